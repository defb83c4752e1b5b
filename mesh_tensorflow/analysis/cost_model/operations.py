"""How each kind of plan is priced: the plan an operation states
(`Operation.plan`, the one its lowering executes) and the local kernels
around it. `PLAN_PRICING` maps a plan type to its pricing: every LocalPlan
and KernelPlan by the estimator's one pricing of each, whatever the
operation. Operations that state no plan communicate nothing and are
priced as one kernel on their inputs' slices (`plans.plan_slicewise`),
except those that run no kernel of their own (`WITHOUT_KERNEL`).
"""

from __future__ import annotations

from mesh_tensorflow.analysis.cost_model.estimator import _Estimator
from mesh_tensorflow.lowering import plans, sharing

# pylint: disable=protected-access


def _source(est: _Estimator, op):
  """Imports and constants: one tensor per distinct slice (a fully
  replicated import: one identity of the shared input)."""
  for t in op.outputs:
    layout = est.layout(t.shape)
    if all(x is None for x in layout):
      est.state[t] = est.slicewise([], est.slice_bytes(t))
    else:
      est.state[t] = est.by_layout(layout, nbytes=est.slice_bytes(t))
      if op.local_kernel == "import" and sharing.blocks_of_one_tensor(layout):
        # The slices are blocks of the imported tensor (which no kernel makes).
        whole = est.new_id()
        [(tensor_axis, mesh_axis)] = [(i, a) for i, a in enumerate(layout) if a is not None]
        for p, block in enumerate(est.state[t]):
          est.note_block(block, whole, mesh_axis, tensor_axis, est.coords[p][mesh_axis])


def _passthrough(est: _Estimator, op):
  """stop_gradient / depend: the input slices themselves (a pending
  allreduce completes), or an identity on every processor when there are
  dependencies."""
  ins = [est.laid_out(t) for t in op.inputs]
  extra = len(op.inputs) > len(op.outputs)
  for i, t in enumerate(op.outputs):
    if extra:
      est.state[t] = est._every_processor(True, inputs=ins)
    else:
      est.state[t] = ins[i]


def _saved(est: _Estimator, op):
  """mtf.SavedOutput: the kept forward value of its first input, as it is
  (a pending sum stays pending)."""
  saved, out = op.inputs[0], op.outputs[0]
  if est.state.get(saved) is None:
    est.laid_out(saved)
  est.state[out] = est.state[saved]
  if saved in est.completed:
    est.completed[out] = est.completed[saved]


PLAN_PRICING = {
    plans.KernelPlan: lambda est, op, plan: est.kernel_plan(op, plan),
    plans.LocalPlan: lambda est, op, plan: est.local_plan(op, plan),
}

# Operations that run no kernel of their own, by the kind they declare
# (`Operation.local_kernel`): their values are their inputs' slices or
# slices made once per distinct block.
WITHOUT_KERNEL = {
    "identity": _passthrough,
    "saved": _saved,
    "import": _source,
    "constant": _source,
}
