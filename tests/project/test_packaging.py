"""The package as users get it: the wheel and sdist `python -m build` makes,
installed into a fresh environment and run from outside the source tree;
what importing it says when TensorFlow is missing, broken or too old; the
metadata against the version matrix; and the warnings policy that turns
TensorFlow's, Keras's and NumPy's deprecations of this library's own calls
into test failures."""

import os
import pathlib
import re
import shutil
import subprocess
import sys
import tarfile
import textwrap
import zipfile

import pytest

from mesh_tensorflow import _environment

pytestmark = pytest.mark.xdist_group("packaging")

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE_DIR = ROOT / "mesh_tensorflow"


def _package_files():
  """Every file of the package in the source tree (relative, '/'-separated)."""
  return sorted(str(p.relative_to(ROOT)).replace(os.sep, "/")
                for p in PACKAGE_DIR.rglob("*")
                if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc")


def _clean_env(**extra):
  env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MTF_VERBOSE")}
  env.update(TF_CPP_MIN_LOG_LEVEL="2", PIP_DISABLE_PIP_VERSION_CHECK="1", **extra)
  return env


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
  """(sdist, wheel) that `python -m build` makes from a copy of the source
  (so the build writes nothing into the source tree); the wheel is built from
  the sdist, so a file missing from the sdist is missing from the wheel too."""
  work = tmp_path_factory.mktemp("build")
  source = work / "source"
  source.mkdir()
  for name in ("setup.py", "setup.cfg", "README.md", "LICENSE"):
    shutil.copy(ROOT / name, source / name)
  shutil.copytree(PACKAGE_DIR, source / "mesh_tensorflow",
                  ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
  out = work / "dist"
  proc = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out),
                         str(source)], capture_output=True, text=True, env=_clean_env(),
                        timeout=300, check=False)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  (sdist,) = out.glob("*.tar.gz")
  (wheel,) = out.glob("*.whl")
  return sdist, wheel


def test_sdist_and_wheel_carry_every_package_file_and_the_console_script(dist):
  sdist, wheel = dist
  expected = _package_files()
  gin_files = [f for f in expected if f.startswith("mesh_tensorflow/transformer/gin/")]
  assert len(gin_files) >= 20 and "mesh_tensorflow/transformer/gin/defaults.gin" in gin_files
  with zipfile.ZipFile(wheel) as whl:
    names = set(whl.namelist())
    info = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    entry_points = whl.read(info).decode()
    metadata = whl.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
  assert not [f for f in expected if f not in names], "files missing from the wheel"
  assert not [n for n in names if not n.startswith(("mesh_tensorflow/", "mesh_tensorflow-"))]
  assert re.search(r"^mtf-transformer = mesh_tensorflow\.transformer\.main:console_main$",
                   entry_points, re.M), entry_points
  with tarfile.open(sdist) as tar:
    top = tar.getnames()[0].split("/")[0]
    in_sdist = {n[len(top) + 1:] for n in tar.getnames()}
  assert not [f for f in expected + ["setup.py", "setup.cfg", "README.md", "LICENSE"]
              if f not in in_sdist], "files missing from the sdist"
  # TensorFlow only through an extra: installing never replaces the user's build.
  requires = re.findall(r"^Requires-Dist: (.*)$", metadata, re.M)
  unconditional = [r for r in requires if "extra ==" not in r]
  assert sorted(re.split(r"[<>=;\s]", r)[0] for r in unconditional) == [
      "absl-py", "gin-config", "numpy"], unconditional
  # TensorFlow 2.21 does not require TensorBoard, which training writes summaries with.
  for extra in ("tensorflow", "tensorflow-cpu", "test"):
    assert f'Requires-Dist: tensorboard; extra == "{extra}"' in metadata
  extras = set(re.findall(r"^Provides-Extra: (.*)$", metadata, re.M))
  assert {"tensorflow", "tensorflow-cpu", "tensorboard", "test", "examples", "report",
          "sentencepiece", "tfds", "docs"} <= extras


def _matrix_table():
  """[(tensorflow, python, result)] of docs/version_matrix.md's table."""
  rows = []
  for line in (ROOT / "docs" / "version_matrix.md").read_text().splitlines():
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if len(cells) >= 3 and re.match(r"^(\d+\.\d+|tf-nightly)$", cells[0]):
      rows.append((cells[0], cells[1], cells[2]))
  return rows


def test_metadata_says_what_the_version_matrix_shows(dist):
  rows = _matrix_table()
  assert rows, "docs/version_matrix.md has no table"
  assert not [r for r in rows if r[2] == "failed"], f"failed cells in the matrix: {rows}"
  passed = [r for r in rows if r[2] == "passed"]
  releases = sorted({tuple(map(int, t.split("."))) for t, _, _ in passed if t != "tf-nightly"})
  pythons = sorted({p for _, p, _ in passed}, key=lambda v: tuple(map(int, v.split("."))))
  assert (releases[0], releases[-1]) == _environment.TESTED_TENSORFLOW
  with zipfile.ZipFile(dist[1]) as whl:
    metadata = whl.read(next(n for n in whl.namelist()
                             if n.endswith(".dist-info/METADATA"))).decode()
  (low, high) = _environment.TESTED_TENSORFLOW
  bounds = f"<{high[0]}.{high[1] + 1},>={low[0]}.{low[1]}"
  for extra in ("tensorflow", "tensorflow-cpu"):
    assert f'Requires-Dist: {extra}{bounds}; extra == "{extra}"' in metadata
  classified = re.findall(r"^Classifier: Programming Language :: Python :: (3\.\d+)$",
                          metadata, re.M)
  assert classified == pythons
  from packaging.specifiers import SpecifierSet  # pylint: disable=g-import-not-at-top
  requires_python = SpecifierSet(re.search(r"^Requires-Python: (.*)$", metadata, re.M).group(1))
  allowed = [f"3.{m}" for m in range(6, 20) if f"3.{m}.1" in requires_python]
  assert allowed == pythons, (str(requires_python), pythons)


def test_wheel_in_a_fresh_environment_runs_the_main_job(dist, tmp_path):
  """The wheel installed into a new virtual environment (reusing this
  environment's TensorFlow) runs the main job for a few steps from a
  directory outside the source tree, importing the installed copy."""
  venv = tmp_path / "venv"
  subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip",
                  str(venv)], check=True, timeout=120)
  python = venv / "bin" / "python"
  # This environment's pip installs into the venv (which has none of its own);
  # --ignore-installed: the source tree's own install is visible there too;
  # --no-compile: the bytecode files below are then written by the run.
  proc = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install",
                         "--quiet", "--no-deps", "--no-index", "--ignore-installed",
                         "--no-compile", str(dist[1])],
                        capture_output=True, text=True, env=_clean_env(), timeout=300,
                        check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  (installed,) = venv.glob("lib/python3.*/site-packages/mesh_tensorflow")
  assert not list(installed.rglob("*.pyc"))
  script = (venv / "bin" / "mtf-transformer").read_text()
  assert script.startswith(f"#!{python}") and "console_main" in script, script
  work = tmp_path / "elsewhere"
  work.mkdir()
  params = ["num_layers = 1", "d_model = 32", "d_ff = 64", "num_heads = 8", "d_kv = 8",
            "run.batch_size = 8", "run.train_steps = 2", "run.eval_steps = 1",
            "run.log_every = 1", "run.num_samples = 0",
            "dataset_fn.corpus_bytes = 300000", "dataset_fn.shuffle_buffer = 200",
            "run.sequence_length = {'inputs': 16, 'targets': 16}"]
  env = _clean_env()
  env.pop("PYTHONDONTWRITEBYTECODE", None)
  proc = subprocess.run(
      [str(python), "-m", "mesh_tensorflow.transformer.main", f"--model_dir={work / 'model'}",
       "--gin_file=models/tiny_lm.gin", *[f"--gin_param={p}" for p in params]],
      cwd=work, capture_output=True, text=True, env=env, timeout=600, check=False)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert re.search(r"^final: .*step=2\b", proc.stdout, re.M), proc.stdout[-3000:]
  assert list((work / "model").glob("*.index")), list((work / "model").iterdir())
  # The run imported the installed copy: it compiled the installed modules.
  compiled = {p.name.split(".")[0] for p in installed.rglob("*.pyc")}
  assert {"__init__", "_environment", "utils", "trainer"} <= compiled, sorted(compiled)


# ---- importing with no TensorFlow, a broken one, an old one -------------------

def _stub_tensorflow(directory, body):
  package = directory / "tensorflow"
  package.mkdir(parents=True)
  (package / "__init__.py").write_text(textwrap.dedent(body))
  return directory


def _import(tmp_path, stub_body=None, command=False, no_site=False):
  """Imports mesh_tensorflow (or runs its main command) in a subprocess with
  a stub `tensorflow` package first on the path (or none at all)."""
  path = [str(ROOT)]
  if stub_body is not None:
    path.insert(0, str(_stub_tensorflow(tmp_path / "stub", stub_body)))
  args = ["-m", "mesh_tensorflow.transformer.main"] if command else ["-c", "import mesh_tensorflow"]
  return subprocess.run([sys.executable, *(["-S"] if no_site else []), *args], cwd=tmp_path,
                        capture_output=True, text=True, timeout=120, check=False,
                        env=_clean_env(PYTHONPATH=os.pathsep.join(path)))


def _one_error_line(proc):
  lines = proc.stderr.strip().splitlines()
  assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), (
      proc.returncode, proc.stderr)
  return lines[0]


def test_importing_with_an_old_tensorflow_says_how_to_upgrade(tmp_path):
  proc = _import(tmp_path, "__version__ = '2.10.1'\n")
  assert proc.returncode != 0
  last = proc.stderr.strip().splitlines()[-1]
  assert last == ('mesh_tensorflow._environment.TensorFlowUnavailable: mesh_tensorflow needs '
                  'TensorFlow 2.16 to 2.21, found 2.10.1; upgrade it with: pip install '
                  '--upgrade "mesh-tensorflow[tensorflow]" (or upgrade the TensorFlow build '
                  'you use)'), proc.stderr
  line = _one_error_line(_import(tmp_path / "command", "__version__ = '2.10.1'\n", command=True))
  assert "found 2.10.1" in line and 'pip install --upgrade "mesh-tensorflow[tensorflow]"' in line


def test_importing_without_tensorflow_says_how_to_install_it(tmp_path):
  proc = _import(tmp_path, no_site=True)
  assert proc.returncode != 0
  assert proc.stderr.strip().splitlines()[-1].endswith(
      'none is installed; install it with: pip install "mesh-tensorflow[tensorflow]" (or '
      'install tensorflow-cpu or a GPU build of TensorFlow first)'), proc.stderr
  line = _one_error_line(_import(tmp_path, command=True, no_site=True))
  assert 'pip install "mesh-tensorflow[tensorflow]"' in line


def test_a_tensorflow_that_fails_to_import_is_named_in_one_line(tmp_path):
  broken = "raise ImportError('libtfkernel_sobol_op.so: undefined symbol: _ZN10tensorflow')\n"
  line = _one_error_line(_import(tmp_path, broken, command=True))
  assert "fails to import (libtfkernel_sobol_op.so: undefined symbol" in line
  assert 'pip install "mesh-tensorflow[tensorflow]"' in line


def test_version_verdicts():
  assert _environment.tensorflow_problem("2.16.2") == (None, None)
  assert _environment.tensorflow_problem("2.21.0") == (None, None)
  error, warning = _environment.tensorflow_problem("2.23.0-dev20261026")
  assert error is None and "newer than the releases it is tested with (2.16 to 2.21)" in warning
  assert "found 2.15.1" in _environment.tensorflow_problem("2.15.1")[0]
  assert "has no version" in _environment.tensorflow_problem(None)[0]


# ---- optional packages ----------------------------------------------------------

def test_missing_optional_packages_name_the_extra(monkeypatch):
  from mesh_tensorflow import cli  # pylint: disable=g-import-not-at-top
  for module, extra in (("sentencepiece", "sentencepiece"), ("tensorflow_datasets", "tfds"),
                        ("matplotlib", "report")):
    monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(ImportError) as raised:
      _environment.require_optional(module, "the feature", extra)
    message = str(raised.value)
    assert "\n" not in message and f'pip install "mesh-tensorflow[{extra}]"' in message
    assert cli.is_user_error(raised.value)  # the commands print it as one error: line


def test_training_without_tensorboard_says_so_once_and_trains(monkeypatch, capsys, tmp_path):
  import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  real_find_spec = _environment.importlib.util.find_spec
  monkeypatch.setattr(_environment.importlib.util, "find_spec",
                      lambda name, *a: None if name == "tensorboard" else real_find_spec(name, *a))
  # tf.summary.scalar without TensorBoard fails; it must not be reached.
  monkeypatch.setattr(tf.summary, "scalar", lambda *a, **k: pytest.fail("tf.summary.scalar"))
  monkeypatch.setattr(_environment, "_warned_once", set())
  hidden = mtf.Dimension("hidden", 4)

  def model_fn(mesh, features, mode):
    del mode
    w = mtf.get_variable(mesh, "w", [hidden])
    return mtf.reduce_mean(mtf.square(features["x"] * w - 1.0))

  data = tf.data.Dataset.from_tensors({"x": tf.ones([8, 4])}).repeat()
  trainer = mtf.training.Trainer(
      model_fn, {"x": "batch:8;hidden:4"},
      mtf.placement_mesh_impl.PlacementMeshImpl("all:2", "batch:all", ["cpu:0", "cpu:1"]),
      mtf.optimize.SgdOptimizer(0.1), model_dir=str(tmp_path), log_every=0,
      checkpoint_every=None)
  trainer.train(data, steps=2)
  trainer.evaluate(data, steps=1)
  lines = [l for l in capsys.readouterr().err.splitlines() if "TensorBoard" in l]
  assert lines == [f"warning: TensorBoard is not installed, so no summaries are written to "
                   f'{tmp_path}; install it with: pip install "mesh-tensorflow[tensorboard]"']
  assert not list(tmp_path.glob("events.out.tfevents.*"))


# ---- the warnings policy --------------------------------------------------------

_CALLS = """
def numpy_deprecated():
  return np.row_stack([[1], [2]])


def tensorflow_deprecated():
  return tf.compat.v1.to_complex128(tf.constant(1.0))
"""


def _compiled_as(module, filename):
  """The functions of _CALLS compiled as code of `module` in `filename`, so
  the frame that calls NumPy or TensorFlow is that module's."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  namespace = {"__name__": module, "np": np, "tf": tf}
  exec(compile(_CALLS, filename, "exec"), namespace)  # pylint: disable=exec-used
  return namespace


def test_deprecations_caused_by_library_code_fail_the_suite():
  """Under the suite's own settings (setup.cfg's filterwarnings, which pytest
  applies to this test, and tests/conftest.py's handler of TensorFlow's
  deprecation notices), a NumPy DeprecationWarning and a TensorFlow
  deprecation notice caused by a call in mesh_tensorflow are errors; the same
  calls made by a test are not. (TensorFlow announces each deprecated
  function once per process: no other test calls to_complex128.)"""
  library = _compiled_as("mesh_tensorflow.cli", str(PACKAGE_DIR / "cli.py"))
  test = _compiled_as(__name__, __file__)
  with pytest.raises(DeprecationWarning, match="row_stack"):
    library["numpy_deprecated"]()
  with pytest.warns(DeprecationWarning, match="row_stack"):
    test["numpy_deprecated"]()  # a warning, not an error
  with pytest.raises(DeprecationWarning, match=r"to_complex128 .* is deprecated"):
    library["tensorflow_deprecated"]()
