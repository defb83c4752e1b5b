"""Input files and settings of the transformer's infer/score, checked where
they enter (mesh_tensorflow.transformer.inference, utils.check_settings)."""

import os

import numpy as np
import pytest
import tensorflow as tf

from mesh_tensorflow.transformer import inference
from mesh_tensorflow.transformer import run_config
from mesh_tensorflow.transformer import transformer
from mesh_tensorflow.transformer import transformer_layers
from mesh_tensorflow.transformer import utils
from mesh_tensorflow.transformer import vocabulary


def test_undecodable_line_names_file_line_and_byte(tmp_path):
  path = tmp_path / "in.txt"
  path.write_bytes("ok\ncaf\u00e9\n".encode("latin-1"))
  with pytest.raises(ValueError) as info:
    inference.read_lines(str(path))
  message = str(info.value)
  for part in (str(path), "line 2", "0xe9", "column 4", "--input_encoding",
               "--input_errors=replace"):
    assert part in message
  assert inference.read_lines(str(path), encoding="latin-1") == ["ok", "caf\u00e9"]
  assert inference.read_lines(str(path), errors="replace") == ["ok", "caf\ufffd"]
  assert inference.read_lines(str(path), errors="ignore") == ["ok", "caf"]


def test_bad_encoding_missing_file_and_directory(tmp_path):
  path = tmp_path / "in.txt"
  path.write_text("a\n")
  with pytest.raises(ValueError, match="'klingon'"):
    inference.read_lines(str(path), encoding="klingon")
  with pytest.raises(ValueError, match="'loud'"):
    inference.read_lines(str(path), errors="loud")
  with pytest.raises(FileNotFoundError) as info:
    inference.read_lines(str(tmp_path / "missing.txt"))
  assert info.value.filename.endswith("missing.txt")
  with pytest.raises(IsADirectoryError):
    inference.read_lines(str(tmp_path))
  with pytest.raises(ValueError, match="--input_file"):
    inference.read_input_file("score", None)


def test_empty_input_gives_empty_output_file(tmp_path):
  empty = tmp_path / "empty.txt"
  empty.write_bytes(b"")
  assert inference.read_lines(str(empty)) == []
  out = tmp_path / "empty.txt.outputs"
  inference.write_lines(str(out), [])
  assert out.exists() and out.read_bytes() == b""


def test_long_prompt_keeps_its_end_and_room_to_generate():
  vocab = vocabulary.ByteVocabulary()
  length, decode_length = 16, 4
  keep = inference.prompt_room(length, decode_length)
  assert keep == 12
  prompt = "abcdefghijklmnopqrstuvwxyz"
  ids, lengths = inference.encode_batch(vocab, [prompt, "hi"], length, 2, append_eos=False,
                                        keep_last=keep)
  assert lengths == [12, 2]
  assert vocab.decode(ids[0, :12].tolist()) == prompt[-12:]
  assert (ids[0, 12:] == 0).all()  # room to generate
  assert inference.prompt_room(8, 100) == 4  # at most half the length is generated


@pytest.mark.parametrize("settings, culprit", [
    ({"train_steps": -5}, "run.train_steps = -5"),
    ({"train_steps": 0}, "run.train_steps = 0"),
    ({"batch_size": 0}, "run.batch_size = 0"),
    ({"eval_steps": -1}, "run.eval_steps = -1"),
    ({"grad_accum_steps": 0}, "run.grad_accum_steps = 0"),
    ({"eval_every": -1}, "run.eval_every = -1"),
    ({"batch_size": 2.5}, "run.batch_size = 2.5"),
])
def test_check_settings_names_the_setting(settings, culprit):
  with pytest.raises(ValueError) as info:
    utils.check_settings("train", **settings)
  assert culprit in str(info.value)


def test_check_settings_accepts_sane_values():
  utils.check_settings("train", sequence_length={"inputs": 8, "targets": 8}, batch_size=8,
                       train_steps=1, eval_every=0, checkpoint_every=0, log_every=0)
  utils.check_settings("eval", train_steps=-5)  # not used outside training
  with pytest.raises(ValueError, match="sequence_length"):
    utils.check_settings("eval", sequence_length={"inputs": 0, "targets": 8})


@pytest.mark.parametrize("make, message", [
    (lambda: transformer_layers.DenseReluDense(hidden_size=0),
     "DenseReluDense: hidden_size must be a positive integer, got 0"),
    (lambda: transformer_layers.SelfAttention(key_value_size=0),
     "SelfAttention: key_value_size must be a positive integer, got 0"),
    (lambda: transformer_layers.SelfAttention(key_value_size=64.5),
     "SelfAttention: key_value_size must be a positive integer, got 64.5"),
    (lambda: transformer.Unitransformer(transformer.LayerStack([]), d_model=0,
                                        input_vocab_size=8, output_vocab_size=8),
     "Unitransformer: d_model must be a positive integer, got 0"),
])
def test_zero_sized_model_dimensions_are_refused_where_the_layer_is_made(make, message):
  """A d_model, d_ff or d_kv of 0 builds a model that computes nothing (or
  divides by zero in its initializer): one error naming the layer."""
  with pytest.raises(ValueError, match=message):
    make()


def test_sizes_given_as_numpy_integers_are_accepted():
  assert transformer_layers.DenseReluDense(hidden_size=np.int64(8)).hidden_size == 8
  assert transformer_layers.SelfAttention(key_value_size=np.int32(4)) is not None


@pytest.mark.parametrize("value", ["float8", "int8", 16])
def test_activation_dtypes_other_than_the_three_are_refused_by_name(value):
  with pytest.raises(ValueError, match=r"run.activation_dtype = .*: use one of float32, "
                     "bfloat16, float16"):
    run_config.float_dtype_name(value)
  with pytest.raises(ValueError, match=r"utils.get_variable_dtype.activation_dtype = "):
    run_config.get_variable_dtype(activation_dtype=value)
  assert run_config.float_dtype_name(tf.bfloat16) == "bfloat16"
