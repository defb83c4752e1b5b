"""Turning an mtf graph into per-processor TensorFlow ops.

`mesh_impl` defines the interface every mesh implementation follows (laid-out
tensors, slicing, collectives), `placement_mesh_impl` and `simd_mesh_impl` are
the two implementations, `lowering` walks the graph. `plans` says what an
operation communicates under a layout (the implementations execute the plans,
the cost model prices them) with the size-based choices of `policies`, and
`observers` passes every executed collective to whoever counts. Slice and
master variables, TPU topology and collective keys support them.

The names of `mesh_tensorflow.lowering.lowering` (`Lowering`,
`pretty_print_counters`, ...) are also readable here.
"""

import importlib as _importlib
import importlib.util as _importlib_util


def __getattr__(name):
  if name.startswith("__"):
    raise AttributeError(name)
  if _importlib_util.find_spec(f"{__name__}.{name}") is not None:
    # A submodule that `from mesh_tensorflow.lowering import name` asks for
    # before it is imported: import it (not the lowering module).
    return _importlib.import_module(f"{__name__}.{name}")
  module = _importlib.import_module("mesh_tensorflow.lowering.lowering")
  try:
    return getattr(module, name)
  except AttributeError:
    raise AttributeError(
        f"module 'mesh_tensorflow.lowering' has no attribute {name!r}") from None
