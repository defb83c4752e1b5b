"""The layer stack of a transformer and what its layers see: the
`TransformerLayer` base class, the `Context` passed to every layer, the
pre-norm residual `LayerStack` and `make_layer_stack`.

Import them from `transformer` (which re-exports them) or from here.

    >>> stack = make_layer_stack([SelfAttention(num_heads=8),
    ...                           DenseReluDense(hidden_size=2048)], num_layers=6)
    >>> ctx = Context(model, mesh, [batch], length, mtf.VariableDType(), losses=[])
    >>> y = stack.call(ctx, x)
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import tensorflow as tf

import mesh_tensorflow as mtf


class ModeKeys:
  """Model modes (the mode names estimators used), plus the
  two decoding modes that layers see."""
  TRAIN = "train"
  EVAL = "eval"
  PREDICT = "infer"
  FIRST_PART = "first_part"
  INCREMENTAL = "incremental"


class TransformerLayer:
  """Base class of the layers of a `LayerStack`.

  A layer records its hyperparameters in `__init__` and creates its variables
  in `call`, under the scope the stack gives it; the same instance may be
  called several times (e.g. once per decoding step) and must find the same
  variables by name, so use explicit names. `call(context, x)` returns a
  tensor of x's shape. In "incremental" mode x has no length dimension (one
  position per sequence); layers with caches read them with
  `context.get_states(n)` and write the new ones with
  `context.record_new_states(...)` (recorded in "first_part" mode too).

  Example:
    >>> class Scale(TransformerLayer):
    ...   def call(self, context, x):
    ...     s = mtf.get_variable(context.mesh, "s", [], dtype=context.variable_dtype)
    ...     return x * s
  """

  def call(self, context: "Context", x: mtf.Tensor) -> mtf.Tensor:
    raise NotImplementedError(f"{type(self).__name__} must implement call(context, x).")

  @property
  def scope_name(self) -> str:
    """The variable scope of this layer inside its stack slot."""
    return type(self).__name__


class Context:
  """What layers need at call time besides their input.

  Args:
    model: the Unitransformer being called.
    mesh: the mtf.Mesh.
    batch_dims: the batch dimensions (e.g. [batch] or [batch, beam]).
    length_dim: the sequence dimension ("length").
    variable_dtype: an mtf.VariableDType.
    beam_dim: the beam dimension during beam search.
    mode: a `ModeKeys` value: "train", "eval", "infer", "first_part" (the
      prefix pass before decoding) or "incremental" (one decoding step).
    position: int positions, [batch..., length] (or [length]); in incremental
      mode the position being decoded, a scalar or [batch...].
    position_is_default: whether position is mtf.range over length_dim.
    sequence_id: int segment ids [batch..., length] of packed examples (0 is
      padding), or None.
    subsequence_id: accepted for compatibility; unused.
    states: the decoding caches read in incremental mode.
    new_states: a list collecting the caches written in first_part and
      incremental modes.
    losses: a list collecting auxiliary losses (scalars), or None when no
      loss is computed.
    initial_position: where decoding starts (first_part mode).
    layer_outputs: a list collecting the activations after each layer.
    encoder_output: [batch..., memory_length, d_model] for decoders.
    encoder_sequence_id: segment ids [batch..., memory_length] of the encoder.
    constant_states: values computed once in first_part mode and read in
      every incremental step (e.g. the keys of the encoder output).
    shared_params: variables shared between encoder and decoder.
    encoder_layer_outputs: the encoder's layer outputs, read-only.
    write_priority: int [length]; with read_priority, position q may attend
      to memory position m iff read_priority[q] >= write_priority[m].
    read_priority: int, like write_priority.

  Example:
    >>> ctx = Context(model, mesh, [batch], length, mtf.VariableDType(),
    ...               mode="train", losses=[])
  """

  def __init__(self, model, mesh: mtf.Mesh, batch_dims: Sequence[mtf.Dimension],
               length_dim: mtf.Dimension, variable_dtype: mtf.VariableDType,
               beam_dim: Optional[mtf.Dimension] = None, mode: str = ModeKeys.TRAIN,
               position=None, position_is_default: bool = False, sequence_id=None,
               subsequence_id=None, states=None, new_states=None, losses=None,
               initial_position=None, layer_outputs=None, encoder_output=None,
               encoder_sequence_id=None, constant_states=None,
               shared_params: Optional[Dict[str, mtf.Tensor]] = None,
               encoder_layer_outputs=None, write_priority=None, read_priority=None):
    self.model = model
    self.mesh = mesh
    self.batch_dims = list(batch_dims)
    self.length_dim = length_dim
    self.variable_dtype = variable_dtype
    self.beam_dim = beam_dim
    self.mode = mode
    self.position = position
    self.position_is_default = position_is_default
    self.sequence_id = sequence_id
    self.subsequence_id = subsequence_id
    self.states = states
    self.new_states = new_states
    self.losses = losses
    self.initial_position = initial_position
    self.layer_outputs = layer_outputs
    self.encoder_output = encoder_output
    self.encoder_sequence_id = encoder_sequence_id
    self.constant_states = constant_states
    self.next_constant_state = 0
    self.shared_params = shared_params if shared_params is not None else {}
    self.encoder_layer_outputs = encoder_layer_outputs
    self.write_priority = write_priority
    self.read_priority = read_priority
    self.layer_index = 0
    self.cache: Dict[Any, Any] = {}

  @property
  def train(self) -> bool:
    """True in training mode (dropout, z-loss, random expert choices)."""
    return self.mode == ModeKeys.TRAIN

  @property
  def activation_dtype(self) -> tf.DType:
    return self.variable_dtype.activation_dtype

  @property
  def incremental(self) -> bool:
    return self.mode == ModeKeys.INCREMENTAL

  @property
  def memory_length_dim(self) -> mtf.Dimension:
    """The self-attention memory dimension: "memory_length", length's size."""
    return mtf.Dimension("memory_length", self.length_dim.size)

  def get_states(self, n: int) -> List[mtf.Tensor]:
    """The next n decoding caches (incremental mode), in recording order."""
    start = len(self.new_states)
    return list(self.states[start:start + n])

  def record_new_states(self, new_states: Sequence[mtf.Tensor]) -> None:
    """Records caches (first_part and incremental modes)."""
    self.new_states.extend(new_states)

  def record_constant_state(self, s) -> None:
    """Records a value computed once, in first_part mode."""
    self.constant_states.append(s)

  def get_constant_state(self):
    """Reads the next value recorded with `record_constant_state`."""
    s = self.constant_states[self.next_constant_state]
    self.next_constant_state += 1
    return s

  @property
  def nonpadding(self) -> Optional[mtf.Tensor]:
    """1.0 at real tokens and 0.0 at padding (sequence_id 0), or None."""
    if not isinstance(self.sequence_id, mtf.Tensor):
      return None
    return mtf.cast(mtf.not_equal(self.sequence_id, 0), self.activation_dtype)


class LayerStack(TransformerLayer):
  """Layers with pre-normalization residual connections and a final norm.

  For each layer: x = x + dropout(layer(norm(x))); then the output is
  dropout(norm(x)). Norms are RMS norms with a learned scale over d_model
  ("rms", as T5) or layer norms ("layer"). Padding positions (sequence_id 0)
  are zeroed before each norm and at the end. Layer i's variables live under
  "layer_%03d/<LayerClass>".

  Args:
    layers: TransformerLayer instances, called in order.
    dropout_rate: dropout on the embeddings, every residual branch and the
      output (training only).
    norm_epsilon: added to the mean square before the reciprocal root.
    norm_type: "rms" or "layer".

  Example:
    >>> stack = LayerStack([SelfAttention(), DenseReluDense()], dropout_rate=0.1)
  """

  def __init__(self, layers: Sequence[TransformerLayer], dropout_rate: float = 0.0,
               norm_epsilon: float = 1e-6, norm_type: str = "rms"):
    if norm_type not in ("rms", "layer"):
      raise ValueError(f"LayerStack: norm_type must be 'rms' or 'layer', got {norm_type!r}.")
    for layer in layers:
      if not hasattr(layer, "call"):
        raise TypeError(f"LayerStack: {layer!r} is not a TransformerLayer (no call method).")
    self._layers = list(layers)
    self._dropout_rate = dropout_rate
    self._norm_epsilon = norm_epsilon
    self._norm_type = norm_type

  @property
  def layers(self) -> List[TransformerLayer]:
    return list(self._layers)

  @property
  def num_layers(self) -> int:
    return len(self._layers)

  def call(self, context: Context, x: mtf.Tensor) -> mtf.Tensor:
    mask = context.nonpadding
    x = self._dropout(context, x)
    if context.layer_outputs is not None:
      context.layer_outputs.append(x)
    for lnum, layer in enumerate(self._layers):
      with mtf.name_scope(context.mesh, "layer_%03d" % lnum):
        norm_x = self._norm(context, x if mask is None else x * mask)
        with mtf.name_scope(context.mesh, getattr(layer, "scope_name", type(layer).__name__)):
          y = layer.call(context, norm_x)
        if y.shape != x.shape:
          raise ValueError(f"LayerStack: layer {lnum} ({type(layer).__name__}) returned "
                           f"shape {y.shape} for an input of shape {x.shape}.")
        x = x + self._dropout(context, y)
      if context.layer_outputs is not None and lnum != len(self._layers) - 1:
        context.layer_outputs.append(x)
      context.layer_index += 1
    x = self._norm(context, x, name="final_layer_norm")
    x = self._dropout(context, x)
    if mask is not None:
      x = x * mask
    if context.layer_outputs is not None:
      context.layer_outputs.append(x)
    return x

  def _dropout(self, context: Context, x: mtf.Tensor) -> mtf.Tensor:
    if context.train and self._dropout_rate > 0.0:
      return mtf.dropout(x, True, rate=self._dropout_rate)
    return x

  def _norm(self, context: Context, x: mtf.Tensor, name: str = "layer_norm") -> mtf.Tensor:
    d_model = context.model.model_dim
    with mtf.name_scope(context.mesh, name):
      scale = mtf.get_variable(
          context.mesh, "scale", mtf.Shape([d_model]), initializer=mtf.initializers.ones(),
          dtype=context.variable_dtype)
      if self._norm_type == "layer":
        bias = mtf.get_variable(
            context.mesh, "bias", mtf.Shape([d_model]),
            initializer=mtf.initializers.zeros(), dtype=context.variable_dtype)
        x = x - mtf.reduce_mean(x, reduced_dim=d_model)
      variance = mtf.reduce_mean(mtf.square(x), reduced_dim=d_model)
      y = x * mtf.rsqrt(variance + self._norm_epsilon) * scale
      return y + bias if self._norm_type == "layer" else y


def make_layer_stack(layers: Sequence[Any], num_layers: int = 6, dropout_rate: float = 0.0,
                     norm_epsilon: float = 1e-6, norm_type: str = "rms") -> LayerStack:
  """A LayerStack repeating the block `layers` num_layers times.

  Elements of `layers` may be TransformerLayer instances (reused: layers
  keep only hyperparameters, so each slot still gets its own variables) or
  classes / factories called once per slot.

  Example:
    >>> stack = make_layer_stack(
    ...     [SelfAttention(num_heads=4), DenseReluDense(hidden_size=256)], num_layers=2)
    >>> stack.num_layers
    4
  """
  block = []
  for _ in range(num_layers):
    for layer in layers:
      block.append(layer() if isinstance(layer, type) or not hasattr(layer, "call") else layer)
  return LayerStack(block, dropout_rate=dropout_rate, norm_epsilon=norm_epsilon,
                    norm_type=norm_type)
