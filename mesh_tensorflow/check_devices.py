"""One command that checks this library on the machine's accelerators.

    python -m mesh_tensorflow.check_devices            # GPU machine: full check
    python -m mesh_tensorflow.check_devices --quick    # small sizes (CI, CPU)

It finds the accelerators (GPUs; without any it says so and checks logical
CPUs instead, so the script itself runs everywhere) and runs:

1. layout invariance: a small transformer's loss and every variable's
   gradient on a one-processor mesh and on a 1-D and a 2-D mesh of the
   devices, with the placement lowering's two collective implementations
   ("direct" and "collective") and the SIMD lowering, each against a
   single-CPU reference;
2. training: a few SGD steps of the MLP and the transformer, in float32 and
   with bfloat16 activations, on a 2-D mesh of the devices; the losses of
   every step against the single-CPU run of the same seed;
3. throughput: a transformer training step on one device (sized to load a
   GPU; tiny with --quick) for mtf and for the same model in plain TF2, each
   with and without XLA: step time, tokens/s, model TFLOP/s (FLOPs counted by
   the lowering's counters) and MFU (model FLOP/s over the device's peak,
   from a table of common GPUs' dense bfloat16 peaks or --peak_tflops).

With one physical GPU, the devices are logical GPUs carved out of it with
memory limits (collectives then use the "ring" implementation: NCCL cannot
run one rank per logical device); with several, the physical GPUs (NCCL).
It prints a summary table and exits with status 1 if any check mismatches
(2 for a usage error).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional, Tuple

from absl import flags
from mesh_tensorflow import cli

# Its own flag set: importing the check never collides with a program's flags.
FLAGS = flags.FlagValues()
flags.DEFINE_bool("quick", False, "Small sizes and few repeats (for CPU-only machines).", flag_values=FLAGS)
flags.DEFINE_integer("processors", 4, "Processors of the 1-D and 2-D meshes (even, >= 2).", flag_values=FLAGS)
flags.DEFINE_integer("train_steps", 3, "SGD steps of the loss comparisons.", flag_values=FLAGS)
flags.DEFINE_float("peak_tflops", 0.0,
                   "The device's dense peak TFLOP/s for MFU (default: looked up by GPU name).", flag_values=FLAGS)
flags.DEFINE_list("parts", ["layout", "train", "throughput"],
                  "Which parts to run (comma-separated): layout, train, throughput.", flag_values=FLAGS)
flags.DEFINE_bool("xla", True, "Also measure the throughput with XLA (jit_compile).", flag_values=FLAGS)
flags.DEFINE_integer("logical_gpu_memory_mb", 2048,
                     "Memory limit of each extra logical GPU carved out of one physical GPU.", flag_values=FLAGS)
flags.DEFINE_integer("main_gpu_memory_mb", 0,
                     "Memory limit of logical GPU 0 (the throughput device) when carving one "
                     "GPU; 0: the GPU's memory less the others' and 2 GiB.", flag_values=FLAGS)
flags.DEFINE_string("throughput_size", "",
                    "Override the throughput transformer: comma-separated key=value of batch, "
                    "length, d_model, heads, d_ff, vocab, layers.", flag_values=FLAGS)

# A hidden switch for the tests: perturbs one device result so that the check
# must report a mismatch.
_INJECT_ENV = "MTF_CHECK_DEVICES_INJECT_MISMATCH"

# Dense (no sparsity) bfloat16 tensor-core peaks, TFLOP/s, by a substring of
# the device name; the first match wins, so specific names come first.
PEAK_BF16_TFLOPS = (
    ("GB200", 2500.0), ("B200", 2250.0), ("B100", 1750.0),
    ("H200", 989.0), ("GH200", 989.0), ("H100 PCIe", 756.0), ("H100 NVL", 835.0),
    ("H100", 989.0), ("H800", 989.0), ("H20", 148.0),
    ("A100", 312.0), ("A800", 312.0), ("A30", 165.0), ("A40", 150.0), ("A10G", 70.0),
    ("A10", 125.0), ("L40S", 362.0), ("L40", 181.0), ("L4", 121.0),
    ("RTX 6000 Ada", 364.0), ("RTX 4090", 165.0), ("RTX 3090", 71.0), ("A6000", 155.0),
    ("V100", 125.0), ("T4", 65.0),
)

TINY = dict(batch=8, length=8, d_model=16, heads=4, d_ff=32, vocab=32, layers=1)
SMALL_MLP = dict(batch=32, pixels=64, hidden=128, classes=10)
SMALL_TRANSFORMER = dict(batch=8, length=16, d_model=64, heads=4, d_ff=128, vocab=128, layers=2)
THROUGHPUT_GPU = dict(batch=16, length=1024, d_model=1024, heads=16, d_ff=4096, vocab=32768,
                      layers=4)
THROUGHPUT_CPU = dict(batch=4, length=64, d_model=128, heads=4, d_ff=512, vocab=512, layers=2)
THROUGHPUT_CPU_QUICK = dict(batch=2, length=16, d_model=32, heads=4, d_ff=64, vocab=64, layers=1)

TOLERANCE = {"float32": 1e-4, "bfloat16": 3e-2}


class UsageError(ValueError):
  pass


def peak_tflops_for(name: str) -> Optional[float]:
  """The dense bfloat16 peak of a GPU named `name`, or None if unknown.

  Example:
    >>> peak_tflops_for("NVIDIA H100 80GB HBM3")
    989.0
  """
  for key, peak in PEAK_BF16_TFLOPS:
    if key.lower() in name.lower():
      return peak
  return None


def _parse_size(text: str, base: Dict[str, int]) -> Dict[str, int]:
  out = dict(base)
  for item in filter(None, (s.strip() for s in text.split(","))):
    key, _, value = item.partition("=")
    if key not in out or not value.isdigit() or int(value) < 1:
      raise UsageError(
          f"--throughput_size: {item!r} is not key=positive integer with key one of "
          f"{sorted(out)}.")
    out[key] = int(value)
  if out["d_model"] % out["heads"]:
    raise UsageError(f"--throughput_size: d_model={out['d_model']} is not a multiple of "
                     f"heads={out['heads']}.")
  return out


# ---------------------------------------------------------------------------- devices
class Platform:
  """What the check runs on: kind ("GPU"/"CPU"), device names, the collective
  communication, the name of the accelerator and a note."""

  def __init__(self, kind, devices, communication, name, note, throughput_device):
    self.kind = kind
    self.devices = devices
    self.communication = communication
    self.name = name
    self.note = note
    self.throughput_device = throughput_device


def _gpu_name_and_memory(gpu) -> Tuple[str, Optional[int]]:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  name = "GPU"
  try:
    name = tf.config.experimental.get_device_details(gpu).get("device_name", name)
  except (ValueError, RuntimeError):
    pass
  memory = None
  try:
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=20, check=True).stdout
    memory = int(out.split()[0])
  except (OSError, subprocess.SubprocessError, ValueError, IndexError):
    pass
  return name, memory


def setup_devices(processors: int) -> Platform:
  """Configures the devices (before TensorFlow initializes) and describes them."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  gpus = tf.config.list_physical_devices("GPU")
  if not gpus:
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
      # A split made already (by a program that imports this check) is kept
      # when it has enough devices.
      if len(tf.config.get_logical_device_configuration(cpu) or []) < processors:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * processors)
    except RuntimeError:  # initialized already (in-process use): enough CPUs?
      if len(tf.config.list_logical_devices("CPU")) < processors:
        raise UsageError(
            f"TensorFlow is initialized with fewer than {processors} logical CPUs; run the "
            "check in a fresh process (python -m mesh_tensorflow.check_devices).") from None
    devices = [d.name for d in tf.config.list_logical_devices("CPU")][:processors]
    return Platform("CPU", devices, "auto", "CPU", "no accelerator found: checking "
                    f"{processors} logical CPUs (the CPU part of the check)", devices[0])
  name, memory = _gpu_name_and_memory(gpus[0])
  if len(gpus) >= processors:
    for gpu in gpus[:processors]:
      tf.config.experimental.set_memory_growth(gpu, True)
    devices = [d.name for d in tf.config.list_logical_devices("GPU")][:processors]
    return Platform("GPU", devices, "nccl", name, f"{len(gpus)} GPUs ({name}); using "
                    f"{processors} physical GPUs, NCCL collectives", devices[0])
  small = FLAGS.logical_gpu_memory_mb
  main = FLAGS.main_gpu_memory_mb
  if not main:
    main = (memory - small * (processors - 1) - 2048) if memory else 16384
  if main < small:
    raise UsageError(f"--main_gpu_memory_mb: {main} MiB left for logical GPU 0 (the GPU has "
                     f"{memory} MiB); lower --logical_gpu_memory_mb or --processors.")
  tf.config.set_logical_device_configuration(
      gpus[0], [tf.config.LogicalDeviceConfiguration(memory_limit=main)] +
      [tf.config.LogicalDeviceConfiguration(memory_limit=small)] * (processors - 1))
  devices = [d.name for d in tf.config.list_logical_devices("GPU")][:processors]
  note = (f"{len(gpus)} GPU ({name}); {processors} logical GPUs carved out of GPU 0 "
          f"({main} MiB + {processors - 1} x {small} MiB), ring collectives (NCCL needs "
          "distinct GPUs)")
  return Platform("GPU", devices, "ring", name, note, devices[0])


# ---------------------------------------------------------------------------- runs
def _lower_outputs(impl, build: Callable, outputs_fn: Callable, holder: dict):
  """A step function: builds the graph, lowers it, returns the TF outputs."""
  import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top

  def step(*inputs):
    graph, mesh, loss = build(*inputs)
    extra = outputs_fn(graph, loss)
    lowering = mtf.Lowering(graph, {mesh: impl})
    holder["lowering"] = lowering
    return [lowering.export_to_tf_tensor(t) for t in [loss] + extra]
  return step


def run_loss_and_grads(impl, build: Callable, inputs) -> List:
  """[loss, gradient of every variable] as NumPy arrays, one run under impl
  (variables at their initial values)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from mesh_tensorflow.testing import reference_models as rm  # pylint: disable=g-import-not-at-top
  holder = {}
  step = _lower_outputs(impl, build, lambda g, l: [t for _, t in rm.variable_gradients(g, l)],
                        holder)
  inputs = [tf.constant(x) for x in inputs]
  if hasattr(impl, "run_all"):
    values = impl.run(step, *inputs)
  else:
    values = tf.function(step, autograph=False)(*inputs)
  return [v.numpy() for v in values]


def train_losses(impl, build: Callable, inputs, steps: int, jit_compile=None) -> List[float]:
  """Loss of each of `steps` SGD steps under impl."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from mesh_tensorflow.testing import reference_models as rm  # pylint: disable=g-import-not-at-top
  import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top

  def step(*xs):
    graph, mesh, loss = build(*xs)
    updates = rm.sgd_updates(graph, loss)
    lowering = mtf.Lowering(graph, {mesh: impl})
    tf_loss = lowering.export_to_tf_tensor(loss)
    with tf.control_dependencies([lowering.lowered_operation(u) for u in updates]):
      return tf.identity(tf_loss)
  inputs = [tf.constant(x) for x in inputs]
  if hasattr(impl, "run_all"):
    return [float(impl.run(step, *inputs)) for _ in range(steps)]
  fn = tf.function(step, autograph=False, jit_compile=jit_compile)
  return [float(fn(*inputs)) for _ in range(steps)]


def relative_error(got, want) -> float:
  """max |got - want| / max(|want|, tiny), over all arrays."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  worst = 0.0
  for g, w in zip(got, want):
    g = np.asarray(g, np.float64)
    w = np.asarray(w, np.float64)
    if g.shape != w.shape:
      return float("inf")
    scale = max(float(np.max(np.abs(w))) if w.size else 0.0, 1e-6)
    worst = max(worst, float(np.max(np.abs(g - w))) / scale if w.size else 0.0)
  return worst


class Report:
  """Rows of the summary table: (part, case, status, detail)."""

  def __init__(self):
    self.rows: List[Tuple[str, str, str, str]] = []

  def add(self, part: str, case: str, status: str, detail: str) -> None:
    self.rows.append((part, case, status, detail))
    print(f"  {status:<4} {part} | {case} | {detail}", flush=True)

  @property
  def failed(self) -> int:
    return sum(1 for r in self.rows if r[2] == "FAIL")

  def table(self) -> str:
    widths = [max(len(r[i]) for r in self.rows + [("part", "case", "status", "")])
              for i in range(3)]
    lines = [f"{'part':<{widths[0]}}  {'case':<{widths[1]}}  {'status':<{widths[2]}}  detail"]
    lines.append("-" * (sum(widths) + 6 + 40))
    for part, case, status, detail in self.rows:
      lines.append(f"{part:<{widths[0]}}  {case:<{widths[1]}}  {status:<{widths[2]}}  {detail}")
    return "\n".join(lines)


def _injected(values):
  """The values, perturbed when the hidden test switch is set."""
  if os.environ.get(_INJECT_ENV):
    values = list(values)
    values[0] = values[0] * 1.05 + 0.01
  return values


def check_layouts(platform: Platform, report: Report) -> None:
  """Loss and gradients of a tiny transformer on meshes of the devices vs CPU."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top
  from mesh_tensorflow.testing import reference_models as rm  # pylint: disable=g-import-not-at-top
  n = len(platform.devices)
  inputs = rm.transformer_data(TINY, seed=1)
  build = lambda a, b: rm.build_mtf_transformer(a, b, TINY)
  with tf.device("/cpu:0"):
    reference = run_loss_and_grads(
        mtf.placement_mesh_impl.PlacementMeshImpl([], "", ["/cpu:0"]), build, inputs)
  two_d = f"rows:2;cols:{n // 2}"
  cases = [("", "", "placement", "placement"), ("", "", "simd", "simd"),
           ("", "", "simd+xla", "simd + XLA")]
  for mesh, layout in ((f"all:{n}", "heads:all;d_ff:all;vocab:all"),
                       (two_d, "batch:rows;heads:cols;d_ff:cols;vocab:cols")):
    for kind in ("placement/direct", "placement/collective", "simd"):
      cases.append((mesh, layout, kind, kind))
  if platform.kind == "GPU":  # XLA compiles collectives on GPUs only
    cases.append((two_d, "batch:rows;heads:cols;d_ff:cols;vocab:cols", "simd+xla",
                  "simd + XLA"))
  first = True
  for mesh, layout, kind, label in cases:
    case = f"{mesh or 'single'} {layout or '(replicated)'} {label}"
    try:
      size = mtf.convert_to_shape(mesh).size if mesh else 1
      devices = platform.devices[:size]
      if kind.startswith("simd"):
        impl = mtf.simd_mesh_impl.SimdMeshImpl(mesh if mesh else [], layout, devices,
                                               communication=platform.communication,
                                               jit_compile=kind == "simd+xla")
      else:
        collectives = kind.split("/")[1] if "/" in kind else "auto"
        impl = mtf.placement_mesh_impl.PlacementMeshImpl(
            mesh if mesh else [], layout, devices, collectives=collectives,
            communication=platform.communication)
      got = run_loss_and_grads(impl, build, inputs)
      if first:
        got = _injected(got)
        first = False
      err = relative_error(got, reference)
      ok = err <= TOLERANCE["float32"]
      report.add("layout", case, "ok" if ok else "FAIL",
                 f"loss + {len(got) - 1} gradients, max rel err {err:.1e} (tol "
                 f"{TOLERANCE['float32']:.0e})")
    except Exception as e:  # pylint: disable=broad-except
      # XLA compiling a multi-device program is reported, not failed: the
      # program then runs uncompiled (jit_compile="auto" falls back elsewhere).
      status = "skip" if kind == "simd+xla" and mesh else "FAIL"
      report.add("layout", case, status, f"{type(e).__name__}: {str(e).splitlines()[0][:160]}")


def check_training(platform: Platform, report: Report, steps: int) -> None:
  """SGD losses on a 2-D mesh of the devices vs the single-CPU run."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top
  from mesh_tensorflow.testing import reference_models as rm  # pylint: disable=g-import-not-at-top
  n = len(platform.devices)
  models = (
      ("mlp", rm.build_mtf_mlp, SMALL_MLP, rm.mlp_data(SMALL_MLP, seed=2),
       "batch:rows;hidden:cols"),
      ("transformer", rm.build_mtf_transformer, SMALL_TRANSFORMER,
       rm.transformer_data(SMALL_TRANSFORMER, seed=2), "batch:rows;heads:cols;d_ff:cols"),
  )
  for name, builder, config, data, layout in models:
    for dtype in (tf.float32, tf.bfloat16):
      build = lambda a, b, builder=builder, config=config, dtype=dtype: builder(a, b, config, dtype)
      case = f"{name} {dtype.name} rows:2;cols:{n // 2} {steps} steps"
      try:
        with tf.device("/cpu:0"):
          want = train_losses(mtf.placement_mesh_impl.PlacementMeshImpl([], "", ["/cpu:0"]),
                              build, data, steps)
        impl = mtf.placement_mesh_impl.PlacementMeshImpl(
            f"rows:2;cols:{n // 2}", layout, platform.devices,
            communication=platform.communication)
        got = train_losses(impl, build, data, steps)
        err = relative_error([got], [want])
        tol = TOLERANCE[dtype.name]
        report.add("train", case, "ok" if err <= tol else "FAIL",
                   f"losses {' '.join(f'{x:.4f}' for x in got)} vs CPU "
                   f"{' '.join(f'{x:.4f}' for x in want)}, rel err {err:.1e} (tol {tol:.0e})")
      except Exception as e:  # pylint: disable=broad-except
        report.add("train", case, "FAIL", f"{type(e).__name__}: {str(e).splitlines()[0][:160]}")


def _median_step_seconds(runners: Dict[str, Callable], steps: int, repeats: int):
  """{name: median seconds per step}, runs interleaved so load drifts cancel."""
  samples = {name: [] for name in runners}
  for _ in range(repeats):
    for name, run in runners.items():
      t0 = time.perf_counter()
      for _ in range(steps):
        loss = run()
      float(loss)
      samples[name].append((time.perf_counter() - t0) / steps)
  return {name: statistics.median(v) for name, v in samples.items()}


def _throughput_step(impl, ids, targets, config, dtype, holder: dict):
  """The mtf SGD step of the throughput transformer; records the lowering's
  FLOP count (per processor: the whole model on one device) in holder."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top
  from mesh_tensorflow.testing import reference_models as rm  # pylint: disable=g-import-not-at-top

  def step():
    graph, mesh, loss = rm.build_mtf_transformer(ids, targets, config, dtype)
    updates = rm.sgd_updates(graph, loss)
    lowering = mtf.Lowering(graph, {mesh: impl})
    tf_loss = lowering.export_to_tf_tensor(loss)
    with tf.control_dependencies([lowering.lowered_operation(u) for u in updates]):
      out = tf.identity(tf_loss)
    holder["flops"] = dict(lowering.counters)["flops"]
    return out
  return step


def measure_throughput(platform: Platform, report: Report, config: Dict[str, int], dtype,
                       peak: Optional[float], xla: bool, steps: int, repeats: int) -> dict:
  """Step times of the transformer on one device: mtf and plain TF2, with and
  without XLA. Returns {variant: seconds per step}."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top
  from mesh_tensorflow.testing import reference_models as rm  # pylint: disable=g-import-not-at-top
  device = platform.throughput_device
  tokens = config["batch"] * config["length"]
  runners, flops = {}, {}
  with tf.device(device):
    ids, targets = (tf.constant(x) for x in rm.transformer_data(config, seed=3))
    for jit in ([False, True] if xla else [False]):
      name = "mtf" + (" + XLA" if jit else "")
      flops[name] = {}
      runners[name] = tf.function(
          _throughput_step(mtf.placement_mesh_impl.PlacementMeshImpl([], "", [device]),
                           ids, targets, config, dtype, flops[name]),
          autograph=False, jit_compile=True if jit else None)
      plain = rm.sgd_step_fn(
          lambda v, a, b: rm.transformer_loss(v, a, b, config=config, activation_dtype=dtype),
          rm.transformer_variables(rm.plain_variable, config), [ids, targets],
          jit_compile=True if jit else None)
      runners["plain TF2" + (" + XLA" if jit else "")] = plain
    usable = {}
    for name, run in runners.items():
      try:
        float(run())  # trace, compile, warm up
        float(run())
        usable[name] = run
      except Exception as e:  # pylint: disable=broad-except
        # Without XLA every variant must run; XLA's limits are reported, not failed.
        report.add("throughput", f"{name} {dtype.name}", "skip" if "XLA" in name else "FAIL",
                   f"{type(e).__name__}: {str(e).splitlines()[0][:160]}")
    times = _median_step_seconds(usable, steps, repeats)
  model_flops = next((h["flops"] for h in flops.values() if "flops" in h), 0)
  for name, seconds in times.items():
    tflops = model_flops / seconds / 1e12
    mfu = f"MFU {100 * tflops / peak:.1f}%" if peak else "MFU n/a (no peak)"
    report.add("throughput", f"{name} {dtype.name}", "info",
               f"{seconds * 1000:.1f} ms/step, {tokens / seconds:,.0f} tokens/s, "
               f"{tflops:.3g} model TFLOP/s, {mfu}")
  if "mtf" in times and "plain TF2" in times:
    report.add("throughput", f"mtf / plain TF2 {dtype.name}", "info",
               f"step-time ratio {times['mtf'] / times['plain TF2']:.2f}")
  if "mtf + XLA" in times and "mtf" in times:
    report.add("throughput", f"XLA / no XLA (mtf) {dtype.name}", "info",
               f"step-time ratio {times['mtf + XLA'] / times['mtf']:.2f}")
  return times


def check_throughput(platform: Platform, report: Report, quick: bool) -> None:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from mesh_tensorflow.testing import reference_models as rm  # pylint: disable=g-import-not-at-top
  if platform.kind == "GPU":
    config = THROUGHPUT_CPU if quick else THROUGHPUT_GPU
    dtypes = [tf.bfloat16] if quick else [tf.bfloat16, tf.float32]
  else:
    config = THROUGHPUT_CPU_QUICK if quick else THROUGHPUT_CPU
    dtypes = [tf.float32]
  if FLAGS.throughput_size:
    config = _parse_size(FLAGS.throughput_size, config)
  peak = FLAGS.peak_tflops or (peak_tflops_for(platform.name) if platform.kind == "GPU"
                               else None)
  print(f"throughput model: {config} ({rm.transformer_flops(config) / 1e9:.2f} GFLOP/step of "
        "matmuls, analytic); peak " + (f"{peak:g} TFLOP/s" if peak else "unknown"),
        flush=True)
  steps, repeats = (2, 3) if quick else (10, 3)
  tf.config.experimental.enable_tensor_float_32_execution(True)
  for dtype in dtypes:
    measure_throughput(platform, report, config, dtype, peak, FLAGS.xla, steps, repeats)


def main(argv) -> int:
  if len(argv) > 1:
    raise UsageError(f"unexpected arguments {argv[1:]}; all options are --flags "
                     "(see --help).")
  if FLAGS.processors < 2 or FLAGS.processors % 2:
    raise UsageError(f"--processors={FLAGS.processors}: give an even number >= 2.")
  if FLAGS.train_steps < 1:
    raise UsageError(f"--train_steps={FLAGS.train_steps}: give a number >= 1.")
  if FLAGS.peak_tflops < 0:
    raise UsageError(f"--peak_tflops={FLAGS.peak_tflops}: give a positive number (or 0 to "
                     "look the device up).")
  if FLAGS.throughput_size:
    _parse_size(FLAGS.throughput_size, THROUGHPUT_GPU)
  unknown = sorted(set(FLAGS.parts) - {"layout", "train", "throughput"})
  if unknown or not FLAGS.parts:
    raise UsageError(f"--parts={','.join(FLAGS.parts)}: choose among layout, train, "
                     "throughput.")
  t0 = time.perf_counter()
  platform = setup_devices(FLAGS.processors)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  print(f"mesh_tensorflow.check_devices: {platform.note}", flush=True)
  print(f"devices: {', '.join(platform.devices)}", flush=True)
  report = Report()
  # Exact float32 for the comparisons (no TF32 tensor-core rounding on GPUs).
  tf.config.experimental.enable_tensor_float_32_execution(False)
  if "layout" in FLAGS.parts:
    print("layout invariance (values and gradients vs a single-CPU reference):", flush=True)
    check_layouts(platform, report)
  if "train" in FLAGS.parts:
    print("training losses vs the single-CPU run of the same seed:", flush=True)
    check_training(platform, report, FLAGS.train_steps)
  if "throughput" in FLAGS.parts:
    print(f"throughput on {platform.throughput_device}:", flush=True)
    check_throughput(platform, report, FLAGS.quick)
  print()
  print(f"summary ({platform.kind}: {platform.name}, {time.perf_counter() - t0:.0f} s)")
  print(report.table())
  if report.failed:
    print(f"FAILED: {report.failed} of {len(report.rows)} checks mismatched", flush=True)
    return 1
  print("all checks passed", flush=True)
  return 0


def run(argv: Optional[List[str]] = None) -> None:
  """Console entry point: parses the flags, runs the check, exits with its
  status (0 passed, 1 a mismatch, 2 a usage error)."""
  argv = cli.parse_own_flags(FLAGS, sys.argv if argv is None else argv,
                              "python -m mesh_tensorflow.check_devices", __doc__)
  try:
    sys.exit(main(argv))
  except UsageError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
  run()
