"""Experts attention (attention_variants.ExpertsSelfAttention / ExpertsEncDecAttention,
attention.ExpertsAttentionParams, moe.MoE1D(use_experts_attention)): the
logits, the experts' loss and the gradients of a tiny Bitransformer are the
same on one device and under split layouts (batch, heads, experts, d_ff);
the queries and keys against a NumPy computation of the experts with one
expert; bad arguments."""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import attention, moe, transformer
from mesh_tensorflow.transformer import transformer_layers as tl
from mtf_test_utils import lower_and_run

B, L, D, V, H, KV, FF, E = 4, 8, 16, 16, 4, 4, 32, 4
batch, length = mtf.Dimension("batch", B), mtf.Dimension("length", L)
RNG = np.random.RandomState(0)
INPUTS = RNG.randint(2, V, size=(B, L)).astype(np.int32)
TARGETS = RNG.randint(2, V, size=(B, L)).astype(np.int32)
TARGETS[1, 6:] = 0
R = RNG.randn(B, L, V).astype(np.float32)
MOE = dict(num_experts=E, hidden_size=FF, group_size=8, capacity_factor_eval=4.0,
           num_heads=H, key_value_size=KV)


def _model(layout, mesh_shape):
  kw = dict(d_model=D, max_length=L, vocab_divisor=8, layout=layout, mesh_shape=mesh_shape)
  enc = transformer.Unitransformer(
      transformer.LayerStack([tl.ExpertsSelfAttention(**MOE), tl.DenseReluDense(FF)]),
      input_vocab_size=V, output_vocab_size=None, autoregressive=False, name="encoder", **kw)
  dec = transformer.Unitransformer(
      transformer.LayerStack([tl.ExpertsSelfAttention(**MOE), tl.ExpertsEncDecAttention(**MOE),
                              tl.DenseReluDense(FF)]),
      input_vocab_size=V, output_vocab_size=V, autoregressive=True, name="decoder", **kw)
  return transformer.Bitransformer(enc, dec)


def _build(layout, mesh_shape):
  def build(mesh):
    inputs = mtf.import_tf_tensor(mesh, tf.constant(INPUTS), [batch, length])
    targets = mtf.import_tf_tensor(mesh, tf.constant(TARGETS), [batch, length])
    logits, loss = _model(layout, mesh_shape).call_simple(inputs, targets, True, mode="eval")
    vocab = logits.shape.dims[-1]
    r = mtf.import_tf_tensor(mesh, tf.constant(np.pad(R, [(0, 0), (0, 0), (0, vocab.size - V)])),
                             logits.shape)
    objective = mtf.reduce_sum(logits * r) + loss
    variables = mesh.graph.trainable_variables
    grads = mtf.gradients([objective], [v.outputs[0] for v in variables])
    out = {"logits": logits, "loss": loss}
    out.update({"grad/" + v.name: g for v, g in zip(variables, grads)})
    return out
  return build


@pytest.mark.parametrize("mesh_shape,layout", [
    ("rows:2;cols:2", "batch:rows;heads:cols;d_ff:cols"),
    ("rows:2;cols:2", "batch:rows;experts:rows;heads:cols"),
], ids=["batch_heads", "experts"])
def test_values_and_gradients_do_not_depend_on_the_layout(mesh_shape, layout):
  # The model is told the split layout in both runs, so the experts' token
  # groups are the same; only the lowering differs.
  single = lower_and_run(_build(layout, mesh_shape), "all:1", "")
  split = lower_and_run(_build(layout, mesh_shape), mesh_shape, layout)
  names = [k for k in single if k.startswith("grad/")]
  assert any(k.endswith("ExpertsSelfAttention/q_wo/kernel") for k in names), names
  assert any(k.endswith("ExpertsEncDecAttention/k_wo/kernel") for k in names), names
  assert not any(k.endswith("/q") for k in names)  # no plain projections
  assert np.abs(single["logits"]).max() > 0.1
  for key in single:
    assert np.abs(single[key]).max() > 0, key
    np.testing.assert_allclose(split[key], single[key], rtol=2e-4, atol=2e-5, err_msg=key)


class _Model:
  model_dim = mtf.Dimension("d_model", D)
  layout = mesh_shape = ensemble_dim = None


def test_one_expert_queries_and_keys_match_numpy():
  """With one expert (switch gating, gate 1, room for every token) the
  queries are relu(x wi) q_wo / sqrt(d_kv) and the keys relu(x wi) k_wo."""
  x_np = RNG.randn(B, L, D).astype(np.float32)
  heads, d_kv = mtf.Dimension("heads", H), mtf.Dimension("d_kv", KV)

  def build(mesh):
    x = mtf.import_tf_tensor(mesh, tf.constant(x_np), [batch, length, _Model.model_dim])
    context = transformer.Context(_Model(), mesh, [batch], length, mtf.VariableDType(),
                                  mode="eval", losses=[])
    params = attention.ExpertsAttentionParams(
        mesh, _Model.model_dim, _Model.model_dim, _Model.model_dim, d_kv, d_kv, [heads], [heads],
        mtf.VariableDType(), shared_kv=True, context=context,
        experts_hparams={"num_experts": 1, "hidden_size": FF, "moe_gating": "switch",
                         "group_size": L, "capacity_factor_eval": 1.0})
    q = params.compute_q(x)
    k = params.compute_k(attention.to_memory(x))
    assert k.shape.get_dim_by_name("memory_length") is not None
    out = {"q": mtf.transpose(q, [batch, length, heads, d_kv]),
           "k": mtf.rename_dimension(k, "memory_length", "length")}
    out["k"] = mtf.transpose(out["k"], [batch, length, heads, d_kv])
    for v in mesh.graph.trainable_variables:
      out[v.name] = v.outputs[0]
    return out

  got = lower_and_run(build, "all:1", "")
  wi = next(v for k, v in got.items() if k.endswith("wi/kernel"))[0]
  q_wo = next(v for k, v in got.items() if k.endswith("q_wo/kernel"))[0]
  k_wo = next(v for k, v in got.items() if k.endswith("k_wo/kernel"))[0]
  h = np.maximum(x_np @ wi, 0.0)
  np.testing.assert_allclose(got["q"], (h @ q_wo).reshape(B, L, H, KV) * KV ** -0.5,
                             rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(got["k"], (h @ k_wo).reshape(B, L, H, KV), rtol=1e-4, atol=1e-5)


def test_bad_arguments():
  with pytest.raises(ValueError, match="shared_kv must be True"):
    tl.ExpertsSelfAttention(shared_kv=False)
  with pytest.raises(ValueError, match="use_experts_attention must be True"):
    tl.ExpertsEncDecAttention(use_experts_attention=False)
  with pytest.raises(ValueError, match="output_dim must be an mtf.Dimension"):
    moe.MoE1D(output_dim=8)
  mesh = mtf.Mesh(mtf.Graph(), "m")
  d, h, k = mtf.Dimension("d_model", 8), mtf.Dimension("heads", 2), mtf.Dimension("d_kv", 4)
  with pytest.raises(ValueError, match="memory heads"):
    attention.ExpertsAttentionParams(mesh, d, d, d, k, k, [h], [], mtf.VariableDType(),
                                     shared_kv=True, context=object(), experts_hparams={})
  with pytest.raises(ValueError, match="needs context and experts_hparams"):
    attention.ExpertsAttentionParams(mesh, d, d, d, k, k, [h], [h], mtf.VariableDType(),
                                     shared_kv=True)
