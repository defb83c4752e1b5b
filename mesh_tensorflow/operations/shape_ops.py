"""Shape-changing operations: reshape, transpose, rename/replace dimensions,
broadcast.

A reshape that keeps every split dimension in place (same mesh dimension,
same stride position; the size may change when the dimension is cut into
[outer, inner] parts with the outer part split, or merged with the dimensions
after it) is local; otherwise the dimensions that move
are gathered first and split again afterwards.

    >>> y = mtf.reshape(x, "batch:8;rows:4;cols:16")
    >>> z = mtf.rename_dimension(y, "rows", "rows_out")
"""

from __future__ import annotations

from mesh_tensorflow.core.graph import Operation, Tensor
from mesh_tensorflow.lowering import plans
from mesh_tensorflow.lowering.mesh_impl import expand_to_shape, reshape_slice
from mesh_tensorflow.operations.elementwise import reduce_to_shape
from mesh_tensorflow.core.shapes import Dimension, Shape, convert_to_dimension, convert_to_shape


def lower_with_unsplit(lowering, op, unsplit_names, fn, partial_sum_axes=None):
  """Lowers `op` by computing fn on slices in which `unsplit_names` are whole:
  runs plans.plan_unsplit (inputs gathered along those dimensions, fn on
  every processor, each output summed over its `partial_sum_axes` if given,
  one list per output, then split into its own layout locally). Operations
  that lower this way state the same plan in their `plan` method.
  """
  impl = lowering.mesh_impl(op)
  lowering.lower_with_plan(
      op, plans.plan_unsplit(op, impl.tensor_layout, unsplit_names, partial_sum_axes), fn)


class ReshapeOperation(Operation):
  """Reinterprets the elements (in row-major order) with a new shape."""

  has_gradient = True

  def __init__(self, x: Tensor, new_shape, name=None):
    new_shape = convert_to_shape(new_shape)
    if new_shape.size != x.shape.size:
      raise ValueError(
          f"mtf.reshape: cannot reshape {x.name} {x.shape} ({x.shape.size} elements) "
          f"to {new_shape} ({new_shape.size} elements); the total size must stay "
          "the same.")
    super().__init__([x], name=name or "reshape")
    self._outputs = [Tensor(self, new_shape, x.dtype)]

  def gradient(self, grad_ys):
    return [reshape(grad_ys[0], self.inputs[0].shape)]

  def plan(self, mesh):
    return plans.plan_reshape(self.inputs[0].shape, self.outputs[0].shape,
                              self.outputs[0].dtype.size, mesh.layout_of, mesh.sizes,
                              mesh.partial_sum_axes_of(self.inputs[0]))

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    out = self.outputs[0]
    plan = self.plan(lowering.plan_mesh(self))
    kept = plan.results[0].move.source  # the layout the local reshape makes
    local_shape = [d.size // impl.mesh_axis_size(a) if a is not None else d.size
                   for d, a in zip(out.shape.dims, kept)]
    # Renaming a dimension leaves the slice as it is: no op to create.
    lowering.lower_with_plan(self, plan, lambda t: reshape_slice(t, local_shape))


def reshape(x: Tensor, new_shape, name=None) -> Tensor:
  """Reshape (row-major) to `new_shape`; returns x itself if unchanged.

  Example:
    >>> y = mtf.reshape(x, [batch, mtf.Dimension("pixels", 784)])
  """
  new_shape = convert_to_shape(new_shape)
  if new_shape == x.shape:
    return x
  return ReshapeOperation(x, new_shape, name=name).outputs[0]


class TransposeOperation(Operation):
  """Reorders dimensions (same names); always local."""

  local_kernel = "copy"  # the kind of local work the cost model prices

  has_gradient = True

  def __init__(self, x: Tensor, new_shape, name=None):
    new_shape = convert_to_shape(new_shape)
    if sorted(new_shape.dims) != sorted(x.shape.dims):
      raise ValueError(
          f"mtf.transpose: {new_shape} is not a permutation of {x.name} {x.shape}.")
    super().__init__([x], name=name or "transpose")
    self._outputs = [Tensor(self, new_shape, x.dtype)]

  def gradient(self, grad_ys):
    return [transpose(grad_ys[0], self.inputs[0].shape)]

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    in_shape, out_shape = self.inputs[0].shape, self.outputs[0].shape
    lowering.set_tensor_lowering(self.outputs[0], impl.slicewise(
        lambda t: expand_to_shape(t, in_shape, out_shape),
        lowering.laid_out(self.inputs[0])))


def transpose(x: Tensor, new_shape, name=None) -> Tensor:
  """Permutes the dimensions of x into the order of new_shape."""
  new_shape = convert_to_shape(new_shape)
  if new_shape == x.shape:
    return x
  return TransposeOperation(x, new_shape, name=name).outputs[0]


def rename_dimension(x: Tensor, old_name: str, new_name: str, name=None) -> Tensor:
  """Renames one dimension (data moves only if the layouts of the names differ).

  Example:
    >>> y = mtf.rename_dimension(x, "hidden", "hidden_out")
  """
  if old_name == new_name:
    return x
  return reshape(x, x.shape.rename_dimension(old_name, new_name), name=name or "rename")


def replace_dimensions(tensor_or_shape, old_dim_or_dims, new_dim_or_dims):
  """Replaces dimension(s) in a tensor (by reshape) or in a shape.

  Example:
    >>> y = mtf.replace_dimensions(x, hidden, [heads, d_head])
  """
  old = _as_dim_list(old_dim_or_dims)
  new = _as_dim_list(new_dim_or_dims)
  shape = tensor_or_shape.shape if isinstance(tensor_or_shape, Tensor) else convert_to_shape(tensor_or_shape)
  names = shape.dimension_names
  positions = []
  for d in old:
    if d.name not in names:
      raise ValueError(f"replace_dimensions: {shape} has no dimension {d.name!r}.")
    positions.append(names.index(d.name))
  if positions != list(range(positions[0], positions[0] + len(positions))):
    raise ValueError(
        f"replace_dimensions: dimensions {[d.name for d in old]} must be adjacent "
        f"and in order in {shape}.")
  dims = shape.dims
  new_shape = Shape(dims[:positions[0]] + new + dims[positions[-1] + 1:])
  if isinstance(tensor_or_shape, Tensor):
    return reshape(tensor_or_shape, new_shape)
  return new_shape


def _as_dim_list(x):
  if isinstance(x, (Dimension, str)) or (isinstance(x, tuple) and len(x) == 2
                                        and isinstance(x[0], str)):
    return [convert_to_dimension(x)]
  if isinstance(x, Shape):
    return x.dims
  return [convert_to_dimension(d) for d in x]


class BroadcastOperation(Operation):
  """Broadcasts x to a shape containing all its dims (local)."""

  local_kernel = "copy"  # the kind of local work the cost model prices

  has_gradient = True

  def __init__(self, x: Tensor, new_shape, name=None):
    new_shape = convert_to_shape(new_shape)
    missing = [d for d in x.shape.dims if d not in new_shape.dims]
    if missing:
      raise ValueError(
          f"mtf.broadcast: {new_shape} lacks {missing} of {x.name} {x.shape}.")
    super().__init__([x], name=name or "broadcast")
    self._outputs = [Tensor(self, new_shape, x.dtype)]

  def gradient(self, grad_ys):
    return [reduce_to_shape(grad_ys[0], self.inputs[0].shape)]

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    lowering.set_tensor_lowering(self.outputs[0], impl.broadcast_impl(
        lowering.laid_out(self.inputs[0]), self.inputs[0].shape, self.outputs[0].shape))


def broadcast(x: Tensor, new_shape, name=None) -> Tensor:
  """Broadcasts x to new_shape (which has all of x's dims, in any order)."""
  new_shape = convert_to_shape(new_shape)
  if new_shape == x.shape:
    return x
  return BroadcastOperation(x, new_shape, name=name).outputs[0]

from mesh_tensorflow.core import autograph_exempt as _autograph_exempt  # noqa: E402  pylint: disable=g-import-not-at-top
_autograph_exempt.exempt(globals())  # AutoGraph leaves this module's code alone
