"""Reverse-mode differentiation of mtf graphs.

    >>> grads = mtf.gradients([loss], [v.outputs[0] for v in graph.trainable_variables])
"""

from __future__ import annotations

from typing import List, Optional, Sequence

from mesh_tensorflow.core.graph import Tensor
from mesh_tensorflow.operations.constant_ops import ones_like
from mesh_tensorflow.operations.elementwise import add_n


def gradients(ys: Sequence[Tensor], xs: Sequence[Tensor],
              grad_ys: Optional[Sequence[Tensor]] = None,
              operations=None) -> List[Optional[Tensor]]:
  """d(sum of ys)/d(xs), as mtf tensors (None where x does not affect ys).

  Args:
    ys: mtf Tensors to differentiate (usually one scalar loss).
    xs: mtf Tensors to differentiate with respect to (e.g. variable values).
    grad_ys: gradients of ys (defaults to ones).
    operations: the operations to consider (defaults to the whole graph).

  Example:
    >>> [dw] = mtf.gradients([loss], [w])
  """
  ys, xs = list(ys), list(xs)
  if not ys:
    raise ValueError("mtf.gradients: ys is empty.")
  for t in ys + xs:
    if not isinstance(t, Tensor):
      raise TypeError(f"mtf.gradients: {t!r} is not an mtf.Tensor.")
  for x in xs:
    if x.dtype.is_complex:
      raise ValueError(
          f"mtf.gradients: {x.name} has dtype {x.dtype.name}; mtf differentiates with "
          "respect to real floating tensors only, and complex operations (mtf.signal_ops "
          "included) have no gradients.")
  graph = ys[0].graph
  if operations is None:
    operations = list(graph.operations)
  if grad_ys is None:
    grad_ys = [ones_like(y) for y in ys]
  # Tensors that depend on some x (only those need gradients). Nothing
  # depends differentiably on x through an op that stops gradients.
  downstream = set(xs)
  for op in operations:
    if getattr(op, "stops_gradient", False):
      continue
    if any(t in downstream for t in op.inputs):
      downstream.update(op.outputs)
  pending = {}
  for y, g in zip(ys, grad_ys):
    if g is not None:
      pending.setdefault(y, []).append(g)
  prefetch_after = None  # the output gradients of the last op that read a variable again
  for op in reversed(operations):
    out_grads = [_sum(pending.get(t)) for t in op.outputs]
    if all(g is None for g in out_grads):
      continue
    if not any(t in downstream for t in op.inputs):
      continue
    if not op.has_gradient:
      needs = [t.name for t in op.inputs if t in downstream and t.dtype.is_floating]
      if needs:
        raise ValueError(
            f"mtf.gradients: operation {op.name!r} ({type(op).__name__}) has no "
            f"gradient, but {needs} need one. Wrap its input in mtf.stop_gradient "
            "or give it one with mtf.custom_gradient.")
      continue
    for t, g in zip(op.outputs, out_grads):
      pending[t] = [g] if g is not None else []
    needed = [t in downstream and t.dtype.is_floating for t in op.inputs]
    dys = [g for g in out_grads if g is not None]
    in_grads, reread = _gradient_reading_variables_again(op, out_grads, needed,
                                                         prefetch_after or dys)
    if reread:
      prefetch_after = dys
    for t, g in zip(op.inputs, in_grads):
      if g is not None and t in downstream and t.dtype.is_floating:
        if g.shape != t.shape:
          raise ValueError(f"Internal: gradient of {t.name} has shape {g.shape}, "
                           f"expected {t.shape} (from {op.name}).")
        pending.setdefault(t, []).append(g)
  return [_sum(pending.get(x)) for x in xs]


def _gradient_reading_variables_again(op, out_grads, needed, after):
  """op's input gradients; where an input is the value of a variable that
  gathers on read (ZeRO stage 3), the gradient reads it again once `after`
  exist instead of keeping the forward pass's gathered copy alive.

  `after` is the output gradients of the previous op (in backward order)
  that read a variable again: each gather runs one such op ahead of its use,
  under the computation in between. Returns (gradients, whether a variable
  was read again). A copy that the gradient does not use is removed."""
  graph = op.graph
  again = {}
  for t in op.inputs:
    var = t.operation
    if (t not in again and getattr(var, "is_variable", False)
        and getattr(var, "gathers_on_read", False)
        and getattr(var, "regathers_for_backward", True)):
      again[t] = var.read_again(after)
  if not again:
    return op.gradient_for(out_grads, needed), False
  first = len(graph.operations)
  previous = op.replace_inputs(again)
  try:
    in_grads = op.gradient_for(out_grads, needed)
  finally:
    op.replace_inputs(dict(zip(op.inputs, previous)))
  used = {t for o in graph.operations[first:] for t in o.inputs}
  unused = [w for w in again.values() if w not in used]
  for w in unused:
    graph.operations.remove(w.operation)
  return in_grads, len(unused) < len(again)


def _sum(gs):
  if not gs:
    return None
  if len(gs) == 1:
    return gs[0]
  return add_n(gs)

from mesh_tensorflow.core import autograph_exempt as _autograph_exempt  # noqa: E402  pylint: disable=g-import-not-at-top
_autograph_exempt.exempt(globals())  # AutoGraph leaves this module's code alone
