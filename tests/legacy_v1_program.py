"""A legacy TF1-style program, as ported Mesh TensorFlow code runs it: V2
behaviour disabled first (graph mode, V1 TensorShapes, V1 control flow,
reference variables by default), then an mtf graph lowered into a tf.Graph and
trained with a Session on a 2x4 mesh of logical CPUs.

Prints one line "losses: l0 l1 ..." (the loss before each SGD step) and
"loop: v" (a while_loop's result); tests/compat/test_v1_tensorshape.py runs it and
compares with the same program under TF2 behaviour (`--v2`).
"""

import sys

import numpy as np
import tensorflow.compat.v1 as tf

if "--v2" not in sys.argv:
  tf.disable_v2_behavior()

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 8)

import mesh_tensorflow as mtf  # noqa: E402  pylint: disable=g-import-not-at-top


def build(graph: mtf.Graph, mesh: mtf.Mesh, x_np, y_np):
  batch, pixels = mtf.Dimension("batch", 16), mtf.Dimension("pixels", 12)
  hidden, classes = mtf.Dimension("hidden", 8), mtf.Dimension("classes", 4)
  x = mtf.import_tf_tensor(mesh, tf.constant(x_np), [batch, pixels])
  y = mtf.import_tf_tensor(mesh, tf.constant(y_np), [batch])
  h = mtf.layers.dense(x, hidden, activation=mtf.relu, name="hidden",
                       kernel_initializer=tf.constant_initializer(0.05))
  h = mtf.shift(h, 1, hidden, wrap=False) + h
  logits = mtf.layers.dense(h, classes, name="logits",
                            kernel_initializer=tf.constant_initializer(-0.03))
  loss = mtf.reduce_mean(mtf.layers.softmax_cross_entropy_with_logits(
      logits, mtf.one_hot(y, classes), classes))
  grads = mtf.gradients([loss], [v.outputs[0] for v in graph.trainable_variables])
  updates = mtf.optimize.SgdOptimizer(0.5).apply_grads(grads, graph.trainable_variables)
  i0 = mtf.constant(mesh, 0, dtype=tf.int32)
  _, total = mtf.while_loop(lambda i, t: mtf.less(i, 3),
                            lambda i, t: [i + 1, t + mtf.reduce_sum(x)],
                            [i0, mtf.zeros(mesh, [], tf.float32)])
  return loss, updates, total


def main():
  rs = np.random.RandomState(0)
  x_np = rs.randn(16, 12).astype(np.float32)
  y_np = rs.randint(0, 4, size=16).astype(np.int32)
  with tf.Graph().as_default():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    loss, updates, total = build(graph, mesh, x_np, y_np)
    impl = mtf.placement_mesh_impl.PlacementMeshImpl(
        "rows:2;cols:4", "batch:rows;hidden:cols", [f"cpu:{i}" for i in range(8)])
    lowering = mtf.Lowering(graph, {mesh: impl})
    tf_loss = lowering.export_to_tf_tensor(loss)
    tf_total = lowering.export_to_tf_tensor(total)
    train_op = tf.group([lowering.lowered_operation(u) for u in updates])
    with tf.Session() as sess:
      sess.run(tf.global_variables_initializer())
      losses = []
      for _ in range(4):
        value, _ = sess.run([tf_loss, train_op])
        losses.append(value)
      loop_value = sess.run(tf_total)
  print("losses:", " ".join(f"{v:.6f}" for v in losses))
  print("loop:", f"{loop_value:.4f}", f"expected {3 * x_np.sum():.4f}")


if __name__ == "__main__":
  main()
