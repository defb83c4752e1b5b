"""How `mtf.einsum` communicates under a layout: `plan_einsum` decides
(which operand dimensions to gather, which mesh axes sum partial products,
whether shared memory fuses that sum into the gathers) and
`EinsumPlan.as_local_plan` states the decision as the LocalPlan that
`MeshImpl.execute_local` runs and the cost model prices.

    >>> plan = plan_einsum([x, w], y, layout_of, (8,), shares_memory=False)
    >>> plan.reduced_axes          # x and w split their summed dimension on mesh axis 0
    (0,)
    >>> plan.as_local_plan(y, layout_of).results[0].pending_sum_axes
    (0,)
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional, Sequence, Tuple

from mesh_tensorflow.lowering.plans import (CountedCollective, LocalPlan, Operand, Redistribution,
                                            Result, plan_gather_dims, slice_elements, stay)
from mesh_tensorflow.lowering.policies import fuses_allreduce, split_outermost


@dataclasses.dataclass(frozen=True)
class EinsumPlan:
  """How mtf.einsum communicates under a layout.

  Attributes:
    operand_moves: per operand, the redistribution before the local product
      (each mesh axis may split only one dimension across the einsum: the
      output's choice, else the first operand's; the others are gathered).
    reduced_axes: mesh axes splitting a dimension that the einsum sums: the
      local products are partial sums, allreduced over these axes (kept
      pending so that later sums fold in before the one allreduce).
    fused: where processors share memory, the allreduce is realized instead
      by gathering the operands along the summed dimensions too (included in
      operand_moves) and multiplying once per group of `group` processors;
      it is still counted as the allreduce the layout implies.
    flops: per processor, 2 * the product of the local sizes of all
      dimensions.
    output_bytes: one processor's slice of the output.
    operand_bytes: one processor's operands after the gathers of an unfused
      plan.
    group: processors per fused group (1 unless fused).
    batch_axes: where processors share memory and nothing is summed across
      processors, LocalPlan's `batch_axes`; else None.
  """
  operand_moves: Tuple[Redistribution, ...]
  reduced_axes: Tuple[int, ...]
  fused: bool
  flops: int
  output_bytes: int
  operand_bytes: int
  group: int = 1
  batch_axes: Optional[Tuple[Optional[int], ...]] = None

  @property
  def pending_sum_axes(self) -> Tuple[int, ...]:
    """Mesh axes of the allreduce left pending on the output (none if fused)."""
    return () if self.fused else self.reduced_axes

  def as_local_plan(self, output, layout_of: Callable) -> LocalPlan:
    """This plan as a LocalPlan: the operands' gathers, one product per
    processor, the output's partial sums pending; fused, the gathers counted
    as the allreduce and each product doing its group's work."""
    fused = dict(kernel_bytes=self.operand_bytes * self.group + self.output_bytes,
                 kernel_flops=self.flops * self.group,
                 counted_as=CountedCollective("allreduce", self.reduced_axes,
                                              self.output_bytes)) if self.fused else {}
    return LocalPlan(tuple(Operand(i, move) for i, move in enumerate(self.operand_moves)),
                     (Result(output.shape, output.dtype.size, stay(layout_of(output.shape)),
                             self.pending_sum_axes),), self.flops,
                     batch_axes=self.batch_axes, **fused)


def plan_einsum(inputs, output, layout_of: Callable, mesh_sizes: Sequence[int],
                shares_memory: bool) -> EinsumPlan:
  """The EinsumPlan of einsum(inputs) -> output; inputs and output have
  `.shape` and `.dtype` (mtf tensors); layout_of(shape) gives a layout."""
  out_names = set(output.shape.dimension_names)
  owner = {}  # mesh axis -> the one dimension it splits in this einsum
  for t in [output] + list(inputs):
    for d, a in zip(t.shape.dims, layout_of(t.shape)):
      if a is not None:
        owner.setdefault(a, d.name)
  gather, reduced_axes, operand_bytes = [], set(), 0
  for t in inputs:
    names = set()
    size = t.dtype.size
    for d, a in zip(t.shape.dims, layout_of(t.shape)):
      if a is not None and owner[a] != d.name:
        names.add(d.name)
      elif a is not None and d.name not in out_names:
        reduced_axes.add(a)
      size *= d.size if (a is None or d.name in names) else d.size // mesh_sizes[a]
    gather.append(names)
    operand_bytes += size
  output_bytes = slice_elements(output.shape, layout_of(output.shape), mesh_sizes) * (
      output.dtype.size)
  fused = bool(reduced_axes) and shares_memory and fuses_allreduce(
      operand_bytes, output_bytes,
      not any(gather) and split_outermost(layout_of, inputs, reduced_axes))
  group = 1
  if fused:
    summed = {d.name for t in inputs for d in t.shape.dims if d.name not in out_names}
    gather = [names | summed for names in gather]
    for a in reduced_axes:
      group *= mesh_sizes[a]
  moves = tuple(plan_gather_dims(t.shape, layout_of(t.shape), names)
                for t, names in zip(inputs, gather))
  split_by = {name: a for a, name in owner.items()}
  flops = 2
  for name, size in {d.name: d.size for t in inputs for d in t.shape.dims}.items():
    a = split_by.get(name)
    flops *= size // mesh_sizes[a] if a is not None else size
  batch_axes = None
  if shares_memory and not reduced_axes:
    batch_axes = tuple(_batch_axis(t, output, layout_of, mesh_sizes) for t in inputs)
  return EinsumPlan(moves, tuple(sorted(reduced_axes)), fused, flops, output_bytes,
                    operand_bytes, group, batch_axes)


def _batch_axis(t, output, layout_of: Callable, mesh_sizes: Sequence[int]) -> Optional[int]:
  """The mesh axis that alone splits t, in its outermost dimension, which is
  also the output's outermost; None if there is none such."""
  if not output.shape.ndims or not t.shape.ndims:
    return None
  layout = tuple(layout_of(t.shape))
  split = [a for a in layout if a is not None]
  if (len(split) != 1 or layout[0] is None or t.shape.dims[0] != output.shape.dims[0]
      or mesh_sizes[layout[0]] == 1):
    return None
  return layout[0]
