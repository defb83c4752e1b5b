"""Per-processor slice variables and their layout-independent checkpoint form.

Each mtf variable becomes a `SlicedVariable`: one tf.Variable per distinct
slice (processors holding the same slice in one shared memory share it). A
SlicedVariable saves itself as slices of one logical full-shape tensor, so a
checkpoint written under one mesh and layout restores under any other.
"""

from __future__ import annotations

from typing import Callable, List, Optional, Sequence

import tensorflow as tf

from mesh_tensorflow.shapes import Shape, convert_to_shape

_META_KEY = "__pending_checkpoint__"


def variable_store(mesh_impl) -> dict:
  """{name: SlicedVariable} of `mesh_impl` for the current TF program (eager,
  or the tf.compat.v1 graph being built)."""
  with tf.init_scope():
    key = "eager" if tf.executing_eagerly() else id(tf.compat.v1.get_default_graph())
  stores = mesh_impl.__dict__.setdefault("_variable_stores", {})
  return stores.setdefault(key, {})


def slice_spec(full_shape: Sequence[int], begin: Sequence[int], size: Sequence[int]) -> str:
  """TensorFlow's checkpoint slice notation: "d0 d1 b0,s0:b1,s1"."""
  if not full_shape:
    return ""
  return (" ".join(str(d) for d in full_shape) + " " +
          ":".join(f"{b},{s}" for b, s in zip(begin, size)))


class SlicedVariable(tf.Module):
  """The slices of one mtf variable on one mesh implementation.

  Attributes:
    var_name: the mtf variable name.
    full_shape: its logical shape (list of ints).
    master_dtype: the dtype it is saved in.
    slices: one tf.Variable per processor (shared ones repeat).
    begins: each processor's slice offset in the full tensor.
  """

  def __init__(self, var_name: str, full_shape, master_dtype, begins, slices):
    super().__init__()
    self.var_name = var_name
    self.full_shape = list(full_shape)
    self.master_dtype = tf.as_dtype(master_dtype)
    # Kept behind a function so tf.Module does not track (and save) each slice.
    self._state = lambda: (list(begins), list(slices))

  @property
  def slices(self) -> List[tf.Variable]:
    return self._state()[1]

  @property
  def begins(self) -> List[List[int]]:
    return self._state()[0]

  def unique_slices(self):
    """[(begin, size, tf.Variable)] with each distinct slice once."""
    seen, out = set(), []
    for begin, v in zip(*self._state()):
      if id(v) not in seen:
        seen.add(id(v))
        out.append((begin, v.shape.as_list(), v))
    return out

  def _serialize_to_tensors(self):
    parts = {}
    for begin, size, v in self.unique_slices():
      parts[slice_spec(self.full_shape, begin, size)] = tf.cast(v.read_value(), self.master_dtype)
    if len(parts) == 1 and list(parts)[0] == "":
      return {"value": parts[""]}
    return {"value": parts}

  def _restore_from_tensors(self, restored_tensors):
    raise NotImplementedError(
        "Restore mtf variables with mesh_tensorflow.checkpoint.CheckpointManager, "
        "which reads exactly the slices each processor needs.")

  def restore_from(self, prefix: str, key: str):
    """Assigns every slice from checkpoint `prefix`, tensor `key`."""
    ops = []
    for begin, size, v in self.unique_slices():
      ops.append(v.assign(tf.cast(read_slice(prefix, key, self.full_shape, begin, size,
                                             self.master_dtype), v.dtype)))
    return ops


def read_slice(prefix, key, full_shape, begin, size, dtype) -> tf.Tensor:
  (value,) = tf.raw_ops.RestoreV2(prefix=prefix, tensor_names=[key],
                                  shape_and_slices=[slice_spec(full_shape, begin, size)],
                                  dtypes=[tf.as_dtype(dtype)])
  return value


def checkpoint_key(name: str) -> str:
  """The key under which CheckpointManager saves mtf variable `name`."""
  escaped = name.replace(".", "..").replace("/", ".S")
  return f"model/variables_by_name/{escaped}/.ATTRIBUTES/value"


def set_pending_checkpoint(mesh_impl, prefix: Optional[str]) -> None:
  """Variables created later on `mesh_impl` start from checkpoint `prefix`."""
  mesh_impl.__dict__[_META_KEY] = prefix


def _pending_value(mesh_impl, name, full_shape, begin, size, dtype):
  prefix = mesh_impl.__dict__.get(_META_KEY)
  if not prefix:
    return None
  reader = tf.train.load_checkpoint(prefix)
  key = checkpoint_key(name)
  if not reader.has_tensor(key):
    return None
  saved = reader.get_variable_to_shape_map()[key]
  if list(saved) != list(full_shape):
    raise ValueError(
        f"Checkpoint {prefix} has variable {name!r} with shape {list(saved)}, but the "
        f"model needs {list(full_shape)}.")
  return read_slice(prefix, key, full_shape, begin, size, dtype)


def get_or_create(mesh_impl, name: str, shape, master_dtype, slice_dtype,
                  trainable: bool, init_fn: Callable) -> SlicedVariable:
  """The SlicedVariable `name` (an mtf Shape `shape`) of mesh_impl, created on
  first use.

  init_fn(begin, slice_shape) gives a slice's initial value (in master dtype)
  unless a pending checkpoint has the variable. Creation is lifted out of any
  tf.function (tf.init_scope), so it happens once.
  """
  shape = convert_to_shape(shape)
  full_shape = shape.to_integer_list()
  store = variable_store(mesh_impl)
  slice_shape = mesh_impl.slice_shape(shape)
  existing = store.get(name)
  if existing is not None:
    first = existing.slices[0]
    if (existing.full_shape != list(full_shape) or first.shape.as_list() != slice_shape
        or first.dtype != tf.as_dtype(slice_dtype)):
      raise ValueError(
          f"Variable {name!r} already exists with shape {existing.full_shape}, slice "
          f"{first.shape.as_list()} {first.dtype.name}; this graph needs shape "
          f"{list(full_shape)}, slice {slice_shape} {tf.as_dtype(slice_dtype).name}. Use "
          "another name, or the same shape, dtype and layout.")
    return existing
  shared = getattr(mesh_impl, "shares_replicas", False)
  begins, slices, by_begin = [], [], {}
  with tf.init_scope():
    for pnum in range(mesh_impl.size):
      begin = mesh_impl.slice_begin(shape, pnum)
      begins.append(begin)
      if shared and tuple(begin) in by_begin:
        slices.append(by_begin[tuple(begin)])
        continue
      with tf.device(mesh_impl.variable_device(pnum)):
        value = _pending_value(mesh_impl, name, full_shape, begin, slice_shape, master_dtype)
        if value is None:
          value = init_fn(begin, slice_shape)
        v = tf.Variable(tf.cast(value, slice_dtype), trainable=trainable,
                        name=f"{name}/slice_{pnum}")
      by_begin[tuple(begin)] = v
      slices.append(v)
  sliced = SlicedVariable(name, full_shape, master_dtype, begins, slices)
  store[name] = sliced
  return sliced


def scalar_state(mesh_impl, name: str, dtype=tf.int64) -> tf.Variable:
  """A checkpointed scalar (e.g. a step counter) kept on processor 0's device."""
  sliced = get_or_create(mesh_impl, name, Shape([]), dtype, dtype, False,
                         lambda begin, size: tf.zeros([], dtype))
  return sliced.slices[0]
