"""Attention layers that change how scores are made: general bilinear
(`GeneralBilinearSelfAttention`, `GeneralBilinearEncDecAttention`),
branched (`BranchedSelfAttention`, `BranchedEncDecAttention`), synthesized
scores (`Synthesizer`), transparent encoder-decoder attention over every
encoder layer (`TransparentEncDecAttention`) and queries and keys from a
mixture of experts (`ExpertsSelfAttention`, `ExpertsEncDecAttention`).

Each takes SelfAttention's arguments plus its own and runs in training,
eval and both decoding modes.

    >>> layer = BranchedSelfAttention(num_heads=8, key_value_size=64)
"""

from __future__ import annotations

from typing import Optional


import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import attention
from mesh_tensorflow.transformer import base_layers as tl
from mesh_tensorflow.transformer import transformer
from mesh_tensorflow.transformer.attention_layer_helpers import (
    FIRST_PART, INCREMENTAL, _EncoderMemory, _attention_kwargs, _encoder_output, _gin_or, _heads, _memory, _once_per_decode, _self_attention_bias, _self_attention_output, _set_relative, _to_memory_length, _update_cache, enc_dec_attention, enc_dec_attention_bias)


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


class GeneralBilinearEncDecAttention(_EncoderMemory, GeneralBilinearSelfAttention):
  """General bilinear attention over the encoder output (see
  GeneralBilinearSelfAttention).

  Example:
    >>> layer = GeneralBilinearEncDecAttention(heads_dims=[("heads", 4)])
  """

  def call(self, context, x, losses=None):
    del losses
    q = self.compute_q(context, x)
    m = None if context.incremental else _encoder_output(self, context)
    m, memory_length = _once_per_decode(self, context, m, lambda m: (m,))
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

  kappa and alpha are kept non-negative and summing to one: the
  projection relu(z) / sum(relu(z) + 1e-4) is applied where they are read,
  which leaves values that already satisfy it unchanged. Both are
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


class BranchedEncDecAttention(_EncoderMemory, BranchedSelfAttention):
  """Branched attention over the encoder output (see BranchedSelfAttention).

  Example:
    >>> layer = BranchedEncDecAttention(num_heads=4, key_value_size=16)
  """

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


class ExpertsEncDecAttention(_EncoderMemory, ExpertsSelfAttention):
  """Attention over the encoder's output with experts-computed queries (from
  the decoder) and keys/values (the same experts applied to the encoder
  output); see ExpertsSelfAttention.

  Example:
    >>> layer = ExpertsEncDecAttention(num_experts=4, hidden_size=256, num_heads=8)
  """

  _memory_from_query = False

  def call(self, context, x, losses=None):
    del losses
    return tl.EncDecAttention.call(self, context, x)
