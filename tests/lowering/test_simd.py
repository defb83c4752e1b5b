"""SimdMeshImpl: one program for every processor gives the placement
lowering's results, values and gradients, on meshes [8], [2,4] and [2,2,2]."""

import random

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import mesh_tensorflow as mtf
from mesh_tensorflow import simd_mesh_impl

import graph_generator as gg
import mtf_test_utils
from mtf_test_utils import DEVICES

MESHES = [("all:8", "batch:all"), ("rows:2;cols:4", "batch:rows;hidden:cols"),
          ("a:2;b:2;c:2", "batch:a;hidden:b;out:c")]
BATCH, FEATURES, HIDDEN, OUT = 8, 4, 16, 4


@settings(max_examples=1, deadline=None, derandomize=True, database=None,
          phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_random_graphs_match_numpy(seed):
  """Random programs over the whole op library (tests/graph_generator.py),
  lowered by the SIMD implementation on all three meshes."""
  case = gg.generate_case(seed, num_ops=8)
  result = gg.check_case(case, random.Random(seed), DEVICES, mode="simd")
  assert not result.problems, case.describe() + "\n" + "\n".join(result.problems)
  assert result.lowerings >= 3


def _mlp(mesh, x_tf, y_tf):
  batch = mtf.Dimension("batch", BATCH)
  features = mtf.Dimension("features", FEATURES)
  hidden = mtf.Dimension("hidden", HIDDEN)
  out = mtf.Dimension("out", OUT)
  x = mtf.import_tf_tensor(mesh, x_tf, [batch, features])
  y = mtf.import_tf_tensor(mesh, y_tf, [batch, out])
  w1 = mtf.get_variable(mesh, "w1", [features, hidden])
  w2 = mtf.get_variable(mesh, "w2", [hidden, out])
  h = mtf.dropout(mtf.relu(mtf.einsum([x, w1], output_shape=[batch, hidden])), rate=0.25)
  pred = mtf.einsum([h, w2], output_shape=[batch, out])
  loss = mtf.reduce_mean(mtf.square(pred - y))
  variables = mesh.graph.trainable_variables
  grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
  updates = [mtf.assign_sub(v, g * 0.1) for v, g in zip(variables, grads)]
  return loss, grads, updates


def _train_mlp(impl, steps=3):
  rng = np.random.RandomState(0)
  x = rng.randn(BATCH, FEATURES).astype(np.float32)
  y = rng.randn(BATCH, OUT).astype(np.float32)
  records = {}

  def step(x_tf, y_tf):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    loss, grads, updates = _mlp(mesh, x_tf, y_tf)
    lowering = mtf.Lowering(graph, {mesh: impl})
    records["lowering"] = lowering
    ops = [lowering.lowered_operation(u) for u in updates]
    exported = [lowering.export_to_tf_tensor(t) for t in [loss] + grads]
    with tf.control_dependencies(ops):
      return [tf.identity(t) for t in exported]

  history = []
  for _ in range(steps):
    if isinstance(impl, simd_mesh_impl.SimdMeshImpl):
      values = impl.run(step, x, y)
    else:
      values = tf.function(step, autograph=False)(tf.constant(x), tf.constant(y))
    history.append([v.numpy() for v in values])
  store = mtf.slice_variables.variable_store(impl)
  return history, {n: store[n].numpy() for n in ("w1", "w2")}, records["lowering"]


@pytest.mark.parametrize("mesh_shape,layout", MESHES)
def test_mlp_training_matches_placement(mesh_shape, layout):
  """Losses, gradients (dropout included) and trained weights over 3 steps."""
  simd = simd_mesh_impl.SimdMeshImpl(mesh_shape, layout, DEVICES)
  placement = mtf_test_utils.make_impl(mesh_shape, layout)
  got, got_w, got_lowering = _train_mlp(simd)
  want, want_w, want_lowering = _train_mlp(placement)
  for step_got, step_want in zip(got, want):
    for a, b in zip(step_got, step_want):
      mtf_test_utils.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  for name in want_w:
    mtf_test_utils.assert_allclose(got_w[name], want_w[name], rtol=1e-5, atol=1e-6)
  # Both lowerings count the collectives the layout implies, identically
  # (the SIMD export also gathers the split gradients to every processor).
  def graph_collectives(lowering):
    return sorted((r.kind, r.mesh_axes, r.bytes_per_processor)
                  for r in lowering.collective_records if not r.op_name.startswith("export/"))
  assert graph_collectives(got_lowering) == graph_collectives(want_lowering)
  assert graph_collectives(want_lowering)


def test_device_order_does_not_change_results():
  """TensorFlow ranks a collective group's members by device name; the SIMD
  program reorders gathered slices to mesh order whatever the device list."""
  mesh_shape, layout = "rows:2;cols:4", "batch:rows;hidden:cols"
  shuffled = [DEVICES[i] for i in (5, 2, 7, 0, 3, 6, 1, 4)]
  got, _, _ = _train_mlp(simd_mesh_impl.SimdMeshImpl(mesh_shape, layout, shuffled), steps=1)
  want, _, _ = _train_mlp(mtf_test_utils.make_impl(mesh_shape, layout), steps=1)
  for a, b in zip(got[0], want[0]):
    mtf_test_utils.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mesh_shape,layout", MESHES)
def test_collectives_inside_while_loop(mesh_shape, layout):
  """A loop whose body allreduces (a mean over a split dimension) and permutes
  (a shift along a split dimension): the placement lowering's values."""
  rng = np.random.RandomState(3)
  x_np = rng.randn(BATCH, HIDDEN).astype(np.float32)
  batch, hidden = mtf.Dimension("batch", BATCH), mtf.Dimension("hidden", HIDDEN)

  def run(impl):
    def step(x_tf):
      graph = mtf.Graph()
      mesh = mtf.Mesh(graph, "mesh")
      x = mtf.import_tf_tensor(mesh, x_tf, [batch, hidden])

      def body(i, v):
        centred = v - mtf.reduce_mean(v, reduced_dim=hidden)
        return [i + 1, mtf.tanh(centred) + mtf.shift(v, 1, batch, wrap=True) * 0.5]
      _, out = mtf.while_loop(lambda i, v: mtf.less(i, 3), body,
                              [mtf.constant(mesh, 0, dtype=tf.int32), x])
      lowering = mtf.Lowering(graph, {mesh: impl})
      kinds = {r.kind for r in lowering.collective_records
               if not r.op_name.startswith("export/")}
      return lowering.export_to_tf_tensor(out), kinds
    if isinstance(impl, simd_mesh_impl.SimdMeshImpl):
      kinds = {}
      def program(x_tf):
        value, kinds["k"] = step(x_tf)
        return value
      return impl.run(program, x_np).numpy(), kinds["k"]
    value, kinds = step(tf.constant(x_np))
    return value.numpy(), kinds

  got, kinds = run(simd_mesh_impl.SimdMeshImpl(mesh_shape, layout, DEVICES))
  want, _ = run(mtf_test_utils.make_impl(mesh_shape, layout))
  v = x_np
  for _ in range(3):
    v = np.tanh(v - v.mean(axis=1, keepdims=True)) + np.roll(v, 1, axis=0) * 0.5
  mtf_test_utils.assert_allclose(want, v, rtol=1e-5, atol=1e-5)
  mtf_test_utils.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
  split = {d.split(":")[0] for d in layout.split(";")}
  # The loop really communicates where the layout splits what it touches.
  assert ("allreduce" in kinds) == ("hidden" in split)
  assert ("permute" in kinds) == ("batch" in split)


def test_shift_with_split_replicas():
  """A shift that sends blocks of a replicated slice (SliceAlong, a
  CollectivePermute of the blocks, an all-gather): np.roll's values."""
  x_np = np.arange(BATCH * HIDDEN, dtype=np.float32).reshape(BATCH, HIDDEN)
  impl = simd_mesh_impl.SimdMeshImpl("rows:2;cols:4", "batch:rows", DEVICES)
  records = {}

  def program(x_tf):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    x = mtf.import_tf_tensor(mesh, x_tf, [mtf.Dimension("batch", BATCH),
                                          mtf.Dimension("hidden", HIDDEN)])
    y = mtf.shift(x, 1, "batch", wrap=True, split_replicas=True)
    lowering = mtf.Lowering(graph, {mesh: impl})
    records["r"] = sorted((r.kind, r.mesh_axes) for r in lowering.collective_records
                          if not r.op_name.startswith("export/"))
    return lowering.export_to_tf_tensor(y)
  got = impl.run(program, x_np).numpy()
  np.testing.assert_array_equal(got, np.roll(x_np, 1, axis=0))
  assert records["r"] == [("allgather", (1,)), ("permute", (0,))]


def test_interleaved_pipeline_matches_placement():
  """The interleaved pipeline schedule (4 stages x 2 layer chunks: sends
  that wrap round, per-slot one-hot chunk picks, explicit backward slots):
  the placement lowering's loss and gradients."""
  from mesh_tensorflow.training import pipeline as pl  # pylint: disable=g-import-not-at-top
  rng = np.random.RandomState(0)
  x_np = rng.randn(BATCH, FEATURES).astype(np.float32)
  t_np = rng.randn(BATCH, FEATURES).astype(np.float32)
  mesh_shape, layout = "pp:4;dp:2", "stages:pp;batch:dp"
  features = mtf.Dimension("features", FEATURES)

  def stage_fn(h):
    w = mtf.get_variable(h.mesh, "w", [features, mtf.Dimension("f2", FEATURES)],
                         initializer=mtf.initializers.random_normal(stddev=0.5))
    y = mtf.einsum([h, w], output_shape=h.shape - [features] + [mtf.Dimension("f2", FEATURES)])
    return h + mtf.tanh(mtf.rename_dimension(y, "f2", "features"))

  def program(impl):
    def step(x_tf, t_tf):
      graph = mtf.Graph()
      mesh = mtf.Mesh(graph, "mesh")
      batch = mtf.Dimension("batch", BATCH)
      x = mtf.import_tf_tensor(mesh, x_tf, [batch, features])
      t = mtf.import_tf_tensor(mesh, t_tf, [batch, features])
      loss = pl.pipeline_loss(stage_fn, lambda y, t: mtf.reduce_sum(mtf.square(y - t)), x,
                              mtf.Dimension("stages", 4), 4, schedule="interleaved",
                              loss_inputs=[t], virtual_stages=2)
      variables = graph.trainable_variables
      grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
      lowering = mtf.Lowering(graph, {mesh: impl})
      return [lowering.export_to_tf_tensor(v) for v in [loss] + grads]
    if isinstance(impl, simd_mesh_impl.SimdMeshImpl):
      return [v.numpy() for v in impl.run(step, x_np, t_np)]
    return [v.numpy() for v in tf.function(step, autograph=False)(tf.constant(x_np),
                                                                   tf.constant(t_np))]
  got = program(simd_mesh_impl.SimdMeshImpl(mesh_shape, layout, DEVICES))
  want = program(mtf_test_utils.make_impl(mesh_shape, layout))
  assert want[1].shape == (2, 4, FEATURES, FEATURES) and np.abs(want[1]).max() > 0
  for a, b in zip(got, want):
    mtf_test_utils.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def _transformer_tests():
  """tests/transformer/test_transformer.py (its small language model and
  data), importable whichever test folders this run collected."""
  return mtf_test_utils.import_script("test_transformer", "tests", "transformer",
                                      "test_transformer.py")


@pytest.mark.parametrize("mesh_shape,layout", [
    ("all:8", "batch:all"), ("rows:2;cols:4", "batch:rows;heads:cols;d_ff:cols;vocab:cols")],
    ids=["8", "2x4"])
def test_transformer_decoding_matches_placement(mesh_shape, layout):
  """Autoregressive decoding (greedy and sampled) runs its collectives inside
  mtf.while_loop: SIMD gives placement's tokens."""
  lm = _transformer_tests()
  _language_model, PROMPT, batch, length = lm._language_model, lm.PROMPT, lm.batch, lm.length  # pylint: disable=invalid-name,protected-access

  def decode():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    prompt = mtf.import_tf_tensor(mesh, tf.constant(PROMPT), [batch, length])
    model = _language_model()
    greedy = model.sample_autoregressive(prompt, temperature=0.0, stop_at_token=None)
    sampled = model.sample_autoregressive(prompt, temperature=1.0, top_k=4, stop_at_token=None)
    lowering = mtf.Lowering(graph, {mesh: impl})
    return lowering.export_to_tf_tensor(greedy), lowering.export_to_tf_tensor(sampled)
  impl = simd_mesh_impl.SimdMeshImpl(mesh_shape, layout, DEVICES)
  got = [t.numpy() for t in impl.run(decode)]
  impl = mtf_test_utils.make_impl(mesh_shape, layout)
  want = [t.numpy() for t in tf.function(decode, autograph=False)()]
  np.testing.assert_array_equal(got[0], want[0])
  np.testing.assert_array_equal(got[1], want[1])
  assert np.all(got[0][:, 2:] > 0)  # decoded, not left as padding


# Three-axis meshes under SIMD: test_mlp_training_matches_placement,
# test_collectives_inside_while_loop and the random graphs.
# The 2x4 mesh with TensorFlow's graph optimizer on, as in a user's program
# (the test processes turn it off).
TRAINER_MESHES = [
    ("all:8", "batch:all", "batch:all", False),
    ("rows:2;cols:4", "batch:rows;hidden:cols", "batch:rows;heads:cols;d_ff:cols", True),
]


@pytest.mark.parametrize("mesh_shape,mnist_layout,lm_layout,grappler", TRAINER_MESHES,
                         ids=["8", "2x4-grappler"])
def test_models_train_like_placement_with_the_trainer(mesh_shape, mnist_layout, lm_layout,
                                                      grappler, request):
  """The MNIST MLP (examples/mnist.py) and a small transformer LM, trained by
  mtf.training.Trainer with each implementation: the same losses."""
  if grappler:
    request.getfixturevalue("grappler_on")
  mnist = mtf_test_utils.import_mnist_example()
  lm = _transformer_tests()
  _language_model, B, L, TARGETS = lm._language_model, lm.B, lm.L, lm.TARGETS  # pylint: disable=invalid-name,protected-access
  rng = np.random.RandomState(1)
  images = rng.rand(32, 8, 8).astype(np.float32)
  labels = rng.randint(0, 10, size=32).astype(np.int32)
  mnist_data = tf.data.Dataset.from_tensor_slices(
      {"image": images, "label": labels}).batch(8, drop_remainder=True).repeat()

  def lm_fn(mesh, features, mode):
    t = features["targets"]
    inputs = mtf.shift(t, 1, t.shape.dims[-1], wrap=False)
    return _language_model(dropout=0.1).call_simple(inputs, t, True, mode=mode)[1]
  lm_data = tf.data.Dataset.from_tensor_slices({"targets": TARGETS}).batch(
      B, drop_remainder=True).repeat()
  cases = [
      (mnist.make_model_fn(16, seed=1), {"image": "batch:8;rows:8;cols:8", "label": "batch:8"},
       mnist_data, mesh_shape, mnist_layout),
      (lm_fn, {"targets": f"batch:{B};length:{L}"}, lm_data, mesh_shape, lm_layout),
  ]
  for model_fn, shapes, data, mesh_shape, layout in cases:
    losses = []
    for impl in (simd_mesh_impl.SimdMeshImpl(mesh_shape, layout, DEVICES),
                 mtf_test_utils.make_impl(mesh_shape, layout)):
      trainer = mtf.training.Trainer(model_fn, shapes, impl,
                                     mtf.optimize.AdamWeightDecayOptimizer(1e-2),
                                     log_every=0, log_fn=lambda line: None)
      losses.append(trainer.train(data, steps=2)["loss"])
      assert trainer.global_step == 2
    np.testing.assert_allclose(losses[0], losses[1], rtol=2e-5, atol=1e-6)
    assert np.all(np.isfinite(losses[0])) and losses[0][1] != losses[0][0]  # it trained


def test_per_processor_inputs_and_outputs():
  """Each processor feeds its own slice (import_laid_out_tensor) and returns
  its own slice of a split result."""
  impl = simd_mesh_impl.SimdMeshImpl("rows:2;cols:4", "batch:rows;hidden:cols", DEVICES)
  batch, hidden = mtf.Dimension("batch", 4), mtf.Dimension("hidden", 8)
  full = np.arange(32, dtype=np.float32).reshape(4, 8)
  slices = []
  for pnum in range(8):
    r, c = divmod(pnum, 4)
    slices.append(full[2 * r:2 * r + 2, 2 * c:2 * c + 2])

  def step(x_local):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    x = mtf.import_laid_out_tensor(mesh, [x_local], [batch, hidden])
    y = x * 2.0
    total = mtf.reduce_sum(x)
    lowering = mtf.Lowering(graph, {mesh: impl})
    return lowering.laid_out(y).tensor_list[0], lowering.export_to_tf_tensor(total)
  outs = impl.run_all(step, simd_mesh_impl.PerProcessor(slices))
  for pnum, (y_local, total) in enumerate(outs):
    np.testing.assert_array_equal(y_local.numpy(), 2.0 * slices[pnum])
    assert float(total) == full.sum()


def _op_count(mesh_shape, layout, size):
  """Ops in the traced SIMD program for a 2-layer MLP on `size` processors
  whose devices need not exist (traced in a graph that never runs)."""
  with tf.Graph().as_default():
    devices = ["/job:worker/task:0/device:CPU:%d" % i for i in range(size)]
    impl = simd_mesh_impl.SimdMeshImpl(mesh_shape, layout, devices)
    x = tf.zeros([64, FEATURES])
    y = tf.zeros([64, OUT])

    def step(x_tf, y_tf):
      graph = mtf.Graph()
      mesh = mtf.Mesh(graph, "mesh")
      batch = mtf.Dimension("batch", 64)
      xs = mtf.import_tf_tensor(mesh, x_tf, [batch, mtf.Dimension("features", FEATURES)])
      w = mtf.get_variable(mesh, "w", [mtf.Dimension("features", FEATURES),
                                       mtf.Dimension("hidden", 64)])
      loss = mtf.reduce_sum(mtf.square(mtf.einsum([xs, w], output_shape=[batch])))
      grad = mtf.gradients([loss], [w])[0]
      update = mtf.assign_sub(w, grad * 0.1)
      lowering = mtf.Lowering(graph, {mesh: impl})
      op = lowering.lowered_operation(update)
      with tf.control_dependencies([op]):
        return lowering.export_to_tf_tensor(loss)
    concrete, variables = impl.trace_program(step, x, y)
    assert len(variables[0].slices) == size
    return len(concrete.graph.get_operations())


def test_program_size_does_not_grow_with_the_mesh():
  small = _op_count("rows:2;cols:4", "batch:rows;hidden:cols", 8)
  large = _op_count("rows:8;cols:8", "batch:rows;hidden:cols", 64)
  assert small == large


def test_pending_sums_share_one_collective():
  """The gradients of both weights (sums over "rows", pending together) are
  reduced by one collective; results and recorded collectives as without."""
  from mesh_tensorflow.testing import reference_models as rm  # pylint: disable=g-import-not-at-top
  config = dict(batch=8, pixels=12, hidden=16, classes=4)
  data = [tf.constant(x) for x in rm.mlp_data(config, seed=4)]

  def train(impl):
    holder = {}

    def step(x, y):
      graph, mesh, loss = rm.build_mtf_mlp(x, y, config)
      updates = rm.sgd_updates(graph, loss, lr=0.5)
      lowering = mtf.Lowering(graph, {mesh: impl})
      holder["lowering"] = lowering
      tf_loss = lowering.export_to_tf_tensor(loss)
      with tf.control_dependencies([lowering.lowered_operation(u) for u in updates]):
        return tf.identity(tf_loss)
    losses = [float(impl.run(step, *data)) for _ in range(3)]
    ops = impl.trace_program(step, *data)[0].graph.get_operations()
    records = sorted((r.kind, r.mesh_axes, r.bytes_per_processor)
                     for r in holder["lowering"].collective_records)
    return losses, sum(op.type == "CollectiveReduceV2" for op in ops), records
  layout = "batch:rows;hidden:cols"
  together = train(simd_mesh_impl.SimdMeshImpl("rows:2;cols:4", layout, DEVICES))
  alone = train(simd_mesh_impl.SimdMeshImpl("rows:2;cols:4", layout, DEVICES,
                                            coalesce_sums=False))
  # logits over cols and the loss over rows (each needed at once), then dw1
  # and dw2 over rows: 4 sums, 3 collectives
  assert (together[1], alone[1]) == (3, 4)
  assert together[2] == alone[2]
  np.testing.assert_allclose(together[0], alone[0], rtol=1e-6)
  assert together[0][0] > together[0][-1]


def test_errors_are_clear():
  with pytest.raises(ValueError, match="8 processors but 4 devices"):
    simd_mesh_impl.SimdMeshImpl("all:8", "batch:all", DEVICES[:4])
  # The original's call form: (mesh_shape, layout_rules, devices, device_assignment).
  assert len(simd_mesh_impl.SimdMeshImpl("all:8", "batch:all").devices) == 8  # local CPUs
  assignment = simd_mesh_impl.tpu_device_assignment("all:8", [2, 2, 1], cores_per_chip=2)
  assert simd_mesh_impl.SimdMeshImpl("all:8", "batch:all", None, assignment).backend == "tpu"
  with pytest.raises(ValueError, match="backend"):
    simd_mesh_impl.SimdMeshImpl("all:8", "batch:all", DEVICES, backend="mpi")
  impl = simd_mesh_impl.SimdMeshImpl("all:8", "batch:all", DEVICES)
  with pytest.raises(ValueError, match="inside SimdMeshImpl.run"):
    _ = impl.pnum

  with pytest.raises(ValueError, match="tpu_replicate"):
    simd_mesh_impl.SimdMeshImpl("all:8", "batch:all", backend="tpu").run(lambda: None)


# ----------------------------------------------------------------- TPU path
def test_group_assignments_are_the_mesh_subgroups():
  impl = simd_mesh_impl.SimdMeshImpl("rows:2;cols:4", "batch:rows", backend="tpu")
  assert impl.group_assignment([1]) == [[0, 1, 2, 3], [4, 5, 6, 7]]
  assert impl.group_assignment([0]) == [[0, 4], [1, 5], [2, 6], [3, 7]]
  assert impl.group_assignment([0, 1]) == [list(range(8))]


def test_logical_to_physical_keeps_rows_on_neighbouring_chips():
  coords = simd_mesh_impl.logical_to_physical("rows:4;cols:8", [4, 4, 2])
  assert len(set(coords)) == 32  # a bijection onto the chips
  for p in range(31):  # consecutive pnums are physical neighbours
    a, b = coords[p], coords[p + 1]
    assert sum(abs(i - j) for i, j in zip(a[:3], b[:3])) == 1, (p, a, b)
  with pytest.raises(ValueError, match="16 processors but the physical slice"):
    simd_mesh_impl.logical_to_physical("rows:4;cols:4", [4, 4, 2])


def test_tpu_program_builds_without_a_tpu():
  """The TPU backend's device assignment and replicated program are built
  (never run: there is no TPU here)."""
  assignment = simd_mesh_impl.tpu_device_assignment("rows:2;cols:4", [2, 2, 1],
                                                    cores_per_chip=2)
  assert assignment.num_replicas == 8
  with tf.Graph().as_default() as g:
    impl = simd_mesh_impl.SimdMeshImpl(
        "rows:2;cols:4", "batch:rows;hidden:cols", backend="tpu",
        device_assignment=assignment,
        devices=["/job:worker/task:0/device:CPU:0"] * 8)

    def step(x_tf):
      graph = mtf.Graph()
      mesh = mtf.Mesh(graph, "mesh")
      x = mtf.import_tf_tensor(mesh, x_tf, "batch:8;hidden:8")
      y = mtf.reduce_sum(mtf.shift(x, 1, "hidden", wrap=True), reduced_dim=x.shape.dims[1])
      lowering = mtf.Lowering(graph, {mesh: impl})
      return lowering.export_to_tf_tensor(y)
    impl.tpu_replicate(step, tf.zeros([8, 8]))
    kinds = {op.type for op in g.get_operations()}
    for f in g.as_graph_def().library.function:
      kinds.update(node.op for node in f.node_def)
  assert {"CrossReplicaSum", "CollectivePermute", "AllToAll", "TPUReplicateMetadata"} <= kinds


def _sum_over_hidden(impl):
  """Processor 0's result of a reduce_sum over "hidden" (split by impl's layout)."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  hidden = mtf.Dimension("hidden", 16)
  x = mtf.import_tf_tensor(mesh, tf.ones([4, 16]), mtf.Shape([mtf.Dimension("batch", 4), hidden]))
  y = mtf.reduce_sum(x, reduced_dim=hidden)

  def step():
    return mtf.Lowering(graph, {mesh: impl}).export_to_tf_tensor(y)
  return impl.run(step).numpy()


def test_collective_keys_stay_unique_over_thousands_of_meshes():
  """Each SimdMeshImpl takes its own block of TensorFlow's int32 group keys.
  With fixed blocks of 2**20 keys, the 4096th mesh after another wrapped around
  to the same keys, and its group of two joined the other's group of eight."""
  first = simd_mesh_impl.SimdMeshImpl("all:8", "hidden:all", DEVICES)
  np.testing.assert_allclose(_sum_over_hidden(first), [16.0] * 4)
  for _ in range(4095):
    simd_mesh_impl.SimdMeshImpl("all:8", "hidden:all", DEVICES)
  last = simd_mesh_impl.SimdMeshImpl("a:2;b:4", "hidden:a", DEVICES)
  np.testing.assert_allclose(_sum_over_hidden(last), [16.0] * 4)
