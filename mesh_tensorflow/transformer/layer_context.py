"""What every transformer layer sees: the `TransformerLayer` base class, the
`Context` passed to each layer call (mode, positions, packing ids, decoding
caches, the list of auxiliary losses), the `ModeKeys`, and
`gin_configurables`, the gin-aware classes once gin_config registered them.

`layer_stack` and `transformer` re-export these names.

    >>> ctx = Context(model, mesh, [batch], length, mtf.VariableDType(), losses=[])
    >>> ctx.mode, ctx.train
    ('train', True)
"""

from __future__ import annotations

import sys
from typing import Any, Dict, List, Optional, Sequence

import tensorflow as tf

import mesh_tensorflow as mtf

EOS_ID = 1


def inputs_prefix_mask(targets: mtf.Tensor) -> mtf.Tensor:
  """For "[inputs] EOS [targets] EOS" examples: true up to the first EOS.

  Example:
    >>> mask = inputs_prefix_mask(targets)   # bool [batch, length]
  """
  length_dim = targets.shape.dims[-1]
  eos_before = mtf.cumsum(mtf.to_int32(mtf.equal(targets, EOS_ID)), length_dim, exclusive=True)
  return mtf.equal(eos_before, 0)


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

  @property
  def name(self) -> Optional[str]:
    """The layer's slot scope in its stack ("block_000/layer_001"), as
    `make_layer_stack` sets it; None for a layer not placed by it."""
    value = self.__dict__.get("_name")
    return value if isinstance(value, str) else None

  def set_name(self, name: Optional[str]) -> None:
    """Sets the slot scope (`make_layer_stack` calls it)."""
    self._name = name


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
    layer_outputs: a list collecting the activations after each layer (a new
      empty list when not given; a pipelined stack runs
      its stages concurrently only when no list was given).
    encoder_output: [batch..., memory_length, d_model] for decoders.
    encoder_sequence_id: segment ids [batch..., memory_length] of the encoder.
    constant_states: values computed once in first_part mode and read in
      every incremental step (e.g. the keys of the encoder output).
    shared_params: variables shared between encoder and decoder.
    encoder_layer_outputs: the encoder's layer outputs, read-only.
    write_priority: int [length]; with read_priority, position q may attend
      to memory position m iff read_priority[q] >= write_priority[m].
    read_priority: int, like write_priority.
    inputs: the model's input ids [batch..., length], for layers that read
      them.
    encoder_inputs: the encoder's input ids, for decoder layers.
    num_microbatches: how many micro-batches the step is cut into (for
      layers whose statistics depend on it).

  A LayerStack also sets `layer_index` (the number of layers run so far)
  and, while the sublayers of one layer run (stacks given sublayer lists),
  `current_layer` and `current_layer_input` (None otherwise).

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
               encoder_layer_outputs=None, write_priority=None, read_priority=None,
               inputs=None, encoder_inputs=None, num_microbatches: int = 1):
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
    self.layer_outputs = layer_outputs if layer_outputs is not None else []
    self.layer_outputs_requested = layer_outputs is not None
    self.encoder_output = encoder_output
    self.encoder_sequence_id = encoder_sequence_id
    self.constant_states = constant_states
    self.next_constant_state = 0
    self.shared_params = shared_params if shared_params is not None else {}
    self.encoder_layer_outputs = encoder_layer_outputs
    self.write_priority = write_priority
    self.read_priority = read_priority
    self.inputs = inputs
    self.encoder_inputs = encoder_inputs
    self.num_microbatches = num_microbatches
    self.layer_index = 0
    self.current_layer = None
    self.current_layer_input = None
    self.cache: Dict[Any, Any] = {}
    # Set by LayerStack(recompute="selective"): recompute_attention(fn, inputs)
    # computes fn(*inputs) and recomputes it in the backward pass.
    self.recompute_attention = None

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


def gin_configurables() -> dict:
  """The gin-aware model classes and functions by name once gin_config
  registered them ({} before: the model library itself never imports gin)."""
  gin_config = sys.modules.get("mesh_tensorflow.transformer.gin_config")
  return gin_config.CONFIGURABLES if gin_config is not None else {}
