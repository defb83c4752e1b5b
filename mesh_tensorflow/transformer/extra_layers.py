"""The original Mesh TensorFlow's further transformer layers, with its call
forms and variable names: talking-heads, general bilinear, branched and
synthesizer attention, transparent encoder-decoder attention, parallel
layers and (dynamic / lightweight) separable convolutions, plus the helpers
`enc_dec_attention`, `enc_dec_attention_bias` and `relative_position_spans`.

Import them from `transformer_layers` (this module adds everything here to it):

    >>> from mesh_tensorflow.transformer import transformer_layers as tl
    >>> layers = [tl.TalkingHeadsSelfAttention(key_heads_dims=[("heads", 8)],
    ...                                        softmax_heads_dims=[("heads", 8)],
    ...                                        value_heads_dims=[("heads", 8)]),
    ...           tl.DenseReluDense(hidden_size=2048)]

Every layer runs in training and eval (whole sequences) and in the decoding
modes ("first_part", then "incremental"); the two exceptions say so in a
clear error (hybrid attention, dynamic talking-heads projections from the
memory).
"""

from __future__ import annotations

import math
from typing import Optional

import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import attention
from mesh_tensorflow.transformer import layer_stack
from mesh_tensorflow.transformer import transformer
from mesh_tensorflow.transformer import transformer_layers as tl

INCREMENTAL = transformer.ModeKeys.INCREMENTAL
FIRST_PART = transformer.ModeKeys.FIRST_PART


def _gin_or(name: str, default):
  """The gin-configurable version of a layer class once registered (so that
  gin bindings apply to layers built inside other layers), else `default`."""
  return layer_stack.gin_configurables().get(name, default)


def _memory(context: transformer.Context, x: mtf.Tensor) -> mtf.Tensor:
  return mtf.replace_dimensions(x, context.length_dim, context.memory_length_dim)


def _to_memory_length(x: mtf.Tensor) -> mtf.Tensor:
  """x with a "length" dimension renamed "memory_length" (unchanged if none)."""
  if "length" in [d.name for d in x.shape.dims]:
    return mtf.rename_dimension(x, "length", "memory_length")
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
def _relative_position_bucket(relative_position: mtf.Tensor, bidirectional: bool = True,
                              num_buckets: int = 32, max_distance: int = 128) -> mtf.Tensor:
  """`attention.relative_position_bucket` on an int32 mtf.Tensor of
  relative positions (memory position - query position)."""
  n = -relative_position
  ret = mtf.zeros_like(n)
  if bidirectional:
    num_buckets //= 2
    ret += mtf.to_int32(mtf.less(n, 0)) * num_buckets
    n = mtf.abs(n)
  else:
    n = mtf.maximum(n, 0)
  max_exact = num_buckets // 2
  is_small = mtf.less(n, max_exact)
  large = max_exact + mtf.to_int32(
      mtf.log(mtf.to_float(mtf.maximum(n, 1)) / max_exact)
      / math.log(max_distance / max_exact) * (num_buckets - max_exact))
  large = mtf.minimum(large, num_buckets - 1)
  return ret + mtf.where(is_small, n, large)


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
  is placed at the start, as in the original: decoding a model whose
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
  if context.incremental:
    k, v, memory_length = context.get_constant_state()
  else:
    m = memory_antecedent
    if layer.shared_kv:
      k = v = params.compute_kv(m)
    else:
      k, v = params.compute_k(m), params.compute_v(m)
    memory_length = _memory_dim(m, type(layer).__name__)
    if context.mode == FIRST_PART:
      context.record_constant_state((k, v, memory_length))
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


# ------------------------------------------------------------ talking heads
def _heads(dims, what: str):
  try:
    return [mtf.convert_to_dimension(d) for d in dims]
  except (TypeError, ValueError) as e:
    raise ValueError(f"{what} must be a list of mtf.Dimension or (name, size) pairs, got "
                     f"{dims!r}: {e}") from None


class TalkingHeadsSelfAttention(tl.SelfAttention):
  """Talking-heads attention (Shazeer et al., 2020, arXiv:2003.02436).

  Queries and keys have heads `key_heads_dims`, the softmax
  `softmax_heads_dims` and the values `value_heads_dims`. Where two of them
  differ, learned projections across heads mix the scores before the
  softmax ("logits" [key heads, softmax heads]) and the weights after it
  ("weights" [softmax heads, value heads]); a dimension present on both
  sides is kept (not mixed). With the three sets equal this is multi-head
  attention. `dynamic_projections` (a subset of "x2l", "m2l", "x2w", "m2w")
  adds projections computed from the queries' input x or the memory m
  (variables "<logits|weights>/<...>_dynamic_<i>/kernel"); those from the
  memory work on whole sequences only.

  Variables: "q/kernel" [d_model, key heads..., d_k], "k/kernel",
  "v/kernel" [d_model, value heads..., d_v], "y/kernel" [value heads...,
  d_v, d_model], "logits/kernel", "weights/kernel" and, with a relative
  attention type, "relative_attention_bias" [softmax heads..., buckets].

  Args:
    key_heads_dims: list of mtf.Dimension or (name, size) pairs.
    softmax_heads_dims: likewise.
    value_heads_dims: likewise.
    key_size: size of "d_k".
    value_size: size of "d_v".
    dropout_rate: dropout on the attention weights (training).
    relative_attention_type: None, "bias" or "bias_shared".
    relative_attention_num_buckets: number of relative-position buckets.
    dynamic_projections: see above.
    dynamic_projections_init_scale: initializer variance scale of the
      dynamic projections (divided by the reduced heads' size).

  Example:
    >>> layer = TalkingHeadsSelfAttention(key_heads_dims=[("key_heads", 4)],
    ...                                   softmax_heads_dims=[("heads", 8)],
    ...                                   value_heads_dims=[("value_heads", 4)])
  """

  def __init__(self, key_heads_dims=(("heads", 12),), softmax_heads_dims=(("heads", 12),),  # pylint: disable=super-init-not-called
               value_heads_dims=(("heads", 12),), key_size: int = 64, value_size: int = 64,
               dropout_rate: float = 0.0, relative_attention_type: Optional[str] = None,
               relative_attention_num_buckets: int = 32, dynamic_projections=None,
               dynamic_projections_init_scale: float = 1e-2):
    name = type(self).__name__
    self.key_heads_dims = _heads(key_heads_dims, f"{name}: key_heads_dims")
    self.softmax_heads_dims = _heads(softmax_heads_dims, f"{name}: softmax_heads_dims")
    self.value_heads_dims = _heads(value_heads_dims, f"{name}: value_heads_dims")
    self.key_dim = mtf.Dimension("d_k", key_size)
    self.value_dim = mtf.Dimension("d_v", value_size)
    self.dropout_rate = dropout_rate
    _set_relative(self, name, relative_attention_type, relative_attention_num_buckets)
    self.dynamic_projections = list(dynamic_projections or [])
    bad = [p for p in self.dynamic_projections if p not in ("x2l", "m2l", "x2w", "m2w")]
    if bad:
      raise ValueError(f"{name}: dynamic_projections must be a subset of ['x2l', 'm2l', "
                       f"'x2w', 'm2w'], got {bad}.")
    self.dynamic_projections_init_scale = dynamic_projections_init_scale

  def query_heads_dims(self) -> list:
    return list(self.softmax_heads_dims)

  def _dense(self, context, x, reduced, new, name, init_scale=None):
    init = (None if init_scale is None else
            mtf.layers.VarianceScalingInitializer(init_scale))
    return mtf.layers.dense(x, new_dims=new, reduced_dims=reduced, use_bias=False,
                            variable_dtype=context.variable_dtype, name=name,
                            kernel_initializer=init)

  def compute_q(self, context, x):
    scale = 1.0 if mtf.layers.unit_scaling_convention() else 1.0 / self.key_dim.size
    return self._dense(context, x, [context.model.model_dim],
                       self.key_heads_dims + [self.key_dim], "q", scale)

  def compute_k(self, context, x):
    return self._dense(context, x, [context.model.model_dim],
                       self.key_heads_dims + [self.key_dim], "k")

  def compute_v(self, context, x):
    return self._dense(context, x, [context.model.model_dim],
                       self.value_heads_dims + [self.value_dim], "v")

  def compute_y(self, context, u):
    return self._dense(context, u, self.value_heads_dims + [self.value_dim],
                       [context.model.model_dim], "y")

  def call(self, context, x, losses=None):
    del losses
    memory_dim = context.memory_length_dim
    q = self.compute_q(context, x)
    m = x if context.incremental else _memory(context, x)
    k, v = self.compute_k(context, m), self.compute_v(context, m)
    if context.incremental:
      old_k, old_v = context.get_states(2)
      k = _update_cache(context, old_k, k, memory_dim)
      v = _update_cache(context, old_v, v, memory_dim)
    if context.mode in (INCREMENTAL, FIRST_PART):
      context.record_new_states([k, v])
    bias = _self_attention_bias(self, context, x.dtype)
    return self.attention_internal(context, x, m, q, k, v, memory_dim, bias)

  def attention_internal(self, context, x, m, q, k, v, memory_length, bias):
    """softmax-attention with the talking-heads projections, back to d_model."""
    if context.incremental and any(p in self.dynamic_projections for p in ("m2l", "m2w")):
      raise ValueError(f"{type(self).__name__}: dynamic projections from the memory "
                       "('m2l', 'm2w') need whole sequences; they cannot decode "
                       "incrementally.")
    p = mtf.layers.us_einsum([q, k], reduced_dims=[self.key_dim])
    logits = self.talking_heads(
        context, p, "logits", self.key_heads_dims, self.softmax_heads_dims,
        ([x] if "x2l" in self.dynamic_projections else [])
        + ([m] if "m2l" in self.dynamic_projections else []))
    if bias is not None:
      logits += mtf.cast(bias, logits.dtype)
    h = mtf.softmax(logits, memory_length)
    weights = self.talking_heads(
        context, h, "weights", self.softmax_heads_dims, self.value_heads_dims,
        ([x] if "x2w" in self.dynamic_projections else [])
        + ([m] if "m2w" in self.dynamic_projections else []))
    if context.train and self.dropout_rate:
      weights = mtf.dropout(weights, True, rate=self.dropout_rate,
                            noise_shape=weights.shape - [context.length_dim])
    u = mtf.einsum([weights, v], reduced_dims=[memory_length])
    return self.compute_y(context, u)

  def talking_heads(self, context, inp, name, input_heads_dims, output_heads_dims,
                    dynamic_projections_from=None):
    """inp projected from input_heads_dims to output_heads_dims (shared
    dimensions kept), or inp itself when the two are the same."""
    shared = [d for d in input_heads_dims if d in output_heads_dims]
    reduced = [d for d in input_heads_dims if d not in output_heads_dims]
    new = [d for d in output_heads_dims if d not in input_heads_dims]
    if not (reduced or new):
      return inp
    if not dynamic_projections_from:
      return mtf.layers.dense(inp, new_dims=new, reduced_dims=reduced, expert_dims=shared,
                              use_bias=False, variable_dtype=context.variable_dtype, name=name)
    with mtf.name_scope(context.mesh, name):
      init = mtf.initializers.bind_fans(mtf.layers.VarianceScalingInitializer(), reduced, new)
      static = mtf.get_variable(context.mesh, "kernel", mtf.Shape(shared + reduced + new),
                                initializer=init, dtype=context.variable_dtype)
      projections = []
      for i, source in enumerate(dynamic_projections_from):
        scale = self.dynamic_projections_init_scale
        if not mtf.layers.unit_scaling_convention():
          scale /= mtf.Shape(reduced).size
        projections.append(mtf.layers.dense(
            source, new_dims=shared + reduced + new, reduced_dims=[context.model.model_dim],
            use_bias=False, variable_dtype=context.variable_dtype,
            name=f"{name}_dynamic_{i}",
            kernel_initializer=mtf.layers.VarianceScalingInitializer(scale)))
      projections[0] += mtf.cast(static, projections[0].dtype)
      return mtf.add_n([mtf.layers.us_einsum([inp, p], reduced_dims=reduced)
                        for p in projections])


def _set_relative(layer, owner, kind, num_buckets):
  if kind not in (None, "bias", "bias_shared"):
    raise ValueError(f"{owner}: relative_attention_type must be None, 'bias' or "
                     f"'bias_shared', got {kind!r}.")
  layer.relative_attention_type = kind
  layer.relative_attention_num_buckets = num_buckets
  layer.relative_attention_max_distance = 128
  layer.z_loss_coeff = None
  layer.fold_scaling_into_initializer = True


class TalkingHeadsEncDecAttention(TalkingHeadsSelfAttention):
  """Talking-heads attention over the encoder output (see
  TalkingHeadsSelfAttention); relative biases come from
  `enc_dec_attention_bias` over the softmax heads.

  Example:
    >>> layer = TalkingHeadsEncDecAttention(softmax_heads_dims=[("heads", 8)])
  """

  def __init__(self, relative_attention_type: Optional[str] = None, **kwargs):
    super().__init__(relative_attention_type=relative_attention_type, **kwargs)

  def make_shared_params(self, context) -> None:
    del context  # its shared bias is made by enc_dec_attention_bias

  def _get_memory_antecedent(self, context):
    return context.encoder_output

  def call(self, context, x, losses=None):
    del losses
    q = self.compute_q(context, x)
    if context.incremental:
      k, v, memory_length = context.get_constant_state()
      m = None
    else:
      m = _encoder_output(self, context)
      k, v = self.compute_k(context, m), self.compute_v(context, m)
      memory_length = _memory_dim(m, type(self).__name__)
      if context.mode == FIRST_PART:
        context.record_constant_state((k, v, memory_length))
    bias = _gin_or("enc_dec_attention_bias", enc_dec_attention_bias)(
        self, context, self.softmax_heads_dims)
    if m is None and any(p in self.dynamic_projections for p in ("m2l", "m2w")):
      raise ValueError(f"{type(self).__name__}: dynamic projections from the memory "
                       "('m2l', 'm2w') cannot decode incrementally.")
    return self.attention_internal(context, x, m, q, k, v, memory_length, bias)


# ------------------------------------------------------------ general bilinear
class GeneralBilinearSelfAttention(tl.SelfAttention):
  """General bilinear attention: multi-head attention with d_kv = d_model and
  no key or value projections (they would be redundant with the query and
  output ones): scores q(x) . m, output y(softmax . m).

  Variables "q/kernel" [d_model, heads..., d_model] and "y/kernel" [heads...,
  d_model, d_model] (the input copy of d_model is named "_d_model"). Decoding
  caches the memory itself.

  Args:
    heads_dims: list of mtf.Dimension or (name, size) pairs.
    dropout_rate: dropout on the attention weights (training).
    relative_attention_type: None, "bias" or "bias_shared".
    relative_attention_num_buckets: number of relative-position buckets.

  Example:
    >>> layer = GeneralBilinearSelfAttention(heads_dims=[("heads", 4)])
  """

  def __init__(self, heads_dims=(("heads", 12),), dropout_rate: float = 0.0,  # pylint: disable=super-init-not-called
               relative_attention_type: Optional[str] = None,
               relative_attention_num_buckets: int = 32):
    name = type(self).__name__
    self.heads_dims = _heads(heads_dims, f"{name}: heads_dims")
    self.dropout_rate = dropout_rate
    _set_relative(self, name, relative_attention_type, relative_attention_num_buckets)

  def query_heads_dims(self) -> list:
    return list(self.heads_dims)

  def compute_q(self, context, x):
    d_model = context.model.model_dim
    scale = 1.0 if mtf.layers.unit_scaling_convention() else 1.0 / d_model.size
    return mtf.layers.dense(x, new_dims=self.heads_dims + [d_model], reduced_dims=[d_model],
                            use_bias=False, variable_dtype=context.variable_dtype, name="q",
                            kernel_initializer=mtf.layers.VarianceScalingInitializer(scale))

  def compute_y(self, context, u):
    d_model = context.model.model_dim
    return mtf.layers.dense(u, new_dims=[d_model], reduced_dims=self.heads_dims + [d_model],
                            use_bias=False, variable_dtype=context.variable_dtype, name="y")

  def call(self, context, x, losses=None):
    del losses
    memory_dim = context.memory_length_dim
    q = self.compute_q(context, x)
    if context.incremental:
      old_m, = context.get_states(1)
      m = _update_cache(context, old_m, x, memory_dim)
    else:
      m = _memory(context, x)
    if context.mode in (INCREMENTAL, FIRST_PART):
      context.record_new_states([m])
    bias = _self_attention_bias(self, context, x.dtype)
    return self.attention_internal(context, q, m, memory_dim, bias)

  def attention_internal(self, context, q, m, memory_length, bias):
    d_model = context.model.model_dim
    logits = mtf.layers.us_einsum([q, m], reduced_dims=[d_model])
    if bias is not None:
      logits += mtf.cast(bias, logits.dtype)
    weights = mtf.softmax(logits, memory_length)
    if context.train and self.dropout_rate:
      weights = mtf.dropout(weights, True, rate=self.dropout_rate,
                            noise_shape=weights.shape - [context.length_dim])
    u = mtf.einsum([weights, m], reduced_dims=[memory_length])
    return self.compute_y(context, u)


class GeneralBilinearEncDecAttention(GeneralBilinearSelfAttention):
  """General bilinear attention over the encoder output (see
  GeneralBilinearSelfAttention).

  Example:
    >>> layer = GeneralBilinearEncDecAttention(heads_dims=[("heads", 4)])
  """

  def __init__(self, relative_attention_type: Optional[str] = None, **kwargs):
    super().__init__(relative_attention_type=relative_attention_type, **kwargs)

  def make_shared_params(self, context) -> None:
    del context

  def _get_memory_antecedent(self, context):
    return context.encoder_output

  def call(self, context, x, losses=None):
    del losses
    q = self.compute_q(context, x)
    if context.incremental:
      m, memory_length = context.get_constant_state()
    else:
      m = _encoder_output(self, context)
      memory_length = _memory_dim(m, type(self).__name__)
      if context.mode == FIRST_PART:
        context.record_constant_state((m, memory_length))
    bias = _gin_or("enc_dec_attention_bias", enc_dec_attention_bias)(
        self, context, self.heads_dims)
    return self.attention_internal(context, q, m, memory_length, bias)


# ------------------------------------------------------------ branched
class BranchedSelfAttention(tl.SelfAttention):
  """Branched attention (Weighted Transformer, Ahmed et al. 2017): each head's
  output is projected to d_model on its own, scaled by "kappa" [heads], sent
  through a feed-forward block (a DenseReluDense built with its gin
  defaults, variables "wi" and "wo" shared by the heads), scaled by "alpha"
  [heads] and summed over the heads.

  kappa and alpha are kept non-negative and summing to one: the original
  projected them after each training step (a variable constraint); here the
  projection relu(z) / sum(relu(z) + 1e-4) is applied where they are read,
  which gives the same values for variables that satisfy it. Both are
  initialized uniform in [0, 1). Takes SelfAttention's keyword arguments
  (num_memory_heads must be 0).

  Example:
    >>> layer = BranchedSelfAttention(num_heads=4, key_value_size=16)
  """

  def __init__(self, **kwargs):
    kwargs.pop("combine_dims", None)
    kwargs.pop("keep_query_heads_dims", None)
    super().__init__(**kwargs)
    if self.num_memory_heads != 0:
      raise ValueError(f"{type(self).__name__}: num_memory_heads must be 0 for branched "
                       f"attention, got {self.num_memory_heads}.")
    self.dense_layer = _gin_or("DenseReluDense", tl.DenseReluDense)()

  def make_params(self, context):
    return tl.attention_params(context, self.kv_dim, self.num_heads, self.num_memory_heads,
                               self.shared_kv, combine_dims=False, keep_query_heads_dims=True)

  def expected_attention_output_shape(self, x, params):
    return mtf.Shape(x.shape.dims[:-1] + params.query_heads_dims + x.shape.dims[-1:])

  @staticmethod
  def _constraint(z):
    z = mtf.relu(z)
    return z / mtf.reduce_sum(z + 1e-4)

  def layer_output_from_attention_output(self, context, attention_output, losses=None):
    heads_dim = mtf.Dimension("heads", self.num_heads)

    def weight(name):
      w = mtf.get_variable(context.mesh, name, mtf.Shape([heads_dim]),
                           initializer=mtf.initializers.random_uniform(0.0, 1.0),
                           dtype=context.variable_dtype)
      return mtf.cast(self._constraint(w), attention_output.dtype)
    kappa, alpha = weight("kappa"), weight("alpha")
    o = attention_output * kappa
    o = self.dense_layer.call(context, o)
    return mtf.reduce_sum(o * alpha, reduced_dim=heads_dim)

  def call(self, context, x, losses=None):
    params = self.make_params(context)
    out = _self_attention_output(self, context, x, params, attention.attention,
                                 self.expected_attention_output_shape(x, params))
    return self.layer_output_from_attention_output(context, out, losses)


class BranchedEncDecAttention(BranchedSelfAttention):
  """Branched attention over the encoder output (see BranchedSelfAttention).

  Example:
    >>> layer = BranchedEncDecAttention(num_heads=4, key_value_size=16)
  """

  def __init__(self, relative_attention_type: Optional[str] = None, **kwargs):
    super().__init__(relative_attention_type=relative_attention_type, **kwargs)

  def make_shared_params(self, context) -> None:
    del context

  def _get_memory_antecedent(self, context):
    return context.encoder_output

  def call(self, context, x, losses=None):
    return _gin_or("enc_dec_attention", enc_dec_attention)(
        self, _encoder_output(self, context), context, x, losses)


# ------------------------------------------------------------ synthesizer
class Synthesizer(tl.SelfAttention):
  """Synthesizer self-attention (arXiv:2005.00743): scores learned per
  position pair, computed from the query alone, or mixed with the usual
  dot products; see `attention.synthetic_attention` for the modes and their
  variables. "plus" modes project queries, keys and values ("q", "k", "v");
  "dense_minus" projects queries and one shared "kv"; "random" and
  "factorized" only "kv".

  Takes SelfAttention's arguments in the original's order, plus
  synthesize_mode; attention_kwargs may set synthetic_attention's
  max_length and factorized_dim.

  Example:
    >>> layer = Synthesizer(num_heads=4, key_value_size=16, synthesize_mode="random_plus_alpha")
  """

  def __init__(self, num_heads: int = 8, num_memory_heads: int = 0, key_value_size: int = 128,
               shared_kv: bool = False, dropout_rate: float = 0.0, attention_kwargs=None,
               relative_attention_type: Optional[str] = None,
               relative_attention_num_buckets: int = 32, attention_func=None,
               combine_dims: bool = True, keep_query_heads_dims: bool = False,
               synthesize_mode: str = "random_plus_alpha",
               fold_scaling_into_initializer: bool = True, **kwargs):
    del attention_func  # the synthesizer's own attention is used
    super().__init__(num_heads, num_memory_heads, key_value_size, shared_kv, dropout_rate,
                     None, relative_attention_type, relative_attention_num_buckets,
                     None, combine_dims, keep_query_heads_dims,
                     fold_scaling_into_initializer, **kwargs)
    if synthesize_mode not in attention.SYNTHESIZE_MODES:
      raise ValueError(f"Synthesizer: synthesize_mode must be one of "
                       f"{attention.SYNTHESIZE_MODES}, got {synthesize_mode!r}.")
    if num_memory_heads != 0:
      raise ValueError(f"Synthesizer: num_memory_heads must be 0, got {num_memory_heads}.")
    self.attention_kwargs = dict(attention_kwargs or {})
    self.synthesize_mode = synthesize_mode
    self.shared_kv = "plus" not in synthesize_mode
    self.no_query = not ("plus" in synthesize_mode or "minus" in synthesize_mode)

  def make_params(self, context):
    return tl.attention_params(context, self.kv_dim, self.num_heads, self.num_memory_heads,
                               self.shared_kv, no_query=self.no_query,
                               fold_scaling_into_initializer=self.fold_scaling_into_initializer)

  def call(self, context, x, losses=None):
    del losses
    params = self.make_params(context)
    memory_dim = context.memory_length_dim
    m = x if context.incremental else _memory(context, x)
    k, v = params.compute_k(m), params.compute_v(m)
    q = x if self.no_query else params.compute_q(x)
    if context.incremental:
      old_k, old_v = context.get_states(2)
      k = _update_cache(context, old_k, k, memory_dim)
      v = _update_cache(context, old_v, v, memory_dim)
    if context.mode in (INCREMENTAL, FIRST_PART):
      context.record_new_states([k, v])
    bias = _self_attention_bias(self, context, x.dtype)
    o = attention.synthetic_attention(
        q, k, v, memory_dim, self.kv_dim, self.kv_dim, bias, synthesize=True,
        synthesize_mode=self.synthesize_mode, context=context,
        **_attention_kwargs(self, context))
    return params.compute_output(o, output_shape=x.shape)


# ------------------------------------------------------------ transparent
class TransparentEncDecAttention(tl.EncDecAttention):
  """Encoder-decoder attention over a learned mixture of the encoder's layer
  outputs (transparent attention, Bapna et al. 2018).

  The encoder's layer outputs at module boundaries (every
  layers_per_encoder_module layers, plus the embeddings: encoder_num_modules
  + 1 of them) are mixed by softmax(w) over them, w the variable "w"
  [encoder_module_outputs, decoder_module_inputs] (with dropout), giving one
  memory per decoder module; the layer attends to the memory of its module
  (context.layer_index // layers_per_decoder_module). The mixture is made
  once per decoder call and shared by all such layers.

  Args:
    layers_per_encoder_module: encoder layers per repeated module.
    layers_per_decoder_module: decoder layers per repeated module.
    encoder_num_modules: number of encoder modules.
    decoder_num_modules: number of decoder modules.
    dropout_rate: dropout on w (training).
    **kwargs: EncDecAttention's (SelfAttention's) arguments.

  Example:
    >>> layer = TransparentEncDecAttention(2, 3, 2, 2, num_heads=4, key_value_size=16)
  """

  def __init__(self, layers_per_encoder_module: int = None,
               layers_per_decoder_module: int = None, encoder_num_modules: int = None,
               decoder_num_modules: int = None, dropout_rate: float = 0.0, **kwargs):
    super().__init__(**kwargs)
    for what, value in (("layers_per_encoder_module", layers_per_encoder_module),
                        ("layers_per_decoder_module", layers_per_decoder_module),
                        ("encoder_num_modules", encoder_num_modules),
                        ("decoder_num_modules", decoder_num_modules)):
      transformer.positive_int(value, f"TransparentEncDecAttention: {what}")
    self.layers_per_encoder_module = layers_per_encoder_module
    self.layers_per_decoder_module = layers_per_decoder_module
    self.encoder_num_modules = encoder_num_modules
    self.decoder_num_modules = decoder_num_modules
    self.dropout_rate = dropout_rate

  def _get_memory_antecedent(self, context):
    index = context.layer_index // self.layers_per_decoder_module
    inputs = self._get_decoder_inputs(context)
    if index >= len(inputs):
      raise ValueError(f"TransparentEncDecAttention: decoder layer {context.layer_index} is in "
                       f"module {index}, but decoder_num_modules={self.decoder_num_modules}.")
    return inputs[index]

  def _get_decoder_inputs(self, context):
    """The memories of the decoder modules (made once per context)."""
    cached = context.cache.get("transparent_decoder_inputs")
    if cached is not None:
      return cached
    outputs = context.encoder_layer_outputs
    needed = self.encoder_num_modules * self.layers_per_encoder_module + 1
    if not outputs or len(outputs) < needed:
      raise ValueError(
          f"TransparentEncDecAttention needs the encoder's layer outputs (at least {needed}: "
          f"encoder_num_modules * layers_per_encoder_module + 1), got "
          f"{len(outputs or [])}; use it in a Bitransformer's decoder.")
    outputs = [_to_memory_length(o) for o in outputs]
    step = self.layers_per_encoder_module
    stacked = mtf.stack([outputs[0]] + outputs[step::step][:self.encoder_num_modules],
                        "encoder_module_outputs")
    enc_dim = stacked.shape.get_dim_by_name("encoder_module_outputs")
    dec_dim = mtf.Dimension("decoder_module_inputs", self.decoder_num_modules)
    stddev = 1.0 if mtf.layers.unit_scaling_convention() else enc_dim.size ** -0.5
    w = mtf.get_variable(context.mesh, "w", mtf.Shape([enc_dim, dec_dim]),
                         initializer=mtf.initializers.random_normal(stddev=stddev),
                         dtype=context.variable_dtype)
    if context.train and self.dropout_rate:
      w = mtf.dropout(w, True, rate=self.dropout_rate)
    s = mtf.softmax(mtf.cast(w, stacked.dtype), reduced_dim=enc_dim)
    z = mtf.layers.us_einsum([s, stacked], reduced_dims=[enc_dim])
    inputs = [mtf.reshape(part, part.shape - [mtf.Dimension(dec_dim.name, 1)])
              for part in mtf.split(z, dec_dim, dec_dim.size)]
    context.cache["transparent_decoder_inputs"] = inputs
    return inputs

  def call(self, context, x, losses=None):
    memory = (context.encoder_output if context.incremental
              else self._get_memory_antecedent(context))
    return _gin_or("enc_dec_attention", enc_dec_attention)(self, memory, context, x, losses)


# ------------------------------------------------------------ parallel
class ParallelLayer(transformer.TransformerLayer):
  """Several layers applied to the same input; their outputs are summed and
  divided by sqrt(number of layers). The layers' variables live side by side
  in this layer's scope (give layers whose variable names differ).

  Args:
    layer_classes: TransformerLayer classes (or factories), each built with
      its defaults (gin bindings apply).

  Example:
    >>> layer = ParallelLayer([DenseReluDense, SelfAttention])
  """

  def __init__(self, layer_classes=None):
    if layer_classes is None:
      layer_classes = (_gin_or("DenseReluDense", tl.DenseReluDense),
                       _gin_or("SelfAttention", tl.SelfAttention))
    self.layer_classes = [cls() for cls in layer_classes]
    if not self.layer_classes:
      raise ValueError("ParallelLayer: layer_classes is empty; give at least one layer class.")

  def make_shared_params(self, context) -> None:
    for layer in self.layer_classes:
      make = getattr(layer, "make_shared_params", None)
      if make is not None:
        make(context)

  def call(self, context, x, losses=None):
    del losses
    outputs = [layer.call(context, x) for layer in self.layer_classes]
    return mtf.add_n(outputs) * (len(outputs) ** -0.5)


# ------------------------------------------------------------ convolutions
# The base of the convolutions that decode incrementally lives in
# transformer_layers (Conv1DLayer uses it too), as in the original.
Conv1D = tl.Conv1D


def _activation(owner, activation):
  if activation in (None, "linear"):
    return None
  fn = getattr(mtf, activation, None) if isinstance(activation, str) else activation
  if not callable(fn):
    raise ValueError(f"{owner}: activation must be 'linear' or the name of an mtf function, "
                     f"got {activation!r}.")
  return fn


class SeparableConv1DLayer(Conv1D):
  """Depthwise-separable 1D convolution along the length with d_model as the
  channels (`mtf.layers.separable_conv1d`, bias on): output position l sums
  the inputs at l + r for r in [min_relative_pos, max_relative_pos], each
  times a per-channel filter, then mixes channels. Padding (sequence id 0)
  is zeroed first; nothing stops information crossing between packed examples.
  Decodes incrementally (exactly so when max_relative_pos <= 0, i.e.
  causal). Variables "separable_conv1d/depthwise_filter_<r>" [d_model] and
  "separable_conv1d/pointwise/kernel", "/bias".

  Args:
    min_relative_pos: the leftmost offset (<= 0 looks back).
    max_relative_pos: the rightmost offset.
    output_size: the output channels (keeping d_model's name).
    depthwise_filter_initializer_scale: stddev of the depthwise filters.
    pointwise_filter_initializer_scale: scale of the pointwise kernel.
    activation: "linear" or the name of an mtf function.

  Example:
    >>> layer = SeparableConv1DLayer(-2, 0, output_size=512)   # causal, width 3
  """

  def __init__(self, min_relative_pos: int, max_relative_pos: int, output_size: int,
               depthwise_filter_initializer_scale: float = 1.0,
               pointwise_filter_initializer_scale: float = 1.0, activation: str = "linear"):
    if max_relative_pos < min_relative_pos:
      raise ValueError(f"{type(self).__name__}: max_relative_pos ({max_relative_pos}) is below "
                       f"min_relative_pos ({min_relative_pos}).")
    self._min_relative_pos = min_relative_pos
    self._max_relative_pos = max_relative_pos
    self._output_size = output_size
    self._depthwise_filter_initializer_scale = depthwise_filter_initializer_scale
    self._pointwise_filter_initializer_scale = pointwise_filter_initializer_scale
    self._activation = activation
    _activation(type(self).__name__, activation)

  @property
  def filter_size(self) -> int:
    return self._max_relative_pos - self._min_relative_pos + 1

  def call(self, context, x, losses=None, all_kernel_wts=None):
    del losses
    if context.mode == FIRST_PART:
      self.record_states_first_part_mode(context, x, self.filter_size)
    if context.mode == INCREMENTAL:
      x = self.record_states_incremental_mode(context, x, self.filter_size)
    else:
      x = self._mask_padding(context, x)
    model_dim = x.shape.dims[-1]
    output = mtf.layers.separable_conv1d(
        x, mtf.Dimension(model_dim.name, self._output_size),
        min_relative_pos=self._min_relative_pos, max_relative_pos=self._max_relative_pos,
        depthwise_filter_initializer_scale=self._depthwise_filter_initializer_scale,
        pointwise_filter_initializer_scale=self._pointwise_filter_initializer_scale,
        use_bias=True, kernel_depth_weights=all_kernel_wts, name="separable_conv1d")
    if context.mode == INCREMENTAL:
      filter_dim = mtf.Dimension("length", self.filter_size)
      last = mtf.one_hot(mtf.constant(x.mesh, self.filter_size - 1, dtype=tf.int32),
                         filter_dim, dtype=output.dtype)
      output = mtf.reduce_sum(output * last, reduced_dim=filter_dim)
    fn = _activation(type(self).__name__, self._activation)
    return output if fn is None else fn(output)


class Conv1DLocalAttn(SeparableConv1DLayer):
  """A separable convolution whose depthwise filters are normalized by a
  softmax over the window (convolution as local attention, Wu et al. 2019,
  arXiv:1901.10430), with num_unique_depth_filters filters of d_model /
  num_unique_depth_filters channels tiled over d_model. Subclasses say where
  the filters come from (`get_kernel_wt`): `LightweightConv1DLocalAttn`
  (learned) or `DynamicConv1DLocalAttn` (computed from each position's
  input).

  Args:
    min_relative_pos, max_relative_pos, output_size,
      depthwise_filter_initializer_scale, pointwise_filter_initializer_scale,
      activation: as SeparableConv1DLayer.
    num_unique_depth_filters: how many times the filter repeats along d_model
      (must divide output_size).
  """

  def __init__(self, min_relative_pos: int, max_relative_pos: int, output_size: int,
               depthwise_filter_initializer_scale: float = 1.0,
               pointwise_filter_initializer_scale: float = 1.0, activation: str = "linear",
               num_unique_depth_filters: int = 1):
    super().__init__(min_relative_pos, max_relative_pos, output_size,
                     depthwise_filter_initializer_scale, pointwise_filter_initializer_scale,
                     activation)
    transformer.positive_int(num_unique_depth_filters,
                             f"{type(self).__name__}: num_unique_depth_filters")
    if output_size % num_unique_depth_filters:
      raise ValueError(f"{type(self).__name__}: num_unique_depth_filters="
                       f"{num_unique_depth_filters} must divide output_size={output_size}.")
    self._num_unique_depth_filters = num_unique_depth_filters

  def get_kernel_wt(self, x, repeated_kernel_dim, kernel_initializer, i, context,
                    variable_dtype, master_dtype=tf.float32, slice_dtype=tf.float32):
    raise NotImplementedError(f"{type(self).__name__}: use LightweightConv1DLocalAttn or "
                              "DynamicConv1DLocalAttn (they define get_kernel_wt).")

  def call(self, context, x, losses=None):
    depth_dim = x.shape.dims[-1]
    if depth_dim.size % self._num_unique_depth_filters:
      raise ValueError(f"{type(self).__name__}: num_unique_depth_filters="
                       f"{self._num_unique_depth_filters} must divide {depth_dim}.")
    window = self.filter_size
    scale = self._depthwise_filter_initializer_scale or 1.0
    init = mtf.layers.VarianceScalingInitializer(scale=scale / window)
    repeated = [mtf.Dimension("repeated_kernel_dim",
                              depth_dim.size // self._num_unique_depth_filters)]
    source = x
    if context.mode == INCREMENTAL:
      # The dynamic filters of the window's positions, from the window.
      state, = context.get_states(1)
      source = self.update_state(
          state, x, mtf.constant(x.mesh, window - 1, shape=mtf.Shape(x.shape.dims[:-1]),
                                 dtype=tf.int32),
          mtf.Dimension("length", window), x.dtype)
    kernels = []
    for i in range(window):
      w = self.get_kernel_wt(source, repeated_kernel_dim=repeated, kernel_initializer=init, i=i,
                             context=context, variable_dtype=context.variable_dtype)
      tiled = mtf.concat([w] * self._num_unique_depth_filters, "repeated_kernel_dim")
      kernels.append(mtf.rename_dimension(tiled, "repeated_kernel_dim", depth_dim.name))
    stacked = mtf.stack(kernels, "new_stack_dim")
    stack_dim = stacked.shape.get_dim_by_name("new_stack_dim")
    kernels = mtf.unstack(mtf.softmax(stacked, reduced_dim=stack_dim), stack_dim)
    return super().call(context, x, all_kernel_wts=kernels)


class LightweightConv1DLocalAttn(Conv1DLocalAttn):
  """Lightweight convolution: learned depthwise filters, softmax-normalized
  over the window, variables "lightwt_depthwise_dense_<i>/kernel"
  [repeated_kernel_dim] (see Conv1DLocalAttn).

  Example:
    >>> layer = LightweightConv1DLocalAttn(-2, 0, output_size=512, num_unique_depth_filters=8)
  """

  def get_kernel_wt(self, x, repeated_kernel_dim, kernel_initializer, i, context,
                    variable_dtype, master_dtype=tf.float32, slice_dtype=tf.float32):
    return mtf.layers.get_dense_kernel_weights(
        x, new_dims=[], reduced_dims=[], expert_dims=repeated_kernel_dim,
        kernel_initializer=kernel_initializer, name="lightwt_depthwise_dense_%d" % i,
        variable_dtype=variable_dtype)


class DynamicConv1DLocalAttn(Conv1DLocalAttn):
  """Dynamic convolution: each position's depthwise filters are computed from
  its input by dense layers "dyn_conv_depthwise_dense_<i>" (kernel [d_model,
  repeated_kernel_dim], bias), softmax-normalized over the window (see
  Conv1DLocalAttn).

  Example:
    >>> layer = DynamicConv1DLocalAttn(-2, 0, output_size=512)
  """

  def get_kernel_wt(self, x, repeated_kernel_dim, kernel_initializer, i, context,
                    variable_dtype, master_dtype=tf.float32, slice_dtype=tf.float32):
    return mtf.layers.dense(x, new_dims=repeated_kernel_dim,
                            reduced_dims=[context.model.model_dim], expert_dims=[],
                            kernel_initializer=kernel_initializer,
                            name="dyn_conv_depthwise_dense_%d" % i, variable_dtype=variable_dtype)


class LocalConvAttnBlock(transformer.TransformerLayer):
  """A gated convolution block: GLU input projection ("local_conv_inp_0"
  linear times "local_conv_inp_1" sigmoid, d_model -> d_model), a
  lightweight or dynamic convolution, and an output projection
  "local_conv_attn_op_projection" (with bias).

  Args:
    min_relative_pos, max_relative_pos, output_size,
      depthwise_filter_initializer_scale, pointwise_filter_initializer_scale,
      activation, num_unique_depth_filters: as Conv1DLocalAttn (the original
      ignored num_unique_depth_filters here; so does this).
    attention_type: "lightweight_conv" or "dynamic_conv".

  Example:
    >>> layer = LocalConvAttnBlock(-2, 0, output_size=512, attention_type="dynamic_conv")
  """

  def __init__(self, min_relative_pos: int, max_relative_pos: int, output_size: int,
               depthwise_filter_initializer_scale: float = 1.0,
               pointwise_filter_initializer_scale: float = 1.0, activation: str = "linear",
               num_unique_depth_filters: int = 1, attention_type: str = "lightweight_conv"):
    del num_unique_depth_filters
    classes = {"lightweight_conv": LightweightConv1DLocalAttn,
               "dynamic_conv": DynamicConv1DLocalAttn}
    if attention_type not in classes:
      raise ValueError(f"LocalConvAttnBlock: attention_type must be one of {sorted(classes)}, "
                       f"got {attention_type!r}.")
    self.conv_local_attn_layer = classes[attention_type](
        min_relative_pos, max_relative_pos, output_size, depthwise_filter_initializer_scale,
        pointwise_filter_initializer_scale, activation)

  def call(self, context, x, losses=None):
    d_model = context.model.model_dim
    gate = [mtf.layers.dense(x, new_dims=[d_model], reduced_dims=[d_model], activation=a,
                             variable_dtype=context.variable_dtype, name="local_conv_inp_%d" % i)
            for i, a in enumerate([None, "sigmoid"])]
    h = self.conv_local_attn_layer.call(context, gate[0] * gate[1], losses)
    if h.shape.dims[-1] != d_model:
      raise ValueError(f"LocalConvAttnBlock: output_size must equal d_model ({d_model.size}), "
                       f"got {h.shape.dims[-1].size}.")
    return mtf.layers.dense(h, new_dims=[d_model], reduced_dims=[d_model],
                            variable_dtype=context.variable_dtype,
                            name="local_conv_attn_op_projection")


# ------------------------------------------------------------ experts attention
class ExpertsSelfAttention(tl.SelfAttention):
  """Self-attention whose queries and keys (= values) are computed by a
  mixture of experts (`attention.ExpertsAttentionParams`, `moe.MoE1D` with
  use_experts_attention); the experts' load-balancing loss joins the
  model's losses. The MoE arguments are the original's; the rest are
  SelfAttention's (shared_kv is True and must stay so).

  Example:
    >>> layer = ExpertsSelfAttention(num_experts=4, hidden_size=256, num_heads=8,
    ...                              key_value_size=64)
  """

  def __init__(self, num_experts=16, loss_coef=1e-2, group_size=1024,
               capacity_factor_train=1.25, capacity_factor_eval=2.0, moe_gating="switch",
               min_expert_capacity=4, switch_policy_train="input_jitter",
               switch_policy_eval="input_jitter", switch_dropout=0.0, switch_temperature=1.0,
               switch_jitter=1e-2, switch_top_k=4, hidden_size=3072,
               use_experts_attention=True, **kwargs):
    del switch_top_k  # an option of gatings not provided here
    kwargs.setdefault("shared_kv", True)
    if not kwargs["shared_kv"]:
      raise ValueError(f"{type(self).__name__}: shared_kv must be True (the experts' keys are "
                       "also the values).")
    if not use_experts_attention:
      raise ValueError(f"{type(self).__name__}: use_experts_attention must be True.")
    super().__init__(**kwargs)
    self.experts_hparams = dict(
        moe_gating=moe_gating, num_experts=num_experts, loss_coef=loss_coef,
        group_size=group_size, min_expert_capacity=min_expert_capacity,
        capacity_factor_train=capacity_factor_train, capacity_factor_eval=capacity_factor_eval,
        switch_policy_train=switch_policy_train, switch_policy_eval=switch_policy_eval,
        switch_dropout=switch_dropout, switch_temperature=switch_temperature,
        switch_jitter=switch_jitter, hidden_size=hidden_size)

  _memory_from_query = True

  def make_params(self, context):
    query_heads, memory_heads = tl._heads_dims(  # pylint: disable=protected-access
        self.num_heads, self.num_memory_heads)
    d_model = context.model.model_dim
    return attention.ExpertsAttentionParams(
        context.mesh, d_model, d_model, d_model, self.kv_dim, self.kv_dim, query_heads,
        memory_heads, context.variable_dtype, shared_kv=True,
        ensemble_dim=getattr(context.model, "ensemble_dim", None),
        keep_query_heads_dims=getattr(self, "keep_query_heads_dims", False),
        context=context, experts_hparams=self.experts_hparams,
        memory_from_query=self._memory_from_query)


class ExpertsEncDecAttention(ExpertsSelfAttention):
  """Attention over the encoder's output with experts-computed queries (from
  the decoder) and keys/values (the same experts applied to the encoder
  output); see ExpertsSelfAttention.

  Example:
    >>> layer = ExpertsEncDecAttention(num_experts=4, hidden_size=256, num_heads=8)
  """

  _memory_from_query = False

  def __init__(self, relative_attention_type=None, **kwargs):
    super().__init__(relative_attention_type=relative_attention_type, **kwargs)

  def make_shared_params(self, context) -> None:
    del context

  def call(self, context, x, losses=None):
    del losses
    return tl.EncDecAttention.call(self, context, x)


__all__ = [
    "BranchedEncDecAttention", "BranchedSelfAttention", "Conv1D", "Conv1DLocalAttn",
    "DynamicConv1DLocalAttn", "ExpertsEncDecAttention", "ExpertsSelfAttention",
    "GeneralBilinearEncDecAttention", "GeneralBilinearSelfAttention",
    "LightweightConv1DLocalAttn", "LocalConvAttnBlock", "ParallelLayer",
    "SeparableConv1DLayer", "Synthesizer", "TalkingHeadsEncDecAttention",
    "TalkingHeadsSelfAttention", "TransparentEncDecAttention", "enc_dec_attention",
    "enc_dec_attention_bias", "relative_position_spans",
]

# The original had these in transformer_layers: they are its names too.
for _name in __all__:
  setattr(tl, _name, globals()[_name])
del _name
