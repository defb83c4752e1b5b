"""Distributed 3-D Fourier transforms (`mtf.signal_ops`).

`fft3d` transforms the innermost three dimensions of a complex tensor and
returns the spectrum transposed: [..., x, y, z] becomes
[..., ky, kz, kx]. `ifft3d` takes such a transposed spectrum back to
[..., x, y, z]. The transform runs as three one-dimensional passes; each pass
needs only the dimension it transforms whole on a processor, so a layout may
split any two of the three (and the batch dimensions) and each pass gathers
just the one it needs. The results do not depend on the layout, and the
gradients are TensorFlow's gradients of the passes.

    >>> k = mtf.signal_ops.fft3d(field, [kx, ky, kz])       # [..., ky, kz, kx]
    >>> back = mtf.signal_ops.ifft3d(k, field.shape[-3:])   # [..., x, y, z]
"""

from __future__ import annotations

from typing import Optional, Sequence

import tensorflow as tf

from mesh_tensorflow.core.graph import Tensor
from mesh_tensorflow.operations.slicewise_ops import slicewise
from mesh_tensorflow.core.shapes import Dimension, Shape, convert_to_dimension


def _check(x: Tensor, dims: Sequence, what: str):
  if not isinstance(x, Tensor) or x.shape.ndims < 3:
    raise ValueError(f"{what}: x must be an mtf.Tensor with at least 3 dimensions, got {x!r}.")
  if not x.dtype.is_complex:
    raise ValueError(f"{what}: x {x.name} has dtype {x.dtype.name}; Fourier transforms need "
                     "complex64 or complex128 (mtf.cast it first).")
  dims = [convert_to_dimension(d) for d in dims]
  if len(dims) != 3:
    raise ValueError(f"{what}: give 3 dimensions, got {dims}.")
  inner = x.shape.dims[-3:]
  return dims, inner


def _transposed(fn, before, after):
  """t -> transpose(fn(transpose(t, before)), after) for innermost-3 permutations
  `before` and `after` (indices among the last three axes)."""
  def run(t):
    lead = list(range(t.shape.rank - 3))
    inner = [len(lead) + i for i in range(3)]
    t = tf.transpose(t, lead + [inner[i] for i in before])
    return tf.transpose(fn(t), lead + [inner[i] for i in after])
  return run


def fft3d(x: Tensor, freq_dims: Sequence[Dimension], name: Optional[str] = None) -> Tensor:
  """The 3-D discrete Fourier transform of x's innermost 3 dimensions,
  transposed: x [..., a, b, c] -> [..., kb, kc, ka] for freq_dims [ka, kb, kc].

  Args:
    x: a complex mtf Tensor.
    freq_dims: the frequency dimensions of a, b and c (same sizes, new names).
    name: optional name.

  Returns:
    the spectrum, [..., freq_dims[1], freq_dims[2], freq_dims[0]].

  Example:
    >>> k = fft3d(field, [mtf.Dimension("kx", 64), mtf.Dimension("ky", 64),
    ...                   mtf.Dimension("kz", 64)])
  """
  (ka, kb, kc), (a, b, c) = _check(x, freq_dims, "fft3d")
  for d, k in zip((a, b, c), (ka, kb, kc)):
    if d.size != k.size:
      raise ValueError(f"fft3d: frequency dimension {k} must have the size of {d}.")
  name = name or "fft3d"
  # [.., a, b, c] -> [.., a, b, kc]
  y = slicewise(tf.signal.fft, [x], Shape(x.shape.dims[:-1] + [kc]), x.dtype, name=name)
  # [.., a, b, kc] -> [.., kb, kc, a]: transform b, then put a innermost.
  y = slicewise(_transposed(tf.signal.fft, (0, 2, 1), (2, 1, 0)), [y],
                Shape(x.shape.dims[:-3] + [kb, kc, a]), x.dtype, name=name)
  # [.., kb, kc, a] -> [.., kb, kc, ka]
  return slicewise(tf.signal.fft, [y], Shape(x.shape.dims[:-3] + [kb, kc, ka]), x.dtype,
                   name=name)


def ifft3d(x: Tensor, dims: Sequence[Dimension], name: Optional[str] = None) -> Tensor:
  """The inverse of `fft3d`: a transposed spectrum [..., kb, kc, ka] back to
  [..., a, b, c] for dims [a, b, c].

  Args:
    x: a complex mtf Tensor, [..., kb, kc, ka].
    dims: the space dimensions [a, b, c] (sizes of ka, kb, kc).
    name: optional name.

  Returns:
    [..., a, b, c].

  Example:
    >>> field = ifft3d(k, [x_dim, y_dim, z_dim])
  """
  (a, b, c), (kb, kc, ka) = _check(x, dims, "ifft3d")
  for d, k in zip((a, b, c), (ka, kb, kc)):
    if d.size != k.size:
      raise ValueError(f"ifft3d: dimension {d} must have the size of {k}.")
  name = name or "ifft3d"
  batch = x.shape.dims[:-3]
  # [.., kb, kc, ka] -> [.., kb, kc, a]
  y = slicewise(tf.signal.ifft, [x], Shape(batch + [kb, kc, a]), x.dtype, name=name)
  # [.., kb, kc, a] -> [.., a, b, kc]: transform kb, then put kc innermost.
  y = slicewise(_transposed(tf.signal.ifft, (2, 1, 0), (0, 2, 1)), [y],
                Shape(batch + [a, b, kc]), x.dtype, name=name)
  # [.., a, b, kc] -> [.., a, b, c]
  return slicewise(tf.signal.ifft, [y], Shape(batch + [a, b, c]), x.dtype, name=name)

from mesh_tensorflow.core import autograph_exempt as _autograph_exempt  # noqa: E402  pylint: disable=g-import-not-at-top
_autograph_exempt.exempt(globals())  # AutoGraph leaves this module's code alone
