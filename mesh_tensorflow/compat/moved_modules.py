"""This library's former module paths, kept importable.

The package's modules live in folders (`core/`, `lowering/`, `layers/`,
`training/`, `distributed/`, `analysis/`, `compat/`, `testing/`). Code that
imports a module by the flat path it had before, such as
`mesh_tensorflow.graph` or `mesh_tensorflow.layers_core`, gets the module at
its new path (the same module object) through the finder installed here.
The original Mesh TensorFlow's own module paths (`placement_mesh_impl`,
`simd_mesh_impl`, `optimize`, `utils`, ...) are real modules at the top of
the package instead.

    >>> import mesh_tensorflow.graph
    >>> import mesh_tensorflow.core.graph
    >>> mesh_tensorflow.graph is mesh_tensorflow.core.graph
    True
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

# Former path (under mesh_tensorflow.) -> current path. A package's
# submodules follow it (mesh_tensorflow.cost_model.x -> analysis.cost_model.x).
MOVED = {
    "shapes": "core.shapes",
    "layout": "core.layout",
    "graph": "core.graph",
    "rng": "core.rng",
    "autograph_exempt": "core.autograph_exempt",
    "gradients": "ops.gradients",
    "signal_ops": "ops.signal_ops",
    "ops.legacy_classes": "compat.legacy_classes",
    "mesh_impl": "lowering.mesh_impl",
    "tpu_topology": "lowering.tpu_topology",
    "collective_keys": "lowering.collective_keys",
    "slice_variables": "lowering.slice_variables",
    "master_variables": "lowering.master_variables",
    "lowering_policies": "lowering.policies",
    "layers_core": "layers.core",
    "layers_attention": "layers.attention",
    "layers_incremental": "layers.incremental",
    "layers_local_attention": "layers.local_attention",
    "layers_losses": "layers.losses",
    "layers_reversible": "layers.reversible",
    "layers_unit_scaling": "layers.unit_scaling",
    "conv_layers": "layers.convolution",
    "initializers": "layers.initializers",
    "learning_rate_schedules": "training.learning_rate_schedules",
    "checkpoint": "training.checkpoint",
    "checkpoint_verify": "training.checkpoint_verify",
    "original_checkpoint": "training.original_checkpoint",
    "microbatches": "training.microbatches",
    "zero": "training.zero",
    "offload": "training.offload",
    "mixed_precision": "training.mixed_precision",
    "adascale": "training.adascale",
    "pipeline": "training.pipeline",
    "cluster": "distributed.cluster",
    "cost_model": "analysis.cost_model",
    "layout_report": "analysis.layout_report",
    "reference_models": "testing.reference_models",
}

_PREFIX = "mesh_tensorflow."


def current_name(name: str) -> str | None:
  """The current full module name for a former one, or None if it did not move.

      >>> current_name("mesh_tensorflow.layers_core")
      'mesh_tensorflow.layers.core'
  """
  if not name.startswith(_PREFIX):
    return None
  short = name[len(_PREFIX):]
  for old, new in MOVED.items():
    if short == old or short.startswith(old + "."):
      return _PREFIX + new + short[len(old):]
  return None


class _MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
  """Resolves a former module path to the module at its current path."""

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
    # stamped the former name's spec on it, which is put back here.
    module.__spec__, module.__loader__ = self._attributes.pop(module.__name__)


def install() -> None:
  """Installs the finder once (the package's `__init__` calls this)."""
  if not any(isinstance(f, _MovedModuleFinder) for f in sys.meta_path):
    # First in line: a moved package's submodules (mesh_tensorflow.cost_model.x)
    # would otherwise be found again through the package's path and loaded a
    # second time under the former name.
    sys.meta_path.insert(0, _MovedModuleFinder())
