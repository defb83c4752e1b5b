"""Train, evaluate, decode and score transformers, driven by gin.

`run` is the whole program behind `python -m mesh_tensorflow.transformer.main`:
it builds the mesh from gin parameters (`mesh_shape`, `layout`), the model
(`model_type` "lm" for a decoder-only `Unitransformer`, "bitransformer" for an
encoder-decoder `Bitransformer`), the data (`dataset.dataset_fn`), and then,
by `mode`:

* "train": trains to `train_steps` with `mtf.training.Trainer` (checkpoints
  and TensorBoard events in `model_dir`; a rerun resumes), evaluates held-out
  loss and perplexity, and prints a few generated samples;
* "eval": held-out loss, perplexity and token accuracy of the checkpoint;
* "infer": decodes every line of `input_file` into `output_file`;
* "score": writes the log-likelihood of every line of `input_file` (a text
  for "lm", "input<TAB>target" for "bitransformer") to `output_file`; without
  `input_file`, of every validation example of the data (a TFDS dataset, a
  seqio task, files), one per line in the data's order;
* "export": writes a SavedModel of the checkpoint to `export_dir`, served
  without this library (see `mesh_tensorflow.transformer.export`).

    >>> from mesh_tensorflow.transformer import gin_config
    >>> gin_config.parse(["models/tiny_lm.gin", "layouts/2x4.gin"], ["run.train_steps = 10"])
    >>> run(model_dir="/tmp/lm", mode="train")["eval_loss"]
    4.9
"""

from __future__ import annotations

import math
import os
import time
from typing import Callable, Dict, List, Mapping, Optional, Sequence

from absl import logging
import gin
import numpy as np
import tensorflow as tf

import mesh_tensorflow as mtf

from mesh_tensorflow import _environment
from mesh_tensorflow.transformer import dataset as dataset_lib
from mesh_tensorflow.transformer import export as export_lib
from mesh_tensorflow.transformer import inference
from mesh_tensorflow.transformer import learning_rate_schedules
from mesh_tensorflow.transformer import modeling
from mesh_tensorflow.transformer import vocabulary as vocabulary_lib
from mesh_tensorflow.transformer.inference import log
from mesh_tensorflow.transformer.modeling import MODEL_TYPES
from mesh_tensorflow.transformer.modeling import make_mesh_impl  # noqa: F401 (utils.make_mesh_impl)

MODES = ("train", "eval", "infer", "score", "export")

# The optimizers, configurable from gin under the original's module path:
# @optimize.AdafactorOptimizer or @mesh_tensorflow.optimize.AdafactorOptimizer.
adafactor_decay_rate_pow = gin.external_configurable(
    mtf.optimize.adafactor_decay_rate_pow, module="mesh_tensorflow.optimize")
adafactor_decay_rate_adam = gin.external_configurable(
    mtf.optimize.adafactor_decay_rate_adam, module="mesh_tensorflow.optimize")


class AdafactorOptimizer(mtf.optimize.AdafactorOptimizer):
  """`mtf.optimize.AdafactorOptimizer` whose default `decay_rate` is gin's
  `adafactor_decay_rate_pow()`, so `adafactor_decay_rate_pow.offset = 0` (as
  the original's operative configs write it) applies, as in the original.

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
# The initializer of the dense layers: configured in place, so the original's
# `VarianceScalingInitializer.scale = ...` applies wherever layers create one.
gin.configurable("VarianceScalingInitializer", module="mesh_tensorflow.layers")(
    mtf.initializers.VarianceScalingInitializer)


# ------------------------------------------- the original's run-level helpers
@gin.configurable
def tpu_mesh_shape(tpu_topology: Optional[str] = None, model_parallelism=1,
                   ensemble_parallelism: Optional[int] = None) -> mtf.Shape:
  """The original's mesh for a TPU topology: "batch" (data parallelism) x
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


@gin.configurable
def get_variable_dtype(master_dtype="float32", slice_dtype="float32",
                       activation_dtype="float32") -> mtf.VariableDType:
  """The run's dtypes (gin: `utils.get_variable_dtype.activation_dtype =
  "bfloat16"`): master (checkpointed) weights, their in-memory slices, and
  activations. Unlike the original, whose default master dtype was bfloat16,
  the default here is float32 (a bfloat16 checkpoint still restores into it
  exactly). `run` keeps the master dtype of the checkpoint it starts from
  (the model directory's, or init_checkpoint) unless the config sets
  `get_variable_dtype.master_dtype`, so a model the original trained with
  its default bfloat16 masters goes on training and saving bfloat16 masters.

  Example:
    >>> get_variable_dtype(activation_dtype="bfloat16").activation_dtype
    tf.bfloat16
  """
  return mtf.VariableDType(tf.as_dtype(master_dtype), tf.as_dtype(slice_dtype),
                           tf.as_dtype(activation_dtype))


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


@gin.configurable
def serialize_num_microbatches(batch_per_replica: int, sequence_length: Mapping[str, int],
                               tokens_per_microbatch_per_replica: Optional[int] = None) -> int:
  """Micro-batches per training step (gradient accumulation), as the
  original chose them: the largest micro-batch of at most
  `tokens_per_microbatch_per_replica` tokens per replica that divides the
  replica's batch (1 micro-batch when unset).

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


@gin.configurable
def auto_train_steps(batch_size: int, sequence_length: Mapping[str, int],
                     train_tokens: int = 2 ** 36) -> int:
  """The original's default train_steps: train_tokens / tokens per batch.

  Example:
    >>> auto_train_steps(128, {"inputs": 512, "targets": 128}, 2 ** 20)
    16
  """
  return int(train_tokens) // (batch_size * max(sequence_length.values()))


# ------------------------------------------------------------------ the mesh
def configure_cpu_devices(num_devices: int = 8) -> List[str]:
  """Splits the host CPU into `num_devices` logical devices and names them.

  Must run before TensorFlow initializes its devices (main.py does it first);
  if they are already initialized, the existing logical CPUs are returned
  (make_mesh_impl says so if there are too few).

  Example:
    >>> configure_cpu_devices(8)[:2]
    ['/device:CPU:0', '/device:CPU:1']
  """
  cpus = tf.config.list_physical_devices("CPU")
  try:
    tf.config.set_logical_device_configuration(
        cpus[0], [tf.config.LogicalDeviceConfiguration() for _ in range(num_devices)])
  except RuntimeError:
    pass  # Already initialized (e.g. by a test's conftest): use what exists.
  return [d.name for d in tf.config.list_logical_devices("CPU")]


# ----------------------------------------------------------------- helpers
def unigram_entropy(ds: tf.data.Dataset, num_batches: int = 100,
                    key: str = "targets") -> float:
  """Entropy (nats per token) of the token frequencies in the first
  `num_batches` batches, padding excluded: the loss of the best model that
  ignores context.

  Example:
    >>> unigram_entropy(train_dataset)
    3.14
  """
  counts = None
  for batch in ds.take(num_batches):
    ids = batch[key].numpy().ravel()
    ids = ids[ids != 0]
    c = np.bincount(ids)
    if counts is None:
      counts = c
    else:
      size = max(len(counts), len(c))
      counts = np.pad(counts, (0, size - len(counts))) + np.pad(c, (0, size - len(c)))
  if counts is None or counts.sum() == 0:
    return float("nan")
  p = counts[counts > 0] / counts.sum()
  return float(-(p * np.log(p)).sum())


def unpacked_validation_data(dataset_fn: Callable, vocabulary, sequence_length: Mapping[str, int],
                             model_type: str) -> tf.data.Dataset:
  """The validation split of `dataset_fn`'s data, one example per row, every
  example once (batches of one, no repeat), for scoring.

  Example:
    >>> ds = unpacked_validation_data(dataset_lib.dataset_fn, vocab, {"targets": 128}, "lm")
  """
  try:
    return dataset_fn(dataset_lib.VALIDATION, vocabulary, sequence_length, 1, None, False,
                      model_type=model_type, packed=False)
  except TypeError as e:
    if "packed" not in str(e):
      raise
    raise ValueError(f"--mode=score without --input_file needs a dataset_fn that takes "
                     f"packed=False (one example per row); {dataset_fn!r} does not: give "
                     f"--input_file instead.") from e


def make_optimizer(optimizer, learning_rate_schedule):
  """The optimizer: calls the factory (a gin reference such as
  @optimize.AdafactorOptimizer; default Adafactor) with the schedule as its
  learning rate ("lr" for SGD and momentum); an Optimizer is used as it is.

  Example:
    >>> make_optimizer(mtf.optimize.AdafactorOptimizer,
    ...                functools.partial(lrs.cosine_with_warmup, peak=0.05))
  """
  if optimizer is None:
    optimizer = AdafactorOptimizer
  if isinstance(optimizer, mtf.optimize.Optimizer):
    return optimizer  # Already an optimizer.
  if learning_rate_schedule is None:
    return optimizer()
  uses_lr = isinstance(optimizer, type) and issubclass(
      optimizer, (mtf.optimize.SgdOptimizer, mtf.optimize.MomentumOptimizer))
  name = "lr" if uses_lr else "learning_rate"
  return optimizer(**{name: learning_rate_schedule})


def clean_decodes(ids, eos_id: int = 1, pad_id: int = 0, length_axis: int = -1) -> tf.Tensor:
  """Replaces every id after the first `eos_id` (kept) with `pad_id`.

  Example:
    >>> clean_decodes([[5, 1, 7, 7]]).numpy().tolist()
    [[5, 1, 0, 0]]
  """
  ids = tf.convert_to_tensor(ids)
  is_eos = tf.cast(tf.equal(ids, tf.cast(eos_id, ids.dtype)), tf.int32)
  after_eos = tf.cumsum(is_eos, axis=length_axis, exclusive=True) > 0
  return tf.where(after_eos, tf.cast(pad_id, ids.dtype), ids)


def _maybe_decode_python(ids_or_strs, vocabulary) -> list:
  """Each element as text: id sequences decoded with `vocabulary`, bytes as
  UTF-8, strings as they are."""
  out = []
  for item in ids_or_strs:
    values = list(np.asarray(item).tolist()) if isinstance(item, np.ndarray) else list(item)
    if values and all(isinstance(v, (int, np.integer)) for v in values):
      out.append(vocabulary.decode([int(v) for v in values]))
    else:
      out.append([v.decode("utf-8") if isinstance(v, bytes) else v for v in values])
  return out


def concat_inputs_and_targets(mtf_features: Mapping[str, "mtf.Tensor"]) -> Dict[str, "mtf.Tensor"]:
  """Turns (packed) input/target pairs into language-model sequences.

  Each example's inputs are followed by its targets in one sequence twice as
  long, for training a decoder-only model on sequence-to-sequence data (the
  original's "delimited_lm"). Packed features ("inputs_segmentation",
  "inputs_position" and the same for "targets") keep their packing: example s
  becomes inputs_s then targets_s, examples in segment order, positions
  counting on from the inputs into the targets, padding (segment 0) at the
  end. Without segmentation, the nonzero ids are one example.

  Args:
    mtf_features: "inputs" and "targets", int tensors [..., length] (the same
      shape), with or without their "_segmentation" and "_position" features.

  Returns:
    {"targets", "targets_segmentation", "targets_position"} over the
    batch dimensions and a "length" dimension of twice the size (only
    "targets" when the input had no segmentation).

  Example:
    >>> out = concat_inputs_and_targets({"inputs": x, "targets": y})
    >>> out["targets"].shape   # [batch, length * 2]
  """
  inputs, targets = mtf_features["inputs"], mtf_features["targets"]
  if inputs.shape != targets.shape:
    raise ValueError(
        f"concat_inputs_and_targets: 'inputs' has shape {inputs.shape} and 'targets' "
        f"{targets.shape}; they need the same shape (pad to one length).")
  mesh, length = inputs.mesh, inputs.shape.dims[-1]
  packed = "inputs_segmentation" in mtf_features
  if packed:
    seg_in, seg_tg = mtf_features["inputs_segmentation"], mtf_features["targets_segmentation"]
    pos_in, pos_tg = mtf_features["inputs_position"], mtf_features["targets_position"]
  else:
    seg_in = mtf.cast(mtf.not_equal(inputs, 0), tf.int32)
    seg_tg = mtf.cast(mtf.not_equal(targets, 0), tf.int32)
    pos_in = pos_tg = mtf.broadcast(mtf.range(mesh, length, tf.int32), inputs.shape)
  # At most `length` examples per row; segment 0 is padding.
  segment = mtf.Dimension("segment", length.size + 1)
  real = mtf.cast(mtf.not_equal(mtf.range(mesh, segment, tf.int32), 0), tf.int32)

  def tokens_per_segment(seg):
    return real * mtf.reduce_sum(mtf.one_hot(seg, segment, dtype=tf.int32), reduced_dim=length)
  n_in, n_tg = tokens_per_segment(seg_in), tokens_per_segment(seg_tg)
  new_length = mtf.Dimension("new_length", 2 * length.size)
  # Where each segment starts in the new row; padding goes past its end.
  start = (mtf.cumsum(n_in + n_tg, segment, exclusive=True)
           + (1 - real) * new_length.size)

  def at_segment(values, seg):
    return mtf.gather(values, seg, segment)
  dest_in = at_segment(start, seg_in) + pos_in
  pos_tg_new = at_segment(n_in, seg_tg) + pos_tg
  dest_tg = at_segment(start, seg_tg) + pos_tg_new
  slots = mtf.range(mesh, new_length, tf.int32)
  to_in = mtf.cast(mtf.equal(dest_in, slots), tf.int32)
  to_tg = mtf.cast(mtf.equal(dest_tg, slots), tf.int32)
  out_shape = inputs.shape.dims[:-1] + [new_length]

  def scatter(from_inputs, from_targets):
    merged = (mtf.einsum([from_inputs, to_in], output_shape=out_shape)
              + mtf.einsum([from_targets, to_tg], output_shape=out_shape))
    return mtf.rename_dimension(merged, "new_length", length.name)
  out = {"targets": scatter(mtf.cast(inputs, tf.int32), mtf.cast(targets, tf.int32))}
  if packed:
    out["targets_segmentation"] = scatter(seg_in, seg_tg)
    out["targets_position"] = scatter(pos_in, pos_tg_new)
  return out


_dynamic_text2self = concat_inputs_and_targets  # the original's name


def _clear_model_dir(model_dir: str) -> None:
  for pattern in ("checkpoint", "ckpt-*", "events.out.tfevents.*"):
    for path in tf.io.gfile.glob(os.path.join(model_dir, pattern)):
      if tf.io.gfile.isdir(path):
        tf.io.gfile.rmtree(path)
      else:
        tf.io.gfile.remove(path)


_EVAL_WRITERS: Dict[str, tf.summary.SummaryWriter] = {}


def _write_scalars(model_dir: Optional[str], step: int, values: Dict[str, float]) -> None:
  """TensorBoard scalars of evaluations ("eval/perplexity") in model_dir,
  next to the Trainer's "eval/loss" (TensorBoard reads every events file of
  the directory)."""
  if not model_dir or not _environment.tensorboard_available(model_dir):
    return
  path = model_dir
  if path not in _EVAL_WRITERS:
    _EVAL_WRITERS[path] = tf.summary.create_file_writer(path)
  writer = _EVAL_WRITERS[path]
  with writer.as_default(step=step):
    for name, value in values.items():
      tf.summary.scalar(f"eval/{name}", value)
  writer.flush()


# Mesh dimensions the original's layouts name whether or not the mesh has
# them (T5's say "ensemble:ensemble" on meshes without an ensemble dimension).
OPTIONAL_MESH_DIMENSIONS = ("ensemble",)


def rules_for_mesh(layout_rules, mesh_shape) -> str:
  """The layout rules without those naming an optional mesh dimension
  (`OPTIONAL_MESH_DIMENSIONS`) that `mesh_shape` lacks: as in the original,
  such a rule splits nothing. Dropped rules are logged; a rule naming any
  other absent mesh dimension is left for the mesh to refuse.

  Example:
    >>> rules_for_mesh("ensemble:ensemble,batch:batch,heads:model", "batch:2;model:4")
    'batch:batch;heads:model'
  """
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


def _schedule(learning_rate_schedule):
  """The original's forms of run.learning_rate_schedule: a number (constant),
  a list of factors (their product), or a schedule."""
  if isinstance(learning_rate_schedule, (list, tuple)):
    factors = list(learning_rate_schedule)
    return lambda step, total_train_steps: learning_rate_schedules.product_learning_rate(
        step, total_train_steps, factors=factors)
  if isinstance(learning_rate_schedule, (int, float)) and not isinstance(
      learning_rate_schedule, bool):
    value = float(learning_rate_schedule)
    return lambda step: value
  return learning_rate_schedule


def checkpoint_at_step(model_dir: str, step: int) -> str:
  """The checkpoint of model_dir written at `step` (either library's naming:
  ckpt-N or model.ckpt-N).

  Raises:
    ValueError: naming the steps model_dir has, when none is at `step`.

  Example:
    >>> checkpoint_at_step("/tmp/lm", 400)
    '/tmp/lm/ckpt-400'
  """
  state = tf.train.get_checkpoint_state(model_dir)
  paths = list(state.all_model_checkpoint_paths) if state else []
  for path in paths:
    if path.rsplit("-", 1)[-1] == str(int(step)):
      return path if os.path.isabs(path) or "://" in path else os.path.join(model_dir, path)
  steps = [p.rsplit("-", 1)[-1] for p in paths]
  raise ValueError(f"run.eval_checkpoint_step = {step}: {model_dir} has no checkpoint of that "
                   f"step (it has steps {', '.join(steps) or 'none'}).")


def _master_dtype_from_checkpoint(variable_dtype: mtf.VariableDType,
                                  prefix: Optional[str]) -> mtf.VariableDType:
  """variable_dtype, with the master dtype of the checkpoint the run starts
  from where the config does not set `get_variable_dtype.master_dtype`: a
  model directory the original trained with its default bfloat16 masters
  keeps training and saving bfloat16 masters, as it would there."""
  if prefix is None or modeling._bound("get_variable_dtype", "master_dtype"):  # pylint: disable=protected-access
    return variable_dtype
  from mesh_tensorflow.compat import original_checkpoint  # pylint: disable=g-import-not-at-top
  try:
    saved = original_checkpoint.saved_master_dtype(resolve_checkpoint(prefix))
  except tf.errors.OpError:
    # A damaged or unreadable checkpoint: the restore reports which file.
    return variable_dtype
  if saved is None or saved == variable_dtype.master_dtype:
    return variable_dtype
  log(f"master dtype {saved.name}, as the checkpoint {prefix} holds (set "
      "get_variable_dtype.master_dtype to choose another)")
  return mtf.VariableDType(saved, variable_dtype.slice_dtype, variable_dtype.activation_dtype)


def resolve_checkpoint(path: str) -> str:
  """A checkpoint path prefix: `path` itself, or a directory's latest.

  Example:
    >>> resolve_checkpoint("/models/t5_small")
    '/models/t5_small/model.ckpt-1000000'
  """
  if tf.io.gfile.isdir(path):
    latest = tf.train.latest_checkpoint(path)
    if not latest:
      raise ValueError(f"init_checkpoint {path!r} is a directory without a checkpoint "
                       "(no 'checkpoint' state file naming one).")
    return latest
  if not tf.io.gfile.exists(path + ".index"):
    raise ValueError(f"init_checkpoint {path!r}: no such checkpoint (give a path prefix "
                     "such as DIR/model.ckpt-1000000, or a model directory).")
  return path


def start_from_checkpoint(trainer: "mtf.training.Trainer", mesh_impl, init_checkpoint: str,
                          reset_optimizer: bool = False) -> Optional[str]:
  """Fine-tuning: makes a Trainer whose model_dir has no checkpoint yet start
  from `init_checkpoint` (this library's or the original's format); a
  Trainer that already resumed from its model_dir keeps that.

  Args:
    trainer: the Trainer (before its first step).
    mesh_impl: its mesh implementation.
    init_checkpoint: checkpoint path prefix or model directory.
    reset_optimizer: start the optimizer state and the global step afresh.

  Returns:
    The checkpoint path restored, or None when the trainer had resumed.

  Example:
    >>> start_from_checkpoint(trainer, impl, "/models/t5_small", reset_optimizer=True)
    '/models/t5_small/model.ckpt-1000000'
  """
  manager = trainer.checkpoint_manager
  if manager is not None and manager.latest_checkpoint:
    log(f"init_checkpoint {init_checkpoint} not used: {manager.directory} already has "
        f"{manager.latest_checkpoint}")
    return None
  path = resolve_checkpoint(init_checkpoint)
  if manager is None:
    manager = mtf.checkpoint.CheckpointManager(mesh_impl, os.path.dirname(path) or ".")
  kwargs = {}
  import inspect  # pylint: disable=g-import-not-at-top
  if "include_optimizer_state" in inspect.signature(manager.restore).parameters:
    kwargs["include_optimizer_state"] = not reset_optimizer
  elif reset_optimizer:
    kwargs["allow_missing"] = True
  manager.restore(path, **kwargs)
  if reset_optimizer:
    step = slice_variables_step(mesh_impl)
    step.assign(0)
  log(f"initialized from {path} (step {trainer.global_step}"
      f"{', optimizer state and step reset' if reset_optimizer else ''})")
  return path


def slice_variables_step(mesh_impl) -> tf.Variable:
  """The Trainer's global step variable on mesh_impl."""
  return mtf.slice_variables.scalar_state(mesh_impl, "global_step", tf.int64)


# ------------------------------------------------------------------ run
_POSITIVE = ("batch_size", "train_steps", "eval_steps", "keep_checkpoints",
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


# run()'s parameters from the original that have no meaning here (TPU and
# Estimator settings, export, input-pipeline bookkeeping): accepted, ignored,
# and listed in one warning when given.
_IGNORED_RUN_PARAMETERS = (
    "tpu_job_name", "tpu", "gcp_project", "tpu_zone", "autostack", "dataset_split",
    "export_checkpoint_step", "export_path", "iterations_per_loop", "eval_summary_dir",
    "mesh_devices", "predict_fn", "train_model_fn", "skip_seen_data", "seen_data_init_step",
    "output_eval_examples", "checkpoint_input_pipeline", "train_dataset_fn",
    "eval_dataset_fn")
_UNSET = object()
# The original's modes and what they are here.
_MODE_ALIASES = {"perplexity_eval": "eval", "score_from_strings": "score"}


@gin.configurable
def run(model_dir: Optional[str],
        mode: str = "train",
        model_type: str = "lm",
        vocabulary: Optional[vocabulary_lib.Vocabulary] = None,
        dataset_fn: Callable = dataset_lib.dataset_fn,
        sequence_length=None,
        batch_size=32,
        train_steps=1000,
        eval_steps: int = 20,
        eval_every: int = 0,
        mesh_shape="rows:2;cols:4",
        layout_rules: str = "batch:rows;d_ff:cols;heads:cols;experts:rows",
        lowering: str = "placement",
        optimizer=None,
        learning_rate_schedule=None,
        checkpoint_every: int = 500,
        keep_checkpoints: int = 3,
        log_every: int = 50,
        grad_accum_steps: Optional[int] = None,
        seed: int = 1,
        vocab_divisor: Optional[int] = None,
        activation_dtype: Optional[str] = None,
        zero_stage: int = 0,
        loss_scale=None,
        jit_compile=False,
        fresh: bool = False,
        input_file: Optional[str] = None,
        output_file: Optional[str] = None,
        num_samples: int = 4,
        sample_prompts: Sequence[str] = ("def ", "class ", "import ", "    return "),
        decode_length: int = 96,
        temperature: float = 0.6,
        top_k: int = 40,
        beam_size: Optional[int] = None,
        alpha: Optional[float] = None,
        checkpoint_path: Optional[str] = None,
        input_encoding: str = "utf-8",
        input_errors: str = "strict",
        init_checkpoint: Optional[str] = None,
        init_checkpoint_reset_optimizer: bool = False,
        save_checkpoints_steps: Optional[int] = None,
        keep_checkpoint_max: Optional[int] = None,
        total_run_steps: Optional[int] = None,
        perplexity_eval_steps: Optional[int] = None,
        eval_checkpoint_step: Optional[int] = None,
        variable_filter: Optional[str] = None,
        ensemble_inputs: Optional[int] = None,
        tpu_job_name=_UNSET, tpu=_UNSET, gcp_project=_UNSET, tpu_zone=_UNSET,
        autostack=_UNSET, dataset_split=_UNSET, export_checkpoint_step=_UNSET,
        export_path=_UNSET, iterations_per_loop=_UNSET, eval_summary_dir=_UNSET,
        mesh_devices=_UNSET, predict_fn=_UNSET, train_model_fn=_UNSET,
        skip_seen_data=_UNSET, seen_data_init_step=_UNSET, output_eval_examples=_UNSET,
        checkpoint_input_pipeline=_UNSET, train_dataset_fn=_UNSET,
        eval_dataset_fn=_UNSET,
        export_dir: Optional[str] = None) -> Dict[str, float]:
  """Trains, evaluates, decodes or scores a transformer (see module docstring).

  Args:
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
    loss_scale: dynamic loss scaling for float16 (gin:
      @mixed_precision.DynamicLossScale()), or None.
    jit_compile: compile the train and eval steps with XLA (gin:
      run.jit_compile = True; see Trainer's jit_compile and
      docs/accelerators.md).
    fresh: delete model_dir's checkpoints and events first (train only).
    input_file: infer/score: one text per line (escaped, see inference.escape).
    output_file: infer/score: where results go (default: input_file +
      ".outputs" or ".scores").
    num_samples: train: samples printed at the end (0: none).
    sample_prompts: the prompts of those samples ("lm").
    decode_length: tokens to generate ("lm"); the output length is at most
      the targets sequence length.
    temperature: 0 for greedy decoding, else sampling temperature.
    top_k: sample from the k most likely tokens (0 or -1: all).
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
      them from the checkpoint (the original continued both, so T5-style
      fine-tuning sets train_steps to the pretrained step plus the new
      steps).
    export_dir: export: where the SavedModel goes (default
      `<model_dir>/export/<step>`); its mesh is `export_saved_model.mesh_shape`
      (default one device), not `mesh_shape`.

  The original's `run` parameters are accepted too. Those with a meaning
  here are honoured: `batch_size` as a (method, value) pair such as
  ("tokens_per_batch", 65536), `train_steps` as a function such as
  @utils.auto_train_steps, `sequence_length` as an int, `mesh_shape` as an
  mtf.Shape (@utils.tpu_mesh_shape()), `learning_rate_schedule` as a number
  or a list of factors, `save_checkpoints_steps` (checkpoint_every),
  `keep_checkpoint_max` (keep_checkpoints), `total_run_steps` (the
  schedule's total steps), `perplexity_eval_steps` (eval_steps),
  `eval_checkpoint_step` (the checkpoint eval/infer/score read), the modes
  "perplexity_eval" (eval) and "score_from_strings" (score). The dtypes come
  from `utils.get_variable_dtype` (activation_dtype here overrides its
  activation dtype), micro-batches from `utils.serialize_num_microbatches`
  when grad_accum_steps is None, and the vocabulary rounding from the
  model's own `Unitransformer.vocab_divisor` unless vocab_divisor is given.
  TPU and Estimator settings (tpu*, autostack, iterations_per_loop,
  mesh_devices, export_*, train/eval_dataset_fn of other packages, ...) are
  ignored with one warning that lists them. `variable_filter` and
  `ensemble_inputs` are refused (not supported here).

  Returns:
    The final metrics (e.g. {"step", "loss", "eval_loss", "perplexity"});
    after training also "losses" (of the steps run now) and "samples".
  """
  given = {name: value for name, value in (
      ("tpu_job_name", tpu_job_name), ("tpu", tpu), ("gcp_project", gcp_project),
      ("tpu_zone", tpu_zone), ("autostack", autostack), ("dataset_split", dataset_split),
      ("export_checkpoint_step", export_checkpoint_step), ("export_path", export_path),
      ("iterations_per_loop", iterations_per_loop), ("eval_summary_dir", eval_summary_dir),
      ("mesh_devices", mesh_devices), ("predict_fn", predict_fn),
      ("train_model_fn", train_model_fn), ("skip_seen_data", skip_seen_data),
      ("seen_data_init_step", seen_data_init_step),
      ("output_eval_examples", output_eval_examples),
      ("checkpoint_input_pipeline", checkpoint_input_pipeline),
      ("train_dataset_fn", train_dataset_fn), ("eval_dataset_fn", eval_dataset_fn))
      if value is not _UNSET}
  if given:
    logging.warning("utils.run: ignoring %d of the original's parameters that have no "
                    "meaning here (TPU/Estimator settings, export, data of other "
                    "packages; use run.dataset_fn for data): %s", len(given),
                    ", ".join(f"{k}={v!r}" for k, v in given.items()))
  if variable_filter:
    raise ValueError(f"run.variable_filter = {variable_filter!r}: training only some "
                     "variables is not supported here; remove the binding.")
  if ensemble_inputs:
    raise ValueError(f"run.ensemble_inputs = {ensemble_inputs!r}: ensembles are not "
                     "supported here; remove the binding.")
  mode = _MODE_ALIASES.get(mode, mode)
  if mode not in MODES:
    raise ValueError(f"mode must be one of {MODES}, got {mode!r}.")
  if model_type not in MODEL_TYPES:
    raise ValueError(f"model_type must be one of {MODEL_TYPES}, got {model_type!r}.")
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
  vocabulary = vocabulary or vocabulary_lib.ByteVocabulary()
  if isinstance(sequence_length, int):
    sequence_length = {"inputs": sequence_length, "targets": sequence_length}
  sequence_length = dict(sequence_length or {"inputs": 128, "targets": 128})
  if isinstance(mesh_shape, mtf.Shape):
    mesh_shape = mesh_shape.to_string()
  if not isinstance(batch_size, int):
    batch_size = compute_batch_size(sequence_length, mesh_shape, layout_rules, batch_size)
  if callable(train_steps):
    train_steps = int(train_steps(batch_size, sequence_length))
  checkpoint_every = save_checkpoints_steps or checkpoint_every
  keep_checkpoints = keep_checkpoint_max or keep_checkpoints
  eval_steps = perplexity_eval_steps or eval_steps
  layout_rules = rules_for_mesh(layout_rules, mesh_shape)
  beam_size = inference.decode_setting("beam_size", beam_size, 1)
  alpha = inference.decode_setting("alpha", alpha, 0.6)
  check_settings(mode, sequence_length=sequence_length, batch_size=batch_size,
                 train_steps=train_steps, eval_steps=eval_steps, eval_every=eval_every,
                 checkpoint_every=checkpoint_every, keep_checkpoints=keep_checkpoints,
                 log_every=log_every, grad_accum_steps=1 if grad_accum_steps is None else grad_accum_steps,
                 decode_length=decode_length, num_samples=num_samples,
                 beam_size=beam_size)
  if mode == "export":
    return export_lib.export_saved_model(
        model_dir, export_dir, model_type=model_type, vocabulary=vocabulary,
        sequence_length=sequence_length, vocab_divisor=vocab_divisor,
        activation_dtype=activation_dtype, decode_length=decode_length, beam_size=beam_size,
        alpha=alpha)
  mesh_impl = make_mesh_impl(mesh_shape, layout_rules, lowering=lowering)
  split = modeling.batch_split(mesh_impl)
  if grad_accum_steps is None:
    grad_accum_steps = (serialize_num_microbatches(batch_size // split, sequence_length)
                        if batch_size % split == 0 else 1)
  if batch_size % (split * grad_accum_steps):
    raise ValueError(
        f"batch_size {batch_size} must be a multiple of the batch split {split} (layout "
        f"{layout_rules!r} on mesh {mesh_shape!r}) times grad_accum_steps "
        f"{grad_accum_steps}.")
  variable_dtype = _master_dtype_from_checkpoint(
      get_variable_dtype(), checkpoint_path or
      (tf.train.latest_checkpoint(model_dir) if model_dir and not (fresh and mode == "train")
       else None) or
      (resolve_checkpoint(init_checkpoint) if init_checkpoint and mode == "train" else None))
  if activation_dtype is not None:
    variable_dtype = mtf.VariableDType(variable_dtype.master_dtype, variable_dtype.slice_dtype,
                                       tf.as_dtype(activation_dtype))
  setup = modeling.Setup(
      model_type=model_type, vocabulary=vocabulary, mesh_impl=mesh_impl,
      sequence_length=sequence_length, batch_size=batch_size // grad_accum_steps,
      vocab_size=vocabulary.vocab_size, vocab_divisor=vocab_divisor,
      variable_dtype=variable_dtype)
  log(f"mode {mode}, model {model_type}, mesh '{mesh_shape}', layout '{layout_rules}', "
      f"batch {batch_size}, sequence length {sequence_length}, vocabulary "
      f"{type(vocabulary).__name__} ({vocabulary.vocab_size} ids, model "
      f"{setup.model_vocab_size()}), model_dir {model_dir or '(none)'}")

  def data(split_name: str, repeat: bool, data_seed: Optional[int]):
    return dataset_fn(split_name, vocabulary, sequence_length, setup.batch_size, data_seed,
                      repeat, model_type=model_type)

  if mode in ("infer", "score"):
    if not model_dir:
      raise ValueError(f"mode {mode!r} needs a model_dir with a checkpoint.")
    if not checkpoint_path and eval_checkpoint_step is None and \
        tf.train.get_checkpoint_state(model_dir) is None:
      raise ValueError(f"No checkpoint in {model_dir!r}: train first (--mode=train).")
    scores_dataset = mode == "score" and not input_file
    if scores_dataset and not output_file:
      raise ValueError("--mode=score without --input_file scores the validation examples of "
                       "the data (dataset_fn): give --output_file for their scores.")
    lines = None if scores_dataset else inference.read_input_file(
        mode, input_file, input_encoding, input_errors)
    if eval_checkpoint_step is not None:
      path = checkpoint_at_step(model_dir, eval_checkpoint_step)
      mtf.checkpoint.CheckpointManager(mesh_impl, model_dir).restore(path)
      log(f"restored {path}")
    else:
      inference.restore(mesh_impl, model_dir, checkpoint_path)
    if mode == "infer":
      return inference.infer(setup, input_file, output_file, decode_length, temperature,
                             top_k, beam_size, alpha, lines=lines)
    if scores_dataset:
      return inference.score_dataset(setup, unpacked_validation_data(
          dataset_fn, vocabulary, sequence_length, model_type), output_file)
    return inference.score(setup, input_file, output_file, lines=lines)

  if model_dir and fresh and mode == "train":
    _clear_model_dir(model_dir)
  trainer = mtf.training.Trainer(
      modeling.make_model_fn(setup), setup.feature_shapes(), mesh_impl,
      make_optimizer(optimizer, learning_rate_schedules.bind_total_train_steps(
          _schedule(learning_rate_schedule), total_run_steps or train_steps)),
      model_dir=model_dir or None,
      grad_accum_steps=grad_accum_steps, checkpoint_every=checkpoint_every,
      keep_checkpoints=keep_checkpoints, log_every=log_every, log_fn=log,
      zero_stage=zero_stage, loss_scale=loss_scale, checkpoint_path=checkpoint_path,
      jit_compile=jit_compile)
  if mode == "eval" and eval_checkpoint_step is not None and model_dir:
    path = checkpoint_at_step(model_dir, eval_checkpoint_step)
    trainer.checkpoint_manager.restore(path)
    log(f"restored {path}")
  if mode == "train" and init_checkpoint:
    start_from_checkpoint(trainer, mesh_impl, init_checkpoint,
                          reset_optimizer=init_checkpoint_reset_optimizer)
  eval_data = data(dataset_lib.VALIDATION, False, 0)

  def evaluate() -> Dict[str, float]:
    try:
      metrics = trainer.evaluate(eval_data, steps=eval_steps)
    except ValueError as e:
      if "empty" not in str(e):
        raise
      raise ValueError(
          f"The validation data yields no full batch of {setup.batch_size} rows: lower "
          "run.batch_size, or give more held-out data (dataset_fn.eval_files, or a larger "
          "dataset_fn.corpus_bytes).") from e
    metrics["perplexity"] = math.exp(min(metrics["cross_entropy"], 50.0))
    _write_scalars(model_dir, trainer.global_step, {"perplexity": metrics["perplexity"]})
    log(f"eval at step {trainer.global_step}: loss={metrics['loss']:.4f} "
        f"cross_entropy={metrics['cross_entropy']:.4f} nats/token "
        f"perplexity={metrics['perplexity']:.3f} "
        f"token_accuracy={metrics['token_accuracy']:.4f} ({eval_steps} held-out batches)")
    return metrics

  start = time.perf_counter()
  result = {"step": trainer.global_step}
  samples: List[str] = []
  if mode == "eval":
    if model_dir and trainer.global_step == 0:
      log(f"warning: {model_dir} has no checkpoint; evaluating an untrained model")
    metrics = evaluate()
  else:
    train_data = data(dataset_lib.TRAIN, True, seed)
    entropy = unigram_entropy(train_data)
    result["unigram_entropy"] = entropy
    log(f"unigram entropy of the training tokens: {entropy:.4f} nats/token "
        f"({entropy / math.log(2):.3f} bits): the loss of a model that ignores context")

    def periodic_eval(step: int, _) -> None:
      if eval_every and step % eval_every == 0 and step != train_steps:
        evaluate()

    history = trainer.train(train_data, steps=train_steps, hooks=[periodic_eval])
    if history["loss"]:
      result["loss"] = history["loss"][-1]
      result["cross_entropy"] = history["cross_entropy"][-1]
    losses = history["loss"]
    metrics = evaluate()
    if num_samples and model_type == "lm":
      prompts = list(sample_prompts)[:num_samples]
      samples = inference.lm_decode(setup, prompts, decode_length, temperature, top_k)
      for prompt, text in zip(prompts, samples):
        log(f"--- sample (prompt {prompt!r}):\n{prompt}{text}")
    elif num_samples:
      pairs = dataset_lib.stdlib_docstring_pairs(dataset_lib.VALIDATION, max_pairs=num_samples)
      samples = inference.bi_decode(setup, [p[0] for p in pairs], temperature, top_k, beam_size,
                          alpha)
      for (source, target), text in zip(pairs, samples):
        log(f"--- {source}\n    reference: {target}\n    model:     {text}")
  result.update({"step": trainer.global_step, "eval_loss": metrics["loss"],
                 "eval_cross_entropy": metrics["cross_entropy"],
                 "perplexity": metrics["perplexity"],
                 "token_accuracy": metrics["token_accuracy"],
                 "seconds": time.perf_counter() - start})
  log("final: " + " ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}"
                           for k, v in result.items()))
  if mode == "train":
    result.update(losses=losses, samples=samples)
  return result




from mesh_tensorflow.transformer.estimator_compat import *  # noqa: E402,F401,F403 (the original's helpers)
from mesh_tensorflow.transformer.utils_original import *  # noqa: E402,F401,F403 (the original's entry points)
from mesh_tensorflow.transformer.utils_original import _maybe_add_pretokenized_features  # noqa: E402,F401
