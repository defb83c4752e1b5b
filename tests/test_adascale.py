"""AdaScale (mesh_tensorflow.adascale): the gain ratio is 1 for S = 1 and
above 1 when the batch is scaled; its variance and squared-norm estimates
match a numpy computation from the micro-batch gradients; the learning rate
is scaled by the gain and the effective progress advances by it."""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import slice_variables

import mtf_test_utils

MICRO, FEATURES, LR = 16, 8, 0.1
RNG = np.random.default_rng(0)
W_TRUE = RNG.normal(size=[FEATURES]).astype(np.float32)
X = RNG.normal(size=[64 * MICRO, FEATURES]).astype(np.float32)
Y = (X @ W_TRUE + 2.0 * RNG.normal(size=[64 * MICRO])).astype(np.float32)  # noisy


def model_fn(mesh, features, mode):
  del mode
  w = mtf.get_variable(mesh, "w", [features["x"].shape.dims[1]],
                       initializer=tf.zeros_initializer())
  err = mtf.einsum([features["x"], w], output_shape=features["y"].shape) - features["y"]
  return mtf.reduce_mean(mtf.square(err)) * 0.5


def _train(scale, steps, optimizer=None):
  data = tf.data.Dataset.from_tensor_slices({"x": X, "y": Y}).batch(MICRO).repeat()
  impl = mtf_test_utils.make_impl("all:8", "batch:all")
  optimizer = optimizer or mtf.adascale.AdaScale(mtf.optimize.SgdOptimizer(LR), scale=scale)
  trainer = mtf.training.Trainer(
      model_fn, {"x": f"batch:{MICRO};features:{FEATURES}", "y": f"batch:{MICRO}"}, impl,
      optimizer, grad_accum_steps=scale, log_every=0, log_fn=lambda line: None)
  history = trainer.train(data, steps=steps)
  return history, slice_variables.variable_store(impl)


def _micro_grads(w, first_micro_batch, count):
  grads = []
  for i in range(first_micro_batch, first_micro_batch + count):
    x, y = X[i * MICRO:(i + 1) * MICRO], Y[i * MICRO:(i + 1) * MICRO]
    grads.append(x.T @ (x @ w - y) / MICRO)
  return np.stack(grads)


def test_gain_is_one_without_scaling():
  history, store = _train(scale=1, steps=3)
  plain, _ = _train(scale=1, steps=3, optimizer=mtf.optimize.SgdOptimizer(LR))
  np.testing.assert_allclose(history["loss"], plain["loss"], rtol=1e-6)
  assert store["adascale/progress"].numpy() == 3.0


def test_scaled_batch_gain_matches_the_estimator_and_scales_the_step():
  scale = 4
  history, store = _train(scale=scale, steps=1)
  g = _micro_grads(np.zeros(FEATURES, np.float32), 0, scale)
  mean = g.mean(axis=0)
  sigma2 = scale / (scale - 1) * (np.mean(np.sum(g ** 2, axis=1)) - np.sum(mean ** 2))
  mu2 = np.sum(mean ** 2) - sigma2 / scale
  gain = (sigma2 + mu2) / (sigma2 / scale + mu2)
  assert 1.0 < gain < scale
  np.testing.assert_allclose(history["summary/adascale/sigma2"][0], sigma2, rtol=1e-4)
  np.testing.assert_allclose(history["summary/adascale/mu2"][0], mu2, rtol=1e-4)
  np.testing.assert_allclose(history["summary/adascale/gain"][0], gain, rtol=1e-4)
  np.testing.assert_allclose(store["w"].numpy(), -LR * gain * mean, rtol=1e-4)
  np.testing.assert_allclose(store["adascale/progress"].numpy(), gain, rtol=1e-5)


def test_gain_grows_with_the_scale_and_progress_sums_gains():
  gains = {}
  for scale in (2, 8):
    history, store = _train(scale=scale, steps=4)
    gains[scale] = np.array(history["summary/adascale/gain"])
    assert np.all(gains[scale] > 1.0) and np.all(gains[scale] <= scale)
    np.testing.assert_allclose(store["adascale/progress"].numpy(), gains[scale].sum(),
                               rtol=1e-5)
  assert gains[8].mean() > gains[2].mean()


def test_arguments_are_checked():
  with pytest.raises(ValueError, match="scale must be a positive integer"):
    mtf.adascale.AdaScale(mtf.optimize.SgdOptimizer(0.1), scale=0)
  with pytest.raises(ValueError, match="grad_accum_steps to its scale"):
    mtf.training.Trainer(model_fn, {"x": "batch:8;features:8", "y": "batch:8"},
                         mtf_test_utils.make_impl("all:8", "batch:all"),
                         mtf.adascale.AdaScale(mtf.optimize.SgdOptimizer(0.1), scale=4))
  assert mtf.adascale.gain_ratio(0.0, 1.0, scale=4) == pytest.approx(1.0)
  assert mtf.adascale.gain_ratio(1.0, 0.0, scale=4) == pytest.approx(4.0)


def test_a_skipped_step_leaves_the_statistics_and_progress_alone():
  scaled = np.where(np.arange(8 * MICRO) // MICRO == 2, np.float32(np.inf), 1.0)
  data = tf.data.Dataset.from_tensor_slices(
      {"x": X[:8 * MICRO], "y": Y[:8 * MICRO], "m": scaled.astype(np.float32)}
  ).batch(MICRO)

  def overflowing_model_fn(mesh, features, mode):
    return model_fn(mesh, features, mode) * mtf.reduce_mean(features["m"])

  impl = mtf_test_utils.make_impl("all:8", "batch:all")
  trainer = mtf.training.Trainer(
      overflowing_model_fn, {"x": f"batch:{MICRO};features:{FEATURES}",
                             "y": f"batch:{MICRO}", "m": f"batch:{MICRO}"}, impl,
      mtf.adascale.AdaScale(mtf.optimize.SgdOptimizer(LR), scale=2), grad_accum_steps=2,
      log_every=0, log_fn=lambda line: None,
      loss_scale=mtf.mixed_precision.DynamicLossScale(initial_scale=1.0))
  history = trainer.train(data, steps=4)  # step 2 holds the overflowing micro-batch
  store = slice_variables.variable_store(impl)
  assert store["loss_scale/skipped_steps"].numpy() == 1
  gains = history["summary/adascale/gain"]
  assert np.all(np.isfinite(gains)) and np.all(np.isfinite(store["w"].numpy()))
  np.testing.assert_allclose(store["adascale/progress"].numpy(),
                             gains[0] + gains[2] + gains[3], rtol=1e-5)
