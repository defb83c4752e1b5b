"""Packing token examples into fixed-length rows for tf.data.

Several short examples share one row; each token carries the number of its
example in the row (`<key>_segmentation`: 1, 2, ..., 0 for padding) and its
position inside that example (`<key>_position`), as the original Mesh
TensorFlow's "inputs_segmentation"/"inputs_position" features, so a model
keeps the examples apart.

    >>> # [5, 6, 1] and [7, 1] packed to length 6:
    >>> # targets [5, 6, 1, 7, 1, 0], segmentation [1, 1, 1, 2, 2, 0],
    >>> # position [0, 1, 2, 0, 1, 0]
    >>> rows = pack(examples, 6)
"""

from __future__ import annotations

from typing import Dict, Mapping, Sequence, Union

import tensorflow as tf

from mesh_tensorflow.core.autograph_exempt import plain_tf

Lengths = Union[int, Mapping[str, int]]


def as_lengths(lengths: Lengths, keys: Sequence[str]) -> Dict[str, int]:
  """{key: length} from one length for all keys or a mapping.

  Example:
    >>> as_lengths(64, ["inputs", "targets"])
    {'inputs': 64, 'targets': 64}
  """
  if isinstance(lengths, int):
    return {k: lengths for k in keys}
  missing = [k for k in keys if k not in lengths]
  if missing:
    raise ValueError(f"No sequence length for {missing}; got {dict(lengths)}.")
  return {k: int(lengths[k]) for k in keys}


def pack(ds: tf.data.Dataset, lengths: Lengths,
         keys: Sequence[str] = ("targets",)) -> tf.data.Dataset:
  """Packs consecutive examples into fixed-length rows ("next fit").

  Examples are appended to the current row while every feature in `keys`
  still fits; otherwise the row is emitted and a new one starts. Each feature
  `k` of an output row comes with `k_segmentation` (1, 2, ... for the examples
  of the row, 0 for padding) and `k_position` (0, 1, ... inside each
  example). Examples must already fit (see `split_tokens` and `trim`); empty
  ones are dropped.

  Args:
    ds: a dataset of {key: int32 vector}.
    lengths: the row length, one for all keys or {key: length}.
    keys: the features to pack (others are dropped).

  Returns:
    A dataset of {k, k_segmentation, k_position: int32 [length]}.

  Example:
    >>> # [5, 6, 1] and [7, 1] packed to length 6:
    >>> # targets [5, 6, 1, 7, 1, 0], targets_segmentation [1, 1, 1, 2, 2, 0],
    >>> # targets_position [0, 1, 2, 0, 1, 0]
    >>> ds = pack(ds, 6)
  """
  keys = list(keys)
  lengths = as_lengths(lengths, keys)
  ds = ds.map(plain_tf(lambda ex: {k: tf.cast(ex[k], tf.int32) for k in keys}))
  ds = ds.filter(plain_tf(lambda ex: tf.reduce_any([tf.size(ex[k]) > 0 for k in keys])))

  def too_long(ex):
    return tf.reduce_any([tf.size(ex[k]) > lengths[k] for k in keys])

  def check(ex):
    message = "pack: an example is longer than its row; split_tokens() or trim() it first"
    assertion = tf.debugging.Assert(tf.logical_not(too_long(ex)), [message])
    with tf.control_dependencies([assertion]):
      return {k: tf.identity(v) for k, v in ex.items()}

  ds = ds.map(plain_tf(check))
  # A final marker flushes the last, partial row.
  examples = ds.map(plain_tf(lambda ex: (ex, tf.constant(False))))
  marker = tf.data.Dataset.from_tensors(
      ({k: tf.zeros([0], tf.int32) for k in keys}, tf.constant(True)))
  examples = examples.concatenate(marker)

  def empty_row():
    row = {}
    for k in keys:
      for suffix in ("", "_segmentation", "_position"):
        row[k + suffix] = tf.zeros([lengths[k]], tf.int32)
      row[k + "_fill"] = tf.constant(0, tf.int32)
    row["_count"] = tf.constant(0, tf.int32)
    return row

  def append(row, ex):
    out = dict(row)
    count = row["_count"] + 1
    for k in keys:
      n = tf.size(ex[k])
      start = row[k + "_fill"]
      padding = [[start, lengths[k] - start - n]]
      out[k] = row[k] + tf.pad(ex[k], padding)
      out[k + "_segmentation"] = row[k + "_segmentation"] + tf.pad(tf.fill([n], count), padding)
      out[k + "_position"] = row[k + "_position"] + tf.pad(tf.range(n), padding)
      out[k + "_fill"] = start + n
    out["_count"] = count
    return out

  def step(row, item):
    ex, is_marker = item
    fits = tf.logical_and(
        tf.logical_not(is_marker),
        tf.reduce_all([row[k + "_fill"] + tf.size(ex[k]) <= lengths[k] for k in keys]))
    emit = tf.logical_and(tf.logical_not(fits), row["_count"] > 0)
    base = tf.nest.map_structure(lambda a, b: tf.where(fits, a, b), row, empty_row())
    new_row = tf.cond(is_marker, lambda: base, lambda: append(base, ex))
    return new_row, (emit, row)

  packed = examples.scan(empty_row(), plain_tf(step))
  packed = packed.filter(plain_tf(lambda emit, row: emit))
  outputs = [k + suffix for k in keys for suffix in ("", "_segmentation", "_position")]
  return packed.map(plain_tf(lambda emit, row: {name: row[name] for name in outputs}))


def pad_unpacked(ds: tf.data.Dataset, lengths: Lengths,
                 keys: Sequence[str] = ("targets",)) -> tf.data.Dataset:
  """One example per row, padded to `lengths`, with the same features as
  `pack` (segmentation 1 on tokens, positions 0, 1, ...).

  Example:
    >>> ds = pad_unpacked(ds, 128)
  """
  keys = list(keys)
  lengths = as_lengths(lengths, keys)

  def pad(ex):
    out = {}
    for k in keys:
      ids = tf.cast(ex[k][:lengths[k]], tf.int32)
      padding = [[0, lengths[k] - tf.size(ids)]]
      out[k] = tf.pad(ids, padding)
      out[k + "_segmentation"] = tf.pad(tf.ones_like(ids), padding)
      out[k + "_position"] = tf.pad(tf.range(tf.size(ids)), padding)
      for suffix in ("", "_segmentation", "_position"):
        out[k + suffix].set_shape([lengths[k]])
    return out

  return ds.map(plain_tf(pad))
