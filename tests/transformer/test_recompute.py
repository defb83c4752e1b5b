"""Activation recomputation on the transformer's layer stack
(LayerStack(recompute="none"|"layer"|"selective"|"projections")): the same loss and
gradients as without recomputation, fewer activation bytes kept between
the forward and the backward pass, dropout repeated exactly in the
recomputation, and the recompute operations exposed for a cost model.
"""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import layer_stack as layer_stack_lib
from mesh_tensorflow.transformer import moe as mtf_moe
from mesh_tensorflow.transformer import transformer
from mesh_tensorflow.transformer import transformer_layers as tl
from mtf_test_utils import make_impl

B, L, V, D = 8, 8, 32, 16
batch, length = mtf.Dimension("batch", B), mtf.Dimension("length", L)
TARGETS = np.random.RandomState(0).randint(2, V, size=(B, L)).astype(np.int32)
TARGETS[3, 5:] = 0
MESH, LAYOUT = "all:1", ""


def _model(recompute, dropout=0.0, recompute_layers=None, moe=False):
  ffn = (mtf_moe.MoE1D(num_experts=4, hidden_size=32, group_size=8, second_policy_train="all",
                       activation=["swish", "linear"], loss_coef=0.1) if moe
         else tl.DenseReluDense(hidden_size=32, dropout_rate=dropout))
  stack = transformer.make_layer_stack(
      [tl.SelfAttention(num_heads=4, key_value_size=4, relative_attention_type="bias",
                        dropout_rate=dropout), ffn],
      num_layers=2, dropout_rate=dropout, recompute=recompute, recompute_layers=recompute_layers)
  return transformer.Unitransformer(stack, d_model=D, input_vocab_size=V, output_vocab_size=V,
                                    autoregressive=True, max_length=L, vocab_divisor=8)


def _loss_and_grads(recompute, dropout=0.0, recompute_layers=None, moe=False):
  """Loss, gradients by variable name, kept activation bytes per processor
  and the stack's recompute_ops, run eagerly on one device."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  impl = make_impl(MESH, LAYOUT)
  targets = mtf.import_tf_tensor(mesh, tf.constant(TARGETS), [batch, length])
  model = _model(recompute, dropout, recompute_layers, moe)
  _, loss = model.call_simple(mtf.shift(targets, 1, length, wrap=False), targets, True)
  n_forward = len(graph.operations)
  variables = graph.trainable_variables
  grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
  kept = layer_stack_lib.kept_activation_bytes(graph, n_forward, impl)
  lowering = mtf.Lowering(graph, {mesh: impl})
  values = {v.name: lowering.export_to_tf_tensor(g).numpy() for v, g in zip(variables, grads)}
  return (float(lowering.export_to_tf_tensor(loss).numpy()), values, kept,
          model.layer_stack.recompute_ops)


_RUNS = {}


def _run(policy, dropout=0.0, recompute_layers=None):
  """_loss_and_grads, computed once per module."""
  key = (policy, dropout, recompute_layers)
  if key not in _RUNS:
    _RUNS[key] = _loss_and_grads(policy, dropout, recompute_layers)
  return _RUNS[key]


@pytest.mark.parametrize("policy", ["layer", "selective", "projections"])
def test_recompute_gives_same_loss_and_gradients(policy):
  loss0, grads0, _, ops0 = _run("none")
  loss, grads, _, ops = _run(policy)
  assert ops0 == []
  assert ops, "no recompute_grad operation was created"
  assert loss == pytest.approx(loss0, rel=1e-6)
  assert set(grads) == set(grads0)
  for name, g in grads.items():
    np.testing.assert_allclose(g, grads0[name], rtol=2e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("policy", ["layer", "projections"])
def test_recomputed_mixture_of_experts_gives_same_loss_and_gradients(policy):
  """A stack of mixture-of-experts layers (gated experts): their balancing
  losses leave each recomputed layer as further outputs, so the loss (with
  them) and every gradient, the gates' included, are those without
  recomputation."""
  loss0, grads0, _, _ = _loss_and_grads("none", moe=True)
  loss, grads, _, ops = _loss_and_grads(policy, moe=True)
  assert len(ops) == 4  # 2 layers of attention and experts, each recomputed
  assert loss == pytest.approx(loss0, rel=1e-6)
  assert any("gate" in name for name in grads) and set(grads) == set(grads0)
  for name, g in grads.items():
    np.testing.assert_allclose(g, grads0[name], rtol=2e-5, atol=1e-6, err_msg=name)
    assert np.abs(g).max() > 0, name


def test_recompute_keeps_fewer_activation_bytes():
  kept = {policy: _run(policy)[2] for policy in ("none", "selective", "projections", "layer")}
  # Per layer: "layer" keeps only the block input; "selective" drops the
  # norms' and the attention core's activations but keeps the projections
  # and the feed-forward activation; "projections" keeps the block input and
  # the projections' outputs only.
  assert kept["layer"] < kept["projections"] < kept["selective"] < kept["none"], kept
  assert kept["layer"] < 0.5 * kept["none"], kept


def test_projections_policy_keeps_the_projections_and_recomputes_the_rest():
  """recompute="projections": each layer's projections (q, k, v, the
  attention's output, the feed-forward's in and out: 6 per layer, 12 in all)
  are read back from the forward pass (mtf.SavedOutput), so the backward
  pass runs 12 fewer matrix products than with recompute="layer", and the
  same others (the attention's scores and weighted sum made again)."""
  def counts(policy):  # in the whole step: the forward passes are the same
    *_, ops = _run(policy)
    operations = ops[0][1].graph.operations
    return (sum(isinstance(op, mtf.SavedOutput) for op in operations),
            sum(type(op).__name__ == "EinsumOperation" for op in operations))
  saved, einsums = counts("projections")
  _, einsums_layer = counts("layer")
  assert saved == 12
  assert einsums == einsums_layer - 12


def test_product_without_batch_dims_tells_projections_from_batched_products():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  heads, d, d_kv = mtf.Dimension("heads", 2), mtf.Dimension("d", 4), mtf.Dimension("d_kv", 3)
  memory = mtf.Dimension("memory_length", L)
  x = mtf.zeros(mesh, [batch, length, d])
  w = mtf.zeros(mesh, [d, heads, d_kv])
  q = mtf.einsum([x, w], output_shape=[batch, heads, length, d_kv])
  k = mtf.zeros(mesh, [batch, heads, memory, d_kv])
  scores = mtf.einsum([q, k], output_shape=[batch, heads, length, memory])
  assert mtf.product_without_batch_dims(q.operation)
  assert not mtf.product_without_batch_dims(scores.operation)  # batch and heads shared
  assert not mtf.product_without_batch_dims(x.operation)


def test_kept_by_recompute_keeps_a_relaid_out_products_smaller_copy():
  """A product read only by a relayout (the sequence-parallel
  reduce-scatter) is kept as the relayout's output; a product read by
  anything else is kept itself; what the rule refuses is not kept."""
  from mesh_tensorflow.training.zero import ZeroRelayout
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  d, hidden = mtf.Dimension("d", 4), mtf.Dimension("hidden", 8)
  x = mtf.zeros(mesh, [batch, length, d])
  w1, w2 = mtf.zeros(mesh, [d, hidden]), mtf.zeros(mesh, [hidden, d])
  h = mtf.einsum([x, w1], output_shape=[batch, length, hidden])
  r = mtf.relu(h)
  y = mtf.einsum([r, w2], output_shape=[batch, length, d])
  split = mtf.Shape([batch, mtf.Dimension("length_split", L), d])
  relaid = ZeroRelayout(y, split).outputs[0]
  kept = mtf.kept_by_recompute(graph.operations, mtf.product_without_batch_dims)
  assert kept == [h.operation, relaid.operation]
  assert mtf.kept_by_recompute(graph.operations, lambda op: False) == []


def test_recompute_grad_keeps_what_saveable_names_on_a_split_mesh():
  """mtf.recompute_grad(saveable=...) on a 2 x 4 mesh, the hidden layer
  split: the same values and gradients as without recomputation; the
  products are kept, only the ReLU runs again."""
  hidden = mtf.Dimension("hidden", 8)
  data = np.random.RandomState(1).randn(B, D).astype(np.float32)
  w1_init = np.random.RandomState(2).randn(D, 8).astype(np.float32)
  w2_init = np.random.RandomState(3).randn(8, D).astype(np.float32)
  d_model = mtf.Dimension("d_model", D)
  results = []
  for saveable in (None, mtf.product_without_batch_dims, "plain"):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    x = mtf.import_tf_tensor(mesh, tf.constant(data), [batch, d_model])
    w1 = mtf.import_tf_tensor(mesh, tf.constant(w1_init), [d_model, hidden])
    w2 = mtf.import_tf_tensor(mesh, tf.constant(w2_init), [hidden, d_model])

    def block(v):
      return mtf.einsum([mtf.relu(mtf.einsum([v, w1], output_shape=[batch, hidden])), w2],
                        output_shape=[batch, d_model])
    y = block(x) if saveable == "plain" else mtf.recompute_grad(
        block, [x], saveable=None if saveable is None else saveable)
    loss = mtf.reduce_sum(y * y)
    grads = mtf.gradients([loss], [x, w1, w2])
    products = sum(type(op).__name__ == "EinsumOperation" for op in graph.operations)
    lowering = mtf.Lowering(graph, {mesh: make_impl("rows:2;cols:4", "hidden:cols;batch:rows")})
    results.append(([lowering.export_to_tf_tensor(t).numpy() for t in [loss] + grads],
                    products))
  (full, full_products), (kept, kept_products), (plain, plain_products) = results
  for a, b, c in zip(full, kept, plain):
    np.testing.assert_allclose(a, c, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(b, c, rtol=1e-5, atol=1e-5)
  # Recomputing everything runs the two forward products again; keeping
  # them, none: the products of the plain gradient, as many.
  assert full_products == plain_products + 2 and kept_products == plain_products


def test_recompute_ops_are_exposed():
  *_, ops = _run("selective")
  policies = {p for p, _ in ops}
  assert policies == {"selective"}
  # Two norms and one attention core per block, two blocks... x 2 layers.
  assert len(ops) == 2 * 2 + 2, [op.name for _, op in ops]
  assert all(isinstance(op, mtf.operations.control.CustomGradientOperation) for _, op in ops)


def test_recompute_repeats_dropout_exactly():
  """The recomputation replays the forward's op names, hence its dropout
  masks: gradients equal those without recomputation, dropout on."""
  loss0, grads0, _, _ = _run("none", dropout=0.2)
  loss, grads, _, _ = _run("layer", dropout=0.2)
  assert loss == pytest.approx(loss0, rel=1e-6)
  for name, g in grads.items():
    np.testing.assert_allclose(g, grads0[name], rtol=2e-5, atol=1e-6, err_msg=name)


def test_bad_recompute_policy_is_an_error():
  with pytest.raises(ValueError, match="recompute must be one of"):
    transformer.make_layer_stack([tl.DenseReluDense(hidden_size=8)], num_layers=1,
                                 recompute="everything")


@pytest.mark.parametrize("policy", ["layer", "selective", "projections"])
def test_recomputing_the_first_layers_only(policy):
  """recompute_layers=1 of 2: the first transformer layer (its attention
  and feed-forward sublayers) is recomputed, the second keeps its
  activations; same loss and gradients, kept bytes in between; 0: none."""
  loss0, grads0, kept_none, _ = _run("none")
  _, _, kept_all, ops_all = _run(policy)
  loss, grads, kept, ops = _run(policy, recompute_layers=1)
  assert loss == pytest.approx(loss0, rel=1e-6)
  for name, g in grads.items():
    np.testing.assert_allclose(g, grads0[name], rtol=2e-5, atol=1e-6, err_msg=name)
  assert 2 * len(ops) == len(ops_all) and {p for p, _ in ops} == {policy}
  # The first layer's: made before any operation of the second layer.
  operations = ops[0][1].graph.operations
  second = min(i for i, op in enumerate(operations) if "block_001" in op.name)
  assert all(operations.index(op) < second for _, op in ops)
  assert kept_all < kept < kept_none
  assert _run(policy, recompute_layers=0)[3] == []
  assert len(_run(policy, recompute_layers=5)[3]) == len(ops_all)


def test_bad_recompute_layers_are_errors():
  layers = [tl.DenseReluDense(hidden_size=8)]
  with pytest.raises(ValueError, match="recompute_layers = 2 says how many layers to recompute, "
                     "but recompute = 'none'"):
    transformer.make_layer_stack(layers, num_layers=2, recompute_layers=2)
  with pytest.raises(ValueError, match="recompute_layers must be a number of layers"):
    transformer.make_layer_stack(layers, num_layers=2, recompute="layer", recompute_layers=-1)
