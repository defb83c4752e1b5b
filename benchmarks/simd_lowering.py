"""SIMD vs placement lowering: lowering time and emitted op count vs mesh size,
and step time on 8 logical CPUs, measured in one run.

    python benchmarks/simd_lowering.py [--sizes 8,64,512] [--repeats 3]

Lowering: one training step of the two-layer transformer of bench_models.py
(layout batch:rows;d_ff:cols;vocab:cols on meshes 2x4, 8x8, 16x32) is traced
into a graph that never runs, on devices that need not exist. Times are with
the slice variables already existing (they are created once per run, one per
processor, in both implementations). For the SIMD lowering "ops" counts the
program (traced once) plus, after the '+', the per-processor calls of it.
Target (issue 5): SIMD lowering time at 512 within 1.2x of its time at 8.

Step time: the MLP and the transformer, 2x4 data x model layout, each
implementation's step run repeatedly on 8 logical CPUs; medians and the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time

import tensorflow as tf

from mesh_tensorflow.testing import use_logical_cpus  # noqa: E402

use_logical_cpus(8)  # before TensorFlow initializes its devices

import bench_models as bm  # noqa: E402
import mesh_tensorflow as mtf  # noqa: E402

LAYOUT = "batch:rows;d_ff:cols;vocab:cols"
MESHES = {8: "rows:2;cols:4", 64: "rows:8;cols:8", 512: "rows:16;cols:32"}


def _step(impl, builder):
  def step(a, b):
    graph, mesh, loss, updates = builder(a, b)
    lowering = mtf.Lowering(graph, {mesh: impl})
    tf_loss = lowering.export_to_tf_tensor(loss)
    with tf.control_dependencies([lowering.lowered_operation(u) for u in updates]):
      return tf.identity(tf_loss)
  return step


def lower_placement(n: int, repeats: int):
  """(median seconds, op count) of tracing the placement step, variables existing."""
  with tf.Graph().as_default():
    devices = [f"/job:worker/task:0/device:CPU:{i}" for i in range(n)]
    impl = mtf.placement_mesh_impl.PlacementMeshImpl(MESHES[n], LAYOUT, devices,
                                                     share_replicas=False)
    ids, _ = bm.transformer_data()
    spec = tf.TensorSpec(ids.shape, tf.int32)
    times, ops = [], 0
    for i in range(repeats + 1):
      t0 = time.perf_counter()
      concrete = tf.function(_step(impl, bm.build_mtf_transformer),
                             autograph=False).get_concrete_function(spec, spec)
      if i:  # the first trace also creates the variables
        times.append(time.perf_counter() - t0)
      ops = len(concrete.graph.get_operations())
  return statistics.median(times), ops


def lower_simd(n: int, repeats: int):
  """(median seconds, program op count) of tracing the SIMD program (both
  passes: finding the variables, then the program), variables existing."""
  with tf.Graph().as_default():
    devices = [f"/job:worker/task:0/device:CPU:{i}" for i in range(n)]
    impl = mtf.simd_mesh_impl.SimdMeshImpl(MESHES[n], LAYOUT, devices)
    ids, _ = bm.transformer_data()
    ids = tf.constant(ids)
    times, ops = [], 0
    for i in range(repeats + 1):
      step = _step(impl, bm.build_mtf_transformer)  # a new function: traced anew
      t0 = time.perf_counter()
      concrete, _ = impl.trace_program(step, ids, ids)
      if i:
        times.append(time.perf_counter() - t0)
      ops = len(concrete.graph.get_operations())
  return statistics.median(times), ops


def step_times(steps: int, repeats: int):
  """{model: (placement median s, simd median s, sorted per-repeat
  SIMD / placement ratios)} on 8 logical CPUs."""
  devices = [f"cpu:{i}" for i in range(8)]
  out = {}
  for model, builder, data in (("mlp", bm.build_mtf_mlp, bm.mlp_data()),
                               ("transformer", bm.build_mtf_transformer,
                                bm.transformer_data())):
    a, b = (tf.constant(x) for x in data)
    layout = "batch:rows;hidden:cols" if model == "mlp" else "batch:rows;heads:cols;d_ff:cols"
    placement = mtf.placement_mesh_impl.PlacementMeshImpl("rows:2;cols:4", layout, devices)
    simd = mtf.simd_mesh_impl.SimdMeshImpl("rows:2;cols:4", layout, devices)
    p_step = tf.function(_step(placement, builder), autograph=False)
    s_fn = _step(simd, builder)
    runners = {"placement": lambda: p_step(a, b), "simd": lambda: simd.run(s_fn, a, b)}
    medians = {}
    for name, run in runners.items():
      float(run())  # trace and warm up
    samples = {name: [] for name in runners}
    for _ in range(repeats):  # interleaved, so drifts in machine load cancel
      for name, run in runners.items():
        t0 = time.perf_counter()
        for _ in range(steps):
          loss = run()
        float(loss)
        samples[name].append((time.perf_counter() - t0) / steps)
    for name in runners:
      medians[name] = statistics.median(samples[name])
    paired = sorted(s / p for p, s in zip(samples["placement"], samples["simd"]))
    out[model] = (medians["placement"], medians["simd"], paired)
  return out


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--sizes", default="8,64,512")
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--steps", type=int, default=10)
  args = parser.parse_args()
  sizes = [int(s) for s in args.sizes.split(",")]
  print("lowering one transformer training step, variables existing (median seconds)")
  print(f"{'processors':>10} {'mesh':<16} | {'placement s':>11} {'ops':>7} | "
        f"{'SIMD s':>7} {'program ops':>11}")
  simd_times = {}
  lower_simd(sizes[0], 1)  # warm-up: the first traces of a process pay for imports
  for n in sizes:
    p_time, p_ops = lower_placement(n, max(1, args.repeats if n <= 64 else 1))
    s_time, s_ops = lower_simd(n, args.repeats)
    simd_times[n] = s_time
    print(f"{n:>10} {MESHES[n]:<16} | {p_time:>11.2f} {p_ops:>7} | {s_time:>7.2f} "
          f"{s_ops:>7} + {n}", flush=True)
  if 8 in simd_times and 512 in simd_times:
    print(f"SIMD lowering time ratio 512 / 8: {simd_times[512] / simd_times[8]:.2f} "
          "(target <= 1.2)")
  print()
  print("step time on 8 logical CPUs, mesh 2x4 (median seconds per step)")
  print("(ratio of medians; then the ratios of the interleaved repeats, min / median / max:")
  print(" their spread is the machine's noise)")
  for model, (p, s, paired) in step_times(args.steps, args.repeats).items():
    print(f"{model:<12} placement {p * 1000:8.1f} ms   SIMD {s * 1000:8.1f} ms   "
          f"SIMD / placement {s / p:.2f}   per repeat {paired[0]:.2f} / "
          f"{statistics.median(paired):.2f} / {paired[-1]:.2f}")


if __name__ == "__main__":
  main()
