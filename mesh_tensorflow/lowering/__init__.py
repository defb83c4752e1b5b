"""Turning an mtf graph into per-processor TensorFlow ops.

`mesh_impl` defines the interface every mesh implementation follows (laid-out
tensors, slicing, collectives), `placement_mesh_impl` and `simd_mesh_impl` are
the two implementations, `lowering` walks the graph, and `policies` holds the
size-based choices the operations and the cost model share. Slice and master
variables, TPU topology and collective keys support them.

The names of `mesh_tensorflow.lowering.lowering` (`Lowering`,
`pretty_print_counters`, ...) are also readable here.
"""

import importlib as _importlib


def __getattr__(name):
  if name.startswith("__"):
    raise AttributeError(name)
  module = _importlib.import_module("mesh_tensorflow.lowering.lowering")
  try:
    return getattr(module, name)
  except AttributeError:
    raise AttributeError(
        f"module 'mesh_tensorflow.lowering' has no attribute {name!r}") from None
