"""Universal Transformer layer stacks (Dehghani et al., 2018): one block of
layers applied again and again with shared weights, with adaptive
computation time (ACT), highway or plain recurrence.

`UTLayerStack` stands where a `LayerStack` does (e.g. the layer stack of a
Unitransformer; gin: `build_model.decoder_layer_stack = @UTLayerStack()`):

    >>> stack = UTLayerStack([SelfAttention(), DenseReluDense()],
    ...                      recurrence_type="act", act_max_steps=4)
    >>> model = Unitransformer(stack, d_model=128, input_vocab_size=259,
    ...                        output_vocab_size=259, autoregressive=True)

Each application ("step") of the block: the step's learned timing signal
("layer_embedding" [layer, d_model], times sqrt(d_model)) is added to the
state (and, with add_position_timing_signal, a sinusoidal position signal);
then every layer of the block runs as in a LayerStack (x + dropout(layer(
layer_norm(x))), variables under "ut/layer_%03d", the same for every step),
`num_inrecurrence_layers` times. Recurrences:

* "basic": `num_rec_steps` steps.
* "highway": `num_rec_steps` steps; each new state is state * carry +
  transformed * transform with sigmoid gates computed from the inputs named
  by `gates_inputs` ("s" state, "t" transformed state, "i" the stack's input),
  carry = 1 - transform when couple_carry_transform_gates.
* "act": up to act_max_steps + 1 steps with per-position halting (a sigmoid
  "pondering" unit); the output is the halting-weighted mix of the states
  ("accumulated": the weighted sum; "random": random halting
  probabilities; "global": one halting probability per sequence).

With mix_with_transformer_before_ut / _after_ut, `num_vanilla_transformer_layers`
plain applications of the block (own variables, "before_ut/..." and
"after_ut/...") come before / after the recurrence. The output is
dropout(layer_norm(x)), padding zeroed.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer.layer_stack import (
    Context, TransformerLayer, _make_layer, _record_layer_output)

_RECURRENCES = ("basic", "highway", "act")
_ACT_TYPES = ("basic", "accumulated", "random", "global")
_GATINGS = ("highway", "gru")


class UTLayerStack(TransformerLayer):
  """A Universal Transformer stack (see the module docstring).

  Args:
    layers: the block's layers (instances, or classes made with no arguments).
    dropout_rate: dropout on the input, every residual branch and the output.
    norm_epsilon: the layer norms' epsilon.
    num_vanilla_transformer_layers: plain applications before/after the
      recurrence (with mix_with_transformer_before_ut / _after_ut).
    couple_carry_transform_gates: highway: carry = 1 - transform.
    act_type: "basic", "accumulated", "random" or "global".
    recurrence_type: "basic", "highway" or "act".
    act_max_steps: ACT runs act_max_steps + 1 steps.
    act_epsilon: a position halts once its halting probability exceeds
      1 - act_epsilon.
    num_rec_steps: steps of "basic" and "highway".
    num_inrecurrence_layers: applications of the block per step.
    position_start_index: where the position signal starts: None or 0,
      "step" (shifted by length * step / steps) or "random".
    add_or_concat_timing_signal: "add" (the only one provided).
    step_timing_signal_type: "learned" (the only one provided).
    add_position_timing_signal: add a sinusoidal position signal every step.
    add_step_timing_signal: add the learned step signal every step.
    mix_with_transformer_before_ut: plain block applications first.
    mix_with_transformer_after_ut: plain block applications last.
    gates_inputs: highway gates' inputs, letters of "sti".
    gate_ffn_layer: "dense" (the only one provided).
    use_gated_transformer: gate each layer's output ("highway" or "gru"
      gating_type) before the residual.
    gating_type: "highway" or "gru".

  Example:
    >>> stack = UTLayerStack([SelfAttention(), DenseReluDense()], num_rec_steps=6)
  """

  def __init__(self, layers: Sequence, dropout_rate: float = 0.0, norm_epsilon: float = 1e-6,
               num_vanilla_transformer_layers: int = 2,
               couple_carry_transform_gates: bool = True, act_type: str = "basic",
               recurrence_type: str = "basic", act_max_steps: int = 4,
               act_epsilon: float = 0.01, num_rec_steps: int = 4,
               num_inrecurrence_layers: int = 1, position_start_index=None,
               add_or_concat_timing_signal: str = "add",
               step_timing_signal_type: str = "learned",
               add_position_timing_signal: bool = False, add_step_timing_signal: bool = True,
               mix_with_transformer_before_ut: bool = False,
               mix_with_transformer_after_ut: bool = False, gates_inputs: str = "i",
               gate_ffn_layer: str = "dense", use_gated_transformer: bool = False,
               gating_type: str = "highway"):
    checks = [
        ("recurrence_type", recurrence_type, _RECURRENCES),
        ("act_type", act_type, _ACT_TYPES),
        ("gating_type", gating_type, _GATINGS),
        ("add_or_concat_timing_signal", add_or_concat_timing_signal, ("add",)),
        ("step_timing_signal_type", step_timing_signal_type, ("learned",)),
        ("gate_ffn_layer", gate_ffn_layer, ("dense",)),
        ("position_start_index", position_start_index, (None, 0, "step", "random")),
    ]
    for name, value, allowed in checks:
      if value not in allowed:
        raise ValueError(f"UTLayerStack: {name} must be one of {allowed}, got {value!r}.")
    for name, value in (("act_max_steps", act_max_steps), ("num_rec_steps", num_rec_steps),
                        ("num_inrecurrence_layers", num_inrecurrence_layers)):
      if not isinstance(value, int) or value < 1:
        raise ValueError(f"UTLayerStack: {name} must be a positive int, got {value!r}.")
    if recurrence_type == "highway" and (not gates_inputs or set(gates_inputs) - set("sti")):
      raise ValueError(f"UTLayerStack: gates_inputs must be letters of 'sti' (state, "
                       f"transformed, inputs), got {gates_inputs!r}.")
    self._layers = [_make_layer(spec) for spec in layers]
    if not self._layers:
      raise ValueError("UTLayerStack: layers is empty; give the block's layers, e.g. "
                       "[SelfAttention, DenseReluDense].")
    self._dropout_rate = dropout_rate
    self._norm_epsilon = norm_epsilon
    self.num_vanilla_transformer_layers = num_vanilla_transformer_layers
    self.couple_carry_transform_gates = couple_carry_transform_gates
    self.act_type = act_type
    self.recurrence_type = recurrence_type
    self.act_max_steps = act_max_steps
    self.act_epsilon = act_epsilon
    self.num_rec_steps = num_rec_steps
    self.num_inrecurrence_layers = num_inrecurrence_layers
    self.position_start_index = position_start_index
    self.add_or_concat_timing_signal = add_or_concat_timing_signal
    self.step_timing_signal_type = step_timing_signal_type
    self.add_position_timing_signal = add_position_timing_signal
    self.add_step_timing_signal = add_step_timing_signal
    self.mix_with_transformer_before_ut = mix_with_transformer_before_ut
    self.mix_with_transformer_after_ut = mix_with_transformer_after_ut
    self.gates_inputs = gates_inputs
    self.gate_ffn_layer = gate_ffn_layer
    self.use_gated_transformer = use_gated_transformer
    self.gating_type = gating_type

  @property
  def layers(self):
    return list(self._layers)

  @property
  def num_layers(self) -> int:
    return len(self._layers)

  @property
  def _num_steps(self) -> int:
    return self.act_max_steps if self.recurrence_type == "act" else self.num_rec_steps

  # ---- timing signals --------------------------------------------------------
  def get_timing_signal_1d(self, context: Context, length: mtf.Dimension,
                           channels: mtf.Dimension, min_timescale: float = 1.0,
                           max_timescale: float = 1.0e4, start_index=0) -> mtf.Tensor:
    """Sinusoids of the positions (plus start_index): sin in the first half
    of `channels`, cos in the second, timescales geometric from
    min_timescale to max_timescale.

    Example:
      >>> signal = stack.get_timing_signal_1d(context, length_dim, d_model)
    """
    if channels.size % 2:
      raise ValueError(f"UTLayerStack: the position signal needs an even number of "
                       f"channels, got {channels}.")
    position = context.position
    if position is None:
      position = mtf.range(context.mesh, length, tf.int32)
    position = mtf.to_float(position) + start_index
    half = mtf.Dimension(channels.name, channels.size // 2)
    increment = math.log(max_timescale / min_timescale) / max(half.size - 1, 1)
    inv = min_timescale * mtf.exp(mtf.range(context.mesh, half, tf.float32) * -increment)
    scaled = position * inv
    signal = mtf.concat([mtf.sin(scaled), mtf.cos(scaled)], channels.name)
    return mtf.cast(signal, context.activation_dtype)

  def add_position_timing_signal_func(self, context: Context, x: mtf.Tensor,
                                      step: int) -> mtf.Tensor:
    """x plus the position signal, started as position_start_index says.

    Example:
      >>> x = stack.add_position_timing_signal_func(context, x, step=0)
    """
    length = context.length_dim
    if self.position_start_index == "random":
      index = mtf.to_float(mtf.floor(mtf.random_uniform(
          context.mesh, mtf.Shape([]), maxval=float(length.size), name="position_shift")))
    elif self.position_start_index == "step":
      index = float(int(length.size * step / self._num_steps))
    else:
      index = 0.0
    return x + self.get_timing_signal_1d(context, length, context.model.model_dim,
                                         start_index=index)

  def get_layer_timing_signal_learned_1d(self, context: Context, channels: mtf.Dimension,
                                         layer: int, num_layers: int) -> mtf.Tensor:
    """Row `layer` of the learned "layer_embedding" [layer, channels] (normal
    with stddev channels**-0.5), times sqrt(channels).

    Example:
      >>> signal = stack.get_layer_timing_signal_learned_1d(context, d_model, 2, 4)
    """
    layer_dim = mtf.Dimension("layer", num_layers)
    table = mtf.get_variable(
        context.mesh, "layer_embedding", mtf.Shape([layer_dim, channels]),
        initializer=mtf.initializers.random_normal(0.0, channels.size ** -0.5),
        dtype=context.variable_dtype)
    row = mtf.gather(table, layer, layer_dim)
    return row * (channels.size ** 0.5)

  def add_step_timing_signal_func(self, context: Context, x: mtf.Tensor,
                                  step) -> mtf.Tensor:
    """x plus the learned signal of `step` (an int, or a scalar mtf int).

    Example:
      >>> x = stack.add_step_timing_signal_func(context, x, 1)
    """
    steps = self._num_steps + (1 if self.recurrence_type == "act" else 0)
    signal = self.get_layer_timing_signal_learned_1d(context, x.shape.dims[-1], step, steps)
    return x + mtf.cast(signal, x.dtype)

  def step_preprocess(self, context: Context, x: mtf.Tensor, step) -> mtf.Tensor:
    """The timing signals added at the start of a step.

    Example:
      >>> x = stack.step_preprocess(context, x, 0)
    """
    if self.add_step_timing_signal:
      x = self.add_step_timing_signal_func(context, x, step)
    if self.add_position_timing_signal:
      x = self.add_position_timing_signal_func(
          context, x, step if isinstance(step, int) else 0)
    return x

  # ---- the block ---------------------------------------------------------------
  def vanilla_transformer_layer(self, context: Context, x: mtf.Tensor, mask,
                                scope: str = "ut") -> mtf.Tensor:
    """One application of the block's layers (pre-norm residual), with the
    variables of `scope`.

    Example:
      >>> y = stack.vanilla_transformer_layer(context, x, None)
    """
    for lnum, layer in enumerate(self._layers):
      with mtf.name_scope(context.mesh, f"{scope}/layer_{lnum:03d}"):
        norm_x = self._layer_norm(context, x if mask is None else x * mask)
        with mtf.name_scope(context.mesh, getattr(layer, "scope_name", type(layer).__name__)):
          y = layer.call(context, norm_x)
        if y.shape != x.shape:
          raise ValueError(f"UTLayerStack: layer {lnum} ({type(layer).__name__}) returned "
                           f"shape {y.shape} for an input of shape {x.shape}.")
        if self.use_gated_transformer:
          y = self.gating(context, x, y, mask)
        x = x + self._dropout(context, y)
      if context.layer_outputs is not None:
        context.layer_outputs.append(x)
      context.layer_index += 1
    return x

  def ffn_layer_multi_inputs(self, context: Context, mask, inputs_list,
                             ffn_layer_type: str = "dense", kernel_initializer=None,
                             activation=None, preprocess: bool = False,
                             postprocess: bool = False, name: str = "ffn") -> mtf.Tensor:
    """A dense layer (to d_model) of the concatenated, optionally
    layer-normed inputs.

    Example:
      >>> gate = stack.ffn_layer_multi_inputs(context, None, [x], activation=mtf.sigmoid)
    """
    if ffn_layer_type != "dense":
      raise ValueError(f"UTLayerStack: ffn_layer_type must be 'dense', got "
                       f"{ffn_layer_type!r}.")
    d_model = context.model.model_dim
    with mtf.name_scope(context.mesh, name):
      parts = []
      for i, inputs in enumerate(inputs_list):
        if preprocess:
          with mtf.name_scope(context.mesh, f"input_{i}"):
            inputs = self._layer_norm(context, inputs if mask is None else inputs * mask)
        parts.append(mtf.rename_dimension(inputs, d_model.name, "gate_inputs"))
      joined = parts[0] if len(parts) == 1 else mtf.concat(parts, "gate_inputs")
      output = mtf.layers.dense(
          joined, new_dims=[d_model], reduced_dims=[joined.shape.dims[-1]],
          activation=activation, use_bias=True, variable_dtype=context.variable_dtype,
          kernel_initializer=kernel_initializer, name="dense")
      if postprocess:
        output = self._layer_norm(context, output if mask is None else output * mask)
      return output

  def gating(self, context: Context, x: mtf.Tensor, transformed_x: mtf.Tensor,
             mask) -> mtf.Tensor:
    """Gated combination of a layer's input and output ("highway" or "gru").

    Example:
      >>> y = stack.gating(context, x, layer_output, None)
    """
    gate = lambda inputs, name: self.ffn_layer_multi_inputs(  # noqa: E731
        context, mask, inputs, self.gate_ffn_layer, activation=mtf.sigmoid,
        preprocess=True, name=name)
    if self.gating_type == "highway":
      transform = gate([x], "transform_gate")
      carry = gate([x], "carry_gate")
      return x * carry + transformed_x * transform
    update = gate([x, transformed_x], "update_gate")
    reset = gate([x, transformed_x], "reset_gate")
    candidate = gate([reset * x, transformed_x], "candidate")
    return (1.0 - update) * transformed_x + update * candidate

  # ---- recurrences -------------------------------------------------------------
  def ut_basic(self, context: Context, x: mtf.Tensor, mask) -> mtf.Tensor:
    """num_rec_steps applications of the block.

    Example:
      >>> y = stack.ut_basic(context, x, None)
    """
    for step in range(self.num_rec_steps):
      x = self.step_preprocess(context, x, step)
      for _ in range(self.num_inrecurrence_layers):
        x = self.vanilla_transformer_layer(context, x, mask)
    return x

  def ut_highway(self, context: Context, layer_inputs, mask) -> mtf.Tensor:
    """num_rec_steps highway-gated applications; layer_inputs is
    (state, inputs, memory).

    Example:
      >>> y = stack.ut_highway(context, (x, x, x), None)
    """
    state, inputs, _ = layer_inputs
    for step in range(self.num_rec_steps):
      new_state = self.step_preprocess(context, state, step)
      for _ in range(self.num_inrecurrence_layers):
        new_state = self.vanilla_transformer_layer(context, new_state, mask)
      gate_inputs = [{"s": state, "t": new_state, "i": inputs}[c] for c in self.gates_inputs]
      transform = self.ffn_layer_multi_inputs(context, mask, gate_inputs, self.gate_ffn_layer,
                                              activation=mtf.sigmoid, preprocess=True,
                                              name="highway_transform_gate")
      if self.couple_carry_transform_gates:
        carry = 1.0 - transform
      else:
        carry = self.ffn_layer_multi_inputs(context, mask, gate_inputs, self.gate_ffn_layer,
                                            activation=mtf.sigmoid, preprocess=True,
                                            name="highway_carry_gate")
      state = state * carry + new_state * transform
    return state

  def act_layer(self, context: Context, x: mtf.Tensor, mask) -> mtf.Tensor:
    """Adaptive computation time: per-position halting over up to
    act_max_steps + 1 steps; returns the halting-weighted state.

    Example:
      >>> y = stack.act_layer(context, x, None)
    """
    threshold = 1.0 - self.act_epsilon
    d_model = x.shape.dims[-1]
    update_shape = x.shape - [d_model]
    if self.act_type == "global":
      update_shape = mtf.Shape(update_shape.dims[:1])
    dtype = x.dtype
    halting = mtf.zeros(context.mesh, update_shape, dtype=dtype)
    remainders = mtf.zeros(context.mesh, update_shape, dtype=dtype)
    n_updates = mtf.zeros(context.mesh, update_shape, dtype=dtype)
    previous = mtf.zeros_like(x)
    state = x
    for step in range(self.act_max_steps + 1):
      state = self.step_preprocess(context, state, step)
      if self.act_type == "random":
        p = mtf.cast(mtf.random_uniform(context.mesh, update_shape, name="act_random"), dtype)
      else:
        with mtf.name_scope(context.mesh, "sigmoid_activation_for_pondering"):
          p = mtf.layers.dense(state, new_dims=[mtf.Dimension("halt", 1)],
                               reduced_dims=[d_model], activation=mtf.sigmoid, use_bias=True,
                               variable_dtype=context.variable_dtype, name="dense")
        p = mtf.reshape(p, x.shape - [d_model])
        if self.act_type == "global":
          p = mtf.reduce_mean(p, output_shape=update_shape)
      running = mtf.cast(mtf.less(halting, 1.0), dtype)
      new_halted = mtf.cast(mtf.greater(halting + p * running, threshold), dtype) * running
      running = mtf.cast(mtf.less_equal(halting + p * running, threshold), dtype) * running
      halting = halting + p * running
      remainders = remainders + new_halted * (1.0 - halting)
      halting = halting + new_halted * remainders
      n_updates = n_updates + running + new_halted
      weights = p * running + new_halted * remainders
      for _ in range(self.num_inrecurrence_layers):
        state = self.vanilla_transformer_layer(context, state, mask)
      if self.act_type == "accumulated":
        previous = state * weights + previous
      else:
        previous = state * weights + previous * (1.0 - weights)
    self.ponder_times = n_updates
    return previous

  def call(self, context: Context, x: mtf.Tensor) -> mtf.Tensor:
    mask = context.nonpadding
    x = _record_layer_output(context, self._dropout(context, x))
    if self.mix_with_transformer_before_ut:
      for i in range(self.num_vanilla_transformer_layers):
        x = self.vanilla_transformer_layer(context, x, mask, scope=f"before_ut_{i}")
    if self.recurrence_type == "act":
      x = self.act_layer(context, x, mask)
    elif self.recurrence_type == "basic":
      x = self.ut_basic(context, x, mask)
    else:
      x = self.ut_highway(context, (x, x, x), mask)
    if self.mix_with_transformer_after_ut:
      for i in range(self.num_vanilla_transformer_layers):
        x = self.vanilla_transformer_layer(context, x, mask, scope=f"after_ut_{i}")
    x = self._layer_norm(context, x, name="final_layer_norm")
    x = self._dropout(context, x)
    if mask is not None:
      x = x * mask
    return _record_layer_output(context, x)

  def _dropout(self, context: Context, x: mtf.Tensor) -> mtf.Tensor:
    if not context.train or not self._dropout_rate:
      return x
    return mtf.dropout(x, True, rate=self._dropout_rate,
                       noise_shape=mtf.Shape(list(context.batch_dims) +
                                             [context.model.model_dim]))

  def _layer_norm(self, context: Context, x: mtf.Tensor,
                  name: Optional[str] = None) -> mtf.Tensor:
    return mtf.layers.layer_norm(x, context.model.model_dim, self._norm_epsilon,
                                 name=name or "layer_prepostprocess")

