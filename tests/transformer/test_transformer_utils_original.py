"""The original transformer/utils.py helpers served at its path
(compat/transformer/helpers.py)."""

import gin
import numpy as np
import pytest

from mesh_tensorflow.transformer import utils, vocabulary


def test_vocabulary_pairs_and_checkpoint_mapping():
  a, b = vocabulary.ByteVocabulary(), vocabulary.ByteVocabulary(extra_ids=2)
  assert utils.inputs_vocabulary((a, b)) is a and utils.targets_vocabulary((a, b)) is b
  assert utils.inputs_vocabulary(a) is a is utils.targets_vocabulary(a)
  assert utils.init_checkpoint_variable_mapping("x/y") == "x/y"
  assert utils.init_checkpoint_variable_mapping("x/y", lambda n: n.upper()) == "X/Y"
  assert utils.should_load_variable("w") is True
  assert utils.should_load_variable("w", lambda n: n != "w") is False
  assert utils.variable_filter_max_size(np.zeros([10, 10]), 100)
  assert not utils.variable_filter_max_size(np.zeros([10, 11]), 100)
  gin.clear_config()
  try:
    gin.parse_config(["utils.separate_vocabularies.inputs = 1",
                      "utils.separate_vocabularies.targets = 2"])
    assert utils.separate_vocabularies() == (1, 2)
  finally:
    gin.clear_config()


def test_files_and_encoding(tmp_path):
  path = str(tmp_path / "lines.txt")
  utils.write_lines_to_file(["a", "b\nc", 3, "# note", ""], path)
  assert open(path).read() == "a\nb c\n3\n# note\n\n"
  assert utils.get_inputs_from_file(path) == ["a", "b c", "3", "# note"]
  assert utils.get_inputs_from_file(path, ignore_comments=True) == ["a", "b c", "3"]
  vocab = vocabulary.ByteVocabulary()
  h, i = ord("h") + 3, ord("i") + 3
  assert utils.encode_inputs(["hi", "i"], vocab, "lm", 4, 3).tolist() == \
      [[h, i, 0], [i, 0, 0], [h, i, 0], [h, i, 0]]
  assert utils.encode_inputs(["hi"], vocab, "bitransformer", 1, 2).tolist() == [[h, i]]
  assert utils.encode_inputs(["hi"], vocab, "bitransformer", 1, 4, unscored_prefix=["i"]) \
      .tolist() == [[-i, h, i, 1]]
  assert utils.encode_delimited_lm(["h"], ["i"], vocab, 1, 5).tolist() == [[h, 1, i, 1, 0]]
  assert utils.encode_delimited_lm(["h"], ["i"], vocab, 1, 3, include_final_eos=False) \
      .tolist() == [[h, 1, i]]


def test_steps_batch_sizes_and_estimator_errors():
  assert utils.get_step_from_checkpoint_path("/m/model.ckpt-1200.index") == 1200
  assert utils.get_step_from_checkpoint_path("/m/ckpt-7") == 7
  with pytest.raises(ValueError, match="names no checkpoint step"):
    utils.get_step_from_checkpoint_path("/m/final")
  length = {"inputs": 512, "targets": 128}
  assert utils.compute_batch_size(length, "rows:2;cols:4", "batch:rows",
                                  ("tokens_per_replica", 1024)) == 4
  assert utils.compute_batch_size(length, "all:8", "batch:all",
                                  ("sequences_per_replica", 3)) == 24
  assert utils.compute_batch_size(length, "all:8", "", ("tokens_per_batch", 2048)) == 4
  assert utils.compute_batch_size(length, "all:8", "", ("sequences_per_batch", 5)) == 5
  with pytest.raises(ValueError, match="not a (multiple|whole number)"):
    utils.compute_batch_size(length, "all:8", "", ("tokens_per_batch", 1000))
  assert utils.auto_train_steps(128, length, 2 ** 26) == 1024
  with pytest.raises(ValueError, match="model_type 'model' is not supported"):
    utils.get_estimator("model", None, "all:1", "", None, None, {"targets": 8})
