"""The transformer of a run and its features: building the model from gin,
the decoder's inputs, the Trainer's model_fn and per-token metrics.

    >>> setup = Setup("lm", ByteVocabulary(), mesh_impl, {"targets": 128}, 32, 259, 8,
    ...               mtf.VariableDType())
    >>> trainer = mtf.training.Trainer(make_model_fn(setup), setup.feature_shapes(), ...)
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import gin
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import layer_stack
from mesh_tensorflow.transformer import transformer as transformer_lib
from mesh_tensorflow.transformer.transformer import shift_right_within_segments
from mesh_tensorflow.transformer import vocabulary as vocabulary_lib

MODEL_TYPES = ("lm", "bitransformer")


def batch_split(mesh_impl) -> int:
  """Into how many pieces the layout splits the "batch" dimension.

  Example:
    >>> batch_split(PlacementMeshImpl("rows:2;cols:4", "batch:rows", devices))
    2
  """
  return dimension_split(mesh_impl, "batch")


def dimension_split(mesh_impl, name: str) -> int:
  """Into how many pieces the layout splits the tensor dimension `name`.

  Example:
    >>> dimension_split(PlacementMeshImpl("rows:2;cols:4", "outer_batch:rows", devices),
    ...                 "outer_batch")
    2
  """
  axis = mesh_impl.tensor_dimension_to_mesh_axis(mtf.Dimension(name, mesh_impl.size))
  return 1 if axis is None else mesh_impl.shape.dims[axis].size


def round_up(n: int, multiple: int) -> int:
  """n rounded up to a multiple of `multiple`.

  Example:
    >>> round_up(259, 8)
    264
  """
  return -(-n // multiple) * multiple


class ForeignValue:
  """A binding this library skipped because its value names a configurable of
  another package (e.g. `run.vocabulary = @t5.models.mesh_transformer.get_vocabulary()`),
  kept where a silent default would be wrong so the call can say what to set.

  Example:
    >>> ForeignValue("run.vocabulary", "@t5.data.get_default_vocabulary()").binding
    'run.vocabulary = @t5.data.get_default_vocabulary()'
  """

  def __init__(self, key: str, value: str):
    self.key = key
    self.value = value

  @property
  def binding(self) -> str:
    return f"{self.key} = {self.value}"

  def __repr__(self) -> str:
    return f"ForeignValue({self.binding!r})"

  def __deepcopy__(self, memo):
    return self


def _configurable(name: str):
  """The gin-aware version of the model class or function `name` of the
  transformer module once gin_config.register_configurables() has made them
  (parsing a gin config does), else the plain one: no gin binding can name it
  before then."""
  return layer_stack.gin_configurables().get(name) or getattr(transformer_lib, name)


@gin.configurable
def build_model(model_type: str, input_vocab_size: int, output_vocab_size: int,
                max_length: int, vocab_divisor: Optional[int] = None,
                layout: Optional[str] = None,
                mesh_shape: Optional[str] = None, encoder_layer_stack=None,
                decoder_layer_stack=None, bitransformer_cls=None):
  """The transformer of `model_type`; its sizes and layers come from gin
  (see gin/defaults.gin and gin/models/*.gin).

  A language model is a `Unitransformer` with the name gin gives it
  (`Unitransformer.name`, default "transformer"); an
  encoder-decoder is a `Bitransformer` of an "encoder" and a "decoder",
  built in the gin scopes "encoder" and "decoder" (so
  `decoder/make_layer_stack.layers = ...` configures one side only). What
  the config sets is never overridden here: the vocabulary rounding is the
  model's `Unitransformer.vocab_divisor` unless `vocab_divisor` is given.

  Args:
    model_type: "lm" (decoder-only) or "bitransformer".
    input_vocab_size: ids of inputs.
    output_vocab_size: ids of outputs.
    max_length: the longest sequence (size of learned position tables).
    vocab_divisor: vocabulary sizes are rounded up to a multiple of this
      (None: the Unitransformer's own, from gin or its default).
    layout: the layout rules, for layers that adapt to them (mixture of
      experts groups tokens by how the batch is split).
    mesh_shape: the mesh shape, likewise.
    encoder_layer_stack: the encoder's layer stack (default: the gin-configured
      `make_layer_stack()` in scope "encoder"), e.g. in gin
      `build_model.encoder_layer_stack = @funnel_transformer.FunnelTransformerLayerStack()`.
    decoder_layer_stack: the same for the decoder (or the language model).
    bitransformer_cls: the encoder-decoder class (default `Bitransformer`),
      e.g. `@funnel_transformer.BitransformerFunnel`.

  Example:
    >>> model = build_model("lm", 259, 259, 128)
  """
  unitransformer = _configurable("Unitransformer")
  make_layer_stack = _configurable("make_layer_stack")
  stacks = {"encoder": encoder_layer_stack, "decoder": decoder_layer_stack}

  def side(name: Optional[str], input_size: int, output_size: Optional[int],
           autoregressive: bool):
    stack = stacks[name or "decoder"]
    stack = stack if stack is not None else make_layer_stack()
    kwargs = {"name": name} if name else {}
    if vocab_divisor is not None:
      kwargs["vocab_divisor"] = vocab_divisor
    if max_length is not None and not _bound("Unitransformer", "max_length"):
      kwargs["max_length"] = max_length
    return unitransformer(
        layer_stack=stack, input_vocab_size=input_size,
        output_vocab_size=output_size, autoregressive=autoregressive,
        layout=layout, mesh_shape=mesh_shape, **kwargs)

  if model_type == "lm":
    return side(None, input_vocab_size, output_vocab_size, True)
  if model_type == "bitransformer":
    with gin.config_scope("encoder"):
      encoder = side("encoder", input_vocab_size, None, False)
    with gin.config_scope("decoder"):
      decoder = side("decoder", output_vocab_size, output_vocab_size, True)
    return (bitransformer_cls or _configurable("Bitransformer"))(encoder, decoder)
  raise ValueError(f"model_type must be one of {MODEL_TYPES}, got {model_type!r}.")


def _bound(configurable: str, parameter: str) -> bool:
  """Whether the gin config binds configurable.parameter in the current
  scope or any (a value the config sets wins over one computed here)."""
  for scope in [""] + [s for s in gin.current_scope() if s]:
    key = f"{scope}/{configurable}.{parameter}" if scope else f"{configurable}.{parameter}"
    try:
      gin.query_parameter(key)
      return True
    except ValueError:
      continue
  return False


def autoregressive_inputs(targets: mtf.Tensor,
                          segmentation: Optional[mtf.Tensor] = None) -> mtf.Tensor:
  """The decoder's inputs: targets shifted right by one (0 first), restarting
  at every packed example (segmentation change).

  Example:
    >>> # targets [5, 6, 1, 7, 1], segmentation [1, 1, 1, 2, 2] -> [0, 5, 6, 0, 7]
    >>> inputs = autoregressive_inputs(targets, segmentation)
  """
  return shift_right_within_segments(targets, segmentation)


@dataclasses.dataclass
class Setup:
  """What every mode of a run needs: the model type, vocabulary, mesh,
  sequence lengths, batch size and dtypes; builds the model and names the
  features.

  Attributes:
    model_type: "lm" or "bitransformer".
    vocabulary: the Vocabulary of inputs and targets.
    mesh_impl: the mesh implementation (mesh shape, layout, devices).
    sequence_length: {"targets": n} (and "inputs" for an encoder-decoder).
    batch_size: rows per (micro-)batch.
    vocab_size: the vocabulary's size (the model rounds it up).
    vocab_divisor: the model's vocabulary is a multiple of this (None: the
      model's own `Unitransformer.vocab_divisor`).
    variable_dtype: master, slice and activation dtypes.
    outer_batch_size: training and evaluation batches are [outer_batch,
      batch, length] with this many outer rows (`run.outer_batch_size`);
      1: [batch, length].

  Example:
    >>> setup = Setup("lm", ByteVocabulary(), impl, {"targets": 128}, 32, 259, 8,
    ...               mtf.VariableDType())
    >>> setup.feature_shapes()["targets"]
    'batch:32;length:128'
  """
  model_type: str
  vocabulary: vocabulary_lib.Vocabulary
  mesh_impl: mtf.MeshImpl
  sequence_length: Dict[str, int]
  batch_size: int
  vocab_size: int
  vocab_divisor: Optional[int]
  variable_dtype: mtf.VariableDType
  outer_batch_size: int = 1

  def model_vocab_size(self) -> int:
    """The model's (rounded-up) output vocabulary size."""
    model = self.new_model()
    return getattr(model, "decoder", model).output_vocab_dim.size

  def new_model(self):
    """A new model object (its variables are found or created by name)."""
    length = max(self.sequence_length.values())
    return build_model(self.model_type, self.vocab_size, self.vocab_size, length,
                       vocab_divisor=self.vocab_divisor,
                       layout=self.mesh_impl.layout_rules.to_string(),
                       mesh_shape=self.mesh_impl.shape.to_string())

  @property
  def batch_split(self) -> int:
    """How many ways the layout splits "batch"."""
    return batch_split(self.mesh_impl)

  @property
  def feature_keys(self) -> List[str]:
    """The token features: ["targets"] or ["inputs", "targets"]."""
    return ["targets"] if self.model_type == "lm" else ["inputs", "targets"]

  def feature_shapes(self, batch_size: Optional[int] = None) -> Dict[str, str]:
    """{feature: mtf shape} of a packed batch (tokens, segmentation, position)."""
    batch_size = batch_size or self.batch_size
    shapes = {}
    for key in self.feature_keys:
      for suffix in ("", "_segmentation", "_position"):
        shapes[key + suffix] = f"batch:{batch_size};length:{self.sequence_length[key]}"
    return shapes

  def training_feature_shapes(self) -> Dict[str, str]:
    """{feature: mtf shape} of a training or evaluation batch: with
    `outer_batch_size` > 1, [outer_batch, batch / outer_batch, length].

    Example:
      >>> dataclasses.replace(setup, outer_batch_size=2).training_feature_shapes()["targets"]
      'outer_batch:2;batch:16;length:128'
    """
    outer = self.outer_batch_size
    if outer == 1:
      return self.feature_shapes()
    return {k: f"outer_batch:{outer};batch:{self.batch_size // outer};" + v.split(";", 1)[1]
            for k, v in self.feature_shapes().items()}

  def to_training_batch(self, features: Mapping[str, tf.Tensor]) -> Dict[str, tf.Tensor]:
    """A dataset batch ([batch, length] features) in the shapes of
    `training_feature_shapes` (`dataset.map` it)."""
    if self.outer_batch_size == 1:
      return dict(features)
    shapes = self.training_feature_shapes()
    return {k: tf.reshape(v, mtf.convert_to_shape(shapes[k]).to_integer_list())
            if k in shapes else v for k, v in features.items()}


def call_model(setup: Setup, model, features: Mapping[str, mtf.Tensor], mode: str,
               compute_loss: bool = True):
  """(logits, loss) of the model on a batch of packed features.

  A language model reads the targets shifted right (within each packed
  example); an encoder-decoder reads the inputs and the targets.

  Example:
    >>> logits, loss = call_model(setup, setup.new_model(), features, "eval")
  """
  targets = features["targets"]
  if setup.model_type == "lm":
    return model.call_simple(
        inputs=autoregressive_inputs(targets, features.get("targets_segmentation")),
        targets=targets, compute_loss=compute_loss, mode=mode,
        variable_dtype=setup.variable_dtype,
        sequence_id=features.get("targets_segmentation"),
        position=features.get("targets_position"))
  return call_with_supported(
      model.call_simple, inputs=features["inputs"], targets=targets,
      compute_loss=compute_loss, mode=mode, variable_dtype=setup.variable_dtype,
      encoder_sequence_id=features.get("inputs_segmentation"),
      decoder_sequence_id=features.get("targets_segmentation"),
      encoder_position=features.get("inputs_position"),
      decoder_position=features.get("targets_position"))


def make_model_fn(setup: Setup, model=None) -> Callable:
  """The Trainer's model_fn: the model's loss, with cross-entropy (nats per
  target token, without z-loss or label smoothing) and token accuracy as
  metrics. It calls `model`, or a new model of the setup on each call.

  Example:
    >>> trainer = mtf.training.Trainer(make_model_fn(setup), ...)
  """
  def model_fn(mesh, features, mode):
    del mesh
    logits, loss = call_model(setup, model or setup.new_model(), features, mode)
    xent, accuracy = token_cross_entropy(logits, features["targets"])
    return loss, {"cross_entropy": xent, "token_accuracy": accuracy}
  return model_fn


def call_with_supported(fn: Callable, *args, **kwargs):
  """Calls fn with the keyword arguments it accepts (others are dropped),
  so decoding options reach models whose signatures differ.

  Example:
    >>> call_with_supported(lambda a, b=1: a + b, 1, b=2, c=3)
    3
  """
  params = inspect.signature(fn).parameters
  if any(p.kind == p.VAR_KEYWORD for p in params.values()):
    return fn(*args, **kwargs)
  return fn(*args, **{k: v for k, v in kwargs.items() if k in params})


def log_likelihoods(logits: mtf.Tensor, targets: mtf.Tensor) -> mtf.Tensor:
  """Per-row sum of log p(target) over the non-padding target tokens.

  Args:
    logits: [batch, length, vocab] mtf Tensor.
    targets: [batch, length] int mtf Tensor (0 is padding).

  Returns:
    A [batch] float32 mtf Tensor.

  Example:
    >>> scores = log_likelihoods(logits, features["targets"])
  """
  vocab_dim = logits.shape.dims[-1]
  length_dim = targets.shape.dims[-1]
  logits = mtf.cast(logits, tf.float32)
  log_probs = mtf.log_softmax(logits, vocab_dim)
  picked = mtf.reduce_sum(log_probs * mtf.one_hot(targets, vocab_dim, dtype=tf.float32),
                          reduced_dim=vocab_dim)
  weights = mtf.cast(mtf.not_equal(targets, 0), tf.float32)
  return mtf.reduce_sum(picked * weights, reduced_dim=length_dim)


def token_cross_entropy(logits: mtf.Tensor, targets: mtf.Tensor) -> Tuple[mtf.Tensor, mtf.Tensor]:
  """Mean cross-entropy (nats per token) and accuracy over non-padding tokens.

  Example:
    >>> xent, accuracy = token_cross_entropy(logits, features["targets"])
  """
  vocab_dim = logits.shape.dims[-1]
  logits = mtf.cast(logits, tf.float32)
  one_hot = mtf.one_hot(targets, vocab_dim, dtype=tf.float32)
  per_token = (mtf.reduce_logsumexp(logits, vocab_dim)
               - mtf.reduce_sum(logits * one_hot, reduced_dim=vocab_dim))
  weights = mtf.cast(mtf.not_equal(targets, 0), tf.float32)
  total = mtf.maximum(mtf.reduce_sum(weights), 1.0)
  correct = mtf.cast(mtf.equal(mtf.argmax(logits, vocab_dim), targets), tf.float32)
  return (mtf.reduce_sum(per_token * weights) / total,
          mtf.reduce_sum(correct * weights) / total)


def make_mesh_impl(mesh_shape: str, layout_rules: str,
                   devices: Optional[Sequence[str]] = None,
                   lowering: str = "placement") -> mtf.MeshImpl:
  """The mesh implementation of `mesh_shape` on this machine.

  Uses the accelerators if there are enough of them, else logical CPUs.
  `lowering` is "placement" (PlacementMeshImpl) or "simd" (SimdMeshImpl: one
  program traced once for every processor).

  Raises:
    ValueError: if the mesh needs more devices than there are.

  Example:
    >>> impl = make_mesh_impl("rows:2;cols:4", "batch:rows;d_ff:cols")
  """
  shape = mtf.convert_to_shape(mesh_shape)
  if devices is None:
    gpus = [d.name for d in tf.config.list_logical_devices("GPU")]
    cpus = [d.name for d in tf.config.list_logical_devices("CPU")]
    devices = gpus if len(gpus) >= shape.size else cpus
  if len(devices) < shape.size:
    raise ValueError(
        f"mesh_shape {mesh_shape!r} needs {shape.size} devices, but this machine has "
        f"{len(devices)} ({', '.join(devices)}). Pick a layout gin file whose mesh fits "
        "(layouts/single.gin, layouts/2x4.gin, ...) or set the mesh, e.g. "
        "--gin_param=\"utils.run.mesh_shape = 'batch:2,model:4'\".")
  if lowering == "simd":
    return mtf.simd_mesh_impl.SimdMeshImpl(shape, layout_rules, list(devices)[:shape.size])
  if lowering != "placement":
    raise ValueError(f"run.lowering = {lowering!r}: use 'placement' or 'simd'.")
  return mtf.placement_mesh_impl.PlacementMeshImpl(shape, layout_rules,
                                                   list(devices)[:shape.size])
