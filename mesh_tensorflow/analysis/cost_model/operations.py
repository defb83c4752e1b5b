"""How each kind of operation is priced: the plan its lowering executes
(from mesh_tensorflow.lowering.plans, the same function the lowering calls)
and the local kernels it runs. `HANDLERS` maps an operation's class name to
its pricing function; any other operation is priced by `generic`.
"""

from __future__ import annotations

from mesh_tensorflow.analysis.cost_model.estimator import _Estimator, _Lazy
from mesh_tensorflow.lowering import plans

# pylint: disable=protected-access


def generic(est: _Estimator, op):
  """Any other operation: local work on its inputs' slices, one kernel per
  distinct combination."""
  ins = [est.laid_out(t) for t in op.inputs]
  nbytes = sum(est.slice_bytes(t) for t in op.inputs) + sum(est.slice_bytes(t) for t in op.outputs)
  ids = est.slicewise(ins, nbytes)
  for t in op.outputs:
    est.state[t] = ids


def _variable(est: _Estimator, op):
  out = op.outputs[0]
  slices = est.by_layout(est.layout(out.shape), count=False)
  est.state[out] = est.slicewise([slices], 2 * est.slice_bytes(out))


def _assign(est: _Estimator, op):
  for t in op.inputs:
    ids = est.laid_out(t)
    # One assign per distinct slice variable, on the first processor that
    # holds it, reading that processor's value.
    axes = [a for a in est.layout(t.shape) if a is not None]
    seen = set()
    for p, c in enumerate(est.coords):
      key = tuple(c[a] for a in axes) if est.share else p
      if key in seen:
        continue
      seen.add(key)
      new = next(est._next_id)  # pylint: disable=protected-access
      est.device[new] = p
      est.unit(new, (ids[p],), 1, 2 * est.slice_bytes(t))
      est.sinks.add(new)


def _elementwise(est: _Estimator, op):
  ins = [est.laid_out(t) for t in op.inputs]
  out = op.outputs[0]
  elems = est.slice_elems(out.shape)
  est.current.flops += elems
  nbytes = sum(est.slice_bytes(t) for t in op.inputs) + elems * out.dtype.size
  est.state[out] = est.slicewise(ins, nbytes)


def _lazy_add(est: _Estimator, op):
  a, b = (est.state.get(t) for t in op.inputs)
  out = op.outputs[0]
  if plans.adds_pending_sums(a.axes if isinstance(a, _Lazy) else None,
                             b.axes if isinstance(b, _Lazy) else None,
                             op.inputs[0].shape, op.inputs[1].shape, out.shape):
    ids = est.slicewise([a.ids, b.ids], 3 * a.nbytes)
    est.state[out] = _Lazy(a.axes, a.nbytes, ids)
    return
  _elementwise(est, op)


def _local(est: _Estimator, op):
  """Broadcast, transpose: local, one kernel per distinct input slice."""
  ins = [est.laid_out(t) for t in op.inputs]
  out = op.outputs[0]
  est.state[out] = est.slicewise(ins, est.slice_bytes(op.inputs[0]) + est.slice_bytes(out))


def _einsum(est: _Estimator, op):
  """Prices the EinsumPlan that EinsumOperation.lower executes."""
  out = op.outputs[0]
  plan = plans.plan_einsum(op.inputs, out, est.layout, est.mesh_sizes, est.share)
  est.current.flops += plan.flops
  per_kernel, local_bytes = plan.flops, plan.operand_bytes
  operands = [est.laid_out(t) for t in op.inputs]  # completes pending sums
  if plan.fused:
    # Shared memory: the operands are gathered along the summed dimensions
    # (counted as the allreduce) and multiplied once per group.
    est.collective("allreduce", plan.output_bytes, plan.reduced_axes)
    ins = [est.execute(move, t.shape, t.dtype.size, ids, record=False)
           for t, ids, move in zip(op.inputs, operands, plan.operand_moves)]
    group = 1
    for a in plan.reduced_axes:
      group *= est.mesh_sizes[a]
    per_kernel *= group
    local_bytes *= group
  else:
    ins = [est.execute(move, t.shape, t.dtype.size, ids)
           for t, ids, move in zip(op.inputs, operands, plan.operand_moves)]
  batched = None
  if est.share and not plan.reduced_axes:
    batched = plans.batchable_operand(
        op.inputs, out, est.layout, est.mesh_sizes,
        is_shared=lambda i: len(set(ins[i])) == 1,
        holds_blocks=lambda i, axis: tuple(ins[i]) in est.blocks)
  out_bytes = plan.output_bytes
  if batched is not None:
    # Shared memory: one product on the concatenated operand, then each
    # processor takes its rows.
    i, axis = batched
    ins[i] = est.combine_ids(ins[i], [axis], local_bytes)
    per_kernel = plan.flops * est.mesh_sizes[axis]
    ids = est.slicewise(ins, (local_bytes + out_bytes) * est.mesh_sizes[axis], per_kernel)
    ids = est.slice_along_ids(ids, axis, out_bytes)
  else:
    ids = est.slicewise(ins, local_bytes + out_bytes, per_kernel)
  est.state[out] = _Lazy(plan.pending_sum_axes, out_bytes, ids) if plan.pending_sum_axes else ids


def _reduce(est: _Estimator, op):
  """Prices the ReducePlan that ReduceOperation.lower executes."""
  x, out = op.inputs[0], op.outputs[0]
  s = est.state.get(x)
  pending = isinstance(s, _Lazy)
  plan = plans.plan_reduce(x.shape, out.shape, op.reduction_fn_string, x.dtype.name == "bool",
                           s.axes if pending else None, est.layout)
  out_bytes = est.slice_bytes(out)
  if plan.folds_pending:
    partial = est.slicewise([s.ids], s.nbytes + out_bytes)
  else:
    ids = est.laid_out(x)
    est.current.flops += est.slice_elems(x.shape)
    partial = est.slicewise([ids], est.slice_bytes(x) + out_bytes)
  if plan.pending:
    est.state[out] = _Lazy(plan.mesh_axes, out_bytes, partial)
  elif plan.allreduce is not None:
    est.state[out] = est.allreduce(out_bytes, plan.allreduce.mesh_axes, partial)
  else:
    est.state[out] = partial


def _reshape(est: _Estimator, op):
  """Prices the ReshapePlan that ReshapeOperation.lower executes."""
  x, out = op.inputs[0], op.outputs[0]
  plan = plans.plan_reshape(x.shape, out.shape, est.layout, est.mesh_sizes)
  ids = est.execute(plan.before, x.shape, x.dtype.size, est.laid_out(x))
  ids = est.slicewise([ids], 2 * est.slice_bytes(out))
  est.state[out] = est.execute(plan.after, out.shape, out.dtype.size, ids)


def _gather(est: _Estimator, op):
  """Prices the GatherPlan that GatherOperation.lower executes."""
  weights, indices = op.inputs
  out = op.outputs[0]
  plan = plans.plan_gather(weights, indices, out, op._dim, est.layout, est.mesh_sizes)  # pylint: disable=protected-access
  w_ids = est.execute(plan.table_move, weights.shape, weights.dtype.size, est.laid_out(weights))
  a = plan.masked_axis
  out_bytes = est.slice_bytes(out)
  ins = [w_ids, est.laid_out(indices)]
  if a is not None:
    ins.append(est.by_layout(est.layout(weights.shape)))  # slice offsets
  ids = est.slicewise(ins, out_bytes + est.slice_bytes(indices))
  est.state[out] = _Lazy([a], out_bytes, ids) if (
      a is not None and est.mesh_sizes[a] > 1) else ids


def _scatter_add_grad(est: _Estimator, op):
  """Prices the ScatterAddPlan that ScatterAddGradOperation.lower executes."""
  g, indices = op.inputs
  out = op.outputs[0]
  plan = plans.plan_scatter_add(out.shape, indices.shape, op._dim, est.layout)  # pylint: disable=protected-access
  ins = [est.laid_out(g), est.laid_out(indices)]
  if plan.uses_offsets:
    ins.append(est.by_layout(est.layout(out.shape)))  # slice offsets
  cur_bytes = est.slice_elems(out.shape, plan.computed_layout) * out.dtype.size
  ids = est.slicewise(ins, est.slice_bytes(g) + cur_bytes)
  if plan.allreduce is not None:
    ids = est.allreduce(cur_bytes, plan.allreduce.mesh_axes, ids)
  ids = est.execute(plan.after, out.shape, out.dtype.size, ids)
  axes = [a for a in plan.pending_sum_axes if est.mesh_sizes[a] > 1]
  est.state[out] = _Lazy(axes, est.slice_bytes(out), ids) if axes else ids


def _sparse_xent(est: _Estimator, op):
  """Prices SparseSoftmaxCrossEntropyOperation: TensorFlow's fused kernel,
  or, with vocab split, the statistics' allreduces of its plan."""
  logits, ids_t = op.inputs
  lg = est.laid_out(logits)
  idx = est.laid_out(ids_t)
  statistics = plans.plan_statistics(logits.shape, op._vocab_dim, est.layout,  # pylint: disable=protected-access
                                     ("MAX", "SUM", "SUM"))
  out = op.outputs[0]
  lg_bytes = est.slice_bytes(logits)
  prep = est.slicewise([lg, idx], 2 * lg_bytes)
  if not statistics:  # TensorFlow's fused kernel (and a logsumexp)
    result = est.slicewise([prep], 3 * lg_bytes)
  else:  # max, partial sums and target logits, three allreduces, finish
    max_step, sum_exp_step, target_step = statistics
    nbytes = est.slice_elems(out.shape) * 4  # float32 partials
    offsets = est.by_layout(est.layout(logits.shape))
    maxes = est.allreduce(nbytes, max_step.mesh_axes, est.slicewise([prep], lg_bytes))
    partial = est.slicewise([prep, idx, maxes, offsets], 2 * lg_bytes)
    sum_exp = est.allreduce(nbytes, sum_exp_step.mesh_axes, partial)
    target = est.allreduce(nbytes, target_step.mesh_axes, partial)
    result = est.slicewise([prep, idx, maxes, sum_exp, target, offsets], 3 * lg_bytes)
  est.state[op.outputs[0]] = result
  est.state[op.outputs[1]] = result
  est.state[op.outputs[2]] = est.slicewise([result], 2 * lg_bytes)


def _softmax(est: _Estimator, op):
  """One fused kernel per slice, or, with the dimension split: the MAX and
  SUM allreduces of the plan's per-slice statistics around four slicewise
  kernels."""
  x, out = op.inputs[0], op.outputs[0]
  ids = est.laid_out(x)
  nbytes = est.slice_bytes(x)
  est.current.flops += 5 * est.slice_elems(x.shape)
  dim = op.reduced_dim
  statistics = plans.plan_statistics(x.shape, dim, est.layout, ("MAX", "SUM"))
  if not statistics:
    est.state[out] = est.slicewise([ids], 2 * nbytes)
    return
  max_step, sum_step = statistics
  stats_bytes = est.slice_elems(x.shape - [dim]) * x.dtype.size
  maxes = est.allreduce(stats_bytes, max_step.mesh_axes,
                        est.slicewise([ids], nbytes + stats_bytes))
  shifted = est.slicewise([ids, maxes], 2 * nbytes)
  exps = est.slicewise([shifted], 2 * nbytes)
  sums = est.allreduce(stats_bytes, sum_step.mesh_axes,
                       est.slicewise([exps], nbytes + stats_bytes))
  est.state[out] = est.slicewise([shifted if op.log else exps, sums], 2 * nbytes)


def _softmax_grad(est: _Estimator, op):
  """Per slice a product and a sum that keeps the dimension, the plan's SUM
  allreduce of the sums when the dimension is split, then one elementwise
  kernel."""
  y, dy = op.inputs
  ids_y, ids_dy = est.laid_out(y), est.laid_out(dy)
  nbytes = est.slice_bytes(y)
  est.current.flops += 4 * est.slice_elems(y.shape)
  dim = op.reduced_dim
  stats_bytes = est.slice_elems(y.shape - [dim]) * y.dtype.size
  sums = est.slicewise([ids_y, ids_dy], 2 * nbytes + stats_bytes)
  for step in plans.plan_statistics(y.shape, dim, est.layout, ("SUM",)):
    sums = est.allreduce(stats_bytes, step.mesh_axes, sums)
  est.state[op.outputs[0]] = est.slicewise([ids_y, ids_dy, sums], 3 * nbytes)


def _source(est: _Estimator, op):
  """Imports and constants: one tensor per distinct slice (a fully
  replicated import: one identity of the shared input)."""
  for t in op.outputs:
    layout = est.layout(t.shape)
    if all(x is None for x in layout):
      est.state[t] = est.slicewise([], est.slice_bytes(t))
    else:
      est.state[t] = est.by_layout(layout, nbytes=est.slice_bytes(t))
      if type(op).__name__ == "ImportOperation" and sum(a is not None for a in layout) == 1:
        est.blocks.add(tuple(est.state[t]))


def _passthrough(est: _Estimator, op):
  """stop_gradient / depend: the input slices themselves (a pending
  allreduce completes), or an identity on every processor when there are
  dependencies."""
  ins = [est.laid_out(t) for t in op.inputs]
  extra = len(op.inputs) > len(op.outputs)
  for i, t in enumerate(op.outputs):
    if extra:
      new = []
      for p in range(est.mesh_size):
        new.append(next(est._next_id))  # pylint: disable=protected-access
        est.device[new[-1]] = p
        est.unit(new[-1], tuple(x[p] for x in ins))
      est.state[t] = tuple(new)
    else:
      est.state[t] = ins[i]


HANDLERS = {
    "Variable": _variable,
    "Assign": _assign,
    "EinsumOperation": _einsum,
    "ReduceOperation": _reduce,
    "_LazyAwareAdd": _lazy_add,
    "ElementwiseOperation": _elementwise,
    "ReshapeOperation": _reshape,
    "BroadcastOperation": _local,
    "TransposeOperation": _local,
    "GatherOperation": _gather,
    "ScatterAddGradOperation": _scatter_add_grad,
    "SparseSoftmaxCrossEntropyOperation": _sparse_xent,
    "SoftmaxOperation": _softmax,
    "SoftmaxGradOperation": _softmax_grad,
    "_IdentityLike": _passthrough,
    "ImportOperation": _source,
    "ConstantOperation": _source,
}
