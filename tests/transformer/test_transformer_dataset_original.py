"""The original Mesh TensorFlow's transformer/dataset.py functions, against
hand-computed rows."""

import sys

import gin
import numpy as np
import pytest
import tensorflow as tf

from mesh_tensorflow.transformer import dataset
from mesh_tensorflow.transformer import vocabulary


def ids_dataset(rows, names=("inputs", "targets"), dtype=tf.int32):
  return tf.data.Dataset.from_generator(
      lambda: iter(rows), output_signature={n: tf.TensorSpec([None], dtype) for n in names})


def as_lists(ds):
  return [{k: v.tolist() for k, v in row.items()} for row in ds.as_numpy_iterator()]


def test_pack_dataset_matches_the_originals_example():
  rows = [{"inputs": [7, 8, 5, 1], "targets": [3, 9, 1], "idx": [0]},
          {"inputs": [8, 4, 9, 3, 1], "targets": [4, 1], "idx": [1]}]
  ds = dataset.pack_dataset(ids_dataset(rows, ("inputs", "targets", "idx")),
                            length={"inputs": 10, "targets": 7}, keys=("inputs", "targets"))
  assert ds.element_spec["inputs"].shape == [10]
  assert as_lists(ds) == [{
      "inputs": [7, 8, 5, 1, 8, 4, 9, 3, 1, 0],
      "inputs_segmentation": [1, 1, 1, 1, 2, 2, 2, 2, 2, 0],
      "inputs_position": [0, 1, 2, 3, 0, 1, 2, 3, 4, 0],
      "targets": [3, 9, 1, 4, 1, 0, 0],
      "targets_segmentation": [1, 1, 1, 2, 2, 0, 0],
      "targets_position": [0, 1, 2, 0, 1, 0, 0]}]


def test_pack_dataset_flushes_each_group_of_max_length_examples():
  # length 3: groups of 3 examples; [9] is in the second group, so it starts
  # a new row although it would fit after [8].
  rows = [{"targets": [5, 6]}, {"targets": [7]}, {"targets": [8]}, {"targets": [9]}]
  out = as_lists(dataset.pack_dataset(ids_dataset(rows, ("targets",), tf.int64), 3))
  assert [r["targets"] for r in out] == [[5, 6, 7], [8, 0, 0], [9, 0, 0]]
  assert [r["targets_segmentation"] for r in out] == [[1, 1, 2], [1, 0, 0], [1, 0, 0]]
  assert [r["targets_position"] for r in out] == [[0, 1, 0], [0, 0, 0], [0, 0, 0]]
  assert all(isinstance(v, list) for r in out for v in r.values())
  assert dataset.pack_dataset(ids_dataset(rows, ("targets",), tf.int64), 3) \
      .element_spec["targets"].dtype == tf.int32


def test_pack_dataset_drops_padding_and_numbers_only_examples_with_tokens():
  rows = [{"inputs": [5, 0, 0], "targets": [6]},
          {"inputs": [], "targets": [7]},
          {"inputs": [8], "targets": [9, 1]}]
  (row,) = as_lists(dataset.pack_dataset(ids_dataset(rows), 5))
  assert row["inputs"] == [5, 8, 0, 0, 0]
  assert row["inputs_segmentation"] == [1, 2, 0, 0, 0]
  assert row["targets"] == [6, 7, 9, 1, 0]
  assert row["targets_segmentation"] == [1, 2, 3, 3, 0]
  assert row["targets_position"] == [0, 0, 0, 1, 0]


def test_pack_dataset_bad_input_errors():
  ds = ids_dataset([{"inputs": [1], "targets": [1]}])
  with pytest.raises(ValueError, match="key 'answers' is not a feature"):
    dataset.pack_dataset(ds, 4, keys=["answers"])
  with pytest.raises(ValueError, match="no length for feature 'targets'"):
    dataset.pack_dataset(ds, {"inputs": 4})
  text = tf.data.Dataset.from_tensors({"targets": tf.constant(["a"])})
  with pytest.raises(ValueError, match="encode strings first"):
    dataset.pack_dataset(text, 4)


def test_trim_and_pad_dataset_and_ensure_eos():
  ds = tf.data.Dataset.from_generator(
      lambda: iter([{"a": [4, 5, 6], "b": [[1, 2], [3, 4], [5, 6]], "c": [9]}]),
      output_signature={"a": tf.TensorSpec([None], tf.int32),
                        "b": tf.TensorSpec([None, 2], tf.int32),
                        "c": tf.TensorSpec([None], tf.int32)})
  out = dataset.trim_and_pad_dataset(ds, {"a": 5, "b": 2}, feature_keys=["a", "b"])
  assert out.element_spec["b"].shape == [2, 2]
  (row,) = as_lists(out)
  assert row == {"a": [4, 5, 6, 0, 0], "b": [[1, 2], [3, 4]], "c": [9]}
  eos = as_lists(dataset.ensure_dataset_eos(ds.map(lambda x: {"a": x["a"], "c": x["c"]}), ["a"]))
  assert eos == [{"a": [4, 5, 1], "c": [9]}]
  kept = ids_dataset([{"inputs": [4, 0], "targets": [4, 1]}])
  assert as_lists(dataset.ensure_dataset_eos(kept)) == [{"inputs": [4, 0], "targets": [4, 1]}]


def test_pack_or_pad_packs_or_pads():
  rows = [{"inputs": [3, 4, 5, 6], "targets": [7, 1]}, {"inputs": [8, 1], "targets": [9, 1]}]
  padded = as_lists(dataset.pack_or_pad(ids_dataset(rows), {"inputs": 3, "targets": 4},
                                        pack=False, ensure_eos=["inputs"]))
  assert padded == [{"inputs": [3, 4, 1], "targets": [7, 1, 0, 0]},
                    {"inputs": [8, 1, 0], "targets": [9, 1, 0, 0]}]
  packed = as_lists(dataset.pack_or_pad(ids_dataset(rows), 6))
  assert packed[0]["inputs"] == [3, 4, 5, 6, 8, 1]
  assert packed[0]["targets_segmentation"] == [1, 1, 2, 2, 0, 0]
  # Padding passes features outside feature_keys through.
  some = as_lists(dataset.pack_or_pad(ids_dataset(rows), 5, pack=False, feature_keys=["targets"]))
  assert some[0] == {"inputs": [3, 4, 5, 6], "targets": [7, 1, 0, 0, 0]}


def test_encoding_functions():
  vocab = vocabulary.ByteVocabulary()
  strings = tf.data.Dataset.from_tensors({"inputs": tf.constant("hi"),
                                          "targets": tf.constant("a"),
                                          "score": tf.constant(0.5)})
  (row,) = as_lists(dataset.encode_all_features(strings, vocab))
  assert row == {"inputs": [ord("h") + 3, ord("i") + 3, 1], "targets": [ord("a") + 3, 1]}
  (row,) = as_lists(dataset.encode_dataset(strings.map(lambda x: {"t": x["targets"]}), vocab))
  assert row == {"t": [ord("a") + 3]}
  pairs = tf.data.Dataset.from_tensor_slices((["x"], ["y"]))
  assert list(dataset.supervised_to_dict(pairs, True).element_spec) == ["targets"]
  (row,) = list(dataset.supervised_to_dict(pairs, False).as_numpy_iterator())
  assert row == {"inputs": b"x", "targets": b"y"}


def test_packed_parallel_tsv_dataset(tmp_path):
  path = tmp_path / "pairs.tsv"
  path.write_text("ab\tc\nd\tef\ntoolong\tx\n")
  lines = dataset.simple_text_line_dataset(str(path), shuffle_buffer_size=1)
  ds = dataset.packed_parallel_tsv_dataset(lines, "train", None, 8,
                                           vocabulary.ByteVocabulary(), max_encoded_len=4)
  (row,) = as_lists(ds)
  b = lambda s: [ord(c) + 3 for c in s]  # noqa: E731
  assert row["inputs"] == b("ab") + [1] + b("d") + [1] + [0, 0, 0]
  assert row["targets"] == b("c") + [1] + b("ef") + [1] + [0, 0, 0]
  assert row["targets_segmentation"] == [1, 1, 2, 2, 2, 0, 0, 0]
  assert row["inputs_position"] == [0, 1, 2, 0, 1, 0, 0, 0]


def test_text_line_datasets(tmp_path):
  (tmp_path / "a.txt").write_text("a1\na2\n")
  (tmp_path / "b.txt").write_text("b1\n")
  lines = sorted(dataset.simple_text_line_dataset(str(tmp_path / "*.txt")).as_numpy_iterator())
  assert lines == [b"a1", b"a2", b"b1"]
  mixed = dataset.sample_from_text_line_datasets(
      [(str(tmp_path / "a.txt"), 1.0), (str(tmp_path / "b.txt"), 0.0)], shuffle_buffer_size=2,
      prefetch=1)
  assert set(mixed.take(20).as_numpy_iterator()) == {b"a1", b"a2"}
  gin.clear_config()
  try:  # the default shuffle buffer would first read 100,000 lines
    gin.parse_config(["sample_from_text_line_datasets.shuffle_buffer_size = 2",
                      "sample_from_text_line_datasets.prefetch = 1"])
    assert set(dataset.make_text_line_dataset(str(tmp_path / "b.txt")).take(3)
               .as_numpy_iterator()) == {b"b1"}
  finally:
    gin.clear_config()
  with pytest.raises(ValueError, match="no file matches"):
    dataset.simple_text_line_dataset(str(tmp_path / "missing*.txt"))


def _example(**features):
  # tf.train.Example with int64 lists, the format Tensor2Tensor wrote.
  return tf.train.Example(features=tf.train.Features(feature={
      k: tf.train.Feature(int64_list=tf.train.Int64List(value=v))
      for k, v in features.items()})).SerializeToString()


def test_pretokenized_t2t_files(tmp_path):
  path = str(tmp_path / "copy-dev-00000-of-00001")
  with tf.io.TFRecordWriter(path) as w:
    w.write(_example(inputs=[5, 6], targets=[7], other=[1, 2, 3]))
    w.write(_example(inputs=[8], targets=[9, 10]))
  ds = dataset.pretokenized_t2t_dataset("copy", False, str(tmp_path), "dev",
                                        sequence_length=6, eos_included=False, vocab_shift=1)
  (row,) = as_lists(ds)
  assert row["inputs"] == [6, 7, 1, 9, 1, 0]
  assert row["targets"] == [8, 1, 10, 11, 1, 0]
  assert row["targets_segmentation"] == [1, 1, 2, 2, 2, 0]
  lm = dataset.pretokenized_tfrecord_dataset([path], True, True, False, None, 4)
  assert [r["targets"] for r in as_lists(lm)] == [[7, 9, 10, 0]]
  with pytest.raises(ValueError, match="no file matches"):
    dataset.pretokenized_t2t_dataset("copy", False, str(tmp_path), "train", sequence_length=6)


def test_tfds_functions_say_what_to_install(monkeypatch):
  monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)
  with pytest.raises(ImportError, match="pip install tensorflow-datasets"):
    dataset.untokenized_tfds_dataset("lm1b", True, None, "train", None, 8,
                                     vocabulary.ByteVocabulary(), True)
  with pytest.raises(ImportError, match="pip install tensorflow-datasets"):
    dataset.pretokenized_tfds_dataset("lm1b", True, None, "train", None, 8)


def test_zero_padding_eval_dataset_and_gin_names():
  ds = ids_dataset([{"targets": [4, 5]}], ("targets",))
  out = as_lists(dataset.pad_dataset_with_zeroed_out_examples(ds).take(3))
  assert out == [{"targets": [4, 5]}, {"targets": [0, 0]}, {"targets": [0, 0]}]
  task = dataset.EvalDataset("t", lambda: ds, lambda s: s, [])
  assert task._fields == ("name", "dataset_fn", "postprocess_fn", "metric_fns")
  gin.clear_config()
  try:
    gin.parse_config(["pack_or_pad.pack = False",
                      "simple_text_line_dataset.shuffle_buffer_size = 3",
                      "dataset.packed_parallel_tsv_dataset.eos_id = 1"])
    rows = as_lists(dataset.pack_or_pad(ids_dataset([{"targets": [4]}], ("targets",)), 3))
    assert rows == [{"targets": [4, 0, 0]}]
  finally:
    gin.clear_config()
