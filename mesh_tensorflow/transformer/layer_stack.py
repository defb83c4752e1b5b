"""The layer stack of a transformer and what its layers see: the
`TransformerLayer` base class, the `Context` passed to every layer, the
pre-norm residual `LayerStack` (or one built from sublayer functions,
sublayers.py) and `make_layer_stack`.

The base class and the context live in layer_context.py; this module
re-exports them. Import them from `transformer` (which re-exports them too)
or from here.

    >>> stack = make_layer_stack([SelfAttention(num_heads=8),
    ...                           DenseReluDense(hidden_size=2048)], num_layers=6)
    >>> ctx = Context(model, mesh, [batch], length, mtf.VariableDType(), losses=[])
    >>> y = stack.call(ctx, x)
"""

from __future__ import annotations

import copy
import re

from absl import logging
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import sequence_parallel as sp_lib
from mesh_tensorflow.transformer import sublayers as sublayers_lib
from mesh_tensorflow.transformer.stack_pipelining import PipelinedStack
from mesh_tensorflow.transformer.layer_context import (  # noqa: F401 (re-exported)
    EOS_ID, Context, ModeKeys, TransformerLayer, gin_configurables, inputs_prefix_mask)


RECOMPUTE_POLICIES = ("none", "layer", "selective", "projections")


def configured_with_custom_sublayers() -> bool:
  """Whether the parsed gin config gives a layer stack (in any scope) its own
  sublayer lists (`LayerStack.sublayers_initial`, `_per_layer` or `_final`),
  which recompute whole layers or nothing: not recompute="selective".

  Example:
    >>> gin_config.parse([], ["LayerStack.sublayers_initial = []"])
    >>> configured_with_custom_sublayers()
    True
  """
  import gin  # pylint: disable=g-import-not-at-top
  return re.search(r"(?m)^[\w/.]*(LayerStack|make_layer_stack)\.sublayers_(initial|per_layer|final)"
                   r"\s*=", gin.config_str()) is not None


def configured_own_stack() -> Optional[str]:
  """The binding that gives the model a layer stack of its own
  (`build_model.decoder_layer_stack = @UTLayerStack()`, the encoder's
  likewise), which `make_layer_stack`'s pipeline and recomputation settings
  do not reach; None when the stacks are make_layer_stack's.

  Example:
    >>> gin_config.parse(["models/tiny_universal_lm.gin"])
    >>> configured_own_stack()
    'build_model.decoder_layer_stack = @universal_transformer.UTLayerStack()'
  """
  import gin  # pylint: disable=g-import-not-at-top
  for match in re.finditer(r"(?m)^[\w/.]*build_model\.(?:en|de)coder_layer_stack\s*=\s*(.+)$",
                           gin.config_str()):
    value = match.group(1).strip()
    if value != "None" and "make_layer_stack" not in value:  # scoped ones too
      return match.group(0).strip()
  return None


class LayerStack(PipelinedStack, TransformerLayer):
  """Layers with pre-normalization residual connections and a final norm.

  For each layer: x = x + dropout(layer(norm(x))); then the output is
  dropout(norm(x)). Norms are RMS norms with a learned scale over d_model
  ("rms", as T5) or layer norms ("layer"). Padding positions (sequence_id 0)
  are zeroed before each norm and at the end.

  Variable names are the original's: a layer's variables live under its
  name (`make_layer_stack` names them "block_%03d/layer_%03d", the layer
  counted within its block) or, for layers without one, "layer_%03d", then
  "<LayerClass>"; the norms are "<layer>/rms_norm/scale" and the final one
  "rms_norm/scale" at the stack's scope. With both `dropout_rate` and
  `norm_epsilon` given (the legacy mode of T5 v1.0 checkpoints) they are
  "<layer>/layer_norm/scale" and "final_layer_norm/scale" instead, and
  sublayer lists are ignored (with a warning). A
  "layer" norm_type keeps the legacy names.

  Activation recomputation (`recompute`, training only):

  * "none": the backward pass reads the activations kept from the forward.
  * "layer": each layer (norm, layer, dropout, residual) is wrapped in
    `mtf.recompute_grad`: only its input is kept, and its forward runs again
    in the backward pass.
  * "selective": only the cheap parts are recomputed: the norms, and in
    attention layers the scores, softmax and weighted sum (the
    [batch, heads, length, memory_length] tensors, the largest activations
    at long lengths); the outputs of the projections (matmuls with weights)
    are kept.
  * "projections": each layer is recomputed as with "layer", but the outputs
    of its projections (matrix products without batch dimensions,
    `mtf.product_without_batch_dims`) are kept and read again rather than
    computed again: the backward pass reruns the norms, activations,
    dropout and the attention's scores, softmax and weighted sum (JAX's
    `dots_with_no_batch_dims_saveable` policy, MaxText's "minimal").

  Layers that add auxiliary losses (a mixture of experts' balancing loss) are
  recomputed like the others: the losses leave the recomputed layer as
  further outputs, so their gradients reach the layer's weights.

  Sequence parallelism (`sequence_parallel=True`, see sequence_parallel.py):
  between the layers the residual stream's length is named
  "residual_length", which a rule such as `residual_length:model` splits;
  `sequence_parallel="d_model"` names its d_model "residual_d_model" instead
  (rule `residual_d_model:model`), for lengths the mesh dimension does not
  divide.

  Pipeline parallelism (`num_stages` > 1): the layers are cut into
  num_stages stages of equal structure, whose variables are stacked along a
  "stages" dimension (variables "pipeline/layer_%03d/..." of shape
  [stages, ...], layer j of stage s being the unpipelined layer
  s * layers_per_stage + j, initialized like it); lay the stages out with a
  rule such as "stages:pp". Stages hold whole blocks (the shortest block of
  layers the stack repeats); where num_stages does not divide the blocks,
  the last stages (with virtual stages: layer chunks) hold one block fewer
  (`chunk_block_counts`; layer j of chunk c is then the unpipelined layer
  after the layers of the chunks before it) and run a padding block in its
  slot, masked out. In train, eval and infer modes the batch is cut
  into num_microbatches micro-batches scheduled by `mtf.pipeline.pipeline`
  (GPipe); with `pipeline_schedule="1f1b"` a model that supports it
  (`Unitransformer`) computes the loss inside the schedule with
  `mtf.pipeline.pipeline_loss`; `pipeline_schedule="interleaved"` with
  `virtual_stages` V > 1 does the same with each stage's layers cut into V
  chunks (variables [virtual_stages, stages, ...]; chunk v S + s, stage s's
  chunk v, holds the unpipelined layers from (v S + s) * layers_per_chunk
  on), which shrinks the bubble V times (stacks of that schedule run chunk
  after chunk, unpipelined, outside training). Decoding ("first_part",
  "incremental") and `layer_outputs` run the stages one after another on
  the whole batch. stack_pipelining.py holds this part of the stack.

  Sublayers (a configurable body): given any of
  `sublayers_initial`, `sublayers_per_layer` and `sublayers_final` (lists of
  functions called as `s(x, layer_stack, context)`, see sublayers.py), the
  stack runs the initial sublayers in order; then for each layer, in its
  slot scope (`layer_scope`) with `context.current_layer` and
  `context.current_layer_input` set, its per-layer sublayers in order (their
  result must keep x's shape); then the final sublayers and the padding mask.
  A list not given is the default: [sublayer_dropout];
  [sublayer_rms_norm, sublayer_call_layer, sublayer_dropout,
  sublayer_residual]; [sublayer_rms_norm, sublayer_dropout]. Then
  `dropout_rate` and `norm_epsilon` serve only `sublayer_legacy_dropout` and
  `sublayer_legacy_*rms_norm` (which rebuild the built-in body's variables),
  `norm_type` must be "rms", `recompute` "none", "layer" or "projections"
  (each layer's sublayers are recomputed) and `num_stages` 1.

  After `call`, `recompute_ops` lists the `recompute_grad` operations the
  stack created, as (policy, op) pairs: what a cost model reads to know
  which activations are not kept for the backward pass (every tensor made
  inside such an op's function, i.e. between its inputs and its outputs).

  Args:
    layers: TransformerLayer instances, called in order.
    dropout_rate: dropout on the embeddings, every residual branch and the
      output (training only).
    norm_epsilon: added to the mean square before the reciprocal root.
    norm_type: "rms" or "layer".
    recompute: "none", "layer", "selective" or "projections" (see above).
    recompute_layers: with recompute other than "none", how many
      blocks (the repeated block of layers: one transformer layer of
      make_layer_stack's num_layers) at the start of each pipeline chunk,
      or of the stack without a pipeline, are recomputed; the others keep
      all their activations (Megatron-LM's --recompute-method=block
      --recompute-num-layers). None: every block.
    num_stages: pipeline stages (1: no pipelining).
    num_microbatches: micro-batches per batch when pipelining.
    pipeline_schedule: "gpipe", "1f1b" or "interleaved".
    stages_dim_name: the name of the stages dimension (for layout rules).
    sublayers_initial: sublayer functions run before the first layer (see
      above; None: the built-in body, or the default list if another list
      is given).
    sublayers_per_layer: sublayer functions run for each layer.
    sublayers_final: sublayer functions run after the last layer.
    recompute_grads: the original's switch: True means recompute="layer".
    sequence_parallel: True or "length": name the stream's length
      "residual_length" between the layers; "d_model": name its d_model
      "residual_d_model" (see above; `context.layer_outputs` then have that
      dimension).
    virtual_stages: layer chunks per stage with the interleaved schedule.

  Example:
    >>> stack = LayerStack([SelfAttention(), DenseReluDense()], dropout_rate=0.1)
    >>> rezero = LayerStack([SelfAttention(), DenseReluDense()], sublayers_per_layer=[
    ...     sublayer_call_layer, sublayer_rezero, sublayer_residual])
    >>> deep = make_layer_stack([SelfAttention, DenseReluDense], num_layers=4,
    ...                         num_stages=4, num_microbatches=8, recompute="layer")
  """

  def __init__(self, layers: Sequence[TransformerLayer],
               sublayers_initial: Optional[Sequence[sublayers_lib.Sublayer]] = None,
               sublayers_per_layer: Optional[Sequence[sublayers_lib.Sublayer]] = None,
               sublayers_final: Optional[Sequence[sublayers_lib.Sublayer]] = None,
               dropout_rate: Optional[float] = None, norm_epsilon: Optional[float] = None,
               recompute_grads: bool = False, norm_type: str = "rms", recompute: str = "none",
               num_stages: int = 1, num_microbatches: int = 1,
               pipeline_schedule: str = "gpipe", stages_dim_name: str = "stages",
               sequence_parallel: Union[bool, str] = False, virtual_stages: int = 1,
               recompute_layers: Optional[int] = None):
    if recompute_grads:
      if recompute not in ("none", "layer"):
        raise ValueError(f"LayerStack: recompute_grads=True asks for recompute='layer' but "
                         f"recompute={recompute!r} was given; set one of them.")
      recompute = "layer"
    if norm_type not in ("rms", "layer"):
      raise ValueError(f"LayerStack: norm_type must be 'rms' or 'layer', got {norm_type!r}.")
    if recompute not in RECOMPUTE_POLICIES:
      raise ValueError(f"LayerStack: recompute must be one of {RECOMPUTE_POLICIES}, got "
                       f"{recompute!r}.")
    for layer in layers:
      if not hasattr(layer, "call"):
        raise TypeError(f"LayerStack: {layer!r} is not a TransformerLayer (no call method).")
    self._layers = list(layers)
    # Legacy mode: both given. Its norms are named
    # "layer_norm"/"final_layer_norm" and sublayer lists are ignored.
    self.legacy = dropout_rate is not None and norm_epsilon is not None
    if self.legacy and any(lst is not None for lst in (
        sublayers_initial, sublayers_per_layer, sublayers_final)):
      logging.warning("LayerStack: dropout_rate and norm_epsilon are both set (the "
                      "original's legacy mode), so the sublayer lists are ignored.")
      sublayers_initial = sublayers_per_layer = sublayers_final = None
    self._dropout_rate = 0.0 if dropout_rate is None else dropout_rate
    self._norm_epsilon = 1e-6 if norm_epsilon is None else norm_epsilon
    self._norm_type = norm_type
    self.recompute = recompute
    check_recompute_layers(recompute, recompute_layers)
    self.recompute_layers = recompute_layers
    self.recompute_ops: List[Any] = []
    self._check_pipeline(num_stages, num_microbatches, pipeline_schedule, virtual_stages)
    self.virtual_stages = virtual_stages
    self.num_stages = num_stages
    self.num_microbatches = num_microbatches
    self.pipeline_schedule = pipeline_schedule
    self.stages_dim_name = stages_dim_name
    self.stream_mode = sp_lib.mode_of(sequence_parallel)  # None, "length" or "d_model"
    self.sequence_parallel = self.stream_mode is not None
    self.pipeline_stats: Optional[Dict[str, Any]] = None
    self._sublayers = self._check_sublayers(
        {"sublayers_initial": sublayers_initial, "sublayers_per_layer": sublayers_per_layer,
         "sublayers_final": sublayers_final})

  def _check_sublayers(self, given: Dict[str, Any]) -> Optional[Tuple[list, list, list]]:
    """The (initial, per-layer, final) sublayer lists, defaults filled in;
    None when none is given (the built-in body)."""
    if all(value is None for value in given.values()):
      return None
    unsupported = []
    if self.recompute == "selective":
      unsupported.append("recompute='selective' (use 'layer' or 'none')")
    if self.pipelined:
      unsupported.append(f"num_stages={self.num_stages} (pipelining; use num_stages=1)")
    if self._norm_type != "rms":
      unsupported.append(f"norm_type={self._norm_type!r} (put sublayer_true_layer_norm "
                         "in the lists instead)")
    if self.sequence_parallel:
      unsupported.append("sequence_parallel=True (use the built-in body)")
    if unsupported:
      raise ValueError("LayerStack: custom sublayers (sublayers_initial/_per_layer/_final) "
                       "do not support " + " or ".join(unsupported) + ".")
    lists = []
    defaults = sublayers_lib.default_sublayers(gin_configurables())
    for (name, value), default in zip(given.items(), defaults):
      if value is None:
        value = default
      if callable(value) or isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise TypeError(f"LayerStack: {name} must be a list of sublayer functions, got "
                        f"{value!r}.")
      value = list(value)
      for fn in value:
        if not callable(fn):
          raise TypeError(
              f"LayerStack: {name} holds {fn!r}, which is not callable; give functions "
              "called as s(x, layer_stack, context), e.g. transformer.sublayer_rms_norm.")
      lists.append(value)
    return tuple(lists)

  @property
  def layers(self) -> List[TransformerLayer]:
    return list(self._layers)

  @property
  def dropout_rate(self) -> float:
    return self._dropout_rate

  @property
  def norm_epsilon(self) -> float:
    return self._norm_epsilon

  @property
  def sublayers_initial(self) -> Optional[list]:
    """The sublayers run before the first layer; None: the built-in body."""
    return None if self._sublayers is None else list(self._sublayers[0])

  @property
  def sublayers_per_layer(self) -> Optional[list]:
    """The sublayers run for each layer; None: the built-in body."""
    return None if self._sublayers is None else list(self._sublayers[1])

  @property
  def sublayers_final(self) -> Optional[list]:
    """The sublayers run after the last layer; None: the built-in body."""
    return None if self._sublayers is None else list(self._sublayers[2])

  @property
  def num_layers(self) -> int:
    return len(self._layers)

  def layer_scope(self, index: int) -> str:
    """The scope of layer `index`'s slot: its name ("block_000/layer_001")
    or "layer_%03d" (layers without a name, and pipelined stacks).

    Example:
      >>> make_layer_stack([SelfAttention, DenseReluDense], num_layers=2).layer_scope(3)
      'block_001/layer_001'
    """
    return "layer_%03d" % index if self.pipelined else self._slot_name(index)

  def _slot_name(self, index: int) -> str:
    """Layer `index`'s scope in the unpipelined stack."""
    name = getattr(self._layers[index], "name", None)
    return name if isinstance(name, str) and name else "layer_%03d" % index

  def _norm_names(self) -> Tuple[str, str]:
    """(per-layer norm scope, final norm scope)."""
    if self.legacy or self._norm_type != "rms":
      return "layer_norm", "final_layer_norm"
    return "rms_norm", "rms_norm"

  def call(self, context: Context, x: mtf.Tensor) -> mtf.Tensor:
    x = self._begin(context, x)
    x = self._to_stream(context, x)  # split from the first layer to the last
    if not self.pipelined:
      losses_before = len(context.losses or ())
      x = self._apply_layers(context, x, self._layers, 0, collect=True)
      self._note_pipeline_refusal(context, losses_before)
    elif self._runs_pipelined(context):
      x = self._call_pipelined(context, x)
    else:
      x = self._call_stages_in_turn(context, x)
    return self.finish(context, self._to_whole(context, x))

  def _begin(self, context: Context, x: mtf.Tensor) -> mtf.Tensor:
    """The initial sublayers, or dropout (before the first layer)."""
    self.recompute_ops = []
    if self._sublayers is not None:
      x = self._run_sublayers(self._sublayers[0], context, x, "sublayers_initial")
    else:
      x = self._dropout(context, x)
    return _record_layer_output(context, x)

  def finish(self, context: Context, x: mtf.Tensor) -> mtf.Tensor:
    """The final norm, dropout and padding mask (after the last layer), or
    the final sublayers and the padding mask."""
    if self._sublayers is not None:
      x = self._run_sublayers(self._sublayers[2], context, x, "sublayers_final")
      x = sublayers_lib.sublayer_mask_padding(x, self, context)
    else:
      mask = context.nonpadding
      x = self._norm(context, x, name=self._norm_names()[1])
      x = self._dropout(context, x)
      if mask is not None:
        x = x * mask
    return _record_layer_output(context, x)

  # ---- the layers ------------------------------------------------------------
  def _apply_layers(self, context: Context, x: mtf.Tensor, layers, first: int,
                    collect: bool = False, gates=None) -> mtf.Tensor:
    """x through `layers` (the stack's own: their slot scopes; a pipeline
    stage's: "layer_%03d" from `first`). Under sequence parallelism the
    layers run on the stream's shape (`_to_stream`); x is returned in the
    shape it came in. `gates` (uneven pipeline stages): per block of
    `block_size` layers, None or a bool tensor; where it is false the block
    passes its input on unchanged."""
    policy = self.recompute if context.train else "none"
    whole = x.shape
    x = self._to_stream(context, x)
    block = self.block_size if gates else 1
    # Layers past the first recompute_layers blocks keep their activations.
    recomputed = (len(layers) if self.recompute_layers is None
                  else self.recompute_layers * self.block_size)
    block_input = x
    for j, layer in enumerate(layers):
      lnum = first + j
      scope = self.layer_scope(lnum) if layers is self._layers else "layer_%03d" % lnum
      if j % block == 0:
        block_input = x
      x = self._sublayer(context, x, layer, scope, policy if j < recomputed else "none",
                         f"layer {lnum}")
      if gates and j % block == block - 1 and gates[j // block] is not None:
        x = mtf.where(gates[j // block], x, block_input, output_shape=x.shape)
      if collect and context.layer_outputs is not None and lnum != len(self._layers) - 1:
        context.layer_outputs.append(x)  # sequence parallel: the stream's shape
      context.layer_index += 1
    return x if x.shape == whole else self._to_whole(context, x)

  def stream_split(self, context: Context) -> Optional[sp_lib.StreamSplit]:
    """The residual stream's split (sequence_parallel.py), or None."""
    return sp_lib.StreamSplit.of(self.stream_mode, context)

  def _to_stream(self, context: Context, x: mtf.Tensor) -> mtf.Tensor:
    split = self.stream_split(context)
    return x if split is None else split.to_stream(x)

  def _to_whole(self, context: Context, x: mtf.Tensor, regather: bool = False) -> mtf.Tensor:
    split = self.stream_split(context)
    return x if split is None else split.to_whole(x, regather)

  def _sublayer(self, context: Context, x: mtf.Tensor, layer, scope: str, policy: str,
                label: str) -> mtf.Tensor:
    """x + dropout(layer(norm(x))) in the name scope `scope`, under the
    recompute policy ("none", "layer", "selective" or "projections"); `label` names the
    layer in errors. With sublayer lists: the per-layer sublayers instead."""
    if self._sublayers is not None:
      return self._layer_with_sublayers(context, x, layer, scope, policy, label)
    split = self.stream_split(context)
    mask = context.nonpadding if split is None else split.like_stream(context.nonpadding, x)

    def norm(t):
      return self._norm(context, t if mask is None else t * mask, self._norm_names()[0])

    def block(x):
      with mtf.name_scope(context.mesh, scope):
        norm_x = self._recompute(norm, [x], policy) if policy == "selective" else norm(x)
        # An all-gather, and another in the backward pass unless the whole
        # layer is recomputed anyway.
        layer_input = self._to_whole(context, norm_x,
                                     regather=policy not in ("layer", "projections"))
        with mtf.name_scope(context.mesh, getattr(layer, "scope_name", type(layer).__name__)):
          y = layer.call(context, layer_input)
        if y.shape != layer_input.shape:
          raise ValueError(f"{type(self).__name__}: {label} ({type(layer).__name__}) returned "
                           f"shape {y.shape} for an input of shape {layer_input.shape}.")
        return x + self._dropout(context, mtf.zero.relayout(y, x.shape))  # reduce-scatter
    block = self._replayable(context, block)
    if policy in ("layer", "projections"):
      return self._recompute_layer(context, block, x, policy)
    saved = context.recompute_attention
    if policy == "selective":
      context.recompute_attention = lambda fn, ins: self._recompute(fn, ins, policy)
    try:
      return block(x)
    finally:
      context.recompute_attention = saved

  def _layer_with_sublayers(self, context: Context, x: mtf.Tensor, layer, scope: str,
                            policy: str, label: str) -> mtf.Tensor:
    """The per-layer sublayers on x (`_per_layer_sublayers`), recomputed as
    `policy` says."""
    def block(x):
      y = self._per_layer_sublayers(context, x, layer, scope)
      if y.shape != x.shape:
        raise ValueError(f"{type(self).__name__}: the sublayers_per_layer of {label} "
                         f"({type(layer).__name__}) returned shape {y.shape} for an input of "
                         f"shape {x.shape}; each layer's sublayers must keep the shape.")
      return y
    block = self._replayable(context, block)
    if policy in ("layer", "projections"):
      return self._recompute_layer(context, block, x, policy)
    return block(x)

  def _per_layer_sublayers(self, context: Context, x: mtf.Tensor, layer,
                           scope: str) -> mtf.Tensor:
    """The per-layer sublayers on x in the name scope `scope`, with the
    context's current layer and input set to `layer` and x while they run."""
    saved = context.current_layer, context.current_layer_input
    context.current_layer, context.current_layer_input = layer, x
    try:
      with mtf.name_scope(context.mesh, scope):
        return self._run_sublayers(self._sublayers[1], context, x, "sublayers_per_layer")
    finally:
      context.current_layer, context.current_layer_input = saved

  def _run_sublayers(self, sublayers, context: Context, x: mtf.Tensor,
                     what: str) -> mtf.Tensor:
    for fn in sublayers:
      y = fn(x, self, context)
      if not isinstance(y, mtf.Tensor):
        raise TypeError(f"{type(self).__name__}: {what} function "
                        f"{getattr(fn, '__name__', fn)!r} returned {type(y).__name__}, not an "
                        "mtf.Tensor.")
      x = y
    return x

  def _replayable(self, context: Context, block):
    """`block` as recompute="layer" runs it: now, and again in the backward
    pass. Stacks that change the context between layers (funnel pooling)
    pin the context `block` saw here."""
    del context
    return block

  def _recompute(self, fn, inputs, policy):
    saveable = mtf.product_without_batch_dims if policy == "projections" else None
    out = mtf.recompute_grad(fn, inputs, saveable=saveable)
    first = out if isinstance(out, mtf.Tensor) else out[0]
    self.recompute_ops.append((policy, first.operation))
    return out

  def _check_recompute(self, context: Context, layers) -> None:
    """Refuses layers that add auxiliary losses where the recomputation
    cannot carry them out (the reversible stack's)."""
    if context.losses is not None and any(hasattr(layer, "num_experts") for layer in layers):
      raise ValueError(
          f"{type(self).__name__}: recompute={self.recompute!r} does not support layers that "
          "add auxiliary losses (mixture of experts); use recompute='none' for this stack.")

  def _recompute_layer(self, context: Context, block, x: mtf.Tensor, policy: str) -> mtf.Tensor:
    """`block(x)` recomputed in the backward pass. The auxiliary losses its
    layers add (a mixture of experts' balancing loss) leave the block as
    further outputs of the recomputation, so that their gradients reach
    the layers' weights through it; the block's own appends (in the forward
    call and again in the recomputation) are taken back off the list."""
    losses = context.losses
    if losses is None:
      return self._recompute(block, [x], policy)

    def block_and_losses(x):
      before = len(losses)
      y = block(x)
      added = losses[before:]
      del losses[before:]
      return [y] + added if added else y
    out = self._recompute(block_and_losses, [x], policy)
    if isinstance(out, mtf.Tensor):
      return out
    losses.extend(out[1:])
    return out[0]

  # ---- pieces ----------------------------------------------------------------
  def _dropout(self, context: Context, x: mtf.Tensor) -> mtf.Tensor:
    if context.train and self._dropout_rate > 0.0:
      return mtf.dropout(x, True, rate=self._dropout_rate)
    return x

  def _norm(self, context: Context, x: mtf.Tensor, name: str = "layer_norm") -> mtf.Tensor:
    """Layer or RMS norm over d_model; on a stream that splits d_model
    (`sequence_parallel="d_model"`) over its RESIDUAL_D_MODEL, the variables
    renamed to match (the mean is then a small all-reduce)."""
    d_model = context.model.model_dim
    reduced = d_model
    if sp_lib.RESIDUAL_D_MODEL in x.shape.dimension_names:
      reduced = x.shape.get_dim_by_name(sp_lib.RESIDUAL_D_MODEL)

    def like_x(v):
      return v if reduced is d_model else mtf.rename_dimension(v, d_model.name, reduced.name)
    with mtf.name_scope(context.mesh, name):
      scale = like_x(mtf.get_variable(
          context.mesh, "scale", mtf.Shape([d_model]), initializer=mtf.initializers.ones(),
          dtype=context.variable_dtype))
      if self._norm_type == "layer":
        bias = like_x(mtf.get_variable(
            context.mesh, "bias", mtf.Shape([d_model]),
            initializer=mtf.initializers.zeros(), dtype=context.variable_dtype))
        x = x - mtf.reduce_mean(x, reduced_dim=reduced)
      variance = mtf.reduce_mean(mtf.square(x), reduced_dim=reduced)
      y = mtf.layers.scale_normalized(x, mtf.rsqrt(variance + self._norm_epsilon), scale)
      return y + bias if self._norm_type == "layer" else y


def _record_layer_output(context: Context, x: mtf.Tensor) -> mtf.Tensor:
  """x, appended to context.layer_outputs when the caller collects them."""
  if context.layer_outputs is not None:
    context.layer_outputs.append(x)
  return x


def kept_activation_bytes(graph: mtf.Graph, num_forward_ops: int, mesh_impl=None) -> int:
  """Bytes of forward activations that the backward pass reads: what stays
  alive between the forward and the backward pass (per processor with a
  mesh_impl, else of the full tensors).

  The forward pass is graph.operations[:num_forward_ops] (record
  len(graph.operations) before calling mtf.gradients); a tensor counts if
  a forward operation other than a variable made it and a backward
  operation reads it. Activation recomputation lowers this number: a
  `recompute_grad` region keeps only its inputs.

  Example:
    >>> n = len(graph.operations)
    >>> grads = mtf.gradients([loss], [v.outputs[0] for v in graph.trainable_variables])
    >>> kept_activation_bytes(graph, n, mesh_impl)
  """
  forward = graph.operations[:num_forward_ops]
  made = {t: op for op in forward if not getattr(op, "is_variable", False) and op.inputs
          for t in op.outputs}
  kept = set()
  for op in graph.operations[num_forward_ops:]:
    for t in op.inputs:
      if t in made:
        kept.add(t)
  total = 0
  for t in kept:
    elements = (int(np.prod(mesh_impl.slice_shape(t.shape))) if mesh_impl is not None
                else t.shape.size)
    total += elements * t.dtype.size
  return total


def make_layer_stack(layers: Sequence[Any], layer_stack_cls=None, num_layers: int = 6,
                     block_scope: bool = True, dropout_rate: Optional[float] = None,
                     norm_epsilon: Optional[float] = None, norm_type: str = "rms",
                     recompute: str = "none", num_stages: int = 1, num_microbatches: int = 1,
                     pipeline_schedule: str = "gpipe",
                     stages_dim_name: str = "stages",
                     sublayers_initial: Optional[Sequence[sublayers_lib.Sublayer]] = None,
                     sublayers_per_layer: Optional[Sequence[sublayers_lib.Sublayer]] = None,
                     sublayers_final: Optional[Sequence[sublayers_lib.Sublayer]] = None,
                     sequence_parallel: Union[bool, str] = False,
                     virtual_stages: int = 1,
                     recompute_layers: Optional[int] = None) -> LayerStack:
  """A LayerStack repeating the block `layers` num_layers times.

  Elements of `layers` may be TransformerLayer instances (reused: layers
  keep only hyperparameters, so each slot still gets its own variables),
  classes / factories called once per slot, or the original's gin form: a
  list or tuple holding a class, optionally a name (a string) and a dict of
  keyword arguments, e.g. `[@transformer_layers.DenseReluDense,
  "feedforward", {"hidden_size": 2048}]`. Each slot is named as in the
  original: with `block_scope` (default) "block_%03d/<name>", the name
  defaulting to "layer_%03d" counted within the block (variables
  "block_001/layer_000/SelfAttention/q"); without it "<name>" or
  "layer_%03d" counted over the stack. dropout_rate and norm_epsilon are
  passed on only when given (both given: the legacy norm names, see
  LayerStack). recompute, recompute_layers, num_stages, num_microbatches,
  pipeline_schedule, virtual_stages, stages_dim_name, sequence_parallel and the sublayer lists are
  LayerStack's (activation recomputation, pipeline parallelism, sequence
  parallelism, sublayers; gin: `transformer.make_layer_stack.num_stages =
  4`). The stack is built by gin's LayerStack once gin_config has
  registered it, so `transformer.LayerStack.sublayers_per_layer = [...]` in
  a gin file applies; `layer_stack_cls` (the original's argument) builds it
  with another LayerStack class instead.

  Example:
    >>> stack = make_layer_stack(
    ...     [SelfAttention(num_heads=4), DenseReluDense(hidden_size=256)], num_layers=2)
    >>> stack.num_layers
    4
  """
  block = []
  for b in range(num_layers):
    for n, spec in enumerate(layers):
      layer = _make_layer(spec)
      if layer is spec:  # one instance in several slots: each slot gets its own name
        layer = copy.copy(layer)
      name = _spec_name(spec)
      if block_scope:
        name = "block_%03d/%s" % (b, name or "layer_%03d" % n)
      else:
        name = name or "layer_%03d" % len(block)
      if hasattr(layer, "set_name"):
        layer.set_name(name)
      else:
        layer._name = name  # pylint: disable=protected-access
      block.append(layer)
  # Only the arguments given here are passed: gin's bindings yield to arguments.
  given = {name: value for name, value in [("sublayers_initial", sublayers_initial),
                                           ("sublayers_per_layer", sublayers_per_layer),
                                           ("sublayers_final", sublayers_final),
                                           ("dropout_rate", dropout_rate),
                                           ("norm_epsilon", norm_epsilon)]
           if value is not None}
  return (layer_stack_cls or _layer_stack_cls())(
      block, norm_type=norm_type,
      recompute=recompute, num_stages=num_stages, num_microbatches=num_microbatches,
      pipeline_schedule=pipeline_schedule, stages_dim_name=stages_dim_name, **given,
      **({"sequence_parallel": sequence_parallel} if sequence_parallel else {}),
      **({"virtual_stages": virtual_stages} if virtual_stages != 1 else {}),
      **({"recompute_layers": recompute_layers} if recompute_layers is not None else {}))


def check_recompute_layers(recompute: str, recompute_layers: Optional[int]) -> None:
  """Raises ValueError unless `recompute_layers` is None or a count of layers
  (0 or more) with a recompute policy other than "none".

  Example:
    >>> check_recompute_layers("layer", 3)   # fine
  """
  if recompute_layers is None:
    return
  if isinstance(recompute_layers, bool) or not isinstance(recompute_layers, int) or \
      recompute_layers < 0:
    raise ValueError(f"LayerStack: recompute_layers must be a number of layers (0 or more) or "
                     f"None (all), got {recompute_layers!r}.")
  if recompute == "none":
    raise ValueError(f"LayerStack: recompute_layers = {recompute_layers} says how many layers "
                     "to recompute, but recompute = 'none'; set recompute = 'layer' or "
                     "'selective'.")


def _spec_name(spec) -> Optional[str]:
  """The name string of a make_layer_stack spec, if it has one."""
  if isinstance(spec, (list, tuple)):
    for item in spec:
      if isinstance(item, str):
        return item
  return None


def _make_layer(spec):
  """One layer from a make_layer_stack spec (see there)."""
  if isinstance(spec, (list, tuple)):
    factory, kwargs = None, {}
    for item in spec:
      if isinstance(item, str):
        continue  # the slot's name (see _spec_name)
      if isinstance(item, dict):
        kwargs = item
      else:
        factory = item
    if factory is None:
      raise ValueError(f"make_layer_stack: the layer spec {spec!r} names no layer class; "
                       "give [LayerClass, optional name, optional {kwargs}].")
    return factory(**kwargs)
  return spec() if isinstance(spec, type) or not hasattr(spec, "call") else spec


def _layer_stack_cls():
  """LayerStack, or its gin-configurable version once registered."""
  return gin_configurables().get("LayerStack", LayerStack)
