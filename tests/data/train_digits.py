"""A small Trainer run for tests/test_training.py: an MLP with dropout on
scikit-learn's digits, momentum with a learning-rate schedule, checkpoints.

Run as a script it prints one line per step, `loss <step> <repr(loss)>`, so a
test can compare runs exactly, and it can be made slow on purpose so that a
test can kill it mid-training or mid-save:

    python tests/data/train_digits.py --model_dir=/tmp/d --steps=60 \\
        --step_sleep=0.05 --slow_save_at=30 --save_sleep=60

`--slow_save_at=N` makes the save of step N print `SAVE_WRITTEN <path>` once
its data files are written and then sleep before the checkpoint state file
names it (a tf.train.CheckpointOptions write callback).

Imported, it provides `model_fn`, `FEATURE_SHAPES`, `dataset` and
`make_trainer` for in-process tests.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Dict, Optional, Sequence

import numpy as np
import tensorflow as tf

BATCH = 32
PIXELS = 64
HIDDEN = 64
CLASSES = 10


def _load():
  from sklearn.datasets import load_digits  # pylint: disable=import-outside-toplevel
  digits = load_digits()
  return (digits.data / 16.0).astype(np.float32), digits.target.astype(np.int32)


def dataset(batch: int = BATCH, seed: int = 1, repeat: bool = True) -> tf.data.Dataset:
  """Shuffled (deterministically, with `seed`) {"image", "label"} batches.

  Example:
    >>> ds = dataset(32)
  """
  images, labels = _load()
  ds = tf.data.Dataset.from_tensor_slices({"image": images, "label": labels})
  ds = ds.shuffle(len(labels), seed=seed, reshuffle_each_iteration=True)
  if repeat:
    ds = ds.repeat()
  return ds.batch(batch, drop_remainder=True)


def feature_shapes(batch: int = BATCH) -> Dict[str, str]:
  return {"image": f"batch:{batch};pixels:{PIXELS}", "label": f"batch:{batch}"}


FEATURE_SHAPES = feature_shapes()


def model_fn(mesh, features, mode, dropout_rate: float = 0.1):
  """MLP with dropout (in training); returns (loss, {"accuracy"}) and records
  a scalar summary "mean_logit"."""
  import mesh_tensorflow as mtf  # pylint: disable=import-outside-toplevel
  images, labels = features["image"], features["label"]
  batch, pixels = images.shape.dims
  hidden = mtf.Dimension("hidden", HIDDEN)
  classes = mtf.Dimension("classes", CLASSES)
  w1 = mtf.get_variable(mesh, "w1", [pixels, hidden])
  b1 = mtf.get_variable(mesh, "b1", [hidden], initializer=tf.zeros_initializer())
  w2 = mtf.get_variable(mesh, "w2", [hidden, classes])
  h = mtf.relu(mtf.einsum([images, w1], output_shape=[batch, hidden]) + b1)
  if dropout_rate:
    h = mtf.dropout(h, mode == "train", rate=dropout_rate)
  logits = mtf.einsum([h, w2], output_shape=[batch, classes])
  loss = mtf.reduce_mean(
      mtf.reduce_logsumexp(logits, classes)
      - mtf.reduce_sum(logits * mtf.one_hot(labels, classes), reduced_dim=classes))
  accuracy = mtf.reduce_mean(
      mtf.cast(mtf.equal(mtf.argmax(logits, classes), labels), tf.float32))
  mtf.scalar_summary("mean_logit", mtf.reduce_mean(logits))
  return loss, {"accuracy": accuracy}


def schedule(step):
  """Momentum with a learning rate that decays with the global step."""
  import mesh_tensorflow as mtf  # pylint: disable=import-outside-toplevel
  return mtf.optimize.MomentumOptimizer(0.1 / (1.0 + 0.01 * step), momentum=0.9)


def make_impl(mesh_shape: str, layout: str):
  import mesh_tensorflow as mtf  # pylint: disable=import-outside-toplevel
  size = mtf.convert_to_shape(mesh_shape).size
  return mtf.placement_mesh_impl.PlacementMeshImpl(
      mesh_shape, layout, ["cpu:%d" % i for i in range(size)])


def make_trainer(mesh_shape: str = "rows:2;cols:4", layout: str = "batch:rows;hidden:cols",
                 **kwargs):
  """A Trainer of model_fn with the momentum schedule; kwargs go to Trainer.

  Example:
    >>> trainer = make_trainer(model_dir="/tmp/d", checkpoint_every=10)
  """
  import mesh_tensorflow as mtf  # pylint: disable=import-outside-toplevel
  kwargs.setdefault("feature_shapes", FEATURE_SHAPES)
  return mtf.training.Trainer(model_fn, mesh_impl=make_impl(mesh_shape, layout),
                              optimizer=schedule, **kwargs)


def main(argv: Optional[Sequence[str]] = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--model_dir", required=True)
  parser.add_argument("--mesh_shape", default="rows:2;cols:4")
  parser.add_argument("--layout", default="batch:rows;hidden:cols")
  parser.add_argument("--steps", type=int, default=60)
  parser.add_argument("--checkpoint_every", type=int, default=10)
  parser.add_argument("--step_sleep", type=float, default=0.0)
  parser.add_argument("--slow_save_at", type=int, default=-1)
  parser.add_argument("--save_sleep", type=float, default=0.0)
  args = parser.parse_args(argv)

  cpu = tf.config.list_physical_devices("CPU")[0]
  tf.config.set_logical_device_configuration(
      cpu, [tf.config.LogicalDeviceConfiguration()] * 8)
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__)))))

  def after_write(save_path: str) -> None:
    if save_path.endswith(f"-{args.slow_save_at}"):
      print(f"SAVE_WRITTEN {save_path}", flush=True)
      time.sleep(args.save_sleep)

  trainer = make_trainer(args.mesh_shape, args.layout, model_dir=args.model_dir,
                         checkpoint_every=args.checkpoint_every, log_every=10,
                         checkpoint_options=tf.train.CheckpointOptions(
                             experimental_write_callbacks=[after_write]))

  def report(step: int, out: Dict[str, float]) -> None:
    print(f"loss {step} {out['loss']!r}", flush=True)
    if args.step_sleep:
      time.sleep(args.step_sleep)

  trainer.train(dataset(), steps=args.steps, hooks=[report])
  print(f"done {trainer.global_step}", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
