"""Master variables: a full-size copy of each mtf variable, on request.

Variables normally exist only as per-processor slices (slice_variables.py).
A program may ask for a full-size
"master" copy of every variable as well, by giving its mesh a variable placer:

    >>> placer = mtf.utils.BalancedVariablePlacer(["cpu:0", "cpu:1"])
    >>> mesh = mtf.Mesh(graph, "mesh", placer)
    >>> w = mtf.get_variable(mesh, "w", "hidden:1024;classes:10")   # creates "w"

Each `mtf.get_variable` then creates a TensorFlow variable of the full shape,
named as the mtf variable (TF1 graphs: in the default graph, where a
`tf.compat.v1.train.Saver` finds it; TF2: eagerly, once), on the device the
placer picks. The slices start from the master's value, and
`lowering.copy_slices_to_masters()` / `copy_masters_to_slices()` are the ops
that copy one into the other (e.g. before saving and after restoring a
checkpoint of the masters). Training updates the slices only: the masters
change only through those copies.
"""

from __future__ import annotations

from typing import Callable, List, Optional

import tensorflow as tf

from mesh_tensorflow.core.shapes import Shape


class _VariableOpStub:
  """What a TF1 device function reads of a variable op (type, name, shape and
  dtype attributes), for placing a variable created eagerly."""

  type = "VarHandleOp"

  def __init__(self, name: str, shape: List[int], dtype: tf.DType):
    self.name = name
    self._attrs = {"shape": shape, "dtype": dtype}

  def get_attr(self, key):
    return self._attrs[key]


def _masters(placer) -> dict:
  return placer.__dict__.setdefault("_mtf_master_variables", {})


def create_master(placer, name: str, shape: Shape, dtype: tf.DType,
                  initial_value: Callable[[], tf.Tensor], trainable: bool) -> tf.Variable:
  """The master variable `name` (full `shape`), created once per TF program
  (eager, or each tf.compat.v1 graph) on the device `placer` picks."""
  device_fn = getattr(placer, "device_function", placer)
  if not callable(device_fn):
    raise TypeError(f"mtf.Mesh: the variable placer {placer!r} has no device_function; give "
                    "an mtf.utils.BalancedVariablePlacer or an object with "
                    "device_function(op) -> device name.")
  full = shape.to_integer_list()
  with tf.init_scope():
    eager = tf.executing_eagerly()
    key = ("eager" if eager else id(tf.compat.v1.get_default_graph()), name)
    masters = _masters(placer)
    if key in masters:
      return masters[key]
    if eager:
      device = device_fn(_VariableOpStub(name, full, dtype))
      with tf.device(device):
        master = tf.Variable(initial_value(), name=name, dtype=dtype, trainable=trainable)
    else:
      graph = tf.compat.v1.get_default_graph()
      # The name already holds the variable scope: create it at the top level.
      with graph.name_scope(None), graph.device(device_fn):
        master = tf.compat.v1.Variable(initial_value, name=name, dtype=dtype,
                                       trainable=trainable)
    masters[key] = master
    return master


def initial_slice(master: tf.Variable, begin, slice_shape) -> tf.Tensor:
  """A slice's initial value: the master's (its initial value in a TF1
  graph, where initializers run in no particular order)."""
  if tf.executing_eagerly():
    full = master.value()
  else:
    full = master.initial_value
  if list(slice_shape) == full.shape.as_list():
    return full
  return tf.slice(full, begin, slice_shape)


def copy_slices_to_masters(lowering) -> Optional[tf.Operation]:
  """Assigns every master the full value of its slices; a no-op without
  masters."""
  ops = []
  for variable, laid_out, master in _with_masters(lowering):
    impl = laid_out.mesh_impl
    slices = impl.slicewise(lambda v: v.value() if hasattr(v, "value") else tf.identity(v),
                            laid_out.laid_out_tensor)
    full = impl.export_to_tf_tensor(slices, variable.storage_shape)
    ops.append(master.assign(tf.cast(full, master.dtype)))
  return _group(ops)


def copy_masters_to_slices(lowering) -> Optional[tf.Operation]:
  """Assigns every variable's slices from its master; a no-op without
  masters."""
  ops = []
  for variable, laid_out, master in _with_masters(lowering):
    values = laid_out.mesh_impl.import_tf_tensor(master.value(), variable.storage_shape)
    ops.append(laid_out.assign_to_slices(lambda v, t: v.assign(t), values.tensor_list))
  return _group(ops)


def _with_masters(lowering):
  """(variable, its LaidOutVariable, its master) for the lowered variables
  that have a master."""
  for variable, laid_out in lowering.variables.items():
    master = getattr(variable, "master", None)
    if master is not None:
      yield variable, laid_out, master


def _group(ops):
  if not ops:
    return tf.no_op()
  return tf.group(*ops)
