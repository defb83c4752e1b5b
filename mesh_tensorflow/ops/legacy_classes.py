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

from mesh_tensorflow.graph import Tensor
from mesh_tensorflow.ops import control, elementwise
from mesh_tensorflow.ops.variables import Variable, _as_variable


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


class StopGradient(control._IdentityLike):  # pylint: disable=protected-access
  """The identity, without a gradient (mtf.stop_gradient)."""

  def __init__(self, x: Tensor, name=None):
    super().__init__([x], 1, name or "stop_gradient")


class Depend(control._IdentityLike):  # pylint: disable=protected-access
  """x, once `dependencies` (mtf Operations or Tensors) have run (mtf.depend)."""

  def __init__(self, x: Tensor, dependencies, name=None):
    deps = list(dependencies) if isinstance(dependencies, (list, tuple)) else [dependencies]
    tensors = [d for d in deps if isinstance(d, Tensor)]
    super().__init__([x] + tensors, 1, name or "depend",
                     grad=lambda op, g: [g[0]] + [None] * len(tensors),
                     control_inputs=[d for d in deps if not isinstance(d, Tensor)])


class PrintOperation(control._IdentityLike):  # pylint: disable=protected-access
  """x, printing `message` and the values of `data` when it runs (mtf.Print)."""

  def __init__(self, x: Tensor, data, message: str, name=None, **kwargs):
    del kwargs  # summarize
    self._data = list(data)
    self._message = message
    super().__init__([x] + self._data, 1, name or "Print",
                     grad=lambda op, g: [g[0]] + [None] * len(self._data))

  def lower(self, lowering):
    from mesh_tensorflow.mesh_impl import LaidOutTensor
    values = [lowering.export_to_tf_tensor(t) for t in self._data]
    with tf.control_dependencies([tf.print(self._message, *values)]):
      laid = lowering.laid_out(self.inputs[0])
      lowering.set_tensor_lowering(
          self.outputs[0], LaidOutTensor([tf.identity(t) for t in laid.tensor_list]))


class ReadVariable(control._IdentityLike):  # pylint: disable=protected-access
  """The current value of an mtf Variable (mtf.read_variable)."""

  def __init__(self, var, name: Optional[str] = None):
    variable: Variable = _as_variable(var)
    super().__init__([variable.outputs[0]], 1, name or "read_variable",
                     grad=lambda op, g: [g[0]])
