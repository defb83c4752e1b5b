"""mtf.dynamic_shift: per-row shifts equal NumPy under several layouts, with
gradients."""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mtf_test_utils import assert_allclose, lower_and_run

X = np.arange(4 * 8, dtype=np.float32).reshape(4, 8) + 1.0
OFFSETS = np.array([0, 1, -2, 9], dtype=np.int32)


def _reference(wrap):
  out = np.zeros_like(X)
  for b in range(4):
    for i in range(8):
      j = i - OFFSETS[b]
      if wrap:
        out[b, i] = X[b, j % 8]
      elif 0 <= j < 8:
        out[b, i] = X[b, j]
  return out


@pytest.mark.parametrize("wrap", [False, True])
@pytest.mark.parametrize("mesh_shape,layout", [
    ("all:1", ""), ("all:8", "length:all"), ("rows:2;cols:4", "batch:rows;length:cols")])
def test_dynamic_shift_matches_numpy(wrap, mesh_shape, layout):
  weights = np.random.RandomState(0).rand(4, 8).astype(np.float32)

  def builder(mesh):
    batch, length = mtf.Dimension("batch", 4), mtf.Dimension("length", 8)
    x = mtf.get_variable(mesh, "x", [batch, length], initializer=tf.constant_initializer(X))
    offsets = mtf.import_tf_tensor(mesh, OFFSETS, [batch])
    y = mtf.dynamic_shift(x, offsets, length, wrap=wrap)
    w = mtf.import_tf_tensor(mesh, weights, [batch, length])
    [grad] = mtf.gradients([mtf.reduce_sum(y * w)], [x])
    return {"y": y, "grad": grad}
  got = lower_and_run(builder, mesh_shape, layout)
  expected = _reference(wrap)
  assert_allclose(got["y"], expected)
  # d/dx sum(w * shift(x)) = the inverse shift of w (zero where nothing moved in).
  grad = np.zeros_like(X)
  for b in range(4):
    for i in range(8):
      j = i - OFFSETS[b]
      if wrap or 0 <= j < 8:
        grad[b, j % 8] += weights[b, i]
  assert_allclose(got["grad"], grad)


def test_dynamic_shift_rejects_float_offsets():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  x = mtf.zeros(mesh, "batch:4;length:8")
  with pytest.raises(TypeError, match="integer"):
    mtf.dynamic_shift(x, mtf.zeros(mesh, "batch:4"), "length", wrap=False)
