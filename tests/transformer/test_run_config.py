"""The transformer run's settings: `run_config.RunConfig` as gin binds it,
the forms `resolved()` accepts, the ignored parameters, and `run` as a front
over one function per mode."""

import dataclasses
import inspect

from absl import logging
import pytest

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import application
from mesh_tensorflow.transformer import gin_config
from mesh_tensorflow.transformer import run_config
from mesh_tensorflow.transformer import vocabulary as vocabulary_lib
from mesh_tensorflow.transformer.run_config import RunConfig


@pytest.fixture(autouse=True)
def _clean_gin():
  gin_config.parse([], [], defaults=False)
  yield
  gin_config.parse([], [], defaults=False)


@pytest.mark.parametrize("spelling", ["run", "utils.run", "mesh_tensorflow.transformer.utils.run"])
def test_every_gin_spelling_binds_the_config(spelling):
  gin_config.parse([], [f"{spelling}.train_steps = 7", f"{spelling}.tpu = 'grpc://x'"],
                   defaults=False)
  config = RunConfig(model_dir=None)
  assert config.train_steps == 7 and config.tpu == "grpc://x"
  assert RunConfig(model_dir=None, train_steps=3).train_steps == 3  # an argument wins


def test_a_misspelt_parameter_is_an_error_that_suggests_the_name():
  with pytest.raises(ValueError, match="did you mean 'train_steps'"):
    gin_config.parse([], ["run.train_stesp = 7"], defaults=False)


def test_resolved_turns_the_alternative_forms_into_canonical_ones():
  config = RunConfig(
      model_dir=None, mode="perplexity_eval", sequence_length=64,
      mesh_shape=mtf.Shape([mtf.Dimension("batch", 4), mtf.Dimension("model", 2)]),
      layout_rules="ensemble:ensemble;batch:batch", batch_size=("tokens_per_replica", 128),
      train_steps=run_config.auto_train_steps, save_checkpoints_steps=7,
      keep_checkpoint_max=2, perplexity_eval_steps=5)
  resolved = config.resolved()
  assert resolved.mode == "eval"
  assert resolved.sequence_length == {"inputs": 64, "targets": 64}
  assert resolved.mesh_shape == "batch:4;model:2"
  assert resolved.layout_rules == "batch:batch"
  assert resolved.batch_size == 8  # 128 tokens = 2 sequences per replica, 4 replicas
  assert resolved.train_steps == 2 ** 36 // (8 * 64)
  assert (resolved.checkpoint_every, resolved.keep_checkpoints, resolved.eval_steps) == (7, 2, 5)
  assert isinstance(resolved.vocabulary, vocabulary_lib.ByteVocabulary)
  assert (resolved.beam_size, resolved.alpha) == (1, 0.6)
  assert resolved.resolved() == resolved  # resolving twice changes nothing


def test_ignored_parameters_are_listed_once_with_their_reasons(monkeypatch):
  reasons = RunConfig.ignored_parameters()
  assert len(reasons) == 19 and all(reasons.values())
  assert {"tpu", "iterations_per_loop", "train_dataset_fn"} <= set(reasons)
  warnings = []
  monkeypatch.setattr(logging, "warning", lambda msg, *args: warnings.append(msg % args))
  resolved = RunConfig(model_dir=None, tpu="grpc://x", autostack=True).resolved()
  assert len(warnings) == 1
  assert "tpu='grpc://x' (a TPU setting" in warnings[0] and "autostack=True" in warnings[0]
  assert resolved.ignored_settings() == {}
  resolved.resolved()
  assert len(warnings) == 1


@pytest.mark.parametrize("setting, message", [
    ({"mode": "predict"}, "mode must be one of"),
    ({"variable_filter": "encoder"}, "run.variable_filter"),
    ({"train_steps": -5}, "run.train_steps = -5"),
    ({"vocabulary": (vocabulary_lib.ByteVocabulary(), vocabulary_lib.ByteVocabulary())},
     "separate inputs and targets vocabularies"),
])
def test_resolved_rejects_settings_that_cannot_work(setting, message):
  with pytest.raises(ValueError, match=message):
    RunConfig(model_dir=None, **setting).resolved()


def test_run_is_a_front_with_one_function_per_mode():
  assert set(application.MODE_FUNCTIONS) == set(run_config.MODES)
  assert list(inspect.signature(application.run).parameters) == [
      f.name for f in dataclasses.fields(RunConfig)]
  with pytest.raises(TypeError, match="no_such_setting"):
    application.run(None, no_such_setting=1)


@pytest.mark.parametrize("files, bindings, mode, expected", [
    # Unset: infer decodes greedily over all tokens, as the original; the
    # samples after training use 0.6 and the 40 most likely tokens.
    (["models/tiny_lm.gin"], [], "infer", (0.0, -1)),
    (["models/tiny_lm.gin"], [], "train", (0.6, 40)),
    # The original's bindings of the decoding methods (T5's sample_decode.gin).
    (["models/tiny_lm.gin"], ["Unitransformer.sample_autoregressive.temperature = 1.0"],
     "infer", (1.0, -1)),
    (["models/tiny_bi.gin"], ["Bitransformer.decode.temperature = 0.5",
                              "Bitransformer.decode.sampling_keep_top_k = 7"], "infer", (0.5, 7)),
    # run's own bindings win.
    (["models/tiny_bi.gin"], ["Bitransformer.decode.temperature = 0.5",
                              "run.temperature = 0.25", "run.top_k = 3"], "infer", (0.25, 3)),
])
def test_decoding_temperature_and_top_k_defaults(files, bindings, mode, expected):
  gin_config.parse(files, bindings)
  config = RunConfig(None, mode=mode).resolved()
  assert (config.temperature, config.top_k) == expected


@pytest.mark.parametrize("steps, message", [
    ("all", "eval_checkpoint_step = 'all': .* has no checkpoint"),
    (-1, "eval_checkpoint_step = -1: .* has no checkpoint"),
    ("latest", "give a step, a list of steps, 'all' or -1"),
    ([5], "eval_checkpoint_step = 5: .* has no checkpoint of that step"),
])
def test_checkpoint_steps_that_name_nothing_are_one_clear_error(tmp_path, steps, message):
  with pytest.raises(ValueError, match=message):
    application.checkpoints_at(str(tmp_path), steps)


@pytest.mark.parametrize("original, mode", [
    ("perplexity_eval", "eval"), ("score_eval", "eval"), ("score_from_strings", "score"),
    ("score_from_dataset", "score")])
def test_the_originals_mode_names(original, mode):
  gin_config.parse(["models/tiny_lm.gin"], [f"utils.run.mode = '{original}'"])
  assert RunConfig(None).resolved().mode == mode


def test_the_operative_config_never_asks_a_later_run_to_start_afresh(tmp_path):
  gin_config.parse(["models/tiny_lm.gin"], ["run.fresh = True", "run.train_steps = 7"])
  RunConfig(None)  # uses run's parameters, as a run does
  path = application.write_operative_config(str(tmp_path))
  text = open(path).read()
  assert "run.train_steps = 7" in text and "run.fresh = False" in text
  assert "run.fresh = True" not in text
  gin_config.parse([path])
  assert RunConfig(None).fresh is False
