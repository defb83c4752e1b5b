"""Where mesh coordinates live on a cluster, and what a collective costs there.

Processor numbers are row-major over the mesh shape (the last mesh dimension
varies fastest, `mtf.pnum_to_processor_coordinates`), and a host holds
`devices_per_host` consecutive processor numbers: on `batch:16;model:8` with
8 GPUs per host, the 8 `model` processors of one `batch` index share a host.

A collective runs over the groups of processors that differ only in its mesh
axes. `group_levels` splits a group into levels, fastest first, each a ring
of `factor` members over one kind of link:

* GPUs: the members inside one host (NVLink), then the hosts (network, one
  adapter per GPU, so the k rings of a host run side by side);
* TPUs: the two cores of a chip (v2, v3), then each torus dimension the group
  spans (a ring over the wrap-around links when it spans the whole
  dimension, a line otherwise), then the slices (data-center network).

`collective_time` prices the collective hierarchically on those levels (ring
reduce-scatter up the levels, the matching all-gather down), with one
latency per ring step:

    >>> cluster = hardware.parse_cluster("a100-80gb:64")
    >>> levels = group_levels([8, 8], [0], cluster)   # across the 8 hosts
    >>> [(lv.link, lv.factor) for lv in levels]
    [('network', 8)]
"""

from __future__ import annotations

import dataclasses
from typing import List, Sequence, Tuple

from mesh_tensorflow.analysis.cost_model import hardware as hardware_lib


@dataclasses.dataclass(frozen=True)
class Level:
  """One ring of a hierarchical collective.

  Attributes:
    link: "nvlink", "network", "chip", "ici", "dcn" (what carries it).
    factor: members of the ring.
    bytes_per_s: bytes/s one member sends on it.
    latency_s: latency of one ring step.
  """
  link: str
  factor: int
  bytes_per_s: float
  latency_s: float


LINK_NAMES = {"nvlink": "NVLink (in host)", "network": "network (across hosts)",
              "chip": "TPU chip", "ici": "ICI torus", "dcn": "data-center network"}


def processor_coordinates(mesh_sizes: Sequence[int], pnum: int) -> Tuple[int, ...]:
  """Row-major coordinates of processor `pnum` (last dimension fastest).

  Example:
    >>> processor_coordinates([2, 4], 5)
    (1, 1)
  """
  coords = []
  for size in reversed(list(mesh_sizes)):
    coords.append(pnum % size)
    pnum //= size
  return tuple(reversed(coords))


def processor_number(mesh_sizes: Sequence[int], coords: Sequence[int]) -> int:
  """The inverse of `processor_coordinates`."""
  p = 0
  for size, c in zip(mesh_sizes, coords):
    p = p * size + c
  return p


def host_of(pnum: int, devices_per_host: int) -> int:
  """The host of processor `pnum`: devices_per_host consecutive numbers each.

  Example:
    >>> [host_of(p, 8) for p in (0, 7, 8, 15, 16)]
    [0, 0, 1, 1, 2]
  """
  return pnum // devices_per_host


def group_members(mesh_sizes: Sequence[int], axes: Sequence[int], pnum: int = 0) -> List[int]:
  """Processor numbers of the group over `axes` that holds `pnum`.

  Example:
    >>> group_members([2, 4], [0])
    [0, 4]
  """
  base = list(processor_coordinates(mesh_sizes, pnum))
  members = [base]
  for a in axes:
    members = [m[:a] + [i] + m[a + 1:] for m in members for i in range(mesh_sizes[a])]
  return sorted(processor_number(mesh_sizes, m) for m in members)


def hosts_of_group(mesh_sizes: Sequence[int], axes: Sequence[int],
                   devices_per_host: int) -> Tuple[int, int]:
  """(members per host, hosts) of the first group over `axes`.

  Example:
    >>> hosts_of_group([16, 8], [1], 8), hosts_of_group([16, 8], [0], 8)
    ((8, 1), (1, 16))
  """
  members = group_members(mesh_sizes, axes)
  hosts = {}
  for p in members:
    hosts[host_of(p, devices_per_host)] = hosts.get(host_of(p, devices_per_host), 0) + 1
  return max(hosts.values()), len(hosts)


def group_levels(mesh_sizes: Sequence[int], axes: Sequence[int],
                 cluster: "hardware_lib.Cluster") -> List[Level]:
  """The rings (fastest first) a collective over `axes` runs on."""
  h = cluster.hardware
  axes = [a for a in axes if mesh_sizes[a] > 1]
  if not axes:
    return []
  members = group_members(mesh_sizes, axes)
  if h.kind == "gpu":
    local, hosts = hosts_of_group(mesh_sizes, axes, h.devices_per_host)
    levels = []
    if local > 1:
      levels.append(Level("nvlink", local, h.intra_host_bytes_per_s, h.intra_host_latency_s))
    if hosts > 1:
      levels.append(Level("network", hosts, h.network_bytes_per_s, h.network_latency_s))
    return levels
  return _tpu_levels(members, cluster)


def _tpu_levels(members: List[int], cluster) -> List[Level]:
  h = cluster.hardware
  levels = []
  slice_size = h.max_slice_devices or cluster.count
  slices = sorted({p // slice_size for p in members})
  in_slice = [p for p in members if p // slice_size == slices[0]]
  torus = hardware_lib.torus_shape(min(cluster.count, slice_size), h)
  chips = {}
  for p in in_slice:
    chip = (p % slice_size) // h.devices_per_chip
    chips.setdefault(chip, []).append(p)
  cores = max(len(v) for v in chips.values())
  # Cores of one chip not in this group belong to another group that runs at
  # the same time over the same links.
  share = h.devices_per_chip // cores
  if cores > 1:
    levels.append(Level("chip", cores, h.hbm_bytes_per_s, h.intra_host_latency_s))
  coords = [processor_coordinates(torus, c) for c in chips]
  for d, size in enumerate(torus):
    span = len({c[d] for c in coords})
    if span > 1:
      wraps = span == size and size > 2
      bw = h.ici_link_bytes_per_s * (2 if wraps else 1) / share
      levels.append(Level("ici", span, bw, h.intra_host_latency_s))
  if len(slices) > 1:
    levels.append(Level("dcn", len(slices), h.network_bytes_per_s, h.network_latency_s))
  return levels


def _reduce_scatter(nbytes: float, levels: Sequence[Level]) -> float:
  t, done = 0.0, 1
  for lv in levels:
    done *= lv.factor
    t += (lv.factor - 1) / done * nbytes / lv.bytes_per_s + (lv.factor - 1) * lv.latency_s
  return t


def collective_time(kind: str, bytes_per_processor: float, levels: Sequence[Level]) -> float:
  """Seconds of one collective over rings `levels` (fastest first).

  kind: "allreduce" (bytes: the tensor each processor holds),
  "reduce_scatter" (bytes: the input), "allgather" (bytes: each
  processor's piece), "alltoall" (bytes each processor holds), anything
  else a send of the bytes over the slowest level.

  Example:
    >>> nv = Level("nvlink", 8, 300e9, 3e-6)
    >>> round(collective_time("allreduce", 1e9, [nv]) * 1e3, 2)   # 2*7/8 GB / 300 GB/s
    5.88
  """
  levels = [lv for lv in levels if lv.factor > 1]
  if not levels:
    return 0.0
  b = float(bytes_per_processor)
  group = 1
  for lv in levels:
    group *= lv.factor
  if kind == "allreduce":
    return 2 * _reduce_scatter(b, levels)
  if kind == "reduce_scatter":
    return _reduce_scatter(b, levels)
  if kind == "allgather":
    return _reduce_scatter(b * group, levels)
  if kind == "alltoall":
    t, below = 0.0, 1
    for lv in levels:
      fraction = (lv.factor - 1) * below / group
      # A ring of k members carries an all-to-all at about k/4 times the
      # bytes of each link (bisection bandwidth), when k > 4.
      crowd = max(lv.factor / 4.0, 1.0) if lv.link in ("ici", "dcn") else 1.0
      t += b * fraction * crowd / lv.bytes_per_s + (lv.factor - 1) * lv.latency_s
      below *= lv.factor
    return t
  slowest = levels[-1]
  return b / slowest.bytes_per_s + slowest.latency_s


def link_label(levels: Sequence[Level]) -> str:
  """Human-readable links, e.g. "NVLink (in host) 8 + network (across hosts) 16"."""
  if not levels:
    return "-"
  return " + ".join(f"{LINK_NAMES.get(lv.link, lv.link)} x{lv.factor}" for lv in levels)


def point_to_point_time(nbytes: float, mesh_sizes: Sequence[int], axis: int,
                        cluster: "hardware_lib.Cluster") -> float:
  """A send of `nbytes` to the neighbour along mesh `axis` (pipeline stages).

  Example:
    >>> point_to_point_time(1e6, [4, 8], 0, hardware_lib.parse_cluster("a100-80gb:32"))
    4.8e-05
  """
  levels = group_levels(mesh_sizes, [axis], cluster)
  if not levels:
    return 0.0
  slowest = levels[-1]
  return nbytes / slowest.bytes_per_s + slowest.latency_s
