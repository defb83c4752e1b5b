"""Writes one of this library's checkpoints in the original Mesh TensorFlow's
format (name-based: `checkpoint`, model.ckpt-N.index / .data-00000-of-00001),
so that tools reading T5 / Mesh TensorFlow checkpoints read it.

    python -m mesh_tensorflow.export_original_checkpoint \\
        --checkpoint=/tmp/run --output_dir=/tmp/run_original --dtype=bfloat16

Flags: --checkpoint (a checkpoint prefix or a model directory: its latest),
--output_dir, --dtype (default "original": the model variables in the saved
dtype, which is the master dtype the run trained with, and the Adafactor
slots in float32, as the original 0.1.21 restores them; "bfloat16" or
"float32": the model variables in that dtype, the slots in float32; "saved":
every variable as saved),
--step (default: the saved global_step), --include_optimizer_state
(default true: also the Adafactor slots), --min_dim_size_to_factor (the
original AdafactorOptimizer's, default 128). Errors print `error: ...` and
exit with status 2.
"""

from __future__ import annotations

import sys

from absl import flags
import tensorflow as tf

from mesh_tensorflow import cli
from mesh_tensorflow.compat import original_checkpoint

# --dtype: (model variables' dtype, slots' dtype); None keeps the saved one.
_DTYPES = {"original": (None, original_checkpoint.ORIGINAL_SLOT_DTYPE),
           "bfloat16": (tf.bfloat16, original_checkpoint.ORIGINAL_SLOT_DTYPE),
           "float32": (tf.float32, original_checkpoint.ORIGINAL_SLOT_DTYPE),
           "saved": (None, None)}

# Its own FlagValues: importing this module never clashes with another
# program's flags of the same names.
FLAGS = flags.FlagValues()
flags.DEFINE_string("checkpoint", None,
                    "This library's checkpoint prefix or model directory.", flag_values=FLAGS)
flags.DEFINE_string("output_dir", None, "Directory for the original-format checkpoint.",
                    flag_values=FLAGS)
flags.DEFINE_enum("dtype", "original", list(_DTYPES),
                  "original: model variables as saved (the trained master dtype), "
                  "Adafactor slots float32, as the original restores them; bfloat16 or "
                  "float32: model variables in that dtype, slots float32; saved: all as "
                  "saved.", flag_values=FLAGS)
flags.DEFINE_integer("step", None, "Step number to write (default: the saved global_step).",
                     flag_values=FLAGS)
flags.DEFINE_bool("include_optimizer_state", True, "Also write the Adafactor slots.",
                  flag_values=FLAGS)
flags.DEFINE_integer("min_dim_size_to_factor", 128,
                     "The original AdafactorOptimizer's min_dim_size_to_factor.",
                     flag_values=FLAGS)


def _run(argv) -> int:
  if len(argv) > 1:
    print(f"error: unexpected arguments {argv[1:]}; pass --checkpoint and --output_dir.",
          file=sys.stderr)
    return 2
  for name in ("checkpoint", "output_dir"):
    if not getattr(FLAGS, name):
      print(f"error: --{name} is required.", file=sys.stderr)
      return 2
  if FLAGS.step is not None and FLAGS.step < 0:
    print(f"error: --step must be >= 0, got {FLAGS.step}.", file=sys.stderr)
    return 2
  try:
    prefix = original_checkpoint.export(
        FLAGS.checkpoint, FLAGS.output_dir, dtype=_DTYPES[FLAGS.dtype][0],
        slot_dtype=_DTYPES[FLAGS.dtype][1], step=FLAGS.step,
        include_optimizer_state=FLAGS.include_optimizer_state,
        min_dim_size_to_factor=FLAGS.min_dim_size_to_factor)
  except (ValueError, tf.errors.OpError, OSError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print(f"wrote {prefix}")
  return 0


def main(argv=None) -> int:
  """Entry point: `python -m mesh_tensorflow.export_original_checkpoint`."""
  try:
    rest = cli.parse_own_flags(FLAGS, sys.argv if argv is None else argv,
                               "python -m mesh_tensorflow.export_original_checkpoint", __doc__)
  except SystemExit as e:  # --help (0) or a bad flag (2)
    return int(e.code or 0)
  return _run(rest)


if __name__ == "__main__":
  sys.exit(main())
