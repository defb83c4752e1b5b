"""Runs many command lines of one entry point in one process (for
tests/project/test_cli_errors.py): each through the same wrapper as the real command
(mesh_tensorflow.cli.run_main / run_absl_main), with stdout and stderr
captured, so a case costs milliseconds instead of a TensorFlow start-up.

    python tests/cli_driver.py CASES.json RESULTS.json

CASES.json is a list of [entry, argv] pairs (argv without the program name,
entry one of ENTRIES); RESULTS.json gets one {"code", "stdout", "stderr"} per
case. Programs with absl flags define the same flag names, so one process
runs cases of at most one of "transformer", "mnist" and "conv_spatial".
With --stop_on_error, the cases after the first that fails are not run.

Tests that run a workflow (train, resume, evaluate, decode: each command
reading what the one before wrote) call `run_commands`, which starts this
file once for all of them: a fresh process, as a user's, without paying
TensorFlow's start-up for every command.
"""

import contextlib
import importlib.util
import io
import json
import os
import subprocess
import sys
import tempfile
import traceback
from typing import Dict, List, Optional, Sequence

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _example(name):
  path = os.path.join(REPO_ROOT, "examples", f"{name}.py")
  spec = importlib.util.spec_from_file_location(f"example_{name}", path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module  # dataclasses look their module up there
  spec.loader.exec_module(module)
  return module


def _absl(main):
  from absl import flags  # pylint: disable=g-import-not-at-top
  from mesh_tensorflow import cli  # pylint: disable=g-import-not-at-top

  def run(argv):
    flags.FLAGS.unparse_flags()
    return cli.run_absl_main(main, ["prog"] + argv)
  return run


def _own_flags(main):
  return main  # these main(argv) functions wrap themselves in cli.run_main


def _entry(name):
  if name == "transformer":
    from mesh_tensorflow.transformer import main  # pylint: disable=g-import-not-at-top
    return _absl(main.main)
  if name in ("mnist", "conv_spatial"):
    if os.environ.get("CLI_DRIVER_HIDE_SKLEARN"):
      sys.modules["sklearn"] = None  # as if scikit-learn were not installed
    return _absl(_example(name).main)
  if name == "report":
    from mesh_tensorflow import report  # pylint: disable=g-import-not-at-top
    return _own_flags(report.main)
  if name == "inspect_checkpoint":
    from mesh_tensorflow import inspect_checkpoint  # pylint: disable=g-import-not-at-top
    return _own_flags(inspect_checkpoint.main)
  if name == "launch":
    from mesh_tensorflow.distributed import launch  # pylint: disable=g-import-not-at-top
    return _own_flags(launch.main)
  if name == "cost_model":
    from mesh_tensorflow.analysis import cost_model  # pylint: disable=g-import-not-at-top
    return _own_flags(cost_model.main)
  raise SystemExit(f"unknown entry {name!r}")


ENTRIES = ("transformer", "mnist", "conv_spatial", "report", "inspect_checkpoint", "launch",
           "cost_model")


def run_commands(entry: str, argvs: Sequence[Sequence[str]], cwd: Optional[str] = None,
                 env: Optional[Dict[str, str]] = None, timeout: float = 900) -> List[str]:
  """Runs `entry` (one of ENTRIES) with each argv in turn, in one fresh
  process, cwd defaulting to the repository; returns each command's stdout.
  Fails (AssertionError with the command's output) at the first command
  that exits with a status other than 0; the later ones are not run."""
  env = dict(os.environ if env is None else env)
  env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  with tempfile.TemporaryDirectory() as work:
    cases_path = os.path.join(work, "cases.json")
    results_path = os.path.join(work, "results.json")
    with open(cases_path, "w") as f:
      json.dump([[entry, [str(a) for a in argv]] for argv in argvs], f)
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), cases_path, results_path,
                           "--stop_on_error"], cwd=cwd or REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)
    assert proc.returncode == 0 and os.path.exists(results_path), (
        f"cli_driver exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-4000:]}")
    with open(results_path) as f:
      results = json.load(f)
  for argv, result in zip(argvs, results):
    assert result["code"] in (0, None), (
        f"{entry} {' '.join(map(str, argv))}: exit {result['code']}\n"
        f"{result['stdout'][-3000:]}\n{result['stderr'][-4000:]}")
  assert len(results) == len(argvs)
  return [r["stdout"] for r in results]


def main():
  cases_path, results_path = sys.argv[1:3]
  stop_on_error = "--stop_on_error" in sys.argv[3:]
  with open(cases_path) as f:
    cases = json.load(f)
  runners = {}
  results = []
  for entry, argv in cases:
    if entry not in runners:
      runners[entry] = _entry(entry)
    run = runners[entry]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
      try:
        code = run(argv)
      except SystemExit as e:
        code = e.code
      except BaseException:  # pylint: disable=broad-except
        traceback.print_exc()
        code = "uncaught"
    results.append({"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()})
    if stop_on_error and code not in (0, None):
      break
  with open(results_path, "w") as f:
    json.dump(results, f)


if __name__ == "__main__":
  main()
