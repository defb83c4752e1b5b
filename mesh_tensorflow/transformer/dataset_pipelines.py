"""This library's token pipelines, text to packed batches of ids:
`tokenize`, `split_tokens`, `trim` and `finish`, and the complete
pipelines built from them, `lm_dataset` (language models), `pairs_dataset`
(encoder-decoders) and `dataset_fn` (gin's `run.dataset_fn`).

    >>> ds = lm_dataset(["a.txt"], vocabulary.ByteVocabulary(), sequence_length=128,
    ...                 batch_size=8, seed=1)
"""

from __future__ import annotations

from typing import Mapping, Optional, Sequence, Tuple, Union

import gin
import tensorflow as tf

from mesh_tensorflow.core.autograph_exempt import plain_tf
from mesh_tensorflow.transformer import vocabulary as vocabulary_lib
from mesh_tensorflow.transformer.corpus import (
    DEFAULT_CORPUS_BYTES, TRAIN, stdlib_docstring_pairs, stdlib_files)
from mesh_tensorflow.transformer.dataset_sources import (
    seqio_dataset, text_dataset, tfds_pairs, tfds_text, tsv_dataset)
from mesh_tensorflow.transformer.packing import Lengths, as_lengths, pack, pad_unpacked

# gin names these `dataset.<name>`, the module users import them from.
_GIN_MODULE = "mesh_tensorflow.transformer.dataset"


# ---------------------------------------------------------- token pipelines
def tokenize(ds: tf.data.Dataset, vocabulary: vocabulary_lib.Vocabulary,
             keys: Sequence[str] = ("targets",), append_eos: bool = True) -> tf.data.Dataset:
  """Encodes the string features `keys` (or a dataset of plain strings, which
  becomes {keys[0]: ids}) and appends the EOS id.

  Example:
    >>> ds = tokenize(text_dataset(["a.txt"]), ByteVocabulary())
  """
  eos = tf.constant([vocabulary.eos_id], tf.int32)

  def encode(example):
    if not isinstance(example, dict):
      example = {keys[0]: example}
    out = dict(example)
    for key in keys:
      ids = tf.cast(vocabulary.encode_tf(example[key]), tf.int32)
      out[key] = tf.concat([ids, eos], 0) if append_eos else ids
    return out

  return ds.map(plain_tf(encode))


def split_tokens(ds: tf.data.Dataset, max_length: int,
                 key: str = "targets") -> tf.data.Dataset:
  """Splits every example's `key` into consecutive pieces of at most
  `max_length` tokens (language modelling on long documents).

  Example:
    >>> # [1, 2, 3, 4, 5] with max_length=2 gives [1, 2], [3, 4], [5].
    >>> ds = split_tokens(ds, 2)
  """
  if max_length < 1:
    raise ValueError(f"split_tokens: max_length must be >= 1, got {max_length}.")

  def pieces(example):
    tokens = example[key]
    n = tf.size(tokens)
    full = n // max_length
    lengths = tf.concat([tf.fill([full], max_length),
                         tf.reshape(n - full * max_length, [1])], 0)
    lengths = tf.boolean_mask(lengths, lengths > 0)
    return tf.data.Dataset.from_tensor_slices(
        {key: tf.RaggedTensor.from_row_lengths(tokens, lengths)})

  return ds.flat_map(plain_tf(pieces)).map(plain_tf(lambda ex: {key: ex[key]}))


def trim(ds: tf.data.Dataset, lengths: Mapping[str, int],
         keep_eos: bool = True) -> tf.data.Dataset:
  """Cuts each feature in `lengths` to at most that many tokens; with
  keep_eos, a cut example still ends with its last token (the EOS id).

  Example:
    >>> ds = trim(ds, {"inputs": 64, "targets": 32})
  """
  def cut(example):
    out = dict(example)
    for key, length in lengths.items():
      ids = example[key]
      if keep_eos:
        out[key] = tf.cond(tf.size(ids) > length,
                           lambda ids=ids, length=length: tf.concat(
                               [ids[:length - 1], ids[-1:]], 0),
                           lambda ids=ids: ids)
      else:
        out[key] = ids[:length]
    return out

  return ds.map(plain_tf(cut))


def finish(ds: tf.data.Dataset, batch_size: int, repeat: bool) -> tf.data.Dataset:
  """Repeats (if asked), batches rows (dropping a short last batch) and
  prefetches. Examples are shuffled before packing, not here."""
  if repeat:
    ds = ds.repeat()
  return ds.batch(batch_size, drop_remainder=True).prefetch(2)


def _shuffle(ds: tf.data.Dataset, seed: Optional[int], shuffle_buffer: int) -> tf.data.Dataset:
  if seed is None or shuffle_buffer <= 1:
    return ds
  return ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)


# ------------------------------------------------------- complete pipelines
def lm_dataset(files: Sequence[str], vocabulary: vocabulary_lib.Vocabulary,
               sequence_length: int, batch_size: int, seed: Optional[int] = 1,
               repeat: bool = True, packed: bool = True, unit: str = "file",
               shuffle_buffer: int = 10000) -> tf.data.Dataset:
  """Batches for a decoder-only language model from plain text files.

  text -> ids + EOS -> pieces of at most sequence_length -> shuffle (seeded,
  reshuffled every epoch) -> pack (or pad) -> batch [-> repeat].

  Args:
    files: text files (globs allowed).
    vocabulary: a Vocabulary.
    sequence_length: tokens per row.
    batch_size: rows per batch (a short last batch is dropped).
    seed: shuffle seed; None reads in file order without shuffling.
    repeat: repeat forever (training) or make one pass (evaluation).
    packed: pack several examples per row (else one example per row).
    unit: "file", "paragraph" or "line" (see text_dataset).
    shuffle_buffer: examples in the shuffle buffer.

  Returns:
    {"targets", "targets_segmentation", "targets_position"}: int32
    [batch_size, sequence_length].

  Example:
    >>> ds = lm_dataset(stdlib_files(), ByteVocabulary(), 128, 16, seed=1)
  """
  ds = tokenize(text_dataset(files, unit), vocabulary, ["targets"])
  ds = split_tokens(ds, sequence_length)
  ds = _shuffle(ds, seed, shuffle_buffer)
  ds = pack(ds, sequence_length) if packed else pad_unpacked(ds, sequence_length)
  return finish(ds, batch_size, repeat)


def pairs_dataset(pairs: Union[Sequence[str], tf.data.Dataset],
                  vocabulary: vocabulary_lib.Vocabulary, sequence_length: Lengths,
                  batch_size: int, seed: Optional[int] = 1, repeat: bool = True,
                  packed: bool = True, shuffle_buffer: int = 10000) -> tf.data.Dataset:
  """Batches for an encoder-decoder model from input/target pairs.

  Args:
    pairs: TSV files of "input<TAB>target" lines, or a dataset of
      {"inputs", "targets"} strings.
    vocabulary: a Vocabulary (for inputs and targets).
    sequence_length: {"inputs": n, "targets": m} (or one int for both);
      longer examples are cut, keeping their EOS.
    batch_size, seed, repeat, packed, shuffle_buffer: as in lm_dataset.

  Returns:
    {"inputs", "targets"} with their "_segmentation" and "_position": int32
    [batch_size, length].

  Example:
    >>> ds = pairs_dataset(["train.tsv"], ByteVocabulary(),
    ...                    {"inputs": 64, "targets": 32}, batch_size=16)
  """
  keys = ["inputs", "targets"]
  lengths = as_lengths(sequence_length, keys)
  ds = pairs if isinstance(pairs, tf.data.Dataset) else tsv_dataset(pairs)
  ds = tokenize(ds, vocabulary, keys)
  ds = trim(ds, lengths)
  ds = _shuffle(ds, seed, shuffle_buffer)
  ds = pack(ds, lengths, keys) if packed else pad_unpacked(ds, lengths, keys)
  return finish(ds, batch_size, repeat)


def pairs_from_list(pairs: Sequence[Tuple[str, str]]) -> tf.data.Dataset:
  """A dataset of {"inputs", "targets"} strings from (input, target) tuples.

  Example:
    >>> ds = pairs_from_list([("2+2", "4"), ("3+1", "4")])
  """
  inputs = [p[0] for p in pairs]
  targets = [p[1] for p in pairs]
  return tf.data.Dataset.from_tensor_slices({"inputs": inputs, "targets": targets})


@gin.configurable(module=_GIN_MODULE)
def dataset_fn(split: str, vocabulary: vocabulary_lib.Vocabulary,
               sequence_length: Mapping[str, int], batch_size: int, seed: Optional[int],
               repeat: bool, model_type: str = "lm",
               train_files: Optional[Sequence[str]] = None,
               eval_files: Optional[Sequence[str]] = None, unit: str = "file",
               packed: bool = True, shuffle_buffer: int = 10000,
               corpus_bytes: int = DEFAULT_CORPUS_BYTES,
               tfds_name: Optional[str] = None, tfds_text_key: str = "text",
               tfds_data_dir: Optional[str] = None, tfds_inputs_key: str = "inputs",
               tfds_targets_key: str = "targets", tfds_train_split: str = "train",
               tfds_eval_split: str = "validation", seqio_task: Optional[str] = None,
               seqio_modules: Sequence[str] = ()) -> tf.data.Dataset:
  """The data `utils.run` trains and evaluates on (gin-configurable).

  With no files given, a language model ("lm") reads the stdlib corpus and
  an encoder-decoder ("bitransformer") learns stdlib signatures -> docstring
  summaries. Text files (`unit` per example) or TSV files ("input<TAB>target")
  replace them; `tfds_name` reads a TensorFlow Datasets dataset by name and
  split instead (needs tensorflow-datasets): its `tfds_text_key` strings for a
  language model, its `tfds_inputs_key` / `tfds_targets_key` strings for an
  encoder-decoder; tokenized, packed and padded as files are.

  Args:
    split: "train" or "validation".
    vocabulary: the Vocabulary.
    sequence_length: {"inputs": n, "targets": m} ("targets" for a language model).
    batch_size: rows per batch.
    seed: shuffle seed.
    repeat: repeat forever (training) or make one pass.
    model_type: "lm" or "bitransformer".
    train_files, eval_files: text (lm) or TSV (bitransformer) files per split.
    unit: example unit of text files for "lm" ("file", "paragraph", "line").
    packed: pack examples into rows.
    shuffle_buffer: examples in the shuffle buffer.
    corpus_bytes: size of the default stdlib corpus.
    tfds_name, tfds_data_dir: a TFDS dataset (e.g. "lm1b", or "my_data:1.0.0")
      and where its prepared data lies (TFDS's default when None).
    tfds_text_key: the text feature of a language model's TFDS dataset.
    tfds_inputs_key, tfds_targets_key: an encoder-decoder's string features.
    tfds_train_split, tfds_eval_split: the TFDS (or seqio) splits read for
      training and evaluation (TFDS split syntax: "train[:90%]").
    seqio_task: a seqio task or mixture name instead (needs seqio): its
      tokenized "targets" (and "inputs") features, packed or padded here.
    seqio_modules: modules to import first, which register the seqio tasks.

  Example (gin):
    dataset_fn.train_files = ["/data/train.txt"]
    dataset_fn.eval_files = ["/data/valid.txt"]
    dataset_fn.unit = "line"
  """
  files = train_files if split == TRAIN else eval_files
  if seqio_task:
    keys = ["targets"] if model_type == "lm" else ["inputs", "targets"]
    lengths = {k: int(sequence_length[k]) for k in keys}
    ds = seqio_dataset(seqio_task, tfds_train_split if split == TRAIN else tfds_eval_split,
                       lengths, vocabulary, seqio_modules)
    ds = _shuffle(ds, seed, shuffle_buffer)
    ds = pack(ds, lengths, keys) if packed else pad_unpacked(ds, lengths, keys)
    return finish(ds, batch_size, repeat)
  if model_type == "lm":
    length = int(sequence_length["targets"])
    tfds_split = tfds_train_split if split == TRAIN else tfds_eval_split
    if tfds_name:
      ds = tokenize(tfds_text(tfds_name, tfds_split, tfds_text_key, tfds_data_dir),
                    vocabulary)
      ds = _shuffle(split_tokens(ds, length), seed, shuffle_buffer)
      ds = pack(ds, length) if packed else pad_unpacked(ds, length)
      return finish(ds, batch_size, repeat)
    if files is None:
      files, unit = stdlib_files(split, corpus_bytes), "file"
    return lm_dataset(files, vocabulary, length, batch_size, seed, repeat, packed, unit,
                      shuffle_buffer)
  if model_type == "bitransformer":
    if tfds_name:
      files = tfds_pairs(tfds_name, tfds_train_split if split == TRAIN else tfds_eval_split,
                         tfds_inputs_key, tfds_targets_key, tfds_data_dir)
    elif files is None:
      files = pairs_from_list(stdlib_docstring_pairs(split, corpus_bytes))
    lengths = {"inputs": int(sequence_length["inputs"]),
               "targets": int(sequence_length["targets"])}
    return pairs_dataset(files, vocabulary, lengths, batch_size, seed, repeat, packed,
                         shuffle_buffer)
  raise ValueError(f"dataset_fn: model_type must be 'lm' or 'bitransformer', got "
                   f"{model_type!r}.")
