"""mesh_tensorflow.testing, the support the tests, benchmarks and stress
scripts share: logical CPUs, lowering under a layout, NumPy comparison."""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import testing
import mtf_test_utils

BATCH, D = mtf.Dimension("batch", 8), mtf.Dimension("d", 4)


def _build(mesh):
  x = mtf.import_tf_tensor(mesh, tf.reshape(tf.range(32.0), [8, 4]), [BATCH, D])
  w = mtf.get_variable(mesh, "w", [D], initializer=tf.constant_initializer(2.0))
  return {"y": mtf.reduce_sum(x * w, reduced_dim=D)}


@pytest.mark.parametrize("mesh_shape,layout", [("all:1", ""), ("rows:2;cols:4", "batch:rows;d:cols")])
def test_lower_and_run_gives_values_variables_and_lowering(mesh_shape, layout):
  want = (np.arange(32.0).reshape(8, 4) * 2.0).sum(axis=1)
  values, variables, lowering = testing.lower_and_run(
      _build, mesh_shape, layout, return_variables=True, return_lowering=True)
  testing.assert_allclose(values["y"], want)
  testing.assert_allclose(variables["w"], np.full([4], 2.0))
  assert isinstance(lowering, mtf.Lowering)
  eager = testing.lower_and_run(_build, mesh_shape, layout, mode="eager")
  testing.assert_allclose(eager["y"], want)
  with pytest.raises(AssertionError):
    testing.assert_allclose(values["y"], want + 1.0)


def test_bad_mode_and_too_many_devices_say_what_to_do():
  with pytest.raises(ValueError, match="mode must be 'function' or 'eager'"):
    testing.lower_and_run(_build, "all:1", "", mode="graph")
  testing.use_logical_cpus(8)  # the split exists: nothing to do
  assert len(tf.config.list_logical_devices("CPU")) >= 8
  with pytest.raises(RuntimeError, match="before anything creates a tensor"):
    testing.use_logical_cpus(64)


def test_tests_helpers_are_the_shared_ones():
  assert mtf_test_utils.lower_and_run is testing.lower_and_run
  assert mtf_test_utils.make_impl is testing.make_impl
  assert mtf_test_utils.DEVICES == testing.DEVICES == [f"cpu:{i}" for i in range(8)]
  impl = testing.make_impl("rows:2;cols:4", "batch:rows")
  assert impl.size == 8 and len(impl.devices) == 8
