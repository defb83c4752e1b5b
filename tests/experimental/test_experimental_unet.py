"""The original's experimental 3-D U-Net (mesh_tensorflow.experimental.unet):
values and gradients of a tiny U-Net are the same on one device and with the
volume split spatially over the mesh; its settings are checked; the
post-processor and the dataset reader work on small files of the published
format."""

from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf
from absl.testing import flagsaver

import mesh_tensorflow as mtf
from mesh_tensorflow.experimental import _flag_specs
from mesh_tensorflow.experimental import model_executor
from mesh_tensorflow.experimental import offline_data_aug
from mesh_tensorflow.experimental import unet
import mtf_test_utils as U


@pytest.fixture(scope="module", autouse=True)
def defined_flags():
  """The modules' absl flags, defined for these tests and removed after them
  (programs imported later in this process may define the same names)."""
  names = model_executor.define_flags()
  yield names
  _flag_specs.forget(names)

TINY = dict(ct_resolution=8, image_nx_block=2, image_ny_block=4, network_depth=2,
            n_conv_per_block=1, n_base_filters=2, batch_size_train=2, batch_size_eval=2,
            mtf_dtype="float32", label_c=3, pred_downsample=2)


def _volumes(batch=2, reso=8, seed=0):
  """Random images [b, R, R, R] and labels (0, 1, 2) with some of each class."""
  rng = np.random.RandomState(seed)
  images = rng.uniform(size=(batch, reso, reso, reso)).astype(np.float32)
  labels = np.zeros((batch, reso, reso, reso), np.float32)
  labels[:, 2:7, 1:6, 2:7] = 1.0
  labels[:, 3:5, 2:4, 3:6] = 2.0
  return images, labels


def _blocked_inputs(images, labels):
  image_shape, label_shape = unet.get_input_mtf_shapes("train")
  x = images.reshape(image_shape.to_integer_list())
  onehot = np.eye(3, dtype=np.float32)[labels.astype(np.int64)]
  return x, onehot.reshape(label_shape.to_integer_list())


def _builder(images, labels, mode="train"):
  def build(mesh):
    image_shape, label_shape = unet.get_input_mtf_shapes(mode)
    preds, loss, metrics, bn = unet.unet_with_spatial_partition(
        mesh, None, mode, tf.constant(images), tf.constant(labels))
    out = {"loss": loss, "dice": metrics["loss_dice"], "xen": metrics["loss_xen"]}
    for i, p in enumerate(preds):
      out[f"pred{i}"] = p
    if mode == "train":
      variables = mesh.graph.trainable_variables
      grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
      for v, g in zip(variables, grads):
        out[f"grad/{v.name}"] = g
      out["n_bn_updates"] = mtf.constant(mesh, float(len(bn)), shape=[], dtype=tf.float32)
    del image_shape, label_shape
    return out
  return build


@pytest.mark.parametrize("two_d", [False, True])
def test_values_and_gradients_do_not_depend_on_the_spatial_layout(two_d):
  settings = dict(TINY, dropout_keep_p=0.75, sampled_2d_slices=two_d, image_c=1)
  with flagsaver.flagsaver(**settings):
    images, labels = _volumes()
    if two_d:  # a slice of each volume (through the lesion)
      images, labels = images[..., 4:5], labels[..., 4]
    x, t = _blocked_inputs(images, labels)
    single = U.lower_and_run(_builder(x, t), "all:1", "")
    # 3-D: the volume split over both dimensions of a 2x4 mesh; 2-D: the
    # batch and the slices' second axis over a 2x2 mesh.
    mesh_shape, layout = (("rows:2;cols:2", "batch:rows;image_ny_block:cols") if two_d else
                          ("rows:2;cols:4", "image_nx_block:rows;image_ny_block:cols"))
    split = U.lower_and_run(_builder(x, t), mesh_shape, layout)
  assert sorted(single) == sorted(split)
  grads = [k for k in single if k.startswith("grad/")]
  # 2 levels x (down conv + BN scale/bias), up conv + BN, deconv, final conv.
  assert len(grads) == 11
  assert single["n_bn_updates"] == 6.0  # 3 batch norms x (mean, variance)
  assert np.isfinite(single["loss"]) and single["loss"] > 0
  for k in single:
    assert np.any(single[k] != 0) or k.startswith("grad/"), k
    U.assert_allclose(split[k], single[k], rtol=1e-4, atol=1e-5, msg=k)
  assert sum(float(np.abs(single[k]).sum()) for k in grads) > 0


def test_eval_predictions_have_the_original_shapes_and_ground_truth():
  with flagsaver.flagsaver(**TINY, sampled_2d_slices=False, image_c=1, dropout_keep_p=1.0):
    images, labels = _volumes()
    x, t = _blocked_inputs(images, labels)
    out = U.lower_and_run(_builder(x, t, "eval"), "all:1", "")
  # preds: liver prob, lesion prob, ground-truth lesion (downsampled), intersect, area sum.
  assert out["pred0"].shape == (2, 2, 4, 2, 1, 4)
  gt = out["pred2"]
  lesion = (labels == 2).astype(np.float32)
  blocks = lesion.reshape(2, 2, 4, 4, 2, 8).transpose(0, 1, 3, 2, 4, 5)
  pooled = blocks.reshape(2, 2, 4, 2, 2, 1, 2, 4, 2).mean(axis=(4, 6, 8))
  np.testing.assert_allclose(gt, pooled, atol=1e-6)
  assert out["pred3"].shape == (2,) and out["pred4"].shape == (2,)
  assert np.all(out["pred4"] >= lesion.sum(axis=(1, 2, 3)) - 1e-4)


def test_settings_that_cannot_split_are_one_clear_error():
  with flagsaver.flagsaver(**dict(TINY, image_ny_block=3)):
    with pytest.raises(ValueError, match="image_ny_block=3 must divide --ct_resolution=8"):
      unet.get_input_mtf_shapes("train")
  with flagsaver.flagsaver(**dict(TINY, network_depth=3)):
    with pytest.raises(ValueError, match="divisible by 2\\*\\*\\(network_depth - 1\\) = 4"):
      unet.get_input_mtf_shapes("train")
  with flagsaver.flagsaver(**TINY):
    with pytest.raises(ValueError, match="dataset_str must be 'train' or 'eval'"):
      unet.get_input_mtf_shapes("test")
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "m")
    with pytest.raises(ValueError, match="images has shape"):
      unet.unet_with_spatial_partition(mesh, None, "train", tf.zeros([2, 8, 8, 8, 1]),
                                       tf.zeros([2, 8, 8, 8, 3]))


def test_layout_flag_gives_the_layout_rules(defined_flags):
  default = mtf.convert_to_layout_rules(unet.FLAG_SPECS["layout"].default)
  assert unet.get_layout() == default
  if "layout" not in defined_flags:
    pytest.skip("another program in this process defined --layout")
  with flagsaver.flagsaver(layout="image_nx_block:rows;image_ny_block:cols"):
    rules = unet.get_layout()
  assert rules == mtf.convert_to_layout_rules("image_nx_block:rows;image_ny_block:cols")
  assert rules != default


def test_dataset_reader_reads_the_published_format(tmp_path):
  images, labels = _volumes(batch=3)
  raw = images * 2048.0 - 1024.0  # the eval path maps raw intensities to [0, 1]
  for i in range(3):
    offline_data_aug.save_to_tfrecord(raw[i], labels[i], 0, i, str(tmp_path), "ct")
  # The published record: GZIP, tf.Example with raw float32 bytes.
  record = next(iter(tf.data.TFRecordDataset(str(tmp_path / "ct-0-1.tfrecords"),
                                             compression_type="GZIP")))
  example = tf.train.Example.FromString(record.numpy())
  got = np.frombuffer(example.features.feature["image/ct_image"].bytes_list.value[0], np.float32)
  np.testing.assert_array_equal(got, raw[1].ravel())
  pattern = str(tmp_path / "ct-*.tfrecords")
  with flagsaver.flagsaver(**TINY, eval_file_pattern=pattern, train_file_pattern=pattern,
                           sampled_2d_slices=False, image_c=1):
    ds = unet.get_dataset_creator("eval")()
    image, label = next(iter(ds))
    assert image.shape == (2, 4, 4, 2, 8, 1) and label.shape == (2, 4, 4, 2, 8, 3)
    back = image.numpy()[..., 0].reshape(8, 8, 8)
    assert any(np.allclose(back, np.clip(r / 1024.0 + 0.5, 0, 1), atol=1e-6) for r in raw)
    np.testing.assert_array_equal(label.numpy().sum(-1), 1.0)
    train_image, train_label = next(iter(unet.get_dataset_creator("train")()))
    assert train_image.shape == image.shape and train_label.shape == label.shape
  with flagsaver.flagsaver(**TINY, eval_file_pattern=pattern, train_file_pattern=pattern,
                           sampled_2d_slices=True, image_c=3):
    # Evaluation on 2-D slices: every window of 3 slices of a volume, with
    # the label of its centre slice.
    slices = list(unet.get_dataset_creator("eval")().take(6))
    assert len(slices) == 6
    first = np.clip(raw[0] / 1024.0 + 0.5, 0, 1)
    for k, (image, label) in enumerate(slices):
      assert image.shape == (2, 4, 4, 2, 3) and label.shape == (2, 4, 4, 2, 3)
      np.testing.assert_allclose(image.numpy().reshape(8, 8, 3), first[:, :, k:k + 3],
                                 atol=1e-6)
      np.testing.assert_array_equal(np.argmax(label.numpy(), -1).reshape(8, 8),
                                    labels[0][:, :, k + 1])
    image, label = next(iter(unet.get_dataset_creator("train")()))
    assert image.shape == (2, 4, 4, 2, 3) and label.shape == (2, 4, 4, 2, 3)
  with flagsaver.flagsaver(**TINY, eval_file_pattern=str(tmp_path / "none-*")):
    with pytest.raises(ValueError, match="eval_file_pattern=.*matches no file"):
      unet.get_dataset_creator("eval")()


def test_post_processor_saves_cubes_and_computes_dice(tmp_path):
  with flagsaver.flagsaver(**TINY, output_ground_truth=True, sampled_2d_slices=False):
    pp = unet.PostProcessor()
    cube = np.arange(2 * 2 * 4 * 2 * 1 * 4, dtype=np.float32).reshape(2, 2, 4, 2, 1, 4)
    pp.record([cube, cube, cube, np.array([1.0, 2.0]), np.array([2.0, 4.0]), 0.5, 7],
              str(tmp_path))
    per_case, global_dice = pp.finish()
  assert sorted(os.listdir(tmp_path))[:2] == ["label_7_0.npy", "label_7_1.npy"]
  saved = np.load(tmp_path / "pred_liver_7_1.npy")
  expected = cube.transpose(0, 1, 3, 2, 4, 5).reshape(2, 4, 4, 4)[1]
  np.testing.assert_array_equal(saved, expected)
  assert per_case == pytest.approx(1.0, abs=1e-3) and global_dice == pytest.approx(1.0, abs=1e-3)
