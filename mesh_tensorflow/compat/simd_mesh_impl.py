"""`mesh_tensorflow.simd_mesh_impl`, the original's module: this library's
`lowering.simd_mesh_impl` with `SimdMeshImpl` carrying the original's names
(`compat.lowering`), and the TPU topology helpers it kept here
(`auto_logical_to_physical_tpu`, `HierarchicalTiling`, ...).

    >>> impl = mtf.simd_mesh_impl.SimdMeshImpl("all:8", "batch:all", devices=None)
"""

from mesh_tensorflow.compat.lowering import OriginalMeshImplNames
from mesh_tensorflow.lowering import simd_mesh_impl as _simd_mesh_impl
from mesh_tensorflow.lowering.simd_mesh_impl import *  # noqa: F401,F403  pylint: disable=wildcard-import
# The original kept its TPU topology helpers in this module.
from mesh_tensorflow.lowering.tpu_topology import (  # noqa: F401
    HierarchicalTiling, auto_logical_to_physical_tpu, logical_to_physical,
    physical_shape_3d_from_topology_proto_4d, tpu_device_assignment)


class SimdMeshImpl(OriginalMeshImplNames, _simd_mesh_impl.SimdMeshImpl):
  """A SimdMeshImpl with the original's names (see compat.lowering)."""

from mesh_tensorflow.core import autograph_exempt as _autograph_exempt  # noqa: E402  pylint: disable=g-import-not-at-top
_autograph_exempt.exempt({"SimdMeshImpl": SimdMeshImpl})  # its methods; AutoGraph leaves them alone
