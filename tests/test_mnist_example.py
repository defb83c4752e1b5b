"""examples/mnist.py: run as a user would (a subprocess per layout) and
in-process, where loss curves of different layouts are compared tightly."""

import importlib.util
import os
import re
import subprocess
import sys

import numpy as np
import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO_ROOT, "examples", "mnist.py")

_FINAL = re.compile(
    r"^final: step=(?P<step>\d+) loss=(?P<loss>\S+) test_accuracy=(?P<acc>\S+) "
    r"seconds=(?P<seconds>\S+) layout='(?P<layout>[^']*)' mesh_shape='(?P<mesh>[^']*)'$")


def _run_script(*args, timeout=240):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
  proc = subprocess.run([sys.executable, SCRIPT, *args], cwd=REPO_ROOT, env=env,
                        capture_output=True, text=True, timeout=timeout, check=False)
  assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-4000:]}"
  lines = proc.stdout.strip().splitlines()
  match = _FINAL.match(lines[-1])
  assert match, f"last line is not the final summary: {lines[-1]!r}"
  return match, proc.stdout


@pytest.fixture(scope="module")
def mnist():
  """The example imported as a module (its absl flags are defined once)."""
  name = "mnist_example"
  if name not in sys.modules:
    spec = importlib.util.spec_from_file_location(name, SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
  return sys.modules[name]


def test_default_run_reaches_90_percent():
  match, stdout = _run_script()
  assert int(match["step"]) == 600
  assert float(match["acc"]) >= 0.90, stdout
  assert match["layout"] == "batch:rows;hidden:cols"
  assert match["mesh"] == "rows:2;cols:4"
  assert "step 100: loss" in stdout


@pytest.fixture(scope="module")
def short_cli_runs():
  runs = {}
  for layout in ["data_parallel", "model_parallel", "2x4"]:
    runs[layout] = _run_script(f"--layout={layout}", "--train_steps=120", "--log_every=40",
                               "--eval_every=60")
  return runs


@pytest.mark.parametrize("layout,rules,mesh_shape", [
    ("data_parallel", "batch:all", "all:8"),
    ("model_parallel", "hidden:all", "all:8"),
    ("2x4", "batch:rows;hidden:cols", "rows:2;cols:4"),
])
def test_cli_presets(short_cli_runs, layout, rules, mesh_shape):
  match, stdout = short_cli_runs[layout]
  assert match["layout"] == rules and match["mesh"] == mesh_shape
  assert int(match["step"]) == 120
  assert float(match["acc"]) >= 0.85, stdout
  logged = [float(x) for x in re.findall(r"^step \d+: loss (\S+)$", stdout, re.M)]
  assert len(logged) == 3 and logged[-1] < logged[0]
  assert "step 60: test accuracy" in stdout


def test_cli_presets_agree(short_cli_runs):
  losses = [float(m["loss"]) for m, _ in short_cli_runs.values()]
  accuracies = [float(m["acc"]) for m, _ in short_cli_runs.values()]
  np.testing.assert_allclose(losses, losses[0], rtol=1e-3)
  assert max(accuracies) - min(accuracies) <= 1.0 / 359 + 1e-9


def test_cli_explicit_layout_rules():
  match, _ = _run_script("--layout=hidden:rows;batch:cols", "--mesh_shape=rows:2;cols:4",
                         "--train_steps=20", "--optimizer=momentum", "--hidden_size=256",
                         "--batch_size=64")
  assert match["layout"] == "hidden:rows;batch:cols" and match["mesh"] == "rows:2;cols:4"
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
                         optimizer=optimizer, log=lambda line: None)
             for layout, mesh_shape in CURVE_LAYOUTS]
  reference = np.array(results[0].losses)
  assert len(reference) == steps and reference[-1] < reference[0]
  for (layout, _), result in zip(CURVE_LAYOUTS[1:], results[1:]):
    np.testing.assert_allclose(result.losses, reference, rtol=1e-4,
                               err_msg=f"{optimizer} under {layout}")
    assert abs(result.test_accuracy - results[0].test_accuracy) <= 1.0 / 359 + 1e-9


def test_seed_changes_the_run(mnist):
  a = mnist.train(layout="data_parallel", train_steps=5, seed=1, log=lambda line: None)
  b = mnist.train(layout="data_parallel", train_steps=5, seed=2, log=lambda line: None)
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
    mnist.train(layout="data_parallel", batch_size=100, train_steps=1,
                log=lambda line: None)


def test_resolve_layout(mnist):
  assert mnist.resolve_layout("data_parallel") == ("batch:all", "all:8")
  assert mnist.resolve_layout("model_parallel") == ("hidden:all", "all:8")
  assert mnist.resolve_layout("2x4") == ("batch:rows;hidden:cols", "rows:2;cols:4")
  assert mnist.resolve_layout("batch:rows") == ("batch:rows", "rows:2;cols:4")
  assert mnist.resolve_layout("batch:all", "all:4") == ("batch:all", "all:4")
