"""Sequence parallelism for a `LayerStack` (Korthikanti et al. 2022), and its
d_model-split variant (Chowdhery et al. 2022, PaLM).

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
the same links. The backward pass all-gathers the input once more for the
weights' gradients rather than keeping it whole (unless the whole layer is
recomputed). Without a rule for RESIDUAL_LENGTH only the name changes.

The length must be a multiple of the mesh dimension's size. Where it is not
(PaLM's 12-way model parallelism at length 2,048), `sequence_parallel =
"d_model"` splits the stream's d_model instead (named RESIDUAL_D_MODEL, rule
`residual_d_model:model`): the same collectives and the same memory saving;
the norms reduce over the split d_model with a small all-reduce of their
[batch, length] statistics.

    >>> split = StreamSplit.of("length", context)
    >>> x = split.to_stream(x)                     # [batch, residual_length, d_model]
    >>> y = layer.call(context, split.to_whole(norm(x)))
    >>> x = x + split.to_stream(y)                 # a reduce-scatter
"""

from __future__ import annotations

import dataclasses
from typing import List, Optional, Union

import mesh_tensorflow as mtf

# The residual stream's length dimension under sequence parallelism.
RESIDUAL_LENGTH = "residual_length"
# The residual stream's d_model dimension when the stream splits d_model.
RESIDUAL_D_MODEL = "residual_d_model"
# The dimension names a split stream may have.
STREAM_NAMES = (RESIDUAL_LENGTH, RESIDUAL_D_MODEL)
MODES = ("length", "d_model")


def mode_of(sequence_parallel: Union[bool, str, None]) -> Optional[str]:
  """The stream dimension a `sequence_parallel` setting splits: None (False),
  "length" (True or "length") or "d_model".

  Example:
    >>> mode_of(True), mode_of("d_model"), mode_of(False)
    ('length', 'd_model', None)
  """
  if sequence_parallel is None or sequence_parallel is False:
    return None
  if sequence_parallel is True:
    return "length"
  if sequence_parallel in MODES:
    return sequence_parallel
  raise ValueError(f"sequence_parallel = {sequence_parallel!r}: use True or 'length' (split the "
                   "stream's length, rule residual_length:<mesh dim>), 'd_model' (split its "
                   "d_model, rule residual_d_model:<mesh dim>) or False.")


def unsplit_stream_notes(sequence_parallel: Union[bool, str, None], rules) -> List[str]:
  """One line when a stack is configured sequence parallel and `rules` split
  the layers over a mesh dimension (heads or d_ff) but leave the stream's
  dimension whole: the setting then renames the stream and saves no memory.
  Empty otherwise.

  Example:
    >>> unsplit_stream_notes(True, mtf.convert_to_layout_rules("batch:data;heads:model"))
    ["sequence_parallel = True but the layout has no rule for 'residual_length': ..."]
  """
  mode = mode_of(sequence_parallel)
  if mode is None:
    return []
  name = STREAM_NAMES[MODES.index(mode)]
  if rules.mesh_dimension_name(name) is not None:
    return []
  model_dim = rules.mesh_dimension_name("heads") or rules.mesh_dimension_name("d_ff")
  if model_dim is None:  # no model parallelism: nothing to split the stream over
    return []
  return [f"sequence_parallel = {sequence_parallel!r} but the layout has no rule for {name!r}: "
          "the residual stream stays whole on every model-parallel device and no memory is "
          f"saved; add '{name}:{model_dim}' to the layout"]


@dataclasses.dataclass(frozen=True)
class StreamSplit:
  """How a stack's residual stream differs from the layers' inputs: the
  dimension `whole` is named `stream_name` between the layers.

  Example:
    >>> split = StreamSplit.of("d_model", context)
    >>> split.to_stream(x).shape   # [batch, length, residual_d_model]
  """
  whole: mtf.Dimension
  stream_name: str

  @classmethod
  def of(cls, mode: Optional[str], context) -> Optional["StreamSplit"]:
    """The split of `mode` (see `mode_of`) in a transformer Context; None
    for no split or a context without the dimension."""
    if mode == "length" and context.length_dim is not None:
      return cls(context.length_dim, RESIDUAL_LENGTH)
    if mode == "d_model":
      return cls(context.model.model_dim, RESIDUAL_D_MODEL)
    return None

  def to_stream(self, x: mtf.Tensor) -> mtf.Tensor:
    """x with `whole` renamed (x itself if it lacks it); a pending sum is
    reduce-scattered where the new layout splits it."""
    if self.whole not in x.shape.dims:
      return x
    return mtf.zero.relayout(x, x.shape.rename_dimension(self.whole.name, self.stream_name))

  def to_whole(self, x: mtf.Tensor, regather: bool = False) -> mtf.Tensor:
    """The inverse of `to_stream` (an all-gather where the layout splits the
    stream). With `regather`, the backward pass gathers x again where the
    gradients of the result's consumers read it, instead of keeping the
    gathered copy (Korthikanti et al. 2022: a layer's input)."""
    if self.stream_name not in x.shape.dimension_names:
      return x
    return mtf.zero.relayout(x, x.shape.rename_dimension(self.stream_name, self.whole.name),
                             regathers_for_backward=regather)

  def like_stream(self, t: Optional[mtf.Tensor], stream: mtf.Tensor) -> Optional[mtf.Tensor]:
    """`t` (a per-position mask, say) renamed to combine with `stream`."""
    if (t is None or self.whole not in t.shape.dims
        or self.stream_name not in stream.shape.dimension_names):
      return t
    return mtf.rename_dimension(t, self.whole.name, self.stream_name)

