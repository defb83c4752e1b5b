"""The original's Estimator-era entry points of transformer/utils.py
(compat/transformer/): get_estimator, train_model, decode_from_file,
score_from_strings, eval_model, export_model, get_checkpoint_iterator, ..."""

import os
import subprocess
import sys

from absl.testing import flagsaver
import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import dataset as dataset_lib
from mesh_tensorflow.transformer import gin_config, transformer, utils, vocabulary

# The module's fixtures are computed once: its tests share one test worker.
pytestmark = pytest.mark.xdist_group("utils_original_entry_points")

TINY = ["num_layers = 1", "d_model = 32", "d_ff = 64", "num_heads = 2", "d_kv = 16"]
MESH, LAYOUT = "rows:2;cols:2", "batch:rows;heads:cols;d_ff:cols"
TEXTS = ["hello world", "abc abc", "def f(x):", "xyz"]
VOCAB = vocabulary.ByteVocabulary()


def lm_dataset_fn(sequence_length, vocabulary, dataset_split):
  """The original's train_dataset_fn form: unbatched examples."""
  assert dataset_split == "train"
  rows = utils.encode_inputs(TEXTS, vocabulary, "bitransformer", 4, sequence_length["targets"])
  return tf.data.Dataset.from_tensor_slices({"targets": rows})


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
  gin_config.parse(["models/tiny_lm.gin"], TINY)
  model_dir = str(tmp_path_factory.mktemp("lm"))
  length = {"targets": 16}
  est = utils.get_estimator("lm", VOCAB, MESH, LAYOUT, model_dir, 4, length,
                            save_checkpoints_steps=3, keep_checkpoint_max=5)
  history = utils.train_model(est, VOCAB, length, 4, lm_dataset_fn, 6, None)
  yield est, model_dir, history
  gin.clear_config()


def test_train_model_trains_and_checkpoints(lm):
  est, model_dir, history = lm
  assert len(history["loss"]) == 6 and history["loss"][-1] < history["loss"][0] - 0.5
  assert est.setup.feature_shapes()["targets"] == "batch:4;length:16"
  assert est.latest_checkpoint() == os.path.join(model_dir, "ckpt-6")


def test_checkpoint_iterator(lm):
  _, model_dir, _ = lm
  at = lambda s: os.path.join(model_dir, f"ckpt-{s}")
  assert list(utils.get_checkpoint_iterator("all", model_dir)) == [at(3), at(6)]
  assert list(utils.get_checkpoint_iterator("all", model_dir, skip_until=3)) == [at(6)]
  assert utils.get_checkpoint_iterator(-1, model_dir) == [at(6)]
  assert utils.get_checkpoint_iterator(4, model_dir) == [at(3)]
  assert utils.get_checkpoint_iterator([1, 5, 6], model_dir) == [at(3), at(6)]
  assert utils.get_checkpoint_iterator(3, model_dir, find_closest=False) == [at(3)]
  with pytest.raises(ValueError, match=r"not found .* has steps \[3, 6\]"):
    utils.get_checkpoint_iterator(4, model_dir, find_closest=False)
  # None waits for new checkpoints; stop_after ends it at the last one.
  assert list(utils.get_checkpoint_iterator(None, model_dir, stop_after=6)) == [at(6)]
  assert [utils.get_step_from_checkpoint_path(p)
          for p in utils.get_checkpoint_iterator("all", model_dir)] == [3, 6]


def test_score_from_strings_equals_mode_score(lm, tmp_path):
  est, model_dir, _ = lm
  texts = ["hello world", "xyz", "abc abc"]
  got = utils.score_from_strings(est, VOCAB, "lm", 4, {"targets": 16}, model_dir, -1,
                                 None, texts, lambda r, v: [x["scores"] for x in r])
  path = tmp_path / "texts.txt"
  path.write_text("\n".join(texts) + "\n")
  utils.run(model_dir, mode="score", model_type="lm", sequence_length={"targets": 16},
            batch_size=4, mesh_shape=MESH, layout_rules=LAYOUT, input_file=str(path),
            output_file=str(tmp_path / "scores"))
  expected = [float(x) for x in (tmp_path / "scores").read_text().split()]
  np.testing.assert_allclose(got, expected, atol=1e-4)
  assert all(s < 0 for s in got)
  # The same scores through compute_log_likelihoods and score_with_estimator.
  rows = {"targets": utils.encode_inputs(texts, VOCAB, "bitransformer", 1, 16)}
  input_fn = lambda params: tf.data.Dataset.from_tensor_slices(rows).batch(4)
  np.testing.assert_allclose(utils.compute_log_likelihoods(est, input_fn), got, atol=1e-4)
  outputs, results = utils.score_with_estimator(est, input_fn, 6, model_dir, VOCAB,
                                                lambda r, v: [x["scores"] for x in r])
  np.testing.assert_allclose(outputs, got, atol=1e-4)
  assert len(results) == 3 and list(results[0]["targets"][:2]) == [ord("h") + 3, ord("e") + 3]
  # Without the final EOS the score is higher (one log-probability fewer).
  no_eos = utils.score_from_strings(est, VOCAB, "lm", 4, {"targets": 16}, model_dir, -1,
                                    None, texts, lambda r, v: [x["scores"] for x in r],
                                    score_eos=False)
  assert all(a > b for a, b in zip(no_eos, got))
  # save_scores writes the scores, targets and lengths.
  prefix = str(tmp_path / "saved")
  scores, targets = utils.score_from_strings(
      est, VOCAB, "lm", 4, {"targets": 16}, model_dir, -1, None, texts,
      lambda r, v: utils.save_scores(r, v, prefix))
  assert targets == texts
  np.testing.assert_allclose(scores, got, atol=1e-4)
  assert (tmp_path / "saved.targets").read_text().splitlines() == texts
  assert (tmp_path / "saved.lengths").read_text().split() == ["12", "4", "8"]
  np.testing.assert_allclose([float(x) for x in (tmp_path / "saved.scores").read_text().split()],
                             got, rtol=1e-5)


def test_decode_from_file_and_infer_model(lm, tmp_path):
  est, model_dir, _ = lm
  prompts = tmp_path / "prompts.txt"
  prompts.write_text("hel\nab\n")
  out = utils.decode_from_file(est, VOCAB, "lm", 4, {"inputs": 16, "targets": 16}, None,
                               str(prompts), str(tmp_path / "dec"))
  assert out == str(tmp_path / "dec") + "-6"
  decodes = open(out).read().split("\n")[:-1]
  assert len(decodes) == 2
  # The same as --mode=infer (greedy, the whole targets length).
  utils.run(model_dir, mode="infer", model_type="lm", sequence_length={"targets": 16},
            batch_size=4, mesh_shape=MESH, layout_rules=LAYOUT, input_file=str(prompts),
            output_file=str(tmp_path / "infer"), temperature=0.0, decode_length=16)
  assert decodes == (tmp_path / "infer").read_text().split("\n")[:-1]
  # decode over an input_fn of ids gives the same texts.
  ids = utils.encode_inputs(["hel", "ab"], VOCAB, "lm", 2, 16)
  got = list(utils.decode(est, lambda p: tf.data.Dataset.from_tensors({"inputs": ids}), VOCAB))
  assert got == decodes
  # infer_model: one decode file per checkpoint.
  files = utils.infer_model(
      est, VOCAB, {"targets": 16}, 4, "lm", model_dir, "all",
      decode_fn=lambda e, **kw: utils.decode_from_file(
          e, input_filename=str(prompts), output_filename=str(tmp_path / "all"), **kw))
  assert files == [str(tmp_path / "all-3"), str(tmp_path / "all-6")]
  assert open(files[1]).read().split("\n")[:-1] == decodes


def test_eval_model_and_decode_from_dataset(lm, tmp_path):
  est, model_dir, _ = lm
  texts = ["hel", "ab"]

  def tasks(sequence_length, vocabulary, dataset_split):
    assert dataset_split == "validation"
    rows = utils.encode_inputs(texts, vocabulary, "lm", 1, sequence_length["targets"])
    ds = tf.data.Dataset.from_tensor_slices({"inputs": rows, "targets": rows})
    length = lambda targets, predictions: {"mean_length": float(np.mean(
        [len(str(p)) for p in predictions]))}
    same = lambda targets, predictions: {"n": float(len(targets))}
    return [dataset_lib.EvalDataset("copy", lambda: ds, lambda s, **kw: s, [length, same])]

  summary = str(tmp_path / "eval")
  metrics = utils.eval_model(est, VOCAB, {"targets": 16}, 4, "validation", model_dir, tasks,
                             summary, "all")
  assert sorted(metrics) == [3, 6]
  assert metrics[6]["eval/copy/n"] == 2.0
  predictions = (tmp_path / "eval" / "copy_6_predictions").read_text().split("\n")[:-1]
  assert metrics[6]["eval/copy/mean_length"] == pytest.approx(np.mean([len(p) for p in predictions]))
  assert (tmp_path / "eval" / "copy_inputs").read_text().split() == texts
  assert tf.io.gfile.glob(os.path.join(summary, "events.out.tfevents.*"))
  files = utils.decode_from_dataset(est, VOCAB, "lm", 4, {"targets": 16}, None, tasks,
                                    "validation", str(tmp_path / "dd"))
  assert files == [str(tmp_path / "dd" / "copy_6_predictions")]
  assert open(files[0]).read() == "\n".join(predictions) + "\n"
  scored = utils.eval_model(est, VOCAB, {"targets": 16}, 4, "validation", model_dir, tasks,
                            summary, -1, eval_with_score=True, output_eval_examples=False)
  assert list(scored) == [6] and scored[6]["eval/copy/n"] == 2.0


def test_export_model(lm, tmp_path):
  est, _, _ = lm
  path = utils.export_model(est, str(tmp_path / "export"), VOCAB, {"targets": 16}, "lm")
  assert path == str(tmp_path / "export" / "6")
  assert tf.io.gfile.exists(os.path.join(path, "saved_model.pb"))
  with pytest.raises(ValueError, match="not the latest"):
    utils.export_model(est, str(tmp_path / "x"), VOCAB, {"targets": 16}, "lm",
                       checkpoint_path=os.path.join(est.model_dir, "ckpt-3"))


def test_flexible_ckpt_init_mapping(lm):
  _, model_dir, _ = lm
  ckpt = os.path.join(model_dir, "ckpt-6")
  local = ["transformer/block_000/layer_000/SelfAttention/q",
           "transformer/block_000/layer_001/DenseReluDense/wi/kernel",  # new
           "transformer/block_000/layer_002/DenseReluDense/wi/kernel",
           "transformer/embedding", "transformer/new_thing"]
  fn = utils.flexible_ckpt_init_mapping(ckpt, [[1]], True, local)
  assert fn(local[0]) == local[0]
  assert fn(local[2]) == "transformer/block_000/layer_001/DenseReluDense/wi/kernel"
  assert fn("transformer/embedding") == "transformer/embedding"
  keep = utils.flexible_ckpt_init_mapping(ckpt, [[1]], False, local)
  assert [keep(n) for n in local] == [True, False, True, True, False]
  with pytest.raises(ValueError, match="checkpoint has 2 layers"):
    utils.flexible_ckpt_init_mapping(ckpt, None, True, local)


def test_bitransformer_scores_equal_mode_score(tmp_path):
  gin_config.parse(["models/tiny_bi.gin"], TINY)
  try:
    model_dir = str(tmp_path / "bi")
    length = {"inputs": 16, "targets": 16}
    est = utils.get_estimator("bitransformer", (VOCAB, VOCAB), "all:2", "batch:all",
                              model_dir, 4, length)
    assert isinstance(utils.build_model("bitransformer", 259, 259), transformer.Bitransformer)

    def pairs(sequence_length, vocabulary, dataset_split):
      del dataset_split
      rows = utils.encode_inputs(TEXTS, vocabulary, "bitransformer", 4, 16)
      return tf.data.Dataset.from_tensor_slices({"inputs": rows, "targets": rows[::-1]})

    utils.train_model(est, VOCAB, length, 4, pairs, 2, None)
    inputs, targets = ["ab", "cd"], ["x", "y", "z", "w"]  # each input has 2 targets
    got = utils.score_from_strings(est, VOCAB, "bitransformer", 4, length, model_dir, -1,
                                   inputs, targets, lambda r, v: [x["scores"] for x in r])
    path = tmp_path / "pairs.txt"
    path.write_text("ab\tx\nab\ty\ncd\tz\ncd\tw\n")
    utils.run(model_dir, mode="score", model_type="bitransformer", sequence_length=length,
              batch_size=4, mesh_shape="all:2", layout_rules="batch:all",
              input_file=str(path), output_file=str(tmp_path / "s"))
    expected = [float(x) for x in (tmp_path / "s").read_text().split()]
    np.testing.assert_allclose(got, expected, atol=1e-4)
    with pytest.raises(ValueError, match="3 inputs must divide the 4 targets"):
      utils.score_from_strings(est, VOCAB, "bitransformer", 4, length, model_dir, -1,
                               ["a", "b", "c"], targets, lambda r, v: r)
  finally:
    gin.clear_config()


def test_build_model_metrics_and_errors():
  gin_config.parse(["models/tiny_lm.gin"], TINY)
  try:
    model = utils.build_model("lm", 259, 259)
    assert isinstance(model, transformer.Unitransformer) and model.autoregressive
    assert model.output_vocab_dim.size % 8 == 0 and model.output_vocab_dim.size >= 259
    with pytest.raises(ValueError, match="model_type 'aligned' is not supported"):
      utils.build_model("aligned", 259, 259)
  finally:
    gin.clear_config()
  total, update = utils.metric_sum(tf.constant([1.0, 2.0]))
  update()
  assert float(update()) == 6.0 and float(total) == 6.0
  value, update = utils.metric_max(tf.constant([4.0, -1.0]))
  assert float(update()) == 4.0
  with pytest.raises(ValueError, match="ensembles are not supported"):
    utils.get_estimator("lm", VOCAB, "all:1", "", None, 4, 8, ensemble_inputs=2)
  with pytest.raises(TypeError, match="must be what utils.get_estimator returns"):
    utils.train_model(object(), VOCAB, 8, 4, lm_dataset_fn, 1, None)
  assert utils.FLAGS is __import__("absl.flags").flags.FLAGS


def test_parse_gin_defaults_and_flags():
  from mesh_tensorflow.transformer import main  # noqa: F401  (defines the gin flags)
  with flagsaver.flagsaver(gin_file=["models/tiny_lm.gin"], gin_param=["num_layers = 3"]):
    utils.FLAGS.mark_as_parsed()
    try:
      utils.parse_gin_defaults_and_flags(finalize_config=False)
      assert gin.query_parameter("%num_layers") == 3
      assert gin.query_parameter("run.model_type") == "lm"
    finally:
      gin.clear_config()


# A program written for the original: it reads the gin flags that importing
# `mesh_tensorflow.transformer.utils` defined.
ORIGINAL_STYLE_PROGRAM = """
from absl import app
import gin
from mesh_tensorflow.transformer import utils

def main(_):
  utils.parse_gin_defaults_and_flags()
  print("num_layers", gin.query_parameter("%num_layers"), "d_model",
        gin.query_parameter("%d_model"))

app.run(main)
"""


def test_a_program_written_for_the_original_gets_the_gin_flags(tmp_path):
  (tmp_path / "models").mkdir()
  (tmp_path / "models" / "mine.gin").write_text(
      "include 'models/tiny_lm.gin'\nd_model = 48\n")
  (tmp_path / "program.py").write_text(ORIGINAL_STYLE_PROGRAM)
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  out = subprocess.run(
      [sys.executable, str(tmp_path / "program.py"), f"--gin_location_prefix={tmp_path}",
       "--gin_file=models/mine.gin", "--gin_param=num_layers = 3"],
      cwd=root, capture_output=True, text=True, timeout=300,
      env=dict(os.environ, PYTHONPATH=root))
  assert out.returncode == 0, out.stderr[-3000:]
  assert "num_layers 3 d_model 48" in out.stdout


def test_maybe_add_pretokenized_features():
  h, i = ord("h") + 3, ord("i") + 3
  examples = [{"targets": np.array([h, i], np.int64), "inputs": np.array([i], np.int16)},
              {"inputs_pretokenized": "kept", "inputs": np.array([h])}]
  out = utils._maybe_add_pretokenized_features(examples, VOCAB)
  assert out is examples
  assert out[0]["targets_pretokenized"] == "hi" and out[0]["inputs_pretokenized"] == "i"
  assert out[1]["inputs_pretokenized"] == "kept" and "targets_pretokenized" not in out[1]
