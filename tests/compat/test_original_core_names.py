"""The original Mesh TensorFlow's core names added for issue 23: operation
classes (AddOperation, MinMaxOperation, PoolBackPropOperation, ...),
`custom_gradient` with the original's grad_fn, `beam_search`,
`layers`, `optimize`, `utils`, `simd_mesh_impl` and `tpu_variables` names.
Operations are checked for values and gradients against NumPy (or
TensorFlow) on one device and under split layouts."""

import os

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import ops as original_ops
from mtf_test_utils import DEVICES, assert_allclose, ensure_eight_devices, lower_and_run

ensure_eight_devices()

BATCH, LENGTH, D = mtf.Dimension("batch", 4), mtf.Dimension("length", 8), mtf.Dimension("d", 4)
SHAPE = [BATCH, LENGTH, D]
# (mesh, layout): one device, then layouts splitting the dimensions involved.
LAYOUTS = [("all:1", ""), ("all:8", "length:all"), ("rows:2;cols:4", "batch:rows;d:cols")]
LAYOUT_IDS = [f"{m}|{l or 'replicated'}" for m, l in LAYOUTS]


def _rand(seed, shape=(4, 8, 4)):
  return np.random.RandomState(seed).normal(size=shape).astype(np.float32)


def _run(build, mesh_layout):
  mesh_shape, layout = mesh_layout
  return lower_and_run(build, mesh_shape, layout, DEVICES)


# ------------------------------------------------------------ operation classes
@pytest.mark.parametrize("mesh_layout", LAYOUTS, ids=LAYOUT_IDS)
def test_add_and_min_max_operations_values_and_gradients(mesh_layout):
  x, y, bias, w = _rand(0), _rand(1), _rand(2, (4,)), _rand(3)
  y[0, 0, 0] = x[0, 0, 0]  # a tie: both inputs get the gradient, as in the original

  def build(mesh):
    tx = mtf.import_tf_tensor(mesh, x, SHAPE)
    ty = mtf.import_tf_tensor(mesh, y, SHAPE)
    tb = mtf.import_tf_tensor(mesh, bias, [D])
    tw = mtf.import_tf_tensor(mesh, w, SHAPE)
    added = mtf.AddOperation(tx, tb, tx.shape).outputs[0]
    biggest = mtf.MinMaxOperation(tf.maximum, tx, ty, tx.shape).outputs[0]
    smallest = mtf.MinMaxOperation(tf.minimum, tx, ty, tx.shape).outputs[0]
    loss = mtf.reduce_sum((added + biggest + 2.0 * smallest) * tw)
    gx, gy, gb = mtf.gradients([loss], [tx, ty, tb])
    return {"add": added, "max": biggest, "min": smallest, "gx": gx, "gy": gy, "gb": gb}
  got = _run(build, mesh_layout)
  assert_allclose(got["add"], x + bias)
  assert_allclose(got["max"], np.maximum(x, y))
  assert_allclose(got["min"], np.minimum(x, y))
  x_max, y_max = (x == np.maximum(x, y)), (y == np.maximum(x, y))
  x_min, y_min = (x == np.minimum(x, y)), (y == np.minimum(x, y))
  assert_allclose(got["gx"], w * (1 + x_max + 2 * x_min))
  assert_allclose(got["gy"], w * (y_max + 2 * y_min))
  assert_allclose(got["gb"], w.sum(axis=(0, 1)))


POOL_SHAPE = [mtf.Dimension("batch", 2), mtf.Dimension("h", 8), mtf.Dimension("w", 8),
              mtf.Dimension("ch", 4)]
POOL_LAYOUTS = [("all:1", ""), ("rows:2;cols:4", "batch:rows;ch:cols"),
                ("rows:2;cols:4", "h:rows;w:cols")]


@pytest.mark.parametrize("kind", ["MAX_2D", "AVG_2D"])
@pytest.mark.parametrize("mesh_layout", POOL_LAYOUTS, ids=[f"{m}|{l}" for m, l in POOL_LAYOUTS])
def test_pool_backprop_matches_tensorflow(kind, mesh_layout):
  x = _rand(4, (2, 8, 8, 4))
  dy = _rand(5, (2, 4, 4, 4))
  w = _rand(6, (2, 8, 8, 4))
  pool = tf.nn.max_pool2d if kind == "MAX_2D" else tf.nn.avg_pool2d
  tx, tdy = tf.constant(x), tf.constant(dy)
  with tf.GradientTape() as outer:
    outer.watch(tdy)
    with tf.GradientTape() as inner:
      inner.watch(tx)
      ty = pool(tx, 2, 2, "VALID")
    dx_ref = inner.gradient(ty, tx, output_gradients=tdy)
    second = tf.reduce_sum(dx_ref * w)
  ddy_ref = outer.gradient(second, tdy)

  def build(mesh):
    mx = mtf.import_tf_tensor(mesh, x, POOL_SHAPE)
    mdy = mtf.import_tf_tensor(mesh, dy, [POOL_SHAPE[0], mtf.Dimension("h", 4),
                                         mtf.Dimension("w", 4), POOL_SHAPE[3]])
    my = mtf.PoolOperation(mx, [2, 2], [2, 2], kind).outputs[0]
    dx = mtf.pool_backprop(mx, my, mdy, [2, 2], [2, 2], kind)
    loss = mtf.reduce_sum(dx * mtf.import_tf_tensor(mesh, w, POOL_SHAPE))
    return {"dx": dx, "ddy": mtf.gradients([loss], [mdy])[0]}
  got = _run(build, mesh_layout)
  assert_allclose(got["dx"], dx_ref.numpy())
  assert_allclose(got["ddy"], ddy_ref.numpy())


def test_pool_backprop_rejects_bad_arguments(graph_and_mesh):
  _, mesh = graph_and_mesh
  x = mtf.zeros(mesh, POOL_SHAPE)
  with pytest.raises(ValueError, match="pool_fn_string 'MAX_1D'"):
    mtf.pool_backprop(x, x, x, [2, 2], [2, 2], "MAX_1D")
  with pytest.raises(ValueError, match="needs 3 ksize"):
    mtf.PoolBackPropOperation(x, x, x, [2, 2], [2, 2], "AVG_3D")


@pytest.mark.parametrize("mesh_layout", LAYOUTS[:2], ids=LAYOUT_IDS[:2])
def test_scalar_summary_operation_is_an_identity_that_records(mesh_layout):
  x = _rand(7)
  graphs = []

  def build(mesh):
    graphs.append(mesh.graph)
    t = mtf.import_tf_tensor(mesh, x, SHAPE)
    total = mtf.ScalarSummaryOperation("total", mtf.reduce_sum(t)).outputs[0]
    return {"total": total, "dx": mtf.gradients([3.0 * total], [t])[0]}
  got = _run(build, mesh_layout)
  assert_allclose(got["total"], x.sum(), rtol=1e-4)
  assert_allclose(got["dx"], np.full_like(x, 3.0))
  assert [name for name, _ in graphs[0].summaries] == ["total"]
  with pytest.raises(ValueError, match="expected a scalar"):
    mtf.ScalarSummaryOperation("bad", mtf.zeros(mtf.Mesh(mtf.Graph(), "m"), [D]))


@pytest.mark.parametrize("mesh_layout", [("all:1", ""), ("rows:2;cols:4", "stacked:rows;d:cols")],
                         ids=["one", "split"])
def test_stacked_variable_holds_the_stacked_initial_values(mesh_layout):
  a, b = _rand(8, (4,)), _rand(9, (4,))
  names = []

  def build(mesh):
    va = mtf.get_variable(mesh, "wa", [D], initializer=tf.constant_initializer(a))
    vb = mtf.get_variable(mesh, "wb", [D], initializer=tf.constant_initializer(b))
    stacked = mtf.StackedVariable([va.operation, vb.operation])
    names.append((stacked.name, stacked.original_names))
    return {"stacked": stacked.outputs[0]}
  got = _run(build, mesh_layout)
  assert_allclose(got["stacked"], np.stack([a, b]))
  assert names[0] == ("stacked/wa", ["wa", "wb"])


def test_stacked_variable_rejects_mixed_shapes(graph_and_mesh):
  _, mesh = graph_and_mesh
  va = mtf.get_variable(mesh, "wa", [D])
  vb = mtf.get_variable(mesh, "wb", [BATCH])
  with pytest.raises(ValueError, match="stack variables of one shape"):
    mtf.StackedVariable([va, vb])


@pytest.mark.parametrize("mesh_layout", LAYOUTS, ids=LAYOUT_IDS)
def test_custom_gradient_with_the_original_grad_fn_keywords(mesh_layout):
  x, c, w = _rand(10), _rand(11, (4,)), _rand(12)
  seen = {}

  def grad_fn(explicit_inputs, all_inputs, forward_operations, outputs, output_grads):
    seen["counts"] = (len(explicit_inputs), len(all_inputs), len(forward_operations),
                      len(outputs))
    g = output_grads[0]
    return [g * 3.0, mtf.reduce_sum(g, output_shape=[D]) * 5.0]

  def build(mesh):
    tx = mtf.import_tf_tensor(mesh, x, SHAPE)
    tc = mtf.import_tf_tensor(mesh, c, [D])
    y = mtf.custom_gradient(lambda t: t * tc, grad_fn, [tx])
    loss = mtf.reduce_sum(y * mtf.import_tf_tensor(mesh, w, SHAPE))
    gx, gc = mtf.gradients([loss], [tx, tc])
    return {"y": y, "gx": gx, "gc": gc}
  got = _run(build, mesh_layout)
  assert_allclose(got["y"], x * c)
  assert_allclose(got["gx"], 3.0 * w)
  assert_allclose(got["gc"], 5.0 * w.sum(axis=(0, 1)), rtol=1e-4)
  assert seen["counts"] == (1, 2, 1, 1)


def test_custom_gradient_operation_original_constructor(graph_and_mesh):
  _, mesh = graph_and_mesh
  x = mtf.zeros(mesh, [D])
  y = x * 2.0
  op = mtf.CustomGradientOperation([x], [x], [y], lambda xs, cap, ys, gs: [gs[0]],
                                   [y.operation])
  assert op.forward_operations == [y.operation]
  assert op.outputs[0].shape == y.shape
  with pytest.raises(ValueError, match="must begin with explicit_inputs"):
    mtf.CustomGradientOperation([x], [y], [y], lambda *a: None, [])


# ------------------------------------------------------------------ lowering helpers
def test_lazy_laid_out_tensor_and_compatible_lazy_allreduce_sums():
  impl = mtf.placement_mesh_impl.PlacementMeshImpl("rows:2;cols:4", "", DEVICES)
  other_impl = mtf.placement_mesh_impl.PlacementMeshImpl("rows:2;cols:4", "", DEVICES)
  slices = mtf.LaidOutTensor([tf.constant(float(i)) for i in range(8)])
  calls = []

  def make():
    calls.append(1)
    return slices
  lazy = mtf.LazyLaidOutTensor(make, [])
  assert lazy.to_laid_out_tensor() is slices and lazy.to_laid_out_tensor() is slices
  assert len(calls) == 2 and lazy.slice_shape == []
  a = mtf.LazyAllreduceSum(impl, slices, [0])
  b = mtf.LazyAllreduceSum(impl, slices, [0])
  assert mtf.compatible_lazy_allreduce_sums([a, b])
  assert not mtf.compatible_lazy_allreduce_sums([])
  assert not mtf.compatible_lazy_allreduce_sums([a, slices])
  assert not mtf.compatible_lazy_allreduce_sums([a, mtf.LazyAllreduceSum(impl, slices, [1])])
  assert not mtf.compatible_lazy_allreduce_sums([a, mtf.LazyAllreduceSum(other_impl, slices, [0])])
  summed = b.to_laid_out_tensor()
  # Summed over the rows axis: processor (row, col) holds col + (col + 4).
  assert [float(t) for t in summed.tensor_list] == [4.0, 6.0, 8.0, 10.0] * 2


def test_ops_module_builds_a_model():
  x, w = _rand(13), _rand(14, (4, 4))
  out = mtf.Dimension("out", 4)

  def build(mesh):
    tx = original_ops.import_tf_tensor(mesh, x, original_ops.Shape(SHAPE))
    tw = original_ops.import_tf_tensor(mesh, w, [D, out])
    h = original_ops.einsum([tx, tw], output_shape=[BATCH, LENGTH, out])
    return {"y": original_ops.reduce_sum(original_ops.relu(h), reduced_dim=LENGTH)}
  got = _run(build, ("rows:2;cols:4", "batch:rows;out:cols"))
  assert_allclose(got["y"], np.maximum(x @ w, 0).sum(axis=1), rtol=1e-4)


# ---------------------------------------------------------------------- beam_search
@pytest.mark.parametrize("mesh_layout", [("all:1", ""), ("rows:2;cols:4", "batch:rows;old_beam:cols"),
                                         ("rows:2;cols:4", "batch:rows;length:cols")],
                         ids=["one", "beam-split", "length-split"])
def test_compute_topk_scores_and_seq(mesh_layout):
  batch, old_beam, length = (mtf.Dimension("batch", 2), mtf.Dimension("old_beam", 4),
                             mtf.Dimension("length", 4))
  beam = mtf.Dimension("beam", 2)
  rng = np.random.RandomState(15)
  seqs = rng.randint(0, 50, size=(2, 4, 4)).astype(np.int32)
  scores = np.array([[0.1, 0.9, 0.5, 0.9], [3.0, -1.0, 2.0, 0.0]], np.float32)
  gather_scores = rng.normal(size=(2, 4)).astype(np.float32)
  flags = np.array([[True, False, True, False], [False, True, True, False]])
  w = rng.normal(size=(2, 2)).astype(np.float32)

  def build(mesh):
    ms = mtf.import_tf_tensor(mesh, seqs, [batch, old_beam, length])
    mscores = mtf.import_tf_tensor(mesh, scores, [batch, old_beam])
    mgather = mtf.import_tf_tensor(mesh, gather_scores, [batch, old_beam])
    mflags = mtf.import_tf_tensor(mesh, flags, [batch, old_beam])
    top_seq, top_scores, top_flags, selector = mtf.beam_search.compute_topk_scores_and_seq(
        ms, mscores, mgather, mflags, beam)
    loss = mtf.reduce_sum(top_scores * mtf.import_tf_tensor(mesh, w, [batch, beam]))
    return {"seq": top_seq, "scores": top_scores, "flags": top_flags, "selector": selector,
            "grad": mtf.gradients([loss], [mgather])[0]}
  got = _run(build, mesh_layout)
  order = np.argsort(-scores, axis=1, kind="stable")[:, :2]  # ties: lower index first
  rows = np.arange(2)[:, None]
  np.testing.assert_array_equal(got["seq"], seqs[rows, order])
  assert_allclose(got["scores"], gather_scores[rows, order])
  np.testing.assert_array_equal(got["flags"], flags[rows, order])
  assert_allclose(got["selector"], np.eye(4, dtype=np.float32)[order])
  expected_grad = np.zeros((2, 4), np.float32)
  for b in range(2):
    for k in range(2):
      expected_grad[b, order[b, k]] += w[b, k]
  assert_allclose(got["grad"], expected_grad)


def test_compute_topk_scores_and_seq_rejects_bad_shapes(graph_and_mesh):
  _, mesh = graph_and_mesh
  seqs = mtf.zeros(mesh, "batch:2;length:4", dtype=tf.int32)
  scores = mtf.zeros(mesh, "batch:2;old_beam:4")
  with pytest.raises(ValueError, match=r"must be \[batch, beam, length\]"):
    mtf.beam_search.compute_topk_scores_and_seq(seqs, scores, scores, scores,
                                                mtf.Dimension("beam", 2))


# ---------------------------------------------------------------------------- layers
_ANNEALED_ONE_DEVICE = {}


@pytest.mark.parametrize("mesh_layout", [LAYOUTS[0], LAYOUTS[2]], ids=[LAYOUT_IDS[0], LAYOUT_IDS[2]])
def test_annealed_dropout_rate_follows_the_step(mesh_layout):
  x = np.abs(_rand(16)) + 0.5
  w = _rand(17)

  def build(mesh):
    t = mtf.import_tf_tensor(mesh, x, SHAPE)
    out = {}
    for name, step in (("start", 100), ("middle", 150), ("end", 200)):
      s = mtf.constant(mesh, step, dtype=tf.int32)
      y = mtf.layers.annealed_dropout(t, True, 100, 200, init_rate=0.5, step=s, name=name)
      out[name] = y
      out["grad_" + name] = mtf.gradients([mtf.reduce_sum(y * mtf.import_tf_tensor(
          mesh, w, SHAPE))], [t])[0]
    return out
  got = _run(build, mesh_layout)
  if mesh_layout == LAYOUTS[0]:
    _ANNEALED_ONE_DEVICE.update(got)
  for name, keep in (("start", 0.5), ("middle", 0.75), ("end", 1.0)):
    y = got[name]
    kept = y != 0
    assert_allclose(y[kept], x[kept] / keep, rtol=1e-5)
    assert_allclose(got["grad_" + name], np.where(kept, w / keep, 0.0), rtol=1e-5)
  assert got["end"].all()
  assert 0.3 < 1 - got["start"].astype(bool).mean() < 0.7  # 128 draws at rate 0.5
  reference = _ANNEALED_ONE_DEVICE or _run(build, LAYOUTS[0])
  # The same elements are dropped under every layout.
  np.testing.assert_array_equal(got["start"] != 0, reference["start"] != 0)


def test_annealed_dropout_without_training_or_rate_and_bad_input(graph_and_mesh):
  _, mesh = graph_and_mesh
  x = mtf.zeros(mesh, SHAPE)
  assert mtf.layers.annealed_dropout(x, False, 0, 10, init_rate=0.5) is x
  assert mtf.layers.annealed_dropout(x, True, 0, 10) is x
  with pytest.raises(ValueError, match="end_step"):
    mtf.layers.annealed_dropout(x, True, 10, 10, init_rate=0.5)


def test_annealed_dropout_uses_the_step_counter():
  x = np.ones((4, 8, 4), np.float32)

  def build(mesh):
    y = mtf.layers.annealed_dropout(mtf.import_tf_tensor(mesh, x, SHAPE), True, 0, 10,
                                    init_rate=0.5)
    return {"y": y}
  got = lower_and_run(build, "all:1", "", DEVICES[:1])
  assert set(np.unique(got["y"])) <= {0.0, 2.0}  # counter 0: keep 0.5


@pytest.mark.parametrize("mesh_layout", LAYOUTS[1:], ids=LAYOUT_IDS[1:])
def test_summary_for_clip_activation_gradient(mesh_layout):
  x = _rand(18)
  graphs = []

  def build(mesh):
    graphs.append(mesh.graph)
    t = mtf.import_tf_tensor(mesh, x, SHAPE)
    mtf.layers.summary_for_clip_activation_gradient(t, "act", [BATCH])
    return {name: value for name, value in mesh.graph.summaries}
  got = _run(build, mesh_layout)
  rms = np.sqrt((x ** 2).mean(axis=(1, 2)))
  expected = {"mean/": x.mean(), "max/": x.max(), "rms_mean/act": rms.mean(),
              "rms_max/act": rms.max(), "rms_var/act": ((rms - rms.mean()) ** 2).mean()}
  assert sorted(got) == sorted(expected)
  for name, value in expected.items():
    assert_allclose(got[name], value, rtol=1e-4, atol=1e-5, msg=name)


# -------------------------------------------------------------------------- optimize
def test_product_learning_rate_and_compute_lr_for_step():
  assert mtf.optimize.product_learning_rate(10, 100, factors=[0.5, 2.0]) == pytest.approx(1.0)
  linear = lambda step, total: 1.0 - step / total  # noqa: E731
  assert mtf.optimize.product_learning_rate(
      30, 110, factors=[2.0, linear], offset=10) == pytest.approx(2.0 * (1 - 20 / 100))
  with pytest.raises(TypeError, match="factors is required"):
    mtf.optimize.product_learning_rate(1, 10)
  rates = mtf.optimize.compute_lr_for_step([None, [0.1, 2.0]], 0.01, step=5)
  assert rates[0] == 0.01 and float(rates[1]) == pytest.approx(0.2)
  lazy = mtf.optimize.compute_lr_for_step([[0.5, linear]], 0.01, train_steps=10)
  assert callable(lazy[0]) and float(lazy[0](4)) == pytest.approx(0.5 * 0.6)


def _train_one_step(make_optimizer, mesh_shape, layout):
  """One optimizer step on 0.5 * sum((x w + b)^2); returns (w, b) after it."""
  x = _rand(19, (8, 4))
  w0, b0 = _rand(20, (4, 4)), _rand(21, (4,))
  batch, hidden, out = mtf.Dimension("batch", 8), mtf.Dimension("hidden", 4), D
  impl = mtf.placement_mesh_impl.PlacementMeshImpl(
      mesh_shape, layout, DEVICES[:mtf.convert_to_shape(mesh_shape).size])

  def variables(mesh):
    w = mtf.get_variable(mesh, "emb_w", [hidden, out], initializer=tf.constant_initializer(w0))
    b = mtf.get_variable(mesh, "dense_b", [out], initializer=tf.constant_initializer(b0))
    return w, b

  @tf.function(autograph=False)
  def step():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    w, b = variables(mesh)
    pred = mtf.einsum([mtf.import_tf_tensor(mesh, x, [batch, hidden]), w],
                      output_shape=[batch, out]) + b
    loss = 0.5 * mtf.reduce_sum(mtf.square(pred))
    grads = mtf.gradients([loss], [w, b])
    ops = make_optimizer().apply_grads(grads, graph.trainable_variables)
    lowering = mtf.Lowering(graph, {mesh: impl})
    with tf.control_dependencies([lowering.lowered_operation(op) for op in ops]):
      return tf.constant(0)

  @tf.function(autograph=False)
  def read():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    w, b = variables(mesh)
    lowering = mtf.Lowering(graph, {mesh: impl})
    return lowering.export_to_tf_tensor(w), lowering.export_to_tf_tensor(b)
  step()
  w1, b1 = read()
  err = x @ w0 + b0
  return w1.numpy(), b1.numpy(), (w0, x.T @ err), (b0, err.sum(axis=0))


def _adam_first_step(value, grad, lr):
  m, v = 0.1 * grad, 0.001 * grad ** 2
  return value - lr * m / (np.sqrt(v) + 1e-6)


@pytest.mark.parametrize("mesh_shape,layout", [("all:1", ""), ("rows:2;cols:4", "hidden:rows;d:cols")])
def test_adam_with_multi_lr_schedule_uses_the_schedule_of_matching_variables(mesh_shape, layout):
  make = lambda: mtf.optimize.AdamWithMultiLRSchedule(  # noqa: E731
      variable_search=["emb"], alt_lr_schedules=[[0.5, 0.1]], learning_rate=0.01)
  w1, b1, (w0, gw), (b0, gb) = _train_one_step(make, mesh_shape, layout)
  assert_allclose(w1, _adam_first_step(w0, gw, 0.05), rtol=1e-4, atol=1e-5)
  assert_allclose(b1, _adam_first_step(b0, gb, 0.01), rtol=1e-4, atol=1e-5)


def test_adafactor_with_multi_lr_schedule_zero_rate_freezes_matching_variables():
  make = lambda: mtf.optimize.AdafactorWithMultiLRSchedule(  # noqa: E731
      variable_search=["dense"], alt_lr_schedules=[[0.0]], learning_rate=0.01,
      multiply_by_parameter_scale=False)
  w1, b1, (w0, _), (b0, _) = _train_one_step(make, "rows:2;cols:4", "hidden:rows;d:cols")
  assert_allclose(b1, b0)
  assert np.abs(w1 - w0).max() > 1e-3
  with pytest.raises(ValueError, match="one schedule per pattern"):
    mtf.optimize.AdamWithMultiLRSchedule(variable_search=["a", "b"], alt_lr_schedules=[[1.0]],
                                         learning_rate=0.1)


# --------------------------------------------------------------- utils, simd, tpu_variables
def test_topology_rank_and_physical_shape_3d():
  topology = tf.tpu.experimental.Topology(
      mesh_shape=[2, 1, 1, 2],
      device_coordinates=[[[0, 0, 0, 0], [0, 0, 0, 1], [1, 0, 0, 0], [1, 0, 0, 1]]])
  assert mtf.utils.topology_rank(topology) == 4
  assert mtf.utils.topology_rank(topology.serialized()) == 4
  with pytest.raises(ValueError, match="Topology"):
    mtf.utils.topology_rank([2, 2])
  f = mtf.simd_mesh_impl.physical_shape_3d_from_topology_proto_4d
  assert f([4, 4, 2, 2]) == [8, 4, 2]
  assert f(topology.mesh_shape) == [1, 2, 2]
  with pytest.raises(ValueError, match="4-D"):
    f([4, 4, 2])


def test_create_host_call_writes_the_summaries(tmp_path):
  with tf.Graph().as_default():
    assert mtf.utils.create_host_call(str(tmp_path)) is None
    tf.compat.v1.add_to_collection(mtf.utils.SCALAR_SUMMARIES_COLLECTION_KEY,
                                   ("loss", tf.constant(1.5)))
    with pytest.raises(ValueError, match="no global step"):
      mtf.utils.create_host_call(str(tmp_path))
    tf.compat.v1.train.get_or_create_global_step()
    fn, args = mtf.utils.create_host_call(str(tmp_path))
    assert len(args) == 2 and args[1].shape.as_list() == [1]
  fn(tf.constant([7]), tf.constant([1.5, 2.5]))
  files = os.listdir(tmp_path)
  assert files and files[0].startswith("events.out.tfevents")
  values = []
  for record in tf.data.TFRecordDataset(str(tmp_path / files[0])):
    event = tf.compat.v1.Event.FromString(record.numpy())
    for value in event.summary.value:
      values.append((event.step, value.tag, float(tf.make_ndarray(value.tensor))))
  assert values == [(7, "loss", 2.0)]


def test_replicated_variable_reads_the_first_copy_and_writes_all():
  copies = [tf.Variable([1.0, 2.0]), tf.Variable([1.0, 2.0])]
  w = mtf.tpu_variables.ReplicatedVariable("w", copies)
  assert w.name == "w" and w.dtype == tf.float32 and w.shape == [2]
  w.assign_add(tf.constant([1.0, 1.0]))
  assert [c.numpy().tolist() for c in copies] == [[2.0, 3.0], [2.0, 3.0]]
  assert tf.convert_to_tensor(w).numpy().tolist() == [2.0, 3.0]
  assert (tf.constant([1.0, 1.0]) + w).numpy().tolist() == [3.0, 4.0]
  assert w.assign(tf.constant([0.0, 5.0])).numpy().tolist() == [0.0, 5.0]
  assert w.handle is copies[0].handle
  with pytest.raises(ValueError, match="one dtype and shape"):
    mtf.tpu_variables.ReplicatedVariable("bad", [tf.Variable([1.0]), tf.Variable([1.0, 2.0])])
  with pytest.raises(ValueError, match="cast it"):
    tf.convert_to_tensor(w, dtype=tf.int32)


@pytest.mark.parametrize("mesh_layout", LAYOUTS[:2], ids=LAYOUT_IDS[:2])
def test_while_loop_original_call_forms_pass_tf_while_loop_arguments(mesh_layout):
  x = _rand(22)

  def build(mesh):
    t = mtf.import_tf_tensor(mesh, x, SHAPE)
    i0 = mtf.constant(mesh, 0, dtype=tf.int32)
    # The original's positional form: (cond_fn, body_fn, inputs, tf_kwargs).
    i, y = mtf.WhileLoopOperation(lambda i, y: mtf.less(i, 10), lambda i, y: [i + 1, y * 2.0],
                                  [i0, t], {"maximum_iterations": 3}).outputs
    j, z = mtf.while_loop(lambda j, z: mtf.less(j, 10), lambda j, z: [j + 1, z + 1.0], [i0, t],
                          maximum_iterations=2, parallel_iterations=1, back_prop=False)
    return {"i": i, "y": y, "j": j, "z": z}
  got = _run(build, mesh_layout)
  assert got["i"] == 3 and got["j"] == 2
  assert_allclose(got["y"], x * 8.0)
  assert_allclose(got["z"], x + 2.0)
  with pytest.raises(TypeError, match="unexpected arguments \\['first_n'\\]"):
    _run(lambda mesh: {"i": mtf.while_loop(lambda i: mtf.less(i, 2), lambda i: [i + 1],
                                           [mtf.constant(mesh, 0, dtype=tf.int32)],
                                           first_n=2)[0]}, mesh_layout)


def test_lazy_allreduce_sum_counter_fn():
  impl = mtf.placement_mesh_impl.PlacementMeshImpl("all:2", "", DEVICES[:2])
  calls = []
  lazy = mtf.LazyAllreduceSum(impl, mtf.LaidOutTensor([tf.constant(1.0), tf.constant(2.0)]),
                              [0], lambda: calls.append(1))
  assert not calls
  assert [float(t) for t in lazy.to_laid_out_tensor().tensor_list] == [3.0, 3.0]
  lazy.to_laid_out_tensor()
  assert calls == [1]  # counted once, when the allreduce is made


def test_pool_backprop_with_overlapping_windows():
  """Unlike the original, ksize may differ from strides."""
  x, dy = _rand(23, (1, 8, 8, 2)), _rand(24, (1, 7, 7, 2))
  tx = tf.constant(x)
  with tf.GradientTape() as tape:
    tape.watch(tx)
    ty = tf.nn.max_pool2d(tx, 2, 1, "VALID")
  expected = tape.gradient(ty, tx, output_gradients=tf.constant(dy)).numpy()
  shape = [mtf.Dimension("b", 1), mtf.Dimension("h", 8), mtf.Dimension("w", 8),
           mtf.Dimension("c", 2)]

  def build(mesh):
    mx = mtf.import_tf_tensor(mesh, x, shape)
    my = mtf.PoolOperation(mx, [2, 2], [1, 1], "MAX_2D").outputs[0]
    mdy = mtf.import_tf_tensor(mesh, dy, my.shape)
    return {"dx": mtf.pool_backprop(mx, my, mdy, [2, 2], [1, 1], "MAX_2D")}
  assert_allclose(_run(build, ("all:2", "c:all"))["dx"], expected)
