"""Float32 masters in the optimizer (`float32_master_in_optimizer`): variables
stored in bfloat16, their float32 masters an optimizer slot sharded by ZeRO
(DeepSpeed's and Megatron-LM's distributed optimizer's layout). Same training
as float32 variables, 2 bytes per parameter replicated instead of 4, the new
values gathered in 16 bits, checkpoints that resume, and checkpoints written
without the masters that start them from the variables."""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.lowering import slice_variables
from mesh_tensorflow.training import zero

import mtf_test_utils

BATCH, FEATURES, HIDDEN, OUT = 16, 32, 64, 8
RNG = np.random.default_rng(3)
X = RNG.normal(size=(4 * BATCH, FEATURES)).astype(np.float32)
Y = RNG.normal(size=(4 * BATCH, OUT)).astype(np.float32)
MESH, LAYOUT = "rows:4;cols:2", "batch:rows;hidden:cols"
SHAPES = {"x": f"batch:{BATCH};features:{FEATURES}", "y": f"batch:{BATCH};out:{OUT}"}


def _model_fn(mesh, features, mode, activation="bfloat16"):
  del mode
  dtype = mtf.mixed_precision.variable_dtype(activation)
  hidden, out = mtf.Dimension("hidden", HIDDEN), mtf.Dimension("out", OUT)
  x = mtf.cast(features["x"], dtype.activation_dtype)
  w1 = mtf.get_variable(mesh, "w1", [x.shape.dims[1], hidden], dtype=dtype)
  w2 = mtf.get_variable(mesh, "w2", [hidden, out], dtype=dtype)
  h = mtf.relu(mtf.einsum([x, w1], output_shape=[x.shape.dims[0], hidden]))
  y = mtf.cast(mtf.einsum([h, w2], output_shape=[x.shape.dims[0], out]), tf.float32)
  return mtf.reduce_mean(mtf.square(y - features["y"]))


def _data(batch=BATCH):
  return tf.data.Dataset.from_tensor_slices({"x": X, "y": Y}).batch(batch).repeat()


def _trainer(stage, master, model_dir=None, accum=1, model_fn=_model_fn, simd=False,
             offload_slots=False, mesh=MESH, layout=LAYOUT):
  impl = (mtf.simd_mesh_impl.SimdMeshImpl(mesh, layout, mtf_test_utils.DEVICES) if simd
          else mtf_test_utils.make_impl(mesh, layout))
  shapes = SHAPES if accum == 1 else {
      k: v.replace(f"batch:{BATCH}", f"batch:{BATCH // accum}") for k, v in SHAPES.items()}
  trainer = mtf.training.Trainer(
      model_fn, shapes, impl,
      mtf.optimize.AdamWeightDecayOptimizer(0.01, offload_slots=offload_slots),
      zero_stage=stage, float32_master_in_optimizer=master, grad_accum_steps=accum,
      model_dir=model_dir, log_every=0, log_fn=lambda line: None)
  return trainer, impl


def _assert_follows(master, float32_variable):
  """The master after 3 Adam steps is the float32 run's variable, up to
  what the bfloat16 rounding of the start and of the gradients changes:
  most weights within a tenth of a learning rate (0.01). Adam divides by
  the gradient's size, so a weight whose gradient is nearly zero (a hidden
  unit ReLU keeps off) moves by whole steps on rounding noise: a few may
  differ by more."""
  diff = np.abs(master - float32_variable)
  assert np.mean(diff) < 1e-3 and np.mean(diff > 1e-2) < 0.02, (
      np.mean(diff), np.mean(diff > 1e-2))


def _values(impl):
  return {name: np.asarray(v.numpy()) for name, v in slice_variables.variable_store(impl).items()}


@pytest.fixture(scope="module")
def float32_run():
  trainer, impl = _trainer(0, False)
  losses = trainer.train(_data(), steps=3)["loss"]
  return losses, _values(impl), max(zero.state_bytes_per_processor(impl))


@pytest.mark.parametrize("stage,simd", [(0, False), (2, False), (3, False), (2, True)])
def test_masters_in_the_optimizer_train_as_float32_variables(float32_run, stage, simd):
  """Also on the SIMD lowering, whose all-gather of the new bfloat16 values
  moves their bits as float16 (TensorFlow's gather has no bfloat16)."""
  base_losses, base_values, base_bytes = float32_run
  trainer, impl = _trainer(stage, True, simd=simd)
  losses = trainer.train(_data(), steps=3)["loss"]
  np.testing.assert_allclose(losses, base_losses, rtol=2e-3)
  values = _values(impl)
  for name in ("w1", "w2"):
    assert values[name].dtype == tf.bfloat16.as_numpy_dtype, name
    assert values[f"{name}/master"].dtype == np.float32, name
    # The stored variable is its master rounded to bfloat16.
    rounded = values[f"{name}/master"].astype(tf.bfloat16.as_numpy_dtype)
    np.testing.assert_array_equal(values[name], rounded, err_msg=name)
    _assert_follows(values[f"{name}/master"], base_values[name])
  assert values["optimizer_float32_masters_ready"] == 1.0
  if stage >= 1:  # 2 bytes replicated + 12 / 4 sharded, against 4 + 8 / 1 per parameter
    assert max(zero.state_bytes_per_processor(impl)) < base_bytes


def test_masters_with_slots_offloaded_to_the_host_train_as_on_the_device():
  """CPU offload (`offload_slots`) keeps the master with the other slots on
  each processor's host and runs the update there; the same numbers."""
  on_device, device_impl = _trainer(2, True)
  expected = on_device.train(_data(), steps=3)["loss"]
  offloaded, impl = _trainer(2, True, offload_slots=True)
  np.testing.assert_allclose(offloaded.train(_data(), steps=3)["loss"], expected, rtol=1e-6)
  values, expected_values = _values(impl), _values(device_impl)
  for name in ("w1", "w1/master", "w1/adam_m", "w2/master"):
    np.testing.assert_array_equal(values[name], expected_values[name], err_msg=name)
  assert values["w1"].dtype == tf.bfloat16.as_numpy_dtype
  # The master is a slot like Adam's: split by ZeRO, on the same devices.
  store = slice_variables.variable_store(impl)
  devices = lambda name: [s.device for s in store[name].slices]  # noqa: E731
  assert devices("w1/master") == devices("w1/adam_m")
  assert len(set(devices("w1/master"))) == impl.size
  # ... and its update is computed on the host mesh.
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  loss = _model_fn(mesh, {k: mtf.zeros(mesh, v) for k, v in SHAPES.items()}, "train")
  zero.shard_training_state(graph, impl, 2, float32_master_in_optimizer=True)
  variables = graph.trainable_variables
  grads = zero.shard_gradients(mtf.gradients([loss], [v.outputs[0] for v in variables]),
                               variables)
  updates = mtf.optimize.AdamWeightDecayOptimizer(0.01, offload_slots=True).apply_grads(
      grads, variables)
  master_updates = [op for op in updates if op.assigned_variables[0].name == "w1/master"]
  assert master_updates and master_updates[0].mesh is mtf.offload.host_mesh(mesh)


def test_the_new_values_are_gathered_in_bfloat16():
  """Stage 2: the same reduce-scatter of the gradients, and the all-gather
  of the new values moves half the bytes of float32 variables'."""
  gathered = {}
  for master in (False, True):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    impl = mtf_test_utils.make_impl(MESH, LAYOUT)
    features = {k: mtf.zeros(mesh, v) for k, v in SHAPES.items()}
    loss = _model_fn(mesh, features, "train")
    zero.shard_training_state(graph, impl, 2, float32_master_in_optimizer=master)
    variables = graph.trainable_variables
    grads = zero.shard_gradients(mtf.gradients([loss], [v.outputs[0] for v in variables]),
                                 variables)
    mtf.optimize.AdamWeightDecayOptimizer(0.01).apply_grads(grads, variables)
    lowering = mtf.Lowering(graph, {mesh: impl})
    records = lowering.collective_records
    gathered[master] = {
        kind: sorted(r.bytes_per_processor for r in records if r.kind == kind)
        for kind in ("allgather", "reduce_scatter")}
  assert gathered[True]["reduce_scatter"] == gathered[False]["reduce_scatter"]
  assert gathered[True]["allgather"] == [b // 2 for b in gathered[False]["allgather"]]
  assert gathered[True]["allgather"]


def test_accumulated_gradients_stay_float32():
  trainer, impl = _trainer(2, True, accum=2)
  trainer.train(_data(BATCH // 2), steps=2)
  values = _values(impl)
  assert values["grad_accumulator/w1"].dtype == np.float32
  assert values["w1"].dtype == tf.bfloat16.as_numpy_dtype


def test_resume_and_start_from_a_checkpoint_without_masters(tmp_path, float32_run):
  """A run with masters resumes them; a checkpoint of float32 variables
  (no master slots) starts the masters from its variables, not from zeros."""
  base_losses, base_values, _ = float32_run
  first, _ = _trainer(2, True, model_dir=str(tmp_path / "m"))
  first.train(_data(), steps=2)
  first.save()
  resumed, impl = _trainer(2, True, model_dir=str(tmp_path / "m"))
  resumed.train(_data(), steps=3)
  _assert_follows(_values(impl)["w1/master"], base_values["w1"])

  plain, _ = _trainer(0, False, model_dir=str(tmp_path / "f"))
  plain.train(_data(), steps=2)
  plain.save()
  switched, impl = _trainer(2, True, model_dir=str(tmp_path / "f"))
  loss = switched.train(_data(), steps=3)["loss"]
  np.testing.assert_allclose(loss, base_losses[2:], rtol=2e-3)
  _assert_follows(_values(impl)["w1/master"], base_values["w1"])


def test_a_run_without_masters_resumes_from_the_checkpoints_float32_masters(tmp_path):
  """Switched off, the option's checkpoint gives float32 variables its exact
  float32 masters (not their bfloat16 rounding), whether the variables are
  created after the restore or exist before it; a checkpoint whose masters
  are not set yet (saved before the first update) gives the variables."""
  with_masters, masters_impl = _trainer(2, True, model_dir=str(tmp_path / "m"))
  with_masters.train(_data(), steps=2)
  with_masters.save()
  saved = _values(masters_impl)
  assert not np.array_equal(saved["w1/master"], saved["w1"].astype(np.float32))
  plain, impl = _trainer(2, False, model_dir=str(tmp_path / "m"))
  plain.evaluate(_data(), steps=1)  # creates the variables from the checkpoint
  assert _values(impl)["w1"].dtype == np.float32
  np.testing.assert_array_equal(_values(impl)["w1"], saved["w1/master"])

  w1 = slice_variables.variable_store(impl)["w1"]
  for piece in w1.slices:
    piece.assign_add(tf.ones_like(piece))
  plain.checkpoint_manager.restore()  # into the existing variables
  np.testing.assert_array_equal(_values(impl)["w1"], saved["w1/master"])

  store = slice_variables.variable_store(masters_impl)
  store["optimizer_float32_masters_ready"].slices[0].assign(0.0)
  with_masters.checkpoint_manager.save(3)
  plain, impl = _trainer(2, False, model_dir=str(tmp_path / "m"))
  plain.evaluate(_data(), steps=1)
  np.testing.assert_array_equal(_values(impl)["w1"], saved["w1"].astype(np.float32))


def test_a_checkpoint_with_masters_moves_to_another_mesh_and_stage(tmp_path, float32_run):
  """Written at stage 2 on rows:4;cols:2, resumed at stage 3 on cols:2;rows:4
  with the model dimension split the other way: the same masters, and
  training goes on as the float32 run's."""
  base_losses, base_values, _ = float32_run
  first, _ = _trainer(2, True, model_dir=str(tmp_path))
  first.train(_data(), steps=2)
  first.save()
  moved, impl = _trainer(3, True, model_dir=str(tmp_path), mesh="cols:2;rows:4",
                         layout="batch:cols;hidden:rows")
  losses = moved.train(_data(), steps=3)["loss"]
  np.testing.assert_allclose(losses, base_losses[2:], rtol=2e-3)
  _assert_follows(_values(impl)["w1/master"], base_values["w1"])


def test_masters_need_16_bit_activations():
  trainer, _ = _trainer(1, True, model_fn=lambda m, f, mode: _model_fn(m, f, mode, "float32"))
  with pytest.raises(ValueError, match="float32_master_in_optimizer .* run.activation_dtype"):
    trainer.train(_data(), steps=1)
