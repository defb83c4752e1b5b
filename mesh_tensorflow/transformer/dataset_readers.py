"""The original Mesh TensorFlow's named datasets, files or TensorFlow
Datasets to feature dicts: text lines (`sample_from_text_line_datasets`,
`make_text_line_dataset`, `simple_text_line_dataset`), tab-separated pairs
(`packed_parallel_tsv_dataset`), pre-tokenized TFRecords and TFDS
(`pretokenized_tfrecord_dataset`, `pretokenized_t2t_dataset`,
`pretokenized_tfds_dataset`), raw TFDS text (`untokenized_tfds_dataset`)
and `pad_dataset_with_zeroed_out_examples`.

    >>> lines = tf.data.TextLineDataset(["pairs.tsv"])   # "input<TAB>target" lines
    >>> ds = packed_parallel_tsv_dataset(lines, "train", None, 64, vocabulary.ByteVocabulary())
"""

from __future__ import annotations

import os
from typing import List, Optional, Sequence, Tuple

import gin
import tensorflow as tf

from mesh_tensorflow import _environment
from mesh_tensorflow.core.autograph_exempt import plain_tf
from mesh_tensorflow.transformer.dataset_transforms import (
    encode_all_features, pack_or_pad, supervised_to_dict)
from mesh_tensorflow.transformer.packing import Lengths

# gin names these `dataset.<name>`, the module users import them from.
_GIN_MODULE = "mesh_tensorflow.transformer.dataset"


def _glob(pattern: str, what: str) -> List[str]:
  names = sorted(tf.io.gfile.glob(pattern))
  if not names:
    raise ValueError(f"{what}: no file matches {pattern!r}.")
  return names


@gin.configurable(module=_GIN_MODULE)
def sample_from_text_line_datasets(glob_weight_list: Sequence[Tuple[str, float]],
                                   shuffle_buffer_size: int = 100000,
                                   prefetch: int = 1000) -> tf.data.Dataset:
  """Lines of several file sets, repeated, shuffled and mixed by weight.

  Args:
    glob_weight_list: [(glob, weight), ...].
    shuffle_buffer_size: lines in each set's shuffle buffer.
    prefetch: lines prefetched per set.

  Example:
    >>> ds = sample_from_text_line_datasets([("a/*.txt", 0.7), ("b/*.txt", 0.3)])
  """
  if not glob_weight_list:
    raise ValueError("sample_from_text_line_datasets: glob_weight_list is empty; give "
                     "[(glob, weight), ...].")
  globs, weights = zip(*glob_weight_list)
  datasets = [tf.data.TextLineDataset(_glob(g, "sample_from_text_line_datasets"))
              .repeat().shuffle(shuffle_buffer_size).prefetch(prefetch) for g in globs]
  return tf.data.Dataset.sample_from_datasets(datasets, weights=[float(w) for w in weights])


@gin.configurable(module=_GIN_MODULE)
def make_text_line_dataset(glob: str = gin.REQUIRED) -> tf.data.Dataset:
  """The lines of the files matching `glob`, repeated and shuffled.

  Example:
    >>> ds = make_text_line_dataset("corpus/*.txt")
  """
  return sample_from_text_line_datasets([(glob, 1.0)])


@gin.configurable(module=_GIN_MODULE)
def simple_text_line_dataset(glob: str = gin.REQUIRED,
                             shuffle_buffer_size: int = 100000) -> tf.data.Dataset:
  """The lines of the files matching `glob`, shuffled (one pass).

  Example:
    >>> ds = simple_text_line_dataset("corpus/*.txt", shuffle_buffer_size=1000)
  """
  return tf.data.TextLineDataset(_glob(glob, "simple_text_line_dataset")).shuffle(
      shuffle_buffer_size)


@gin.configurable(module=_GIN_MODULE)
def packed_parallel_tsv_dataset(dataset: tf.data.Dataset = gin.REQUIRED,
                                dataset_split: str = gin.REQUIRED,
                                batch_size: Optional[int] = None,
                                sequence_length: Lengths = gin.REQUIRED,
                                vocabulary=gin.REQUIRED,
                                append_eos: bool = True, eos_id: int = 1,
                                max_encoded_len: int = 0) -> tf.data.Dataset:
  """Packed {"inputs", "targets"} examples from "input<TAB>target" lines.

  Args:
    dataset: a dataset of lines (e.g. simple_text_line_dataset).
    dataset_split: unused (the original's argument).
    batch_size: unused (the original's argument).
    sequence_length: one int or {"inputs": n, "targets": m}.
    vocabulary: a Vocabulary, or an (inputs, targets) pair of them.
    append_eos: append `eos_id` to both features.
    eos_id: the EOS id.
    max_encoded_len: if > 0, drop examples with a feature longer than this.

  Returns:
    Packed rows (see pack_dataset).

  Example:
    >>> lines = tf.data.Dataset.from_tensor_slices(["ab\\tc", "d\\tef"])
    >>> ds = packed_parallel_tsv_dataset(lines, "train", None, 8, ByteVocabulary())
  """
  del batch_size, dataset_split
  inputs_vocab, targets_vocab = (vocabulary if isinstance(vocabulary, tuple)
                                 else (vocabulary, vocabulary))

  def parse(line):
    fields = tf.io.decode_csv(line, record_defaults=["", ""], field_delim="\t",
                              use_quote_delim=False)
    return {"inputs": fields[0], "targets": fields[1]}

  def encode(features):
    out = {}
    for k, vocab in (("inputs", inputs_vocab), ("targets", targets_vocab)):
      ids = tf.cast(vocab.encode_tf(features[k]), tf.int64)
      if append_eos:
        ids = tf.concat([ids, tf.constant([eos_id], tf.int64)], 0)
      out[k] = ids
    return out

  dataset = dataset.map(plain_tf(parse)).map(plain_tf(encode))
  if max_encoded_len:
    dataset = dataset.filter(plain_tf(lambda x: tf.reduce_max(
        tf.stack([tf.size(v) for v in x.values()])) <= max_encoded_len))
  return pack_or_pad(dataset, sequence_length)


def pretokenized_tfrecord_dataset(filenames: Sequence[str], text2self: bool,
                                  eos_included: bool, repeat: bool,
                                  batch_size: Optional[int], sequence_length: Lengths,
                                  vocab_shift: int = 0) -> tf.data.Dataset:
  """Packed rows from TFRecord files of tf.train.Example protos with int64
  "targets" (and "inputs" unless text2self) features, as Tensor2Tensor wrote.

  Args:
    filenames: the TFRecord files.
    text2self: read only "targets" (language modelling).
    eos_included: the ids already end in EOS; else 1 is appended.
    repeat: repeat forever.
    batch_size: unused (the original's argument).
    sequence_length: one int or {key: length}.
    vocab_shift: added to every id read.

  Example:
    >>> ds = pretokenized_tfrecord_dataset(["train-00000"], True, True, False, None, 64)
  """
  del batch_size
  dataset = tf.data.TFRecordDataset(list(filenames), buffer_size=64 * 1024 * 1024)
  if repeat:
    dataset = dataset.repeat()
  keys = ["targets"] if text2self else ["inputs", "targets"]
  spec = {k: tf.io.VarLenFeature(tf.int64) for k in keys}

  def decode(serialized):
    parsed = tf.io.parse_single_example(serialized, spec)
    out = {}
    for k in keys:
      ids = parsed[k].values + vocab_shift
      if not eos_included:
        ids = tf.concat([ids, tf.constant([1], tf.int64)], 0)
      out[k] = ids
    return out

  return pack_or_pad(dataset.map(plain_tf(decode)), sequence_length)


@gin.configurable(module=_GIN_MODULE)
def pretokenized_t2t_dataset(dataset_name: str = gin.REQUIRED, text2self: bool = False,
                             data_dir: str = gin.REQUIRED, dataset_split: str = "train",
                             batch_size: Optional[int] = None,
                             sequence_length: Lengths = gin.REQUIRED,
                             vocabulary=None, eos_included: bool = True,
                             vocab_shift: int = 0) -> tf.data.Dataset:
  """Packed rows from a Tensor2Tensor data directory: the files
  `<data_dir>/<dataset_name>-<dataset_split>-*` (see
  pretokenized_tfrecord_dataset); the train split repeats and is shuffled.

  Example:
    >>> ds = pretokenized_t2t_dataset("translate_ende", False, "/data/t2t", "dev",
    ...                               sequence_length=64)
  """
  del vocabulary
  pattern = os.path.join(data_dir, f"{dataset_name}-{dataset_split}-*")
  filenames = sorted(tf.io.gfile.glob(pattern))
  if not filenames:
    raise ValueError(f"pretokenized_t2t_dataset: no file matches {pattern!r}; check "
                     f"data_dir, dataset_name and dataset_split.")
  dataset = pretokenized_tfrecord_dataset(
      filenames=filenames, text2self=text2self, eos_included=eos_included,
      repeat=dataset_split == "train", batch_size=batch_size,
      sequence_length=sequence_length, vocab_shift=vocab_shift)
  if dataset_split == "train":
    dataset = dataset.shuffle(1000)
  return dataset


def _tfds(what: str):
  return _environment.require_optional(
      "tensorflow_datasets", what, "tfds",
      alternative="without it, read text files (simple_text_line_dataset, "
                  "packed_parallel_tsv_dataset or dataset_fn with train_files=...)")


@gin.configurable(module=_GIN_MODULE)
def pretokenized_tfds_dataset(dataset_name: str = gin.REQUIRED,
                              text2self: bool = gin.REQUIRED,
                              tfds_data_dir: str = gin.REQUIRED,
                              dataset_split: str = gin.REQUIRED,
                              batch_size: Optional[int] = None,
                              sequence_length: Lengths = gin.REQUIRED,
                              vocabulary=None) -> tf.data.Dataset:
  """Packed rows of a tokenized TensorFlow Datasets dataset (as_supervised):
  ids are shifted up by one to free EOS (1), which is appended. Needs
  tensorflow-datasets.

  Example:
    >>> ds = pretokenized_tfds_dataset("lm1b/subwords8k", True, None, "train",
    ...                                sequence_length=256)
  """
  del batch_size, vocabulary
  tfds = _tfds("pretokenized_tfds_dataset")
  dataset = tfds.load(dataset_name, split=dataset_split, as_supervised=True,
                      data_dir=tfds_data_dir, shuffle_files=dataset_split == "train")
  if dataset_split == "train":
    dataset = dataset.repeat().shuffle(1000)

  def shifted(t):
    t = tf.cast(t, tf.int64)
    return tf.concat([t + 1, tf.constant([1], tf.int64)], 0)

  def features(inputs, targets):
    if text2self:
      return {"targets": shifted(targets)}
    return {"inputs": shifted(inputs), "targets": shifted(targets)}

  return pack_or_pad(dataset.map(plain_tf(features)), sequence_length)


@gin.configurable(module=_GIN_MODULE)
def untokenized_tfds_dataset(dataset_name: str = gin.REQUIRED,
                             text2self: bool = gin.REQUIRED,
                             tfds_data_dir: str = gin.REQUIRED,
                             dataset_split: str = gin.REQUIRED,
                             batch_size: Optional[int] = None,
                             sequence_length: Lengths = gin.REQUIRED,
                             vocabulary=gin.REQUIRED,
                             pack: bool = gin.REQUIRED) -> tf.data.Dataset:
  """Rows of a text TensorFlow Datasets dataset, encoded with `vocabulary`
  (EOS appended) and packed or padded. Needs tensorflow-datasets.

  Example:
    >>> ds = untokenized_tfds_dataset("lm1b", True, None, "train", None, 256,
    ...                               ByteVocabulary(), True)
  """
  del batch_size
  tfds = _tfds("untokenized_tfds_dataset")
  dataset = tfds.load(dataset_name, split=dataset_split, as_supervised=not text2self,
                      data_dir=tfds_data_dir)
  if dataset_split == "train":
    dataset = dataset.repeat().shuffle(1000)
  if not text2self:
    dataset = supervised_to_dict(dataset, text2self)
  dataset = encode_all_features(dataset, vocabulary)
  return pack_or_pad(dataset, sequence_length, pack)


def pad_dataset_with_zeroed_out_examples(ds: tf.data.Dataset) -> tf.data.Dataset:
  """`ds`, then its examples with every feature zeroed, forever (so that every
  host of an evaluation gets as many batches).

  Example:
    >>> ds = pad_dataset_with_zeroed_out_examples(ds).take(100)
  """
  return ds.concatenate(ds.map(plain_tf(
      lambda x: tf.nest.map_structure(tf.zeros_like, x))).repeat())
