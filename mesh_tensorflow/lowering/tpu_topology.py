"""Where the processors of a logical mesh go on a TPU slice's physical grid.

A TPU slice is a grid of chips (x, y, z), each with one or more cores; a
collective is fast when the processors it joins are physical neighbours. These
pure-Python helpers pick, for each logical processor number (pnum, row-major
over the mesh), a physical core:

* `logical_to_physical` walks the chips in a serpentine order (never jumping
  between non-neighbours) and lays the mesh over that walk, so processors
  adjacent along the last mesh dimension are adjacent chips.
* `auto_logical_to_physical_tpu` is the same mapping as physical processor
  numbers (the original's name and signature).
* `HierarchicalTiling` lets the user say, for each mesh dimension, the tile of
  the physical grid it spans.
* `tpu_device_assignment` turns a mapping into the
  `tf.tpu.experimental.DeviceAssignment` that `SimdMeshImpl` replicates over.

All of them are also importable from `mesh_tensorflow.lowering.simd_mesh_impl`.

    >>> tiling = HierarchicalTiling([("dp", None), ("mp", [1, 1, 2])], [8, 8, 2])
    >>> tiling.mesh_shape
    Shape[dp=64, mp=2]
"""

from __future__ import annotations

import math
from typing import List, Sequence, Tuple

import numpy as np
import tensorflow as tf

from mesh_tensorflow.core.layout import processor_coordinates_to_pnum
from mesh_tensorflow.core.shapes import Dimension, Shape, convert_to_shape


def logical_to_physical(mesh_shape, physical_shape, cores_per_chip: int = 1) -> List[tuple]:
  """Physical coordinates (x, y, z, core) for each pnum of a logical mesh.

  Processors adjacent along the LAST mesh dimension (the one collectives of
  model parallelism use most) land on physically adjacent chips: the chips
  are walked in a serpentine (boustrophedon) order through the physical
  grid, which never jumps between non-neighbouring chips, and the logical
  mesh is laid over that walk in row-major order.

  Args:
    mesh_shape: the logical mesh (an mtf Shape, string or list of sizes).
    physical_shape: chips per physical axis, e.g. [4, 4, 1] for a 4x4 slice.
    cores_per_chip: TPU cores per chip (each core is one processor).

  Returns:
    One (x, y, z, core) tuple per pnum.

  Example:
    >>> logical_to_physical("rows:4;cols:4", [4, 4, 1])[:5]
    [(0, 0, 0, 0), (1, 0, 0, 0), (2, 0, 0, 0), (3, 0, 0, 0), (3, 1, 0, 0)]
  """
  if isinstance(mesh_shape, (list, tuple)) and all(isinstance(s, int) for s in mesh_shape):
    size = int(np.prod(mesh_shape))
  else:
    size = convert_to_shape(mesh_shape).size
  physical_shape = list(physical_shape) + [1] * (3 - len(physical_shape))
  x_n, y_n, z_n = physical_shape[:3]
  if x_n * y_n * z_n * cores_per_chip != size:
    raise ValueError(
        f"logical_to_physical: the mesh has {size} processors but the physical slice "
        f"{physical_shape} with {cores_per_chip} core(s) per chip has "
        f"{x_n * y_n * z_n * cores_per_chip}. Pick a mesh whose size matches the slice.")
  walk = []
  for z in range(z_n):
    ys = range(y_n) if z % 2 == 0 else reversed(range(y_n))
    for j, y in enumerate(ys):
      forward = (j + z * y_n) % 2 == 0
      xs = range(x_n) if forward else reversed(range(x_n))
      for x in xs:
        for core in range(cores_per_chip):
          walk.append((x, y, z, core))
  return walk


def tpu_device_assignment(mesh_shape, physical_shape, cores_per_chip: int = 1,
                          topology=None):
  """A `tf.tpu.experimental.DeviceAssignment` placing pnum p on the chip
  `logical_to_physical(...)[p]`: replica p runs SIMD processor p.

  Without a TPU system, pass no `topology`: one is described from
  `physical_shape` (single host), which is enough to build and inspect the
  program.

  Example:
    >>> da = tpu_device_assignment("rows:2;cols:4", [2, 2, 1], cores_per_chip=2)
    >>> da.num_replicas
    8
  """
  coords = logical_to_physical(mesh_shape, physical_shape, cores_per_chip)
  physical_shape = list(physical_shape) + [1] * (3 - len(physical_shape))
  if topology is None:
    device_coordinates = []
    for z in range(physical_shape[2]):
      for y in range(physical_shape[1]):
        for x in range(physical_shape[0]):
          for core in range(cores_per_chip):
            device_coordinates.append([x, y, z, core])
    topology = tf.tpu.experimental.Topology(
        mesh_shape=physical_shape + [cores_per_chip],
        device_coordinates=np.array([device_coordinates], np.int32))
  core_assignment = np.array([[list(c)] for c in coords], np.int32)
  return tf.tpu.experimental.DeviceAssignment(topology, core_assignment)


def _physical_pnums(physical_shape: Sequence[int], coordinates) -> List[int]:
  """Row-major processor numbers of physical `coordinates` on the grid."""
  grid = Shape([Dimension(f"axis{i}", s) for i, s in enumerate(physical_shape)])
  return [processor_coordinates_to_pnum(grid, c) for c in coordinates]


def auto_logical_to_physical_tpu(logical_shape: Sequence[int], physical_shape: Sequence[int],
                                 return_coordinates: bool = False,
                                 device_assignment=None):
  """For each logical pnum, the physical processor it runs on (replaces the
  original's function of this name; see `logical_to_physical`).

  Args:
    logical_shape: the mesh's sizes, e.g. [16, 8] (or an mtf Shape / string).
    physical_shape: 1 to 3 chip-grid sizes, or [x, y, z, cores_per_chip].
    return_coordinates: return physical coordinates (lists, in the rank of
      `physical_shape`) instead of processor numbers.
    device_assignment: not supported (the mapping is computed from the
      shapes); pass the result to `tpu_device_assignment` instead.

  Returns:
    A permutation of range(product(physical_shape)): entry p is the row-major
    number of logical processor p's physical core (or its coordinates).

  Example:
    >>> auto_logical_to_physical_tpu([2, 2], [2, 2])
    [0, 2, 3, 1]
  """
  if device_assignment is not None:
    raise ValueError(
        "auto_logical_to_physical_tpu: device_assignment is not supported; compute the "
        "mapping from the shapes and build the assignment with tpu_device_assignment().")
  physical_shape = [int(s) for s in physical_shape]
  if not 1 <= len(physical_shape) <= 4:
    raise ValueError(f"auto_logical_to_physical_tpu: physical_shape {physical_shape} must "
                     "have 1 to 3 chip dimensions, or 4 with cores per chip last.")
  chips, cores = (physical_shape[:3], physical_shape[3]) if len(physical_shape) == 4 else (
      physical_shape, 1)
  if isinstance(logical_shape, (list, tuple)) and all(isinstance(s, int) for s in logical_shape):
    logical_shape = [Dimension(f"d{i}", s) for i, s in enumerate(logical_shape)]
  walk = logical_to_physical(logical_shape, chips, cores)
  rank = len(physical_shape)
  coords = [list(c[:len(chips)]) + ([c[3]] if rank == 4 else []) for c in walk]
  if return_coordinates:
    return coords
  return _physical_pnums(physical_shape, coords)


class HierarchicalTiling:
  """A mesh whose every dimension spans a tile of the physical grid.

  `spec` lists the mesh dimensions, outermost first, each as (name, tile):
  the tile is the shape (one size per physical axis) that the dimension's
  processors cover once projected onto the grid. The last dimension's
  processors form one compact tile; each earlier dimension steps over whole
  tiles of the dimensions after it (so it is the more strided one). The first
  tile may be None: it is whatever the others leave of the grid.

  Args:
    spec: a list of (name, list of ints or None) pairs.
    physical_shape: the grid, e.g. [8, 8, 2] (x, y, cores).

  Example:
    >>> t = HierarchicalTiling([("dp", None), ("mp", [1, 1, 2])], [2, 2, 2])
    >>> t.mesh_shape, t.logical_to_physical
    (Shape[dp=4, mp=2], [0, 1, 2, 3, 4, 5, 6, 7])
  """

  def __init__(self, spec, physical_shape: Sequence[int]):
    physical_shape = [int(s) for s in physical_shape]
    names = [name for name, _ in spec]
    tiles = [None if t is None else [int(s) for s in t] for _, t in spec]
    for name, tile in zip(names, tiles):
      if tile is not None and len(tile) != len(physical_shape):
        raise ValueError(f"HierarchicalTiling: the tile {tile} of mesh dimension {name!r} "
                         f"must give one size per physical axis of {physical_shape}.")
    if any(t is None for t in tiles[1:]):
      raise ValueError("HierarchicalTiling: only the first mesh dimension's tile may be "
                       f"None, got spec {spec}.")
    if tiles and tiles[0] is None:
      rest = [math.prod(t[j] for t in tiles[1:]) for j in range(len(physical_shape))]
      if any(p % r for p, r in zip(physical_shape, rest)):
        raise ValueError(f"HierarchicalTiling: the tiles of spec {spec} do not divide "
                         f"the physical shape {physical_shape}.")
      tiles[0] = [p // r for p, r in zip(physical_shape, rest)]
    covered = [math.prod(t[j] for t in tiles) for j in range(len(physical_shape))]
    if covered != physical_shape:
      raise ValueError(f"HierarchicalTiling: the tiles of spec {spec} multiply to "
                       f"{covered} per physical axis, not the physical shape {physical_shape}.")
    # stride of mesh dimension i along physical axis j: the extent of the
    # tiles of all later dimensions along j
    strides = []
    for i in range(len(tiles)):
      strides.append([math.prod(t[j] for t in tiles[i + 1:]) for j in range(len(physical_shape))])
    self._mesh_shape = Shape([Dimension(n, math.prod(t)) for n, t in zip(names, tiles)])
    self._coordinates: List[Tuple[int, ...]] = []
    for logical in np.ndindex(*[d.size for d in self._mesh_shape.dims]):
      physical = [0] * len(physical_shape)
      for c, tile, stride in zip(logical, tiles, strides):
        for j, digit in enumerate(np.unravel_index(c, tile)):
          physical[j] += int(digit) * stride[j]
      self._coordinates.append(tuple(physical))
    self._logical_to_physical = _physical_pnums(physical_shape, self._coordinates)

  @property
  def mesh_shape(self) -> Shape:
    """The logical mesh: one dimension per spec entry, sized by its tile."""
    return self._mesh_shape

  @property
  def logical_to_physical(self) -> List[int]:
    """For each logical pnum, the row-major number of its physical processor."""
    return list(self._logical_to_physical)

  @property
  def physical_coordinates(self) -> List[Tuple[int, ...]]:
    """For each logical pnum, its coordinates on the physical grid."""
    return list(self._coordinates)

  @classmethod
  def spec_to_mesh_shape(cls, spec, num_processors: int) -> Shape:
    """The mesh shape of `spec` on `num_processors` processors, without the
    physical shape (the first tile may be None: it takes what is left).

    Example:
      >>> HierarchicalTiling.spec_to_mesh_shape([("dp", None), ("mp", [2, 1])], 16)
      Shape[dp=8, mp=2]
    """
    sizes = [None if t is None else math.prod(t) for _, t in spec]
    known = math.prod(s for s in sizes[1:] if s is not None)
    if sizes and sizes[0] is None:
      if num_processors % known:
        raise ValueError(f"HierarchicalTiling: spec {spec} does not divide "
                         f"{num_processors} processors.")
      sizes[0] = num_processors // known
    if None in sizes or math.prod(sizes) != num_processors:
      raise ValueError(f"HierarchicalTiling: spec {spec} gives {sizes}, not "
                       f"{num_processors} processors in all.")
    return Shape([Dimension(name, s) for (name, _), s in zip(spec, sizes)])


def physical_shape_3d_from_topology_proto_4d(mesh_shape: Sequence[int]) -> List[int]:
  """The 3-D physical shape [y * z, x, cores] that `auto_logical_to_physical_tpu`
  takes, from a TPU topology's 4-D mesh shape [x, y, z, cores_per_chip]
  (`tf.tpu.experimental.Topology.mesh_shape`).

  Example:
    >>> physical_shape_3d_from_topology_proto_4d([4, 4, 2, 2])
    [8, 4, 2]
  """
  mesh_shape = [int(n) for n in mesh_shape]
  if len(mesh_shape) != 4:
    raise ValueError(f"physical_shape_3d_from_topology_proto_4d: expected a 4-D topology "
                     f"mesh shape [x, y, z, cores_per_chip], got {mesh_shape}.")
  return [mesh_shape[1] * mesh_shape[2], mesh_shape[0], mesh_shape[3]]


def topology_rank(topology) -> int:
  """The number of dimensions of a TPU topology's mesh shape.

  Args:
    topology: a `tf.tpu.experimental.Topology` or its serialized proto (bytes,
      as `tf.tpu.experimental.initialize_tpu_system` returns it).

  Example:
    >>> topology_rank(tf.tpu.experimental.Topology(
    ...     mesh_shape=[2, 1, 1, 2],
    ...     device_coordinates=[[[0, 0, 0, 0], [0, 0, 0, 1], [1, 0, 0, 0], [1, 0, 0, 1]]]))
    4
  """
  if isinstance(topology, bytes):
    topology = tf.tpu.experimental.Topology(serialized=topology)
  if not isinstance(topology, tf.tpu.experimental.Topology):
    raise ValueError(f"topology_rank: expected a tf.tpu.experimental.Topology or its "
                     f"serialized bytes, got {type(topology).__name__}.")
  return len(topology.mesh_shape)
