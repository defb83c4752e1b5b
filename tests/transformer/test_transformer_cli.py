"""`python -m mesh_tensorflow.transformer.main` as a user runs it: train a tiny
model for a few steps in a temporary model_dir, resume, evaluate, decode lines
of a file and score them, for a language model and an encoder-decoder.

The language model's first training run is the real command in a subprocess;
each workflow after that runs its commands one after another in one fresh
process (tests/cli_driver.py: the same absl wrapper as the command, without a
TensorFlow start-up per command). Its errors are in tests/project/test_cli_errors.py."""

import glob
import os
import re
import subprocess
import sys

from cli_driver import run_commands

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Small enough to train in seconds; the sizes divide every 8-device layout.
TINY = [
    "num_layers = 1", "d_model = 32", "d_ff = 64", "num_heads = 8", "d_kv = 8",
    "run.batch_size = 8", "run.eval_steps = 2", "run.log_every = 2",
    "run.checkpoint_every = 3", "run.num_samples = 2", "run.decode_length = 8",
    "dataset_fn.corpus_bytes = 300000", "dataset_fn.shuffle_buffer = 200",
]
_FINAL = re.compile(r"^final: (.*)$", re.M)


def _args(*args, model_dir, params=()):
  return [f"--model_dir={model_dir}", *args] + [
      f"--gin_param={p}" for p in list(TINY) + list(params)]


def _main(*args, model_dir, params=(), timeout=900):
  """Runs the CLI in a subprocess; returns its stdout (asserting success)."""
  command = [sys.executable, "-m", "mesh_tensorflow.transformer.main",
             *_args(*args, model_dir=model_dir, params=params)]
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
  proc = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                        timeout=timeout, check=False)
  assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-4000:]}"
  return proc.stdout


def _commands(*argvs):
  """Runs several command lines of the CLI (each from `_args`) one after
  another in one fresh process (tests/cli_driver.py); their stdouts."""
  return run_commands("transformer", argvs)


def _final(stdout):
  match = _FINAL.search(stdout)
  assert match, stdout
  return {k: float(v) for k, v in (item.split("=") for item in match.group(1).split())}


def _scalar_tags(model_dir):
  """The tags of the TensorBoard events files in model_dir."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  tags = set()
  for path in glob.glob(str(model_dir / "events.out.tfevents.*")):
    for event in tf.compat.v1.train.summary_iterator(path):
      tags.update(v.tag for v in event.summary.value)
  return tags


def test_language_model_train_resume_eval_infer_score(tmp_path):
  model_dir = tmp_path / "lm"
  lm = ["run.sequence_length = {'inputs': 32, 'targets': 32}"]
  out = _main("--gin_file=models/tiny_lm.gin", "--gin_file=layouts/2x4.gin",
              "--print_layout_report", model_dir=model_dir,
              params=lm + ["run.train_steps = 4"])
  # --print_layout_report prints the layout report before training.
  assert out.index("layout '") < out.index("final: ")
  final = _final(out)
  assert final["step"] == 4 and 2.0 < final["unigram_entropy"] < 5.6
  assert final["eval_cross_entropy"] < 5.6  # below log(vocab) after a few steps
  assert "step 4/4 loss=" in out and "--- sample (prompt 'def ')" in out
  assert glob.glob(str(model_dir / "ckpt-4*"))
  assert _scalar_tags(model_dir) >= {"loss", "cross_entropy", "eval/loss", "eval/perplexity"}

  # Then, in one process: run again with more steps on another layout and
  # the SIMD lowering (it resumes at step 4 and decodes its sample:
  # collectives inside the loop), evaluate, decode a file on one device and
  # on eight, score lines, start over with --fresh.
  # Training wrote the config it ran with: decoding needs nothing else. It
  # decodes greedily (the same outputs twice), as the original does.
  operative = model_dir / "operative_config.gin"
  prompts = tmp_path / "prompts.txt"
  prompts.write_text("def \nimport os\\nimport \n")
  texts = tmp_path / "texts.txt"
  texts.write_text("import os\nx = 1\\nprint(x)\n" + "def f(a, b):\n")
  scores_file = tmp_path / "scores.txt"
  resumed, evaluated, *decodes, _, fresh = _commands(
      _args("--gin_file=models/tiny_lm.gin", "--gin_file=layouts/data_parallel.gin",
            model_dir=model_dir, params=lm + ["run.train_steps = 6", "run.num_samples = 1",
                                              "run.lowering = 'simd'"]),
      _args("--mode=eval", "--gin_file=models/tiny_lm.gin", model_dir=model_dir, params=lm),
      _args("--mode=infer", f"--input_file={prompts}", f"--gin_file={operative}",
            "--gin_file=layouts/single.gin", model_dir=model_dir, params=lm),
      _args("--mode=infer", f"--input_file={prompts}", f"--output_file={prompts}.2x4",
            f"--gin_file={operative}", "--gin_file=layouts/2x4.gin", model_dir=model_dir,
            params=lm),
      _args("--mode=score", f"--input_file={texts}", f"--output_file={scores_file}",
            "--gin_file=models/tiny_lm.gin", model_dir=model_dir, params=lm),
      _args("--fresh", "--gin_file=models/tiny_lm.gin", model_dir=model_dir,
            params=lm + ["run.train_steps = 2", "run.num_samples = 0"]))
  assert "(step 4)" in resumed and "trained steps 5..6" in resumed
  assert "--- sample (prompt 'def ')" in resumed
  assert _final(resumed)["step"] == 6

  final = _final(evaluated)
  assert final["step"] == 6 and final["perplexity"] > 1.0
  assert "eval at step 6" in evaluated

  assert "make_layer_stack.layers = " in operative.read_text()
  decoded = [(tmp_path / name).read_text().splitlines()
             for name in ("prompts.txt.outputs", "prompts.txt.2x4")]
  for lines, out in zip(decoded, decodes):
    assert len(lines) == 2 and "decoded 2 inputs" in out
  assert decoded[0] == decoded[1]

  scores = [float(s) for s in scores_file.read_text().split()]
  assert len(scores) == 3 and all(s < 0 for s in scores)

  # --fresh deleted the checkpoints and started over.
  assert "trained steps 1..2" in fresh and not glob.glob(str(model_dir / "ckpt-6*"))


def test_encoder_decoder_train_and_infer(tmp_path):
  model_dir = tmp_path / "bi"
  bi = ["run.sequence_length = {'inputs': 32, 'targets': 32}",
        "dataset_fn.corpus_bytes = 3000000"]
  inputs = tmp_path / "inputs.txt"
  inputs.write_text("def add(a, b):\ndef read_file(path):\ndef main():\n")
  trained, _ = _commands(
      _args("--gin_file=models/tiny_bi.gin", "--gin_file=layouts/2x4.gin",
            model_dir=model_dir, params=bi + ["run.train_steps = 3"]),
      _args("--mode=infer", f"--input_file={inputs}", "--gin_file=models/tiny_bi.gin",
            model_dir=model_dir, params=bi + ["run.beam_size = 2"]))
  assert _final(trained)["step"] == 3 and "reference:" in trained
  assert len((tmp_path / "inputs.txt.outputs").read_text().splitlines()) == 3


# T5's way to decode a file (its infer.gin, in the original's vocabulary):
# the files through decode_from_file's parameters, every checkpoint by default.
T5_STYLE_INFER = """
utils.run.mode = "infer"
infer_checkpoint_step = "all"
utils.run.eval_checkpoint_step = %infer_checkpoint_step
infer_model.decode_fn = @decode_from_file
input_filename = "/path/to/inputs"
output_filename = "/path/to/outputs"
decode_from_file.input_filename = %input_filename
decode_from_file.output_filename = %output_filename
"""


def test_t5_style_decoding_of_every_checkpoint_and_evaluation_of_several(tmp_path):
  model_dir = tmp_path / "lm"
  lm = ["run.sequence_length = {'inputs': 32, 'targets': 32}", "run.checkpoint_every = 2",
        "run.num_samples = 0"]
  (tmp_path / "infer.gin").write_text(T5_STYLE_INFER)
  prompts, outputs = tmp_path / "prompts.txt", tmp_path / "outputs.txt"
  prompts.write_text("def \nimport \n")
  _, out, evaluated = _commands(
      _args("--gin_file=models/tiny_lm.gin", model_dir=model_dir,
            params=lm + ["run.train_steps = 4"]),
      _args(f"--gin_file={model_dir / 'operative_config.gin'}",
            f"--gin_file={tmp_path / 'infer.gin'}", model_dir=model_dir,
            params=[f"input_filename = '{prompts}'", f"output_filename = '{outputs}'"]),
      _args("--mode=eval", f"--gin_file={model_dir / 'operative_config.gin'}",
            model_dir=model_dir, params=["run.eval_checkpoint_step = [2, 4]"]))
  assert "restored" in out and "ckpt-2" in out and "ckpt-4" in out
  for step in (2, 4):
    assert len((tmp_path / f"outputs.txt-{step}").read_text().splitlines()) == 2
  assert not outputs.exists()
  assert "eval at step 2" in evaluated and "eval at step 4" in evaluated
  assert _final(evaluated)["step"] == 4


# T5's score_from_file.gin, in the original's vocabulary: inputs and targets
# in two files, the scores through save_scores.
T5_STYLE_SCORE = """
utils.run.mode = "score_from_strings"
score_from_strings.inputs = %inputs_filename
score_from_strings.targets = %targets_filename
score_from_strings.score_postprocess_fn = @save_scores
save_scores.scores_filename = %scores_filename
"""


def test_t5_style_scoring_of_inputs_and_targets_files(tmp_path):
  model_dir = tmp_path / "bi"
  (tmp_path / "score.gin").write_text(T5_STYLE_SCORE)
  inputs, targets = tmp_path / "inputs.txt", tmp_path / "targets.txt"
  inputs.write_text("def f(x):\nimport os\nclass A:\n")
  targets.write_text("    return x\nimport sys\n    pass\n")
  (tmp_path / "pairs.tsv").write_text("".join(
      f"{i}\t{t}\n" for i, t in zip(inputs.read_text().splitlines(),
                                     targets.read_text().splitlines())))
  operative = f"--gin_file={model_dir / 'operative_config.gin'}"
  _commands(
      _args("--gin_file=models/tiny_bi.gin", model_dir=model_dir,
            params=["run.sequence_length = {'inputs': 32, 'targets': 32}",
                    "run.train_steps = 2", "run.num_samples = 0",
                    "dataset_fn.corpus_bytes = 3000000"]),
      _args(operative, f"--gin_file={tmp_path / 'score.gin'}", model_dir=model_dir,
            params=[f"inputs_filename = '{inputs}'", f"targets_filename = '{targets}'",
                    f"scores_filename = '{tmp_path / 'scores.txt'}'"]),
      _args(operative, "--mode=score", f"--input_file={tmp_path / 'pairs.tsv'}",
            f"--output_file={tmp_path / 'pair_scores.txt'}", model_dir=model_dir))
  scores = (tmp_path / "scores.txt").read_text().split()
  assert len(scores) == 3 and scores == (tmp_path / "pair_scores.txt").read_text().split()


def test_encoder_decoder_decodes_the_validation_examples_without_an_input_file(tmp_path):
  model_dir = tmp_path / "bi"
  bi = ["run.sequence_length = {'inputs': 32, 'targets': 32}", "run.num_samples = 0",
        "dataset_fn.corpus_bytes = 3000000"]
  (tmp_path / "train.tsv").write_text("".join(f"in {i}\tout {i}\n" for i in range(64)))
  valid = [f"validation input {i} of six" for i in range(6)]  # about a row each
  (tmp_path / "valid.tsv").write_text("".join(f"{text}\tT\n" for text in valid))
  files = [f"dataset_fn.train_files = ['{tmp_path / 'train.tsv'}']",
           f"dataset_fn.eval_files = ['{tmp_path / 'valid.tsv'}']", "run.eval_steps = 1",
           "run.batch_size = 2"]
  _, out = _commands(
      _args("--gin_file=models/tiny_bi.gin", "--gin_file=layouts/single.gin",
            model_dir=model_dir, params=bi + files + ["run.train_steps = 2"]),
      _args("--mode=infer", f"--output_file={tmp_path / 'valid.outputs'}",
            f"--gin_file={model_dir / 'operative_config.gin'}", model_dir=model_dir,
            params=files))
  assert f"{valid[0]!r} ->" in out and "decoded 6 inputs" in out
  assert len((tmp_path / "valid.outputs").read_text().split("\n")) == 7
