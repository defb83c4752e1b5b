"""Pipeline parallelism of a `LayerStack`: its layers cut into stages (and,
with the interleaved schedule, each stage into layer chunks) run by
`mtf.pipeline`, and decoding with a pipelined stack. `LayerStack` inherits
this mixin; layer_stack.py documents the behaviour.

    >>> stack = make_layer_stack([SelfAttention, DenseReluDense], num_layers=4,
    ...                          num_stages=2, num_microbatches=4,
    ...                          pipeline_schedule="interleaved", virtual_stages=2)
    >>> stack.layers_per_chunk
    2
"""

from __future__ import annotations

import copy
import functools

import numpy as np
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer.layer_context import Context, ModeKeys, inputs_prefix_mask

# Context attributes that may hold per-example tensors [batch..., length].
_PER_EXAMPLE_CONTEXT = ("sequence_id", "position", "read_priority", "write_priority")

# What no pipelined stack runs (the planner reports the same lines for a
# stack it saw do either without a pipeline: `pipeline_refusal`).
ENCODER_OUTPUT_REFUSAL = (
    "LayerStack: a pipelined stack cannot attend to an encoder output yet "
    "(encoder-decoder decoders); pipeline the encoder or a decoder-only model, "
    "or set num_stages=1 for this stack.")
AUXILIARY_LOSS_REFUSAL = (
    "LayerStack: a pipelined stack's layers must not add auxiliary losses "
    "(mixture of experts, attention z-loss): they would be computed on the pipeline's idle "
    "ticks too. Set num_stages=1 for this stack.")


class PipelinedStack:
  """The pipelining half of `LayerStack` (needs its `_layers`,
  `_apply_layers`, `_dropout`, `_to_stream`, `_to_whole`, `finish` and `_slot_name`)."""

  num_stages: int = 1
  virtual_stages: int = 1

  def _check_pipeline(self, num_stages, num_microbatches, schedule, virtual_stages=1):
    if num_stages < 1 or num_microbatches < 1 or virtual_stages < 1:
      raise ValueError(f"LayerStack: num_stages ({num_stages}), num_microbatches "
                       f"({num_microbatches}) and virtual_stages ({virtual_stages}) must be "
                       "positive.")
    if schedule not in mtf.pipeline.SCHEDULES:
      raise ValueError(f"LayerStack: pipeline_schedule must be one of "
                       f"{mtf.pipeline.SCHEDULES}, got {schedule!r}.")
    if virtual_stages > 1 and schedule != "interleaved":
      raise ValueError(f"LayerStack: virtual_stages={virtual_stages} needs "
                       f"pipeline_schedule='interleaved' (got {schedule!r}).")
    if num_stages == 1:
      return
    n = len(self._layers)
    period = self.block_size
    blocks = n // period
    if blocks == 1 and period > 1:
      i = next(i for i, layer in enumerate(self._layers) if not _same_layer(layer,
                                                                           self._layers[0]))
      raise ValueError(
          f"LayerStack: pipeline stages must have the same layers, but the stack repeats no "
          f"block of layers (layer {i}, {type(self._layers[i]).__name__}, differs from layer "
          f"0, {type(self._layers[0]).__name__}). Repeat one block of layers "
          "(make_layer_stack) at least num_stages times.")
    chunks = num_stages * virtual_stages
    if blocks < chunks:
      what = (f"num_stages={num_stages} x virtual_stages={virtual_stages} = {chunks}"
              if virtual_stages > 1 else f"num_stages={num_stages}")
      raise ValueError(f"LayerStack: {what} is more than the stack's {blocks} blocks of "
                       f"{period} layers; use at most {blocks} "
                       f"{'layer chunks' if virtual_stages > 1 else 'stages'}.")
    if schedule == "interleaved" and num_microbatches % num_stages:
      raise ValueError(f"LayerStack: the interleaved schedule needs num_microbatches "
                       f"({num_microbatches}) to be a multiple of num_stages ({num_stages}).")

  # The layers and the pipeline's sizes are set once, in the constructor:
  # these two are computed once (init_name_fn asks for each stacked row).
  @functools.cached_property
  def block_size(self) -> int:
    """Layers of the block the stack repeats (the shortest period of its
    layers' types and hyperparameters): stages hold whole blocks."""
    return _period(self._layers)

  @functools.cached_property
  def chunk_block_counts(self) -> tuple:
    """Blocks each layer chunk runs (chunk c = v S + s is stage s's chunk v;
    without virtual stages a chunk is a stage). B blocks on C chunks:
    ceil(B / C) each, the last C ceil(B / C) - B chunks one fewer (their
    unused slot is a padding block: computed, masked out, its variables
    never trained)."""
    chunks = self.num_stages * self.virtual_stages
    blocks = len(self._layers) // self.block_size
    most = -(-blocks // chunks)
    lighter = chunks * most - blocks
    return tuple(most - (c >= chunks - lighter) for c in range(chunks))

  @property
  def stage_block_counts(self) -> tuple:
    """Blocks each stage runs (over its layer chunks)."""
    counts, s_count = self.chunk_block_counts, self.num_stages
    return tuple(sum(counts[v * s_count + s] for v in range(self.virtual_stages))
                 for s in range(s_count))

  @property
  def layers_per_chunk(self) -> int:
    """Layer slots of a stage's chunk, the layers it runs at a time: the
    busiest chunk's layers (every chunk's when the chunks divide the blocks
    evenly)."""
    return max(self.chunk_block_counts) * self.block_size

  @property
  def layers_per_stage(self) -> int:
    """Layer slots of each stage: layers_per_chunk x virtual_stages."""
    return self.layers_per_chunk * self.virtual_stages

  def _chunk_first_layer(self, chunk: int) -> int:
    """The unpipelined index of layer chunk `chunk`'s first layer."""
    return sum(self.chunk_block_counts[:chunk]) * self.block_size

  def stages_dim(self) -> mtf.Dimension:
    """The dimension the stage variables are stacked along."""
    return mtf.Dimension(self.stages_dim_name, self.num_stages)

  @property
  def pipelined(self) -> bool:
    return self.num_stages > 1

  # Set by the last call without a pipeline: why this stack could not run
  # pipelined (one of the refusals above), or None.
  pipeline_refusal: str | None = None

  def _note_pipeline_refusal(self, context: Context, losses_before: int) -> None:
    """After running the layers without a pipeline: records whether a
    pipeline would refuse what they did (`pipeline_refusal`)."""
    if isinstance(context.encoder_output, mtf.Tensor):
      self.pipeline_refusal = ENCODER_OUTPUT_REFUSAL
    elif context.losses is not None and len(context.losses) > losses_before:
      self.pipeline_refusal = AUXILIARY_LOSS_REFUSAL
    else:
      self.pipeline_refusal = None

  def _runs_pipelined(self, context: Context) -> bool:
    """Whether `call` runs the GPipe schedule (the interleaved one runs only
    inside `pipeline_loss`; its stacks run chunk after chunk otherwise)."""
    return (self.virtual_stages == 1
            and context.mode in (ModeKeys.TRAIN, ModeKeys.EVAL, ModeKeys.PREDICT)
            and not getattr(context, "layer_outputs_requested", True))

  def _stage_context(self, context: Context, h: mtf.Tensor, carried_names,
                     carried_values) -> Context:
    """The context layers see inside a stage: per-example tensors of the
    stage's micro-batches, batch dimensions [stages, micro-batch]."""
    sub = copy.copy(context)
    for name, value in zip(carried_names, carried_values):
      setattr(sub, name, value)
    names = {b.name for b in context.batch_dims}
    sub.batch_dims = [d for d in h.shape.dims if d.name in names | {self.stages_dim_name}]
    sub.cache = dict(context.cache)
    sub.losses = [] if context.losses is not None else None
    return sub

  def _carried(self, context: Context, batch_dim: mtf.Dimension):
    """Context tensors with a batch dimension: moved through the pipeline
    along with the activations."""
    names, values = [], []
    for name in _PER_EXAMPLE_CONTEXT:
      value = getattr(context, name)
      if isinstance(value, mtf.Tensor) and batch_dim in value.shape.dims:
        names.append(name)
        values.append(value)
    if isinstance(context.encoder_output, mtf.Tensor):
      raise ValueError(ENCODER_OUTPUT_REFUSAL)
    return names, values

  def _stage_fn(self, context: Context, names):
    k = self.layers_per_chunk
    layers = self._layers[:k]

    def stage_fn(h, *carried):
      sub = self._stage_context(context, h, names, carried)
      with mtf.name_scope(context.mesh, "pipeline"):
        out = self._apply_layers(sub, h, layers, 0, gates=self._padding_gates(context))
      if sub.losses:
        raise ValueError(AUXILIARY_LOSS_REFUSAL)
      return out
    return stage_fn

  def _padding_gates(self, context: Context):
    """With uneven stages, per block slot of a stage: None where every stage
    runs the slot, else a [stages] bool constant, false on the stages whose
    slot is padding (the block's output is replaced by its input there)."""
    counts = self.chunk_block_counts
    if min(counts) == max(counts):
      return None
    # The chunk each stage runs in this call (the interleaved schedule says).
    chunks = mtf.pipeline.stage_chunks(context.mesh.graph) or range(self.num_stages)
    dim = self.stages_dim()
    return [None if b < min(counts) else
            mtf.constant(context.mesh, np.array([counts[c] > b for c in chunks]),
                         mtf.Shape([dim]), dtype=tf.bool)
            for b in range(max(counts))]

  def init_name_fn(self, context: Context):
    """Maps a stacked variable's name and a stage (with virtual stages: a
    layer chunk) to the unpipelined name of that layer (its initial
    value)."""
    scope = "pipeline/layer_"

    def fn(name, stage):
      i = name.find(scope)
      if i < 0:
        return f"{name}/stage_{stage}"
      j = int(name[i + len(scope):i + len(scope) + 3])
      if j >= self.chunk_block_counts[stage] * self.block_size:  # a padding slot
        return f"{name}/stage_{stage}"
      index = self._chunk_first_layer(stage) + j
      return name[:i] + self._slot_name(index) + name[i + len(scope) + 3:]
    return fn

  def _call_pipelined(self, context: Context, x: mtf.Tensor) -> mtf.Tensor:
    batch_dim = _batch_dim(context, x)
    names, values = self._carried(context, batch_dim)
    y, stats = mtf.pipeline.pipeline(
        self._stage_fn(context, names), x, self.stages_dim(), self.num_microbatches,
        carried=values, batch_dim=batch_dim, init_name_fn=self.init_name_fn(context),
        return_stats=True)
    self.pipeline_stats = stats
    context.layer_index += len(self._layers)
    return y

  def schedules_loss(self, context: Context) -> bool:
    """Whether the model should hand its loss to `logits_and_loss` (a
    pipelined 1F1B stack in training)."""
    return (self.pipelined and self.pipeline_schedule != "gpipe" and context.train
            and not getattr(context, "layer_outputs_requested", True)
            and context.losses is not None)

  def logits_and_loss(self, context: Context, x: mtf.Tensor, logits_fn, targets: mtf.Tensor):
    """Logits and cross-entropy loss of a Unitransformer whose stack runs the
    1F1B schedule: the stack, the final norm, logits_fn(y) -> logits and the
    loss of each micro-batch run inside the schedule. The loss is the
    model's: cross-entropy (label smoothing, z-loss) summed over non-padding
    target tokens, over their count in the whole batch (or
    loss_denominator).

    Returns:
      (logits [batch..., length, vocab], scalar loss).
    """
    model = context.model
    if getattr(model, "_loss_fn", None) is not None:
      raise ValueError(f"LayerStack: pipeline_schedule={self.pipeline_schedule!r} computes "
                       "the model's cross-entropy per micro-batch and cannot use a custom "
                       "loss_fn; use pipeline_schedule='gpipe'.")
    vocab_dim = model.output_vocab_dim
    weights = mtf.layers.weights_nonzero(targets, dtype=context.activation_dtype)
    if model.loss_on_targets_only:
      weights = weights * mtf.cast(mtf.logical_not(inputs_prefix_mask(targets)),
                                   weights.dtype)
    if model.loss_denominator is not None:
      inverse = mtf.constant(context.mesh, 1.0 / float(model.loss_denominator), dtype=tf.float32)
    else:
      inverse = 1.0 / mtf.maximum(mtf.reduce_sum(weights), 1.0)
    inverse = mtf.cast(mtf.stop_gradient(inverse), context.activation_dtype)

    def loss_fn(_, y, t, w):
      logits = logits_fn(y)
      xent = mtf.layers.softmax_cross_entropy_with_logits(
          logits, t, vocab_dim, z_loss=model.z_loss, label_smoothing=model.label_smoothing)
      return mtf.reduce_sum(mtf.cast(xent, w.dtype) * w) * inverse, logits
    loss, logits = self.pipeline_loss(context, x, loss_fn, [targets, weights])
    return logits, loss

  def pipeline_loss(self, context: Context, x: mtf.Tensor, loss_fn, loss_inputs=()):
    """Runs the stack and loss_fn on each micro-batch inside the schedule
    (`mtf.pipeline.pipeline_loss`) and returns its result.

    loss_fn(context, y, *loss_inputs_mb) gets the stack's output y (after the
    final norm) of one micro-batch and that micro-batch's rows of
    loss_inputs, and returns a scalar or (scalar, per-example tensor); the
    scalars are summed over micro-batches, so a mean over the batch must
    divide by the whole batch's count.
    """
    batch_dim = _batch_dim(context, x)
    names, values = self._carried(context, batch_dim)
    x = self._dropout(context, x)
    x = self._to_stream(context, x)
    sub_ctx = copy.copy(context)

    def head(y, *ins):
      n = len(names)
      for name, value in zip(names, ins[:n]):
        setattr(sub_ctx, name, value)
      y = self._to_whole(sub_ctx, y)
      return loss_fn(sub_ctx, self.finish(sub_ctx, y), *ins[n:])
    *result, stats = mtf.pipeline.pipeline_loss(
        self._stage_fn(context, names), head, x, self.stages_dim(), self.num_microbatches,
        schedule=self.pipeline_schedule, carried=values, loss_inputs=values + list(loss_inputs),
        batch_dim=batch_dim, init_name_fn=self.init_name_fn(context), return_stats=True,
        virtual_stages=self.virtual_stages)
    self.pipeline_stats = stats
    context.layer_index += len(self._layers)
    return result[0] if len(result) == 1 else tuple(result)

  def _call_stages_in_turn(self, context: Context, x: mtf.Tensor) -> mtf.Tensor:
    """Decoding with a pipelined stack (and, with virtual stages, evaluating):
    stage after stage (layer chunk after chunk), whole batch."""
    k = self.layers_per_chunk
    layers = self._layers[:k]
    sv = mtf.pipeline.StageVariables(context.mesh, self.stages_dim(),
                                     self.init_name_fn(context), self.virtual_stages)
    probe = copy.copy(context)
    probe.new_states, probe.constant_states = [], []
    probe.losses = [] if context.losses is not None else None
    probe.cache = dict(context.cache)
    probe.next_constant_state = context.next_constant_state

    def run(ctx, x, count=k):
      with mtf.name_scope(context.mesh, "pipeline"):
        return self._apply_layers(ctx, x, layers[:count], 0)
    sv.discover(run, probe, x)
    for s in range(self.num_stages * self.virtual_stages):
      with sv.stage(s):
        x = run(context, x, self.chunk_block_counts[s] * self.block_size)
    return x




def _hyperparameters(layer) -> dict:
  """A layer's attributes without its slot name."""
  return {k: v for k, v in vars(layer).items() if k != "_name"}


def _same_layer(a, b) -> bool:
  return type(a) is type(b) and _hyperparameters(a) == _hyperparameters(b)


def _period(layers) -> int:
  """The length of the shortest block whose repeats make up `layers`."""
  n = len(layers)
  for p in range(1, n):
    if n % p == 0 and all(_same_layer(layers[i], layers[i % p]) for i in range(p, n)):
      return p
  return max(n, 1)


def _batch_dim(context: Context, x: mtf.Tensor) -> mtf.Dimension:
  """The dimension of x that micro-batches split: "batch" (not an outer
  batch dimension before it: run.outer_batch_size), else the first batch
  dimension x has, else its first."""
  present = [d for d in context.batch_dims if d in x.shape.dims]
  named = [d for d in present if d.name == "batch"]
  return (named or present or x.shape.dims[:1])[0]

from mesh_tensorflow.core import autograph_exempt as _autograph_exempt  # noqa: E402  pylint: disable=g-import-not-at-top
_autograph_exempt.exempt(globals())  # AutoGraph leaves this module's code alone
