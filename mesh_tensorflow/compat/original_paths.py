"""The original Mesh TensorFlow's module paths, served by one table.

The original kept some modules at the top of the package
(`mesh_tensorflow.ops`, `mesh_tensorflow.placement_mesh_impl`,
`mesh_tensorflow.optimize`, `mesh_tensorflow.utils`, ...) and its transformer application in
`mesh_tensorflow.transformer.utils`. Here they live in folders; the finder
installed by `install()` (the package's `__init__` calls it first thing)
answers an import of an original path with the module at its current path:
the same module object, so `import mesh_tensorflow.placement_mesh_impl` and
`from mesh_tensorflow import optimize` keep working unchanged.

    >>> import mesh_tensorflow.optimize
    >>> import mesh_tensorflow.training.optimize
    >>> mesh_tensorflow.optimize is mesh_tensorflow.training.optimize
    True

Commands (`python -m mesh_tensorflow.report`, ...) are real files, since
`python -m` needs one; no original path is a command.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

# The original's module path -> the module that serves it now. Its
# submodules follow it (a.b.c -> the current module of a.b, then .c).
ORIGINAL_PATHS = {
    "mesh_tensorflow.beam_search": "mesh_tensorflow.layers.beam_search",
    "mesh_tensorflow.ops_with_redefined_builtins":
        "mesh_tensorflow.compat.ops_with_redefined_builtins",
    "mesh_tensorflow.ops": "mesh_tensorflow.compat.original_ops",
    "mesh_tensorflow.optimize": "mesh_tensorflow.training.optimize",
    "mesh_tensorflow.placement_mesh_impl": "mesh_tensorflow.compat.placement_mesh_impl",
    "mesh_tensorflow.simd_mesh_impl": "mesh_tensorflow.compat.simd_mesh_impl",
    "mesh_tensorflow.test_utils": "mesh_tensorflow.compat.test_utils",
    "mesh_tensorflow.tpu_variables": "mesh_tensorflow.lowering.tpu_variables",
    "mesh_tensorflow.transformer.utils": "mesh_tensorflow.compat.transformer.utils",
    "mesh_tensorflow.utils": "mesh_tensorflow.compat.utils",
}


def current_name(name: str) -> str | None:
  """The module that serves the original path `name` now, or None if it is
  not an original path.

      >>> current_name("mesh_tensorflow.placement_mesh_impl")
      'mesh_tensorflow.compat.placement_mesh_impl'
  """
  for old, new in ORIGINAL_PATHS.items():
    if name == old or name.startswith(old + "."):
      return new + name[len(old):]
  return None


class _OriginalPathFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
  """Resolves an original module path to the module at its current path."""

  def __init__(self):
    self._attributes = {}

  def find_spec(self, fullname, path=None, target=None):
    del path, target
    if current_name(fullname) is None:
      return None
    return importlib.util.spec_from_loader(fullname, self)

  def create_module(self, spec):
    module = importlib.import_module(current_name(spec.name))
    self._attributes[module.__name__] = (module.__spec__, module.__loader__)
    return module

  def exec_module(self, module):
    # Already executed under its current name; the import machinery has
    # stamped the original path's spec on it, which is put back here.
    module.__spec__, module.__loader__ = self._attributes.pop(module.__name__)


def install() -> None:
  """Installs the finder once (the package's `__init__` calls this)."""
  if not any(isinstance(f, _OriginalPathFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _OriginalPathFinder())
