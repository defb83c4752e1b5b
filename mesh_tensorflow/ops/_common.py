"""Helpers shared by the op families."""

from __future__ import annotations

import numbers

import numpy as np
import tensorflow as tf

from mesh_tensorflow.graph import Mesh, Operation, Tensor
from mesh_tensorflow.shapes import Shape, convert_to_shape


def is_scalar_value(x) -> bool:
  return isinstance(x, (numbers.Number, np.number, bool, np.bool_))


def to_tensor(mesh: Mesh, x, dtype) -> Tensor:
  """Python numbers become scalar mtf constants; mtf Tensors pass through."""
  if isinstance(x, Tensor):
    return x
  if is_scalar_value(x):
    from mesh_tensorflow.ops.constant import constant
    return constant(mesh, x, shape=Shape([]), dtype=dtype)
  raise TypeError(
      f"Expected an mtf.Tensor or a Python number, got {type(x).__name__} {x!r}. "
      "Import TensorFlow tensors with mtf.import_tf_tensor.")


def first_tensor(*xs) -> Tensor:
  for x in xs:
    if isinstance(x, Tensor):
      return x
  raise TypeError(f"At least one argument must be an mtf.Tensor, got {xs!r}.")


def num_elements(t: tf.Tensor) -> int:
  n = t.shape.num_elements()
  return n if n is not None else 0


class GenericOperation(Operation):
  """An operation whose lowering and gradient are given as functions.

  lower_fn(lowering, op) sets the lowering of op.outputs; grad_fn(op, grad_ys)
  returns one gradient per input. Used for ops that need no state of their own.
  """

  def __init__(self, inputs, output_shapes, output_dtypes, lower_fn, grad_fn=None,
               mesh=None, name=None):
    super().__init__(inputs, mesh=mesh, name=name)
    self._outputs = [Tensor(self, convert_to_shape(s), d, index=i)
                     for i, (s, d) in enumerate(zip(output_shapes, output_dtypes))]
    self._lower_fn = lower_fn
    self._grad_fn = grad_fn
    self.has_gradient = grad_fn is not None

  def lower(self, lowering):
    self._lower_fn(lowering, self)

  def gradient(self, grad_ys):
    if self._grad_fn is None:
      return super().gradient(grad_ys)
    return self._grad_fn(self, grad_ys)
