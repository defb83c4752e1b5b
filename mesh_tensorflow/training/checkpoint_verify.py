"""Checking checkpoints before restoring them, and cleaning up after saves.

A checkpoint is a path prefix ("/run/ckpt-40") with an index file
("ckpt-40.index") and data files ("ckpt-40.data-00000-of-00001").
`verify` reads the index and every saved tensor (every slice) back, so a
truncated, overwritten or deleted file is found before any variable is
assigned: TensorFlow checks each tensor's CRC32C when it reads it. The result
is one line naming the file and what is wrong.

`choose` picks what `CheckpointManager.restore` restores:

* an explicit checkpoint (`run.checkpoint_path`, `--checkpoint_path`) is
  restored if intact; if damaged, the run stops with a `CheckpointError` that
  names the intact checkpoints of the directory;
* otherwise the newest intact checkpoint of the directory: a damaged newer one
  is reported in one line (`warning: ...`) and skipped. Nothing is deleted.

`clean_leftovers` removes what interrupted saves leave behind (`ckpt-N_temp/`
directories, data files without an index); CheckpointManager.save calls it
after every successful save.

    >>> verify("/tmp/run/ckpt-40")          # None: intact
    >>> verify("/tmp/run/ckpt-50")
    "/tmp/run/ckpt-50.data-00000-of-00001 is truncated or damaged (...)"
    >>> choose("/tmp/run", None, ["/tmp/run/ckpt-40", "/tmp/run/ckpt-50"])
    '/tmp/run/ckpt-40'
"""

from __future__ import annotations

import os
import re
import sys
from typing import Callable, List, Optional, Sequence

import tensorflow as tf

CHECKPOINT_PATH_SETTING = "--checkpoint_path (gin: run.checkpoint_path)"

_DATA_FILE = re.compile(r"^(?P<prefix>.*)\.data-(?P<shard>\d{5})-of-(?P<count>\d{5})$")


class CheckpointError(ValueError):
  """A checkpoint that cannot be restored (damaged, incomplete, or none)."""


def _warn(line: str) -> None:
  print(f"warning: {line}", file=sys.stderr, flush=True)


def _first_line(error: Exception) -> str:
  text = getattr(error, "message", None) or str(error)
  text = text.strip().splitlines()[0] if text.strip() else type(error).__name__
  return text.split("\n")[0].strip()


def _exists(path: str) -> bool:
  return tf.io.gfile.exists(path)


def _glob(pattern: str) -> List[str]:
  return sorted(tf.io.gfile.glob(pattern))


def _data_files(prefix: str) -> List[str]:
  return [p for p in _glob(prefix + ".data-*-of-*") if _DATA_FILE.match(p)]


def _missing_shards(prefix: str) -> List[str]:
  """Data file names the index's shard count calls for but that are absent."""
  present = _data_files(prefix)
  counts = {int(_DATA_FILE.match(p).group("count")) for p in present}
  if not present:
    return [f"{prefix}.data-00000-of-*"]
  count = max(counts)
  names = [f"{prefix}.data-{i:05d}-of-{count:05d}" for i in range(count)]
  return [n for n in names if not _exists(n)]


def _which_data_file(prefix: str, message: str) -> str:
  """The data file an error is about (named in the message), else the data
  files of the checkpoint."""
  for path in _data_files(prefix):
    if os.path.basename(path) in message:
      return path
  files = _data_files(prefix)
  if len(files) == 1:
    return files[0]
  return f"{prefix}.data-*"


def verify(prefix: str) -> Optional[str]:
  """None if checkpoint `prefix` is complete and every tensor reads back
  with a matching checksum; else one line naming the file and the fault.

  Reads every tensor once, so it takes about as long as a restore.

  Example:
    >>> verify("/tmp/run/ckpt-40") is None
    True
  """
  index = prefix + ".index"
  if not _exists(index):
    return f"{index} is missing (the checkpoint is incomplete)"
  if tf.io.gfile.stat(index).length == 0:
    return f"{index} is empty (the checkpoint is incomplete)"
  missing = _missing_shards(prefix)
  if missing:
    return f"{missing[0]} is missing (the checkpoint is incomplete)"
  try:
    reader = tf.train.load_checkpoint(prefix)
    shapes = reader.get_variable_to_shape_map()
  except Exception as e:  # pylint: disable=broad-except
    return f"{index} is damaged and cannot be read ({_first_line(e)})"
  for key in sorted(shapes):
    try:
      reader.get_tensor(key)
    except Exception as e:  # pylint: disable=broad-except
      # The reader raises OpErrors, and IndexError for short reads.
      detail = _first_line(e)
      return (f"{_which_data_file(prefix, detail)} is truncated or damaged: tensor "
              f"{key!r} does not read back ({detail})")
  return None


def intact(prefixes: Sequence[str]) -> List[str]:
  """The checkpoints among `prefixes` that `verify` passes, in order.

  Example:
    >>> intact(["/tmp/run/ckpt-30", "/tmp/run/ckpt-40"])
    ['/tmp/run/ckpt-30']
  """
  return [p for p in prefixes if verify(p) is None]


def _names(prefixes: Sequence[str]) -> str:
  return ", ".join(prefixes) if prefixes else "none"


def choose(directory: str, checkpoint_path: Optional[str], checkpoints: Sequence[str],
           warn: Callable[[str], None] = _warn) -> Optional[str]:
  """The checkpoint to restore: `checkpoint_path` if given (it must be
  intact), else the newest intact one of `checkpoints` (oldest first, as
  tf.train.CheckpointManager lists them); None if there are none.

  Raises:
    CheckpointError: if checkpoint_path is damaged or missing, or every
      checkpoint of the directory is damaged. The message names the intact
      checkpoints and the setting that picks one.

  Example:
    >>> choose("/tmp/run", None, manager.checkpoints)
    '/tmp/run/ckpt-40'
  """
  checkpoints = list(checkpoints)
  if checkpoint_path:
    problem = verify(checkpoint_path)
    if problem is None:
      return checkpoint_path
    others = [p for p in checkpoints if p != checkpoint_path]
    raise CheckpointError(
        f"cannot restore checkpoint {checkpoint_path}: {problem}. Intact checkpoints in "
        f"{directory}: {_names(intact(others))}; pick one with {CHECKPOINT_PATH_SETTING}.")
  damaged = []
  for prefix in reversed(checkpoints):
    problem = verify(prefix)
    if problem is None:
      if damaged:
        warn(f"restoring {prefix}, the newest intact checkpoint, instead (the damaged "
             "files are left as they are)")
      return prefix
    damaged.append(prefix)
    warn(f"checkpoint {prefix} is damaged: {problem}")
  if damaged:
    raise CheckpointError(
        f"no intact checkpoint in {directory}: {_names(list(reversed(damaged)))} are all "
        f"damaged. Start over with --fresh (deletes them) or another --model_dir, or pick a "
        f"checkpoint from elsewhere with {CHECKPOINT_PATH_SETTING}.")
  return None


def clean_leftovers(directory: str, checkpoint_name: str = "ckpt") -> List[str]:
  """Removes what interrupted saves left in `directory`: temporary
  `<name>-N_temp/` directories and data files of checkpoints that have no
  index (a save killed before it wrote the index). Call it only after a save
  has finished; a checkpoint with an index is never touched. Returns what was
  removed.

  Example:
    >>> clean_leftovers("/tmp/run")
    ['/tmp/run/ckpt-30_temp']
  """
  removed = []
  stem = os.path.join(directory, checkpoint_name)
  for path in _glob(stem + "-*_temp"):
    if tf.io.gfile.isdir(path):
      tf.io.gfile.rmtree(path)
      removed.append(path)
  for path in _glob(stem + "-*.data-*-of-*"):
    match = _DATA_FILE.match(path)
    if match and not _exists(match.group("prefix") + ".index"):
      tf.io.gfile.remove(path)
      removed.append(path)
  return sorted(removed)
