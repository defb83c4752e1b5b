"""Operation classes under the names and constructor signatures of the original
Mesh TensorFlow, for code that builds operations directly (custom layers,
layout tools) instead of through the `mtf.*` functions.

Most original class names are this library's own classes (exported in
`mesh_tensorflow/__init__.py`); the ones here are thin wrappers where the
function form is built differently here.

    >>> y = mtf.ScalarMultiplyOperation(x, 2.0).outputs[0]    # mtf.multiply(x, 2.0)
"""

from __future__ import annotations

from typing import Callable, Optional

import tensorflow as tf

from mesh_tensorflow.core.graph import Operation, Tensor
from mesh_tensorflow.operations import control, conv, elementwise
from mesh_tensorflow.operations.shape_ops import lower_with_unsplit
from mesh_tensorflow.operations.slicing import split_sizes
from mesh_tensorflow.operations.variables import Variable, _as_variable
from mesh_tensorflow.core.shapes import Dimension, Shape, convert_to_shape


class ScalarMultiplyOperation(elementwise.ElementwiseOperation):
  """x * scalar (a Python number)."""

  def __init__(self, x: Tensor, scalar: float, name=None):
    super().__init__(lambda t: t * tf.cast(scalar, t.dtype), [x],
                     name=name or "scalar_mul",
                     input_grads=[lambda op, dy: dy * scalar])


class ScalarAddOperation(elementwise.ElementwiseOperation):
  """x + scalar (a Python number)."""

  def __init__(self, x: Tensor, scalar: float, name=None):
    super().__init__(lambda t: t + tf.cast(scalar, t.dtype), [x],
                     name=name or "scalar_add",
                     input_grads=[lambda op, dy: dy])


class BinaryOpWithBroadcasting(elementwise.ElementwiseOperation):
  """tf_fn(x1, x2) with broadcasting by dimension name; no gradient (as in the
  original: comparisons and other non-differentiable functions)."""

  def __init__(self, tf_fn: Callable, x1: Tensor, x2: Tensor, output_shape=None,
               output_dtype=None, name=None):
    x1, x2 = elementwise._binary_inputs(x1, x2, name or "binary_op")  # pylint: disable=protected-access
    super().__init__(tf_fn, [x1, x2], output_shape=output_shape, output_dtype=output_dtype,
                     name=name or "binary_op")


def binary_arguments_to_tensors(x1, x2):
  """(x1, x2) as mtf Tensors of one dtype: a Python number becomes a constant
  on the other argument's mesh."""
  return elementwise._binary_inputs(x1, x2, "binary_arguments_to_tensors")  # pylint: disable=protected-access


def binary_op_with_broadcasting(tf_fn: Callable, x1, x2, output_shape=None,
                                output_dtype=None) -> Tensor:
  """tf_fn of two tensors (or a tensor and a number) broadcast by dimension
  name, without a gradient.

  Example:
    >>> closer = mtf.binary_op_with_broadcasting(tf.less, distance, radius,
    ...                                          output_dtype=tf.bool)
  """
  return BinaryOpWithBroadcasting(tf_fn, x1, x2, output_shape, output_dtype).outputs[0]


class ReadVariable(control._IdentityLike):  # pylint: disable=protected-access
  """The current value of an mtf Variable (mtf.read_variable)."""

  def __init__(self, var, name: Optional[str] = None):
    variable: Variable = _as_variable(var)
    super().__init__([variable.outputs[0]], 1, name or "read_variable",
                     grad=lambda op, g: [g[0]])


class SplitOperation(Operation):
  """x cut along `split_dim` into `num_or_size_splits` parts (a number of
  equal parts or a list of sizes); one output per part (mtf.split)."""

  has_gradient = True

  def __init__(self, x: Tensor, split_dim, num_or_size_splits, name=None):
    dim = x.shape.get_dim_by_name(split_dim if isinstance(split_dim, str) else split_dim.name)
    sizes = split_sizes(x, dim, num_or_size_splits, "SplitOperation")
    super().__init__([x], name=name or "split")
    self._dim, self._sizes = dim, sizes
    self._outputs = [Tensor(self, x.shape.resize_dimension(dim.name, n), x.dtype, index=i)
                     for i, n in enumerate(sizes)]

  def _unsplittable_dim_names(self):
    return [self._dim.name]

  def gradient(self, grad_ys):
    from mesh_tensorflow.operations.slicing import concat
    parts = [g if g is not None else elementwise.zeros_like_fn(y)
             for g, y in zip(grad_ys, self._outputs)]
    return [concat(parts, self._dim.name)]

  def plan(self, mesh):
    from mesh_tensorflow.lowering import plans  # pylint: disable=g-import-not-at-top
    return plans.plan_unsplit(self, mesh.layout_of, [self._dim.name])

  def lower(self, lowering):
    axis = self.inputs[0].shape.index_of(self._dim.name)
    sizes = self._sizes
    lower_with_unsplit(lowering, self, [self._dim.name],
                       lambda t: tuple(tf.split(t, sizes, axis=axis)))


class Conv2dOperation(conv.ConvOperation):
  """The original's 2D convolution class: conv_input [..., h, w, in_channels]
  with conv_filter [fh, fw, in_channels, out_channels] (mtf.conv2d)."""

  def __init__(self, conv_input: Tensor, conv_filter: Tensor, strides, padding, name=None):
    in_channels = conv_filter.shape.dims[2].name
    super().__init__(conv_input, conv_filter, strides, padding,
                     _spatial_names(conv_input.shape, in_channels, 2), name=name)


def _spatial_names(shape, channels: str, n: int):
  """The last n dimension names of `shape` other than `channels`."""
  return [d.name for d in conv._spatial_dims(  # pylint: disable=protected-access
      convert_to_shape(shape), n, [channels], f"conv{n}d")]


class Conv3dOperation(conv.ConvOperation):
  """The original's 3D convolution class: conv_input [..., d, h, w,
  in_channels] with conv_filter [fd, fh, fw, in_channels, out_channels]."""

  def __init__(self, conv_input: Tensor, conv_filter: Tensor, strides, padding, name=None):
    in_channels = conv_filter.shape.dims[3].name
    super().__init__(conv_input, conv_filter, strides, padding,
                     _spatial_names(conv_input.shape, in_channels, 3), name=name)


class Conv2or3dBackpropInputOperation(conv.ConvBackpropInputOperation):
  """The original's class for the gradient of a 2D/3D convolution
  (`conv_dimension` 2 or 3) in its input; with `is_transpose`, of a transposed
  convolution, which is a plain convolution of dy (an instance of a
  `ConvOperation` subclass is returned then).

  As in the original, every dimension is reported splittable; the lowering
  gathers split spatial dimensions itself.

  Example:
    >>> dx = mtf.Conv2or3dBackpropInputOperation(
    ...     2, False, x.shape, kernel, dy, [1, 1, 1, 1], "SAME").outputs[0]
  """

  def __new__(cls, conv_dimension: int, is_transpose: bool, *args, **kwargs):
    if is_transpose:
      return _TransposedConvBackpropInput(conv_dimension, *args, **kwargs)
    return super().__new__(cls)

  def __init__(self, conv_dimension: int, is_transpose: bool, input_shape,
               conv_filter: Tensor, dy: Tensor, strides, padding, name=None):
    del is_transpose  # False here: __new__ builds the transposed case
    _check_conv_dimension(conv_dimension, "Conv2or3dBackpropInputOperation")
    input_shape = convert_to_shape(input_shape)
    in_channels = conv_filter.shape.dims[conv_dimension].name
    super().__init__(dy, conv_filter, input_shape, strides, padding,
                     _spatial_names(input_shape, in_channels, conv_dimension),
                     name=name or f"conv{conv_dimension}d_backprop")

  def _unsplittable_dim_names(self):
    return ()


class _TransposedConvBackpropInput(conv.ConvOperation):
  """Conv2or3dBackpropInputOperation(n, True, ...): the input gradient of a
  transposed convolution with filter [k..., out_channels, in_channels]."""

  def __init__(self, conv_dimension: int, input_shape, conv_filter: Tensor, dy: Tensor,
               strides, padding, name=None):
    what = "Conv2or3dBackpropInputOperation"
    _check_conv_dimension(conv_dimension, what)
    out_channels = conv_filter.shape.dims[conv_dimension].name
    super().__init__(dy, conv_filter, strides, padding,
                     _spatial_names(dy.shape, out_channels, conv_dimension),
                     name=name or f"conv{conv_dimension}d_trans_backprop")
    if self.outputs[0].shape != convert_to_shape(input_shape):
      raise ValueError(f"{what}: the gradient of {dy.name} has shape {self.outputs[0].shape}, "
                       f"not the input shape {input_shape}; check strides and padding.")

  def _unsplittable_dim_names(self):
    return ()


class Conv2or3dBackpropFilterOperation(conv.ConvBackpropFilterOperation):
  """The original's class for the gradient of a 2D/3D convolution
  (`conv_dimension` 2 or 3) in its filter; with `is_transpose`, of a
  transposed convolution (whose image and gradient swap roles).

  Every dimension is reported splittable, as in the original.

  Example:
    >>> dk = mtf.Conv2or3dBackpropFilterOperation(
    ...     2, False, x, kernel.shape, dy, [1, 1, 1, 1], "SAME").outputs[0]
  """

  def __init__(self, conv_dimension: int, is_transpose: bool, conv_input: Tensor,
               filter_shape, dy: Tensor, strides, padding, name=None):
    _check_conv_dimension(conv_dimension, "Conv2or3dBackpropFilterOperation")
    filter_shape = convert_to_shape(filter_shape)
    image, grad = (dy, conv_input) if is_transpose else (conv_input, dy)
    channels = filter_shape.dims[conv_dimension].name
    trans = "_trans" if is_transpose else ""
    super().__init__(image, grad, filter_shape, strides, padding,
                     _spatial_names(image.shape, channels, conv_dimension),
                     name=name or f"conv{conv_dimension}d{trans}_backprop_filter")

  def _unsplittable_dim_names(self):
    return ()


def _check_conv_dimension(conv_dimension, what: str) -> None:
  if conv_dimension not in (2, 3):
    raise ValueError(f"{what}: conv_dimension must be 2 or 3, got {conv_dimension!r}.")


class _ConvTransposeOperation(conv.ConvBackpropInputOperation):
  """An n-D transposed convolution under the original's class signature."""
  spatial_rank = 2

  def __init__(self, conv_input: Tensor, conv_filter: Tensor, strides, padding, name=None):
    n = self.spatial_rank
    out_shape, strides, padding, names = conv.conv_transpose_setup(
        n, conv_input, conv_filter, strides, padding)
    super().__init__(conv_input, conv_filter, out_shape, strides, padding, names,
                     name=name or f"conv{n}d_transpose")


class Conv2dTransposeOperation(_ConvTransposeOperation):
  """The original's 2D transposed convolution class: conv_input [..., h, w,
  in_channels] with conv_filter [fh, fw, out_channels, in_channels]
  (mtf.conv2d_transpose)."""
  spatial_rank = 2


class Conv3dTransposeOperation(_ConvTransposeOperation):
  """The original's 3D transposed convolution class (mtf.conv3d_transpose)."""
  spatial_rank = 3


class PoolOperation(conv.PoolOperation):
  """The original's pooling class: `pool_fn_string` "MAX_2D", "AVG_2D",
  "MAX_3D" or "AVG_3D" pools x [..., (d,) h, w, channels] with VALID padding
  (mtf.max_pool2d and friends)."""

  def __init__(self, x: Tensor, ksize, strides, pool_fn_string: str, name=None):
    kinds = {"MAX_2D": ("max", 2), "AVG_2D": ("avg", 2), "MAX_3D": ("max", 3),
             "AVG_3D": ("avg", 3)}
    if pool_fn_string not in kinds:
      raise ValueError(f"PoolOperation: pool_fn_string {pool_fn_string!r} is not one of "
                       f"{sorted(kinds)}.")
    kind, n = kinds[pool_fn_string]
    spatial = [d.name for d in x.shape.dims[-n - 1:-1]]
    super().__init__(x, kind, tuple(ksize), tuple(strides), "VALID", spatial,
                     name=name or f"{kind}_pool{n}d")


class AddOperation(elementwise._LazyAwareAdd):  # pylint: disable=protected-access
  """x1 + x2 with broadcasting to `output_shape` (mtf.add); two pending sums
  over the same mesh axes stay pending, as with mtf.add.

  Example:
    >>> z = mtf.AddOperation(x, bias, x.shape).outputs[0]
  """

  def __init__(self, x1: Tensor, x2: Tensor, output_shape, name=None):
    x1, x2 = elementwise._binary_inputs(x1, x2, "AddOperation")  # pylint: disable=protected-access
    grads = None
    if x1.dtype.is_floating:
      grads = [lambda op, dy: elementwise.reduce_to_shape(dy, op.inputs[0].shape),
               lambda op, dy: elementwise.reduce_to_shape(dy, op.inputs[1].shape)]
    super().__init__(tf.add, [x1, x2], output_shape=output_shape, name=name or "add",
                     input_grads=grads, zero_gradient=grads is None)


class MinMaxOperation(elementwise.ElementwiseOperation):
  """tf_fn (tf.minimum or tf.maximum) of x1 and x2 with broadcasting; the
  gradient goes to each input where it equals the output (to both on a tie,
  as in the original).

  Example:
    >>> hi = mtf.MinMaxOperation(tf.maximum, x, y, x.shape).outputs[0]
  """

  def __init__(self, tf_fn: Callable, x1: Tensor, x2: Tensor, output_shape, name=None):
    x1, x2 = elementwise._binary_inputs(x1, x2, "MinMaxOperation")  # pylint: disable=protected-access

    def grad(i):
      def fn(op, dy):
        hit = elementwise.cast(elementwise.equal(op.inputs[i], op.outputs[0]), dy.dtype)
        return elementwise.reduce_to_shape(dy * hit, op.inputs[i].shape)
      return fn
    grads = [grad(0), grad(1)] if x1.dtype.is_floating else None
    super().__init__(tf_fn, [x1, x2], output_shape=output_shape,
                     name=name or getattr(tf_fn, "__name__", "min_max"),
                     input_grads=grads, zero_gradient=grads is None)


_POOL_KINDS = {"MAX_2D": ("max", 2), "AVG_2D": ("avg", 2), "MAX_3D": ("max", 3),
               "AVG_3D": ("avg", 3)}


def _pool_kind(pool_fn_string: str, what: str):
  if pool_fn_string not in _POOL_KINDS:
    raise ValueError(f"{what}: pool_fn_string {pool_fn_string!r} is not one of "
                     f"{sorted(_POOL_KINDS)}.")
  return _POOL_KINDS[pool_fn_string]


class PoolBackPropOperation(conv.PoolBackpropOperation):
  """The original's pooling-gradient class: dx of x for y = pool(x) and the
  output gradient dy (`pool_fn_string` "MAX_2D", "AVG_2D", "MAX_3D" or
  "AVG_3D"; VALID padding, spatial dimensions just before the last).

  Example:
    >>> dx = mtf.PoolBackPropOperation(x, y, dy, [2, 2], [2, 2], "MAX_2D").outputs[0]
  """

  def __init__(self, x: Tensor, y: Tensor, dy: Tensor, ksize, strides,
               pool_fn_string: str, name=None):
    kind, n = _pool_kind(pool_fn_string, "PoolBackPropOperation")
    if len(ksize) != n or len(strides) != n:
      raise ValueError(f"PoolBackPropOperation: {pool_fn_string} needs {n} ksize and "
                       f"strides values, got ksize={ksize!r}, strides={strides!r}.")
    spatial = [d.name for d in x.shape.dims[-n - 1:-1]]
    inputs = [x, y, dy] if kind == "max" else [dy]
    super().__init__(kind, inputs, x.shape, tuple(ksize), tuple(strides), "VALID",
                     spatial, name=name or "pool_backprop")


def pool_backprop(x: Tensor, y: Tensor, dy: Tensor, ksize, strides, pool_fn_string: str,
                  name=None) -> Tensor:
  """The gradient in x of y = pool(x) for output gradient dy (the original's
  function; see `PoolBackPropOperation`).

  Example:
    >>> y = mtf.max_pool2d(x, [2, 2])
    >>> dx = mtf.pool_backprop(x, y, dy, [2, 2], [2, 2], "MAX_2D")
  """
  return PoolBackPropOperation(x, y, dy, ksize, strides, pool_fn_string, name).outputs[0]


class ScalarSummaryOperation(control._IdentityLike):  # pylint: disable=protected-access
  """The original's summary class: identity on the scalar x that also records
  it (under `name`) for the Trainer to write to TensorBoard, as
  `mtf.scalar_summary` does.

  Example:
    >>> z_loss = mtf.ScalarSummaryOperation("z_loss", z_loss).outputs[0]
  """

  def __init__(self, name: str, x: Tensor):
    if not isinstance(x, Tensor) or x.shape.ndims != 0:
      raise ValueError(f"ScalarSummaryOperation {name!r}: expected a scalar mtf.Tensor, "
                       f"got {x!r}.")
    super().__init__([x], 1, name, grad=lambda op, g: [g[0]])
    from mesh_tensorflow.training.trainer import scalar_summary  # pylint: disable=import-outside-toplevel
    scalar_summary(name, self.outputs[0])


class StackedVariable(Variable):
  """One variable holding several variables of one shape and dtype, stacked
  along a new first dimension "stacked" (the original's way to cut the number
  of slice variables). It is named "stacked/<first name>", starts from the
  stacked initial values and remembers `original_names`.

  Example:
    >>> stacked = mtf.StackedVariable([w1_var, w2_var])
    >>> w = stacked.outputs[0]   # shape [stacked=2] + w1's shape
  """

  def __init__(self, vs):
    vs = [_as_variable(v) for v in vs]
    if not vs:
      raise ValueError("StackedVariable: needs at least one variable.")
    for v in vs[1:]:
      if v.shape != vs[0].shape or v.variable_dtype.master_dtype != vs[0].master_dtype:
        raise ValueError(f"StackedVariable: {v.name} {v.shape} ({v.master_dtype.name}) "
                         f"differs from {vs[0].name} {vs[0].shape} "
                         f"({vs[0].master_dtype.name}); stack variables of one shape "
                         "and dtype.")
    initial_values = [v._full_initial_value for v in vs]  # pylint: disable=protected-access

    def initializer(shape, dtype=None):
      del shape, dtype
      return tf.stack([fn() for fn in initial_values])
    shape = Shape([Dimension("stacked", len(vs))] + vs[0].shape.dims)
    super().__init__(vs[0].mesh, "stacked/" + vs[0].name, shape, vs[0].variable_dtype,
                     initializer, vs[0].trainable)
    self._original_names = [v.name for v in vs]

  @property
  def original_names(self):
    return list(self._original_names)

# ---------------------------------------------------------------- Estimator hooks
class _EstimatorHook:
  """Base of the original's Estimator checkpoint hooks, which cannot
  exist here: TensorFlow 2.16 removed the Estimator API. Constructing one raises
  an error that says what replaces it."""

  def __init__(self, *args, **kwargs):
    del args, kwargs
    raise NotImplementedError(
        f"mtf.{type(self).__name__} was a TensorFlow Estimator hook, and the Estimator "
        "API no longer exists in TensorFlow >= 2.16. Save and restore with "
        "mtf.checkpoint.CheckpointManager(mesh_impl, model_dir): call "
        "restore_or_initialize() before training and save(step) every N steps "
        "(mtf.training.Trainer does both), or lower in a tf.compat.v1 graph and use "
        "tf.compat.v1.train.Saver on the slice variables.")


class MtfRestoreHook(_EstimatorHook):
  """The original's restore hook (raises: see `_EstimatorHook`)."""


class MtfCheckpointSaverListener(_EstimatorHook):
  """The original's checkpoint saver listener (raises: see `_EstimatorHook`)."""


from mesh_tensorflow.core import autograph_exempt as _autograph_exempt  # noqa: E402  pylint: disable=g-import-not-at-top
_autograph_exempt.exempt(globals())  # AutoGraph leaves this module's code alone
