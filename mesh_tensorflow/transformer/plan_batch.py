"""How a plan splits its batch: the sequences of one micro-batch, and the
data-parallel mesh axes, those that split "batch" or "outer_batch"
(`run.outer_batch_size`), with the one ZeRO shards the training state over
(the axis that splits "batch", as `mtf.zero` chooses it).

    >>> micro_batch(512, 4, 2, {"slices": 2, "data": 32}, {"outer_batch": "slices",
    ...                                                       "batch": "data"})
    128
"""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping, Sequence, Tuple

from mesh_tensorflow.transformer import run_config


def micro_batch(batch: int, microbatches: int, outer: int, dim_sizes: Mapping[str, int],
                rule_map: Mapping[str, str]) -> int:
  """Sequences in each of the step's `microbatches` (num_microbatches x
  grad_accum_steps), checked against the layout's splits of "batch" and
  "outer_batch" (a micro-batch is outer x micro / outer sequences).

  Raises:
    ValueError: naming run.batch_size or run.outer_batch_size and the split
      that does not divide.
  """
  m = microbatches
  if batch % m:
    raise ValueError(f"run.batch_size = {batch} is not a multiple of the {m} micro-batches.")
  micro = batch // m
  ways = dim_sizes.get(rule_map.get("batch"), 1)
  outer_ways = dim_sizes.get(rule_map.get("outer_batch"), 1)
  if outer > 1 or outer_ways > 1:
    run_config.check_outer_batch(outer, micro, outer_ways, ways)
    return micro
  if micro % ways:
    fix = (f"use a number of micro-batches that divides {batch // ways}" if batch % ways == 0
           else f"use a batch size that is a multiple of {ways}, or split batch over fewer "
           "processors")
    raise ValueError(f"run.batch_size = {batch} in {m} micro-batches (num_microbatches x "
                     f"grad_accum_steps) gives {micro} sequences each, which the layout's "
                     f"batch:{rule_map['batch']} ({ways}-way) does not divide; {fix}.")
  return micro


@dataclasses.dataclass(frozen=True)
class DataParallel:
  """The data-parallel axes of a (sub-)mesh.

  Attributes:
    axes: the axes that split "batch" or "outer_batch": gradients are
      summed over them.
    zero_axes: the axis that splits "batch" (none if it is not split):
      ZeRO shards over it.
    zero_size: processors along zero_axes.
  """
  axes: Tuple[int, ...]
  zero_axes: Tuple[int, ...]
  zero_size: int


def data_parallel(dims: Sequence, rule_map: Mapping[str, str]) -> DataParallel:
  """The data-parallel axes of the mesh dimensions `dims` under the layout
  rules `rule_map` ({tensor dimension: mesh dimension}).

  Example:
    >>> dims = mtf.convert_to_shape("slices:2;data:4;model:2").dims
    >>> data_parallel(dims, {"outer_batch": "slices", "batch": "data"})
    DataParallel(axes=(0, 1), zero_axes=(1,), zero_size=4)
  """
  split = {rule_map.get("batch"), rule_map.get("outer_batch")} - {None}
  axes = tuple(i for i, d in enumerate(dims) if d.name in split)
  zero_axes = tuple(i for i, d in enumerate(dims) if d.name == rule_map.get("batch"))
  return DataParallel(axes, zero_axes, math.prod(dims[a].size for a in zero_axes))
