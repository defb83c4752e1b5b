"""One variable made of per-replica copies (`ReplicatedVariable`; replaces
the original's `mesh_tensorflow.tpu_variables`).

Inside a TF1 `tpu.replicate()` computation such a variable resolved to the
replica's own handle. TensorFlow 2 has no such context; the
replacement is a variable created under `tf.distribute.TPUStrategy` (or any
`tf.distribute.Strategy`), which mirrors it on every replica. Here
`ReplicatedVariable` works on the devices at hand: it reads its first copy and
writes every copy, so the copies stay equal.

    >>> copies = [tf.Variable(tf.zeros([2]), name=f"w_{i}") for i in range(2)]
    >>> w = ReplicatedVariable("w", copies)
    >>> w.assign_add(tf.ones([2]))  # both copies are [1., 1.]
    >>> tf.convert_to_tensor(w)
"""

from __future__ import annotations

from typing import Sequence

import tensorflow as tf

TF_23 = True  # "TensorFlow is 2.3 or newer": always true here
VariableBase = object  # ReplicatedVariable's base class


class ReplicatedVariable(VariableBase):
  """A variable held as equal copies, one per replica (device).

  Args:
    name: the variable's name.
    variables: the per-replica `tf.Variable`s, of one dtype and shape; the
      first is the one read.

  Example:
    >>> w = ReplicatedVariable("w", [tf.Variable(1.0), tf.Variable(1.0)])
    >>> w.assign(3.0)
    >>> float(w.read_value())
    3.0
  """

  def __init__(self, name: str, variables: Sequence[tf.Variable]):
    variables = list(variables)
    if not variables:
      raise ValueError(f"ReplicatedVariable {name!r}: needs at least one variable.")
    for v in variables[1:]:
      if v.dtype != variables[0].dtype or v.shape != variables[0].shape:
        raise ValueError(
            f"ReplicatedVariable {name!r}: copy {v.name} is {v.dtype.name} {v.shape}, "
            f"the first is {variables[0].dtype.name} {variables[0].shape}; the copies "
            "must have one dtype and shape.")
    self._name = name
    self._primary_var = variables[0]
    self._vars = variables
    self._dtype = variables[0].dtype

  @property
  def handle(self):
    """The first copy's resource handle (TensorFlow 2 has no replicated
    context that would pick the replica's own)."""
    return self._primary_var.handle

  @property
  def device(self):
    return self._primary_var.device

  @property
  def name(self) -> str:
    return self._name

  @property
  def dtype(self) -> tf.DType:
    return self._dtype

  @property
  def shape(self) -> tf.TensorShape:
    return self._primary_var.shape

  @property
  def op(self):
    return self._primary_var.op

  @property
  def initializer(self):
    return tf.group(*[v.initializer for v in self._vars])

  @property
  def variables(self):
    return list(self._vars)

  def get_shape(self) -> tf.TensorShape:
    return self.shape

  def read_value(self) -> tf.Tensor:
    return self._primary_var.read_value()

  def value(self) -> tf.Tensor:
    return self._primary_var.value()

  def _assign_all(self, method: str, value, read_value: bool):
    ops = [getattr(v, method)(value, read_value=False) for v in self._vars]
    if read_value:
      with tf.control_dependencies(ops):
        return self.read_value()
    return tf.group(*ops) if not tf.executing_eagerly() else None

  def assign(self, value, use_locking=None, name=None, read_value=True):
    del use_locking, name
    return self._assign_all("assign", value, read_value)

  def assign_add(self, delta, use_locking=None, name=None, read_value=True):
    del use_locking, name
    return self._assign_all("assign_add", delta, read_value)

  def assign_sub(self, delta, use_locking=None, name=None, read_value=True):
    del use_locking, name
    return self._assign_all("assign_sub", delta, read_value)

  def __repr__(self):
    return f"ReplicatedVariable({self._name!r}, {len(self._vars)} copies)"


def _to_tensor(var, dtype=None, name=None, as_ref=False):
  del name
  if as_ref:
    raise NotImplementedError(
        f"ReplicatedVariable {var.name!r}: a reference to it is not supported; "
        "create the variable under tf.distribute.TPUStrategy for a mirrored variable.")
  value = var.read_value()
  if dtype is not None and dtype != value.dtype:
    raise ValueError(f"ReplicatedVariable {var.name!r} is {value.dtype.name}, "
                     f"not {tf.as_dtype(dtype).name}; cast it with tf.cast.")
  return value


tf.register_tensor_conversion_function(ReplicatedVariable, _to_tensor)
