"""Slicing and joining along a named dimension: slice, pad, concat, split,
stack, unstack, shift.

Along a split dimension these gather the dimension first (shift instead
exchanges only the boundary elements with the neighbouring processor).

    >>> head = mtf.slice(x, begin=0, size=4, slice_dim_name="length")
    >>> prev = mtf.shift(x, offset=1, dim=length, wrap=False)
"""

from __future__ import annotations

from typing import List, Sequence

import tensorflow as tf

from mesh_tensorflow.core.graph import Operation, Tensor
from mesh_tensorflow.lowering.mesh_impl import int_constant
from mesh_tensorflow.lowering import plans
from mesh_tensorflow.operations import elementwise as ew
from mesh_tensorflow.operations.constant_ops import zeros
from mesh_tensorflow.operations.einsum_ops import einsum
from mesh_tensorflow.operations.indexing import mtf_range, one_hot
from mesh_tensorflow.operations.shape_ops import rename_dimension
from mesh_tensorflow.core.shapes import Dimension, Shape, convert_to_dimension


def _dim_named(x: Tensor, dim):
  name = dim if isinstance(dim, str) else convert_to_dimension(dim).name
  return x.shape.get_dim_by_name(name)


class SliceOperation(Operation):
  has_gradient = True

  def __init__(self, x: Tensor, begin: int, size: int, slice_dim_name: str, name=None):
    dim = _dim_named(x, slice_dim_name)
    if begin < 0 or size < 0 or begin + size > dim.size:
      raise ValueError(
          f"mtf.slice of {x.name}: [{begin}, {begin + size}) is outside dimension "
          f"{dim.name!r} of size {dim.size}.")
    super().__init__([x], name=name or "slice")
    self._begin, self._dim = begin, dim
    self._outputs = [Tensor(self, x.shape.resize_dimension(dim.name, size), x.dtype)]

  def _unsplittable_dim_names(self):
    return [self._dim.name]

  def gradient(self, grad_ys):
    size = self.outputs[0].shape.get_dim_by_name(self._dim.name).size
    return [pad(grad_ys[0], [self._begin, self._dim.size - self._begin - size],
                self._dim.name)]

  def plan(self, mesh):
    return plans.plan_unsplit(self, mesh.layout_of, [self._dim.name])

  def lower(self, lowering):
    axis = self.inputs[0].shape.index_of(self._dim.name)
    size = self.outputs[0].shape.dims[axis].size
    begin = self._begin

    def fn(t):
      b = [0] * t.shape.rank
      s = [-1] * t.shape.rank
      b[axis], s[axis] = begin, size
      return tf.slice(t, int_constant(b), int_constant(s))
    lowering.lower_with_plan(self, self.plan(lowering.plan_mesh(self)), fn)


def slice(x: Tensor, begin: int, size: int, slice_dim_name: str, name=None) -> Tensor:  # pylint: disable=redefined-builtin
  """Elements [begin, begin + size) along the named dimension (same name)."""
  return SliceOperation(x, begin, size, slice_dim_name, name=name).outputs[0]


mtf_slice = slice


class PadOperation(Operation):
  has_gradient = True

  def __init__(self, x: Tensor, paddings, dim_name: str, name=None):
    dim = _dim_named(x, dim_name)
    before, after = paddings
    super().__init__([x], name=name or "pad")
    self._dim, self._paddings = dim, (int(before), int(after))
    self._outputs = [Tensor(self, x.shape.resize_dimension(
        dim.name, dim.size + before + after), x.dtype)]

  def _unsplittable_dim_names(self):
    return [self._dim.name]

  def gradient(self, grad_ys):
    return [slice(grad_ys[0], self._paddings[0], self._dim.size, self._dim.name)]

  def plan(self, mesh):
    return plans.plan_unsplit(self, mesh.layout_of, [self._dim.name])

  def lower(self, lowering):
    axis = self.inputs[0].shape.index_of(self._dim.name)
    pads = self._paddings

    def fn(t):
      p = [[0, 0]] * t.shape.rank
      p[axis] = list(pads)
      return tf.pad(t, p)
    lowering.lower_with_plan(self, self.plan(lowering.plan_mesh(self)), fn)


def pad(x: Tensor, paddings, dim_name: str, name=None) -> Tensor:
  """Pads with zeros: paddings = [before, after] along dim_name."""
  return PadOperation(x, paddings, dim_name, name=name).outputs[0]


class ConcatOperation(Operation):
  has_gradient = True

  def __init__(self, xs: Sequence[Tensor], concat_dim_name: str, name=None):
    xs = list(xs)
    if not xs:
      raise ValueError("mtf.concat needs at least one tensor.")
    sizes = []
    base = xs[0].shape
    for x in xs:
      sizes.append(_dim_named(x, concat_dim_name).size)
      if (x.shape.dimension_names != base.dimension_names or
          [d for d in x.shape.dims if d.name != concat_dim_name] !=
          [d for d in base.dims if d.name != concat_dim_name]):
        raise ValueError(
            f"mtf.concat along {concat_dim_name!r}: {x.name} {x.shape} and "
            f"{xs[0].name} {base} differ in other dimensions.")
    super().__init__(xs, name=name or "concat")
    self._dim_name, self._sizes = concat_dim_name, sizes
    self._outputs = [Tensor(self, base.resize_dimension(concat_dim_name, sum(sizes)),
                            xs[0].dtype)]

  def _unsplittable_dim_names(self):
    return [self._dim_name]

  def gradient(self, grad_ys):
    out, begin = [], 0
    for s in self._sizes:
      out.append(slice(grad_ys[0], begin, s, self._dim_name))
      begin += s
    return out

  def plan(self, mesh):
    return plans.plan_unsplit(self, mesh.layout_of, [self._dim_name])

  def lower(self, lowering):
    axis = self.inputs[0].shape.index_of(self._dim_name)
    lowering.lower_with_plan(self, self.plan(lowering.plan_mesh(self)),
                             lambda *ts: tf.concat(list(ts), axis=axis))


def concat(xs: Sequence[Tensor], concat_dim_name: str, name=None) -> Tensor:
  """Concatenates along concat_dim_name (other dimensions must agree)."""
  return ConcatOperation(xs, concat_dim_name, name=name).outputs[0]


def split_sizes(x: Tensor, dim, num_or_size_splits, what: str = "mtf.split") -> List[int]:
  """The part sizes of splitting x's `dim` into `num_or_size_splits` (a number
  of equal parts or a list of sizes), checked."""
  if isinstance(num_or_size_splits, int):
    if num_or_size_splits <= 0 or dim.size % num_or_size_splits:
      raise ValueError(f"{what}: {num_or_size_splits} does not divide {dim} of {x.name}.")
    return [dim.size // num_or_size_splits] * num_or_size_splits
  sizes = [int(n) for n in num_or_size_splits]
  if sum(sizes) != dim.size:
    raise ValueError(f"{what}: sizes {sizes} do not add up to {dim} of {x.name}.")
  return sizes


def split(x: Tensor, split_dim, num_or_size_splits, name=None) -> List[Tensor]:
  """Splits along split_dim into equal parts or the given sizes."""
  dim = _dim_named(x, split_dim)
  sizes = split_sizes(x, dim, num_or_size_splits)
  out, begin = [], 0
  for s in sizes:
    out.append(slice(x, begin, s, dim.name))
    begin += s
  return out


class StackOperation(Operation):
  has_gradient = True

  def __init__(self, xs: Sequence[Tensor], dim_name: str, axis: int, name=None):
    xs = list(xs)
    for x in xs[1:]:
      if x.shape != xs[0].shape:
        raise ValueError(
            f"mtf.stack: {x.name} {x.shape} differs from {xs[0].name} {xs[0].shape}.")
    super().__init__(xs, name=name or "stack")
    dims = xs[0].shape.dims
    dims.insert(axis, Dimension(dim_name, len(xs)))
    self._dim_name, self._axis = dim_name, axis
    self._outputs = [Tensor(self, Shape(dims), xs[0].dtype)]

  def _unsplittable_dim_names(self):
    return [self._dim_name]

  def gradient(self, grad_ys):
    return unstack(grad_ys[0], self.outputs[0].shape.get_dim_by_name(self._dim_name))

  def plan(self, mesh):
    return plans.plan_unsplit(self, mesh.layout_of, [self._dim_name])

  def lower(self, lowering):
    axis = self._axis
    lowering.lower_with_plan(self, self.plan(lowering.plan_mesh(self)),
                             lambda *ts: tf.stack(list(ts), axis=axis))


def stack(xs: Sequence[Tensor], dim_name: str, axis: int = 0, name=None) -> Tensor:
  """Stacks equal-shaped tensors along a new dimension `dim_name` at `axis`."""
  return StackOperation(xs, dim_name, axis, name=name).outputs[0]


class UnstackOperation(Operation):
  has_gradient = True

  def __init__(self, x: Tensor, dim, name=None):
    dim = _dim_named(x, dim)
    super().__init__([x], name=name or "unstack")
    self._dim = dim
    out_shape = x.shape - [dim]
    self._outputs = [Tensor(self, out_shape, x.dtype, index=i) for i in range(dim.size)]

  def _unsplittable_dim_names(self):
    return [self._dim.name]

  def gradient(self, grad_ys):
    gs = [g if g is not None else zeros(self.mesh, self.outputs[0].shape, self.inputs[0].dtype)
          for g in grad_ys]
    return [stack(gs, self._dim.name, self.inputs[0].shape.index_of(self._dim.name))]

  def plan(self, mesh):
    return plans.plan_unsplit(self, mesh.layout_of, [self._dim.name])

  def lower(self, lowering):
    axis = self.inputs[0].shape.index_of(self._dim.name)
    lowering.lower_with_plan(self, self.plan(lowering.plan_mesh(self)),
                             lambda t: tuple(tf.unstack(t, axis=axis)))


def unstack(x: Tensor, dim, name=None) -> List[Tensor]:
  """Splits x into a list of tensors along (and without) dim."""
  return UnstackOperation(x, dim, name=name).outputs


class ShiftOperation(Operation):
  """out[i] = x[i - offset] along dim (zero fill, or wraparound)."""

  has_gradient = True

  def __init__(self, x: Tensor, offset: int, dim, wrap: bool, name=None,
               split_replicas: bool = False):
    dim = _dim_named(x, dim)
    super().__init__([x], name=name or "shift")
    self._offset, self._dim, self._wrap = int(offset), dim, bool(wrap)
    self._split_replicas = bool(split_replicas)
    self._outputs = [Tensor(self, x.shape, x.dtype)]

  def gradient(self, grad_ys):
    return [shift(grad_ys[0], -self._offset, self._dim, self._wrap,
                  split_replicas=self._split_replicas)]

  wrap = property(lambda self: self._wrap)
  split_replicas = property(lambda self: self._split_replicas)

  def plan(self, mesh):
    return plans.plan_shift(self, self._dim, self._offset, mesh.layout_of, mesh.sizes)

  def lower(self, lowering):
    x = self.inputs[0]
    axis = x.shape.index_of(self._dim.name)
    offset, wrap = self._offset, self._wrap
    plan = self.plan(lowering.plan_mesh(self))
    if len(plan.operands) == 1:  # no offset, or the dimension gathered
      lowering.lower_with_plan(self, plan, lambda t: _local_shift(t, offset, axis, wrap))
      return
    # Only the boundary moves: each processor combines its slice with the
    # one its neighbour sent.
    local = lowering.mesh_impl(self).slice_shape(x.shape)[axis]
    k = abs(offset)

    def combine(mine, theirs):
      if offset > 0:
        return tf.concat([_take(theirs, axis, local - k, k), _take(mine, axis, 0, local - k)], axis)
      return tf.concat([_take(mine, axis, k, local - k), _take(theirs, axis, 0, k)], axis)
    lowering.lower_with_plan(self, plan, combine)


def _take(t, axis, begin, size):
  b = [0] * t.shape.rank
  s = [-1] * t.shape.rank
  b[axis], s[axis] = begin, size
  return tf.slice(t, int_constant(b), int_constant(s))


def _local_shift(t, offset, axis, wrap):
  if wrap:
    return tf.roll(t, offset, axis)
  size = t.shape.as_list()[axis]
  k = min(abs(offset), size)
  zero_shape = t.shape.as_list()
  zero_shape[axis] = k
  zeros = tf.zeros(zero_shape, t.dtype)
  if offset > 0:
    return tf.concat([zeros, _take(t, axis, 0, size - k)], axis)
  return tf.concat([_take(t, axis, k, size - k), zeros], axis)


def shift(x: Tensor, offset: int, dim, wrap: bool, name=None, *,
          split_replicas: bool = False) -> Tensor:
  """Shifts x by offset along dim: out[i] = x[i - offset].

  Args:
    x: the tensor.
    offset: positions to shift by (negative: towards the start).
    dim: a Dimension of x, or its name.
    wrap: whether positions shifted out at one end come back at the other
      (otherwise zeros come in).
    name: the operation's name.
    split_replicas: where `dim` is split and each processor receives its
      neighbour's slice, and the layout replicates x over other mesh
      dimensions, each replica sends only its block of the slice and the
      receivers all-gather them: the same values, 1/r of the bytes on the
      neighbour's link for r replicas plus one all-gather among the
      replicas. Worth it where the neighbours are on another host and the
      replicas on one (pipeline stages; `mtf.pipeline` sets it).

  Example:
    >>> prev_token = mtf.shift(tokens, 1, length_dim, wrap=False)
  """
  return ShiftOperation(x, offset, dim, wrap, name=name,
                        split_replicas=split_replicas).outputs[0]


def dynamic_shift(x: Tensor, offset: Tensor, dim, wrap: bool, name=None) -> Tensor:
  """Shifts x along dim by a per-element integer offset: out[i] = x[i - offset].

  `offset` is an integer mtf Tensor whose dimensions are a subset of x's other
  dimensions (so different rows may shift by different amounts). Positions
  shifted in from outside are zero unless wrap. Built from one_hot and einsum,
  so it works under every layout and is differentiable in x; it costs
  O(size(dim)^2) per row, so prefer mtf.shift for a fixed offset.

  Example:
    >>> y = mtf.dynamic_shift(x, offsets, length_dim, wrap=False)
  """
  dim = _dim_named(x, dim)
  if offset.dtype.is_floating or offset.dtype == tf.bool:
    raise TypeError(f"mtf.dynamic_shift: offset {offset.name} must be integer.")
  if dim in offset.shape.dims or any(d not in x.shape.dims for d in offset.shape.dims):
    raise ValueError(
        f"mtf.dynamic_shift: offset {offset.name} {offset.shape} must have only "
        f"dimensions of {x.name} {x.shape} other than {dim.name!r}.")
  source_dim = Dimension(dim.name + "_dynamic_shift_source", dim.size)
  source = mtf_range(x.mesh, dim, offset.dtype) - offset  # [offset dims..., dim]
  if wrap:
    source = ew.mod(source, dim.size)
  selector = one_hot(source, source_dim, dtype=x.dtype)  # zero rows when out of range
  return einsum([rename_dimension(x, dim.name, source_dim.name), selector],
                output_shape=x.shape, name=name or "dynamic_shift")

from mesh_tensorflow.core import autograph_exempt as _autograph_exempt  # noqa: E402  pylint: disable=g-import-not-at-top
_autograph_exempt.exempt(globals())  # AutoGraph leaves this module's code alone
