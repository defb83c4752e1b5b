"""The original's evaluation, export and checkpoint-mapping entry points
(metric_sum, metric_max, eval_model, export_model, flexible_ckpt_init_mapping),
over a `MeshEstimator` (see `estimator`). Served at the original's path
`mesh_tensorflow.transformer.utils`:

    >>> from mesh_tensorflow.transformer import utils
    >>> utils.eval_model(est, vocab, {"targets": 32}, 4, "validation", "/tmp/lm",
    ...                  my_eval_dataset_fn, None, None)
"""

from __future__ import annotations

import os
import re
from typing import Dict, Optional, Sequence

from absl import logging
import gin
import numpy as np
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import _environment
from mesh_tensorflow.compat.transformer import helpers
from mesh_tensorflow.transformer import dataset as dataset_lib
from mesh_tensorflow.transformer import export as export_lib
from mesh_tensorflow.compat.transformer.decoding import _example_text
from mesh_tensorflow.compat.transformer.decoding import get_checkpoint_iterator
from mesh_tensorflow.compat.transformer.estimator import _check_estimator
from mesh_tensorflow.compat.transformer.estimator import _lengths
from mesh_tensorflow.compat.transformer.estimator import decode_texts
from mesh_tensorflow.compat.transformer.estimator import score_ids

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
      helpers.write_lines_to_file(targets[t.name], os.path.join(summary_dir, f"{t.name}_targets"))
      helpers.write_lines_to_file(
          [_example_text(estimator.vocabulary, ex, "inputs") for ex in examples[t.name]
           if "inputs" in ex or "inputs_pretokenized" in ex],
          os.path.join(summary_dir, f"{t.name}_inputs"))
  writer = (tf.summary.create_file_writer(summary_dir)
            if _environment.tensorboard_available(summary_dir) else None)
  results = {}
  for path in get_checkpoint_iterator(eval_checkpoint_step, model_dir):
    estimator.restore(path)
    step = helpers.get_step_from_checkpoint_path(path)
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
        helpers.write_lines_to_file(predictions,
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
  step = helpers.get_step_from_checkpoint_path(checkpoint_path)
  path = os.path.join(export_dir, str(step))
  export_lib.export_saved_model(model_dir, path, model_type=model_type,
                                vocabulary=helpers.targets_vocabulary(vocabulary),
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

