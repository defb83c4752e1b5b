"""SavedModel export (`--mode=export`): a process that imports only TensorFlow
loads the SavedModel and reproduces `--mode=infer` (greedy) and `--mode=score`
of a tiny trained language model and encoder-decoder."""

import json
import os
import subprocess
import sys

import gin
import numpy as np
import pytest

from mesh_tensorflow.transformer import export
from mesh_tensorflow.transformer import gin_config
from mesh_tensorflow.transformer import inference
from mesh_tensorflow.transformer import utils
from mesh_tensorflow.transformer import vocabulary as vocabulary_lib

# The module's fixtures are computed once: its tests share one test worker.
pytestmark = pytest.mark.xdist_group("saved_model_export")

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TINY = [
    "num_layers = 1", "d_model = 32", "d_ff = 64", "num_heads = 4", "d_kv = 8",
    "run.batch_size = 8", "run.train_steps = 3", "run.eval_steps = 1", "run.log_every = 0",
    "run.checkpoint_every = 100", "run.num_samples = 0", "run.decode_length = 8",
    "run.temperature = 0.0", "dataset_fn.shuffle_buffer = 100",
    "cosine_with_warmup.warmup_steps = 0", "dataset_fn.unit = 'line'",
]
# Training runs on a 2x4 mesh; the CLI's infer and score run on one device, as
# the default export does, with batches of the same size (8 texts): the
# comparison of greedy outputs is then exact. (Another mesh or batch size may
# sum in another order, which can flip a near-tie of this barely trained model.)
LAYOUT = ["mesh_shape = 'rows:2;cols:4'", "layout = 'batch:rows;d_ff:cols;heads:cols'"]
SINGLE = ["mesh_shape = 'all:1'", "layout = ''"]
MODELS = {
    "lm": ["run.model_type = 'lm'", "run.sequence_length = {'inputs': 24, 'targets': 24}"],
    "bi": ["run.model_type = 'bitransformer'",
           "run.sequence_length = {'inputs': 16, 'targets': 12}"],
}
# Texts with a newline, a tab, non-ASCII and an empty line; one longer than
# the sequence length (cut alike).
TEXTS = ["def ", "import os\nimport sys", "", "class Café:\tpass", "x" * 40, "return ",
         "def f3(", "z"]
PAIRS = [("def add(a, b):", "Return a + b."), ("", "x"), ("é z", ""),
         ("y" * 30, "Return the sum of the values"), ("def f1(x):", "return x + 1"),
         ("def f2(x):", "return x + 3"), ("a", "b"), ("def f9(y):", "return")]


def _data_bindings(root) -> list:
  """Small training and held-out files (no stdlib corpus to scan)."""
  lines = [f"def f{i}(x):\treturn x + {i}" for i in range(64)]
  path = os.path.join(root, "data.tsv")
  with open(path, "w") as f:
    f.write("\n".join(lines) + "\n")
  return [f"dataset_fn.train_files = [{path!r}]", f"dataset_fn.eval_files = [{path!r}]"]


def _run(model, data, layout=tuple(LAYOUT), **kwargs):
  gin_config.parse([], TINY + list(layout) + MODELS[model] + data)
  try:
    return utils.run(**kwargs)
  finally:
    gin.clear_config()


class _PythonBytes(vocabulary_lib.Vocabulary):
  """The byte vocabulary's ids, encoded by Python code (as SentencePiece is)."""

  _bytes = vocabulary_lib.ByteVocabulary()
  vocab_size = 259

  def encode(self, text):
    return self._bytes.encode(text)

  def decode(self, ids):
    return self._bytes.decode(ids)

  def encode_tf(self, text):
    raise NotImplementedError

  def decode_tf(self, ids):
    raise NotImplementedError


def _cli_export(model_dir, target, data):
  """--mode=export with --export_dir and --export_mesh_shape/--export_layout."""
  command = [sys.executable, "-m", "mesh_tensorflow.transformer.main",
             f"--model_dir={model_dir}", "--mode=export", f"--export_dir={target}",
             "--export_mesh_shape=rows:2;cols:2",
             "--export_layout=batch:rows;heads:cols;d_ff:cols"]
  command += [f"--gin_param={p}" for p in TINY + LAYOUT + MODELS["lm"] + data]
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=REPO_ROOT)
  proc = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                        timeout=300, check=False)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
  return proc.stdout


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
  """Trains both models, runs the CLI modes infer and score, and exports: each
  model on the default mesh, the LM also on a 2x2 mesh (by the CLI) and with a
  vocabulary that has no TensorFlow ops."""
  root = tmp_path_factory.mktemp("export")
  data = _data_bindings(str(root))
  out = {"data": data}
  for model in MODELS:
    model_dir = str(root / model)
    _run(model, data, model_dir=model_dir, mode="train")
    inputs = str(root / f"{model}.txt")
    lines = TEXTS if model == "lm" else [p[0] for p in PAIRS]
    inference.write_lines(inputs, lines)
    _run(model, data, SINGLE, model_dir=model_dir, mode="infer", input_file=inputs)
    scored = str(root / f"{model}_pairs.txt")
    inference.write_lines(scored, TEXTS if model == "lm" else [f"{a}\t{b}" for a, b in PAIRS])
    _run(model, data, SINGLE, model_dir=model_dir, mode="score", input_file=scored)
    info = _run(model, data, model_dir=model_dir, mode="export")
    with open(scored + ".scores") as f:
      scores = [float(line) for line in f]
    out[model] = {"dir": info["export_dir"], "info": info, "model_dir": model_dir,
                  "outputs": inference.read_lines(inputs + ".outputs"), "scores": scores}
  out["split_dir"] = str(root / "split")
  out["split_log"] = _cli_export(out["lm"]["model_dir"], out["split_dir"], data)
  gin_config.parse([], TINY + SINGLE + MODELS["lm"] + data)
  try:
    out["ids_info"] = export.export_saved_model(
        out["lm"]["model_dir"], str(root / "ids"), model_type="lm",
        vocabulary=_PythonBytes(), sequence_length={"inputs": 24, "targets": 24},
        decode_length=8)
  finally:
    gin.clear_config()
  return out


# The rows of TEXTS the ids-only SavedModel decodes, as zero-padded ids, and
# the same with EOS appended for scoring (as --mode=score does).
_IDS_ROWS = [0, 1, 5, 6, 7]


def _ids_requests():
  prompts = [vocabulary_lib.ByteVocabulary().encode(TEXTS[i]) for i in _IDS_ROWS]
  width = max(len(p) for p in prompts) + 1
  return ([p + [0] * (width - len(p)) for p in prompts],
          [p + [1] + [0] * (width - len(p) - 1) for p in prompts])


_LOAD_ALL = """
import json
import tensorflow as tf
jobs, ids_job = json.loads(JOBS)
result = {"devices": len(tf.config.list_logical_devices("CPU"))}
for name, path, texts, inputs, targets in jobs:
  sig = tf.saved_model.load(path).signatures
  # 11 examples: two chunks of the SavedModel's batch of 8, the second padded.
  decoded = sig["serving_default"](inputs=tf.constant(texts + texts[:3]))["outputs"].numpy()
  if inputs is None:
    scores = sig["score"](targets=tf.constant(targets + targets[:3]))["scores"]
  else:
    scores = sig["score"](inputs=tf.constant(inputs + inputs[:3]),
                          targets=tf.constant(targets + targets[:3]))["scores"]
  ids = sig["decode_ids"](inputs=tf.constant([[103, 104, 105, 35], [70, 0, 0, 0]]))
  result[name] = {"signatures": sorted(sig), "outputs": [d.decode("utf-8") for d in decoded],
                  "scores": scores.numpy().tolist(),
                  "decode_ids": ids["outputs"].numpy().tolist()}
path, prompts, scored = ids_job
sig = tf.saved_model.load(path).signatures
result["ids"] = {
    "signatures": sorted(sig),
    "outputs": sig["serving_default"](inputs=tf.constant(prompts))["outputs"].numpy().tolist(),
    "scores": sig["score_ids"](targets=tf.constant(scored))["scores"].numpy().tolist()}
print(json.dumps(result))
"""


@pytest.fixture(scope="module")
def loaded(exported):
  """What one fresh process that never imports mesh_tensorflow (any import of
  it would fail) gets from every SavedModel."""
  lm, bi = exported["lm"], exported["bi"]
  sources, targets = [p[0] for p in PAIRS], [p[1] for p in PAIRS]
  jobs = [[["lm", lm["dir"], TEXTS, None, TEXTS], ["bi", bi["dir"], sources, sources, targets],
           ["split", exported["split_dir"], TEXTS, None, TEXTS]],
          [exported["ids_info"]["export_dir"], *_ids_requests()]]
  script = _LOAD_ALL.replace("JOBS", repr(json.dumps(jobs)))
  guard = "import sys\nsys.modules['mesh_tensorflow'] = None  # any import of it fails\n"
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
  env.pop("PYTHONPATH", None)
  proc = subprocess.run([sys.executable, "-c", guard + script], cwd="/", env=env,
                        capture_output=True, text=True, timeout=300, check=False)
  assert proc.returncode == 0, proc.stderr[-4000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", ["lm", "bi"])
def test_fresh_process_reproduces_infer_and_score(exported, loaded, name):
  got = loaded[name]
  assert got["signatures"] == ["decode", "decode_ids", "score", "score_ids",
                               "serving_default"]
  want_outputs, want_scores = exported[name]["outputs"], exported[name]["scores"]
  assert got["outputs"] == want_outputs + want_outputs[:3]
  np.testing.assert_allclose(got["scores"], want_scores + want_scores[:3], rtol=1e-4, atol=1e-4)
  assert all(s < 0 for s in got["scores"])


def test_decode_ids_returns_the_new_ids(exported, loaded):
  # A language model's ids signature gives the continuation only, moved to
  # the front; as text it is what serving_default gives for "def ".
  vocab = vocabulary_lib.ByteVocabulary()
  lm = loaded["lm"]["decode_ids"]
  assert len(lm[0]) == 24 and vocab.decode(lm[0]) == exported["lm"]["outputs"][0]
  assert len(loaded["bi"]["decode_ids"][0]) == 12


def test_default_export_dir_and_step(exported):
  info = exported["lm"]["info"]
  assert info["step"] == 3
  assert info["export_dir"] == os.path.join(exported["lm"]["model_dir"], "export", "3")
  assert os.path.exists(os.path.join(info["export_dir"], "saved_model.pb"))


def test_cli_export_on_a_split_mesh(exported, loaded):
  """A data- and model-parallel SavedModel, loaded where there is one CPU
  device, computes the same scores (greedy texts can differ only by a near
  tie, summing in another order: not compared)."""
  assert "mesh 'rows:2;cols:2'" in exported["split_log"]
  assert loaded["devices"] == 1
  want = exported["lm"]["scores"]
  np.testing.assert_allclose(loaded["split"]["scores"], want + want[:3], rtol=1e-4, atol=1e-4)
  assert len(loaded["split"]["outputs"]) == len(TEXTS) + 3


def test_python_vocabulary_exports_ids_signatures_only(exported, loaded):
  assert export.has_graph_ops(vocabulary_lib.ByteVocabulary())
  assert not export.has_graph_ops(_PythonBytes())
  assert exported["ids_info"]["signatures"] == ["decode_ids", "score_ids", "serving_default"]
  assert loaded["ids"]["signatures"] == ["decode_ids", "score_ids", "serving_default"]
  vocab = vocabulary_lib.ByteVocabulary()
  assert ([vocab.decode(row) for row in loaded["ids"]["outputs"]]
          == [exported["lm"]["outputs"][i] for i in _IDS_ROWS])
  np.testing.assert_allclose(loaded["ids"]["scores"],
                             [exported["lm"]["scores"][i] for i in _IDS_ROWS],
                             rtol=1e-4, atol=1e-4)


def test_export_without_checkpoint_is_one_clear_error(tmp_path):
  with pytest.raises(ValueError, match="No checkpoint in"):
    export.export_saved_model(str(tmp_path), model_type="lm")
  with pytest.raises(ValueError, match="needs --model_dir"):
    export.export_saved_model("", model_type="lm")


def test_score_without_input_file_scores_every_validation_example(exported, tmp_path):
  """T5's scoring of a task: --mode=score without --input_file scores the
  validation examples of the data in order, as scoring the same pairs from a
  file does."""
  model_dir, data = exported["bi"]["model_dir"], exported["data"]
  from_data = str(tmp_path / "validation.scores")
  result = _run("bi", data, SINGLE, model_dir=model_dir, mode="score", output_file=from_data)
  held_out = data[1].split(" = ", 1)[1].strip("[]'")
  lines = inference.read_lines(held_out)
  _run("bi", data, SINGLE, model_dir=model_dir, mode="score", input_file=held_out,
       output_file=str(tmp_path / "file.scores"))
  with open(from_data) as f:
    got = [float(line) for line in f]
  with open(tmp_path / "file.scores") as f:
    want = [float(line) for line in f]
  assert result["examples"] == len(lines) == len(got) == 64
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  with pytest.raises(ValueError, match="give --output_file"):
    _run("bi", data, SINGLE, model_dir=model_dir, mode="score")
