"""Layout-invariant random numbers.

Every element's value is a hash of (seed, step key, its index in the full
tensor), so each processor computes just its own slice and the full tensor is
the same under every layout and mesh: no full-size copy is ever made.
"""

from __future__ import annotations

import math
import zlib
from typing import Sequence

import tensorflow as tf

_M1 = 0x85EBCA6B
_M2 = 0xC2B2AE35
_GOLDEN = 0x9E3779B9


def _u32(v) -> tf.Tensor:
  return tf.constant(v & 0xFFFFFFFF, tf.uint32)


def _fmix(h: tf.Tensor) -> tf.Tensor:
  """MurmurHash3's 32-bit finalizer: a bijective avalanche mix on uint32."""
  h = tf.bitwise.bitwise_xor(h, tf.bitwise.right_shift(h, _u32(16)))
  h = h * _u32(_M1)
  h = tf.bitwise.bitwise_xor(h, tf.bitwise.right_shift(h, _u32(13)))
  h = h * _u32(_M2)
  return tf.bitwise.bitwise_xor(h, tf.bitwise.right_shift(h, _u32(16)))


def name_seed(name: str, seed=None) -> int:
  """A 32-bit seed from an op or variable name and an optional user seed."""
  return zlib.crc32(f"{name}#{seed}".encode()) & 0xFFFFFFFF


def global_index(full_shape: Sequence[int], begin: Sequence, slice_shape: Sequence[int]) -> tf.Tensor:
  """int64 row-major index, in the full tensor, of every element of a slice."""
  rank = len(full_shape)
  idx = tf.zeros([1] * rank, tf.int64)
  stride = 1
  for axis in reversed(range(rank)):
    r = tf.range(slice_shape[axis], dtype=tf.int64) + tf.cast(begin[axis], tf.int64)
    shape = [1] * rank
    shape[axis] = slice_shape[axis]
    idx = idx + tf.reshape(r, shape) * stride
    stride *= full_shape[axis]
  return tf.broadcast_to(idx, slice_shape)


def keyed_index(full_shape: Sequence[int], begin: Sequence, slice_shape: Sequence[int],
                axis: int, keys: Sequence[int]) -> tf.Tensor:
  """Like `global_index`, with row i along `axis` numbered keys[i]: the index
  of the element in a tensor whose rows are the keys (distinct keys draw
  distinct numbers; equal keys the same, wherever the row is)."""
  rest_full = list(full_shape[:axis]) + list(full_shape[axis + 1:])
  rest = global_index(rest_full, list(begin[:axis]) + list(begin[axis + 1:]),
                      list(slice_shape[:axis]) + list(slice_shape[axis + 1:]))
  rows = tf.range(slice_shape[axis], dtype=tf.int64) + tf.cast(begin[axis], tf.int64)
  row_keys = tf.gather(tf.constant(list(keys), tf.int64), rows)
  key_shape = [1] * len(full_shape)
  key_shape[axis] = slice_shape[axis]
  index = tf.expand_dims(rest, axis) + tf.reshape(row_keys, key_shape) * math.prod(rest_full)
  return tf.broadcast_to(index, slice_shape)


def _bits(index: tf.Tensor, seed: int, key: tf.Tensor, stream: int) -> tf.Tensor:
  lo = tf.cast(tf.bitwise.bitwise_and(index, 0xFFFFFFFF), tf.uint32)
  hi = tf.cast(tf.bitwise.right_shift(index, 32), tf.uint32)
  key = tf.cast(key, tf.int64)
  k_lo = tf.cast(tf.bitwise.bitwise_and(key, 0xFFFFFFFF), tf.uint32)
  s = _fmix(_fmix(k_lo + _u32(seed)) ^ _u32(stream * _GOLDEN + 1))
  h = _fmix(lo ^ s)
  return _fmix(h + _fmix(hi + s * _u32(3)))


def uniform(index, seed: int, key, dtype=tf.float32, stream: int = 0) -> tf.Tensor:
  """Uniform [0, 1) values, one per element of `index`."""
  bits = tf.bitwise.right_shift(_bits(index, seed, key, stream), _u32(8))
  return tf.cast(tf.cast(bits, tf.float32) * (1.0 / (1 << 24)), dtype)


def normal(index, seed: int, key, dtype=tf.float32) -> tf.Tensor:
  """Standard normal values (Box-Muller on two independent streams).

  Computed in float64: float32 log/cos differ in the last bit between
  TensorFlow's vectorized and scalar kernels, i.e. with the slice shape, and
  the full tensor must not depend on the layout.
  """
  u1 = 1.0 - uniform(index, seed, key, tf.float64, stream=1)
  u2 = uniform(index, seed, key, tf.float64, stream=2)
  z = tf.sqrt(-2.0 * tf.math.log(u1)) * tf.cos((2.0 * math.pi) * u2)
  return tf.cast(z, dtype)


def truncated_normal(index, seed: int, key, dtype=tf.float32) -> tf.Tensor:
  """Normal values re-drawn (up to 4 times, then clipped) outside 2 stddevs."""
  z = normal(index, seed, key, tf.float32)
  for attempt in range(4):
    redraw = normal(index, seed ^ (0x5BD1E995 * (attempt + 1)) & 0xFFFFFFFF, key)
    z = tf.where(tf.abs(z) > 2.0, redraw, z)
  return tf.cast(tf.clip_by_value(z, -2.0, 2.0), dtype)
