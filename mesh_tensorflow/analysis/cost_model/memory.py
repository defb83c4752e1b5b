"""Peak memory per processor: slice variables, optimizer slots, activations.

    >>> memory_estimate(graph, "all:8", "batch:all").peak_bytes
"""

from __future__ import annotations

import collections

from mesh_tensorflow.analysis.cost_model.estimator import _Estimator
from mesh_tensorflow.analysis.cost_model.params import DeviceParams
from mesh_tensorflow.analysis.cost_model.results import MemoryEstimate
from mesh_tensorflow.core.layout import convert_to_layout_rules
from mesh_tensorflow.core.shapes import convert_to_shape


def memory_estimate(graph, mesh_shape, layout, shares_memory: bool = False) -> MemoryEstimate:
  """Peak bytes per processor: slice variables, optimizer slots, activations.

  Args:
    graph: the mtf.Graph.
    mesh_shape: e.g. "rows:2;cols:4".
    layout: layout rules.
    shares_memory: count replicated activation slices once per distinct
      slice, divided over the processors (logical CPU devices of one process).

  Example:
    >>> memory_estimate(graph, "all:8", "batch:all").variables
  """
  mesh_shape = convert_to_shape(mesh_shape)
  rules = convert_to_layout_rules(layout)
  est = _Estimator(graph.operations, mesh_shape, rules, DeviceParams.default("cpu"))
  return _memory(est, graph.operations, shares_memory)


def _memory(est: _Estimator, operations, shares_memory: bool) -> MemoryEstimate:
  variables = slots = 0
  per_variable = {}
  for op in operations:
    if getattr(op, "is_variable", False):
      n = est.slice_elems(op.storage_shape) * op.slice_dtype.size
      per_variable[op.name] = n
      if op.trainable:
        variables += n
      else:
        slots += n
  # Liveness over graph order: a tensor lives from its op to its last reader.
  last_use = {}
  for i, op in enumerate(operations):
    for t in op.inputs:
      last_use[t] = i
  live = 0
  peak = 0
  dying = collections.defaultdict(int)
  for i, op in enumerate(operations):
    # A variable's value is its slices, except where reading it gathers them
    # (ZeRO stage 3): that copy lives like any other tensor.
    if not getattr(op, "is_variable", False) or getattr(op, "gathers_on_read", False):
      for t in op.outputs:
        if t in last_use:
          b = est.slice_bytes(t)
          if shares_memory:
            b = b * est.distinct(est.layout(t.shape)) // est.mesh_size
          live += b
          dying[last_use[t]] += b
    peak = max(peak, live)
    live -= dying.pop(i, 0)
  return MemoryEstimate(variables, slots, peak, per_variable)
