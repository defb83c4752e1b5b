"""Attention arithmetic shared by the transformer layers: projections,
scaled-free dot-product attention over a memory dimension, masks as additive
biases, and T5-style bucketed relative position biases.

Tensors use the dimension names of the transformer: queries
[batch..., heads, length, d_kv], keys and values [batch..., heads,
memory_length, d_kv]; during incremental decoding the query has no length
dimension.

    >>> q, k, v = project_qkv(x, memory, params)
    >>> o = attend(q, k, v, memory_dim, params.key_dim, bias)
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np
import tensorflow as tf

import mesh_tensorflow as mtf

NEG_INF = -1e9


class AttentionParams:
  """The q, k, v, o weights of one attention layer.

  q is [d_model, heads, d_kv]; k and v are [d_model, heads, d_kv], or
  [d_model, d_kv] with a single memory head (multi-query attention); o is
  [heads, d_kv, d_model]; with shared_kv one variable "kv" serves k and v (the
  original's names). Initialized normal with stddev (d_model * d_kv)^-0.5
  for q (which takes the place of the 1/sqrt(d_kv) logit scaling),
  d_model^-0.5 for k and v and (heads * d_kv)^-0.5 for o, as T5.

  Args:
    mesh: the mesh.
    d_model: the model dimension.
    heads: the "heads" dimension.
    key_dim: the "d_kv" dimension.
    variable_dtype: an mtf.VariableDType.
    single_memory_head: k and v without a heads dimension.
    shared_kv: one variable for k and v.
    fold_scaling_into_initializer: the scores' 1/sqrt(d_kv) is in the query
      weights' initial scale (default); False: pass `scale` to `attend`.

  Example:
    >>> params = AttentionParams(mesh, d_model, heads, d_kv, mtf.VariableDType())
  """

  def __init__(self, mesh: mtf.Mesh, d_model: mtf.Dimension, heads: mtf.Dimension,
               key_dim: mtf.Dimension, variable_dtype: mtf.VariableDType,
               single_memory_head: bool = False, shared_kv: bool = False,
               fold_scaling_into_initializer: bool = True):
    self.d_model, self.heads, self.key_dim = d_model, heads, key_dim
    self.memory_heads = [] if single_memory_head else [heads]
    normal = mtf.initializers.random_normal

    def var(name, shape, stddev):
      return mtf.get_variable(mesh, name, mtf.Shape(shape), initializer=normal(stddev=stddev),
                              dtype=variable_dtype)
    q_stddev = d_model.size ** -0.5
    if fold_scaling_into_initializer:
      q_stddev *= key_dim.size ** -0.5  # attend() then needs no 1/sqrt(d_kv)
    self.wq = var("q", [d_model, heads, key_dim], q_stddev)
    self.wk = var("kv" if shared_kv else "k", [d_model] + self.memory_heads + [key_dim],
                  d_model.size ** -0.5)
    self.wv = self.wk if shared_kv else var(
        "v", [d_model] + self.memory_heads + [key_dim], d_model.size ** -0.5)
    self.wo = var("o", [heads, key_dim, d_model], (heads.size * key_dim.size) ** -0.5)

  def _project(self, x: mtf.Tensor, w: mtf.Tensor, heads) -> mtf.Tensor:
    batch_and_length = [d for d in x.shape.dims if d != self.d_model]
    lead, last = batch_and_length[:-1], batch_and_length[-1:]
    if last and last[0].name not in ("length", "memory_length"):
      lead, last = batch_and_length, []
    return mtf.einsum([x, w], output_shape=mtf.Shape(lead + heads + last + [self.key_dim]))

  def compute_q(self, x: mtf.Tensor) -> mtf.Tensor:
    """[batch..., heads, (length,) d_kv] from x [batch..., (length,) d_model]."""
    return self._project(x, self.wq, [self.heads])

  def compute_k(self, memory: mtf.Tensor) -> mtf.Tensor:
    return self._project(memory, self.wk, self.memory_heads)

  def compute_v(self, memory: mtf.Tensor) -> mtf.Tensor:
    return self._project(memory, self.wv, self.memory_heads)

  def compute_output(self, o: mtf.Tensor, output_shape) -> mtf.Tensor:
    """Back to d_model: o [batch..., heads, (length,) d_kv] -> output_shape."""
    return mtf.einsum([o, self.wo], output_shape=output_shape)


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
