"""Lists the mtf variables of a checkpoint with their logical shapes, and
checks checkpoints.

    python -m mesh_tensorflow.inspect_checkpoint MODEL_DIR_OR_CHECKPOINT_PREFIX
    python -m mesh_tensorflow.inspect_checkpoint --verify MODEL_DIR_OR_CHECKPOINT_PREFIX

--verify reads every saved tensor (every slice) back, checking its checksum:
for a directory, every checkpoint its state file lists. A damaged checkpoint
is an `error:` line naming the file and what is wrong (exit status 2).
"""

from __future__ import annotations

import os
import sys
from typing import List, Optional, Sequence

from mesh_tensorflow import cli


def _check_exists(path: str) -> None:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if not tf.io.gfile.isdir(path) and not tf.io.gfile.glob(path + ".*"):
    raise cli.UserError(f"{path}: no such directory or checkpoint",
                        hint="give a model_dir or a checkpoint prefix such as "
                        "MODEL_DIR/ckpt-100")


def _checkpoints(path: str) -> List[str]:
  """The checkpoints `path` names: a prefix, or those of a directory."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  _check_exists(path)
  if not os.path.isdir(path):
    return [path]
  state = tf.train.get_checkpoint_state(path)
  if state is None or not state.all_model_checkpoint_paths:
    raise cli.UserError(f"No checkpoint in directory {path!r}.",
                        hint="give a model_dir that training wrote checkpoints to")
  return [p if os.path.isabs(p) else os.path.join(path, p)
          for p in state.all_model_checkpoint_paths]


def _verify(path: str) -> int:
  from mesh_tensorflow.training import checkpoint_verify  # pylint: disable=g-import-not-at-top
  checkpoints = _checkpoints(path)
  problems = {}
  for prefix in checkpoints:
    problem = checkpoint_verify.verify(prefix)
    print(f"{'ok     ' if problem is None else 'DAMAGED'} {prefix}", flush=True)
    if problem is not None:
      problems[prefix] = problem
  if not problems:
    print(f"verified {len(checkpoints)} checkpoint(s): every slice reads back")
    return 0
  intact = [p for p in checkpoints if p not in problems]
  first = next(iter(problems.values()))
  more = f" ({len(problems) - 1} more damaged)" if len(problems) > 1 else ""
  raise cli.UserError(
      f"{first}{more}",
      hint=(f"intact: {', '.join(intact)}; restore one with --checkpoint_path "
            "(gin: run.checkpoint_path)") if intact else
      "no intact checkpoint: retrain (--fresh) or restore a copy")


def main(argv: Optional[Sequence[str]] = None) -> int:
  """`python -m mesh_tensorflow.inspect_checkpoint ARGS`; returns the exit status (see cli.run_module_command)."""
  from mesh_tensorflow import cli as cli_lib  # pylint: disable=g-import-not-at-top
  return cli_lib.run_module_command("mesh_tensorflow.inspect_checkpoint", _main, argv)


def _main(argv: Sequence[str]) -> int:
  """`python -m mesh_tensorflow.inspect_checkpoint [--verify] PATH`."""
  parser = cli.FlagParser(
      prog="python -m mesh_tensorflow.inspect_checkpoint",
      description="List a checkpoint's mtf variables (a model_dir means its latest "
      "checkpoint); --verify reads every tensor back.")
  parser.add_argument("path", help="a model_dir or a checkpoint prefix (.../ckpt-100)")
  parser.add_argument("--verify", action="store_true",
                      help="read every slice back and check its checksum")
  args = parser.parse_args(argv)
  if args.verify:
    return _verify(args.path)
  from mesh_tensorflow.training.checkpoint import list_variables  # pylint: disable=g-import-not-at-top
  _check_exists(args.path)
  try:
    rows = list_variables(args.path)
  except ValueError as e:
    raise cli.UserError(
        str(e), hint="check the path; --verify tells which file of a checkpoint is damaged"
    ) from None
  width = max([len(r[0]) for r in rows] + [8])
  print(f"{'variable':<{width}}  {'shape':<20} dtype")
  for name, shape, dtype in rows:
    print(f"{name:<{width}}  {str(shape):<20} {dtype}")
  print(f"{len(rows)} variables")
  return 0


if __name__ == "__main__":
  sys.exit(main())
