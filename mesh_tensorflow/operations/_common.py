"""Helpers shared by the op families."""

from __future__ import annotations

import numbers

import numpy as np
import tensorflow as tf

from mesh_tensorflow.core.graph import Mesh, Tensor
from mesh_tensorflow.core.shapes import Shape
from mesh_tensorflow.operations.constant_ops import constant


def is_scalar_value(x) -> bool:
  return isinstance(x, (numbers.Number, np.number, bool, np.bool_))


def to_tensor(mesh: Mesh, x, dtype) -> Tensor:
  """Python numbers become scalar mtf constants; mtf Tensors pass through."""
  if isinstance(x, Tensor):
    return x
  if is_scalar_value(x):
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
