"""Train, evaluate, decode, score and export transformers, driven by gin.

`run` is the program behind `python -m mesh_tensorflow.transformer.main`: a
small front that takes the run's settings (a `run_config.RunConfig`: gin's
`run.*` bindings, overridden by its keyword arguments), resolves them, and
calls the function of the mode:

* `train`: trains to `train_steps` with `mtf.training.Trainer` (checkpoints
  and TensorBoard events in `model_dir`; a rerun resumes), evaluates held-out
  loss and perplexity, and prints a few generated samples;
* `evaluate` ("eval"): held-out loss, perplexity and token accuracy of the
  checkpoint;
* `infer`: decodes every line of `input_file` into `output_file`;
* `score`: writes the log-likelihood of every line of `input_file` (a text
  for "lm", "input<TAB>target" for "bitransformer") to `output_file`; without
  `input_file`, of every validation example of the data (a TFDS dataset, a
  seqio task, files), one per line in the data's order;
* `export`: writes a SavedModel of the checkpoint to `export_dir`, served
  without this library (see `mesh_tensorflow.transformer.export`).

Each builds the mesh from `mesh_shape` and `layout_rules`, the model
(`model_type` "lm" for a decoder-only `Unitransformer`, "bitransformer" for
an encoder-decoder `Bitransformer`) and the data (`dataset_fn`).

    >>> from mesh_tensorflow.transformer import gin_config
    >>> gin_config.parse(["models/tiny_lm.gin", "layouts/2x4.gin"], ["run.train_steps = 10"])
    >>> run(model_dir="/tmp/lm", mode="train")["eval_loss"]
    4.9
    >>> train(RunConfig(model_dir="/tmp/lm", train_steps=20))["step"]
    20
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import os
import re
import time
from typing import Any, Callable, Dict, List, Mapping, Optional

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
from mesh_tensorflow.transformer import run_config
from mesh_tensorflow.transformer.inference import log
from mesh_tensorflow.transformer.modeling import make_mesh_impl
from mesh_tensorflow.transformer.run_config import RunConfig


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


def make_optimizer(optimizer, learning_rate_schedule):
  """The optimizer: calls the factory (a gin reference such as
  @optimize.AdafactorOptimizer; default Adafactor) with the schedule as its
  learning rate ("lr" for SGD and momentum); an Optimizer is used as it is.

  Example:
    >>> make_optimizer(mtf.optimize.AdafactorOptimizer,
    ...                functools.partial(lrs.cosine_with_warmup, peak=0.05))
  """
  if optimizer is None:
    optimizer = run_config.AdafactorOptimizer
  if isinstance(optimizer, mtf.optimize.Optimizer):
    return optimizer  # Already an optimizer.
  if learning_rate_schedule is None:
    return optimizer()
  uses_lr = isinstance(optimizer, type) and issubclass(
      optimizer, (mtf.optimize.SgdOptimizer, mtf.optimize.MomentumOptimizer))
  name = "lr" if uses_lr else "learning_rate"
  return optimizer(**{name: learning_rate_schedule})


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



OPERATIVE_CONFIG = "operative_config.gin"


def write_operative_config(model_dir: str) -> str:
  """Writes gin's operative config (every parameter the run has used, with
  its value) to `model_dir`/operative_config.gin, as the original and T5
  write it; returns the path. Evaluating, decoding, scoring or exporting the
  model later starts from `--gin_file=MODEL_DIR/operative_config.gin`.

  Example:
    >>> write_operative_config("/tmp/lm")
    '/tmp/lm/operative_config.gin'
  """
  path = os.path.join(model_dir, OPERATIVE_CONFIG)
  # `fresh` deletes the model's checkpoints: a run that starts from this file
  # must not inherit it.
  body = re.sub(r"^((?:\S+/)?run\.fresh) = True$", r"\1 = False", gin.operative_config_str(),
                flags=re.M)
  text = ("# The gin parameters this model was trained with, as it used them: pass\n"
          "# --gin_file=" + path + " to evaluate, decode, score or export it.\n\n" + body)
  tf.io.gfile.makedirs(model_dir)
  partial = path + ".partial"
  with tf.io.gfile.GFile(partial, "w") as f:
    f.write(text)
  tf.io.gfile.rename(partial, path, overwrite=True)
  return path


def _listed_checkpoints(model_dir: str) -> List[str]:
  """The checkpoints model_dir's `checkpoint` state file lists, as paths."""
  state = tf.train.get_checkpoint_state(model_dir)
  return [path if os.path.isabs(path) or "://" in path else os.path.join(model_dir, path)
          for path in (state.all_model_checkpoint_paths if state else [])]


def checkpoint_at_step(model_dir: str, step: int) -> str:
  """The checkpoint of model_dir written at `step` (either library's naming:
  ckpt-N or model.ckpt-N).

  Raises:
    ValueError: naming the steps model_dir has, when none is at `step`.

  Example:
    >>> checkpoint_at_step("/tmp/lm", 400)
    '/tmp/lm/ckpt-400'
  """
  paths = _listed_checkpoints(model_dir)
  for path in paths:
    if path.rsplit("-", 1)[-1] == str(int(step)):
      return path
  steps = [p.rsplit("-", 1)[-1] for p in paths]
  raise ValueError(f"run.eval_checkpoint_step = {step}: {model_dir} has no checkpoint of that "
                   f"step (it has steps {', '.join(steps) or 'none'}).")


def _step_of(path: str) -> int:
  """The step of a checkpoint path (ckpt-N or model.ckpt-N)."""
  return int(path.rsplit("-", 1)[-1])


def checkpoints_at(model_dir: str, steps) -> List[str]:
  """The checkpoints of model_dir that `run.eval_checkpoint_step` names, as
  the original reads it: a step, a list of steps, "all" (every checkpoint, in
  step order) or -1 (the newest).

  Example:
    >>> checkpoints_at("/tmp/lm", "all")
    ['/tmp/lm/ckpt-200', '/tmp/lm/ckpt-400']
  """
  if steps == "all":
    paths = _listed_checkpoints(model_dir)
    if not paths:
      raise ValueError(f"run.eval_checkpoint_step = 'all': {model_dir} has no checkpoint.")
    return sorted(paths, key=_step_of)
  if isinstance(steps, (list, tuple)):
    return [checkpoint_at_step(model_dir, step) for step in steps]
  if isinstance(steps, str) and not steps.lstrip("-").isdigit():
    raise ValueError(f"run.eval_checkpoint_step = {steps!r}: give a step, a list of steps, "
                     "'all' or -1 (the newest).")
  if int(steps) == -1:
    latest = tf.train.latest_checkpoint(model_dir)
    if latest is None:
      raise ValueError(f"run.eval_checkpoint_step = -1: {model_dir} has no checkpoint.")
    return [latest]
  return [checkpoint_at_step(model_dir, int(steps))]


def _master_dtype_from_checkpoint(variable_dtype: mtf.VariableDType,
                                  prefix: Optional[str]) -> mtf.VariableDType:
  """variable_dtype, with the master dtype of the checkpoint the run starts
  from where the config does not set `get_variable_dtype.master_dtype`: a
  checkpoint with bfloat16 masters (the original's default) keeps training
  and saving bfloat16 masters."""
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
  """A checkpoint path prefix: `path` itself, or a directory's latest (see
  `mtf.checkpoint.resolve`).

  Example:
    >>> resolve_checkpoint("/models/t5_small")
    '/models/t5_small/model.ckpt-1000000'
  """
  return mtf.checkpoint.resolve(path)


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


# ------------------------------------------------------------------ the modes
def run(*args, **settings) -> Dict[str, Any]:
  """Runs the mode of the config: gin's `run.*` bindings, overridden by the
  keyword arguments (the parameters of `RunConfig`, which documents each).

  Returns:
    The final metrics (e.g. {"step", "loss", "eval_loss", "perplexity"});
    after training also "losses" (of the steps run now) and "samples".

  Example:
    >>> run("/tmp/lm", mode="eval")["perplexity"]
    12.3
  """
  config = RunConfig(*args, **settings).resolved()
  return MODE_FUNCTIONS[config.mode](config)


# help(run) and gin's parameter checks list RunConfig's parameters.
run.__signature__ = inspect.signature(RunConfig)


@dataclasses.dataclass
class _Model:
  """What every mode but export builds from a resolved config."""
  mesh_impl: Any
  setup: modeling.Setup
  grad_accum_steps: int

  def data(self, config: RunConfig, split_name: str, repeat: bool,
           data_seed: Optional[int]) -> tf.data.Dataset:
    """Training or evaluation batches, in `setup.training_feature_shapes`."""
    data = config.dataset_fn(split_name, self.setup.vocabulary, config.sequence_length,
                             self.setup.batch_size, data_seed, repeat,
                             model_type=config.model_type)
    if self.setup.outer_batch_size > 1:
      data = data.map(self.setup.to_training_batch)
    return data


def _build(config: RunConfig) -> _Model:
  """The mesh, the model setup and the micro-batching of a resolved config."""
  mesh_impl = make_mesh_impl(config.mesh_shape, config.layout_rules, lowering=config.lowering)
  split = modeling.batch_split(mesh_impl)
  batch_size, grad_accum_steps = config.batch_size, config.grad_accum_steps
  if grad_accum_steps is None:
    grad_accum_steps = (run_config.serialize_num_microbatches(batch_size // split,
                                                              config.sequence_length)
                        if batch_size % split == 0 else 1)
  if batch_size % (split * grad_accum_steps):
    raise ValueError(
        f"batch_size {batch_size} must be a multiple of the batch split {split} (layout "
        f"{config.layout_rules!r} on mesh {config.mesh_shape!r}) times grad_accum_steps "
        f"{grad_accum_steps}.")
  _check_outer_batch(config, mesh_impl, batch_size // grad_accum_steps, split)
  model_dir, mode = config.model_dir, config.mode
  variable_dtype = _master_dtype_from_checkpoint(
      run_config.get_variable_dtype(), config.checkpoint_path or
      (tf.train.latest_checkpoint(model_dir) if model_dir and not (config.fresh and mode == "train")
       else None) or
      (resolve_checkpoint(config.init_checkpoint)
       if config.init_checkpoint and mode == "train" else None))
  if config.activation_dtype is not None:
    variable_dtype = mtf.VariableDType(variable_dtype.master_dtype, variable_dtype.slice_dtype,
                                       tf.as_dtype(run_config.float_dtype_name(
                                           config.activation_dtype)))
  vocabulary = config.vocabulary
  setup = modeling.Setup(
      model_type=config.model_type, vocabulary=vocabulary, mesh_impl=mesh_impl,
      sequence_length=config.sequence_length, batch_size=batch_size // grad_accum_steps,
      vocab_size=vocabulary.vocab_size, vocab_divisor=config.vocab_divisor,
      variable_dtype=variable_dtype, outer_batch_size=config.outer_batch_size)
  log(f"mode {mode}, model {config.model_type}, mesh '{config.mesh_shape}', layout "
      f"'{config.layout_rules}', batch {batch_size}, sequence length "
      f"{config.sequence_length}, vocabulary {type(vocabulary).__name__} "
      f"({vocabulary.vocab_size} ids, model {setup.model_vocab_size()}), model_dir "
      f"{model_dir or '(none)'}")
  return _Model(mesh_impl, setup, grad_accum_steps)


def _check_outer_batch(config: RunConfig, mesh_impl, batch: int, split: int) -> None:
  """run.outer_batch_size must cut each (micro-)batch into groups that the
  layout's splits of "outer_batch" and "batch" divide."""
  outer_split = modeling.dimension_split(mesh_impl, "outer_batch")
  if config.outer_batch_size > 1 or outer_split > 1:
    run_config.check_outer_batch(
        config.outer_batch_size, batch, outer_split, split,
        f" (layout {config.layout_rules!r} on mesh {config.mesh_shape!r})")


def export(config: RunConfig) -> str:
  """Writes a SavedModel of the config's checkpoint (mode "export").

  Returns:
    The SavedModel's directory.

  Example:
    >>> export(RunConfig(model_dir="/tmp/lm", mode="export"))
    '/tmp/lm/export/400'
  """
  config = config.resolved()
  return export_lib.export_saved_model(
      config.model_dir, config.export_dir, model_type=config.model_type,
      vocabulary=config.vocabulary, sequence_length=config.sequence_length,
      vocab_divisor=config.vocab_divisor, activation_dtype=config.activation_dtype,
      decode_length=config.decode_length, beam_size=config.beam_size, alpha=config.alpha)


def _decoding_runs(config: RunConfig):
  """(model, input lines, output_file) of infer and score, once per
  checkpoint to read (restored before each): the newest, or those
  `eval_checkpoint_step` names; with several, each one's outputs go to
  `<output_file>-<step>`, as the original writes them."""
  model = _build(config)
  model_dir = config.model_dir
  if not model_dir:
    raise ValueError(f"mode {config.mode!r} needs a model_dir with a checkpoint.")
  if (not config.checkpoint_path and config.eval_checkpoint_step is None
      and tf.train.get_checkpoint_state(model_dir) is None):
    raise ValueError(f"No checkpoint in {model_dir!r}: train first (--mode=train).")
  if config.mode == "score" and not config.input_file:
    if not config.output_file:
      raise ValueError("--mode=score without --input_file scores the validation examples of "
                       "the data (dataset_fn): give --output_file for their scores.")
    lines = None
  elif config.mode == "infer" and not config.input_file and config.model_type != "lm":
    if not config.output_file:
      raise ValueError("--mode=infer without --input_file decodes the inputs of the validation "
                       "examples of the data (dataset_fn): give --output_file for the outputs.")
    lines = _validation_inputs(config, model)
  else:
    lines = inference.read_input_file(config.mode, config.input_file, config.input_encoding,
                                      config.input_errors)
  if config.mode == "score" and config.targets_file:
    lines = _with_targets(config, lines)
  if config.eval_checkpoint_step is None:
    inference.restore(model.mesh_impl, model_dir, config.checkpoint_path)
    yield model, lines, config.output_file
    return
  paths = checkpoints_at(model_dir, config.eval_checkpoint_step)
  manager = mtf.checkpoint.CheckpointManager(model.mesh_impl, model_dir)
  for path in paths:
    manager.restore(path)
    log(f"restored {path}")
    output_file = config.output_file
    if len(paths) > 1:
      output_file = (output_file or config.input_file + inference.OUTPUT_SUFFIX[config.mode]
                     ) + f"-{_step_of(path)}"
    yield model, lines, output_file


def _validation_inputs(config: RunConfig, model: _Model) -> List[str]:
  """The inputs of the data's validation examples as texts (T5's decoding of
  a task's examples: infer_from_task.gin)."""
  vocabulary = model.setup.vocabulary
  examples = unpacked_validation_data(config.dataset_fn, vocabulary, config.sequence_length,
                                      config.model_type)
  return [inference.ids_to_text(vocabulary, example["inputs"])
          for example in examples.as_numpy_iterator()]


def _with_targets(config: RunConfig, inputs: List[str]) -> List[str]:
  """Score's lines from input_file's inputs and targets_file's targets, as
  score reads one file: input<TAB>target (a language model scores the
  targets alone)."""
  targets = inference.read_lines(config.targets_file, config.input_encoding,
                                 config.input_errors)
  if len(targets) != len(inputs):
    raise ValueError(f"run.targets_file {config.targets_file!r} has {len(targets)} lines but "
                     f"run.input_file {config.input_file!r} has {len(inputs)}: give one target "
                     "per input.")
  if config.model_type == "lm":
    return targets
  return [f"{i}\t{t}" for i, t in zip(inputs, targets)]


def infer(config: RunConfig) -> Dict[str, Any]:
  """Decodes every line of `input_file` into `output_file` (mode "infer");
  with several checkpoints (`eval_checkpoint_step`), into
  `<output_file>-<step>` for each.

  Example:
    >>> infer(RunConfig(model_dir="/tmp/lm", mode="infer", input_file="prompts.txt"))
  """
  config = dataclasses.replace(config, mode="infer").resolved()
  result: Dict[str, Any] = {}
  for model, lines, output_file in _decoding_runs(config):
    result = inference.infer(model.setup, config.input_file, output_file,
                             config.decode_length, config.temperature, config.top_k,
                             config.beam_size, config.alpha, lines=lines)
  return result


def score(config: RunConfig) -> Dict[str, Any]:
  """Writes the log-likelihood of every line of `input_file` to
  `output_file` (mode "score"); without `input_file`, of every validation
  example of the data, as T5 scores a task. Several checkpoints: as infer.

  Example:
    >>> score(RunConfig(model_dir="/tmp/lm", mode="score", input_file="texts.txt"))
  """
  config = dataclasses.replace(config, mode="score").resolved()
  result: Dict[str, Any] = {}
  for model, lines, output_file in _decoding_runs(config):
    if lines is None:
      result = inference.score_dataset(model.setup, unpacked_validation_data(
          config.dataset_fn, model.setup.vocabulary, config.sequence_length,
          config.model_type), output_file)
    else:
      result = inference.score(model.setup, config.input_file, output_file, lines=lines)
  return result


def unpacked_validation_data(dataset_fn: Callable, vocabulary, sequence_length: Mapping[str, int],
                             model_type: str) -> tf.data.Dataset:
  """The validation split of `dataset_fn`'s data, one example per row, every
  example once (batches of one, no repeat), for scoring and decoding.

  Example:
    >>> ds = unpacked_validation_data(dataset_lib.dataset_fn, vocab, {"targets": 128}, "lm")
  """
  try:
    return dataset_fn(dataset_lib.VALIDATION, vocabulary, sequence_length, 1, None, False,
                      model_type=model_type, packed=False)
  except TypeError as e:
    if "packed" not in str(e):
      raise
    raise ValueError(f"--mode=score or infer without --input_file needs a dataset_fn that "
                     f"takes packed=False (one example per row); {dataset_fn!r} does not: "
                     f"give --input_file instead.") from e


def _trainer(config: RunConfig, model: _Model) -> "mtf.training.Trainer":
  """The Trainer of train and eval (model_dir cleared first with `fresh`)."""
  if config.model_dir and config.fresh and config.mode == "train":
    _clear_model_dir(config.model_dir)
  trainer = mtf.training.Trainer(
      modeling.make_model_fn(model.setup), model.setup.training_feature_shapes(),
      model.mesh_impl,
      make_optimizer(config.optimizer, learning_rate_schedules.bind_total_train_steps(
          run_config.as_schedule(config.learning_rate_schedule),
          config.total_run_steps or config.train_steps)),
      model_dir=config.model_dir or None,
      grad_accum_steps=model.grad_accum_steps, checkpoint_every=config.checkpoint_every,
      keep_checkpoints=config.keep_checkpoints, log_every=config.log_every, log_fn=log,
      zero_stage=config.zero_stage,
      zero_reshard_after_forward=config.zero_reshard_after_forward, loss_scale=config.loss_scale,
      float32_master_in_optimizer=config.float32_master_in_optimizer,
      checkpoint_path=config.checkpoint_path, jit_compile=config.jit_compile)
  if config.mode == "train" and config.init_checkpoint:
    start_from_checkpoint(trainer, model.mesh_impl, config.init_checkpoint,
                          reset_optimizer=config.init_checkpoint_reset_optimizer)
  return trainer


def _evaluator(config: RunConfig, model: _Model,
               trainer: "mtf.training.Trainer") -> Callable[[], Dict[str, float]]:
  """A function that evaluates the trainer's model on the held-out data."""
  eval_data = model.data(config, dataset_lib.VALIDATION, False, 0)

  def evaluate_now() -> Dict[str, float]:
    try:
      metrics = trainer.evaluate(eval_data, steps=config.eval_steps)
    except ValueError as e:
      if "empty" not in str(e):
        raise
      raise ValueError(
          f"The validation data yields no full batch of {model.setup.batch_size} rows: lower "
          "run.batch_size, or give more held-out data (dataset_fn.eval_files, or a larger "
          "dataset_fn.corpus_bytes).") from e
    metrics["perplexity"] = math.exp(min(metrics["cross_entropy"], 50.0))
    _write_scalars(config.model_dir, trainer.global_step,
                   {"perplexity": metrics["perplexity"]})
    log(f"eval at step {trainer.global_step}: loss={metrics['loss']:.4f} "
        f"cross_entropy={metrics['cross_entropy']:.4f} nats/token "
        f"perplexity={metrics['perplexity']:.3f} "
        f"token_accuracy={metrics['token_accuracy']:.4f} ({config.eval_steps} held-out "
        "batches)")
    return metrics
  return evaluate_now


def _final(result: Dict[str, Any], trainer, metrics: Dict[str, float],
           start: float) -> Dict[str, Any]:
  result.update({"step": trainer.global_step, "eval_loss": metrics["loss"],
                 "eval_cross_entropy": metrics["cross_entropy"],
                 "perplexity": metrics["perplexity"],
                 "token_accuracy": metrics["token_accuracy"],
                 "seconds": time.perf_counter() - start})
  log("final: " + " ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}"
                           for k, v in result.items()))
  return result


def evaluate(config: RunConfig) -> Dict[str, Any]:
  """Held-out loss, perplexity and token accuracy of the checkpoint (mode
  "eval").

  Example:
    >>> evaluate(RunConfig(model_dir="/tmp/lm", mode="eval"))["perplexity"]
    12.3
  """
  config = dataclasses.replace(config, mode="eval").resolved()
  model = _build(config)
  trainer = _trainer(config, model)
  evaluate_now = _evaluator(config, model, trainer)
  paths = [None]
  if config.eval_checkpoint_step is not None and config.model_dir:
    paths = checkpoints_at(config.model_dir, config.eval_checkpoint_step)
  start = time.perf_counter()
  for path in paths:  # several: each evaluated and logged ("eval at step N"), the last final
    if path is not None:
      trainer.checkpoint_manager.restore(path)
      log(f"restored {path}")
    if config.model_dir and trainer.global_step == 0:
      log(f"warning: {config.model_dir} has no checkpoint; evaluating an untrained model")
    metrics = evaluate_now()
  return _final({"step": trainer.global_step}, trainer, metrics, start)


def train(config: RunConfig) -> Dict[str, Any]:
  """Trains to `train_steps`, evaluates, and prints `num_samples` samples
  (mode "train").

  Returns:
    The final metrics, the losses of the steps run now ("losses") and the
    samples ("samples").

  Example:
    >>> train(RunConfig(model_dir="/tmp/lm", train_steps=20))["step"]
    20
  """
  config = dataclasses.replace(config, mode="train").resolved()
  model = _build(config)
  trainer = _trainer(config, model)
  evaluate_now = _evaluator(config, model, trainer)
  start = time.perf_counter()
  result: Dict[str, Any] = {"step": trainer.global_step}
  train_data = model.data(config, dataset_lib.TRAIN, True, config.seed)
  entropy = unigram_entropy(train_data)
  result["unigram_entropy"] = entropy
  log(f"unigram entropy of the training tokens: {entropy:.4f} nats/token "
      f"({entropy / math.log(2):.3f} bits): the loss of a model that ignores context")

  first_step = trainer.global_step + 1

  def periodic_eval(step: int, _) -> None:
    if step == first_step and config.model_dir:  # the model's parameters are used by now
      write_operative_config(config.model_dir)
    if config.eval_every and step % config.eval_every == 0 and step != config.train_steps:
      evaluate_now()

  history = trainer.train(train_data, steps=config.train_steps, hooks=[periodic_eval])
  if history["loss"]:
    result["loss"] = history["loss"][-1]
    result["cross_entropy"] = history["cross_entropy"][-1]
  metrics = evaluate_now()
  if config.model_dir and history["loss"]:  # with what evaluation used too
    write_operative_config(config.model_dir)
  samples = _samples(config, model.setup)
  _final(result, trainer, metrics, start)
  result.update(losses=history["loss"], samples=samples)
  return result


def _samples(config: RunConfig, setup: modeling.Setup) -> List[str]:
  """The `num_samples` samples train prints at the end."""
  if not config.num_samples:
    return []
  if config.model_type == "lm":
    prompts = list(config.sample_prompts)[:config.num_samples]
    samples = inference.lm_decode(setup, prompts, config.decode_length, config.temperature,
                                  config.top_k)
    for prompt, text in zip(prompts, samples):
      log(f"--- sample (prompt {prompt!r}):\n{prompt}{text}")
    return samples
  pairs = dataset_lib.stdlib_docstring_pairs(dataset_lib.VALIDATION,
                                             max_pairs=config.num_samples)
  samples = inference.bi_decode(setup, [p[0] for p in pairs], config.temperature,
                                config.top_k, config.beam_size, config.alpha)
  for (source, target), text in zip(pairs, samples):
    log(f"--- {source}\n    reference: {target}\n    model:     {text}")
  return samples


# The function of each mode (after MODE_ALIASES).
MODE_FUNCTIONS: Dict[str, Callable[[RunConfig], Any]] = {
    "train": train, "eval": evaluate, "infer": infer, "score": score, "export": export}
