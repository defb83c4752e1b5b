"""Checkpoints in the original Mesh TensorFlow's format: reading them into
this library's models, and writing this library's checkpoints in it.

The original (TF1, Estimator) saved a name-based checkpoint: a `checkpoint`
state file and `model.ckpt-N.index` / `.data-*`, every variable full-size
under its mtf name (`encoder/block_000/layer_000/SelfAttention/q`), optimizer
slots as `<variable>_slot_<slot>` and the step as `global_step` (int64).
The transformer's variables here carry the same names; two things differ:

* attention weights are 3-D here, `q`, `k`, `v`, `kv` [d_model, heads, d_kv]
  and `o` [heads, d_kv, d_model], and 2-D there, [d_model, heads * d_kv] and
  [heads * d_kv, d_model] (heads-major, so the two are one reshape apart);
* Adafactor's factored second moments: the original's `X_slot_vr` is the
  variable's shape without its largest dimension and `X_slot_vc` without
  the second largest, so they are this library's `X/adafactor_vc` and
  `X/adafactor_vr` (`X_slot_v` and `X_slot_m` are `X/adafactor_v` and
  `X/adafactor_m`).

Reading is per slice: each processor's slice is read with RestoreV2's
shape-and-slice (for a converted weight, the contiguous 2-D range that
covers the slice, then reshaped and cut), so no processor ever holds a
whole tensor. Importing `mesh_tensorflow` registers the format with
`mesh_tensorflow.training.checkpoint` (`register_format`), so
`CheckpointManager.restore` detects it and calls `restore_into`; use it rather
than these functions:

    >>> manager = mtf.checkpoint.CheckpointManager(mesh_impl, "/tmp/new_run")
    >>> manager.restore("/path/to/t5_model_dir", include_optimizer_state=False)

Writing (`export`, or `python -m mesh_tensorflow.export_original_checkpoint`)
assembles one variable at a time on the host; it is an offline tool.
"""

from __future__ import annotations

import os
import re
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf
from absl import logging

from mesh_tensorflow.lowering import slice_variables
from mesh_tensorflow.training import checkpoint as checkpoint_lib
from mesh_tensorflow.training.checkpoint import resolve

GLOBAL_STEP = "global_step"
# This library's Adafactor slot -> the original's slot suffix.
SLOT_TO_ORIGINAL = {"adafactor_vr": "_slot_vc", "adafactor_vc": "_slot_vr",
                    "adafactor_v": "_slot_v", "adafactor_m": "_slot_m"}
_ORIGINAL_SLOT = re.compile(r"^(.*)_slot_(vr|vc|v|m)$")
_OUR_SLOT = re.compile(r"^(.*)/(adafactor_vr|adafactor_vc|adafactor_v|adafactor_m)$")
_ATTENTION_WEIGHT = re.compile(r"Attention[^/]*/(q|k|v|kv|o)$")
_OUR_FORMAT_PREFIX = "model/variables_by_name/"


# ------------------------------------------------------------------ formats
def _index(prefix: str) -> Dict[str, Tuple[List[int], tf.DType]]:
  try:
    reader = tf.train.load_checkpoint(prefix)
  except (tf.errors.NotFoundError, tf.errors.DataLossError, ValueError) as e:
    raise ValueError(f"Cannot read checkpoint {prefix!r}: {e}") from e
  dtypes = reader.get_variable_to_dtype_map()
  return {k: (list(v), dtypes[k]) for k, v in reader.get_variable_to_shape_map().items()}


def is_original_format(prefix: str) -> bool:
  """Whether checkpoint `prefix` is name-based (the original's format) rather
  than this library's object-based one.

  Example:
    >>> is_original_format(resolve("/models/t5_small"))
    True
  """
  return not any(k.startswith(_OUR_FORMAT_PREFIX) for k in _index(prefix))


# -------------------------------------------------------- shape conversion
def merged_axis(name: str, shape: Sequence[int]) -> Optional[int]:
  """The axis i whose dimensions i and i+1 are one dimension in the
  original's checkpoint (3-D attention weights), or None.

  Example:
    >>> merged_axis("encoder/block_000/layer_000/SelfAttention/q", [512, 8, 64])
    1
    >>> merged_axis("encoder/block_000/layer_000/SelfAttention/o", [8, 64, 512])
    0
  """
  m = _ATTENTION_WEIGHT.search(name)
  if m is None or len(shape) != 3:
    return None
  return 0 if m.group(1) == "o" else 1


def original_shape(shape: Sequence[int], axis: Optional[int]) -> List[int]:
  """`shape` with dimensions axis and axis+1 merged (unchanged if None)."""
  shape = list(shape)
  if axis is None:
    return shape
  return shape[:axis] + [shape[axis] * shape[axis + 1]] + shape[axis + 2:]


def _read_merged(prefix: str, key: str, dtype, shape: Sequence[int], axis: Optional[int],
                 begin: Sequence[int], size: Sequence[int]) -> tf.Tensor:
  """Slice [begin, begin + size) of a variable of (this library's) `shape`
  stored merged along `axis`: reads the contiguous range that covers it."""
  if axis is None:
    return slice_variables.read_slice(prefix, key, shape, begin, size, dtype)
  inner = shape[axis + 1]
  disk_begin = list(begin[:axis]) + [begin[axis] * inner] + list(begin[axis + 2:])
  disk_size = list(size[:axis]) + [size[axis] * inner] + list(size[axis + 2:])
  value = slice_variables.read_slice(prefix, key, original_shape(shape, axis), disk_begin,
                                     disk_size, dtype)
  value = tf.reshape(value, list(size[:axis]) + [size[axis], inner] + list(size[axis + 2:]))
  if size[axis + 1] == inner:
    return value
  start = [0] * len(shape)
  start[axis + 1] = begin[axis + 1]
  return tf.slice(value, start, list(size))


def _factored_axes(shape: Sequence[int]) -> Tuple[int, int]:
  """(axis of the largest, axis of the second largest) dimension; ties: the
  earlier axis counts larger (both libraries' rule)."""
  order = sorted(range(len(shape)), key=lambda i: -shape[i])
  return order[0], order[1]


# ------------------------------------------------------------ the mapping
class _Source:
  """How one model variable is read from the checkpoint."""

  def __init__(self, key: str, dtype, base_shape: List[int], axis: Optional[int],
               reduce_axis: Optional[int] = None):
    self.key, self.dtype, self.base_shape = key, dtype, base_shape
    self.axis, self.reduce_axis = axis, reduce_axis

  def read(self, prefix: str, begin: Sequence[int], size: Sequence[int]) -> tf.Tensor:
    if self.reduce_axis is None:
      return _read_merged(prefix, self.key, self.dtype, self.base_shape, self.axis, begin,
                          size)
    # A factored slot derived from the full second moment: its mean over the
    # reduced axis (exact: the moments are running means of squares).
    r = self.reduce_axis
    begin = list(begin[:r]) + [0] + list(begin[r:])
    size = list(size[:r]) + [self.base_shape[r]] + list(size[r:])
    value = _read_merged(prefix, self.key, self.dtype, self.base_shape, self.axis, begin,
                         size)
    return tf.reduce_mean(tf.cast(value, tf.float32), axis=r)


def _norm_alternatives(name: str) -> List[str]:
  """Older spellings of a norm's name in published checkpoints."""
  out = []
  m = re.match(r"^(.*)/(rms_norm|layer_norm|final_layer_norm)/scale$", name)
  if m is None:
    return out
  head, kind = m.groups()
  in_layer = re.search(r"(^|/)layer_\d+$", head) is not None
  if kind == "rms_norm":
    out.append(f"{head}/{'layer_norm' if in_layer else 'final_layer_norm'}/scale")
  else:
    out.append(f"{head}/rms_norm/scale")
  return out


class Plan:
  """The mapping of a model's variables onto one original-format checkpoint.

  Args:
    prefix: the checkpoint prefix.
    allow_missing: trainable variables the checkpoint lacks start from their
      initializers instead of being an error.
    include_optimizer_state: restore optimizer slots and the step; False
      ignores them (fine-tuning starts afresh).

  Example:
    >>> plan = Plan(resolve(model_dir))
    >>> plan.check([("shared/embedding", [32128, 512], True)])
  """

  def __init__(self, prefix: str, allow_missing: bool = False,
               include_optimizer_state: bool = True):
    self.prefix = prefix
    self.index = _index(prefix)
    self.allow_missing = allow_missing
    self.include_optimizer_state = include_optimizer_state
    self.skipped: Dict[str, str] = {}  # slot variable -> why it starts from zeros
    self._shapes: Dict[str, List[int]] = {}  # model variable -> shape (for slots)
    self._checked_graphs = set()

  # ---- one variable
  def base_key(self, name: str) -> Optional[str]:
    for candidate in [name] + _norm_alternatives(name):
      if candidate in self.index:
        return candidate
    return None

  def source(self, name: str, shape: Sequence[int]) -> Tuple[Optional[_Source], str]:
    """(source, "") or (None, why): "missing", "mismatch: ...", "slot: ...",
    "optimizer state" (not restored), "step"."""
    shape = list(shape)
    if name == GLOBAL_STEP:
      if not self.include_optimizer_state:
        return None, "optimizer state"
      if GLOBAL_STEP in self.index and self.index[GLOBAL_STEP][0] == shape:
        return _Source(GLOBAL_STEP, self.index[GLOBAL_STEP][1], shape, None), ""
      return None, "step"
    slot = _OUR_SLOT.match(name)
    if slot is not None:
      if not self.include_optimizer_state:
        return None, "optimizer state"
      return self._slot_source(slot.group(1), slot.group(2), shape)
    key = self.base_key(name)
    if key is None:
      return None, "missing"
    axis = merged_axis(name, shape)
    want = original_shape(shape, axis)
    have, dtype = self.index[key]
    if have != want:
      return None, (f"mismatch: checkpoint {key!r} is {have}, the model's {name!r} "
                    f"{shape} needs {want}")
    return _Source(key, dtype, shape, axis), ""

  def _slot_source(self, base: str, slot: str, shape: List[int]):
    base_key = self.base_key(base)
    if base_key is None:
      return None, "slot: the checkpoint has no variable " + repr(base)
    base_disk = self.index[base_key][0]
    if slot in ("adafactor_v", "adafactor_m"):  # the variable's own shape
      key = base_key + SLOT_TO_ORIGINAL[slot]
      axis = merged_axis(base, shape)
      if key in self.index and self.index[key][0] == original_shape(shape, axis) == base_disk:
        return _Source(key, self.index[key][1], shape, axis), ""
      return None, (f"slot: the checkpoint has no {key!r} of shape "
                    f"{original_shape(shape, axis)} (the original factored this "
                    "variable's second moment otherwise)")
    key = base_key + SLOT_TO_ORIGINAL[slot]
    if key in self.index and self.index[key][0] == shape:
      return _Source(key, self.index[key][1], shape, None), ""
    base_shape = self._shapes.get(base)
    full_key = base_key + "_slot_v"
    if full_key in self.index and base_shape is not None and len(base_shape) >= 2:
      axis = merged_axis(base, base_shape)
      largest, second = _factored_axes(base_shape)
      reduce_axis = second if slot == "adafactor_vr" else largest
      if (self.index[full_key][0] == original_shape(base_shape, axis)
          and [d for i, d in enumerate(base_shape) if i != reduce_axis] == shape):
        return _Source(full_key, self.index[full_key][1], base_shape, axis, reduce_axis), ""
    return None, (f"slot: the checkpoint's second moments of {base_key!r} are factored "
                  "otherwise (or absent)")

  # ---- the whole model
  def check(self, variables: Iterable[Tuple[str, Sequence[int], bool]]) -> None:
    """Raises one ValueError listing every model variable the checkpoint lacks
    (trainable ones, unless allow_missing), every checkpoint variable no
    model variable takes and every shape mismatch; logs the optimizer slots
    that start from zeros.

    Args:
      variables: (name, full shape, trainable) of every model variable.
    """
    variables = [(n, list(s), bool(t)) for n, s, t in variables]
    self._shapes.update({n: s for n, s, _ in variables})
    missing, mismatched, used = [], [], {GLOBAL_STEP}
    for name, shape, trainable in variables:
      source, why = self.source(name, shape)
      if source is not None:
        used.add(source.key)
      elif why == "missing":
        if trainable and not self.allow_missing:
          missing.append(name)
      elif why.startswith("mismatch"):
        mismatched.append(why[len("mismatch: "):])
        used.add(self.base_key(name))
      elif why.startswith("slot"):
        self.skipped[name] = why[len("slot: "):]
    bases = {self.base_key(n) for n, _, _ in variables if not _OUR_SLOT.match(n)} - {None}
    unmapped = []
    for key in sorted(self.index):
      if key in used:
        continue
      slot = _ORIGINAL_SLOT.match(key)
      if slot is not None and slot.group(1) in bases:
        continue  # a slot of a model variable, restored or reported
      unmapped.append(key)
    problems = []
    if missing:
      problems.append(f"{len(missing)} model variable(s) the checkpoint lacks: "
                      f"{', '.join(missing)} (restore with allow_missing=True to start them "
                      "from their initializers)")
    if unmapped:
      problems.append(f"{len(unmapped)} checkpoint variable(s) no model variable takes: "
                      f"{', '.join(unmapped)}")
    if mismatched:
      problems.append(f"{len(mismatched)} shape mismatch(es): {'; '.join(mismatched)}")
    if missing and unmapped:
      ours = sorted({n.split("/")[0] for n in missing})
      theirs = sorted({k.split("/")[0] for k in unmapped})
      if not set(ours) & set(theirs):
        problems.append(f"the model's missing variables are under {ours} and the "
                        f"checkpoint's unused ones under {theirs}: name the stacks alike "
                        "(e.g. Unitransformer.name = 'transformer' for the original's "
                        "language models)")
    if problems:
      raise ValueError(f"Checkpoint {self.prefix} (the original Mesh TensorFlow's format) "
                       "does not fit the model: " + " | ".join(problems) + ". List its "
                       "variables with python -m mesh_tensorflow.inspect_checkpoint "
                       f"{self.prefix}.")
    for name, why in sorted(self.skipped.items()):
      logging.warning("Optimizer slot %s starts from zeros: %s.", name, why)

  def check_graph(self, graph) -> None:
    """`check` over the variables of an mtf Graph, once per graph."""
    if id(graph) in self._checked_graphs:
      return
    self._checked_graphs.add(id(graph))
    self.check([(v.name, v.shape.to_integer_list(), v.trainable)
                for v in graph.all_variables])

  # ---- the hook slice_variables calls for variables created later
  def pending_value(self, name: str, full_shape, begin, size, trainable: bool,
                    graph=None) -> Optional[tf.Tensor]:
    """The checkpoint's slice for a variable being created, or None (start
    from the initializer)."""
    if graph is not None:
      self.check_graph(graph)
    source, why = self.source(name, full_shape)
    if source is not None:
      return source.read(self.prefix, begin, size)
    if why == "missing" and trainable and not self.allow_missing:
      raise ValueError(
          f"Checkpoint {self.prefix} has no variable {name!r}, which the model creates. "
          "Restore with allow_missing=True to start it from its initializer, or list the "
          f"checkpoint's variables with python -m mesh_tensorflow.inspect_checkpoint "
          f"{self.prefix}.")
    if why.startswith("mismatch"):
      raise ValueError(f"Checkpoint {self.prefix}: {why[len('mismatch: '):]}.")
    return None


def restore_into(variables: Dict[str, "slice_variables.SlicedVariable"], prefix: str,
                 allow_missing: bool = False, include_optimizer_state: bool = True) -> Plan:
  """Checks existing variables against original-format checkpoint `prefix`
  (one ValueError listing every problem), then assigns each slice from it.

  Returns:
    the Plan, for variables created later (see `set_pending`).

  Example:
    >>> plan = restore_into(manager.variables(), resolve(model_dir))
  """
  plan = Plan(prefix, allow_missing, include_optimizer_state)
  if any(v.trainable for v in variables.values()):  # a traced model: check it whole
    plan.check([(n, v.full_shape, v.trainable) for n, v in variables.items()])
  # Else (restored before the first trace) each graph is checked as it is
  # lowered, over all its variables (pending_value).
  for name, var in variables.items():
    source, _ = plan.source(name, var.full_shape)
    if source is None:
      continue
    for begin, size, v in var.unique_slices():
      with tf.device(v.device):
        v.assign(tf.cast(source.read(prefix, begin, size), v.dtype))
  return plan


class OriginalFormat:
  """The name-based format as a `training.checkpoint.CheckpointFormat`: what
  `CheckpointManager.restore` and `checkpoint.list_variables` use for it.

  Example:
    >>> OriginalFormat().recognizes(resolve("/models/t5_small"))
    True
  """

  def recognizes(self, prefix: str) -> bool:
    return is_original_format(prefix)

  def restore_into(self, variables, prefix: str, allow_missing: bool,
                   include_optimizer_state: bool) -> Plan:
    return restore_into(variables, prefix, allow_missing, include_optimizer_state)

  def list_variables(self, prefix: str) -> List[Tuple[str, List[int], str]]:
    return sorted((name, shape, dtype.name) for name, (shape, dtype) in _index(prefix).items())

  def __eq__(self, other) -> bool:
    return isinstance(other, OriginalFormat)

  def __hash__(self) -> int:
    return hash(OriginalFormat)


checkpoint_lib.register_format(OriginalFormat())


# ------------------------------------------------------------------ writing
def original_variables(checkpoint: str, include_optimizer_state: bool = True,
                       min_dim_size_to_factor: int = 128
                       ) -> List[Tuple[str, np.ndarray]]:
  """[(original name, full value)] of one of this library's checkpoints, as
  the original would have saved them (attention weights 2-D, Adafactor slots
  renamed; full second moments `X/adafactor_v` of variables the original
  factors become its `X_slot_vr` / `X_slot_vc` means). Values keep the
  saved dtype; slots that cannot be expressed are dropped with a warning.

  Example:
    >>> dict(original_variables("/tmp/run"))["shared/embedding"].shape
    (32128, 512)
  """
  prefix = resolve(checkpoint)
  if is_original_format(prefix):
    raise ValueError(f"{prefix} is already in the original's format.")
  reader = tf.train.load_checkpoint(prefix)
  values = {}
  suffix = "/.ATTRIBUTES/value"
  for key in reader.get_variable_to_shape_map():
    if key.startswith(_OUR_FORMAT_PREFIX) and key.endswith(suffix):
      name = _unescape(key[len(_OUR_FORMAT_PREFIX):-len(suffix)])
      values[name] = reader.get_tensor(key)
  out = []
  for name in sorted(values):
    value = values[name]
    slot = _OUR_SLOT.match(name)
    if name == GLOBAL_STEP or name.startswith("__"):
      continue  # the step is written by `write`; "__..." are this library's own state
    if slot is None:
      out.append((name, _to_original(name, value)))
      continue
    if not include_optimizer_state:
      continue
    base, kind = slot.groups()
    if base not in values:
      logging.warning("Dropping slot %s: its variable %s is not in the checkpoint.", name,
                      base)
      continue
    base_shape = list(values[base].shape)
    disk = original_shape(base_shape, merged_axis(base, base_shape))
    factors = len(disk) >= 2 and sorted(disk)[-2] >= min_dim_size_to_factor
    if kind == "adafactor_m":
      out.append((base + "_slot_m", _to_original(base, value)))
    elif kind == "adafactor_v":
      full = _to_original(base, value)
      if not factors:
        out.append((base + "_slot_v", full))
      else:  # the original's factored moments are exact means of the full one
        largest, second = _factored_axes(disk)
        out.append((base + "_slot_vr", full.mean(axis=largest).astype(full.dtype)))
        out.append((base + "_slot_vc", full.mean(axis=second).astype(full.dtype)))
    else:
      largest, second = _factored_axes(disk) if len(disk) >= 2 else (None, None)
      removed = second if kind == "adafactor_vr" else largest
      want = [d for i, d in enumerate(disk) if i != removed]
      if factors and list(value.shape) == want:
        out.append((base + SLOT_TO_ORIGINAL[kind], value))
      else:
        logging.warning("Dropping slot %s: the original factors %s %s otherwise.", name,
                        base, disk)
  return out


def saved_master_dtype(prefix: str) -> Optional[tf.DType]:
  """The one dtype of the floating model variables (not optimizer slots) of
  a checkpoint in either format, or None (none, or several).

  Example:
    >>> saved_master_dtype("/models/t5_small/model.ckpt-1000000")
    tf.bfloat16
  """
  dtypes = set()
  for key, dtype in tf.train.load_checkpoint(prefix).get_variable_to_dtype_map().items():
    if key.startswith(_OUR_FORMAT_PREFIX):
      name = _unescape(key[len(_OUR_FORMAT_PREFIX):].rsplit("/.ATTRIBUTES/", 1)[0])
      if _OUR_SLOT.match(name):
        continue
    elif "/" in key and _ORIGINAL_SLOT.match(key):
      continue
    else:
      name = key
    if dtype.is_floating and name != GLOBAL_STEP and not name.startswith("__") and \
        "/" in name:
      dtypes.add(dtype)
  return dtypes.pop() if len(dtypes) == 1 else None


def saved_step(checkpoint: str) -> int:
  """The `global_step` saved in one of this library's checkpoints (else the
  number its prefix ends with, else 0).

  Example:
    >>> saved_step("/tmp/run")
    1000
  """
  prefix = resolve(checkpoint)
  reader = tf.train.load_checkpoint(prefix)
  key = slice_variables.checkpoint_key(GLOBAL_STEP)
  if reader.has_tensor(key):
    return int(reader.get_tensor(key))
  return _step_of(prefix)


def _step_of(prefix: str) -> int:
  m = re.search(r"-(\d+)$", prefix)
  return int(m.group(1)) if m else 0


def _unescape(escaped: str) -> str:
  return re.sub(r"\.(.)", lambda m: "/" if m.group(1) == "S" else m.group(1), escaped)


def _to_original(name: str, value: np.ndarray) -> np.ndarray:
  return value.reshape(original_shape(value.shape, merged_axis(name, value.shape)))


# The original's AdafactorOptimizer keeps its slots in float32 whatever the
# master dtype (its restore refuses another dtype).
ORIGINAL_SLOT_DTYPE = tf.float32


def write(variables: Sequence[Tuple[str, np.ndarray]], output_dir: str, step: int,
          dtype=None, slot_dtype=None) -> str:
  """Writes `variables` as a name-based checkpoint OUTPUT_DIR/model.ckpt-STEP
  with a `checkpoint` state file; floating model variables are cast to
  `dtype` and floating Adafactor slots (`..._slot_v` etc.) to `slot_dtype`
  (None: kept), `global_step` is int64. Returns the prefix.

  Example:
    >>> write([("shared/embedding", table)], "/tmp/export", 1000, tf.bfloat16)
    '/tmp/export/model.ckpt-1000'
  """
  tf.io.gfile.makedirs(output_dir)
  prefix = os.path.join(output_dir, f"model.ckpt-{int(step)}")
  names, tensors = [GLOBAL_STEP], [tf.constant(int(step), tf.int64)]
  for name, value in variables:
    if name == GLOBAL_STEP:
      continue
    t = tf.convert_to_tensor(value)
    cast_to = slot_dtype if _ORIGINAL_SLOT.match(name) else dtype
    if cast_to is not None and t.dtype.is_floating:
      t = tf.cast(t, cast_to)
    names.append(name)
    tensors.append(t)
  tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(names),
                    tensors=tensors)
  # The state file names the prefix relative to the directory, as TF1's
  # Saver writes it; written aside and renamed, so readers never see half.
  base = os.path.basename(prefix)
  state = os.path.join(output_dir, "checkpoint")
  with tf.io.gfile.GFile(state + ".tmp", "w") as f:
    f.write(f'model_checkpoint_path: "{base}"\nall_model_checkpoint_paths: "{base}"\n')
  tf.io.gfile.rename(state + ".tmp", state, overwrite=True)
  return prefix


def export(checkpoint: str, output_dir: str, dtype=None, step: Optional[int] = None,
           include_optimizer_state: bool = True,
           min_dim_size_to_factor: int = 128, slot_dtype=ORIGINAL_SLOT_DTYPE) -> str:
  """Writes one of this library's checkpoints (a prefix or a directory: its
  latest) in the original's format; returns the new prefix.

  By default the model variables keep the saved dtype, which is the master
  dtype the run trained with (`get_variable_dtype.master_dtype`: bfloat16
  for the original's configs, which take its default; see
  `utils.run`), and the Adafactor slots are float32 as the original keeps
  them, so the original restores the export unchanged.

  Args:
    checkpoint: this library's checkpoint prefix or model directory.
    output_dir: where model.ckpt-STEP.* and the `checkpoint` file go.
    dtype: the dtype of floating model variables (e.g. tf.bfloat16); None
      keeps the saved one.
    slot_dtype: the dtype of floating Adafactor slots (default float32, the
      original's); None keeps the saved one.
    step: the step number (default: the checkpoint's `global_step`, else
      the number in its name).
    include_optimizer_state: also write the Adafactor slots.
    min_dim_size_to_factor: the original AdafactorOptimizer's setting, for
      slots converted from unfactored second moments.

  Example:
    >>> export("/tmp/run", "/tmp/run_original", dtype=tf.bfloat16)
    '/tmp/run_original/model.ckpt-1000'
  """
  variables = original_variables(checkpoint, include_optimizer_state,
                                 min_dim_size_to_factor)
  if step is None:
    step = saved_step(checkpoint)
  return write(variables, output_dir, step, dtype, slot_dtype)
