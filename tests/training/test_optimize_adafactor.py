"""Adafactor, Adam, global-norm clipping, learning-rate schedules and variable
dtypes: each optimizer matches a float64 NumPy reference step by step (values
and slots), on one device and under several layouts of an 8-device mesh."""

import functools
import math
import time

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.training import learning_rate_schedules as lrs
from mesh_tensorflow.operations import variables as variable_ops

DEVICES = [f"/cpu:{i}" for i in range(8)]

# Layouts of a model over batch:8, heads:2, hidden:16, out:8. The factored
# dimensions of w [hidden, out] and w3 [heads, out, hidden] are hidden (d0)
# and out (d1); the layouts split neither, one, or both of them.
LAYOUTS = [
    ("", "all:1"),
    ("hidden:all", "all:8"),
    ("batch:rows;hidden:cols", "rows:2;cols:4"),
    ("out:rows;hidden:cols", "rows:2;cols:4"),
    ("heads:rows;out:cols", "rows:2;cols:4"),
]
LAYOUT_IDS = [f"{l or 'single'}@{m}" for l, m in LAYOUTS]

BATCH, HEADS, HIDDEN, OUT = 8, 2, 16, 8
NUM_STEPS = 3

_rng = np.random.RandomState(1)
X = _rng.randn(BATCH, HIDDEN).astype(np.float32)
Y = _rng.randn(BATCH, OUT).astype(np.float32)
S = (1.0 + 0.5 * _rng.randn(HEADS, HIDDEN)).astype(np.float32)
INITIAL = {
    "w": (0.3 * _rng.randn(HIDDEN, OUT)).astype(np.float32),
    "b": (0.1 * _rng.randn(OUT)).astype(np.float32),
    "w3": (0.2 * _rng.randn(HEADS, OUT, HIDDEN)).astype(np.float32),
}


def _constant_init(value):
  def init(shape, dtype=tf.float32):
    assert list(shape) == list(value.shape)
    return tf.constant(value, dtype)
  return init


def _dims():
  return {name: mtf.Dimension(name, size) for name, size in
          [("batch", BATCH), ("heads", HEADS), ("hidden", HIDDEN), ("out", OUT)]}


def _build_loss(mesh):
  """0.5 * sum((x w + b + sum_h (x * s[h]) w3[h]^T - y)^2)."""
  d = _dims()
  x = mtf.import_tf_tensor(mesh, tf.constant(X), [d["batch"], d["hidden"]])
  y = mtf.import_tf_tensor(mesh, tf.constant(Y), [d["batch"], d["out"]])
  s = mtf.import_tf_tensor(mesh, tf.constant(S), [d["heads"], d["hidden"]])
  w = mtf.get_variable(mesh, "w", [d["hidden"], d["out"]],
                       initializer=_constant_init(INITIAL["w"]))
  b = mtf.get_variable(mesh, "b", [d["out"]], initializer=_constant_init(INITIAL["b"]))
  w3 = mtf.get_variable(mesh, "w3", [d["heads"], d["out"], d["hidden"]],
                        initializer=_constant_init(INITIAL["w3"]))
  pred = (mtf.einsum([x, w], output_shape=[d["batch"], d["out"]]) + b
          + mtf.einsum([x * s, w3], output_shape=[d["batch"], d["out"]]))
  return 0.5 * mtf.reduce_sum(mtf.square(pred - y))


def _full_values(impl):
  """{variable name: full NumPy value}, assembled from the slices in the store."""
  values = {}
  for name, sliced in variable_ops.variable_store(impl).items():
    full = np.zeros(sliced.full_shape, dtype=sliced.slices[0].dtype.as_numpy_dtype)
    for begin, v in zip(sliced.begins, sliced.slices):
      part = v.numpy()
      full[tuple(slice(b, b + n) for b, n in zip(begin, part.shape))] = part
    values[name] = full
  return values


def _run(make_optimizer, layout, mesh_shape, num_steps=NUM_STEPS, step=None):
  """Runs num_steps updates; returns, per step, the loss before the update and
  every variable (slots and step counter included) after it."""
  impl = mtf.placement_mesh_impl.PlacementMeshImpl(
      mesh_shape, layout, DEVICES[:mtf.convert_to_shape(mesh_shape).size])

  @tf.function(autograph=False)
  def train_step():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    loss = _build_loss(mesh)
    variables = graph.trainable_variables
    grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
    ops = make_optimizer().apply_grads(grads, variables, step=step)
    lowering = mtf.Lowering(graph, {mesh: impl})
    update = tf.group(*[lowering.lowered_operation(op) for op in ops])
    with tf.control_dependencies([update]):
      return tf.identity(lowering.export_to_tf_tensor(loss))

  history = []
  for _ in range(num_steps):
    loss = train_step().numpy()
    values = _full_values(impl)
    values["loss"] = loss
    history.append(values)
  return history, impl


# ------------------------------------------------------------ NumPy references
def _grads(params):
  x, y, s = X.astype(np.float64), Y.astype(np.float64), S.astype(np.float64)
  xs = x[:, None, :] * s[None, :, :]  # [batch, heads, hidden]
  pred = x @ params["w"] + params["b"] + np.einsum("bhi,hoi->bo", xs, params["w3"])
  err = pred - y
  grads = {"w": x.T @ err, "b": err.sum(axis=0),
           "w3": np.einsum("bo,bhi->hoi", err, xs)}
  return 0.5 * np.sum(err ** 2), grads


def _rms(a):
  return np.sqrt(np.mean(np.square(a)))


def _factored_axes(shape, min_dim_size):
  """Axes of the two largest dimensions (earlier first on ties), or None."""
  if len(shape) < 2:
    return None
  order = sorted(range(len(shape)), key=lambda i: (-shape[i], i))
  if shape[order[1]] < min_dim_size:
    return None
  return order[0], order[1]


class AdafactorReference:
  """Adafactor in float64 NumPy, written from the paper's algorithm."""

  def __init__(self, multiply_by_parameter_scale=True, learning_rate=None,
               decay_rate=None, beta1=0.0, clipping_threshold=1.0, factored=True,
               epsilon1=1e-30, epsilon2=1e-3, min_dim_size_to_factor=128):
    if learning_rate is None:
      scale = 1.0 if multiply_by_parameter_scale else 0.05
      learning_rate = lambda t: scale * min(0.01, 1.0 / math.sqrt(t + 1.0))
    self.learning_rate = learning_rate
    self.decay_rate = decay_rate or (lambda t: 1.0 - (t + 1.0) ** -0.8)
    self.multiply = multiply_by_parameter_scale
    self.beta1 = beta1
    self.threshold = clipping_threshold
    self.factored = factored
    self.eps1, self.eps2 = epsilon1, epsilon2
    self.min_dim = min_dim_size_to_factor

  def __call__(self, param, grad, state, t, name=None):
    del name
    decay, lr = self.decay_rate(t), self.learning_rate(t)
    sq = grad ** 2 + self.eps1
    axes = _factored_axes(param.shape, self.min_dim) if self.factored else None
    if axes:
      a0, a1 = axes
      vr = decay * state.get("adafactor_vr", 0.0) + (1 - decay) * sq.mean(axis=a1)
      vc = decay * state.get("adafactor_vc", 0.0) + (1 - decay) * sq.mean(axis=a0)
      state["adafactor_vr"], state["adafactor_vc"] = vr, vc
      row = np.expand_dims(vr, a1)
      col = np.expand_dims(vc, a0)
      v = row * col / row.mean(axis=a0, keepdims=True)
    else:
      v = decay * state.get("adafactor_v", 0.0) + (1 - decay) * sq
      state["adafactor_v"] = v
    u = grad / np.sqrt(v)
    if self.threshold is not None:
      u = u / max(1.0, _rms(u) / self.threshold)
    step_size = lr * max(self.eps2, _rms(param)) if self.multiply else lr
    delta = u * step_size
    if self.beta1:
      delta = self.beta1 * state.get("adafactor_m", 0.0) + (1 - self.beta1) * delta
      state["adafactor_m"] = delta
    return param - delta


def adam_reference(lr, weight_decay_rate, beta_1, beta_2, epsilon, excluded):
  def update(param, grad, state, t, name):
    del t
    m = beta_1 * state.get("adam_m", 0.0) + (1 - beta_1) * grad
    v = beta_2 * state.get("adam_v", 0.0) + (1 - beta_2) * grad ** 2
    state["adam_m"], state["adam_v"] = m, v
    u = m / (np.sqrt(v) + epsilon)
    if name not in excluded:
      u = u + weight_decay_rate * param
    return param - lr * u
  return update


def reference_history(update, num_steps=NUM_STEPS, first_step=0, clip_norm=None,
                      counter=True):
  """update(param, grad, state, t, name) -> new param, for each variable."""
  params = {k: v.astype(np.float64) for k, v in INITIAL.items()}
  states = {k: {} for k in params}
  history = []
  for i in range(num_steps):
    loss, grads = _grads(params)
    if clip_norm is not None:
      norm = math.sqrt(sum(np.sum(g ** 2) for g in grads.values()))
      grads = {k: g * clip_norm / max(norm, clip_norm) for k, g in grads.items()}
    values = {"loss": loss}
    for name in params:
      params[name] = update(params[name], grads[name], states[name], first_step + i, name)
      values[name] = params[name].copy()
      for slot, v in states[name].items():
        values[f"{name}/{slot}"] = np.copy(v)
    if counter:
      values["optimizer_step"] = np.int64(i + 1)
    history.append(values)
  return history


def assert_histories_close(got, want, rtol=2e-5, atol=2e-6):
  assert len(got) == len(want)
  previous = {k: INITIAL[k] for k in INITIAL}
  for step, (g, w) in enumerate(zip(got, want)):
    assert set(g) == set(w), (sorted(g), sorted(w))
    for key in w:
      np.testing.assert_allclose(g[key], w[key], rtol=rtol, atol=atol,
                                 err_msg=f"{key} after step {step + 1}")
    # The updates themselves (small next to the values) agree closely too.
    for key in INITIAL:
      want_prev = previous[key] if step == 0 else want[step - 1][key]
      got_prev = previous[key] if step == 0 else got[step - 1][key]
      np.testing.assert_allclose(g[key] - got_prev, w[key] - want_prev,
                                 rtol=2e-3, atol=1e-6,
                                 err_msg=f"update of {key} at step {step + 1}")


# ------------------------------------------------------------- configurations
ADAFACTOR_CONFIGS = {
    # Defaults (relative step size, decay 1 - (t+1)^-0.8, clipping at 1),
    # factoring every matrix.
    "factored": dict(min_dim_size_to_factor=4),
    "unfactored": dict(factored=False, clipping_threshold=None),
    "beta1_clipped": dict(beta1=0.9, clipping_threshold=0.5, min_dim_size_to_factor=4),
}


@pytest.mark.parametrize("config", list(ADAFACTOR_CONFIGS))
@pytest.mark.parametrize("layout,mesh_shape", LAYOUTS, ids=LAYOUT_IDS)
def test_adafactor_matches_numpy(config, layout, mesh_shape):
  kwargs = ADAFACTOR_CONFIGS[config]
  got, _ = _run(lambda: mtf.optimize.AdafactorOptimizer(**kwargs), layout, mesh_shape)
  assert_histories_close(got, reference_history(AdafactorReference(**kwargs)))


@pytest.mark.parametrize("layout,mesh_shape", LAYOUTS[::2], ids=LAYOUT_IDS[::2])
def test_adafactor_absolute_step_schedule_adam_decay_and_global_clipping(
    layout, mesh_shape):
  """No parameter scale; the learning rate is a schedule; Adam-style decay;
  gradients clipped to global norm 2 (far below their norm here)."""
  schedule = lrs.product(0.05, functools.partial(lrs.linear_warmup, warmup_steps=2,
                                                 initial_value=0.5))

  def make():
    return mtf.optimize.AdafactorOptimizer(
        multiply_by_parameter_scale=False, learning_rate=schedule,
        decay_rate=mtf.optimize.adafactor_decay_rate_adam(0.9),
        min_dim_size_to_factor=4, clip_gradients_by_global_norm=2.0)
  got, _ = _run(make, layout, mesh_shape)
  reference = AdafactorReference(
      multiply_by_parameter_scale=False,
      learning_rate=lambda t: 0.05 * min(1.0, 0.5 + 0.5 * t / 2),
      decay_rate=lambda t: 0.9 * (1 - 0.9 ** t) / (1 - 0.9 ** (t + 1)),
      min_dim_size_to_factor=4)
  assert_histories_close(got, reference_history(reference, clip_norm=2.0))


@pytest.mark.parametrize("layout,mesh_shape", LAYOUTS, ids=LAYOUT_IDS)
def test_adam_matches_numpy(layout, mesh_shape):
  def make():
    return mtf.optimize.AdamWeightDecayOptimizer(
        learning_rate=0.01, weight_decay_rate=0.1, beta_1=0.8, beta_2=0.99,
        epsilon=1e-4, exclude_from_weight_decay=["^b$"])
  got, _ = _run(make, layout, mesh_shape)
  want = reference_history(adam_reference(0.01, 0.1, 0.8, 0.99, 1e-4, excluded=("b",)),
                           counter=False)
  assert_histories_close(got, want)


def test_adafactor_with_explicit_step_keeps_no_counter():
  """step=10 makes the defaults use t = 10, 10, 10 (the caller owns the step)."""
  got, impl = _run(lambda: mtf.optimize.AdafactorOptimizer(min_dim_size_to_factor=4),
                   "hidden:all", "all:8", step=10)
  assert "optimizer_step" not in variable_ops.variable_store(impl)
  reference = AdafactorReference(min_dim_size_to_factor=4,
                                 decay_rate=lambda t: 1.0 - 11.0 ** -0.8)
  assert_histories_close(got, reference_history(reference, counter=False))


def test_factored_slots_are_laid_out_like_their_variables():
  _, impl = _run(lambda: mtf.optimize.AdafactorOptimizer(beta1=0.5, min_dim_size_to_factor=4),
                 "out:rows;hidden:cols", "rows:2;cols:4", num_steps=1)
  store = variable_ops.variable_store(impl)
  # w [hidden:16, out:8] -> vr keeps hidden (split 4 ways), vc keeps out (2 ways).
  expected = {"w": [4, 4], "w/adafactor_vr": [4], "w/adafactor_vc": [4],
              "w/adafactor_m": [4, 4], "w3/adafactor_vr": [2, 4],
              "w3/adafactor_vc": [2, 4], "b/adafactor_v": [4], "optimizer_step": []}
  for name, slice_shape in expected.items():
    assert {tuple(s.shape.as_list()) for s in store[name].slices} == {tuple(slice_shape)}, name
  assert store["w3/adafactor_vr"].full_shape == [HEADS, HIDDEN]
  assert store["w3/adafactor_vc"].full_shape == [HEADS, OUT]
  assert not any(s.trainable for s in store["w/adafactor_vr"].slices)


def test_factored_dims_choice():
  opt = mtf.optimize.AdafactorOptimizer(min_dim_size_to_factor=4)
  shape = mtf.convert_to_shape
  assert opt.factored_dims(shape("a:2;b:8;c:4")) == tuple(shape("b:8;c:4").dims)
  assert opt.factored_dims(shape("a:4;b:8")) == tuple(shape("b:8;a:4").dims)
  assert opt.factored_dims(shape("a:3;b:8")) is None
  assert opt.factored_dims(shape("a:64")) is None
  assert mtf.optimize.AdafactorOptimizer(factored=False).factored_dims(
      shape("a:512;b:512")) is None


def test_two_optimizers_advance_the_step_counter_once_per_graph():
  impl = mtf.placement_mesh_impl.PlacementMeshImpl("all:2", "hidden:all", DEVICES[:2])

  @tf.function(autograph=False)
  def train_step():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    loss = _build_loss(mesh)
    variables = graph.trainable_variables
    grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
    ops = (mtf.optimize.AdafactorOptimizer().apply_grads(grads[:1], variables[:1])
           + mtf.optimize.AdafactorOptimizer(beta1=0.5).apply_grads(grads[1:], variables[1:]))
    lowering = mtf.Lowering(graph, {mesh: impl})
    tf.group(*[lowering.lowered_operation(op) for op in ops])

  for _ in range(3):
    train_step()
  assert int(_full_values(impl)["optimizer_step"]) == 3


def test_optimizer_arguments_are_checked():
  with pytest.raises(ValueError, match="beta1"):
    mtf.optimize.AdafactorOptimizer(beta1=1.0)
  with pytest.raises(ValueError, match="clipping_threshold"):
    mtf.optimize.AdafactorOptimizer(clipping_threshold=0.0)
  with pytest.raises(ValueError, match="clip_gradients_by_global_norm"):
    mtf.optimize.SgdOptimizer(0.1, clip_gradients_by_global_norm=-1.0)
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  loss = _build_loss(mesh)
  variables = graph.trainable_variables
  grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
  vector_lr = mtf.ones(mesh, "out:8")
  with pytest.raises(ValueError, match="must be a scalar"):
    mtf.optimize.SgdOptimizer(vector_lr).apply_grads(grads, variables)


# ------------------------------------------------------ clip_by_global_norm
@pytest.mark.parametrize("clip_norm", [0.5, 1e3])
@pytest.mark.parametrize("layout,mesh_shape", [("", "all:1"),
                                               ("batch:rows;hidden:cols", "rows:2;cols:4")])
def test_clip_by_global_norm(clip_norm, layout, mesh_shape):
  rng = np.random.RandomState(3)
  a = rng.randn(BATCH, HIDDEN).astype(np.float32)
  c = rng.randn(HIDDEN).astype(np.float32)
  d = rng.randn(OUT).astype(np.float32)
  dims = _dims()
  impl = mtf.placement_mesh_impl.PlacementMeshImpl(
      mesh_shape, layout, DEVICES[:mtf.convert_to_shape(mesh_shape).size])
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  grads = [mtf.import_tf_tensor(mesh, tf.constant(a), [dims["batch"], dims["hidden"]]),
           None,
           mtf.import_tf_tensor(mesh, tf.constant(c), [dims["hidden"]]),
           mtf.cast(mtf.import_tf_tensor(mesh, tf.constant(d), [dims["out"]]), tf.bfloat16)]
  clipped, norm = mtf.optimize.clip_by_global_norm(grads, clip_norm)
  assert clipped[1] is None and clipped[3].dtype == tf.bfloat16
  lowering = mtf.Lowering(graph, {mesh: impl})
  got = [lowering.export_to_tf_tensor(t).numpy().astype(np.float64)
         for t in (clipped[0], clipped[2], clipped[3], norm)]
  d_bf16 = tf.cast(tf.cast(d, tf.bfloat16), tf.float64).numpy()
  want_norm = math.sqrt(np.sum(a.astype(np.float64) ** 2) + np.sum(c.astype(np.float64) ** 2)
                        + np.sum(d_bf16 ** 2))
  factor = clip_norm / max(want_norm, clip_norm)
  np.testing.assert_allclose(got[3], want_norm, rtol=1e-6)
  np.testing.assert_allclose(got[0], a * factor, rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(got[1], c * factor, rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(got[2], d_bf16 * factor, rtol=1e-2, atol=1e-3)
  if clip_norm < want_norm:
    total = math.sqrt(sum(np.sum(g ** 2) for g in got[:3]))
    assert abs(total - clip_norm) < 1e-2 * clip_norm
  tf_clipped, tf_norm = tf.clip_by_global_norm([a, c], clip_norm,
                                               use_norm=tf.constant(want_norm, tf.float32))
  np.testing.assert_allclose(got[0], tf_clipped[0].numpy(), rtol=1e-5, atol=1e-7)
  del tf_norm


def test_clip_by_global_norm_checks_its_arguments():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  g = mtf.ones(mesh, "out:8")
  with pytest.raises(ValueError, match="every gradient is None"):
    mtf.optimize.clip_by_global_norm([None], 1.0)
  with pytest.raises(ValueError, match="positive"):
    mtf.optimize.clip_by_global_norm([g], 0.0)
  other = mtf.ones(mtf.Mesh(graph, "other"), "out:8")
  with pytest.raises(ValueError, match="different meshes"):
    mtf.optimize.clip_by_global_norm([g, other], 1.0)


# ---------------------------------------------------------------- schedules
SCHEDULE_STEPS = [0, 1, 7, 99, 100, 101, 250, 1000, 5000]

SCHEDULES = {
    "constant": (functools.partial(lrs.constant, value=0.3), lambda s: 0.3),
    "linear_warmup": (functools.partial(lrs.linear_warmup, warmup_steps=100),
                      lambda s: min(1.0, s / 100)),
    "linear_warmup_from_0.1": (
        functools.partial(lrs.linear_warmup, warmup_steps=250, initial_value=0.1),
        lambda s: min(1.0, 0.1 + 0.9 * s / 250)),
    "rsqrt_decay": (functools.partial(lrs.rsqrt_decay, warmup_steps=100),
                    lambda s: 1 / math.sqrt(max(s, 100))),
    "cosine_decay": (functools.partial(lrs.cosine_decay, total_steps=1000, final_value=0.1),
                     lambda s: 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(s, 1000) / 1000))),
    "cosine_decay_with_warmup": (
        functools.partial(lrs.cosine_decay, total_steps=1000, warmup_steps=100),
        lambda s: min(1.0, s / 100) * 0.5 * (1 + math.cos(
            math.pi * min(max(s - 100, 0), 900) / 900))),
    "product": (lrs.product(0.01, functools.partial(lrs.linear_warmup, warmup_steps=100),
                            functools.partial(lrs.rsqrt_decay, warmup_steps=250)),
                lambda s: 0.01 * min(1.0, s / 100) / math.sqrt(max(s, 250))),
    "adafactor_decay_pow": (mtf.optimize.adafactor_decay_rate_pow(0.8),
                            lambda s: 1 - (s + 1) ** -0.8),
    "adafactor_decay_adam": (mtf.optimize.adafactor_decay_rate_adam(0.999),
                             lambda s: 0.999 * (1 - 0.999 ** s) / (1 - 0.999 ** (s + 1))),
}


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_schedules_match_their_formulas(name):
  schedule, formula = SCHEDULES[name]
  want = np.array([formula(s) for s in SCHEDULE_STEPS])
  python = np.array([schedule(s) for s in SCHEDULE_STEPS])
  assert all(isinstance(schedule(s), float) for s in SCHEDULE_STEPS[:2])
  np.testing.assert_allclose(python, want, rtol=1e-12, atol=1e-15)
  tf_values = np.array([schedule(tf.constant(s, tf.int64)).numpy() for s in SCHEDULE_STEPS])
  np.testing.assert_allclose(tf_values, want, rtol=1e-5, atol=1e-7)
  # As mtf scalars, from an int64 step imported into a 2-device mesh.
  impl = mtf.placement_mesh_impl.PlacementMeshImpl("all:2", "", DEVICES[:2])
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  outputs = []
  for s in SCHEDULE_STEPS:
    step = mtf.import_fully_replicated(mesh, tf.constant(s, tf.int64), mtf.Shape([]))
    value = schedule(step)
    assert isinstance(value, mtf.Tensor) and value.dtype == tf.float32
    assert value.shape == mtf.Shape([])
    outputs.append(value)
  lowering = mtf.Lowering(graph, {mesh: impl})
  mtf_values = np.array([lowering.export_to_tf_tensor(v).numpy() for v in outputs])
  np.testing.assert_allclose(mtf_values, want, rtol=1e-5, atol=1e-7)


def test_schedule_arguments_are_checked():
  with pytest.raises(ValueError, match="warmup_steps must be positive"):
    lrs.rsqrt_decay(5, warmup_steps=0)
  with pytest.raises(ValueError, match="must exceed warmup_steps"):
    lrs.cosine_decay(5, total_steps=10, warmup_steps=10)
  with pytest.raises(TypeError, match="step must be"):
    lrs.constant("3")
  with pytest.raises(TypeError, match="factor must be"):
    lrs.product(0.1, "x")
  graph = mtf.Graph()
  with pytest.raises(ValueError, match="scalar step"):
    lrs.rsqrt_decay(mtf.ones(mtf.Mesh(graph, "mesh"), "out:8"))
  assert lrs.linear_warmup(3, warmup_steps=0) == 1.0


def test_sgd_follows_a_schedule_of_the_step_counter():
  """A callable learning rate gets the step counter: 0, 1, 2 on three steps."""
  schedule = lrs.product(0.02, functools.partial(lrs.linear_warmup, warmup_steps=2,
                                                 initial_value=0.5))
  got, _ = _run(lambda: mtf.optimize.SgdOptimizer(schedule), "batch:rows;hidden:cols",
                "rows:2;cols:4")

  def sgd(param, grad, state, t, name):
    del state, name
    return param - 0.02 * min(1.0, 0.5 + 0.25 * t) * grad
  assert_histories_close(got, reference_history(sgd))


# -------------------------------------------------------- variable dtypes
def _tiny_update_run(variable_dtype, make_optimizer, num_steps=10):
  """w [n:4] starts at 1; loss = sum(w * c) with c = 1e-3, so each SGD step
  with lr=1 subtracts 1e-3 (far below bfloat16's resolution at 1, 2^-7)."""
  impl = mtf.placement_mesh_impl.PlacementMeshImpl("all:2", "n:all", DEVICES[:2])
  n = mtf.Dimension("n", 4)

  @tf.function(autograph=False)
  def train_step():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    w = mtf.get_variable(mesh, "w", [n], dtype=variable_dtype,
                         initializer=tf.ones_initializer())
    c = mtf.constant(mesh, 1e-3, [n], dtype=w.dtype)
    loss = mtf.reduce_sum(w * c)
    variables = graph.trainable_variables
    grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
    ops = make_optimizer().apply_grads(grads, variables)
    lowering = mtf.Lowering(graph, {mesh: impl})
    tf.group(*[lowering.lowered_operation(op) for op in ops])

  for _ in range(num_steps):
    train_step()
  store = variable_ops.variable_store(impl)
  return store["w"], _full_values(impl)["w"]


def test_bfloat16_activations_keep_float32_master_updates():
  """Updates are computed from the float32 master value, not from the
  bfloat16 value the model reads: ten steps of (bfloat16) 1e-3 add up, where
  rounding the weight through bfloat16 would leave it stuck at 1 - 1e-3."""
  grad = float(tf.cast(tf.constant(1e-3, tf.bfloat16), tf.float64).numpy())
  for make, step in [
      (lambda: mtf.optimize.SgdOptimizer(1.0), grad),
      (lambda: mtf.optimize.MomentumOptimizer(1.0, momentum=0.0), grad),
      # beta_2 = 0: the update is grad / |grad| = 1, times the learning rate.
      (lambda: mtf.optimize.AdamWeightDecayOptimizer(
          1e-3, beta_1=0.0, beta_2=0.0, epsilon=1e-30), 1e-3)]:
    sliced, w = _tiny_update_run(
        mtf.VariableDType(tf.float32, tf.float32, tf.bfloat16), make)
    assert sliced.slices[0].dtype == tf.float32
    np.testing.assert_allclose(w, 1.0 - 10 * step, rtol=1e-6)


def test_bfloat16_slices_store_the_rounded_master_update():
  """With bfloat16 slices the update is still computed in float32, then
  rounded once to bfloat16 when stored."""
  sliced, w = _tiny_update_run(mtf.VariableDType(tf.float32, tf.bfloat16, tf.bfloat16),
                               lambda: mtf.optimize.SgdOptimizer(8.0), num_steps=3)
  assert sliced.slices[0].dtype == tf.bfloat16
  # 1 - 8e-3 rounds to 1 - 2^-7 in bfloat16, and so on.
  expected = 1.0
  for _ in range(3):
    expected = float(tf.cast(tf.cast(expected - 8e-3, tf.float32), tf.bfloat16).numpy())
  np.testing.assert_allclose(w.astype(np.float64), expected)
  assert expected < 1.0 - 2e-2


def _train_digits_mlp(activation_dtype, steps=300, batch=128, hidden=64):
  """A 64-hidden-unit MLP on scikit-learn's digits with Adafactor; returns
  (test accuracy, final training loss)."""
  from sklearn.datasets import load_digits  # pylint: disable=import-outside-toplevel
  digits = load_digits()
  order = np.random.RandomState(0).permutation(len(digits.target))
  images = (digits.images[order].reshape(-1, 64) / 16.0).astype(np.float32)
  labels = digits.target[order].astype(np.int32)
  split = 1400
  impl = mtf.placement_mesh_impl.PlacementMeshImpl(
      "rows:2;cols:2", "batch:rows;hidden:cols", DEVICES[:4])
  variable_dtype = mtf.VariableDType(tf.float32, tf.float32, activation_dtype)
  dims = {"pixels": mtf.Dimension("pixels", 64), "hidden": mtf.Dimension("hidden", hidden),
          "classes": mtf.Dimension("classes", 10)}

  def model(mesh, x_tf, y_tf):
    n = x_tf.shape[0]
    batch_dim = mtf.Dimension("batch", n)
    x = mtf.cast(mtf.import_tf_tensor(mesh, x_tf, [batch_dim, dims["pixels"]]),
                 activation_dtype)
    y = mtf.import_tf_tensor(mesh, y_tf, [batch_dim])
    w1 = mtf.get_variable(mesh, "w1", [dims["pixels"], dims["hidden"]], dtype=variable_dtype)
    b1 = mtf.get_variable(mesh, "b1", [dims["hidden"]], dtype=variable_dtype,
                          initializer=tf.zeros_initializer())
    w2 = mtf.get_variable(mesh, "w2", [dims["hidden"], dims["classes"]], dtype=variable_dtype)
    h = mtf.relu(mtf.einsum([x, w1], output_shape=[batch_dim, dims["hidden"]]) + b1)
    logits = mtf.cast(mtf.einsum([h, w2], output_shape=[batch_dim, dims["classes"]]),
                      tf.float32)
    onehot = mtf.one_hot(y, dims["classes"], dtype=tf.float32)
    loss = -mtf.reduce_mean(mtf.reduce_sum(
        onehot * mtf.log_softmax(logits, dims["classes"]), reduced_dim=dims["classes"]))
    correct = mtf.reduce_sum(mtf.cast(mtf.equal(mtf.argmax(logits, dims["classes"]), y),
                                      tf.float32))
    return loss, correct

  @tf.function(autograph=False)
  def train_step(x_tf, y_tf):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    loss, _ = model(mesh, x_tf, y_tf)
    variables = graph.trainable_variables
    grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
    ops = mtf.optimize.AdafactorOptimizer(
        learning_rate=0.05, min_dim_size_to_factor=16).apply_grads(grads, variables)
    lowering = mtf.Lowering(graph, {mesh: impl})
    with tf.control_dependencies([lowering.lowered_operation(op) for op in ops]):
      return tf.identity(lowering.export_to_tf_tensor(loss))

  @tf.function(autograph=False)
  def count_correct(x_tf, y_tf):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    _, correct = model(mesh, x_tf, y_tf)
    return mtf.Lowering(graph, {mesh: impl}).export_to_tf_tensor(correct)

  rng = np.random.RandomState(1)
  loss = None
  for _ in range(steps):
    idx = rng.randint(0, split, size=batch)
    loss = float(train_step(images[idx], labels[idx]))
  test_x, test_y = images[split:split + 396], labels[split:split + 396]
  accuracy = float(count_correct(test_x, test_y)) / len(test_y)
  return accuracy, loss


def test_bfloat16_mlp_trains_like_float32():
  """bfloat16 activations with float32 master weights reach the float32
  model's accuracy on held-out digits."""
  start = time.perf_counter()
  acc32, loss32 = _train_digits_mlp(tf.float32)
  acc16, loss16 = _train_digits_mlp(tf.bfloat16)
  print(f"digits MLP, Adafactor, 300 steps: float32 accuracy {acc32:.4f} loss "
        f"{loss32:.4f}; bfloat16 accuracy {acc16:.4f} loss {loss16:.4f}; "
        f"{time.perf_counter() - start:.1f} s")
  assert acc32 > 0.93, acc32
  assert acc16 > 0.93, acc16
  assert abs(acc16 - acc32) < 0.03, (acc16, acc32)
