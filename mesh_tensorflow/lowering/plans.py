"""Communication plans: what the lowering moves between processors, decided
from shapes, layouts and mesh sizes alone, before any TensorFlow op exists.

The collectives an operation emits come from a plan made here. A mesh
implementation executes a plan (`MeshImpl.execute`), the lowering's counters
observe the collectives it runs (observers.py), and the cost model
(analysis/cost_model) prices the very same plan objects without building
TensorFlow ops, so the estimate and the lowering cannot disagree about what
is communicated.

A plan is a tuple of steps. Each step names mesh and tensor axes:

* `AllGather(mesh_axis, tensor_axis)`: un-splits a tensor axis (allconcat).
* `AllToAll(mesh_axis, split_axis, concat_axis)`: moves the split from one
  tensor axis to another.
* `SliceAlong(mesh_axis, tensor_axis)`: splits a whole tensor axis; local,
  no communication.
* `AllReduce(mesh_axes, reduction)`: combines partial results (sums, maxima)
  of every group.

    >>> plan = plan_relayout((0, None), (None, 0))
    >>> plan.steps
    (AllToAll(mesh_axis=0, split_axis=1, concat_axis=0),)
    >>> plan.target
    (None, 0)

Operations that choose how to communicate get their plan from a function
here: `plan_gather`, `plan_reshape`, `plan_reduce`, `plan_scatter_add`
(`plan_einsum` in einsum_plans.py); those that reduce along one dimension inside their
kernels (softmax, its gradient, the cross-entropy) get a KernelPlan, several
kernels with the statistics' allreduces between them, from
statistics_plans.py. Most are LocalPlans:
communication around one local kernel, which `MeshImpl.execute_local` runs
and the cost model prices without knowing the operation. The size-based choices
inside them live in policies.py.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Optional, Sequence, Tuple, Union

from mesh_tensorflow.lowering.policies import gathers_table_first

Layout = Tuple[Optional[int], ...]  # per tensor axis: the mesh axis splitting it, or None


@dataclasses.dataclass(frozen=True)
class AllGather:
  """Concatenates the blocks of `tensor_axis` over `mesh_axis`: afterwards
  every processor holds that axis whole. Collective kind "allgather"."""
  mesh_axis: int
  tensor_axis: int
  kind = "allgather"

  def apply(self, layout: Layout) -> Layout:
    return _with(layout, self.tensor_axis, None)


@dataclasses.dataclass(frozen=True)
class AllToAll:
  """Splits `split_axis` over `mesh_axis` and un-splits `concat_axis` (which
  that mesh axis split before) in one exchange. Collective kind "alltoall"."""
  mesh_axis: int
  split_axis: int
  concat_axis: int
  kind = "alltoall"

  def apply(self, layout: Layout) -> Layout:
    return _with(_with(layout, self.concat_axis, None), self.split_axis, self.mesh_axis)


@dataclasses.dataclass(frozen=True)
class SliceAlong:
  """Keeps each processor's block of the whole `tensor_axis` by its
  coordinate along `mesh_axis`: local, no communication."""
  mesh_axis: int
  tensor_axis: int
  kind = None

  def apply(self, layout: Layout) -> Layout:
    return _with(layout, self.tensor_axis, self.mesh_axis)


@dataclasses.dataclass(frozen=True)
class AllReduce:
  """Combines the slices of every group over `mesh_axes` with `reduction`
  ("SUM", "MAX", "MIN", "LOGICAL_OR", "LOGICAL_AND"); the layout stays.
  Collective kind "allreduce"."""
  mesh_axes: Tuple[int, ...]
  reduction: str = "SUM"
  kind = "allreduce"

  def apply(self, layout: Layout) -> Layout:
    return tuple(layout)


@dataclasses.dataclass(frozen=True)
class Permute:
  """Each processor receives the slice of the processor at coordinate
  `sources[c]` along `mesh_axis` (its own coordinate being c), or zeros
  where that is None; the layout stays. Collective kind "permute"."""
  mesh_axis: int
  sources: Tuple[Optional[int], ...]
  kind = "permute"

  def apply(self, layout: Layout) -> Layout:
    return tuple(layout)


@dataclasses.dataclass(frozen=True)
class ReduceScatter:
  """Sums partial slices over `mesh_axis` and leaves each processor the
  block of `tensor_axis` at its coordinate (that axis becomes split over
  `mesh_axis`). Collective kind "reduce_scatter"."""
  mesh_axis: int
  tensor_axis: int
  kind = "reduce_scatter"

  def apply(self, layout: Layout) -> Layout:
    return _with(layout, self.tensor_axis, self.mesh_axis)


@dataclasses.dataclass(frozen=True)
class JoinBlocks:
  """Where processors share memory and their slices are the blocks of one
  existing tensor along `tensor_axis` (split over `mesh_axis`), each takes
  that whole tensor: local, no communication and no copy."""
  mesh_axis: int
  tensor_axis: int
  kind = None

  def apply(self, layout: Layout) -> Layout:
    return _with(layout, self.tensor_axis, None)


@dataclasses.dataclass(frozen=True)
class CountedCollective:
  """A collective of `kind` over `mesh_axes` (`nbytes` per processor) that a
  LocalPlan's operand moves realize instead (its `counted_as`): where
  processors share memory, gathering an einsum's operands along a summed
  dimension lets one product per group make the sum the layout implies, so
  the moves are counted as that one allreduce and their own gathers not."""
  kind: str
  mesh_axes: Tuple[int, ...]
  nbytes: int


Step = Union[AllGather, AllToAll, SliceAlong, AllReduce, Permute, ReduceScatter, JoinBlocks]


def _with(layout: Layout, tensor_axis: int, mesh_axis: Optional[int]) -> Layout:
  out = list(layout)
  out[tensor_axis] = mesh_axis
  return tuple(out)


@dataclasses.dataclass(frozen=True)
class Redistribution:
  """Moves a tensor from layout `source` to layout `target` by `steps`.

  Example:
    >>> plan = plan_gather_dims(mtf.Shape([batch, hidden]), (0, 1), {"hidden"})
    >>> plan.steps, plan.target
    ((AllGather(mesh_axis=1, tensor_axis=1),), (0, None))
  """
  source: Layout
  target: Layout
  steps: Tuple[Step, ...]

  def __bool__(self) -> bool:
    return bool(self.steps)

  def walk(self):
    """(step, layout before the step) for each step in order."""
    layout = self.source
    for step in self.steps:
      yield step, layout
      layout = step.apply(layout)

  def then(self, *steps: Step) -> "Redistribution":
    """This redistribution followed by `steps` (a Redistribution's steps, or
    single steps)."""
    more = []
    for s in steps:
      more.extend(s.steps if isinstance(s, Redistribution) else (s,))
    layout = self.target
    for s in more:
      layout = s.apply(layout)
    return Redistribution(self.source, layout, self.steps + tuple(more))


def stay(layout: Sequence[Optional[int]]) -> Redistribution:
  """No communication: a tensor stays in `layout`."""
  return Redistribution(tuple(layout), tuple(layout), ())


def plan_relayout(source: Sequence[Optional[int]], target: Sequence[Optional[int]]
                  ) -> Redistribution:
  """The fewest collectives that move a tensor from layout `source` to
  `target`: per mesh axis, an all-to-all where both layouts split a tensor
  axis over it (different ones), an all-gather where only the source does;
  then the local slicing of the axes only the target splits.

  Steps run in mesh-axis order, except that an all-to-all waits until the
  tensor axis it splits is no longer split by another mesh axis (a tensor
  axis is split by at most one mesh axis at every step). Where two mesh axes
  swap tensor axes, neither can go first: the first of them all-gathers and
  slices its new axis at the end instead."""
  source, target = tuple(source), tuple(target)
  if source == target:
    return Redistribution(source, target, ())
  mesh_axes = sorted({a for a in source + target if a is not None})
  todo = []  # mesh axes that move or un-split a tensor axis, in order
  for mesh_axis in mesh_axes:
    old, new = _tensor_axis_of(source, mesh_axis), _tensor_axis_of(target, mesh_axis)
    if old is not None and old != new:
      todo.append(mesh_axis)
  steps, layout = [], source
  while todo:
    for mesh_axis in todo:
      new = _tensor_axis_of(target, mesh_axis)
      if new is None or layout[new] is None:
        break
    else:  # a cycle of all-to-alls: break it with an all-gather
      mesh_axis, new = todo[0], None
    old = _tensor_axis_of(layout, mesh_axis)
    step = (AllGather(mesh_axis, old) if new is None
            else AllToAll(mesh_axis, split_axis=new, concat_axis=old))
    steps.append(step)
    layout = step.apply(layout)
    todo.remove(mesh_axis)
  for mesh_axis in mesh_axes:
    new = _tensor_axis_of(target, mesh_axis)
    if new is not None and layout[new] is None:
      step = SliceAlong(mesh_axis, new)
      steps.append(step)
      layout = step.apply(layout)
  return Redistribution(source, target, tuple(steps))


def plan_gather_dims(shape, layout: Sequence[Optional[int]], names) -> Redistribution:
  """Un-splits the dimensions of `shape` named in `names` (all-gathers)."""
  target = tuple(None if d.name in names else a for d, a in zip(shape.dims, layout))
  return plan_relayout(layout, target)


def _tensor_axis_of(layout: Layout, mesh_axis: int) -> Optional[int]:
  for tensor_axis, m in enumerate(layout):
    if m == mesh_axis:
      return tensor_axis
  return None


def slice_elements(shape, layout: Sequence[Optional[int]], mesh_sizes: Sequence[int]) -> int:
  """Elements of one processor's slice of `shape` under `layout`."""
  return math.prod(d.size // mesh_sizes[a] if a is not None else d.size
                   for d, a in zip(shape.dims, layout))


# ----------------------------------------------------------------------------- einsum


# ----------------------------------------------------------------------------- gather


def plan_gather(weights, indices, output, dim, layout_of: Callable,
                mesh_sizes: Sequence[int]) -> "LocalPlan":
  """The LocalPlan of gather(weights, indices, dim) -> output (a table
  lookup along `dim`).

  The table is moved first: where a mesh axis splits `dim`, it is gathered
  along `dim` when the indices are split over that axis too or when moving
  the table costs less than summing the looked-up rows
  (policies.gathers_table_first). Otherwise each processor looks up in its
  own block of `dim` (the kernel reads the block's offset: `coordinates`),
  masking ids that other blocks hold, and the result is a pending sum over
  that mesh axis. The kernel reads the indices and writes the output (not
  the whole table)."""
  w_layout = tuple(layout_of(weights.shape))
  mesh_axis = w_layout[weights.shape.index_of(dim.name)]
  out_layout = tuple(layout_of(output.shape))
  out_bytes = slice_elements(output.shape, out_layout, mesh_sizes) * output.dtype.size
  kernel_bytes = out_bytes + slice_elements(indices.shape, layout_of(indices.shape),
                                            mesh_sizes) * indices.dtype.size
  idx = Operand(1, stay(layout_of(indices.shape)))
  if mesh_axis is not None and (
      mesh_axis in layout_of(indices.shape) or gathers_table_first(
          slice_elements(weights.shape, w_layout, mesh_sizes) * weights.dtype.size,
          mesh_sizes[mesh_axis], out_bytes)):
    return LocalPlan((Operand(0, plan_gather_dims(weights.shape, w_layout, {dim.name})), idx),
                     (Result(output.shape, output.dtype.size, stay(out_layout)),),
                     kernel_bytes=kernel_bytes)
  masked = () if mesh_axis is None else (mesh_axis,)
  return LocalPlan((Operand(0, stay(w_layout)), idx),
                   (Result(output.shape, output.dtype.size, stay(out_layout), masked),),
                   coordinates=w_layout if masked else None, kernel_bytes=kernel_bytes)


# ----------------------------------------------------------------------------- reshape


def plan_reshape(in_shape, out_shape, dtype_size: int, layout_of: Callable,
                 mesh_sizes: Sequence[int],
                 input_pending_axes: Optional[Sequence[int]] = None) -> "LocalPlan":
  """The LocalPlan of reshape(x of in_shape) -> out_shape: gather the splits
  that do not survive the reshape, reshape each slice locally (the result's
  move starts from the layout the slices then have), then slice the axes
  that the new layout splits and the kept splits do not cover.

  A split survives when the output splits, over the same mesh axis, a
  dimension with the same stride prefix (product of the dimensions before)
  whose size the mesh axis divides: e.g. a split dimension cut into [blocks,
  block] with blocks split, or merged with the dimensions after it. Each
  processor's contiguous chunk is then the same in both shapes.

  Where only dimension names change (the sizes, in order, stay), the split
  moves as `plan_relayout` moves it: an all-to-all rather than a gather.

  A reshape is linear: where nothing is gathered and only axes outside the
  input's pending sum (`input_pending_axes`) are sliced, the summands are
  reshaped instead and the sum stays pending (a renamed gradient then joins
  the sum it is added to, one allreduce for both)."""
  in_layout, out_layout = tuple(layout_of(in_shape)), tuple(layout_of(out_shape))
  if in_shape.to_integer_list() == out_shape.to_integer_list():
    # Only names change: the slices stay and the split moves as a relayout
    # does (an all-to-all where a split moves to another dimension, as a
    # mixture-of-experts layer's tokens move to their experts).
    move = plan_relayout(in_layout, out_layout)
    if not input_pending_axes:
      return LocalPlan((Operand(0, stay(in_layout)),), (Result(out_shape, dtype_size, move),))
    if all(getattr(step, "mesh_axis", None) not in input_pending_axes
           and not isinstance(step, AllReduce) for step in move.steps):
      # The moves run along other mesh axes, among processors holding the
      # same summand: the sum stays pending (an expert layer's output,
      # partial over its hidden dimension's split, goes back to its tokens
      # by all-to-all and is summed once, later).
      return LocalPlan((Operand(0, stay(in_layout), partial=TAKES_PARTIAL),),
                       (Result(out_shape, dtype_size, move, tuple(input_pending_axes)),))
  in_strides, out_strides = in_shape.cumprod(), out_shape.cumprod()
  kept_in, kept_out = set(), set()
  for i, a in enumerate(in_layout):
    if a is None:
      continue
    for j, b in enumerate(out_layout):
      if (b == a and out_shape.dims[j].size % mesh_sizes[a] == 0
          and out_strides[j] == in_strides[i]):
        kept_in.add(i)
        kept_out.add(j)
  names = {d.name for i, d in enumerate(in_shape.dims)
           if in_layout[i] is not None and i not in kept_in}
  kept = tuple(a if j in kept_out else None for j, a in enumerate(out_layout))
  gather, out_move = plan_gather_dims(in_shape, in_layout, names), plan_relayout(kept, out_layout)
  if input_pending_axes and not gather and all(
      isinstance(step, SliceAlong) and step.mesh_axis not in input_pending_axes
      for step in out_move.steps):
    return LocalPlan((Operand(0, gather, partial=TAKES_PARTIAL),),
                     (Result(out_shape, dtype_size, out_move, tuple(input_pending_axes)),))
  return LocalPlan((Operand(0, gather),), (Result(out_shape, dtype_size, out_move),))


# ----------------------------------------------------------------------------- reductions


def split_axis(shape, dim, layout_of: Callable) -> Optional[int]:
  """The mesh axis that splits dimension `dim` (a Dimension or name) of
  `shape` under the layout, or None."""
  name = dim if isinstance(dim, str) else dim.name
  return tuple(layout_of(shape))[shape.index_of(name)]


def adds_pending_sums(a_pending_axes: Optional[Sequence[int]],
                      b_pending_axes: Optional[Sequence[int]], a_shape, b_shape,
                      out_shape) -> bool:
  """Whether a + b of two pending sums (their mesh axes, None when not
  pending) stays one pending sum: same axes and no broadcasting. Then one
  allreduce of the summed partials replaces two."""
  return (a_pending_axes is not None and b_pending_axes is not None
          and tuple(sorted(a_pending_axes)) == tuple(sorted(b_pending_axes))
          and a_shape == b_shape == out_shape)


def adds_to_pending_sum(a_pending_axes: Optional[Sequence[int]],
                        b_pending_axes: Optional[Sequence[int]], a_shape, b_shape, out_shape,
                        out_layout: Sequence[Optional[int]]) -> Optional[int]:
  """Which operand of a + b (0 or 1) is a pending sum that can stay one when
  the other operand is whole: the other is not pending, no broadcasting, and
  no pending mesh axis splits the output (so the whole operand is the same
  on every processor along them). The whole operand then joins the partial
  sums on the processors at coordinate 0 along the pending axes only, and
  the one allreduce that was due anyway completes the sum. None otherwise."""
  if not a_shape == b_shape == out_shape:
    return None
  if (a_pending_axes is None) == (b_pending_axes is None):
    return None
  index, axes = (0, a_pending_axes) if a_pending_axes is not None else (1, b_pending_axes)
  if not axes or set(axes) & {a for a in out_layout if a is not None}:
    return None
  return index


def plan_reduce(x, out, reduction: str, input_pending_axes: Optional[Sequence[int]],
                layout_of: Callable, mesh_sizes: Sequence[int]) -> "LocalPlan":
  """The LocalPlan of reducing `x` to the shape of `out` with `reduction`
  ("SUM", "MAX", "MIN"; on booleans SUM and MAX are any, MIN all);
  input_pending_axes: the mesh axes of x's pending sum, or None.

  Each processor reduces its slice. Where mesh axes split reduced
  dimensions, a sum is left pending over them (see LazyAllreduceSum) and any
  other reduction is allreduced at once. A sum of a pending sum takes its
  summands instead (`TAKES_PARTIAL`) and leaves one pending sum over both
  sets of axes."""
  layout = tuple(layout_of(x.shape))
  out_layout = tuple(layout_of(out.shape))
  axes = [a for d, a in zip(x.shape.dims, layout) if d not in out.shape.dims and a is not None]
  is_bool = x.dtype.is_bool
  is_sum = reduction == "SUM" and not is_bool
  folds = is_sum and input_pending_axes is not None
  if folds:
    axes = sorted(set(axes) | set(input_pending_axes))
  axes = tuple(axes)
  operand = Operand(0, stay(layout), partial=TAKES_PARTIAL if folds else "")
  flops = 0 if input_pending_axes is not None else slice_elements(x.shape, layout, mesh_sizes)
  move, pending = stay(out_layout), ()
  if axes and is_sum:
    pending = axes
  elif axes:
    op = reduction
    if is_bool:  # any / all
      op = "LOGICAL_OR" if reduction in ("SUM", "MAX") else "LOGICAL_AND"
    move = move.then(AllReduce(axes, op))
  return LocalPlan((operand,), (Result(out.shape, out.dtype.size, move, pending),), flops,
                   memory_bound=True)


def plan_scatter_add(g, indices, out, dim, layout_of: Callable) -> "LocalPlan":
  """The LocalPlan of the gradient of mtf.gather: a scatter-add of `g` into
  `out` (the table's shape) along `dim`.

  Where the indices are split over the mesh axis that also splits `dim`,
  each processor sums its ids into the whole of `dim`; those partial sums
  are allreduced, then `dim` is split again. Otherwise a processor whose
  block of `dim` is split sums only the ids of its block (the kernel reads
  the block's offset: `coordinates`), and the partial sums over mesh axes
  that split the indices but not the output stay pending."""
  out_layout = tuple(layout_of(out.shape))
  mesh_axis = split_axis(out.shape, dim, layout_of)
  idx_axes = {a for a in layout_of(indices.shape) if a is not None}
  gathers_output = mesh_axis is not None and mesh_axis in idx_axes
  computed = tuple(None if (gathers_output and d.name == dim.name) else a
                   for d, a in zip(out.shape.dims, out_layout))
  operands = (Operand(0, stay(layout_of(g.shape))), Operand(1, stay(layout_of(indices.shape))))
  if gathers_output:
    move = stay(computed).then(AllReduce(tuple(sorted(idx_axes))),
                               plan_relayout(computed, out_layout))
    return LocalPlan(operands, (Result(out.shape, out.dtype.size, move),))
  pending = tuple(sorted(idx_axes - {a for a in out_layout if a is not None}))
  return LocalPlan(operands, (Result(out.shape, out.dtype.size,
                                     plan_relayout(computed, out_layout), pending),),
                   coordinates=out_layout if mesh_axis is not None else None)


# ----------------------------------------------------------------------------- local kernels


@dataclasses.dataclass(frozen=True)
class PlanMesh:
  """What an operation's plan depends on: the layout of a shape
  (`layout_of(shape)`: per tensor axis the mesh axis splitting it, or
  None), the mesh axes' sizes (and names), whether processors share memory,
  and the placement of the operation's inputs (`partial_sum_axes_of(tensor)`: the
  mesh axes of its pending sum, or None; `summands_axes_of(tensor)`: the
  same for a pending sum that a consumer may have completed since, whose
  summands are still at hand). Both the lowering (from a mesh
  implementation) and the cost model make one; `Operation.plan(mesh)` takes
  it.

  Example:
    >>> mesh = PlanMesh(lambda shape: (0, None), (8,))
    >>> einsum_op.plan(mesh).results[0].pending_sum_axes
  """
  layout_of: Callable
  sizes: Tuple[int, ...]
  shares_memory: bool = False
  partial_sum_axes_of: Callable = lambda tensor: None
  names: Tuple[str, ...] = ()
  summands_axes_of: Callable = lambda tensor: None


READS_PARTIAL = "read"
TAKES_PARTIAL = "take"


@dataclasses.dataclass(frozen=True)
class Operand:
  """One argument of an operation's local kernel: input number `input`
  after `move`. `partial`: "" for the input's value; READS_PARTIAL or
  TAKES_PARTIAL to use the summands of the input's pending sum (its Partial
  placement) instead, `move` then starting with the allreduces or
  reduce-scatters it needs. An operation that takes them over leaves the sum
  to complete only if something else needs it; one that reads them leaves
  it as it is."""
  input: int
  move: Redistribution
  partial: str = ""


@dataclasses.dataclass(frozen=True)
class Result:
  """One result of an operation's local kernel, of `shape` with elements of
  `dtype_size` bytes, moved by `move` (from the layout the kernel makes it
  in) and left a pending sum over `pending_sum_axes`."""
  shape: object
  dtype_size: int
  move: Redistribution
  pending_sum_axes: Tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class LocalPlan:
  """An operation made of communication around one local kernel: the
  operands' moves, the kernel on every processor (none when `kernel` is
  False: the results are the operands), and the results' moves. Its results
  are the operation's outputs in order, or, when `combined`, the arguments
  of one more local kernel that makes the single output.

  `flops` are one processor's kernel's; a `memory_bound` kernel (a
  reduction: one add per element read) is priced by the bytes it touches
  rather than at matrix-product speed. `coordinates`: a layout whose slice
  offsets the kernel also reads (the processor's block of a split
  dimension; the lowering passes them after the operands), so processors
  with different blocks run different kernels; None when it reads none.
  `kernel_bytes`, `kernel_flops`: what one kernel reads and writes when
  that is not its operands and results (a lookup reads only the rows it
  needs), and its FLOPs when they are not `flops` (the operation's FLOPs per
  processor); None for those.

  Where processors share memory: `counted_as`, a collective that the
  operands' moves realize (they are counted as it, see CountedCollective);
  `batch_axes`, per operand the mesh axis that alone splits its outermost
  dimension, also the result's (None where that is not so): when exactly one
  operand differs between processors, has such an axis and its slices are
  the blocks of one tensor, one kernel runs on the joined blocks and each
  processor takes its rows of the result (`batched_operand`). None: never.

  Example:
    >>> plan = plan_unsplit(op, layout_of, {"length"})
    >>> [o.move.steps for o in plan.operands]
    [(AllGather(mesh_axis=0, tensor_axis=1),)]
  """
  operands: Tuple[Operand, ...]
  results: Tuple[Result, ...]
  flops: int = 0
  kernel: bool = True
  combined: bool = False
  coordinates: Optional[Layout] = None
  kernel_bytes: Optional[int] = None
  memory_bound: bool = False
  kernel_flops: Optional[int] = None
  counted_as: Optional[CountedCollective] = None
  batch_axes: Optional[Tuple[Optional[int], ...]] = None


def batched_operand(batch_axes: Sequence[Optional[int]], is_one_tensor: Callable[[int], bool],
                    holds_blocks: Callable[[int, int], bool]) -> Optional[Tuple[int, int]]:
  """(operand, mesh axis) on which a LocalPlan with `batch_axes` runs one
  kernel on joined blocks, or None: exactly one operand is not one tensor
  shared by every processor (`is_one_tensor`), it has a batch axis, and its
  slices are the blocks of one existing tensor along it (`holds_blocks`:
  joining them copies nothing; a copy of computed activations would cost
  more than the one large kernel saves)."""
  differing = [i for i in range(len(batch_axes)) if not is_one_tensor(i)]
  if len(differing) != 1:
    return None
  i = differing[0]
  axis = batch_axes[i]
  if axis is None or not holds_blocks(i, axis):
    return None
  return i, axis


@dataclasses.dataclass(frozen=True)
class Kernel:
  """One local kernel of a KernelPlan, run on every processor: it reads the
  plan's values `args` and makes one new value per result (each moved and
  left a pending sum as the Result says). `nbytes` and `flops`: what one
  processor's kernel reads and writes, and its matrix-product FLOPs (0 for
  kernels priced by their bytes). `coordinates`: as LocalPlan's. `state`:
  the layout of the slice variables the kernel also reads (a variable's
  stored slices; processors holding the same slice variable run one
  kernel), or, with `writes`, the ones it updates (once per distinct slice
  variable: a side effect, and no results)."""
  args: Tuple[int, ...]
  results: Tuple[Result, ...]
  nbytes: int
  flops: int = 0
  coordinates: Optional[Layout] = None
  state: Optional[Layout] = None
  writes: bool = False


@dataclasses.dataclass(frozen=True)
class KernelPlan:
  """An operation made of several local kernels with communication between
  them (the allreduces of per-slice statistics when a softmax's dimension is
  split). Values are numbered in order: the operands after their moves,
  then each kernel's results. The operation's outputs are the values
  `outputs`; `flops` counts the operation's FLOPs per processor
  (statistics_plans.py makes them; its docstring has an example)."""
  operands: Tuple[Operand, ...]
  kernels: Tuple[Kernel, ...]
  outputs: Tuple[int, ...]
  flops: int = 0


def plan_slicewise(op, layout_of: Callable, mesh_sizes: Sequence[int]) -> LocalPlan:
  """The LocalPlan of an operation that communicates nothing (one whose
  `plan` is None): one kernel on its inputs' slices as they are laid out,
  making its outputs in their own layouts. An elementwise operation
  (`local_kernel` "elementwise") counts one FLOP per output element, priced
  by the bytes it touches."""
  operands = tuple(Operand(i, stay(layout_of(t.shape))) for i, t in enumerate(op.inputs))
  results = tuple(Result(t.shape, t.dtype.size, stay(layout_of(t.shape))) for t in op.outputs)
  flops = 0
  if op.local_kernel == "elementwise" and op.outputs:
    out = op.outputs[0]
    flops = slice_elements(out.shape, layout_of(out.shape), mesh_sizes)
  return LocalPlan(operands, results, flops, memory_bound=True)


def _kept_split(shape, layout: Layout, whole_names) -> Layout:
  return tuple(None if d.name in whole_names else a for d, a in zip(shape.dims, layout))


def plan_unsplit(op, layout_of: Callable, unsplit_names, partial_sum_axes=None,
                 flops: int = 0) -> LocalPlan:
  """The LocalPlan of an operation computed on slices in which the
  dimensions `unsplit_names` are whole: the inputs gather them, the kernel
  runs on every processor, and each output (whole along them) is summed
  over its `partial_sum_axes` (one list per output, if any) and then split
  into its own layout locally."""
  unsplit = set(unsplit_names)
  operands = tuple(Operand(i, plan_gather_dims(t.shape, layout_of(t.shape), unsplit))
                   for i, t in enumerate(op.inputs))
  results = []
  for i, out in enumerate(op.outputs):
    layout = tuple(layout_of(out.shape))
    current = _kept_split(out.shape, layout, unsplit)
    move = stay(current)
    if partial_sum_axes and partial_sum_axes[i]:
      move = move.then(AllReduce(tuple(sorted(partial_sum_axes[i]))))
    results.append(Result(out.shape, out.dtype.size, move.then(plan_relayout(current, layout))))
  return LocalPlan(operands, tuple(results), flops)


def plan_local(op, layout_of: Callable, gather_names, whole_out_names, flops: int = 0
               ) -> LocalPlan:
  """The LocalPlan of an operation with one output computed per processor
  on its inputs' slices with `gather_names` gathered: input dimensions that
  stay split and are missing from the output are summed by the kernel, the
  output is whole along `whole_out_names` and split elsewhere as its layout
  says. The partial sums stay pending (allreduced at once when a summed
  mesh axis also splits a dimension the kernel makes whole)."""
  gather_names = set(gather_names)
  out = op.outputs[0]
  out_names = set(out.shape.dimension_names)
  operands, reduced = [], set()
  for i, t in enumerate(op.inputs):
    names = gather_names & set(t.shape.dimension_names)
    layout = tuple(layout_of(t.shape))
    operands.append(Operand(i, plan_gather_dims(t.shape, layout, names)))
    for d, a in zip(t.shape.dims, layout):
      if a is not None and d.name not in names and d.name not in out_names:
        reduced.add(a)
  target = tuple(layout_of(out.shape))
  current = _kept_split(out.shape, target, whole_out_names)
  move = stay(current)
  if reduced & {a for a, c in zip(target, current) if a is not None and c is None}:
    move = move.then(AllReduce(tuple(sorted(reduced))))  # sum, then split
    reduced = set()
  move = move.then(plan_relayout(current, target))
  return LocalPlan(tuple(operands),
                   (Result(out.shape, out.dtype.size, move, tuple(sorted(reduced))),), flops)


def replica_splits(shape, layout: Sequence[Optional[int]], mesh_sizes: Sequence[int],
                   keep_whole: Sequence[int] = ()) -> Tuple[Tuple[int, int], ...]:
  """(mesh axis, tensor axis) pairs that cut a tensor replicated over mesh
  axes into one block per replica: each mesh axis of size > 1 that `layout`
  does not use gets the largest whole tensor axis (not in `keep_whole`, not
  taken by an earlier pair) that its size divides.

  Example:
    >>> replica_splits(mtf.Shape([stages, batch, d_model]), (0, None, None), (4, 8))
    ((1, 2),)      # mesh axis 1 replicates it: cut d_model (the larger axis)
  """
  sizes = shape.to_integer_list() if hasattr(shape, "to_integer_list") else list(shape)
  taken = set(keep_whole) | {t for t, m in enumerate(layout) if m is not None}
  pairs = []
  for m, n in enumerate(mesh_sizes):
    if n == 1 or m in layout:
      continue
    free = [t for t in range(len(sizes)) if t not in taken and sizes[t] % n == 0]
    if free:
      t = max(free, key=lambda t: (sizes[t], -t))
      taken.add(t)
      pairs.append((m, t))
  return tuple(pairs)


def plan_shift(op, dim, offset: int, layout_of: Callable, mesh_sizes: Sequence[int]
               ) -> LocalPlan:
  """The LocalPlan of shifting `op`'s input by `offset` along `dim`: nothing
  for no offset; where `dim` is split and the offset at most one slice, each
  processor receives its neighbour's slice (a Permute) and combines it with
  its own; otherwise `dim` is gathered, shifted and split again. With
  `wrap` (op.wrap) the ends wrap around.

  With `op.split_replicas`, a neighbour's slice that is replicated over
  other mesh axes travels in blocks: each replica keeps one block
  (`replica_splits`), sends it, and the receivers all-gather the blocks,
  so the permute carries 1/r of the slice for r replicas (the
  scatter-gather of pipeline sends in Narayanan et al. 2021, section 4.1:
  the slow inter-host link carries less, the fast one the all-gather)."""
  x = op.inputs[0]
  layout = tuple(layout_of(x.shape))
  if offset == 0:
    return LocalPlan((Operand(0, stay(layout)),), (Result(x.shape, x.dtype.size, stay(layout)),),
                     kernel=False)
  mesh_axis = split_axis(x.shape, dim, layout_of)
  n = 1 if mesh_axis is None else mesh_sizes[mesh_axis]
  if n == 1 or abs(offset) > dim.size // n:
    return plan_unsplit(op, layout_of, {dim.name})
  sources = [(c - 1 if offset > 0 else c + 1) for c in range(n)]
  sources = tuple(s % n if op.wrap else (s if 0 <= s < n else None) for s in sources)
  blocks = (replica_splits(x.shape, layout, mesh_sizes, (x.shape.index_of(dim.name),))
            if getattr(op, "split_replicas", False) else ())
  send = stay(layout).then(*[SliceAlong(m, t) for m, t in blocks], Permute(mesh_axis, sources),
                           *[AllGather(m, t) for m, t in reversed(blocks)])
  return LocalPlan((Operand(0, stay(layout)), Operand(0, send)),
                   (Result(x.shape, x.dtype.size, stay(layout)),))


def plan_sum_relayout(x, out, layout_of: Callable, pending_axes: Optional[Sequence[int]],
                      reduce_scatter: bool) -> LocalPlan:
  """The LocalPlan of moving `x` to the layout of `out` (same sizes, other
  dimension names). A pending sum (over `pending_axes`) that the new layout
  splits along one of its mesh axes is reduce-scattered there when
  `reduce_scatter`, and its block then allreduced over the other axes (a
  1/n share of the bytes crosses them: across TPU slices or hosts, the
  slower links); anything else is completed and redistributed."""
  in_layout, out_layout = tuple(layout_of(x.shape)), tuple(layout_of(out.shape))
  if reduce_scatter and pending_axes:
    scatter = [(m, t) for t, m in enumerate(out_layout)
               if m is not None and m in pending_axes and in_layout[t] is None]
    if scatter:
      move = stay(in_layout).then(*[ReduceScatter(m, t) for m, t in scatter])
      rest = tuple(a for a in pending_axes if a not in {m for m, _ in scatter})
      if rest:
        move = move.then(AllReduce(rest))
      move = move.then(plan_relayout(move.target, out_layout))
      return LocalPlan((Operand(0, move, partial=TAKES_PARTIAL),),
                       (Result(out.shape, out.dtype.size, stay(out_layout)),), kernel=False)
  return LocalPlan((Operand(0, plan_relayout(in_layout, out_layout)),),
                   (Result(out.shape, out.dtype.size, stay(out_layout)),), kernel=False)


def plan_variable_read(storage_shape, value, layout_of: Callable, mesh_sizes: Sequence[int]
                       ) -> KernelPlan:
  """The KernelPlan of reading a variable whose slice variables are laid out
  as `storage_shape` while its value (an mtf tensor) uses its own layout
  (ZeRO stage 3 stores a variable split further than it is used): a kernel
  reading each slice variable, its result moved into the value's layout.

  Example:
    >>> plan = variable_op.plan(mesh)      # stored split over rows, used whole
    >>> plan.kernels[0].results[0].move.steps
    (AllGather(mesh_axis=0, tensor_axis=0),)
  """
  storage = tuple(layout_of(storage_shape))
  nbytes = slice_elements(value.shape, storage, mesh_sizes) * value.dtype.size
  move = plan_relayout(storage, tuple(layout_of(value.shape)))
  read = Kernel((), (Result(value.shape, value.dtype.size, move),), 2 * nbytes, state=storage)
  return KernelPlan((), (read,), (0,))


def plan_assign(storage_shapes, values, layout_of: Callable, mesh_sizes: Sequence[int]
                ) -> KernelPlan:
  """The KernelPlan of assigning `values` (mtf tensors) to variables whose
  slice variables are laid out as `storage_shapes`: each value moved into
  its storage layout, then a kernel writing each slice variable."""
  operands, kernels = [], []
  for i, (shape, value) in enumerate(zip(storage_shapes, values)):
    storage = tuple(layout_of(shape))
    operands.append(Operand(i, plan_relayout(tuple(layout_of(value.shape)), storage)))
    nbytes = slice_elements(value.shape, storage, mesh_sizes) * value.dtype.size
    kernels.append(Kernel((i,), (), 2 * nbytes, state=storage, writes=True))
  return KernelPlan(tuple(operands), tuple(kernels), ())
