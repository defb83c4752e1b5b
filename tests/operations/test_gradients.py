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
