"""Index-based operations: one_hot, range, gather, cumsum, top_k, top_1,
argmax, sample_with_temperature.

    >>> labels_1h = mtf.one_hot(labels, classes_dim, dtype=tf.float32)
    >>> emb = mtf.gather(embedding_table, ids, vocab_dim)
"""

from __future__ import annotations

import tensorflow as tf

from mesh_tensorflow.lowering import plans, statistics_plans
from mesh_tensorflow.core.graph import Operation, Tensor
from mesh_tensorflow.lowering.mesh_impl import (LaidOutTensor, expand_to_shape,
                                      int_constant, once_per_graph, shared_constant)
from mesh_tensorflow.operations import elementwise as ew
from mesh_tensorflow.operations.constant_ops import constant
from mesh_tensorflow.operations.einsum_ops import einsum
from mesh_tensorflow.operations.random_ops import random_uniform
from mesh_tensorflow.operations.reduction import _dim_of, pool_tensor_1d, reduce_max
from mesh_tensorflow.core.shapes import Dimension, Shape, convert_to_dimension, convert_to_shape


def _dim_named(x: Tensor, dim):
  name = dim if isinstance(dim, str) else convert_to_dimension(dim).name
  return x.shape.get_dim_by_name(name)


def slice_offsets(impl, shape, axis) -> LaidOutTensor:
  """Per-processor offset (in the full tensor) of the slice along `axis`."""
  def offset(pnum, begin):
    # A Python int under placement (one shared constant); a tensor under SIMD.
    b = begin[axis]
    return int_constant(b) if isinstance(b, int) else tf.cast(b, tf.int32)
  return impl.make_slices(offset, shape)


def local_ids(ids: tf.Tensor, offset) -> tf.Tensor:
  """int32 ids made relative to a block of a split dimension starting at
  `offset` (None: not split). See ids_in_block for why it is per graph."""
  def make():
    local = tf.cast(ids, tf.int32)
    return local if offset is None else local - offset
  return once_per_graph(("local_ids", ids, offset), make)


def clipped_ids(ids: tf.Tensor, offset, block_size: int) -> tf.Tensor:
  """local_ids clipped into [0, block_size): safe to gather with."""
  return once_per_graph(
      ("clipped_ids", ids, offset, block_size),
      lambda: tf.raw_ops.ClipByValue(t=local_ids(ids, offset), clip_value_min=int_constant(0),
                                     clip_value_max=int_constant(block_size - 1)))


def ids_in_block(ids: tf.Tensor, offset, block_size: int):
  """Ids made relative to a processor's block of a split dimension.

  Returns the local ids clipped into [0, block_size) (safe to gather with) and
  a bool mask of the ids that fall inside the block. `offset` is the block's
  start, or None when the dimension is not split.

  These ops are created once per TensorFlow graph for the same ids, offset and
  block: an embedding lookup and its gradient use the same ids, and on a large
  mesh creating ops is most of the lowering time. A slice tensor belongs to one
  device except where replicas are shared, so sharing never adds a transfer.
  """
  clipped = clipped_ids(ids, offset, block_size)
  in_block = once_per_graph(("in_block", ids, offset, block_size),
                             lambda: tf.equal(local_ids(ids, offset), clipped))
  return clipped, in_block


class OneHotOperation(Operation):
  def __init__(self, indices: Tensor, output_dim, on_value, off_value, dtype, name=None):
    output_dim = convert_to_dimension(output_dim)
    if indices.dtype.is_floating or indices.dtype == tf.bool:
      raise TypeError(f"mtf.one_hot: indices {indices.name} must be integers, "
                      f"got {indices.dtype.name}.")
    if indices.shape.has_dim_name(output_dim.name):
      raise ValueError(f"mtf.one_hot: {indices.name} already has {output_dim.name!r}.")
    super().__init__([indices], name=name or "one_hot")
    self._values = (on_value, off_value)
    self._outputs = [Tensor(self, indices.shape + [output_dim], dtype)]

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    out = self.outputs[0]
    depth = impl.slice_shape(out.shape)[-1]
    on, off = self._values
    dtype = out.dtype

    def fn(idx, offset):
      return tf.one_hot(tf.cast(idx, tf.int32) - offset, depth, on_value=tf.cast(on, dtype),
                        off_value=tf.cast(off, dtype), dtype=dtype)
    laid = impl.slicewise(fn, lowering.laid_out(self.inputs[0]),
                          slice_offsets(impl, out.shape, out.shape.ndims - 1))
    # indices are replicated along output_dim's mesh axis but not split: fine.
    lowering.set_tensor_lowering(out, laid)


def one_hot(indices: Tensor, output_dim, on_value=1.0, off_value=0.0, dtype=tf.float32,
            name=None) -> Tensor:
  """One-hot encoding; the output has indices' dims plus output_dim (last)."""
  return OneHotOperation(indices, output_dim, on_value, off_value, dtype, name=name).outputs[0]


class RangeOperation(Operation):
  def __init__(self, mesh, dim, dtype, name=None):
    super().__init__([], mesh=mesh, name=name or "range")
    self._outputs = [Tensor(self, Shape([convert_to_dimension(dim)]), dtype)]

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    out = self.outputs[0]
    size = impl.slice_shape(out.shape)[0]
    dtype = out.dtype
    lowering.set_tensor_lowering(out, impl.make_slices(
        lambda pnum, begin: tf.cast(tf.range(size) + begin[0], dtype), out.shape))


def range(mesh, dim, dtype=tf.int32, name=None) -> Tensor:  # pylint: disable=redefined-builtin
  """[0, 1, ..., dim.size - 1] along dim."""
  return RangeOperation(mesh, dim, dtype, name=name).outputs[0]


mtf_range = range


def _gather_output_shape(weights: Tensor, indices: Tensor, dim: Dimension,
                         output_shape) -> Shape:
  """indices' dims, then weights' others (shared ones once); or output_shape,
  which must be a permutation of that."""
  if indices.dtype.is_floating:
    raise TypeError(f"mtf.gather: indices {indices.name} must be integers.")
  shape = Shape(indices.shape.dims + [d for d in weights.shape.dims
                                      if d.name != dim.name and d not in indices.shape.dims])
  if output_shape is None:
    return shape
  output_shape = convert_to_shape(output_shape)
  if sorted(output_shape.dims) != sorted(shape.dims):
    raise ValueError(f"mtf.gather: output_shape {output_shape} must be a "
                     f"permutation of {shape}.")
  return output_shape


class GatherOperation(Operation):
  """weights[indices] along dim; output = indices dims + other weights dims."""

  def __init__(self, weights: Tensor, indices: Tensor, dim, output_shape=None, name=None):
    dim = _dim_named(weights, dim)
    shape = _gather_output_shape(weights, indices, dim, output_shape)
    super().__init__([weights, indices], name=name or "gather")
    self._dim = dim
    self.has_gradient = weights.dtype.is_floating
    self._outputs = [Tensor(self, shape, weights.dtype)]

  def gradient(self, grad_ys):
    return [scatter_add_grad(grad_ys[0], self.inputs[1], self.inputs[0].shape, self._dim),
            None]

  def plan(self, mesh):
    weights, indices = self.inputs
    return plans.plan_gather(weights, indices, self.outputs[0], self._dim, mesh.layout_of,
                             mesh.sizes)

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    weights, indices = self.inputs
    out = self.outputs[0]
    dim = self._dim
    plan = self.plan(lowering.plan_mesh(self))
    axis = weights.shape.index_of(dim.name)
    # The mesh axis splitting `dim` of the table as the kernel reads it
    # (None: the table was gathered along `dim`, or is whole there).
    mesh_axis = plan.operands[0].move.target[axis]
    w_dims = weights.shape.dims
    gathered_shape = Shape(w_dims[:axis] + indices.shape.dims + w_dims[axis + 1:])
    local_size = dim.size // (1 if mesh_axis is None else impl.mesh_axis_size(mesh_axis))

    gather_axis = int_constant(axis)

    def fn(w, idx, offset=None):
      if mesh_axis is None:
        clipped = clipped_ids(idx, None, local_size)
        return expand_to_shape(tf.raw_ops.GatherV2(params=w, indices=clipped, axis=gather_axis),
                               gathered_shape, out.shape)
      clipped, in_block = ids_in_block(idx, offset, local_size)
      g = tf.raw_ops.GatherV2(params=w, indices=clipped, axis=gather_axis)
      # Ids outside this processor's block of `dim` contribute zeros.
      g = tf.where(expand_to_shape(in_block, indices.shape, gathered_shape), g,
                   shared_constant(0, g.dtype))
      return expand_to_shape(g, gathered_shape, out.shape)
    offsets = ((slice_offsets(impl, weights.shape, axis),) if plan.coordinates is not None
               else ())
    lowering.lower_with_plan(self, plan, fn, offsets)


def gather(weights: Tensor, indices: Tensor, dim, output_shape=None, name=None) -> Tensor:
  """Looks up entries of `weights` along `dim` (like an embedding lookup).

  The output has the dimensions of indices, then those of weights except dim.
  Dimensions that weights and indices share are batch dimensions (as
  `tf.gather`'s `batch_dims`): entry [b, i] of the result is
  weights[b, indices[b, i]]; that case is computed as a one-hot product.

  Example:
    >>> vectors = mtf.gather(table, ids, vocab_dim)   # [batch, length, d_model]
    >>> first = mtf.gather(table, 0, vocab_dim)        # an int index: [d_model]
    >>> per_row = mtf.gather(counts, segment_ids, segments)  # counts [batch, segments]
  """
  if not isinstance(indices, Tensor):
    indices = constant(weights.mesh, indices, [], dtype=tf.int32)
  dim = _dim_named(weights, dim)
  if any(d.name != dim.name and d in weights.shape.dims for d in indices.shape.dims):
    return _batched_gather(weights, indices, dim, output_shape, name)
  return GatherOperation(weights, indices, dim, output_shape=output_shape, name=name).outputs[0]


def _batched_gather(weights: Tensor, indices: Tensor, dim: Dimension, output_shape,
                    name) -> Tensor:
  """gather where weights and indices share dimensions: a one-hot einsum."""
  shape = _gather_output_shape(weights, indices, dim, output_shape)
  if weights.dtype == tf.bool:
    return ew.cast(_batched_gather(ew.cast(weights, tf.int32), indices, dim, shape, name),
                   tf.bool)
  selector = one_hot(indices, dim, dtype=weights.dtype)
  return einsum([selector, weights], output_shape=shape, name=name or "gather")


class ScatterAddGradOperation(Operation):
  """The gradient of gather: sums rows of g into a tensor of weights_shape."""

  has_gradient = True

  def __init__(self, g: Tensor, indices: Tensor, weights_shape, dim, name=None):
    super().__init__([g, indices], name=name or "gather_grad")
    self._dim = dim
    self._outputs = [Tensor(self, convert_to_shape(weights_shape), g.dtype)]

  def gradient(self, grad_ys):
    return [gather(grad_ys[0], self.inputs[1], self._dim, output_shape=self.inputs[0].shape),
            None]

  def plan(self, mesh):
    g, indices = self.inputs
    return plans.plan_scatter_add(g, indices, self.outputs[0], self._dim, mesh.layout_of)

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    g, indices = self.inputs
    out = self.outputs[0]
    dim = self._dim
    plan = self.plan(lowering.plan_mesh(self))
    mesh_axis = impl.tensor_dimension_to_mesh_axis(dim)
    use_offsets = plan.coordinates is not None  # each processor sums its block's ids
    local_size = dim.size if not use_offsets else dim.size // impl.mesh_axis_size(mesh_axis)
    others = [d for d in out.shape.dims if d.name != dim.name]
    src_shape = Shape(indices.shape.dims + others)
    dest_shape = Shape([dim] + others)

    minus_one, num_segments = int_constant(-1), int_constant(local_size)

    def fn(gs, idx, offset=None):
      gs = expand_to_shape(gs, g.shape, src_shape)
      clipped, in_block = ids_in_block(idx, offset if use_offsets else None, local_size)
      # Segment -1 (ids outside this processor's block) is dropped. The segment
      # ids keep the indices' shape, which prefixes gs's: no flattening reshapes.
      seg = tf.raw_ops.SelectV2(condition=in_block, t=clipped, e=minus_one)
      summed = tf.raw_ops.UnsortedSegmentSum(data=gs, segment_ids=seg, num_segments=num_segments)
      return expand_to_shape(summed, dest_shape, out.shape)
    offsets = ((slice_offsets(impl, out.shape, out.shape.index_of(dim.name)),)
               if use_offsets else ())
    lowering.lower_with_plan(self, plan, fn, offsets)


def scatter_add_grad(g, indices, weights_shape, dim):
  return ScatterAddGradOperation(g, indices, weights_shape, dim).outputs[0]


def reduce_first(tensor: Tensor, reduced_dim, name=None) -> Tensor:
  """The entries at index 0 along `reduced_dim`, which disappears.

  A lookup of index 0 (`mtf.gather`): local when the layout keeps
  `reduced_dim` whole; when it splits it, the processors holding index 0
  contribute their entries, the others zeros, summed by one allreduce of the
  (smaller) result.

  Args:
    tensor: an mtf Tensor with `reduced_dim`.
    reduced_dim: the Dimension (or its name) to take the first entry of.
    name: optional operation name.

  Returns:
    tensor's other dimensions, in order.

  Example:
    >>> firsts = mtf.reduce_first(x, reduced_dim=length)   # [[2, 5], [9, 15]] -> [2, 9]
  """
  dim = _dim_of(tensor, reduced_dim)
  if tensor.dtype == tf.bool:  # the allreduce of a split dim sums numbers
    return ew.cast(reduce_first(ew.cast(tensor, tf.int32), dim, name), tf.bool)
  return gather(tensor, 0, dim, name=name or "reduce_first")


def stride_tensor_1d(tensor: Tensor, pool_dim, pool_size: int = 2) -> Tensor:
  """Every `pool_size`-th entry along `pool_dim`, starting at 0: pool_tensor_1d
  with reduce_first.

  Args:
    tensor: an mtf Tensor with `pool_dim`.
    pool_dim: the Dimension (or its name) to stride along.
    pool_size: the stride; must divide pool_dim's size.

  Returns:
    tensor with pool_dim of size pool_dim.size // pool_size.

  Example:
    >>> y = mtf.stride_tensor_1d(x, length, pool_size=2)   # [2, 5, 9, 15] -> [2, 9]
  """
  return pool_tensor_1d(tensor, pool_dim, reduce_fn=reduce_first, pool_size=pool_size)


class CumsumOperation(Operation):
  has_gradient = True

  def __init__(self, x: Tensor, dim, exclusive=False, reverse=False, name=None):
    dim = _dim_named(x, dim)  # before joining the graph, which it may reject
    super().__init__([x], name=name or "cumsum")
    self._dim = dim
    self._exclusive, self._reverse = exclusive, reverse
    self._outputs = [Tensor(self, x.shape, x.dtype)]

  def gradient(self, grad_ys):
    return [CumsumOperation(grad_ys[0], self._dim, self._exclusive,
                            not self._reverse).outputs[0]]

  def plan(self, mesh):
    x = self.inputs[0]
    if plans.split_axis(x.shape, self._dim, mesh.layout_of) is None:
      return plans.plan_unsplit(self, mesh.layout_of, [self._dim.name])
    # Split: each block's own sum, then the totals of the blocks before it.
    return statistics_plans.plan_cumsum(x, self._dim, mesh.layout_of, mesh.sizes)

  def lower(self, lowering):
    x = self.inputs[0]
    axis = x.shape.index_of(self._dim.name)
    exclusive, reverse = self._exclusive, self._reverse

    def local(t):
      return tf.cumsum(t, axis=axis, exclusive=exclusive, reverse=reverse)

    plan = self.plan(lowering.plan_mesh(self))
    if isinstance(plan, plans.LocalPlan):
      lowering.lower_with_plan(self, plan, local)
      return
    offsets = slice_offsets(lowering.mesh_impl(self), x.shape, axis)

    def block_sums(t):
      return local(t), tf.reduce_sum(t, axis=axis, keepdims=True)

    def add_carry(partial, totals, offset):
      block = offset // partial.shape[axis]  # this processor's block along the dimension
      others = tf.range(totals.shape[axis])
      before = others > block if reverse else others < block
      shape = [totals.shape[axis] if i == axis else 1 for i in builtin_range(partial.shape.rank)]
      mask = tf.reshape(tf.cast(before, totals.dtype), shape)
      return partial + tf.reduce_sum(totals * mask, axis=axis, keepdims=True)
    lowering.lower_kernels(self, plan, [block_sums, add_carry], extra={1: (offsets,)})


def cumsum(x: Tensor, dim, exclusive: bool = False, name=None) -> Tensor:
  """Cumulative sum along dim."""
  return CumsumOperation(x, dim, exclusive=exclusive, name=name).outputs[0]


class TopKOperation(Operation):
  has_gradient = True

  def __init__(self, x: Tensor, reduced_dim, k_dim, name=None):
    reduced_dim = _dim_named(x, reduced_dim)
    if k_dim.size > reduced_dim.size:
      raise ValueError(f"mtf.top_k: k={k_dim.size} exceeds {reduced_dim} of {x.name}.")
    super().__init__([x], name=name or "top_k")
    self._reduced_dim, self._k_dim = reduced_dim, k_dim
    # reduced_dim removed, k_dim appended last.
    shape = x.shape - [reduced_dim] + [k_dim]
    self._outputs = [Tensor(self, shape, x.dtype, index=0),
                     Tensor(self, shape, tf.int32, index=1)]

  def gradient(self, grad_ys):
    g = grad_ys[0]
    if g is None:
      return [None]
    onehot = one_hot(self.outputs[1], self._reduced_dim, dtype=g.dtype)
    return [einsum([onehot, g], output_shape=self.inputs[0].shape)]

  def plan(self, mesh):
    x = self.inputs[0]
    if plans.split_axis(x.shape, self._reduced_dim, mesh.layout_of) is None:
      return plans.plan_unsplit(self, mesh.layout_of, [self._reduced_dim.name, self._k_dim.name])
    # Split: each block's own top k, allgathered as candidates, then the top k
    # of those (gathering x would move all of it: a vocabulary's logits).
    return statistics_plans.plan_top_k(x, self._reduced_dim, self._k_dim, self.outputs[0],
                                       mesh.layout_of, mesh.sizes)

  def lower(self, lowering):
    x = self.inputs[0]
    axis = x.shape.index_of(self._reduced_dim.name)
    k = self._k_dim.size
    rank = x.shape.ndims
    perm = [i for i in list(builtin_range(rank)) if i != axis] + [axis]

    def last(t):
      return t if axis == rank - 1 else tf.transpose(t, perm)  # tf.math.top_k: the last axis

    plan = self.plan(lowering.plan_mesh(self))
    if isinstance(plan, plans.LocalPlan):
      lowering.lower_with_plan(self, plan, lambda t: tuple(tf.math.top_k(last(t), k=k)))
      return
    offsets = slice_offsets(lowering.mesh_impl(self), x.shape, axis)

    def block_top_k(t, offset):
      t = last(t)
      values, indices = tf.math.top_k(t, k=min(k, t.shape[-1]))
      return values, indices + offset

    def candidates_top_k(values, indices):
      best = tf.math.top_k(values, k=k)
      return best.values, tf.gather(indices, best.indices, batch_dims=rank - 1)
    lowering.lower_kernels(self, plan, [block_top_k, candidates_top_k], extra={0: (offsets,)})


builtin_range = __builtins__["range"] if isinstance(__builtins__, dict) else __builtins__.range


def top_k(x: Tensor, reduced_dim, k_dim=None, name=None, k=None):
  """The k largest values along reduced_dim and their indices, largest first.

  Returns (values, indices), both shaped as x without reduced_dim and with
  k_dim last. Ties go to the lower index.

  Example:
    >>> values, indices = mtf.top_k(logits, vocab_dim, k_dim=mtf.Dimension("k", 4))
    >>> # logits [batch, length, vocab] -> values, indices [batch, length, k]
  """
  if k_dim is None:
    if k is None:
      raise ValueError("mtf.top_k: give k_dim (a Dimension) or k (an int).")
    k_dim = Dimension(f"{_dim_named(x, reduced_dim).name}_top_k", k)
  elif isinstance(k_dim, int):
    k_dim = Dimension(f"{_dim_named(x, reduced_dim).name}_top_k", k_dim)
  else:
    k_dim = convert_to_dimension(k_dim)
  op = TopKOperation(x, reduced_dim, k_dim, name=name)
  return op.outputs[0], op.outputs[1]


class ArgmaxOperation(Operation):
  def __init__(self, x: Tensor, reduced_dim, dtype=tf.int32, name=None):
    reduced_dim = _dim_named(x, reduced_dim)  # before joining the graph
    super().__init__([x], name=name or "argmax")
    self._dim = reduced_dim
    self._outputs = [Tensor(self, x.shape - [self._dim], dtype)]

  def plan(self, mesh):
    x = self.inputs[0]
    if plans.split_axis(x.shape, self._dim, mesh.layout_of) is None:
      return plans.plan_unsplit(self, mesh.layout_of, [self._dim.name])
    # Split: per-block maxima and first indices, combined by two small
    # allreduces (gathering x would move all of it: a vocabulary's logits).
    return statistics_plans.plan_argmax(x, self._dim, self.outputs[0], mesh.layout_of,
                                        mesh.sizes)

  def lower(self, lowering):
    x = self.inputs[0]
    axis = x.shape.index_of(self._dim.name)
    dtype = self.outputs[0].dtype
    plan = self.plan(lowering.plan_mesh(self))
    if isinstance(plan, plans.LocalPlan):
      lowering.lower_with_plan(self, plan, lambda t: tf.argmax(t, axis=axis, output_type=dtype))
      return
    size = self._dim.size
    offsets = slice_offsets(lowering.mesh_impl(self), x.shape, axis)

    def maxima(t):
      m = tf.reduce_max(t, axis=axis, keepdims=True)
      return m, m  # this block's, and (after the allreduce) everyone's

    def candidates(t, block_max, global_max, offset):
      first = tf.argmax(t, axis=axis, output_type=dtype) + tf.cast(offset, dtype)
      holds_it = tf.squeeze(tf.equal(block_max, global_max), axis=axis)
      return tf.where(holds_it, first, tf.cast(size, dtype))

    def clamp(c):  # no block holds a NaN maximum: index 0, as tf.argmax gives a NaN row
      return tf.where(c < size, c, tf.zeros_like(c))

    lowering.lower_kernels(self, plan, [maxima, candidates, clamp], extra={1: (offsets,)})


def argmax(x: Tensor, reduced_dim, name=None, dtype=tf.int32) -> Tensor:
  """Index of the maximum along reduced_dim (the first one on ties).

  The third argument is the name; a dtype given there is taken as the dtype.

  Example:
    >>> best = mtf.argmax(logits, vocab_dim)             # int32, no vocab_dim
  """
  if isinstance(name, tf.DType):
    name, dtype = None, name
  return ArgmaxOperation(x, reduced_dim, dtype=dtype, name=name).outputs[0]


def top_1(x: Tensor, reduced_dim, name=None, dtype=tf.int32):
  """(max, argmax) along reduced_dim: the values and their indices, in this
  order (`values, indices = top_1(...)`).

  Example:
    >>> gate, expert_index = mtf.top_1(raw_gates, reduced_dim=experts_dim)
  """
  return (reduce_max(x, reduced_dim=_dim_named(x, reduced_dim)),
          argmax(x, reduced_dim, name, dtype=dtype))  # argmax also takes a dtype as name


def sample_with_temperature(logits: Tensor, dim, temperature=1.0, name=None) -> Tensor:
  """Samples an index along dim from softmax(logits / temperature) (Gumbel
  max); temperature 0 gives argmax."""
  dim = _dim_named(logits, dim)
  if isinstance(temperature, (int, float)) and temperature == 0.0:
    return argmax(logits, dim)
  u = random_uniform(logits.mesh, logits.shape, minval=1e-9, maxval=1.0, dtype=logits.dtype)
  g = -ew.log(-ew.log(u))
  return argmax(logits + g * temperature, dim)

from mesh_tensorflow.core import autograph_exempt as _autograph_exempt  # noqa: E402  pylint: disable=g-import-not-at-top
_autograph_exempt.exempt(globals())  # AutoGraph leaves this module's code alone
