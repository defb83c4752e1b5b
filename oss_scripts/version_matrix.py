r"""Tests the built wheel against several TensorFlow and Python versions.

    python oss_scripts/version_matrix.py [--tensorflow=2.16,2.18,2.21,nightly]
        [--python=3.10,3.11,3.12,3.13] [--workdir=DIR] [--results=FILE]
        [--order=2.16/3.11,... [--only]] [--markdown=FILE]

Builds the wheel once (`python -m build --wheel`), then for every combination
(one at a time): makes a virtual environment with that Python, installs that
TensorFlow (`tensorflow-cpu==X.Y.*`, or `tf-nightly`) the way a user with a
TensorFlow already in place would, installs the wheel beside it and checks
that this did not replace or add a TensorFlow distribution nor change NumPy,
installs the `test` extra under the environment's TensorFlow and NumPy
versions (a test tool may want a newer NumPy than that TensorFlow takes), and
checks that `mesh_tensorflow` is imported from the environment, and runs a fast
subset of the test suite from a copy of tests/ (the source tree is not on the
path): the language core (ops and their gradients, lowered), the
transformer command line training, resuming from its checkpoint, evaluating
and decoding, checkpoints restored under other meshes, and model directories
written by the original Mesh TensorFlow 0.1.21.

A Python that a TensorFlow has no wheel for is reported as such (not a
failure). Each cell's result goes into a JSON results file (default
DIR/results.json); a later run with the same file runs only the cells it does
not hold yet (--rerun: all), and several runs may share one file, so cells
can run in separate processes (--order picks the cells to run first, --only
just those). Prints a markdown table of the whole grid ("not run" for cells
not run yet); --markdown writes it into a page, between the page's table
markers, after every cell. Needs `build` (`pip install build`) and the
Python versions as python3.X (on PATH or installed by pyenv). Exit status 1
if any cell failed.
"""

from __future__ import annotations

import argparse
import dataclasses
import fcntl
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import List, Optional, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TENSORFLOWS = ("2.16", "2.18", "2.21", "nightly")
PYTHONS = ("3.10", "3.11", "3.12", "3.13")
# The fast subset: language core, training with a checkpoint resume and the
# transformer CLI, checkpoints across meshes, the original's model directories.
SUBSET = (
    "tests/operations/test_gradients.py",
    "tests/transformer/test_transformer_cli.py::test_language_model_train_resume_eval_infer_score",
    "tests/training/test_checkpoint.py",
    "tests/transformer/test_original_model_dirs.py",
)
TABLE_BEGIN = "<!-- version matrix table: begin -->"
TABLE_END = "<!-- version matrix table: end -->"
TENSORFLOW_DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tf-nightly", "tf-nightly-cpu",
                            "tensorflow-intel", "tensorflow-macos")


@dataclasses.dataclass
class Cell:
  tensorflow: str
  python: str
  status: str = "not run"      # passed | failed | no wheel | not run
  detail: str = ""
  tensorflow_version: str = ""
  numpy_version: str = ""
  seconds: float = 0.0


def _run(command: Sequence[str], log, cwd: Optional[str] = None, env=None,
         timeout: float = 3600) -> subprocess.CompletedProcess:
  log.write(f"\n$ {' '.join(command)}\n")
  log.flush()
  proc = subprocess.run(list(command), cwd=cwd, env=env, capture_output=True, text=True,
                        timeout=timeout, check=False)
  log.write(proc.stdout + proc.stderr)
  log.flush()
  return proc


def _clean_env() -> dict:
  env = {k: v for k, v in os.environ.items()
         if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PIP_REQUIRE_VIRTUALENV")}
  env["TF_CPP_MIN_LOG_LEVEL"] = "2"
  env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
  return env


def build_wheel(workdir: str, log) -> str:
  """Builds the sdist and from it the wheel into workdir/dist, from a copy
  of the source (so that the build writes nothing into the source tree and
  several runs can build at once); returns the wheel's path."""
  dist, source = os.path.join(workdir, "dist"), os.path.join(workdir, "source")
  for folder in (dist, source):
    shutil.rmtree(folder, ignore_errors=True)
  os.makedirs(source)
  for name in ("setup.py", "setup.cfg", "README.md", "LICENSE"):
    shutil.copy(os.path.join(REPO, name), source)
  shutil.copytree(os.path.join(REPO, "mesh_tensorflow"), os.path.join(source, "mesh_tensorflow"),
                  ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
  proc = _run([sys.executable, "-m", "build", "--outdir", dist, source], log, env=_clean_env())
  if proc.returncode != 0:
    raise SystemExit(f"error: building the wheel failed (see {log.name})")
  wheels = [f for f in os.listdir(dist) if f.endswith(".whl")]
  return os.path.join(dist, wheels[0])


def copy_tests(workdir: str) -> str:
  """tests/ and setup.cfg (the pytest settings) in a folder without the package."""
  suite = os.path.join(workdir, "suite")
  shutil.rmtree(suite, ignore_errors=True)
  os.makedirs(suite)
  shutil.copytree(os.path.join(REPO, "tests"), os.path.join(suite, "tests"),
                  ignore=shutil.ignore_patterns("__pycache__"))
  shutil.copy(os.path.join(REPO, "setup.cfg"), suite)
  return suite


def _tensorflow_requirement(tensorflow: str) -> List[str]:
  if tensorflow == "nightly":
    return ["--pre", "tf-nightly"]
  return [f"tensorflow-cpu=={tensorflow}.*"]


def _distributions(python: str, log) -> dict:
  proc = _run([python, "-m", "pip", "list", "--format=freeze"], log, env=_clean_env())
  out = {}
  for line in proc.stdout.splitlines():
    if "==" in line:
      name, version = line.split("==", 1)
      out[name.lower().replace("_", "-")] = version
  return out


def find_python(version: str) -> Optional[str]:
  """An interpreter of Python `version`: python3.X on PATH if it runs, else
  one that pyenv installed."""
  candidates = [shutil.which(f"python{version}")]
  root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
  candidates += sorted(glob.glob(os.path.join(root, "versions", f"{version}.*", "bin",
                                              f"python{version}")), reverse=True)
  for candidate in filter(None, candidates):
    if subprocess.run([candidate, "-c", "pass"], capture_output=True,
                      check=False).returncode == 0:
      return candidate
  return None


def run_cell(cell: Cell, wheel: str, suite: str, workdir: str, log) -> None:
  """Makes the cell's environment, installs, checks and tests; fills `cell`."""
  start = time.time()
  env = _clean_env()
  interpreter = find_python(cell.python)
  if interpreter is None:
    cell.status, cell.detail = "not run", f"no python{cell.python} on PATH"
    return
  venv = os.path.join(workdir, "venvs", f"tf{cell.tensorflow}-py{cell.python}")
  shutil.rmtree(venv, ignore_errors=True)
  if _run([interpreter, "-m", "venv", venv], log, env=env).returncode != 0:
    cell.status, cell.detail = "failed", "venv"
    return
  python = os.path.join(venv, "bin", "python")
  pip = [python, "-m", "pip", "install", "--quiet", "--no-compile"]
  _run(pip + ["--upgrade", "pip"], log, env=env)
  proc = _run(pip + _tensorflow_requirement(cell.tensorflow), log, env=env)
  if proc.returncode != 0:
    if "No matching distribution" in proc.stdout + proc.stderr:
      cell.status, cell.detail = "no wheel", f"TensorFlow {cell.tensorflow} has no Python {cell.python} wheel"
    else:
      cell.status, cell.detail = "failed", "installing TensorFlow"
    return
  before = _distributions(python, log)
  kept = {d: v for d, v in before.items() if d in TENSORFLOW_DISTRIBUTIONS + ("numpy",)}
  # The wheel as a user installs it: it must leave TensorFlow and NumPy alone.
  proc = _run(pip + [wheel], log, env=env)
  if proc.returncode != 0:
    cell.status, cell.detail = "failed", "installing the wheel"
    return
  after = _distributions(python, log)
  changed = {d: (v, after.get(d)) for d, v in kept.items() if after.get(d) != v}
  added = sorted(d for d in after if d in TENSORFLOW_DISTRIBUTIONS and d not in kept)
  if changed or added:
    cell.status, cell.detail = "failed", f"the wheel changed {changed or added}"
    return
  # The test tools (matplotlib, scikit-learn, ...) may want a newer NumPy than
  # this TensorFlow takes: they are installed under the environment's own
  # TensorFlow and NumPy versions.
  constraints = os.path.join(venv, "constraints.txt")
  with open(constraints, "w", encoding="utf-8") as f:
    f.write("".join(f"{d}=={v}\n" for d, v in kept.items()))
  proc = _run(pip + ["-c", constraints, f"{wheel}[test]"], log, env=env)
  if proc.returncode != 0:
    cell.status, cell.detail = "failed", "installing the test extra"
    return
  cell.numpy_version = _distributions(python, log).get("numpy", "")
  probe = _run([python, "-c", "import mesh_tensorflow, tensorflow as tf; "
                "print(mesh_tensorflow.__file__); print(tf.__version__)"],
               log, cwd=suite, env=env)
  lines = probe.stdout.split()
  if probe.returncode != 0 or len(lines) < 2:
    cell.status, cell.detail = "failed", "import mesh_tensorflow"
    return
  if not os.path.realpath(lines[0]).startswith(os.path.realpath(venv)):
    cell.status, cell.detail = "failed", f"imported from {lines[0]}"
    return
  cell.tensorflow_version = lines[1]
  proc = _run([python, "-m", "pytest", *SUBSET, "-q", "-p", "no:cacheprovider"], log, cwd=suite,
              env=env)
  summary = [l for l in (proc.stdout + proc.stderr).splitlines() if re.search(r"\d+ (passed|failed)", l)]
  cell.detail = re.sub(r"=+", "", summary[-1]).strip() if summary else f"pytest exit {proc.returncode}"
  cell.detail = re.sub(r" in [\d.]+s.*$", "", cell.detail)
  cell.status = "passed" if proc.returncode == 0 else "failed"
  cell.seconds = time.time() - start


def load_results(path: str) -> dict:
  if not os.path.exists(path):
    return {}
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def record_result(path: str, cell: Cell) -> None:
  """Adds one cell's result to the results file (several runs may share it)."""
  with open(path + ".lock", "w", encoding="utf-8") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    results = load_results(path)
    results[f"{cell.tensorflow}/{cell.python}"] = dataclasses.asdict(cell)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
      json.dump(results, f, indent=1, sort_keys=True)
    os.replace(path + ".tmp", path)


def table(cells: Sequence[Cell]) -> str:
  lines = ["| TensorFlow | Python | result | tests | TensorFlow installed | NumPy |",
           "|---|---|---|---|---|---|"]
  for c in cells:
    name = "tf-nightly" if c.tensorflow == "nightly" else c.tensorflow
    lines.append(f"| {name} | {c.python} | {c.status} | {c.detail} | "
                 f"{c.tensorflow_version} | {c.numpy_version} |")
  return "\n".join(lines) + "\n"


def write_markdown(path: str, text: str) -> None:
  with open(path, encoding="utf-8") as f:
    page = f.read()
  begin, end = page.index(TABLE_BEGIN) + len(TABLE_BEGIN), page.index(TABLE_END)
  with open(path, "w", encoding="utf-8") as f:
    f.write(page[:begin] + "\n" + text + page[end:])


def main(argv: Optional[Sequence[str]] = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--tensorflow", default=",".join(TENSORFLOWS),
                      help="TensorFlow versions (X.Y or nightly), comma-separated")
  parser.add_argument("--python", default=",".join(PYTHONS),
                      help="Python versions, comma-separated")
  parser.add_argument("--order", default=None,
                      help="run these TF/Python cells first, e.g. 2.16/3.11,nightly/3.12 "
                           "(a cell not in the grid is ignored)")
  parser.add_argument("--only", action="store_true",
                      help="with --order: run only the cells it names")
  parser.add_argument("--workdir", default=None,
                      help="where the environments go (default: a new temporary folder)")
  parser.add_argument("--results", default=None,
                      help="a JSON file of cell results (default: workdir/results.json); "
                           "cells it holds are not run again unless --rerun")
  parser.add_argument("--rerun", action="store_true", help="run cells the results file holds")
  parser.add_argument("--markdown", default=None,
                      help="a page whose table (between its table markers) is replaced")
  args = parser.parse_args(argv)
  workdir = args.workdir or tempfile.mkdtemp(prefix="mtf_version_matrix_")
  os.makedirs(workdir, exist_ok=True)
  cells = [Cell(t.strip(), p.strip()) for t in args.tensorflow.split(",")
           for p in args.python.split(",")]
  results_path = args.results or os.path.join(workdir, "results.json")
  done = load_results(results_path)
  for cell in cells:
    key = f"{cell.tensorflow}/{cell.python}"
    if key in done and not args.rerun:
      cell.__dict__.update(done[key])
  pending = [c for c in cells if c.status == "not run"]
  if args.order:
    first = [tuple(c.split("/")) for c in args.order.split(",")]
    rank = {key: i for i, key in enumerate(first)}
    run_order = sorted(pending, key=lambda c: rank.get((c.tensorflow, c.python), len(rank)))
    if args.only:
      run_order = [c for c in run_order if (c.tensorflow, c.python) in rank]
  else:
    run_order = pending
  with open(os.path.join(workdir, "log.txt"), "a", encoding="utf-8") as log:
    print(f"workdir {workdir} (log: {log.name})", file=sys.stderr)
    wheel = build_wheel(workdir, log) if run_order else ""
    suite = copy_tests(workdir) if run_order else ""
    for cell in run_order:
      print(f"TensorFlow {cell.tensorflow}, Python {cell.python} ...", file=sys.stderr, flush=True)
      try:
        run_cell(cell, wheel, suite, workdir, log)
      except subprocess.TimeoutExpired as e:
        cell.status, cell.detail = "failed", f"timed out: {' '.join(map(str, e.cmd))[:60]}"
      print(f"  {cell.status}: {cell.detail} ({cell.seconds:.0f} s)", file=sys.stderr, flush=True)
      if cell.status != "not run":
        record_result(results_path, cell)
        for other in cells:  # what other runs sharing the file have finished
          other.__dict__.update(load_results(results_path).get(
              f"{other.tensorflow}/{other.python}", {}))
      shutil.rmtree(os.path.join(workdir, "venvs", f"tf{cell.tensorflow}-py{cell.python}"),
                    ignore_errors=True)
      if args.markdown:  # the table so far, so that a stopped run still leaves it
        write_markdown(args.markdown, table(cells))
  text = table(cells)
  print(text)
  if args.markdown:
    write_markdown(args.markdown, text)
  return 1 if any(c.status == "failed" for c in cells) else 0


if __name__ == "__main__":
  sys.exit(main())
