"""Lowering inside tf.function (with retracing), eagerly, and in a
tf.compat.v1 graph with a Session; variables and assignment, import/export,
bfloat16 activations, and randomness across steps and layouts."""

import contextlib
import gc
import sys
import weakref

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf

from mtf_test_utils import MESHES, make_impl

_RNG = np.random.default_rng(11)
X = _RNG.normal(size=(8, 16)).astype(np.float32)
Y = _RNG.normal(size=(8, 4)).astype(np.float32)
W0 = (_RNG.normal(size=(16, 4)) * 0.1).astype(np.float32)
LR = 0.1

_LAYOUTS = [("all:8", "batch:all"), ("rows:2;cols:4", "hidden:rows;out:cols"),
            ("a:2;b:2;c:2", "batch:a;hidden:b;out:c")]
_ALL_LAYOUTS = [(m, l) for m, ls in MESHES.items() for l in ls]


@contextlib.contextmanager
def count_variables():
  """Collects the tf.Variables created inside (wherever they are lifted to)."""
  created = []

  def creator(next_creator, **kwargs):
    v = next_creator(**kwargs)
    created.append(v)
    return v
  with tf.variable_creator_scope(creator):
    yield created


def _regression(x_value=None):
  """Linear regression with one gradient-descent update (lr = LR).

  Returns (graph, mesh, w, loss, update).
  """
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.import_tf_tensor(mesh, tf.constant(X) if x_value is None else x_value,
                           "batch:8;hidden:16")
  y = mtf.import_tf_tensor(mesh, tf.constant(Y), "batch:8;out:4")
  w = mtf.get_variable(mesh, "w", "hidden:16;out:4",
                       initializer=lambda shape, dtype=None: tf.constant(W0))
  err = mtf.einsum([x, w], output_shape="batch:8;out:4") - y
  loss = mtf.reduce_mean(mtf.square(err))
  [g] = mtf.gradients([loss], [w])
  update = mtf.assign_sub(w, g * LR)
  return graph, mesh, w, loss, update


def _numpy_training(steps):
  """(w before each step, loss at each step) of plain gradient descent."""
  w = W0.astype(np.float64)
  ws, losses = [], []
  for _ in range(steps):
    err = X @ w - Y
    ws.append(w.copy())
    losses.append((err ** 2).mean())
    w = w - LR * (2.0 / err.size) * X.T @ err
  return ws, losses


def _check_training(results):
  ws, losses = _numpy_training(len(results))
  for i, (w_before, loss) in enumerate(results):
    np.testing.assert_allclose(np.asarray(w_before), ws[i], rtol=1e-4, atol=1e-5,
                               err_msg=f"step {i}")
    np.testing.assert_allclose(np.asarray(loss), losses[i], rtol=1e-4, err_msg=f"step {i}")
  assert losses[-1] < losses[0]


# ----------------------------------------------------------- tf.function
@pytest.mark.parametrize("mesh_shape,layout", _LAYOUTS)
def test_tf_function_retracing_reuses_variables(mesh_shape, layout):
  graph, mesh, w, loss, update = _regression()
  impl = make_impl(mesh_shape, layout)

  @tf.function
  def train(tag):
    del tag  # a Python value: each new one retraces
    lowering = mtf.Lowering(graph, {mesh: impl})
    op = lowering.lowered_operation(update)
    with tf.control_dependencies([op]):
      return lowering.export_to_tf_tensor(w), lowering.export_to_tf_tensor(loss)

  results = []
  with count_variables() as created:
    for step in range(6):
      results.append([t.numpy() for t in train(step // 2)])  # new traces at 2, 4
      if step == 0:
        first = list(created)
        traces = train.experimental_get_tracing_count()
  # Creating the slice variables does not make tf.function trace twice.
  assert traces == 1, traces
  assert train.experimental_get_tracing_count() == traces + 2
  assert first, "the first trace should create the slice variables"
  assert len(created) == len(first), "retracing created new variables"
  _check_training(results)


def test_tf_function_two_graphs_share_variables_by_name():
  """Another mtf graph lowered with the same mesh implementation sees the
  same slice variables (the impl holds them, by name)."""
  graph, mesh, w, _, update = _regression()
  impl = make_impl("rows:2;cols:4", "hidden:cols")

  @tf.function
  def train():
    lowering = mtf.Lowering(graph, {mesh: impl})
    lowering.lowered_operation(update)  # stateful ops run without being returned
  for _ in range(3):
    train()
  reader_graph = mtf.Graph()
  reader_mesh = mtf.Mesh(reader_graph, "mesh")
  w2 = mtf.get_variable(reader_mesh, "w", "hidden:16;out:4")

  @tf.function
  def read():
    return mtf.Lowering(reader_graph, {reader_mesh: impl}).export_to_tf_tensor(w2)
  ws, _ = _numpy_training(4)
  np.testing.assert_allclose(read().numpy(), ws[3], rtol=1e-4, atol=1e-5)
  del w


def test_autograph_does_not_rewrite_mtf_code():
  """In a tf.function with AutoGraph on (the default), building, differentiating,
  lowering and exporting an mtf graph runs mtf's own code as written: AutoGraph
  converts only the user's function (its converted functions are named tf__*)."""
  converted = []

  def watch(frame, event, arg):
    if event == "call" and frame.f_code.co_name.startswith("tf__"):
      converted.append(frame.f_code.co_name)
  impl = make_impl("rows:2;cols:4", "batch:rows;out:cols")

  @tf.function
  def train_step():
    graph, mesh, w, loss, update = _regression()
    hidden = mtf.layers.dense(mtf.relu(loss * w), mtf.Dimension("logit", 3),
                              reduced_dims=w.shape.dims[:1], name="dense")
    probs = mtf.softmax(hidden, "logit")
    lowering = mtf.Lowering(graph, {mesh: impl})
    with tf.control_dependencies([lowering.lowered_operation(update)]):
      return lowering.export_to_tf_tensor(loss), lowering.export_to_tf_tensor(probs)
  sys.setprofile(watch)
  try:
    train_step.get_concrete_function()
  finally:
    sys.setprofile(None)
  # Only this file's functions: the step and the model-building helper it calls.
  assert set(converted) == {"tf__train_step", "tf___regression"}, sorted(set(converted))


# ----------------------------------------------------------- eager
@pytest.mark.parametrize("mesh_shape,layout", _LAYOUTS)
def test_eager_lowering_training(mesh_shape, layout):
  graph, mesh, w, loss, update = _regression()
  impl = make_impl(mesh_shape, layout)
  results = []
  with count_variables() as created:
    for step in range(4):
      lowering = mtf.Lowering(graph, {mesh: impl})  # runs the ops, the update too
      lowering.lowered_operation(update)  # (None: eagerly there is no op to return)
      results.append((lowering.export_to_tf_tensor(w).numpy(),
                      lowering.export_to_tf_tensor(loss).numpy()))
      if step == 0:
        n_first = len(created)
  assert n_first >= 1 and len(created) == n_first
  _check_training(results)


# ----------------------------------------------------------- tf.compat.v1
@pytest.mark.parametrize("mesh_shape,layout", _LAYOUTS[:2])
def test_v1_graph_and_session(mesh_shape, layout):
  with tf.Graph().as_default() as tf_graph:
    x_ph = tf.compat.v1.placeholder(tf.float32, [8, 16])
    graph, mesh, w, loss, update = _regression(x_ph)
    impl = make_impl(mesh_shape, layout)
    lowering = mtf.Lowering(graph, {mesh: impl})
    train_op = lowering.lowered_operation(update)
    w_t = lowering.export_to_tf_tensor(w)
    loss_t = lowering.export_to_tf_tensor(loss)
    init = tf.compat.v1.global_variables_initializer()
    results = []
    with tf.compat.v1.Session(graph=tf_graph) as sess:
      sess.run(init)
      for _ in range(4):
        # Read, then update: one run would not order the reads and the assign.
        results.append(sess.run([w_t, loss_t], feed_dict={x_ph: X}))
        sess.run(train_op, feed_dict={x_ph: X})
  _check_training(results)


def test_v1_random_ops_differ_between_runs():
  with tf.Graph().as_default() as tf_graph:
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    u = mtf.random_uniform(mesh, "batch:8;hidden:16")
    lowering = mtf.Lowering(graph, {mesh: make_impl("rows:2;cols:4", "batch:rows")})
    u_t = lowering.export_to_tf_tensor(u)
    with tf.compat.v1.Session(graph=tf_graph) as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      a, b = sess.run(u_t), sess.run(u_t)
  assert not np.array_equal(a, b)
  assert a.min() >= 0 and a.max() < 1


# ----------------------------------------------------------- assignment
@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("mesh_shape,layout", [("rows:2;cols:4", "hidden:cols;out:rows"),
                                               ("all:8", "hidden:all")])
def test_assign_assign_add_assign_sub(mode, mesh_shape, layout):
  dv = np.arange(64, dtype=np.float32).reshape(16, 4) / 10
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  init = lambda shape, dtype=None: tf.ones(shape)
  a = mtf.get_variable(mesh, "a", "hidden:16;out:4", initializer=init)
  b = mtf.get_variable(mesh, "b", "hidden:16;out:4", initializer=init)
  c = mtf.get_variable(mesh, "c", "hidden:16;out:4", initializer=init)
  delta = mtf.import_tf_tensor(mesh, tf.constant(dv), "hidden:16;out:4")
  ops = [mtf.assign(a, delta * 2.0), mtf.assign_add(b, delta), mtf.assign_sub(c, delta)]
  impl = make_impl(mesh_shape, layout)

  def step():
    lowering = mtf.Lowering(graph, {mesh: impl})
    values = [lowering.export_to_tf_tensor(v) for v in (a, b, c)]  # before the ops
    with tf.control_dependencies(values):
      group = tf.group(*[lowering.lowered_operation(op) for op in ops])
    with tf.control_dependencies([group]):
      return [tf.identity(v) for v in values]
  if mode == "function":
    step = tf.function(step)
  seen = [[v.numpy() for v in step()] for _ in range(3)]
  ones = np.ones((16, 4), np.float32)
  for i, (av, bv, cv) in enumerate(seen):
    np.testing.assert_allclose(av, ones if i == 0 else 2 * dv, rtol=1e-6)
    np.testing.assert_allclose(bv, ones + i * dv, rtol=1e-6)
    np.testing.assert_allclose(cv, ones - i * dv, rtol=1e-6)


def test_assign_to_a_non_variable_is_a_type_error():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.zeros(mesh, "hidden:4", name="x")
  with pytest.raises(TypeError, match="x:0"):
    mtf.assign(x, x)


# ----------------------------------------------------------- import / export
@pytest.mark.parametrize("mesh_shape,layout", _ALL_LAYOUTS)
def test_import_and_export(mesh_shape, layout):
  full = np.arange(8 * 16, dtype=np.float32).reshape(8, 16)
  vec = np.arange(4, dtype=np.float32)
  impl = make_impl(mesh_shape, layout)
  shape = mtf.convert_to_shape("batch:8;hidden:16")

  def slices():
    out = []
    for pnum in range(impl.size):
      begin = impl.slice_begin(shape, pnum)
      size = impl.slice_shape(shape)
      out.append(tf.constant(full[begin[0]:begin[0] + size[0], begin[1]:begin[1] + size[1]]))
    return out

  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  a = mtf.import_tf_tensor(mesh, tf.constant(full), shape)
  b = mtf.import_fully_replicated(mesh, tf.constant(vec), "out:4")
  c = mtf.import_laid_out_tensor(mesh, mtf.LaidOutTensor(slices()), shape)
  d = mtf.import_laid_out_tensor(mesh, slices(), shape)  # a plain list works too
  total = mtf.einsum([a + c * 2.0 - d, b], output_shape="batch:8;hidden:16;out:4")

  @tf.function
  def run():
    lowering = mtf.Lowering(graph, {mesh: impl})
    laid = lowering.laid_out(c)
    return ([lowering.export_to_tf_tensor(t) for t in (a, b, c, d, total)],
            laid.tensor_list)
  values, tensor_list = run()
  a_v, b_v, c_v, d_v, total_v = [v.numpy() for v in values]
  np.testing.assert_array_equal(a_v, full)
  np.testing.assert_array_equal(b_v, vec)
  np.testing.assert_array_equal(c_v, full)
  np.testing.assert_array_equal(d_v, full)
  np.testing.assert_allclose(total_v, (2 * full)[:, :, None] * vec, rtol=1e-6)
  assert len(tensor_list) == impl.size
  assert tensor_list[0].shape.as_list() == impl.slice_shape(shape)


def test_import_laid_out_tensor_rejects_wrong_slice_shape():
  impl = make_impl("all:8", "batch:all")
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.import_laid_out_tensor(mesh, [tf.zeros([2, 4])] * 8, "batch:8;hidden:4", name="xs")
  with pytest.raises(ValueError, match="xs"):
    mtf.Lowering(graph, {mesh: impl}).export_to_tf_tensor(x)


# ----------------------------------------------------------- dtypes
@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("as_variable_dtype", [False, True])
def test_bfloat16_activations_with_float32_variables(mode, as_variable_dtype):
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.import_tf_tensor(mesh, tf.constant(X, tf.bfloat16), "batch:8;hidden:16")
  init = lambda shape, dtype=None: tf.constant(W0)
  if as_variable_dtype:
    w = mtf.get_variable(mesh, "w", "hidden:16;out:4", initializer=init,
                         dtype=mtf.VariableDType(tf.float32, tf.float32, tf.bfloat16))
  else:
    w = mtf.get_variable(mesh, "w", "hidden:16;out:4", initializer=init,
                         activation_dtype=tf.bfloat16)
  var = w.operation
  assert w.dtype == tf.bfloat16
  assert (var.master_dtype, var.slice_dtype, var.activation_dtype) == (
      tf.float32, tf.float32, tf.bfloat16)
  y = mtf.einsum([x, w], output_shape="batch:8;out:4")
  loss = mtf.reduce_sum(mtf.cast(y, tf.float32))
  [g] = mtf.gradients([loss], [w])
  assert g.dtype == tf.bfloat16 and y.dtype == tf.bfloat16
  update = mtf.assign_sub(w, g * 0.01)
  impl = make_impl("rows:2;cols:4", "batch:rows;hidden:cols")

  slice_dtypes = set()

  def step():
    lowering = mtf.Lowering(graph, {mesh: impl})
    slice_dtypes.update(s.dtype for s in lowering.variables[var].slices)
    op = lowering.lowered_operation(update)
    with tf.control_dependencies([op] if op is not None else []):
      return lowering.export_to_tf_tensor(y), lowering.export_to_tf_tensor(g)
  if mode == "function":
    step = tf.function(step)
  y1, g1 = step()
  assert slice_dtypes == {tf.float32}
  assert y1.dtype == tf.bfloat16
  np.testing.assert_allclose(y1.numpy().astype(np.float32), X @ W0, rtol=0.05, atol=0.05)
  expected_g = np.tile(X.sum(axis=0)[:, None], [1, 4])
  np.testing.assert_allclose(g1.numpy().astype(np.float32), expected_g, rtol=0.02, atol=0.05)
  # The float32 slices took the update (not rounded to bfloat16 storage).
  y2 = step()[0].numpy().astype(np.float32)
  w1 = W0 - 0.01 * g1.numpy().astype(np.float32)
  np.testing.assert_allclose(y2, X @ w1, rtol=0.05, atol=0.05)


# ----------------------------------------------------------- initialization
def _init_values(mesh_shape, layout, initializer, mode):
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  kwargs = {} if initializer is None else {"initializer": initializer}
  ws = [mtf.get_variable(mesh, "w1", "hidden:16;mid:8", **kwargs),
        mtf.get_variable(mesh, "w2", "batch:8;hidden:16;out:4", **kwargs)]
  impl = make_impl(mesh_shape, layout)

  def run():
    lowering = mtf.Lowering(graph, {mesh: impl})
    return [lowering.export_to_tf_tensor(w) for w in ws]
  values = tf.function(run)() if mode == "function" else run()
  return [v.numpy() for v in values]


@pytest.mark.parametrize("which", ["default", "tf_random_normal"])
def test_variable_initialization_is_layout_invariant(which):
  initializer = None if which == "default" else tf.random_normal_initializer(
      stddev=0.5, seed=3)
  reference = _init_values("single:1", "", initializer, "eager")
  for i, (mesh_shape, layout) in enumerate(_ALL_LAYOUTS):
    mode = "function" if i % 3 == 0 else "eager"
    got = _init_values(mesh_shape, layout, initializer, mode)
    for r, v in zip(reference, got):
      np.testing.assert_array_equal(v, r, err_msg=f"{mesh_shape} {layout} {mode}")
  w1, w2 = reference
  assert not np.array_equal(w1[:8], w1[8:]), "blocks of the variable must differ"
  if which == "default":
    # Glorot uniform: |w| <= sqrt(6 / (fan_in + fan_out)), fan_out the last dim.
    assert np.abs(w1).max() <= np.sqrt(6 / (16 + 8)) and w1.std() > 0.1
    assert np.abs(w2).max() <= np.sqrt(6 / (128 + 4))
  else:
    np.testing.assert_allclose(w1, initializer([16, 8]).numpy(), rtol=1e-6)


# ----------------------------------------------------------- randomness
def _dropout_graph():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.ones(mesh, "batch:8;hidden:16")
  d = mtf.dropout(x, rate=0.5)
  n = mtf.random_normal(mesh, "hidden:16;out:4")
  return graph, mesh, d, n


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_dropout_masks_change_each_step_and_match_across_layouts(mode):
  runs = []
  for mesh_shape, layout in [("single:1", ""), ("rows:2;cols:4", "batch:rows;hidden:cols"),
                             ("a:2;b:2;c:2", "hidden:a;out:b;batch:c")]:
    graph, mesh, d, n = _dropout_graph()
    impl = make_impl(mesh_shape, layout)

    def step():
      lowering = mtf.Lowering(graph, {mesh: impl})
      return lowering.export_to_tf_tensor(d), lowering.export_to_tf_tensor(n)
    if mode == "function":
      step = tf.function(step)
    runs.append([[t.numpy() for t in step()] for _ in range(3)])
  first = runs[0]
  for other in runs[1:]:
    for step_a, step_b in zip(first, other):
      for a, b in zip(step_a, step_b):
        np.testing.assert_array_equal(a, b)
  masks = [s[0] != 0 for s in first]
  assert not np.array_equal(masks[0], masks[1])
  assert not np.array_equal(masks[1], masks[2])
  assert not np.array_equal(first[0][1], first[1][1])
  for s in first:
    assert set(np.unique(s[0])) <= {0.0, 2.0}


def test_per_graph_caches_do_not_keep_old_graphs_alive():
  """Constants and reshapes shared within a graph live as long as that graph:
  a job that retraces its step must not keep old graphs alive."""
  from mesh_tensorflow.lowering.mesh_impl import int_constant  # pylint: disable=import-outside-toplevel
  refs = []
  for i in range(20):
    graph = tf.Graph()
    with graph.as_default():
      a, b = int_constant([i, 1]), int_constant([i, 1])
      assert a is b  # shared within the graph
    refs.append(weakref.ref(graph))
    del graph, a, b
  gc.collect()
  assert all(r() is None for r in refs)



def test_retraced_steps_do_not_keep_old_function_graphs_alive():
  """An mtf graph built once and lowered into several traced functions (a
  retracing step) holds none of their graphs, nor does the mesh
  implementation, whose collectives and shared blocks are per graph."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.import_tf_tensor(mesh, tf.reshape(tf.range(32.0), [8, 4]), "batch:8;d:4")
  total = mtf.reduce_sum(mtf.square(x), output_shape="d:4")
  impl = make_impl("rows:2;cols:4", "batch:rows;d:cols")
  refs = []
  for _ in range(3):
    step = tf.function(lambda: mtf.Lowering(graph, {mesh: impl}).export_to_tf_tensor(total))
    concrete = step.get_concrete_function()
    np.testing.assert_allclose(concrete().numpy(), (np.arange(32.0).reshape(8, 4) ** 2).sum(0))
    refs.append(weakref.ref(concrete.graph))
    del step, concrete
  gc.collect()
  assert all(r() is None for r in refs)

def test_embedding_step_creates_no_redundant_ops():
  """Ops that lowering would create twice or for nothing, counted on a split
  vocabulary: the lookup and its gradient share each processor's clipped ids,
  variable reads add no Identity, and an update is one NoOp, not one per
  device. On large meshes op creation is most of the lowering time."""
  impl = mtf.placement_mesh_impl.PlacementMeshImpl(
      "rows:2;cols:4", "batch:rows;vocab:cols", [f"cpu:{i}" for i in range(8)])
  ids_value = (np.arange(8 * 4).reshape(8, 4) * 5) % 64
  # A table larger than a processor's output: looked up block by block
  # (cost_model.gathers_table_first), not gathered first.
  table_value = np.arange(64 * 4, dtype=np.float32).reshape(64, 4) / 100

  @tf.function(autograph=False)
  def step(ids_value):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    ids = mtf.import_tf_tensor(mesh, ids_value, "batch:8;length:4")
    table = mtf.get_variable(mesh, "embedding_step_table", "vocab:64;d:4",
                             initializer=lambda shape, dtype=None: tf.constant(table_value))
    loss = mtf.reduce_sum(mtf.square(mtf.gather(table, ids, "vocab")))
    [g] = mtf.gradients([loss], [table])
    update = mtf.assign_sub(table, g * 0.01)
    lowering = mtf.Lowering(graph, {mesh: impl})
    with tf.control_dependencies([lowering.lowered_operation(update)]):
      return tf.identity(lowering.export_to_tf_tensor(loss))
  spec = tf.TensorSpec([8, 4], tf.int32)
  ops = step.get_concrete_function(spec).graph.get_operations()
  count = lambda kind: sum(op.type == kind for op in ops)
  # 2 row slices of ids x 4 vocabulary blocks; forward and gradient share them.
  assert count("ClipByValue") == count("Equal") == 8
  # The gradient sums with the ids in their own shape: nothing flattened.
  assert count("UnsortedSegmentSum") == 8
  assert not [op.name for op in ops if op.type == "UnsortedSegmentSum"
              and any(t.op.type == "Reshape" for t in op.inputs)]
  assert not [op.name for op in ops
              if op.type == "Identity" and op.inputs[0].op.type == "ReadVariableOp"]
  assert count("AssignSubVariableOp") == 4  # one per distinct slice
  # tf.function adds one NoOp of its own (automatic control dependencies).
  assert [op.name for op in ops if op.type == "NoOp" and op.name.startswith("assign")] == [
      "assign_sub/NoOp"]
  # The numbers: d/dtable of sum(table[ids]^2) adds 2 * table[id] per use.
  ids32 = tf.constant(ids_value, tf.int32)
  np.testing.assert_allclose(step(ids32).numpy(), (table_value[ids_value] ** 2).sum(), rtol=1e-5)
  grad = np.zeros_like(table_value)
  np.add.at(grad, ids_value.ravel(), 2 * table_value[ids_value.ravel()])
  table_after = table_value - 0.01 * grad
  np.testing.assert_allclose(step(ids32).numpy(), (table_after[ids_value] ** 2).sum(), rtol=1e-5)


def test_renaming_a_dimension_creates_no_op():
  """rename_dimension changes names, not slices: when the new name is laid
  out like the old one, the lowered slices are the input's own tensors."""
  impl = mtf.placement_mesh_impl.PlacementMeshImpl(
      "rows:2;cols:4", "batch:rows;d:cols;d_again:cols", [f"cpu:{i}" for i in range(8)])
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.import_tf_tensor(mesh, tf.reshape(tf.range(64.0), [8, 8]), "batch:8;d:8")
  kept = mtf.rename_dimension(x, "d", "d_again")       # same layout: same slices
  moved = mtf.rename_dimension(x, "batch", "batch_2")  # not split any more
  lowering = mtf.Lowering(graph, {mesh: impl})
  source = lowering.laid_out(x).tensor_list
  assert all(a is b for a, b in zip(lowering.laid_out(kept).tensor_list, source))
  assert [t.shape.as_list() for t in lowering.laid_out(moved).tensor_list] == [[8, 2]] * 8
  for t in (kept, moved):
    np.testing.assert_array_equal(lowering.export_to_tf_tensor(t).numpy(),
                                  np.arange(64.0).reshape(8, 8))
