"""Fuzz table of the command-line entry points: every user mistake is one
`error:` line naming the culprit (plus a `hint:` line), exit status 2, no
traceback, and nothing written to or deleted from the model directory.

CLI_CASES is the table; tests/ERRORS.md and docs/errors.md list it for readers
(a test keeps them in sync). Most cases run through tests/cli_driver.py, one
process per entry point calling its main function with the same wrapper as
the real command; REAL_CASES start the real commands in subprocesses to prove
that path (TensorFlow's start-up lines quiet, --verbose / MTF_VERBOSE show the
traceback).
"""

import dataclasses
import json
import os
import re
import socket
import subprocess
import sys
import time
from typing import Tuple

import numpy as np
import pytest
import tensorflow as tf

# The module's fixtures are computed once: its tests share one test worker.
pytestmark = pytest.mark.xdist_group("cli_errors")

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DRIVER = os.path.join(REPO_ROOT, "tests", "cli_driver.py")
T = "python -m mesh_tensorflow.transformer.main"


@dataclasses.dataclass(frozen=True)
class CliCase:
  id: str                       # "<entry>-<what>"
  command: str                  # the command line, for the table
  description: str
  argv: Tuple[str, ...]         # {work} is the test's directory
  message_has: Tuple[str, ...]  # in the `error:` line

  @property
  def entry(self) -> str:
    return self.id.split("-", 1)[0]


_TINY = ("--gin_file=models/tiny_lm.gin", "--model_dir={work}/model")
# infer/score look for a checkpoint before reading the input file.
_WITH_CKPTS = ("--gin_file=models/tiny_lm.gin", "--model_dir={work}/ckpts")

CLI_CASES = [
    CliCase("transformer-unknown-flag", T, "A flag the program does not have",
            ("--bogus_flag=1",) + _TINY, ("bogus_flag",)),
    CliCase("transformer-positional-argument", T, "A word without --flag= before it",
            _TINY + ("train",), ("unexpected arguments", "train")),
    CliCase("transformer-unknown-mode", T, "A --mode the program does not have",
            _TINY + ("--mode=bogus",), ("--mode", "bogus")),
    CliCase("transformer-gin-typo", T, "A gin binding of a parameter that does not exist",
            _TINY + ("--gin_param=run.trian_steps = 5",), ("trian_steps",)),
    CliCase("transformer-gin-unquoted-string", T,
            "A string value whose quotes the shell removed",
            _TINY + ("--gin_param=transformer.make_layer_stack.recompute = layer",),
            ("needs quotes", "--gin_param=\"name = 'layer'\"")),
    CliCase("transformer-gin-unclosed-bracket", T, "A gin binding whose bracket is not closed",
            _TINY + ("--gin_param=run.sequence_length = {'inputs': 8",),
            ("run.sequence_length", "not closed")),
    CliCase("transformer-gin-file-missing", T, "A --gin_file that does not exist",
            ("--gin_file=models/nope.gin", "--model_dir={work}/model"), ("nope.gin",)),
    CliCase("transformer-negative-train-steps", T, "run.train_steps below 1",
            _TINY + ("--gin_param=run.train_steps = -5",), ("run.train_steps", "-5")),
    CliCase("transformer-zero-batch-size", T, "run.batch_size of 0",
            _TINY + ("--gin_param=run.batch_size = 0",), ("run.batch_size", "0")),
    CliCase("transformer-zero-sequence-length", T, "A sequence length of 0",
            _TINY + ("--gin_param=run.sequence_length = {'inputs': 0, 'targets': 0}",),
            ("run.sequence_length",)),
    CliCase("transformer-mesh-dim-zero", T, "A mesh dimension of size 0",
            _TINY + ("--gin_param=run.mesh_shape = 'rows:0;cols:4'",), ("'rows'", "size 0")),
    CliCase("transformer-mesh-too-big", T, "A mesh with more processors than devices",
            _TINY + ("--gin_param=run.mesh_shape = 'rows:3;cols:3'",), ("9 devices",)),
    CliCase("transformer-layout-unknown-mesh-dim", T,
            "A layout rule naming a mesh dimension the mesh lacks",
            _TINY + ("--gin_param=run.layout_rules = 'batch:columns'",), ("columns",)),
    CliCase("transformer-no-checkpoint", T, "--mode=infer with a --model_dir that has no checkpoint",
            _TINY + ("--mode=infer", "--input_file={work}/latin1.txt"),
            ("No checkpoint in", "train first")),
    CliCase("transformer-input-missing", T, "--input_file that does not exist (score)",
            _WITH_CKPTS + ("--mode=score", "--input_file={work}/missing.txt"), ("missing.txt",)),
    CliCase("transformer-input-not-utf8", T, "--input_file with bytes that are not UTF-8",
            _WITH_CKPTS + ("--mode=infer", "--input_file={work}/latin1.txt"),
            ("latin1.txt, line 2", "0xe9", "--input_encoding")),
    CliCase("transformer-input-is-directory", T, "--input_file naming a directory",
            _WITH_CKPTS + ("--mode=infer", "--input_file={work}"), ("is a directory",)),
    CliCase("transformer-unknown-encoding", T, "--input_encoding that is no codec",
            _WITH_CKPTS + ("--mode=infer", "--input_file={work}/latin1.txt",
                     "--input_encoding=klingon"), ("klingon",)),
    CliCase("transformer-damaged-checkpoint-path", T,
            "--checkpoint_path naming a damaged checkpoint",
            ("--gin_file=models/tiny_lm.gin", "--model_dir={work}/ckpts", "--mode=eval",
             "--checkpoint_path={work}/ckpts/ckpt-2"),
            ("ckpt-2.data-00000-of-00001", "truncated", "ckpt-1", "--checkpoint_path")),
    CliCase("transformer-no-intact-checkpoint", T, "Every checkpoint of --model_dir damaged",
            ("--gin_file=models/tiny_lm.gin", "--model_dir={work}/all_damaged", "--mode=eval"),
            ("no intact checkpoint", "ckpt-1", "--fresh")),
    CliCase("mnist-unknown-flag", "python examples/mnist.py", "A flag the program does not have",
            ("--bogus=1", "--model_dir={work}/model"), ("bogus",)),
    CliCase("mnist-zero-train-steps", "python examples/mnist.py", "--train_steps=0",
            ("--train_steps=0", "--model_dir={work}/model"), ("--train_steps=0",)),
    CliCase("mnist-no-sklearn", "python examples/mnist.py", "scikit-learn not installed",
            ("--model_dir={work}/model",), ("scikit-learn", "examples/mnist.py")),
    CliCase("conv_spatial-no-sklearn", "python examples/conv_spatial.py",
            "scikit-learn not installed", (), ("scikit-learn", "examples/conv_spatial.py")),
    CliCase("report-unknown-flag", "python -m mesh_tensorflow.report",
            "A flag the program does not have", ("--bogus",), ("--bogus",)),
    CliCase("report-gin-typo", "python -m mesh_tensorflow.report",
            "A gin binding of a parameter that does not exist",
            ("--gin_file=models/tiny_lm.gin", "--gin_param=run.trian_steps = 5"),
            ("trian_steps",)),
    CliCase("report-mesh-dim-zero", "python -m mesh_tensorflow.report",
            "A mesh dimension of size 0",
            ("--gin_file=models/tiny_lm.gin", "--mesh_shape=rows:0;cols:4"), ("'rows'",)),
    CliCase("report-layout-unknown-mesh-dim", "python -m mesh_tensorflow.report",
            "A layout rule naming a mesh dimension the mesh lacks",
            ("--gin_file=models/tiny_lm.gin", "--mesh_shape=data:8", "--layout=batch:dta"),
            ("'batch:dta'", "'data:8'")),
    CliCase("report-bad-memory-budget", "python -m mesh_tensorflow.report",
            "A negative --memory_budget_bytes", ("--auto", "--memory_budget_bytes=-1"),
            ("--memory_budget_bytes=-1",)),
    CliCase("inspect_checkpoint-missing-path", "python -m mesh_tensorflow.inspect_checkpoint",
            "A path that is neither a directory nor a checkpoint", ("{work}/nothing",),
            ("nothing", "no such directory")),
    CliCase("inspect_checkpoint-damaged-index", "python -m mesh_tensorflow.inspect_checkpoint",
            "A checkpoint whose index is damaged", ("{work}/ckpts/ckpt-3",), ("ckpt-3",)),
    CliCase("inspect_checkpoint-verify-damaged-data",
            "python -m mesh_tensorflow.inspect_checkpoint --verify",
            "A checkpoint whose data file is truncated", ("--verify", "{work}/ckpts/ckpt-2"),
            ("ckpt-2.data-00000-of-00001", "truncated")),
    CliCase("inspect_checkpoint-no-path", "python -m mesh_tensorflow.inspect_checkpoint",
            "No path given", (), ("path",)),
    CliCase("launch-no-program", "python -m mesh_tensorflow.launch",
            "No program after --", ("--workers=2",), ("no program",)),
    CliCase("launch-zero-workers", "python -m mesh_tensorflow.launch", "--workers=0",
            ("--workers=0", "--", "examples/mnist.py"), ("--workers=0",)),
    CliCase("launch-bad-cluster-address", "python -m mesh_tensorflow.launch --serve",
            "A worker address without a port", ("--serve", "--cluster=localhost", "--task=0"),
            ("'localhost'", "host:port")),
    CliCase("cost_model-zero-devices", "python -m mesh_tensorflow.analysis.cost_model",
            "--devices=0", ("--calibrate", "--devices=0"), ("--devices=0",)),
    CliCase("cost_model-output-is-directory", "python -m mesh_tensorflow.analysis.cost_model",
            "--output naming a directory", ("--calibrate", "--output={work}"),
            ("is a directory",)),
]

# Cases run in one driver process per group (absl programs each need their own).
ABSL_PROGRAMS = ("transformer", "mnist", "conv_spatial")


def _group(case):
  return case.entry if case.entry in ABSL_PROGRAMS else "tools"


GROUPS = sorted({_group(c) for c in CLI_CASES})


def _save_checkpoints(directory, count):
  """`count` small checkpoints ckpt-1..ckpt-count of a few variables."""
  root = tf.train.Checkpoint(w=tf.Variable(np.arange(64, dtype=np.float32)),
                             b=tf.Variable(np.ones([8], np.float32)))
  manager = tf.train.CheckpointManager(root, directory, max_to_keep=count)
  for n in range(1, count + 1):
    manager.save(checkpoint_number=n)


def _truncate(path):
  with open(path, "r+b") as f:
    f.truncate(os.path.getsize(path) // 2)


def _snapshot(directory):
  out = {}
  for base, _, files in os.walk(directory):
    for name in files:
      path = os.path.join(base, name)
      with open(path, "rb") as f:
        out[os.path.relpath(path, directory)] = f.read()
  return out


@pytest.fixture(scope="module")
def work(tmp_path_factory):
  return make_work(str(tmp_path_factory.mktemp("cli")))


def make_work(work):
  """The files the cases use, in directory `work`."""
  os.makedirs(os.path.join(work, "model"))
  with open(os.path.join(work, "model", "keep.txt"), "w") as f:
    f.write("not to be touched")
  with open(os.path.join(work, "latin1.txt"), "wb") as f:
    f.write("def f(x):\ncaf\u00e9 = 1\n".encode("latin-1"))
  ckpts = os.path.join(work, "ckpts")
  _save_checkpoints(ckpts, 3)
  _truncate(os.path.join(ckpts, "ckpt-2.data-00000-of-00001"))
  with open(os.path.join(ckpts, "ckpt-3.index"), "wb") as f:
    f.write(np.random.default_rng(0).bytes(200))
  damaged = os.path.join(work, "all_damaged")
  _save_checkpoints(damaged, 2)
  for n in (1, 2):
    _truncate(os.path.join(damaged, f"ckpt-{n}.data-00000-of-00001"))
  return work


def _env(**extra):
  env = dict(os.environ, PYTHONPATH=REPO_ROOT)
  for name in ("MTF_VERBOSE", "TF_CPP_MIN_LOG_LEVEL", "MTF_COMMAND_LINE"):
    env.pop(name, None)
  env.update(extra)
  return env


def _start_driver(group, cases, work):
  cases_path = os.path.join(work, f"{group}.cases.json")
  with open(cases_path, "w") as f:
    json.dump([[c.entry, [a.replace("{work}", work) for a in c.argv]] for c in cases], f)
  results_path = os.path.join(work, f"{group}.results.json")
  env = _env(MTF_COMMAND_LINE="1")
  if group in ("mnist", "conv_spatial"):
    env["CLI_DRIVER_HIDE_SKLEARN"] = "1"
  proc = subprocess.Popen([sys.executable, DRIVER, cases_path, results_path],
                          cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
  return proc, results_path


REAL_CASES = [
    # (id, argv after python, extra env, expect traceback)
    ("transformer", ["-m", "mesh_tensorflow.transformer.main", "--gin_file=models/tiny_lm.gin",
                     "--gin_param=run.train_steps = -5", "--model_dir={work}/model"], {}, False),
    ("transformer-verbose", ["-m", "mesh_tensorflow.transformer.main",
                             "--gin_file=models/tiny_lm.gin",
                             "--gin_param=run.train_steps = -5", "--model_dir={work}/model"],
     {"MTF_VERBOSE": "1"}, True),
    ("mnist", ["examples/mnist.py", "--train_steps=-1", "--model_dir={work}/model"], {}, False),
    ("launch", ["-m", "mesh_tensorflow.distributed.launch", "--workers=0", "--", "examples/mnist.py"],
     {}, False),
]


@pytest.fixture(scope="module")
def results(work):
  """{case id: {"code", "stdout", "stderr"}} of every case, driver and real."""
  before = {d: _snapshot(os.path.join(work, d)) for d in ("model", "ckpts", "all_damaged")}
  started = {}
  for group in GROUPS:
    started[group] = _start_driver(group, [c for c in CLI_CASES if _group(c) == group], work)
  real = {}
  for name, argv, env, _ in REAL_CASES:
    real[name] = subprocess.Popen([sys.executable] + [a.replace("{work}", work) for a in argv],
                                  cwd=REPO_ROOT, env=_env(**env), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
  out = {}
  for group, (proc, path) in started.items():
    log, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, f"driver for {group} failed:\n{log[-3000:]}"
    with open(path) as f:
      for case, result in zip([c for c in CLI_CASES if _group(c) == group], json.load(f)):
        out[case.id] = result
  for name, proc in real.items():
    stdout, stderr = proc.communicate(timeout=300)
    out["real:" + name] = {"code": proc.returncode, "stdout": stdout, "stderr": stderr}
  after = {d: _snapshot(os.path.join(work, d)) for d in before}
  out["snapshots"] = (before, after)
  return out


@pytest.mark.parametrize("case", CLI_CASES, ids=[c.id for c in CLI_CASES])
def test_user_error_is_one_line_and_status_2(results, case):
  result = results[case.id]
  stderr = result["stderr"]
  assert result["code"] == 2, f"{case.id}: status {result['code']}\n{stderr[-3000:]}"
  assert "Traceback" not in stderr, stderr[-3000:]
  errors = [line for line in stderr.splitlines() if line.startswith("error:")]
  assert len(errors) == 1, stderr[-3000:]
  missing = [s for s in case.message_has if s not in errors[0]]
  assert not missing, f"{case.id}: the error line lacks {missing}: {errors[0]}"
  assert any(line.startswith("hint:") for line in stderr.splitlines()), stderr


def test_nothing_written_or_deleted(results):
  before, after = results["snapshots"]
  assert after == before


@pytest.mark.parametrize("name", [c[0] for c in REAL_CASES])
def test_real_command_line(results, name):
  """The real commands: status 2, the error and hint lines only (TensorFlow's
  start-up lines quiet), a traceback only when asked for."""
  result = results["real:" + name]
  stderr = result["stderr"]
  assert result["code"] == 2, stderr[-3000:]
  verbose = dict((c[0], c[3]) for c in REAL_CASES)[name]
  lines = stderr.splitlines()
  assert sum(line.startswith("error:") for line in lines) == 1, stderr[-3000:]
  if verbose:
    assert "Traceback" in stderr
  else:
    assert [line.split(":")[0] for line in lines] == ["error", "hint"], stderr[-3000:]


def _table_rows(path):
  with open(path) as f:
    text = f.read()
  return re.findall(r"^\| `([a-z_]+-[a-z0-9-]+)` \| `([^`]+)` \| (.+?) \|", text, flags=re.M)


@pytest.mark.parametrize("doc", ["tests/ERRORS.md", "docs/errors.md"])
def test_tables_mirror_cli_cases(doc):
  rows = _table_rows(os.path.join(REPO_ROOT, doc))
  assert rows == [(c.id, c.command, c.description) for c in CLI_CASES]


def test_cli_classifies_errors():
  from mesh_tensorflow import cli  # pylint: disable=g-import-not-at-top
  assert cli.is_user_error(cli.UserError("x"))
  assert cli.is_user_error(FileNotFoundError(2, "no such file", "x.txt"))
  assert not cli.is_user_error(IndexError("list index out of range"))
  assert not cli.is_user_error(ZeroDivisionError("integer modulo by zero"))
  try:
    np.zeros(3).reshape(4)
  except ValueError as e:  # raised by NumPy, not by our validation: a bug
    assert not cli.is_user_error(e)
  assert cli.strip_verbose(["p", "--verbose", "--", "c.py", "--verbose"]) == [
      "p", "--", "c.py", "--verbose"]
  assert cli.verbose_requested(["p", "--verbose"])
  assert not cli.verbose_requested(["p", "--", "c.py", "--verbose"]) or os.environ.get(
      "MTF_VERBOSE")
  assert cli.one_line("bad\n  In call to configurable 'run' (<function run at 0x1>)") == "bad"

  def bug(argv):
    return [][1]
  with pytest.raises(IndexError):  # internal errors keep their traceback
    cli.run_main(bug, ["prog"])


def test_quiet_startup_filter():
  from mesh_tensorflow import cli  # pylint: disable=g-import-not-at-top
  text = ("WARNING: All log messages before absl::InitializeLog() is called are written to "
          "STDERR\nI0000 00:00:1.2 1 port.cc:153] oneDNN custom operations are on.\n"
          "I0000 00:00:1.3 1 cpu_feature_guard.cc:227] This TensorFlow binary is optimized\n"
          "To enable the following instructions: AVX2, in other operations, rebuild\n"
          "E0000 00:00:1.4 1 cuda_platform.cc:52] failed call to cuInit\n"
          "Fatal Python error: something real\n")
  assert cli._filter_startup_lines(text, 3) == "Fatal Python error: something real\n"
  kept = cli._filter_startup_lines(text, 2)
  assert "cuInit" in kept and "oneDNN" not in kept and "To enable" not in kept


def _port_open(port):
  with socket.socket() as s:
    s.settimeout(0.5)
    return s.connect_ex(("127.0.0.1", port)) == 0


def test_launcher_says_who_can_reach_workers_and_cleans_up(tmp_path):
  """A one-worker cluster on loopback: the first line warns about exposure,
  the worker's log says where TensorFlow listens, and after the client ends
  the worker process is gone and its port closed."""
  from mesh_tensorflow.distributed import launch  # pylint: disable=g-import-not-at-top
  lines = []
  client = [sys.executable, "-c", "import os; print(os.environ['MTF_CLUSTER'])"]
  launcher = launch.Launcher(client, workers=1, devices_per_worker=1, log=lines.append,
                             log_dir=str(tmp_path), env={"PYTHONPATH": REPO_ROOT},
                             kill_grace_s=2.0)
  # The client may finish before the worker is up: wait for the worker's log.
  result = launcher.run()
  assert result.returncode == 0, lines
  assert lines[0].startswith("[launch] note:") and "unauthenticated" in lines[0]
  assert "0.0.0.0" in lines[0] and "firewall" in lines[0]
  attempt = result.attempts[0]
  port = int(attempt.addresses[0].rpartition(":")[2])
  for pid in attempt.worker_pids:
    with pytest.raises(ProcessLookupError):
      deadline = time.monotonic() + 10
      while time.monotonic() < deadline:
        os.kill(pid, 0)
        time.sleep(0.1)
      os.kill(pid, 0)
  assert not _port_open(port)
  assert os.listdir(tmp_path)  # the worker's log is kept for the user


COMMAND_MODULES = ("report.py", "launch.py", "check_devices.py", "inspect_checkpoint.py",
                   "export_original_checkpoint.py", "transformer/main.py",
                   "analysis/cost_model/__main__.py", "bert/run_classifier.py",
                   "bert/run_squad.py", "bert/run_pretraining.py")


@pytest.mark.parametrize("path", COMMAND_MODULES)
def test_command_help_text_says_each_thing_once(path):
  """A command's --help starts with its module docstring: no line twice."""
  import ast  # pylint: disable=g-import-not-at-top
  with open(os.path.join(REPO_ROOT, "mesh_tensorflow", path), encoding="utf-8") as f:
    doc = ast.get_docstring(ast.parse(f.read())) or ""
  lines = [line.strip() for line in doc.splitlines() if len(line.strip()) > 30]
  repeated = sorted({line for line in lines if lines.count(line) > 1})
  assert not repeated, f"{path}: its help text repeats {repeated}"
