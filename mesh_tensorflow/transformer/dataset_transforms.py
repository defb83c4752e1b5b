"""Transforms of feature-dict datasets under the original Mesh TensorFlow's
names and arguments: packing (`pack_dataset`, `pack_or_pad`), trimming and
padding (`trim_and_pad_dataset`), EOS (`ensure_dataset_eos`), encoding text
features with a vocabulary (`encode_dataset`, `encode_all_features`) and
`supervised_to_dict`; plus `EvalDataset`. Padding is id 0 and EOS is id 1.

    >>> ds = pack_or_pad(ds, {"inputs": 64, "targets": 64}, pack=True)
"""

from __future__ import annotations

import collections
from typing import Collection, Dict, List, Mapping, Optional, Union

import gin
import tensorflow as tf

from mesh_tensorflow.core.autograph_exempt import plain_tf
from mesh_tensorflow.transformer import vocabulary as vocabulary_lib
from mesh_tensorflow.transformer.packing import Lengths

# gin names these `dataset.<name>`, the module users import them from.
_GIN_MODULE = "mesh_tensorflow.transformer.dataset"


# ------------------------------------------- dataset functions
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


@gin.configurable(module=_GIN_MODULE)
def pack_dataset(dataset: tf.data.Dataset, length: Lengths,
                 keys: Optional[Collection[str]] = None,
                 use_custom_ops: bool = False) -> tf.data.Dataset:
  """Packs several examples into each fixed-length row.

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


@gin.configurable(module=_GIN_MODULE)
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
