"""The original transformer/utils.py entry points (train_model, eval_model,
decode_from_file, score_from_strings, ...), running on this library.

The original passed a TPUEstimator between these functions. Here
`get_estimator` returns a `MeshEstimator`: a small object bundling the
model's `modeling.Setup` (model type, vocabulary, mesh and layout, batch
size, sequence lengths), the model directory and the optimizer settings.
It trains with `mtf.training.Trainer`, restores with
`mtf.checkpoint.CheckpointManager` and decodes and scores with
`transformer.inference`, so every function below takes it where the
original took an estimator. Re-exported from `transformer.utils`:

    >>> from mesh_tensorflow.transformer import utils, gin_config
    >>> gin_config.parse(["models/tiny_lm.gin"])
    >>> est = utils.get_estimator("lm", vocab, "all:2", "batch:all", "/tmp/lm", 4,
    ...                           {"targets": 32})
    >>> utils.train_model(est, vocab, {"targets": 32}, 4, my_dataset_fn, 10, None)
    >>> utils.decode_from_file(est, vocab, "lm", 4, {"inputs": 32, "targets": 32},
    ...                        est.latest_checkpoint(), "prompts.txt", "decodes.txt")
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import re
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence

from absl import flags
from absl import logging
import gin
import numpy as np
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import _environment
from mesh_tensorflow.transformer import dataset as dataset_lib
from mesh_tensorflow.transformer import export as export_lib
from mesh_tensorflow.transformer import gin_config
from mesh_tensorflow.transformer import inference
from mesh_tensorflow.transformer import learning_rate_schedules
from mesh_tensorflow.transformer import modeling
from mesh_tensorflow.transformer import estimator_compat as compat

__all__ = [
    "FLAGS", "MeshEstimator", "build_model", "compute_log_likelihoods", "decode",
    "decode_from_dataset", "decode_from_file", "eval_model", "export_model",
    "flexible_ckpt_init_mapping", "get_checkpoint_iterator", "get_estimator", "infer_model",
    "metric_max", "metric_sum", "parse_gin_defaults_and_flags", "save_scores",
    "score_from_dataset", "score_from_strings", "score_with_estimator", "train_model"]

FLAGS = flags.FLAGS

_MODEL_TYPES = ("lm", "bitransformer")


def _utils():
  from mesh_tensorflow.transformer import utils  # pylint: disable=g-import-not-at-top
  return utils


def _flag(name: str, default):
  try:
    value = getattr(FLAGS, name)
  except (AttributeError, flags.UnparsedFlagAccessError):
    return default
  return default if value is None else value


def parse_gin_defaults_and_flags(skip_unknown: bool = False,
                                 finalize_config: bool = True) -> List[str]:
  """Parses this library's gin defaults, then the files and bindings of the
  --gin_file and --gin_param flags (searched also under the
  --gin_location_prefix flag's directories), as the original did.

  skip_unknown is accepted for the original's signature: bindings of other
  packages are always skipped (and listed in one warning, see
  `gin_config.parse`). Returns the skipped bindings.

  Example:
    >>> FLAGS(["prog", "--gin_file=models/tiny_lm.gin"])
    >>> parse_gin_defaults_and_flags()
    []
  """
  del skip_unknown
  for prefix in _flag("gin_location_prefix", []):
    gin.add_config_file_search_path(prefix)
  skipped = gin_config.parse(list(_flag("gin_file", [])), list(_flag("gin_param", [])))
  if finalize_config:
    gin.finalize()
  return skipped


def build_model(model_type: str = "bitransformer", input_vocab_size: Optional[int] = None,
                output_vocab_size: Optional[int] = None, layout_rules=None, mesh_shape=None):
  """A `Unitransformer` ("lm") or `Bitransformer` ("bitransformer") whose
  layers and sizes come from gin, as the original's build_model. (Not itself
  a gin configurable: gin's `build_model` is `modeling.build_model`, which
  this calls.)

  Args:
    model_type: "lm" or "bitransformer" (the original's "delimited_lm" is an
      "lm"; "aligned" and "bi_student_teacher" are not supported here).
    input_vocab_size: ids of the inputs.
    output_vocab_size: ids of the outputs.
    layout_rules: optional layout rules (a string or mtf.LayoutRules).
    mesh_shape: optional mesh shape (a string or mtf.Shape).

  Example:
    >>> model = build_model("lm", 259, 259)
    >>> model.output_vocab_dim.size
    264
  """
  if not input_vocab_size or not output_vocab_size:
    raise ValueError("build_model: give input_vocab_size and output_vocab_size (positive "
                     f"ints), got {input_vocab_size!r} and {output_vocab_size!r}.")
  if model_type == "delimited_lm":
    model_type = "lm"
  if model_type not in _MODEL_TYPES:
    raise ValueError(f"build_model: model_type {model_type!r} is not supported here; choose "
                     f"one of {_MODEL_TYPES}.")
  if layout_rules is not None and not isinstance(layout_rules, str):
    layout_rules = mtf.convert_to_layout_rules(layout_rules).to_string()
  if mesh_shape is not None and not isinstance(mesh_shape, str):
    mesh_shape = mtf.convert_to_shape(mesh_shape).to_string()
  return modeling.build_model(model_type, input_vocab_size, output_vocab_size, None,
                              layout=layout_rules, mesh_shape=mesh_shape)


# ------------------------------------------------------------------ estimator
@dataclasses.dataclass
class MeshEstimator:
  """What `get_estimator` returns: the model setup, its directory and its
  training settings; it stands where the original passed a TPUEstimator.

  Attributes:
    setup: the `modeling.Setup` (model type, vocabulary, mesh, layout, batch
      size, sequence lengths, dtypes).
    model_dir: checkpoints and events.
    optimizer: an optimizer factory or Optimizer (None: Adafactor).
    learning_rate_schedule: a schedule, a number, or a list of factors.
    keep_checkpoint_max: checkpoints kept.
    save_checkpoints_steps: save every this many steps.
    init_checkpoint: a checkpoint to start training from when model_dir has none.

  Example:
    >>> est = get_estimator("lm", ByteVocabulary(), "all:2", "batch:all", "/tmp/lm", 4,
    ...                     {"targets": 32})
    >>> est.train(lambda params: my_batches, max_steps=10)
  """
  setup: modeling.Setup
  model_dir: Optional[str]
  optimizer: Any = None
  learning_rate_schedule: Any = None
  keep_checkpoint_max: int = 5
  save_checkpoints_steps: int = 1000
  init_checkpoint: Optional[str] = None
  _trainer: Any = dataclasses.field(default=None, repr=False)
  _cache: dict = dataclasses.field(default_factory=dict, repr=False)

  @property
  def mesh_impl(self):
    return self.setup.mesh_impl

  @property
  def model_type(self) -> str:
    return self.setup.model_type

  @property
  def vocabulary(self):
    return self.setup.vocabulary

  def latest_checkpoint(self) -> Optional[str]:
    """model_dir's newest checkpoint path, or None."""
    return tf.train.latest_checkpoint(self.model_dir) if self.model_dir else None

  def trainer(self, train_steps: Optional[int] = None) -> "mtf.training.Trainer":
    """The `mtf.training.Trainer` of this model (built once)."""
    if self._trainer is None:
      utils = _utils()
      schedule = learning_rate_schedules.bind_total_train_steps(
          utils._schedule(self.learning_rate_schedule), train_steps or 1)  # pylint: disable=protected-access
      self._trainer = mtf.training.Trainer(
          modeling.make_model_fn(self.setup), self.setup.feature_shapes(), self.mesh_impl,
          utils.make_optimizer(self.optimizer, schedule), model_dir=self.model_dir,
          checkpoint_every=self.save_checkpoints_steps,
          keep_checkpoints=self.keep_checkpoint_max, log_every=100, log_fn=inference.log)
      if self.init_checkpoint:
        utils.start_from_checkpoint(self._trainer, self.mesh_impl, self.init_checkpoint)
    return self._trainer

  def restore(self, checkpoint_path: Optional[str] = None) -> str:
    """Restores checkpoint_path (default: model_dir's newest); returns it."""
    if checkpoint_path is None and not self.model_dir:
      raise ValueError("MeshEstimator: no model_dir and no checkpoint_path to restore.")
    return inference.restore(self.mesh_impl, self.model_dir or os.path.dirname(checkpoint_path),
                             checkpoint_path)

  def _features(self, input_fn: Callable, train: bool) -> tf.data.Dataset:
    ds = input_fn({"batch_size": self.setup.batch_size})
    return ds.map(lambda ex: complete_features(ex, self.setup.feature_keys))

  def train(self, input_fn: Callable, max_steps: int, hooks=()) -> Dict[str, list]:
    """Trains to global step max_steps on input_fn(params)'s batches."""
    return self.trainer(max_steps).train(self._features(input_fn, True), steps=max_steps,
                                         hooks=hooks)

  def evaluate(self, input_fn: Callable, steps: Optional[int] = None,
               checkpoint_path: Optional[str] = None) -> Dict[str, float]:
    """Mean loss and metrics of the checkpoint over input_fn's batches."""
    trainer = self.trainer()
    if checkpoint_path:
      trainer.checkpoint_manager.restore(checkpoint_path)
    return trainer.evaluate(self._features(input_fn, False), steps=steps)

  def predict(self, input_fn: Callable,
              checkpoint_path: Optional[str] = None) -> Iterator[Dict[str, Any]]:
    """Per example of input_fn(params)'s batches: {"inputs", "outputs"}
    (decoded text) when batches hold only "inputs", else {"inputs",
    "targets", "scores"} (the targets' log-likelihood in nats)."""
    self.restore(checkpoint_path)
    for batch in input_fn({"batch_size": self.setup.batch_size}).as_numpy_iterator():
      if "targets" in batch:
        scores = score_ids(self.setup, batch, self._cache)
        for i, s in enumerate(scores):
          row = {"targets": batch["targets"][i], "scores": s}
          if "inputs" in batch:
            row["inputs"] = batch["inputs"][i]
          yield row
      else:
        texts = [_ids_to_text(self.vocabulary, row) for row in batch["inputs"]]
        for ids, out in zip(batch["inputs"], decode_texts(self.setup, texts)):
          yield {"inputs": ids, "outputs": out}


def _ids_to_text(vocabulary, ids) -> str:
  ids = [int(t) for t in np.asarray(ids).reshape(-1)]
  for stop in (0, vocabulary.eos_id):
    if stop in ids:
      ids = ids[:ids.index(stop)]
  return vocabulary.decode(ids)


def decode_texts(setup: modeling.Setup, texts: Sequence[str], temperature: float = 0.0,
                 decode_length: Optional[int] = None) -> List[str]:
  """Greedy (or sampled) decodes of texts: continuations for "lm", outputs
  for "bitransformer".

  Example:
    >>> decode_texts(est.setup, ["def "])
    ['f(x):']
  """
  if setup.model_type == "lm":
    return inference.lm_decode(setup, list(texts), decode_length or
                               setup.sequence_length["targets"], temperature)
  return inference.bi_decode(setup, list(texts), temperature)


def complete_features(ex: Mapping[str, tf.Tensor], keys: Sequence[str]) -> Dict[str, tf.Tensor]:
  """The model's features of a batch: the token features `keys`, with
  "_segmentation" (1 on tokens) and "_position" when absent, int32, other
  features dropped."""
  out = {}
  for key in keys:
    if key not in ex:
      raise ValueError(f"The dataset has no {key!r} feature (it has {sorted(ex)}); the model "
                       f"needs {list(keys)}.")
    ids = tf.cast(ex[key], tf.int32)
    out[key] = ids
    seg = ex.get(key + "_segmentation")
    out[key + "_segmentation"] = (tf.cast(seg, tf.int32) if seg is not None
                                  else tf.cast(tf.not_equal(ids, 0), tf.int32))
    pos = ex.get(key + "_position")
    if pos is None:
      pos = tf.broadcast_to(tf.range(tf.shape(ids)[-1]), tf.shape(ids)) * \
          tf.cast(tf.not_equal(ids, 0), tf.int32)
    out[key + "_position"] = tf.cast(pos, tf.int32)
  return out


def score_ids(setup: modeling.Setup, batch: Mapping[str, np.ndarray],
              cache: Optional[dict] = None) -> List[float]:
  """The targets' log-likelihood (nats) of each row of a batch of id
  features ("targets", and "inputs" for an encoder-decoder), cut or padded
  to the setup's lengths.

  Example:
    >>> score_ids(est.setup, {"targets": np.array([[107, 108, 1, 0]])})
    [-7.9]
  """
  n = len(batch["targets"])
  rows = inference.padded_batch_size(n, setup.batch_split)
  features = {}
  for key in setup.feature_keys:
    length = setup.sequence_length[key]
    ids = np.zeros([rows, length], np.int32)
    src = np.asarray(batch[key]).astype(np.int32)[:, :length]
    ids[:n, :src.shape[1]] = src
    features[key] = ids
    features[key + "_segmentation"] = (ids != 0).astype(np.int32)
    positions = np.broadcast_to(np.arange(length, dtype=np.int32), ids.shape)
    features[key + "_position"] = np.where(ids != 0, positions, 0).astype(np.int32)

  def build(mesh, feats):
    del mesh
    logits, _ = modeling.call_model(setup, setup.new_model(), feats, "eval", compute_loss=False)
    return {"score": modeling.log_likelihoods(logits, feats["targets"])}

  out = inference.run_mtf(setup.mesh_impl, features, setup.feature_shapes(rows), build,
                          cache if cache is not None else {}, "score_ids")
  return [float(s) for s in out["score"][:n]]


def get_estimator(model_type, vocabulary, mesh_shape, layout_rules, model_dir, batch_size,
                  sequence_length, autostack=None, learning_rate_schedule=None,
                  keep_checkpoint_max=5, save_checkpoints_steps=1000, optimizer=None,
                  predict_fn=None, variable_filter=None, ensemble_inputs=None, use_tpu=False,
                  tpu_job_name=None, iterations_per_loop=None, cluster=None,
                  init_checkpoint=None, mesh_devices=None,
                  score_in_predict_mode=False) -> MeshEstimator:
  """A `MeshEstimator` of the model (the original returned a TPUEstimator).

  The arguments are the original's. TPU and Estimator settings (autostack,
  use_tpu, tpu_job_name, iterations_per_loop, cluster, mesh_devices,
  predict_fn, score_in_predict_mode) are accepted and ignored; the mesh is
  laid out over this machine's devices (`utils.make_mesh_impl`).

  Args:
    model_type: "lm" (or "delimited_lm") or "bitransformer".
    vocabulary: a Vocabulary, or an (inputs, targets) pair of one vocabulary.
    mesh_shape: a string such as "rows:2;cols:4" or an mtf.Shape.
    layout_rules: a string such as "batch:rows" or mtf.LayoutRules.
    model_dir: checkpoints and events.
    batch_size: rows per batch (an int, or the original's (method, value)).
    sequence_length: {"inputs": n, "targets": m} or an int.
    learning_rate_schedule: a schedule, number or list of factors.
    keep_checkpoint_max: checkpoints kept.
    save_checkpoints_steps: save every this many steps.
    optimizer: an optimizer factory (None: Adafactor).
    variable_filter: refused when given (training only some variables is
      not supported).
    ensemble_inputs: refused when given (no ensembles here).
    init_checkpoint: start training from this checkpoint when model_dir has none.

  Example:
    >>> est = get_estimator("lm", ByteVocabulary(), "all:2", "batch:all", "/tmp/lm", 4,
    ...                     {"targets": 32})
    >>> est.setup.feature_shapes()["targets"]
    'batch:4;length:32'
  """
  del autostack, predict_fn, use_tpu, tpu_job_name, iterations_per_loop, cluster
  del mesh_devices, score_in_predict_mode
  utils = _utils()
  if variable_filter:
    raise ValueError(f"get_estimator: variable_filter={variable_filter!r}: training only some "
                     "variables is not supported here; pass None.")
  if ensemble_inputs:
    raise ValueError(f"get_estimator: ensemble_inputs={ensemble_inputs!r}: ensembles are not "
                     "supported here; pass None.")
  if model_type == "delimited_lm":
    model_type = "lm"
  if model_type not in _MODEL_TYPES:
    raise ValueError(f"get_estimator: model_type {model_type!r} is not supported here; "
                     f"choose one of {_MODEL_TYPES}.")
  if isinstance(vocabulary, (list, tuple)):
    if len(vocabulary) != 2 or vocabulary[0] is not vocabulary[1]:
      raise ValueError("get_estimator: separate inputs and targets vocabularies are not "
                       "supported; give one vocabulary.")
    vocabulary = vocabulary[0]
  sequence_length = _lengths(sequence_length)
  if not isinstance(mesh_shape, str):
    mesh_shape = mtf.convert_to_shape(mesh_shape).to_string()
  if not isinstance(layout_rules, str):
    layout_rules = mtf.convert_to_layout_rules(layout_rules).to_string()
  if not isinstance(batch_size, int):
    batch_size = utils.compute_batch_size(sequence_length, mesh_shape, layout_rules, batch_size)
  layout_rules = utils.rules_for_mesh(layout_rules, mesh_shape)
  mesh_impl = utils.make_mesh_impl(mesh_shape, layout_rules)
  split = modeling.batch_split(mesh_impl)
  if batch_size % split:
    raise ValueError(f"get_estimator: batch_size {batch_size} must be a multiple of the batch "
                     f"split {split} (layout {layout_rules!r} on mesh {mesh_shape!r}).")
  setup = modeling.Setup(
      model_type=model_type, vocabulary=vocabulary, mesh_impl=mesh_impl,
      sequence_length=sequence_length, batch_size=batch_size,
      vocab_size=vocabulary.vocab_size, vocab_divisor=None,
      variable_dtype=utils.get_variable_dtype())
  return MeshEstimator(setup, model_dir, optimizer, learning_rate_schedule,
                       keep_checkpoint_max or 5, save_checkpoints_steps or 1000, init_checkpoint)


def _lengths(sequence_length) -> Dict[str, int]:
  if isinstance(sequence_length, int):
    return {"inputs": sequence_length, "targets": sequence_length}
  if not sequence_length or "targets" not in sequence_length:
    raise ValueError(f"sequence_length {sequence_length!r} must be an int or a dict with a "
                     "'targets' length (and 'inputs' for an encoder-decoder).")
  out = dict(sequence_length)
  out.setdefault("inputs", out["targets"])
  return out


def _check_estimator(estimator, fn: str) -> MeshEstimator:
  if callable(estimator) and not isinstance(estimator, MeshEstimator):
    estimator = estimator()
  if not isinstance(estimator, MeshEstimator):
    raise TypeError(f"utils.{fn}: estimator must be what utils.get_estimator returns (a "
                    f"MeshEstimator), got {type(estimator).__name__}.")
  return estimator


# ------------------------------------------------------------------ training
def train_model(estimator, vocabulary, sequence_length, batch_size, train_dataset_fn,
                train_steps, ensemble_inputs, dataset_split="train", skip_seen_data=False,
                seen_data_init_step=0, checkpoint_input_pipeline=False) -> Dict[str, list]:
  """Trains the estimator's model to global step train_steps.

  train_dataset_fn is the original's: train_dataset_fn(sequence_length=,
  vocabulary=, dataset_split=) -> a dataset of (packed) examples, batched
  here; or this library's `dataset.dataset_fn` form (a function whose first
  parameter is `split`), which batches itself. A resumed run skips the
  batches it already trained on (mtf.training.Trainer does), so
  skip_seen_data and checkpoint_input_pipeline need no work here.

  Returns:
    The Trainer's history ({"loss": [...], ...}) of the steps run now.

  Example:
    >>> train_model(est, vocab, {"targets": 32}, 4, my_dataset_fn, 100, None)["loss"][-1]
    2.1
  """
  del seen_data_init_step
  estimator = _check_estimator(estimator, "train_model")
  if skip_seen_data and checkpoint_input_pipeline:
    raise ValueError("train_model: set at most one of skip_seen_data and "
                     "checkpoint_input_pipeline.")
  if ensemble_inputs:
    raise ValueError(f"train_model: ensemble_inputs={ensemble_inputs!r}: ensembles are not "
                     "supported here; pass None.")
  lengths = _lengths(sequence_length)

  def input_fn(params):
    del params
    return _dataset(train_dataset_fn, vocabulary, lengths, batch_size, dataset_split,
                    estimator.model_type, repeat=True)

  return estimator.train(input_fn, max_steps=int(train_steps))


def _dataset(dataset_fn, vocabulary, lengths, batch_size, split, model_type,
             repeat: bool) -> tf.data.Dataset:
  params = list(inspect.signature(dataset_fn).parameters)
  if params and params[0] == "split":
    return dataset_fn(split, compat.targets_vocabulary(vocabulary), lengths, batch_size, 1,
                      repeat, model_type=model_type)
  ds = dataset_fn(sequence_length=lengths, vocabulary=vocabulary, dataset_split=split)
  if repeat:
    ds = ds.repeat()
  return ds.batch(batch_size, drop_remainder=True)


# ------------------------------------------------------------------ checkpoints
def _checkpoint_steps(model_dir: str) -> Dict[int, str]:
  """{step: path prefix} of model_dir's checkpoints (ckpt-N or model.ckpt-N)."""
  steps = {}
  for index in tf.io.gfile.glob(os.path.join(model_dir, "*ckpt-*.index")):
    prefix = index[:-len(".index")]
    match = re.match(r"^(model\.)?ckpt-(\d+)$", os.path.basename(prefix))
    if match:
      steps[int(match.group(2))] = prefix
  return steps


@gin.configurable(module="utils")
def get_checkpoint_iterator(checkpoint_step, model_dir, skip_until=0, stop_after=None,
                            find_closest=True) -> Iterable[str]:
  """Checkpoint paths of model_dir, as the original's: an int or list of
  ints gives those steps' checkpoints (with find_closest the nearest
  existing ones), "all" every checkpoint after skip_until in step order, -1
  the latest, and None waits for new checkpoints
  (tf.train.checkpoints_iterator) after skip_until, up to stop_after.
  Checkpoints of this library (ckpt-N) and of the original (model.ckpt-N)
  are both found.

  Example:
    >>> list(get_checkpoint_iterator("all", "/tmp/lm"))
    ['/tmp/lm/ckpt-5', '/tmp/lm/ckpt-10']
  """
  if checkpoint_step == "all":
    steps = _checkpoint_steps(model_dir)
    return [steps[s] for s in sorted(steps) if s > skip_until]
  if checkpoint_step == -1:
    latest = tf.train.latest_checkpoint(model_dir)
    if latest is None:
      raise ValueError(f"get_checkpoint_iterator: {model_dir} has no checkpoint.")
    return [latest]
  if checkpoint_step is None:
    def waiting():
      for path in tf.train.checkpoints_iterator(model_dir):
        step = compat.get_step_from_checkpoint_path(path)
        if step > skip_until and (stop_after is None or step <= stop_after):
          yield path
        if stop_after is not None and step >= stop_after:
          return
    return waiting()
  wanted = [checkpoint_step] if isinstance(checkpoint_step, int) else list(checkpoint_step)
  steps = _checkpoint_steps(model_dir)
  if not steps:
    raise ValueError(f"get_checkpoint_iterator: no checkpoint files found in {model_dir}.")
  if find_closest:
    chosen = sorted({min(steps, key=lambda s, w=w: (abs(s - w), s)) for w in wanted})
    return [steps[s] for s in chosen]
  found = [steps[w] for w in wanted if w in steps]
  if not found:
    raise ValueError(f"get_checkpoint_iterator: checkpoints {checkpoint_step!r} not found in "
                     f"{model_dir} (it has steps {sorted(steps)}).")
  return found


# ------------------------------------------------------------------ decoding
@gin.configurable(module="utils")
def decode(estimator, input_fn, vocabulary, checkpoint_path=None) -> Iterator[str]:
  """Yields the decoded text of every example of input_fn(params) (batches
  of "inputs" ids), from checkpoint_path (default: the newest).

  Example:
    >>> list(decode(est, lambda p: tf.data.Dataset.from_tensors({"inputs": ids}), vocab))
    ['Return a + b.']
  """
  del vocabulary
  estimator = _check_estimator(estimator, "decode")
  for i, result in enumerate(estimator.predict(input_fn, checkpoint_path=checkpoint_path)):
    if i & (i - 1) == 0:
      logging.info("decoded %d: %s", i, result["outputs"])
    yield result["outputs"]


@gin.configurable(module="utils")
def compute_log_likelihoods(estimator, input_fn, checkpoint_path=None) -> List[float]:
  """The targets' log-likelihood (nats) of every example of input_fn(params)
  (batches of "targets", and "inputs" for an encoder-decoder).

  Example:
    >>> compute_log_likelihoods(est, lambda p: tf.data.Dataset.from_tensors(batch))
    [-12.5, -3.25]
  """
  estimator = _check_estimator(estimator, "compute_log_likelihoods")
  return [float(r["scores"]) for r in estimator.predict(input_fn, checkpoint_path)]


@gin.configurable(module="utils")
def decode_from_file(estimator, vocabulary, model_type, batch_size, sequence_length,
                     checkpoint_path=None, input_filename=gin.REQUIRED,
                     output_filename=gin.REQUIRED, eos_id=1, repeats=1) -> str:
  """Decodes every line of input_filename (greedily) and writes one output
  per line to "<output_filename>-<checkpoint step>"; returns that path.

  Example:
    >>> decode_from_file(est, vocab, "lm", 4, {"inputs": 32, "targets": 32},
    ...                  "/tmp/lm/ckpt-10", "prompts.txt", "decodes.txt")
    'decodes.txt-10'
  """
  del batch_size, sequence_length, eos_id
  estimator = _check_estimator(estimator, "decode_from_file")
  if model_type != estimator.model_type and not (model_type == "delimited_lm"):
    raise ValueError(f"decode_from_file: model_type {model_type!r} differs from the "
                     f"estimator's {estimator.model_type!r}.")
  inputs = compat.get_inputs_from_file(input_filename)
  path = estimator.restore(checkpoint_path)
  step = compat.get_step_from_checkpoint_path(path)
  texts = [line for line in inputs for _ in range(repeats)]
  decodes = decode_texts(estimator.setup, texts) if texts else []
  output = f"{output_filename}-{step}"
  compat.write_lines_to_file(decodes, output)
  return output


@gin.configurable(module="utils")
def decode_from_dataset(estimator, vocabulary, model_type, batch_size, sequence_length,
                        checkpoint_path=None, infer_dataset_fn=gin.REQUIRED,
                        dataset_split="validation", decode_output_dir=gin.REQUIRED) -> List[str]:
  """Decodes the inputs of every EvalDataset of infer_dataset_fn(
  sequence_length=, vocabulary=, dataset_split=) and writes
  "<decode_output_dir>/<task>_<step>_predictions" (and "<task>_inputs");
  returns the prediction files' paths.

  Example:
    >>> decode_from_dataset(est, vocab, "bitransformer", 4, lengths,
    ...                     infer_dataset_fn=my_tasks, decode_output_dir="/tmp/out")
  """
  del model_type, batch_size
  estimator = _check_estimator(estimator, "decode_from_dataset")
  path = estimator.restore(checkpoint_path)
  step = compat.get_step_from_checkpoint_path(path)
  written = []
  for task in infer_dataset_fn(sequence_length=_lengths(sequence_length),
                               vocabulary=vocabulary, dataset_split=dataset_split):
    task = dataset_lib.EvalDataset(*task)
    examples = list(task.dataset_fn().as_numpy_iterator())
    texts = [_example_text(estimator.vocabulary, ex, "inputs") for ex in examples]
    outputs = decode_texts(estimator.setup, texts) if texts else []
    tf.io.gfile.makedirs(decode_output_dir)
    compat.write_lines_to_file(texts, os.path.join(decode_output_dir, f"{task.name}_inputs"))
    out = os.path.join(decode_output_dir, f"{task.name}_{step}_predictions")
    compat.write_lines_to_file(outputs, out)
    written.append(out)
  return written


def _example_text(vocabulary, ex: Mapping[str, Any], key: str) -> str:
  pre = ex.get(key + "_pretokenized")
  if pre is not None:
    return pre.decode("utf-8") if isinstance(pre, bytes) else str(pre)
  return _ids_to_text(vocabulary, ex[key])


@gin.configurable(module="utils")
def infer_model(estimator, vocabulary, sequence_length, batch_size, model_type, model_dir,
                eval_checkpoint_step, checkpoint_paths=None, decode_fn=decode_from_file):
  """Runs decode_fn (default decode_from_file, its files from gin) for every
  checkpoint of get_checkpoint_iterator(eval_checkpoint_step, model_dir)
  (or of checkpoint_paths); returns decode_fn's results.

  Example:
    >>> infer_model(est, vocab, lengths, 4, "lm", "/tmp/lm", -1,
    ...             decode_fn=functools.partial(decode_from_file, input_filename="p.txt",
    ...                                         output_filename="d.txt"))
    ['d.txt-10']
  """
  if checkpoint_paths is None:
    checkpoint_paths = get_checkpoint_iterator(eval_checkpoint_step, model_dir)
  return [decode_fn(estimator, vocabulary=vocabulary, model_type=model_type,
                    batch_size=batch_size, sequence_length=sequence_length,
                    checkpoint_path=path) for path in checkpoint_paths]


# ------------------------------------------------------------------ scoring
def _maybe_add_pretokenized_features(examples: List[Dict[str, Any]], vocabulary):
  """Adds "<feature>_pretokenized" (the vocabulary's decode of the ids) to
  every example that has "inputs" or "targets" without it; returns examples.

  Example:
    >>> _maybe_add_pretokenized_features([{"targets": np.array([107, 108])}], vocab)
    [{'targets': array([107, 108]), 'targets_pretokenized': 'hi'}]
  """
  vocabs = {"inputs": compat.inputs_vocabulary(vocabulary),
            "targets": compat.targets_vocabulary(vocabulary)}
  warned = set()
  for example in examples:
    for key, vocab in vocabs.items():
      if key in example and key + "_pretokenized" not in example:
        example[key + "_pretokenized"] = vocab.decode(np.asarray(example[key]).tolist())
        if key not in warned:
          warned.add(key)
          logging.warning("'%s_pretokenized' is approximated by decoding '%s'.", key, key)
  return examples


@gin.configurable(module="utils")
def save_scores(results, vocabulary, scores_filename=None, save_example_text=True):
  """The scores of scored examples (dicts with "scores", "targets" and
  maybe "inputs"), written to "<scores_filename>.scores" (and, with
  save_example_text, ".targets", ".lengths" and ".inputs") when a filename
  is given.

  Returns:
    scores; with save_example_text (scores, targets) or (scores, inputs,
    targets), the texts decoded unless the results hold "*_pretokenized".

  Example:
    >>> save_scores([{"scores": -1.5, "targets": [107, 1]}], vocab, None, False)
    [-1.5]
  """
  if not results:
    raise ValueError("save_scores: no examples were scored.")
  scores = [float(r["scores"]) for r in results]
  if scores_filename is not None:
    compat.write_lines_to_file(["%g" % s for s in scores], scores_filename + ".scores")
  if not save_example_text:
    return scores
  targets = [_example_text(compat.targets_vocabulary(vocabulary), r, "targets") for r in results]
  lengths = [int(np.argmax(np.asarray(r["targets"]) == 0)) if 0 in np.asarray(r["targets"])
             else len(r["targets"]) for r in results]
  if scores_filename is not None:
    compat.write_lines_to_file(targets, scores_filename + ".targets")
    compat.write_lines_to_file(lengths, scores_filename + ".lengths")
  if "inputs" in results[0]:
    inputs = [_example_text(compat.inputs_vocabulary(vocabulary), r, "inputs") for r in results]
    if scores_filename is not None:
      compat.write_lines_to_file(inputs, scores_filename + ".inputs")
    return scores, inputs, targets
  return scores, targets


def score_with_estimator(estimator, input_fn, eval_checkpoint_step, model_dir, vocabulary,
                         score_postprocess_fn=save_scores, num_examples=None):
  """Scores every example of input_fn(params) with the checkpoint(s) of
  eval_checkpoint_step (see get_checkpoint_iterator) and returns
  (score_postprocess_fn(results, vocabulary), results) of the last one.

  Example:
    >>> outputs, results = score_with_estimator(est, input_fn, -1, "/tmp/lm", vocab)
  """
  estimator = _check_estimator(estimator, "score_with_estimator")
  outputs = results = None
  for path in get_checkpoint_iterator(eval_checkpoint_step, model_dir):
    results = list(estimator.predict(input_fn, checkpoint_path=path))
    if num_examples is not None:
      results = results[:num_examples]
    outputs = score_postprocess_fn(results, vocabulary)
  if results is None:
    raise ValueError(f"score_with_estimator: no checkpoint of {eval_checkpoint_step!r} in "
                     f"{model_dir}.")
  return outputs, results


@gin.configurable(module="utils")
def score_from_strings(estimator, vocabulary, model_type, batch_size, sequence_length,
                       model_dir, eval_checkpoint_step, inputs=gin.REQUIRED,
                       targets=gin.REQUIRED, score_postprocess_fn=gin.REQUIRED, eos_id=1,
                       score_eos=True):
  """The log-likelihood (nats) of every target given its input, through
  score_postprocess_fn(results, vocabulary) (e.g. save_scores).

  inputs may be None for "lm" (targets scored alone); with fewer inputs
  than targets, each input is repeated for len(targets) // len(inputs)
  consecutive targets. score_eos=False leaves the final EOS out of the score.

  Example:
    >>> score_from_strings(est, vocab, "lm", 4, {"targets": 32}, "/tmp/lm", -1,
    ...                    None, ["hello"], lambda r, v: [x["scores"] for x in r])
    [-14.2]
  """
  estimator = _check_estimator(estimator, "score_from_strings")
  lengths = _lengths(sequence_length)
  targets = list(targets)
  if inputs is not None and model_type != "lm":
    inputs = list(inputs)
    if not inputs or len(targets) % len(inputs):
      raise ValueError(f"score_from_strings: {len(inputs)} inputs must divide the "
                       f"{len(targets)} targets.")
    inputs = [i for i in inputs for _ in range(len(targets) // len(inputs))]
  vocab_in = compat.inputs_vocabulary(vocabulary)
  vocab_out = compat.targets_vocabulary(vocabulary)

  def encode(texts, vocab, length, eos):
    rows = []
    for text in texts:
      ids = vocab.encode(text)
      if eos:
        ids = ids[:length - 1] + [eos_id]
      rows.append((ids[:length] + [0] * length)[:length])
    return np.array(rows, np.int32).reshape([len(texts), length])

  features = {"targets": encode(targets, vocab_out, lengths["targets"], score_eos)}
  if model_type != "lm":
    features["inputs"] = encode(inputs, vocab_in, lengths["inputs"], True)
  strings = {"targets_pretokenized": targets}
  if model_type != "lm":
    strings["inputs_pretokenized"] = inputs

  def input_fn(params):
    del params
    return tf.data.Dataset.from_tensor_slices(features).batch(batch_size)

  _, results = score_with_estimator(estimator, input_fn, eval_checkpoint_step, model_dir,
                                    vocabulary, score_postprocess_fn=lambda r, v: None)
  for i, r in enumerate(results):
    for key, values in strings.items():
      r[key] = values[i]
  return score_postprocess_fn(results, vocabulary)


@gin.configurable(module="utils")
def score_from_dataset(estimator, vocabulary, batch_size, sequence_length, model_dir,
                       eval_checkpoint_step, dataset_split, score_dataset_fn=None,
                       score_postprocess_fn=gin.REQUIRED):
  """The log-likelihood of every example of the EvalDatasets of
  score_dataset_fn(sequence_length=, vocabulary=, dataset_split=),
  concatenated, through score_postprocess_fn(results, vocabulary).

  Example:
    >>> score_from_dataset(est, vocab, 4, lengths, "/tmp/lm", -1, "validation",
    ...                    my_tasks, lambda r, v: [x["scores"] for x in r])
  """
  if score_dataset_fn is None:
    raise ValueError("score_from_dataset: give score_dataset_fn (a function returning "
                     "EvalDatasets).")
  estimator = _check_estimator(estimator, "score_from_dataset")
  examples = []
  for task in score_dataset_fn(sequence_length=_lengths(sequence_length),
                               vocabulary=vocabulary, dataset_split=dataset_split):
    examples.extend(dataset_lib.EvalDataset(*task).dataset_fn().as_numpy_iterator())
  if not examples:
    raise ValueError("score_from_dataset: the datasets hold no examples.")
  keys = [k for k in ("inputs", "targets") if k in examples[0]]
  lengths = _lengths(sequence_length)

  def pad(rows, length):
    out = np.zeros([len(rows), length], np.int32)
    for i, r in enumerate(rows):
      r = np.asarray(r)[:length]
      out[i, :len(r)] = r
    return out

  features = {k: pad([ex[k] for ex in examples], lengths[k]) for k in keys}

  def input_fn(params):
    del params
    return tf.data.Dataset.from_tensor_slices(features).batch(batch_size)

  _, results = score_with_estimator(estimator, input_fn, eval_checkpoint_step, model_dir,
                                    vocabulary, score_postprocess_fn=lambda r, v: None)
  for r, ex in zip(results, examples):
    for key in ("inputs_pretokenized", "targets_pretokenized"):
      if key in ex:
        r[key] = ex[key]
  return score_postprocess_fn(results, vocabulary)


# ------------------------------------------------------------------ evaluation
def metric_sum(values, name=None, **kwargs):
  """A streaming sum: (total, update) where update() adds sum(values) to
  the total (a tf.Variable) and returns it, the TF2 form of the original's
  (value, update_op) metric.

  Example:
    >>> total, update = metric_sum(tf.constant([1.0, 2.0]))
    >>> float(update())
    3.0
  """
  del kwargs
  accum = tf.Variable(0.0, trainable=False, name=name or "metric_sum")

  def update():
    return accum.assign_add(tf.reduce_sum(tf.cast(values, tf.float32)))
  return accum, update


def metric_max(values, name=None, **kwargs):
  """A streaming maximum (starting at 0): (value, update), see metric_sum.

  Example:
    >>> value, update = metric_max(tf.constant([1.0, 5.0]))
    >>> float(update())
    5.0
  """
  del kwargs
  accum = tf.Variable(0.0, trainable=False, name=name or "metric_max")

  def update():
    return accum.assign(tf.maximum(accum, tf.reduce_max(tf.cast(values, tf.float32))))
  return accum, update


def eval_model(estimator, vocabulary, sequence_length, batch_size, dataset_split, model_dir,
               eval_dataset_fn, eval_summary_dir, eval_checkpoint_step, eval_with_score=False,
               output_eval_examples=True) -> Dict[int, Dict[str, float]]:
  """Evaluates the checkpoints of eval_checkpoint_step (see
  get_checkpoint_iterator) on the EvalDatasets of eval_dataset_fn(
  sequence_length=, vocabulary=, dataset_split=): their inputs are decoded
  (or, with eval_with_score, their targets scored), post-processed, and
  every metric_fn(targets, predictions) is written to TensorBoard in
  eval_summary_dir (default "<model_dir>/<split>_eval") as
  "eval/<task>/<metric>"; with output_eval_examples also the inputs,
  targets and "<task>_<step>_predictions" files.

  Returns:
    {step: {"eval/<task>/<metric>": value}}.

  Example:
    >>> eval_model(est, vocab, lengths, 4, "validation", "/tmp/bi", my_tasks, None, -1)
    {10: {'eval/copy/accuracy': 25.0}}
  """
  if eval_dataset_fn is None:
    raise ValueError("eval_model: give eval_dataset_fn (a function returning EvalDatasets).")
  estimator = _check_estimator(estimator, "eval_model")
  tasks = [dataset_lib.EvalDataset(*t) for t in eval_dataset_fn(
      sequence_length=_lengths(sequence_length), vocabulary=vocabulary,
      dataset_split=dataset_split)]
  tasks = [t for t in tasks if t.metric_fns]
  if not tasks:
    logging.info("eval_model: every EvalDataset has metric_fns=[]; nothing to evaluate.")
    return {}
  summary_dir = eval_summary_dir or os.path.join(model_dir, f"{dataset_split}_eval")
  tf.io.gfile.makedirs(summary_dir)
  examples = {t.name: list(t.dataset_fn().as_numpy_iterator()) for t in tasks}
  targets = {}
  for t in tasks:
    targets[t.name] = [t.postprocess_fn(_example_text(estimator.vocabulary, ex, "targets"),
                                        example=ex, is_target=True) for ex in examples[t.name]]
    if output_eval_examples:
      compat.write_lines_to_file(targets[t.name], os.path.join(summary_dir, f"{t.name}_targets"))
      compat.write_lines_to_file(
          [_example_text(estimator.vocabulary, ex, "inputs") for ex in examples[t.name]
           if "inputs" in ex or "inputs_pretokenized" in ex],
          os.path.join(summary_dir, f"{t.name}_inputs"))
  writer = (tf.summary.create_file_writer(summary_dir)
            if _environment.tensorboard_available(summary_dir) else None)
  results = {}
  for path in get_checkpoint_iterator(eval_checkpoint_step, model_dir):
    estimator.restore(path)
    step = compat.get_step_from_checkpoint_path(path)
    results[step] = {}
    for t in tasks:
      exs = examples[t.name]
      if eval_with_score:
        lengths = estimator.setup.sequence_length
        batch = {k: np.stack([np.asarray(ex[k])[:lengths[k]].tolist() +
                              [0] * (lengths[k] - min(len(ex[k]), lengths[k]))
                              for ex in exs]) for k in estimator.setup.feature_keys}
        outputs = score_ids(estimator.setup, batch, estimator._cache)  # pylint: disable=protected-access
      else:
        texts = [_example_text(estimator.vocabulary, ex, "inputs") for ex in exs]
        outputs = decode_texts(estimator.setup, texts)
      predictions = [t.postprocess_fn(o, example=ex) for o, ex in zip(outputs, exs)]
      if output_eval_examples:
        compat.write_lines_to_file(predictions,
                                   os.path.join(summary_dir, f"{t.name}_{step}_predictions"))
      for metric_fn in t.metric_fns:
        for metric, value in metric_fn(targets[t.name], predictions).items():
          tag = f"eval/{t.name}/{metric}"
          results[step][tag] = float(value)
          if writer is not None:
            with writer.as_default():
              tf.summary.scalar(tag, float(value), step=step)
          logging.info("%s at step %d: %.3f", tag, step, value)
      if writer is not None:
        writer.flush()
  return results


# ------------------------------------------------------------------ export
def export_model(estimator, export_dir, vocabulary, sequence_length, model_type,
                 eval_with_score=False, batch_size=1, checkpoint_path=None) -> str:
  """Writes a SavedModel of the checkpoint (default: the newest) to
  "<export_dir>/<step>" (only the newest checkpoint can be exported; see `transformer.export.export_saved_model`; it
  serves decoding and scoring, so eval_with_score selects nothing here);
  returns its path.

  Example:
    >>> export_model(est, "/tmp/export", vocab, {"targets": 32}, "lm")
    '/tmp/export/10'
  """
  del eval_with_score, batch_size
  estimator = _check_estimator(estimator, "export_model")
  if checkpoint_path is None:
    checkpoint_path = estimator.latest_checkpoint()
    if checkpoint_path is None:
      raise ValueError(f"export_model: {estimator.model_dir} has no checkpoint; train first.")
  model_dir = os.path.dirname(checkpoint_path)
  latest = tf.train.latest_checkpoint(model_dir)
  if latest is None or os.path.basename(latest) != os.path.basename(checkpoint_path):
    raise ValueError(f"export_model: checkpoint_path {checkpoint_path!r} is not the latest "
                     f"checkpoint of its directory ({latest!r}); only the latest is exported.")
  step = compat.get_step_from_checkpoint_path(checkpoint_path)
  path = os.path.join(export_dir, str(step))
  export_lib.export_saved_model(model_dir, path, model_type=model_type,
                                vocabulary=compat.targets_vocabulary(vocabulary),
                                sequence_length=_lengths(sequence_length),
                                vocab_divisor=estimator.setup.vocab_divisor)
  return path


# ------------------------------------------------------------------ checkpoint mapping
def _block_layer_counts(names: Sequence[str]):
  """(blocks, layers) per stack ([encoder, decoder] or [lm]): one more than
  the largest block_NNN / layer_NNN index (blocks None when there are none)."""
  def most(pattern):
    found = [int(n) + 1 for v in names for n in re.findall(pattern, v)]
    return max(found + [-1])
  if any(re.match(r"^encoder/", v) for v in names):
    blocks = [most(r"encoder/.*block_(\d{3})"), most(r"decoder/.*block_(\d{3})")]
    layers = [most(r"encoder/.*layer_(\d{3})"), most(r"decoder/.*layer_(\d{3})")]
  else:
    blocks, layers = [most(r"block_(\d{3})")], [most(r"layer_(\d{3})")]
  return [b if b != -1 else None for b in blocks], layers


def _layer_pairs(ckpt_blocks, ckpt_layers, local_blocks, local_layers, new_layers, prefix):
  def key(layer, block, blocks):
    text = f"layer_{layer:03d}"
    if blocks is not None:
      text = f"block_{block:03d}/" + text
    return text
  ckpt = [key(l, b, ckpt_blocks) for b in range(ckpt_blocks or 1) for l in range(ckpt_layers)]
  local = [key(l, b, local_blocks) for b in range(local_blocks or 1) for l in range(local_layers)
           if not new_layers or l not in new_layers]
  if len(ckpt) != len(local):
    raise ValueError(f"flexible_ckpt_init_mapping: the checkpoint has {len(ckpt)} layers "
                     f"under {prefix or 'the model'} but the model has {len(local)} (not "
                     "counting new_layers); they must be equal.")
  return [(prefix, c, l) for c, l in zip(ckpt, local)]


@gin.configurable(module="utils")
def flexible_ckpt_init_mapping(ckpt_path="", new_layers=None, return_mapping_fn=True,
                               local_var_names: Optional[Sequence[str]] = None):
  """A mapping_fn (model variable name -> checkpoint variable name) for
  init_checkpoint_variable_mapping, or with return_mapping_fn=False a
  filter_fn for should_load_variable, that loads a checkpoint whose layers
  are numbered differently: the checkpoint's layers, in order, go to the
  model's layers except those listed in new_layers ([[enc...], [dec...]]
  for an encoder-decoder, [[...]] for a language model), which keep their
  initialisation.

  Args:
    ckpt_path: the checkpoint.
    new_layers: layer indices (within a block) new in the model.
    return_mapping_fn: return the mapping (True) or the filter.
    local_var_names: the model's variable names (the original read them from
      the TF1 graph, which TF2 has not; default: the names in the latest
      checkpoint of the same directory).

  Example:
    >>> fn = flexible_ckpt_init_mapping("/ckpt/model.ckpt-100", [[1]], True,
    ...                                 ["decoder/layer_000/x", "decoder/layer_002/x"])
    >>> fn("decoder/layer_002/x")
    'decoder/layer_001/x'
  """
  ckpt_names = [n for n, _, _ in mtf.checkpoint.list_variables(ckpt_path)]
  if local_var_names is None:
    local_var_names = ckpt_names
  local_var_names = list(local_var_names)
  ckpt_blocks, ckpt_layers = _block_layer_counts(ckpt_names)
  local_blocks, local_layers = _block_layer_counts(local_var_names)
  if len(ckpt_blocks) != len(local_blocks):
    raise ValueError("flexible_ckpt_init_mapping: the checkpoint and the model are not both "
                     "encoder-decoders or both language models.")
  prefixes = ["encoder/", "decoder/"] if len(ckpt_blocks) == 2 else [""]
  new_layers = new_layers or [None] * len(prefixes)
  pairs = []
  for i, prefix in enumerate(prefixes):
    pairs += _layer_pairs(ckpt_blocks[i], ckpt_layers[i], local_blocks[i], local_layers[i],
                          new_layers[i], prefix)
  mapping = {}
  ckpt_set = set(ckpt_names)
  for local in local_var_names:
    if "layer_" not in local:
      if local in ckpt_set:
        mapping[local] = local
      continue
    for prefix, ckpt_key, local_key in pairs:
      if local.startswith(prefix) and re.search(r"(^|/)" + re.escape(local_key) + "/", local):
        candidate = local.replace(local_key + "/", ckpt_key + "/", 1)
        if candidate in ckpt_set:
          mapping[local] = candidate
        break

  def mapping_fn(name: str) -> str:
    if name not in mapping:
      raise KeyError(f"flexible_ckpt_init_mapping: {name!r} has no variable in {ckpt_path}.")
    return mapping[name]

  def filter_fn(name: str) -> bool:
    return name in mapping

  return mapping_fn if return_mapping_fn else filter_fn

