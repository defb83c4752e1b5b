"""Lists the mtf variables of a checkpoint with their logical shapes.

    python -m mesh_tensorflow.inspect_checkpoint MODEL_DIR_OR_CHECKPOINT_PREFIX
"""

import sys

from mesh_tensorflow.checkpoint import list_variables


def main(argv) -> int:
  if len(argv) != 2:
    print(__doc__.strip())
    return 2
  try:
    rows = list_variables(argv[1])
  except (ValueError, FileNotFoundError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  width = max([len(r[0]) for r in rows] + [8])
  print(f"{'variable':<{width}}  {'shape':<20} dtype")
  for name, shape, dtype in rows:
    print(f"{name:<{width}}  {str(shape):<20} {dtype}")
  print(f"{len(rows)} variables")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
