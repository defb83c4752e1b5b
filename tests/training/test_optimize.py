"""mtf.optimize: every optimizer matches a NumPy reference, step by step, under
several layouts (replicated, model-parallel, 2-D data x model)."""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.operations import variables as variable_ops

DEVICES = [f"/cpu:{i}" for i in range(8)]

LAYOUTS = [
    ("", "all:8"),
    ("hidden:all", "all:8"),
    ("batch:rows;hidden:cols", "rows:2;cols:4"),
    ("batch:all", "all:8"),
    ("out:rows;batch:cols", "rows:2;cols:4"),
]
LAYOUT_IDS = [f"{l or 'replicated'}@{m}" for l, m in LAYOUTS]

BATCH, HIDDEN, OUT = 8, 8, 4
NUM_STEPS = 4
LR = 0.02

_rng = np.random.RandomState(0)
X = _rng.randn(BATCH, HIDDEN).astype(np.float32)
Y = _rng.randn(BATCH, OUT).astype(np.float32)
W0 = (0.3 * _rng.randn(HIDDEN, OUT)).astype(np.float32)
B0 = (0.1 * _rng.randn(OUT)).astype(np.float32)


def _constant_init(value):
  def init(shape, dtype=tf.float32):
    assert list(shape) == list(value.shape)
    return tf.constant(value, dtype)
  return init


def _dims():
  return (mtf.Dimension("batch", BATCH), mtf.Dimension("hidden", HIDDEN),
          mtf.Dimension("out", OUT))


def _build_loss(mesh):
  """0.5 * sum((x w + b - y)^2), with trainable w [hidden, out] and b [out]."""
  batch, hidden, out = _dims()
  x = mtf.import_tf_tensor(mesh, tf.constant(X), [batch, hidden])
  y = mtf.import_tf_tensor(mesh, tf.constant(Y), [batch, out])
  w = mtf.get_variable(mesh, "w", [hidden, out], initializer=_constant_init(W0))
  b = mtf.get_variable(mesh, "b", [out], initializer=_constant_init(B0))
  pred = mtf.einsum([x, w], output_shape=[batch, out]) + b
  return 0.5 * mtf.reduce_sum(mtf.square(pred - y))


def _run(make_optimizer, layout, mesh_shape, slot_names=(), num_steps=NUM_STEPS):
  """Runs num_steps optimizer steps; returns, per step, the loss before the
  update and the variables (and slots) after it, as NumPy arrays."""
  impl = mtf.placement_mesh_impl.PlacementMeshImpl(
      mesh_shape, layout, DEVICES[:mtf.convert_to_shape(mesh_shape).size])
  _, hidden, out = _dims()
  shapes = {"w": [hidden, out], "b": [out]}

  @tf.function(autograph=False)
  def step():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    loss = _build_loss(mesh)
    variables = graph.trainable_variables
    grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
    ops = make_optimizer(mesh).apply_grads(grads, variables)
    lowering = mtf.Lowering(graph, {mesh: impl})
    update = tf.group(*[lowering.lowered_operation(op) for op in ops])
    with tf.control_dependencies([update]):
      return tf.identity(lowering.export_to_tf_tensor(loss))

  @tf.function(autograph=False)
  def read():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    tensors = {}
    for var_name, shape in shapes.items():
      tensors[var_name] = mtf.get_variable(mesh, var_name, shape)
      for slot in slot_names:
        tensors[f"{var_name}/{slot}"] = mtf.get_variable(
            mesh, f"{var_name}/{slot}", shape, trainable=False)
    lowering = mtf.Lowering(graph, {mesh: impl})
    return {k: lowering.export_to_tf_tensor(t) for k, t in tensors.items()}

  history = []
  for _ in range(num_steps):
    loss = step().numpy()
    values = {k: v.numpy() for k, v in read().items()}
    values["loss"] = loss
    history.append(values)
  return history, impl


def _reference(update_fn, num_steps=NUM_STEPS):
  """The same training in float64 NumPy; update_fn(name, param, grad, state)
  returns the new param and updates `state` (a dict of slots) in place."""
  params = {"w": W0.astype(np.float64), "b": B0.astype(np.float64)}
  states = {"w": {}, "b": {}}
  x, y = X.astype(np.float64), Y.astype(np.float64)
  history = []
  for _ in range(num_steps):
    err = x @ params["w"] + params["b"] - y
    loss = 0.5 * np.sum(err ** 2)
    grads = {"w": x.T @ err, "b": err.sum(axis=0)}
    for name in params:
      params[name] = update_fn(name, params[name], grads[name], states[name])
    values = {"loss": loss}
    for name in params:
      values[name] = params[name].copy()
      for slot, v in states[name].items():
        values[f"{name}/{slot}"] = v.copy()
    history.append(values)
  return history


def _assert_histories_close(got, want):
  assert len(got) == len(want)
  for step, (g, w) in enumerate(zip(got, want)):
    assert set(g) == set(w), (sorted(g), sorted(w))
    for key in w:
      np.testing.assert_allclose(g[key], w[key], rtol=2e-5, atol=2e-6,
                                 err_msg=f"{key} after step {step + 1}")


def _sgd_ref(lr):
  def update(name, p, g, state):
    return p - lr * g
  return update


def _momentum_ref(lr, momentum):
  def update(name, p, g, state):
    v = momentum * state.get("momentum", np.zeros_like(p)) - lr * g
    state["momentum"] = v
    return p + v
  return update


def _adam_ref(lr, weight_decay_rate=0.0, beta_1=0.9, beta_2=0.999, epsilon=1e-6,
              excluded=()):
  def update(name, p, g, state):
    m = beta_1 * state.get("adam_m", np.zeros_like(p)) + (1 - beta_1) * g
    v = beta_2 * state.get("adam_v", np.zeros_like(p)) + (1 - beta_2) * g * g
    state["adam_m"], state["adam_v"] = m, v
    u = m / (np.sqrt(v) + epsilon)
    if weight_decay_rate and name not in excluded:
      u = u + weight_decay_rate * p
    return p - lr * u
  return update


@pytest.mark.parametrize("layout,mesh_shape", LAYOUTS, ids=LAYOUT_IDS)
def test_sgd_matches_numpy(layout, mesh_shape):
  got, _ = _run(lambda mesh: mtf.optimize.SgdOptimizer(LR), layout, mesh_shape)
  _assert_histories_close(got, _reference(_sgd_ref(LR)))


@pytest.mark.parametrize("layout,mesh_shape", LAYOUTS, ids=LAYOUT_IDS)
def test_momentum_matches_numpy(layout, mesh_shape):
  got, _ = _run(lambda mesh: mtf.optimize.MomentumOptimizer(LR, momentum=0.9),
                layout, mesh_shape, slot_names=["momentum"])
  _assert_histories_close(got, _reference(_momentum_ref(LR, 0.9)))


@pytest.mark.parametrize("layout,mesh_shape", LAYOUTS, ids=LAYOUT_IDS)
def test_adam_matches_numpy(layout, mesh_shape):
  got, _ = _run(lambda mesh: mtf.optimize.AdamWeightDecayOptimizer(learning_rate=0.01),
                layout, mesh_shape, slot_names=["adam_m", "adam_v"])
  _assert_histories_close(got, _reference(_adam_ref(0.01)))


@pytest.mark.parametrize("layout,mesh_shape", LAYOUTS[1:3], ids=LAYOUT_IDS[1:3])
def test_adam_weight_decay_and_exclusion(layout, mesh_shape):
  def make(mesh):
    return mtf.optimize.AdamWeightDecayOptimizer(
        learning_rate=0.01, weight_decay_rate=0.1, beta_1=0.8, beta_2=0.99,
        epsilon=1e-4, exclude_from_weight_decay=["^b$"])
  got, _ = _run(make, layout, mesh_shape, slot_names=["adam_m", "adam_v"])
  want = _reference(_adam_ref(0.01, weight_decay_rate=0.1, beta_1=0.8, beta_2=0.99,
                              epsilon=1e-4, excluded=("b",)))
  _assert_histories_close(got, want)


@pytest.mark.parametrize("layout,mesh_shape", LAYOUTS[:3], ids=LAYOUT_IDS[:3])
def test_learning_rate_may_be_an_mtf_scalar(layout, mesh_shape):
  def make(mesh):
    return mtf.optimize.SgdOptimizer(mtf.constant(mesh, LR, dtype=tf.float32))
  got, _ = _run(make, layout, mesh_shape)
  _assert_histories_close(got, _reference(_sgd_ref(LR)))


def test_slots_share_their_variables_layout():
  got, impl = _run(lambda mesh: mtf.optimize.MomentumOptimizer(LR, 0.5),
                   "hidden:all", "all:8", slot_names=["momentum"], num_steps=1)
  del got
  store = variable_ops.variable_store(impl)
  for name, slice_shape in [("w", [HIDDEN // 8, OUT]), ("b", [OUT])]:
    for key in (name, f"{name}/momentum"):
      assert [s.shape.as_list() for s in store[key].slices] == [slice_shape] * 8, key
  assert not any(s.trainable for s in store["w/momentum"].slices)


def test_slots_add_no_communication():
  """Slots are laid out like their variables, so momentum and Adam emit
  exactly the collectives that plain SGD does (the gradients' own allreduces,
  which, being lazy, happen where the optimizer first reads each gradient)."""
  impl = mtf.placement_mesh_impl.PlacementMeshImpl(
      "rows:2;cols:4", "batch:rows;hidden:cols", DEVICES)

  def counts(make_optimizer):
    result = {}

    @tf.function(autograph=False)
    def step():
      graph = mtf.Graph()
      mesh = mtf.Mesh(graph, "mesh")
      loss = _build_loss(mesh)
      variables = graph.trainable_variables
      grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
      ops = make_optimizer().apply_grads(grads, variables)
      lowering = mtf.Lowering(graph, {mesh: impl})
      result["counts"] = lowering.collective_counts()
      tf.group(*[lowering.lowered_operation(op) for op in ops])

    step()
    return result["counts"]

  sgd = counts(lambda: mtf.optimize.SgdOptimizer(LR))
  assert sgd.get("allreduce", (0, 0))[0] > 0, sgd
  assert counts(lambda: mtf.optimize.MomentumOptimizer(LR, 0.9)) == sgd
  assert counts(lambda: mtf.optimize.AdamWeightDecayOptimizer(
      0.01, weight_decay_rate=0.1)) == sgd


def test_variables_without_gradient_are_skipped():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  loss = _build_loss(mesh)
  unused = mtf.get_variable(mesh, "unused", "out:4")
  variables = graph.trainable_variables
  grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
  assert grads[[v.name for v in variables].index("unused")] is None
  ops = mtf.optimize.MomentumOptimizer(0.1, 0.9).apply_grads(grads, variables)
  assigned = {v.name for op in ops for v in op.assigned_variables}
  assert assigned == {"w", "b", "w/momentum", "b/momentum"}
  assert "unused/momentum" not in graph.name_to_variable
  del unused


def test_apply_grads_checks_its_arguments():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  loss = _build_loss(mesh)
  variables = graph.trainable_variables
  grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
  opt = mtf.optimize.SgdOptimizer(0.1)
  with pytest.raises(ValueError, match="2 variables"):
    opt.apply_grads(grads[:1], variables)
  with pytest.raises(ValueError, match="has shape"):
    opt.apply_grads(list(reversed(grads)), variables)
  # Value tensors are accepted in place of Variable operations.
  ops = opt.apply_grads(grads, [v.outputs[0] for v in variables])
  assert len(ops) == 2
