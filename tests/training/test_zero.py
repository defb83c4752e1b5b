"""ZeRO stages 0-3 (mesh_tensorflow.training.zero): same losses, less memory per
device at each stage, reduce-scatter for sharded gradients, checkpoints that
move between stages and meshes. (The small transformer's figures: benchmarks/zero_memory.py;
ZeRO stage 3 with float16 on the transformer: tests/training/test_mixed_precision.py.)"""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.lowering import slice_variables
from mesh_tensorflow.training import zero

import mtf_test_utils

BATCH, FEATURES, HIDDEN, OUT = 16, 32, 64, 8
RNG = np.random.default_rng(0)
X = RNG.normal(size=(3, BATCH, FEATURES)).astype(np.float32)
Y = RNG.normal(size=(3, BATCH, OUT)).astype(np.float32)


def _model(mesh, x, y):
  batch, hidden, out = mtf.Dimension("batch", BATCH), mtf.Dimension("hidden", HIDDEN), \
      mtf.Dimension("out", OUT)
  w1 = mtf.get_variable(mesh, "w1", [x.shape.dims[1], hidden])
  w2 = mtf.get_variable(mesh, "w2", [hidden, out])
  b = mtf.get_variable(mesh, "b", [out], initializer=tf.zeros_initializer())
  h = mtf.relu(mtf.einsum([x, w1], output_shape=[batch, hidden]))
  return mtf.reduce_mean(mtf.square(mtf.einsum([h, w2], output_shape=[batch, out]) + b - y))


def _train(mesh_shape, layout, stage, steps=3, model=_model, record=None, reshard=True):
  """Losses, max per-processor bytes (state, gradients) and collective counts;
  `record` (a dict) also gets what the graph and lowering did with the
  variables."""
  impl = mtf_test_utils.make_impl(mesh_shape, layout)
  optimizer = mtf.optimize.AdamWeightDecayOptimizer(0.01)
  record = {} if record is None else record

  @tf.function(autograph=False)
  def step(x_tf, y_tf):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    x = mtf.import_tf_tensor(mesh, x_tf, f"batch:{BATCH};features:{FEATURES}")
    y = mtf.import_tf_tensor(mesh, y_tf, f"batch:{BATCH};out:{OUT}")
    loss = model(mesh, x, y)
    zero.shard_training_state(graph, impl, stage, reshard_after_forward=reshard)
    variables = graph.trainable_variables
    record["first_backward"] = len(graph.operations)
    grads = zero.shard_gradients(mtf.gradients([loss], [v.outputs[0] for v in variables]),
                                 variables)
    updates = optimizer.apply_grads(grads, variables)
    ops = graph.operations
    record["forward_value_readers"] = {
        v.name: sorted(j for j, op in enumerate(ops) if v.outputs[0] in op.inputs)
        for v in variables}
    record["read_after"] = {v.name: [t.name for t in v.read_after] for v in variables}
    lowering = mtf.Lowering(graph, {mesh: impl})
    record["grads"] = max(zero.tensor_bytes_per_processor(lowering, grads))
    record["collectives"] = lowering.collective_counts()
    record["gathers"] = sorted(r.op_name for r in lowering.collective_records
                               if r.kind == "allgather")
    with tf.control_dependencies([lowering.lowered_operation(u) for u in updates]):
      return tf.identity(lowering.export_to_tf_tensor(loss))

  losses = [float(step(X[i], Y[i])) for i in range(steps)]
  return (losses, max(zero.state_bytes_per_processor(impl)), record["grads"],
          record["collectives"], impl)


@pytest.mark.parametrize("mesh_shape,layout", [("all:8", "batch:all"),
                                               ("rows:2;cols:4", "batch:rows;hidden:cols")])
def test_stages_give_stage0_losses_with_less_memory_each(mesh_shape, layout):
  results = [_train(mesh_shape, layout, stage) for stage in zero.STAGES]
  base_losses = results[0][0]
  totals = []
  for stage, (losses, state, grads, collectives, _) in enumerate(results):
    np.testing.assert_allclose(losses, base_losses, rtol=1e-6, err_msg=f"stage {stage}")
    totals.append(state + grads)
    assert ("reduce_scatter" in collectives) == (stage >= 2), (stage, collectives)
  assert all(b < a for a, b in zip(totals, totals[1:])), totals
  # Slots shrink at stage 1, gradients at 2, variables at 3.
  assert results[1][1] < results[0][1] and results[1][2] == results[0][2]
  assert results[2][2] < results[1][2] and results[2][1] == results[1][1]
  assert results[3][1] < results[2][1]
  if mesh_shape == "all:8":
    assert totals[3] <= totals[0] / 6, totals
  # Stage 3 adds gathers (forward, and again backward) and nothing else.
  c2, c3 = results[2][3], results[3][3]
  assert {k: v for k, v in c3.items() if k != "allgather"} == \
      {k: v for k, v in c2.items() if k != "allgather"}
  assert c3["allgather"][0] > c2["allgather"][0]


def test_sharded_shapes_follow_the_layout():
  impl = mtf_test_utils.make_impl("rows:2;cols:4", "batch:rows;hidden:cols")
  zero.add_zero_rule(impl, "rows")
  shape = mtf.convert_to_shape("features:32;hidden:64")
  twin = zero.sharded_shape(shape, impl, "rows")
  assert twin.dimension_names == ["zero_rows", "hidden"]  # hidden is taken by cols
  assert impl.slice_shape(twin) == [16, 16]
  assert zero.sharded_shape(mtf.convert_to_shape("batch:16;out:8"), impl, "rows") is None
  assert zero.sharded_shape(mtf.convert_to_shape("out:3"), impl, "rows") is None


def test_stage3_variables_are_stored_as_blocks_and_checkpoints_move_between_stages(tmp_path):
  *_, impl3 = _train("rows:2;cols:4", "batch:rows;hidden:cols", 3, steps=2)
  store = slice_variables.variable_store(impl3)
  assert store["w1"].slices[0].shape.as_list() == [16, 16]       # [features/2, hidden/4]
  assert store["w1/adam_m"].slices[0].shape.as_list() == [16, 16]
  expected = {k: store[k].numpy() for k in ("w1", "w2", "b", "w1/adam_v")}
  manager = mtf.checkpoint.CheckpointManager(impl3, str(tmp_path))
  manager.save(2)
  for mesh_shape, layout, stage in [("all:8", "batch:all", 0), ("all:8", "batch:all", 2)]:
    impl = mtf_test_utils.make_impl(mesh_shape, layout)
    mtf.checkpoint.CheckpointManager(impl, str(tmp_path)).restore_or_initialize()
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    _model(mesh, mtf.zeros(mesh, f"batch:{BATCH};features:{FEATURES}"),
           mtf.zeros(mesh, f"batch:{BATCH};out:{OUT}"))
    zero.shard_training_state(graph, impl, stage)
    variables = graph.trainable_variables
    for v in variables:  # the slot, sharded as the stage says
      target = mtf.optimize._update_target(v, False)  # pylint: disable=protected-access
      mtf.optimize._slot(target, "adam_v")  # pylint: disable=protected-access
    mtf.Lowering(graph, {mesh: impl})
    restored = slice_variables.variable_store(impl)
    for name, value in expected.items():
      np.testing.assert_array_equal(restored[name].numpy(), value, err_msg=name)


def test_errors_name_the_stage_and_the_layout():
  impl = mtf_test_utils.make_impl("rows:2;cols:4", "hidden:cols")
  graph = mtf.Graph()
  with pytest.raises(ValueError, match="zero_stage must be one of"):
    zero.shard_training_state(graph, impl, 4)
  with pytest.raises(ValueError, match="does not split 'batch'.*zero_mesh_dim"):
    zero.shard_training_state(graph, impl, 1)
  with pytest.raises(ValueError, match="'depth' is not in the mesh"):
    zero.shard_training_state(graph, impl, 1, mesh_dim="depth")


def test_trainer_zero_with_gradient_accumulation_keeps_sharded_accumulators():
  data = tf.data.Dataset.from_tensor_slices(
      {"x": X.reshape(-1, FEATURES), "y": Y.reshape(-1, OUT)}).batch(BATCH // 2).repeat()
  shapes = {"x": f"batch:{BATCH // 2};features:{FEATURES}", "y": f"batch:{BATCH // 2};out:{OUT}"}

  def model_fn(mesh, features, mode):
    del mode
    return _model_for_batch(mesh, features["x"], features["y"])

  results = {}
  for stage in (0, 2):
    impl = mtf_test_utils.make_impl("rows:2;cols:4", "batch:rows;hidden:cols")
    trainer = mtf.training.Trainer(model_fn, shapes, impl,
                                   mtf.optimize.MomentumOptimizer(0.05, 0.9),
                                   grad_accum_steps=2, zero_stage=stage, log_every=0,
                                   log_fn=lambda line: None)
    results[stage] = trainer.train(data, steps=3)["loss"]
    store = slice_variables.variable_store(impl)
    results[f"acc{stage}"] = store["grad_accumulator/w1"].slices[0].shape.as_list()
  np.testing.assert_allclose(results[2], results[0], rtol=1e-6)
  assert results["acc0"] == [FEATURES, HIDDEN // 4]
  assert results["acc2"] == [FEATURES // 2, HIDDEN // 4]  # reduce-scattered, kept sharded


def _model_for_batch(mesh, x, y):
  batch, hidden, out = x.shape.dims[0], mtf.Dimension("hidden", HIDDEN), y.shape.dims[1]
  w1 = mtf.get_variable(mesh, "w1", [x.shape.dims[1], hidden])
  w2 = mtf.get_variable(mesh, "w2", [hidden, out])
  h = mtf.relu(mtf.einsum([x, w1], output_shape=[batch, hidden]))
  return mtf.reduce_mean(mtf.square(mtf.einsum([h, w2], output_shape=[batch, out]) - y))


def test_a_custom_optimizer_writing_with_mtf_assign_is_told_to_use_self_assign():
  class HalfStep(mtf.optimize.Optimizer):
    def apply_grad(self, grad, var):
      return [mtf.assign(var, self.value(var) - 0.5 * grad)]

  impl = mtf_test_utils.make_impl("all:8", "batch:all")
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  loss = _model(mesh, mtf.zeros(mesh, f"batch:{BATCH};features:{FEATURES}"),
                mtf.zeros(mesh, f"batch:{BATCH};out:{OUT}"))
  zero.shard_training_state(graph, impl, 1)
  variables = graph.trainable_variables
  grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
  with pytest.raises(TypeError, match="update target of variable 'w1'.*Optimizer.assign"):
    HalfStep().apply_grads(grads, variables)


def test_stage3_after_whole_slices_on_the_same_impl_says_how_to_switch():
  *_, impl = _train("all:8", "batch:all", 0, steps=1)
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  _model(mesh, mtf.zeros(mesh, f"batch:{BATCH};features:{FEATURES}"),
         mtf.zeros(mesh, f"batch:{BATCH};out:{OUT}"))
  with pytest.raises(ValueError, match="'w1' already has slices.*restore it into a new mesh"):
    zero.shard_training_state(graph, impl, 3)


LAYERS = 3


def _stage3_step(stage, recompute, reshard=True):
  """Losses of a 3-layer tanh MLP (optionally each layer recomputed) on
  `all:8`, and what its graph and lowering did with the variables."""

  def mlp(mesh, x, y):
    h = x
    for i in range(LAYERS):
      dims = [h.shape.dims[1], mtf.Dimension(f"h{i}", HIDDEN if i < LAYERS - 1 else OUT)]

      def layer(a, i=i, dims=dims):
        w = mtf.get_variable(mesh, f"w{i}", dims)
        return mtf.tanh(mtf.einsum([a, w], output_shape=[a.shape.dims[0], dims[1]]))
      h = mtf.recompute_grad(layer, [h]) if recompute else layer(h)
    return mtf.reduce_mean(mtf.square(mtf.rename_dimension(h, f"h{LAYERS - 1}", "out") - y))
  record = {}
  losses = _train("all:8", "batch:all", stage, model=mlp, record=record, reshard=reshard)[0]
  return losses, record


@pytest.mark.parametrize("recompute", [False, True])
def test_stage3_gathers_again_for_the_backward_pass_instead_of_keeping_the_copy(recompute):
  base, _ = _stage3_step(0, recompute)
  losses, rec = _stage3_step(3, recompute)
  np.testing.assert_allclose(losses, base, rtol=1e-6)
  # The forward pass's gathered copies are read by forward operations only.
  for name, readers in rec["forward_value_readers"].items():
    assert readers and max(readers) < rec["first_backward"], (name, readers)
  forward = [n for n in rec["gathers"] if "read_again" not in n]
  again = [n for n in rec["gathers"] if "read_again" in n]
  assert len(forward) == LAYERS, rec["gathers"]
  # Backward: every layer's weight is read again, except the first layer's
  # when its einsum's input gradient is not needed and nothing recomputes it.
  expected = [f"w{i}/read_again" for i in range(LAYERS) if recompute or i > 0]
  assert sorted(n.split("/read_again")[0] + "/read_again" for n in again) == expected, again
  # Only a few variables ahead: the third waits for the first's reader.
  assert rec["read_after"]["w0"] == [] and rec["read_after"]["w1"] == []
  assert rec["read_after"]["w2"], rec["read_after"]


@pytest.mark.parametrize("recompute", [False, True])
def test_stage3_without_resharding_gathers_once_and_keeps_the_copy(recompute):
  """reshard_after_forward=False (FSDP's SHARD_GRAD_OP): the same losses,
  one gather per variable and step, the backward pass reading the forward
  pass's copies."""
  base, _ = _stage3_step(0, recompute)
  losses, rec = _stage3_step(3, recompute, reshard=False)
  np.testing.assert_allclose(losses, base, rtol=1e-6)
  assert len(rec["gathers"]) == LAYERS and not any("read_again" in n for n in rec["gathers"])
  read_in_backward = [name for name, readers in rec["forward_value_readers"].items()
                      if max(readers) >= rec["first_backward"]]
  assert len(read_in_backward) >= LAYERS - 1, rec["forward_value_readers"]
  with pytest.raises(ValueError, match="reshard_after_forward=False applies to stage 3"):
    zero.shard_training_state(mtf.Graph(), mtf_test_utils.make_impl("all:8", "batch:all"), 2,
                              reshard_after_forward=False)


def test_cost_model_counts_a_stage3_gathered_copy_while_it_is_alive():
  peaks = []
  for stage in (0, 3):
    impl = mtf_test_utils.make_impl("all:8", "batch:all")
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    x = mtf.zeros(mesh, f"batch:{BATCH};features:{FEATURES}")
    w = mtf.get_variable(mesh, "w", f"features:{FEATURES};hidden:{HIDDEN}")
    mtf.einsum([x, w], output_shape=f"batch:{BATCH};hidden:{HIDDEN}")
    zero.shard_training_state(graph, impl, stage)
    peaks.append(mtf.cost_model.memory_estimate(graph, "all:8", impl.layout_rules))
  # Stage 3 stores an eighth of w, and its gathered copy (all of w on every
  # processor) is alive at the product.
  assert peaks[1].variables == peaks[0].variables // 8
  assert peaks[1].activations - peaks[0].activations == FEATURES * HIDDEN * 4


def test_a_graph_with_zero_a_step_counter_and_host_meshes_is_freed():
  """What ZeRO, the optimizer's step counter and offloading remember about a
  graph lives on the graph: once the caller drops it, it is collected (a
  planner that builds thousands of training steps does not keep them)."""
  import gc  # pylint: disable=g-import-not-at-top
  import weakref  # pylint: disable=g-import-not-at-top
  impl = mtf_test_utils.make_impl("all:2", "batch:all")

  def build():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    x = mtf.import_tf_tensor(mesh, tf.constant(X[0]), f"batch:{BATCH};features:{FEATURES}")
    y = mtf.import_tf_tensor(mesh, tf.constant(Y[0]), f"batch:{BATCH};out:{OUT}")
    loss = _model(mesh, x, y)
    zero.shard_training_state(graph, impl, 2)
    assert zero.plan_for(graph) is not None
    mtf.optimize.step_counter(mesh)
    assert mtf.offload.device_mesh_of(mtf.offload.host_mesh(mesh)) is mesh
    variables = graph.trainable_variables
    grads = zero.shard_gradients(mtf.gradients([loss], [v.outputs[0] for v in variables]),
                                 variables)
    mtf.optimize.AdamWeightDecayOptimizer(0.01).apply_grads(grads, variables)
    return weakref.ref(graph)
  graph = build()
  gc.collect()
  assert graph() is None


def _outer_batch_model(mesh, x, y):
  """_model on features with an outer batch dimension: [outer_batch, batch, ...]."""
  outer, batch = x.shape.dims[0], x.shape.dims[1]
  hidden, out = mtf.Dimension("hidden", HIDDEN), mtf.Dimension("out", OUT)
  w1 = mtf.get_variable(mesh, "w1", [x.shape.dims[2], hidden])
  w2 = mtf.get_variable(mesh, "w2", [hidden, out])
  b = mtf.get_variable(mesh, "b", [out], initializer=tf.zeros_initializer())
  h = mtf.relu(mtf.einsum([x, w1], output_shape=[outer, batch, hidden]))
  return mtf.reduce_mean(mtf.square(mtf.einsum([h, w2], output_shape=[outer, batch, out])
                                    + b - y))


@pytest.mark.parametrize("stage", [2, 3])
def test_hybrid_sharding_shards_over_batch_and_reduces_blocks_over_outer_batch(stage):
  """Hybrid sharded data parallelism: "outer_batch:rows;batch:cols" with ZeRO
  shards the state over cols only; each gradient is reduce-scattered over
  cols, and only its quarter is allreduced over rows (the slower links
  between slices or hosts). Same losses as plain data parallelism."""
  # Separate memories, as on accelerators (on shared memory the weight
  # gradients' einsums fuse their sums into gathers).
  impl = mtf_test_utils.make_impl("rows:2;cols:4", "outer_batch:rows;batch:cols",
                                  share_replicas=False)
  optimizer = mtf.optimize.AdamWeightDecayOptimizer(0.01)
  records = []

  @tf.function(autograph=False)
  def step(x_tf, y_tf):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    x = mtf.import_tf_tensor(mesh, tf.reshape(x_tf, [2, BATCH // 2, FEATURES]),
                             f"outer_batch:2;batch:{BATCH // 2};features:{FEATURES}")
    y = mtf.import_tf_tensor(mesh, tf.reshape(y_tf, [2, BATCH // 2, OUT]),
                             f"outer_batch:2;batch:{BATCH // 2};out:{OUT}")
    loss = _outer_batch_model(mesh, x, y)
    plan = zero.shard_training_state(graph, impl, stage)
    assert plan.mesh_dim == "cols"
    variables = graph.trainable_variables
    grads = zero.shard_gradients(mtf.gradients([loss], [v.outputs[0] for v in variables]),
                                 variables)
    updates = optimizer.apply_grads(grads, variables)
    lowering = mtf.Lowering(graph, {mesh: impl})
    records.extend(lowering.collective_records)
    with tf.control_dependencies([lowering.lowered_operation(u) for u in updates]):
      return tf.identity(lowering.export_to_tf_tensor(loss))

  losses = [float(step(X[i], Y[i])) for i in range(3)]
  base = _train("all:8", "batch:all", 0)[0]
  np.testing.assert_allclose(losses, base, rtol=1e-6)
  w1_bytes, w2_bytes = FEATURES * HIDDEN * 4, HIDDEN * OUT * 4
  grads = {(r.kind, r.mesh_axes, r.bytes_per_processor) for r in records
           if r.kind in ("reduce_scatter", "allreduce")}
  # Per variable (w1, w2, b): the whole gradient reduce-scattered over cols
  # (axis 1), then its quarter allreduced over rows (axis 0); nothing whole
  # crosses rows (the loss's scalar sum aside).
  whole = {w1_bytes, w2_bytes, OUT * 4}
  assert {n for kind, axes, n in grads if kind == "reduce_scatter"} == whole, grads
  assert {n for kind, axes, n in grads if kind == "allreduce" and axes == (0,)} == \
      {n // 4 for n in whole}, grads
  assert {(kind, axes) for kind, axes, n in grads if n > 4} == \
      {("reduce_scatter", (1,)), ("allreduce", (0,))}, grads
  # Adam's two slots (and, at stage 3, the variables) in quarters: over cols only.
  total = w1_bytes + w2_bytes + OUT * 4
  expected = total + 2 * total / 4 if stage == 2 else 3 * total / 4
  assert max(zero.state_bytes_per_processor(impl)) == expected
