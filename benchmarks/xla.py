"""Step time with vs without XLA (jit_compile) on CPU, measured in one run.

    python benchmarks/xla.py [--repeats 7] [--steps 5]

The MLP and the transformer of bench_models.py, one SGD step each: the mtf
step on a one-processor mesh (placement lowering in a tf.function, and the
SIMD lowering's per-processor program), and the same model in plain TF2.
Runs are interleaved (every variant once per repeat) so that drifts in the
machine's load cancel; the table gives medians and XLA / no-XLA ratios
(below 1: XLA is faster). The first call of each variant (tracing and
compiling) is not timed.
"""

from __future__ import annotations

import argparse
import statistics
import time

import tensorflow as tf

import bench_models as bm
import mesh_tensorflow as mtf


def _mtf_step(impl, builder, a, b):
  def step(x, y):
    graph, mesh, loss, updates = builder(x, y)
    lowering = mtf.Lowering(graph, {mesh: impl})
    tf_loss = lowering.export_to_tf_tensor(loss)
    with tf.control_dependencies([lowering.lowered_operation(u) for u in updates]):
      return tf.identity(tf_loss)
  return step


def runners(model: str, jit: bool):
  """{variant: run()} for one model, with or without XLA."""
  builder, data = ((bm.build_mtf_mlp, bm.mlp_data()) if model == "mlp"
                   else (bm.build_mtf_transformer, bm.transformer_data()))
  a, b = (tf.constant(x) for x in data)
  placement = mtf.placement_mesh_impl.PlacementMeshImpl([], "", ["cpu:0"])
  p_step = tf.function(_mtf_step(placement, builder, a, b), autograph=False,
                       jit_compile=True if jit else None)
  simd = mtf.simd_mesh_impl.SimdMeshImpl([], "", ["cpu:0"], jit_compile=jit)
  s_step = _mtf_step(simd, builder, a, b)
  plain = bm.sgd_step_fn(
      bm.mlp_loss if model == "mlp" else bm.transformer_loss,
      (bm.mlp_variables if model == "mlp" else bm.transformer_variables)(bm._plain_variable),
      [a, b],
      jit_compile=True if jit else None)
  return {"mtf placement": lambda: p_step(a, b), "mtf SIMD": lambda: simd.run(s_step, a, b),
          "plain TF2": plain}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=int, default=7)
  parser.add_argument("--steps", type=int, default=5)
  parser.add_argument("--models", default="mlp,transformer")
  args = parser.parse_args()
  print("step time on one CPU device, median ms per step (XLA / no XLA: < 1 means XLA is faster)")
  print(f"{'model':<12} {'variant':<14} {'no XLA':>8} {'XLA':>8} {'XLA / no XLA':>13} "
        f"{'spread':>13}")
  for model in args.models.split(","):
    variants = {}
    for jit in (False, True):
      for name, run in runners(model, jit).items():
        variants[(name, jit)] = run
        float(run())  # trace and compile
    samples = {key: [] for key in variants}
    for _ in range(args.repeats):
      for key, run in variants.items():
        t0 = time.perf_counter()
        for _ in range(args.steps):
          loss = run()
        float(loss)
        samples[key].append((time.perf_counter() - t0) / args.steps)
    for name in ("mtf placement", "mtf SIMD", "plain TF2"):
      off = statistics.median(samples[(name, False)])
      on = statistics.median(samples[(name, True)])
      # spread: (max - min) / median of the no-XLA samples, a noise gauge
      spread = (max(samples[(name, False)]) - min(samples[(name, False)])) / off
      print(f"{model:<12} {name:<14} {off * 1000:8.1f} {on * 1000:8.1f} {on / off:13.2f} "
            f"{spread:12.0%}", flush=True)


if __name__ == "__main__":
  main()
