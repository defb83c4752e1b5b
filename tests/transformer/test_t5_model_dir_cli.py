"""A T5-style model directory (an original-format checkpoint built from the
published variable names + an operative_config.gin in the original's gin
names) through `python -m mesh_tensorflow.transformer.main` as T5 users ran
`t5_mesh_transformer`: score, infer, train (continuing the original's step,
writing this library's checkpoints) and eval with
--gin_file=DIR/operative_config.gin (a path outside the package's gin
directory), then fine-tune a new model directory from the original's
checkpoint with --init_checkpoint on a TSV file of inputs<TAB>targets."""

import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from cli_driver import run_commands

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
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


def _env():
  return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
              PYTHONPATH=os.pathsep.join([REPO_ROOT, os.environ.get("PYTHONPATH", "")]))


def _argv(*args, params=()):
  return [*args] + [f"--gin_param={p}" for p in COMMON + list(params)]


def _main(*args, params=(), timeout=900):
  command = [sys.executable, "-m", "mesh_tensorflow.transformer.main",
             *_argv(*args, params=params)]
  proc = subprocess.run(command, cwd=REPO_ROOT, env=_env(), capture_output=True, text=True,
                        timeout=timeout, check=False)
  assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-4000:]}"
  return proc.stdout, proc.stderr


# The tiny model of the operative config, in the original's variable names
# and shapes ([d_model, heads * d_kv] attention weights), as T5 checkpoints
# store them: shared embedding, a separate decoder/logits, gated GELU
# feed-forward (wi_0 / wi_1), relative attention "bias_shared" (one table per
# stack, under its first layer), rms_norm norms. Vocabulary: 259 byte ids
# rounded up to 384 (vocab_divisor 128).
D, H, K, F, V = 32, 4, 8, 64, 384


def original_arrays(seed=0):
  rng = np.random.default_rng(seed)

  def normal(shape, scale):
    return (rng.standard_normal(shape) * scale).astype(np.float32)
  out = {"shared/embedding": normal([V, D], 1.0), "decoder/logits/kernel": normal([D, V], 0.2)}
  for stack, layers in (("encoder", ["SelfAttention", "DenseReluDense"]),
                        ("decoder", ["SelfAttention", "EncDecAttention", "DenseReluDense"])):
    out[f"{stack}/block_000/layer_000/SelfAttention/relative_attention_bias"] = normal(
        [H, 32], 0.1)
    for n, layer in enumerate(layers):
      scope = f"{stack}/block_000/layer_{n:03d}"
      out[f"{scope}/rms_norm/scale"] = np.ones([D], np.float32)
      if layer == "DenseReluDense":
        out[f"{scope}/DenseReluDense/wi_0/kernel"] = normal([D, F], D ** -0.5)
        out[f"{scope}/DenseReluDense/wi_1/kernel"] = normal([D, F], D ** -0.5)
        out[f"{scope}/DenseReluDense/wo/kernel"] = normal([F, D], F ** -0.5)
      else:
        for w in "qkv":
          out[f"{scope}/{layer}/{w}"] = normal([D, H * K], D ** -0.5)
        out[f"{scope}/{layer}/o"] = normal([H * K, D], (H * K) ** -0.5)
    out[f"{stack}/rms_norm/scale"] = np.ones([D], np.float32)
  return out


def save_original(directory, arrays, step):
  """A name-based TF1 checkpoint model.ckpt-STEP with bfloat16 masters and
  the `checkpoint` state file, as the original wrote them."""
  prefix = os.path.join(directory, f"model.ckpt-{step}")
  names = sorted(arrays)
  tensors = [tf.cast(arrays[n], tf.bfloat16) for n in names]
  tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names + ["global_step"],
                    shape_and_slices=[""] * (len(names) + 1),
                    tensors=tensors + [tf.constant(step, tf.int64)])
  with open(os.path.join(directory, "checkpoint"), "w") as f:
    f.write(f'model_checkpoint_path: "model.ckpt-{step}"\n'
            f'all_model_checkpoint_paths: "model.ckpt-{step}"\n')
  return prefix


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  root = tmp_path_factory.mktemp("t5")
  model_dir = root / "pretrained"
  model_dir.mkdir()
  shutil.copy(OPERATIVE, model_dir / "operative_config.gin")
  save_original(str(model_dir), original_arrays(), step=1000)
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


def test_original_model_dir_score_infer_train_eval_then_fine_tune(workdir):
  model_dir = workdir / "pretrained"
  gin_file = f"--gin_file={model_dir / 'operative_config.gin'}"
  # Score the original's checkpoint on the mesh the config asks for
  # (tpu_mesh_shape: 8 cores, 4 per replica).
  pairs = workdir / "pairs.tsv"
  pairs.write_text("red green\tgreen red\nblue\tblue\n")
  out, err = _main(f"--model_dir={model_dir}", gin_file, "--mode=score",
                   f"--input_file={pairs}")
  assert "mesh 'batch:2;model:4'" in out and "model.ckpt-1000" in out
  # The config's vocab_divisor (128), not this library's 8.
  assert "(259 ids, model 384)" in out
  # One warning lists the t5 package's and TPU bindings; one lists run's
  # ignored parameters.
  assert err.count("gin: skipped") == 1 and "tpu_estimator_model_fn" in err
  assert err.count("utils.run: ignoring") == 1 and "iterations_per_loop=100" in err
  scores = [float(x) for x in (workdir / "pairs.tsv.scores").read_text().split()]
  assert len(scores) == 2 and all(np.isfinite(scores)) and all(s < 0 for s in scores)

  # Then, one after another in one fresh process (tests/cli_driver.py):
  # decode; training continues the original's step and writes this
  # library's checkpoints into the directory, eval reads them; fine-tune: a
  # fresh model directory starts from the original's checkpoint, with the
  # optimizer state and the step reset, and learns the TSV task.
  inputs = workdir / "inputs.txt"
  inputs.write_text("red green\nblue cyan\nwhite\n")
  tuned = workdir / "tuned"
  _, trained, evaluated, out = run_commands("transformer", [
      _argv(f"--model_dir={model_dir}", gin_file, "--mode=infer", f"--input_file={inputs}",
            params=[SINGLE]),
      _argv(f"--model_dir={model_dir}", gin_file, "--mode=train",
            params=[SINGLE, "run.train_steps = 1002"] + _data(workdir)),
      _argv(f"--model_dir={model_dir}", gin_file, "--mode=eval",
            params=[SINGLE] + _data(workdir)),
      _argv(f"--model_dir={tuned}", gin_file, "--mode=train",
            f"--init_checkpoint={model_dir / 'model.ckpt-1000'}",
            "--init_checkpoint_reset_optimizer",
            params=[SINGLE, "run.train_steps = 12",
                    "constant_learning_rate.learning_rate = 0.02"] + _data(workdir)),
  ], env=_env())
  assert len((workdir / "inputs.txt.outputs").read_text().splitlines()) == 3
  assert "trained steps 1001..1002" in trained and "final: step=1002" in trained
  assert "final: step=1002" in evaluated and "perplexity=" in evaluated
  assert re.search(r"initialized from .*model.ckpt-1000 \(step 0", out), out
  assert "trained steps 1..12" in out
  losses = [float(loss) for _, loss in _STEP_LOSS.findall(out)]
  assert len(losses) == 12
  assert sum(losses[-3:]) / 3 < 0.8 * sum(losses[:3]) / 3, losses
  assert (tuned / "checkpoint").exists()
