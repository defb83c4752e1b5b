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

The absolute times move with the machine's speed (up to 2x from day to day on
a shared machine), so each row also prints TensorFlow's own floor for that
many ops, measured in the same run: tracing a `tf.function` that creates the
same number of plain `Mul` ops, with no mtf code.
The ratio lowering / floor is what the lowering adds on top of creating its
ops, and does not depend on the machine's speed.
"""

from __future__ import annotations

import argparse
import statistics
import time

import tensorflow as tf

from mesh_tensorflow.testing import use_logical_cpus  # noqa: E402

use_logical_cpus(64)  # before TensorFlow initializes its devices

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


def op_creation_floor(n_ops: int) -> float:
  """Seconds to trace a tf.function that creates `n_ops` Mul ops with no mtf
  code (a chain on one device): TensorFlow's own cost of creating that many
  ops, the lowering's floor."""
  @tf.function(autograph=False)
  def make_ops(x):
    two = tf.constant(2.0)
    for _ in range(n_ops):
      x = tf.raw_ops.Mul(x=x, y=two)
    return x
  t0 = time.perf_counter()
  make_ops.get_concrete_function(tf.TensorSpec([4], tf.float32))
  return time.perf_counter() - t0


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--sizes", default="1,2,4,8,16,32,64")
  parser.add_argument("--repeats", type=int, default=3)
  args = parser.parse_args()
  print("seconds are medians; 'first' includes creating the slice variables (once per")
  print("run), 'lower' is building and lowering the graph with variables existing.")
  print("'floor' is TensorFlow's time to create that many ops with no mtf code;")
  print("'x' is lower / floor, measured in the same run.")
  print(f"{'devices':>7} {'mesh':<14} | {'shared replicas: first':>22} {'lower':>6} {'ops':>6} "
        f"{'floor':>6} {'x':>5} | {'one copy per device: first':>26} {'lower':>6} {'ops':>6} "
        f"{'floor':>6} {'x':>5}")
  for n in [int(s) for s in args.sizes.split(",")]:
    cells = []
    for share in (True, False):
      runs, floors = [], []
      for _ in range(args.repeats):  # interleaved: slow phases hit both alike
        runs.append(trace_once(n, share))
        floors.append(op_creation_floor(runs[-1][2]))
      lower = statistics.median(r[1] for r in runs)
      floor = statistics.median(floors)
      cells.append((statistics.median(r[0] for r in runs), lower, runs[0][2], floor,
                    lower / floor))
    (f1, l1, o1, c1, x1), (f2, l2, o2, c2, x2) = cells
    print(f"{n:>7} {mesh_for(n)[0]:<14} | {f1:>22.2f} {l1:>6.2f} {o1:>6} {c1:>6.2f} {x1:>5.2f} "
          f"| {f2:>26.2f} {l2:>6.2f} {o2:>6} {c2:>6.2f} {x2:>5.2f}")


if __name__ == "__main__":
  main()
