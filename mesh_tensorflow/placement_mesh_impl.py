"""`mesh_tensorflow.placement_mesh_impl`, the original's import path for the mesh implementation that places each processor's ops on a device.

The module is `mesh_tensorflow.lowering.placement_mesh_impl`; importing either path gives
the same module object.
"""

import sys

from mesh_tensorflow.lowering import placement_mesh_impl as _module

sys.modules[__name__] = _module
