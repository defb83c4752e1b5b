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


def test_scripts_with_absl_flags_are_imported_through_import_script():
  """A test that executes an example or benchmark in the test process goes
  through mtf_test_utils.import_script, which leaves absl's global flags as
  they were. Executing one directly defines its --model_dir in the process,
  and a later `import mesh_tensorflow.transformer.main` in the same test
  worker fails with DuplicateFlagError (an order-dependent failure)."""
  import glob  # pylint: disable=g-import-not-at-top
  import os  # pylint: disable=g-import-not-at-top
  tests_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  # Files allowed to execute other files: the helper itself; cli_driver runs
  # in its own process; the public-names fixture is a data module with no flags.
  allowed = {"mtf_test_utils.py", "cli_driver.py", "test_original_public_names.py"}
  call = "." + "exec_module("  # spelled apart so this file does not match
  offenders = []
  for path in glob.glob(os.path.join(tests_dir, "**", "*.py"), recursive=True):
    if os.path.basename(path) in allowed:
      continue
    with open(path, encoding="utf-8") as f:
      if call in f.read():
        offenders.append(os.path.relpath(path, tests_dir))
  assert not offenders, f"use mtf_test_utils.import_script in: {offenders}"


def test_import_script_leaves_absl_flags_as_they_were():
  from absl import flags  # pylint: disable=g-import-not-at-top
  before = {name: flags.FLAGS[name] for name in flags.FLAGS}
  mtf_test_utils.import_mnist_example()
  after = {name: flags.FLAGS[name] for name in flags.FLAGS}
  assert after.keys() == before.keys()
  assert all(after[name] is before[name] for name in before)
