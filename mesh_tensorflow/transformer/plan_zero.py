"""ZeRO in a plan: what `mtf.zero` changes in a step's time and memory.

The planner prices one micro-batch's graph built without ZeRO; this module
turns that into the step `mtf.zero` runs at `run.zero_stage` over the
data-parallel mesh dimensions (dp processors):

* stage >= 1: each processor updates 1/dp of every variable and keeps 1/dp
  of the optimizer slots; stages 1 and 2 then all-gather the new values into
  the replicated variables, after the update (nothing hides them);
* stage >= 2: the gradients' all-reduce over the data-parallel dimensions is
  a reduce-scatter into the blocks, and the gradients take 1/dp of memory
  (where "outer_batch" is split over other mesh dimensions, the blocks are
  then all-reduced over those: hybrid sharded data parallelism);
* stage 3: the variables are stored in blocks; each layer's are gathered
  in the forward pass and (unless `run.zero_reshard_after_forward = False`)
  again in the backward pass, a few variables ahead of their use, so each
  gather runs under the compute of the layer before it.

Variables move in their stored dtype when `run.float32_master_in_optimizer`
stores them in the activation dtype, and in the activation dtype otherwise
(the read casts before it moves): `read_per_stored` is the bytes moved per
byte stored (1, or activation bytes / 4).

    >>> opt, gathers = optimizer_phase(opt, dp_axes=(0,), dp=8, stage=2)
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Dict, Optional, Tuple


def optimizer_phase(opt, dp_axes: Tuple[int, ...], dp: int, stage: int,
                    read_per_stored: float = 1.0,
                    reduce_axes: Optional[Tuple[int, ...]] = None):
  """The optimizer phase as `mtf.zero` runs it at `stage`, and the
  collectives that follow the update.

  Args:
    opt: the optimizer phase (a `planner._Phase`) without ZeRO.
    dp_axes: the data-parallel axes of the sub-mesh that ZeRO shards over.
    dp: processors along them.
    stage: run.zero_stage.
    read_per_stored: bytes moved per byte of a stored variable.
    reduce_axes: the axes the gradients are summed over (default dp_axes):
      with "outer_batch" split too, from stage 2 a gradient is
      reduce-scattered over dp_axes and its block allreduced over the others
      (`plans.plan_sum_relayout`).

  Returns:
    (the phase with 1/dp of the update's FLOPs and bytes and its gradient
    all-reduces turned into reduce-scatters from stage 2, {collective key:
    count} of the all-gathers after the update at stages 1 and 2, in the
    variables' stored dtype: a gradient's bytes over `read_per_stored`).
  """
  if stage == 0 or dp == 1:
    return opt, {}
  comm: Dict[tuple, float] = {}
  after: Dict[tuple, float] = {}
  reduce_axes = tuple(dp_axes if reduce_axes is None else reduce_axes)
  rest = tuple(a for a in reduce_axes if a not in dp_axes)

  def add(into: Dict[tuple, float], key: tuple, count: float) -> None:
    into[key] = into.get(key, 0) + count
  for key, count in opt.comm.items():
    kind, axes, nbytes = key
    if kind == "allreduce" and tuple(axes) == reduce_axes:
      if stage <= 2:
        add(after, ("allgather", tuple(dp_axes), int(nbytes / read_per_stored) // dp), count)
      if stage >= 2:
        key = ("reduce_scatter", tuple(dp_axes), nbytes)
        if rest:
          add(comm, ("allreduce", rest, nbytes // dp), count)
    add(comm, key, count)
  return dataclasses.replace(opt, flops=opt.flops / dp, bytes=opt.bytes / dp, comm=comm), after


@dataclasses.dataclass
class Stage3Gathers:
  """The variable gathers of ZeRO stage 3 over one step (busiest stage)."""
  key: tuple = ()         # (kind, axes, bytes per processor) of one layer's gather
  count: float = 0.0      # gathers of all the stages' layers in a step
  seconds: float = 0.0    # their time on one device, hidden or not
  exposed: float = 0.0    # what the layers' compute does not hide


def stage3_gathers(layer_variable_bytes: float, dp_axes: Tuple[int, ...], dp: int,
                   read_per_stored: float, time_of: Callable[[tuple], float], *,
                   stages: int, layers_per_stage: int, executed_layers: int,
                   microbatches: int, grad_accum: int, reshard_after_forward: bool,
                   forward_s: float, backward_s: float, grad_reduce_hidden_s: float
                   ) -> Stage3Gathers:
  """Stage 3's gathers of one layer's variables and how much of them shows.

  Within a pipeline the forward copy serves every micro-batch and the
  backward pass gathers again for each; without one, each accumulation step
  gathers in its forward pass. A gather runs under the compute of the layer
  before it (`forward_s`, `backward_s`: one layer's, the backward with its
  recomputation); the backward gathers share the data-parallel links with
  the gradient reduction (`grad_reduce_hidden_s`: the part of it the
  backward pass hides), so what the compute cannot cover shows in the step.
  """
  if dp <= 1:
    return Stage3Gathers()
  key = ("allgather", dp_axes, int(layer_variable_bytes / dp * read_per_stored))
  one = time_of(key)
  forward_gathers = grad_accum if stages == 1 else 1
  backward_gathers = microbatches if reshard_after_forward else 0
  count = (forward_gathers + backward_gathers) * executed_layers
  seconds = count / stages * one
  rest = layers_per_stage - 1
  exposed = (forward_gathers * (one + rest * max(0.0, one - forward_s))
             + backward_gathers * (one + rest * max(0.0, one - backward_s)))
  covered = layers_per_stage * (forward_gathers * forward_s + backward_gathers * backward_s)
  shared = grad_reduce_hidden_s if backward_gathers else 0.0
  return Stage3Gathers(key, count, seconds, max(exposed, seconds + shared - covered))
