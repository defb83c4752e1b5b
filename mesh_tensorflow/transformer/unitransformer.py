"""The decoder-only Transformer, `Unitransformer`, and its default vocabulary
embedding, `VocabEmbedding`.

A Unitransformer wraps a `LayerStack` (layer_stack.py) with the vocabulary
embedding, positions and the output softmax: a language model, an encoder,
or (inside a `Bitransformer`, bitransformer.py) the encoder or the decoder.
It trains (`call_simple`), decodes incrementally (`sample_autoregressive`:
a "first_part" pass over the prompt fills per-layer caches, then an
`mtf.while_loop` runs one position at a time) and searches beams
(`beam_search`).

    >>> model = Unitransformer(stack, d_model=512, input_vocab_size=256,
    ...                        output_vocab_size=256, autoregressive=True,
    ...                        max_length=512)
    >>> logits, loss = model.call_simple(inputs, targets, compute_loss=True)
    >>> samples = model.sample_autoregressive(prompts, temperature=0.0)
"""

from __future__ import annotations

import inspect
import numbers
from typing import Optional, Union

import numpy as np
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.layers import beam_search as beam_search_lib
from mesh_tensorflow.transformer.layer_context import (
    Context, ModeKeys, gin_configurables, inputs_prefix_mask)
from mesh_tensorflow.transformer.layer_stack import LayerStack
from mesh_tensorflow.transformer.model_inputs import (
    _NEG_INF, _one_position, _positional_embedding_kind, _round_up, positive_int,
    sinusoid_positional_embedding_weights, sinusoidal_position_embedding)


class VocabEmbedding:
  """Token ids to model states and model states to logits, with one table.

  The default vocabulary embedding of `Unitransformer`: a table [vocab,
  d_model] (standard normal, layout-invariant), looked up for the inputs;
  with `Unitransformer.shared_embedding_and_softmax_weights` the same table
  makes the logits, hidden * d_model^-0.5 . table. A Unitransformer
  without shared weights makes its logits with a separate dense layer
  ("logits") instead of `hidden_to_logits`.

  Other classes with the same constructor and the two methods
  (vocab_embeddings.py, adaptive_softmax.py) replace it through
  `Unitransformer.vocab_embedding_cls` or the original's gin binding
  `get_vocab_embedding_cls.cls`.

  Args:
    mesh: the mtf.Mesh.
    vocab_dim: the vocabulary dimension ("vocab").
    output_dim: the model dimension ("d_model").
    variable_dtype: an mtf.VariableDType.
    name: the variable name ("embedding").
    ensemble_dim: optional leading dimension(s) of the table (ensembles).
    scale_variable_like_classifier_weights: initialize the table with
      stddev d_model^-0.5 (like a classifier) and scale looked-up
      embeddings by d_model^0.5 instead of the logits by d_model^-0.5.

  Example:
    >>> emb = VocabEmbedding(mesh, vocab_dim, model_dim, mtf.VariableDType(),
    ...                      name="embedding", ensemble_dim=None)
    >>> x = emb.ids_to_embedding(ids, context)        # [batch, length, d_model]
    >>> logits = emb.hidden_to_logits(x, context)     # [batch, length, vocab]
  """

  def __init__(self, mesh: mtf.Mesh, vocab_dim: mtf.Dimension, output_dim: mtf.Dimension,
               variable_dtype: mtf.VariableDType, name: str = "embedding",
               ensemble_dim=None, scale_variable_like_classifier_weights: bool = False):
    self._vocab_dim = vocab_dim
    self._output_dim = output_dim
    self._classifier_scale = scale_variable_like_classifier_weights
    initializer = (mtf.initializers.random_normal_or_replaced(stddev=output_dim.size ** -0.5)
                   if scale_variable_like_classifier_weights else None)
    self._weights = mtf.layers.embedding_weights(
        mesh, vocab_dim, output_dim, variable_dtype, name=name, ensemble_dim=ensemble_dim,
        initializer=initializer)

  @classmethod
  def from_weights(cls, weights: mtf.Tensor, vocab_dim: mtf.Dimension,
                   output_dim: mtf.Dimension) -> "VocabEmbedding":
    """A VocabEmbedding over an existing table [..., vocab, d_model].

    Example:
      >>> emb = VocabEmbedding.from_weights(table, vocab_dim, model_dim)
    """
    obj = cls.__new__(cls)
    obj._vocab_dim, obj._output_dim = vocab_dim, output_dim
    obj._classifier_scale = False
    obj._weights = weights
    return obj

  @property
  def weights(self) -> mtf.Tensor:
    """The table [..., vocab, d_model]."""
    return self._weights

  def ids_to_embedding(self, ids: mtf.Tensor, context: Optional[Context] = None) -> mtf.Tensor:
    """The embeddings [ids dims..., d_model] of int ids in [0, vocab)."""
    del context
    x = mtf.gather(self._weights, ids, self._vocab_dim)
    if self._classifier_scale:
      x = x * (self._output_dim.size ** 0.5)
    return x

  def hidden_to_logits(self, hidden: mtf.Tensor,
                       context: Optional[Context] = None) -> mtf.Tensor:
    """The logits [..., vocab] of model states hidden [..., d_model]."""
    del context
    if not self._classifier_scale:
      hidden = hidden * (self._output_dim.size ** -0.5)
    extra = [d for d in self._weights.shape.dims
             if d not in (self._vocab_dim, self._output_dim) and d not in hidden.shape.dims]
    return mtf.einsum([hidden, self._weights], output_shape=mtf.Shape(
        extra + (hidden.shape - [self._output_dim]).dims + [self._vocab_dim]))


def get_vocab_embedding_cls(cls=VocabEmbedding):
  """The vocabulary embedding class of Unitransformers built without an
  explicit `vocab_embedding_cls`: the original's gin hook, so that
  `transformer.get_vocab_embedding_cls.cls = @vocab_embeddings.Mixtape`
  in a ported gin file still works.

  Example:
    >>> get_vocab_embedding_cls() is VocabEmbedding
    True
  """
  return cls


def _default_vocab_embedding_cls():
  """get_vocab_embedding_cls(), through gin when gin_config registered it
  (the model library itself never imports gin); VocabEmbedding then also
  takes its gin bindings (VocabEmbedding.scale_variable_like_classifier_weights)."""
  configurables = gin_configurables()
  cls = configurables.get("get_vocab_embedding_cls", get_vocab_embedding_cls)()
  return configurables.get("VocabEmbedding", cls) if cls is VocabEmbedding else cls



def _call_loss_fn(loss_fn, model, context, logits, targets, vocab_dim):
  """loss_fn(model, context, logits, targets, vocab_dim), or
  loss_fn(context, logits, targets, vocab_dim) for a function with four
  positional parameters."""
  try:
    params = list(inspect.signature(loss_fn).parameters.values())
  except (TypeError, ValueError):  # no signature to read: the five-argument form
    params = None
  if params is not None and not any(p.kind == p.VAR_POSITIONAL for p in params):
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) == 4:
      return loss_fn(context, logits, targets, vocab_dim)
  return loss_fn(model, context, logits, targets, vocab_dim)

class Unitransformer:
  """A Transformer with one layer stack: a language model or an encoder, or
  (inside a Bitransformer) the encoder or decoder.

  Args:
    layer_stack: a LayerStack.
    d_model: the model dimension.
    input_vocab_size: size of the input vocabulary (rounded up to a multiple
      of vocab_divisor).
    output_vocab_size: size of the output vocabulary, or None for an encoder
      that returns its final activations instead of logits.
    autoregressive: causal self-attention (position q sees memory m <= q).
    max_length: the largest position a learned position embedding covers.
    shared_embedding_and_softmax_weights: the softmax reuses the embedding
      table (scaled by d_model^-0.5).
    label_smoothing: mixes the targets with the uniform distribution.
    z_loss: weight of log(Z)^2 in the training loss (helps bfloat16).
    name: the variable scope ("transformer", "encoder", "decoder").
    layout: optional layout rules, for layers that adapt to them (MoE1D
      sizes its token groups so they split like the batch).
    mesh_shape: optional mesh shape, with layout.
    vocab_divisor: vocabulary sizes are rounded up to a multiple of this, so
      that a layout can split "vocab".
    loss_fn: optional loss_fn(model, context, logits, targets, vocab_dim) ->
      scalar (a four-argument loss_fn(context, logits, targets, vocab_dim)
      works too) replacing the cross-entropy below.
    positional_embedding: "learned" (or True), "sinusoidal", or "none"
      (False/None; e.g. with relative attention bias).
    ensemble: an ensemble size; not supported (None or 0 only).
    token_dropout_rate: in training, each input token is replaced by id 0
      (padding) with this probability.
    sinusoid_positional_embedding: True for a fixed table of
      sinusoids (`sinusoid_positional_embedding_weights`: sines in the first
      half of d_model, cosines in the second) instead of a learned one.
    input_full_attention: for "[inputs] EOS [targets]" language models: the
      inputs part attends to all of itself.
    loss_on_targets_only: for the same: no loss on the inputs part.
    loss_denominator: divide the summed token losses by this number instead
      of the number of non-padding target tokens.
    vocab_embedding_cls: the class that embeds the input ids and, with
      shared_embedding_and_softmax_weights, makes the logits: called as
      cls(mesh, vocab_dim, d_model_dim, variable_dtype, name="embedding",
      ensemble_dim=None); see `VocabEmbedding`, vocab_embeddings.py and
      adaptive_softmax.py. None: `get_vocab_embedding_cls()` (VocabEmbedding
      unless gin binds get_vocab_embedding_cls.cls).

  The loss is the mean (over non-padding target tokens) of the softmax
  cross-entropy, plus z_loss * log(Z)^2 in training, plus the auxiliary
  losses layers add to the context (e.g. mixture-of-experts balancing).

  Example:
    >>> model = Unitransformer(stack, d_model=64, input_vocab_size=256,
    ...                        output_vocab_size=256, autoregressive=True,
    ...                        max_length=128)
  """

  def __init__(self, layer_stack: LayerStack, d_model: int = 1024,
               input_vocab_size: Optional[int] = None,
               output_vocab_size: Optional[int] = None, autoregressive: bool = True,
               max_length: int = 512, shared_embedding_and_softmax_weights: bool = False,
               label_smoothing: float = 0.0, z_loss: float = 1e-4, name: str = "transformer",
               layout=None, mesh_shape=None, vocab_divisor: int = 128, ensemble=None,
               loss_fn=None, positional_embedding: Union[str, bool, None] = "learned",
               sinusoid_positional_embedding: bool = False,
               input_full_attention: bool = False, loss_on_targets_only: bool = False,
               loss_denominator: Optional[float] = None, token_dropout_rate: float = 0.0,
               vocab_embedding_cls=None):
    if ensemble:
      raise ValueError(f"Unitransformer: ensemble={ensemble} (an ensemble dimension on every "
                       "variable) is not supported; train the models separately.")
    if not 0.0 <= token_dropout_rate < 1.0:
      raise ValueError(f"Unitransformer: token_dropout_rate must be in [0, 1), got "
                       f"{token_dropout_rate}.")
    self.token_dropout_rate = token_dropout_rate
    if input_vocab_size is None:
      raise ValueError("Unitransformer: input_vocab_size is required.")
    if autoregressive and not output_vocab_size:
      raise ValueError("Unitransformer: an autoregressive model needs output_vocab_size.")
    if input_full_attention and not autoregressive:
      raise ValueError("Unitransformer: input_full_attention needs autoregressive=True.")
    positive_int(d_model, "Unitransformer: d_model", " (gin: d_model = ...)",
                 (numbers.Integral,))
    self.layer_stack = layer_stack
    self.model_dim = mtf.Dimension("d_model", d_model)
    self.input_vocab_dim = mtf.Dimension("vocab", _round_up(input_vocab_size, vocab_divisor))
    self.output_vocab_dim = (mtf.Dimension("vocab", _round_up(output_vocab_size, vocab_divisor))
                             if output_vocab_size else None)
    self.autoregressive = autoregressive
    self.max_length_dim = mtf.Dimension("max_length", max_length)
    self.shared_embedding_and_softmax_weights = shared_embedding_and_softmax_weights
    self.label_smoothing = label_smoothing
    self.z_loss = z_loss
    self.name = name
    self.layout = layout
    self.mesh_shape = mesh_shape
    self.positional_embedding = _positional_embedding_kind(positional_embedding)
    if sinusoid_positional_embedding:
      if self.positional_embedding != "learned":
        raise ValueError("Unitransformer: sinusoid_positional_embedding=True replaces the "
                         "learned table; leave positional_embedding at 'learned'.")
      self.positional_embedding = "sinusoid_table"
    self.input_full_attention = input_full_attention
    self.loss_on_targets_only = loss_on_targets_only
    self.loss_denominator = loss_denominator
    self._loss_fn = loss_fn
    self.vocab_embedding_cls = (vocab_embedding_cls if vocab_embedding_cls is not None
                                else _default_vocab_embedding_cls())
    if self.output_vocab_dim is not None:
      self._check_vocab_embedding()

  def _check_vocab_embedding(self) -> None:
    cls = getattr(self.vocab_embedding_cls, "func", self.vocab_embedding_cls)
    cls_name = getattr(cls, "__name__", repr(cls))
    if self.shared_embedding_and_softmax_weights:
      if self.input_vocab_dim != self.output_vocab_dim:
        raise ValueError(
            f"Unitransformer {self.name!r}: shared_embedding_and_softmax_weights needs "
            f"equal input and output vocabularies, got {self.input_vocab_dim.size} and "
            f"{self.output_vocab_dim.size} (after rounding up to vocab_divisor).")
    elif getattr(cls, "logits_need_shared_weights", False):  # cls may be a partial's func
      raise ValueError(
          f"Unitransformer {self.name!r}: {cls_name} makes the output softmax, which "
          "it only does with shared_embedding_and_softmax_weights=True (gin: "
          "Unitransformer.shared_embedding_and_softmax_weights = True).")

  @property
  def fully_autoregressive(self) -> bool:
    return self.autoregressive and not self.input_full_attention

  # ---- the network -----------------------------------------------------------
  def _vocab_embedding(self, context: Context):
    """The vocabulary embedding object: the one shared with another
    Unitransformer (context.shared_params["embedding"]) or this model's own."""
    shared = context.shared_params.get("embedding")
    if isinstance(shared, mtf.Tensor):  # a bare table, as in earlier versions
      return VocabEmbedding.from_weights(shared, self.input_vocab_dim, self.model_dim)
    if shared is not None:
      return shared
    return self.vocab_embedding_cls(context.mesh, self.input_vocab_dim, self.model_dim,
                                    context.variable_dtype, name="embedding",
                                    ensemble_dim=None)

  def _position_embedding(self, context: Context, x: mtf.Tensor) -> Optional[mtf.Tensor]:
    kind = self.positional_embedding
    if kind is None:
      return None
    position = context.position
    if kind == "sinusoidal":
      if position is None:
        position = mtf.range(context.mesh, context.length_dim, tf.int32)
      return sinusoidal_position_embedding(position, self.model_dim, x.dtype)
    if kind == "sinusoid_table":
      table = sinusoid_positional_embedding_weights(context.mesh, self.max_length_dim,
                                                    self.model_dim, x.dtype)
    elif "positional_embedding" in context.shared_params:
      table = context.shared_params["positional_embedding"]
    else:
      table = mtf.layers.embedding_weights(context.mesh, self.max_length_dim, self.model_dim,
                                           context.variable_dtype, name="positional_embedding")
    if context.length_dim.size > self.max_length_dim.size:
      raise ValueError(f"Unitransformer {self.name!r}: sequences of length "
                       f"{context.length_dim.size} exceed max_length={self.max_length_dim.size}"
                       " of the learned position embedding.")
    if context.position_is_default and not context.incremental:
      part = mtf.slice(table, 0, context.length_dim.size, self.max_length_dim.name)
      return mtf.rename_dimension(part, self.max_length_dim.name, context.length_dim.name)
    position = mtf.minimum(position, self.max_length_dim.size - 1)
    return mtf.gather(table, position, self.max_length_dim)

  def _call_internal(self, context: Context, inputs: mtf.Tensor,
                     targets: Optional[mtf.Tensor] = None) -> mtf.Tensor:
    """Logits [batch..., (length,) vocab] (or activations for an encoder)."""
    vocab_embedding = self._vocab_embedding(context)
    context.cache["vocab_embedding"] = vocab_embedding
    if context.train and getattr(self, "token_dropout_rate", 0.0):
      # Dropped input tokens become id 0 (padding), each with probability
      # token_dropout_rate, the same under every layout.
      keep = mtf.greater_equal(
          mtf.random_uniform(context.mesh, inputs.shape, name="token_dropout"),
          self.token_dropout_rate)
      inputs = mtf.where(keep, inputs, mtf.zeros_like(inputs))
    x = vocab_embedding.ids_to_embedding(inputs, context)
    pos = self._position_embedding(context, x)
    if pos is not None:
      x = x + pos
    self._shared_layer_params(context)
    if (targets is not None and self.output_vocab_dim is not None
        and getattr(self.layer_stack, "schedules_loss", lambda c: False)(context)):
      # A pipelined stack running the 1F1B schedule computes the loss of
      # each micro-batch inside its schedule (layer_stack.py).
      if self._own_loss(vocab_embedding, context) is not None:
        raise ValueError(
            f"Unitransformer {self.name!r}: {type(vocab_embedding).__name__} computes its "
            "own training loss, which pipeline_schedule='1f1b' cannot run per "
            "micro-batch; use pipeline_schedule='gpipe'.")
      logits, loss = self.layer_stack.logits_and_loss(
          context, x, lambda y: self._logits(context, y, vocab_embedding), targets)
      context.losses.append(loss)
      return logits
    x = self.layer_stack.call(context, x)
    if self.output_vocab_dim is None:
      return x
    context.cache["vocab_embedding_hidden"] = x
    logits = self._logits(context, x, vocab_embedding)
    if targets is not None and context.losses is not None:
      own_loss = self._own_loss(vocab_embedding, context)
      if own_loss is not None:
        loss = own_loss(self, x, targets, context)
      else:
        loss = self._compute_loss(context, logits, targets, self.output_vocab_dim)
      if (context.num_microbatches or 1) > 1:
        loss = loss / float(context.num_microbatches)
      context.losses.append(loss)
    return logits

  def _own_loss(self, vocab_embedding, context: Context):
    """The vocabulary embedding's own training loss (an adaptive softmax's,
    whose gradients never go through the whole softmax), or None."""
    if (self._loss_fn is not None or not context.train
        or not self.shared_embedding_and_softmax_weights):
      return None
    return getattr(vocab_embedding, "compute_loss", None)

  def _logits(self, context: Context, x: mtf.Tensor, vocab_embedding) -> mtf.Tensor:
    """The output logits [..., vocab] of the stack's output x."""
    if self.shared_embedding_and_softmax_weights:
      return vocab_embedding.hidden_to_logits(x, context)
    return mtf.layers.dense(x, self.output_vocab_dim, reduced_dims=[self.model_dim],
                            use_bias=False, variable_dtype=context.variable_dtype,
                            name="logits")

  def _shared_layer_params(self, context: Context) -> None:
    """Variables that several layers of the stack share (relative attention
    biases of type "bias_shared"), created once, outside any recomputed or
    pipelined region, in the scope of the first layer that uses them
    ("<stack>/block_000/layer_000/SelfAttention/relative_attention_bias")."""
    stack = self.layer_stack
    for i, layer in enumerate(stack.layers):
      make = getattr(layer, "make_shared_params", None)
      if make is None:
        continue
      scope = (stack.layer_scope(i) if hasattr(stack, "layer_scope")
               else "layer_%03d" % i)
      with mtf.name_scope(context.mesh, scope), mtf.name_scope(
          context.mesh, getattr(layer, "scope_name", type(layer).__name__)):
        make(context)

  def _compute_loss(self, context: Context, logits: mtf.Tensor, targets: mtf.Tensor,
                    vocab_dim: mtf.Dimension) -> mtf.Tensor:
    if self._loss_fn is not None:
      return _call_loss_fn(self._loss_fn, self, context, logits, targets, vocab_dim)
    dtype = logits.dtype
    loss = mtf.layers.softmax_cross_entropy_with_logits(
        logits, targets, vocab_dim, z_loss=self.z_loss if context.train else 0.0,
        label_smoothing=self.label_smoothing)
    weights = mtf.layers.weights_nonzero(targets, dtype=dtype)
    if self.loss_on_targets_only:
      weights = weights * mtf.cast(mtf.logical_not(inputs_prefix_mask(targets)), dtype)
    total = mtf.reduce_sum(loss * weights)
    if self.loss_denominator is not None:
      return total * (1.0 / float(self.loss_denominator))
    return total / mtf.maximum(mtf.reduce_sum(weights), 1.0)

  def _priorities(self, targets, length_range):
    if self.input_full_attention and targets is not None:
      region = inputs_prefix_mask(targets)
      region = mtf.logical_or(region, mtf.shift(region, 1, targets.shape.dims[-1], wrap=False))
      priority = length_range * mtf.to_int32(mtf.logical_not(region))
      return priority, priority
    if self.autoregressive:
      return length_range, length_range
    return None, None

  def call_simple(self, inputs: mtf.Tensor, targets: Optional[mtf.Tensor],
                  compute_loss: bool, mode: str = ModeKeys.TRAIN,
                  variable_dtype: Optional[mtf.VariableDType] = None, sequence_id=None,
                  subsequence_id=None, position=None, encoder_output=None,
                  encoder_sequence_id=None, encoder_inputs=None, shared_params=None,
                  layer_outputs=None, encoder_layer_outputs=None, num_microbatches: int = 1):
    """Logits (and the loss) for all positions in parallel: training and eval.

    Args:
      inputs: int32 [batch..., length]; for a language model the targets
        shifted right by one (mtf.shift(targets, 1, length, wrap=False)).
      targets: int32 [batch..., length] or None (0 is padding).
      compute_loss: whether to return the loss.
      mode: ModeKeys.TRAIN, EVAL or PREDICT.
      variable_dtype: an mtf.VariableDType (default float32).
      sequence_id: int32 [batch..., length] segment ids of packed examples.
      subsequence_id: accepted for compatibility.
      position: int32 [batch..., length] positions within each segment.
      encoder_output: for a decoder, the encoder's output with its length
        renamed "memory_length".
      encoder_sequence_id: the encoder's segment ids [batch..., memory_length].
      encoder_inputs: the encoder's input ids, for decoder layers that read
        them (context.encoder_inputs).
      shared_params: variables shared with another Unitransformer.
      layer_outputs: an optional list collecting each layer's output.
      encoder_layer_outputs: the encoder's layer outputs, for layers that
        read them.
      num_microbatches: how many micro-batches the caller cuts the step into
        and sums the losses of: the token loss is divided
        by it, so the sum is the whole batch's mean.

    Returns:
      (logits [batch..., length, vocab], scalar loss or None).

    Example:
      >>> logits, loss = model.call_simple(
      ...     mtf.shift(targets, 1, length, wrap=False), targets, True)
    """
    variable_dtype = variable_dtype or mtf.VariableDType(tf.float32)
    batch_dims = inputs.shape.dims[:-1]
    length_dim = inputs.shape.dims[-1]
    length_range = mtf.range(inputs.mesh, length_dim, tf.int32)
    position_is_default = position is None
    if position is None:
      position = length_range
    read_priority, write_priority = self._priorities(targets, length_range)
    context = Context(
        model=self, mesh=inputs.mesh, batch_dims=batch_dims, length_dim=length_dim,
        variable_dtype=variable_dtype, mode=mode, losses=[] if compute_loss else None,
        sequence_id=sequence_id, subsequence_id=subsequence_id, position=position,
        position_is_default=position_is_default, encoder_output=encoder_output,
        encoder_sequence_id=encoder_sequence_id, shared_params=shared_params,
        layer_outputs=layer_outputs, encoder_layer_outputs=encoder_layer_outputs,
        write_priority=write_priority, read_priority=read_priority, inputs=inputs,
        encoder_inputs=encoder_inputs, num_microbatches=num_microbatches)
    with mtf.name_scope(inputs.mesh, self.name):
      logits = self._call_internal(context, inputs, targets)
    loss = None
    if compute_loss and context.losses:
      # float32, as layers' auxiliary losses (MoE balancing) are, whatever
      # the activation dtype of the main loss.
      loss = mtf.add_n([mtf.to_float(x) for x in context.losses])
    return logits, loss

  # ---- decoding --------------------------------------------------------------
  def first_part(self, inputs, batch_dims, length_dim, variable_dtype, encoder_output=None,
                 encoder_sequence_id=None, shared_params=None, encoder_layer_outputs=None,
                 initial_position=None, beam_dim=None, encoder_inputs=None):
    """The prefix pass before decoding ("first_part" mode).

    Runs the known prefix (inputs, shifted right) through the stack and
    returns (states, constant_states): the per-layer caches and the values
    computed once (e.g. encoder keys) that `incremental_logits_fn` needs.

    Example:
      >>> states, constants = model.first_part(ids, [batch], length, vdtype)
    """
    length_range = mtf.range(inputs.mesh, length_dim, tf.int32)
    priority = self._decode_priority(length_range, initial_position)
    context = Context(
        model=self, mesh=inputs.mesh, batch_dims=batch_dims, length_dim=length_dim,
        variable_dtype=variable_dtype, beam_dim=beam_dim, mode=ModeKeys.FIRST_PART,
        position=length_range, position_is_default=True, new_states=[],
        initial_position=initial_position, sequence_id=None,
        encoder_output=encoder_output, encoder_sequence_id=encoder_sequence_id,
        constant_states=[], shared_params=shared_params,
        encoder_layer_outputs=encoder_layer_outputs, write_priority=priority,
        read_priority=priority, inputs=inputs, encoder_inputs=encoder_inputs)
    shifted = mtf.shift(inputs, offset=1, dim=length_dim, wrap=False)
    with mtf.name_scope(inputs.mesh, self.name):
      self._call_internal(context, shifted)
    return context.new_states, context.constant_states

  def _decode_priority(self, length_range, initial_position):
    """Write priorities while decoding: with input_full_attention the prefix
    (up to initial_position) is visible from everywhere."""
    if self.input_full_attention and initial_position is not None:
      return length_range * mtf.to_int32(mtf.greater(length_range, initial_position))
    return length_range

  def incremental_logits_fn(self, batch_dims, length_dim, variable_dtype, constant_states,
                            encoder_output=None, encoder_sequence_id=None, shared_params=None,
                            encoder_layer_outputs=None, beam_dim=None, never_end_token=None,
                            initial_position=None, encoder_inputs=None,
                            ban_padding: bool = True, bos_id: int = 0):
    """logits_fn(step, ids, states) -> (logits, new_states): one incremental
    decoding step, in the form mtf.beam_search's decoders take.

    step is the position decoded (a scalar or [batch...]); the token read
    is ids at step - 1 (at step 0: bos_id). The logits of id 0 (padding)
    unless ban_padding is False (beam search, whose log probabilities are
    over the whole vocabulary), and of never_end_token if given,
    are -1e9: decoding never produces them.

    Example:
      >>> fn = model.incremental_logits_fn([batch], length, vdtype, constants)
      >>> logits, states = fn(step, ids, states)
    """

    def logits_fn(step, ids, states):
      context = Context(
          model=self, mesh=ids.mesh, batch_dims=batch_dims, length_dim=length_dim,
          variable_dtype=variable_dtype, beam_dim=beam_dim, mode=ModeKeys.INCREMENTAL,
          position=step, states=list(states), new_states=[], sequence_id=None,
          encoder_output=encoder_output, encoder_sequence_id=encoder_sequence_id,
          constant_states=constant_states, shared_params=shared_params,
          encoder_layer_outputs=encoder_layer_outputs, encoder_inputs=encoder_inputs,
          write_priority=self._decode_priority(mtf.range(ids.mesh, length_dim, tf.int32),
                                               initial_position),
          read_priority=step)
      token = _one_position(ids, step - 1, length_dim)
      if bos_id:  # step 0 reads bos_id
        token = token + bos_id * mtf.to_int32(mtf.equal(step, 0))
      with mtf.name_scope(ids.mesh, self.name):
        logits = self._call_internal(context, token)
      banned = (([0] if ban_padding else []) +
                ([never_end_token] if never_end_token is not None else []))
      if not banned:
        return logits, context.new_states
      logits = logits + mtf.constant(
          ids.mesh, np.isin(np.arange(self.output_vocab_dim.size), banned) * _NEG_INF,
          mtf.Shape([self.output_vocab_dim]), dtype=logits.dtype)
      return logits, context.new_states
    return logits_fn

  def sample_autoregressive(self, partial_sequences: mtf.Tensor, stop_at_token: Optional[int] = 1,
                            max_steps=None, temperature: float = 0.0,
                            variable_dtype: Optional[mtf.VariableDType] = None,
                            encoder_output=None, encoder_sequence_id=None,
                            encoder_inputs=None, shared_params=None,
                            has_partial_sequences: bool = True,
                            encoder_layer_outputs=None, never_end: bool = False,
                            remove_partial_sequences: bool = False,
                            sampling_keep_top_k: Optional[int] = None, bos_id: int = 0,
                            top_k: Optional[int] = None) -> mtf.Tensor:
    """Continues sequences one token at a time with cached keys and values.

    Each sequence's known prefix is its leading nonzero tokens; decoding fills
    the zeros after it, stopping (per sequence) after `stop_at_token`, after
    max_steps new tokens or at the end of the length dimension. Positions
    after a sequence ends stay 0; decoding never produces id 0 itself.

    Args:
      partial_sequences: int32 [batch..., length]: prefixes, then zeros.
      stop_at_token: the end-of-sequence id (None: never stop early).
      max_steps: an int or int32 mtf scalar: at most this many new tokens.
      temperature: 0.0 is greedy (argmax); 1.0 samples from the model.
      variable_dtype: an mtf.VariableDType.
      encoder_output: for a decoder, the encoder output ("memory_length").
      encoder_sequence_id: the encoder's segment ids ("memory_length").
      shared_params: variables shared with the encoder.
      has_partial_sequences: False if all inputs are zeros (saves the
        prefix pass over the whole length).
      encoder_layer_outputs: the encoder's layer outputs.
      never_end: never produce stop_at_token.
      remove_partial_sequences: shift each output left so it starts with
        the first new token.
      top_k: sample only among the k most likely tokens.
      sampling_keep_top_k: the original's name for top_k (-1: no limit).
      encoder_inputs: the encoder's input ids, for decoder layers that read them.
      bos_id: the id read before the first token; only 0 (the id decoding
        starts from here) is supported.

    Returns:
      int32 [batch..., length]: the prefixes followed by the new tokens.

    Example:
      >>> out = model.sample_autoregressive(prompts, temperature=0.0, max_steps=20)
    """
    if not self.autoregressive:
      raise ValueError("sample_autoregressive needs an autoregressive Unitransformer.")
    variable_dtype = variable_dtype or mtf.VariableDType(tf.float32)
    _check_bos_id(bos_id, "sample_autoregressive")
    if top_k is None and sampling_keep_top_k is not None and sampling_keep_top_k > 0:
      top_k = sampling_keep_top_k
    inputs = partial_sequences
    batch_dims = inputs.shape.dims[:-1]
    length_dim = inputs.shape.dims[-1]
    initial_position = mtf.reduce_sum(mtf.to_int32(mtf.not_equal(inputs, 0)),
                                      reduced_dim=length_dim)
    states, constant_states = self.first_part(
        inputs, batch_dims, length_dim, variable_dtype, encoder_output, encoder_sequence_id,
        shared_params, encoder_layer_outputs, initial_position, encoder_inputs=encoder_inputs)
    if not has_partial_sequences:
      states = [mtf.zeros_like(s) for s in states]
    logits_fn = self.incremental_logits_fn(
        batch_dims, length_dim, variable_dtype, constant_states, encoder_output,
        encoder_sequence_id, shared_params, encoder_layer_outputs,
        never_end_token=stop_at_token if never_end else None,
        initial_position=initial_position, encoder_inputs=encoder_inputs)
    outputs = beam_search_lib.greedy_decode(
        logits_fn, inputs, temperature=temperature, initial_states=states,
        eos_id=stop_at_token, max_steps=max_steps, top_k=top_k,
        initial_position=initial_position)
    if remove_partial_sequences and has_partial_sequences:
      outputs = _shift_left(outputs, initial_position, length_dim)
    return outputs

  def beam_search(self, inputs: mtf.Tensor, decode_length=None,
                  variable_dtype: Optional[mtf.VariableDType] = None, encoder_output=None,
                  encoder_sequence_id=None, encoder_inputs=None, alpha: float = 0.6,
                  shared_params=None, encoder_layer_outputs=None, bos_id: int = 0,
                  stop_at_token: int = 1, return_all_beams: bool = False):
    """Beam search from position 0 (see `mtf.beam_search.beam_search`):
    with the model's layout and mesh shape, candidates are prefiltered per
    vocabulary part.

    Args:
      inputs: int32 zeros [batch, beam, length]; the beam dimension's size is
        the beam width.
      decode_length: int or int32 mtf scalar: at most this many tokens.
      variable_dtype: an mtf.VariableDType.
      encoder_output: for a decoder, the encoder output ("memory_length").
      encoder_sequence_id: the encoder's segment ids.
      encoder_inputs: the encoder's input ids, for decoder layers that read them.
      alpha: length penalty exponent: scores are log P / ((5 + n) / 6)^alpha.
      shared_params: variables shared with the encoder.
      encoder_layer_outputs: the encoder's layer outputs.
      bos_id: the id the first position reads (the model's start token;
        0 unless it was trained with shift_targets(targets, bos_id)).
      stop_at_token: end-of-sequence id.
      return_all_beams: return ([batch, beam, length], scores [batch, beam])
        instead of the best sequence [batch, length].

    Example:
      >>> best = model.beam_search(mtf.zeros(mesh, "batch:4;beam:4;length:32",
      ...                                    dtype=tf.int32), alpha=0.6)
    """
    if not self.autoregressive:
      raise ValueError("beam_search needs an autoregressive Unitransformer.")
    variable_dtype = variable_dtype or mtf.VariableDType(tf.float32)
    batch_dims = inputs.shape.dims[:-2]
    beam_dim, length_dim = inputs.shape.dims[-2:]
    states, constant_states = self.first_part(
        inputs, batch_dims + [beam_dim], length_dim, variable_dtype, encoder_output,
        encoder_sequence_id, shared_params, encoder_layer_outputs, beam_dim=beam_dim,
        encoder_inputs=encoder_inputs)
    states = [mtf.zeros_like(s) for s in states]
    logits_fn = self.incremental_logits_fn(
        batch_dims + [beam_dim], length_dim, variable_dtype, constant_states, encoder_output,
        encoder_sequence_id, shared_params, encoder_layer_outputs, beam_dim=beam_dim,
        encoder_inputs=encoder_inputs, ban_padding=False, bos_id=bos_id)
    beams, scores = beam_search_lib.beam_search(
        logits_fn, inputs, alpha, states=states, eos_id=stop_at_token,
        decode_length=decode_length, use_tpu=True, dtype=tf.float32,
        layout=self.layout, mesh_shape=self.mesh_shape)
    if return_all_beams:
      return beams, scores
    return beam_search_lib.best_beam(beams)


def _check_bos_id(bos_id: int, fn_name: str) -> None:
  if bos_id:
    raise ValueError(f"{fn_name}: bos_id={bos_id} is not supported; decoding reads id 0 "
                     "before the first token (train with shift_targets(targets, bos_id=0)).")


def _shift_left(ids: mtf.Tensor, amount: mtf.Tensor, length_dim: mtf.Dimension) -> mtf.Tensor:
  """ids[..., i + amount] at position i (0 past the end); amount per row."""
  memory = mtf.Dimension("shift_source", length_dim.size)
  src = mtf.range(ids.mesh, memory, tf.int32)
  dst = mtf.range(ids.mesh, length_dim, tf.int32)
  move = mtf.to_int32(mtf.equal(src, dst + amount))  # [batch..., length, shift_source]
  return mtf.einsum([mtf.rename_dimension(ids, length_dim.name, memory.name), move],
                    output_shape=ids.shape)
