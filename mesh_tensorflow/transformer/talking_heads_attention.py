"""Talking-heads attention (Shazeer et al., 2020, arXiv:2003.02436): heads
that mix before and after the softmax, for self-attention
(`TalkingHeadsSelfAttention`) and encoder-decoder attention
(`TalkingHeadsEncDecAttention`).

    >>> layer = TalkingHeadsSelfAttention(key_heads_dims=[("heads", 8)],
    ...                                   softmax_heads_dims=[("heads", 8)],
    ...                                   value_heads_dims=[("heads", 8)])
"""

from __future__ import annotations

from typing import Optional

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import base_layers as tl
from mesh_tensorflow.transformer.attention_layer_helpers import (
    FIRST_PART, INCREMENTAL, _EncoderMemory, _encoder_output, _gin_or, _heads, _memory,
    _once_per_decode, _self_attention_bias, _set_relative, _update_cache,
    enc_dec_attention_bias)


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


class TalkingHeadsEncDecAttention(_EncoderMemory, TalkingHeadsSelfAttention):
  """Talking-heads attention over the encoder output (see
  TalkingHeadsSelfAttention); relative biases come from
  `enc_dec_attention_bias` over the softmax heads.

  Example:
    >>> layer = TalkingHeadsEncDecAttention(softmax_heads_dims=[("heads", 8)])
  """

  def call(self, context, x, losses=None):
    del losses
    q = self.compute_q(context, x)
    m = None if context.incremental else _encoder_output(self, context)
    k, v, memory_length = _once_per_decode(
        self, context, m, lambda m: (self.compute_k(context, m), self.compute_v(context, m)))
    bias = _gin_or("enc_dec_attention_bias", enc_dec_attention_bias)(
        self, context, self.softmax_heads_dims)
    if m is None and any(p in self.dynamic_projections for p in ("m2l", "m2w")):
      raise ValueError(f"{type(self).__name__}: dynamic projections from the memory "
                       "('m2l', 'm2w') cannot decode incrementally.")
    return self.attention_internal(context, x, m, q, k, v, memory_length, bias)
