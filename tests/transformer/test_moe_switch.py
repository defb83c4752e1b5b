"""Switch (top-1) gating of the mixture-of-experts layer (moe_gating="switch"):
routing, capacity, balancing and router z-losses against NumPy under layouts
that split the groups or the experts; a switch model trains to the same losses
on one device and with expert parallelism."""

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import gin_config, moe, utils
from mtf_test_utils import assert_allclose, lower_and_run

GROUPS, GROUP, EXPERTS, CAPACITY = 2, 6, 4, 2
LOGITS = np.random.RandomState(0).randn(GROUPS, GROUP, EXPERTS).astype(np.float32)
NONPADDING = np.array([[1, 1, 1, 1, 1, 0], [1, 0, 1, 1, 1, 1]], np.float32)


def _numpy_top_1(logits, capacity, nonpadding):
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  choice = probs.argmax(-1)
  dispatch = np.zeros(logits.shape + (capacity,), np.float32)
  combine = np.zeros_like(dispatch)
  loss = 0.0
  for g in range(logits.shape[0]):
    taken = np.zeros(logits.shape[2], int)
    for t in range(logits.shape[1]):
      if not nonpadding[g, t]:
        continue
      e = choice[g, t]
      if taken[e] < capacity:
        dispatch[g, t, e, taken[e]] = 1.0
        combine[g, t, e, taken[e]] = probs[g, t, e]
      taken[e] += 1
    count = nonpadding[g].sum()
    fraction = np.bincount(choice[g][nonpadding[g] > 0], minlength=logits.shape[2]) / count
    mean_prob = (probs[g] * nonpadding[g][:, None]).sum(0) / count
    loss += logits.shape[2] * (fraction * mean_prob).sum() / logits.shape[0]
  log_z = np.log(np.exp(logits).sum(-1))
  z_loss = (log_z ** 2 * nonpadding).sum() / nonpadding.sum()
  return dispatch, combine, loss, z_loss


@pytest.mark.parametrize("mesh_shape,layout", [("all:1", ""), ("all:2", "batch:all"),
                                               ("rows:2;cols:2", "batch:rows;experts:cols")])
def test_top_1_routing_matches_numpy(mesh_shape, layout):
  groups, group = mtf.Dimension("batch", GROUPS), mtf.Dimension("group", GROUP)
  experts, capacity = mtf.Dimension("experts", EXPERTS), mtf.Dimension("expert_capacity",
                                                                       CAPACITY)

  def build(mesh):
    logits = mtf.import_tf_tensor(mesh, tf.constant(LOGITS), [groups, group, experts])
    nonpadding = mtf.import_tf_tensor(mesh, tf.constant(NONPADDING), [groups, group])
    dispatch, combine, loss = moe.top_1_routing(logits, capacity, nonpadding)
    return {"dispatch": dispatch, "combine": combine, "loss": loss,
            "z_loss": moe.router_z_loss(logits, experts, nonpadding)}
  got = lower_and_run(build, mesh_shape, layout)
  dispatch, combine, loss, z_loss = _numpy_top_1(LOGITS, CAPACITY, NONPADDING)
  assert dispatch.sum() < NONPADDING.sum()  # some tokens overflow their expert
  np.testing.assert_array_equal(got["dispatch"], dispatch)
  assert_allclose(got["combine"], combine, rtol=1e-5)
  assert_allclose(got["loss"], loss, rtol=1e-5)
  assert_allclose(got["z_loss"], z_loss, rtol=1e-5)


def test_switch_options_are_checked():
  with pytest.raises(ValueError, match="moe_gating must be one of"):
    moe.MoE1D(moe_gating="top_3")
  with pytest.raises(ValueError, match="switch policy must be one of"):
    moe.MoE1D(moe_gating="switch", switch_policy_train="jitter")
  with pytest.raises(ValueError, match="z_loss is applied by switch gating only"):
    moe.MoE1D(z_loss=1e-3)
  assert moe.MoE1D(num_experts=1, moe_gating="switch").num_experts == 1


TINY = [
    "num_layers = 1", "d_model = 32", "d_ff = 64", "num_heads = 4", "d_kv = 8",
    "run.sequence_length = {'inputs': 32, 'targets': 32}", "run.batch_size = 8",
    "run.train_steps = 3", "run.eval_steps = 1", "run.log_every = 0", "run.num_samples = 0",
    "cosine_with_warmup.warmup_steps = 0", "cosine_with_warmup.peak = 0.05",
    "dataset_fn.corpus_bytes = 200000", "dataset_fn.shuffle_buffer = 100",
    "MoE1D.moe_gating = 'switch'", "MoE1D.z_loss = 1e-3", "MoE1D.group_size = 32",
]


def _train(layout_file):
  gin_config.parse(["models/moe_tiny_lm.gin", f"layouts/{layout_file}"], TINY)
  try:
    return utils.run(model_dir=None, mode="train")
  finally:
    gin.clear_config()


def test_switch_model_trains_alike_with_expert_parallelism():
  """Same groups (the batch is split 8 ways in both), experts split or not;
  the default train policy jitters the gate input with layout-invariant noise."""
  reference = _train("data_parallel.gin")
  assert reference["losses"][-1] < reference["losses"][0]
  expert_parallel = _train("expert_parallel.gin")
  np.testing.assert_allclose(expert_parallel["losses"], reference["losses"], rtol=2e-4)
  assert expert_parallel["eval_loss"] == pytest.approx(reference["eval_loss"], rel=2e-4)
