"""mtf.gradients builds only the gradients that lead to xs: no operation for the
gradient of a constant operand (the lowering would emit it on every device)."""

import numpy as np
import tensorflow as tf

import mesh_tensorflow as mtf

from mtf_test_utils import lower_and_run


def test_constant_operands_get_no_gradient_ops():
  wv = np.arange(8, dtype=np.float32).reshape(2, 4) / 10
  cv = np.linspace(-1.0, 1.0, 8, dtype=np.float32).reshape(2, 4)
  built = {}

  def builder(mesh):
    w = mtf.get_variable(mesh, "w", "a:2;b:4",
                         initializer=lambda shape, dtype=None: tf.constant(wv))
    c = mtf.import_tf_tensor(mesh, tf.constant(cv), "a:2;b:4")
    y = mtf.where(mtf.greater(c, 0.0), w * c, c)  # c's branch has no gradient path
    loss = mtf.reduce_sum(y * 3.0)
    before = len(mesh.graph.operations)
    [g] = mtf.gradients([loss], [w.operation.outputs[0]])
    built["new_ops"] = mesh.graph.operations[before:]
    return {"g": g}
  got = lower_and_run(builder, "rows:2;cols:4", "b:cols")
  np.testing.assert_allclose(got["g"], np.where(cv > 0, cv * 3.0, 0.0), rtol=1e-6)
  multiplies = [op for op in built["new_ops"] if op.name.startswith("multiply")]
  wheres = [op for op in built["new_ops"] if op.name.startswith("where")]
  # d(y*3)/dy and d(w*c)/dw: one product each; none for c or for the scalar.
  assert len(multiplies) == 2, [op.name for op in built["new_ops"]]
  # The where's gradient reaches only its x branch (w * c), not c.
  assert len(wheres) == 1, [op.name for op in built["new_ops"]]


def test_dropout_backward_reads_its_one_byte_mask_only():
  xv = np.linspace(0.5, 2.0, 32, dtype=np.float32).reshape(4, 8)
  built = {}

  def builder(mesh):
    x = mtf.get_variable(mesh, "x", "a:4;b:8",
                         initializer=lambda shape, dtype=None: tf.constant(xv))
    y = mtf.dropout(x, is_training=True, rate=0.5)
    loss = mtf.reduce_sum(y * y)
    before = len(mesh.graph.operations)
    [g] = mtf.gradients([loss], [x.operation.outputs[0]])
    built["y_op"], built["new_ops"] = y.operation, mesh.graph.operations[before:]
    return {"y": y, "g": g}
  got = lower_and_run(builder, "rows:2;cols:4", "a:rows;b:cols")
  kept = got["y"] != 0
  assert 0 < kept.sum() < kept.size
  np.testing.assert_allclose(got["y"], np.where(kept, xv * 2.0, 0.0), rtol=1e-6)
  np.testing.assert_allclose(got["g"], np.where(kept, 2 * got["y"] * 2.0, 0.0), rtol=1e-6)
  x, mask = built["y_op"].inputs
  assert mask.dtype == tf.bool
  # The backward pass reads the boolean mask itself (not a mask in x's
  # dtype), and not x.
  assert any(mask in op.inputs for op in built["new_ops"])
  assert all(x not in op.inputs for op in built["new_ops"])
