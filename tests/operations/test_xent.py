"""The fused sparse softmax cross-entropy: values, log Z and gradients equal a
NumPy reference with the vocabulary whole, split, or split with the batch."""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mtf_test_utils import assert_allclose, lower_and_run

BATCH, LENGTH, VOCAB = 4, 2, 16
RNG = np.random.RandomState(3)
LOGITS = (RNG.randn(LENGTH, BATCH, VOCAB) * 3).astype(np.float32)  # vocab last but not batch first
IDS = RNG.randint(0, VOCAB, size=(BATCH, LENGTH)).astype(np.int32)
WEIGHTS = RNG.rand(BATCH, LENGTH).astype(np.float32)
Z_LOSS = 0.1


def _reference():
  logits = LOGITS.transpose(1, 0, 2).astype(np.float64)        # [batch, length, vocab]
  m = logits.max(-1, keepdims=True)
  log_z = np.log(np.exp(logits - m).sum(-1)) + m[..., 0]
  target = np.take_along_axis(logits, IDS[..., None], -1)[..., 0]
  loss = log_z - target + Z_LOSS * log_z ** 2
  probs = np.exp(logits - log_z[..., None])
  onehot = np.eye(VOCAB)[IDS]
  dlogits = (probs - onehot + 2 * Z_LOSS * log_z[..., None] * probs) * WEIGHTS[..., None]
  return loss, dlogits.transpose(1, 0, 2)


def _builder(mesh):
  batch = mtf.Dimension("batch", BATCH)
  length = mtf.Dimension("length", LENGTH)
  vocab = mtf.Dimension("vocab", VOCAB)
  w = mtf.get_variable(mesh, "logits", [length, batch, vocab],
                       initializer=tf.constant_initializer(LOGITS))
  ids = mtf.import_tf_tensor(mesh, IDS, [batch, length])
  weights = mtf.import_tf_tensor(mesh, WEIGHTS, [batch, length])
  loss = mtf.layers.softmax_cross_entropy_with_logits(w, ids, vocab, z_loss=Z_LOSS)
  total = mtf.reduce_sum(loss * weights)
  [grad] = mtf.gradients([total], [w])
  return {"loss": mtf.transpose(loss, [batch, length]), "grad": grad}


@pytest.mark.parametrize("mesh_shape,layout", [
    ("all:1", ""),
    ("all:8", "vocab:all"),
    ("rows:2;cols:4", "batch:rows;vocab:cols"),
    ("rows:2;cols:4", "length:rows;batch:cols"),
])
def test_fused_cross_entropy_matches_numpy(mesh_shape, layout):
  got = lower_and_run(_builder, mesh_shape, layout)
  loss, grad = _reference()
  assert_allclose(got["loss"], loss, rtol=1e-5, atol=1e-5)
  assert_allclose(got["grad"], grad, rtol=1e-4, atol=1e-6)


def test_split_vocabulary_costs_three_small_allreduces():
  _, lowering = lower_and_run(
      lambda mesh: {"loss": _builder(mesh)["loss"]}, "all:8", "vocab:all",
      return_lowering=True)
  records = [r for r in lowering.collective_records if "softmax_cross_entropy" in r.op_name]
  assert [r.kind for r in records] == ["allreduce"] * 3
  assert all(r.bytes_per_processor == BATCH * LENGTH * 4 for r in records)


@pytest.mark.parametrize("mesh_shape,layout", [("all:1", ""), ("all:8", "vocab:all")])
def test_masked_logits_stay_finite(mesh_shape, layout):
  """-inf logits (a masked vocabulary) away from the targets give the loss of
  the remaining entries and a zero gradient there, not NaN: the split
  vocabulary picks the target logit with a one-hot product that must not
  compute 0 * -inf."""
  logits = LOGITS.transpose(1, 0, 2).copy()                     # [batch, length, vocab]
  masked = np.zeros_like(logits, bool)
  masked[..., ::3] = True
  masked[np.arange(BATCH)[:, None], np.arange(LENGTH)[None, :], IDS] = False
  logits[masked] = -np.inf

  def builder(mesh):
    batch = mtf.Dimension("batch", BATCH)
    length = mtf.Dimension("length", LENGTH)
    vocab = mtf.Dimension("vocab", VOCAB)
    w = mtf.get_variable(mesh, "logits", [batch, length, vocab],
                         initializer=tf.constant_initializer(logits))
    ids = mtf.import_tf_tensor(mesh, IDS, [batch, length])
    loss = mtf.layers.softmax_cross_entropy_with_logits(w, ids, vocab)
    [grad] = mtf.gradients([mtf.reduce_sum(loss)], [w])
    return {"loss": loss, "grad": grad}
  got = lower_and_run(builder, mesh_shape, layout)
  kept = np.where(masked, -np.inf, logits.astype(np.float64))
  m = kept.max(-1, keepdims=True)
  log_z = np.log(np.exp(kept - m).sum(-1)) + m[..., 0]
  target = np.take_along_axis(kept, IDS[..., None], -1)[..., 0]
  assert np.isfinite(got["loss"]).all() and np.isfinite(got["grad"]).all()
  assert_allclose(got["loss"], log_z - target, rtol=1e-5, atol=1e-5)
  probs = np.exp(kept - log_z[..., None])
  assert_allclose(got["grad"], probs - np.eye(VOCAB)[IDS], rtol=1e-4, atol=1e-6)
  assert (got["grad"][masked] == 0).all()
