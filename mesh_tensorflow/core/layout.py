"""Layout rules: which tensor dimensions are split over which mesh dimensions.

This module is pure Python (no TensorFlow): a layout is a mapping from tensor
dimension names to mesh dimension names, and a `TensorLayout` is what that
mapping means for one tensor on one mesh.

    >>> rules = convert_to_layout_rules("batch:rows;hidden:cols")
    >>> mesh_shape = convert_to_shape("rows:2;cols:4")
    >>> rules.tensor_layout(convert_to_shape("batch:8;hidden:16"), mesh_shape)
    TensorLayout(0, 1)
"""

from __future__ import annotations

import functools
from typing import Iterable, List, Optional, Sequence, Tuple

import numpy as np

from mesh_tensorflow.core.shapes import convert_to_shape, parse_pairs


class LayoutRules:
  """A set of (tensor dimension name, mesh dimension name) pairs.

  Example:
    >>> LayoutRules([("batch", "rows"), ("hidden", "cols")])
    LayoutRules('batch:rows;hidden:cols')
  """

  def __init__(self, pairs: Iterable[Tuple[str, str]]):
    self._pairs = []
    seen = {}
    for pair in pairs:
      if len(pair) != 2 or not all(isinstance(p, str) and p for p in pair):
        raise ValueError(
            f"Layout rule {pair!r} must be a pair (tensor_dim_name, mesh_dim_name).")
      t, m = pair
      if t in seen and seen[t] != m:
        raise ValueError(
            f"Layout rules map tensor dimension {t!r} to both {seen[t]!r} and "
            f"{m!r}; give each tensor dimension one mesh dimension.")
      if t not in seen:
        seen[t] = m
        self._pairs.append((t, m))
    self._map = seen

  @property
  def pairs(self):
    return list(self._pairs)

  def __iter__(self):
    return iter(self._pairs)

  def __len__(self):
    return len(self._pairs)

  def __eq__(self, other):
    return isinstance(other, LayoutRules) and set(self._pairs) == set(other._pairs)

  def __hash__(self):
    return hash(frozenset(self._pairs))

  def __repr__(self):
    return f"LayoutRules({self.to_string()!r})"

  def to_string(self) -> str:
    return ";".join(f"{t}:{m}" for t, m in self._pairs)

  def mesh_dimension_name(self, tensor_dim_name: str) -> Optional[str]:
    return self._map.get(tensor_dim_name)

  def mesh_dimension_name_to_tensor_dimension_names(self, mesh_dimension_name: str) -> List[str]:
    """The tensor dimension names the rules map to `mesh_dimension_name`."""
    return [t for t, m in self._pairs if m == mesh_dimension_name]

  def check_mesh_shape(self, mesh_shape) -> None:
    """Raises if a rule names a mesh dimension that `mesh_shape` lacks."""
    mesh_shape = convert_to_shape(mesh_shape)
    names = set(mesh_shape.dimension_names)
    for t, m in self._pairs:
      if m not in names:
        raise ValueError(
            f"Layout rule '{t}:{m}' names mesh dimension {m!r}, but the mesh "
            f"shape is '{mesh_shape.to_string()}' (dimensions "
            f"{sorted(names)}). Fix the rule or add {m!r} to the mesh shape.")

  def tensor_dimension_to_mesh_axis(self, tensor_dimension, mesh_shape) -> Optional[int]:
    """Index of the mesh dimension that splits `tensor_dimension`, or None."""
    m = self._map.get(tensor_dimension.name)
    if m is None:
      return None
    names = convert_to_shape(mesh_shape).dimension_names
    return names.index(m) if m in names else None

  def tensor_layout(self, tensor_shape, mesh_shape, tensor_name: str = "") -> "TensorLayout":
    """The layout of a tensor of `tensor_shape` on a mesh of `mesh_shape`.

    Raises:
      ValueError: if two dimensions of the tensor would be split over one mesh
        dimension, or a mesh dimension does not divide the dimension it splits.
    """
    tensor_shape = convert_to_shape(tensor_shape)
    mesh_shape = convert_to_shape(mesh_shape)
    what = f"tensor {tensor_name!r} " if tensor_name else "tensor "
    axes = []
    used = {}
    for d in tensor_shape.dims:
      a = self.tensor_dimension_to_mesh_axis(d, mesh_shape)
      if a is not None:
        mdim = mesh_shape.dims[a]
        if a in used:
          raise ValueError(
              f"Layout splits two dimensions of {what}{tensor_shape} over mesh "
              f"dimension {mdim.name!r}: {used[a]!r} and {d.name!r}. A mesh "
              f"dimension can split at most one dimension of a tensor; change "
              f"the rule for {d.name!r} or {used[a]!r}.")
        if d.size % mdim.size:
          raise ValueError(
              f"Mesh dimension {mdim.name!r} (size {mdim.size}) does not divide "
              f"dimension {d.name!r} (size {d.size}) of {what}{tensor_shape}. "
              f"Make {d.name!r} a multiple of {mdim.size} or drop the rule "
              f"'{d.name}:{mdim.name}'.")
        used[a] = d.name
      axes.append(a)
    return TensorLayout(axes)


def convert_to_layout_rules(x) -> LayoutRules:
  """Converts a LayoutRules, a list of pairs, or a string "a:rows;b:cols"."""
  if isinstance(x, LayoutRules):
    return x
  if x is None:
    return LayoutRules([])
  if isinstance(x, str):
    return LayoutRules(parse_pairs(x, "layout rule"))
  if isinstance(x, dict):
    return LayoutRules(list(x.items()))
  return LayoutRules(x)


class TensorLayout(tuple):
  """For each tensor dimension, the mesh axis that splits it (or None)."""

  def __new__(cls, axes: Sequence[Optional[int]]):
    return super().__new__(cls, tuple(axes))

  def __repr__(self):
    return "TensorLayout(" + ", ".join(str(a) for a in self) + ")"

  def tensor_axis_to_mesh_axis(self, tensor_axis: int) -> Optional[int]:
    return self[tensor_axis]

  def mesh_axis_to_tensor_axis(self, mesh_ndims: int) -> Tuple[Optional[int], ...]:
    """For each of the first `mesh_ndims` mesh axes, the tensor axis it splits
    (or None).

    >>> TensorLayout([0, 2, 1]).mesh_axis_to_tensor_axis(2)
    (0, 2)
    """
    return tuple(self.index(m) if m in self else None for m in range(mesh_ndims))

  @property
  def is_fully_replicated(self) -> bool:
    return all(a is None for a in self)


def pnum_to_processor_coordinates(mesh_shape, pnum: int) -> List[int]:
  """Row-major coordinates of processor `pnum` in the mesh."""
  sizes = convert_to_shape(mesh_shape).to_integer_list()
  coords = []
  for s in reversed(sizes):
    coords.append(pnum % s)
    pnum //= s
  return coords[::-1]


def processor_coordinates_to_pnum(mesh_shape, coordinates: Sequence[int]) -> int:
  """Inverse of `pnum_to_processor_coordinates`."""
  pnum = 0
  for c, s in zip(coordinates, convert_to_shape(mesh_shape).to_integer_list()):
    pnum = pnum * s + c
  return pnum


def processor_groups(mesh_shape, mesh_axes: Sequence[int]) -> List[List[int]]:
  """Groups of pnums that differ only along `mesh_axes` (in row-major order).

  An allreduce over `mesh_axes` combines exactly the processors of a group.
  """
  sizes = tuple(convert_to_shape(mesh_shape).to_integer_list())
  return [list(g) for g in _processor_groups(sizes, tuple(sorted(set(mesh_axes))))]


@functools.lru_cache(maxsize=512)
def _processor_groups(sizes: Tuple[int, ...], axes: Tuple[int, ...]) -> Tuple[Tuple[int, ...], ...]:
  """The groups of `processor_groups`: the pnums laid out as the mesh, the
  group axes moved last (rows in row-major order of the other axes,
  members in row-major order of the group axes)."""
  pnums = np.arange(int(np.prod(sizes, dtype=np.int64)), dtype=np.int64).reshape(sizes)
  group_size = int(np.prod([sizes[a] for a in axes], dtype=np.int64))
  rows = np.moveaxis(pnums, list(axes), list(range(len(sizes) - len(axes), len(sizes))))
  return tuple(map(tuple, rows.reshape(-1, group_size).tolist()))


from mesh_tensorflow.core import autograph_exempt as _autograph_exempt  # noqa: E402  pylint: disable=g-import-not-at-top
_autograph_exempt.exempt(globals())  # AutoGraph leaves this module's code alone
