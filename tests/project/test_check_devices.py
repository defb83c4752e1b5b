"""python -m mesh_tensorflow.check_devices on a CPU-only machine, and the XLA
(jit_compile) options: same results with and without."""

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import check_devices
from mesh_tensorflow.testing import reference_models as rm

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEVICES = ["cpu:%d" % i for i in range(8)]
TINY_MLP = dict(batch=8, pixels=12, hidden=16, classes=4)


def _run_check(args, capsys, monkeypatch, inject=False):
  if inject:
    monkeypatch.setenv(check_devices._INJECT_ENV, "1")
  else:
    monkeypatch.delenv(check_devices._INJECT_ENV, raising=False)
  check_devices.FLAGS.unparse_flags()
  argv = check_devices.FLAGS(["check_devices"] + args)
  try:
    status = check_devices.main(argv)
  finally:
    check_devices.FLAGS.unparse_flags()
  return status, capsys.readouterr().out


def _rows(out, part):
  table = out[out.index("summary ("):]
  return [line for line in table.splitlines() if line.startswith(part + " ")]


def test_cpu_check_passes_and_prints_the_table(capsys, monkeypatch):
  status, out = _run_check(["--quick", "--train_steps=2", "--parts=layout,train,throughput"],
                           capsys, monkeypatch)
  assert "no accelerator found" in out
  layout = _rows(out, "layout")
  # one-processor placement, SIMD and SIMD + XLA, then 1-D and 2-D meshes with
  # the two placement collective implementations and the SIMD lowering
  assert len(layout) == 9, out
  assert all(" ok " in row for row in layout), out
  assert any("placement/collective" in r and "rows:2;cols:2" in r for r in layout)
  assert any("simd + XLA" in r for r in layout)
  train = _rows(out, "train")
  assert len(train) == 4 and all(" ok " in r for r in train), out
  assert any("bfloat16" in r for r in train)
  throughput = _rows(out, "throughput")
  names = " ".join(throughput)
  for variant in ("mtf float32", "plain TF2 float32", "mtf + XLA float32",
                  "mtf / plain TF2 float32"):
    assert variant in names, out
  assert "tokens/s" in names and "model TFLOP/s" in names and "MFU n/a" in names
  assert status == 0 and "all checks passed" in out


def test_injected_mismatch_fails(capsys, monkeypatch):
  status, out = _run_check(["--quick", "--parts=layout"], capsys, monkeypatch, inject=True)
  assert status == 1, out
  assert "FAILED: 1 of" in out
  assert len([r for r in _rows(out, "layout") if " FAIL " in r]) == 1


def test_peak_flag_gives_mfu(capsys, monkeypatch):
  status, out = _run_check(["--quick", "--parts=throughput", "--noxla", "--peak_tflops=0.5",
                            "--throughput_size=layers=1,batch=2"], capsys, monkeypatch)
  assert status == 0
  assert "MFU" in out and "MFU n/a" not in out


def test_usage_errors_exit_2(capsys, monkeypatch):
  env = dict(os.environ, PYTHONPATH=REPO_ROOT, TF_CPP_MIN_LOG_LEVEL="2")
  proc = subprocess.run([sys.executable, "-m", "mesh_tensorflow.check_devices",
                         "--train_steps=abc"], cwd=REPO_ROOT, env=env, capture_output=True,
                        text=True, timeout=300)
  assert proc.returncode == 2, proc.stderr
  assert proc.stderr.strip().splitlines()[-1].startswith("error: ")
  assert "train_steps" in proc.stderr
  for args, message in ((["--processors=3"], "--processors=3"),
                        (["--parts=layout,bogus"], "--parts"),
                        (["--throughput_size=layers=0"], "--throughput_size")):
    with pytest.raises(check_devices.UsageError, match=message):
      _run_check(args, capsys, monkeypatch)


def test_peak_table():
  assert check_devices.peak_tflops_for("NVIDIA H100 PCIe") == 756.0
  assert check_devices.peak_tflops_for("NVIDIA H100 80GB HBM3") == 989.0
  assert check_devices.peak_tflops_for("NVIDIA H200") == 989.0
  assert check_devices.peak_tflops_for("NVIDIA A100-SXM4-80GB") == 312.0
  assert check_devices.peak_tflops_for("NVIDIA L4") == 121.0
  assert check_devices.peak_tflops_for("Tesla V100-SXM2-16GB") == 125.0
  assert check_devices.peak_tflops_for("Some Future GPU") is None


# ---------------------------------------------------------------------------- XLA
def _mlp_step(impl, data):
  def step(x, y):
    graph, mesh, loss = rm.build_mtf_mlp(x, y, TINY_MLP)
    grads = rm.variable_gradients(graph, loss)
    updates = rm.sgd_updates(graph, loss)
    lowering = mtf.Lowering(graph, {mesh: impl})
    outs = [lowering.export_to_tf_tensor(t) for t in [loss] + [g for _, g in grads]]
    with tf.control_dependencies([lowering.lowered_operation(u) for u in updates]):
      return [tf.identity(t) for t in outs]
  return step


@pytest.mark.parametrize("lowering", ["placement", "simd"])
def test_xla_single_processor_same_results(lowering):
  data = [tf.constant(x) for x in rm.mlp_data(TINY_MLP, seed=5)]
  results = {}
  for jit in (False, True):
    if lowering == "simd":
      impl = mtf.simd_mesh_impl.SimdMeshImpl([], "", ["cpu:0"], jit_compile=jit)
      assert impl.compiles_program == jit
      step = _mlp_step(impl, data)
      run = lambda: impl.run(step, *data)
    else:
      impl = mtf.placement_mesh_impl.PlacementMeshImpl([], "", ["cpu:0"])
      fn = tf.function(_mlp_step(impl, data), autograph=False, jit_compile=jit)
      run = lambda: fn(*data)
    results[jit] = [[v.numpy() for v in run()] for _ in range(2)]  # two SGD steps
  for off, on in zip(results[False], results[True]):
    for a, b in zip(off, on):
      np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
  assert results[True][0][0] != results[True][1][0]  # the update ran


def test_simd_jit_compile_on_cpu_with_collectives():
  data = [tf.constant(x) for x in rm.mlp_data(TINY_MLP, seed=5)]
  strict = mtf.simd_mesh_impl.SimdMeshImpl("all:2", "batch:all", DEVICES[:2], jit_compile=True)
  with pytest.raises(ValueError, match="XLA cannot compile collective ops on CPU"):
    strict.run(_mlp_step(strict, data), *data)
  auto = mtf.simd_mesh_impl.SimdMeshImpl("all:2", "batch:all", DEVICES[:2], jit_compile="auto")
  assert not auto.compiles_program  # falls back: runs uncompiled on CPUs
  reference = mtf.placement_mesh_impl.PlacementMeshImpl([], "", ["cpu:0"])
  want = tf.function(_mlp_step(reference, data), autograph=False)(*data)
  got = auto.run(_mlp_step(auto, data), *data)
  for a, b in zip(want, got):
    np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-5, atol=1e-6)
  with pytest.raises(ValueError, match="jit_compile"):
    mtf.simd_mesh_impl.SimdMeshImpl("all:2", "batch:all", DEVICES[:2], jit_compile="yes")


def _trainer_losses(impl, jit):
  images, labels = rm.mlp_data(TINY_MLP, seed=6)
  dataset = tf.data.Dataset.from_tensors({"x": images, "y": labels}).repeat()

  def model_fn(mesh, features, mode):
    del mode
    w = mtf.get_variable(mesh, "w", "pixels:12;classes:4",
                         initializer=tf.constant_initializer(rm.initial_value([12, 4], 3)))
    logits = mtf.einsum([features["x"], w], output_shape="batch:8;classes:4")
    return mtf.reduce_mean(mtf.layers.softmax_cross_entropy_with_logits(
        logits, features["y"], mtf.Dimension("classes", 4)))
  trainer = mtf.training.Trainer(
      model_fn, {"x": "batch:8;pixels:12", "y": "batch:8"}, impl,
      mtf.optimize.SgdOptimizer(0.5), log_every=0, jit_compile=jit)
  return trainer.train(dataset, steps=3)["loss"]


def test_trainer_jit_compile_same_losses():
  off = _trainer_losses(mtf.placement_mesh_impl.PlacementMeshImpl([], "", ["cpu:0"]), False)
  on = _trainer_losses(mtf.placement_mesh_impl.PlacementMeshImpl([], "", ["cpu:0"]), True)
  np.testing.assert_allclose(on, off, rtol=1e-5)
  assert off[0] > off[-1]
  with pytest.raises(ValueError, match="jit_compile=True needs a one-processor mesh"):
    _trainer_losses(mtf.placement_mesh_impl.PlacementMeshImpl("all:2", "batch:all",
                                                              DEVICES[:2]), True)
