"""`mesh_tensorflow.simd_mesh_impl`, the original's import path for the mesh implementation that emits one program for all processors.

The module is `mesh_tensorflow.lowering.simd_mesh_impl`; importing either path gives
the same module object.
"""

import sys

from mesh_tensorflow.lowering import simd_mesh_impl as _module

sys.modules[__name__] = _module
