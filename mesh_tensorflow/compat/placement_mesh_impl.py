"""`mesh_tensorflow.placement_mesh_impl`, the original's module: this
library's `lowering.placement_mesh_impl` with `PlacementMeshImpl` carrying the
original's names (`compat.lowering`), and the original's collectives over
plain lists of tensors (`allreduce_ring`, `allconcat_ring`, `alltoall_ring`).

    >>> impl = mtf.placement_mesh_impl.PlacementMeshImpl("all:2", "", ["cpu:0", "cpu:1"])
    >>> ys = mtf.placement_mesh_impl.allreduce_ring([a0, a1], ["cpu:0", "cpu:1"])
"""

from __future__ import annotations

from typing import Callable, Sequence

import tensorflow as tf

from mesh_tensorflow.compat.lowering import OriginalMeshImplNames
from mesh_tensorflow.lowering import placement_mesh_impl as _placement_mesh_impl
from mesh_tensorflow.lowering.placement_mesh_impl import *  # noqa: F401,F403  pylint: disable=wildcard-import
from mesh_tensorflow.lowering.placement_mesh_impl import reduce_n


class PlacementMeshImpl(OriginalMeshImplNames, _placement_mesh_impl.PlacementMeshImpl):
  """A PlacementMeshImpl with the original's names (see compat.lowering)."""


# The original's collectives over plain lists of tensors.
# Ported code calls these module functions directly on one tf.Tensor per device.
# Each device computes its result from the others' tensors (TensorFlow copies
# between devices as needed); the "ring" in the names is the original's
# schedule, which this library's lowering does not use.


def _on_each(devices: Sequence[str], fn: Callable[[int], tf.Tensor]) -> list:
  """[fn(i) computed on devices[i] for each i]."""
  results = []
  for i, device in enumerate(devices):
    with tf.device(device):
      results.append(fn(i))
  return results


def _check_per_device(xs, devices, what: str) -> None:
  if len(devices) != len(xs):
    raise ValueError(f"{what}: got {len(xs)} tensors and {len(devices)} devices; give one "
                     "device per tensor.")


def allreduce_ring(xs: Sequence[tf.Tensor], devices: Sequence[str],
                   reduction_fn_string: str = "SUM") -> list:
  """The reduction ("SUM", "MAX", "MIN", ...) of all of xs, on every device.

  Example:
    >>> ys = allreduce_ring([a0, a1], ["cpu:0", "cpu:1"])   # [a0 + a1, a0 + a1]
  """
  _check_per_device(xs, devices, "allreduce_ring")
  if len(xs) == 1:
    return list(xs)
  return _on_each(devices, lambda _: reduce_n(list(xs), reduction_fn_string))


allreduce_ring_single_shard = allreduce_ring


def allconcat_ring(xs: Sequence[tf.Tensor], devices: Sequence[str], concat_axis: int) -> list:
  """All of xs concatenated along concat_axis, on every device.

  Example:
    >>> ys = allconcat_ring([a0, a1], ["cpu:0", "cpu:1"], 0)   # [a0; a1] twice
  """
  _check_per_device(xs, devices, "allconcat_ring")
  if len(xs) == 1:
    return list(xs)
  return _on_each(devices, lambda _: tf.concat(list(xs), axis=concat_axis))


def alltoall_ring(xs: Sequence[tf.Tensor], devices: Sequence[str], split_axis: int,
                  concat_axis: int) -> list:
  """MPI all-to-all: xs[i] is cut into len(xs) parts along split_axis, and
  device j gets part j of every tensor, concatenated along concat_axis.

  Example:
    >>> ys = alltoall_ring([a0, a1], ["cpu:0", "cpu:1"], split_axis=1, concat_axis=0)
  """
  _check_per_device(xs, devices, "alltoall_ring")
  n = len(xs)
  if n == 1:
    return list(xs)
  for i, x in enumerate(xs):
    length = x.shape.as_list()[split_axis]
    if length is not None and length % n:
      raise ValueError(f"alltoall_ring: tensor {i} has {length} entries along "
                       f"split_axis {split_axis}, not divisible by {n} devices.")
  parts = _on_each(devices, lambda i: tf.split(xs[i], n, axis=split_axis))
  return _on_each(devices, lambda j: tf.concat([p[j] for p in parts], axis=concat_axis))


alltoall_pointtwise = alltoall_ring

from mesh_tensorflow.core import autograph_exempt as _autograph_exempt  # noqa: E402  pylint: disable=g-import-not-at-top
_autograph_exempt.exempt(globals(), public_only=True)  # AutoGraph leaves this code alone
