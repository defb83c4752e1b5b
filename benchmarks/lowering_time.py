"""Build + lowering time and emitted TensorFlow op count vs. mesh size.

    python benchmarks/lowering_time.py [--sizes 1,2,4,8,16,32,64]

Traces (without running) one training step of the two-layer transformer block
of step_time.py under a 2-D data x model layout on meshes of 1 to 64
processors, on 64 logical CPU devices (the time includes creating the slice
variables, which happens on the first trace only). Both
placement variants are measured: shared replicas (CPU devices of one process)
and one copy per device (as on GPUs). Prints medians of --repeats runs.
"""

from __future__ import annotations

import argparse
import statistics
import time

import tensorflow as tf

_cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(_cpu, [tf.config.LogicalDeviceConfiguration()] * 64)

import bench_models as bm  # noqa: E402
import mesh_tensorflow as mtf


def mesh_for(n: int):
  rows = 1
  while rows * rows * 2 <= n:
    rows *= 2
  cols = n // rows
  return f"rows:{rows};cols:{cols}", "batch:rows;heads:cols;d_ff:cols;vocab:cols"


def trace_once(n: int, share: bool):
  shape, layout = mesh_for(n)
  if bm.TRANSFORMER["batch"] % int(shape.split(";")[0].split(":")[1]):
    raise ValueError("batch must divide rows")
  impl = mtf.placement_mesh_impl.PlacementMeshImpl(
      shape, layout, [f"cpu:{i}" for i in range(n)], share_replicas=share)
  ids, targets = bm.transformer_data()

  @tf.function
  def step(ids, targets):
    graph, mesh, loss, updates = bm.build_mtf_transformer(ids, targets)
    lowering = mtf.Lowering(graph, {mesh: impl})
    tf_loss = lowering.export_to_tf_tensor(loss)
    with tf.control_dependencies([lowering.lowered_operation(u) for u in updates]):
      return tf.identity(tf_loss)
  spec = tf.TensorSpec(ids.shape, tf.int32)
  t0 = time.perf_counter()
  concrete = step.get_concrete_function(spec, spec)
  seconds = time.perf_counter() - t0
  return seconds, len(concrete.graph.get_operations())


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--sizes", default="1,2,4,8,16,32,64")
  parser.add_argument("--repeats", type=int, default=3)
  args = parser.parse_args()
  print(f"{'devices':>7} {'mesh':<16} {'shared s':>9} {'shared ops':>11} "
        f"{'per-device s':>13} {'per-device ops':>15}")
  for n in [int(s) for s in args.sizes.split(",")]:
    cells = []
    for share in (True, False):
      runs = [trace_once(n, share) for _ in range(args.repeats)]
      cells.append((statistics.median(r[0] for r in runs), runs[0][1]))
    print(f"{n:>7} {mesh_for(n)[0]:<16} {cells[0][0]:>9.2f} {cells[0][1]:>11} "
          f"{cells[1][0]:>13.2f} {cells[1][1]:>15}")


if __name__ == "__main__":
  main()
