"""A 3-D (or 2-D) U-Net whose volume is split spatially across the mesh.

The volume of resolution R is cut into `image_nx_block` x `image_ny_block`
blocks along its first two axes. The model's tensors are

    [batch, image_nx_block, image_ny_block, image_sx_block, image_sy_block,
     image_sz_block, channels]

(`image_sz_block` is absent for 2-D slices), where voxel
(nx * sx_size + sx, ny * sy_size + sy, sz) is at block (nx, ny), offset
(sx, sy, sz). A layout such as "image_nx_block:rows;image_ny_block:cols"
splits the volume over a 2-D mesh: every convolution first trades halos
with the neighbouring blocks (`mtf.halo_exchange`), so the network computes
the same numbers under any layout.

Settings come from absl flags (`ct_resolution`,
`network_depth`, `n_base_filters`, `mtf_dtype`, `layout`, ...). Nothing is
defined at import: call `define_flags()` before parsing, or read the
defaults. Functions:

    >>> from mesh_tensorflow.experimental import unet
    >>> unet.define_flags()
    >>> image_shape, label_shape = unet.get_input_mtf_shapes("train")
    >>> preds, loss, metrics, bn_updates = unet.unet_with_spatial_partition(
    ...     mesh, mesh_impl, "train", images, labels)

`images` and `labels` may be mtf Tensors of those shapes, whole tf.Tensors,
or laid-out slices (one tf.Tensor per processor).
"""

from __future__ import annotations

import functools
import os
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import tensorflow as tf
from absl import logging

import mesh_tensorflow as mtf
from mesh_tensorflow.experimental import _flag_specs
from mesh_tensorflow.experimental import data_aug_lib
from mesh_tensorflow.experimental._flag_specs import FlagSpec

FLAGS = _flag_specs.FLAGS

FLAG_SPECS: Dict[str, FlagSpec] = {
    "sampled_2d_slices": FlagSpec("boolean", False,
                                  "Build the model on 2-D slices of the volume instead of 3-D."),
    "ct_resolution": FlagSpec("integer", 128, "Resolution of the volume along every axis."),
    "n_dataset_read_interleave": FlagSpec("integer", 16, "Files read in parallel."),
    "n_dataset_processes": FlagSpec("integer", 16, "Parallel parse/augmentation calls."),
    "batch_size_train": FlagSpec("integer", 32, "Training batch size."),
    "batch_size_eval": FlagSpec("integer", 32, "Evaluation batch size."),
    "image_nx_block": FlagSpec("integer", 8, "Blocks along the first axis."),
    "image_ny_block": FlagSpec("integer", 8, "Blocks along the second axis."),
    "image_c": FlagSpec("integer", 1, "Input channels (neighbouring slices for 2-D; 1 for 3-D)."),
    "label_c": FlagSpec("integer", 3, "Output classes (0 background, 1 organ, 2 lesion)."),
    "pred_downsample": FlagSpec("integer", 2, "Average-pool predictions by this factor."),
    "output_ground_truth": FlagSpec("boolean", True,
                                    "Also return the (downsampled) ground truth lesion."),
    "n_base_filters": FlagSpec("integer", 32, "Filters of the first level (doubling per level)."),
    "network_depth": FlagSpec("integer", 4, "Levels of the U-Net (poolings + 1)."),
    "n_conv_per_block": FlagSpec("integer", 2, "Convolutions per level."),
    "with_batch_norm": FlagSpec("boolean", True, "Batch-normalize after every convolution."),
    "dropout_keep_p": FlagSpec("float", 0.5, "Probability to keep an activation."),
    "xen_liver_weight": FlagSpec("float", 8, "Cross-entropy weight of organ (class 1) voxels."),
    "xen_lesion_weight": FlagSpec("float", 16, "Cross-entropy weight of lesion (class 2) voxels."),
    "dice_loss_weight": FlagSpec("float", 0.2, "Weight of the dice loss, in [0, 1]."),
    "dice_epsilon": FlagSpec("float", 0.1, "Added to the dice denominators."),
    "image_translate_ratio": FlagSpec("float", 0.0, "Random translation (augmentation)."),
    "image_transform_ratio": FlagSpec("float", 0.0, "Random shear (augmentation)."),
    "image_noise_probability": FlagSpec("float", 0.0, "Probability of adding noise."),
    "image_noise_ratio": FlagSpec("float", 0.0, "Amplitude of the added noise."),
    "image_corrupt_ratio_mean": FlagSpec("float", 0.0, "Mean share of non-lesion voxels zeroed."),
    "image_corrupt_ratio_stddev": FlagSpec("float", 0.0, "Its standard deviation."),
    "per_class_intensity_scale": FlagSpec("float", 0.0, "Spread of per-class intensity change."),
    "per_class_intensity_shift": FlagSpec("float", 0.0, "Mean of per-class intensity change."),
    "mtf_dtype": FlagSpec("string", "bfloat16", "Activation and variable dtype of the model."),
    "layout": FlagSpec("string", "batch:cores, image_nx_block:rows, image_ny_block:columns",
                       "Layout rules."),
    "train_file_pattern": FlagSpec("string", "",
                                   "Training TFRecords (GZIP); may hold {} for ct_resolution."),
    "eval_file_pattern": FlagSpec("string", "",
                                  "Evaluation TFRecords (GZIP); may hold {} for ct_resolution."),
}


def define_flags(flag_values=FLAGS) -> List[str]:
  """Defines this module's absl flags (those not defined elsewhere yet);
  returns the names it defined.

  Example:
    >>> unet.define_flags()   # before app.run / FLAGS(argv)
  """
  return _flag_specs.define(FLAG_SPECS, flag_values)


def _flag(name: str):
  return _flag_specs.value(FLAG_SPECS, name)


def _check_settings() -> None:
  reso = _flag("ct_resolution")
  for blocks in ("image_nx_block", "image_ny_block"):
    n = _flag(blocks)
    if n < 1 or reso % n:
      raise ValueError(f"unet: --{blocks}={n} must divide --ct_resolution={reso}.")
  depth = _flag("network_depth")
  if depth < 1:
    raise ValueError(f"unet: --network_depth={depth} must be at least 1.")
  shrink = 2 ** (depth - 1)
  for blocks in ("image_nx_block", "image_ny_block"):
    size = reso // _flag(blocks)
    if size % shrink or size % _flag("pred_downsample"):
      raise ValueError(
          f"unet: the block size {size} (--ct_resolution / --{blocks}) must be divisible by "
          f"2**(network_depth - 1) = {shrink} (the poolings stay inside a block) and by "
          f"--pred_downsample={_flag('pred_downsample')}.")
  if not _flag("sampled_2d_slices") and (reso % shrink or reso % _flag("pred_downsample")):
    raise ValueError(f"unet: --ct_resolution={reso} must be divisible by {shrink} and by "
                     f"--pred_downsample={_flag('pred_downsample')}.")


def get_layout() -> mtf.LayoutRules:
  """The layout rules of the `layout` flag.

  Example:
    >>> unet.get_layout()
  """
  return mtf.convert_to_layout_rules(_flag("layout"))


def _dims(dataset_str: str) -> Dict[str, mtf.Dimension]:
  if dataset_str not in ("train", "eval"):
    raise ValueError(f"unet: dataset_str must be 'train' or 'eval', got {dataset_str!r}.")
  reso = _flag("ct_resolution")
  batch = _flag("batch_size_train" if dataset_str == "train" else "batch_size_eval")
  return {
      "batch": mtf.Dimension("batch", batch),
      "nx": mtf.Dimension("image_nx_block", _flag("image_nx_block")),
      "ny": mtf.Dimension("image_ny_block", _flag("image_ny_block")),
      "sx": mtf.Dimension("image_sx_block", reso // _flag("image_nx_block")),
      "sy": mtf.Dimension("image_sy_block", reso // _flag("image_ny_block")),
      "sz": mtf.Dimension("image_sz_block", reso),
      "image_c": mtf.Dimension("image_c", _flag("image_c")),
      "label_c": mtf.Dimension("label_c", _flag("label_c")),
  }


def get_input_mtf_shapes(dataset_str: str) -> List[mtf.Shape]:
  """[image shape, label shape] of one batch as the dataset delivers it.

  The shapes are [batch, image_nx_block, image_sx_block, image_ny_block,
  image_sy_block, (image_sz_block,) image_c | label_c]: a plain reshape of
  [batch, R, R, (R,) channels].

  Example:
    >>> image_shape, label_shape = unet.get_input_mtf_shapes("train")
  """
  _check_settings()
  d = _dims(dataset_str)
  spatial = [d["batch"], d["nx"], d["sx"], d["ny"], d["sy"]]
  if not _flag("sampled_2d_slices"):
    spatial.append(d["sz"])
  return [mtf.Shape(spatial + [d["image_c"]]), mtf.Shape(spatial + [d["label_c"]])]


def _blocked(t: tf.Tensor, channels: Optional[int]) -> tf.Tensor:
  """[R, R, (R,) (C)] -> [nx, sx, ny, sy, (R,) (C)]."""
  reso = _flag("ct_resolution")
  nx, ny = _flag("image_nx_block"), _flag("image_ny_block")
  shape = [nx, reso // nx, ny, reso // ny] + t.shape.as_list()[2:]
  if channels is not None and len(shape) == (5 if _flag("sampled_2d_slices") else 6) - 1:
    shape.append(channels)
  return tf.reshape(t, shape)


def _finish_example(image: tf.Tensor, label: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
  """Blocks, one-hot encodes and casts one example."""
  dtype = tf.as_dtype(_flag("mtf_dtype"))
  image = _blocked(image, _flag("image_c"))
  label = tf.one_hot(tf.cast(_blocked(label, None), tf.int32), _flag("label_c"))
  return tf.cast(image, dtype), tf.cast(label, dtype)


def _stacked_2d_slices(image: tf.Tensor, label: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
  """Every window of image_c neighbouring slices of a volume, with the label
  of the centre slice, stacked on a new leading axis."""
  reso, c = _flag("ct_resolution"), _flag("image_c")
  images, labels = [], []
  for begin in range(reso - c + 1):
    img, lab = _finish_example(image[:, :, begin:begin + c],
                               label[:, :, begin + c // 2])
    images.append(img)
    labels.append(lab)
  return tf.stack(images), tf.stack(labels)


def _parse_example(serialized: tf.Tensor, dataset_str: str, seed: Optional[int] = None):
  """One serialized tf.Example ("image/ct_image", "image/label": raw float32
  bytes of an R^3 volume) -> (image, label), augmented when training."""
  features = {"image/ct_image": tf.io.FixedLenFeature([], tf.string),
              "image/label": tf.io.FixedLenFeature([], tf.string)}
  parsed = tf.io.parse_single_example(serialized, features)
  reso = _flag("ct_resolution")
  image = tf.io.decode_raw(parsed["image/ct_image"], tf.float32)
  label = tf.io.decode_raw(parsed["image/label"], tf.float32)
  if dataset_str != "train":
    # Raw intensities to [0, 1]; the training files hold preprocessed ones.
    image = tf.clip_by_value(image / 1024.0 + 0.5, 0.0, 1.0)
  image = tf.reshape(image, [reso] * 3)
  label = tf.reshape(label, [reso] * 3)
  return _augment_and_finish(image, label, dataset_str)


def _augment_and_finish(image: tf.Tensor, label: tf.Tensor, dataset_str: str):
  """The per-example pipeline on one [R, R, R] volume and label."""
  reso, c = _flag("ct_resolution"), _flag("image_c")
  two_d = _flag("sampled_2d_slices")
  if dataset_str == "eval" and two_d:
    return _stacked_2d_slices(image, label)
  if two_d:
    begin = tf.random.uniform([], 0, reso - c + 1, dtype=tf.int32)
    image = tf.slice(image, [0, 0, begin], [reso, reso, c])
    label = tf.slice(label, [0, 0, begin], [reso, reso, c])
  if dataset_str == "train":
    for axis in (0, 1, 2):
      image, label = data_aug_lib.maybe_flip(image, label, axis)
    image, label = data_aug_lib.maybe_rot180(image, label, static_axis=2)
    image = data_aug_lib.intensity_shift(image, label, _flag("per_class_intensity_scale"),
                                         _flag("per_class_intensity_shift"))
    image = data_aug_lib.image_corruption(image, label, reso,
                                          _flag("image_corrupt_ratio_mean"),
                                          _flag("image_corrupt_ratio_stddev"))
    noise_shape = [reso, reso, c] if two_d else [reso] * 3
    image = data_aug_lib.maybe_add_noise(image, noise_shape, 1, 4,
                                         _flag("image_noise_probability"),
                                         _flag("image_noise_ratio"))
    image, label = data_aug_lib.projective_transform(
        image, label, reso, _flag("image_translate_ratio"), _flag("image_transform_ratio"),
        two_d)
  if two_d:
    label = label[:, :, c // 2]
  return _finish_example(image, label)


def get_dataset_creator(dataset_str: str) -> Callable[[], tf.data.Dataset]:
  """A function returning the unbatched, repeated dataset of
  (image, label) pairs in the shapes of `get_input_mtf_shapes` (without batch).

  Reads GZIP TFRecords of tf.Examples with "image/ct_image" and
  "image/label" (raw float32 bytes of an R^3 volume) from
  `train_file_pattern` or `eval_file_pattern` (a "{}" in the pattern becomes
  ct_resolution); training examples are shuffled and augmented.

  Example:
    >>> ds = unet.get_dataset_creator("train")().batch(4)
  """
  if dataset_str not in ("train", "eval"):
    raise ValueError(f"unet.get_dataset_creator: dataset_str must be 'train' or 'eval', "
                     f"got {dataset_str!r}.")
  flag = "train_file_pattern" if dataset_str == "train" else "eval_file_pattern"
  training = dataset_str == "train"

  def _dataset_creator() -> tf.data.Dataset:
    pattern = _flag(flag).format(_flag("ct_resolution"))
    if not pattern or not tf.io.gfile.glob(pattern):
      raise ValueError(f"unet: --{flag}={pattern!r} matches no file; give GZIP TFRecords "
                       "of tf.Examples with 'image/ct_image' and 'image/label'.")
    files = tf.data.Dataset.list_files(pattern, shuffle=training).repeat()
    read = functools.partial(tf.data.TFRecordDataset, compression_type="GZIP")
    if training:
      ds = files.interleave(lambda f: read(f).prefetch(1),
                            cycle_length=_flag("n_dataset_read_interleave"),
                            num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
    else:
      ds = files.interleave(lambda f: read(f).prefetch(1), cycle_length=1)
    parse = functools.partial(_parse_example, dataset_str=dataset_str)
    if training:
      ds = ds.shuffle(_flag("n_dataset_processes")).map(
          parse, num_parallel_calls=_flag("n_dataset_processes"))
    else:
      ds = ds.map(parse)
    if dataset_str == "eval" and _flag("sampled_2d_slices"):
      ds = ds.unbatch()
    return ds

  return _dataset_creator


class PostProcessor:
  """Collects evaluation results, saves the predictions as .npy files and
  logs the lesion dice over all of them.

  Example:
    >>> pp = unet.PostProcessor()
    >>> pp.record(results, "/tmp/preds")   # once per eval batch
    >>> dice_per_case, dice_global = pp.finish()
  """

  def __init__(self):
    self._area_int = []
    self._area_sum = []
    self._instance_i = 0

  def record(self, results, pred_output_dir: str) -> None:
    """Records one batch: `results` is the evaluation output (the
    predictions of `unet_with_spatial_partition`, then the loss and the
    global step), as numpy values. Files go to pred_output_dir (none when
    it is empty)."""
    results = list(results)
    if _flag("output_ground_truth"):
      pred_liver, pred_lesion, label, area_int, area_sum, _, global_step = results
      arrays = {"pred_liver": pred_liver, "pred_lesion": pred_lesion, "label": label}
    else:
      pred_liver, pred_lesion, area_int, area_sum, _, global_step = results
      arrays = {"pred_liver": pred_liver, "pred_lesion": pred_lesion}
    if pred_output_dir:
      tf.io.gfile.makedirs(pred_output_dir)
      two_d = _flag("sampled_2d_slices")
      for kind, data in arrays.items():
        instances = [np.asarray(data)] if two_d else list(self._reshape_to_cubes(data))
        for i, instance in enumerate(instances):
          path = os.path.join(pred_output_dir,
                              f"{kind}_{int(global_step)}_{self._instance_i + i}.npy")
          with tf.io.gfile.GFile(path, "wb") as f:
            np.save(f, instance)
    self._instance_i += 1 if _flag("sampled_2d_slices") else len(np.asarray(pred_liver))
    self._area_int.append(np.asarray(area_int))
    self._area_sum.append(np.asarray(area_sum))

  def finish(self) -> Tuple[float, float]:
    """Logs and returns (dice per case, global dice) of the lesion class."""
    if not self._area_int:
      raise ValueError("PostProcessor.finish: no results were recorded.")
    area_int = np.concatenate(self._area_int)
    area_sum = np.concatenate(self._area_sum)
    if _flag("sampled_2d_slices"):
      per_case = _flag("ct_resolution") - _flag("image_c") + 1
      if area_int.size % per_case:
        raise ValueError(f"PostProcessor.finish: {area_int.size} slice results are not a "
                         f"whole number of volumes of {per_case} slices.")
      area_int = area_int.reshape([-1, per_case]).sum(axis=1)
      area_sum = area_sum.reshape([-1, per_case]).sum(axis=1)
    dice_per_case = float((2 * area_int / (area_sum + 0.001)).mean())
    dice_global = float(2 * area_int.sum() / (area_sum.sum() + 0.001))
    logging.info("dice_per_case: %s, dice_global: %s", dice_per_case, dice_global)
    return dice_per_case, dice_global

  def _reshape_to_cubes(self, data) -> np.ndarray:
    """[b, nx, ny, sx, sy, sz] blocks -> [b, r, r, r] volumes (r = R / pred_downsample)."""
    reso = _flag("ct_resolution") // _flag("pred_downsample")
    data = np.transpose(np.asarray(data), (0, 1, 3, 2, 4, 5))
    return np.reshape(data, (data.shape[0], reso, reso, reso))


def conv_with_spatial_partition(x: mtf.Tensor, sampled_2d_slices: bool,
                                image_nx_dim: mtf.Dimension, image_ny_dim: mtf.Dimension,
                                n_filters: int, keep_p: float, with_batch_norm: bool,
                                is_training: bool, odim_name: str,
                                variable_dtype: mtf.VariableDType,
                                name: str) -> Tuple[mtf.Tensor, list]:
  """A 3x3(x3) SAME convolution over the blocked volume, then batch norm
  (optional), leaky ReLU (0.1) and dropout.

  Returns:
    (output, list of batch-norm update operations).

  Example:
    >>> y, updates = unet.conv_with_spatial_partition(
    ...     x, False, nx, ny, 16, 1.0, True, True, "conv_0_0", vdtype, "conv_down_0_0")
  """
  out_dim = mtf.Dimension(odim_name, n_filters)
  if sampled_2d_slices:
    x = mtf.layers.conv2d_with_blocks(
        x, out_dim, filter_size=(3, 3), strides=(1, 1), padding="SAME",
        h_blocks_dim=image_nx_dim, w_blocks_dim=image_ny_dim,
        variable_dtype=variable_dtype, name=name)
  else:
    x = mtf.layers.conv3d_with_blocks(
        x, out_dim, filter_size=(3, 3, 3), strides=(1, 1, 1), padding="SAME",
        d_blocks_dim=image_nx_dim, h_blocks_dim=image_ny_dim,
        variable_dtype=variable_dtype, name=name)
  bn_update_ops = []
  if with_batch_norm:
    x, bn_update_ops = mtf.layers.batch_norm(x, is_training, momentum=0.90, epsilon=1e-6,
                                             dims_idx_start=0, dims_idx_end=-1, name=name)
  x = mtf.leaky_relu(x, 0.1)
  x = mtf.dropout(x, is_training, keep_p)
  return x, bn_update_ops


def deconv_with_spatial_partition(x: mtf.Tensor, sampled_2d_slices: bool,
                                  image_nx_dim: mtf.Dimension, image_ny_dim: mtf.Dimension,
                                  n_filters: int, keep_p: float, is_training: bool,
                                  odim_name: str, variable_dtype: mtf.VariableDType,
                                  name: str) -> mtf.Tensor:
  """A 2x2(x2) transposed convolution with stride 2 (upsampling) over the
  blocked volume, then dropout.

  Example:
    >>> up = unet.deconv_with_spatial_partition(
    ...     x, False, nx, ny, 16, 1.0, True, "conv_0_1", vdtype, "deconv_0_0")
  """
  out_dim = mtf.Dimension(odim_name, n_filters)
  if sampled_2d_slices:
    x = mtf.layers.conv2d_transpose_with_blocks(
        x, out_dim, filter_size=(2, 2), strides=(2, 2), padding="SAME",
        h_blocks_dim=image_nx_dim, w_blocks_dim=image_ny_dim,
        variable_dtype=variable_dtype, name=name)
  else:
    x = mtf.layers.conv3d_transpose_with_blocks(
        x, out_dim, filter_size=(2, 2, 2), strides=(2, 2, 2), padding="SAME",
        d_blocks_dim=image_nx_dim, h_blocks_dim=image_ny_dim,
        variable_dtype=variable_dtype, name=name)
  return mtf.dropout(x, is_training, keep_p)


def _import_input(mesh, value, shape: mtf.Shape, what: str) -> mtf.Tensor:
  """An mtf Tensor of `shape` from an mtf Tensor, a whole tf.Tensor or
  laid-out slices."""
  if isinstance(value, mtf.Tensor):
    if value.shape != shape:
      raise ValueError(f"unet_with_spatial_partition: {what} has shape {value.shape}, "
                       f"expected {shape} (see get_input_mtf_shapes).")
    return value
  if isinstance(value, (tf.Tensor, np.ndarray)):
    if list(value.shape) != shape.to_integer_list():
      raise ValueError(f"unet_with_spatial_partition: {what} has shape "
                       f"{list(value.shape)}, expected {shape.to_integer_list()} ({shape}).")
    return mtf.import_tf_tensor(mesh, tf.convert_to_tensor(value), shape, name=what)
  return mtf.import_laid_out_tensor(mesh, value, shape, name=what)


def unet_with_spatial_partition(mesh: mtf.Mesh, mesh_impl, dataset_str: str, images,
                                labels) -> Tuple[List[mtf.Tensor], mtf.Tensor,
                                                 Dict[str, mtf.Tensor], list]:
  """Builds the U-Net, its loss, metrics and predictions on `mesh`.

  Down path: per level `n_conv_per_block` convolutions (filters
  n_base_filters * 2**level), then 2x max pooling. Up path: transposed
  convolution, concatenation with the down path's level, convolutions.
  A final 1x1(x1) convolution gives `label_c` logits. The loss is
  (1 - dice_loss_weight) * weighted cross-entropy (organ voxels weighted
  xen_liver_weight, lesion voxels xen_lesion_weight) + dice_loss_weight *
  the lesion's soft dice loss (mean of per-case and global).

  Args:
    mesh: an mtf.Mesh.
    mesh_impl: its mesh implementation (laid-out inputs must follow its
      layout).
    dataset_str: "train" or "eval" (batch norm and dropout train only in "train").
    images: [batch, nx, sx, ny, sy, (sz,) image_c] as an mtf Tensor, a
      tf.Tensor or laid-out slices (see `get_input_mtf_shapes`).
    labels: the one-hot labels, [..., label_c], in the same forms.

  Returns:
    (preds, loss, eval_metrics, bn_update_ops): preds are the downsampled
    organ and lesion probabilities [batch, nx, ny, sx', sy', (sz')], the
    downsampled ground-truth lesion (with output_ground_truth), and the
    per-example lesion intersection and area sum [batch]; loss is a scalar;
    eval_metrics maps names to scalars; bn_update_ops are the batch-norm
    moving-average updates to run with a training step.

  Example:
    >>> preds, loss, metrics, bn_updates = unet.unet_with_spatial_partition(
    ...     mesh, mesh_impl, "train", features["image"], features["label"])
  """
  del mesh_impl  # the lowering brings it
  _check_settings()
  is_training = dataset_str == "train"
  d = _dims(dataset_str)
  batch_dim, nx, ny = d["batch"], d["nx"], d["ny"]
  label_c_dim = d["label_c"]
  two_d = _flag("sampled_2d_slices")
  image_shape, label_shape = get_input_mtf_shapes(dataset_str)
  dtype = tf.as_dtype(_flag("mtf_dtype"))
  variable_dtype = mtf.VariableDType(dtype, dtype, dtype)

  x = mtf.cast(_import_input(mesh, images, image_shape, "images"), dtype)
  t = mtf.cast(_import_input(mesh, labels, label_shape, "labels"), dtype)
  order = [batch_dim, nx, ny, d["sx"], d["sy"]] + ([] if two_d else [d["sz"]])
  x = mtf.transpose(x, order + [d["image_c"]])
  t = mtf.transpose(t, order + [label_c_dim])

  depth_n, n_conv = _flag("network_depth"), _flag("n_conv_per_block")
  base, keep_p = _flag("n_base_filters"), _flag("dropout_keep_p")
  with_bn = _flag("with_batch_norm")
  levels, bn_updates = [], []
  for depth in range(depth_n):
    for i in range(n_conv):
      x, ops = conv_with_spatial_partition(
          x, two_d, nx, ny, base * 2 ** depth, 1.0 if depth == 0 and i == 0 else keep_p,
          with_bn, is_training, f"conv_{depth}_{i}", variable_dtype, f"conv_down_{depth}_{i}")
      bn_updates.extend(ops)
    levels.append(x)
    if depth < depth_n - 1:
      x = (mtf.layers.max_pool2d(x, ksize=(2, 2)) if two_d
           else mtf.layers.max_pool3d(x, ksize=(2, 2, 2)))
  for depth in reversed(range(depth_n - 1)):
    skip_name = f"conv_{depth}_{n_conv - 1}"
    x = deconv_with_spatial_partition(x, two_d, nx, ny, base * 2 ** depth, keep_p,
                                      is_training, skip_name, variable_dtype,
                                      f"deconv_{depth}_0")
    x = mtf.concat([x, levels[depth]], concat_dim_name=skip_name)
    for i in range(n_conv):
      x, ops = conv_with_spatial_partition(
          x, two_d, nx, ny, base * 2 ** depth, keep_p, with_bn, is_training,
          f"conv_{depth}_{i}", variable_dtype, f"conv_up_{depth}_{i}")
      bn_updates.extend(ops)

  label_c = label_c_dim.size
  if two_d:
    y = mtf.layers.conv2d_with_blocks(
        x, label_c_dim, filter_size=(1, 1), strides=(1, 1), padding="SAME",
        h_blocks_dim=nx, w_blocks_dim=ny, variable_dtype=variable_dtype,
        name=f"final_conv_{label_c}")
  else:
    y = mtf.layers.conv3d_with_blocks(
        x, label_c_dim, filter_size=(1, 1, 1), strides=(1, 1, 1), padding="SAME",
        d_blocks_dim=nx, h_blocks_dim=ny, variable_dtype=variable_dtype,
        name=f"final_conv_{label_c}")

  def scalar(v, dt=dtype):
    return mtf.constant(mesh, v, shape=[], dtype=dt)

  argmax_t = mtf.argmax(t, label_c_dim)
  liver_t = mtf.cast(mtf.equal(argmax_t, scalar(1, tf.int32)), dtype)
  lesion_t = mtf.cast(mtf.equal(argmax_t, scalar(2, tf.int32)), dtype)
  argmax_y = mtf.argmax(y, label_c_dim)
  lesion_y = mtf.cast(mtf.equal(argmax_y, scalar(2, tf.int32)), dtype)

  pixel_loss = mtf.layers.softmax_cross_entropy_with_logits(y, t, label_c_dim)
  liver_w, lesion_w = _flag("xen_liver_weight"), _flag("xen_lesion_weight")
  pixel_weight = (scalar(1.0) + liver_t * scalar(liver_w - 1.0)
                  + lesion_t * scalar(lesion_w - liver_w))
  loss_xen = mtf.reduce_mean(pixel_loss * pixel_weight)

  eps = scalar(_flag("dice_epsilon"))
  y_prob = mtf.softmax(y, reduced_dim=label_c_dim)
  one_class = mtf.Dimension("label_c", 1)
  lesion_prob = mtf.reduce_sum(mtf.slice(y_prob, 2, 1, "label_c"), reduced_dim=one_class)
  per_case = mtf.Shape([batch_dim])
  prob_intersect = mtf.reduce_sum(lesion_prob * lesion_t, output_shape=per_case)
  prob_area_sum = mtf.reduce_sum(lesion_prob + lesion_t, output_shape=per_case)
  loss_dice_per_case = mtf.reduce_mean(scalar(-2.0) * prob_intersect / (prob_area_sum + eps))
  loss_dice_global = scalar(-2.0) * mtf.reduce_sum(prob_intersect) / (
      mtf.reduce_sum(prob_area_sum) + eps)
  loss_dice = (loss_dice_per_case + loss_dice_global) * scalar(0.5)
  dice_w = _flag("dice_loss_weight")
  loss = scalar(dice_w) * loss_dice + scalar(1.0 - dice_w) * loss_xen

  intersect = mtf.reduce_sum(lesion_y * lesion_t, output_shape=per_case)
  area_sum = mtf.reduce_sum(lesion_y + lesion_t, output_shape=per_case)
  tiny = scalar(1e-6)
  eval_metrics = {
      "lesion_pred_ratio": mtf.reduce_mean(lesion_y),
      "lesion_label_ratio": mtf.reduce_mean(lesion_t),
      "accuracy_of_all_classes": mtf.reduce_mean(
          mtf.cast(mtf.equal(argmax_y, argmax_t), dtype)),
      "lesion_dice_per_case": mtf.reduce_mean(scalar(2.0) * intersect / (area_sum + tiny)),
      "lesion_dice_global": scalar(2.0) * mtf.reduce_sum(intersect) / (
          mtf.reduce_sum(area_sum) + tiny),
      "loss_xen": loss_xen,
      "loss_dice": loss_dice,
      "loss_dice_per_case": loss_dice_per_case,
      "loss_dice_global": loss_dice_global,
  }

  k = _flag("pred_downsample")
  pool = ((lambda v: mtf.layers.avg_pool2d(v, ksize=(k, k))) if two_d
          else (lambda v: mtf.layers.avg_pool3d(v, ksize=(k, k, k))))
  y_prob_small = pool(y_prob)
  preds = [mtf.reduce_sum(mtf.slice(y_prob_small, c, 1, "label_c"), reduced_dim=one_class)
           for c in (1, 2)]
  if _flag("output_ground_truth"):
    preds.append(mtf.reduce_sum(pool(mtf.slice(t, 2, 1, "label_c")), reduced_dim=one_class))
  preds.extend([intersect, area_sum])
  return preds, loss, eval_metrics, bn_updates
