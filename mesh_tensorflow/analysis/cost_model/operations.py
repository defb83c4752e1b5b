"""How each kind of plan is priced: the plan an operation states
(`Operation.plan`, the one its lowering executes) and the local kernels
around it. `PLAN_PRICING` maps a plan type to its pricing function
(LocalPlans are priced by `_Estimator.local_plan`); operations that state no
plan communicate nothing and are priced by the kind of local kernel they run
(`LOCAL_HANDLERS`), else by `generic`.
"""

from __future__ import annotations

from mesh_tensorflow.analysis.cost_model.estimator import _Estimator, _Lazy
from mesh_tensorflow.lowering import observers, plans

# pylint: disable=protected-access


def generic(est: _Estimator, op):
  """Any other operation: local work on its inputs' slices, one kernel per
  distinct combination."""
  ins = [est.laid_out(t) for t in op.inputs]
  nbytes = sum(est.slice_bytes(t) for t in op.inputs) + sum(est.slice_bytes(t) for t in op.outputs)
  ids = est.slicewise(ins, nbytes)
  for t in op.outputs:
    est.state[t] = ids


def _storage(est: _Estimator, op, plan: plans.StoragePlan):
  """Prices the StoragePlan that Variable.lower and Assign.lower execute:
  one read of each distinct slice variable (laid out as its storage) moved
  into the value's layout; or the new values moved into the storage layout
  and one assign per distinct slice variable, on the first processor that
  holds it, reading that processor's value."""
  if not plan.writes:
    out = op.outputs[0]
    storage, move = plan.storage[0], plan.moves[0]
    nbytes = est.slice_elems(out.shape, storage) * out.dtype.size
    ids = est.slicewise([est.by_layout(storage, count=False)], 2 * nbytes)
    est.state[out] = est.execute(move, out.shape, out.dtype.size, ids)
    return
  for t, storage, move in zip(op.inputs, plan.storage, plan.moves):
    ids = est.execute(move, t.shape, t.dtype.size, est.laid_out(t))
    nbytes = 2 * est.slice_elems(t.shape, storage) * t.dtype.size
    axes = [a for a in storage if a is not None]
    seen = set()
    for p, c in enumerate(est.coords):
      key = tuple(c[a] for a in axes) if est.share else p
      if key in seen:
        continue
      seen.add(key)
      new = next(est._next_id)  # pylint: disable=protected-access
      est.device[new] = p
      est.unit(new, (ids[p],), 1, nbytes)
      est.sinks.add(new)


def _elementwise(est: _Estimator, op):
  ins = [est.laid_out(t) for t in op.inputs]
  out = op.outputs[0]
  elems = est.slice_elems(out.shape)
  est.current.flops += elems
  nbytes = sum(est.slice_bytes(t) for t in op.inputs) + elems * out.dtype.size
  est.state[out] = est.slicewise(ins, nbytes)


def _local(est: _Estimator, op):
  """Broadcast, transpose: local, one kernel per distinct input slice."""
  ins = [est.laid_out(t) for t in op.inputs]
  out = op.outputs[0]
  est.state[out] = est.slicewise(ins, est.slice_bytes(op.inputs[0]) + est.slice_bytes(out))


def _einsum(est: _Estimator, op, plan: plans.EinsumPlan):
  """Prices the EinsumPlan that EinsumOperation.lower executes."""
  out = op.outputs[0]
  est.current.flops += plan.flops
  per_kernel, local_bytes = plan.flops, plan.operand_bytes
  operands = [est.laid_out(t) for t in op.inputs]  # completes pending sums
  communication = plan.communication
  if isinstance(communication, plans.GatheredAllReduce):
    # Shared memory: the operands are gathered along the summed dimensions
    # (counted as the allreduce) and multiplied once per group.
    est.collective(communication.kind, communication.nbytes, communication.mesh_axes)
    ins = [est.execute(move, t.shape, t.dtype.size, ids, record=False)
           for t, ids, move in zip(op.inputs, operands, communication.operand_moves)]
    group = observers.group_size(communication.mesh_axes, est.mesh_sizes)
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


def _statistics(est: _Estimator, op, plan: plans.StatisticsPlan):
  """Prices a StatisticsPlan by the local kernels it names."""
  {"softmax": _softmax, "log_softmax": _softmax, "softmax_grad": _softmax_grad,
   "log_softmax_grad": _softmax_grad, "cross_entropy": _sparse_xent}[plan.kernels](
       est, op, plan)


def _sparse_xent(est: _Estimator, op, plan: plans.StatisticsPlan):
  """The fused cross-entropy: TensorFlow's fused kernel, or, with vocab
  split, the statistics' allreduces of its plan."""
  logits, ids_t = op.inputs
  lg = est.laid_out(logits)
  idx = est.laid_out(ids_t)
  statistics = plan.steps
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


def _softmax(est: _Estimator, op, plan: plans.StatisticsPlan):
  """One fused kernel per slice, or, with the dimension split: the MAX and
  SUM allreduces of the plan's per-slice statistics around four slicewise
  kernels."""
  x, out = op.inputs[0], op.outputs[0]
  ids = est.laid_out(x)
  nbytes = est.slice_bytes(x)
  est.current.flops += 5 * est.slice_elems(x.shape)
  dim = plan.dim
  statistics = plan.steps
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
  est.state[out] = est.slicewise([shifted if plan.kernels == "log_softmax" else exps, sums],
                                 2 * nbytes)


def _softmax_grad(est: _Estimator, op, plan: plans.StatisticsPlan):
  """Per slice a product and a sum that keeps the dimension, the plan's SUM
  allreduce of the sums when the dimension is split, then one elementwise
  kernel."""
  y, dy = op.inputs
  ids_y, ids_dy = est.laid_out(y), est.laid_out(dy)
  nbytes = est.slice_bytes(y)
  est.current.flops += 4 * est.slice_elems(y.shape)
  stats_bytes = est.slice_elems(y.shape - [plan.dim]) * y.dtype.size
  sums = est.slicewise([ids_y, ids_dy], 2 * nbytes + stats_bytes)
  for step in plan.steps:
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
      if op.local_kernel == "import" and sum(a is not None for a in layout) == 1:
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


PLAN_PRICING = {
    plans.EinsumPlan: _einsum,
    plans.StatisticsPlan: _statistics,
    plans.StoragePlan: _storage,
    plans.LocalPlan: lambda est, op, plan: est.local_plan(op, plan),
}

# Operations without communication, by the kind of local work they declare
# (`Operation.local_kernel`).
LOCAL_HANDLERS = {
    "elementwise": _elementwise,
    "copy": _local,
    "identity": _passthrough,
    "import": _source,
    "constant": _source,
}
