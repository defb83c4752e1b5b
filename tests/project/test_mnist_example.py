"""examples/mnist.py: run as a user would (in a subprocess, resuming from its
checkpoints; a series of runs shares one fresh process, tests/cli_driver.py)
and in-process, where loss curves of different layouts are compared tightly."""

import os
import re
import subprocess
import sys

import numpy as np
import pytest

import mtf_test_utils
from cli_driver import run_commands

# The module's fixtures are computed once: its tests share one test worker.
pytestmark = pytest.mark.xdist_group("test_mnist_short_cli_runs")

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO_ROOT, "examples", "mnist.py")

_FINAL = re.compile(
    r"^final: step=(?P<step>\d+) loss=(?P<loss>\S+) test_accuracy=(?P<acc>\S+) "
    r"test_loss=(?P<test_loss>\S+) seconds=(?P<seconds>\S+) "
    r"layout='(?P<layout>[^']*)' mesh_shape='(?P<mesh>[^']*)'$")
_PROGRESS = re.compile(r"^step (\d+)/(\d+) loss=(\S+) .*steps/s eta \S+$", re.M)


def _quiet(line):
  del line


def _run_script(*args, model_dir, timeout=900):
  """Runs the example like a user (with its own model_dir); returns the final
  line's match and stdout."""
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
  proc = subprocess.run([sys.executable, SCRIPT, *args, f"--model_dir={model_dir}"],
                        cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                        timeout=timeout, check=False)
  assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-4000:]}"
  return _final_line(proc.stdout), proc.stdout


def _final_line(stdout):
  lines = stdout.strip().splitlines()
  match = _FINAL.match(lines[-1])
  assert match, f"last line is not the final summary: {lines[-1]!r}"
  return match


def _run_scripts(*runs):
  """Runs the example once per (args, model_dir) of `runs`, one after
  another in one fresh process (tests/cli_driver.py: the example's main
  through the same absl wrapper); (final line's match, stdout) of each."""
  outs = run_commands("mnist", [[*args, f"--model_dir={model_dir}"] for args, model_dir in runs])
  return [(_final_line(out), out) for out in outs]


def _progress_steps(stdout):
  return [int(m.group(1)) for m in _PROGRESS.finditer(stdout)]


@pytest.fixture(scope="module")
def mnist():
  """The example imported as a module (its absl flags are defined once)."""
  return mtf_test_utils.import_mnist_example()


def test_default_run_reaches_90_percent(tmp_path):
  match, stdout = _run_script(model_dir=tmp_path)
  assert int(match["step"]) == 600
  assert float(match["acc"]) >= 0.90, stdout
  assert match["layout"] == "batch:rows;hidden:cols"
  assert match["mesh"] == "rows:2;cols:4"
  assert _progress_steps(stdout) == [100, 200, 300, 400, 500, 600]
  assert f"saved checkpoint {tmp_path}{os.sep}ckpt-600" in stdout
  assert list(tmp_path.glob("events.out.tfevents.*")), "no TensorBoard events written"


def test_cli_run_twice_resumes(tmp_path, mnist):
  """The user story: train, then run again with more steps (and another
  layout): the step count continues from the checkpoint; the same command a
  third time only evaluates; --fresh starts over."""
  first, out1 = _run_script("--layout=data_parallel", "--train_steps=60", "--log_every=20",
                            "--checkpoint_every=25", model_dir=tmp_path)
  assert int(first["step"]) == 60 and _progress_steps(out1) == [20, 40, 60]
  assert "restored" not in out1

  # The runs after the first: one after another in one fresh process.
  (second, out2), (third, out3), (fresh, out4) = _run_scripts(
      (["--layout=2x4", "--train_steps=100", "--log_every=20"], tmp_path),
      (["--layout=2x4", "--train_steps=100"], tmp_path),
      (["--train_steps=10", "--fresh", "--log_every=5"], tmp_path))
  assert f"restored checkpoint {tmp_path}{os.sep}ckpt-60 (step 60)" in out2
  assert _progress_steps(out2) == [80, 100]
  assert "trained steps 61..100" in out2
  assert int(second["step"]) == 100 and second["mesh"] == "rows:2;cols:4"
  assert float(second["acc"]) >= 0.85, out2
  # Same losses as an uninterrupted run (another layout: float rounding only).
  uninterrupted = mnist.train(layout="2x4", train_steps=100, log=_quiet)
  np.testing.assert_allclose(float(second["loss"]), uninterrupted.losses[-1], rtol=1e-3)

  assert "evaluating only" in out3 and _progress_steps(out3) == []
  assert int(third["step"]) == 100 and third["loss"] == "nan"
  assert third["acc"] == second["acc"]

  assert "restored" not in out4 and _progress_steps(out4) == [5, 10]
  assert int(fresh["step"]) == 10


@pytest.fixture(scope="module")
def short_cli_runs(tmp_path_factory):
  layouts = ["data_parallel", "model_parallel", "2x4"]
  return dict(zip(layouts, _run_scripts(*(
      ([f"--layout={layout}", "--train_steps=120", "--log_every=40", "--eval_every=60"],
       tmp_path_factory.mktemp(layout)) for layout in layouts))))


@pytest.mark.parametrize("layout,rules,mesh_shape", [
    ("data_parallel", "batch:all", "all:8"),
    ("model_parallel", "hidden:all", "all:8"),
    ("2x4", "batch:rows;hidden:cols", "rows:2;cols:4"),
])
@pytest.mark.xdist_group("test_mnist_short_cli_runs")  # shares `short_cli_runs`
def test_cli_presets(short_cli_runs, layout, rules, mesh_shape):
  match, stdout = short_cli_runs[layout]
  assert match["layout"] == rules and match["mesh"] == mesh_shape
  assert int(match["step"]) == 120
  assert float(match["acc"]) >= 0.85, stdout
  logged = [float(m.group(3)) for m in _PROGRESS.finditer(stdout)]
  assert len(logged) == 3 and logged[-1] < logged[0]
  assert "step 60: test accuracy" in stdout


@pytest.mark.xdist_group("test_mnist_short_cli_runs")  # shares `short_cli_runs`
def test_cli_presets_agree(short_cli_runs):
  losses = [float(m["loss"]) for m, _ in short_cli_runs.values()]
  accuracies = [float(m["acc"]) for m, _ in short_cli_runs.values()]
  np.testing.assert_allclose(losses, losses[0], rtol=1e-3)
  assert max(accuracies) - min(accuracies) <= 1.0 / 359 + 1e-9


def test_cli_explicit_layout_rules_and_grad_accumulation(tmp_path):
  match, stdout = _run_script(
      "--layout=hidden:rows;batch:cols", "--mesh_shape=rows:2;cols:4", "--train_steps=20",
      "--optimizer=momentum", "--hidden_size=256", "--batch_size=64",
      "--grad_accum_steps=2", model_dir=tmp_path)
  assert match["layout"] == "hidden:rows;batch:cols" and match["mesh"] == "rows:2;cols:4"
  assert "batch 64 (2 micro-batches of 32)" in stdout
  assert np.isfinite(float(match["loss"]))


CURVE_LAYOUTS = [
    ("replicated", ""),
    ("data_parallel", ""),
    ("model_parallel", ""),
    ("2x4", ""),
    ("hidden:rows;batch:cols", "rows:2;cols:4"),
]


@pytest.mark.parametrize("optimizer,steps", [("sgd", 80), ("momentum", 60), ("adam", 8)])
def test_every_layout_gives_the_same_loss_curve(mnist, optimizer, steps):
  # Adam (epsilon=1e-6, no bias correction) makes a near sign(grad) first
  # step, which amplifies rounding differences between layouts: compare
  # only a few of its steps.
  results = [mnist.train(layout=layout, mesh_shape=mesh_shape, train_steps=steps,
                         optimizer=optimizer, log=_quiet)
             for layout, mesh_shape in CURVE_LAYOUTS]
  reference = np.array(results[0].losses)
  assert len(reference) == steps and reference[-1] < reference[0]
  for (layout, _), result in zip(CURVE_LAYOUTS[1:], results[1:]):
    np.testing.assert_allclose(result.losses, reference, rtol=1e-4,
                               err_msg=f"{optimizer} under {layout}")
    assert abs(result.test_accuracy - results[0].test_accuracy) <= 1.0 / 359 + 1e-9


def test_resume_in_process_continues_the_same_curve(mnist, tmp_path):
  full = mnist.train(layout="2x4", train_steps=40, optimizer="momentum", log=_quiet)
  first = mnist.train(layout="2x4", train_steps=15, optimizer="momentum",
                      model_dir=str(tmp_path), checkpoint_every=10, log=_quiet)
  rest = mnist.train(layout="2x4", train_steps=40, optimizer="momentum",
                     model_dir=str(tmp_path), checkpoint_every=10, log=_quiet)
  assert (first.start_step, first.steps, rest.start_step, rest.steps) == (0, 15, 15, 40)
  # Same layout, momentum slots restored, same batches skipped: bit-identical.
  assert first.losses + rest.losses == full.losses
  assert rest.test_accuracy == full.test_accuracy


def test_grad_accumulation_gives_the_same_curve(mnist):
  whole = mnist.train(layout="data_parallel", train_steps=30, batch_size=128, log=_quiet)
  split = mnist.train(layout="data_parallel", train_steps=30, batch_size=128,
                      grad_accum_steps=4, log=_quiet)
  np.testing.assert_allclose(split.losses, whole.losses, rtol=1e-4)


def test_checkpoint_of_another_model_is_reported(mnist, tmp_path):
  mnist.train(layout="data_parallel", train_steps=2, model_dir=str(tmp_path), log=_quiet)
  with pytest.raises(ValueError, match=r"'w1' with shape \[8, 8, 1024\].*\[8, 8, 256\]"):
    mnist.train(layout="data_parallel", train_steps=4, hidden_size=256,
                model_dir=str(tmp_path), log=_quiet)
  again = mnist.train(layout="data_parallel", train_steps=4, hidden_size=256,
                      model_dir=str(tmp_path), fresh=True, log=_quiet)
  assert again.start_step == 0 and again.steps == 4


def test_fresh_deletes_only_checkpoints_and_events(mnist, tmp_path):
  for name in ["checkpoint", "ckpt-5.index", "ckpt-5.data-00000-of-00001",
               "events.out.tfevents.1.host.v2", "notes.txt"]:
    (tmp_path / name).write_text("x")
  (tmp_path / "ckpt-7_temp").mkdir()
  mnist.clear_model_dir(str(tmp_path))
  assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_seed_changes_the_run(mnist):
  a = mnist.train(layout="data_parallel", train_steps=5, seed=1, log=_quiet)
  b = mnist.train(layout="data_parallel", train_steps=5, seed=2, log=_quiet)
  assert a.losses[0] != b.losses[0]


def test_test_split_is_fixed_and_disjoint(mnist):
  data = mnist.load_data()
  assert data["train_images"].shape == (1438, 8, 8)
  assert data["test_images"].shape == (359, 8, 8)
  again = mnist.load_data()
  np.testing.assert_array_equal(data["test_labels"], again["test_labels"])
  train = {img.tobytes() for img in data["train_images"]}
  overlap = sum(img.tobytes() in train for img in data["test_images"])
  assert overlap <= 2  # load_digits itself holds a couple of duplicate images


def test_batch_that_the_mesh_does_not_divide_is_reported(mnist):
  with pytest.raises(ValueError, match="does not divide"):
    mnist.train(layout="data_parallel", batch_size=100, train_steps=1, log=_quiet)
  with pytest.raises(ValueError, match="grad_accum_steps=3 must be >= 1 and divide"):
    mnist.train(layout="data_parallel", batch_size=128, grad_accum_steps=3, log=_quiet)


def test_resolve_layout(mnist):
  assert mnist.resolve_layout("data_parallel") == ("batch:all", "all:8")
  assert mnist.resolve_layout("model_parallel") == ("hidden:all", "all:8")
  assert mnist.resolve_layout("2x4") == ("batch:rows;hidden:cols", "rows:2;cols:4")
  assert mnist.resolve_layout("batch:rows") == ("batch:rows", "rows:2;cols:4")
  assert mnist.resolve_layout("batch:all", "all:4") == ("batch:all", "all:4")
