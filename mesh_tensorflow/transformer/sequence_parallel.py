"""Sequence parallelism for a `LayerStack` (Korthikanti et al. 2022).

With tensor (model) parallelism the layers' products are split over a mesh
dimension, but the residual stream between the layers, [batch, length,
d_model], is replicated there: every model-parallel processor computes the
same norms, dropout and residual additions on the whole stream and keeps the
same copy for the backward pass. A sequence-parallel stack names the
stream's length dimension RESIDUAL_LENGTH between the layers, so a layout
rule such as `residual_length:model` splits it over the same mesh dimension.
Each layer then all-gathers its normalized input (`to_whole`) and its
output, a pending sum over that mesh dimension, is reduce-scattered into the
stream (`to_stream`) instead of all-reduced: the bytes of the all-reduce, on
the same links. Without a rule for RESIDUAL_LENGTH only the name changes.

    >>> x = to_stream(x, context.length_dim)      # [batch, residual_length, d_model]
    >>> y = layer.call(context, to_whole(norm(x), context.length_dim))
    >>> x = x + to_stream(y, context.length_dim)  # a reduce-scatter
"""

from __future__ import annotations

from typing import Optional

import mesh_tensorflow as mtf

# The residual stream's length dimension under sequence parallelism.
RESIDUAL_LENGTH = "residual_length"


def to_stream(x: mtf.Tensor, length_dim: Optional[mtf.Dimension]) -> mtf.Tensor:
  """x with its length dimension named RESIDUAL_LENGTH (x itself if it has
  none); a pending sum is reduce-scattered where the new layout splits it."""
  if length_dim is None or length_dim not in x.shape.dims:
    return x
  return mtf.zero.relayout(x, x.shape.rename_dimension(length_dim.name, RESIDUAL_LENGTH))


def to_whole(x: mtf.Tensor, length_dim: Optional[mtf.Dimension]) -> mtf.Tensor:
  """The inverse of `to_stream` (an all-gather where the layout splits the
  stream)."""
  if RESIDUAL_LENGTH not in x.shape.dimension_names:
    return x
  return mtf.zero.relayout(x, x.shape.rename_dimension(RESIDUAL_LENGTH, length_dim.name))


def like_stream(t: Optional[mtf.Tensor], stream: mtf.Tensor,
                length_dim: Optional[mtf.Dimension]) -> Optional[mtf.Tensor]:
  """`t` (a per-position mask, say) renamed to combine with `stream`: its
  length dimension named RESIDUAL_LENGTH where the stream's is."""
  if (t is None or length_dim not in t.shape.dims
      or RESIDUAL_LENGTH not in stream.shape.dimension_names):
    return t
  return mtf.rename_dimension(t, length_dim.name, RESIDUAL_LENGTH)
