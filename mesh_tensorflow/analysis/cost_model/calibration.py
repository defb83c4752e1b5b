"""Measuring DeviceParams on this machine, and the cost model's command:

    python -m mesh_tensorflow.analysis.cost_model --calibrate [--output params.json]
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Optional, Sequence

from mesh_tensorflow.analysis.cost_model import params as params_lib
from mesh_tensorflow.analysis.cost_model.params import DeviceParams

# pylint: disable=protected-access


def calibrate(num_devices: int = 8, repeats: int = 5) -> DeviceParams:
  """Measures DeviceParams on the CPU devices of this machine.

  Run through `python -m mesh_tensorflow.analysis.cost_model --calibrate`, which
  creates `num_devices` logical CPU devices first. Measures: the fixed cost
  of a kernel (a chain of tiny ops), matrix-product FLOP/s, elementwise
  bytes/s, how many devices compute at once (the same products on 1 and on
  all devices), and the latency and bandwidth of an allreduce across the
  devices as PlacementMeshImpl performs it (per transfer or combine, and
  per byte combined: the units the estimate counts with shared memory).

  Example:
    >>> params = calibrate()
    >>> params.op_overhead_s < 1e-3
    True
  """
  import time  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  devices = [d.name for d in tf.config.list_logical_devices("CPU")][:num_devices]
  if len(devices) < num_devices:
    raise ValueError(f"calibrate: {num_devices} CPU devices needed, {len(devices)} exist. "
                     "Run `python -m mesh_tensorflow.analysis.cost_model --calibrate`, which "
                     "creates them before TensorFlow starts.")

  def timed(fn, inner=1):
    fn()
    fn()
    samples = []
    for _ in range(repeats):
      t0 = time.perf_counter()
      fn()
      samples.append((time.perf_counter() - t0) / inner)
    samples.sort()
    return samples[len(samples) // 2]

  # Kernel overhead: a chain of 200 tiny ops minus an empty function.
  small = tf.constant([1.0])

  @tf.function
  def chain():
    x = small
    for i in range(200):
      with tf.device(devices[i % len(devices)]):
        x = x + 1.0
    return x

  @tf.function
  def empty():
    return small + 1.0
  overhead = max((timed(chain) - timed(empty)) / 199, 1e-7)

  # Matrix products: one device, then all devices at once.
  n = 512
  mats = [tf.random.normal([n, n], seed=i) for i in range(len(devices))]

  @tf.function
  def one_matmul():
    with tf.device(devices[0]):
      y = mats[0]
      for _ in range(4):
        y = tf.matmul(y, mats[0])
      return tf.reduce_sum(y)

  @tf.function
  def all_matmuls():
    outs = []
    for d, m in zip(devices, mats):
      with tf.device(d):
        y = m
        for _ in range(4):
          y = tf.matmul(y, m)
        outs.append(tf.reduce_sum(y))
    return tf.add_n(outs)
  t_one = timed(one_matmul)
  t_all = timed(all_matmuls)
  flops_per_s = 4 * 2 * n ** 3 / t_one
  parallel = max(1, min(len(devices), round(len(devices) * t_one / t_all)))

  # Elementwise bandwidth.
  big = tf.random.normal([4 * 1024 * 1024])

  @tf.function
  def elementwise():
    y = big
    for _ in range(4):
      y = y * 1.0001 + 0.5
    return y[0]
  mem_bw = 8 * 2 * big.shape.num_elements() * 4 / timed(elementwise)

  # Allreduce as the placement lowering does it on CPU: add_n of the slices.
  def allreduce_fn(size):
    parts = []
    for i, d in enumerate(devices):
      with tf.device(d):
        parts.append(tf.random.normal([size], seed=100 + i))

    @tf.function
    def f():
      outs = []
      for _ in range(4):
        with tf.device(devices[0]):
          total = tf.add_n(parts)
        outs.append(total[0])
      return tf.add_n(outs)
    return f
  # Priced as the estimator prices it with shared memory: the add_n reads
  # the other devices' slices (a transfer each) and is one combine, each
  # costing collective_latency_s; it reads and writes (devices + 1) slices'
  # bytes, shared by `parallel` cores, at collective_bytes_per_s.
  t_small = timed(allreduce_fn(16)) / 4
  t_large = timed(allreduce_fn(1024 * 1024)) / 4
  latency = max(t_small - overhead, 1e-7) / len(devices)
  combined = (len(devices) + 1) * 1024 * 1024 * 4 / parallel
  coll_bw = combined / max(t_large - t_small, 1e-9)
  return DeviceParams("calibrated", flops_per_s=float(f"{flops_per_s:.3g}"),
                      memory_bytes_per_s=float(f"{mem_bw:.3g}"),
                      collective_bytes_per_s=float(f"{coll_bw:.3g}"),
                      collective_latency_s=float(f"{latency:.3g}"),
                      op_overhead_s=float(f"{overhead:.3g}"),
                      parallel_processors=int(parallel), shares_memory=True)


def main(argv: Optional[Sequence[str]] = None) -> int:
  """`python -m mesh_tensorflow.analysis.cost_model ARGS`; returns the exit status (see cli.run_module_command)."""
  from mesh_tensorflow import cli as cli_lib  # pylint: disable=g-import-not-at-top
  return cli_lib.run_module_command("mesh_tensorflow.analysis.cost_model", _main, argv)


def _main(argv: Sequence[str]) -> int:
  """`python -m mesh_tensorflow.analysis.cost_model --calibrate [--devices 8]
  [--output params.json]`: prints (and writes) calibrated DeviceParams."""
  from mesh_tensorflow import cli  # pylint: disable=g-import-not-at-top
  parser = cli.FlagParser(
      prog="python -m mesh_tensorflow.analysis.cost_model",
      description="Device parameters of the mtf cost model.")
  parser.add_argument("--calibrate", action="store_true",
                      help="measure the parameters on this machine's CPUs")
  parser.add_argument("--devices", type=int, default=8, help="logical CPU devices")
  parser.add_argument("--output", default=None, help="also write the JSON here")
  parser.add_argument("--show_defaults", action="store_true",
                      help="print the built-in defaults for cpu, gpu and tpu")
  args = parser.parse_args(argv)
  if args.devices < 1:
    parser.error(f"--devices={args.devices}: must be at least 1")
  if args.output and os.path.isdir(args.output):
    parser.error(f"--output={args.output} is a directory; give a file name such as "
                 "params.json")
  if args.show_defaults or not args.calibrate:
    print(json.dumps({k: dataclasses.asdict(v) for k, v in params_lib._DEFAULTS.items()}, indent=2))
    if not args.calibrate:
      return 0
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  cpu = tf.config.list_physical_devices("CPU")[0]
  try:
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * args.devices)
  except RuntimeError:
    pass  # TensorFlow already started (e.g. in tests): calibrate() checks the count.
  params = calibrate(args.devices)
  text = params.to_json()
  print(text)
  if args.output:
    with open(args.output, "w") as f:
      f.write(text + "\n")
  return 0
