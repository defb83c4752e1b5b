"""Mixed precision (mesh_tensorflow.training.mixed_precision): bfloat16 and float16
activations with float32 masters train an MLP on scikit-learn's digits to
float32's accuracy; dynamic loss scaling skips and logs an overflowing step
(variables, slots unchanged), halves the scale and grows it again."""

import numpy as np
import pytest
import tensorflow as tf
from absl import logging

import mesh_tensorflow as mtf
from mesh_tensorflow.lowering import slice_variables

import mtf_test_utils

BATCH, HELD_OUT = 64, 288
MESH, LAYOUT = "rows:2;cols:4", "batch:rows;hidden:cols"


def _digits():
  from sklearn.datasets import load_digits  # pylint: disable=g-import-not-at-top
  d = load_digits()
  return (d.data / 16.0).astype(np.float32), d.target.astype(np.int32)


def _model_fn(activation_dtype):
  def model_fn(mesh, features, mode):
    del mode
    dtype = mtf.mixed_precision.variable_dtype(activation_dtype)
    images = mtf.cast(features["image"], dtype.activation_dtype)
    labels = features["label"]
    batch, pixels = images.shape.dims
    hidden, classes = mtf.Dimension("hidden", 64), mtf.Dimension("classes", 10)
    w1 = mtf.get_variable(mesh, "w1", [pixels, hidden], dtype=dtype)
    b1 = mtf.get_variable(mesh, "b1", [hidden], dtype=dtype,
                          initializer=tf.zeros_initializer())
    w2 = mtf.get_variable(mesh, "w2", [hidden, classes], dtype=dtype)
    h = mtf.relu(mtf.einsum([images, w1], output_shape=[batch, hidden]) + b1)
    logits = mtf.einsum([h, w2], output_shape=[batch, classes])
    assert logits.dtype == dtype.activation_dtype
    if "multiplier" in features:  # to inject an overflow
      logits = logits * mtf.cast(features["multiplier"], logits.dtype)
    logits = mtf.cast(logits, tf.float32)
    loss = mtf.reduce_mean(
        mtf.reduce_logsumexp(logits, classes)
        - mtf.reduce_sum(logits * mtf.one_hot(labels, classes), reduced_dim=classes))
    accuracy = mtf.reduce_mean(
        mtf.cast(mtf.equal(mtf.argmax(logits, classes), labels), tf.float32))
    return loss, {"accuracy": accuracy}
  return model_fn


def _train_and_eval(activation_dtype, loss_scale=None, steps=150):
  images, labels = _digits()
  train = tf.data.Dataset.from_tensor_slices(
      {"image": images[:-HELD_OUT], "label": labels[:-HELD_OUT]})
  train = train.shuffle(2000, seed=1).repeat().batch(BATCH, drop_remainder=True)
  test = tf.data.Dataset.from_tensor_slices(
      {"image": images[-HELD_OUT:], "label": labels[-HELD_OUT:]}).batch(HELD_OUT)
  trainer = mtf.training.Trainer(
      _model_fn(activation_dtype),
      {"image": f"batch:{BATCH};pixels:64", "label": f"batch:{BATCH}"},
      mtf_test_utils.make_impl("all:2", "batch:all"), mtf.optimize.MomentumOptimizer(0.1, 0.9),
      log_every=0, log_fn=lambda line: None, loss_scale=loss_scale,
      eval_feature_shapes={"image": f"batch:{HELD_OUT};pixels:64",
                           "label": f"batch:{HELD_OUT}"})
  trainer.train(train, steps=steps)
  return trainer, trainer.evaluate(test)["accuracy"]


def test_low_precision_activations_reach_float32_accuracy():
  _, fp32 = _train_and_eval("float32")
  _, bf16 = _train_and_eval("bfloat16")
  trainer, fp16 = _train_and_eval("float16", mtf.mixed_precision.DynamicLossScale(
      initial_scale=2.0 ** 10, growth_interval=50))
  assert fp32 > 0.85, fp32  # held-out: the last 288 digits (other writers)
  assert abs(bf16 - fp32) < 0.03 and abs(fp16 - fp32) < 0.03, (fp32, bf16, fp16)
  store = slice_variables.variable_store(trainer._impl)  # pylint: disable=protected-access
  assert store["w1"].slices[0].dtype == tf.float32  # float32 masters
  assert store["loss_scale/scale"].numpy() == 2.0 ** 13  # grew three times, 150 good steps
  assert store["loss_scale/skipped_steps"].numpy() == 0


def test_injected_overflow_is_skipped_logged_and_counted(caplog):
  images, labels = _digits()
  n = 6
  multipliers = np.ones([n], np.float32)
  multipliers[3] = 1e30  # step 4 overflows float16
  batches = [{"image": images[i * 16:(i + 1) * 16], "label": labels[i * 16:(i + 1) * 16],
              "multiplier": multipliers[i]} for i in range(n)]
  data = tf.data.Dataset.from_generator(
      lambda: iter(batches), output_signature={
          "image": tf.TensorSpec([16, 64], tf.float32), "label": tf.TensorSpec([16], tf.int32),
          "multiplier": tf.TensorSpec([], tf.float32)})
  lines = []
  scaler = mtf.mixed_precision.DynamicLossScale(initial_scale=256.0, growth_interval=2)
  trainer = mtf.training.Trainer(
      _model_fn("float16"),
      {"image": "batch:16;pixels:64", "label": "batch:16", "multiplier": ""},
      mtf_test_utils.make_impl(MESH, LAYOUT),
      mtf.optimize.AdamWeightDecayOptimizer(0.01), log_every=0, log_fn=lines.append,
      loss_scale=scaler)
  store = slice_variables.variable_store(trainer._impl)  # pylint: disable=protected-access
  trainer.train(data, steps=3)
  state = {k: v.numpy() for k, v in store.items() if k.startswith(("w1", "w2", "b1"))}
  assert "w1/adam_m" in state and store["loss_scale/scale"].numpy() == 512.0  # 2 good: x2
  with caplog.at_level(logging.WARNING):
    history = trainer.train(data, steps=4)  # resumes at step 4
  assert not np.isfinite(history["loss"][-1])
  for k, v in state.items():
    np.testing.assert_array_equal(store[k].numpy(), v, err_msg=f"{k} changed on a skipped step")
  assert store["loss_scale/skipped_steps"].numpy() == 1
  assert store["loss_scale/scale"].numpy() == 256.0  # 512 halved
  assert trainer.global_step == 4
  assert any("step 4: non-finite gradients, update skipped; loss scale 512 -> 256" in line
             for line in lines), lines
  assert "update skipped" in caplog.text
  history = trainer.train(data, steps=6)  # training goes on
  assert all(np.isfinite(history["loss"]))
  assert not np.array_equal(store["w1"].numpy(), state["w1"])


def test_loss_scale_arguments_are_checked():
  with pytest.raises(ValueError, match="min_scale <= initial_scale"):
    mtf.mixed_precision.DynamicLossScale(initial_scale=0.5)
  with pytest.raises(ValueError, match="factor must be > 1"):
    mtf.mixed_precision.DynamicLossScale(factor=1.0)
  with pytest.raises(ValueError, match="activation_dtype must be one of"):
    mtf.mixed_precision.variable_dtype("int8")


def _train_tiny_transformer(activation_dtype, steps=2, gin_params=(), **trainer_kwargs):
  import gin  # pylint: disable=g-import-not-at-top
  from mesh_tensorflow.transformer import gin_config, modeling  # pylint: disable=g-import-not-at-top
  from mesh_tensorflow.transformer import vocabulary  # pylint: disable=g-import-not-at-top
  gin_config.parse([], ["num_layers = 1", "d_model = 32", "d_ff = 64", "num_heads = 4",
                        "d_kv = 8"] + list(gin_params))
  try:
    impl = mtf_test_utils.make_impl("rows:2;cols:2", "batch:rows;d_ff:cols;heads:cols")
    vocab = vocabulary.ByteVocabulary()
    setup = modeling.Setup("lm", vocab, impl, {"targets": 16}, 8, vocab.vocab_size, 8,
                           mtf.mixed_precision.variable_dtype(activation_dtype))
    tokens = np.random.default_rng(0).integers(3, 259, size=(steps, 8, 16)).astype(np.int32)
    trainer = mtf.training.Trainer(
        modeling.make_model_fn(setup), {"targets": "batch:8;length:16"}, impl,
        mtf.optimize.AdamWeightDecayOptimizer(1e-3), log_every=0, log_fn=lambda s: None,
        **trainer_kwargs)
    return trainer.train(tf.data.Dataset.from_tensor_slices({"targets": tokens}),
                         steps=steps)["loss"]
  finally:
    gin.clear_config()


def test_transformer_in_float16_with_loss_scaling_and_zero3_trains_like_float32():
  reference = _train_tiny_transformer("float32")
  losses = _train_tiny_transformer("float16", zero_stage=3,
                                   loss_scale=mtf.mixed_precision.DynamicLossScale())
  assert np.all(np.isfinite(losses))
  np.testing.assert_allclose(losses, reference, rtol=5e-3)


def test_transformer_with_recomputed_layers_and_zero3_trains_like_stage0():
  # Stage 3 gathers every variable again for the backward pass, and the
  # recomputed layers compute with that second copy.
  recompute = ["num_layers = 2", "transformer.make_layer_stack.recompute = 'layer'"]
  reference = _train_tiny_transformer("float32", gin_params=recompute)
  losses = _train_tiny_transformer("float32", gin_params=recompute, zero_stage=3)
  np.testing.assert_allclose(losses, reference, rtol=1e-5)
