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

from mesh_tensorflow.graph import Operation, Tensor
from mesh_tensorflow.ops import control, conv, elementwise
from mesh_tensorflow.ops.shape_ops import lower_with_unsplit
from mesh_tensorflow.ops.slicing import split_sizes
from mesh_tensorflow.ops.variables import Variable, _as_variable
from mesh_tensorflow.shapes import convert_to_shape


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
    from mesh_tensorflow.ops.slicing import concat
    parts = [g if g is not None else elementwise.zeros_like_fn(y)
             for g, y in zip(grad_ys, self._outputs)]
    return [concat(parts, self._dim.name)]

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
  """The original's class for the gradient of a 2D/3D convolution in its input
  (`conv_dimension` 2 or 3)."""

  def __init__(self, conv_dimension: int, input_shape, conv_filter: Tensor, dy: Tensor,
               strides, padding, name=None):
    in_channels = conv_filter.shape.dims[conv_dimension].name
    super().__init__(dy, conv_filter, input_shape, strides, padding,
                     _spatial_names(input_shape, in_channels, conv_dimension), name=name)


class Conv2or3dBackpropFilterOperation(conv.ConvBackpropFilterOperation):
  """The original's class for the gradient of a 2D/3D convolution in its
  filter (`conv_dimension` 2 or 3)."""

  def __init__(self, conv_dimension: int, conv_input: Tensor, filter_shape, dy: Tensor,
               strides, padding, name=None):
    in_channels = convert_to_shape(filter_shape).dims[conv_dimension].name
    super().__init__(conv_input, dy, filter_shape, strides, padding,
                     _spatial_names(conv_input.shape, in_channels, conv_dimension), name=name)


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
