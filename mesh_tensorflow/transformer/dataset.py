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

import collections
import os
from typing import (Callable, Collection, Dict, List, Mapping, Optional, Sequence, Tuple,
                    Union)

import gin
import tensorflow as tf

from mesh_tensorflow import _environment
from mesh_tensorflow.core.autograph_exempt import plain_tf
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
  ds = _tfds_load(name, split, data_dir)
  if text_key not in ds.element_spec:
    raise ValueError(f"tfds_text: {name!r} has no feature {text_key!r}; its features are "
                     f"{sorted(ds.element_spec)} (set dataset_fn.tfds_text_key).")
  return ds.map(plain_tf(lambda ex: ex[text_key]))


def tfds_pairs(name: str, split: str = "train", inputs_key: str = "inputs",
               targets_key: str = "targets",
               data_dir: Optional[str] = None) -> tf.data.Dataset:
  """{"inputs", "targets"} strings from two features of a TensorFlow Datasets
  dataset (needs `pip install tensorflow-datasets`).

  Example:
    >>> ds = tfds_pairs("my_translation", "train", "en", "de", data_dir="/data/tfds")
  """
  ds = _tfds_load(name, split, data_dir)
  for key in (inputs_key, targets_key):
    if key not in ds.element_spec:
      raise ValueError(f"tfds_pairs: {name!r} has no feature {key!r}; its features are "
                       f"{sorted(ds.element_spec)} (set dataset_fn.tfds_inputs_key / "
                       "tfds_targets_key).")
  return ds.map(plain_tf(lambda ex: {"inputs": ex[inputs_key], "targets": ex[targets_key]}))


def seqio_dataset(name: str, split: str, sequence_length: Mapping[str, int],
                  vocabulary: Optional[vocabulary_lib.Vocabulary] = None,
                  modules: Sequence[str] = ()) -> tf.data.Dataset:
  """The tokenized features `sequence_length` names of a seqio task or
  mixture (one pass, unshuffled, trimmed by seqio), as int32 ids.

  Args:
    name: a registered seqio task or mixture name.
    split: its split ("train", "validation", ...).
    sequence_length: {"inputs": n, "targets": m} (or only "targets").
    vocabulary: the run's vocabulary; the task's features must have its size.
    modules: modules to import first (they register the tasks).

  Example:
    >>> ds = seqio_dataset("my_task", "train", {"inputs": 512, "targets": 114},
    ...                    modules=["my_project.tasks"])
  """
  try:
    import seqio  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError(f"seqio task {name!r}: needs seqio (`pip install seqio`).") from e
  import importlib  # pylint: disable=g-import-not-at-top
  for module in modules:
    importlib.import_module(module)
  try:
    task = seqio.get_mixture_or_task(name)
  except (KeyError, ValueError) as e:
    raise ValueError(
        f"seqio task {name!r} is not registered; name the module that registers it "
        "(dataset_fn.seqio_modules = ['my_project.tasks']).") from e
  for key in sequence_length:
    if key not in task.output_features:
      raise ValueError(f"seqio task {name!r} has no feature {key!r}; its features are "
                       f"{sorted(task.output_features)}.")
    size = task.output_features[key].vocabulary.vocab_size
    if vocabulary is not None and size != vocabulary.vocab_size:
      raise ValueError(
          f"seqio task {name!r}: feature {key!r} has a vocabulary of {size} ids, the run's "
          f"({type(vocabulary).__name__}) has {vocabulary.vocab_size}; set utils.run.vocabulary "
          "to the task's vocabulary.")
  ds = task.get_dataset(sequence_length=dict(sequence_length), split=split, shuffle=False,
                        num_epochs=1, use_cached=False)
  keys = list(sequence_length)
  return ds.map(plain_tf(lambda ex: {k: tf.cast(ex[k], tf.int32) for k in keys}))


def _tfds_load(name: str, split: str, data_dir: Optional[str]) -> tf.data.Dataset:
  tfds = _environment.require_optional(
      "tensorflow_datasets", f"dataset {name!r}", "tfds",
      alternative="without it, train on text or TSV files (dataset_fn.train_files=...)")
  return tfds.load(name, split=split, data_dir=data_dir, shuffle_files=False)


def _expand(files: Union[str, Sequence[str]]) -> List[str]:
  if isinstance(files, str):
    files = [files]
  out = []
  for pattern in files:
    matches = sorted(tf.io.gfile.glob(pattern))
    if not matches:
      raise ValueError(f"No file matches {pattern!r}.")
    out.extend(matches)
  if not out:
    raise ValueError("No files given: name at least one file (dataset_fn.train_files, "
                     "dataset_fn.eval_files).")
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


# ------------------------------------------- the original's dataset functions
# Same names, arguments and output features as the original Mesh TensorFlow's
# transformer/dataset.py, on tf.data; padding is id 0 and EOS is id 1.

EvalDataset = collections.namedtuple(
    "EvalDataset", ["name", "dataset_fn", "postprocess_fn", "metric_fns"])
EvalDataset.__doc__ = """An evaluation task: its name, a function returning its
tf.data.Dataset, a function turning decodes into strings to score, and a list of
metric_fn(targets, predictions) -> {name: value}.

Example:
  >>> task = EvalDataset("copy", lambda: ds, lambda s: s, [])
"""


def _keys_of(dataset: tf.data.Dataset, what: str) -> List[str]:
  spec = dataset.element_spec
  if not isinstance(spec, dict):
    raise ValueError(f"{what}: the dataset must yield a dict of features, got elements "
                     f"{spec}; map them to {{'targets': ...}} first.")
  return list(spec)


def _length_of(length: Union[int, Mapping[str, int]], key: str, what: str) -> int:
  if isinstance(length, int):
    return length
  if key not in length:
    raise ValueError(f"{what}: no length for feature {key!r} in {dict(length)}; give one "
                     f"int or a length for every feature.")
  return int(length[key])


def _pack_group(batch: Dict[str, tf.Tensor], keys: List[str],
                lengths: Dict[str, int]) -> Dict[str, tf.Tensor]:
  """Packs one padded batch of examples into rows, next fit in order."""
  # Example i's tokens of key k are batch[k][i, :n] with n its count of
  # non-padding ids (padding follows the tokens).
  counts = tf.stack([tf.math.count_nonzero(batch[k], axis=1, dtype=tf.int32) for k in keys],
                    axis=1)  # [examples, keys]
  limits = tf.constant([lengths[k] for k in keys], tf.int32)
  zeros = tf.zeros([len(keys)], tf.int32)

  def place(state, n):
    row, fill, seg = state[0], state[1], state[2]
    fits = tf.reduce_all(fill + n <= limits)
    row = tf.where(fits, row, row + 1)
    fill = tf.where(fits, fill, zeros)
    seg = tf.where(fits, seg, zeros)
    seg = seg + tf.cast(n > 0, tf.int32)
    return row, fill + n, seg, fill

  rows, _, segs, offsets = tf.scan(
      place, counts, initializer=(tf.constant(0, tf.int32), zeros, zeros, zeros))
  num_rows = tf.reduce_max(rows) + 1
  out = {}
  for i, k in enumerate(keys):
    tokens = tf.cast(batch[k], tf.int32)
    width = tf.shape(tokens)[1]
    position = tf.broadcast_to(tf.range(width)[tf.newaxis, :], tf.shape(tokens))
    mask = position < counts[:, i:i + 1]
    row_of = tf.broadcast_to(rows[:, tf.newaxis], tf.shape(tokens))
    column = offsets[:, i:i + 1] + position
    index = tf.boolean_mask(tf.stack([row_of, column], axis=-1), mask)
    shape = tf.stack([num_rows, lengths[k]])
    seg = tf.broadcast_to(segs[:, i:i + 1], tf.shape(tokens))
    out[k] = tf.scatter_nd(index, tf.boolean_mask(tokens, mask), shape)
    out[k + "_segmentation"] = tf.scatter_nd(index, tf.boolean_mask(seg, mask), shape)
    out[k + "_position"] = tf.scatter_nd(index, tf.boolean_mask(position, mask), shape)
  return out


@gin.configurable
def pack_dataset(dataset: tf.data.Dataset, length: Lengths,
                 keys: Optional[Collection[str]] = None,
                 use_custom_ops: bool = False) -> tf.data.Dataset:
  """Packs several examples into each fixed-length row, as the original did.

  Every feature in `keys` is cut to its length and its padding (id 0) dropped;
  consecutive examples then share a row while all their features fit ("next
  fit"), in groups of max(length) examples (a group's last row is emitted
  before the next group starts). Each feature `k` comes with
  `k_segmentation` (1, 2, ... for the examples of the row that have tokens of
  `k`, 0 for padding) and `k_position` (0, 1, ... inside each example);
  features not in `keys` are dropped. All outputs are int32 [length].

  Args:
    dataset: a dataset of {key: integer vector}.
    length: the row length, one int for all keys or {key: length}.
    keys: the features to pack; None packs every feature.
    use_custom_ops: accepted and ignored (packing is plain TensorFlow here).

  Returns:
    A dataset of {k, k_segmentation, k_position} for each k in keys.

  Example:
    >>> # {"inputs": [7, 8, 5, 1], "targets": [3, 9, 1]} and
    >>> # {"inputs": [8, 4, 9, 3, 1], "targets": [4, 1]} with lengths 10 and 7:
    >>> # inputs [7, 8, 5, 1, 8, 4, 9, 3, 1, 0],
    >>> # inputs_segmentation [1, 1, 1, 1, 2, 2, 2, 2, 2, 0], ...
    >>> ds = pack_dataset(ds, length={"inputs": 10, "targets": 7})
  """
  del use_custom_ops
  available = _keys_of(dataset, "pack_dataset")
  keys = available if keys is None else list(keys)
  spec = dataset.element_spec
  for k in keys:
    if k not in spec:
      raise ValueError(f"pack_dataset: key {k!r} is not a feature of the dataset; it has "
                       f"{available}.")
    if not spec[k].shape.is_compatible_with([None]):
      raise ValueError(f"pack_dataset: feature {k!r} has shape {spec[k].shape}; packed "
                       f"features must be vectors.")
    if not (spec[k].dtype.is_integer):
      raise ValueError(f"pack_dataset: feature {k!r} is {spec[k].dtype.name}; pack token "
                       f"ids (encode strings first, e.g. encode_all_features).")
  lengths = {k: _length_of(length, k, "pack_dataset") for k in keys}
  for k, n in lengths.items():
    if n < 1:
      raise ValueError(f"pack_dataset: length of {k!r} must be >= 1, got {n}.")
  ds = dataset.map(plain_tf(lambda x: {k: x[k][:lengths[k]] for k in keys}))
  ds = ds.padded_batch(max(lengths.values()), padded_shapes={k: [None] for k in keys})
  ds = ds.map(plain_tf(lambda batch: _pack_group(batch, keys, lengths)))
  ds = ds.unbatch()
  # A row without any token (a group of empty examples) carries nothing.
  ds = ds.filter(plain_tf(lambda row: tf.reduce_any([tf.reduce_any(row[k] != 0)
                                                      for k in keys])))

  widths = {k + suffix: n for k, n in lengths.items()
            for suffix in ("", "_segmentation", "_position")}

  def fix_shapes(row):
    return {name: tf.ensure_shape(v, [widths[name]]) for name, v in row.items()}

  return ds.map(plain_tf(fix_shapes))


def trim_and_pad_dataset(dataset: tf.data.Dataset, length: Lengths,
                         feature_keys: Optional[Collection[str]] = None) -> tf.data.Dataset:
  """Cuts or zero-pads the first axis of features to `length`.

  Args:
    dataset: a dataset of {key: tensor of rank >= 1}.
    length: one int for all features or {key: length}.
    feature_keys: the features to trim and pad; others pass unchanged.
      Defaults to all features.

  Returns:
    The dataset with those features of first dimension `length`.

  Example:
    >>> # [5, 6, 1] with length 5 becomes [5, 6, 1, 0, 0]; with 2, [5, 6].
    >>> ds = trim_and_pad_dataset(ds, {"inputs": 8, "targets": 4})
  """
  spec = _keys_of(dataset, "trim_and_pad_dataset")
  chosen = set(feature_keys) if feature_keys else set(spec)

  def one(k, t):
    if k not in chosen:
      return t
    if t.shape.rank == 0:
      raise ValueError(f"trim_and_pad_dataset: feature {k!r} is a scalar; only features "
                       f"with a first axis can be trimmed and padded.")
    n = _length_of(length, k, "trim_and_pad_dataset")
    t = t[:n]
    t = tf.pad(t, [[0, n - tf.shape(t)[0]]] + [[0, 0]] * (t.shape.rank - 1))
    return tf.ensure_shape(t, [n] + t.shape.as_list()[1:])

  return dataset.map(plain_tf(lambda x: {k: one(k, t) for k, t in x.items()}))


def ensure_dataset_eos(dataset: tf.data.Dataset,
                       feature_keys: Optional[Collection[str]] = None) -> tf.data.Dataset:
  """Makes features end in EOS (1) or padding (0): a last id above 1 becomes 1.

  Args:
    dataset: a dataset of {key: integer vector}.
    feature_keys: the features to fix; defaults to all.

  Example:
    >>> # [4, 5, 6] becomes [4, 5, 1]; [4, 5, 0] and [4, 5, 1] stay.
    >>> ds = ensure_dataset_eos(ds, ["targets"])
  """
  chosen = set(feature_keys) if feature_keys else set(_keys_of(dataset, "ensure_dataset_eos"))

  def one(k, v):
    if k not in chosen:
      return v
    return tf.concat([v[:-1], tf.clip_by_value(v[-1:], 0, 1)], axis=0)

  return dataset.map(plain_tf(lambda x: {k: one(k, v) for k, v in x.items()}))


@gin.configurable
def pack_or_pad(dataset: tf.data.Dataset, length: Lengths, pack: bool = True,
                feature_keys: Optional[Collection[str]] = None,
                ensure_eos: Union[bool, Collection[str]] = False) -> tf.data.Dataset:
  """Packs examples into rows of `length` (pack=True) or zero-pads each one.

  Args:
    dataset: a dataset of {key: integer vector}.
    length: one int for all features or {key: length}.
    pack: pack (pack_dataset) or pad one example per row.
    feature_keys: the features to pack or pad; packing drops the others,
      padding passes them through. Defaults to all features.
    ensure_eos: True (all of feature_keys), False, or the features whose last
      id is set to EOS (1) unless it is padding (0) (see ensure_dataset_eos).

  Returns:
    A dataset whose chosen features have shape [length] (with
    `_segmentation` and `_position` when packed).

  Example:
    >>> ds = pack_or_pad(ds, {"inputs": 64, "targets": 32}, pack=False)
  """
  feature_keys = set(feature_keys or _keys_of(dataset, "pack_or_pad"))
  if pack:
    dataset = pack_dataset(dataset, length=length, keys=sorted(feature_keys))
  dataset = trim_and_pad_dataset(dataset, length=length, feature_keys=feature_keys)
  if ensure_eos:
    eos_keys = feature_keys if isinstance(ensure_eos, bool) else set(ensure_eos)
    dataset = ensure_dataset_eos(dataset, eos_keys)
  return dataset


def encode_dataset(dataset: tf.data.Dataset,
                   vocabulary: vocabulary_lib.Vocabulary) -> tf.data.Dataset:
  """Encodes every (string) feature to token ids with `vocabulary.encode_tf`
  (no EOS is added; see encode_all_features for that).

  Example:
    >>> ds = encode_dataset(ds, ByteVocabulary())   # {"targets": "hi"} -> [107, 108]
  """
  _keys_of(dataset, "encode_dataset")
  return dataset.map(plain_tf(lambda x: {k: vocabulary.encode_tf(v) for k, v in x.items()}))


def encode_all_features(dataset: tf.data.Dataset,
                        vocabulary: vocabulary_lib.Vocabulary) -> tf.data.Dataset:
  """Encodes the string features and appends EOS (1) as int64 ids; features
  that are not strings are dropped.

  Example:
    >>> ds = encode_all_features(ds, ByteVocabulary())   # "hi" -> [107, 108, 1]
  """
  _keys_of(dataset, "encode_all_features")

  def encode(features):
    out = {}
    for k, v in features.items():
      if v.dtype == tf.string:
        ids = tf.cast(vocabulary.encode_tf(v), tf.int64)
        out[k] = tf.concat([ids, tf.constant([1], tf.int64)], 0)
    return out

  return dataset.map(plain_tf(encode))


def supervised_to_dict(dataset: tf.data.Dataset, text2self: bool) -> tf.data.Dataset:
  """(inputs, targets) pairs as {"inputs", "targets"}, or {"targets"} with
  text2self.

  Example:
    >>> ds = supervised_to_dict(tf.data.Dataset.from_tensor_slices((["a"], ["b"])), False)
  """
  if text2self:
    return dataset.map(plain_tf(lambda inputs, targets: {"targets": targets}))
  return dataset.map(plain_tf(lambda inputs, targets: {"inputs": inputs, "targets": targets}))


def _glob(pattern: str, what: str) -> List[str]:
  names = sorted(tf.io.gfile.glob(pattern))
  if not names:
    raise ValueError(f"{what}: no file matches {pattern!r}.")
  return names


@gin.configurable
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


@gin.configurable
def make_text_line_dataset(glob: str = gin.REQUIRED) -> tf.data.Dataset:
  """The lines of the files matching `glob`, repeated and shuffled.

  Example:
    >>> ds = make_text_line_dataset("corpus/*.txt")
  """
  return sample_from_text_line_datasets([(glob, 1.0)])


@gin.configurable
def simple_text_line_dataset(glob: str = gin.REQUIRED,
                             shuffle_buffer_size: int = 100000) -> tf.data.Dataset:
  """The lines of the files matching `glob`, shuffled (one pass).

  Example:
    >>> ds = simple_text_line_dataset("corpus/*.txt", shuffle_buffer_size=1000)
  """
  return tf.data.TextLineDataset(_glob(glob, "simple_text_line_dataset")).shuffle(
      shuffle_buffer_size)


@gin.configurable
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


@gin.configurable
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


@gin.configurable
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


@gin.configurable
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
