"""Dot-product attention over a memory dimension: `attend` (this library's
form), the original's `attention` and `hybrid_attention`, masks as
additive biases (`bias_where`, `add_bias`,
`visibility_mask_to_attention_bias`) and T5-style bucketed relative
position biases (`relative_position_bucket`, `relative_position_bias`), and
the reshape that lets attention split the length over a second mesh axis
(`maybe_reshape_attention_input_for_2d_sharding`).

    >>> o = attend(q, k, v, memory_dim, params.key_dim, bias)
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np
import tensorflow as tf

import mesh_tensorflow as mtf

NEG_INF = -1e9


def attend(q: mtf.Tensor, k: mtf.Tensor, v: mtf.Tensor, memory_dim: mtf.Dimension,
           key_dim: mtf.Dimension, bias: Optional[mtf.Tensor] = None,
           dropout_rate: float = 0.0, train: bool = False, scale: Optional[float] = None,
           log_z: Optional[list] = None) -> mtf.Tensor:
  """softmax(scale * q.k + bias) . v over memory_dim (no 1/sqrt(d_kv) unless
  `scale` says so: see AttentionParams).

  Args:
    q: [batch..., heads, (length,) d_kv].
    k: [batch..., (heads,) memory_length, d_kv].
    v: like k.
    memory_dim: the dimension attended over.
    key_dim: the dimension summed in q.k (also v's depth).
    bias: additive, broadcastable to the logits, or None.
    dropout_rate: dropout on the attention weights (training only).
    train: whether training.
    scale: multiplies the scores q.k (None: 1).
    log_z: if a list, the log-partition of the softmax, [batch..., heads,
      (length)], is appended to it (for an auxiliary z-loss).

  Returns:
    [batch..., heads, (length,) d_kv], q's shape.

  Example:
    >>> o = attend(q, k, v, memory_length, d_kv, bias)
  """
  logits_dims = [d for d in q.shape.dims if d != key_dim]
  logits_dims += [d for d in k.shape.dims if d not in logits_dims and d != key_dim]
  logits = mtf.einsum([q, k], output_shape=mtf.Shape(logits_dims))
  if scale is not None:
    logits = logits * scale
  if bias is not None:
    logits = logits + mtf.cast(bias, logits.dtype)
  if log_z is not None:
    log_z.append(mtf.reduce_logsumexp(logits, memory_dim))
  weights = mtf.softmax(logits, memory_dim)
  if train and dropout_rate > 0.0:
    weights = mtf.dropout(weights, True, rate=dropout_rate)
  return mtf.einsum([weights, v], output_shape=q.shape)


def bias_where(hidden: mtf.Tensor, dtype=tf.float32) -> mtf.Tensor:
  """NEG_INF where `hidden` (bool) is true, else 0 (-3e4 in float16, whose
  range ends at 65504: 0 * -inf would be NaN)."""
  return mtf.cast(hidden, dtype) * (-3e4 if tf.as_dtype(dtype) == tf.float16 else NEG_INF)


def add_bias(a: Optional[mtf.Tensor], b: Optional[mtf.Tensor]) -> Optional[mtf.Tensor]:
  if a is None:
    return b
  if b is None:
    return a
  return a + b


def to_memory(x: mtf.Tensor, length_name: str = "length") -> mtf.Tensor:
  """x with its "length" dimension renamed "memory_length"."""
  return mtf.rename_dimension(x, length_name, "memory_" + length_name)


# ------------------------------------------------------------ relative positions
def relative_position_bucket(relative_position: np.ndarray, bidirectional: bool = True,
                             num_buckets: int = 32, max_distance: int = 128) -> np.ndarray:
  """T5's bucket of each relative position (memory position - query position).

  Half the buckets (all of them if not bidirectional, where positions after
  the query share bucket 0) cover exact small distances, the rest distances
  growing logarithmically up to max_distance; farther ones share the last
  bucket. Computed in NumPy, so the buckets are exact integers whatever the
  layout.

  Example:
    >>> relative_position_bucket(np.array([-1, 0, 1]), bidirectional=False)
    array([1, 0, 0])
  """
  n = -np.asarray(relative_position, np.int64)
  bucket = np.zeros_like(n)
  if bidirectional:
    num_buckets //= 2
    bucket += (n < 0).astype(np.int64) * num_buckets
    n = np.abs(n)
  else:
    n = np.maximum(n, 0)
  max_exact = num_buckets // 2
  is_small = n < max_exact
  with np.errstate(divide="ignore"):
    large = max_exact + (np.log(np.maximum(n, 1) / max_exact) / math.log(max_distance / max_exact)
                         * (num_buckets - max_exact)).astype(np.int64)
  large = np.minimum(large, num_buckets - 1)
  return bucket + np.where(is_small, n, large)


def relative_position_bias(weights: mtf.Tensor, query_position: mtf.Tensor,
                           memory_dim: mtf.Dimension, bidirectional: bool,
                           max_distance: int = 128) -> mtf.Tensor:
  """The learned bias of each (query, memory position) pair.

  Args:
    weights: [heads, buckets] bias variable.
    query_position: int positions of the queries ([length] or, when
      decoding, a scalar or [batch...]).
    memory_dim: the memory dimension; memory positions are its indices.
    bidirectional: use separate buckets for memory after the query.
    max_distance: see `relative_position_bucket`.

  Returns:
    [query_position dims..., memory_dim, heads].

  Example:
    >>> bias = relative_position_bias(w, mtf.range(mesh, length), memory_length, False)
  """
  mesh = weights.mesh
  buckets_dim = weights.shape.dims[-1]
  size = memory_dim.size
  rel_dim = mtf.Dimension("relative_position", 2 * size - 1)
  table = relative_position_bucket(np.arange(-(size - 1), size), bidirectional,
                                   buckets_dim.size, max_distance).astype(np.int32)
  table = mtf.constant(mesh, table, mtf.Shape([rel_dim]), dtype=tf.int32)
  rel = mtf.range(mesh, memory_dim, tf.int32) - query_position + (size - 1)
  rel = mtf.minimum(mtf.maximum(rel, 0), 2 * size - 2)
  buckets = mtf.gather(table, rel, rel_dim)
  return mtf.gather(weights, buckets, buckets_dim)


# --------------------------------------------------------- masks and attention
def visibility_mask_to_attention_bias(visible: mtf.Tensor, dtype) -> mtf.Tensor:
  """An additive attention bias: 0 where `visible` (bool) is true, a large
  negative number where it is false (-1e9; -3e4 in float16, whose range ends
  at 65504).

  Example:
    >>> bias = visibility_mask_to_attention_bias(mtf.less_equal(m_pos, q_pos), tf.float32)
  """
  return bias_where(mtf.logical_not(visible), dtype)


def _is_training(context) -> bool:
  return True if context is None else bool(context.train)


def _dropout_weights(weights: mtf.Tensor, context, dropout_rate: float,
                     dropout_broadcast_dims) -> mtf.Tensor:
  """Dropout on attention weights, the same mask along dropout_broadcast_dims."""
  if not dropout_rate or not _is_training(context):
    return weights
  noise_shape = weights.shape - list(dropout_broadcast_dims or [])
  return mtf.dropout(weights, True, rate=dropout_rate, noise_shape=noise_shape)


def _output_shape(q: mtf.Tensor, key_dim: mtf.Dimension, value_dim: mtf.Dimension) -> mtf.Shape:
  """q's shape with key_dim replaced (in place) by value_dim."""
  return mtf.Shape([value_dim if d == key_dim else d for d in q.shape.dims])


def attention(q: mtf.Tensor, k: mtf.Tensor, v: mtf.Tensor, memory_length_dim: mtf.Dimension,
              key_dim: mtf.Dimension, value_dim: mtf.Dimension,
              bias: Optional[mtf.Tensor] = None, dropout_rate: float = 0.0,
              dropout_broadcast_dims=None, extra_logit=None, context=None,
              float32_logits: bool = True) -> mtf.Tensor:
  """Dot-product attention: softmax(q.k + bias) over memory_length_dim, times v.

  The scores are not scaled (fold 1/sqrt(d_kv) into q, as `AttentionParams`
  does). q has other_query_dims + key_dim, k other_memory_dims +
  memory_length_dim + key_dim and v other_memory_dims + memory_length_dim +
  value_dim, other_memory_dims a subset of other_query_dims (typically q
  [batch, heads, length, d_kv], k and v [batch, heads, memory_length, d_kv]).

  Args:
    q, k, v: the queries, keys and values.
    memory_length_dim: the dimension attended over.
    key_dim: the channels of q and k (summed).
    value_dim: the channels of v.
    bias: added to the scores (broadcast), e.g. from
      `visibility_mask_to_attention_bias`.
    dropout_rate: dropout on the attention weights (when training: the
      context's mode, or always without a context).
    dropout_broadcast_dims: dimensions along which the dropout mask is shared.
    extra_logit: an extra logit (scalar or tensor) in each softmax's
      denominator, as if attending to a zero value.
    context: an optional transformer.Context (training flag; layout for
      `maybe_reshape_attention_input_for_2d_sharding`).
    float32_logits: compute the scores in float32.

  Returns:
    q.shape with key_dim replaced by value_dim.

  Example:
    >>> o = attention(q, k, v, memory_length, d_kv, d_kv, bias)
  """
  out_shape = _output_shape(q, key_dim, value_dim)
  q, k, v, bias = maybe_reshape_attention_input_for_2d_sharding(
      context, q, k, v, bias, [key_dim, value_dim])
  if float32_logits:
    q, k = mtf.cast(q, tf.float32), mtf.cast(k, tf.float32)
  logits = mtf.layers.us_einsum([q, k], reduced_dims=[key_dim])
  if bias is not None:
    logits += mtf.cast(bias, logits.dtype)
  weights = mtf.softmax(logits, memory_length_dim, extra_logit=extra_logit)
  weights = _dropout_weights(mtf.cast(weights, v.dtype), context, dropout_rate,
                             dropout_broadcast_dims)
  o = mtf.einsum([weights, v], output_shape=_output_shape(q, key_dim, value_dim))
  return mtf.reshape(o, out_shape) if o.shape != out_shape else o


def hybrid_attention(q: mtf.Tensor, k: mtf.Tensor, v: mtf.Tensor, context,
                     memory_length_dim: mtf.Dimension, key_dim: mtf.Dimension,
                     value_dim: mtf.Dimension, bias: Optional[mtf.Tensor] = None,
                     dropout_rate: float = 0.0, dropout_broadcast_dims=None,
                     extra_logit=None) -> mtf.Tensor:
  """A learned mixture of ordinary and doubly-normalized attention.

  With scores s = q.k + bias, the weights are
  c * softmax_memory(log_softmax_length(s)) + (1 - c) * softmax_memory(s),
  where the second normalization first normalizes over the queries ("length",
  of memory_length_dim's size) and c is the scalar variable "doubly_coeff"
  (initialized 0.5, clipped to [0, 1]). It needs every query position, so it
  works on whole sequences only (not in incremental decoding).

  Example:
    >>> o = hybrid_attention(q, k, v, context, memory_length, d_kv, d_kv, bias)
  """
  query_length_dim = mtf.Dimension("length", memory_length_dim.size)
  if query_length_dim not in q.shape.dims:
    raise ValueError(f"hybrid_attention: q {q.shape} has no {query_length_dim}: doubly-"
                     "normalized attention needs whole sequences (it cannot decode one "
                     "position at a time); use attention_func=None for decoding.")
  logits = mtf.layers.us_einsum([q, k], reduced_dims=[key_dim])
  if bias is not None:
    logits += mtf.cast(bias, logits.dtype)
  coeff = mtf.get_variable(context.mesh, "doubly_coeff", mtf.Shape([]),
                           initializer=mtf.initializers.constant(0.5),
                           dtype=context.variable_dtype)
  coeff = mtf.maximum(mtf.minimum(coeff, 1.0), 0.0)
  upper = mtf.softmax(logits, memory_length_dim, extra_logit=extra_logit)
  lower = mtf.log_softmax(logits, query_length_dim, extra_logit=extra_logit)
  doubly = mtf.softmax(lower, memory_length_dim, extra_logit=extra_logit)
  weights = coeff * doubly + (1.0 - coeff) * upper
  weights = _dropout_weights(weights, context, dropout_rate, dropout_broadcast_dims)
  return mtf.einsum([weights, v], output_shape=_output_shape(q, key_dim, value_dim))


def maybe_reshape_attention_input_for_2d_sharding(context, q, k, v, bias, unsplittable_dims):
  """q, k, v and bias, reshaped so that a mesh dimension the attention would
  leave idle splits it too (2-D model parallelism), or unchanged.

  When the model has a layout and a mesh shape (context.model.layout and
  mesh_shape) and some mesh dimension splits none of q, k, v and bias, a
  dimension present in q, k and v (not in `unsplittable_dims`, e.g. batch or
  heads) is cut into its high part (same name) and low part (named after a
  tensor dimension the layout maps to the idle mesh dimension), so the
  attention computation is split over that mesh dimension too. The values
  are the same; only where they are computed changes.

  Example:
    >>> q, k, v, bias = maybe_reshape_attention_input_for_2d_sharding(
    ...     context, q, k, v, bias, [d_kv])
  """
  inputs = (q, k, v, bias)
  model = getattr(context, "model", None)
  layout, mesh_shape = getattr(model, "layout", None), getattr(model, "mesh_shape", None)
  if not layout or not mesh_shape:
    return inputs
  mesh_shape = mtf.convert_to_shape(mesh_shape)
  rules = mtf.convert_to_layout_rules(layout)
  used = [False] * mesh_shape.ndims
  for x in inputs:
    if x is None:
      continue
    for axis in rules.tensor_layout(x.shape, mesh_shape):
      if axis is not None:
        used[axis] = True
  if all(used):
    return inputs
  idle = mesh_shape.dims[used.index(False)]
  names = [name for name, mesh_name in rules if mesh_name == idle.name]
  if not names:
    return inputs
  resplit = None
  for d in q.shape.dims:
    if d in k.shape.dims and d in v.shape.dims and d not in unsplittable_dims:
      splits = mtf.tensor_dim_to_mesh_dim_size(layout, mesh_shape, d)
      if d.size % (splits * idle.size) == 0:
        resplit = d
        break
  if resplit is None:
    return inputs
  high = mtf.Dimension(resplit.name, splits)
  low = mtf.Dimension(names[0], resplit.size // splits)

  def reshape(x):
    if x is not None and resplit in x.shape.dims:
      return mtf.replace_dimensions(x, resplit, [high, low])
    return x
  return tuple(reshape(x) for x in inputs)
