"""The settings of a transformer run (`RunConfig`) and the gin names behind them.

`RunConfig` holds every parameter of `application.run` with its default and
meaning; gin binds them under the name `run` (`run.train_steps = 500`, also
spelled `utils.run.train_steps` or
`mesh_tensorflow.transformer.utils.run.train_steps`, as the original's gin
files do). `RunConfig.resolved()` turns the accepted alternative forms (a
batch size as ("tokens_per_batch", 65536), a mesh as an `mtf.Shape`, ...)
into one canonical config and rejects settings that cannot work, naming the
`run.<name>` at fault.

This module also registers the gin names a run's config refers to: the
optimizers (`@optimize.AdafactorOptimizer`), `@utils.tpu_mesh_shape()`,
`utils.get_variable_dtype`, `utils.serialize_num_microbatches`,
`@utils.auto_train_steps`, `@vocabulary.get_vocabulary()`.

    >>> from mesh_tensorflow.transformer import gin_config
    >>> gin_config.parse(["models/tiny_lm.gin"], ["run.batch_size = ('tokens_per_batch', 4096)"])
    >>> RunConfig(model_dir=None).resolved().batch_size   # 4096 tokens / 128 per sequence
    32
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Union

from absl import logging
import gin
import numpy as np
import tensorflow as tf

import mesh_tensorflow as mtf

from mesh_tensorflow.transformer import dataset as dataset_lib
from mesh_tensorflow.transformer import inference
from mesh_tensorflow.transformer import learning_rate_schedules
from mesh_tensorflow.transformer import modeling
from mesh_tensorflow.transformer import vocabulary as vocabulary_lib
from mesh_tensorflow.transformer.inference import log
from mesh_tensorflow.transformer.modeling import MODEL_TYPES

# The module path under which gin files name `run` and its helpers
# (`utils.run.train_steps`, `@utils.tpu_mesh_shape()`).
GIN_MODULE = "mesh_tensorflow.transformer.utils"

MODES = ("train", "eval", "infer", "score", "export")
# The original's names of two modes -> the mode each runs.
MODE_ALIASES = {"perplexity_eval": "eval", "score_eval": "eval", "score_from_strings": "score",
                "score_from_dataset": "score"}


# The optimizers, configurable from gin under the module path gin files use:
# @optimize.AdafactorOptimizer or @mesh_tensorflow.optimize.AdafactorOptimizer.
adafactor_decay_rate_pow = gin.external_configurable(
    mtf.optimize.adafactor_decay_rate_pow, module="mesh_tensorflow.optimize")
adafactor_decay_rate_adam = gin.external_configurable(
    mtf.optimize.adafactor_decay_rate_adam, module="mesh_tensorflow.optimize")


class AdafactorOptimizer(mtf.optimize.AdafactorOptimizer):
  """`mtf.optimize.AdafactorOptimizer` whose default `decay_rate` is gin's
  `adafactor_decay_rate_pow()`, so `adafactor_decay_rate_pow.offset = 0` (as
  operative configs write it) applies.

  Example:
    >>> gin.parse_config("adafactor_decay_rate_pow.exponent = 0.5")
    >>> AdafactorOptimizer(learning_rate=0.01).decay_rate(3)   # 1 - 4 ** -0.5
    0.5
  """

  def _decay_rate_default(self):
    return adafactor_decay_rate_pow()


gin.external_configurable(AdafactorOptimizer, "AdafactorOptimizer",
                          module="mesh_tensorflow.optimize")
for _cls in (mtf.optimize.AdamWeightDecayOptimizer, mtf.optimize.SgdOptimizer,
             mtf.optimize.MomentumOptimizer):
  gin.external_configurable(_cls, module="mesh_tensorflow.optimize")
gin.external_configurable(mtf.mixed_precision.DynamicLossScale,
                          module="mesh_tensorflow.mixed_precision")
gin.external_configurable(vocabulary_lib.get_vocabulary, module="vocabulary")
# The initializer of the dense layers: configured in place, so a config's
# `VarianceScalingInitializer.scale = ...` applies wherever layers create one.
gin.configurable("VarianceScalingInitializer", module="mesh_tensorflow.layers")(
    mtf.initializers.VarianceScalingInitializer)


# ------------------------------------------ the forms of run parameters
@gin.configurable(module=GIN_MODULE)
def tpu_mesh_shape(tpu_topology: Optional[str] = None, model_parallelism=1,
                   ensemble_parallelism: Optional[int] = None) -> mtf.Shape:
  """The mesh of the original's TPU topology setting: "batch" (data parallelism) x
  "model" (model_parallelism cores per replica), from the topology's core
  count ("v3-8": 8 cores; "4x4": 4 * 4 * 2 cores; None: the accelerators, or
  else the logical CPUs, of this machine). The mesh needs that many devices
  here too; on fewer, set `utils.run.mesh_shape` directly.

  Example:
    >>> tpu_mesh_shape("v3-8", 2).to_string()
    'batch:4;model:2'
  """
  if tpu_topology is None:
    cores = (len(tf.config.list_logical_devices("GPU"))
             or len(tf.config.list_logical_devices("CPU")))
  elif tpu_topology.startswith("v"):
    cores = int(tpu_topology.split("-")[-1])
  else:
    cores = int(np.prod([int(x) for x in tpu_topology.split("x")])) * 2
  if isinstance(model_parallelism, (list, tuple)):
    raise ValueError(
        f"tpu_mesh_shape.model_parallelism = {model_parallelism!r} (a hierarchical tiling "
        "spec) is not supported; give an integer or set utils.run.mesh_shape.")
  data = cores // int(model_parallelism)
  if ensemble_parallelism:
    data //= int(ensemble_parallelism)
  dims = []
  if ensemble_parallelism and ensemble_parallelism > 1:
    dims.append(mtf.Dimension("ensemble", int(ensemble_parallelism)))
  if data > 1:
    dims.append(mtf.Dimension("batch", data))
  if model_parallelism > 1:
    dims.append(mtf.Dimension("model", int(model_parallelism)))
  return mtf.Shape(dims)


ACTIVATION_DTYPES = ("float32", "bfloat16", "float16")


def float_dtype_name(value, setting: str = "run.activation_dtype") -> str:
  """The name of a dtype the library keeps variables and activations in
  ("float32", "bfloat16" or "float16"), given as a name or a tf.DType.

  Example:
    >>> float_dtype_name(tf.bfloat16)
    'bfloat16'

  Raises:
    ValueError: naming `setting`, for any other value.
  """
  name = getattr(value, "name", value)
  if name not in ACTIVATION_DTYPES:
    raise ValueError(f"{setting} = {value!r}: use one of {', '.join(ACTIVATION_DTYPES)}.")
  return name


@gin.configurable(module=GIN_MODULE)
def get_variable_dtype(master_dtype="float32", slice_dtype="float32",
                       activation_dtype="float32") -> mtf.VariableDType:
  """The run's dtypes (gin: `utils.get_variable_dtype.activation_dtype =
  "bfloat16"`): master (checkpointed) weights, their in-memory slices, and
  activations. The default master dtype is float32 (a bfloat16 checkpoint
  restores into it exactly); `run` keeps the master dtype of the checkpoint
  it starts from (the model directory's, or init_checkpoint) unless the
  config sets `get_variable_dtype.master_dtype`, so a model trained with
  bfloat16 masters goes on training and saving bfloat16 masters.

  Example:
    >>> get_variable_dtype(activation_dtype="bfloat16").activation_dtype
    tf.bfloat16
  """
  setting = "utils.get_variable_dtype.{}"
  return mtf.VariableDType(
      tf.as_dtype(float_dtype_name(master_dtype, setting.format("master_dtype"))),
      tf.as_dtype(float_dtype_name(slice_dtype, setting.format("slice_dtype"))),
      tf.as_dtype(float_dtype_name(activation_dtype, setting.format("activation_dtype"))))


def check_outer_batch(outer: int, batch: int, outer_split: int, split: int,
                      where: str = "") -> None:
  """Rejects a run.outer_batch_size that does not cut `batch` sequences
  (a micro-batch's) into outer_batch x batch / outer_batch with each a
  multiple of its split by the layout (`outer_split`, `split`).

  Example:
    >>> check_outer_batch(2, 4, 2, 4)
    Traceback (most recent call last):
    ValueError: run.outer_batch_size = 2: a batch of 4 sequences is ...
  """
  if batch % outer or outer % outer_split or (batch // outer) % split:
    raise ValueError(
        f"run.outer_batch_size = {outer}: a batch of {batch} sequences is outer_batch "
        f"{outer} x batch {batch / outer:g}; outer_batch must divide it and be a multiple of "
        f"its split ({outer_split}-way), batch a multiple of its split ({split}-way){where}: "
        "change run.outer_batch_size, run.batch_size or the layout.")


def compute_batch_size(sequence_length: Mapping[str, int], mesh_shape, layout_rules,
                       method_and_value) -> int:
  """Sequences per batch from the original's (method, value) form:
  "sequences_per_batch", "tokens_per_batch", "sequences_per_replica" or
  "tokens_per_replica" (replicas: the mesh's split of "batch" times
  "outer_batch").

  Example:
    >>> compute_batch_size({"targets": 128}, "batch:4", "batch:batch",
    ...                    ("tokens_per_replica", 512))
    16
  """
  try:
    method, value = method_and_value
  except (TypeError, ValueError):
    raise ValueError(f"run.batch_size = {method_and_value!r}: give an integer or a "
                     "(method, value) pair such as ('tokens_per_batch', 65536).") from None
  shape = mtf.convert_to_shape(mesh_shape)
  rules = mtf.convert_to_layout_rules(layout_rules)
  replicas = 1
  for name in ("batch", "outer_batch"):
    axis = rules.tensor_dimension_to_mesh_axis(mtf.Dimension(name, shape.size), shape)
    replicas *= 1 if axis is None else shape.dims[axis].size
  longest = max(sequence_length.values())

  def tokens_to_sequences(tokens):
    if tokens % longest:
      raise ValueError(f"run.batch_size = {method_and_value!r}: {tokens} tokens are not a "
                       f"whole number of sequences of length {longest}.")
    return tokens // longest
  if method == "sequences_per_batch":
    return int(value)
  if method == "tokens_per_batch":
    return tokens_to_sequences(value)
  if method == "sequences_per_replica":
    return int(value) * replicas
  if method == "tokens_per_replica":
    return tokens_to_sequences(value) * replicas
  raise ValueError(f"run.batch_size: unknown method {method!r}; use sequences_per_batch, "
                   "tokens_per_batch, sequences_per_replica or tokens_per_replica.")


@gin.configurable(module=GIN_MODULE)
def serialize_num_microbatches(batch_per_replica: int, sequence_length: Mapping[str, int],
                               tokens_per_microbatch_per_replica: Optional[int] = None) -> int:
  """Micro-batches per training step (gradient accumulation): the largest
  micro-batch of at most `tokens_per_microbatch_per_replica` tokens per
  replica that divides the replica's batch (1 micro-batch when unset).

  Example:
    >>> serialize_num_microbatches(16, {"targets": 128}, 512)
    4
  """
  if not tokens_per_microbatch_per_replica:
    return 1
  size = max(1, int(tokens_per_microbatch_per_replica) // max(sequence_length.values()))
  while batch_per_replica % size:
    size -= 1
  return batch_per_replica // size


@gin.configurable(module=GIN_MODULE)
def auto_train_steps(batch_size: int, sequence_length: Mapping[str, int],
                     train_tokens: int = 2 ** 36) -> int:
  """train_steps from a token budget: train_tokens / tokens per batch.

  Example:
    >>> auto_train_steps(128, {"inputs": 512, "targets": 128}, 2 ** 20)
    16
  """
  return int(train_tokens) // (batch_size * max(sequence_length.values()))


# Mesh dimensions that layouts may name whether or not the mesh has them
# (T5's say "ensemble:ensemble" on meshes without an ensemble dimension).
OPTIONAL_MESH_DIMENSIONS = ("ensemble",)


def as_sequence_lengths(sequence_length) -> Dict[str, int]:
  """`run.sequence_length` as a dict: an int is both lengths, None 128 each.

  Example:
    >>> as_sequence_lengths(64)
    {'inputs': 64, 'targets': 64}
  """
  if isinstance(sequence_length, int):
    return {"inputs": sequence_length, "targets": sequence_length}
  return dict(sequence_length or {"inputs": 128, "targets": 128})


def rules_for_mesh(layout_rules, mesh_shape) -> str:
  """The layout rules without those naming an optional mesh dimension
  (`OPTIONAL_MESH_DIMENSIONS`) that `mesh_shape` lacks: such a rule splits
  nothing. Dropped rules are logged; a rule naming any
  other absent mesh dimension is left for the mesh to refuse.

  Example:
    >>> rules_for_mesh("ensemble:ensemble,batch:batch,heads:model", "batch:2;model:4")
    'batch:batch;heads:model'
  """
  if isinstance(mesh_shape, str):
    given = [part.split(":")[0].strip() for part in mesh_shape.split(";") if part.strip()]
    repeated = sorted({n for n in given if given.count(n) > 1})
    if repeated:
      raise ValueError(f"mesh shape {mesh_shape!r} repeats the dimension name(s) {repeated}: "
                       "give each mesh dimension its own name, e.g. 'data:4;model:2'.")
  shape = mtf.convert_to_shape(mesh_shape)
  names = set(shape.dimension_names)
  rules = mtf.convert_to_layout_rules(layout_rules)

  def dropped(mesh_dim):
    return mesh_dim not in names and mesh_dim in OPTIONAL_MESH_DIMENSIONS
  gone = [f"{t}:{m}" for t, m in rules.pairs if dropped(m)]
  if gone:
    log(f"layout rules {', '.join(gone)} name mesh dimensions that mesh "
        f"'{shape.to_string()}' lacks: those tensor dimensions are not split")
  return ";".join(f"{t}:{m}" for t, m in rules.pairs if not dropped(m))


def as_schedule(learning_rate_schedule):
  """A learning-rate schedule from a `run.learning_rate_schedule` setting: a
  number (constant), a list of factors (their product), or a schedule (as
  it is).

  Example:
    >>> as_schedule(0.01)(step=7)
    0.01
  """
  if isinstance(learning_rate_schedule, (list, tuple)):
    factors = list(learning_rate_schedule)
    return lambda step, total_train_steps: learning_rate_schedules.product_learning_rate(
        step, total_train_steps, factors=factors)
  if isinstance(learning_rate_schedule, (int, float)) and not isinstance(
      learning_rate_schedule, bool):
    value = float(learning_rate_schedule)
    return lambda step: value
  return learning_rate_schedule


_POSITIVE = ("batch_size", "outer_batch_size", "train_steps", "eval_steps", "keep_checkpoints",
             "grad_accum_steps", "decode_length", "beam_size")
_NON_NEGATIVE = ("eval_every", "num_samples", "checkpoint_every", "log_every")


def check_settings(mode: str, sequence_length: Optional[Mapping[str, int]] = None,
                   **settings) -> None:
  """Rejects counts that cannot work, naming the gin setting (run.<name>).

  Steps, batch sizes, sequence lengths and the like must be positive
  integers (train_steps only matters, and is only checked, in "train" mode);
  eval_every, num_samples, checkpoint_every and log_every may be 0 (never,
  or only at the end).

  Raises:
    ValueError: naming the setting, its value and what it needs.

  Example:
    >>> check_settings("train", train_steps=-5)
    Traceback (most recent call last):
    ValueError: run.train_steps = -5: must be a positive integer ...
  """
  def bad(name, value, need):
    hint = " (use --mode=eval to evaluate without training)" if name == "train_steps" else ""
    raise ValueError(f"run.{name} = {value!r}: must be {need}{hint}; set it with "
                     f"--gin_param=\"run.{name} = ...\".")

  for name, value in settings.items():
    if name == "train_steps" and mode != "train":
      continue
    if name in _POSITIVE or name in _NON_NEGATIVE:
      ok_type = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
      lowest = 1 if name in _POSITIVE else 0
      if not ok_type or value < lowest:
        bad(name, value, "a positive integer" if lowest else "an integer >= 0")
  for key, value in dict(sequence_length or {}).items():
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
      raise ValueError(f"run.sequence_length[{key!r}] = {value!r}: must be a positive "
                       "integer, e.g. run.sequence_length = {'inputs': 128, 'targets': 128}.")



# ------------------------------------------------------------------ the config
class _Ignored:
  """The default of a parameter accepted only to be ignored (see `ignored`)."""

  def __repr__(self) -> str:
    return "IGNORED"


IGNORED = _Ignored()


def ignored(reason: str) -> Any:
  """A RunConfig field of the original's `run` that has no meaning here:
  accepted (so its gin files and calls keep working), and listed with
  `reason` in one warning when set (see `RunConfig.ignored_settings`)."""
  return dataclasses.field(default=IGNORED, repr=False, metadata={"ignored": reason})


_TPU = "a TPU setting (the mesh runs on this process's devices)"
_ESTIMATOR = "an Estimator setting (training runs on mtf.training.Trainer)"
_DATA = "input-pipeline bookkeeping of other packages (use run.dataset_fn for data)"


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunConfig:
  """Every setting of a transformer run (`application.run`), with its default.

  gin binds them as `run.<name>` (see the module docstring); `run(**kwargs)`
  overrides the config for one call. The values may take the alternative
  forms `resolved()` accepts.

  Attributes:
    model_dir: checkpoints and TensorBoard events (None: neither; only train
      and eval work then).
    mode: "train", "eval", "infer", "score" or "export".
    model_type: "lm" or "bitransformer".
    vocabulary: a Vocabulary (default ByteVocabulary()).
    dataset_fn: dataset_fn(split, vocabulary, sequence_length, batch_size,
      seed, repeat, model_type=...) -> tf.data.Dataset of packed features.
    sequence_length: {"inputs": n, "targets": m}.
    batch_size: rows per training batch; the mesh dimension splitting
      "batch" must divide it.
    outer_batch_size: training and evaluation batches of shape [outer_batch,
      batch, length]: outer_batch_size groups of batch_size /
      outer_batch_size rows (the original's tpu_estimator_model_fn
      parameter). A layout may then split the two over different mesh
      dimensions: "outer_batch:slices;batch:data" with run.zero_stage
      shards the training state over `data` only and reduces the
      gradients over `slices` (hybrid sharded data parallelism). Decoding
      and scoring read one flat batch.
    train_steps: the global step to train to (a resumed run continues to it).
    eval_steps: held-out batches per evaluation.
    eval_every: also evaluate every this many steps (0: at the end only).
    mesh_shape: e.g. "rows:2;cols:4".
    layout_rules: e.g. "batch:rows;d_ff:cols;heads:cols;experts:rows".
    lowering: "placement" (one op per device) or "simd" (one program traced
      once for every processor; see mtf.simd_mesh_impl).
    optimizer: an optimizer factory (gin: @optimize.AdafactorOptimizer),
      called with learning_rate=learning_rate_schedule.
    learning_rate_schedule: a function of the step (gin:
      @learning_rate_schedules.cosine_with_warmup), or None for the
      optimizer's default. One with a `total_train_steps` argument (the
      original's schedules, e.g. @learning_rate_schedules.product_learning_rate)
      gets train_steps for it.
    checkpoint_every: save every this many steps (and at the end).
    keep_checkpoints: checkpoints kept in model_dir.
    log_every: print progress every this many steps.
    grad_accum_steps: micro-batches per update.
    seed: data order (weights are initialized from their names).
    vocab_divisor: the model's vocabulary is the vocabulary's size rounded up
      to a multiple of this, so layouts can split it.
    activation_dtype: "float32", "bfloat16" or "float16" (float32 master
      weights either way; use float16 with loss_scale).
    zero_stage: ZeRO stage 0-3 over the mesh dimension splitting "batch"
      (mtf.zero): shard optimizer slots, gradients, variables.
    zero_reshard_after_forward: stage 3: False keeps each gathered variable
      from the forward pass to the backward pass (one gather per step, as
      FSDP's SHARD_GRAD_OP; more memory).
    float32_master_in_optimizer: with bfloat16 or float16 activations, store
      the variables (and checkpoint them) in that dtype and keep their
      float32 masters as an optimizer slot, sharded with the other slots from
      zero_stage 1: 2 bytes per parameter replicated instead of 4, the
      gradients' reduction and the gather of new values in 16 bits
      (DeepSpeed's and Megatron-LM's distributed optimizer's layout).
    loss_scale: dynamic loss scaling for float16 (gin:
      @mixed_precision.DynamicLossScale()), or None.
    jit_compile: compile the train and eval steps with XLA (gin:
      run.jit_compile = True; see Trainer's jit_compile and
      docs/accelerators.md).
    fresh: delete model_dir's checkpoints and events first (train only).
    input_file: infer/score: one text per line (escaped, see inference.escape);
      without it, score scores the validation examples of the data and an
      encoder-decoder's infer decodes their inputs (T5's scoring and
      decoding of a task), into output_file.
    output_file: infer/score: where results go (default: input_file +
      ".outputs" or ".scores").
    targets_file: score: the targets, one per line, of input_file's inputs
      (the original's score_from_strings(inputs, targets): T5's
      score_from_file.gin); without it, input_file holds input<TAB>target.
    num_samples: train: samples printed at the end (0: none).
    sample_prompts: the prompts of those samples ("lm").
    decode_length: tokens to generate ("lm"); the output length is at most
      the targets sequence length.
    temperature: 0 for greedy decoding, else sampling temperature (default:
      the original's gin binding `Bitransformer.decode.temperature` or
      `Unitransformer.sample_autoregressive.temperature`, as T5's
      sample_decode.gin sets it; else 0, greedy, for infer, as the original
      decodes, and 0.6 for the samples printed after training).
    top_k: sample from the k most likely tokens (0 or -1: all; default: the
      original's `...sampling_keep_top_k` binding, else all for infer and 40
      for the samples after training).
    beam_size: beam search width ("bitransformer"; 1: greedy or sampling;
      default: gin's `Bitransformer.decode.beam_size`, else 1).
    alpha: beam search length penalty (default: gin's
      `Bitransformer.decode.alpha`, else 0.6).
    checkpoint_path: restore this checkpoint (e.g. ".../ckpt-400") instead of
      the newest intact one of model_dir (see mtf.checkpoint_verify).
    input_encoding: infer/score: the encoding of input_file.
    input_errors: infer/score: "strict" (an undecodable byte is an error
      naming the file and line), "replace" or "ignore".
    init_checkpoint: train: a checkpoint (path prefix, or a model directory
      for its latest) of this library or of the original Mesh TensorFlow to
      start from when model_dir has none yet (fine-tuning); later runs
      resume from model_dir as usual.
    init_checkpoint_reset_optimizer: with init_checkpoint: start the
      optimizer state (slots) and the global step afresh instead of taking
      them from the checkpoint (by default both continue, so T5-style
      fine-tuning sets train_steps to the pretrained step plus the new
      steps).
    save_checkpoints_steps: the original's name of checkpoint_every (wins
      when set).
    keep_checkpoint_max: the original's name of keep_checkpoints (wins when
      set).
    total_run_steps: the total steps the learning-rate schedule is given
      (default: train_steps).
    perplexity_eval_steps: the original's name of eval_steps (wins when set).
    eval_checkpoint_step: eval/infer/score: read the checkpoint of this step
      of model_dir; also, as the original, a list of steps, "all" (every
      checkpoint, in step order; T5's infer.gin default) or -1 (the newest).
      With several, each is evaluated in turn, or decoded or scored into
      `<output_file>-<step>`.
    variable_filter: refused (training only some variables is not supported).
    ensemble_inputs: refused (ensembles are not supported).
    export_dir: export: where the SavedModel goes (default
      `<model_dir>/export/<step>`); its mesh is `export_saved_model.mesh_shape`
      (default one device), not `mesh_shape`.

  The alternative forms `resolved()` accepts: `batch_size` as a (method,
  value) pair such as ("tokens_per_batch", 65536), `train_steps` as a
  function such as @utils.auto_train_steps, `sequence_length` as an int,
  `mesh_shape` as an mtf.Shape (@utils.tpu_mesh_shape()),
  `learning_rate_schedule` as a number or a list of factors, the modes
  "perplexity_eval" and "score_eval" (eval), "score_from_strings" and
  "score_from_dataset" (score: the lines of input_file, or without it the
  validation examples of the data, as T5 scores a task). The dtypes come
  from `utils.get_variable_dtype` (activation_dtype here overrides its
  activation dtype), micro-batches from `utils.serialize_num_microbatches`
  when grad_accum_steps is None, and the vocabulary rounding from the
  model's own `Unitransformer.vocab_divisor` unless vocab_divisor is given.
  The original's TPU and Estimator settings (the fields made with `ignored`;
  `ignored_parameters()` says why each is ignored) are accepted and ignored
  with one warning that lists them.

  Example:
    >>> RunConfig(model_dir="/tmp/lm", train_steps=10).mode
    'train'
  """
  model_dir: Optional[str] = dataclasses.field(kw_only=False)
  mode: str = "train"
  model_type: str = "lm"
  vocabulary: Optional[vocabulary_lib.Vocabulary] = None
  dataset_fn: Callable = dataset_lib.dataset_fn
  sequence_length: Any = None
  batch_size: Any = 32
  outer_batch_size: int = 1
  train_steps: Any = 1000
  eval_steps: int = 20
  eval_every: int = 0
  mesh_shape: Any = "rows:2;cols:4"
  layout_rules: str = "batch:rows;d_ff:cols;heads:cols;experts:rows"
  lowering: str = "placement"
  optimizer: Any = None
  learning_rate_schedule: Any = None
  checkpoint_every: int = 500
  keep_checkpoints: int = 3
  log_every: int = 50
  grad_accum_steps: Optional[int] = None
  seed: int = 1
  vocab_divisor: Optional[int] = None
  activation_dtype: Optional[str] = None
  zero_stage: int = 0
  zero_reshard_after_forward: bool = True
  float32_master_in_optimizer: bool = False
  loss_scale: Any = None
  jit_compile: Any = False
  fresh: bool = False
  input_file: Optional[str] = None
  output_file: Optional[str] = None
  targets_file: Optional[str] = None
  num_samples: int = 4
  sample_prompts: Sequence[str] = ("def ", "class ", "import ", "    return ")
  decode_length: int = 96
  temperature: Optional[float] = None
  top_k: Optional[int] = None
  beam_size: Optional[int] = None
  alpha: Optional[float] = None
  checkpoint_path: Optional[str] = None
  input_encoding: str = "utf-8"
  input_errors: str = "strict"
  init_checkpoint: Optional[str] = None
  init_checkpoint_reset_optimizer: bool = False
  save_checkpoints_steps: Optional[int] = None
  keep_checkpoint_max: Optional[int] = None
  total_run_steps: Optional[int] = None
  perplexity_eval_steps: Optional[int] = None
  eval_checkpoint_step: Optional[Union[int, str, Sequence[int]]] = None
  variable_filter: Optional[str] = None
  ensemble_inputs: Optional[int] = None
  # The original's parameters that have no meaning here, each with why.
  tpu_job_name: Any = ignored(_TPU)
  tpu: Any = ignored(_TPU)
  gcp_project: Any = ignored(_TPU)
  tpu_zone: Any = ignored(_TPU)
  iterations_per_loop: Any = ignored(_TPU)
  mesh_devices: Any = ignored(_TPU)
  autostack: Any = ignored("variable stacking is the lowering's concern, not a setting")
  dataset_split: Any = ignored("the splits are fixed per mode (train data, validation data)")
  export_checkpoint_step: Any = ignored("export reads run.checkpoint_path or the latest")
  export_path: Any = ignored("export writes to run.export_dir")
  eval_summary_dir: Any = ignored("evaluations write their events to model_dir")
  predict_fn: Any = ignored(_ESTIMATOR)
  train_model_fn: Any = ignored(_ESTIMATOR)
  skip_seen_data: Any = ignored(_DATA)
  seen_data_init_step: Any = ignored(_DATA)
  output_eval_examples: Any = ignored(_DATA)
  checkpoint_input_pipeline: Any = ignored(_DATA)
  train_dataset_fn: Any = ignored(_DATA)
  eval_dataset_fn: Any = ignored(_DATA)
  export_dir: Optional[str] = None

  @classmethod
  def ignored_parameters(cls) -> Dict[str, str]:
    """{parameter: why it is ignored} of the fields made with `ignored`.

    Example:
      >>> RunConfig.ignored_parameters()["tpu"]
      "a TPU setting (the mesh runs on this process's devices)"
    """
    return {f.name: f.metadata["ignored"] for f in dataclasses.fields(cls)
            if "ignored" in f.metadata}

  def ignored_settings(self) -> Dict[str, Any]:
    """{parameter: value} of the ignored parameters this config sets."""
    return {name: getattr(self, name) for name in self.ignored_parameters()
            if getattr(self, name) is not IGNORED}

  def resolved(self) -> "RunConfig":
    """This config in canonical form, checked.

    The alternative forms become the canonical ones (see the class
    docstring): `mode` one of MODES, `vocabulary` one Vocabulary,
    `sequence_length` a dict, `mesh_shape` a string, `batch_size` and
    `train_steps` ints, save_checkpoints_steps, keep_checkpoint_max and
    perplexity_eval_steps folded into checkpoint_every, keep_checkpoints and
    eval_steps, `layout_rules` without rules naming an
    optional mesh dimension the mesh lacks (`rules_for_mesh`), and
    `beam_size`/`alpha`/`temperature`/`top_k` from the original's gin
    bindings of the decoding methods when unset (see their docs). The
    ignored parameters that are set are logged in one warning and cleared,
    so resolving a resolved config changes nothing.

    Raises:
      ValueError: naming the `run.<name>` setting that cannot work.

    Example:
      >>> RunConfig(model_dir=None, sequence_length=64).resolved().sequence_length
      {'inputs': 64, 'targets': 64}
    """
    given = self.ignored_settings()
    if given:
      reasons = self.ignored_parameters()
      logging.warning("utils.run: ignoring %d of the original's parameters that have no "
                      "meaning here: %s", len(given),
                      "; ".join(f"{k}={v!r} ({reasons[k]})" for k, v in given.items()))
    if self.variable_filter:
      raise ValueError(f"run.variable_filter = {self.variable_filter!r}: training only some "
                       "variables is not supported here; remove the binding.")
    if self.ensemble_inputs:
      raise ValueError(f"run.ensemble_inputs = {self.ensemble_inputs!r}: ensembles are not "
                       "supported here; remove the binding.")
    mode = MODE_ALIASES.get(self.mode, self.mode)
    if mode not in MODES:
      raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}.")
    if self.model_type not in MODEL_TYPES:
      raise ValueError(f"model_type must be one of {MODEL_TYPES}, got {self.model_type!r}.")
    sequence_length = as_sequence_lengths(self.sequence_length)
    mesh_shape = self.mesh_shape
    if isinstance(mesh_shape, mtf.Shape):
      mesh_shape = mesh_shape.to_string()
    batch_size = self.batch_size
    if not isinstance(batch_size, int):
      batch_size = compute_batch_size(sequence_length, mesh_shape, self.layout_rules,
                                      batch_size)
    train_steps = self.train_steps
    if callable(train_steps):
      train_steps = int(train_steps(batch_size, sequence_length))
    config = dataclasses.replace(
        self, mode=mode, vocabulary=_one_vocabulary(self.vocabulary),
        sequence_length=sequence_length, mesh_shape=mesh_shape, batch_size=batch_size,
        train_steps=train_steps,
        checkpoint_every=self.save_checkpoints_steps or self.checkpoint_every,
        keep_checkpoints=self.keep_checkpoint_max or self.keep_checkpoints,
        eval_steps=self.perplexity_eval_steps or self.eval_steps,
        save_checkpoints_steps=None, keep_checkpoint_max=None, perplexity_eval_steps=None,
        layout_rules=rules_for_mesh(self.layout_rules, mesh_shape),
        beam_size=inference.decode_setting("beam_size", self.beam_size, 1),
        alpha=inference.decode_setting("alpha", self.alpha, 0.6),
        temperature=inference.decode_setting("temperature", self.temperature,
                                             0.0 if mode == "infer" else 0.6, self.model_type),
        top_k=inference.decode_setting("sampling_keep_top_k", self.top_k,
                                       -1 if mode == "infer" else 40, self.model_type),
        **{name: IGNORED for name in given})
    check_settings(
        mode, sequence_length=sequence_length, batch_size=batch_size,
        outer_batch_size=config.outer_batch_size, train_steps=train_steps,
        eval_steps=config.eval_steps, eval_every=config.eval_every,
        checkpoint_every=config.checkpoint_every, keep_checkpoints=config.keep_checkpoints,
        log_every=config.log_every,
        grad_accum_steps=1 if config.grad_accum_steps is None else config.grad_accum_steps,
        decode_length=config.decode_length, num_samples=config.num_samples,
        beam_size=config.beam_size)
    return config


def _one_vocabulary(vocabulary) -> vocabulary_lib.Vocabulary:
  """run.vocabulary as one Vocabulary (default ByteVocabulary())."""
  if isinstance(vocabulary, modeling.ForeignValue):
    raise ValueError(
        f"The config's `{vocabulary.binding}` names another package's vocabulary. Set one "
        "of this library's: --gin_param=\"run.vocabulary = "
        "@vocabulary.SentencePieceVocabulary()\" --gin_param=\"SentencePieceVocabulary."
        "sentencepiece_model_file = 'spm.model'\" --gin_param=\"SentencePieceVocabulary."
        "extra_ids = 100\" (T5's), or @vocabulary.ByteVocabulary().")
  if isinstance(vocabulary, (list, tuple)):
    if len(vocabulary) != 2 or vocabulary[0] is not vocabulary[1]:
      raise ValueError("run.vocabulary: separate inputs and targets vocabularies are not "
                       "supported; give one vocabulary.")
    vocabulary = vocabulary[0]
  return vocabulary or vocabulary_lib.ByteVocabulary()


# gin's `run`: its bindings are RunConfig's defaults.
gin.configurable("run", module=GIN_MODULE)(RunConfig)
