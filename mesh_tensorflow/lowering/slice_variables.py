"""Per-processor slice variables and their layout-independent checkpoint form.

Each mtf variable becomes a `SlicedVariable`: one tf.Variable per distinct
slice (processors holding the same slice in one shared memory share it). A
SlicedVariable saves itself as slices of one logical full-shape tensor, so a
checkpoint written under one mesh and layout restores under any other.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from mesh_tensorflow.core.shapes import Shape, convert_to_shape
from mesh_tensorflow.lowering import sharing

# mesh_impl.keeps keys: the slice variables of each TensorFlow program, and
# the checkpoint new variables start from (training.offload shares both with
# its host implementation).
STORES_KEY = "slice_variables"
PENDING_KEY = "pending_checkpoint"

# How a checkpoint keeps float32 masters of 16-bit variables
# (`float32_master_in_optimizer`): variable X saved in its 16-bit dtype, its
# float32 master as the optimizer slot X + MASTER_SUFFIX, valid once the
# scalar MASTERS_READY is 1 (after the first update).
MASTER_SUFFIX = "/master"
MASTERS_READY = "optimizer_float32_masters_ready"

# Slice variables are created eagerly (tf.init_scope) the first time a graph
# needs them. Left to its default, a tf.function that sees a variable being
# created while it traces assumes the variable belongs to that trace, and traces
# the whole Python function a second time before its first call; with lifting
# off it keeps its first trace (the variable is eager either way).
NOT_CAPTURED_BY_TF_FUNCTION = {"experimental_enable_variable_lifting": False}


def variable_store(mesh_impl) -> dict:
  """{name: SlicedVariable} of `mesh_impl` for the current TF program (eager,
  or the tf.compat.v1 graph being built)."""
  with tf.init_scope():
    key = "eager" if tf.executing_eagerly() else id(tf.compat.v1.get_default_graph())
  stores = mesh_impl.keeps.setdefault(STORES_KEY, {})
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
    self.master_dtype = tf.as_dtype(master_dtype)
    # Kept behind a function so tf.Module does not track (and save) each slice,
    # nor wrap the lists.
    full_shape, begins, slices = list(full_shape), list(begins), list(slices)
    self._state = lambda: (begins, slices, full_shape)

  @property
  def full_shape(self) -> List[int]:
    return list(self._state()[2])

  @property
  def slices(self) -> List[tf.Variable]:
    return list(self._state()[1])

  @property
  def begins(self) -> List[List[int]]:
    return list(self._state()[0])

  def unique_slices(self):
    """[(begin, size, tf.Variable)] with each distinct slice once."""
    seen, out = set(), []
    begins, slices, _ = self._state()
    for begin, v in zip(begins, slices):
      if id(v) not in seen:
        seen.add(id(v))
        out.append((begin, v.shape.as_list(), v))
    return out

  @property
  def trainable(self) -> bool:
    return bool(self.slices[0].trainable)

  def numpy(self) -> np.ndarray:
    """The full logical value, assembled from the slices (in the slice dtype).

    Example:
      >>> variable_store(mesh_impl)["w1"].numpy().shape
      (64, 256)
    """
    out = None
    for begin, size, v in self.unique_slices():
      value = v.numpy()
      if out is None:
        out = np.zeros(self.full_shape, dtype=value.dtype)
      out[tuple(slice(b, b + n) for b, n in zip(begin, size))] = value
    return out

  def _serialize_to_tensors(self):
    parts = {}
    for begin, size, v in self.unique_slices():
      spec = slice_spec(self.full_shape, begin, size)
      if spec not in parts:  # Unshared replicas: save the lowest processor's copy
        # (scalar_state, e.g. the global step, updates only processor 0's).
        parts[spec] = tf.cast(v.read_value(), self.master_dtype)
    if len(parts) == 1 and list(parts)[0] == "":
      return {"value": parts[""]}
    return {"value": parts}

  def _restore_from_tensors(self, restored_tensors):
    raise NotImplementedError(
        "Restore mtf variables with mesh_tensorflow.training.checkpoint.CheckpointManager, "
        "which reads exactly the slices each processor needs.")

  def restore_from(self, prefix: str, key: str, saved_dtype=None):
    """Assigns every slice from checkpoint `prefix`, tensor `key` (saved as
    `saved_dtype`, default the master dtype; values are cast to the slice dtype)."""
    saved_dtype = tf.as_dtype(saved_dtype or self.master_dtype)
    ops = []
    for begin, size, v in self.unique_slices():
      ops.append(v.assign(tf.cast(read_slice(prefix, key, self.full_shape, begin, size,
                                             saved_dtype), v.dtype)))
    return ops


def read_slice(prefix: str, key: str, full_shape: Sequence[int], begin: Sequence[int],
               size: Sequence[int], dtype) -> tf.Tensor:
  """Reads slice [begin, begin + size) of checkpoint tensor `key` (of logical
  shape `full_shape`, saved as `dtype`), whatever slices it was saved as.

  Example:
    >>> read_slice("/tmp/run/ckpt-10", checkpoint_key("w1"), [64, 256], [0, 128],
    ...            [64, 128], tf.float32)
  """
  (value,) = tf.raw_ops.RestoreV2(prefix=prefix, tensor_names=[key],
                                  shape_and_slices=[slice_spec(full_shape, begin, size)],
                                  dtypes=[tf.as_dtype(dtype)])
  return value


_KEY_TAIL = "/.ATTRIBUTES/value"


def _escape(name: str) -> str:
  return name.replace(".", "..").replace("/", ".S")


def checkpoint_key(name: str) -> str:
  """The key under which CheckpointManager saves mtf variable `name`."""
  return f"model/variables_by_name/{_escape(name)}{_KEY_TAIL}"


class PendingCheckpoint:
  """A checkpoint that variables created later start from.

  Attributes:
    prefix: the checkpoint path prefix.
    shapes: {checkpoint key: logical shape} of the checkpoint.
    dtypes: {checkpoint key: saved dtype}.
    allow_missing: whether a trainable variable that the checkpoint lacks may
      start from its initializer (non-trainable state, such as optimizer slots,
      gradient accumulators and step counters, always may).
  """

  def __init__(self, prefix: str, allow_missing: bool = False,
               include_optimizer_state: bool = True):
    reader = tf.train.load_checkpoint(prefix)
    self.prefix = prefix
    self.shapes = {k: list(v) for k, v in reader.get_variable_to_shape_map().items()}
    self.dtypes = dict(reader.get_variable_to_dtype_map())
    self.allow_missing = allow_missing
    self.include_optimizer_state = include_optimizer_state
    self.float32_sources = float32_sources(reader, self.shapes, self.dtypes)

  def source(self, name: str, dtype) -> Tuple[str, tf.DType]:
    """(checkpoint key, saved dtype) that variable `name`, of master dtype
    `dtype`, restores from: a float32 variable saved in 16 bits with its
    float32 master reads the master."""
    key = checkpoint_key(name)
    if tf.as_dtype(dtype) == tf.float32 and key in self.float32_sources:
      key = self.float32_sources[key]
    return key, self.dtypes[key]


def float32_sources(reader, shapes, dtypes) -> Dict[str, str]:
  """{key of a 16-bit variable: key of its float32 master} of a checkpoint
  written with `float32_master_in_optimizer` after its first update (before
  it, the masters are not yet set: none).

  Example:
    >>> reader = tf.train.load_checkpoint("/tmp/run/ckpt-100")
    >>> float32_sources(reader, reader.get_variable_to_shape_map(),
    ...                 reader.get_variable_to_dtype_map())[checkpoint_key("w1")]
    'model/variables_by_name/w1.Smaster/.ATTRIBUTES/value'
  """
  ready = checkpoint_key(MASTERS_READY)
  if ready not in shapes or float(reader.get_tensor(ready)) < 0.5:
    return {}
  out = {}
  suffix = _escape(MASTER_SUFFIX) + _KEY_TAIL
  for key, dtype in dtypes.items():
    if not key.endswith(suffix) or dtype != tf.float32:
      continue
    variable_key = key[:-len(suffix)] + _KEY_TAIL
    if (dtypes.get(variable_key) in (tf.bfloat16, tf.float16)
        and shapes[variable_key] == shapes[key]):
      out[variable_key] = key
  return out


def set_pending_checkpoint(mesh_impl, prefix: Optional[str],
                           allow_missing: bool = False,
                           include_optimizer_state: bool = True) -> None:
  """Variables created later on `mesh_impl` start from checkpoint `prefix`
  (None: from their initializers).

  Example:
    >>> set_pending_checkpoint(mesh_impl, "/tmp/run/ckpt-100")
  """
  mesh_impl.keeps[PENDING_KEY] = (
      PendingCheckpoint(prefix, allow_missing, include_optimizer_state) if prefix else None)


def set_pending(mesh_impl, pending) -> None:
  """Variables created later on `mesh_impl` start from `pending`: any object
  with a method pending_value(name, full_shape, begin, size, trainable,
  graph) returning a slice value or None (e.g. what a registered checkpoint
  format's restore_into returns, see training.checkpoint)."""
  mesh_impl.keeps[PENDING_KEY] = pending


def _pending_value(mesh_impl, name, full_shape, begin, size, trainable, graph=None,
                   dtype=None):
  pending = mesh_impl.keeps.get(PENDING_KEY)
  if pending is None:
    return None
  if hasattr(pending, "pending_value"):
    return pending.pending_value(name, full_shape, begin, size, trainable, graph)
  if not trainable and not getattr(pending, "include_optimizer_state", True):
    return None
  key = checkpoint_key(name)
  if key not in pending.shapes:
    if trainable and not pending.allow_missing:
      raise ValueError(
          f"Checkpoint {pending.prefix} has no variable {name!r}, which the model "
          "creates. Restore with allow_missing=True to start it from its initializer, "
          "or check the variable names (python -m mesh_tensorflow.inspect_checkpoint "
          f"{pending.prefix}).")
    return None
  saved = pending.shapes[key]
  if saved != list(full_shape):
    raise ValueError(
        f"Checkpoint {pending.prefix} has variable {name!r} with shape {saved}, but the "
        f"model needs {list(full_shape)}.")
  key, saved_dtype = pending.source(name, dtype or pending.dtypes[key])
  return read_slice(pending.prefix, key, full_shape, begin, size, saved_dtype)


def get_or_create(mesh_impl, name: str, shape, master_dtype, slice_dtype,
                  trainable: bool, init_fn: Callable, graph=None) -> SlicedVariable:
  """The SlicedVariable `name` (an mtf Shape `shape`) of mesh_impl, created on
  first use.

  init_fn(begin, slice_shape) gives a slice's initial value (in master dtype)
  unless a pending checkpoint has the variable (set_pending_checkpoint). Creation is lifted out of any
  tf.function (tf.init_scope), so it happens once. `graph` (the mtf Graph
  the variable belongs to) lets a pending checkpoint check all of the
  graph's variables at once.
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
  begins = [mesh_impl.slice_begin(shape, pnum) for pnum in range(mesh_impl.size)]

  def create(pnum):
    begin = begins[pnum]
    with tf.device(mesh_impl.variable_device(pnum)):
      value = _pending_value(mesh_impl, name, full_shape, begin, slice_shape, trainable, graph,
                             master_dtype)
      if value is None:
        value = init_fn(begin, slice_shape)
      return tf.Variable(tf.cast(value, slice_dtype), trainable=trainable,
                         name=f"{name}/slice_{pnum}", **NOT_CAPTURED_BY_TF_FUNCTION)
  with tf.init_scope():  # processors holding the same slice share one variable
    slices = sharing.per_processor([tuple(b) for b in begins], mesh_impl.shares_replicas,
                                   create)
  sliced = SlicedVariable(name, full_shape, master_dtype, begins, slices)
  store[name] = sliced
  return sliced


def scalar_state(mesh_impl, name: str, dtype=tf.int64) -> tf.Variable:
  """A checkpointed scalar (e.g. a step counter) kept on processor 0's device."""
  sliced = get_or_create(mesh_impl, name, Shape([]), dtype, dtype, False,
                         lambda begin, size: tf.zeros([], dtype))
  return mesh_impl.program_slices(sliced)[0]


def next_step_key(mesh_impl) -> tf.Tensor:
  """Increments and returns a per-mesh step counter, so random ops (dropout)
  differ from one execution of the lowered program to the next."""
  counter = scalar_state(mesh_impl, "__mtf_rng_step__", tf.int64)
  return counter.assign_add(1)
