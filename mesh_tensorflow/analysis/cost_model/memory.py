"""Peak memory per processor: slice variables, optimizer slots, activations.

    >>> memory_estimate(graph, "all:8", "batch:all").peak_bytes
"""

from __future__ import annotations

import collections
from typing import Callable, Dict, Optional, Tuple

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
  # A variable's value is its slices, except where reading it gathers them
  # (ZeRO stage 3): that copy lives like any other tensor.
  def nbytes(t):
    b = est.slice_bytes(t)
    return b * est.distinct(est.layout(t.shape)) // est.mesh_size if shares_memory else b
  peak = peak_live_bytes(
      operations, last_uses(operations), nbytes,
      lambda i, op, t, end: (not getattr(op, "is_variable", False)
                             or getattr(op, "gathers_on_read", False)))
  return MemoryEstimate(variables, slots, peak, per_variable)


def last_uses(operations, shares: Optional[Dict[int, int]] = None) -> Dict[int, int]:
  """{id of a tensor: index of the last operation that reads it}; with
  `shares` (tensor id -> the id of the tensor whose memory it shares), a
  view's readers count for the tensor it shares.

  Example:
    >>> last_uses(graph.operations)[id(x)]
    7
  """
  shares = shares or {}
  last: Dict[int, int] = {}
  for i, op in enumerate(operations):
    for t in op.inputs:
      last[shares.get(id(t), id(t))] = i
  return last


def peak_live_bytes(operations, last_use: Dict[int, int], nbytes: Callable,
                    counted: Callable) -> float:
  """The peak, over graph order, of the bytes of live tensors: a tensor
  lives from the operation that makes it to its last reader (`last_uses`);
  only tensors that something reads and that `counted(index, op, tensor,
  last reader's index)` accepts count, `nbytes(tensor)` each.

  Example:
    >>> peak_live_bytes(ops, last_uses(ops), lambda t: 4 * t.shape.size,
    ...                 lambda i, op, t, end: True)
  """
  live = peak = 0
  dying: Dict[int, float] = collections.defaultdict(int)
  for i, op in enumerate(operations):
    for t in op.outputs:
      end = last_use.get(id(t))
      if end is None or not counted(i, op, t, end):
        continue
      b = nbytes(t)
      live += b
      dying[end] += b
    peak = max(peak, live)
    live -= dying.pop(i, 0)
  return peak


def step_activation_bytes(ops, first_bwd: int, first_opt: int, size: Callable, costs,
                          is_score: Callable) -> Tuple[float, float, float]:
  """(kept, peak, kept scores) bytes per processor of a step's activations:
  the forward pass's tensors that the backward pass reads (alive between the
  two passes), the peak of live tensors over both passes, and the attention
  score tensors (`is_score`) among the kept ones; `size` gives a tensor's
  bytes per processor (0: it takes no memory). A reshape that moves nothing
  (a renamed dimension, say), an identity or a kept forward output
  (`mtf.SavedOutput`) makes no new tensor: its output shares its input's
  memory. Variables' values and their gradients (alive from the
  backward pass to the optimizer) are left out: the plan counts them as
  variables and gradients."""
  root: Dict[int, int] = {}  # tensor id -> the id of the tensor whose memory it shares
  for op, cost in zip(ops, costs):
    kind = type(op).__name__
    kernel = getattr(op, "local_kernel", None)
    if ((kind == "ReshapeOperation" or kernel == "identity" and len(op.inputs) == 1
         or kernel == "saved") and not cost.collectives
        and size(op.outputs[0]) == size(op.inputs[0])):
      source = id(op.inputs[0])
      root[id(op.outputs[0])] = root.get(source, source)
  last_use = last_uses(ops, root)

  def counted(i, op, t, end) -> bool:  # not a variable, an alias or a gradient
    return not (getattr(op, "is_variable", False) or id(t) in root
                or (i >= first_bwd and end >= first_opt))
  peak = peak_live_bytes(ops[:first_opt], last_use, size, counted)
  kept_tensors = [t for i, op in enumerate(ops[:first_bwd]) for t in op.outputs
                  if last_use.get(id(t), -1) >= first_bwd and counted(i, op, t, last_use[id(t)])]
  kept = sum(size(t) for t in kept_tensors)
  kept_scores = sum(size(t) for t in kept_tensors if is_score(t))
  return kept, peak, kept_scores


def outputs_the_backward_needs(ops, first_bwd: int, first_opt: int, kept_ops,
                               layer_of: Callable) -> list:
  """The operations of `kept_ops` (forward operations whose outputs a
  recomputed layer keeps, `mtf.kept_by_recompute`) whose outputs the
  backward pass reads, directly or through the recomputation of the
  layer's other forward operations. A kept output nothing needs again (a
  projection whose sum joins the residual stream: the next layer's input
  is kept anyway) is not held for the backward pass. `layer_of(op)` names
  an operation's layer (None: outside every layer); the walk back through
  recomputed operations stays in the layer it starts in, whose input is
  kept whole.

  Example:
    >>> needed = outputs_the_backward_needs(ops, first_bwd, first_opt, kept, layer_of)
  """
  producer = {id(t): op for op in ops[:first_bwd] for t in op.outputs}
  kept_by_output = {id(op.outputs[0]): op for op in kept_ops}
  pending = [(t, producer[id(t)]) for op in ops[first_bwd:first_opt] for t in op.inputs
             if id(t) in producer]
  seen, needed = set(), {}
  while pending:
    t, made_by = pending.pop()
    if id(t) in seen:
      continue
    seen.add(id(t))
    if id(t) in kept_by_output:
      needed[id(t)] = kept_by_output[id(t)]
      continue
    layer = layer_of(made_by)
    if layer is None or getattr(made_by, "is_variable", False):
      continue
    for source in made_by.inputs:
      op = producer.get(id(source))
      if op is not None and layer_of(op) == layer:
        pending.append((source, op))
  return [op for op in kept_ops if id(op.outputs[0]) in needed]
