"""The KernelPlans of operations that reduce along one dimension inside
their kernels: softmax, its gradient, the fused cross-entropy, argmax,
top-k and the cumulative sum.
With that dimension whole, each is one fused kernel per slice; with it
split, several kernels with the MAX, SUM or MIN allreduces of per-slice
statistics between them.

    >>> plan = plan_softmax(x, vocab, False, layout_of, (2, 4))  # vocab split over mesh axis 1
    >>> [r.move.steps for k in plan.kernels for r in k.results][0]
    (AllReduce(mesh_axes=(1,), reduction='MAX'),)
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

from mesh_tensorflow.core.shapes import Dimension, Shape
from mesh_tensorflow.lowering.plans import (AllReduce, Kernel, KernelPlan, Layout, Operand, Result,
                                            plan_relayout, slice_elements, stay)


def _statistics_shape(shape, dim_name: str):
  """`shape` with dimension `dim_name` of size 1 (per-slice statistics kept
  to broadcast back)."""
  return Shape([Dimension(d.name, 1) if d.name == dim_name else d for d in shape.dims])


def _unsplit(layout: Layout, tensor_axis: int) -> Layout:
  out = list(layout)
  out[tensor_axis] = None
  return tuple(out)


def plan_softmax(x, dim, log: bool, layout_of: Callable, mesh_sizes: Sequence[int]
                 ) -> KernelPlan:
  """The KernelPlan of softmax (or log_softmax) of `x` along `dim`: one fused
  kernel per slice, or, with `dim` split, the local maxima, their MAX
  allreduce, the shift, the exponentials, the local sums, their SUM
  allreduce and the normalization."""
  layout = tuple(layout_of(x.shape))
  axis = x.shape.index_of(dim.name)
  nbytes = slice_elements(x.shape, layout, mesh_sizes) * x.dtype.size
  flops = 5 * slice_elements(x.shape, layout, mesh_sizes)
  value = Result(x.shape, x.dtype.size, stay(layout))
  operands = (Operand(0, stay(layout)),)
  mesh_axis = layout[axis]
  if mesh_axis is None:
    return KernelPlan(operands, (Kernel((0,), (value,), 2 * nbytes),), (1,), flops)
  stats_layout = _unsplit(layout, axis)
  stats_shape = _statistics_shape(x.shape, dim.name)
  stats_bytes = slice_elements(stats_shape, stats_layout, mesh_sizes) * x.dtype.size

  def stats(reduction):
    return Result(stats_shape, x.dtype.size,
                  stay(stats_layout).then(AllReduce((mesh_axis,), reduction)))
  kernels = (Kernel((0,), (stats("MAX"),), nbytes + stats_bytes),   # 1: maxima
             Kernel((0, 1), (value,), 2 * nbytes),                  # 2: shifted
             Kernel((2,), (value,), 2 * nbytes),                    # 3: exponentials
             Kernel((3,), (stats("SUM"),), nbytes + stats_bytes),   # 4: sums
             Kernel((2 if log else 3, 4), (value,), 2 * nbytes))    # 5: normalized
  return KernelPlan(operands, kernels, (5,), flops)


def plan_softmax_grad(y, dim, log: bool, layout_of: Callable, mesh_sizes: Sequence[int]
                      ) -> KernelPlan:
  """The KernelPlan of the gradient of softmax (log_softmax) from its output
  y and the output's gradient dy (same shape): per slice the sum along `dim`
  of y * dy (of dy), its SUM allreduce when `dim` is split, then one
  elementwise kernel."""
  layout = tuple(layout_of(y.shape))
  axis = y.shape.index_of(dim.name)
  nbytes = slice_elements(y.shape, layout, mesh_sizes) * y.dtype.size
  stats_layout = _unsplit(layout, axis)
  stats_shape = _statistics_shape(y.shape, dim.name)
  stats_bytes = slice_elements(stats_shape, stats_layout, mesh_sizes) * y.dtype.size
  move = stay(stats_layout)
  if layout[axis] is not None:
    move = move.then(AllReduce((layout[axis],), "SUM"))
  operands = (Operand(0, stay(layout)), Operand(1, stay(layout)))
  kernels = (Kernel((1,) if log else (0, 1), (Result(stats_shape, y.dtype.size, move),),
                    2 * nbytes + stats_bytes),
             Kernel((0, 1, 2), (Result(y.shape, y.dtype.size, stay(layout)),), 3 * nbytes))
  return KernelPlan(operands, kernels, (3,), 4 * slice_elements(y.shape, layout, mesh_sizes))


def plan_cross_entropy(logits, ids, vocab_dim, layout_of: Callable, mesh_sizes: Sequence[int]
                       ) -> KernelPlan:
  """The KernelPlan of the fused sparse softmax cross-entropy of `logits`
  against `ids` along `vocab_dim`. Outputs: the loss, log Z (both of the
  ids' shape) and softmax(logits) - one_hot(ids).

  The logits are first put with the vocabulary last (`prepare`). With the
  vocabulary whole: TensorFlow's fused kernel (and log Z from it). With it
  split: the local maxima and their MAX allreduce; per slice the
  exponentials, their sums, the one-hot of the ids in this block (the
  kernel reads the block's offset) and the target logits; the sums' and
  targets' SUM allreduces (float32 partials); then the loss, log Z and the
  backprop. Last, the backprop goes back to the logits' dimension order."""
  out_shape = logits.shape - [vocab_dim]
  ordered = out_shape + [vocab_dim]
  layout, ordered_layout = tuple(layout_of(logits.shape)), tuple(layout_of(ordered))
  out_layout = tuple(layout_of(out_shape))
  size = logits.dtype.size
  lg_bytes = slice_elements(logits.shape, layout, mesh_sizes) * size

  def value(shape, lay, dtype_size=size, move=None):
    return Result(shape, dtype_size, move or stay(lay))
  operands = (Operand(0, stay(layout)), Operand(1, stay(layout_of(ids.shape))))
  prepare = Kernel((0, 1), (value(ordered, ordered_layout),
                            value(out_shape, out_layout, ids.dtype.size)), 2 * lg_bytes)  # 2, 3
  mesh_axis = ordered_layout[-1]
  if mesh_axis is None:
    fused = Kernel((2, 3), (value(out_shape, out_layout), value(out_shape, out_layout),
                            value(ordered, ordered_layout)), 3 * lg_bytes)  # 4, 5, 6
    back = Kernel((6,), (value(logits.shape, layout),), 2 * lg_bytes)  # 7
    return KernelPlan(operands, (prepare, fused, back), (4, 5, 7))
  stats_layout = _unsplit(ordered_layout, len(ordered_layout) - 1)
  stats_shape = _statistics_shape(ordered, vocab_dim.name)

  def summed(shape, lay, reduction):  # float32 partials, allreduced
    return value(shape, lay, 4, stay(lay).then(AllReduce((mesh_axis,), reduction)))
  maxima = Kernel((2,), (summed(stats_shape, stats_layout, "MAX"),), lg_bytes)  # 4
  partial = Kernel((2, 3, 4), (value(ordered, ordered_layout, 4),            # 5: exps
                               summed(stats_shape, stats_layout, "SUM"),     # 6: sums
                               value(ordered, ordered_layout, 4),            # 7: one-hot
                               summed(out_shape, out_layout, "SUM")),        # 8: targets
                   2 * lg_bytes, coordinates=ordered_layout)
  finish = Kernel((5, 7, 4, 6, 8), (value(out_shape, out_layout), value(out_shape, out_layout),
                                    value(ordered, ordered_layout)), 3 * lg_bytes)  # 9, 10, 11
  back = Kernel((11,), (value(logits.shape, layout),), 2 * lg_bytes)  # 12
  return KernelPlan(operands, (prepare, maxima, partial, finish, back), (9, 10, 12))


def plan_argmax(x, dim, out, layout_of: Callable, mesh_sizes: Sequence[int]) -> KernelPlan:
  """The KernelPlan of the argmax `out` of `x` along `dim` split over a mesh
  axis, without gathering `x`: per slice its maxima, kept and MAX-allreduced
  (kernel 1); per slice the first index of its maximum, offset into the
  whole dimension, where that maximum is the global one, else the
  dimension's size (kernel 2, which reads the block's offset), and their
  MIN allreduce: the first index of the maximum over all blocks; 0 where
  no block matched (kernel 3: a row whose maximum is NaN, as `tf.argmax`
  gives for a row of NaNs), laid out as `out`'s. Two allreduces of `out`'s
  size instead of an allgather of `x`.

  Example:
    >>> plan = plan_argmax(logits, vocab, best, layout_of, (2, 4))  # vocab over axis 1
    >>> [s.reduction for k in plan.kernels for r in k.results for s in r.move.steps]
    ['MAX', 'MIN']
  """
  layout = tuple(layout_of(x.shape))
  axis = x.shape.index_of(dim.name)
  mesh_axis = layout[axis]
  stats_layout = _unsplit(layout, axis)
  stats_shape = _statistics_shape(x.shape, dim.name)
  current = stats_layout[:axis] + stats_layout[axis + 1:]  # out's dimensions, as x splits them
  x_bytes = slice_elements(x.shape, layout, mesh_sizes) * x.dtype.size
  stats_bytes = slice_elements(stats_shape, stats_layout, mesh_sizes) * x.dtype.size
  out_bytes = slice_elements(out.shape, current, mesh_sizes) * out.dtype.size
  stats = Result(stats_shape, x.dtype.size, stay(stats_layout))
  maxima = Kernel((0,), (stats, dataclasses.replace(  # 1: the slice's maxima, 2: the global
      stats, move=stay(stats_layout).then(AllReduce((mesh_axis,), "MAX")))),
                  x_bytes + 2 * stats_bytes)
  candidates = Kernel((0, 1, 2), (Result(out.shape, out.dtype.size, stay(current).then(
      AllReduce((mesh_axis,), "MIN"))),), x_bytes + 2 * stats_bytes + out_bytes,
                      coordinates=layout)  # 3
  clamp = Kernel((3,), (Result(out.shape, out.dtype.size,
                               plan_relayout(current, tuple(layout_of(out.shape)))),),
                 2 * out_bytes)  # 4
  return KernelPlan((Operand(0, stay(layout)),), (maxima, candidates, clamp), (4,))


def plan_top_k(x, dim, k_dim, values, layout_of: Callable, mesh_sizes: Sequence[int]
               ) -> KernelPlan:
  """The KernelPlan of the top `k_dim.size` values of `x` along `dim` split
  over a mesh axis, and their indices, without gathering `x`: per slice the
  block's own top min(k, block) values and their indices offset into the
  whole dimension (kernel 1, which reads the block's offset), both
  allgathered along the mesh axis as the blocks' candidates in block order;
  then the top k of the candidates and the indices they came with (kernel
  2), laid out as the outputs. One allgather of k values and k indices per
  block instead of one of `x`. Ties keep the lower index first, as
  `tf.math.top_k` does: the candidates come in index order among equals.

  Example:
    >>> plan = plan_top_k(logits, vocab, k, values, layout_of, (2, 4))  # vocab over axis 1
    >>> [type(s).__name__ for r in plan.kernels[0].results for s in r.move.steps]
    ['AllGather', 'AllGather']
  """
  layout = tuple(layout_of(x.shape))
  axis = x.shape.index_of(dim.name)
  mesh_axis = layout[axis]
  blocks = mesh_sizes[mesh_axis]
  kept = min(k_dim.size, dim.size // blocks)
  others = x.shape - [dim]
  current = layout[:axis] + layout[axis + 1:]  # the other dimensions, as x splits them
  per_block, whole = current + (mesh_axis,), current + (None,)  # the candidates' layouts
  candidates = others + [Dimension(f"{k_dim.name}_candidates", kept * blocks)]
  gathered = plan_relayout(per_block, whole)
  x_bytes = slice_elements(x.shape, layout, mesh_sizes) * x.dtype.size
  block_elements = slice_elements(candidates, per_block, mesh_sizes)
  all_elements = slice_elements(candidates, whole, mesh_sizes)
  out_elements = slice_elements(values.shape, whole, mesh_sizes)
  item = x.dtype.size + 4  # a value and its int32 index
  local = Kernel((0,), (Result(candidates, x.dtype.size, gathered),
                        Result(candidates, 4, gathered)),
                 x_bytes + block_elements * item, coordinates=layout)  # 1, 2
  moved = plan_relayout(whole, tuple(layout_of(values.shape)))
  best = Kernel((1, 2), (Result(values.shape, x.dtype.size, moved), Result(values.shape, 4, moved)),
                (all_elements + out_elements) * item)  # 3, 4
  return KernelPlan((Operand(0, stay(layout)),), (local, best), (3, 4))


def plan_cumsum(x, dim, layout_of: Callable, mesh_sizes: Sequence[int]) -> KernelPlan:
  """The KernelPlan of the cumulative sum of `x` along `dim` split over a
  mesh axis, without gathering `x`: per slice the block's own cumulative
  sum and its total, the totals allgathered along the mesh axis (kernel 1);
  then each block adds the totals of the blocks before it (after it, for a
  reverse sum; kernel 2, which reads the block's offset). One allgather of
  one total per block and row instead of one of `x`.

  Example:
    >>> plan = plan_cumsum(x, length, layout_of, (2, 4))  # length over axis 1
    >>> [type(s).__name__ for r in plan.kernels[0].results for s in r.move.steps]
    ['AllGather']
  """
  layout = tuple(layout_of(x.shape))
  axis = x.shape.index_of(dim.name)
  mesh_axis = layout[axis]
  blocks = Shape([Dimension(f"{dim.name}_blocks", mesh_sizes[mesh_axis]) if d.name == dim.name
                  else d for d in x.shape.dims])
  whole = _unsplit(layout, axis)  # the totals, gathered
  x_bytes = slice_elements(x.shape, layout, mesh_sizes) * x.dtype.size
  totals_bytes = slice_elements(blocks, whole, mesh_sizes) * x.dtype.size
  value = Result(x.shape, x.dtype.size, stay(layout))
  totals = Result(blocks, x.dtype.size, plan_relayout(layout, whole))
  local = Kernel((0,), (value, totals), 2 * x_bytes + totals_bytes)  # 1, 2
  carried = Kernel((1, 2), (value,), 2 * x_bytes + totals_bytes, coordinates=layout)  # 3
  return KernelPlan((Operand(0, stay(layout)),), (local, carried), (3,),
                    slice_elements(x.shape, layout, mesh_sizes))
