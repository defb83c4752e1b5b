"""Runs the original Mesh TensorFlow's own unit tests against this library.

The original 0.1.21's `*_test.py` files are taken as they are from its wheel
(or an unpacked copy), copied into a temporary directory and run with pytest,
with this repository first on the import path, so that their
`import mesh_tensorflow` imports this library. Nothing in them is edited.
The summary line gives the count of passing tests; `--list` prints every
test that did not pass.

    pip download mesh-tensorflow==0.1.21 --no-deps -d /tmp/orig
    pip install mock   # the original's tests import it
    python oss_scripts/run_original_tests.py \
        --original=/tmp/orig/mesh_tensorflow-0.1.21-py3-none-any.whl

Some of them need the `tfds` extra (tensorflow-datasets) and
tensorflow-probability (with tf-keras); a file that cannot be imported is
reported as one error.

`--estimator_stand_in` makes `tensorflow.compat.v1.estimator`, which
TensorFlow 2.16+ no longer has, importable for the test files: the harness
(a conftest.py in the temporary directory, never this library) registers a
stand-in module under that name holding only `ModeKeys` with the estimator's
mode strings ("train", "eval", "infer"), all that adaptive_softmax_test.py
reads from it. Counts with it are not counts of the unedited setting. pytest's "skipped" count is the `test_session`
placeholders of `tf.test.TestCase` ("Not a test"), not tests.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _collect_test_files(original: str, destination: str) -> list[str]:
  """Copies the original's test files into `destination`, one flat folder.

  Args:
    original: the original's wheel, or a folder holding its `mesh_tensorflow`
      package.
    destination: an empty folder.

  Returns:
    The names of the copied files.
  """
  names = []
  if zipfile.is_zipfile(original):
    with zipfile.ZipFile(original) as wheel:
      for member in wheel.namelist():
        if member.startswith("mesh_tensorflow/") and member.endswith("_test.py"):
          name = _flat_name(member)
          with open(os.path.join(destination, name), "wb") as out:
            out.write(wheel.read(member))
          names.append(name)
  else:
    package = os.path.join(original, "mesh_tensorflow")
    if not os.path.isdir(package):
      raise SystemExit(f"error: --original={original} is neither the original's "
                       "wheel nor a folder holding its mesh_tensorflow package")
    for root, _, files in os.walk(package):
      for file_name in files:
        if file_name.endswith("_test.py"):
          path = os.path.join(root, file_name)
          name = _flat_name(os.path.relpath(path, original))
          shutil.copyfile(path, os.path.join(destination, name))
          names.append(name)
  if not names:
    raise SystemExit(f"error: no *_test.py files found in --original={original}")
  return sorted(names)


# The conftest.py that --estimator_stand_in writes next to the test files.
_ESTIMATOR_STAND_IN = '''"""Written by run_original_tests.py --estimator_stand_in: a STAND-IN for
tensorflow.compat.v1.estimator (absent from TensorFlow 2.16+), with ModeKeys
only, so that test files importing it can run. Not TensorFlow's module."""
import sys
import types

_stand_in = types.ModuleType("tensorflow.compat.v1.estimator",
                             "Stand-in from run_original_tests.py: ModeKeys only.")


class ModeKeys:
  TRAIN = "train"
  EVAL = "eval"
  PREDICT = "infer"


_stand_in.ModeKeys = ModeKeys
sys.modules.setdefault("tensorflow.compat.v1.estimator", _stand_in)
'''


def _flat_name(member: str) -> str:
  """mesh_tensorflow/transformer/utils_test.py -> transformer__utils_test.py."""
  parts = member.split("/")[1:]
  return "__".join(parts)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--original", required=True,
                      help="the original's wheel, or a folder holding its "
                      "mesh_tensorflow package")
  parser.add_argument("--list", action="store_true",
                      help="print every test that did not pass")
  parser.add_argument("--estimator_stand_in", action="store_true",
                      help="register a stand-in tensorflow.compat.v1.estimator module "
                      "(ModeKeys only) for the test files")
  parser.add_argument("pytest_args", nargs="*",
                      help="extra pytest arguments (after --)")
  args = parser.parse_args(argv)
  with tempfile.TemporaryDirectory() as work:
    names = _collect_test_files(args.original, work)
    if args.estimator_stand_in:
      with open(os.path.join(work, "conftest.py"), "w") as conftest:
        conftest.write(_ESTIMATOR_STAND_IN)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [_REPO] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
               "-rfEs", "--continue-on-collection-errors", "--rootdir", work] + names + list(args.pytest_args)
    result = subprocess.run(command, cwd=work, env=env, capture_output=True,
                            text=True, check=False)
  output = result.stdout + result.stderr
  if args.list:
    for line in output.splitlines():
      if line.startswith(("FAILED", "ERROR")):
        print(line)
  summary = [line for line in output.splitlines()
             if re.search(r"\d+ (passed|failed)", line)]
  if not summary:
    print(output)
    return 1
  stand_in = " (with the estimator stand-in)" if args.estimator_stand_in else ""
  print(f"original tests ({len(names)} files){stand_in}: {summary[-1].strip('= ')}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
