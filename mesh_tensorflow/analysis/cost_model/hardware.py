"""Accelerators and clusters from published specifications.

A `Hardware` is one kind of accelerator and the machine around it: peak dense
16-bit matrix throughput (and float32's), HBM capacity and bandwidth, how
many devices share a host and the links inside a host and between hosts,
and for TPUs the torus of inter-chip links. A `Cluster` is a preset (or a
JSON file) and a device count:

    >>> cluster = parse_cluster("a100-80gb:1024")
    >>> cluster.hardware.devices_per_host, cluster.num_hosts
    (8, 128)

Every number comes from a public specification named in `sources` beside it
(see docs/planning.md for the table). Bandwidths are per device and per
direction. Four fields are not specifications: `matmul_efficiency` (the
fraction of peak a large matrix product reaches) and `hbm_efficiency` (the
fraction of the HBM bandwidth that memory-bound kernels reach) are fitted
on published runs (benchmarks/scale_validation.py says which: for GPUs both
together, for TPUs the products' with the GPUs' HBM efficiency),
`attention_efficiency` (the fraction of peak a fused attention kernel's
score products reach) is fitted per GPU generation on long-sequence runs
(benchmarks/mosaic_sweep.py says which; 0 on the presets without one: the
products' rate), and link latencies are the usual order of magnitude of
one ring step (a few microseconds), marked "assumed".

A machine that is not a preset is a JSON file with the fields of `Hardware`
(`name`, `kind`, `peak_flops_per_s`, `hbm_bytes`, `hbm_bytes_per_s`,
`devices_per_host`, `intra_host_bytes_per_s`, `intra_host_latency_s`,
`network_bytes_per_s`, `network_latency_s`, and for TPUs `torus_dims`,
`ici_link_bytes_per_s`, `devices_per_chip`, `max_slice_devices`), optionally
`matmul_efficiency` and `hbm_efficiency` (left out: the presets' fitted
values), `attention_efficiency` (left out: 0, the products' rate),
`float32_flops_per_s` (left out: float32 products at the peak)
and `bfloat16` (left out: true), plus an optional `count`;
`--hardware=my_machine.json:256` overrides the count.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from typing import Dict, Optional, Tuple

GB = 1e9
GIB = 2 ** 30


@dataclasses.dataclass(frozen=True)
class Hardware:
  """One kind of accelerator and its interconnect.

  Attributes:
    name: preset name, e.g. "a100-80gb".
    kind: "gpu" or "tpu" (how collectives are priced: hosts and a network,
      or a torus of inter-chip links).
    peak_flops_per_s: peak dense 16-bit (bfloat16 or float16) matrix FLOP/s
      of one device; MFU is measured against it.
    hbm_bytes: memory of one device.
    hbm_bytes_per_s: memory bandwidth of one device.
    devices_per_host: devices of one host (consecutive processor numbers).
    intra_host_bytes_per_s: bytes/s one device sends to the others of its
      host (NVLink: per direction); TPU: unused (ICI).
    intra_host_latency_s: latency of one ring step inside a host.
    network_bytes_per_s: bytes/s one device sends across hosts (the host's
      network bandwidth divided by its devices); TPU: data-center network
      between slices.
    network_latency_s: latency of one ring step across hosts.
    torus_dims: TPU: number of torus dimensions (2 or 3); 0 for GPUs.
    ici_link_bytes_per_s: TPU: one inter-chip link, per direction.
    devices_per_chip: TPU v2/v3: 2 cores (TensorFlow devices) per chip.
    max_slice_devices: TPU: devices of the largest ICI-connected slice (pod);
      larger clusters cross the data-center network.
    matmul_efficiency: fraction of peak a large matrix product reaches
      (fitted, see the module docstring).
    hbm_efficiency: fraction of `hbm_bytes_per_s` that memory-bound kernels
      (norms, softmax, elementwise chains, the products' operands) reach
      (fitted with matmul_efficiency).
    attention_efficiency: fraction of peak at which a fused attention
      kernel (FlashAttention; `attention = "fused"`) runs the score
      products, counted in full as model FLOP formulas count them (a causal
      kernel that skips the masked half shows above its own rate); 0: at
      matmul_efficiency. Fitted, see the module docstring.
    kernel_overhead_s: fixed cost of launching one kernel.
    float32_flops_per_s: peak dense matrix FLOP/s with float32 operands as
      TensorFlow runs them (A100 and later: TF32 tensor cores, on by
      default; V100: its FP32 units); 0, as on a TPU (XLA's default
      precision multiplies float32 operands in bfloat16 passes): the same
      as peak_flops_per_s.
    bfloat16: the device multiplies bfloat16 at peak_flops_per_s; False
      (V100, which has float16 tensor cores only): bfloat16 products run
      at float32_flops_per_s.
    sources: {field: where the number comes from}.

  Example:
    >>> preset("h100-sxm").peak_flops_per_s
    989000000000000.0
  """
  name: str
  kind: str
  peak_flops_per_s: float
  hbm_bytes: float
  hbm_bytes_per_s: float
  devices_per_host: int
  intra_host_bytes_per_s: float = 0.0
  intra_host_latency_s: float = 3e-6
  network_bytes_per_s: float = 0.0
  network_latency_s: float = 8e-6
  torus_dims: int = 0
  ici_link_bytes_per_s: float = 0.0
  devices_per_chip: int = 1
  max_slice_devices: int = 0
  matmul_efficiency: float = 0.7
  hbm_efficiency: float = 1.0
  attention_efficiency: float = 0.0
  kernel_overhead_s: float = 2e-6
  float32_flops_per_s: float = 0.0
  bfloat16: bool = True
  sources: Dict[str, str] = dataclasses.field(default_factory=dict, compare=False)

  def validate(self) -> "Hardware":
    if self.kind not in ("gpu", "tpu"):
      raise ValueError(f"hardware {self.name!r}: kind must be 'gpu' or 'tpu', got {self.kind!r}.")
    for field in ("peak_flops_per_s", "hbm_bytes", "hbm_bytes_per_s", "devices_per_host"):
      if not getattr(self, field) or getattr(self, field) <= 0:
        raise ValueError(f"hardware {self.name!r}: {field} must be positive, got "
                         f"{getattr(self, field)!r}.")
    if self.kind == "gpu" and (self.intra_host_bytes_per_s <= 0 or self.network_bytes_per_s <= 0):
      raise ValueError(f"hardware {self.name!r}: a GPU needs intra_host_bytes_per_s and "
                       "network_bytes_per_s (bytes/s per device).")
    if self.kind == "tpu" and (self.torus_dims not in (2, 3) or self.ici_link_bytes_per_s <= 0):
      raise ValueError(f"hardware {self.name!r}: a TPU needs torus_dims (2 or 3) and "
                       "ici_link_bytes_per_s.")
    if not 0 < self.matmul_efficiency <= 1:
      raise ValueError(f"hardware {self.name!r}: matmul_efficiency must be in (0, 1].")
    if not 0 < self.hbm_efficiency <= 1:
      raise ValueError(f"hardware {self.name!r}: hbm_efficiency must be in (0, 1].")
    if not 0 <= self.attention_efficiency <= 1:
      raise ValueError(f"hardware {self.name!r}: attention_efficiency must be in [0, 1] (0: "
                       f"matmul_efficiency's), got {self.attention_efficiency!r}.")
    if not 0 <= self.float32_flops_per_s <= self.peak_flops_per_s:
      raise ValueError(f"hardware {self.name!r}: float32_flops_per_s must be between 0 (the same "
                       f"as peak_flops_per_s) and peak_flops_per_s, got "
                       f"{self.float32_flops_per_s!r}.")
    if not isinstance(self.bfloat16, bool):
      raise ValueError(f"hardware {self.name!r}: bfloat16 must be true or false, got "
                       f"{self.bfloat16!r}.")
    return self

  def check_dtype(self, dtype: str) -> None:
    """Refuses activations of a dtype the device cannot compute in: float16
    on a TPU.

    Example:
      >>> preset("tpu-v4").check_dtype("bfloat16")
    """
    if self.kind == "tpu" and dtype == "float16":
      raise ValueError(f"run.activation_dtype = 'float16' on {self.name}: TPUs compute in "
                       "float32 and bfloat16 only; set run.activation_dtype = 'bfloat16'.")

  def matrix_flops_per_s(self, dtype: str) -> float:
    """Peak matrix FLOP/s of one device for products of `dtype` operands
    ("bfloat16", "float16" or "float32").

    Example:
      >>> preset("a100-80gb").matrix_flops_per_s("float32") / 1e12
      156.0
    """
    float32 = self.float32_flops_per_s or self.peak_flops_per_s
    if "bfloat16" in dtype:
      return self.peak_flops_per_s if self.bfloat16 else float32
    return self.peak_flops_per_s if "float16" in dtype else float32

  def for_products(self, dtype: str) -> "Hardware":
    """This hardware with peak_flops_per_s at `dtype`'s rate
    (`matrix_flops_per_s`): what prices a step whose activations are `dtype`.

    Example:
      >>> preset("v100-32gb").for_products("bfloat16").peak_flops_per_s / 1e12
      15.7
    """
    rate = self.matrix_flops_per_s(dtype)
    return self if rate == self.peak_flops_per_s else dataclasses.replace(
        self, peak_flops_per_s=rate)

  def slower_products_note(self, dtype: str) -> Optional[str]:
    """A line for a plan whose `dtype` products run below peak_flops_per_s,
    else None.

    Example:
      >>> preset("a100-80gb").slower_products_note("bfloat16") is None
      True
    """
    rate = self.matrix_flops_per_s(dtype)
    if rate == self.peak_flops_per_s:
      return None
    why = ("it has no bfloat16 matrix units" if "bfloat16" in dtype
           else "float32 products run below the 16-bit rate")
    fix = "float16" if not self.bfloat16 else "bfloat16"
    return (f"{dtype} products priced at {rate / 1e12:.4g} TFLOP/s, not the {self.name}'s "
            f"{self.peak_flops_per_s / 1e12:.4g} ({why}): run.activation_dtype = '{fix}' "
            "runs them at the full rate")

  def to_json(self) -> str:
    return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)


@dataclasses.dataclass(frozen=True)
class Cluster:
  """A number of identical devices.

  `slices` > 0: the devices form that many TPU slices of `count / slices`
  devices each (MaxText's "2x v5p-128"), joined by the data-center network;
  `hardware.max_slice_devices` is then the slice's size. 0: slices as large
  as `hardware.max_slice_devices` allows (one, up to a pod).

  Example:
    >>> Cluster(preset("tpu-v4"), 512).num_hosts
    128
    >>> str(parse_cluster("tpu-v5p:2x64"))
    'tpu-v5p:2x64'
  """
  hardware: Hardware
  count: int
  slices: int = 0

  @property
  def num_hosts(self) -> int:
    return -(-self.count // self.hardware.devices_per_host)

  def __str__(self):
    if self.slices:
      return f"{self.hardware.name}:{self.slices}x{self.count // self.slices}"
    return f"{self.hardware.name}:{self.count}"


# ---------------------------------------------------------------- presets
_A100 = "NVIDIA A100 Tensor Core GPU datasheet (2021): "
_DGXA = "NVIDIA DGX A100 datasheet: "
_V100 = "NVIDIA Tesla V100 GPU datasheet (SXM2): "
_DGX1 = "NVIDIA DGX-1 with Tesla V100 datasheet: "
_H100 = "NVIDIA H100 Tensor Core GPU datasheet (SXM): "
_H200 = "NVIDIA H200 Tensor Core GPU datasheet (SXM): "
_DGXH = "NVIDIA DGX H100/H200 datasheet: "
_JOUPPI20 = "Jouppi et al., 'A domain-specific supercomputer for training deep neural networks', CACM 2020: "
_CLOUD = "Google Cloud TPU documentation, system architecture page of the version: "
_ASSUMED = "assumed: typical latency of one ring step (order of magnitude, not a specification)"
_FITTED = "fitted on published runs: benchmarks/scale_validation.py"
_TF32 = ("; TensorFlow runs float32 products in TF32 by default "
         "(tf.config.experimental.enable_tensor_float_32_execution)")
_TPU_FLOAT32 = ("0: the bf16 rate (XLA's default precision multiplies float32 operands in "
                "bfloat16 passes)")


# Each kind's fitted efficiencies: every preset of that kind, and a JSON
# file that leaves them out, use them.
# GPU matmul and HBM efficiencies: fitted together on three rows of
# Narayanan et al. 2021, Table 1 (planned with the dropout those runs used),
# with the planner's default pricing (the step as XLA compiles it, unfused
# attention): benchmarks/scale_validation.py --fit.
# TPUs: the matrix products' efficiency fitted on MaxText's smallest TPU v5e
# and v5p runs, HBM as the GPUs' (benchmarks/scale_validation.py names the
# rows).
# FlashAttention's share of peak (attention_efficiency), by GPU generation:
# fitted on MosaicML's 7B and 3B runs of 65,536 tokens on 8 A100 80 GB and
# on 8 H100 (benchmarks/mosaic_sweep.py --fit); the H200 is the H100's chip.
_ATTENTION = {"a100": 0.672, "h100": 0.366}
_FITTED_ATTENTION = "fitted on published runs: benchmarks/mosaic_sweep.py --fit"
_FITTED_EFFICIENCIES = {"gpu": dict(matmul_efficiency=0.765, hbm_efficiency=0.70),
                        "tpu": dict(matmul_efficiency=0.95, hbm_efficiency=0.70)}


def _gpu(name, flops, hbm, hbm_bw, nvlink, nic, sources, attention=None, **kw) -> Hardware:
  # attention: the generation whose fitted attention_efficiency applies.
  if attention:
    kw["attention_efficiency"] = _ATTENTION[attention]
    sources = dict(sources, attention_efficiency=f"{_FITTED_ATTENTION} ({attention.upper()})")
  return Hardware(name=name, kind="gpu", peak_flops_per_s=flops, hbm_bytes=hbm,
                  hbm_bytes_per_s=hbm_bw, devices_per_host=8, intra_host_bytes_per_s=nvlink,
                  intra_host_latency_s=3e-6, network_bytes_per_s=nic, network_latency_s=8e-6,
                  sources=dict(sources, intra_host_latency_s=_ASSUMED,
                               network_latency_s=_ASSUMED, matmul_efficiency=_FITTED,
                               hbm_efficiency=_FITTED), **_FITTED_EFFICIENCIES["gpu"], **kw)


def _tpu(name, flops, hbm, hbm_bw, devices_per_host, torus_dims, ici_link, devices_per_chip,
         max_slice, sources, network=None, **kw) -> Hardware:
  # network: the data-center network per device and direction where the
  # documentation states it; else 100 Gb/s per host, assumed.
  return Hardware(name=name, kind="tpu", peak_flops_per_s=flops, hbm_bytes=hbm,
                  hbm_bytes_per_s=hbm_bw, devices_per_host=devices_per_host,
                  intra_host_latency_s=1.5e-6,
                  network_bytes_per_s=network or 12.5e9 / devices_per_host,
                  network_latency_s=10e-6, torus_dims=torus_dims, ici_link_bytes_per_s=ici_link,
                  devices_per_chip=devices_per_chip, max_slice_devices=max_slice,
                  sources={"intra_host_latency_s": _ASSUMED, "network_latency_s": _ASSUMED,
                           "float32_flops_per_s": _TPU_FLOAT32,
                           "network_bytes_per_s": "assumed: 100 Gb/s data-center network per host",
                           "matmul_efficiency": _FITTED, "hbm_efficiency": _FITTED, **sources},
                  **_FITTED_EFFICIENCIES["tpu"], **kw)


# GPUs: 8 per host (DGX / HGX boards). NVLink figures in the datasheets are
# both directions together; a ring sends in one direction, so per direction
# is half. One 200 Gb/s (A100) or 400 Gb/s (H100/H200) InfiniBand adapter
# per GPU: 25 or 50 GB/s per GPU and direction; a DGX-1 (V100) has four
# 100 Gb/s adapters for its 8 GPUs: 6.25 GB/s per GPU.
PRESETS: Dict[str, Hardware] = {}


def _add(h: Hardware) -> None:
  PRESETS[h.name] = h.validate()


for _gb in (16, 32):
  _add(_gpu(f"v100-{_gb}gb", 125e12, _gb * GB, 900 * GB, 150 * GB, 6.25 * GB, {
      "peak_flops_per_s": _V100 + "Tensor Performance 125 TFLOPS (float16; no bfloat16)",
      "hbm_bytes": _V100 + f"{_gb} GB HBM2",
      "hbm_bytes_per_s": _V100 + "900 GB/s",
      "float32_flops_per_s": _V100 + "Single-Precision 15.7 TFLOPS (no TF32)",
      "intra_host_bytes_per_s": _V100 + "NVLink 300 GB/s (both directions) -> 150 GB/s per "
                                "direction (a DGX-1's hybrid cube-mesh)",
      "network_bytes_per_s": _DGX1 + "4x 100 Gb/s EDR InfiniBand for 8 GPUs -> 6.25 GB/s per GPU",
      "devices_per_host": _DGX1 + "8x Tesla V100"}, float32_flops_per_s=15.7e12, bfloat16=False))
del _gb
_add(_gpu("a100-40gb", 312e12, 40 * GB, 1555 * GB, 300 * GB, 25 * GB, {
    "peak_flops_per_s": _A100 + "BF16 Tensor Core 312 TFLOPS (dense)",
    "hbm_bytes": _A100 + "40 GB HBM2",
    "float32_flops_per_s": _A100 + "TF32 Tensor Core 156 TFLOPS (dense)" + _TF32,
    "hbm_bytes_per_s": _A100 + "1,555 GB/s",
    "intra_host_bytes_per_s": _A100 + "NVLink 600 GB/s (both directions) -> 300 GB/s per direction",
    "network_bytes_per_s": _DGXA + "8x single-port 200 Gb/s HDR InfiniBand -> 25 GB/s per GPU",
    "devices_per_host": _DGXA + "8x A100 GPUs"}, float32_flops_per_s=156e12, attention="a100"))
_add(_gpu("a100-80gb", 312e12, 80 * GB, 2039 * GB, 300 * GB, 25 * GB, {
    "peak_flops_per_s": _A100 + "BF16 Tensor Core 312 TFLOPS (dense)",
    "hbm_bytes": _A100 + "80 GB HBM2e",
    "float32_flops_per_s": _A100 + "TF32 Tensor Core 156 TFLOPS (dense)" + _TF32,
    "hbm_bytes_per_s": _A100 + "2,039 GB/s (SXM)",
    "intra_host_bytes_per_s": _A100 + "NVLink 600 GB/s (both directions) -> 300 GB/s per direction",
    "network_bytes_per_s": _DGXA + "8x single-port 200 Gb/s HDR InfiniBand -> 25 GB/s per GPU",
    "devices_per_host": _DGXA + "8x A100 GPUs"}, float32_flops_per_s=156e12, attention="a100"))
_add(_gpu("h100-sxm", 989e12, 80 * GB, 3350 * GB, 450 * GB, 50 * GB, {
    "peak_flops_per_s": _H100 + "BF16 Tensor Core 1,979 TFLOPS with sparsity -> 989 dense",
    "hbm_bytes": _H100 + "80 GB HBM3",
    "float32_flops_per_s": _H100 + "TF32 Tensor Core 989 TFLOPS with sparsity -> 494.5 dense"
    + _TF32,
    "hbm_bytes_per_s": _H100 + "3.35 TB/s",
    "intra_host_bytes_per_s": _H100 + "NVLink 900 GB/s (both directions) -> 450 GB/s per direction",
    "network_bytes_per_s": _DGXH + "8x 400 Gb/s ConnectX-7 (NDR) -> 50 GB/s per GPU",
    "devices_per_host": _DGXH + "8x GPUs"}, float32_flops_per_s=494.5e12, attention="h100"))
_add(_gpu("h200", 989e12, 141 * GB, 4800 * GB, 450 * GB, 50 * GB, {
    "peak_flops_per_s": _H200 + "BF16 Tensor Core 1,979 TFLOPS with sparsity -> 989 dense",
    "hbm_bytes": _H200 + "141 GB HBM3e",
    "float32_flops_per_s": _H200 + "TF32 Tensor Core 989 TFLOPS with sparsity -> 494.5 dense"
    + _TF32,
    "hbm_bytes_per_s": _H200 + "4.8 TB/s",
    "intra_host_bytes_per_s": _H200 + "NVLink 900 GB/s (both directions) -> 450 GB/s per direction",
    "network_bytes_per_s": _DGXH + "8x 400 Gb/s ConnectX-7 (NDR) -> 50 GB/s per GPU",
    "devices_per_host": _DGXH + "8x GPUs"}, float32_flops_per_s=494.5e12, attention="h100"))
# TPU v2 and v3: a device is a TensorCore (2 per chip, each a TensorFlow
# device, as the Mesh-TensorFlow paper counts "cores"); the chip's HBM, its
# bandwidth and its 4 ICI links are shared by its 2 cores.
_add(_tpu("tpu-v2", 22.5e12, 8 * GIB, 350 * GB, 8, 2, 62e9, 2, 512, {
    "peak_flops_per_s": _JOUPPI20 + "45 TFLOPS (bf16) per chip, 2 cores -> 22.5 per core",
    "hbm_bytes": _JOUPPI20 + "16 GiB HBM per chip -> 8 GiB per core",
    "hbm_bytes_per_s": _JOUPPI20 + "700 GB/s per chip -> 350 per core",
    "ici_link_bytes_per_s": _JOUPPI20 + "4 ICI links of 496 Gbit/s per chip -> 62 GB/s per link",
    "torus_dims": _JOUPPI20 + "2D torus, 256 chips (512 cores) per pod",
    "devices_per_host": _JOUPPI20 + "4 chips (8 cores) per host"}))
_add(_tpu("tpu-v3", 61.5e12, 16 * GIB, 450 * GB, 8, 2, 82e9, 2, 2048, {
    "peak_flops_per_s": _JOUPPI20 + "123 TFLOPS (bf16) per chip, 2 cores -> 61.5 per core",
    "hbm_bytes": _JOUPPI20 + "32 GiB HBM per chip -> 16 GiB per core",
    "hbm_bytes_per_s": _JOUPPI20 + "900 GB/s per chip -> 450 per core",
    "ici_link_bytes_per_s": _JOUPPI20 + "4 ICI links of 656 Gbit/s per chip -> 82 GB/s per link",
    "torus_dims": _JOUPPI20 + "2D torus, 1,024 chips (2,048 cores) per pod",
    "devices_per_host": _JOUPPI20 + "4 chips (8 cores) per host"}))
_add(_tpu("tpu-v4", 275e12, 32 * GIB, 1200 * GB, 4, 3, 50e9, 1, 4096, {
    "peak_flops_per_s": _CLOUD + "TPU v4: 275 TFLOPS (bf16) per chip",
    "hbm_bytes": _CLOUD + "TPU v4: 32 GiB HBM2 per chip",
    "hbm_bytes_per_s": _CLOUD + "TPU v4: 1,200 GB/s",
    "ici_link_bytes_per_s": ("Jouppi et al., TPU v4 (ISCA 2023): an ICI link carries 400 Gbit/s "
                             "each way -> 50 GB/s; " + _CLOUD + "TPU v4: 1.1 PB/s all-reduce "
                             "bandwidth per 4,096-chip pod, about 270 GB/s per chip over 6 links"),
    "torus_dims": _CLOUD + "TPU v4: 3D torus, 4,096 chips per pod",
    "devices_per_host": _CLOUD + "TPU v4: 4 chips per host"}))
_add(_tpu("tpu-v5e", 197e12, 16 * GIB, 819 * GB, 8, 2, 50e9, 1, 256, {
    "peak_flops_per_s": _CLOUD + "TPU v5e: 197 TFLOPS (bf16) per chip",
    "hbm_bytes": _CLOUD + "TPU v5e: 16 GiB HBM2 per chip",
    "hbm_bytes_per_s": _CLOUD + "TPU v5e: 819 GB/s",
    "ici_link_bytes_per_s": _CLOUD + "TPU v5e: 4 ICI links, 1,600 Gbit/s per chip -> 50 GB/s per link",
    "torus_dims": _CLOUD + "TPU v5e: 2D torus, 256 chips per pod",
    "devices_per_host": _CLOUD + "TPU v5e: 8 chips per host (v5litepod-8)",
    "network_bytes_per_s": _CLOUD + "TPU v5e: NIC 2 x 100 Gb/s per host (6.4 Tb/s per 256-chip "
                           "pod) -> 25 Gb/s, 3.125 GB/s per chip"}, network=3.125e9))
_add(_tpu("tpu-v5p", 459e12, 95 * GIB, 2765 * GB, 4, 3, 100e9, 1, 8960, {
    "peak_flops_per_s": _CLOUD + "TPU v5p: 459 TFLOPS (bf16) per chip",
    "hbm_bytes": _CLOUD + "TPU v5p: HBM capacity per chip 95 GiB (HBM2e)",
    "hbm_bytes_per_s": _CLOUD + "TPU v5p: 2,765 GB/s",
    "ici_link_bytes_per_s": _CLOUD + "TPU v5p: 6 ICI links, 4,800 Gbit/s per chip -> 100 GB/s per link",
    "torus_dims": _CLOUD + "TPU v5p: 3D torus, 8,960 chips per pod",
    "devices_per_host": _CLOUD + "TPU v5p: 4 chips per host",
    "network_bytes_per_s": _CLOUD + "TPU v5p: data center network (DCN) bandwidth per chip "
                           "50 Gb/s -> 6.25 GB/s"}, network=6.25e9))

_add(_tpu("tpu-v6e", 918e12, 32 * GIB, 1638 * GB, 8, 2, 100e9, 1, 256, {
    "peak_flops_per_s": _CLOUD + "TPU v6e (Trillium): 918 TFLOPs (bf16) per chip",
    "hbm_bytes": _CLOUD + "TPU v6e: HBM capacity per chip 32 GB (taken as GiB, as v5e's 16 GB)",
    "hbm_bytes_per_s": _CLOUD + "TPU v6e: HBM bandwidth per chip 1,638 GBps",
    "ici_link_bytes_per_s": _CLOUD + "TPU v6e: 4 ICI ports, 800 GBps bidirectional per chip "
                            "-> 100 GB/s per link and direction",
    "torus_dims": _CLOUD + "TPU v6e: 2D torus, 256 chips per pod",
    "devices_per_host": _CLOUD + "TPU v6e: 8 chips per host"}))

# Aliases: the former round-number "gpu" and "tpu" device parameters.
ALIASES = {"gpu": "a100-80gb", "tpu": "tpu-v3", "a100": "a100-80gb", "h100": "h100-sxm",
           "v100": "v100-32gb",
           "v2": "tpu-v2", "v3": "tpu-v3", "v4": "tpu-v4", "v5e": "tpu-v5e", "v5p": "tpu-v5p",
           "v6e": "tpu-v6e", "trillium": "tpu-v6e"}


def find_preset(name: str) -> Optional[Hardware]:
  """The preset called `name`, an alias ("gpu" is a100-80gb, "tpu" tpu-v3)
  or any case of either; None when `name` names none. Every command that
  takes a preset name resolves it here.

  Example:
    >>> find_preset(" H100 ").name
    'h100-sxm'
  """
  key = name.strip().lower()
  return PRESETS.get(ALIASES.get(key, key))


def preset(name: str) -> Hardware:
  """The preset called `name` (as `find_preset`); raises ValueError naming
  the presets when there is none.

  Example:
    >>> preset("tpu-v4").torus_dims
    3
  """
  found = find_preset(name)
  if found is None:
    raise ValueError(f"unknown hardware {name!r}: use one of {sorted(PRESETS)} or a JSON "
                     "file (fields in docs/planning.md).")
  return found


def hardware_from_json(text_or_path: str) -> Tuple[Hardware, Optional[int]]:
  """A Hardware (and its optional `count`) from a JSON string or file.

  Example:
    >>> hw, count = hardware_from_json(preset("a100-80gb").to_json())
  """
  text = text_or_path
  if not text_or_path.lstrip().startswith("{"):
    if not os.path.isfile(text_or_path):
      raise ValueError(f"hardware file {text_or_path!r} does not exist: give a preset name "
                       f"({', '.join(sorted(PRESETS))}) or the path of a JSON file of "
                       "Hardware fields (docs/planning.md).")
    with open(text_or_path) as f:
      text = f.read()
  try:
    values = json.loads(text)
  except json.JSONDecodeError as e:
    raise ValueError(f"hardware file {text_or_path!r} is not valid JSON: {e}") from None
  if not isinstance(values, dict):
    raise ValueError(f"hardware file {text_or_path!r}: expected a JSON object of Hardware fields.")
  count = values.pop("count", None)
  fields = {f.name for f in dataclasses.fields(Hardware)}
  unknown = sorted(set(values) - fields)
  if unknown:
    raise ValueError(f"hardware file {text_or_path!r}: unknown fields {unknown}; the fields "
                     f"are {sorted(fields | {'count'})} (docs/planning.md).")
  missing = [f for f in ("name", "kind", "peak_flops_per_s", "hbm_bytes", "hbm_bytes_per_s",
                         "devices_per_host") if f not in values]
  if missing:
    raise ValueError(f"hardware file {text_or_path!r}: missing fields {missing}.")
  # Left out: the presets' fitted values, not the dataclass defaults.
  for field, value in _FITTED_EFFICIENCIES["tpu" if values["kind"] == "tpu" else "gpu"].items():
    values.setdefault(field, value)
  return Hardware(**values).validate(), count


def hardware_from_spec(spec: str) -> Hardware:
  """A preset by name, or a Hardware JSON object (`Hardware.to_json`);
  what `DeviceParams.hardware` holds.

  Example:
    >>> hardware_from_spec("a100-80gb").devices_per_host
    8
  """
  if spec.lstrip().startswith("{"):
    return hardware_from_json(spec)[0]
  return preset(spec)


def parse_cluster(spec: str) -> Cluster:
  """"NAME:COUNT" (a preset) or "FILE.json[:COUNT]"; for TPUs COUNT may be
  "SxN": S slices of N devices each, joined by the data-center network
  (`Cluster.slices`).

  Example:
    >>> parse_cluster("tpu-v3:512").hardware.name
    'tpu-v3'
    >>> parse_cluster("tpu-v5p:2x64").count
    128
  """
  if not spec or not spec.strip():
    raise ValueError("--hardware is empty: write NAME:COUNT, e.g. a100-80gb:1024 or tpu-v4:512.")
  spec = spec.strip()
  name, count, slices = spec, None, None
  if ":" in spec:
    head, tail = spec.rsplit(":", 1)
    sliced = re.fullmatch(r"\s*(\d+)\s*x\s*(\d+)\s*", tail)
    if tail.strip().isdigit():
      name, count = head, int(tail)
    elif sliced:
      name, slices, count = head, int(sliced.group(1)), int(sliced.group(2))
    elif not os.path.exists(spec):
      raise ValueError(f"--hardware={spec}: the count {tail!r} is not a whole number "
                       "(write e.g. a100-80gb:1024, or for TPU slices e.g. tpu-v5p:2x64).")
  if name.endswith(".json") or os.path.exists(name) or name.lstrip().startswith("{"):
    hardware, file_count = hardware_from_json(name)
    count = count if count is not None else file_count
  else:
    hardware = preset(name)
  if count is None:
    raise ValueError(f"--hardware={spec}: say how many devices, e.g. {hardware.name}:1024.")
  if count <= 0:
    raise ValueError(f"--hardware={spec}: the device count must be positive.")
  if slices is None:
    return Cluster(hardware, count)
  return _sliced(spec, hardware, slices, count)


def _sliced(spec: str, hardware: Hardware, slices: int, per_slice: int) -> Cluster:
  """`slices` TPU slices of `per_slice` devices (parse_cluster's "SxN")."""
  if hardware.kind != "tpu":
    raise ValueError(f"--hardware={spec}: slices (SxN) are TPU slices joined by the "
                     f"data-center network; {hardware.name} is a GPU: write "
                     f"{hardware.name}:{slices * per_slice} (hosts and their network are in "
                     "the preset).")
  if slices <= 0:
    raise ValueError(f"--hardware={spec}: the number of slices must be positive.")
  largest = hardware.max_slice_devices
  if largest and per_slice > largest:
    raise ValueError(f"--hardware={spec}: a slice of {per_slice} devices is larger than "
                     f"{hardware.name}'s largest ({largest}); use more, smaller slices.")
  if per_slice % hardware.devices_per_chip:
    raise ValueError(f"--hardware={spec}: a slice holds whole chips of "
                     f"{hardware.devices_per_chip} devices; make {per_slice} a multiple of it.")
  return Cluster(dataclasses.replace(hardware, max_slice_devices=per_slice),
                 slices * per_slice, slices)


def torus_shape(devices: int, hardware: Hardware) -> Tuple[int, ...]:
  """The chip torus of a TPU slice of `devices` devices (as square / cubic as
  possible, powers of two first), one slice at most.

  Example:
    >>> torus_shape(512, preset("tpu-v2"))
    (16, 16)
  """
  chips = max(min(devices, hardware.max_slice_devices or devices) // hardware.devices_per_chip, 1)
  dims = [1] * hardware.torus_dims
  n = chips
  # Deal prime factors (largest first) to the smallest dimension.
  factors = []
  f = 2
  while n > 1:
    while n % f == 0:
      factors.append(f)
      n //= f
    f += 1
  for f in sorted(factors, reverse=True):
    i = min(range(len(dims)), key=lambda k: dims[k])
    dims[i] *= f
  return tuple(sorted(dims))


def describe(cluster: Cluster) -> str:
  """One line about the cluster."""
  h = cluster.hardware
  line = (f"{cluster.count} x {h.name}: {h.peak_flops_per_s / 1e12:.0f} TFLOP/s "
          f"{'bf16' if h.bfloat16 else 'fp16'}, "
          f"{h.hbm_bytes / GIB:.0f} GiB HBM at {h.hbm_bytes_per_s / 1e9:.0f} GB/s per device")
  if h.kind == "gpu":
    line += (f"; {cluster.num_hosts} hosts of {h.devices_per_host} "
             f"(in-host {h.intra_host_bytes_per_s / 1e9:.0f} GB/s, network "
             f"{h.network_bytes_per_s / 1e9:.0f} GB/s per device)")
  else:
    dims = "x".join(str(d) for d in torus_shape(cluster.count, h))
    line += f"; {dims} chip torus, ICI {h.ici_link_bytes_per_s / 1e9:.0f} GB/s per link"
    slices = math.ceil(cluster.count / h.max_slice_devices) if h.max_slice_devices else 1
    if slices > 1:
      line += f", {slices} slices over the data-center network"
  return line
