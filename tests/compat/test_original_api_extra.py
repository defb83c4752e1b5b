"""More names of the original Mesh TensorFlow API: `mtf.squared_relu`,
`mtf.reduce_first`, `mtf.pool_tensor_1d`, `mtf.stride_tensor_1d`,
`mtf.layers.corr`, `mtf.layers.clip_activation_gradient` and the original's
(step, total_train_steps) learning-rate schedules. Values and gradients are
checked against NumPy, under layouts that split the dimensions involved."""

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.layers import core as layers_core
from mesh_tensorflow.transformer import learning_rate_schedules as lrs
from mtf_test_utils import DEVICES, assert_allclose, ensure_eight_devices, lower_and_run

ensure_eight_devices()

BATCH, LENGTH, D = mtf.Dimension("batch", 4), mtf.Dimension("length", 8), mtf.Dimension("d", 4)
SHAPE = [BATCH, LENGTH, D]
MESH = "rows:2;cols:4"
# Layouts of [batch, length, d] on MESH: none split, length and another split,
# length split alone, length whole with the others split.
LAYOUTS = ["", "length:rows;d:cols", "length:rows;batch:cols", "batch:rows;d:cols"]
LAYOUTS_LENGTH_SPLIT = ["length:rows;d:cols", "length:rows;batch:cols"]


def _x(seed=0, shape=(4, 8, 4)):
  return np.random.RandomState(seed).normal(size=shape).astype(np.float32)


def _run(build, layout, **kwargs):
  return lower_and_run(build, MESH, layout, **kwargs)


def _run_on_one_device(build):
  return lower_and_run(build, "all:1", "", DEVICES[:1])


# ------------------------------------------------------------------ squared_relu
@pytest.mark.parametrize("layout", ["", "length:rows;d:cols"])
def test_squared_relu_values_and_gradient(layout):
  x = _x()
  w = _x(1)

  def build(mesh):
    t = mtf.import_tf_tensor(mesh, x, SHAPE)
    y = mtf.squared_relu(t)
    loss = mtf.reduce_sum(y * mtf.import_tf_tensor(mesh, w, SHAPE))
    return {"y": y, "dx": mtf.gradients([loss], [t])[0]}
  got = _run(build, layout)
  relu = np.maximum(x, 0.0)
  assert_allclose(got["y"], relu ** 2)
  assert_allclose(got["dx"], 2.0 * relu * w)


def test_squared_relu_is_an_activation_name_and_rejects_non_tensors():
  resolve = layers_core._resolve_activation  # pylint: disable=protected-access
  assert resolve("squared_relu") is mtf.squared_relu
  got = _run_on_one_device(lambda mesh: {"y": mtf.squared_relu(mtf.import_tf_tensor(
      mesh, np.array([-2.0, 0.5, 3.0], np.float32), [mtf.Dimension("n", 3)]))})
  assert_allclose(got["y"], [0.0, 0.25, 9.0])
  with pytest.raises(TypeError, match="squared_relu"):
    mtf.squared_relu(np.ones(3))


# ------------------------------------------------------------------ reduce_first
@pytest.mark.parametrize("layout", LAYOUTS)
def test_reduce_first_values_dtypes_and_gradient(layout):
  x = _x()
  w = _x(2, (4, 4))

  def build(mesh):
    t = mtf.import_tf_tensor(mesh, x, SHAPE)
    ints = mtf.import_tf_tensor(mesh, np.arange(128, dtype=np.int32).reshape(4, 8, 4), SHAPE)
    first = mtf.reduce_first(t, LENGTH)
    loss = mtf.reduce_sum(first * mtf.import_tf_tensor(mesh, w, [BATCH, D]))
    return {"first": first, "by_name": mtf.reduce_first(t, reduced_dim="length"),
            "ints": mtf.reduce_first(ints, LENGTH),
            "bools": mtf.reduce_first(mtf.greater(ints, 40), LENGTH),
            "over_d": mtf.reduce_first(t, D), "dx": mtf.gradients([loss], [t])[0]}
  got = _run(build, layout)
  assert got["first"].shape == (4, 4)
  assert_allclose(got["first"], x[:, 0, :])
  assert_allclose(got["by_name"], x[:, 0, :])
  assert got["ints"].tolist() == np.arange(128).reshape(4, 8, 4)[:, 0, :].tolist()
  assert got["bools"].tolist() == (np.arange(128).reshape(4, 8, 4)[:, 0, :] > 40).tolist()
  assert_allclose(got["over_d"], x[:, :, 0])
  expected_dx = np.zeros_like(x)
  expected_dx[:, 0, :] = w
  assert_allclose(got["dx"], expected_dx)


def test_reduce_first_communication():
  """A split reduced dim costs one allreduce of the (small) result, never a
  gather of the input; a whole one costs nothing."""
  x = _x()

  def build(mesh):
    return {"first": mtf.reduce_first(mtf.import_tf_tensor(mesh, x, SHAPE), LENGTH)}
  got, lowering = _run(build, "length:rows;d:cols", return_lowering=True)
  assert_allclose(got["first"], x[:, 0, :])
  counters = dict(lowering.counters)
  assert counters.get("collectives/allreduce") == 1
  assert counters.get("collective_bytes/allreduce") == 4 * 1 * 4  # [batch:4, d:4/4] float32
  assert not [k for k in counters if "gather" in k or "concat" in k or "alltoall" in k]
  _, lowering = _run(build, "batch:rows;d:cols", return_lowering=True)
  assert not [k for k, _ in lowering.counters if k.startswith("collective")]


def test_reduce_first_bad_input():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  t = mtf.zeros(mesh, [BATCH, D])
  with pytest.raises(ValueError, match="length"):
    mtf.reduce_first(t, LENGTH)
  with pytest.raises(TypeError, match="mtf.Tensor"):
    mtf.reduce_first(np.zeros([4, 4]), D)


# ------------------------------------------------------------------ pooling
@pytest.mark.parametrize("layout", LAYOUTS)
def test_pool_and_stride_tensor_1d_values_and_gradient(layout):
  x = _x(3)
  w = _x(4, (4, 4, 4))

  def build(mesh):
    t = mtf.import_tf_tensor(mesh, x, SHAPE)
    mean = mtf.pool_tensor_1d(t, LENGTH)  # pool_size 2, reduce_mean
    pooled_shape = mtf.Shape([BATCH, mtf.Dimension("length", 4), D])
    loss = mtf.reduce_sum(mean * mtf.import_tf_tensor(mesh, w, pooled_shape))
    return {"mean": mean, "max4": mtf.pool_tensor_1d(t, LENGTH, mtf.reduce_max, pool_size=4),
            "first": mtf.pool_tensor_1d(t, "length", mtf.reduce_first),
            "stride": mtf.stride_tensor_1d(t, LENGTH),
            "stride4": mtf.stride_tensor_1d(t, LENGTH, pool_size=4),
            "dx": mtf.gradients([loss], [t])[0]}
  got = _run(build, layout)
  assert got["mean"].shape == (4, 4, 4)
  assert_allclose(got["mean"], x.reshape(4, 4, 2, 4).mean(axis=2))
  assert_allclose(got["max4"], x.reshape(4, 2, 4, 4).max(axis=2))
  assert_allclose(got["first"], x[:, ::2, :])
  assert_allclose(got["stride"], x[:, ::2, :])
  assert_allclose(got["stride4"], x[:, ::4, :])
  # d(sum(w * mean of pairs))/dx: w of the pair, halved.
  assert_allclose(got["dx"], np.repeat(w, 2, axis=1) / 2.0)


def test_pooled_dimension_keeps_its_name_and_split():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  t = mtf.zeros(mesh, SHAPE)
  y = mtf.pool_tensor_1d(t, LENGTH, pool_size=4)
  assert y.shape == mtf.Shape([BATCH, mtf.Dimension("length", 2), D])
  assert mtf.stride_tensor_1d(t, LENGTH, pool_size=8).shape == mtf.Shape(
      [BATCH, mtf.Dimension("length", 1), D])
  x = _x(5)
  # length split over rows stays split: the reshape into windows is local.
  got, lowering = _run(lambda m: {"y": mtf.pool_tensor_1d(
      mtf.import_tf_tensor(m, x, SHAPE), LENGTH, pool_size=4)}, "length:rows;d:cols",
      return_lowering=True)
  assert_allclose(got["y"], x.reshape(4, 2, 4, 4).mean(axis=2))
  assert not [k for k, _ in lowering.counters if k.startswith("collective")]


def test_pool_tensor_1d_bad_input():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  t = mtf.zeros(mesh, SHAPE)
  with pytest.raises(ValueError, match=r"pool_size 3 does not divide dimension 'length'"):
    mtf.pool_tensor_1d(t, LENGTH, pool_size=3)
  with pytest.raises(ValueError, match=r"pool_size 3 does not divide dimension 'length'"):
    mtf.stride_tensor_1d(t, LENGTH, pool_size=3)
  with pytest.raises(ValueError, match="positive int"):
    mtf.pool_tensor_1d(t, LENGTH, pool_size=0)
  with pytest.raises(ValueError, match="no dimension"):
    mtf.pool_tensor_1d(t, mtf.Dimension("time", 8))
  with pytest.raises(ValueError, match="no dimension 'time'"):
    mtf.stride_tensor_1d(t, "time")


# ------------------------------------------------------------------ corr
@pytest.mark.parametrize("layout", ["", "batch:rows;d:cols", "length:rows;batch:cols"])
def test_corr_equals_numpy_corrcoef(layout):
  x = _x(6)
  x[..., 1] += 0.5 * x[..., 0]  # some correlation

  def build(mesh):
    t = mtf.import_tf_tensor(mesh, x, SHAPE)
    c = mtf.layers.corr(t, D)
    assert c.shape == mtf.Shape([mtf.Dimension("d_1", 4), mtf.Dimension("d_2", 4)])
    return {"c": c, "c_length": mtf.layers.corr(t, "length")}
  got = _run(build, layout)
  assert_allclose(got["c"], np.corrcoef(x.reshape(-1, 4), rowvar=False), atol=1e-5)
  samples = np.moveaxis(x, 1, -1).reshape(-1, 8)
  assert_allclose(got["c_length"], np.corrcoef(samples, rowvar=False), atol=1e-5)
  assert abs(got["c"][0, 1]) > 0.2  # the added correlation shows


def test_corr_bad_input():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  with pytest.raises(ValueError, match="no dimension 'length'"):
    mtf.layers.corr(mtf.zeros(mesh, [BATCH, D]), LENGTH)
  with pytest.raises(ValueError, match="no sample dimension"):
    mtf.layers.corr(mtf.zeros(mesh, [D]), D)
  with pytest.raises(TypeError, match="int32"):
    mtf.layers.corr(mtf.zeros(mesh, [BATCH, D], dtype=tf.int32), D)
  with pytest.raises(ValueError, match="'d_1'"):
    mtf.layers.corr(mtf.zeros(mesh, [mtf.Dimension("d_1", 2), D]), D)


# ------------------------------------------------------------------ clip_activation_gradient
def _clip_grads(x, w, layout, **clip_kwargs):
  def build(mesh):
    t = mtf.import_tf_tensor(mesh, x, SHAPE)
    y = mtf.layers.clip_activation_gradient(t, **clip_kwargs)
    loss = mtf.reduce_sum(y * mtf.import_tf_tensor(mesh, w, SHAPE))
    return {"y": y, "dx": mtf.gradients([loss], [t])[0]}
  return _run(build, layout)


@pytest.mark.parametrize("layout", ["", "length:rows;d:cols"])
def test_clip_activation_gradient_clips_by_rms(layout):
  x, w = _x(7), _x(8)
  rms = float(np.sqrt(np.mean(w.astype(np.float64) ** 2)))
  clipped = _clip_grads(x, w, layout, clip_rms_norm=rms / 4.0)
  assert_allclose(clipped["y"], x)  # identity forward
  assert_allclose(clipped["dx"], w / 4.0)  # gradient rms brought down to rms / 4
  kept = _clip_grads(x, w, layout, clip_rms_norm=rms * 2.0)
  assert_allclose(kept["dx"], w)  # already below the limit: unchanged


def test_clip_activation_gradient_is_gin_configurable():
  x, w = _x(9), _x(10)
  rms = float(np.sqrt(np.mean(w.astype(np.float64) ** 2)))
  assert_allclose(_clip_grads(x, w, "")["dx"], w)  # no clip_rms_norm: plain identity
  try:
    gin.bind_parameter("clip_activation_gradient.clip_rms_norm", rms / 2.0)
    assert_allclose(_clip_grads(x, w, "")["dx"], w / 2.0)
  finally:
    gin.clear_config()
  graph = mtf.Graph()
  with pytest.raises(ValueError, match="clip_rms_norm must be positive"):
    mtf.layers.clip_activation_gradient(mtf.zeros(mtf.Mesh(graph, "m"), SHAPE), -1.0)


# ------------------------------------------------------------------ learning-rate schedules
def test_constant_schedules():
  assert lrs.constant(5, 100) == 1.0
  assert lrs.constant(5, 100, value=0.3) == pytest.approx(0.3)
  assert lrs.constant_learning_rate(5, 100, learning_rate=0.02) == pytest.approx(0.02)
  value = lrs.constant_learning_rate(tf.constant(5), 100, learning_rate=0.02)
  assert isinstance(value, tf.Tensor) and value.dtype == tf.float32
  assert float(value) == pytest.approx(0.02)
  with pytest.raises(TypeError, match="constant"):
    lrs.constant(5, 100, value="fast")


def test_linear_decay_and_warmup():
  # Fraction: decay over the last 10% (10 steps) of 100.
  assert [lrs.linear_decay(s, 100) for s in (0, 90, 95, 100)] == pytest.approx(
      [1.0, 1.0, 0.5, 0.0])
  # Absolute: decay over the last 40 steps.
  assert [lrs.linear_decay(s, 100, steps_or_fraction=40) for s in (50, 60, 80)] == \
      pytest.approx([1.0, 1.0, 0.5])
  assert [lrs.linear_warmup(s, 100000) for s in (0, 2500, 10000, 20000)] == pytest.approx(
      [0.0, 0.25, 1.0, 1.0])
  assert [lrs.linear_warmup(s, 200, steps_or_fraction=0.1) for s in (5, 10, 20, 50)] == \
      pytest.approx([0.25, 0.5, 1.0, 1.0])
  with pytest.raises(ValueError, match="steps_or_fraction"):
    lrs.linear_decay(5, 100, steps_or_fraction=0.0)


def test_truncated_rsqrt_and_noam():
  assert [lrs.truncated_rsqrt(s, 10**6) for s in (0, 10000, 40000)] == pytest.approx(
      [0.01, 0.01, 0.005])
  assert lrs.truncated_rsqrt(400, 10**6, warmup_steps=100) == pytest.approx(0.05)
  noam = lrs.learning_rate_schedule_noam
  # rsqrt(max(step, 100)) * 2, then the last 10% (100 steps of 1000) decay linearly.
  assert [noam(s, 1000, warmup_steps=100, multiplier=2.0) for s in (0, 400, 950, 1000)] == \
      pytest.approx([0.2, 0.1, 2.0 / np.sqrt(950) * 0.5, 0.0])
  assert noam(950, 1000, warmup_steps=100, linear_decay_fraction=0.0) == pytest.approx(
      1.0 / np.sqrt(950))
  # offset: the schedule restarts at step 500 over the remaining 500 steps.
  assert noam(900, 1000, warmup_steps=100, offset=500) == pytest.approx(1.0 / np.sqrt(400))
  assert noam(975, 1000, warmup_steps=100, offset=500) == pytest.approx(
      1.0 / np.sqrt(475) * 0.5)


def test_slanted_triangular():
  st = lambda s, **kw: lrs.slanted_triangular(s, 1000, max_learning_rate=0.032, **kw)
  # cut = 100 steps up from 0.032 / 32 = 0.001 to 0.032, then 900 down to 0.001.
  assert [st(s) for s in (0, 50, 100, 550, 1000)] == pytest.approx(
      [0.001, 0.001 * 16.5, 0.032, 0.001 * 16.5, 0.001])
  assert st(150, start_step=100) == pytest.approx(0.001 * 16.5)
  assert float(lrs.slanted_triangular(tf.constant(550, tf.int64), 1000, max_learning_rate=0.032)) \
      == pytest.approx(0.001 * 16.5)
  with pytest.raises(ValueError, match="cut_fraction"):
    lrs.slanted_triangular(0, 1000, cut_fraction=1.0)
  with pytest.raises(ValueError, match="below one step"):
    lrs.slanted_triangular(0, 5, cut_fraction=0.1)


def test_product_learning_rate():
  factors = [2.0, lrs.linear_warmup, lrs.truncated_rsqrt]
  # warmup over 10000 steps (default), rsqrt(max(step, 10000)) = 0.01.
  assert [lrs.product_learning_rate(s, 10**6, factors=factors) for s in (0, 5000, 40000)] == \
      pytest.approx([0.0, 0.01, 0.01])
  # offset shifts both the step and the total: linear_decay sees (50, 100).
  with_offset = lrs.product_learning_rate(150, 200, factors=[lrs.linear_decay], offset=100)
  assert with_offset == pytest.approx(1.0)
  assert lrs.product_learning_rate(195, 200, factors=[lrs.linear_decay], offset=100) == \
      pytest.approx(0.5)
  tf_value = lrs.product_learning_rate(tf.constant(5000, tf.int64), 10**6, factors=factors)
  assert isinstance(tf_value, tf.Tensor) and float(tf_value) == pytest.approx(0.01)
  with pytest.raises(TypeError, match="neither a number nor a schedule"):
    lrs.product_learning_rate(0, 100, factors=["x"])


def test_schedules_take_an_mtf_step():
  def build(mesh):
    step = mtf.constant(mesh, 550, [], dtype=tf.int32)
    return {"st": lrs.slanted_triangular(step, 1000, max_learning_rate=0.032),
            "noam": lrs.learning_rate_schedule_noam(step, 1000, warmup_steps=100),
            "product": lrs.product_learning_rate(
                step, 1000, factors=[3.0, lrs.linear_decay, lrs.constant])}
  got = _run_on_one_device(build)
  assert_allclose(got["st"], 0.001 * 16.5)
  assert_allclose(got["noam"], 1.0 / np.sqrt(550))
  assert_allclose(got["product"], 3.0)


def test_original_schedules_from_gin_get_total_train_steps():
  try:
    gin.parse_config("""
        learning_rate_schedules.product_learning_rate.factors = [
            @learning_rate_schedules.linear_warmup, @learning_rate_schedules.linear_decay]
        linear_warmup.steps_or_fraction = 100
        linear_decay.steps_or_fraction = 0.5
    """)
    schedule = lrs.bind_total_train_steps(lrs.product_learning_rate, 1000)
    assert [schedule(s) for s in (50, 500, 750)] == pytest.approx([0.5, 1.0, 0.5])
  finally:
    gin.clear_config()
  # A schedule of the step alone is left as it is.
  assert lrs.bind_total_train_steps(lrs.cosine_with_warmup, 1000) is lrs.cosine_with_warmup
  assert lrs.bind_total_train_steps(None, 1000) is None
