"""mtf.slicewise / mtf.cwise: any TensorFlow function on the slices, under any
layout, with TensorFlow's gradient or a user's grad_function."""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mtf_test_utils import DEVICES, assert_allclose, ensure_eight_devices, lower_and_run

ensure_eight_devices()

BATCH = mtf.Dimension("batch", 8)
LENGTH = mtf.Dimension("length", 8)
HIDDEN = mtf.Dimension("hidden", 16)
X = np.random.RandomState(0).randn(8, 8, 16).astype(np.float32)
BIAS = np.random.RandomState(1).randn(16).astype(np.float32)
LAYOUTS = [("all:8", "batch:all"), ("all:8", "length:all"), ("all:8", "hidden:all"),
           ("rows:2;cols:4", "batch:rows;hidden:cols"),
           ("rows:2;cols:4", "length:rows;hidden:cols"),
           ("rows:2;cols:4", "hidden:rows;length:cols")]


def _build(mesh):
  x = mtf.import_tf_tensor(mesh, X, [BATCH, LENGTH, HIDDEN])
  bias = mtf.import_tf_tensor(mesh, BIAS, [HIDDEN])
  # cumsum along "length": only batch and hidden may stay split.
  running = mtf.slicewise(lambda t: tf.cumsum(t, axis=1), [x], splittable_dims=[BATCH, HIDDEN])
  # A broadcasting function with the default splittable dims.
  scaled = mtf.slicewise(lambda t, c: tf.nn.softplus(t) * c, [x, bias], output_shape=x.shape)
  erf = mtf.cwise(tf.math.erf, [x])
  loss = (mtf.reduce_sum(running * running) + mtf.reduce_sum(scaled)
          + mtf.reduce_sum(erf))
  dx, dbias = mtf.gradients([loss], [x, bias])
  return {"running": running, "scaled": scaled, "erf": erf, "dx": dx, "dbias": dbias}


def _numpy_reference():
  running = np.cumsum(X, axis=1)
  dx = (2 * np.flip(np.cumsum(np.flip(running, 1), 1), 1) + BIAS / (1 + np.exp(-X))
        + 2 / np.sqrt(np.pi) * np.exp(-X ** 2))
  return {"running": running, "scaled": np.log1p(np.exp(X)) * BIAS,
          "erf": np.vectorize(__import__("math").erf)(X).astype(np.float32),
          "dx": dx, "dbias": np.log1p(np.exp(X)).sum((0, 1))}


@pytest.mark.parametrize("mesh_shape,layout", [("all:1", "")] + LAYOUTS)
def test_slicewise_values_and_gradients_match_numpy_under_every_layout(mesh_shape, layout):
  devices = DEVICES[:1] if mesh_shape == "all:1" else DEVICES
  got = lower_and_run(_build, mesh_shape, layout, devices)
  for key, want in _numpy_reference().items():
    assert_allclose(got[key], want, rtol=1e-4, atol=1e-4, msg=f"{key} under {layout!r}")


def test_unsplittable_dimension_is_gathered_and_counted():
  """cumsum over a split "length": the lowering gathers length (one allgather
  in the forward pass) instead of summing slices independently."""
  def build(mesh):
    x = mtf.import_tf_tensor(mesh, X, [BATCH, LENGTH, HIDDEN])
    return {"y": mtf.slicewise(lambda t: tf.cumsum(t, axis=1), [x],
                               splittable_dims=[BATCH, HIDDEN])}
  got, lowering = lower_and_run(build, "all:8", "length:all", return_lowering=True)
  assert_allclose(got["y"], np.cumsum(X, axis=1))
  assert lowering.collective_counts()["allgather"][0] == 1
  elementwise, lowering = lower_and_run(
      lambda mesh: {"y": mtf.cwise(tf.math.erf, [mtf.import_tf_tensor(
          mesh, X, [BATCH, LENGTH, HIDDEN])])}, "all:8", "length:all", return_lowering=True)
  assert "allgather" not in lowering.collective_counts()


def test_multiple_outputs_new_dimension_and_grad_function():
  pair = mtf.Dimension("pair", 2)
  calls = []

  def grad_function(op, d_low, d_high):
    calls.append(op.name)
    return [d_low + d_high]  # min/max of a value and its double, for x > 0

  def build(mesh):
    x = mtf.import_tf_tensor(mesh, np.abs(X) + 0.5, [BATCH, LENGTH, HIDDEN])
    low, high = mtf.slicewise(lambda t: (t, 2 * t), [x], output_shape=[x.shape, x.shape],
                              output_dtype=[tf.float32, tf.float32],
                              grad_function=grad_function, name="low_high")
    stacked = mtf.slicewise(lambda t: tf.stack([t, -t], axis=-1), [x],
                            output_shape=mtf.Shape(x.shape.dims + [pair]))
    loss = mtf.reduce_sum(low + high) + mtf.reduce_sum(stacked * stacked)
    (dx,) = mtf.gradients([loss], [x])
    return {"high": high, "stacked": stacked, "dx": dx}

  mtf_x = np.abs(X) + 0.5
  for mesh_shape, layout in [("all:1", ""), ("rows:2;cols:4", "pair:rows;batch:cols"),
                             ("all:8", "hidden:all")]:
    devices = DEVICES[:1] if mesh_shape == "all:1" else DEVICES
    got = lower_and_run(build, mesh_shape, layout, devices)
    assert_allclose(got["high"], 2 * mtf_x)
    assert_allclose(got["stacked"], np.stack([mtf_x, -mtf_x], axis=-1))
    assert_allclose(got["dx"], 2 + 4 * mtf_x, rtol=1e-5, atol=1e-4)
  assert calls and all(name.startswith("low_high") for name in calls)


def test_splittability_reported_like_the_original():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.zeros(mesh, [BATCH, HIDDEN])
  op = mtf.SlicewiseOperation(tf.exp, [x], [x.shape], [x.dtype], splittable_dims=[BATCH])
  assert op.splittable_dims == frozenset(["batch"])
  assert op.unsplittable_dims == frozenset(["hidden"])
  assert op.outputs[0].operation is op
  default = mtf.slicewise(tf.reduce_sum, [x], output_shape=[], name="total").operation
  assert default.unsplittable_dims == frozenset(["batch", "hidden"])
  plain = mtf.Operation([x], name="plain")
  assert plain._initialize_all_dimensions_as_splittable() == (
      frozenset(["batch", "hidden"]), frozenset())
  assert plain._initialize_splittable_and_unsplittable_dims("unsplittable", ["hidden"]) == (
      frozenset(["hidden"]), frozenset(["batch"]))
  with pytest.raises(ValueError, match="default_splittability"):
    plain._initialize_splittable_and_unsplittable_dims("sometimes")


def test_wrong_number_of_outputs_is_a_clear_error():
  def build(mesh):
    x = mtf.import_tf_tensor(mesh, X, [BATCH, LENGTH, HIDDEN])
    a, b = mtf.slicewise(lambda t: (t, t, t), [x], output_dtype=[tf.float32, tf.float32])
    return {"a": a}
  with pytest.raises(ValueError, match="returned 3 tensors for 2 outputs"):
    lower_and_run(build, "all:1", "", DEVICES[:1], mode="eager")
  with pytest.raises(ValueError, match="at least one input"):
    mtf.slicewise(tf.exp, [])
