"""CPU offload of optimizer state (mesh_tensorflow.training.offload): slot variables
and their updates live on each processor's host device, results equal those
without offload. (Run on CPU devices only: each processor's "host" is mapped
to another logical CPU so that the placement is observable.)"""

import numpy as np
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.lowering import slice_variables

import mtf_test_utils

BATCH, FEATURES, HIDDEN = 16, 16, 32
RNG = np.random.default_rng(0)
X = RNG.normal(size=(3, BATCH, FEATURES)).astype(np.float32)
Y = RNG.normal(size=(3, BATCH)).astype(np.float32)
MESH, LAYOUT = "rows:2;cols:4", "batch:rows;hidden:cols"


def _host(device):
  """Processor k's 'host': logical CPU 7 - k."""
  return "/job:localhost/replica:0/task:0/device:CPU:%d" % (
      7 - tf.DeviceSpec.from_string(device).device_index)


def _cpu_index(device):
  spec = tf.DeviceSpec.from_string(device)
  assert spec.device_type == "CPU", device
  return spec.device_index


def _model(mesh, x, y):
  hidden = mtf.Dimension("hidden", HIDDEN)
  w1 = mtf.get_variable(mesh, "w1", [x.shape.dims[1], hidden])
  w2 = mtf.get_variable(mesh, "w2", [hidden])
  h = mtf.relu(mtf.einsum([x, w1], output_shape=[x.shape.dims[0], hidden]))
  return mtf.reduce_mean(mtf.square(mtf.einsum([h, w2], output_shape=y.shape) - y))


def _train(offload_slots):
  impl = mtf_test_utils.make_impl(MESH, LAYOUT, share_replicas=False)
  optimizer = mtf.optimize.AdamWeightDecayOptimizer(0.01, offload_slots=offload_slots)

  @tf.function(autograph=False)
  def step(x_tf, y_tf):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    x = mtf.import_tf_tensor(mesh, x_tf, f"batch:{BATCH};features:{FEATURES}")
    y = mtf.import_tf_tensor(mesh, y_tf, f"batch:{BATCH}")
    loss = _model(mesh, x, y)
    variables = graph.trainable_variables
    grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
    updates = optimizer.apply_grads(grads, variables)
    lowering = mtf.Lowering(graph, mtf.offload.lowering_map(graph, {mesh: impl}, _host))
    with tf.control_dependencies([lowering.lowered_operation(u) for u in updates]):
      return tf.identity(lowering.export_to_tf_tensor(loss))

  losses = [float(step(X[i], Y[i])) for i in range(3)]
  return losses, slice_variables.variable_store(impl), impl


def test_slots_live_and_update_on_the_host_with_equal_results():
  losses, store, impl = _train(offload_slots=True)
  reference, ref_store, _ = _train(offload_slots=False)
  np.testing.assert_allclose(losses, reference, rtol=1e-6)
  for name in ("w1", "w2", "w1/adam_m", "w1/adam_v", "w2/adam_v"):
    np.testing.assert_allclose(store[name].numpy(), ref_store[name].numpy(), rtol=1e-6,
                               atol=1e-7, err_msg=name)
  for pnum in range(impl.size):
    assert _cpu_index(store["w1"].slices[pnum].device) == pnum
    for slot in ("w1/adam_m", "w2/adam_v"):
      assert _cpu_index(store[slot].slices[pnum].device) == 7 - pnum, (slot, pnum)


def test_graph_ops_of_the_slot_update_run_on_the_host():
  impl = mtf_test_utils.make_impl(MESH, LAYOUT, share_replicas=False)
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  loss = _model(mesh, mtf.zeros(mesh, f"batch:{BATCH};features:{FEATURES}"),
                mtf.ones(mesh, f"batch:{BATCH}"))
  variables = graph.trainable_variables
  grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
  updates = mtf.optimize.MomentumOptimizer(0.1, 0.9, offload_slots=True).apply_grads(
      grads, variables)
  velocity = [op for op in updates if op.assigned_variables[0].name == "w1/momentum"][0]
  host = mtf.offload.host_mesh(mesh)
  assert velocity.mesh is host and velocity.inputs[0].mesh is host  # update math on host
  with tf.Graph().as_default():
    lowering = mtf.Lowering(graph, mtf.offload.lowering_map(graph, {mesh: impl}, _host))
    new_velocity = lowering.laid_out(velocity.inputs[0]).tensor_list
    for pnum in range(impl.size):
      assert _cpu_index(new_velocity[pnum].device) == 7 - pnum


def test_trainer_with_offloaded_slots_and_zero_matches_plain_training():
  data = tf.data.Dataset.from_tensor_slices(
      {"x": X.reshape(-1, FEATURES), "y": Y.reshape(-1)}).batch(BATCH).repeat()
  shapes = {"x": f"batch:{BATCH};features:{FEATURES}", "y": f"batch:{BATCH}"}

  def model_fn(mesh, features, mode):
    del mode
    return _model(mesh, features["x"], features["y"])

  results = []
  for offload_slots, stage in ((False, 0), (True, 0), (True, 2)):
    impl = mtf_test_utils.make_impl(MESH, LAYOUT)
    trainer = mtf.training.Trainer(
        model_fn, shapes, impl,
        mtf.optimize.AdamWeightDecayOptimizer(0.01, offload_slots=offload_slots),
        log_every=0, log_fn=lambda line: None, zero_stage=stage)
    results.append(trainer.train(data, steps=3)["loss"])
    assert "w1/adam_m" in slice_variables.variable_store(impl)  # checkpointed with the rest
  np.testing.assert_allclose(results[1], results[0], rtol=1e-6)
  np.testing.assert_allclose(results[2], results[0], rtol=1e-6)


def test_host_device_of_an_accelerator():
  assert (mtf.offload.host_device("/job:worker/task:1/device:GPU:3")
          == "/job:worker/task:1/device:CPU:0")
  assert mtf.offload.host_device("/device:CPU:5") == "/device:CPU:5"
