"""Random augmentations of 3-D volumes and their voxel labels, on TF2 ops.

Each function takes an [X, Y, Z] float32 volume (or [X, Y, C] for 2-D
slices) and its label volume (0 background, 1 organ, 2 lesion) and returns
randomly transformed copies; the randomness comes from `tf.random`, so
`tf.random.set_seed` makes a run repeatable. Functions whose strength is 0
return their input unchanged.

    >>> image, label = data_aug_lib.maybe_flip(image, label, flip_axis=0)
    >>> image, label = data_aug_lib.maybe_rot180(image, label, static_axis=2)
    >>> image = data_aug_lib.maybe_add_noise(image, [64, 64, 64], 1, 4, 0.5, 0.1)
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple, Union

import numpy as np
import tensorflow as tf

_TINY = 1e-6

TensorLike = Union[tf.Tensor, np.ndarray]
Pair = Tuple[tf.Tensor, tf.Tensor]


def _truncated_normal(mean, stddev) -> tf.Tensor:
  """A normal sample clipped to mean +- 2 stddev."""
  v = tf.random.normal([], mean=mean, stddev=stddev)
  return tf.clip_by_value(v, mean - 2.0 * stddev, mean + 2.0 * stddev)


def _rand_noise(mean, stddev, scale: int, shape: Sequence[int]) -> tf.Tensor:
  """Clipped normal noise of `shape`, drawn on a grid `scale` times coarser
  and resized up (bilinear) when scale > 1."""
  shape = [int(s) for s in shape]
  coarse = [max(s // scale, 1) for s in shape]
  noise = tf.random.normal(coarse, mean=mean, stddev=stddev)
  noise = tf.clip_by_value(noise, mean - 2.0 * stddev, mean + 2.0 * stddev)
  if scale != 1:
    # Axes 1 and 2 are resized as an image with axis 0 as the channels...
    noise = tf.image.resize(noise, [shape[0], shape[1]])
    noise = tf.transpose(noise, [0, 2, 1])
    # ... then the last axis, with the middle one as the channels.
    noise = tf.image.resize(noise, [shape[0], shape[2]])
    noise = tf.transpose(noise, [0, 2, 1])
  return noise


def _transform_2d(data: tf.Tensor, matrix: tf.Tensor, interpolation: str) -> tf.Tensor:
  """Projective transform of [H, W, C] over H and W (zeros outside)."""
  out = tf.raw_ops.ImageProjectiveTransformV3(
      images=tf.expand_dims(tf.cast(data, tf.float32), 0),
      transforms=tf.reshape(tf.cast(matrix, tf.float32), [1, 8]),
      output_shape=tf.shape(data)[:2], fill_value=0.0, interpolation=interpolation,
      fill_mode="CONSTANT")
  return tf.cast(out[0], data.dtype)


def projective_transform(image: TensorLike, label: TensorLike, reso: int,
                         image_translate_ratio: float, image_transform_ratio: float,
                         sampled_2d_slices: bool = False) -> Pair:
  """Random projective transforms (shear and translation) of the volume.

  For each axis held fixed (only the last for 2-D slices), the planes across
  it are transformed by one random 3x3 projective matrix near the identity
  (entries with spread image_transform_ratio, translations with spread
  image_translate_ratio * reso). The image is interpolated bilinearly, the
  label by nearest neighbour; voxels from outside become 0.

  Example:
    >>> image, label = projective_transform(image, label, 64, 0.05, 0.05)
  """
  if image_translate_ratio < _TINY and image_transform_ratio < _TINY:
    return image, label
  # Moves the fixed axis last (as the channels), transforms, moves it back.
  perms = {0: [2, 1, 0], 1: [0, 2, 1], 2: None}
  for static_axis in (0, 1, 2):
    if sampled_2d_slices and static_axis != 2:
      continue
    r, t = image_transform_ratio, image_translate_ratio * reso
    matrix = tf.stack([
        _truncated_normal(1.0, r), _truncated_normal(0.0, r), _truncated_normal(0.0, t),
        _truncated_normal(0.0, r), _truncated_normal(1.0, r), _truncated_normal(0.0, t),
        _truncated_normal(0.0, r), _truncated_normal(0.0, r)])
    perm = perms[static_axis]

    def apply(data, interpolation, perm=perm, matrix=matrix):
      if perm is not None:
        data = tf.transpose(data, perm)
      data = _transform_2d(data, matrix, interpolation)
      return data if perm is None else tf.transpose(data, perm)
    image = apply(image, "BILINEAR")
    label = apply(label, "NEAREST")
  return image, label


def maybe_add_noise(image: TensorLike, noise_shape: Sequence[int], scale0: int, scale1: int,
                    image_noise_probability: float, image_noise_ratio: float) -> tf.Tensor:
  """With probability image_noise_probability, adds normal noise at two
  scales (grids scale0 and scale1 times coarser), each with a random
  standard deviation in [0, image_noise_ratio).

  Example:
    >>> noisy = maybe_add_noise(image, [64, 64, 64], 1, 4, 0.5, 0.1)
  """
  if image_noise_probability < _TINY or image_noise_ratio < _TINY:
    return image
  noise = 0.0
  for scale in (scale0, scale1):
    stddev = tf.random.uniform([], 0.0, image_noise_ratio)
    noise += _rand_noise(0.0, stddev, scale, noise_shape)
  add = tf.less_equal(tf.random.uniform([]), image_noise_probability)
  return tf.cond(add, lambda: image + tf.cast(noise, image.dtype), lambda: image)


def _percentile(values: tf.Tensor, q: tf.Tensor) -> tf.Tensor:
  """The q-th percentile (0..100) of all values, nearest rank."""
  flat = tf.sort(tf.reshape(values, [-1]))
  n = tf.size(flat)
  index = tf.cast(tf.round(tf.cast(q, tf.float32) / 100.0 * tf.cast(n - 1, tf.float32)),
                  tf.int32)
  return flat[tf.clip_by_value(index, 0, n - 1)]


def _gen_rand_mask(ratio_mean, ratio_stddev, scale, shape, smoothness=0) -> tf.Tensor:
  """A boolean mask of `shape` that is True on a random share (about
  ratio_mean) of the voxels, in blobs of about `scale` voxels."""
  scale = max(int(scale), 1)
  ratio = tf.random.normal([], mean=ratio_mean, stddev=ratio_stddev)
  low = tf.maximum(0.0, ratio_mean - 2.0 * ratio_stddev)
  high = tf.minimum(1.0, ratio_mean + 2.0 * ratio_stddev)
  q = tf.cast(100.0 * tf.clip_by_value(ratio, low, high), tf.int32)
  pattern = _rand_noise(0.0, 1.0, scale, shape)
  if smoothness > 0:
    k = int(smoothness) // 2 * 2 + 1
    pattern = tf.nn.conv3d(pattern[tf.newaxis, ..., tf.newaxis], tf.ones([k, k, k, 1, 1]),
                           strides=[1] * 5, padding="SAME")[0, ..., 0]
  return tf.less(pattern, _percentile(pattern, q))


def _box_blur(mask: tf.Tensor, size: int) -> tf.Tensor:
  size = max(int(size), 1)
  kernel = tf.ones([size] * 3 + [1, 1], tf.float32) / float(size ** 3)
  return tf.nn.conv3d(tf.cast(mask, tf.float32)[tf.newaxis, ..., tf.newaxis], kernel,
                      strides=[1] * 5, padding="SAME")[0, ..., 0]


def maybe_gen_fake_data_based_on_real_data(image: TensorLike, label: TensorLike, reso: int,
                                           min_fake_lesion_ratio: float,
                                           gen_fake_probability: float) -> Pair:
  """With probability gen_fake_probability, replaces the real lesions by
  synthetic ones: the real lesion is painted over with the organ's mean
  intensity, random blobs inside the organ (a random share of at least
  min_fake_lesion_ratio) get the lesion's intensity and become label 2.
  Volumes without both organ and lesion are returned unchanged.

  Example:
    >>> image, label = maybe_gen_fake_data_based_on_real_data(image, label, 64, 0.05, 0.5)
  """
  draw = tf.random.uniform([], 0.0, 1.0)
  background = tf.less(label, 0.5)
  lesion = tf.greater(label, 1.5)
  liver = tf.logical_not(tf.logical_or(background, lesion))
  diff = 1.15 * (tf.reduce_mean(tf.boolean_mask(image, liver))
                 - tf.reduce_mean(tf.boolean_mask(image, lesion)))
  diff = tf.where(tf.math.is_nan(diff), 0.0, diff)

  ratio = (tf.random.normal([], mean=0.01, stddev=0.01)
           + tf.random.normal([], mean=0.0, stddev=0.05))
  ratio = tf.clip_by_value(ratio, min_fake_lesion_ratio, min_fake_lesion_ratio + 0.20)
  blob = max(int(reso) // 32, 1)
  fake = tf.logical_and(
      _gen_rand_mask(ratio, 0.0, blob, label.shape, smoothness=blob if reso >= 32 else 0),
      tf.logical_not(background))
  fake_liver = tf.logical_not(tf.logical_or(background, fake))

  generate = tf.logical_and(tf.greater(diff, 1e-4),
                            tf.greater(draw, 1.0 - gen_fake_probability))
  new_image = image + diff * _box_blur(lesion, blob) - diff * _box_blur(fake, blob)
  new_label = tf.cast(fake_liver, tf.float32) + 2.0 * tf.cast(fake, tf.float32)
  image = tf.cond(generate, lambda: new_image, lambda: image)
  label = tf.cond(generate, lambda: new_label, lambda: label)
  return image, label


def _flip_along(data: tf.Tensor, axis) -> tf.Tensor:
  """data reversed along `axis` (an int or a scalar int tensor in 0..2)."""
  axis = tf.convert_to_tensor(axis, tf.int32)
  return tf.switch_case(tf.clip_by_value(axis, 0, 2),
                        [lambda a=a: tf.reverse(data, [a]) for a in range(3)])


def maybe_flip(image: TensorLike, label: TensorLike, flip_axis,
               flip_indicator: Optional[TensorLike] = None) -> Pair:
  """Reverses image and label along flip_axis (0, 1 or 2) with probability
  1/2, or when flip_indicator (a number in [0, 1]) is above 0.5.

  Example:
    >>> image, label = maybe_flip(image, label, 1, flip_indicator=1.0)  # always flips
  """
  if flip_indicator is None:
    flip_indicator = tf.random.uniform([])
  flip = tf.greater(flip_indicator, 0.5)
  return (tf.cond(flip, lambda: _flip_along(image, flip_axis), lambda: image),
          tf.cond(flip, lambda: _flip_along(label, flip_axis), lambda: label))


def maybe_rot180(image: TensorLike, label: TensorLike, static_axis,
                 rot180_k: Optional[TensorLike] = None) -> Pair:
  """Rotates image and label by 180 degrees about static_axis (0, 1 or 2)
  with probability 1/2, or when rot180_k (0 or 2, the number of quarter
  turns) is 2.

  Example:
    >>> image, label = maybe_rot180(image, label, static_axis=2, rot180_k=2)
  """
  if rot180_k is None:
    rot180_k = 2 * tf.random.uniform([], 0, 2, dtype=tf.int32)
  rotate = tf.not_equal(rot180_k, 0)
  static_axis = tf.convert_to_tensor(static_axis, tf.int32)

  def rot(data):
    # A half turn about one axis reverses the two other axes.
    return tf.switch_case(tf.clip_by_value(static_axis, 0, 2), [
        lambda: tf.reverse(data, [1, 2]), lambda: tf.reverse(data, [0, 2]),
        lambda: tf.reverse(data, [0, 1])])
  return (tf.cond(rotate, lambda: rot(image), lambda: image),
          tf.cond(rotate, lambda: rot(label), lambda: label))


def intensity_shift(image: TensorLike, label: TensorLike, per_class_intensity_scale: float,
                    per_class_intensity_shift: float) -> tf.Tensor:
  """Scales the lesion's intensities by a random factor around
  1 + per_class_intensity_shift and the rest around 1 - shift (spread
  per_class_intensity_scale).

  Example:
    >>> image = intensity_shift(image, label, 0.1, 0.1)
  """
  if per_class_intensity_scale < _TINY and per_class_intensity_shift < _TINY:
    return image
  lesion = tf.cast(tf.greater(label, 1.5), image.dtype)
  noise = _truncated_normal(per_class_intensity_shift, per_class_intensity_scale)
  image = image + noise * image * lesion
  noise = _truncated_normal(-per_class_intensity_shift, per_class_intensity_scale)
  return image + noise * image * (1.0 - lesion)


def image_corruption(image: TensorLike, label: TensorLike, reso: int,
                     image_corrupt_ratio_mean: float,
                     image_corrupt_ratio_stddev: float) -> tf.Tensor:
  """Zeros a random share (about image_corrupt_ratio_mean, in blobs of about
  reso / 3 voxels) of the non-lesion voxels.

  Example:
    >>> image = image_corruption(image, label, 64, 0.1, 0.05)
  """
  if image_corrupt_ratio_mean < _TINY and image_corrupt_ratio_stddev < _TINY:
    return image
  keep = _gen_rand_mask(1.0 - image_corrupt_ratio_mean, image_corrupt_ratio_stddev,
                        int(reso) // 3, image.shape)
  keep = tf.logical_or(tf.greater(label, 1.5), keep)
  return image * tf.cast(keep, image.dtype)
