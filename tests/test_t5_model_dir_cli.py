"""A T5-style model directory (checkpoint + operative_config.gin in the
original's gin names) through `python -m mesh_tensorflow.transformer.main`
as T5 users ran `t5_mesh_transformer`: train, score, infer and eval with
--gin_file=DIR/operative_config.gin (a path outside the package's gin
directory), then fine-tune a new model directory from it with
--init_checkpoint on a TSV file of inputs<TAB>targets."""

import os
import re
import shutil
import subprocess
import sys

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OPERATIVE = os.path.join(REPO_ROOT, "tests", "data", "t5_style_operative_config.gin")

WORDS = ["red", "green", "blue", "cyan", "magenta", "yellow", "black", "white"]
# What the t5 package supplied (vocabulary, data) and a small single-device
# mesh; the model itself comes from the operative config.
COMMON = [
    "run.vocabulary = @vocabulary.ByteVocabulary()",
    "inputs_length = 16", "targets_length = 16",
    "utils.run.batch_size = ('tokens_per_batch', 128)",
    "run.num_samples = 0", "run.log_every = 1", "dataset_fn.shuffle_buffer = 64",
]
SINGLE = "utils.run.mesh_shape = 'model:1,batch:1'"
_STEP_LOSS = re.compile(r"^step (\d+)/\d+ loss=([0-9.]+)", re.M)


def _main(*args, params=(), timeout=900):
  command = [sys.executable, "-m", "mesh_tensorflow.transformer.main", *args]
  command += [f"--gin_param={p}" for p in COMMON + list(params)]
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
             PYTHONPATH=os.pathsep.join([REPO_ROOT, os.environ.get("PYTHONPATH", "")]))
  proc = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                        timeout=timeout, check=False)
  assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-4000:]}"
  return proc.stdout, proc.stderr


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  root = tmp_path_factory.mktemp("t5")
  model_dir = root / "pretrained"
  model_dir.mkdir()
  shutil.copy(OPERATIVE, model_dir / "operative_config.gin")
  # The task: repeat the words of the input in reverse order.
  lines = []
  for i, a in enumerate(WORDS):
    for b in WORDS[i:] + WORDS[:i]:
      lines.append(f"{a} {b}\t{b} {a}\n")
  (root / "train.tsv").write_text("".join(lines))
  (root / "valid.tsv").write_text("".join(lines[:16]))
  return root


def _data(root):
  return [f"dataset_fn.train_files = ['{root / 'train.tsv'}']",
          f"dataset_fn.eval_files = ['{root / 'valid.tsv'}']"]


def test_model_dir_train_score_infer_eval_then_fine_tune(workdir):
  model_dir = workdir / "pretrained"
  gin_file = f"--gin_file={model_dir / 'operative_config.gin'}"
  out, err = _main(f"--model_dir={model_dir}", gin_file, "--mode=train",
                   params=[SINGLE, "run.train_steps = 2"] + _data(workdir))
  assert "final: step=2" in out and (model_dir / "checkpoint").exists()
  # One warning lists the t5 package's and TPU bindings; one lists run's
  # ignored parameters.
  assert err.count("gin: skipped") == 1 and "tpu_estimator_model_fn" in err
  assert err.count("utils.run: ignoring") == 1 and "iterations_per_loop=100" in err
  # The config's vocab_divisor (128), not this library's 8.
  assert "(259 ids, model 384)" in out

  # Score on the mesh the config asks for (tpu_mesh_shape: 8 cores, 4 per
  # replica), which differs from the one it was trained on.
  pairs = workdir / "pairs.tsv"
  pairs.write_text("red green\tgreen red\nblue\tblue\n")
  out, _ = _main(f"--model_dir={model_dir}", gin_file, "--mode=score",
                 f"--input_file={pairs}")
  assert "mesh 'batch:2;model:4'" in out
  scores = [float(x) for x in (workdir / "pairs.tsv.scores").read_text().split()]
  assert len(scores) == 2 and all(s < 0 for s in scores)

  inputs = workdir / "inputs.txt"
  inputs.write_text("red green\nblue cyan\nwhite\n")
  _main(f"--model_dir={model_dir}", gin_file, "--mode=infer", f"--input_file={inputs}",
        params=[SINGLE])
  assert len((workdir / "inputs.txt.outputs").read_text().splitlines()) == 3

  out, _ = _main(f"--model_dir={model_dir}", gin_file, "--mode=eval",
                 params=[SINGLE] + _data(workdir))
  assert "final: step=2" in out and "perplexity=" in out

  # Fine-tune: a fresh model directory starts from the pretrained one, with
  # the optimizer state and the step reset, and learns the TSV task.
  tuned = workdir / "tuned"
  out, _ = _main(f"--model_dir={tuned}", gin_file, "--mode=train",
                 f"--init_checkpoint={model_dir}", "--init_checkpoint_reset_optimizer",
                 params=[SINGLE, "run.train_steps = 12",
                         "constant_learning_rate.learning_rate = 0.02"] + _data(workdir))
  assert re.search(r"initialized from .*pretrained.*ckpt-2", out), out
  assert "trained steps 1..12" in out
  losses = [float(loss) for _, loss in _STEP_LOSS.findall(out)]
  assert len(losses) == 12
  assert sum(losses[-3:]) / 3 < 0.8 * sum(losses[:3]) / 3, losses
  assert (tuned / "checkpoint").exists()
