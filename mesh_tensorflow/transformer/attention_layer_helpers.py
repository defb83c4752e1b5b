"""What the attention layer families share: the encoder-decoder attention
(`enc_dec_attention`, `enc_dec_attention_bias`), its
relative-position spans (`relative_position_spans`), and small helpers for
memories, decoding caches and attention biases.

`transformer_layers` re-exports the three public functions under their
original names:

    >>> bias = enc_dec_attention_bias(layer, context, heads_dims)
    >>> spans = relative_position_spans(context)
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.layers.attention import _relative_position_bucket
from mesh_tensorflow.transformer import attention
from mesh_tensorflow.transformer import layer_stack
from mesh_tensorflow.transformer import sequence_parallel
from mesh_tensorflow.transformer import transformer

INCREMENTAL = transformer.ModeKeys.INCREMENTAL
FIRST_PART = transformer.ModeKeys.FIRST_PART


def _gin_or(name: str, default):
  """The gin-configurable version of a layer class once registered (so that
  gin bindings apply to layers built inside other layers), else `default`."""
  return layer_stack.gin_configurables().get(name, default)


class _EncoderMemory:
  """What the encoder-decoder attention layers share: relative_attention_type
  defaults to None, they make no shared params (a "bias_shared" relative
  bias is made by `enc_dec_attention_bias`) and their memory is the
  encoder's output. Comes before the attention class among the bases."""

  def __init__(self, relative_attention_type: Optional[str] = None, **kwargs):
    super().__init__(relative_attention_type=relative_attention_type, **kwargs)

  def make_shared_params(self, context: transformer.Context) -> None:
    del context

  def _get_memory_antecedent(self, context: transformer.Context) -> Optional[mtf.Tensor]:
    return context.encoder_output


def _memory(context: transformer.Context, x: mtf.Tensor) -> mtf.Tensor:
  return mtf.replace_dimensions(x, context.length_dim, context.memory_length_dim)


def _to_memory_length(x: mtf.Tensor) -> mtf.Tensor:
  """x with a "length" dimension (or a sequence-parallel stack's
  "residual_length") renamed "memory_length" (unchanged if none)."""
  for name in ("length", sequence_parallel.RESIDUAL_LENGTH):
    if name in [d.name for d in x.shape.dims]:
      return mtf.rename_dimension(x, name, "memory_length")
  return x


def _memory_dim(m: mtf.Tensor, owner: str) -> mtf.Dimension:
  dims = [d for d in m.shape.dims if d.name == "memory_length"]
  if not dims:
    raise ValueError(f"{owner}: the encoder output {m.shape} has no \"memory_length\" "
                     "dimension.")
  return dims[0]


def _encoder_output(layer, context: transformer.Context) -> mtf.Tensor:
  m = layer._get_memory_antecedent(context)  # pylint: disable=protected-access
  if m is None:
    raise ValueError(f"{type(layer).__name__} needs context.encoder_output (use it in a "
                     "Bitransformer's decoder).")
  if m.shape.dims[-1] != context.model.model_dim:
    raise ValueError(f"{type(layer).__name__}: the encoder output's channels "
                     f"{m.shape.dims[-1]} differ from the decoder's {context.model.model_dim}.")
  return m


def _once_per_decode(layer, context: transformer.Context, memory: Optional[mtf.Tensor],
                     compute: Callable[[mtf.Tensor], Sequence[mtf.Tensor]]) -> tuple:
  """compute(memory) and memory's "memory_length" dimension, as one tuple,
  computed once per decode: the first part records them as a constant
  state and each incremental step reads them back (memory is then unused)."""
  if context.incremental:
    return context.get_constant_state()
  values = tuple(compute(memory)) + (_memory_dim(memory, type(layer).__name__),)
  if context.mode == FIRST_PART:
    context.record_constant_state(values)
  return values


def _update_cache(context: transformer.Context, cache: mtf.Tensor, new: mtf.Tensor,
                  memory_dim: mtf.Dimension) -> mtf.Tensor:
  """cache [..., memory_length, ...] with the decoded position's slot set to new."""
  at = mtf.one_hot(context.position, memory_dim, dtype=new.dtype)
  return cache * (1.0 - at) + new * at


def _self_attention_bias(layer, context: transformer.Context, dtype) -> Optional[mtf.Tensor]:
  """The causal, packing, priority and relative-position bias of a
  self-attention layer (SelfAttention's), for the current mode."""
  if context.incremental:
    return layer._step_bias(context, dtype)  # pylint: disable=protected-access
  return layer._full_bias(context, dtype)  # pylint: disable=protected-access


def _attention_kwargs(layer, context: transformer.Context) -> dict:
  """The keyword arguments of `attention.attention` for a layer: its
  attention_kwargs, dropout (training only) shared along the length."""
  kwargs = dict(getattr(layer, "attention_kwargs", None) or {})
  kwargs["dropout_rate"] = layer.dropout_rate if context.train else 0.0
  kwargs.setdefault("dropout_broadcast_dims", [context.length_dim])
  return kwargs


# ------------------------------------------------------- relative positions
def relative_position_spans(context: transformer.Context, num_sentinels: int = None
                            ) -> mtf.Tensor:
  """Relative positions from decoder to encoder tokens for span-filling
  (denoising) objectives: [batch..., length, memory_length].

  Inputs are text with spans replaced by sentinels (the last num_sentinels
  ids of the vocabulary); targets are the spans, each after its sentinel.
  A target token is placed at its sentinel's position in the input (tokens
  before any sentinel at the input's start) and the result is that position
  minus each encoder position. Packed examples (sequence ids) are kept
  apart. When decoding ("first_part" and "incremental" modes) every target
  is placed at the start: decoding a model whose
  targets hold sentinels sees other positions than its training did.

  Args:
    context: a decoder Context (inputs, encoder_inputs, sequence ids).
    num_sentinels: the number of sentinel ids (the vocabulary's extra_ids).

  Example:
    >>> rel = relative_position_spans(context, num_sentinels=100)
  """
  if num_sentinels is None:
    raise ValueError("relative_position_spans: num_sentinels is required (gin: "
                     "relative_position_spans.num_sentinels = <vocabulary extra_ids>).")
  decoding = context.mode in (INCREMENTAL, FIRST_PART)
  if not isinstance(context.encoder_inputs, mtf.Tensor):
    if decoding and isinstance(context.encoder_output, mtf.Tensor):
      # Decoding places every target at the input's start (see above).
      encoder_length = _memory_dim(context.encoder_output, "relative_position_spans")
      return 0 - mtf.range(context.mesh, encoder_length, tf.int32)
    raise ValueError("relative_position_spans needs context.encoder_inputs (a decoder of a "
                     "Bitransformer).")
  encoder_id = _to_memory_length(context.encoder_inputs)
  encoder_length = _memory_dim(encoder_id, "relative_position_spans")
  decoder_id, decoder_length = context.inputs, context.length_dim
  encoder_pos = mtf.range(encoder_id.mesh, encoder_length, tf.int32)
  if decoding or decoder_id is None or decoder_length not in decoder_id.shape.dims:
    return 0 - encoder_pos
  model = context.model
  vocab_size = getattr(model, "input_vocab_size_unpadded", None) or getattr(
      model, "input_vocab_size", None) or model.input_vocab_dim.size

  def is_sentinel(t):
    return mtf.cast(mtf.greater_equal(t, vocab_size - num_sentinels), tf.int32)
  encoder_segment = mtf.cumsum(is_sentinel(encoder_id), encoder_length)
  decoder_segment = mtf.cumsum(is_sentinel(decoder_id), decoder_length)
  if isinstance(context.encoder_sequence_id, mtf.Tensor) and isinstance(
      context.sequence_id, mtf.Tensor):
    multiplier = max(encoder_length.size, decoder_length.size)
    encoder_segment += _to_memory_length(context.encoder_sequence_id) * multiplier
    decoder_segment += context.sequence_id * multiplier
  dec_to_enc = mtf.reduce_sum(mtf.to_int32(mtf.less(encoder_segment, decoder_segment)),
                              reduced_dim=encoder_length)
  return dec_to_enc - encoder_pos


def enc_dec_attention_bias(layer, context: transformer.Context, heads_dims,
                           relative_position_fn=None) -> Optional[mtf.Tensor]:
  """The bias of encoder-decoder attention.

  Hides encoder padding (encoder sequence id 0) and, with packed examples,
  the encoder segments of other examples (decoder sequence id != encoder
  sequence id). With the layer's relative_attention_type "bias" or
  "bias_shared", adds a learned bias "enc_dec_relative_attention_bias"
  [heads_dims..., buckets] of the bucketed relative_position_fn(context)
  (bidirectional buckets; default `relative_position_spans`, gin bindings
  applying); "bias_shared" makes one per model.

  Example:
    >>> bias = enc_dec_attention_bias(layer, context, [mtf.Dimension("heads", 8)])
  """
  dtype = context.activation_dtype
  bias = None
  enc_ids = context.encoder_sequence_id
  if isinstance(enc_ids, mtf.Tensor):
    enc_ids = _to_memory_length(enc_ids)
    if isinstance(context.sequence_id, mtf.Tensor) and not context.incremental:
      bias = attention.visibility_mask_to_attention_bias(
          mtf.equal(context.sequence_id, enc_ids), dtype)
    else:
      bias = attention.visibility_mask_to_attention_bias(mtf.not_equal(enc_ids, 0), dtype)
  kind = getattr(layer, "relative_attention_type", None)
  if kind in ("bias", "bias_shared"):
    buckets_dim = mtf.Dimension("buckets", layer.relative_attention_num_buckets)
    shape = mtf.Shape(list(heads_dims) + [buckets_dim])
    key = ("enc_dec_relative_attention_bias", tuple(heads_dims))
    values = context.cache.get(key) if kind == "bias_shared" else None
    if values is None:
      values = mtf.get_variable(context.mesh, "enc_dec_relative_attention_bias", shape,
                                dtype=context.variable_dtype)
      if kind == "bias_shared":
        context.cache[key] = values
    if relative_position_fn is None:
      relative_position_fn = _gin_or("relative_position_spans", relative_position_spans)
    buckets = _relative_position_bucket(relative_position_fn(context), bidirectional=True,
                                        num_buckets=buckets_dim.size)
    bias = attention.add_bias(bias, mtf.cast(mtf.gather(values, buckets, buckets_dim), dtype))
  elif kind is not None:
    raise ValueError(f"{type(layer).__name__}: relative_attention_type must be None, 'bias' "
                     f"or 'bias_shared' for encoder-decoder attention, got {kind!r}.")
  return bias


def enc_dec_attention(self_attention_layer, memory_antecedent: mtf.Tensor,
                      context: transformer.Context, x: mtf.Tensor, losses=None,
                      attention_fn=attention.attention) -> mtf.Tensor:
  """Multi-head attention of x over memory_antecedent (the encoder output)
  with the layer's parameters (`make_params`): the encoder keys and values
  are computed once per decode ("first_part") and read back in every
  incremental step.

  Example:
    >>> y = enc_dec_attention(layer, context.encoder_output, context, x)
  """
  layer = self_attention_layer
  if memory_antecedent.shape.dims[-1] != context.model.model_dim:
    raise ValueError(f"enc_dec_attention: the memory's channels {memory_antecedent.shape.dims[-1]}"
                     f" differ from the model's {context.model.model_dim}.")
  params = layer.make_params(context)
  q = params.compute_q(x)

  def keys_and_values(m):
    if layer.shared_kv:
      kv = params.compute_kv(m)
      return kv, kv
    return params.compute_k(m), params.compute_v(m)
  k, v, memory_length = _once_per_decode(layer, context, memory_antecedent, keys_and_values)
  bias = _gin_or("enc_dec_attention_bias", enc_dec_attention_bias)(
      layer, context, params.query_heads_dims)
  o = attention_fn(q, k, v, memory_length, layer.kv_dim, layer.kv_dim, bias, context=context,
                   **_attention_kwargs(layer, context))
  shape = (layer.expected_attention_output_shape(x, params)
           if hasattr(layer, "expected_attention_output_shape") else x.shape)
  out = params.compute_output(o, output_shape=shape)
  if hasattr(layer, "layer_output_from_attention_output"):
    out = layer.layer_output_from_attention_output(context, out, losses)
  return out


def _self_attention_output(layer, context: transformer.Context, x: mtf.Tensor, params,
                           attention_fn, output_shape, **fn_kwargs) -> mtf.Tensor:
  """SelfAttention's computation with another attention function and output
  shape: caches of keys and values in the decoding modes."""
  memory_dim = context.memory_length_dim
  q = params.compute_q(x)
  if context.incremental:
    k_new, v_new = params.compute_k(x), params.compute_v(x)
    k_cache, v_cache = context.get_states(2)
    k = _update_cache(context, k_cache, k_new, memory_dim)
    v = _update_cache(context, v_cache, v_new, memory_dim)
    context.record_new_states([k, v])
  else:
    m = _memory(context, x)
    k, v = params.compute_k(m), params.compute_v(m)
    if context.mode == FIRST_PART:
      context.record_new_states([k, v])
  bias = _self_attention_bias(layer, context, x.dtype)
  o = attention_fn(q, k, v, memory_length_dim=memory_dim, key_dim=layer.kv_dim,
                   value_dim=layer.kv_dim, bias=bias, context=context,
                   **_attention_kwargs(layer, context), **fn_kwargs)
  return params.compute_output(o, output_shape=output_shape)


def _heads(dims, what: str):
  try:
    return [mtf.convert_to_dimension(d) for d in dims]
  except (TypeError, ValueError) as e:
    raise ValueError(f"{what} must be a list of mtf.Dimension or (name, size) pairs, got "
                     f"{dims!r}: {e}") from None


def _set_relative(layer, owner, kind, num_buckets):
  if kind not in (None, "bias", "bias_shared"):
    raise ValueError(f"{owner}: relative_attention_type must be None, 'bias' or "
                     f"'bias_shared', got {kind!r}.")
  layer.relative_attention_type = kind
  layer.relative_attention_num_buckets = num_buckets
  layer.relative_attention_max_distance = 128
  layer.z_loss_coeff = None
  layer.fold_scaling_into_initializer = True
