"""What the SIMD program holds besides the implementation: the arguments that
differ between processors (`PerProcessor`), each processor's slice variables
as the program sees them (resource handles), the state of one trace, and the
devices a mesh runs on by default.

    >>> impl.run(step, PerProcessor([x_slice_0, ..., x_slice_7]))
"""

from __future__ import annotations

from typing import Callable, List, Sequence

import tensorflow as tf


class PerProcessor:
  """Arguments of `SimdMeshImpl.run` that differ between processors.

  Each processor's program receives `values[pnum]` (e.g. its own slice of a
  batch, to be brought in with `mtf.import_laid_out_tensor(mesh, [x], shape)`).

  Example:
    >>> impl.run(step, PerProcessor([x_slice_0, ..., x_slice_7]))
  """

  def __init__(self, values: Sequence):
    self.values = list(values)


class _ProcessorVariable:
  """One processor's slice variable inside the SIMD program: a resource
  handle that the program receives as an argument, with the tf.Variable
  methods that lowering and optimizers use."""

  def __init__(self, handle: tf.Tensor, dtype, shape, name: str):
    self.handle = handle
    self.dtype = tf.as_dtype(dtype)
    self.shape = tf.TensorShape(shape)
    self.name = name
    self.trainable = True

  def read_value(self) -> tf.Tensor:
    value = tf.raw_ops.ReadVariableOp(resource=self.handle, dtype=self.dtype)
    # The program is always traced: a static shape suffices (no runtime check op).
    value.set_shape(self.shape)
    return value

  value = read_value

  def _update(self, op, value, read_value):
    value = tf.cast(tf.convert_to_tensor(value), self.dtype)
    assign = op(resource=self.handle, value=value)
    if not read_value:
      return assign
    with tf.control_dependencies([assign]):
      return self.read_value()

  def assign(self, value, read_value=True, **_):
    return self._update(tf.raw_ops.AssignVariableOp, value, read_value)

  def assign_add(self, value, read_value=True, **_):
    return self._update(tf.raw_ops.AssignAddVariableOp, value, read_value)

  def assign_sub(self, value, read_value=True, **_):
    return self._update(tf.raw_ops.AssignSubVariableOp, value, read_value)


class _ProgramState:
  """What one trace of the program knows: its pnum and its variables."""

  def __init__(self, pnum: tf.Tensor, discover: bool, variable_names=(), handles=(),
               token=None):
    self.pnum = pnum
    self.token = token
    self.discover = discover
    self.used = []  # SlicedVariables in first-use order (discovery pass)
    self.handles = dict(zip(variable_names, handles))
    self.wrappers = {}
    self.graph = tf.compat.v1.get_default_graph()
    self.pending = []  # LazyAllreduceSums made at the program's top level, not yet reduced
    self.cache = {}  # index tensors computed once per program (coordinates, group indices)

  def cached(self, key, make: Callable[[], tf.Tensor]) -> tf.Tensor:
    """make(), computed once per program: only at the program's top level
    (a tensor made inside a loop or branch cannot be used outside it) and with
    no control dependencies, so reusing it orders nothing."""
    if tf.compat.v1.get_default_graph() is not self.graph:
      return make()
    if key not in self.cache:
      with tf.control_dependencies(None):
        self.cache[key] = make()
    return self.cache[key]


def _has_loops(concrete) -> bool:
  """Whether a traced program runs a while loop (in its body or a nested function)."""
  loop_ops = ("While", "StatelessWhile", "_While")
  if any(op.type in loop_ops for op in concrete.graph.get_operations()):
    return True
  library = concrete.graph.as_graph_def().library
  return any(node.op in loop_ops for f in library.function for node in f.node_def)


def _local_devices(n: int) -> List[str]:
  """This process's first n GPUs if it has n, else its first n logical CPUs."""
  for kind in ("GPU", "CPU"):
    found = [d.name for d in tf.config.list_logical_devices(kind)]
    if len(found) >= n:
      return found[:n]
  raise ValueError(
      f"SimdMeshImpl: the mesh has {n} processors but this process has fewer GPUs and "
      f"fewer logical CPUs ({len(tf.config.list_logical_devices('CPU'))}). Pass devices=, "
      "or split the CPU first with tf.config.set_logical_device_configuration.")


def _device_sort_key(device: str):
  spec = tf.DeviceSpec.from_string(device or "")
  return (spec.job or "", spec.replica or 0, spec.task or 0, (spec.device_type or "").upper(),
          spec.device_index or 0)
