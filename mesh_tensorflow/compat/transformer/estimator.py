"""The original transformer/utils.py's Estimator and training entry points
(get_estimator, train_model, build_model, parse_gin_defaults_and_flags),
running on this library; the decoding, scoring and evaluation ones are in
`decoding` and `evaluation`, over the same estimator.

The original passed a TPUEstimator between these functions. Here
`get_estimator` returns a `MeshEstimator`: a small object bundling the
model's `modeling.Setup` (model type, vocabulary, mesh and layout, batch
size, sequence lengths), the model directory and the optimizer settings.
It trains with `mtf.training.Trainer`, restores with
`mtf.checkpoint.CheckpointManager` and decodes and scores with
`transformer.inference`, so every entry point takes it where the
original took an estimator. Served at the original's path
`mesh_tensorflow.transformer.utils`:

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
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence

from absl import flags
import gin
import numpy as np
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import cli
from mesh_tensorflow.compat.transformer import helpers
from mesh_tensorflow.transformer import application
from mesh_tensorflow.transformer import gin_config
from mesh_tensorflow.transformer import inference
from mesh_tensorflow.transformer import learning_rate_schedules
from mesh_tensorflow.transformer import modeling
from mesh_tensorflow.transformer import run_config

__all__ = [
    "FLAGS", "MeshEstimator", "build_model", "get_estimator", "parse_gin_defaults_and_flags",
    "train_model"]

FLAGS = flags.FLAGS
# --gin_file, --gin_param and --gin_location_prefix, as the original defined
# them on import (programs written for it read them from FLAGS).
cli.define_gin_flags()

_MODEL_TYPES = ("lm", "bitransformer")


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
  gin_config.add_search_paths(_flag("gin_location_prefix", []))
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
      schedule = learning_rate_schedules.bind_total_train_steps(
          run_config.as_schedule(self.learning_rate_schedule), train_steps or 1)
      self._trainer = mtf.training.Trainer(
          modeling.make_model_fn(self.setup), self.setup.feature_shapes(), self.mesh_impl,
          application.make_optimizer(self.optimizer, schedule), model_dir=self.model_dir,
          checkpoint_every=self.save_checkpoints_steps,
          keep_checkpoints=self.keep_checkpoint_max, log_every=100, log_fn=inference.log)
      if self.init_checkpoint:
        application.start_from_checkpoint(self._trainer, self.mesh_impl, self.init_checkpoint)
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
        texts = [inference.ids_to_text(self.vocabulary, row) for row in batch["inputs"]]
        for ids, out in zip(batch["inputs"], decode_texts(self.setup, texts)):
          yield {"inputs": ids, "outputs": out}


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
    batch_size = run_config.compute_batch_size(sequence_length, mesh_shape, layout_rules, batch_size)
  layout_rules = run_config.rules_for_mesh(layout_rules, mesh_shape)
  mesh_impl = application.make_mesh_impl(mesh_shape, layout_rules)
  split = modeling.batch_split(mesh_impl)
  if batch_size % split:
    raise ValueError(f"get_estimator: batch_size {batch_size} must be a multiple of the batch "
                     f"split {split} (layout {layout_rules!r} on mesh {mesh_shape!r}).")
  setup = modeling.Setup(
      model_type=model_type, vocabulary=vocabulary, mesh_impl=mesh_impl,
      sequence_length=sequence_length, batch_size=batch_size,
      vocab_size=vocabulary.vocab_size, vocab_divisor=None,
      variable_dtype=run_config.get_variable_dtype())
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
    return dataset_fn(split, helpers.targets_vocabulary(vocabulary), lengths, batch_size, 1,
                      repeat, model_type=model_type)
  ds = dataset_fn(sequence_length=lengths, vocabulary=vocabulary, dataset_split=split)
  if repeat:
    ds = ds.repeat()
  return ds.batch(batch_size, drop_remainder=True)

