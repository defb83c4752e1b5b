"""Reversible residual blocks (RevNet, https://arxiv.org/abs/1707.04585).

Part of `mtf.layers` (import them from there). A reversible block maps
(x1, x2) to (x2, x1 + f(x2)); its inputs can be recomputed from its outputs,
so backpropagation through a stack of them keeps no activations: each
block's gradient rebuilds its inputs from its outputs while it runs f again.

    >>> x1, x1_back, x2, x2_back = x, None, x, None
    >>> for i in range(num_layers):
    ...   x1, x1_back, x2, x2_back = mtf.layers.reversible_half_residual_and_swap(
    ...       x1, x1_back, x2, x2_back, lambda t, i=i: block(t, name=f"layer_{i}"))
    >>> y = (x1 + x2) * 0.5
"""

from __future__ import annotations

from typing import Callable, List, Optional, Tuple

from mesh_tensorflow.operations.gradients import gradients
from mesh_tensorflow.core.graph import Tensor
from mesh_tensorflow.operations.constant_ops import zeros_like
from mesh_tensorflow.operations.control import _ForwardScope, custom_gradient, depend

def _sum(values: List[Optional[Tensor]]) -> Optional[Tensor]:
  values = [t for t in values if t is not None]
  if not values:
    return None
  total = values[0]
  for t in values[1:]:
    total = total + t
  return total


def reversible_half_residual_and_swap(
    x1: Tensor, x1_backwards: Optional[Tensor], x2: Tensor, x2_backwards: Optional[Tensor],
    f: Callable[[Tensor], Tensor], recompute_grads: bool = True
) -> Tuple[Tensor, Optional[Tensor], Tensor, Optional[Tensor]]:
  """One reversible residual block: (y1, y2) = (x2, x1 + f(x2)).

  Returns (x2, x2_backwards, x1 + f(x2), x1_backwards), in that order (the
  halves swap). The *_backwards tensors carry the recomputed activations
  through the backward pass: give None to the first block, then pass each
  block's outputs to the next. With recompute_grads, the gradient of a block
  recomputes x1 = y1 - f(x2) from its outputs (or from the next block's
  recomputation) and runs f again to differentiate it, so the forward
  activations inside f need not be kept; gradients equal plain
  backpropagation's. f may create variables (they get gradients) and use
  dropout (the recomputation draws the same masks).

  Args:
    x1: the first half (any shape; f(x2) must have its shape).
    x1_backwards: None for the first block, else the previous block's.
    x2: the second half.
    x2_backwards: None for the first block, else the previous block's.
    f: a function Tensor -> Tensor.
    recompute_grads: use the reversible gradient (else plain backpropagation).

  Returns:
    (y1, y1_backwards, y2, y2_backwards) = (x2, x2_backwards, x1 + f(x2),
    x1_backwards); the backwards entries are None without recompute_grads
    when given None.

  Example:
    >>> x1, b1, x2, b2 = reversible_half_residual_and_swap(
    ...     x, None, x, None, lambda t: mtf.layers.dense(t, d_model, name="f0"))
  """
  what = "reversible_half_residual_and_swap"
  if x1.shape != x2.shape or x1.dtype != x2.dtype:
    raise ValueError(f"{what}: x1 {x1.shape} {x1.dtype.name} and x2 {x2.shape} "
                     f"{x2.dtype.name} must have one shape and dtype.")

  def forward(a1, a1_backwards, a2, a2_backwards):
    fa2 = f(a2)
    if not isinstance(fa2, Tensor) or fa2.shape != a1.shape:
      raise ValueError(f"{what}: f must return a tensor of x1's shape {a1.shape}, got "
                       f"{getattr(fa2, 'shape', fa2)}.")
    return [a2, a2_backwards, a1 + fa2, a1_backwards]

  if not recompute_grads:
    return tuple(forward(x1, x1_backwards, x2, x2_backwards))
  if x1_backwards is None:
    x1_backwards = zeros_like(x1)
  if x2_backwards is None:
    x2_backwards = zeros_like(x2)
  graph = x1.graph
  replay = _ForwardScope(graph)

  def grad_fn(explicit, captured, outputs, output_grads):
    dy1, y1_value, dy2, y2_value = output_grads
    # The next block sends back, as the "gradients" of the backwards outputs,
    # the values it recomputed for this block's outputs; the last block has
    # none and uses the forward values.
    x2_value = y1_value if y1_value is not None else explicit[2]
    sum_value = y2_value if y2_value is not None else outputs[2]
    pending = [g for g in (dy1, dy2) if g is not None]
    if pending:
      x2_value = depend(x2_value, pending)   # recompute only once needed
    start = len(graph.operations)
    with replay.replay():
      fx2 = f(x2_value)
    recomputed = graph.operations[start:]
    x1_value = sum_value - fx2
    if dy2 is not None:
      grads = gradients([fx2], [x2_value] + list(captured), grad_ys=[dy2],
                        operations=recomputed)
      df, captured_grads = grads[0], grads[1:]
    else:
      df, captured_grads = None, [None] * len(captured)
    # Inputs: x1, x1_backwards, x2, x2_backwards (+ what f captured).
    return [dy2, x1_value, _sum([dy1, df]), x2_value] + list(captured_grads)

  return tuple(custom_gradient(forward, grad_fn, [x1, x1_backwards, x2, x2_backwards],
                               name="reversible_half_residual"))

from mesh_tensorflow.core import autograph_exempt as _autograph_exempt  # noqa: E402  pylint: disable=g-import-not-at-top
_autograph_exempt.exempt(globals())  # AutoGraph leaves this module's code alone
