"""The original transformer/utils.py helpers that do not need an Estimator,
and clear errors for the ones that only made sense with one. Served at the
original's path `mesh_tensorflow.transformer.utils`:

    >>> from mesh_tensorflow.transformer import utils
    >>> utils.write_lines_to_file(["a", "b"], "/tmp/out.txt")
    >>> utils.get_inputs_from_file("/tmp/out.txt")
    ['a', 'b']

Training, evaluation, decoding and scoring run through
`mesh_tensorflow.transformer.application.run` (and the
`python -m mesh_tensorflow.transformer.main` command line); the original's
Estimator-era entry points (get_estimator, train_model, ...) are in
`estimator`, `decoding` and `evaluation` beside this module.
"""

from __future__ import annotations

import re
from typing import Callable, List, Optional, Sequence

__all__ = [
    "inputs_vocabulary", "targets_vocabulary", "separate_vocabularies",
    "init_checkpoint_variable_mapping", "should_load_variable", "variable_filter_max_size",
    "get_inputs_from_file", "write_lines_to_file", "encode_inputs", "encode_delimited_lm",
    "get_step_from_checkpoint_path", "tpu_estimator_model_fn"]

import gin
import numpy as np
import tensorflow as tf



def inputs_vocabulary(vocabulary):
  """The inputs' vocabulary of a Vocabulary or an (inputs, targets) pair.

  Example:
    >>> inputs_vocabulary((byte_vocab, spm_vocab)) is byte_vocab
    True
  """
  return vocabulary[0] if isinstance(vocabulary, tuple) else vocabulary


def targets_vocabulary(vocabulary):
  """The targets' vocabulary of a Vocabulary or an (inputs, targets) pair.

  Example:
    >>> targets_vocabulary((byte_vocab, spm_vocab)) is spm_vocab
    True
  """
  return vocabulary[1] if isinstance(vocabulary, tuple) else vocabulary


@gin.configurable(module="utils")
def separate_vocabularies(inputs=gin.REQUIRED, targets=gin.REQUIRED):
  """An (inputs, targets) vocabulary pair (for gin).

  Example:
    >>> vocab = separate_vocabularies(ByteVocabulary(), ByteVocabulary())
  """
  return (inputs, targets)


@gin.configurable(module="utils")
def init_checkpoint_variable_mapping(name: str,
                                     mapping_fn: Optional[Callable[[str], str]] = None) -> str:
  """The checkpoint variable name for model variable `name`: mapping_fn(name),
  or `name` itself.

  Example:
    >>> init_checkpoint_variable_mapping("decoder/x", lambda n: n.replace("decoder", "dec"))
    'dec/x'
  """
  return mapping_fn(name) if mapping_fn else name


@gin.configurable(module="utils")
def should_load_variable(name: str, filter_fn: Optional[Callable[[str], bool]] = None) -> bool:
  """Whether variable `name` is loaded from an initial checkpoint:
  filter_fn(name), or True.

  Example:
    >>> should_load_variable("decoder/logits/kernel", lambda n: "logits" not in n)
    False
  """
  return filter_fn(name) if filter_fn else True


def variable_filter_max_size(v, max_size: float = 1e7) -> bool:
  """Whether variable `v` (anything with `.size`, e.g. an mtf Variable's
  shape or a NumPy array) has at most max_size elements.

  Example:
    >>> variable_filter_max_size(np.zeros([10, 10]), max_size=50)
    False
  """
  size = v.size if not hasattr(v, "shape") or not hasattr(v.shape, "size") else v.shape.size
  return size <= max_size


def get_inputs_from_file(input_filename: str, ignore_comments: bool = False) -> List[str]:
  """The lines of a file, trailing whitespace stripped, a final empty line
  dropped (and lines starting with "#" with ignore_comments).

  Example:
    >>> get_inputs_from_file("prompts.txt")
    ['def ', 'class ']
  """
  with tf.io.gfile.GFile(input_filename, "r") as f:
    lines = [line.rstrip() for line in f]
  if lines and not lines[-1]:
    lines.pop()
  if ignore_comments:
    lines = [line for line in lines if not line.startswith("#")]
  return lines


def write_lines_to_file(lines: Sequence, filename: str) -> None:
  """Writes str(line) per line (newlines inside a line become spaces),
  replacing the file.

  Example:
    >>> write_lines_to_file(["a", "b\\nc"], "/tmp/out.txt")   # "a\\nb c\\n"
  """
  if tf.io.gfile.exists(filename):
    tf.io.gfile.remove(filename)
  with tf.io.gfile.GFile(filename, "w") as f:
    for line in lines:
      f.write(str(line).replace("\n", " ") + "\n")


def _pad_rows(rows: List[List[int]], batch_size: int, sequence_length: int) -> np.ndarray:
  if not rows:
    raise ValueError("encode: no inputs to encode.")
  out = []
  for ids in rows:
    ids = ids[:sequence_length]
    out.append(ids + [0] * (sequence_length - len(ids)))
  out.extend([out[0]] * (-len(out) % batch_size))
  return np.array(out, dtype=np.int32)


def encode_inputs(inputs: Sequence[str], vocabulary, model_type: str, batch_size: int,
                  sequence_length: int, eos_id: int = 1,
                  unscored_prefix: Optional[Sequence[str]] = None) -> np.ndarray:
  """Encodes strings into an int32 [n rounded up to batch_size, sequence_length]
  array (cut or zero-padded; extra rows repeat the first). Inputs of a
  sequence-to-sequence model end in EOS, a language model's prompts do not;
  an unscored prefix is encoded as negated ids before the line's.

  Example:
    >>> encode_inputs(["hi"], ByteVocabulary(), "lm", 2, 4).tolist()
    [[107, 108, 0, 0], [107, 108, 0, 0]]
  """
  rows = []
  for i, line in enumerate(inputs):
    ids = inputs_vocabulary(vocabulary).encode(line.strip())
    if unscored_prefix:
      ids = [-t for t in inputs_vocabulary(vocabulary).encode(unscored_prefix[i].strip())] + ids
    if model_type != "lm":
      ids = ids + [eos_id]
    rows.append(ids)
  return _pad_rows(rows, batch_size, sequence_length)


def encode_delimited_lm(inputs: Sequence[str], targets: Sequence[str], vocabulary,
                        batch_size: int, sequence_length: int, eos_id: int = 1,
                        include_final_eos: bool = True) -> np.ndarray:
  """Encodes (input, target) pairs as one delimited language-model sequence
  each: input ids, EOS, target ids (and EOS), cut or zero-padded.

  Example:
    >>> encode_delimited_lm(["a"], ["b"], ByteVocabulary(), 1, 5).tolist()
    [[100, 1, 101, 1, 0]]
  """
  rows = []
  for inp, tgt in zip(inputs, targets):
    ids = inputs_vocabulary(vocabulary).encode(inp.strip()) + [eos_id]
    ids += targets_vocabulary(vocabulary).encode(tgt.strip())
    if include_final_eos:
      ids.append(eos_id)
    rows.append(ids)
  return _pad_rows(rows, batch_size, sequence_length)


def get_step_from_checkpoint_path(checkpoint_path: str) -> int:
  """The global step in a checkpoint path: "model.ckpt-<step>" (the
  original's) or "ckpt-<step>" (this library's CheckpointManager).

  Example:
    >>> get_step_from_checkpoint_path("/models/lm/ckpt-1200")
    1200
  """
  match = re.match(r".*ckpt-(\d+)", checkpoint_path)
  if match is None:
    raise ValueError(f"get_step_from_checkpoint_path: {checkpoint_path!r} names no "
                     "checkpoint step (expected '...ckpt-<step>').")
  return int(match.group(1))


def _no_estimator(name: str, replacement: str):
  def fn(*args, **kwargs):
    del args, kwargs
    raise NotImplementedError(
        f"utils.{name} built a TPUEstimator, which TensorFlow 2 no longer has; {replacement}")
  fn.__name__ = name
  fn.__doc__ = (f"Raises NotImplementedError: the original's {name} needs an Estimator. "
                f"{replacement}")
  return fn


tpu_estimator_model_fn = _no_estimator(
    "tpu_estimator_model_fn", "build the model function with "
    "modeling.make_model_fn(setup) and run it with mtf.training.Trainer.")
