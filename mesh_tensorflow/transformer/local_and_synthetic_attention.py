"""Attention without full query-key scores: synthesized weights
(`synthetic_attention`, the Synthesizer's modes), windows along the length
(`local_attention_1d`).

    >>> o = local_attention_1d(q, k, v, length_dim, key_dim, value_dim, radius=128)
"""

from __future__ import annotations

from typing import Optional

import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer.dot_product_attention import (
    _dropout_weights, _output_shape, attention, visibility_mask_to_attention_bias)


SYNTHESIZE_MODES = ("random", "factorized", "dense_minus", "random_plus_alpha", "random_plus",
                    "dense_plus_alpha", "dense_plus")


def _slice_synthetic(r: mtf.Tensor, q: mtf.Tensor, memory_length_dim: mtf.Dimension,
                     context, gather_position: bool) -> mtf.Tensor:
  """r [..., length:max, memory_length:max] cut to the memory length and to
  the queries' length (or, decoding, the row of context.position)."""
  max_memory = r.shape.get_dim_by_name(memory_length_dim.name).size
  if memory_length_dim.size > max_memory:
    raise ValueError(f"synthetic_attention: memory length {memory_length_dim.size} exceeds the "
                     f"synthesizer's max_length {max_memory}; raise max_length.")
  r = mtf.slice(r, 0, memory_length_dim.size, memory_length_dim.name)
  if context is not None and context.mode == "incremental":
    if gather_position:
      r = mtf.gather(r, context.position, r.shape.get_dim_by_name("length"))
    return r
  length_dim = q.shape.get_dim_by_name("length")
  return mtf.slice(r, 0, length_dim.size, "length")


def _alpha_mix(context, logits: mtf.Tensor, r: mtf.Tensor, with_alpha: bool) -> mtf.Tensor:
  if not with_alpha:
    return logits + r
  alpha = mtf.get_variable(context.mesh, "alpha", mtf.Shape([mtf.Dimension("alpha", 1)]),
                           initializer=mtf.initializers.zeros(), dtype=context.variable_dtype)
  alpha = mtf.reduce_sum(mtf.sigmoid(alpha))  # the one value, as a scalar
  return (1.0 - alpha) * logits + alpha * r


def synthetic_attention(q: mtf.Tensor, k: mtf.Tensor, v: mtf.Tensor,
                        memory_length_dim: mtf.Dimension, key_dim: mtf.Dimension,
                        value_dim: mtf.Dimension, bias: Optional[mtf.Tensor] = None,
                        dropout_rate: float = 0.0, dropout_broadcast_dims=None,
                        extra_logit=None, synthesize: bool = True,
                        synthesize_mode: str = "random_plus_alpha", factorized_dim: int = 16,
                        max_length: int = 512, context=None) -> mtf.Tensor:
  """Synthesizer attention (Tay et al., "Synthesizer: Rethinking
  Self-Attention in Transformer Models"): scores that are learned rather than
  (or as well as) computed from query-key dot products.

  Modes (variables under the caller's scope):

  * "random": learned scores "R" [length:max_length, heads,
    memory_length:max_length]; q is not used (only its dimensions).
  * "factorized": R = R1 . R2 over "tmp":factorized_dim, "R1" and "R2"
    [tmp, heads, memory_length:512] (R1's memory_length indexes the queries).
  * "dense_minus": scores dense(relu(q)) -> memory_length:max_length
    (variable "pi/kernel" [d_kv, memory_length]).
  * "random_plus" / "random_plus_alpha": q.k plus R [length:512, heads,
    memory_length:512], or (1 - a) q.k + a R with a = sigmoid("alpha").
  * "dense_plus" / "dense_plus_alpha": the same with the dense scores.

  Learned scores are cut to the actual lengths; in incremental decoding the
  row of the position being decoded is used. With synthesize=False this is
  plain dot-product attention.

  Args:
    q: as `attention`, and so are k, v, memory_length_dim, key_dim,
      value_dim, bias, dropout_rate, dropout_broadcast_dims and extra_logit.
    synthesize: use the synthetic scores.
    synthesize_mode: one of the modes above.
    factorized_dim: the size of "tmp" (factorized mode).
    max_length: the longest sequence of the random and dense_minus modes.
    context: the transformer.Context (required: mesh, mode, variable dtype).

  Returns:
    [other query dims..., heads, value_dim] ("random", "factorized"), q.shape
    with key_dim replaced by value_dim (the others).

  Example:
    >>> o = synthetic_attention(q, k, v, memory_length, d_kv, d_kv, bias,
    ...                         synthesize_mode="random_plus_alpha", context=context)
  """
  if synthesize and synthesize_mode not in SYNTHESIZE_MODES:
    raise ValueError(f"synthetic_attention: synthesize_mode must be one of "
                     f"{SYNTHESIZE_MODES}, got {synthesize_mode!r}.")
  if synthesize and context is None:
    raise ValueError("synthetic_attention: synthesize=True needs the layer's context.")
  heads = None
  if synthesize:
    if "heads" not in [d.name for d in v.shape.dims]:
      raise ValueError(f"synthetic_attention: v {v.shape} needs a \"heads\" dimension.")
    heads = v.shape.get_dim_by_name("heads")

    def table(name, dims):
      return mtf.get_variable(context.mesh, name, mtf.Shape(dims), dtype=context.variable_dtype)
    if synthesize_mode == "random":
      r = table("R", [mtf.Dimension("length", max_length), heads,
                      mtf.Dimension("memory_length", max_length)])
      logits = _slice_synthetic(r, q, memory_length_dim, context, True)
    elif synthesize_mode == "factorized":
      tmp, mem = mtf.Dimension("tmp", factorized_dim), mtf.Dimension("memory_length", 512)
      r1 = mtf.rename_dimension(table("R1", [tmp, heads, mem]), "memory_length", "length")
      r2 = table("R2", [tmp, heads, mem])
      r = mtf.einsum([r1, r2], output_shape=mtf.Shape(
          [mtf.Dimension("length", 512), heads, mem]))
      logits = _slice_synthetic(r, q, memory_length_dim, context, True)
    elif synthesize_mode.startswith("dense"):
      size = max_length if synthesize_mode == "dense_minus" else 512
      r = mtf.layers.dense(mtf.relu(q), [mtf.Dimension("memory_length", size)], use_bias=False,
                           name="pi", reduced_dims=[key_dim])
      r = _slice_synthetic(r, q, memory_length_dim, context, False)
      if synthesize_mode == "dense_minus":
        logits = r
      else:
        logits = _alpha_mix(context, mtf.einsum([q, k], reduced_dims=[key_dim]), r,
                            "alpha" in synthesize_mode)
    else:
      r = table("R", [mtf.Dimension("length", 512), heads, mtf.Dimension("memory_length", 512)])
      r = _slice_synthetic(r, q, memory_length_dim, context, True)
      logits = _alpha_mix(context, mtf.einsum([q, k], reduced_dims=[key_dim]), r,
                          "alpha" in synthesize_mode)
  else:
    logits = mtf.einsum([q, k], reduced_dims=[key_dim])
  if bias is not None:
    logits += mtf.cast(bias, logits.dtype)
  weights = mtf.softmax(logits, memory_length_dim, extra_logit=extra_logit)
  weights = _dropout_weights(weights, context, dropout_rate, dropout_broadcast_dims)
  if synthesize and synthesize_mode in ("random", "factorized"):
    rest = [d for d in q.shape.dims if d != key_dim and d != heads][:-1] if (
        key_dim in q.shape.dims) else q.shape.dims[:-1]
    out_shape = mtf.Shape([d for d in rest if d != heads] + [heads, value_dim])
  else:
    out_shape = _output_shape(q, key_dim, value_dim)
  return mtf.einsum([weights, v], output_shape=out_shape)


def local_attention_1d(q: mtf.Tensor, k: mtf.Tensor, v: Optional[mtf.Tensor],
                       length_dim: mtf.Dimension, key_dim: mtf.Dimension,
                       value_dim: mtf.Dimension, fully_autoregressive: bool = True,
                       length_dim_num_splits: int = 1, radius: int = 128, sequence_id=1,
                       write_priority: Optional[mtf.Tensor] = None,
                       read_priority: Optional[mtf.Tensor] = None,
                       attention_kwargs: Optional[dict] = None) -> mtf.Tensor:
  """Attention to a neighbourhood, computed block by block.

  Query position p sees memory positions in (p - radius, p] if
  fully_autoregressive, else in (p - radius, p + radius]; only positions of
  its own sequence (equal sequence_id); and, given priorities, only where
  read_priority[p] >= write_priority[m]. The length is cut into blocks (the
  largest divisor of length / length_dim_num_splits not above
  max(radius, 128)) whose keys and values are extended by `radius` positions
  of the neighbouring blocks (a halo exchange, which stays between
  neighbouring processors when the length is split), so memory is
  O(length * (block + radius)).

  Args:
    q: [..., length_dim, ..., key_dim].
    k: like q.
    v: like k with value_dim, or None for v = k.
    length_dim: the sequence dimension.
    key_dim: the channels of q and k.
    value_dim: the channels of v.
    fully_autoregressive: look back only.
    length_dim_num_splits: how many ways the layout splits length_dim.
    radius: how far each position looks.
    sequence_id: packed-example ids [..., length_dim] (or an int: one example).
    write_priority: optional int [..., length_dim].
    read_priority: optional int [..., length_dim].
    attention_kwargs: keyword arguments for `attention` (dropout_rate, ...).

  Returns:
    q's shape with key_dim replaced by value_dim.

  Example:
    >>> o = local_attention_1d(q, k, v, length, d_kv, d_kv, radius=16)
  """
  if radius < 1:
    raise ValueError(f"local_attention_1d: radius must be positive, got {radius}.")
  if length_dim.size % length_dim_num_splits:
    raise ValueError(f"local_attention_1d: length_dim_num_splits={length_dim_num_splits} must "
                     f"divide {length_dim}.")
  per_split = length_dim.size // length_dim_num_splits
  block = max(radius, 128)
  while per_split % block:
    block -= 1
  query_block = mtf.Dimension("query_block_length", block)
  memory_block = mtf.Dimension("memory_block_length", block)
  num_blocks = mtf.Dimension(length_dim.name, length_dim.size // block)
  exchange = mtf.left_halo_exchange if fully_autoregressive else mtf.halo_exchange

  def as_query(x):
    return mtf.replace_dimensions(x, length_dim, [num_blocks, query_block])

  def as_memory(x):
    x = mtf.replace_dimensions(x, length_dim, [num_blocks, memory_block])
    return exchange(x, num_blocks, memory_block, radius)
  mesh = q.mesh
  q = as_query(q)
  k = as_memory(k)
  v = k if v is None else as_memory(v)
  if sequence_id is None:
    sequence_id = 1
  if not isinstance(sequence_id, mtf.Tensor) or length_dim not in sequence_id.shape.dims:
    sequence_id = sequence_id + mtf.zeros(mesh, mtf.Shape([length_dim]), tf.int32)
  pos = mtf.range(mesh, length_dim, tf.int32)
  # Memory past the sequence's ends comes back from the halo as zeros: give
  # it sequence id -1 so that no query sees it.
  m_sequence_id = as_memory(sequence_id + 1) - 1
  relative = as_memory(pos) - as_query(pos)
  visible = mtf.equal(as_query(sequence_id), m_sequence_id)
  visible = mtf.logical_and(visible, mtf.greater(relative, -radius))
  visible = mtf.logical_and(
      visible, mtf.less_equal(relative, 0 if fully_autoregressive else radius))
  if read_priority is not None:
    visible = mtf.logical_and(visible, mtf.greater_equal(as_query(read_priority),
                                                         as_memory(write_priority)))
  padded = mtf.Dimension("memory_block_length",
                         (1 if fully_autoregressive else 2) * radius + block)
  bias = visibility_mask_to_attention_bias(visible, q.dtype)
  o = attention(q, k, v, padded, key_dim, value_dim, bias, **(attention_kwargs or {}))
  return mtf.replace_dimensions(o, [num_blocks, query_block], length_dim)
