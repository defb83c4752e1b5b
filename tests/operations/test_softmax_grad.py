"""The fused softmax / log_softmax gradient (SoftmaxGradOperation): first and
second order equal TensorFlow's autodiff, whole or split over the mesh, and
a split softmax dimension costs the backward pass exactly one small SUM
allreduce."""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mtf_test_utils import lower_and_run

BATCH, CLASSES = 4, 8
RNG = np.random.RandomState(7)
X = RNG.randn(BATCH, CLASSES).astype(np.float32)
W = RNG.randn(BATCH, CLASSES).astype(np.float32)
C = RNG.randn(BATCH, CLASSES).astype(np.float32)


def _builder(log):
  def build(mesh):
    batch, classes = mtf.Dimension("batch", BATCH), mtf.Dimension("classes", CLASSES)
    x = mtf.get_variable(mesh, "x", [batch, classes], initializer=tf.constant_initializer(X))
    w = mtf.get_variable(mesh, "w", [batch, classes], initializer=tf.constant_initializer(W))
    c = mtf.import_tf_tensor(mesh, C, [batch, classes])
    fn = mtf.log_softmax if log else mtf.softmax
    y = fn(x, classes)
    [gx] = mtf.gradients([mtf.reduce_sum(y * w)], [x])
    # Second order: differentiate a function of the first gradient again.
    gxx, gxw = mtf.gradients([mtf.reduce_sum(gx * c)], [x, w])
    return {"gx": gx, "gxx": gxx, "gxw": gxw}
  return build


def _reference(log):
  x, w, c = (tf.constant(v, tf.float64) for v in (X, W, C))
  fn = tf.nn.log_softmax if log else tf.nn.softmax
  with tf.GradientTape(persistent=True) as outer:
    outer.watch([x, w])
    with tf.GradientTape() as inner:
      inner.watch(x)
      total = tf.reduce_sum(fn(x, axis=-1) * w)
    gx = inner.gradient(total, x)
    second = tf.reduce_sum(gx * c)
  return {"gx": gx.numpy(), "gxx": outer.gradient(second, x).numpy(),
          "gxw": outer.gradient(second, w).numpy()}


@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("mesh_shape,layout", [
    ("all:1", ""),
    ("all:8", "classes:all"),
    ("rows:2;cols:4", "batch:rows;classes:cols"),
])
def test_softmax_gradients_match_autodiff(log, mesh_shape, layout):
  got = lower_and_run(_builder(log), mesh_shape, layout)
  want = _reference(log)
  for key in want:
    np.testing.assert_allclose(got[key], want[key], rtol=1e-4, atol=1e-5, err_msg=key)


@pytest.mark.parametrize("log", [False, True])
def test_split_softmax_backward_is_one_sum_allreduce(log):
  def build(mesh):
    batch, classes = mtf.Dimension("batch", BATCH), mtf.Dimension("classes", CLASSES)
    x = mtf.get_variable(mesh, "x", [batch, classes], initializer=tf.constant_initializer(X))
    y = (mtf.log_softmax if log else mtf.softmax)(x, classes)
    [gx] = mtf.gradients([mtf.reduce_sum(y * y)], [x])
    return {"gx": gx}
  _, lowering = lower_and_run(build, "all:8", "classes:all", return_lowering=True)
  records = [r for r in lowering.collective_records if "softmax_grad" in r.op_name]
  assert [(r.kind, r.bytes_per_processor) for r in records] == [("allreduce", BATCH * 4)]
