"""Group keys for TensorFlow collective ops, unique in this process.

TensorFlow identifies a collective group by an int32 key that is process-wide:
once a key names a group of some size and devices, every later collective with
that key must join the same group. DTensor and `tf.distribute` number their
groups from 1 in the same key space, so mesh_tensorflow keeps clear of them:

- [2**19, 2**20): placement lowering, one key per distinct device list;
- [2**20, 2**31): SIMD lowering, one block per `SimdMeshImpl`, just large
  enough for every subgroup of its mesh.

Keys are handed out in creation order, so processes that build the same
meshes in the same order (the workers of one job) agree on them.

    >>> placement_group_key(["/device:CPU:0", "/device:CPU:1"])
    524288
"""

from __future__ import annotations

import threading
from typing import Sequence

_PLACEMENT_FIRST = 1 << 19
_SIMD_FIRST = 1 << 20
_LAST = (1 << 31) - 1  # group keys are int32

_lock = threading.Lock()
_placement_keys = {}
_next_simd_key = _SIMD_FIRST


def placement_group_key(devices: Sequence[str]) -> int:
  """The group key of a collective among `devices` (in this order)."""
  with _lock:
    key = tuple(devices)
    if key not in _placement_keys:
      if _PLACEMENT_FIRST + len(_placement_keys) >= _SIMD_FIRST:
        raise RuntimeError(
            f"mesh_tensorflow: {len(_placement_keys)} distinct device groups have "
            "used collective ops in this process, all the group keys placement "
            "lowering has. Reuse device lists, or use collectives='direct'.")
      _placement_keys[key] = _PLACEMENT_FIRST + len(_placement_keys)
    return _placement_keys[key]


def allocate_simd_keys(count: int) -> int:
  """The first of `count` consecutive group keys reserved for one caller."""
  global _next_simd_key
  with _lock:
    first = _next_simd_key
    if first + count - 1 > _LAST:
      raise RuntimeError(
          f"mesh_tensorflow: no room for {count} more collective group keys in "
          "this process (TensorFlow's keys are int32 and each SimdMeshImpl takes "
          "a block). Create fewer SimdMeshImpls per process: reuse one per mesh.")
    _next_simd_key = first + count
    return first
