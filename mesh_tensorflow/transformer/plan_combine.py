"""Collectives merged as XLA merges them: the once-per-step gradient
reduction and parameter gathering of a plan priced as a compiled step runs
them.

XLA's combiner passes (all-reduce, reduce-scatter and all-gather) merge
independent collectives of one kind over the same device groups into one
collective, in program order, until the merged result would exceed a size:
30 MiB by default (`kDefaultAllReduceCombineThreshold` and its two siblings
in OpenXLA's `xla/service/collective_utils.h`). A step's gradient
reductions (one per variable, all ready at the end of the backward pass)
and ZeRO's gathers of the updated variables are such collectives: merged,
a 48-way ring pays its per-step latency once per 30 MiB rather than once
per variable. Other stacks do the same with buckets (Megatron-LM,
DeepSpeed and PyTorch DDP group gradients before reducing them).

Here the size limit holds for a merged collective's largest buffer, its
input or its result: an all-gather's result is n times its input (n
processors in a group), a reduce-scatter's input n times its result. XLA
counts a reduce-scatter's result only, which at 512-way data parallelism
would merge gigabytes of unreduced gradients into one collective that
needs them all in memory at once (memory this plan does not count), where
the training stacks' buckets, like this limit, bound the input.

    >>> combine({("allreduce", (0,), 2**20): 90}, group_size=lambda axes: 8)
    {('allreduce', (0,), 31457280): 3}
"""

from __future__ import annotations

import math
from typing import Callable, Dict, Tuple

COMBINE_THRESHOLD_BYTES = 30 * 2**20  # XLA's default, see the module docstring

Key = Tuple[str, Tuple[int, ...], int]  # (kind, mesh axes, bytes per processor)


def largest_buffer(kind: str, bytes_per_processor: float, group_size: int) -> float:
  """Bytes of a collective's larger buffer on one processor, input or
  result (what the threshold counts): an all-gather's result is
  `group_size` inputs; a reduce-scatter's and an all-reduce's input is the
  larger (`bytes_per_processor`, as the planner counts collectives)."""
  if kind == "allgather":
    return bytes_per_processor * group_size
  return bytes_per_processor


def combine(collectives: Dict[Key, float], group_size: Callable[[Tuple[int, ...]], int],
            threshold: float = COMBINE_THRESHOLD_BYTES) -> Dict[Key, float]:
  """`collectives` ({key: count}) with those of one kind over the same mesh
  axes merged into collectives whose buffers are at most `threshold` bytes.

  Collectives of one size are packed as many to a merged one as fit; the
  ones left over from every size are pooled into as few merged ones as
  their total needs. A collective whose buffer alone exceeds the threshold
  stays as it is.

  Args:
    collectives: counts per step, keyed by (kind, mesh axes, bytes per
      processor).
    group_size: processors in a group over the given mesh axes.
    threshold: the largest merged buffer, in bytes.

  Returns:
    The merged collectives' counts, keyed as `collectives` is. The bytes
    moved are unchanged; the count is what merging leaves.
  """
  merged: Dict[Key, float] = {}
  leftover: Dict[Tuple[str, Tuple[int, ...]], float] = {}
  for (kind, axes, nbytes), count in collectives.items():
    per_merge = max(1, int(threshold // max(largest_buffer(kind, nbytes, group_size(axes)), 1)))
    full = math.floor(count / per_merge) if per_merge > 1 else count
    if full:
      key = (kind, axes, nbytes * per_merge)
      merged[key] = merged.get(key, 0) + full
    rest = count - full * per_merge
    if rest > 1e-9:
      leftover[(kind, axes)] = leftover.get((kind, axes), 0.0) + rest * nbytes
  for (kind, axes), total in leftover.items():
    count = max(1, math.ceil(largest_buffer(kind, total, group_size(axes)) / threshold - 1e-9))
    key = (kind, axes, int(total / count))
    merged[key] = merged.get(key, 0) + count
  return merged


def pieces(collectives: Dict[Key, float], layers: int) -> float:
  """How many pieces an overlap hides one after another, the last of which
  it cannot hide: one per layer, or one per collective where (merged) there
  are fewer collectives than layers; a merged collective starts when the
  last of its inputs is ready.

    >>> pieces({("reduce_scatter", (0,), 2**30): 3}, layers=48)
    3.0
  """
  return max(1.0, min(float(layers), float(sum(collectives.values()))))
