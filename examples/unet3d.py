"""Trains the original's 3-D U-Net on synthetic volumes split across 8 devices.

Each volume is a noisy cube holding an "organ" (a bright sphere, class 1)
with a "lesion" inside it (a smaller, brighter sphere, class 2); the U-Net of
`mesh_tensorflow.experimental.unet` learns to segment them. The volume is cut
into `image_nx_block` x `image_ny_block` blocks along its first two axes, and
the layout splits those blocks over the mesh, so each of the 8 logical CPU
devices holds one part of every volume; convolutions trade halos with the
neighbouring devices and the results equal the unsplit model's.

The volumes are written as GZIP TFRecords in the original's format and read
back by `unet.get_dataset_creator` (training ones augmented by flips and
half turns); `model_executor.train_and_eval` trains and then evaluates
(lesion dice of `unet.PostProcessor`):

    python examples/unet3d.py
    python examples/unet3d.py --train_steps=60 --mesh_shape="rows:2;cols:4"
    python examples/unet3d.py --layout="batch:rows;image_ny_block:cols"

Every flag of `unet` and `model_executor` (`--ct_resolution`,
`--network_depth`, `--n_base_filters`, `--lr`, ...) applies too; the example
gives them small defaults. The run ends with a machine readable line:

    final: steps=40 first_loss=... last_loss=... dice_global=... losses=[...]
"""

from __future__ import annotations

import os
if __name__ == "__main__":
  os.environ.setdefault("MTF_COMMAND_LINE", "1")  # quiet TensorFlow's start-up lines
from mesh_tensorflow import cli  # noqa: E402  (imports TensorFlow, quietly when run)

import sys
import tempfile
from typing import Tuple

import tensorflow as tf

# Eight logical CPU devices stand in for accelerators (before TF touches devices).
_CPU = tf.config.list_physical_devices("CPU")[0]
try:
  tf.config.set_logical_device_configuration(
      _CPU, [tf.config.LogicalDeviceConfiguration()] * 8)
except RuntimeError:
  pass  # Already initialized.

from absl import flags  # noqa: E402
import numpy as np  # noqa: E402

import mesh_tensorflow as mtf  # noqa: E402
from mesh_tensorflow.experimental import model_executor  # noqa: E402
from mesh_tensorflow.experimental import offline_data_aug  # noqa: E402

FLAGS = flags.FLAGS

flags.DEFINE_integer("train_steps", 40, "Training steps.")
flags.DEFINE_string("mesh_shape", "rows:2;cols:4", "Mesh shape (at most 8 processors).")
flags.DEFINE_string("layout", "image_nx_block:rows;image_ny_block:cols",
                    "Layout rules: which mesh dimension splits which tensor dimension.")
flags.DEFINE_integer("num_volumes", 16, "Synthetic training volumes (4 more for evaluation).")
flags.DEFINE_integer("seed", 1, "Seed of the synthetic volumes and of the augmentations.")
flags.DEFINE_integer("log_every", 10, "Print the loss every this many steps (0: never).")
flags.DEFINE_string("data_dir", "", "Where the synthetic TFRecords go (default: a temporary "
                    "directory).")

model_executor.define_flags()
# Small defaults for the original's flags (the command line still overrides them).
for _name, _value in {
    "use_tpu": False, "ct_resolution": 16, "image_nx_block": 2, "image_ny_block": 4,
    "network_depth": 2, "n_conv_per_block": 2, "n_base_filters": 4, "batch_size_train": 4,
    "batch_size_eval": 4, "mtf_dtype": "float32", "dropout_keep_p": 1.0,
    "xen_liver_weight": 4.0, "xen_lesion_weight": 16.0, "lr": 0.03,
    "n_dataset_read_interleave": 2, "n_dataset_processes": 2, "write_summary": False,
    "num_training_loops": 1, "num_eval_iterations_per_loop": 1,
}.items():
  FLAGS.set_default(_name, _value)


def synthetic_volume(rng: np.random.RandomState, reso: int) -> Tuple[np.ndarray, np.ndarray]:
  """A [reso]^3 image in [0, 1] and its labels (0 background, 1 organ, 2 lesion).

  Example:
    >>> image, label = synthetic_volume(np.random.RandomState(0), 16)
  """
  grid = np.stack(np.meshgrid(*[np.arange(reso)] * 3, indexing="ij"), -1).astype(np.float32)
  organ_r = rng.uniform(0.25, 0.4) * reso
  centre = rng.uniform(organ_r, reso - organ_r, size=3)
  lesion_r = rng.uniform(0.45, 0.6) * organ_r
  lesion_centre = centre + rng.uniform(-1, 1, size=3) * (organ_r - lesion_r) / np.sqrt(3)
  label = np.zeros([reso] * 3, np.float32)
  label[np.linalg.norm(grid - centre, axis=-1) <= organ_r] = 1.0
  label[np.linalg.norm(grid - lesion_centre, axis=-1) <= lesion_r] = 2.0
  image = np.choose(label.astype(np.int64), [0.2, 0.5, 0.8]).astype(np.float32)
  image += rng.normal(0.0, 0.05, size=image.shape).astype(np.float32)
  return np.clip(image, 0.0, 1.0), label


def write_data(directory: str, num_volumes: int, reso: int, seed: int) -> Tuple[str, str]:
  """Writes training and evaluation TFRecords; returns their file patterns.

  Training files hold intensities in [0, 1]; evaluation files hold raw ones
  (the reader maps x to x / 1024 + 0.5), as in the original's data.

  Example:
    >>> train_pattern, eval_pattern = write_data("/tmp/unet3d", 16, 16, 1)
  """
  rng = np.random.RandomState(seed)
  for i in range(num_volumes):
    image, label = synthetic_volume(rng, reso)
    offline_data_aug.save_to_tfrecord(image, label, 0, i, directory, "train")
  for i in range(4):
    image, label = synthetic_volume(rng, reso)
    offline_data_aug.save_to_tfrecord((image - 0.5) * 1024.0, label, 0, i, directory, "eval")
  return (os.path.join(directory, "train-*.tfrecords"),
          os.path.join(directory, "eval-*.tfrecords"))


def main(argv):
  if len(argv) > 1:
    raise cli.UserError(f"unexpected arguments {argv[1:]}: every setting is a --flag",
                        hint="pass --helpfull to list the flags")
  if FLAGS.train_steps < 1:
    raise cli.UserError(f"--train_steps={FLAGS.train_steps} must be at least 1")
  if FLAGS.num_volumes < 1:
    raise cli.UserError(f"--num_volumes={FLAGS.num_volumes} must be at least 1")
  if FLAGS.use_tpu:
    raise cli.UserError("--use_tpu is the original's TPU infeed driver, not available in TF2",
                        hint="leave --use_tpu=false; this example runs on 8 logical CPUs")
  try:
    mesh_shape = mtf.convert_to_shape(FLAGS.mesh_shape)
    layout = mtf.convert_to_layout_rules(FLAGS.layout)
  except (ValueError, TypeError) as e:
    raise cli.UserError(f"--mesh_shape={FLAGS.mesh_shape!r} / --layout={FLAGS.layout!r}: {e}",
                        hint='e.g. --mesh_shape="rows:2;cols:4" '
                        '--layout="image_nx_block:rows;image_ny_block:cols"') from None
  if mesh_shape.size > 8:
    raise cli.UserError(f"--mesh_shape={FLAGS.mesh_shape!r} has {mesh_shape.size} processors; "
                        "this example has 8 devices")
  tf.random.set_seed(FLAGS.seed)
  directory = FLAGS.data_dir or tempfile.mkdtemp(prefix="unet3d_")
  tf.io.gfile.makedirs(directory)
  train_pattern, eval_pattern = write_data(directory, FLAGS.num_volumes, FLAGS.ct_resolution,
                                           FLAGS.seed)
  FLAGS.train_file_pattern, FLAGS.eval_file_pattern = train_pattern, eval_pattern
  FLAGS.num_train_iterations_per_loop = FLAGS.train_steps
  try:
    context = model_executor.MeshContext(None, False, mesh_shape, layout)
    print(f"volume {FLAGS.ct_resolution}^3 in {FLAGS.image_nx_block}x{FLAGS.image_ny_block} "
          f"blocks; layout '{FLAGS.layout}' on mesh '{FLAGS.mesh_shape}'", flush=True)

    def log(line: str) -> None:
      if line.startswith("train step"):
        step = int(line.split()[2].rstrip(":"))
        if not FLAGS.log_every or step % FLAGS.log_every:
          return
      print(line, flush=True)
    result = model_executor.train_and_eval(context, log=log)
  except ValueError as e:
    raise cli.UserError(str(e)) from None
  losses = result["train_losses"]
  print(f"eval: loss={result['loss']:.5f} accuracy={result['accuracy_of_all_classes']:.4f} "
        f"lesion_dice={result['dice_global']:.4f}")
  print(f"final: steps={len(losses)} first_loss={losses[0]:.6f} last_loss={losses[-1]:.6f} "
        f"dice_global={result['dice_global']:.4f} "
        f"losses=[{','.join(f'{v:.6g}' for v in losses)}]", flush=True)


if __name__ == "__main__":
  sys.exit(cli.run_absl_main(main))
