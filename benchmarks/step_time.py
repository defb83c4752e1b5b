"""Step time of the MLP and the two-layer transformer under several layouts,
as a ratio to plain single-device TF2 measured in the same run.

    python benchmarks/step_time.py [--repeats 7] [--steps 10] [--no-dtensor]

Prints a table of median step times and ratios (lower is better; 1.0 = as fast
as plain TensorFlow). Timings are medians over repeats, so noise on a shared
machine mostly cancels in the ratios. The same models in TensorFlow's DTensor,
under the same mesh shapes and layout rules (bench_dtensor.py), are measured
in the same run for comparison.
"""

from __future__ import annotations

import argparse
import statistics
import time

import tensorflow as tf

# Each layout's step is its own tf.function, traced once; TensorFlow counts
# them together and would warn about "retracing".
tf.get_logger().setLevel("ERROR")
from mesh_tensorflow.testing import DEVICES, use_logical_cpus  # noqa: E402

use_logical_cpus(8)  # before TensorFlow initializes its devices

import bench_dtensor  # noqa: E402
import bench_models as bm  # noqa: E402

LAYOUTS = {
    "mlp": [
        ("single", "all:1", "", ["cpu:0"]),
        ("data-parallel 8x1", "all:8", "batch:all", DEVICES),
        ("model-parallel 1x8", "all:8", "hidden:all", DEVICES),
        ("2x4 data x model", "rows:2;cols:4", "batch:rows;hidden:cols", DEVICES),
    ],
    "transformer": [
        ("single", "all:1", "", ["cpu:0"]),
        ("data-parallel 8x1", "all:8", "batch:all", DEVICES),
        ("model-parallel 1x8", "all:8", "heads:all;d_ff:all;vocab:all", DEVICES),
        ("2x4 data x model", "rows:2;cols:4", "batch:rows;heads:cols;d_ff:cols;vocab:cols",
         DEVICES),
    ],
}


def time_steps(step, steps: int, repeats: int):
  step()  # trace + warm up
  step()
  samples = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    for _ in range(steps):
      out = step()
    float(out)
    samples.append((time.perf_counter() - t0) / steps)
  return statistics.median(samples)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=int, default=7)
  parser.add_argument("--steps", type=int, default=10)
  parser.add_argument("--models", default="mlp,transformer")
  parser.add_argument("--dtensor", action=argparse.BooleanOptionalAction, default=True,
                      help="also time the DTensor versions (default: yes)")
  args = parser.parse_args()
  rows = []
  for model in args.models.split(","):
    data = bm.mlp_data() if model == "mlp" else bm.transformer_data()
    builder = bm.build_mtf_mlp if model == "mlp" else bm.build_mtf_transformer
    plain = (bm.plain_mlp_step_fn if model == "mlp" else bm.plain_transformer_step_fn)(*data)
    candidates = [("plain TF2", plain)] + [
        (name, bm.mtf_step_fn(builder, data, shape, layout, devs))
        for name, shape, layout, devs in LAYOUTS[model]]
    if args.dtensor:
      candidates += [(f"DTensor {name}", bench_dtensor.dtensor_step_fn(model, data, shape, layout))
                     for name, shape, layout, _ in LAYOUTS[model] if name != "single"]
    # Interleave measurements so slow phases of the machine hit all alike.
    times = {name: [] for name, _ in candidates}
    for name, fn in candidates:
      fn(); fn()
    for _ in range(args.repeats):
      for name, fn in candidates:
        times[name].append(time_steps(fn, args.steps, 1))
    base = statistics.median(times["plain TF2"])
    for name, _ in candidates:
      med = statistics.median(times[name])
      rows.append((model, name, med * 1e3, med / base))
  print(f"{'model':<12} {'layout':<30} {'median ms':>10} {'ratio':>7}")
  for model, name, ms, ratio in rows:
    print(f"{model:<12} {name:<30} {ms:>10.2f} {ratio:>7.2f}")


if __name__ == "__main__":
  main()
