"""The original's decoding and scoring entry points (get_checkpoint_iterator,
decode, decode_from_file, infer_model, save_scores, score_from_strings, ...),
over a `MeshEstimator` (see `estimator`). Served at the original's path
`mesh_tensorflow.transformer.utils`:

    >>> from mesh_tensorflow.transformer import utils
    >>> utils.decode_from_file(est, vocab, "lm", 4, {"inputs": 32, "targets": 32},
    ...                        est.latest_checkpoint(), "prompts.txt", "decodes.txt")
"""

from __future__ import annotations

import os
import re
from typing import Any, Dict, Iterable, Iterator, List, Mapping

from absl import logging
import gin
import numpy as np
import tensorflow as tf

from mesh_tensorflow.compat.transformer import helpers
from mesh_tensorflow.transformer import dataset as dataset_lib
from mesh_tensorflow.transformer import inference
from mesh_tensorflow.compat.transformer.estimator import _check_estimator
from mesh_tensorflow.compat.transformer.estimator import _lengths
from mesh_tensorflow.compat.transformer.estimator import decode_texts

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
        step = helpers.get_step_from_checkpoint_path(path)
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
  inputs = helpers.get_inputs_from_file(input_filename)
  path = estimator.restore(checkpoint_path)
  step = helpers.get_step_from_checkpoint_path(path)
  texts = [line for line in inputs for _ in range(repeats)]
  decodes = decode_texts(estimator.setup, texts) if texts else []
  output = f"{output_filename}-{step}"
  helpers.write_lines_to_file(decodes, output)
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
  step = helpers.get_step_from_checkpoint_path(path)
  written = []
  for task in infer_dataset_fn(sequence_length=_lengths(sequence_length),
                               vocabulary=vocabulary, dataset_split=dataset_split):
    task = dataset_lib.EvalDataset(*task)
    examples = list(task.dataset_fn().as_numpy_iterator())
    texts = [_example_text(estimator.vocabulary, ex, "inputs") for ex in examples]
    outputs = decode_texts(estimator.setup, texts) if texts else []
    tf.io.gfile.makedirs(decode_output_dir)
    helpers.write_lines_to_file(texts, os.path.join(decode_output_dir, f"{task.name}_inputs"))
    out = os.path.join(decode_output_dir, f"{task.name}_{step}_predictions")
    helpers.write_lines_to_file(outputs, out)
    written.append(out)
  return written


def _example_text(vocabulary, ex: Mapping[str, Any], key: str) -> str:
  pre = ex.get(key + "_pretokenized")
  if pre is not None:
    return pre.decode("utf-8") if isinstance(pre, bytes) else str(pre)
  return inference.ids_to_text(vocabulary, ex[key])


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
  vocabs = {"inputs": helpers.inputs_vocabulary(vocabulary),
            "targets": helpers.targets_vocabulary(vocabulary)}
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
    helpers.write_lines_to_file(["%g" % s for s in scores], scores_filename + ".scores")
  if not save_example_text:
    return scores
  targets = [_example_text(helpers.targets_vocabulary(vocabulary), r, "targets") for r in results]
  lengths = [int(np.argmax(np.asarray(r["targets"]) == 0)) if 0 in np.asarray(r["targets"])
             else len(r["targets"]) for r in results]
  if scores_filename is not None:
    helpers.write_lines_to_file(targets, scores_filename + ".targets")
    helpers.write_lines_to_file(lengths, scores_filename + ".lengths")
  if "inputs" in results[0]:
    inputs = [_example_text(helpers.inputs_vocabulary(vocabulary), r, "inputs") for r in results]
    if scores_filename is not None:
      helpers.write_lines_to_file(inputs, scores_filename + ".inputs")
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
  vocab_in = helpers.inputs_vocabulary(vocabulary)
  vocab_out = helpers.targets_vocabulary(vocabulary)

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


