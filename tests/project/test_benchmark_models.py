"""The benchmarks compare like with like: the mtf models of
benchmarks/bench_models.py, the plain TF baseline and the DTensor versions
(bench_dtensor.py) compute the same losses step after step, so the ratios
that benchmarks/step_time.py prints measure only the cost of each layout."""

import numpy as np
import pytest
import tensorflow as tf

from mtf_test_utils import import_script

# benchmarks/ holds scripts (bench_dtensor imports its sibling bench_models).
bm = import_script("bench_models", "benchmarks", "bench_models.py")
bench_dtensor = import_script("bench_dtensor", "benchmarks", "bench_dtensor.py")


def _losses(step, n=3):
  return [float(step()) for _ in range(n)]


def test_mlp_plain_mtf_and_dtensor_train_alike(devices):
  data = bm.mlp_data()
  reference = _losses(bm.plain_mlp_step_fn(*data))
  assert reference[2] < reference[0]  # SGD steps happen
  mtf_losses = _losses(bm.mtf_step_fn(bm.build_mtf_mlp, data, "rows:2;cols:4",
                                      "batch:rows;hidden:cols", devices))
  dtensor_losses = _losses(bench_dtensor.dtensor_step_fn("mlp", data, "rows:2;cols:4",
                                                         "batch:rows;hidden:cols"))
  np.testing.assert_allclose(mtf_losses, reference, rtol=1e-5)
  np.testing.assert_allclose(dtensor_losses, reference, rtol=1e-5)


def test_transformer_plain_and_mtf_train_alike(devices):
  data = bm.transformer_data()
  reference = _losses(bm.plain_transformer_step_fn(*data))
  assert reference[2] < reference[0]
  mtf_losses = _losses(bm.mtf_step_fn(bm.build_mtf_transformer, data, "rows:2;cols:4",
                                      "batch:rows;heads:cols;d_ff:cols;vocab:cols", devices))
  np.testing.assert_allclose(mtf_losses, reference, rtol=1e-5)


def test_dtensor_layout_follows_the_mtf_rules():
  mesh = tf.experimental.dtensor.create_mesh([("rows", 2), ("cols", 4)], device_type="CPU")
  layout_of = bench_dtensor._layout_fn(  # pylint: disable=protected-access
      mesh, "rows:2;cols:4", "batch:rows;heads:cols;d_ff:cols")
  assert layout_of(np.zeros([4, 3, 8]), ("batch", "length", "heads")).sharding_specs == [
      "rows", "unsharded", "cols"]
  # The same checks as mtf's own layouts: one mesh dimension splits at most
  # one dimension of a tensor, and must divide it.
  with pytest.raises(ValueError, match="two dimensions"):
    layout_of(np.zeros([8, 8]), ("heads", "d_ff"))
  with pytest.raises(ValueError, match="does not divide"):
    layout_of(np.zeros([6]), ("heads",))
