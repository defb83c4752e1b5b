r"""A cost model for mtf graphs: compute, communication, memory and step time
of a graph under a mesh shape and layout, without lowering it.

For every operation the model prices the plan the lowering executes under the
layout (`mesh_tensorflow.lowering.plans`: the same plan objects, so what is
communicated cannot differ): the FLOPs per processor, each collective (kind,
mesh axes, bytes per processor), pending sums, and how many TensorFlow
kernels run.
Peak memory per processor is the slice variables (trainable ones and
optimizer slots) plus the largest set of activation slices alive at once when
the operations run in graph order (which holds the activations that the
backward pass reads). A few device parameters turn these into a step time.

    >>> est = mtf.cost_model.estimate(graph, "rows:2;cols:4", "batch:rows;hidden:cols")
    >>> est.step_time_s, est.memory.peak_bytes
    >>> print(est.summary())

`estimate(..., exact=True)` lowers the graph into a throwaway TensorFlow graph
instead and reads the lowering's own counters (slower; every op supported).
The analytical mode prices the plan each operation states (`Operation.plan`:
convolutions and halo exchange, shifts, slicing, replica statistics, ZeRO's
reduce-scatters, anything lowered on gathered dimensions) with the same
code for all, and prices einsum, reductions, softmax and its gradient,
reshapes, gathers and their gradient and the fused cross-entropy from their
plans too; an operation that states no plan communicates nothing and is
costed as local work on its inputs' slices.

Calibrate the device parameters on the machine at hand (8 logical CPUs):

    python -m mesh_tensorflow.analysis.cost_model --calibrate [--output params.json]
"""

from __future__ import annotations

from typing import Optional, Sequence

from mesh_tensorflow.analysis.cost_model import memory as memory_lib
from mesh_tensorflow.analysis.cost_model import operations as pricing
from mesh_tensorflow.analysis.cost_model.calibration import calibrate, main
from mesh_tensorflow.analysis.cost_model.estimator import (
    _Estimator, step_components, time_from_components)
from mesh_tensorflow.analysis.cost_model.memory import memory_estimate
from mesh_tensorflow.analysis.cost_model.params import DeviceParams, as_device_params
from mesh_tensorflow.analysis.cost_model.results import (
    Collective, CostEstimate, MemoryEstimate, OpCost, format_bytes)
from mesh_tensorflow.core.layout import convert_to_layout_rules
from mesh_tensorflow.core.shapes import convert_to_shape
from mesh_tensorflow.lowering.policies import (  # noqa: F401  pylint: disable=unused-import
    fuses_allreduce, gathers_table_first, split_outermost)  # (their former home)

__all__ = ["estimate", "memory_estimate", "calibrate", "main", "DeviceParams",
           "as_device_params", "CostEstimate", "OpCost", "MemoryEstimate", "Collective",
           "format_bytes", "step_components", "time_from_components"]

_fmt_bytes = format_bytes  # the former private name


def estimate(graph, mesh_shape, layout, params=None, exact: bool = False,
             operations: Optional[Sequence] = None, check: bool = True,
             outputs: Optional[Sequence] = None) -> CostEstimate:
  """Estimates compute, communication, memory and step time of `graph`.

  Args:
    graph: an mtf.Graph (a training step: model, gradients, updates).
    mesh_shape: e.g. "rows:2;cols:4" or an mtf Shape.
    layout: layout rules, e.g. "batch:rows;hidden:cols".
    params: DeviceParams, "cpu" (default), "gpu", "tpu" or a JSON file from
      `python -m mesh_tensorflow.analysis.cost_model --calibrate`.
    exact: take FLOPs and collectives from a real lowering into a throwaway
      TensorFlow graph (slower; exact for every op type).
    operations: cost only these operations of the graph (default: all).
    check: first check that the layout is legal for every tensor (searches
      that only try legal layouts skip this).
    outputs: the mtf tensors the step exports (fetches). Default: those no
      operation reads, and in a step that updates variables only the scalar
      ones (the loss). Kernels that neither an export nor a variable update
      needs are not counted, as TensorFlow prunes them.

  Returns:
    A CostEstimate.

  Raises:
    ValueError: if the layout is illegal for a tensor of the graph (the
      message names the tensor, dimension and rule).

  Example:
    >>> est = estimate(graph, "all:8", "batch:all")   # an MLP's training step
    >>> sorted(est.collective_counts())                 # the weight gradients
    ['allreduce']
  """
  mesh_shape = convert_to_shape(mesh_shape)
  if mesh_shape is None:
    raise ValueError("estimate: mesh_shape is empty; write e.g. 'all:8' or 'rows:2;cols:4'.")
  rules = convert_to_layout_rules(layout)
  rules.check_mesh_shape(mesh_shape)
  params = as_device_params(params)
  operations = list(graph.operations if operations is None else operations)
  if outputs is not None:
    outputs = list(outputs)
    produced = {t for op in operations for t in op.outputs}
    for t in outputs:
      if t not in produced:
        raise ValueError(f"estimate: output {getattr(t, 'name', t)!r} is not an mtf tensor "
                         "that the costed operations produce; pass tensors of this graph "
                         "(or leave outputs=None).")
  est = _Estimator(operations, mesh_shape, rules, params, outputs)
  if check:  # clear errors for illegal layouts first
    for op in operations:
      for t in op.outputs:
        rules.tensor_layout(t.shape, mesh_shape, t.name)
  ops = est.run(pricing.PLAN_PRICING, pricing.WITHOUT_KERNEL)
  memory = memory_lib._memory(est, operations, False)
  result = CostEstimate(mesh_shape, rules, ops, memory, params)
  if exact:
    _apply_exact(result, est, graph, mesh_shape, rules)
  return result


def _apply_exact(result: CostEstimate, est: _Estimator, graph, mesh_shape, rules):
  """Replaces FLOPs and collectives by those of a real lowering."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from mesh_tensorflow.lowering.lowering import Lowering  # pylint: disable=g-import-not-at-top
  from mesh_tensorflow.lowering.placement_mesh_impl import PlacementMeshImpl  # pylint: disable=g-import-not-at-top
  meshes = {op.mesh for op in graph.operations}
  with tf.Graph().as_default():
    # Imported TensorFlow tensors and variables (eager, or from the graph of a
    # tf.function) cannot be used in this graph: a counting lowering imports
    # zeros of their shape.
    impls = {m: PlacementMeshImpl(mesh_shape, rules, [f"/cpu:{i}" for i in range(mesh_shape.size)],
                                  share_replicas=result.params.shares_memory)
             for m in meshes}
    lowering = Lowering(graph, impls, counting_only=True)
  by_name = {op.name: op for op in result.ops}
  for op in result.ops:
    op.collectives = []
    op.flops = 0
    op.approximate = False
  for r in lowering.collective_records:
    target = by_name.get(r.op_name)
    if target is None:
      target = by_name.setdefault(r.op_name, OpCost(r.op_name, "export"))
      result.ops.append(target)
    target.collectives.append(r)
  for name, fl in lowering.flops.items():
    if name in by_name:
      by_name[name].flops += fl
  for op in result.ops:
    op.time_s = est.time_of(op)
  result.exact = True
