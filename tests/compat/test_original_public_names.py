"""Every public name of the original Mesh TensorFlow imports at its original path.

tests/data/original_public_names.json lists, per module, the public names of
the original package (produced from its source by
oss_scripts/original_public_names.py). A name this library does not provide
yet is listed in NOT_YET (or its module in NOT_YET_MODULES) below; those lists
are checked to be still missing, so they can only shrink: provide a name, and
its entry must go.
"""

import importlib
import importlib.util
import json
import os
import sys

import pytest

import mesh_tensorflow  # noqa: F401  (first, as a user would)

_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
with open(os.path.join(_HERE, "data", "original_public_names.json"), encoding="utf-8") as f:
  ORIGINAL = json.load(f)

# Modules that do not exist yet (every one of their names is missing with them).
NOT_YET_MODULES: set = set()

# Names missing from modules that exist.
NOT_YET = {
}


def _import(module):
  try:
    return importlib.import_module(module), None
  except ImportError as e:
    return None, e


def test_the_list_is_the_original_package():
  # A few anchors, so an empty or truncated list cannot pass the tests below.
  assert len(ORIGINAL) >= 50
  assert len(ORIGINAL["mesh_tensorflow.ops"]) >= 200
  assert {"einsum", "Shape", "mtf_range"} <= set(ORIGINAL["mesh_tensorflow.ops"])
  assert "range" in ORIGINAL["mesh_tensorflow.ops_with_redefined_builtins"]
  assert "tf" not in ORIGINAL["mesh_tensorflow.ops"]  # imported modules are not names
  assert set(NOT_YET) | NOT_YET_MODULES <= set(ORIGINAL)
  assert not set(NOT_YET) & NOT_YET_MODULES


@pytest.mark.parametrize("module", sorted(ORIGINAL))
def test_original_names_import_at_their_path(module):
  mod, error = _import(module)
  if module in NOT_YET_MODULES:
    assert mod is None, (f"{module} imports now: remove it from NOT_YET_MODULES (and list "
                         "in NOT_YET any of its names it still lacks).")
    return
  assert mod is not None, f"{module} does not import: {error}"
  not_yet = NOT_YET.get(module, set())
  unknown = not_yet - set(ORIGINAL[module])
  assert not unknown, f"NOT_YET[{module!r}] lists names the original lacks: {sorted(unknown)}"
  missing = []
  for name in ORIGINAL[module]:
    try:
      exec(f"from {module} import {name}", {})  # pylint: disable=exec-used
    except ImportError:
      missing.append(name)
  assert not set(missing) - not_yet, (
      f"{module} lacks the original's {sorted(set(missing) - not_yet)}")
  stale = not_yet - set(missing)
  assert not stale, f"{module} provides {sorted(stale)} now: remove them from NOT_YET."


def test_ops_star_import_does_not_shadow_builtins():
  namespace = {}
  exec("from mesh_tensorflow.ops import *", namespace)  # pylint: disable=exec-used
  assert "einsum" in namespace and "mtf_range" in namespace
  assert not {"abs", "pow", "range", "slice"} & set(namespace)
  namespace = {}
  exec("from mesh_tensorflow.ops_with_redefined_builtins import *", namespace)  # pylint: disable=exec-used
  assert namespace["range"] is mesh_tensorflow.mtf_range
  assert namespace["abs"] is mesh_tensorflow.mtf_abs


def test_ops_module_resolves_to_the_package_objects():
  from mesh_tensorflow import ops  # pylint: disable=g-import-not-at-top
  for name in ("einsum", "constant", "slicewise", "Shape", "Tensor", "reduce_sum"):
    assert getattr(ops, name) is getattr(mesh_tensorflow, name)
  assert callable(ops.einsum) and callable(ops.constant) and callable(ops.slicewise)
  assert "einsum" in dir(ops)
  with pytest.raises(AttributeError, match="no attribute 'no_such_op'"):
    ops.no_such_op  # pylint: disable=pointless-statement


def test_counts_provided_per_module():
  provided = total = 0
  for module, names in ORIGINAL.items():
    if module in NOT_YET_MODULES:
      total += len(names)
      continue
    total += len(names)
    provided += len(names) - len(NOT_YET.get(module, ()))
  not_yet = total - provided
  assert not_yet == sum(len(ORIGINAL[m]) for m in NOT_YET_MODULES) + sum(
      len(v) for v in NOT_YET.values())
  # The core package (outside bert, experimental and transformer) is complete.
  core = [m for m in ORIGINAL if not m.startswith(("mesh_tensorflow.bert",
                                                   "mesh_tensorflow.experimental",
                                                   "mesh_tensorflow.transformer"))]
  assert not [m for m in core if m in NOT_YET or m in NOT_YET_MODULES]


def _load_script():
  path = os.path.join(_HERE, "..", "oss_scripts", "original_public_names.py")
  spec = importlib.util.spec_from_file_location("original_public_names", path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module
  spec.loader.exec_module(module)
  return module


def test_script_rules_on_a_small_package():
  script = _load_script()
  files = {
      "mesh_tensorflow/__init__.py":
          "from mesh_tensorflow import sub\nfrom mesh_tensorflow.ops2 import *\n",
      "mesh_tensorflow/ops.py": (
          "import numpy as np\nimport tensorflow.compat.v1 as tf\n"
          "from mesh_tensorflow import utils\n"
          "tf = tf.compat.v1\nX = 1\n_private = 2\na, (b, c) = 1, (2, 3)\n"
          "def f(): pass\nclass K: pass\n"
          "try:\n  from tensorflow.python import core\n  HAS = True\n"
          "except ImportError:\n  HAS = False\n"),
      "mesh_tensorflow/ops2.py": (
          "from mesh_tensorflow.ops import *\nfrom mesh_tensorflow.ops import f as abs\n"),
      "mesh_tensorflow/sub/__init__.py": "from mesh_tensorflow.sub.api import g\n",
      "mesh_tensorflow/sub/api.py": "def g(): pass\nfrom mesh_tensorflow.ops import f\n",
      "mesh_tensorflow/sub/api_test.py": "def test_g(): pass\n",
      "mesh_tensorflow/utils.py": "",
  }
  names = script.public_names_by_module(files)
  assert names["mesh_tensorflow.ops"] == ["HAS", "K", "X", "a", "b", "c", "f"]
  assert names["mesh_tensorflow.ops2"] == ["HAS", "K", "X", "a", "abs", "b", "c", "f"]
  assert names["mesh_tensorflow.sub"] == ["g"]
  assert names["mesh_tensorflow.sub.api"] == ["g"]  # an import elsewhere is not re-exported
  assert names["mesh_tensorflow"] == ["HAS", "K", "X", "a", "abs", "b", "c", "f", "sub"]
  assert "mesh_tensorflow.sub.api_test" not in names
  assert names["mesh_tensorflow.utils"] == []


def test_script_reads_a_source_tree(tmp_path):
  script = _load_script()
  (tmp_path / "mesh_tensorflow").mkdir()
  (tmp_path / "mesh_tensorflow" / "__init__.py").write_text("")
  (tmp_path / "mesh_tensorflow" / "m.py").write_text("import gin\ndef h(): pass\n")
  out = []
  script.main(["--src", str(tmp_path)], write=out.append)
  assert json.loads("".join(out)) == {"mesh_tensorflow": [], "mesh_tensorflow.m": ["h"]}
  with pytest.raises(SystemExit):
    script.main(["--src", str(tmp_path / "nothing")], write=out.append)


def test_docs_examples_run():
  import re  # pylint: disable=g-import-not-at-top
  with open(os.path.join(_HERE, "..", "docs", "original_api.md"), encoding="utf-8") as f:
    blocks = re.findall(r"```python\n(.*?)```", f.read(), re.S)
  assert len(blocks) >= 3
  for block in blocks:
    exec(compile(block, "docs/original_api.md", "exec"), {})  # pylint: disable=exec-used
