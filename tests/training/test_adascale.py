"""AdaScale (mesh_tensorflow.training.adascale): the gain ratio is 1 for S = 1 and
above 1 when the batch is scaled; its variance and squared-norm estimates
match a numpy computation from the micro-batch gradients; the learning rate
is scaled by the gain and the effective progress advances by it."""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.lowering import slice_variables

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


# ---- samples="replicas": the per-replica gradients of data parallelism -------

BATCH = 64  # one update's global batch; 8 replicas of 8 examples on all:8


def _replica_run(impl, steps=1, shapes=None, fn=model_fn, **adascale_kwargs):
  opt = mtf.adascale.AdaScale(mtf.optimize.SgdOptimizer(LR), **adascale_kwargs)
  shapes = shapes or {"x": f"batch:{BATCH};features:{FEATURES}", "y": f"batch:{BATCH}"}
  data = tf.data.Dataset.from_tensor_slices({"x": X, "y": Y}).batch(BATCH).repeat()
  trainer = mtf.training.Trainer(fn, shapes, impl, opt, log_every=0,
                                 log_fn=lambda line: None)
  history = trainer.train(data, steps=steps)
  return opt, history, slice_variables.variable_store(impl)


def _replica_grads(grad_fn, replicas):
  """Each replica's gradient of the mean loss over its own chunk of the batch."""
  chunk = BATCH // replicas
  return [grad_fn(X[r * chunk:(r + 1) * chunk], Y[r * chunk:(r + 1) * chunk])
          for r in range(replicas)]


def _estimates(sample_sq_norms, mean_sq, s):
  sigma2 = s / (s - 1) * (np.mean(sample_sq_norms) - mean_sq)
  mu2 = mean_sq - sigma2 / s
  return sigma2, mu2, (sigma2 + mu2) / (sigma2 / s + mu2)


@pytest.mark.parametrize("simd", [False, True], ids=["placement", "simd"])
def test_replica_samples_match_numpy_per_replica_gradients(simd):
  if simd:
    impl = mtf.simd_mesh_impl.SimdMeshImpl("all:8", "batch:all", mtf_test_utils.DEVICES)
  else:
    impl = mtf_test_utils.make_impl("all:8", "batch:all")
  opt, history, store = _replica_run(impl)
  assert (opt.samples, opt.scale) == ("replicas", 8)
  w0 = np.zeros(FEATURES, np.float32)
  g = np.stack(_replica_grads(lambda x, y: x.T @ (x @ w0 - y) / len(x), 8))
  mean = g.mean(axis=0)
  sq_norms = np.sum(g.astype(np.float64) ** 2, axis=1)
  sigma2, mu2, gain = _estimates(sq_norms, np.sum(mean.astype(np.float64) ** 2), 8)
  assert 1.0 < gain <= 8
  np.testing.assert_allclose(history["summary/adascale/sample_sq_mean"][0],
                             sq_norms.mean(), rtol=1e-4)
  np.testing.assert_allclose(history["summary/adascale/sigma2"][0], sigma2, rtol=1e-4)
  np.testing.assert_allclose(history["summary/adascale/mu2"][0], mu2, rtol=1e-4)
  np.testing.assert_allclose(history["summary/adascale/gain"][0], gain, rtol=1e-4)
  np.testing.assert_allclose(store["w"].numpy(), -LR * gain * mean, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(store["adascale/progress"].numpy(), gain, rtol=1e-5)


def test_replica_gain_stays_in_range_over_steps():
  _, history, store = _replica_run(mtf_test_utils.make_impl("all:8", "batch:all"), steps=3)
  gains = np.array(history["summary/adascale/gain"])
  assert np.all(gains > 1.0) and np.all(gains <= 8.0)
  np.testing.assert_allclose(store["adascale/progress"].numpy(), gains.sum(), rtol=1e-5)


def test_one_replica_gives_gain_exactly_one():
  impl = mtf_test_utils.make_impl("rows:1;cols:8", "batch:rows")
  opt, history, store = _replica_run(impl, steps=2, samples="replicas")
  assert (opt.samples, opt.scale) == ("replicas", 1)
  assert store["adascale/progress"].numpy() == 2.0
  data = tf.data.Dataset.from_tensor_slices({"x": X, "y": Y}).batch(BATCH)
  plain = mtf.training.Trainer(
      model_fn, {"x": f"batch:{BATCH};features:{FEATURES}", "y": f"batch:{BATCH}"},
      mtf_test_utils.make_impl("rows:1;cols:8", "batch:rows"), mtf.optimize.SgdOptimizer(LR),
      log_every=0, log_fn=lambda line: None).train(data, steps=2)
  np.testing.assert_allclose(history["loss"], plain["loss"], rtol=1e-6)


HIDDEN = 8
W1 = (RNG.normal(size=[FEATURES, HIDDEN]) / np.sqrt(FEATURES)).astype(np.float32)
W2 = (RNG.normal(size=[HIDDEN]) / np.sqrt(HIDDEN)).astype(np.float32)


def two_layer_fn(mesh, features, mode):
  del mode
  x, y = features["x"], features["y"]
  hidden = mtf.Dimension("hidden", HIDDEN)
  w1 = mtf.get_variable(mesh, "w1", [x.shape.dims[1], hidden],
                        initializer=tf.constant_initializer(W1))
  w2 = mtf.get_variable(mesh, "w2", [hidden], initializer=tf.constant_initializer(W2))
  h = mtf.einsum([x, w1], output_shape=mtf.Shape([x.shape.dims[0], hidden]))
  err = mtf.einsum([h, w2], output_shape=y.shape) - y
  return mtf.reduce_mean(mtf.square(err)) * 0.5


def test_two_by_four_layout_has_two_replicas_summed_over_model_parallel_slices():
  impl = mtf_test_utils.make_impl("rows:2;cols:4", "batch:rows;hidden:cols")
  opt, history, _ = _replica_run(impl, fn=two_layer_fn)
  assert (opt.samples, opt.scale, opt.replica_mesh_dim) == ("replicas", 2, "rows")

  def grads(x, y):
    err = x @ W1 @ W2 - y
    return np.concatenate([np.outer(x.T @ err, W2).ravel(), (x @ W1).T @ err]) / len(x)
  g = np.stack(_replica_grads(grads, 2)).astype(np.float64)
  sq_norms = np.sum(g ** 2, axis=1)
  np.testing.assert_allclose(history["summary/adascale/sample_sq_mean"][0],
                             sq_norms.mean(), rtol=1e-4)
  _, _, gain = _estimates(sq_norms, np.sum(g.mean(axis=0) ** 2), 2)
  np.testing.assert_allclose(history["summary/adascale/gain"][0], gain, rtol=1e-4)
  assert 1.0 <= history["summary/adascale/gain"][0] <= 2.0


def test_replica_squared_norm_needs_a_pending_sum():
  def builder(mesh):
    x = mtf.import_tf_tensor(mesh, tf.constant(X[:8]), "batch:8;features:8", name="x")
    return {"sq": mtf.replica_squared_norm(x, "all")}
  with pytest.raises(ValueError, match=r"x.*not a pending sum over mesh dimension 'all'"):
    mtf_test_utils.lower_and_run(builder, "all:8", "batch:all")
  with pytest.raises(ValueError, match="scale=4, but samples='replicas'"):
    mtf.adascale.AdaScale(mtf.optimize.SgdOptimizer(0.1), scale=4, samples="replicas"
                          ).configure(mtf_test_utils.make_impl("all:8", "batch:all"))
  with pytest.raises(ValueError, match="does not split 'batch'"):
    mtf.adascale.AdaScale(mtf.optimize.SgdOptimizer(0.1), samples="replicas"
                          ).configure(mtf_test_utils.make_impl("all:8", "hidden:all"))


@pytest.mark.parametrize("option", ["loss_scale", "zero_stage_3"])
def test_replica_samples_with_loss_scaling_and_zero(option):
  """Loss scaling completes the allreduce (unscale) before AdaScale reads the
  partial sums, and divides them by scale^2; ZeRO reduce-scatters them."""
  kwargs = ({"loss_scale": mtf.mixed_precision.DynamicLossScale(initial_scale=1024.0)}
            if option == "loss_scale" else {"zero_stage": 3})
  impl = mtf_test_utils.make_impl("all:8", "batch:all")
  opt = mtf.adascale.AdaScale(mtf.optimize.SgdOptimizer(LR))
  data = tf.data.Dataset.from_tensor_slices({"x": X, "y": Y}).batch(BATCH)
  history = mtf.training.Trainer(
      model_fn, {"x": f"batch:{BATCH};features:{FEATURES}", "y": f"batch:{BATCH}"}, impl,
      opt, log_every=0, log_fn=lambda line: None, **kwargs).train(data, steps=1)
  w0 = np.zeros(FEATURES, np.float32)
  g = np.stack(_replica_grads(lambda x, y: x.T @ (x @ w0 - y) / len(x), 8))
  np.testing.assert_allclose(history["summary/adascale/sample_sq_mean"][0],
                             np.mean(np.sum(g.astype(np.float64) ** 2, axis=1)), rtol=1e-4)


def test_replica_squared_norm_op_sums_model_parallel_slices_in_one_allreduce():
  def builder(mesh):
    x = mtf.import_tf_tensor(mesh, tf.constant(X[:BATCH]), f"batch:{BATCH};features:8")
    y = mtf.import_tf_tensor(mesh, tf.constant(Y[:BATCH]), f"batch:{BATCH}")
    loss = two_layer_fn(mesh, {"x": x, "y": y}, "train")
    w1, w2 = [v.outputs[0] for v in mesh.graph.trainable_variables]
    return {"sq": mtf.replica_squared_norm(mtf.gradients([loss], [w1, w2]), "rows")}
  got, lowering = mtf_test_utils.lower_and_run(
      builder, "rows:2;cols:4", "batch:rows;hidden:cols", return_lowering=True)

  def grads(x, y):
    err = x @ W1 @ W2 - y
    return np.concatenate([np.outer(x.T @ err, W2).ravel(), (x @ W1).T @ err]) / len(x)
  g = np.stack(_replica_grads(grads, 2)).astype(np.float64)
  np.testing.assert_allclose(got["sq"], np.mean(np.sum(g ** 2, axis=1)), rtol=1e-4)
  counts = lowering.collective_counts("replica_squared_norm")
  assert counts == {"allreduce": (1, 4)}  # one float32 scalar for both weights


def test_replicas_and_microbatches_agree_on_the_same_base_batches():
  """8 replicas of 8 examples in one step of 64, and 8 micro-batches of 8 (each
  spread over the replicas) see the same 8 base-batch gradients."""
  _, replicas, replica_store = _replica_run(mtf_test_utils.make_impl("all:8", "batch:all"))
  micro_data = tf.data.Dataset.from_tensor_slices({"x": X, "y": Y}).batch(8)
  impl = mtf_test_utils.make_impl("all:8", "batch:all")
  opt = mtf.adascale.AdaScale(mtf.optimize.SgdOptimizer(LR), scale=8)
  micro = mtf.training.Trainer(
      model_fn, {"x": f"batch:8;features:{FEATURES}", "y": "batch:8"}, impl, opt,
      grad_accum_steps=8, log_every=0, log_fn=lambda line: None).train(micro_data, steps=1)
  assert opt.samples == "microbatches"
  for key in ("gain", "sigma2", "mu2", "sample_sq_mean"):
    np.testing.assert_allclose(replicas[f"summary/adascale/{key}"][0],
                               micro[f"summary/adascale/{key}"][0], rtol=1e-4)
  np.testing.assert_allclose(replica_store["w"].numpy(),
                             slice_variables.variable_store(impl)["w"].numpy(), rtol=1e-4)
