"""The README's TF2 example: build an mtf model, lower it onto a 2x4 mesh of
8 logical CPU devices inside a tf.function, and train it for a few steps.

    python examples/quickstart.py
"""
import numpy as np
import tensorflow as tf

# 8 logical CPU devices stand in for accelerators (before TF touches devices).
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 8)

import mesh_tensorflow as mtf  # noqa: E402

batch = mtf.Dimension("batch", 64)
features = mtf.Dimension("features", 32)
hidden = mtf.Dimension("hidden", 128)

# The layout: split "batch" over mesh rows and "hidden" over mesh columns.
mesh_impl = mtf.placement_mesh_impl.PlacementMeshImpl(
    "rows:2;cols:4", "batch:rows;hidden:cols", ["cpu:%d" % i for i in range(8)])


def build(x_tf, y_tf):
  """The model as an mtf graph: returns (graph, mesh, loss, update ops)."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.import_tf_tensor(mesh, x_tf, [batch, features])
  y = mtf.import_tf_tensor(mesh, y_tf, [batch])
  w1 = mtf.get_variable(mesh, "w1", [features, hidden])
  w2 = mtf.get_variable(mesh, "w2", [hidden])
  h = mtf.relu(mtf.einsum([x, w1], output_shape=[batch, hidden]))
  prediction = mtf.einsum([h, w2], output_shape=[batch])
  loss = mtf.reduce_mean(mtf.square(prediction - y))
  variables = graph.trainable_variables
  grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
  updates = [mtf.assign_sub(v, g * 0.05) for v, g in zip(variables, grads)]
  return graph, mesh, loss, updates


@tf.function(autograph=False)
def train_step(x_tf, y_tf):
  graph, mesh, loss, updates = build(x_tf, y_tf)
  # Slice variables are created on the first trace and reused afterwards.
  lowering = mtf.Lowering(graph, {mesh: mesh_impl})
  print(mtf.pretty_print_counters(lowering.counters))  # runs while tracing
  with tf.control_dependencies([lowering.lowered_operation(u) for u in updates]):
    return tf.identity(lowering.export_to_tf_tensor(loss))


rng = np.random.default_rng(0)
x = rng.normal(size=(64, 32)).astype(np.float32)
y = x[:, :4].sum(axis=1).astype(np.float32)
first = float(train_step(x, y))
for _ in range(100):
  loss = float(train_step(x, y))
print(f"loss: first step {first:.4f}, after 100 steps {loss:.4f}")
