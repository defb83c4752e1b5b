"""einsum over named dimensions, and matmul.

Dimensions are matched by name. Summing a split dimension sums the local
products and then allreduces (lazily) over the mesh dimensions that split it.

    >>> h = mtf.einsum([x, w], output_shape=[batch, hidden])
    >>> h = mtf.einsum(x, w, output_shape=[batch, hidden])   # same
"""

from __future__ import annotations

import string
from typing import Sequence

from mesh_tensorflow.lowering import einsum_plans
from mesh_tensorflow.core.graph import Operation, Tensor
from mesh_tensorflow.operations.local_einsum import local_einsum
from mesh_tensorflow.operations.shape_ops import broadcast
from mesh_tensorflow.core.shapes import Shape, convert_to_shape, shape_union


class EinsumOperation(Operation):
  """Sum over dims absent from output_shape of the product of the inputs."""

  def __init__(self, inputs: Sequence[Tensor], output_shape, name=None):
    output_shape = convert_to_shape(output_shape)
    names = ", ".join(f"{t.name} {t.shape}" for t in inputs)
    try:
      all_dims = shape_union([t.shape for t in inputs])
    except ValueError as e:
      raise ValueError(f"mtf.einsum({names}): {e}") from None
    for d in output_shape.dims:
      if d.name not in all_dims.dimension_names:
        raise ValueError(
            f"mtf.einsum({names}): output dimension {d.name!r} is in no input. "
            "Every output dimension must come from an input; use mtf.broadcast "
            "to add one.")
      if d not in all_dims.dims:
        raise ValueError(
            f"mtf.einsum({names}): output dimension {d} has another size in the "
            f"inputs ({all_dims.get_dim_by_name(d.name)}).")
    dtypes = {t.dtype for t in inputs}
    if len(dtypes) > 1:
      raise TypeError(f"mtf.einsum({names}): inputs have different dtypes "
                      f"{sorted(d.name for d in dtypes)}; cast them to one.")
    super().__init__(inputs, name=name or "einsum")
    self.has_gradient = inputs[0].dtype.is_floating
    self._outputs = [Tensor(self, output_shape, inputs[0].dtype)]

  def gradient(self, grad_ys):
    return self.gradient_for(grad_ys, [True] * len(self.inputs))

  def gradient_for(self, grad_ys, needed):
    g = grad_ys[0]
    grads = []
    for i, x in enumerate(self.inputs):
      if not needed[i]:
        grads.append(None)
        continue
      others = [g] + [t for j, t in enumerate(self.inputs) if j != i]
      available = shape_union([t.shape for t in others])
      target = Shape([d for d in x.shape.dims if d in available.dims])
      gx = einsum(others, output_shape=target)
      grads.append(broadcast(gx, x.shape) if target != x.shape else gx)
    return grads

  def plan(self, mesh):
    """The LocalPlan of this einsum (einsum_plans.plan_einsum): the operands'
    gathers, one product per processor, the output's partial sums pending;
    where processors share memory the sum may be fused into the gathers and
    the products batched."""
    plan = einsum_plans.plan_einsum(self.inputs, self.outputs[0], mesh.layout_of, mesh.sizes,
                                    mesh.shares_memory)
    return plan.as_local_plan(self.outputs[0], mesh.layout_of)

  def lower(self, lowering):
    out = self.outputs[0]
    letters = {}
    for t in [out] + self.inputs:
      for d in t.shape.dims:
        letters.setdefault(d.name, _LETTERS[len(letters)])
    eq = ",".join("".join(letters[d.name] for d in t.shape.dims) for t in self.inputs)
    eq += "->" + "".join(letters[d.name] for d in out.shape.dims)
    lowering.lower_with_plan(self, self.plan(lowering.plan_mesh(self)),
                             lambda *xs: local_einsum(eq, *xs))


_LETTERS = string.ascii_letters


def _infer_output_shape(xs, reduced_dims):
  if reduced_dims is not None:
    reduced = {d.name if not isinstance(d, str) else d for d in reduced_dims}
    return Shape([d for d in shape_union([x.shape for x in xs]).dims if d.name not in reduced])
  counts = {}
  for x in xs:
    for d in x.shape.dims:
      counts[d] = counts.get(d, 0) + 1
  return Shape([d for d in shape_union([x.shape for x in xs]).dims if counts[d] == 1])


def einsum(*args, output_shape=None, reduced_dims=None, name=None) -> Tensor:
  """Generalized product-and-sum over named dimensions.

  Call as `einsum([a, b, ...], output_shape=...)` or `einsum(a, b, ...,
  output_shape=...)`. Without output_shape, the output keeps the dimensions in
  exactly one input (or, with reduced_dims, all but those).

  Example:
    >>> y = mtf.einsum([x, w], output_shape=[batch, d_ff])
  """
  args = list(args)
  if args and isinstance(args[0], (list, tuple)):
    xs = list(args[0])
    rest = args[1:]
  else:
    xs = []
    while args and isinstance(args[0], Tensor):
      xs.append(args.pop(0))
    rest = args
  if rest:
    if output_shape is not None or len(rest) > 2:
      raise TypeError("mtf.einsum: too many positional arguments.")
    output_shape = rest[0]
    if len(rest) == 2:
      name = rest[1] if isinstance(rest[1], str) and ":" not in rest[1] else name
  if not xs:
    raise ValueError("mtf.einsum needs at least one input tensor.")
  for x in xs:
    if not isinstance(x, Tensor):
      raise TypeError(f"mtf.einsum: {x!r} is not an mtf.Tensor.")
  if output_shape is None:
    output_shape = _infer_output_shape(xs, reduced_dims)
  return EinsumOperation(xs, output_shape, name=name).outputs[0]


def matmul(a: Tensor, b: Tensor, output_shape=None, reduced_dims=None, name=None) -> Tensor:
  """einsum of two tensors; by default sums the dimensions they share."""
  return einsum([a, b], output_shape=output_shape, reduced_dims=reduced_dims, name=name)

from mesh_tensorflow.core import autograph_exempt as _autograph_exempt  # noqa: E402  pylint: disable=g-import-not-at-top
_autograph_exempt.exempt(globals())  # AutoGraph leaves this module's code alone
