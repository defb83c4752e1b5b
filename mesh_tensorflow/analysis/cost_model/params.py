"""Device parameters: the speeds that turn the cost model's counts into seconds.

    >>> DeviceParams.default("gpu").hardware
    'a100-80gb'

"gpu" and "tpu" are the `hardware` presets a100-80gb and tpu-v3 flattened
(`from_hardware`); any preset name works too ("h100-sxm"). Parameters made
from a preset keep its name in `hardware`: the estimate then prices each
collective on that machine's links (`topology`), as the planner does.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Optional

from mesh_tensorflow.analysis.cost_model import hardware


@dataclasses.dataclass(frozen=True)
class DeviceParams:
  """Speeds of one kind of device, used to turn counts into seconds.

  Attributes:
    name: a label ("cpu", "gpu", "tpu", "calibrated").
    flops_per_s: matrix-product throughput of one processor.
    memory_bytes_per_s: bytes per second one processor reads and writes in
      elementwise and data-movement kernels.
    collective_bytes_per_s: bytes per second a processor sends in collectives.
    collective_latency_s: fixed cost of one collective (per group).
    op_overhead_s: fixed cost of dispatching one kernel.
    parallel_processors: how many processors compute at the same time (None:
      all of them; on logical CPU devices, the real cores).
    shares_memory: processors share one memory (logical CPU devices of one
      process): processors holding the same (replicated) slice share one
      kernel and one copy, as `PlacementMeshImpl` does there.
    hardware: a `hardware` preset name or a Hardware JSON object: the mesh's
      processors are that many devices of it, and each collective is priced
      on the links its groups cross (hosts, network, TPU torus;
      `estimator.collective_seconds`) instead of at collective_bytes_per_s
      and collective_latency_s. None: one flat link for every collective.

  Example:
    >>> p = DeviceParams.default("gpu")
    >>> p.memory_bytes_per_s
    2039000000000.0
  """
  name: str
  flops_per_s: float
  memory_bytes_per_s: float
  collective_bytes_per_s: float
  collective_latency_s: float
  op_overhead_s: float
  parallel_processors: Optional[int] = None
  shares_memory: bool = False
  hardware: Optional[str] = None

  @staticmethod
  def default(kind: str = "cpu") -> "DeviceParams":
    """Default parameters for "cpu" (logical devices of this 2-core machine),
    "gpu" (the a100-80gb preset), "tpu" (tpu-v3) or any hardware preset."""
    try:
      return _DEFAULTS[kind.lower()]
    except KeyError:
      pass
    try:
      return from_hardware(hardware.preset(kind))
    except ValueError:
      raise ValueError(f"DeviceParams.default: unknown device kind {kind!r}; use one of "
                       f"{sorted(_DEFAULTS)}, a hardware preset or calibrate (python -m "
                       "mesh_tensorflow.analysis.cost_model --calibrate).") from None

  def to_json(self) -> str:
    return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

  @staticmethod
  def from_json(text_or_path: str) -> "DeviceParams":
    """Reads parameters from a JSON string or file (as written by --calibrate)."""
    text = text_or_path
    if not text_or_path.lstrip().startswith("{"):
      if not os.path.isfile(text_or_path):
        raise ValueError(f"device parameters file {text_or_path!r} does not exist: give cpu, "
                         "gpu, tpu, a hardware preset or the JSON file that python -m "
                         "mesh_tensorflow.analysis.cost_model --calibrate --output writes.")
      with open(text_or_path) as f:
        text = f.read()
    try:
      values = json.loads(text)
    except json.JSONDecodeError as e:
      raise ValueError(f"device parameters {text_or_path!r} are not valid JSON: {e}") from None
    if not isinstance(values, dict):
      raise ValueError(f"device parameters {text_or_path!r}: expected a JSON object of "
                       "DeviceParams fields, as --calibrate --output writes.")
    fields = {f.name for f in dataclasses.fields(DeviceParams)}
    unknown = sorted(set(values) - fields)
    if unknown:
      raise ValueError(f"DeviceParams.from_json: unknown fields {unknown}; expected {sorted(fields)}.")
    missing = [f for f in _SPEEDS + ("name",) if f not in values]
    if missing:
      raise ValueError(f"device parameters {text_or_path!r}: missing fields {missing}.")
    def wrong_value(field):
      v = values[field]
      if isinstance(v, bool) or not isinstance(v, (int, float)):
        return True
      return v <= 0 if field.endswith("per_s") else v < 0  # a rate, or seconds
    wrong = [f for f in _SPEEDS if wrong_value(f)]
    if wrong:
      raise ValueError(f"device parameters {text_or_path!r}: {wrong} must be numbers (rates "
                       "per second above 0, latency and overhead in seconds, 0 or more).")
    return DeviceParams(**values)


_SPEEDS = ("flops_per_s", "memory_bytes_per_s", "collective_bytes_per_s", "collective_latency_s",
           "op_overhead_s")


# "cpu": this project's 2-core machine with 8 logical CPU devices, as
# `python -m mesh_tensorflow.analysis.cost_model --calibrate` measures it
# (rounded; repeated calibrations agree within about 15% on the three
# speeds, within about 25% on the two costs). One matrix product already
# uses both cores, so one processor computes at a time. With them the
# estimate puts every legal 8-device layout of the benchmark MLP and a sample
# of the transformer's within 20% of their measured step times and ranks the
# transformer's layouts at about 0.97, the MLP's at about 0.86
# (benchmarks/layout_search.py; docs/layouts.md says why the MLP's rank
# lower). Other machines: calibrate. "gpu" and "tpu" are the a100-80gb and
# tpu-v3 presets of hardware.py (published specs).
_DEFAULTS = {
    "cpu": DeviceParams("cpu", flops_per_s=2.6e11, memory_bytes_per_s=2.6e10,
                        collective_bytes_per_s=2.8e10, collective_latency_s=4e-6,
                        op_overhead_s=3e-6, parallel_processors=1, shares_memory=True),
}


def from_hardware(device: "hardware.Hardware") -> DeviceParams:
  """The `DeviceParams` of a hardware preset: its compute and memory speeds,
  and its links through `hardware` (collective_bytes_per_s and
  collective_latency_s, the slowest link a collective may cross, serve only
  where `hardware` is dropped)."""
  if device.kind == "gpu":
    bw, lat = device.network_bytes_per_s, device.network_latency_s
  else:
    bw, lat = 2 * device.ici_link_bytes_per_s / device.devices_per_chip, device.intra_host_latency_s
  named = hardware.PRESETS.get(device.name) == device
  return DeviceParams(device.name, flops_per_s=device.peak_flops_per_s * device.matmul_efficiency,
                      memory_bytes_per_s=device.hbm_bytes_per_s * device.hbm_efficiency,
                      collective_bytes_per_s=bw,
                      collective_latency_s=lat, op_overhead_s=device.kernel_overhead_s,
                      hardware=device.name if named else device.to_json())


def _preset_params(kind: str, preset_name: str) -> DeviceParams:
  return dataclasses.replace(from_hardware(hardware.preset(preset_name)), name=kind)


_DEFAULTS["gpu"] = _preset_params("gpu", "a100-80gb")
_DEFAULTS["tpu"] = _preset_params("tpu", "tpu-v3")


def as_device_params(params) -> DeviceParams:
  """None -> CPU defaults; "cpu"/"gpu"/"tpu"; a DeviceParams; a JSON path."""
  if params is None:
    return DeviceParams.default("cpu")
  if isinstance(params, DeviceParams):
    return params
  if isinstance(params, str):
    if params.strip().lower() in _DEFAULTS:
      return DeviceParams.default(params.strip())
    device = hardware.find_preset(params)
    if device is not None:
      return from_hardware(device)
    return DeviceParams.from_json(params)
  if isinstance(params, dict):
    return DeviceParams(**params)
  raise TypeError(f"device params must be a DeviceParams, 'cpu'/'gpu'/'tpu' or a JSON path, "
                  f"got {params!r}.")
