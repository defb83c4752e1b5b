"""The original's experimental input readers and executor in TF2: the
placement reader hands each device its slice of every batch; the executor
trains, checkpoints, resumes and evaluates the U-Net on local devices; the
TPU-infeed pieces raise one error naming the TF2 replacement."""

from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf
from absl.testing import flagsaver

import mesh_tensorflow as mtf
from mesh_tensorflow.experimental import _flag_specs
from mesh_tensorflow.experimental import input_reader
from mesh_tensorflow.experimental import model_executor
from mesh_tensorflow.experimental import offline_data_aug
import mtf_test_utils as U


@pytest.fixture(scope="module", autouse=True)
def defined_flags():
  """The modules' absl flags, defined for these tests and removed after them
  (programs imported later in this process may define the same names)."""
  names = model_executor.define_flags()
  yield names
  _flag_specs.forget(names)


@pytest.mark.parametrize("cls", [input_reader.SimdMeshImplInputReader,
                                 input_reader.SubBatchSlicer, input_reader.ProcessDevices])
def test_tpu_infeed_pieces_name_the_replacement(cls):
  with pytest.raises(NotImplementedError, match="mtf.training.Trainer"):
    cls(None, None, None)


def test_executor_on_tpu_names_the_replacement():
  with pytest.raises(NotImplementedError, match="--use_tpu=false.*mtf.training.Trainer"):
    model_executor.MeshContext(None, True, "all:8", "")
  with flagsaver.flagsaver(use_tpu=True):
    with pytest.raises(NotImplementedError, match="TensorFlow 2 does not have"):
      model_executor.train_and_eval()


def test_mesh_context_places_the_mesh_on_local_devices():
  ctx = model_executor.MeshContext(None, False, "rows:2;cols:4", "image_nx_block:rows")
  graph, mesh, impl = ctx.create_graph_mesh_and_mesh_impl()
  assert isinstance(graph, mtf.Graph) and mesh.graph is graph
  assert impl is ctx.mesh_impl and impl.size == ctx.num_cores == 8 and ctx.num_hosts == 1
  with pytest.raises(ValueError, match="needs 16 devices, this machine has 8"):
    model_executor.MeshContext(None, False, "rows:4;cols:4", "")


def _examples():
  x = np.arange(5 * 6, dtype=np.float32).reshape(5, 6)
  y = np.arange(5, dtype=np.float32) * 10
  return x, y, lambda: tf.data.Dataset.from_tensor_slices((x, y))


def test_placement_reader_gives_each_device_its_slice():
  x, y, creator = _examples()
  shapes = [mtf.convert_to_shape("batch:2;cols:6"), mtf.convert_to_shape("batch:2")]
  impl = U.make_impl("rows:2;cols:2", "batch:rows;cols:cols")
  reader = input_reader.PlacementMeshImplInputReader(impl, creator, shapes)
  reader.initialize(sess=None)

  def model_fn(images, labels):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "m")
    a = mtf.import_laid_out_tensor(mesh, images, shapes[0]) * 2.0
    b = mtf.import_laid_out_tensor(mesh, labels, shapes[1]) + 1.0
    first = [t.shape.as_list() for t in images.tensor_list]
    lowering = mtf.Lowering(graph, {mesh: impl})
    return lowering.export_to_tf_tensor(a), lowering.export_to_tf_tensor(b), first

  step = tf.function(lambda: reader.gpu_placement(model_fn), autograph=False)
  a, b, slice_shapes = step()
  assert slice_shapes == [[1, 3]] * 4  # batch over rows, cols over cols
  np.testing.assert_array_equal(a, x[:2] * 2.0)
  np.testing.assert_array_equal(b, y[:2] + 1.0)
  a, b, _ = step()
  np.testing.assert_array_equal(a, x[2:4] * 2.0)
  # Training drops the short last batch; evaluation pads it with zeros.
  assert len(list(reader.dataset)) == 2
  eval_reader = input_reader.PlacementMeshImplInputReader(impl, creator, shapes,
                                                          is_eval_mode=True)
  batches = list(eval_reader.dataset)
  assert len(batches) == 3
  np.testing.assert_array_equal(batches[2][0], np.stack([x[4], np.zeros(6, np.float32)]))


def test_placement_reader_rejects_bad_arguments():
  _, _, creator = _examples()
  with pytest.raises(TypeError, match="needs a PlacementMeshImpl.*mtf.training.Trainer"):
    input_reader.PlacementMeshImplInputReader(object(), creator, ["batch:2"])
  impl = U.make_impl("all:2", "batch:all")
  with pytest.raises(ValueError, match="must start with the batch dimension"):
    input_reader.PlacementMeshImplInputReader(impl, creator, ["batch:2;cols:6", "other:2"])


def _write(directory, count, raw):
  rng = np.random.RandomState(0)
  for i in range(count):
    image = rng.uniform(size=(8, 8, 8)).astype(np.float32)
    label = np.zeros((8, 8, 8), np.float32)
    label[2:6, 2:6, 2:6] = 1.0
    label[3:5, 3:5, 3:5] = 2.0
    image[label == 2] += 1.0
    offline_data_aug.save_to_tfrecord(image * 1024.0 - 512.0 if raw else image / 2.0, label,
                                      0, i, str(directory), "raw" if raw else "train")


def test_train_and_eval_trains_checkpoints_resumes_and_saves_predictions(tmp_path):
  _write(tmp_path, 3, raw=False)
  _write(tmp_path, 2, raw=True)
  settings = dict(
      use_tpu=False, ct_resolution=8, image_nx_block=2, image_ny_block=2, network_depth=2,
      n_conv_per_block=1, n_base_filters=2, batch_size_train=2, batch_size_eval=2,
      mtf_dtype="float32", dropout_keep_p=1.0, lr=0.05, num_training_loops=1,
      num_train_iterations_per_loop=3, num_eval_iterations_per_loop=1,
      train_file_pattern=str(tmp_path / "train-*"), eval_file_pattern=str(tmp_path / "raw-*"),
      checkpoint_dir=str(tmp_path / "ckpt"), pred_output_dir=str(tmp_path / "preds"),
      save_checkpoints_steps=100, write_summary=True,
      summary_dir=str(tmp_path / "tb"), n_dataset_read_interleave=1,
      n_dataset_processes=1)
  lines = []
  with flagsaver.flagsaver(**settings):
    split = model_executor.MeshContext(None, False, "all:2", "image_ny_block:all")
    result = model_executor.train_and_eval(split, log=lines.append)
    assert len(result["train_losses"]) == 3
    assert all(np.isfinite(result["train_losses"]))
    assert {"loss", "accuracy_of_all_classes", "dice_global", "dice_per_case"} <= set(result)
    assert "train step 3: loss" in lines[2]
    preds = sorted(os.listdir(tmp_path / "preds"))
    assert preds == ["label_3_0.npy", "label_3_1.npy", "pred_lesion_3_0.npy",
                     "pred_lesion_3_1.npy", "pred_liver_3_0.npy", "pred_liver_3_1.npy"]
    assert np.load(tmp_path / "preds" / "pred_liver_3_0.npy").shape == (4, 4, 4)
    assert any(name.startswith("events.") for name in os.listdir(tmp_path / "tb"))
    # A second run resumes from the checkpoint, on another mesh.
    lines.clear()
    with flagsaver.flagsaver(num_train_iterations_per_loop=1, num_eval_iterations_per_loop=0):
      single = model_executor.MeshContext(None, False, "all:1", "")
      again = model_executor.train_and_eval(single, log=lines.append)
  assert any(line.startswith("restored") and "(step 3)" in line for line in lines)
  assert "train step 4: loss" in [l for l in lines if l.startswith("train step")][0]
  assert len(again["train_losses"]) == 1


def test_the_unet_is_a_model_fn_of_the_tf2_trainer():
  from mesh_tensorflow.experimental import unet  # pylint: disable=import-outside-toplevel
  settings = dict(ct_resolution=8, image_nx_block=2, image_ny_block=2, network_depth=2,
                  n_conv_per_block=1, n_base_filters=2, batch_size_train=2, batch_size_eval=2,
                  mtf_dtype="float32", dropout_keep_p=1.0, with_batch_norm=False,
                  sampled_2d_slices=False, image_c=1)
  with flagsaver.flagsaver(**settings):
    image_shape, label_shape = unet.get_input_mtf_shapes("train")
    impl = U.make_impl("rows:2;cols:2", "image_nx_block:rows;image_ny_block:cols")

    def model_fn(mesh, features, mode):
      _, loss, metrics, _ = unet.unet_with_spatial_partition(
          mesh, impl, mode, features["image"], features["label"])
      return loss, {"accuracy": metrics["accuracy_of_all_classes"]}

    rng = np.random.RandomState(0)
    labels = np.zeros((2, 8, 8, 8), np.int64)
    labels[:, 2:6, 2:6, 2:6] = 1
    labels[:, 3:5, 3:5, 3:5] = 2
    images = (labels / 2.0 + rng.normal(0, 0.05, labels.shape)).astype(np.float32)
    batch = {"image": images.reshape(image_shape.to_integer_list()),
             "label": np.eye(3, dtype=np.float32)[labels].reshape(
                 label_shape.to_integer_list())}
    trainer = mtf.training.Trainer(model_fn, {"image": image_shape, "label": label_shape},
                                   impl, mtf.optimize.AdafactorOptimizer(learning_rate=0.05),
                                   log_every=0)
    history = trainer.train(tf.data.Dataset.from_tensors(batch).repeat(), steps=6)
  losses = history["loss"]
  assert len(losses) == 6 and all(np.isfinite(losses))
  assert losses[-1] < losses[0], losses


def test_flags_are_defined_on_demand_and_leave_other_programs_theirs(defined_flags):
  assert {"use_tpu", "lr", "ct_resolution", "network_depth"} <= set(defined_flags)
  from absl import flags  # pylint: disable=import-outside-toplevel
  own = flags.FlagValues()
  flags.DEFINE_string("mesh_shape", "x:1", "a program's own flag", flag_values=own)
  names = model_executor.define_flags(own)
  assert "mesh_shape" not in names and "lr" in names
  assert own["mesh_shape"].value == "x:1"
