"""Attention layers over named dimensions: dot-product and multi-head
attention, local (windowed) causal self-attention, and attention masks.

Part of `mtf.layers` (import them from there). Masks are additive biases
(0 where attention is allowed, -1e9 where it is not) over the query length
dimension and a memory length dimension named "memory_" + its name, so
`length` pairs with `memory_length`.

    >>> pos = mtf.range(mesh, length, tf.int32)
    >>> mask = mtf.layers.attention_mask_autoregressive(pos)   # [length, memory_length]
    >>> y = mtf.layers.multihead_attention(x, None, mask, d_kv, heads)
"""

from __future__ import annotations

import math
from typing import List, Optional, Sequence, Tuple

import tensorflow as tf

from mesh_tensorflow.layers import initializers
from mesh_tensorflow.core import rng
from mesh_tensorflow.core.graph import Mesh, Tensor
from mesh_tensorflow.layers.core import _dim_list, check_is_training, layer_scope
from mesh_tensorflow.operations import elementwise as ew
from mesh_tensorflow.operations import random_ops
from mesh_tensorflow.operations.einsum_ops import einsum
from mesh_tensorflow.operations.indexing import range as mtf_range
from mesh_tensorflow.operations.reduction import softmax
from mesh_tensorflow.operations.shape_ops import rename_dimension, reshape
from mesh_tensorflow.operations.slicing import concat, shift, unstack
from mesh_tensorflow.operations.variables import VariableDType, get_variable
from mesh_tensorflow.core.shapes import Dimension, Shape

_NEG_INF = -1e9


def memory_name(length_name: str) -> str:
  """The name of the memory dimension paired with a query length dimension.

  Example:
    >>> memory_name("length")
    'memory_length'
  """
  return "memory_" + length_name


def rename_length_to_memory_length(x: Tensor, length_name: str = "length",
                                   memory_length_name: Optional[str] = None) -> Tensor:
  """Renames x's length dimension to its memory name (see `memory_name`).

  Example:
    >>> memory = rename_length_to_memory_length(x)   # length -> memory_length
  """
  return rename_dimension(x, length_name, memory_length_name or memory_name(length_name))


# ---------------------------------------------------------------- masks
def _bias(condition: Tensor, dtype) -> Tensor:
  """-1e9 where condition holds, else 0."""
  dtype = tf.as_dtype(dtype)
  if not dtype.is_floating:
    dtype = tf.float32
  return ew.cast(condition, dtype) * _NEG_INF


def _to_memory(x: Tensor) -> Tensor:
  """x with its last dimension renamed to its memory name (unless it has one)."""
  name = x.shape.dims[-1].name
  if name.startswith("memory_"):
    return x
  return rename_dimension(x, name, memory_name(name))


def attention_mask_ignore_padding(inputs: Tensor, dtype=tf.float32) -> Tensor:
  """Bias that hides padding (id 0) memory positions.

  Args:
    inputs: integer ids [..., length] (the last dimension is renamed
      "memory_" + its name) or already [..., memory_length]; 0 is padding.
    dtype: bias dtype.

  Returns:
    a bias [..., memory_length].

  Example:
    >>> mask = attention_mask_ignore_padding(ids)   # [batch, memory_length]
  """
  return _bias(ew.equal(_to_memory(inputs), 0), dtype)


def attention_mask_autoregressive(query_pos: Tensor, dtype=tf.float32) -> Tensor:
  """Bias that hides memory positions after the query position.

  Args:
    query_pos: integer positions [..., length].
    dtype: bias dtype.

  Returns:
    a bias [..., length, memory_length].

  Example:
    >>> mask = attention_mask_autoregressive(mtf.range(mesh, length, tf.int32))
  """
  return _bias(ew.less(query_pos, _to_memory(query_pos)), dtype)


def attention_mask_same_segment(query_segment: Tensor, memory_segment: Optional[Tensor] = None,
                                dtype=tf.float32) -> Tensor:
  """Bias that hides memory positions of another segment (packed examples).

  Args:
    query_segment: integer segment ids [..., length].
    memory_segment: segment ids [..., length] of the memory (renamed here) or
      already [..., memory_length]; defaults to query_segment.
    dtype: bias dtype.

  Returns:
    a bias [..., length, memory_length].

  Example:
    >>> mask = attention_mask_same_segment(segment_ids)
  """
  if memory_segment is None:
    memory_segment = query_segment
  memory_segment = _to_memory(memory_segment)
  return _bias(ew.not_equal(query_segment, memory_segment), dtype)


def attention_bias_local_block(mesh: Mesh, block_length: Dimension, memory_length: Dimension,
                               dtype=tf.float32) -> Tensor:
  """Causal bias of a query block against [previous block, own block].

  Args:
    mesh: the mesh.
    block_length: the query block dimension.
    memory_length: the memory dimension (its size is replaced by twice the
      block length: the previous block, all visible, then the query's own
      block, visible up to the query position).
    dtype: bias dtype (integer dtypes give float32).

  Returns:
    a bias [block_length, memory_length].

  Example:
    >>> bias = attention_bias_local_block(mesh, Dimension("block", 4),
    ...                                   Dimension("memory_block", 8))
  """
  memory = Dimension(memory_length.name, 2 * block_length.size)
  qpos = mtf_range(mesh, block_length, tf.int32)
  mpos = mtf_range(mesh, memory, tf.int32)
  return _bias(ew.less(qpos, mpos - block_length.size), dtype)


# ---------------------------------------------------------------- parameters
class _StackedNormal(initializers.Initializer):
  """Normal values whose stddev depends on the index along the first axis."""

  def __init__(self, stddevs: Sequence[float]):
    self.stddevs = list(stddevs)

  def slice_value(self, name, full_shape, begin, slice_shape, dtype):
    z = rng.normal(rng.global_index(full_shape, begin, slice_shape),
                   rng.name_seed(name, "init"), tf.constant(0, tf.int64), tf.float32)
    stddevs = tf.constant(self.stddevs, tf.float32)[begin[0]:begin[0] + slice_shape[0]]
    return tf.cast(z * tf.reshape(stddevs, [-1] + [1] * (len(slice_shape) - 1)), dtype)


def multihead_attention_params(mesh: Mesh, heads: Dimension, io_channels: Dimension,
                               kv_channels: Dimension, variable_dtype: VariableDType,
                               combine: bool = False) -> List[Tensor]:
  """The q, k, v and o weights of multi-head attention, each [heads,
  io_channels, kv_channels].

  Initialized (layout-invariantly) normal with stddev io^-0.5 * kv^-0.25 for q
  and k (so q.k needs no 1/sqrt(kv) scaling), io^-0.5 for v and (io *
  heads)^-0.5 for o. With combine, one variable "qkvo" holds
  all four (unstacked here); otherwise variables "q", "k", "v", "o".

  Example:
    >>> wq, wk, wv, wo = multihead_attention_params(
    ...     mesh, heads, d_model, d_kv, mtf.VariableDType(), combine=True)
  """
  qk = io_channels.size ** -0.5 * kv_channels.size ** -0.25
  v = io_channels.size ** -0.5
  o = (io_channels.size * heads.size) ** -0.5
  shape = [heads, io_channels, kv_channels]
  if combine:
    qkvo = Dimension("qkvo", 4)
    var = get_variable(mesh, "qkvo", Shape([qkvo] + shape), dtype=variable_dtype,
                       initializer=_StackedNormal([qk, qk, v, o]))
    return unstack(var, qkvo)
  return [get_variable(mesh, n, Shape(shape), dtype=variable_dtype,
                       initializer=initializers.random_normal(stddev=s))
          for n, s in zip("qkvo", [qk, qk, v, o])]


def multihead_attention_vars(mesh: Mesh, heads: Dimension, io_channels: Dimension,
                             kv_channels: Dimension, master_dtype, slice_dtype,
                             activation_dtype) -> List[Tensor]:
  """`multihead_attention_params` with combine=True and dtypes given one by one.

  Example:
    >>> wq, wk, wv, wo = multihead_attention_vars(
    ...     mesh, heads, d_model, d_kv, tf.float32, tf.float32, tf.float32)
  """
  return multihead_attention_params(
      mesh, heads, io_channels, kv_channels,
      VariableDType(master_dtype or tf.float32, slice_dtype or master_dtype or tf.float32,
                    activation_dtype),
      combine=True)


# ---------------------------------------------------------------- attention
def dot_product_attention(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor],
                          is_training: bool = True, dropout: float = 0.0,
                          dropout_broadcast_dims=None, extra_logit=None) -> Tensor:
  """softmax(q.k + mask) . v over the memory length.

  The logits are not scaled: the 1/sqrt(depth) factor
  lives in the initialization of the query and key weights.

  Args:
    q: [..., length_q, depth_k] (leading dims usually batch, heads).
    k: [..., length_kv, depth_k].
    v: [..., length_kv, depth_v].
    mask: an additive bias broadcastable to the logits [..., length_q,
      length_kv], or None.
    is_training: dropout is applied only when true (the fifth argument).
    dropout: dropout rate on the attention weights.
    dropout_broadcast_dims: dimensions along which the dropout mask is shared.
    extra_logit: an optional extra logit (a scalar or tensor) in the softmax
      normalizer, as if attending to one more position whose value is zero.

  Returns:
    [..., length_q, depth_v].

  Example:
    >>> o = dot_product_attention(q, k, v, mask=None)
  """
  check_is_training(is_training, "mtf.layers.dot_product_attention")
  length_kv = k.shape.dims[-2]
  depth_v = v.shape.dims[-1]
  logits = einsum([q, k], output_shape=Shape(q.shape.dims[:-1] + [length_kv]))
  if mask is not None:
    if mask.dtype != logits.dtype:
      mask = ew.cast(mask, logits.dtype)
    logits = logits + mask
  weights = softmax(logits, length_kv, extra_logit=extra_logit)
  if dropout:
    weights = random_ops.dropout(weights, is_training, rate=dropout,
                                 noise_shape=weights.shape - _dim_list(dropout_broadcast_dims))
  return einsum([weights, v], output_shape=Shape(q.shape.dims[:-1] + [depth_v]))


def multihead_attention(query_antecedent: Tensor, memory_antecedent: Optional[Tensor],
                        mask: Optional[Tensor], kv_channels: Dimension, heads: Dimension,
                        is_training: bool = True, dropout: float = 0.0,
                        dropout_broadcast_dims=None, master_dtype=tf.float32,
                        slice_dtype=tf.float32, name: Optional[str] = None) -> Tensor:
  """Multi-head attention with input and output projections.

  Args:
    query_antecedent: [batch..., length, io_channels].
    memory_antecedent: [batch..., memory_length, io_channels]; None for
      self-attention (the query, its length renamed "memory_" + name).
    mask: additive bias broadcastable to [batch..., heads, length,
      memory_length] (see attention_mask_*), or None.
    kv_channels: the per-head key/value dimension.
    heads: the heads dimension.
    dropout: dropout rate on the attention weights.
    dropout_broadcast_dims: dimensions along which the dropout mask is shared.
    master_dtype: variable storage dtype.
    slice_dtype: variable slice dtype.
    name: scope name (default "multihead_attention", unique per call);
      variable "<name>/qkvo" [qkvo, heads, io_channels, kv_channels].
    is_training: dropout is applied only when true.

  Returns:
    [batch..., length, io_channels].

  Example:
    >>> y = multihead_attention(x, None, mask, d_kv, heads)
  """
  batch_dims = query_antecedent.shape.dims[:-2]
  length, io_channels = query_antecedent.shape.dims[-2:]
  if memory_antecedent is None:
    memory_antecedent = rename_dimension(query_antecedent, length.name, memory_name(length.name))
  memory_length, memory_channels = memory_antecedent.shape.dims[-2:]
  if memory_antecedent.shape.dims[:-2] != batch_dims:
    raise ValueError(f"multihead_attention: memory {memory_antecedent.shape} must have the "
                     f"batch dimensions {batch_dims} of the query {query_antecedent.shape}.")
  if memory_channels != io_channels:
    raise ValueError(f"multihead_attention: memory channels {memory_channels} differ from "
                     f"the query's {io_channels}.")
  with layer_scope(query_antecedent.mesh, name, "multihead_attention"):
    wq, wk, wv, wo = multihead_attention_vars(
        query_antecedent.mesh, heads, io_channels, kv_channels, master_dtype, slice_dtype,
        query_antecedent.dtype)
    q = einsum([query_antecedent, wq], output_shape=batch_dims + [heads, length, kv_channels])
    kv_shape = batch_dims + [heads, memory_length, kv_channels]
    k = einsum([memory_antecedent, wk], output_shape=kv_shape)
    v = einsum([memory_antecedent, wv], output_shape=kv_shape)
    o = dot_product_attention(q, k, v, mask, is_training, dropout, dropout_broadcast_dims)
    return einsum([o, wo], output_shape=batch_dims + [length, io_channels])


def _relative_position_bucket(relative_position: Tensor, bidirectional: bool = True,
                              num_buckets: int = 32, max_distance: int = 128) -> Tensor:
  """The bucket of each relative position (memory - query) of an int32
  tensor: exact buckets for small distances, logarithmically wider ones up
  to max_distance, one bucket beyond; bidirectional, half the buckets for
  each sign. The transformer's and BERT's relative attention biases use it."""
  bucket = 0
  n = -relative_position
  if bidirectional:
    num_buckets //= 2
    bucket += ew.to_int32(ew.less(n, 0)) * num_buckets
    n = ew.abs(n)
  else:
    n = ew.maximum(n, 0)
  max_exact = num_buckets // 2
  is_small = ew.less(n, max_exact)
  # n is clamped below at 1 inside the log (its value is unused where n is small).
  log_ratio = ew.log(ew.to_float(ew.maximum(n, 1)) / max_exact)
  large = max_exact + ew.to_int32(
      log_ratio / math.log(max_distance / max_exact) * (num_buckets - max_exact))
  large = ew.minimum(large, num_buckets - 1)
  return bucket + ew.where(is_small, n, large)


def _block_length(length_per_split: int, window_size: int) -> int:
  """The largest divisor of length_per_split that is at most window_size."""
  for b in range(min(window_size, length_per_split), 0, -1):
    if length_per_split % b == 0:
      return b
  return 1


def masked_local_attention_1d(x: Tensor, kv_channels: Dimension, heads: Dimension,
                              is_training: bool = False, window_size: int = 128,
                              master_dtype=tf.float32, slice_dtype=tf.float32,
                              length_per_split: Optional[int] = None,
                              return_kv: Optional[list] = None,
                              params: Optional[Tuple[Tensor, Tensor, Tensor, Tensor]] = None,
                              name: Optional[str] = None) -> Tensor:
  """Causal local self-attention: position p attends to (p - window_size, p].

  The length is cut into blocks (named like the length dimension, so they are
  split the same way); each block of queries attends to its own block and
  the blocks before it that the window reaches, fetched with `mtf.shift`
  (across a split length, only neighbouring slices move). Positions before
  the start are masked exactly, not attended as zeros.

  Args:
    x: [batch..., length, io_channels].
    kv_channels: per-head key/value dimension.
    heads: heads dimension.
    is_training: accepted for the signature's sake; this layer has no
      dropout, so it changes nothing.
    window_size: how many positions (including itself) each query sees.
    master_dtype: variable storage dtype.
    slice_dtype: variable slice dtype.
    length_per_split: the length held by each processor when the length
      dimension is split (blocks must not straddle processors); defaults to
      the whole length.
    return_kv: if a list, k and v ([batch..., heads, length, kv_channels]) are
      appended to it.
    params: (wq, wk, wv, wo) to use instead of new variables.
    name: scope name (default "masked_local_attention_1d", unique per call).

  Returns:
    a tensor with x's shape.

  Example:
    >>> y = masked_local_attention_1d(x, d_kv, heads, window_size=64)
  """
  batch_dims = x.shape.dims[:-2]
  length, io_channels = x.shape.dims[-2:]
  if window_size < 1:
    raise ValueError(f"masked_local_attention_1d: window_size must be >= 1, got {window_size}.")
  per_split = length_per_split or length.size
  if length.size % per_split:
    raise ValueError(f"masked_local_attention_1d: length_per_split={per_split} does not "
                     f"divide {length}.")
  mesh = x.mesh
  with layer_scope(mesh, name, "masked_local_attention_1d"):
    wq, wk, wv, wo = params or multihead_attention_vars(
        mesh, heads, io_channels, kv_channels, master_dtype, slice_dtype, x.dtype)
    qkv_shape = Shape(batch_dims + [heads, length, kv_channels])
    q = einsum([x, wq], output_shape=qkv_shape)
    k = einsum([x, wk], output_shape=qkv_shape)
    v = einsum([x, wv], output_shape=qkv_shape)
    if return_kv is not None:
      return_kv.extend([k, v])
    block = _block_length(per_split, window_size)
    num_prev = math.ceil((window_size - 1) / block)
    blocks = Dimension(length.name, length.size // block)
    query_block = Dimension("query_block_length", block)
    memory_block = Dimension("memory_block_length", block)
    q = reshape(q, batch_dims + [heads, blocks, query_block, kv_channels])
    k = reshape(k, batch_dims + [heads, blocks, memory_block, kv_channels])
    v = reshape(v, batch_dims + [heads, blocks, memory_block, kv_channels])
    if num_prev:
      # Memory of block b: blocks b - num_prev, ..., b - 1, b (zeros before 0).
      k = concat([shift(k, j, blocks, wrap=False) for j in range(num_prev, 0, -1)] + [k],
                 memory_block.name)
      v = concat([shift(v, j, blocks, wrap=False) for j in range(num_prev, 0, -1)] + [v],
                 memory_block.name)
    memory = k.shape.get_dim_by_name(memory_block.name)
    qpos = mtf_range(mesh, query_block, tf.int32)
    mpos = mtf_range(mesh, memory, tf.int32)
    block_start = mtf_range(mesh, blocks, tf.int32) * block
    # Distance from the memory position to the query position.
    distance = qpos - mpos + num_prev * block
    hidden = ew.logical_or(
        ew.logical_or(ew.less(distance, 0), ew.greater_equal(distance, window_size)),
        ew.less(block_start + mpos, num_prev * block))  # before the first position
    o = dot_product_attention(q, k, v, _bias(hidden, x.dtype))
    o = reshape(o, qkv_shape)
    return einsum([o, wo], output_shape=x.shape)


def multihead_self_attention_memory_compressed(
    x: Tensor, mask_right: bool, compression_factor: int, kv_channels: Dimension,
    heads: Dimension, is_training: bool = True, dropout: float = 0.0,
    dropout_broadcast_dims=None, master_dtype=tf.float32, slice_dtype=tf.float32,
    name: Optional[str] = None) -> Tensor:
  """Multi-head self-attention to a memory shortened by mean pooling.

  The keys and values come from the means of consecutive groups of
  `compression_factor` positions (`compress_mean`), so the memory is
  compression_factor times shorter. With mask_right, a query sees a group
  only when the group's last position is at or before it. The softmax has an
  extra zero logit, so a query that sees no group (the
  first compression_factor - 1 positions with mask_right) gets zeros.

  Args:
    x: [batch..., length, io_channels].
    mask_right: causal attention (for decoders).
    compression_factor: the group size; must divide the length.
    kv_channels: per-head key/value dimension.
    heads: heads dimension.
    dropout: dropout rate on the attention weights.
    dropout_broadcast_dims: dimensions along which the dropout mask is shared.
    master_dtype: variable storage dtype.
    slice_dtype: variable slice dtype.
    name: scope name (default "multihead_attention", unique per call);
      variable "<name>/qkvo".
    is_training: dropout is applied only when true.

  Returns:
    a tensor with x's shape.

  Example:
    >>> y = multihead_self_attention_memory_compressed(x, True, 4, d_kv, heads)
  """
  from mesh_tensorflow.layers.core import compress_mean  # pylint: disable=g-import-not-at-top
  batch_dims = x.shape.dims[:-2]
  length, io_channels = x.shape.dims[-2:]
  mesh = x.mesh
  with layer_scope(mesh, name, "multihead_attention"):
    wq, wk, wv, wo = multihead_attention_vars(mesh, heads, io_channels, kv_channels,
                                              master_dtype, slice_dtype, x.dtype)
    memory = rename_dimension(compress_mean(x, length, compression_factor), length.name,
                              memory_name(length.name))
    memory_length = memory.shape.dims[-2]
    q = einsum([x, wq], output_shape=batch_dims + [heads, length, kv_channels])
    kv_shape = batch_dims + [heads, memory_length, kv_channels]
    k = einsum([memory, wk], output_shape=kv_shape)
    v = einsum([memory, wv], output_shape=kv_shape)
    mask = None
    if mask_right:
      query_pos = mtf_range(mesh, length, tf.int32)
      group_end = (mtf_range(mesh, memory_length, tf.int32) * compression_factor
                   + compression_factor - 1)
      mask = _bias(ew.greater(group_end, query_pos), x.dtype)
    o = dot_product_attention(q, k, v, mask, is_training, dropout, dropout_broadcast_dims,
                              extra_logit=0.0)
    return einsum([o, wo], output_shape=x.shape)

from mesh_tensorflow.core import autograph_exempt as _autograph_exempt  # noqa: E402  pylint: disable=g-import-not-at-top
_autograph_exempt.exempt(globals())  # AutoGraph leaves this module's code alone
