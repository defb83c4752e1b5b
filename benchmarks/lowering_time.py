"""Build + lowering time and emitted TensorFlow op count vs. mesh size.

    python benchmarks/lowering_time.py [--sizes 1,2,4,8,16,32,64]

Traces (without running) one training step of the two-layer transformer block
of step_time.py under a 2-D data x model layout on meshes of 1 to 64
processors, on 64 logical CPU devices. Two times per cell: the first trace
(which also creates the slice variables, once per run, and which tf.function
traces twice because variables are created) and a build + lowering with the
variables existing. Both placement variants are measured: shared replicas (CPU
devices of one process) and one copy per device (as on GPUs). Prints medians of
--repeats runs.
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
  """(seconds of the first trace, which also creates the slice variables,
  seconds of a build + lowering with variables existing, emitted op count)."""
  shape, layout = mesh_for(n)
  impl = mtf.placement_mesh_impl.PlacementMeshImpl(
      shape, layout, [f"cpu:{i}" for i in range(n)], share_replicas=share)
  ids, _ = bm.transformer_data()
  spec = tf.TensorSpec(ids.shape, tf.int32)

  def make_step():
    @tf.function(autograph=False)
    def step(ids, targets):
      graph, mesh, loss, updates = bm.build_mtf_transformer(ids, targets)
      lowering = mtf.Lowering(graph, {mesh: impl})
      tf_loss = lowering.export_to_tf_tensor(loss)
      with tf.control_dependencies([lowering.lowered_operation(u) for u in updates]):
        return tf.identity(tf_loss)
    return step
  t0 = time.perf_counter()
  make_step().get_concrete_function(spec, spec)
  first = time.perf_counter() - t0
  t0 = time.perf_counter()
  concrete = make_step().get_concrete_function(spec, spec)
  lowering = time.perf_counter() - t0
  return first, lowering, len(concrete.graph.get_operations())


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--sizes", default="1,2,4,8,16,32,64")
  parser.add_argument("--repeats", type=int, default=3)
  args = parser.parse_args()
  print("seconds are medians; 'first' includes creating the slice variables (once per")
  print("run), 'lower' is building and lowering the graph with variables existing.")
  print(f"{'devices':>7} {'mesh':<14} | {'shared replicas: first':>22} {'lower':>6} {'ops':>6} "
        f"| {'one copy per device: first':>26} {'lower':>6} {'ops':>6}")
  for n in [int(s) for s in args.sizes.split(",")]:
    cells = []
    for share in (True, False):
      runs = [trace_once(n, share) for _ in range(args.repeats)]
      cells.append((statistics.median(r[0] for r in runs),
                    statistics.median(r[1] for r in runs), runs[0][2]))
    (f1, l1, o1), (f2, l2, o2) = cells
    print(f"{n:>7} {mesh_for(n)[0]:<14} | {f1:>22.2f} {l1:>6.2f} {o1:>6} "
          f"| {f2:>26.2f} {l2:>6.2f} {o2:>6}")


if __name__ == "__main__":
  main()
