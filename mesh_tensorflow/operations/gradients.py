"""Reverse-mode differentiation of mtf graphs.

    >>> grads = mtf.gradients([loss], [v.outputs[0] for v in graph.trainable_variables])
"""

from __future__ import annotations

from typing import List, Optional, Sequence

from mesh_tensorflow.core.graph import Tensor
from mesh_tensorflow.operations.constant_ops import ones_like
from mesh_tensorflow.operations.elementwise import add_n
from mesh_tensorflow.operations.shape_ops import ReshapeOperation, reshape


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
  prefetch_after = None  # the output gradients of the last op that read a tensor again
  made_again = {}  # gathered tensors (not variables) made again: tensor -> copy
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
    in_grads, reread = _gradient_reading_again(op, out_grads, needed,
                                                         prefetch_after or dys, made_again)
    if reread:
      prefetch_after = dys
    for t, g in zip(op.inputs, in_grads):
      if g is not None and t in downstream and t.dtype.is_floating:
        if g.shape != t.shape:
          raise ValueError(f"Internal: gradient of {t.name} has shape {g.shape}, "
                           f"expected {t.shape} (from {op.name}).")
        pending.setdefault(t, []).append(g)
  return [_sum(pending.get(x)) for x in xs]


def _read_again_for_backward(t) -> bool:
  """Whether gradients read `t` made again rather than `t` itself: the value
  of a variable that gathers on read (ZeRO stage 3), or the output of an
  operation that says so (`regathers_for_backward`: a sequence-parallel
  layer's gathered input)."""
  producer = t.operation
  if getattr(producer, "is_variable", False):
    return (getattr(producer, "gathers_on_read", False)
            and getattr(producer, "regathers_for_backward", True))
  if getattr(producer, "regathers_for_backward", False):
    return True
  # A renamed view of such a tensor (not of a variable) is made again too.
  return (isinstance(producer, ReshapeOperation)
          and not getattr(producer.inputs[0].operation, "is_variable", False)
          and _read_again_for_backward(producer.inputs[0]))


def _made_again(t, after, made):
  """`t` made again for the backward pass (see _read_again_for_backward).
  A gathered tensor that is not a variable's value is made once for all the
  gradients that read it (`made`: tensor -> copy); a variable's, once per
  reader, just ahead of it."""
  producer = t.operation
  if getattr(producer, "is_variable", False):
    return producer.read_again(after)
  if t not in made:
    made[t] = (producer.read_again(after) if hasattr(producer, "read_again")
               else reshape(_made_again(producer.inputs[0], after, made), t.shape))
  return made[t]


def _gradient_reading_again(op, out_grads, needed, after, made):
  """op's input gradients; where an input is the value of a variable that
  gathers on read (ZeRO stage 3), or another gathered tensor marked to be
  gathered again (`_read_again_for_backward`), the gradient reads it again
  once `after` exist instead of keeping the forward pass's gathered copy
  alive.

  `after` is the output gradients of the previous op (in backward order)
  that read a tensor again: each gather runs one such op ahead of its use,
  under the computation in between. Returns (gradients, whether a tensor was
  read again). A copy that the gradient does not use is removed."""
  graph = op.graph
  start, made_before = len(graph.operations), set(made)
  again = {}
  for t in op.inputs:
    if t not in again and _read_again_for_backward(t):
      again[t] = _made_again(t, after, made)
  if not again:
    return op.gradient_for(out_grads, needed), False
  first = len(graph.operations)
  previous = op.replace_inputs(again)
  try:
    in_grads = op.gradient_for(out_grads, needed)
  finally:
    op.replace_inputs(dict(zip(op.inputs, previous)))
  # Remove the copies made here that the gradient does not read (and what
  # only they read).
  used = {t for o in graph.operations[first:] for t in o.inputs}
  for o in reversed(graph.operations[start:first]):
    if any(t in used for t in o.outputs):
      used.update(o.inputs)
    else:
      graph.operations.remove(o)
  for t in set(made) - made_before:
    if made[t] not in used:
      del made[t]
  return in_grads, any(w in used for w in again.values())


def _sum(gs):
  if not gs:
    return None
  if len(gs) == 1:
    return gs[0]
  return add_n(gs)

from mesh_tensorflow.core import autograph_exempt as _autograph_exempt  # noqa: E402  pylint: disable=g-import-not-at-top
_autograph_exempt.exempt(globals())  # AutoGraph leaves this module's code alone
