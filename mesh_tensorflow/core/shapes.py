"""Named dimensions and shapes.

A `Dimension` is a (name, size) pair; a `Shape` is an ordered list of dimensions
with distinct names. Shapes can be written as strings:

    >>> convert_to_shape("batch:8;hidden:64")
    Shape[batch=8, hidden=64]
"""

from __future__ import annotations

import collections
import functools
import operator
import re
from typing import Iterable, Optional, Sequence, Union

_NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]+$")


class Dimension(collections.namedtuple("Dimension", ["name", "size"])):
  """A named tensor dimension, e.g. `Dimension("batch", 512)`."""

  __slots__ = ()

  def __new__(cls, name: str, size: int):
    if not isinstance(name, str) or not name:
      raise TypeError(f"Dimension name must be a non-empty string, got {name!r}.")
    if not _NAME_RE.match(name):
      raise ValueError(
          f"Dimension name {name!r} may only contain letters, digits, '_', '.' "
          "and '-'.")
    try:
      int_size = int(size)
    except (TypeError, ValueError):
      raise TypeError(
          f"Dimension {name!r}: size must be an integer, got {size!r}.") from None
    if int_size != size or int_size < 0:
      raise ValueError(
          f"Dimension {name!r}: size must be a non-negative integer, got {size!r}.")
    return super().__new__(cls, name, int_size)

  def __repr__(self):
    return f"Dimension(name={self.name!r}, size={self.size})"


def convert_to_dimension(d) -> Optional[Dimension]:
  """Converts `Dimension`, a `(name, size)` pair or `"name:size"` to Dimension."""
  if d is None or isinstance(d, Dimension):
    return d
  if isinstance(d, str):
    name, size = _split_pair(d, "dimension")
    return Dimension(name, _parse_size(name, size, d))
  if isinstance(d, (tuple, list)) and len(d) == 2:
    return Dimension(d[0], d[1])
  raise TypeError(f"Cannot convert {d!r} to a Dimension; use Dimension(name, size).")


class CallableString(str):
  """A string that is also callable (returning itself), so both
  `shape.to_string` and `shape.to_string()` give the text."""

  def __call__(self) -> str:
    return str(self)


class CallableList(list):
  """A list that is also callable (returning a plain copy), so
  `shape.to_integer_list` and `shape.cumprod` work as properties and as
  methods."""

  def __call__(self) -> list:
    return list(self)


def _parse_size(name: str, size: str, text: str) -> int:
  try:
    return int(size)
  except ValueError:
    raise ValueError(
        f"Cannot parse {text!r}: the size of dimension {name!r} must be an "
        f"integer, got {size!r}.") from None


def _split_pair(s: str, what: str):
  parts = s.split(":")
  if len(parts) != 2 or not parts[0].strip() or not parts[1].strip():
    raise ValueError(f"Cannot parse {what} {s!r}: expected 'name:value'.")
  return parts[0].strip(), parts[1].strip()


def parse_pairs(s: str, what: str):
  """Parses 'a:b;c:d' into [(a, b), (c, d)];
  ',', '.' and whitespace also separate pairs ("a:b,c:d", "a:b c:d")."""
  s = s.strip()
  if not s:
    return []
  return [_split_pair(item, what) for item in re.split(r"[;,.\s]+", s) if item.strip()]


class Shape:
  """An ordered list of `Dimension`s with distinct names.

  Example:
    >>> s = Shape([Dimension("batch", 8), Dimension("hidden", 64)])
    >>> s.size, s.dimension_names
    (512, ['batch', 'hidden'])
    >>> s - [Dimension("hidden", 64)]
    Shape[batch=8]
  """

  def __init__(self, dims: Iterable = ()):
    dims = [convert_to_dimension(d) for d in dims]
    names = [d.name for d in dims]
    if len(set(names)) != len(names):
      dup = sorted({n for n in names if names.count(n) > 1})
      raise ValueError(
          f"Shape {[tuple(d) for d in dims]} repeats dimension name(s) {dup}; each "
          "dimension of a tensor needs its own name (rename one with "
          "mtf.rename_dimension).")
    self._dims = tuple(dims)

  @property
  def dims(self):
    return list(self._dims)

  @property
  def ndims(self) -> int:
    return len(self._dims)

  def __len__(self):
    return len(self._dims)

  def __iter__(self):
    return iter(self._dims)

  def __getitem__(self, key):
    if isinstance(key, slice):
      return Shape(self._dims[key])
    return self._dims[key]

  def __eq__(self, other):
    if isinstance(other, Shape):
      return self._dims == other._dims
    if isinstance(other, (list, tuple)):
      try:
        return self == convert_to_shape(other)
      except (TypeError, ValueError):
        return False
    return NotImplemented

  def __ne__(self, other):
    eq = self.__eq__(other)
    return eq if eq is NotImplemented else not eq

  def __hash__(self):
    return hash(self._dims)

  def __add__(self, other):
    return Shape(self._dims + tuple(convert_to_shape(other)._dims))

  def __radd__(self, other):
    return Shape(tuple(convert_to_shape(other)._dims) + self._dims)

  def __sub__(self, other):
    """Removes the dimensions of `other` (names or dims) that this shape has."""
    if isinstance(other, (Dimension, str)):
      other = [other]
    names = {o if isinstance(o, str) else convert_to_dimension(o).name
             for o in (other.dims if isinstance(other, Shape) else other)}
    return Shape([d for d in self._dims if d.name not in names])

  def __repr__(self):
    return "Shape[" + ", ".join(f"{d.name}={d.size}" for d in self._dims) + "]"

  @property
  def to_string(self) -> CallableString:
    """'name:size;...', e.g. "batch:8;hidden:64" (also callable)."""
    return CallableString(";".join(f"{d.name}:{d.size}" for d in self._dims))

  def cumprod_to_tensor_axis(self, cumprod: int) -> Optional[int]:
    """The tensor axis before which the sizes multiply to `cumprod`, or None."""
    try:
      return self.cumprod().index(cumprod)
    except ValueError:
      return None

  @property
  def size(self) -> int:
    return functools.reduce(operator.mul, (d.size for d in self._dims), 1)

  @property
  def to_integer_list(self) -> CallableList:
    """The sizes, e.g. [8, 64] (also callable)."""
    return CallableList(d.size for d in self._dims)

  @property
  def dimension_names(self):
    return [d.name for d in self._dims]

  @property
  def cumprod(self) -> CallableList:
    """Exclusive cumulative products of the sizes (row-major strides reversed;
    also callable)."""
    out, p = CallableList(), 1
    for d in self._dims:
      out.append(p)
      p *= d.size
    return out

  def has_dim(self, dim) -> bool:
    return dim in self._dims

  def has_dim_name(self, name: str) -> bool:
    return name in self.dimension_names

  def get_dim_by_name(self, name: str) -> Dimension:
    for d in self._dims:
      if d.name == name:
        return d
    raise ValueError(f"Shape {self} has no dimension named {name!r}.")

  def index_of(self, dim) -> int:
    name = dim if isinstance(dim, str) else dim.name
    for i, d in enumerate(self._dims):
      if d.name == name:
        return i
    raise ValueError(f"Shape {self} has no dimension named {name!r}.")

  def rename_dimension(self, old_name: str, new_name: str) -> "Shape":
    self.index_of(old_name)
    return Shape([Dimension(new_name, d.size) if d.name == old_name else d
                  for d in self._dims])

  def resize_dimension(self, name: str, new_size: int) -> "Shape":
    self.index_of(name)
    return Shape([Dimension(name, new_size) if d.name == name else d
                  for d in self._dims])


ShapeLike = Union[Shape, Sequence[Dimension], str, None]


def convert_to_shape(x) -> Optional[Shape]:
  """Converts a Shape, a list of Dimensions/pairs or a string like "a:2;b:3"."""
  if x is None or isinstance(x, Shape):
    return x
  if isinstance(x, str):
    return Shape([Dimension(n, _parse_size(n, v, x)) for n, v in parse_pairs(x, "shape")])
  if isinstance(x, Dimension):
    return Shape([x])
  if isinstance(x, (list, tuple)):
    return Shape(x)
  raise TypeError(
      f"Cannot convert {x!r} to a Shape; use a list of Dimensions or a string "
      "like 'batch:8;hidden:64'.")


def shape_union(shapes: Sequence[Shape]) -> Shape:
  """Union of dimensions, in order of first appearance; sizes must agree."""
  dims, seen = [], {}
  for s in shapes:
    for d in s.dims:
      if d.name in seen:
        if seen[d.name] != d.size:
          raise ValueError(
              f"Dimension {d.name!r} has size {seen[d.name]} in one tensor and "
              f"{d.size} in another; a dimension name must have one size.")
      else:
        seen[d.name] = d.size
        dims.append(d)
  return Shape(dims)

from mesh_tensorflow.core import autograph_exempt as _autograph_exempt  # noqa: E402  pylint: disable=g-import-not-at-top
_autograph_exempt.exempt(globals())  # AutoGraph leaves this module's code alone
