"""The core layers for `transformer.LayerStack`: self-attention (with an
optional T5-style relative position bias), encoder-decoder attention, local
self-attention, the feed-forward block (with gated variants), the 1-D
convolutions that decode incrementally (`Conv1D`, `Conv1DLayer`) and
`ParallelLayer`, which sums several layers over the same input.

The layer families build on these (talking_heads_attention.py,
attention_variants.py, convolution_layers.py); `transformer_layers` gathers
all of them under the original's names (its docstring shows them in use).
Every layer works in all modes: training and eval, "first_part" and
"incremental".
"""

from __future__ import annotations

import numbers
from typing import Optional, Sequence, Union

import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.layers import core as layers_core
from mesh_tensorflow.transformer import attention
from mesh_tensorflow.transformer import transformer
from mesh_tensorflow.transformer.attention_layer_helpers import (
    _EncoderMemory, enc_dec_attention_bias)

_RELATIVE_TYPES = (None, "bias", "bias_shared")


def _check_heads(owner: str, num_heads: int, num_memory_heads: int) -> None:
  if num_heads < 1:
    raise ValueError(f"{owner}: num_heads must be positive, got {num_heads}.")
  if num_memory_heads < 0 or (num_memory_heads > 1 and num_heads % num_memory_heads):
    raise ValueError(f"{owner}: num_memory_heads must be 0 (one per head), 1 (multi-query) "
                     f"or a divisor of num_heads={num_heads}, got {num_memory_heads}.")


def _heads_dims(num_heads: int, num_memory_heads: int):
  """(query heads dims, memory heads dims) as the original laid them out."""
  if num_heads == 1:
    return [], []
  if num_memory_heads == 0:
    heads = [mtf.Dimension("heads", num_heads)]
    return heads, heads
  if num_memory_heads == 1:
    return [mtf.Dimension("heads", num_heads)], []
  if num_heads % num_memory_heads:
    raise ValueError(f"num_memory_heads={num_memory_heads} must divide num_heads={num_heads}.")
  memory = [mtf.Dimension("heads", num_memory_heads)]
  return memory + [mtf.Dimension("query_heads", num_heads // num_memory_heads)], memory


def attention_params(context: transformer.Context, kv_dim: mtf.Dimension, num_heads: int,
                     num_memory_heads: int = 0, shared_kv: bool = False,
                     no_query: bool = False, combine_dims: bool = True,
                     keep_query_heads_dims: bool = False,
                     fold_scaling_into_initializer: bool = True) -> attention.AttentionParams:
  """The AttentionParams of a transformer attention layer (d_model in and out).

  num_heads read-heads; num_memory_heads 0: as many write-heads ("heads"
  for all); 1: a single write-head (multi-query attention, keys and values
  without heads); n > 1 (dividing num_heads): keys and values over
  "heads":n and queries over "heads":n and "query_heads":num_heads/n. One
  head: no heads dimension at all.

  Example:
    >>> params = attention_params(context, mtf.Dimension("d_kv", 64), num_heads=8)
  """
  query_heads, memory_heads = _heads_dims(num_heads, num_memory_heads)
  d_model = context.model.model_dim
  return attention.AttentionParams(
      context.mesh, d_model, d_model, d_model, kv_dim, kv_dim, query_heads, memory_heads,
      context.variable_dtype, shared_kv=shared_kv, no_query=no_query,
      combine_dims=combine_dims, ensemble_dim=getattr(context.model, "ensemble_dim", None),
      keep_query_heads_dims=keep_query_heads_dims,
      fold_scaling_into_initializer=fold_scaling_into_initializer)


class SelfAttention(transformer.TransformerLayer):
  """Multi-head self-attention.

  Causal when the model is autoregressive (through the context's read/write
  priorities); packed examples (sequence_id) attend only within their
  segment. In "first_part" and "incremental" modes the keys and values of
  every position are kept in caches [batch..., heads, memory_length, d_kv]
  (two decoding states); a step writes its own position and attends to the
  positions up to it.

  Args:
    num_heads: number of heads ("heads" dimension).
    num_memory_heads: 0 (one key/value head per query head), 1
      (multi-query attention: keys and values without a heads dimension) or
      a divisor n of num_heads (grouped: keys and values over "heads":n,
      queries over "heads":n and "query_heads":num_heads/n).
    key_value_size: size of "d_kv".
    shared_kv: one projection for keys and values.
    dropout_rate: dropout on the attention weights (training).
    relative_attention_type: None, "bias" (a learned bias per head and
      relative-position bucket, for each layer) or "bias_shared" (one bias
      for all such layers of the stack, the variable of the first one:
      "<stack>/block_000/layer_000/SelfAttention/relative_attention_bias").
    relative_attention_num_buckets: number of buckets (T5: 32).
    relative_attention_max_distance: distances beyond share the last bucket.
    attention_kwargs, combine_dims, hyperprompt_task_num: accepted for
      compatibility, no effect (the weights are kept per head and d_kv,
      which computes the same products as combined ones).
    fold_scaling_into_initializer: True (default): the 1/sqrt(d_kv) of the
      scores is folded into the query weights' initializer; False: the query
      weights are initialized like the keys and the scores are scaled.
    z_loss_coeff: if set, training adds z_loss_coeff * mean(log(Z)^2) of the
      attention softmax (over non-padding queries, divided by the number of
      micro-batches) to the model's auxiliary losses, which keeps the scores
      small (helps bfloat16).
    attention_func: None (softmax attention) or "hybrid" (a learned mixture
      with doubly-normalized attention, `attention.hybrid_attention`; whole
      sequences only: decoding with it is a ValueError).
    keep_query_heads_dims, use_hyperprompt and the other hyperprompt
      options: experimental variants, not supported; anything but their
      defaults is a ValueError.

  The positional order is the original's: `SelfAttention(8, 0, 64, False,
  0.1)` is 8 heads of size 64 with dropout 0.1.

  Example:
    >>> layer = SelfAttention(num_heads=8, key_value_size=64,
    ...                       relative_attention_type="bias", z_loss_coeff=1e-4)
  """

  def __init__(self, num_heads: int = 8, num_memory_heads: int = 0,
               key_value_size: int = 128, shared_kv: bool = False,
               dropout_rate: float = 0.0, attention_kwargs=None,
               relative_attention_type: Optional[str] = None,
               relative_attention_num_buckets: int = 32, attention_func=None,
               combine_dims: bool = True, keep_query_heads_dims: bool = False,
               fold_scaling_into_initializer: bool = True,
               z_loss_coeff: Optional[float] = None, use_hyperprompt: bool = False,
               hyperprompt_mtlshare: bool = False, hyperprompt_length_encoder=None,
               hyperprompt_length_decoder=None, hyperprompt_hidden_dim=None,
               hyperprompt_task_num: int = 8, relative_attention_max_distance: int = 128):
    del attention_kwargs  # accepted for compatibility
    name = type(self).__name__
    _check_heads(name, num_heads, num_memory_heads)
    transformer.positive_int(key_value_size, f"{name}: key_value_size",
                             integer_types=(numbers.Integral,))
    if relative_attention_type not in _RELATIVE_TYPES:
      raise ValueError(f"{name}: relative_attention_type must be one of "
                       f"{_RELATIVE_TYPES}, got {relative_attention_type!r}.")
    transformer.refuse_unsupported(name, {
        "keep_query_heads_dims": (keep_query_heads_dims, False),
        "use_hyperprompt": (use_hyperprompt, False),
        "hyperprompt_mtlshare": (hyperprompt_mtlshare, False),
        "hyperprompt_length_encoder": (hyperprompt_length_encoder, None),
        "hyperprompt_length_decoder": (hyperprompt_length_decoder, None),
        "hyperprompt_hidden_dim": (hyperprompt_hidden_dim, None)})
    if z_loss_coeff is not None and z_loss_coeff < 0:
      raise ValueError(f"{name}: z_loss_coeff must be >= 0 or None, got {z_loss_coeff}.")
    del combine_dims, hyperprompt_task_num  # no effect here: see the class docstring
    self.num_heads = num_heads
    self.num_memory_heads = num_memory_heads
    self.key_value_size = key_value_size
    self.shared_kv = shared_kv
    self.dropout_rate = dropout_rate
    self.relative_attention_type = relative_attention_type
    self.relative_attention_num_buckets = relative_attention_num_buckets
    self.relative_attention_max_distance = relative_attention_max_distance
    self.fold_scaling_into_initializer = fold_scaling_into_initializer
    self.z_loss_coeff = z_loss_coeff
    if attention_func not in (None, "hybrid"):
      raise ValueError(f"{name}: attention_func must be None or 'hybrid', got "
                       f"{attention_func!r}.")
    self.attention_func = attention_func

  @property
  def heads_dim(self) -> mtf.Dimension:
    return mtf.Dimension("heads", self.num_heads)

  @property
  def kv_dim(self) -> mtf.Dimension:
    return mtf.Dimension("d_kv", self.key_value_size)

  def make_params(self, context: transformer.Context) -> attention.AttentionParams:
    return attention_params(
        context, self.kv_dim, self.num_heads, self.num_memory_heads, self.shared_kv,
        fold_scaling_into_initializer=getattr(self, "fold_scaling_into_initializer", True))

  def query_heads_dims(self) -> list:
    """The heads dimensions of the queries (see `attention_params`)."""
    return _heads_dims(self.num_heads, self.num_memory_heads)[0]

  # ---- relative position bias ------------------------------------------------
  def _buckets_dim(self) -> mtf.Dimension:
    return mtf.Dimension("buckets", self.relative_attention_num_buckets)

  def make_shared_params(self, context: transformer.Context) -> None:
    """Creates the model-wide bias of "bias_shared" (called by the model)."""
    if self.relative_attention_type != "bias_shared":
      return
    key = "relative_attention_bias_shared"
    if key not in context.cache:  # made in the first such layer's scope
      context.cache[key] = self._bias_variable(context, "relative_attention_bias")

  def _bias_variable(self, context, name):
    return mtf.get_variable(
        context.mesh, name, mtf.Shape(self.query_heads_dims() + [self._buckets_dim()]),
        initializer=mtf.initializers.random_normal(stddev=0.5),
        dtype=context.variable_dtype)

  def _relative_bias(self, context: transformer.Context, query_position,
                     memory_dim: mtf.Dimension) -> Optional[mtf.Tensor]:
    kind = self.relative_attention_type
    if kind is None:
      return None
    if kind == "bias_shared":
      weights = context.cache["relative_attention_bias_shared"]
    else:
      weights = self._bias_variable(context, "relative_attention_bias")
    return attention.relative_position_bias(
        weights, query_position, memory_dim,
        bidirectional=not context.model.fully_autoregressive,
        max_distance=self.relative_attention_max_distance)

  # ---- masks -----------------------------------------------------------------
  def _extra_hidden(self, query_position, memory_position):
    """Memory positions hidden beyond the causal/segment masks (None here)."""
    return None

  def _full_bias(self, context: transformer.Context, dtype) -> Optional[mtf.Tensor]:
    """Bias [batch..., length, memory_length] for whole-sequence modes."""
    bias = None
    if context.read_priority is not None:
      hidden = mtf.less(context.read_priority, attention.to_memory(context.write_priority))
      bias = attention.bias_where(hidden, dtype)
    if isinstance(context.sequence_id, mtf.Tensor):
      hidden = mtf.not_equal(context.sequence_id, attention.to_memory(context.sequence_id))
      bias = attention.add_bias(bias, attention.bias_where(hidden, dtype))
    query_pos = mtf.range(context.mesh, context.length_dim, tf.int32)
    memory_pos = mtf.range(context.mesh, context.memory_length_dim, tf.int32)
    extra = self._extra_hidden(query_pos, memory_pos)
    if extra is not None:
      bias = attention.add_bias(bias, attention.bias_where(extra, dtype))
    return attention.add_bias(bias, self._relative_bias(context, query_pos,
                                                         context.memory_length_dim))

  def _step_bias(self, context: transformer.Context, dtype) -> mtf.Tensor:
    """Bias [batch..., memory_length] for one decoding step at context.position."""
    memory_pos = mtf.range(context.mesh, context.memory_length_dim, tf.int32)
    if context.write_priority is None:
      hidden = mtf.greater(memory_pos, context.position)
    else:
      hidden = mtf.greater(attention.to_memory(context.write_priority), context.position)
    extra = self._extra_hidden(context.position, memory_pos)
    if extra is not None:
      hidden = mtf.logical_or(hidden, extra)
    bias = attention.bias_where(hidden, dtype)
    return attention.add_bias(bias, self._relative_bias(context, context.position,
                                                         context.memory_length_dim))

  # ---- call ------------------------------------------------------------------
  def call(self, context: transformer.Context, x: mtf.Tensor) -> mtf.Tensor:
    params = self.make_params(context)
    memory_dim = context.memory_length_dim
    q = params.compute_q(x)
    if context.incremental:
      k_new, v_new = params.compute_k(x), params.compute_v(x)
      k_cache, v_cache = context.get_states(2)
      at = mtf.one_hot(context.position, memory_dim, dtype=x.dtype)
      k = k_cache * (1.0 - at) + k_new * at
      v = v_cache * (1.0 - at) + v_new * at
      context.record_new_states([k, v])
      bias = self._step_bias(context, x.dtype)
    else:
      memory = attention.to_memory(x, context.length_dim.name)
      k, v = params.compute_k(memory), params.compute_v(memory)
      if context.mode == transformer.ModeKeys.FIRST_PART:
        context.record_new_states([k, v])
      bias = self._full_bias(context, x.dtype)
    o = _attend(self, context, q, k, v, memory_dim, params.key_dim, bias)
    return params.compute_output(o, x.shape)


def _attend(layer, context, q, k, v, memory_dim, key_dim, bias):
  """attention.attend with the layer's dropout, score scaling and z-loss,
  recomputed in the backward pass when the layer stack asks for it
  (LayerStack(recompute="selective") sets context.recompute_attention)."""
  scale = None  # an unfolded 1/sqrt(d_kv) is applied by AttentionParams.compute_q
  if getattr(layer, "attention_func", None) == "hybrid":
    if context.incremental:
      raise ValueError(f"{type(layer).__name__}: attention_func='hybrid' normalizes over all "
                       "query positions and cannot decode one position at a time; use "
                       "attention_func=None for models that decode.")
    return attention.hybrid_attention(
        q, k, v, context, memory_dim, key_dim, key_dim, bias,
        dropout_rate=layer.dropout_rate if context.train else 0.0)
  z_loss_coeff = getattr(layer, "z_loss_coeff", None)
  if z_loss_coeff and context.train and context.losses is not None:
    # The z-loss reads the scores, so this layer is not recomputed: a loss
    # taken from inside a recomputed function would have no gradient path.
    z_losses = []
    o = attention.attend(q, k, v, memory_dim, key_dim, bias, layer.dropout_rate,
                         context.train, scale=scale, log_z=z_losses)
    z = mtf.square(z_losses[0])
    if context.nonpadding is not None:
      z = z * mtf.cast(context.nonpadding, z.dtype)
    loss = z_loss_coeff * mtf.reduce_mean(z) / max(context.num_microbatches or 1, 1)
    context.losses.append(mtf.cast(loss, tf.float32))
    return o

  def fn(q, k, v):
    return attention.attend(q, k, v, memory_dim, key_dim, bias, layer.dropout_rate,
                            context.train, scale=scale)
  recompute = getattr(context, "recompute_attention", None)
  return recompute(fn, [q, k, v]) if recompute is not None else fn(q, k, v)


class LocalSelfAttention(SelfAttention):
  """Self-attention limited to a window: memory position m is visible from
  query position q iff |q - m| <= radius (and m <= q when causal).

  The scores are computed for all pairs and masked (memory O(length^2));
  decoding uses the same caches as SelfAttention.

  Args:
    radius: how far each position looks (the first positional argument:
      `LocalSelfAttention(64, 8)` is radius 64 with 8 heads).
    num_heads ... attention_kwargs, **kwargs: SelfAttention's arguments.

  Example:
    >>> layer = LocalSelfAttention(radius=64, num_heads=8, key_value_size=64)
  """

  def __init__(self, radius: int = 128, num_heads: int = 8, num_memory_heads: int = 0,
               key_value_size: int = 128, shared_kv: bool = False,
               dropout_rate: float = 0.0, attention_kwargs=None, **kwargs):
    if radius < 0:
      raise ValueError(f"LocalSelfAttention: radius must be >= 0, got {radius}.")
    super().__init__(num_heads, num_memory_heads, key_value_size, shared_kv, dropout_rate,
                     attention_kwargs, **kwargs)
    self.radius = radius

  def _extra_hidden(self, query_position, memory_position):
    return mtf.logical_or(mtf.less(memory_position, query_position - self.radius),
                          mtf.greater(memory_position, query_position + self.radius))


class EncDecAttention(_EncoderMemory, SelfAttention):
  """Attention from the decoder to the encoder output (context.encoder_output).

  Memory positions of encoder padding are hidden (encoder_sequence_id 0); with
  packed examples each target segment sees only its own input segment
  (decoder sequence_id == encoder sequence_id). The encoder keys and values
  are computed once per decode (constant states). With a
  relative_attention_type ("bias", "bias_shared") the bias comes from
  `enc_dec_attention_bias` (learned, of `relative_position_spans`).

  Example:
    >>> layer = EncDecAttention(num_heads=8, key_value_size=64)
  """

  def call(self, context: transformer.Context, x: mtf.Tensor) -> mtf.Tensor:
    memory = context.encoder_output
    if memory is None:
      raise ValueError("EncDecAttention needs context.encoder_output (use it in a "
                       "Bitransformer's decoder).")
    params = self.make_params(context)
    memory_dim = memory.shape.get_dim_by_name("memory_length")
    q = params.compute_q(x)
    if context.incremental:
      k, v = context.get_constant_state()
    else:
      k, v = params.compute_k(memory), params.compute_v(memory)
      if context.mode == transformer.ModeKeys.FIRST_PART:
        context.record_constant_state((k, v))
    bias = None
    enc_ids = context.encoder_sequence_id
    if self.relative_attention_type is not None:
      # The same masks plus the learned relative-position bias (attention_layer_helpers.py).
      bias_fn = transformer.gin_configurables().get("enc_dec_attention_bias",
                                                    enc_dec_attention_bias)
      bias = bias_fn(self, context, params.query_heads_dims)
    elif isinstance(enc_ids, mtf.Tensor):
      if isinstance(context.sequence_id, mtf.Tensor) and not context.incremental:
        hidden = mtf.not_equal(context.sequence_id, enc_ids)
      else:
        hidden = mtf.equal(enc_ids, 0)
      bias = attention.bias_where(hidden, x.dtype)
    o = _attend(self, context, q, k, v, memory_dim, params.key_dim, bias)
    return params.compute_output(o, x.shape)


Activation = Union[str, None, Sequence[Union[str, None]]]


class DenseReluDense(transformer.TransformerLayer):
  """The feed-forward block: d_model -> d_ff (activation) -> d_model.

  With a list of activations the hidden layer is the product of one
  projection per activation: ["gelu", "linear"] is GEGLU, ["swish",
  "linear"] SwiGLU, ["linear", "sigmoid"] a GLU. Variables "wi/kernel" (or
  "wi_0/kernel", "wi_1/kernel", ...) [d_model, d_ff] and "wo/kernel"
  [d_ff, d_model]; no biases by default.

  Args:
    hidden_size: size of "d_ff".
    dropout_rate: dropout on the hidden activations (training).
    activation: an mtf function name ("relu", "gelu", ...), "linear"/None,
      a callable, or a list of them (gated).
    use_bias: add biases.

  Example:
    >>> layer = DenseReluDense(hidden_size=2048, activation=["gelu", "linear"])
  """

  def __init__(self, hidden_size: int = 4096, dropout_rate: float = 0.0,
               activation: Activation = "relu", use_bias: bool = False):
    # A zero-sized d_ff builds a layer that computes nothing.
    transformer.positive_int(hidden_size, f"{type(self).__name__}: hidden_size",
                             integer_types=(numbers.Integral,))
    self.hidden_size = hidden_size
    self.dropout_rate = dropout_rate
    self.activation = activation
    self.use_bias = use_bias

  def call(self, context: transformer.Context, x: mtf.Tensor) -> mtf.Tensor:
    d_model = context.model.model_dim
    d_ff = mtf.Dimension("d_ff", self.hidden_size)
    activations = (list(self.activation) if isinstance(self.activation, (list, tuple))
                   else [self.activation])
    if len(activations) == 1:
      h = mtf.layers.dense(x, d_ff, reduced_dims=[d_model], activation=activations[0],
                           use_bias=self.use_bias, variable_dtype=context.variable_dtype,
                           name="wi")
    else:
      h = None
      for i, a in enumerate(activations):
        part = mtf.layers.dense(x, d_ff, reduced_dims=[d_model], activation=a,
                                use_bias=self.use_bias, variable_dtype=context.variable_dtype,
                                name=f"wi_{i}")
        h = part if h is None else h * part
    if context.train and self.dropout_rate > 0.0:
      h = mtf.dropout(h, True, rate=self.dropout_rate)
    return mtf.layers.dense(h, d_model, reduced_dims=[d_ff], use_bias=self.use_bias,
                            variable_dtype=context.variable_dtype, name="wo")


class Conv1D(transformer.TransformerLayer):
  """Base class of convolutions along the length that can decode
  incrementally: the last filter_size inputs of the layer are its decoding
  state ("length": filter_size), filled from the prefix in "first_part"
  mode and shifted by one position per incremental step.
  """

  def record_states_first_part_mode(self, context, x, filter_size,
                                    length_dim_name: str = "length") -> None:
    """Records x at the filter_size positions before context.initial_position
    (zeros before the start)."""
    length_dim = x.shape.dims[-2]
    # Gathered over a window dimension of another name than x's length,
    # then given the state's name.
    window_dim = mtf.Dimension("conv1d_window", filter_size)
    start = context.initial_position if context.initial_position is not None else 0
    indices = mtf.range(x.mesh, window_dim, dtype=tf.int32) + start
    shifted = mtf.shift(x, filter_size, length_dim, wrap=False)
    state = mtf.gather(shifted, indices, length_dim,
                       output_shape=mtf.Shape(x.shape.dims[:-2] + [window_dim]
                                              + x.shape.dims[-1:]))
    context.record_new_states([mtf.rename_dimension(state, window_dim.name, length_dim_name)])

  def record_states_incremental_mode(self, context, x, filter_size,
                                     length_dim_name: str = "length") -> mtf.Tensor:
    """The window [batch..., length:filter_size, d_model] ending with x (the
    current position); recorded as the new state."""
    filter_dim = mtf.Dimension(length_dim_name, filter_size)
    state, = context.get_states(1)
    position = mtf.constant(x.mesh, filter_size - 1, shape=mtf.Shape(x.shape.dims[:-1]),
                            dtype=tf.int32)
    window = self.update_state(state, x, position, filter_dim, x.dtype)
    context.record_new_states([window])
    return window

  def update_state(self, old_state, x, position, filter_dim, dtype):
    """old_state shifted left by one with x written at `position`."""
    shifted = mtf.shift(old_state, -1, filter_dim, wrap=False)
    return shifted + mtf.one_hot(position, filter_dim, dtype=dtype) * x

  def _mask_padding(self, context, x):
    """x zeroed at padding (sequence id 0), so that padding never leaks into
    real positions."""
    if hasattr(context, "sequence_id"):
      mask = context.nonpadding
    elif isinstance(getattr(context, "inputs", None), mtf.Tensor) and (
        x.shape.dims[-2] in context.inputs.shape.dims):
      # A bare context (inputs and mode only): padding is input id 0.
      mask = mtf.not_equal(context.inputs, 0)
    else:
      mask = None
    return x if mask is None else x * mtf.cast(mask, x.dtype)



_TF_GLOROT_UNIFORM = tf.compat.v1.glorot_uniform_initializer


class Conv1DLayer(Conv1D):
  """A 1D convolution along the length, from the model dimension to
  `output_size` channels (a dimension of the model dimension's name):
  padding positions (sequence id 0, or input id 0 in a bare
  context) are zeroed first, the window is centred ("SAME" padding), and in
  "first_part" / "incremental" modes the last `filter_size` inputs are the
  decoding state, so that an incremental step convolves the window ending at
  the current position (which equals the full computation only for
  filter_size 1).

  It does not stop information from crossing between packed examples: use it
  in encoders, or decoders that accept that. Variable "conv1d/kernel"
  [1, filter_size, d_model, output_size], Glorot-uniform initialized (with
  this library's layout-invariant Glorot initializer).

  Args:
    filter_size: the window length.
    output_size: the number of output channels.
    activation: an mtf function name, "linear"/None, or a callable.

  Example:
    >>> layer = Conv1DLayer(filter_size=3, output_size=512)
  """

  def __init__(self, filter_size: int, output_size: int, activation: Activation = "linear"):
    self._filter_size = filter_size
    self.output_size = output_size
    self.activation = activation

  @property
  def filter_size(self) -> int:
    return self._filter_size

  def call(self, context: transformer.Context, x: mtf.Tensor, losses=None) -> mtf.Tensor:
    del losses
    mode = getattr(context, "mode", None)
    if mode == transformer.ModeKeys.FIRST_PART:
      self.record_states_first_part_mode(context, x, self.filter_size)
    if mode == transformer.ModeKeys.INCREMENTAL:
      x = self.record_states_incremental_mode(context, x, self.filter_size)
      padding = "VALID"
    else:
      x = self._mask_padding(context, x)
      padding = "SAME"
    output_dim = mtf.Dimension(x.shape.dims[-1].name, self.output_size)
    # TensorFlow's Glorot initializer draws other numbers on every layout;
    # this library's Glorot-uniform default is layout-invariant and used
    # instead. A replaced tf.compat.v1.glorot_uniform_initializer (ported
    # tests patch it to fix the kernel) is honoured.
    glorot = tf.compat.v1.glorot_uniform_initializer
    initializer = None if glorot is _TF_GLOROT_UNIFORM else glorot()
    y = mtf.layers.conv1d(x, output_dim, filter_size=self.filter_size, padding=padding,
                          filter_initializer=initializer,
                          variable_dtype=getattr(context, "variable_dtype", None))
    if mode == transformer.ModeKeys.INCREMENTAL:
      # [batch..., length:1, output] -> [batch..., output]
      y = mtf.reduce_sum(y, reduced_dim=y.shape.dims[-2])
    activation = layers_core._resolve_activation(self.activation)  # pylint: disable=protected-access
    return y if activation is None else activation(y)


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
      layer_classes = (transformer.gin_configurables().get("DenseReluDense", DenseReluDense),
                       transformer.gin_configurables().get("SelfAttention", SelfAttention))
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
