"""The unit-scaling convention: scale contractions instead of weights.

Part of `mtf.layers` (import them from there). Under the convention, the
output of a contraction is divided by the square root of the product of the
sizes of the dimensions it sums over, so activations keep their scale
without inverse-square-root weight initialization (weights then have unit
scale, and an optimizer's step sizes mean the same for every layer).

It is off by default; turn it on with gin (`unit_scaling_convention.value =
True` in a config, or `gin.bind_parameter("unit_scaling_convention.value",
True)`). `us_einsum` is the einsum that honours it.

    >>> y = mtf.layers.us_einsum([x, w], output_shape=[batch, d_ff])
"""

from __future__ import annotations

import math
from typing import Sequence

import gin

from mesh_tensorflow.core.graph import Tensor
from mesh_tensorflow.operations.einsum_ops import einsum


@gin.configurable
def unit_scaling_convention(value: bool = False) -> bool:
  """Whether the unit-scaling convention is on (gin-configurable: `value`).

  Args:
    value: the setting; bind it with gin rather than passing it.

  Returns:
    value.

  Example:
    >>> mtf.layers.unit_scaling_convention()   # without a gin binding
    False
  """
  return value


def us_einsum(xs: Sequence[Tensor], *args, **kwargs) -> Tensor:
  """`mtf.einsum(xs, ...)`, divided by sqrt(product of the summed dimensions'
  sizes) when `unit_scaling_convention()` is on.

  The summed dimensions are those of the inputs that the output lacks.

  Args:
    xs: the input tensors (a list).
    *args: further positional arguments of `mtf.einsum` (the output shape).
    **kwargs: keyword arguments of `mtf.einsum` (output_shape, reduced_dims, name).

  Returns:
    the einsum's output.

  Example:
    >>> h = us_einsum([x, w], output_shape=[batch, d_ff])   # / sqrt(d_model) if on
  """
  xs = list(xs)
  y = einsum(xs, *args, **kwargs)
  if not unit_scaling_convention():
    return y
  kept = set(y.shape.dims)
  summed = {d for x in xs for d in x.shape.dims if d not in kept}
  size = math.prod(d.size for d in summed)
  return y * (size ** -0.5) if size > 1 else y

from mesh_tensorflow.core import autograph_exempt as _autograph_exempt  # noqa: E402  pylint: disable=g-import-not-at-top
_autograph_exempt.exempt(globals())  # AutoGraph leaves this module's code alone
