"""A small convolutional network whose images are split across devices.

Spatial partitioning: each 8x8 digit image (scikit-learn's `load_digits`,
shipped with scikit-learn, nothing is downloaded) is cut along its height into
4 blocks of 2 rows, as the tensor [batch, h_blocks, h, w, channels]. The
layout splits `h_blocks` over a mesh dimension, so each device holds a quarter
of every image. Every convolution first exchanges one-row halos with the
neighbouring blocks (`mtf.halo_exchange`, permutes between neighbouring
devices) and then convolves its blocks locally; the result equals the
convolution of the whole image. The model:

    conv 3x3 (16 filters) -> tanh -> conv 3x3 (16) -> tanh -> max pool 2x2
    -> conv 3x3 (32) -> tanh -> dense to 10 classes

Layouts change where the work happens, never the result: for one seed every
layout gives the same loss curve up to float rounding (layouts sum in
different orders). The activation is tanh because it is smooth: with
`--activation=relu`, a pre-activation within rounding distance of 0 now and
then falls on different sides of the kink under two layouts, and from that
step on the curves part visibly (here after some 40 steps), while with tanh
they stay within about 1e-5 relative for hundreds of steps. By default the script
trains under the spatially partitioned layout and the unpartitioned one
(everything on one device) and prints both curves and their largest
difference:

    python examples/conv_spatial.py
    python examples/conv_spatial.py --layouts=spatial,spatial_data,data_parallel,single
    python examples/conv_spatial.py --layouts="h_blocks:all" --train_steps=300

Each run ends with a machine readable line:

    final: layout='...' mesh_shape='...' steps=200 loss=... test_accuracy=... losses=[...]
"""

from __future__ import annotations

import os
if __name__ == "__main__":
  os.environ.setdefault("MTF_COMMAND_LINE", "1")  # quiet TensorFlow's start-up lines
from mesh_tensorflow import cli  # noqa: E402  (imports TensorFlow, quietly when run)

import math
import sys
import time
from typing import Callable, Dict, List, Tuple

import tensorflow as tf

# Eight logical CPU devices stand in for accelerators (before TF touches devices).
_CPU = tf.config.list_physical_devices("CPU")[0]
try:
  tf.config.set_logical_device_configuration(
      _CPU, [tf.config.LogicalDeviceConfiguration()] * 8)
except RuntimeError:
  pass  # Already initialized (e.g. imported by a test that configured them).

from absl import flags  # noqa: E402
import numpy as np  # noqa: E402

import mesh_tensorflow as mtf  # noqa: E402
from mesh_tensorflow.layers import convolution as conv_layers  # noqa: E402

NUM_DEVICES = 8
IMAGE_SIZE = 8
H_BLOCKS = 4                     # blocks along the image height
BLOCK_ROWS = IMAGE_SIZE // H_BLOCKS

# Named layouts: preset -> (layout rules, mesh shape).
LAYOUT_PRESETS: Dict[str, Tuple[str, str]] = {
    "spatial": ("h_blocks:space", "space:4"),
    "spatial_data": ("h_blocks:space;batch:data", "space:4;data:2"),
    "data_parallel": ("batch:all", "all:8"),
    "single": ("", "all:1"),
}

FLAGS = flags.FLAGS
flags.DEFINE_list(
    "layouts", ["spatial", "single"],
    "Comma-separated layouts to train under, each a preset ("
    + ", ".join(f"{k}: '{v[0]}' on '{v[1]}'" for k, v in LAYOUT_PRESETS.items())
    + ") or layout rules such as 'h_blocks:all' (on --mesh_shape).")
flags.DEFINE_string("mesh_shape", "all:4", "Mesh shape for layouts given as rules.")
flags.DEFINE_integer("train_steps", 200, "Training steps per layout.")
flags.DEFINE_integer("batch_size", 64, "Batch size (divisible by any mesh dimension splitting it).")
flags.DEFINE_float("learning_rate", 0.05, "Learning rate of momentum SGD.")
flags.DEFINE_float("momentum", 0.9, "Momentum.")
flags.DEFINE_integer("seed", 1, "Seed of the data order.")
flags.DEFINE_enum("activation", "tanh", ["gelu", "relu", "tanh"],
                  "Activation after each convolution.")
flags.DEFINE_integer("log_every", 50, "Print the training loss every this many steps.")


def load_data() -> Dict[str, np.ndarray]:
  """Digit images in [0, 1] as [n, 8, 8] float32 and int32 labels; a fixed
  shuffled 20% is the test set.

  Example:
    >>> data = load_data(); data["train_images"].shape
    (1438, 8, 8)
  """
  from sklearn.datasets import load_digits  # pylint: disable=import-outside-toplevel
  digits = load_digits()
  order = np.random.RandomState(0).permutation(len(digits.target))
  images = (digits.images[order] / 16.0).astype(np.float32)
  labels = digits.target[order].astype(np.int32)
  split = len(images) - int(round(0.2 * len(images)))
  return {"train_images": images[:split], "train_labels": labels[:split],
          "test_images": images[split:], "test_labels": labels[split:]}


def resolve_layout(layout: str, mesh_shape: str) -> Tuple[str, str]:
  """(rules, mesh shape) of a preset name or of explicit rules.

  Example:
    >>> resolve_layout("spatial", "")
    ('h_blocks:space', 'space:4')
  """
  if layout in LAYOUT_PRESETS:
    return LAYOUT_PRESETS[layout]
  return layout, mesh_shape


ACTIVATIONS = {"tanh": mtf.tanh, "relu": mtf.relu, "gelu": mtf.gelu}


def conv_model(mesh: mtf.Mesh, images: tf.Tensor, labels: tf.Tensor,
               weights: tf.Tensor, activation: str = "tanh") -> Dict[str, mtf.Tensor]:
  """The network on `mesh` for one batch of [batch, 8, 8] images.

  Args:
    mesh: the mtf mesh (of a fresh graph).
    images: float32 [batch, 8, 8].
    labels: int32 [batch].
    weights: float32 [batch]: 1 for real examples, 0 for padding.
    activation: "tanh", "relu" or "gelu".

  Returns:
    {"loss": weighted mean cross-entropy, "num_correct": weighted count}.

  Example:
    >>> out = conv_model(mesh, images, labels, tf.ones([64]))
  """
  batch = mtf.Dimension("batch", int(images.shape[0]))
  h_blocks = mtf.Dimension("h_blocks", H_BLOCKS)
  rows = mtf.Dimension("h", BLOCK_ROWS)
  cols = mtf.Dimension("w", IMAGE_SIZE)
  channels = mtf.Dimension("channels", 1)
  classes = mtf.Dimension("classes", 10)
  activation_fn = ACTIVATIONS[activation]
  # Row r of an image is row r % 2 of block r // 2: a plain reshape.
  blocked = tf.reshape(images, [batch.size, H_BLOCKS, BLOCK_ROWS, IMAGE_SIZE, 1])
  x = mtf.import_tf_tensor(mesh, blocked, [batch, h_blocks, rows, cols, channels])

  def conv_act(t, filters: int, name: str):
    out_dim = mtf.Dimension(f"{name}_filters", filters)
    bias = mtf.get_variable(mesh, f"{name}/bias", [out_dim],
                            initializer=tf.zeros_initializer())
    y = conv_layers.conv2d_with_blocks(t, out_dim, (3, 3), (1, 1), "SAME",
                                       h_blocks_dim=h_blocks, name=name)
    return activation_fn(y + bias)

  h = conv_act(x, 16, "conv1")
  h = conv_act(h, 16, "conv2")
  h = conv_layers.max_pool2d(h, (2, 2), h_blocks_dim=h_blocks)   # 4x4, 1 row per block
  h = conv_act(h, 32, "conv3")
  dense = mtf.get_variable(mesh, "dense/kernel", h.shape.dims[1:] + [classes])
  bias = mtf.get_variable(mesh, "dense/bias", [classes], initializer=tf.zeros_initializer())
  logits = mtf.einsum([h, dense], output_shape=[batch, classes]) + bias

  y = mtf.import_tf_tensor(mesh, labels, [batch])
  w = mtf.import_tf_tensor(mesh, weights, [batch])
  one_hot = mtf.one_hot(y, classes, dtype=logits.dtype)
  per_example = (mtf.reduce_logsumexp(logits, classes)
                 - mtf.reduce_sum(logits * one_hot, reduced_dim=classes))
  correct = mtf.cast(mtf.equal(mtf.argmax(logits, classes), y), tf.float32)
  return {"loss": mtf.reduce_sum(per_example * w) / mtf.reduce_sum(w),
          "num_correct": mtf.reduce_sum(correct * w)}


def train(layout: str, mesh_shape: str = "all:4", train_steps: int = 200,
          batch_size: int = 64, learning_rate: float = 0.05, momentum: float = 0.9,
          seed: int = 1, log_every: int = 50, activation: str = "tanh",
          log: Callable[[str], None] = print) -> Dict[str, object]:
  """Trains the network under one layout; returns its losses and accuracy.

  Args:
    layout: a preset name or layout rules.
    mesh_shape: the mesh shape for layout rules (presets bring their own).
    train_steps: number of training steps.
    batch_size: examples per step.
    learning_rate: momentum SGD learning rate.
    momentum: momentum SGD momentum.
    seed: seed of the data order.
    log_every: print the loss every this many steps (0: never).
    activation: "tanh", "relu" or "gelu".
    log: where progress lines go.

  Returns:
    {"losses": [...], "test_accuracy": float, "layout": str, "mesh_shape": str,
     "seconds": float}.

  Example:
    >>> result = train("spatial", train_steps=20)
  """
  rules, mesh_shape = resolve_layout(layout, mesh_shape)
  size = mtf.convert_to_shape(mesh_shape).size
  devices = [d.name for d in tf.config.list_logical_devices("CPU")][:size]
  mesh_impl = mtf.placement_mesh_impl.PlacementMeshImpl(mesh_shape, rules, devices)
  data = load_data()
  ds = tf.data.Dataset.from_tensor_slices((data["train_images"], data["train_labels"]))
  ds = ds.shuffle(len(data["train_labels"]), seed=seed, reshuffle_each_iteration=True)
  ds = ds.repeat().batch(batch_size, drop_remainder=True)
  ones = tf.ones([batch_size], tf.float32)

  # The test set in one batch, padded (with weight 0) to a multiple of 8.
  num_test = len(data["test_labels"])
  pad = -num_test % NUM_DEVICES
  test_images = tf.constant(np.pad(data["test_images"], [(0, pad), (0, 0), (0, 0)]))
  test_labels = tf.constant(np.pad(data["test_labels"], [(0, pad)]))
  test_weights = tf.constant(np.pad(np.ones(num_test, np.float32), [(0, pad)]))

  traced = {}

  @tf.function(autograph=False, input_signature=[
      tf.TensorSpec([batch_size, IMAGE_SIZE, IMAGE_SIZE], tf.float32),
      tf.TensorSpec([batch_size], tf.int32)])
  def train_step(images, labels):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "conv_mesh")
    loss = conv_model(mesh, images, labels, ones, activation)["loss"]
    variables = graph.trainable_variables
    grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
    optimizer = mtf.optimize.MomentumOptimizer(learning_rate, momentum=momentum)
    updates = optimizer.apply_grads(grads, variables)
    lowering = mtf.Lowering(graph, {mesh: mesh_impl})
    traced["collectives"] = lowering.collective_counts()
    with tf.control_dependencies([lowering.lowered_operation(u) for u in updates]):
      return tf.identity(lowering.export_to_tf_tensor(loss))

  @tf.function(autograph=False)
  def eval_step():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "conv_mesh")
    out = conv_model(mesh, test_images, test_labels, test_weights, activation)
    lowering = mtf.Lowering(graph, {mesh: mesh_impl})
    return lowering.export_to_tf_tensor(out["num_correct"]) / float(num_test)

  log(f"layout '{rules}' on mesh '{mesh_shape}' ({size} devices)")
  start = time.perf_counter()
  losses: List[float] = []
  for step, (images, labels) in enumerate(ds.take(train_steps), start=1):
    losses.append(float(train_step(images, labels)))
    if step == 1:
      counts = ", ".join(f"{n} {kind}" for kind, (n, _) in sorted(traced["collectives"].items()))
      log(f"  collectives per training step: {counts or 'none'}")
    if log_every and step % log_every == 0:
      log(f"  step {step}: loss {losses[-1]:.6f}")
  accuracy = float(eval_step())
  return {"losses": losses, "test_accuracy": accuracy, "layout": rules,
          "mesh_shape": mesh_shape, "seconds": time.perf_counter() - start}


def main(argv):
  if len(argv) > 1:
    raise cli.UserError(f"unexpected arguments {argv[1:]}: every setting is a --flag",
                        hint="pass --helpfull to list the flags")
  cli.require("sklearn", "examples/conv_spatial.py", 'pip install -e ".[examples]"')
  results = []
  for layout in FLAGS.layouts:
    r = train(layout, FLAGS.mesh_shape, FLAGS.train_steps, FLAGS.batch_size,
              FLAGS.learning_rate, FLAGS.momentum, FLAGS.seed, FLAGS.log_every,
              FLAGS.activation)
    results.append(r)
    print(f"  test accuracy {r['test_accuracy']:.4f} ({r['seconds']:.1f} s)")
    print(f"final: layout='{r['layout']}' mesh_shape='{r['mesh_shape']}' "
          f"steps={len(r['losses'])} loss={r['losses'][-1]:.6f} "
          f"test_accuracy={r['test_accuracy']:.4f} "
          f"losses=[{','.join(f'{v:.7g}' for v in r['losses'])}]", flush=True)
  if len(results) > 1:
    base = np.array(results[0]["losses"])
    worst = max(float(np.max(np.abs(np.array(r["losses"]) - base))) for r in results[1:])
    scale = float(np.max(np.abs(base)))
    agree = worst <= 1e-3 * max(scale, 1.0) and all(
        math.isfinite(v) for r in results for v in r["losses"])
    print(f"max |loss difference| between layouts: {worst:.3g} "
          f"(largest loss {scale:.3g}); loss curves agree: {agree}")


if __name__ == "__main__":
  sys.exit(cli.run_absl_main(main))
