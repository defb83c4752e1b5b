"""A two-layer MLP on handwritten digits, laid out over 8 logical CPUs.

This is the classic Mesh TensorFlow MNIST model (images -> hidden relu ->
classes), trained on scikit-learn's `load_digits` (1,797 real 8x8 images that
ship with scikit-learn, so nothing is downloaded). A fixed, seeded 20% of the
images is held out as the test set.

Training runs on `mtf.training.Trainer`: compiled train and eval steps,
batches from tf.data split by the layout, checkpoints, TensorBoard events and
progress lines. The same model runs under any layout; only `--layout` and
`--mesh_shape` change, and for one `--seed` every layout gives the same loss
curve (up to float rounding):

    python examples/mnist.py                            # batch:rows;hidden:cols on rows:2;cols:4
    python examples/mnist.py --layout=data_parallel     # batch:all on all:8
    python examples/mnist.py --layout=model_parallel    # hidden:all on all:8
    python examples/mnist.py --layout="hidden:all" --mesh_shape="all:8"

Checkpoints and TensorBoard events go to `--model_dir` (default
`<temp dir>/mesh_tensorflow_mnist`; `tensorboard --logdir` it). A run with a
checkpoint there resumes from it: `--train_steps` is the step to train to, so
running the default command twice restores step 600 and only evaluates, and

    python examples/mnist.py --train_steps=900 --layout=model_parallel

continues from step 600 to 900, on another layout if you like (checkpoints
are layout-independent). `--fresh` deletes the checkpoints and starts over.
`--grad_accum_steps=k` computes each update of `--batch_size` examples as k
micro-batches (same result, less memory per step).

The last line printed is machine readable (loss: the training loss of the
last step run now, nan if none was):

    final: step=600 loss=0.038035 test_accuracy=0.9861 test_loss=0.0536 seconds=1.7 layout='...' mesh_shape='...'

Layouts differ only in the order of floating-point sums, so their loss curves
agree to about 1e-6 relative at first; training dynamics slowly amplify that
(about 1e-3 after 600 SGD steps). Adam with its default epsilon=1e-6 and no
bias correction takes a nearly sign(grad) first step, which amplifies rounding
in gradients that cancel to almost zero: its curves part much sooner.

How the mtf graph meets `tf.function`: the Trainer traces one step function
per mode (train, eval) with a fixed input signature; each trace calls
`model_fn`, which builds the mtf graph of the model from the batch's mtf
features, and lowers it. Variables are created on the first trace, one slice
variable per processor, and kept in the mesh implementation's variable store
under their mtf name, so the eval function finds the very slices that
training updates. Optimizer slots work the same way.
"""

from __future__ import annotations

import os
if __name__ == "__main__":
  os.environ.setdefault("MTF_COMMAND_LINE", "1")  # quiet TensorFlow's start-up lines
from mesh_tensorflow import cli  # noqa: E402  (imports TensorFlow, quietly when run)

import dataclasses
import glob
import math
import shutil
import sys
import tempfile
import time
from typing import Callable, Dict, List, Optional, Tuple

from absl import flags
from absl import logging
import numpy as np
import tensorflow as tf

import mesh_tensorflow as mtf

NUM_CPU_DEVICES = 8

# Named layouts: preset name -> (layout rules, mesh shape).
LAYOUT_PRESETS: Dict[str, Tuple[str, str]] = {
    "2x4": ("batch:rows;hidden:cols", "rows:2;cols:4"),
    "data_parallel": ("batch:all", "all:8"),
    "model_parallel": ("hidden:all", "all:8"),
    "replicated": ("", "all:8"),
}
DEFAULT_MESH_SHAPE = "rows:2;cols:4"
SPLIT_SEED = 0  # fixed train/test split, whatever --seed is
DEFAULT_MODEL_DIR = os.path.join(tempfile.gettempdir(), "mesh_tensorflow_mnist")

DEFAULT_LEARNING_RATES = {"sgd": 0.5, "momentum": 0.1, "adam": 0.003}

FLAGS = flags.FLAGS
flags.DEFINE_string(
    "layout", "2x4",
    "Layout rules such as 'batch:rows;hidden:cols', or a preset: "
    + ", ".join(f"{k} ('{v[0]}' on '{v[1]}')" for k, v in LAYOUT_PRESETS.items()) + ".")
flags.DEFINE_string(
    "mesh_shape", "",
    "Mesh shape such as 'rows:2;cols:4'. Empty: the preset's mesh, or "
    f"'{DEFAULT_MESH_SHAPE}' for explicit layout rules.")
flags.DEFINE_integer("train_steps", 600,
                     "Train until this global step (a resumed run continues to it).")
flags.DEFINE_integer("batch_size", 128,
                     "Examples per update; the mesh dimension splitting 'batch' must divide "
                     "batch_size / grad_accum_steps.")
flags.DEFINE_integer("hidden_size", 1024, "Size of the hidden layer.")
flags.DEFINE_float("learning_rate", None,
                   "Learning rate; default per optimizer: "
                   + ", ".join(f"{k} {v}" for k, v in DEFAULT_LEARNING_RATES.items()) + ".")
flags.DEFINE_enum("optimizer", "sgd", ["sgd", "momentum", "adam"], "Optimizer.")
flags.DEFINE_integer("seed", 1, "Seed of the initial weights and of the data order.")
flags.DEFINE_integer("log_every", 100, "Print a progress line every this many steps.")
flags.DEFINE_integer("eval_every", 0,
                     "Also print test accuracy every this many steps (0: only at the end).")
flags.DEFINE_string("model_dir", DEFAULT_MODEL_DIR,
                    "Checkpoints and TensorBoard events; a run resumes from the checkpoint "
                    "here. Empty: neither.")
flags.DEFINE_bool("fresh", False,
                  "Delete the checkpoints and events in --model_dir and start from step 0.")
flags.DEFINE_integer("checkpoint_every", 200,
                     "Save a checkpoint every this many steps (and at the end).")
flags.DEFINE_string("cluster", "",
                    "Run the mesh on the CPU devices of these worker tasks (host:port,...; "
                    "default: $MTF_CLUSTER, set by python -m mesh_tensorflow.launch, or "
                    "$TF_CONFIG); no cluster: 8 logical CPUs of this process.")
flags.DEFINE_enum("lowering", "placement", ["placement", "simd"],
                  "Mesh implementation: one op per device (placement) or one program "
                  "for every processor (simd).")
flags.DEFINE_integer("grad_accum_steps", 1,
                     "Split each update's batch into this many micro-batches whose gradients "
                     "are averaged.")


@dataclasses.dataclass
class TrainResult:
  """What `train` measured.

  Attributes:
    losses: the training loss of every step run now, in order.
    test_accuracy: fraction of test images classified correctly at the end.
    test_loss: mean cross-entropy on the test images at the end.
    steps: the global step at the end (counting steps of earlier runs).
    start_step: the global step this run started from (0 unless resumed).
    seconds: wall time of training and evaluation (tracing included).
    layout: the layout rules used.
    mesh_shape: the mesh shape used.
  """
  losses: List[float]
  test_accuracy: float
  test_loss: float
  steps: int
  start_step: int
  seconds: float
  layout: str
  mesh_shape: str

  @property
  def final_loss(self) -> float:
    return self.losses[-1] if self.losses else float("nan")

  def summary_line(self) -> str:
    return (f"final: step={self.steps} loss={self.final_loss:.6f} "
            f"test_accuracy={self.test_accuracy:.4f} test_loss={self.test_loss:.4f} "
            f"seconds={self.seconds:.1f} layout='{self.layout}' mesh_shape='{self.mesh_shape}'")


def configure_cpu_devices(num_devices: int = NUM_CPU_DEVICES) -> List[str]:
  """Splits the host CPU into `num_devices` logical devices and names them.

  Must run before TensorFlow initializes its devices; if they are already
  initialized (e.g. by a test's conftest) with enough CPUs, that is fine too.

  Returns:
    The device names, e.g. ["/device:CPU:0", ...].

  Example:
    >>> devices = configure_cpu_devices(8)
  """
  cpus = tf.config.list_physical_devices("CPU")
  try:
    tf.config.set_logical_device_configuration(
        cpus[0], [tf.config.LogicalDeviceConfiguration() for _ in range(num_devices)])
  except RuntimeError:
    pass  # Devices already initialized; checked below.
  logical = tf.config.list_logical_devices("CPU")
  if len(logical) < num_devices:
    raise RuntimeError(
        f"Need {num_devices} logical CPU devices but TensorFlow has {len(logical)}; "
        "configure them before any TensorFlow op runs.")
  return [d.name for d in logical[:num_devices]]


def resolve_layout(layout: str, mesh_shape: str = "") -> Tuple[str, str]:
  """(layout rules, mesh shape) for a preset name or explicit rules.

  Example:
    >>> resolve_layout("data_parallel")
    ('batch:all', 'all:8')
  """
  if layout in LAYOUT_PRESETS:
    rules, preset_mesh = LAYOUT_PRESETS[layout]
    return rules, mesh_shape or preset_mesh
  return layout, mesh_shape or DEFAULT_MESH_SHAPE


def load_data() -> Dict[str, np.ndarray]:
  """Digits as float32 images in [0, 1] of shape [n, 8, 8], int32 labels.

  The images are permuted once with the fixed `SPLIT_SEED` (not `--seed`, so
  the test set never changes); the last 20% of that order is held out for
  testing. (The file's own order groups writers, so its plain last 20% comes
  from writers never seen in training and tops out near 91%.)

  Example:
    >>> data = load_data(); data["train_images"].shape
    (1438, 8, 8)
  """
  from sklearn.datasets import load_digits  # pylint: disable=import-outside-toplevel
  digits = load_digits()
  order = np.random.RandomState(SPLIT_SEED).permutation(len(digits.target))
  images = (digits.images[order] / 16.0).astype(np.float32)
  labels = digits.target[order].astype(np.int32)
  num_test = int(round(0.2 * len(images)))
  split = len(images) - num_test
  return {"train_images": images[:split], "train_labels": labels[:split],
          "test_images": images[split:], "test_labels": labels[split:]}


def train_dataset(images: np.ndarray, labels: np.ndarray, batch_size: int,
                  seed: int) -> tf.data.Dataset:
  """Shuffled (with `seed`), repeated {"image", "label"} batches of exactly
  `batch_size`.

  The order depends only on `seed` (not on TensorFlow's global seed), so a
  resumed run that skips the batches already consumed sees the same batches
  as an uninterrupted one.

  Example:
    >>> ds = train_dataset(data["train_images"], data["train_labels"], 128, seed=1)
  """
  images, labels = tf.constant(images), tf.constant(labels)
  count = int(labels.shape[0])

  def epoch_order(epoch):
    # Stateless: the same order whatever tf.random.set_seed a program set.
    order = tf.random.experimental.stateless_shuffle(
        tf.range(count), seed=tf.stack([tf.constant(seed, tf.int64), epoch]))
    return tf.data.Dataset.from_tensor_slices(order)

  ds = tf.data.Dataset.range(2**62).flat_map(epoch_order)
  ds = ds.map(lambda i: {"image": tf.gather(images, i), "label": tf.gather(labels, i)})
  return ds.batch(batch_size, drop_remainder=True).prefetch(2)


def test_dataset(images: np.ndarray, labels: np.ndarray,
                 multiple: int) -> tf.data.Dataset:
  """The whole test set as one {"image", "label", "weight"} batch, padded to a
  multiple of `multiple` (so any layout can split it); padding has weight 0.

  Example:
    >>> ds = test_dataset(data["test_images"], data["test_labels"], multiple=8)
  """
  num = len(labels)
  pad = -(-num // multiple) * multiple - num
  batch = {"image": np.pad(images, [(0, pad), (0, 0), (0, 0)]),
           "label": np.pad(labels, [(0, pad)]),
           "weight": np.pad(np.ones(num, np.float32), [(0, pad)])}
  return tf.data.Dataset.from_tensors(batch)


def _glorot_uniform(seed: int, index: int) -> Callable:
  """A stateless Glorot-uniform initializer (fan_out = last dimension).

  The full value depends only on (seed, index), not on the layout: the
  library computes it once and hands each processor its slice.
  """
  def init(shape, dtype=tf.float32):
    fan_out = shape[-1]
    fan_in = max(1, math.prod(shape) // fan_out)
    limit = math.sqrt(6.0 / (fan_in + fan_out))
    return tf.random.stateless_uniform(shape, seed=[seed, index], minval=-limit,
                                       maxval=limit, dtype=dtype)
  return init


def mnist_model(mesh: mtf.Mesh, images: mtf.Tensor, labels: mtf.Tensor,
                hidden_size: int, seed: int,
                weights: Optional[mtf.Tensor] = None) -> Dict[str, mtf.Tensor]:
  """Builds the MLP on `mesh` for one batch; returns mtf tensors.

  Args:
    mesh: the mtf mesh (of a fresh mtf.Graph).
    images: float32 mtf Tensor [batch, image_rows, image_cols].
    labels: int32 mtf Tensor [batch].
    hidden_size: size of the hidden layer.
    seed: seed of the initial weights.
    weights: optional float32 mtf Tensor [batch], 1 for real examples and 0
      for padding (counted out of the loss and the accuracy).

  Returns:
    {"logits", "loss", "accuracy"}: mean cross-entropy loss and fraction of
    correctly classified examples (both over weighted examples).

  Example:
    >>> out = mnist_model(mesh, features["image"], features["label"], 1024, seed=1)
  """
  batch_dim, _, _ = images.shape.dims
  hidden_dim = mtf.Dimension("hidden", hidden_size)
  classes_dim = mtf.Dimension("classes", 10)

  w1 = mtf.get_variable(mesh, "w1", images.shape.dims[1:] + [hidden_dim],
                        initializer=_glorot_uniform(seed, 1))
  b1 = mtf.get_variable(mesh, "b1", [hidden_dim], initializer=tf.zeros_initializer())
  w2 = mtf.get_variable(mesh, "w2", [hidden_dim, classes_dim],
                        initializer=_glorot_uniform(seed, 2))
  b2 = mtf.get_variable(mesh, "b2", [classes_dim], initializer=tf.zeros_initializer())

  # einsum sums the dimensions missing from output_shape (here the pixels).
  hidden = mtf.relu(mtf.einsum([images, w1], output_shape=[batch_dim, hidden_dim]) + b1)
  logits = mtf.einsum([hidden, w2], output_shape=[batch_dim, classes_dim]) + b2

  # Softmax cross-entropy: logsumexp(logits) - logits[label].
  one_hot = mtf.one_hot(labels, classes_dim, dtype=logits.dtype)
  per_example = (mtf.reduce_logsumexp(logits, classes_dim)
                 - mtf.reduce_sum(logits * one_hot, reduced_dim=classes_dim))
  correct = mtf.cast(mtf.equal(mtf.argmax(logits, classes_dim), labels), tf.float32)
  if weights is None:
    loss = mtf.reduce_mean(per_example)
    accuracy = mtf.reduce_mean(correct)
  else:
    total = mtf.reduce_sum(weights)
    loss = mtf.reduce_sum(per_example * weights) / total
    accuracy = mtf.reduce_sum(correct * weights) / total
  return {"logits": logits, "loss": loss, "accuracy": accuracy}


def make_model_fn(hidden_size: int, seed: int) -> Callable:
  """The Trainer's model_fn(mesh, features, mode) -> (loss, {"accuracy"}).

  Evaluation batches carry a "weight" feature (0 for padding).

  Example:
    >>> trainer = mtf.training.Trainer(make_model_fn(1024, seed=1), ...)
  """
  def model_fn(mesh, features, mode):
    del mode  # The model has no dropout: train and eval are the same graph.
    out = mnist_model(mesh, features["image"], features["label"], hidden_size, seed,
                      weights=features.get("weight"))
    return out["loss"], {"accuracy": out["accuracy"]}
  return model_fn


def make_optimizer(name: str, learning_rate: float) -> mtf.optimize.Optimizer:
  """The optimizer called `name` ("sgd", "momentum" or "adam").

  Example:
    >>> opt = make_optimizer("momentum", 0.1)
  """
  if name == "sgd":
    return mtf.optimize.SgdOptimizer(learning_rate)
  if name == "momentum":
    return mtf.optimize.MomentumOptimizer(learning_rate, momentum=0.9)
  if name == "adam":
    return mtf.optimize.AdamWeightDecayOptimizer(learning_rate)
  raise ValueError(f"Unknown optimizer {name!r}; choose sgd, momentum or adam.")


def clear_model_dir(model_dir: str) -> None:
  """Deletes the checkpoints and TensorBoard event files in `model_dir`
  (nothing else, so pointing --model_dir at a directory with other files
  never loses them).

  Example:
    >>> clear_model_dir("/tmp/mesh_tensorflow_mnist")
  """
  patterns = ["checkpoint", "ckpt-*", "events.out.tfevents.*"]
  for pattern in patterns:
    for path in glob.glob(os.path.join(glob.escape(model_dir), pattern)):
      if os.path.isdir(path):
        shutil.rmtree(path)  # A partial save's temporary directory.
      else:
        os.remove(path)


def train(layout: str = "2x4", mesh_shape: str = "", train_steps: int = 600,
          batch_size: int = 128, hidden_size: int = 1024,
          learning_rate: Optional[float] = None, optimizer: str = "sgd", seed: int = 1,
          log_every: int = 100, eval_every: int = 0, model_dir: Optional[str] = None,
          fresh: bool = False, checkpoint_every: int = 200, grad_accum_steps: int = 1,
          log: Callable[[str], None] = print,
          devices: Optional[List[str]] = None, lowering: str = "placement") -> TrainResult:
  """Trains the MLP under one layout and evaluates it on the test split.

  Args:
    layout: layout rules or a preset name (see LAYOUT_PRESETS).
    mesh_shape: mesh shape; empty for the preset's (or the default) mesh.
    train_steps: the global step to train to (a resumed run continues to it).
    batch_size: examples per update.
    hidden_size: size of the hidden layer.
    learning_rate: None for the optimizer's default.
    optimizer: "sgd", "momentum" or "adam".
    seed: seed of the initial weights and of the data order.
    log_every: print a progress line every this many steps (0: never).
    eval_every: print test accuracy every this many steps (0: only at the end).
    model_dir: checkpoints and TensorBoard events go here, and training resumes
      from its checkpoint; None: no checkpoints.
    fresh: delete model_dir's checkpoints and events first.
    checkpoint_every: save every this many steps (and at the end).
    grad_accum_steps: micro-batches per update (must divide batch_size).
    log: where progress lines go.
    lowering: "placement" (PlacementMeshImpl) or "simd" (SimdMeshImpl: one
      program traced once for every processor).
    devices: the mesh's devices (e.g. mtf.cluster.connect(...)); None: logical
      CPUs of this process.

  Returns:
    A TrainResult with this run's per-step losses and the final test metrics.

  Example:
    >>> result = train(layout="data_parallel", train_steps=100)
    >>> result.test_accuracy > 0.8
    True
  """
  rules, mesh_shape = resolve_layout(layout, mesh_shape)
  if learning_rate is None:
    learning_rate = DEFAULT_LEARNING_RATES[optimizer]
  if grad_accum_steps < 1 or batch_size % grad_accum_steps:
    raise ValueError(f"grad_accum_steps={grad_accum_steps} must be >= 1 and divide "
                     f"batch_size={batch_size}.")
  micro_batch = batch_size // grad_accum_steps
  num_processors = mtf.convert_to_shape(mesh_shape).size
  if devices is None:
    devices = configure_cpu_devices(max(num_processors, NUM_CPU_DEVICES))
  if len(devices) < num_processors:
    raise ValueError(f"mesh '{mesh_shape}' has {num_processors} processors but only "
                     f"{len(devices)} devices are available; pick a smaller --mesh_shape.")
  devices = list(devices)[:num_processors]
  if lowering == "simd":
    mesh_impl = mtf.simd_mesh_impl.SimdMeshImpl(mesh_shape, rules, devices)
  elif lowering == "placement":
    mesh_impl = mtf.placement_mesh_impl.PlacementMeshImpl(mesh_shape, rules, devices)
  else:
    raise ValueError(f"--lowering={lowering!r}: use 'placement' or 'simd'.")

  data = load_data()
  dataset = train_dataset(data["train_images"], data["train_labels"], micro_batch, seed)
  test = test_dataset(data["test_images"], data["test_labels"], num_processors)
  num_test = int(test.element_spec["label"].shape[0])

  def shapes(batch: int, weighted: bool) -> Dict[str, str]:
    out = {"image": f"batch:{batch};image_rows:8;image_cols:8", "label": f"batch:{batch}"}
    if weighted:
      out["weight"] = f"batch:{batch}"
    return out

  if model_dir and fresh:
    clear_model_dir(model_dir)
  accum_text = (f" ({grad_accum_steps} micro-batches of {micro_batch})"
                if grad_accum_steps > 1 else "")
  log(f"layout '{rules}' on mesh '{mesh_shape}', optimizer {optimizer} "
      f"(learning rate {learning_rate}), batch {batch_size}{accum_text}, "
      f"hidden {hidden_size}, model_dir {model_dir or '(none)'}")
  start = time.perf_counter()
  trainer = mtf.training.Trainer(
      make_model_fn(hidden_size, seed), shapes(micro_batch, False), mesh_impl,
      make_optimizer(optimizer, learning_rate), model_dir=model_dir or None,
      grad_accum_steps=grad_accum_steps, checkpoint_every=checkpoint_every,
      log_every=log_every, log_fn=log, eval_feature_shapes=shapes(num_test, True))
  start_step = trainer.global_step
  if start_step >= train_steps:
    log(f"model_dir holds step {start_step} >= --train_steps={train_steps}: evaluating "
        "only (raise --train_steps to train on, or pass --fresh to start over)")

  def evaluate_every(step: int, _) -> None:
    if eval_every and step % eval_every == 0 and step != train_steps:
      log(f"step {step}: test accuracy {trainer.evaluate(test)['accuracy']:.4f}")

  history = trainer.train(dataset, steps=train_steps, hooks=[evaluate_every])
  metrics = trainer.evaluate(test)
  seconds = time.perf_counter() - start
  return TrainResult(losses=history["loss"], test_accuracy=metrics["accuracy"],
                     test_loss=metrics["loss"], steps=trainer.global_step,
                     start_step=start_step, seconds=seconds, layout=rules,
                     mesh_shape=mesh_shape)


def main(argv):
  if len(argv) > 1:
    raise cli.UserError(f"unexpected arguments {argv[1:]}: every setting is a --flag",
                        hint="pass --helpfull to list the flags")
  for name in ("train_steps", "batch_size", "hidden_size", "grad_accum_steps"):
    if FLAGS[name].value < 1:
      raise cli.UserError(f"--{name}={FLAGS[name].value}: must be a positive integer")
  for name in ("log_every", "eval_every", "checkpoint_every"):
    if FLAGS[name].value < 0:
      raise cli.UserError(f"--{name}={FLAGS[name].value}: must be >= 0 (0: never)")
  cli.require("sklearn", "examples/mnist.py", 'pip install -e ".[examples]"')
  if not FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)  # INFO would show TF's chatter on every save.
  cluster = mtf.cluster.resolve(FLAGS.cluster)
  devices = mtf.cluster.connect(cluster) if cluster else None  # None: 8 logical CPUs here
  if cluster:
    print(f"cluster: {mtf.cluster.describe_devices(devices)}: {devices[0]} ...", flush=True)
  else:
    configure_cpu_devices(NUM_CPU_DEVICES)
  try:
    with mtf.cluster.exit_on_worker_loss(cluster):  # no-op without a cluster
      result = train(layout=FLAGS.layout, mesh_shape=FLAGS.mesh_shape,
                     train_steps=FLAGS.train_steps, batch_size=FLAGS.batch_size,
                     hidden_size=FLAGS.hidden_size, learning_rate=FLAGS.learning_rate,
                     optimizer=FLAGS.optimizer, seed=FLAGS.seed, log_every=FLAGS.log_every,
                     eval_every=FLAGS.eval_every, model_dir=FLAGS.model_dir,
                     fresh=FLAGS.fresh, checkpoint_every=FLAGS.checkpoint_every,
                     grad_accum_steps=FLAGS.grad_accum_steps, devices=devices,
                     lowering=FLAGS.lowering)
  except ValueError as e:
    if FLAGS.model_dir and "heckpoint" in str(e) and "intact" not in str(e):
      raise cli.UserError(
          str(e), hint=f"if the checkpoint in --model_dir={FLAGS.model_dir} is of another "
          "model, pass --fresh to start over, or another --model_dir") from e
    raise
  print(result.summary_line(), flush=True)


if __name__ == "__main__":
  sys.exit(cli.run_absl_main(main))
