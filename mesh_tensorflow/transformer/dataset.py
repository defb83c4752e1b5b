"""tf.data pipelines for transformers: text files -> packed batches of ids.

A language-model pipeline reads text, tokenizes it, splits long examples into
pieces of at most `sequence_length` tokens, shuffles with a seed, packs several
short examples into each fixed-length row and batches the rows:

    >>> vocab = vocabulary.ByteVocabulary()
    >>> ds = lm_dataset(["a.txt"], vocab, sequence_length=128, batch_size=8, seed=1)
    >>> sorted(ds.element_spec)
    ['targets', 'targets_position', 'targets_segmentation']

Packed rows carry, per token, the number of the example it belongs to
(`<key>_segmentation`: 1, 2, ... within the row, 0 for padding) and its
position inside that example (`<key>_position`), so a model keeps the examples
apart (attention masks, position embeddings), as in the original Mesh
TensorFlow (see packing.py). An encoder-decoder pipeline reads tab-separated "input<TAB>target"
lines and packs `inputs` and `targets` together (`pairs_dataset`).

Every pipeline is deterministic for a given seed: the same files give the same
batches in the same order, run after run.

The default corpus needs no download: the Python standard library's own
source files (code, comments and docstrings), a fixed sorted list of them, with
every tenth file held out for evaluation (corpus.py). TensorFlow Datasets
can be used instead when it is installed and its data is reachable
(`tfds_text`).
"""

from __future__ import annotations

from typing import List, Mapping, Optional, Sequence, Tuple, Union

import gin
import tensorflow as tf

from mesh_tensorflow.autograph_exempt import plain_tf
from mesh_tensorflow.transformer import vocabulary as vocabulary_lib
from mesh_tensorflow.transformer.corpus import (  # noqa: F401 (re-exported)
    DEFAULT_CORPUS_BYTES, HOLDOUT_EVERY, TRAIN, VALIDATION, stdlib_docstring_pairs,
    stdlib_files)
from mesh_tensorflow.transformer.packing import (  # noqa: F401 (re-exported)
    Lengths, as_lengths, pack, pad_unpacked)



# ------------------------------------------------------------- text sources
def text_dataset(files: Sequence[str], unit: str = "line") -> tf.data.Dataset:
  """The examples of plain text files as a dataset of string scalars.

  Args:
    files: paths (globs are expanded), read in the order given.
    unit: what one example is: "line" (every non-empty line), "paragraph"
      (blocks separated by blank lines) or "file" (a whole file).

  Example:
    >>> ds = text_dataset(["notes.txt"], unit="paragraph")
  """
  files = _expand(files)
  if unit == "line":
    ds = tf.data.TextLineDataset(files)
  elif unit == "file":
    ds = tf.data.Dataset.from_tensor_slices(files).map(tf.io.read_file)
  elif unit == "paragraph":
    def paragraphs(text):
      text = tf.strings.regex_replace(text, r"\r\n", "\n")
      return tf.data.Dataset.from_tensor_slices(
          tf.strings.split(tf.strings.regex_replace(text, r"\n[ \t]*\n+", "\x00"), "\x00"))
    ds = tf.data.Dataset.from_tensor_slices(files).map(tf.io.read_file)
    ds = ds.flat_map(plain_tf(paragraphs))
  else:
    raise ValueError(f"text_dataset: unit must be 'line', 'paragraph' or 'file', got {unit!r}.")
  return ds.filter(plain_tf(lambda s: tf.strings.length(tf.strings.strip(s)) > 0))


def tsv_dataset(files: Sequence[str]) -> tf.data.Dataset:
  """{"inputs", "targets"} string pairs from "input<TAB>target" lines.

  Lines without a tab are skipped; a target may contain further tabs.

  Example:
    >>> ds = tsv_dataset(["pairs.tsv"])
  """
  ds = tf.data.TextLineDataset(_expand(files))
  ds = ds.filter(plain_tf(lambda line: tf.strings.regex_full_match(line, "[^\t]*\t.*")))

  def split(line):
    parts = tf.strings.split(line, "\t", maxsplit=1)
    return {"inputs": parts[0], "targets": parts[1]}

  return ds.map(plain_tf(split))


def tfds_text(name: str, split: str = "train", text_key: str = "text",
              data_dir: Optional[str] = None) -> tf.data.Dataset:
  """String examples of a TensorFlow Datasets dataset (needs
  `pip install tensorflow-datasets` and its data, downloaded or in data_dir).

  Example:
    >>> ds = tfds_text("lm1b", "train", "text")
  """
  try:
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError(
        "tfds_text needs tensorflow-datasets (`pip install tensorflow-datasets`); without "
        "it, train on text files (dataset_fn=@dataset.lm_dataset_fn with train_files=...)."
    ) from e
  ds = tfds.load(name, split=split, data_dir=data_dir, shuffle_files=False)
  return ds.map(plain_tf(lambda ex: ex[text_key]))


def _expand(files: Union[str, Sequence[str]]) -> List[str]:
  if isinstance(files, str):
    files = [files]
  out = []
  for pattern in files:
    matches = sorted(tf.io.gfile.glob(pattern))
    if not matches:
      raise ValueError(f"No file matches {pattern!r}.")
    out.extend(matches)
  return out


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


def pack_dataset(dataset: tf.data.Dataset, length: Lengths,
                 keys: Optional[Sequence[str]] = None,
                 use_custom_ops: bool = False) -> tf.data.Dataset:
  """The original Mesh TensorFlow's packing call: cuts every feature in `keys`
  (default: all) to `length` tokens, then packs (see packing.pack).

  Args:
    dataset: a dataset of {key: integer vector}.
    length: the row length, one for all keys or {key: length}.
    keys: the features to pack; None packs every feature of the dataset.
    use_custom_ops: accepted and ignored (packing is plain TensorFlow here).

  Example:
    >>> ds = pack_dataset(ds, length={"inputs": 64, "targets": 32})
  """
  del use_custom_ops
  keys = list(dataset.element_spec) if keys is None else list(keys)
  lengths = as_lengths(length, keys)
  return pack(trim(dataset, lengths, keep_eos=False), lengths, keys)


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


@gin.configurable
def dataset_fn(split: str, vocabulary: vocabulary_lib.Vocabulary,
               sequence_length: Mapping[str, int], batch_size: int, seed: Optional[int],
               repeat: bool, model_type: str = "lm",
               train_files: Optional[Sequence[str]] = None,
               eval_files: Optional[Sequence[str]] = None, unit: str = "file",
               packed: bool = True, shuffle_buffer: int = 10000,
               corpus_bytes: int = DEFAULT_CORPUS_BYTES,
               tfds_name: Optional[str] = None, tfds_text_key: str = "text",
               tfds_data_dir: Optional[str] = None) -> tf.data.Dataset:
  """The data `utils.run` trains and evaluates on (gin-configurable).

  With no files given, a language model ("lm") reads the stdlib corpus and
  an encoder-decoder ("bitransformer") learns stdlib signatures -> docstring
  summaries. Text files (`unit` per example) or TSV files ("input<TAB>target")
  replace them; `tfds_name` reads a TensorFlow Datasets text dataset instead
  (language models only; needs tensorflow-datasets).

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
    tfds_name, tfds_text_key, tfds_data_dir: a TFDS text dataset instead.

  Example (gin):
    dataset_fn.train_files = ["/data/train.txt"]
    dataset_fn.eval_files = ["/data/valid.txt"]
    dataset_fn.unit = "line"
  """
  files = train_files if split == TRAIN else eval_files
  if model_type == "lm":
    length = int(sequence_length["targets"])
    if tfds_name:
      tfds_split = "train" if split == TRAIN else "validation"
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
    if files is None:
      files = pairs_from_list(stdlib_docstring_pairs(split, corpus_bytes))
    lengths = {"inputs": int(sequence_length["inputs"]),
               "targets": int(sequence_length["targets"])}
    return pairs_dataset(files, vocabulary, lengths, batch_size, seed, repeat, packed,
                         shuffle_buffer)
  raise ValueError(f"dataset_fn: model_type must be 'lm' or 'bitransformer', got "
                   f"{model_type!r}.")
