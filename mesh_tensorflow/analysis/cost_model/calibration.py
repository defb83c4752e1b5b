"""Measuring DeviceParams on this machine, and the cost model's command:

    python -m mesh_tensorflow.analysis.cost_model --calibrate [--output params.json]
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Callable, Dict, Optional, Sequence

from mesh_tensorflow.analysis.cost_model import params as params_lib
from mesh_tensorflow.analysis.cost_model.params import DeviceParams

# pylint: disable=protected-access


def calibrate(num_devices: int = 8, repeats: int = 9) -> DeviceParams:
  """Measures DeviceParams on the CPU devices of this machine.

  Run through `python -m mesh_tensorflow.analysis.cost_model --calibrate`, which
  creates `num_devices` logical CPU devices first. Each parameter is measured
  on kernels like those of a training step:

  * op_overhead_s: a chain of 200 tiny kernels, less an empty function;
  * flops_per_s: the forward and the two backward matrix products (one
    operand transposed) of three layer shapes, one after another;
  * parallel_processors: the same products on one and on all devices at once;
  * memory_bytes_per_s: elementwise kernels over 1 to 4 MiB tensors that are
    not in cache (a step's backward pass reads what the forward pass wrote
    long before);
  * collective_latency_s and collective_bytes_per_s: an allreduce as
    PlacementMeshImpl performs it (an add_n of every device's slice), per
    transfer or combine and per byte combined, the units the estimate counts
    with shared memory; less the function's call (the empty function) and
    the kernels it runs, and measured beside the kernel chain and the empty
    function (all three before the heavy measurements, which slow small
    kernels that follow them).

  Every measurement is the median of `repeats` calls, taken in three passes
  over all measurements; each keeps its least median, so a slow phase of the
  machine (another process, threads still starting) spoils one pass of a
  measurement, not the parameters.

  Example:
    >>> params = calibrate()
    >>> params.op_overhead_s < 1e-3
    True
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  devices = [d.name for d in tf.config.list_logical_devices("CPU")][:num_devices]
  if len(devices) < num_devices:
    raise ValueError(f"calibrate: {num_devices} CPU devices needed, {len(devices)} exist. "
                     "Run `python -m mesh_tensorflow.analysis.cost_model --calibrate`, which "
                     "creates them before TensorFlow starts.")
  functions, amounts = {}, {}
  for build in (_overhead_functions, _product_functions, _elementwise_functions,
                _allreduce_functions):
    new_functions, new_amounts = build(tf, devices)
    functions.update(new_functions)
    amounts.update(new_amounts)
  # The latency is what the small allreduce takes beyond the call and its
  # kernels: measure the three in a row, in the same state of the machine
  # (after a heavy function, TensorFlow's worker threads slow small kernels).
  light = ("chain", "empty", "allreduce_small")
  functions = {name: functions[name] for name in light + tuple(
      n for n in functions if n not in light)}
  seconds = _least_medians(functions, repeats, passes=3)

  overhead = max((seconds["chain"] - seconds["empty"]) / (_CHAIN - 1), 1e-7)
  flops_per_s = amounts["products"] / seconds["products_one_device"]
  parallel = max(1, min(len(devices), round(
      len(devices) * seconds["products_one_device"] / seconds["products_all_devices"])))
  memory_bytes_per_s = amounts["elementwise"] / seconds["elementwise"]
  # Priced as the estimator prices it with shared memory: the add_n reads
  # the other devices' slices (a transfer each) and is one combine, each
  # costing collective_latency_s; it reads and writes (devices + 1) slices'
  # bytes, shared by `parallel` cores, at collective_bytes_per_s. The call
  # itself (the empty function's time: with 8 logical devices, as long as
  # tens of transfers) is not part of any allreduce; each allreduce also
  # runs two kernels (the add_n and the slice of its result that the sum
  # reads).
  t_small = (seconds["allreduce_small"] - seconds["empty"]) / _ALLREDUCES
  t_large = (seconds["allreduce_large"] - seconds["empty"]) / _ALLREDUCES
  latency = max(t_small - 2 * overhead, 1e-7) / len(devices)
  combined = (len(devices) + 1) * amounts["allreduce_large"] / parallel
  collective_bytes_per_s = combined / max(t_large - t_small, 1e-9)
  rounded = lambda x: float(f"{x:.3g}")
  return DeviceParams("calibrated", flops_per_s=rounded(flops_per_s),
                      memory_bytes_per_s=rounded(memory_bytes_per_s),
                      collective_bytes_per_s=rounded(collective_bytes_per_s),
                      collective_latency_s=rounded(latency),
                      op_overhead_s=rounded(overhead),
                      parallel_processors=int(parallel), shares_memory=True)


_CHAIN = 200  # tiny kernels in the overhead measurement
_ALLREDUCES = 4  # allreduces per call of an allreduce measurement


def _least_medians(functions: Dict[str, Callable], repeats: int, passes: int
                   ) -> Dict[str, float]:
  """{name: the least, over `passes` passes, of the median seconds of
  `repeats` calls of that function}."""
  import time  # pylint: disable=g-import-not-at-top
  for fn in functions.values():
    fn()  # traces and warms each function
  seconds = {name: float("inf") for name in functions}
  for _ in range(passes):
    for name, fn in functions.items():
      samples = []
      for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
      seconds[name] = min(seconds[name], sorted(samples)[len(samples) // 2])
  return seconds


def _overhead_functions(tf, devices):
  """A chain of tiny kernels across the devices, and an empty function."""
  small = tf.constant([1.0])

  @tf.function
  def chain():
    x = small
    for i in range(_CHAIN):
      with tf.device(devices[i % len(devices)]):
        x = x + 1.0
    return x

  @tf.function
  def empty():
    return small + 1.0
  return dict(chain=chain, empty=empty), {}


def _product_functions(tf, devices):
  """A training step's matrix products (forward, and backward with one
  operand transposed) over three layer shapes, on one device and on all
  devices at once; amounts: their FLOPs on one device."""
  shapes = ((256, 512, 1024), (512, 512, 512), (512, 1024, 1024))
  operands = [[(tf.random.normal([m, k], seed=3 * i), tf.random.normal([k, n], seed=3 * i + 1),
                tf.random.normal([m, n], seed=3 * i + 2)) for m, k, n in shapes]
              for i in range(len(devices))]

  def products(device_operands):
    # One product after another, as a step's chain of layers runs them
    # (independent products would run two at a time).
    outs = []
    for x, w, dy in device_operands:
      for a, b, transpose_a, transpose_b in ((x, w, False, False), (dy, w, False, True),
                                             (x, dy, True, False)):
        with tf.control_dependencies(outs[-1:]):
          product = tf.matmul(a, b, transpose_a=transpose_a, transpose_b=transpose_b)
          outs.append(tf.reduce_sum(product[:1]))
    return tf.add_n(outs)

  @tf.function
  def products_one_device():
    with tf.device(devices[0]):
      return products(operands[0])

  @tf.function
  def products_all_devices():
    outs = []
    for device, device_operands in zip(devices, operands):
      with tf.device(device):
        outs.append(products(device_operands))
    return tf.add_n(outs)
  flops = sum(3 * 2 * m * k * n for m, k, n in shapes)
  return (dict(products_one_device=products_one_device,
               products_all_devices=products_all_devices), dict(products=flops))


def _elementwise_functions(tf, devices):
  """Two elementwise kernels on each of 64 MiB of distinct 1 to 4 MiB
  tensors, one kernel after another (so none reads a tensor still in
  cache); amounts: the bytes they read and write."""
  del devices  # the default device
  inputs = [tf.random.normal([elements], seed=i)
            for elements in (256 * 1024, 512 * 1024, 1024 * 1024)
            for i in range((64 << 20) // (4 * elements))]

  @tf.function
  def elementwise():
    outs = []
    for x in inputs:
      with tf.control_dependencies(outs[-1:]):
        outs.append((tf.nn.relu(x) - 0.5)[0])
    return tf.add_n(outs)
  moved = sum(2 * 2 * x.shape.num_elements() * 4 for x in inputs)
  return dict(elementwise=elementwise), dict(elementwise=moved)


def _allreduce_functions(tf, devices):
  """Allreduces as the placement lowering performs them on CPU (an add_n of
  every device's slice) of tiny and of 4 MiB slices; amounts: a large
  slice's bytes."""
  def allreduces(size):
    # Each allreduce sums its own slices: identical add_n's would be merged
    # into one by TensorFlow's common-subexpression elimination.
    sets = []
    for r in range(_ALLREDUCES):
      parts = []
      for i, device in enumerate(devices):
        with tf.device(device):
          parts.append(tf.random.normal([size], seed=100 + i + len(devices) * r))
      sets.append(parts)

    @tf.function
    def f():
      outs = []
      for parts in sets:
        with tf.device(devices[0]):
          outs.append(tf.add_n(parts)[0])
      return tf.add_n(outs)
    return f
  large = 1024 * 1024
  return (dict(allreduce_small=allreduces(16), allreduce_large=allreduces(large)),
          dict(allreduce_large=large * 4))


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
