"""How each kind of plan is priced: the plan an operation states
(`Operation.plan`, the one its lowering executes) and the local kernels
around it. `PLAN_PRICING` maps a plan type to its pricing: every LocalPlan
and KernelPlan by the estimator's one pricing of each, whatever the
operation, and the einsum's and variable storage's plans here. Operations
that state no plan communicate nothing and are priced as one kernel on their
inputs' slices (`plans.plan_slicewise`), except those that run no kernel of
their own (`WITHOUT_KERNEL`).
"""

from __future__ import annotations

from mesh_tensorflow.analysis.cost_model.estimator import _Estimator, _Lazy
from mesh_tensorflow.lowering import observers, plans

# pylint: disable=protected-access


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
    plans.KernelPlan: lambda est, op, plan: est.kernel_plan(op, plan),
    plans.StoragePlan: _storage,
    plans.LocalPlan: lambda est, op, plan: est.local_plan(op, plan),
}

# Operations that run no kernel of their own, by the kind they declare
# (`Operation.local_kernel`): their values are their inputs' slices or
# slices made once per distinct block.
WITHOUT_KERNEL = {
    "identity": _passthrough,
    "import": _source,
    "constant": _source,
}
