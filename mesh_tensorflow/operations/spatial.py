"""What convolutions and pooling share: argument checks, output sizes, the
spatial dimensions of an image, and the per-slice move of an image's
dimensions into TensorFlow's canonical layout (`[batch, spatial..., channels]`)
and back.

    >>> conv_output_size(32, 3, 2, "SAME")
    16
"""

from __future__ import annotations

import math
from typing import List, Optional, Sequence, Tuple, Union

import tensorflow as tf

from mesh_tensorflow.core.graph import Operation
from mesh_tensorflow.lowering.mesh_impl import int_constant
from mesh_tensorflow.core.shapes import Dimension, Shape, convert_to_dimension

IntOrInts = Union[int, Sequence[int]]
DimLike = Union[Dimension, str, None]

_CONV_FNS = {2: tf.nn.conv2d, 3: tf.nn.conv3d}
_CONV_TRANSPOSE_FNS = {2: tf.nn.conv2d_transpose, 3: tf.nn.conv3d_transpose}
_POOL_FNS = {("max", 2): tf.nn.max_pool2d, ("avg", 2): tf.nn.avg_pool2d,
             ("max", 3): tf.nn.max_pool3d, ("avg", 3): tf.nn.avg_pool3d}


# ---- argument helpers --------------------------------------------------------
def _normalize_padding(padding: str, what: str) -> str:
  p = str(padding).upper()
  if p not in ("SAME", "VALID"):
    raise ValueError(f"{what}: padding must be 'SAME' or 'VALID', got {padding!r}.")
  return p


def _normalize_ints(value: IntOrInts, n: int, what: str) -> Tuple[int, ...]:
  """An int, n ints, or n + 2 ints with 1 at both ends (TF's NHWC form)."""
  if isinstance(value, int):
    out = (value,) * n
  else:
    out = tuple(int(v) for v in value)
    if len(out) == n + 2:
      if out[0] != 1 or out[-1] != 1:
        raise ValueError(
            f"{what}: {list(out)} has {n + 2} entries, so the first and last (batch "
            "and channels) must be 1.")
      out = out[1:-1]
  if len(out) != n or any(v < 1 for v in out):
    raise ValueError(f"{what}: expected {n} positive integers, got {value!r}.")
  return out


def conv_output_size(in_size: int, filter_size: int, stride: int, padding: str) -> int:
  """Spatial output size of a convolution or pooling window, as TensorFlow's.

  Example:
    >>> conv_output_size(8, 3, 2, "SAME"), conv_output_size(8, 3, 2, "VALID")
    (4, 3)
  """
  if padding == "SAME":
    return -(-in_size // stride)
  if in_size < filter_size:
    raise ValueError(
        f"A VALID window of size {filter_size} does not fit in a dimension of size "
        f"{in_size}.")
  return (in_size - filter_size) // stride + 1


def windowed_dims(shape: Shape, spatial: Sequence[str], ksize: Sequence[int],
                  strides: Sequence[int], padding: str) -> List[Dimension]:
  """The dimensions of `shape` after a window of `ksize` slides over the
  `spatial` ones with `strides` and `padding` (others unchanged).

  Example:
    >>> windowed_dims(mtf.Shape([b, h]), ["h"], [3], [2], "SAME")   # h: 32 -> 16
  """
  dims = []
  for d in shape.dims:
    if d.name in spatial:
      i = list(spatial).index(d.name)
      d = Dimension(d.name, conv_output_size(d.size, ksize[i], strides[i], padding))
    dims.append(d)
  return dims


def conv_transpose_output_size(in_size: int, filter_size: int, stride: int,
                               padding: str) -> int:
  """Spatial output size of a transposed convolution: in_size * stride for
  SAME, (in_size - 1) * stride + filter_size for VALID (the sizes whose
  convolution gives back in_size; TensorFlow also accepts a few others).

  Example:
    >>> conv_transpose_output_size(4, 3, 2, "SAME"), conv_transpose_output_size(4, 3, 2, "VALID")
    (8, 9)
  """
  if padding == "SAME":
    return in_size * stride
  return (in_size - 1) * stride + filter_size


def _same_padding(in_size: int, filter_size: int, stride: int) -> Tuple[int, int]:
  """(before, after) zero padding that TensorFlow's SAME adds."""
  out = -(-in_size // stride)
  total = max((out - 1) * stride + filter_size - in_size, 0)
  return total // 2, total - total // 2


def _dim_of(shape: Shape, dim: DimLike, what: str) -> Optional[Dimension]:
  if dim is None:
    return None
  name = dim if isinstance(dim, str) else convert_to_dimension(dim).name
  if name not in shape.dimension_names:
    raise ValueError(f"{what}: {shape} has no dimension {name!r}.")
  return shape.get_dim_by_name(name)


def _spatial_dims(shape: Shape, n: int, exclude: Sequence[str], what: str) -> List[Dimension]:
  """The last n dimensions of `shape` whose names are not in `exclude`."""
  candidates = [d for d in shape.dims if d.name not in set(exclude)]
  if len(candidates) < n:
    raise ValueError(
        f"{what}: {shape} needs {n} spatial dimensions besides {list(exclude)}.")
  return candidates[-n:]


# ---- local (per-slice) computation -------------------------------------------
def _to_canonical(t: tf.Tensor, names: Sequence[str], spatial: Sequence[str],
                  channel: Optional[str], others: Optional[Sequence[str]] = None):
  """Transposes a slice to [others..., spatial..., channel] and flattens the
  others into one batch axis. Without a channel name, appends a size-1 one.
  `others` fixes the order of the remaining dims (default: their own order).

  Returns (tensor, other names, their local sizes).
  """
  names = list(names)
  if others is None:
    others = [n for n in names if n not in spatial and n != channel]
  others = list(others)
  order = others + list(spatial) + ([channel] if channel is not None else [])
  perm = [names.index(n) for n in order]
  if perm != list(range(len(perm))):
    t = tf.transpose(t, int_constant(perm))
  sizes = t.shape.as_list()
  other_sizes = sizes[:len(others)]
  new_shape = [math.prod(other_sizes)] + sizes[len(others):]
  if channel is None:
    new_shape.append(1)
  return tf.reshape(t, int_constant(new_shape)), others, other_sizes


def _from_canonical(t: tf.Tensor, others: Sequence[str], other_sizes: Sequence[int],
                    spatial: Sequence[str], channel: Optional[str],
                    out_names: Sequence[str]) -> tf.Tensor:
  """Inverse of `_to_canonical`, ending in the dimension order `out_names`."""
  sizes = t.shape.as_list()
  body = sizes[1:] if channel is not None else sizes[1:-1]
  t = tf.reshape(t, int_constant(list(other_sizes) + body))
  current = list(others) + list(spatial) + ([channel] if channel is not None else [])
  perm = [current.index(n) for n in out_names]
  if perm != list(range(len(perm))):
    t = tf.transpose(t, int_constant(perm))
  return t


def _lower_local(lowering, op: Operation, fn) -> None:
  """Lowers `op` (one output) by running its LocalPlan (`op.plan`, from
  plans.plan_local) with kernel fn on every processor's slices."""
  lowering.lower_with_plan(op, op.plan(lowering.plan_mesh(op)), fn)

from mesh_tensorflow.core import autograph_exempt as _autograph_exempt  # noqa: E402  pylint: disable=g-import-not-at-top
_autograph_exempt.exempt(globals())  # AutoGraph leaves this module's code alone
