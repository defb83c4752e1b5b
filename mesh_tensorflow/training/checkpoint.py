"""Layout-independent checkpoints of mtf variables.

Every mtf variable (and optimizer slot) is saved as one logical full-shape
tensor, written as the slices the processors hold; restoring reads exactly the
slices the new mesh and layout need. So a run saved on a [2, 4] mesh with
"batch:rows;hidden:cols" restores on [8] with "hidden:all", or on one device.

Saving uses `tf.train.Checkpoint` and `tf.train.CheckpointManager`: the
checkpoint state file is replaced atomically after the data files are complete,
so a run killed during a save leaves the previous checkpoint usable.

Restoring first reads every saved tensor back (mtf.checkpoint_verify): a
damaged or incomplete newest checkpoint is reported in one line and the newest
intact one restored instead; an explicitly chosen damaged one is an error that
names the intact ones. Each save removes what interrupted saves left behind.

Restoring checks every variable against the checkpoint: a trainable variable
the checkpoint lacks, or one saved with another logical shape, is a ValueError
(pass allow_missing=True to start missing ones from their initializers).
Missing non-trainable state (optimizer slots, gradient accumulators, step
counters) starts from its initial value, so a run may switch optimizers.

    >>> manager = mtf.checkpoint.CheckpointManager(mesh_impl, "/tmp/model")
    >>> manager.restore_or_initialize()   # before or after the first trace
    >>> manager.save(step)

List a checkpoint's variables with their logical shapes:

    python -m mesh_tensorflow.inspect_checkpoint /tmp/model
    python -m mesh_tensorflow.inspect_checkpoint --verify /tmp/model
"""

from __future__ import annotations

import copy
import os
import re
from typing import Dict, List, Optional, Protocol, Tuple

import tensorflow as tf

from mesh_tensorflow.training import checkpoint_verify
from mesh_tensorflow.lowering import slice_variables


def resolve(path: str) -> str:
  """The checkpoint prefix of `path`: a prefix, or a directory (its latest
  checkpoint, per its `checkpoint` state file).

  Raises:
    ValueError: naming `path` if it holds no checkpoint.

  Example:
    >>> resolve("/models/t5_small")
    '/models/t5_small/model.ckpt-1000000'
  """
  if tf.io.gfile.isdir(path):
    prefix = tf.train.latest_checkpoint(path)
    if prefix is None:
      raise ValueError(f"No checkpoint in directory {path!r} (no `checkpoint` state file "
                       "naming one).")
    return prefix
  if not tf.io.gfile.exists(path + ".index"):
    raise ValueError(f"No checkpoint at {path!r}: {path}.index does not exist. Give a "
                     "checkpoint prefix such as DIR/model.ckpt-1000 or a model directory.")
  return path


class CheckpointFormat(Protocol):
  """A checkpoint format other than this library's own, which `restore` and
  `list_variables` read once it is registered (`register_format`).

  `mesh_tensorflow.compat.original_checkpoint` registers the name-based TF1
  format when the package is imported.
  """

  def recognizes(self, prefix: str) -> bool:
    """Whether the checkpoint at path prefix `prefix` is in this format."""

  def restore_into(self, variables: Dict[str, slice_variables.SlicedVariable], prefix: str,
                   allow_missing: bool, include_optimizer_state: bool):
    """Checks and assigns the existing `variables` from `prefix`; returns the
    pending source of variables created later (see slice_variables.set_pending)."""

  def list_variables(self, prefix: str) -> List[Tuple[str, List[int], str]]:
    """[(name as saved, shape, dtype name)] of the checkpoint at `prefix`."""


_FORMATS: List[CheckpointFormat] = []


def register_format(checkpoint_format: CheckpointFormat) -> None:
  """Makes `CheckpointManager.restore` and `list_variables` read checkpoints
  that `checkpoint_format` recognizes (checked in registration order, before
  this library's own format).

  Example:
    >>> register_format(MyFormat())
  """
  if checkpoint_format not in _FORMATS:
    _FORMATS.append(checkpoint_format)


def format_of(prefix: str) -> Optional[CheckpointFormat]:
  """The registered format of the checkpoint at `prefix`; None for this
  library's own.

  Example:
    >>> format_of(resolve("/tmp/run")) is None
    True
  """
  for checkpoint_format in _FORMATS:
    if checkpoint_format.recognizes(prefix):
      return checkpoint_format
  return None


class _Variables(tf.Module):
  def __init__(self):
    super().__init__()
    self.variables_by_name = {}


class CheckpointManager:
  """Saves and restores the mtf variables of one or more mesh implementations.

  Args:
    mesh_impls: a MeshImpl or a list of them (one per mesh of the model).
    directory: where checkpoints go.
    max_to_keep: how many recent checkpoints to keep.
    checkpoint_name: file prefix inside `directory`.
    options: tf.train.CheckpointOptions for every save (e.g. write callbacks,
      which run after the data files are written and before the checkpoint
      state file names them).

  Example:
    >>> manager = CheckpointManager(impl, model_dir)
    >>> restored = manager.restore_or_initialize()
    >>> for step in ...: train_step(); manager.save(step)
  """

  def __init__(self, mesh_impls, directory: str, max_to_keep: int = 5,
               checkpoint_name: str = "ckpt",
               options: Optional[tf.train.CheckpointOptions] = None):
    if not isinstance(mesh_impls, (list, tuple)):
      mesh_impls = [mesh_impls]
    self._impls = list(mesh_impls)
    self._directory = directory
    self._checkpoint_name = checkpoint_name
    self._options = options
    self._root = _Variables()
    self._checkpoint = tf.train.Checkpoint(model=self._root)
    self._manager = tf.train.CheckpointManager(
        self._checkpoint, directory, max_to_keep=max_to_keep,
        checkpoint_name=checkpoint_name)

  @property
  def directory(self) -> str:
    return self._directory

  @property
  def latest_checkpoint(self) -> Optional[str]:
    return self._manager.latest_checkpoint

  @property
  def checkpoints(self) -> List[str]:
    return list(self._manager.checkpoints)

  def variables(self) -> Dict[str, slice_variables.SlicedVariable]:
    """{name: SlicedVariable} of every mtf variable created so far, all meshes.

    Example:
      >>> manager.variables()["w1"].numpy().shape
      (64, 256)
    """
    return self._variables()

  def _variables(self) -> Dict[str, slice_variables.SlicedVariable]:
    out = {}
    for impl in self._impls:
      for name, var in slice_variables.variable_store(impl).items():
        if name in out:
          raise ValueError(f"Variable {name!r} exists on two meshes; names must be unique.")
        out[name] = var
    return out

  def save(self, step: int) -> str:
    """Writes checkpoint number `step` (eagerly); returns its path prefix."""
    variables = self._variables()
    if not variables:
      raise ValueError(
          "CheckpointManager.save: no mtf variables exist yet. Trace or run the "
          "lowered step function once before saving.")
    self._root.variables_by_name.update(variables)
    options = None
    if self._options is not None:
      # tf.train.CheckpointManager appends its own callback to the options'
      # callback list: give it a fresh list each time.
      options = copy.copy(self._options)
      options.experimental_write_callbacks = list(
          self._options.experimental_write_callbacks or [])
    path = self._manager.save(checkpoint_number=int(step), options=options)
    checkpoint_verify.clean_leftovers(self._directory, self._checkpoint_name)
    return path

  def restore(self, checkpoint_path: Optional[str] = None, allow_missing: bool = False,
              include_optimizer_state: bool = True, verify: bool = True) -> str:
    """Restores existing variables from a checkpoint (default: the latest) and
    makes variables created later start from it.

    The checkpoint may also be in a registered format (`register_format`,
    detected automatically), such as the name-based TF1 checkpoints of
    mesh_tensorflow/compat/original_checkpoint.py. Then every problem (a model
    variable it lacks, a checkpoint variable nothing takes, a shape
    mismatch) is listed in one ValueError.

    Args:
      checkpoint_path: a checkpoint path prefix (e.g. ".../ckpt-100") or a
        model directory (its latest checkpoint); None for the latest in this
        manager's directory.
      allow_missing: let trainable variables that the checkpoint lacks keep (or
        start from) their initial values instead of raising.
      include_optimizer_state: False: optimizer slots, the step and other
        non-trainable state keep (or start from) their initial values, e.g.
        to fine-tune from a pretrained checkpoint.
      verify: read every saved tensor back first (see mtf.checkpoint_verify):
        a damaged checkpoint_path raises, a damaged latest checkpoint is
        reported and the newest intact one restored instead.

    Returns:
      The checkpoint path restored.

    Raises:
      ValueError: if there is no (intact) checkpoint, or a trainable variable is missing
        from it (unless allow_missing), or a variable has another shape. For
        variables created later, the error comes when they are created (when
        the step function is first traced).

    Example:
      >>> manager.restore()                     # latest, before or after tracing
      >>> manager.restore(".../ckpt-100", allow_missing=True)
    """
    if checkpoint_path:
      checkpoint_path = resolve(checkpoint_path)
    if verify:
      # A directory written by other tools (a TF1 Saver's model.ckpt-N) has a
      # latest checkpoint that tf.train.CheckpointManager does not list as its own.
      candidates = self.checkpoints or (
          [self.latest_checkpoint] if self.latest_checkpoint else [])
      path = checkpoint_verify.choose(self._directory, checkpoint_path, candidates)
    else:
      path = checkpoint_path or self.latest_checkpoint
    if not path:
      raise ValueError(f"No checkpoint found in {self._directory!r}.")
    path = resolve(path)
    checkpoint_format = format_of(path)
    if checkpoint_format is not None:
      pending = checkpoint_format.restore_into(self._variables(), path, allow_missing,
                                               include_optimizer_state)
      for impl in self._impls:
        slice_variables.set_pending(impl, pending)
      return path
    try:
      pending = slice_variables.PendingCheckpoint(path, allow_missing,
                                                  include_optimizer_state)
    except (tf.errors.NotFoundError, tf.errors.DataLossError) as e:
      raise ValueError(f"Cannot read checkpoint {path!r}: {e}") from e
    variables = self._variables()
    for name, var in variables.items():  # Check everything before assigning anything.
      key = slice_variables.checkpoint_key(name)
      if key not in pending.shapes:
        if allow_missing or not var.trainable:
          continue
        raise ValueError(
            f"Checkpoint {path} has no variable {name!r}. Pass allow_missing=True to "
            "keep its initial value, or list the checkpoint's variables with "
            f"python -m mesh_tensorflow.inspect_checkpoint {path}.")
      if pending.shapes[key] != var.full_shape:
        raise ValueError(
            f"Checkpoint {path} has variable {name!r} with shape {pending.shapes[key]}; "
            f"the model needs {var.full_shape}.")
    for name, var in variables.items():
      key = slice_variables.checkpoint_key(name)
      if key in pending.shapes and (include_optimizer_state or var.trainable):
        var.restore_from(path, *pending.source(name, var.master_dtype))
    for impl in self._impls:
      slice_variables.set_pending_checkpoint(impl, path, allow_missing,
                                             include_optimizer_state)
    return path

  def restore_or_initialize(self, checkpoint_path: Optional[str] = None) -> Optional[str]:
    """Restores `checkpoint_path`, else the newest intact checkpoint if there
    is one (see `restore`); returns its path (None: nothing to restore)."""
    if checkpoint_path or self.latest_checkpoint:
      return self.restore(checkpoint_path)
    return None


def _unescape(escaped: str) -> str:
  """Inverse of the checkpoint key escaping ("." -> "..", "/" -> ".S")."""
  return re.sub(r"\.(.)", lambda m: "/" if m.group(1) == "S" else m.group(1), escaped)


def list_variables(checkpoint: str) -> List[Tuple[str, List[int], str]]:
  """[(mtf variable name, logical shape, dtype)] of a checkpoint (a path prefix
  or a directory, meaning its latest checkpoint).

  Example:
    >>> list_variables("/tmp/run")
    [('b1', [1024], 'float32'), ('global_step', [], 'int64'), ('w1', [8, 8, 1024], ...)]
  """
  path = checkpoint
  if os.path.isdir(checkpoint):
    path = tf.train.latest_checkpoint(checkpoint)
    if path is None:
      raise ValueError(f"No checkpoint in directory {checkpoint!r}.")
  try:
    reader = tf.train.load_checkpoint(path)
  except (tf.errors.OpError, ValueError) as e:
    raise ValueError(f"Cannot read checkpoint {path!r}: {e}") from e
  dtypes = reader.get_variable_to_dtype_map()
  prefix, suffix = "model/variables_by_name/", "/.ATTRIBUTES/value"
  checkpoint_format = format_of(path)
  if checkpoint_format is not None:
    return checkpoint_format.list_variables(path)
  out = []
  for key, shape in reader.get_variable_to_shape_map().items():
    if key.startswith(prefix) and key.endswith(suffix):
      name = _unescape(key[len(prefix):-len(suffix)])
      out.append((name, list(shape), dtypes[key].name))
  return sorted(out)

from mesh_tensorflow.core import autograph_exempt as _autograph_exempt  # noqa: E402  pylint: disable=g-import-not-at-top
_autograph_exempt.exempt(globals())  # AutoGraph leaves this module's code alone
