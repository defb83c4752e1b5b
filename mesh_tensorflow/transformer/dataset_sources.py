"""Where transformer data comes from: text files (`text_dataset`),
tab-separated pairs (`tsv_dataset`), TensorFlow Datasets (`tfds_text`,
`tfds_pairs`) and seqio tasks (`seqio_dataset`), each as a tf.data.Dataset
of strings or features.

    >>> ds = text_dataset(["a.txt"], unit="line")    # one string per line
    >>> pairs = tsv_dataset(["pairs.tsv"])           # {"inputs", "targets"} strings
"""

from __future__ import annotations

from typing import List, Mapping, Optional, Sequence, Union

import tensorflow as tf

from mesh_tensorflow import _environment
from mesh_tensorflow.core.autograph_exempt import plain_tf
from mesh_tensorflow.transformer import vocabulary as vocabulary_lib


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
