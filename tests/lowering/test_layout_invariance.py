"""Layout invariance: every layout of every mesh computes the same values and
gradients as a NumPy reference.

Random programs come from tests/graph_generator.py (also used by
oss_scripts/stress_layouts.py for long runs); hand-written cases below pin
down the trickiest lowerings (shift across slice boundaries, random ops).
"""

import random

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mesh_tensorflow as mtf

import graph_generator as gg
import mtf_test_utils
from mtf_test_utils import DEVICES

_SETTINGS = dict(deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.too_slow])


# ----------------------------------------------------------- random programs
@pytest.mark.parametrize("mesh_shape", gg.MESH_SHAPES)
@settings(max_examples=100, **_SETTINGS)
@given(seed=st.integers(0, 2**32 - 1))
def test_random_graph_matches_numpy(mesh_shape, seed):
  case = gg.generate_case(seed)
  result = gg.check_case(case, random.Random(seed), DEVICES, mesh_shapes=[mesh_shape],
                         layouts_per_mesh=2, unconstrained_layouts=1)
  assert not result.problems, case.describe() + "\n" + "\n".join(result.problems)
  assert result.lowerings >= 2


@settings(max_examples=6, **_SETTINGS)
@given(seed=st.integers(0, 2**32 - 1))
def test_random_graph_in_tf_function(seed):
  """The same programs lowered inside a tf.function (the slower path)."""
  case = gg.generate_case(seed, num_ops=6)
  result = gg.check_case(case, random.Random(seed), DEVICES,
                         mesh_shapes=["rows:2;cols:4"], mode="function")
  assert not result.problems, case.describe() + "\n" + "\n".join(result.problems)


@pytest.mark.parametrize("mesh_shape", ["rows:2;cols:4", "a:2;b:2;c:2"])
def test_random_graphs_in_tf_function_with_grappler(grappler_on, mesh_shape):
  """Random programs lowered inside a tf.function with TensorFlow's graph
  optimizer on, as in a user's program (the test processes turn it off)."""
  assert not tf.config.optimizer.get_experimental_options()["disable_meta_optimizer"]
  for seed in range(4):
    case = gg.generate_case(seed, num_ops=8)
    result = gg.check_case(case, random.Random(seed), DEVICES, mesh_shapes=[mesh_shape],
                           mode="function")
    assert not result.problems, case.describe() + "\n" + "\n".join(result.problems)
    assert result.lowerings >= 1


@settings(max_examples=30, **_SETTINGS)
@given(seed=st.integers(0, 2**32 - 1))
def test_longer_random_graphs(seed):
  """Longer programs (deeper chains of relayouts), one layout per mesh."""
  case = gg.generate_case(seed, num_ops=18)
  result = gg.check_case(case, random.Random(seed), DEVICES)
  assert not result.problems, case.describe() + "\n" + "\n".join(result.problems)


def test_generator_covers_every_op_family():
  """Guards the generator itself: over a few hundred seeds every op family the
  tests promise shows up, and layouts do split dimensions."""
  seen = set()
  for seed in range(400):
    for step in gg.generate_case(seed).steps:
      seen.add(step.name.split("(")[0].split("[")[0])
  expected = {
      "input", "tanh", "exp", "relu", "add", "sub", "multiply", "divide", "maximum",
      "add_operator", "einsum", "reduce_sum", "reduce_max", "reduce_mean",
      "reduce_logsumexp", "softmax", "log_softmax", "reshape", "transpose",
      "broadcast", "slice", "pad", "concat", "split", "stack", "unstack", "shift",
      "one_hot", "range", "gather", "where", "cumsum", "top_k", "argmax", "cast",
      "dropout", "random_uniform", "random_normal", "while_loop", "custom_gradient",
      "recompute_grad", "stop_gradient", "greater", "less", "add_n"}
  assert expected <= seen, sorted(expected - seen)


def test_random_layouts_split_dimensions():
  rnd = random.Random(0)
  shapes = [mtf.convert_to_shape("x:8;y:4"), mtf.convert_to_shape("y:4;z:2")]
  for mesh_shape in gg.MESH_SHAPES:
    drawn = [gg.random_layout(rnd, shapes, mesh_shape) for _ in range(30)]
    assert all(gg.layout_is_legal(shapes, r, mesh_shape) for r in drawn)
    if mesh_shape == "all:8":  # only x (size 8) can be split 8 ways
      assert {tuple(r) for r in drawn} == {(), (("x", "all"),)}, drawn
    else:
      assert any(len(r) == 3 for r in drawn), drawn


def test_generator_is_deterministic():
  a, b = gg.generate_case(1234), gg.generate_case(1234)
  assert a.describe() == b.describe()
  for key, value in a.reference().items():
    np.testing.assert_array_equal(value, b.reference()[key])


# ----------------------------------------------------------- shift
_SHIFT_LAYOUTS = [
    ("all:8", ""), ("all:8", "x:all"), ("rows:2;cols:4", "x:cols;y:rows"),
    ("rows:2;cols:4", "x:rows"), ("a:2;b:2;c:2", "x:b;y:c"), ("single:1", ""),
]


@pytest.mark.parametrize("mesh_shape,layout", _SHIFT_LAYOUTS)
def test_shift_values_and_gradients(mesh_shape, layout):
  """Offsets smaller and larger than a slice (x has 8 elements, slices have 1,
  2 or 4), zero-filled and wrapping, against numpy."""
  xv = np.random.default_rng(0).normal(size=(8, 2)).astype(np.float32)
  wv = np.random.default_rng(1).normal(size=(8, 2)).astype(np.float32)
  offsets = [-9, -8, -5, -3, -2, -1, 1, 2, 3, 4, 5, 7, 8, 9]
  cases = [(o, w) for o in offsets for w in (False, True)]

  def builder(mesh):
    x = mtf.import_tf_tensor(mesh, tf.constant(xv), "x:8;y:2")
    w = mtf.import_tf_tensor(mesh, tf.constant(wv), "x:8;y:2")
    out = {}
    total = []
    for o, wrap in cases:
      s = mtf.shift(x, o, "x", wrap)
      out[f"{o}/{wrap}"] = s
      total.append(mtf.reduce_sum(s * w))
    [g] = mtf.gradients([mtf.add_n(total)], [x])
    out["grad"] = g
    return out
  got = mtf_test_utils.lower_and_run(builder, mesh_shape, layout, mode="eager")
  expected_grad = np.zeros_like(xv)
  for o, wrap in cases:
    if wrap:
      ref = np.roll(xv, o, axis=0)
      expected_grad += np.roll(wv, -o, axis=0)
    else:
      ref = np.zeros_like(xv)
      gref = np.zeros_like(wv)
      if 0 < o < 8:
        ref[o:] = xv[:-o]
        gref[:-o] = wv[o:]
      elif -8 < o < 0:
        ref[:o] = xv[-o:]
        gref[-o:] = wv[:o]
      expected_grad += gref
    np.testing.assert_allclose(got[f"{o}/{wrap}"], ref, err_msg=f"offset={o} wrap={wrap}")
  np.testing.assert_allclose(got["grad"], expected_grad, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------- randomness
def _dropout_builder(x_value, rate):
  def builder(mesh):
    x = mtf.import_tf_tensor(mesh, tf.constant(x_value), "batch:8;hidden:4")
    c = mtf.import_tf_tensor(mesh, tf.constant(np.arange(32, dtype=np.float32)
                                               .reshape(8, 4)), "batch:8;hidden:4")
    d = mtf.dropout(x, rate=rate)
    u = mtf.random_uniform(mesh, "batch:8;hidden:4;out:2")
    n = mtf.random_normal(mesh, "hidden:4;out:2", mean=1.0, stddev=2.0)
    [g] = mtf.gradients([mtf.reduce_sum(d * c)], [x])
    return {"d": d, "u": u, "n": n, "g": g}
  return builder


def test_random_ops_are_layout_invariant():
  xv = np.ones((8, 4), np.float32) * 3.0
  rate = 0.5
  runs = []
  for mesh_shape, layout in [
      ("single:1", ""), ("all:8", ""), ("all:8", "batch:all"),
      ("rows:2;cols:4", "batch:rows;hidden:cols"), ("rows:2;cols:4", "out:rows;batch:cols"),
      ("a:2;b:2;c:2", "batch:a;hidden:b;out:c"), ("a:2;b:2;c:2", "hidden:c")]:
    runs.append(mtf_test_utils.lower_and_run(
        _dropout_builder(xv, rate), mesh_shape, layout, mode="eager"))
  first = runs[0]
  for run in runs[1:]:
    for key in first:
      np.testing.assert_array_equal(run[key], first[key], err_msg=key)
  d = first["d"]
  kept = d != 0
  np.testing.assert_allclose(d[kept], 6.0)  # 3 / (1 - rate)
  assert 0 < kept.sum() < kept.size, "a mask keeping all or nothing is implausible"
  # d(sum(dropout(x) * c))/dx = c * mask / keep_prob
  c = np.arange(32, dtype=np.float32).reshape(8, 4)
  np.testing.assert_allclose(first["g"], c * kept / (1 - rate))
  assert np.all((first["u"] >= 0) & (first["u"] < 1))
  assert first["u"].std() > 0.1 and abs(first["n"].mean() - 1.0) < 2.0


def test_random_ops_layout_invariant_in_tf_function():
  xv = np.ones((8, 4), np.float32)
  eager = mtf_test_utils.lower_and_run(_dropout_builder(xv, 0.25), "all:8", "", mode="eager")
  for mesh_shape, layout in [("rows:2;cols:4", "batch:cols;hidden:rows"),
                             ("a:2;b:2;c:2", "hidden:a;out:b;batch:c")]:
    got = mtf_test_utils.lower_and_run(_dropout_builder(xv, 0.25), mesh_shape, layout)
    for key in eager:
      np.testing.assert_array_equal(got[key], eager[key], err_msg=key)


# ----------------------------------------------------------- a small MLP
@pytest.mark.parametrize("mesh_shape,layout", [
    (m, l) for m, ls in mtf_test_utils.MESHES.items() for l in ls])
def test_mlp_values_and_gradients(mesh_shape, layout):
  """A two-layer MLP with softmax cross-entropy, against numpy by hand."""
  rng = np.random.default_rng(5)
  xv = rng.normal(size=(8, 16)).astype(np.float32)
  w1v = (rng.normal(size=(16, 8)) * 0.3).astype(np.float32)
  w2v = (rng.normal(size=(8, 4)) * 0.3).astype(np.float32)
  labels = rng.integers(0, 4, size=8).astype(np.int32)

  def builder(mesh):
    x = mtf.import_tf_tensor(mesh, tf.constant(xv), "batch:8;hidden:16")
    y = mtf.import_tf_tensor(mesh, tf.constant(labels), "batch:8")
    w1 = mtf.get_variable(mesh, "w1", "hidden:16;mid:8",
                          initializer=lambda shape, dtype=None: tf.constant(w1v))
    w2 = mtf.get_variable(mesh, "w2", "mid:8;out:4",
                          initializer=lambda shape, dtype=None: tf.constant(w2v))
    h = mtf.tanh(mtf.einsum([x, w1], output_shape="batch:8;mid:8"))
    logits = mtf.einsum([h, w2], output_shape="batch:8;out:4")
    out_dim = logits.shape.get_dim_by_name("out")
    xent = -mtf.reduce_sum(mtf.log_softmax(logits, out_dim) * mtf.one_hot(y, out_dim),
                           reduced_dim=out_dim)
    loss = mtf.reduce_mean(xent)
    g1, g2 = mtf.gradients([loss], [w1, w2])
    return {"loss": loss, "g1": g1, "g2": g2, "logits": logits}
  got = mtf_test_utils.lower_and_run(builder, mesh_shape, layout, mode="eager")
  # numpy forward and backward
  a = xv @ w1v
  h = np.tanh(a)
  logits = h @ w2v
  z = logits - logits.max(axis=1, keepdims=True)
  p = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
  onehot = np.eye(4)[labels]
  loss = -(np.log(p) * onehot).sum(axis=1).mean()
  dlogits = (p - onehot) / 8
  g2 = h.T @ dlogits
  g1 = xv.T @ ((dlogits @ w2v.T) * (1 - h * h))
  np.testing.assert_allclose(got["logits"], logits, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(got["loss"], loss, rtol=1e-5)
  np.testing.assert_allclose(got["g1"], g1, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(got["g2"], g2, rtol=1e-4, atol=1e-6)


# ----------------------------------------------------------- regressions
# Bugs the random programs found, pinned down with hand-written numpy checks.
_REGRESSION_LAYOUTS = [("all:8", ""), ("all:8", "a:all"), ("rows:2;cols:4", "a:cols;b:rows"),
                       ("a:2;b:2;c:2", "a:b;b:c")]


@pytest.mark.parametrize("mesh_shape,layout", _REGRESSION_LAYOUTS)
def test_recompute_grad_with_closures(mesh_shape, layout):
  """fn uses its argument, the explicit input itself (through its closure), a
  tensor computed from that input, and a variable."""
  xv = np.linspace(-1, 1, 8).astype(np.float32)
  vv = np.linspace(0.5, 2, 8).astype(np.float32)
  wv = np.linspace(2, -1, 8).astype(np.float32)

  def builder(mesh):
    x = mtf.import_tf_tensor(mesh, tf.constant(xv), "a:8")
    v = mtf.get_variable(mesh, "v", "a:8", initializer=lambda shape, dtype=None: tf.constant(vv))
    w = mtf.import_tf_tensor(mesh, tf.constant(wv), "a:8")
    c = x * 2.0
    y = mtf.recompute_grad(lambda t: t * x + t * c + v * t, [x])  # 3x^2 + vx
    gx, gv = mtf.gradients([mtf.reduce_sum(y * w)], [x, v])
    return {"y": y, "gx": gx, "gv": gv}
  got = mtf_test_utils.lower_and_run(builder, mesh_shape, layout, mode="eager")
  np.testing.assert_allclose(got["y"], 3 * xv ** 2 + vv * xv, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(got["gx"], wv * (6 * xv + vv), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(got["gv"], wv * xv, rtol=1e-5, atol=1e-6)


def test_recompute_grad_reuses_default_named_layer_variables():
  """A default-named mtf.layers layer inside fn finds its forward variables
  when fn runs again (it once made dense_1 and differentiated fresh weights)."""
  xv = np.linspace(-1, 1, 16).astype(np.float32).reshape(2, 8)

  def builder(mesh, recompute):
    x = mtf.import_tf_tensor(mesh, tf.constant(xv), "b:2;a:8")
    out_dim = mtf.Dimension("o", 4)

    def fn(t):
      return mtf.layers.dense(t, out_dim, reduced_dims=t.shape.dims[-1:], use_bias=False)
    y = mtf.recompute_grad(fn, [x]) if recompute else fn(x)
    [g] = mtf.gradients([mtf.reduce_sum(mtf.square(y))], [x])
    names = sorted(v.name for v in mesh.graph.all_variables)
    assert names == ["dense/kernel"], names
    return {"y": y, "g": g}
  plain = mtf_test_utils.lower_and_run(lambda m: builder(m, False), "all:2", "a:all",
                                       mode="eager")
  again = mtf_test_utils.lower_and_run(lambda m: builder(m, True), "all:2", "a:all",
                                       mode="eager")
  np.testing.assert_allclose(again["y"], plain["y"], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(again["g"], plain["g"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mesh_shape,layout", [("all:1", ""), ("rows:2;cols:4", "b:rows;e:cols")])
def test_softmax_of_a_six_dimensional_tensor(mesh_shape, layout):
  """TensorFlow's oneDNN CPU softmax rejects more than 5 dimensions."""
  xv = np.random.RandomState(0).randn(2, 2, 2, 2, 4, 3).astype(np.float32)

  def builder(mesh):
    x = mtf.import_tf_tensor(mesh, tf.constant(xv), "a:2;b:2;c:2;d:2;e:4;f:3")
    return {"p": mtf.softmax(x, "f"), "q": mtf.softmax(x, "c")}
  got = mtf_test_utils.lower_and_run(builder, mesh_shape, layout)
  for key, axis in (("p", 5), ("q", 2)):
    e = np.exp(xv - xv.max(axis=axis, keepdims=True))
    np.testing.assert_allclose(got[key], e / e.sum(axis=axis, keepdims=True), rtol=1e-5,
                               atol=1e-6)


@pytest.mark.parametrize("mesh_shape,layout", _REGRESSION_LAYOUTS)
def test_gradient_ignores_paths_through_stop_gradient(mesh_shape, layout):
  """An op without a gradient (while_loop) behind stop_gradient is fine."""
  xv = np.linspace(-1, 1, 8).astype(np.float32)

  def builder(mesh):
    x = mtf.import_tf_tensor(mesh, tf.constant(xv), "a:8")
    i0 = mtf.constant(mesh, 0, dtype=tf.int32)
    _, looped = mtf.while_loop(lambda i, t: mtf.less(i, 2), lambda i, t: [i + 1, t * 3.0],
                               [i0, mtf.stop_gradient(x)])
    loss = mtf.reduce_sum(looped * x + x)
    [g] = mtf.gradients([loss], [x])
    return {"g": g, "looped": looped}
  got = mtf_test_utils.lower_and_run(builder, mesh_shape, layout, mode="eager")
  np.testing.assert_allclose(got["looped"], 9 * xv, rtol=1e-6)
  np.testing.assert_allclose(got["g"], 9 * xv + 1, rtol=1e-6)


@pytest.mark.parametrize("mesh_shape,layout", [
    ("all:8", "a:all;b:all"), ("rows:2;cols:4", "a:cols;b:cols"),
    ("rows:2;cols:4", "a:rows;b:cols"), ("a:2;b:2;c:2", "a:b;b:b")])
def test_gather_gradient_with_indices_split_like_the_table(mesh_shape, layout):
  """Table dim and index dim split over the same mesh dimension."""
  table = np.arange(16, dtype=np.float32).reshape(8, 2)
  ids = np.array([1, 1, 7, 0, 3, 3, 3, 5], np.int32)
  wv = np.linspace(1, 2, 16).astype(np.float32).reshape(8, 2)

  def builder(mesh):
    t = mtf.import_tf_tensor(mesh, tf.constant(table), "a:8;d:2")
    i = mtf.import_tf_tensor(mesh, tf.constant(ids), "b:8")
    w = mtf.import_tf_tensor(mesh, tf.constant(wv), "b:8;d:2")
    g = mtf.gather(t, i, "a")
    [dt] = mtf.gradients([mtf.reduce_sum(g * w)], [t])
    return {"g": g, "dt": dt}
  got = mtf_test_utils.lower_and_run(builder, mesh_shape, layout, mode="eager")
  expected = np.zeros_like(table)
  np.add.at(expected, ids, wv)
  np.testing.assert_array_equal(got["g"], table[ids])
  np.testing.assert_allclose(got["dt"], expected, rtol=1e-6)


def test_random_normal_is_bit_identical_across_slicings():
  """float32 log/cos differ in the last bit between vectorized and scalar
  kernels; normal samples must not depend on the slice shape."""
  def builder(mesh):
    return {"n": mtf.random_normal(mesh, "a:8;b:4;c:2")}
  runs = [mtf_test_utils.lower_and_run(builder, m, l, mode="eager")["n"]
          for m, l in [("single:1", ""), ("all:8", "a:all"), ("rows:2;cols:4", "b:cols;c:rows"),
                       ("a:2;b:2;c:2", "a:a;b:b;c:c")]]
  for r in runs[1:]:
    np.testing.assert_array_equal(r, runs[0])
