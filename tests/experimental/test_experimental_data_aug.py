"""The original's augmentations (mesh_tensorflow.experimental.data_aug_lib)
and offline augmentation writer, on small volumes: shapes, determinism under
seeds, and invariants (flips and half turns are involutions, strength 0 is
the identity, labels keep their classes)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from absl.testing import flagsaver

from mesh_tensorflow.experimental import _flag_specs
from mesh_tensorflow.experimental import data_aug_lib as aug
from mesh_tensorflow.experimental import offline_data_aug


@pytest.fixture(scope="module", autouse=True)
def defined_flags():
  """The modules' absl flags, defined for these tests and removed after them
  (programs imported later in this process may define the same names)."""
  names = offline_data_aug.define_flags()
  yield names
  _flag_specs.forget(names)


@pytest.fixture(autouse=True)
def unset_global_seed():
  """Tests here set TensorFlow's global seed; later tests in this process
  must not inherit it."""
  yield
  tf.random.set_seed(None)


def _volume(reso=8, seed=0):
  rng = np.random.RandomState(seed)
  image = rng.uniform(size=(reso, reso, reso)).astype(np.float32)
  label = np.zeros((reso, reso, reso), np.float32)
  label[1:7, 2:7, 1:6] = 1.0
  label[2:4, 3:5, 2:5] = 2.0
  image[label == 2] *= 0.3  # darker lesion
  return tf.constant(image), tf.constant(label)


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_flip_reverses_one_axis_and_is_an_involution(axis):
  image, label = _volume()
  flipped, flipped_label = aug.maybe_flip(image, label, axis, flip_indicator=1.0)
  np.testing.assert_array_equal(flipped, np.flip(image.numpy(), axis))
  np.testing.assert_array_equal(flipped_label, np.flip(label.numpy(), axis))
  back, back_label = aug.maybe_flip(flipped, flipped_label, axis, flip_indicator=0.9)
  np.testing.assert_array_equal(back, image)
  np.testing.assert_array_equal(back_label, label)
  same, _ = aug.maybe_flip(image, label, axis, flip_indicator=0.2)
  np.testing.assert_array_equal(same, image)


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_rot180_turns_about_the_static_axis(axis):
  image, label = _volume()
  turned, turned_label = aug.maybe_rot180(image, label, axis, rot180_k=2)
  others = tuple(a for a in range(3) if a != axis)
  np.testing.assert_array_equal(turned, np.rot90(image.numpy(), 2, axes=others))
  np.testing.assert_array_equal(turned_label, np.rot90(label.numpy(), 2, axes=others))
  back, _ = aug.maybe_rot180(turned, turned_label, axis, rot180_k=2)
  np.testing.assert_array_equal(back, image)
  same, _ = aug.maybe_rot180(image, label, axis, rot180_k=0)
  np.testing.assert_array_equal(same, image)


def test_zero_strength_is_the_identity():
  image, label = _volume()
  assert aug.intensity_shift(image, label, 0.0, 0.0) is image
  assert aug.image_corruption(image, label, 8, 0.0, 0.0) is image
  assert aug.maybe_add_noise(image, [8, 8, 8], 1, 4, 0.0, 0.5) is image
  out = aug.projective_transform(image, label, 8, 0.0, 0.0)
  assert out[0] is image and out[1] is label


def test_random_augmentations_are_repeatable_under_a_seed():
  image, label = _volume()

  def run():
    tf.random.set_seed(7)
    x, y = aug.maybe_flip(image, label, 0)
    x, y = aug.maybe_rot180(x, y, 2)
    x = aug.intensity_shift(x, y, 0.1, 0.1)
    x = aug.image_corruption(x, y, 8, 0.2, 0.05)
    x = aug.maybe_add_noise(x, [8, 8, 8], 1, 4, 1.0, 0.1)
    x, y = aug.projective_transform(x, y, 8, 0.05, 0.05)
    return x.numpy(), y.numpy()
  (a, b), (c, d) = run(), run()
  np.testing.assert_array_equal(a, c)
  np.testing.assert_array_equal(b, d)
  assert a.shape == b.shape == (8, 8, 8)
  assert not np.array_equal(a, image.numpy())


def test_noise_is_added_with_its_probability_and_has_the_shape():
  image, _ = _volume()
  tf.random.set_seed(1)
  noisy = aug.maybe_add_noise(image, [8, 8, 8], 1, 4, 1.0, 0.2).numpy()
  assert noisy.shape == (8, 8, 8)
  diff = noisy - image.numpy()
  assert 0 < np.abs(diff).max() <= 0.8 + 1e-6  # two clipped noises of stddev < 0.2
  slices = aug.maybe_add_noise(image[..., :3], [8, 8, 3], 1, 4, 1.0, 0.2)
  assert slices.shape == (8, 8, 3)


def test_corruption_keeps_the_lesion_and_zeros_some_other_voxels():
  image, label = _volume()
  tf.random.set_seed(3)
  out = aug.image_corruption(image, label, 8, 0.5, 0.0).numpy()
  lesion = label.numpy() == 2
  np.testing.assert_array_equal(out[lesion], image.numpy()[lesion])
  zeroed = np.mean(out[~lesion] == 0)
  assert 0.3 < zeroed < 0.7
  kept = out[~lesion] != 0
  np.testing.assert_array_equal(out[~lesion][kept], image.numpy()[~lesion][kept])


def test_intensity_shift_scales_each_class_by_one_factor():
  image, label = _volume()
  tf.random.set_seed(5)
  out = aug.intensity_shift(image, label, 0.05, 0.2).numpy()
  ratio = out / image.numpy()
  lesion = label.numpy() == 2
  assert np.ptp(ratio[lesion]) < 1e-5 and np.ptp(ratio[~lesion]) < 1e-5
  assert ratio[lesion][0] > 1.0 > ratio[~lesion][0]


def test_projective_transform_keeps_label_classes():
  image, label = _volume()
  tf.random.set_seed(2)
  x, y = aug.projective_transform(image, label, 8, 0.1, 0.1)
  assert x.shape == y.shape == (8, 8, 8)
  assert set(np.unique(y.numpy())) <= {0.0, 1.0, 2.0}  # nearest neighbour
  x2, y2 = aug.projective_transform(image[..., :3], label[..., :3], 8, 0.1, 0.1,
                                    sampled_2d_slices=True)
  assert x2.shape == (8, 8, 3) and set(np.unique(y2.numpy())) <= {0.0, 1.0, 2.0}


def test_fake_lesions_replace_the_real_ones():
  image, label = _volume(reso=32)
  tf.random.set_seed(0)
  x, y = aug.maybe_gen_fake_data_based_on_real_data(image, label, 32, 0.05, 1.0)
  y = y.numpy()
  assert set(np.unique(y)) <= {0.0, 1.0, 2.0}
  np.testing.assert_array_equal(y == 0, label.numpy() == 0)  # the organ stays
  assert (y == 2).any() and not np.array_equal(y == 2, label.numpy() == 2)
  assert x.shape == (32, 32, 32)
  same_x, same_y = aug.maybe_gen_fake_data_based_on_real_data(image, label, 32, 0.05, 0.0)
  np.testing.assert_array_equal(same_y, label)
  np.testing.assert_array_equal(same_x, image)


def test_offline_augmentation_writes_the_published_format(tmp_path):
  image, label = _volume(reso=8)
  src = tmp_path / "src"
  src.mkdir()
  raw = image.numpy() * 2048.0 - 1024.0
  offline_data_aug.save_to_tfrecord(raw, label.numpy(), 0, 0, str(src), "ct")
  out = tmp_path / "out"
  with flagsaver.flagsaver(input_file_pattern=str(src / "*.tfrecords"),
                           output_folder=str(out), ct_resolution=8, num_data_aug=2,
                           process_no=3, gen_fake_probability=0.0):
    offline_data_aug.main(["offline_data_aug"])
  names = sorted(p.name for p in out.iterdir())
  assert names == ["augmented-3-0.tfrecords", "augmented-3-1.tfrecords"]
  record = next(iter(tf.data.TFRecordDataset(str(out / names[0]), compression_type="GZIP")))
  feature = tf.train.Example.FromString(record.numpy()).features.feature
  got = np.frombuffer(feature["image/ct_image"].bytes_list.value[0], np.float32)
  np.testing.assert_allclose(got, np.clip(raw / 1024.0 + 0.5, 0, 1).ravel(), atol=1e-6)
  got_label = np.frombuffer(feature["image/label"].bytes_list.value[0], np.float32)
  np.testing.assert_array_equal(got_label, label.numpy().ravel())
  with flagsaver.flagsaver(input_file_pattern=str(tmp_path / "none*"), output_folder=str(out)):
    with pytest.raises(ValueError, match="input_file_pattern=.*matches no file"):
      offline_data_aug.apply_data_aug()


def test_fake_data_with_probability_zero_on_a_tiny_volume_is_the_identity():
  # The original's own case: a 2x2x2 volume with reso=32.
  image = tf.constant([[[-100, 2], [2, 3]], [[4, 35], [-1024, 7]]], tf.float32)
  label = tf.constant([[[0, 0], [0, 1]], [[1, 1], [2, 2]]], tf.float32)
  x, y = aug.maybe_gen_fake_data_based_on_real_data(image, label, reso=32,
                                                    min_fake_lesion_ratio=0.0,
                                                    gen_fake_probability=0.0)
  np.testing.assert_array_equal(x, image)
  np.testing.assert_array_equal(y, label)
