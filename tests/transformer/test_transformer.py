"""mtf.transformer and mtf.beam_search: the same training losses and greedy
decodes under every layout (data, model, 2x4 and expert parallel), beam
search against greedy and against a hand-made model whose best sequence is
known, incremental decoding against full recomputation, the mixture of
experts' routing (capacity, dropped tokens, balancing loss), relative
position buckets, and the encoder-decoder model.

Models are tiny so the whole file runs in about two minutes on two cores.
"""

import collections

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import attention
from mesh_tensorflow.transformer import moe
from mesh_tensorflow.transformer import transformer
from mesh_tensorflow.transformer import transformer_layers as tl
from mtf_test_utils import full_and_incremental_logits, lower_and_run, make_impl

B, L, V, D = 8, 8, 32, 16
batch, length = mtf.Dimension("batch", B), mtf.Dimension("length", L)
_rng = np.random.RandomState(0)
TARGETS = _rng.randint(2, V, size=(4 * B, L)).astype(np.int32)
TARGETS[3, 5:] = 0  # padding
PROMPT = np.zeros((B, L), np.int32)
PROMPT[:, :2] = TARGETS[:B, :2]
PROMPT[1, 1] = 0  # a shorter prefix

LAYOUTS = [
    ("all:1", ""),
    ("all:8", "batch:all"),
    ("all:8", "heads:all;d_ff:all;vocab:all"),
    ("rows:2;cols:4", "batch:rows;heads:cols;d_ff:cols;vocab:cols"),
]
LAYOUT_IDS = ["single", "data_parallel", "model_parallel", "data_model_2x4"]
MOE_LAYOUTS = [("all:1", ""), ("all:8", "experts:all")]


def _language_model(use_moe=False, dropout=0.1, layout=None, mesh_shape=None):
  if use_moe:
    ffn = moe.MoE1D(num_experts=8, hidden_size=16, group_size=8, second_policy_train="all",
                    second_policy_eval="all", loss_coef=1e-2)
  else:
    ffn = tl.DenseReluDense(hidden_size=32, activation=["gelu", "linear"], dropout_rate=dropout)
  stack = transformer.make_layer_stack(
      [tl.SelfAttention(num_heads=8, key_value_size=4, relative_attention_type="bias",
                        dropout_rate=dropout), ffn], num_layers=1, dropout_rate=dropout)
  return transformer.Unitransformer(stack, d_model=D, input_vocab_size=V, output_vocab_size=V,
                                    autoregressive=True, max_length=L, vocab_divisor=8,
                                    layout=layout, mesh_shape=mesh_shape)


def _train_and_decode(mesh_shape, layout, use_moe=False, steps=3, model_knows_layout=False):
  """Trains a few Adam steps with the Trainer, then greedy-decodes PROMPT and
  samples from it (temperature 1, top 4)."""
  impl = make_impl(mesh_shape, layout)

  def model_fn(mesh, features, mode):
    t = features["targets"]
    inputs = mtf.shift(t, 1, length, wrap=False)
    return _model().call_simple(inputs, t, True, mode=mode)[1]

  def _model():
    if model_knows_layout:
      return _language_model(use_moe, layout=layout, mesh_shape=mesh_shape)
    return _language_model(use_moe)
  trainer = mtf.training.Trainer(
      model_fn, {"targets": f"batch:{B};length:{L}"}, impl,
      mtf.optimize.AdamWeightDecayOptimizer(1e-2), log_every=0, log_fn=lambda line: None)
  data = tf.data.Dataset.from_tensor_slices({"targets": TARGETS}).batch(B, drop_remainder=True)
  losses = trainer.train(data.repeat(), steps=steps)["loss"]

  @tf.function(autograph=False)
  def decode():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    prompt = mtf.import_tf_tensor(mesh, tf.constant(PROMPT), [batch, length])
    model = _model()
    greedy = model.sample_autoregressive(prompt, temperature=0.0, stop_at_token=None)
    sampled = model.sample_autoregressive(prompt, temperature=1.0, top_k=4, stop_at_token=None)
    lowering = mtf.Lowering(graph, {mesh: impl})
    return lowering.export_to_tf_tensor(greedy), lowering.export_to_tf_tensor(sampled)
  greedy, sampled = decode()
  return np.array(losses), greedy.numpy(), sampled.numpy()


_REFERENCE = {}


def _reference(use_moe):
  if use_moe not in _REFERENCE:
    _REFERENCE[use_moe] = _train_and_decode("all:1", "", use_moe)
  return _REFERENCE[use_moe]


@pytest.mark.parametrize("mesh_shape,layout", LAYOUTS[1:], ids=LAYOUT_IDS[1:])
def test_losses_and_greedy_decode_match_single_device(mesh_shape, layout):
  ref_losses, ref_ids, ref_sampled = _reference(False)
  losses, ids, sampled = _train_and_decode(mesh_shape, layout)
  assert np.all(np.isfinite(losses))
  np.testing.assert_allclose(losses, ref_losses, rtol=2e-5, atol=2e-5)
  np.testing.assert_array_equal(ids, ref_ids)
  np.testing.assert_array_equal(sampled, ref_sampled)  # layout-invariant randomness
  # The prefixes are kept and the rest is decoded.
  np.testing.assert_array_equal(ids[:, :1], PROMPT[:, :1])
  assert ids[0, 1] == PROMPT[0, 1] and np.all(ids[:, 2:] > 0)


def test_expert_parallel_matches_single_device():
  ref_losses, ref_ids, _ = _reference(True)
  losses, ids, _ = _train_and_decode(*MOE_LAYOUTS[1], use_moe=True)
  np.testing.assert_allclose(losses, ref_losses, rtol=2e-5, atol=2e-5)
  np.testing.assert_array_equal(ids, ref_ids)


def test_fsdp_style_experts_train_and_decode_as_one_device():
  """The model knows its layout, which splits the batch and not "experts":
  each device runs every expert on its own groups (no all-to-all), and
  training and decoding give one device's losses and samples."""
  ref_losses, ref_ids, _ = _reference(True)
  losses, ids, _ = _train_and_decode("all:8", "batch:all", use_moe=True,
                                     model_knows_layout=True)
  np.testing.assert_allclose(losses, ref_losses, rtol=2e-5, atol=2e-5)
  np.testing.assert_array_equal(ids, ref_ids)


def _run(builder, mesh_shape="all:1", layout=""):
  """Lowers builder(mesh) -> {key: tensor} in a tf.function; numpy values."""
  return lower_and_run(builder, mesh_shape, layout)


def test_moe_outputs_equal_with_and_without_splitting_experts():
  x = _rng.randn(B, L, D).astype(np.float32)

  def build(mesh):
    model = _language_model(use_moe=True, dropout=0.0)
    ctx = transformer.Context(model, mesh, [batch], length, mtf.VariableDType(),
                              mode="eval", losses=[])
    layer = moe.MoE1D(num_experts=8, hidden_size=16, group_size=16,
                      second_policy_eval="all", expert_capacity=1)
    y = layer.call(ctx, mtf.import_tf_tensor(mesh, tf.constant(x), [batch, length, model.model_dim]))
    return {"y": y, "loss": ctx.losses[0]}
  single = _run(build)
  for mesh_shape, layout in [("all:8", "experts:all"),
                             ("rows:2;cols:4", "batch:rows;experts:cols;d_ff:rows")]:
    split = _run(build, mesh_shape, layout)
    np.testing.assert_allclose(split["y"], single["y"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(split["loss"], single["loss"], rtol=1e-6)
  # One slot per expert and group of 8: some tokens are dropped entirely.
  dropped = np.all(single["y"] == 0.0, axis=-1)
  assert 0 < dropped.sum() < B * L
  # GShard's layout, batch and experts split over the same devices: the
  # tokens travel to their experts and back by all-to-all, nothing gathered.
  split, lowering = lower_and_run(build, "all:8", "batch:all;experts:all",
                                  return_lowering=True)
  np.testing.assert_allclose(split["y"], single["y"], rtol=1e-5, atol=1e-6)
  kinds = collections.Counter(r.kind for r in lowering.collective_records)
  assert kinds["alltoall"] == 2 and kinds["allgather"] == 0, kinds


def test_gated_moe_experts_match_numpy_under_every_split():
  """activation=["swish", "linear"]: SwiGLU experts (Mixtral's), kernels
  "wi_0" and "wi_1" [experts, d_model, d_ff] as the original names them.
  Two experts, both taken by every token, room for all: y = sum over
  experts of softmax(x Wg)_e * (swish(x W0_e) * (x W1_e)) Wo_e."""
  x = _rng.randn(B, L, D).astype(np.float32)

  def build(mesh):
    model = _language_model(use_moe=True, dropout=0.0)
    ctx = transformer.Context(model, mesh, [batch], length, mtf.VariableDType(),
                              mode="eval", losses=[])
    layer = moe.MoE1D(num_experts=2, hidden_size=16, group_size=L, second_policy_eval="all",
                      expert_capacity=L, activation=["swish", "linear"])
    y = layer.call(ctx, mtf.import_tf_tensor(mesh, tf.constant(x), [batch, length, model.model_dim]))
    return {"y": y}
  for mesh_shape, layout in [("all:1", ""), ("all:2", "experts:all"),
                             ("rows:2;cols:4", "batch:cols;experts:rows;d_ff:cols")]:
    got, w = lower_and_run(build, mesh_shape, layout, return_variables=True)
    assert sorted(w) == ["gate/kernel", "wi_0/kernel", "wi_1/kernel", "wo/kernel"], sorted(w)
    logits = x @ w["gate/kernel"]
    gates = np.exp(logits - logits.max(-1, keepdims=True))
    gates /= gates.sum(-1, keepdims=True)
    want = 0.0
    for e in range(2):
      a = x @ w["wi_0/kernel"][e]
      h = a / (1 + np.exp(-a)) * (x @ w["wi_1/kernel"][e])
      want = want + gates[..., e:e + 1] * (h @ w["wo/kernel"][e])
    np.testing.assert_allclose(got["y"], want, rtol=2e-4, atol=2e-5, err_msg=mesh_shape)


def test_moe_with_unsplit_experts_keeps_each_processors_tokens_local():
  """A layout that splits the batch but not "experts" (FSDP or data
  parallelism over the experts, as MaxText runs Mixtral): each processor
  runs every expert on its own groups, with the outputs of one device and
  no all-to-all or gather of the experts' inputs."""
  x = _rng.randn(B, L, D).astype(np.float32)

  def build(layout, mesh_shape, local=True):
    def builder(mesh):
      model = _language_model(use_moe=True, dropout=0.0)
      model.layout, model.mesh_shape = layout, mesh_shape  # the groups follow the layout
      ctx = transformer.Context(model, mesh, [batch], length, mtf.VariableDType(),
                                mode="eval", losses=[])
      layer = moe.MoE1D(num_experts=8, hidden_size=16, group_size=16,
                        second_policy_eval="all", expert_capacity=2)
      assert layer._experts_stay_local(ctx)
      if not local:  # the all-to-all path, on one device: the reference
        layer._experts_stay_local = lambda context: False
      y = layer.call(ctx, mtf.import_tf_tensor(mesh, tf.constant(x),
                                               [batch, length, model.model_dim]))
      return {"y": y, "loss": ctx.losses[0]}
    return builder
  for mesh_shape, layout in [("all:8", "batch:all"), ("rows:2;cols:4", "batch:rows;d_ff:cols"),
                             ("rows:8;cols:1", "batch:rows;experts:cols")]:
    single = _run(build(layout, mesh_shape, local=False))
    split, lowering = lower_and_run(build(layout, mesh_shape), mesh_shape, layout,
                                    return_lowering=True)
    np.testing.assert_allclose(split["y"], single["y"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(split["loss"], single["loss"], rtol=1e-6)
    kinds = collections.Counter(r.kind for r in lowering.collective_records)
    assert kinds["alltoall"] == 0 and kinds["allgather"] == 0, (layout, kinds)


def test_moe_routing_drops_tokens_over_capacity():
  experts, group, capacity = mtf.Dimension("experts", 4), mtf.Dimension("group", 6), 2
  # Every token prefers expert 0, then expert 1 (token 5 prefers 2, then 1).
  logits = np.tile(np.array([3.0, 2.0, 0.0, -1.0], np.float32), (1, 6, 1))
  logits[0, 5] = [0.0, 2.0, 3.0, -1.0]
  groups = mtf.Dimension("batch", 1)

  def build(mesh):
    g = mtf.import_tf_tensor(mesh, tf.constant(logits), [groups, group, experts])
    dispatch, combine, loss = moe.top_2_routing(
        g, mtf.Dimension("expert_capacity", capacity), policy="all")
    return {"dispatch": dispatch, "combine": combine, "loss": loss}
  out = _run(build)
  d = out["dispatch"][0]  # [group, experts, capacity]
  # First choices in order: tokens 0, 1 take expert 0's slots; token 5 takes
  # expert 2's slot 0. Second choices: tokens 0, 1 take expert 1's slots.
  expected = np.zeros((6, 4, capacity), np.float32)
  expected[0, 0, 0] = expected[1, 0, 1] = expected[5, 2, 0] = 1
  expected[0, 1, 0] = expected[1, 1, 1] = 1
  np.testing.assert_array_equal(d, expected)
  # Tokens 2, 3 and 4 lost both choices: all-zero combine rows.
  assert np.all(out["combine"][0, 2:5] == 0)
  p = np.exp(logits[0, 0]) / np.exp(logits[0, 0]).sum()
  np.testing.assert_allclose(out["combine"][0, 0, 0, 0], p[0] / (p[0] + p[1]), rtol=1e-5)
  # Token 5 kept its first choice but its second (expert 1) was full.
  p5 = np.exp(logits[0, 5]) / np.exp(logits[0, 5]).sum()
  np.testing.assert_allclose(out["combine"][0, 5].sum(), p5[2] / (p5[2] + p5[1]), rtol=1e-5)


def test_moe_balancing_loss_is_one_for_uniform_routing_and_more_when_skewed():
  experts, group, groups = mtf.Dimension("experts", 4), mtf.Dimension("group", 8), mtf.Dimension(
      "batch", 1)
  rng = np.random.RandomState(1)
  cases = {"uniform": np.tile(np.eye(4, dtype=np.float32) * 2.0, (2, 1))}
  for i in range(4):  # routing skewed towards expert 0 to various degrees
    skew = rng.randn(8, 4).astype(np.float32)
    skew[:, 0] += 1.0 + i
    cases[f"skewed{i}"] = skew

  def build(mesh):
    out = {}
    for name, logits in cases.items():
      g = mtf.import_tf_tensor(mesh, tf.constant(logits[None]), [groups, group, experts])
      out[name] = moe.top_2_routing(g, mtf.Dimension("expert_capacity", 4))[2]
    return out
  losses = _run(build)
  np.testing.assert_allclose(losses["uniform"], 1.0, rtol=1e-6)
  for name in cases:
    if name != "uniform":
      assert losses[name] > 1.05, (name, losses[name])


def test_relative_position_buckets():
  rel = np.array([0, -1, -7, -8, -16, -127, -128, -1000, 1, 7, 8, 200])
  bi = attention.relative_position_bucket(rel, bidirectional=True, num_buckets=32,
                                          max_distance=128)
  # Bidirectional: 16 buckets per side, exact up to 8, then logarithmic.
  np.testing.assert_array_equal(bi, [0, 1, 7, 8, 10, 15, 15, 15, 17, 23, 24, 31])
  uni = attention.relative_position_bucket(rel, bidirectional=False, num_buckets=32,
                                           max_distance=128)
  np.testing.assert_array_equal(uni, [0, 1, 7, 8, 16, 31, 31, 31, 0, 0, 0, 0])


def test_relative_attention_bias_per_pair():
  heads, buckets = mtf.Dimension("heads", 2), mtf.Dimension("buckets", 8)
  memory = mtf.Dimension("memory_length", 6)
  w = _rng.randn(2, 8).astype(np.float32)

  def build(mesh):
    weights = mtf.import_tf_tensor(mesh, tf.constant(w), [heads, buckets])
    query = mtf.range(mesh, mtf.Dimension("length", 6), tf.int32)
    return {"bias": attention.relative_position_bias(weights, query, memory, False, 16)}
  bias = _run(build)["bias"]  # [memory, length, heads]
  rel = np.arange(6)[:, None] - np.arange(6)[None, :]
  ids = attention.relative_position_bucket(rel, False, 8, 16)
  np.testing.assert_allclose(bias, np.transpose(w[:, ids], (1, 2, 0)))


def _toy_logits_fn(table):
  """logits = table[previous token] (a hand-made first-order model)."""
  vocab, prev = mtf.Dimension("vocab", table.shape[1]), mtf.Dimension("prev", table.shape[0])

  def logits_fn(step, ids, states):
    length_dim = ids.shape.dims[-1]
    previous = mtf.reduce_sum(ids * mtf.one_hot(step - 1, length_dim, dtype=tf.int32),
                              reduced_dim=length_dim)
    t = mtf.constant(ids.mesh, table, mtf.Shape([prev, vocab]))
    logits = mtf.einsum([mtf.one_hot(previous, prev), t],
                        output_shape=previous.shape + [vocab])
    return logits, list(states)
  return logits_fn


def _decode_toy(table, beam_size, alpha, n=4):
  beam = mtf.Dimension("beam", beam_size)
  rows, toy_length = mtf.Dimension("batch", 2), mtf.Dimension("length", n)

  def build(mesh):
    fn = _toy_logits_fn(table)
    greedy = mtf.beam_search.greedy_decode(
        fn, mtf.zeros(mesh, [rows, toy_length], dtype=tf.int32))
    beams, scores = mtf.beam_search.beam_search(
        fn, mtf.zeros(mesh, [rows, beam, toy_length], dtype=tf.int32), alpha)
    return {"greedy": greedy, "beams": beams, "scores": scores}
  return _run(build)


def test_beam_search_finds_the_best_sequence_greedy_misses():
  # Tokens: 0 pad/start, 1 EOS, 2 A, 3 B, 4 C.
  probs = np.full((5, 5), 1e-4)
  probs[0] = [1e-4, 0.02, 0.55, 0.40, 0.03]   # first token: A (0.55) or B (0.40)
  probs[2] = [1e-4, 0.30, 0.25, 0.25, 0.20]   # after A: nothing is likely
  probs[3] = [1e-4, 0.95, 0.02, 0.02, 0.01]   # after B: EOS
  probs[4] = [1e-4, 0.90, 0.05, 0.03, 0.02]
  probs[1] = [1e-4, 0.90, 0.05, 0.03, 0.02]
  table = np.log(probs / probs.sum(1, keepdims=True)).astype(np.float32)
  out = _decode_toy(table, beam_size=2, alpha=0.0)
  np.testing.assert_array_equal(out["greedy"], [[2, 1, 0, 0]] * 2)  # A EOS: p = 0.165
  np.testing.assert_array_equal(out["beams"][:, 0], [[3, 1, 0, 0]] * 2)  # B EOS: p = 0.38
  np.testing.assert_allclose(out["scores"][:, 0], np.log(0.40 * 0.95), rtol=1e-3)
  assert np.all(out["scores"][:, 0] >= out["scores"][:, 1])


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_beam_search_with_one_beam_is_greedy(alpha):
  rng = np.random.RandomState(3)
  for trial in range(3):
    table = (2.0 * rng.randn(6, 6)).astype(np.float32)
    table[:, 0] = -30.0  # never padding
    table[1 + trial, 1] = 5.0  # some token tends to be followed by EOS
    out = _decode_toy(table, beam_size=1, alpha=alpha, n=6)
    np.testing.assert_array_equal(out["beams"][:, 0], out["greedy"])


def test_incremental_decoding_matches_full_recomputation():
  """Logits of each decoding step (cached keys and values) equal the logits
  at that position of one pass over the whole sequence."""
  stack = transformer.LayerStack([
      tl.SelfAttention(num_heads=2, key_value_size=4, relative_attention_type="bias_shared"),
      tl.DenseReluDense(hidden_size=16),
      tl.LocalSelfAttention(radius=2, num_heads=2, key_value_size=4, num_memory_heads=1,
                            relative_attention_type="bias_shared"),
      tl.DenseReluDense(hidden_size=16, activation=["swish", "linear"])])
  model = transformer.Unitransformer(stack, d_model=D, input_vocab_size=V, output_vocab_size=V,
                                     autoregressive=True, max_length=L, vocab_divisor=8,
                                     positional_embedding="sinusoidal")

  build = full_and_incremental_logits(model, TARGETS[:B], batch, length)
  for mesh_shape, layout in [("all:1", ""), ("rows:2;cols:4", "batch:rows;vocab:cols;d_ff:cols")]:
    out = _run(build, mesh_shape, layout)
    # Decoding never produces id 0 (padding): its logit is -1e9 there.
    assert np.all(out["incremental"][..., 0] < -1e8)
    np.testing.assert_allclose(out["incremental"][..., 1:], out["full"][..., 1:], rtol=1e-4,
                               atol=1e-5)


def _bitransformer():
  def stack(decoder):
    layers = [tl.SelfAttention(num_heads=4, key_value_size=4)]
    if decoder:
      layers.append(tl.EncDecAttention(num_heads=4, key_value_size=4))
    layers.append(tl.DenseReluDense(hidden_size=16))
    return transformer.make_layer_stack(layers, num_layers=1)
  encoder = transformer.Unitransformer(stack(False), d_model=D, input_vocab_size=V,
                                       output_vocab_size=None, autoregressive=False,
                                       max_length=L, vocab_divisor=8, name="encoder")
  decoder = transformer.Unitransformer(stack(True), d_model=D, input_vocab_size=V,
                                       output_vocab_size=V, autoregressive=True, max_length=L,
                                       vocab_divisor=8, name="decoder")
  return transformer.Bitransformer(encoder, decoder)


def test_bitransformer_trains_and_decodes():
  inputs = TARGETS[:B].copy()
  inputs[:, 6:] = 0
  targets = np.zeros_like(inputs)
  targets[:, :6] = inputs[:, :6][:, ::-1]  # reverse the input
  targets[:, 6] = 1  # EOS
  impl = make_impl("rows:2;cols:2", "batch:rows;heads:cols;vocab:cols")

  def model_fn(mesh, features, mode):
    return _bitransformer().call_simple(features["inputs"], features["targets"], True,
                                        mode=mode)[1]
  trainer = mtf.training.Trainer(
      model_fn, {"inputs": f"batch:{B};length:{L}", "targets": f"batch:{B};length:{L}"},
      impl, mtf.optimize.AdamWeightDecayOptimizer(1e-2), log_every=0, log_fn=lambda s: None)
  data = tf.data.Dataset.from_tensors({"inputs": inputs, "targets": targets}).repeat()
  losses = trainer.train(data, steps=20)["loss"]
  assert losses[-1] < 0.5 * losses[0]

  @tf.function(autograph=False)
  def decode():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    x = mtf.import_tf_tensor(mesh, tf.constant(inputs), [batch, length])
    model = _bitransformer()
    greedy = model.decode(x, beam_size=1)
    beam = model.decode(x, beam_size=2, alpha=0.6)
    # Teacher-forced logits on the greedy output: greedy picks their argmax.
    logits, _ = model.call_simple(x, greedy, False, mode="infer")
    lowering = mtf.Lowering(graph, {mesh: impl})
    return [lowering.export_to_tf_tensor(t) for t in (greedy, beam, logits)]
  greedy, beam, logits = [t.numpy() for t in decode()]
  argmax = logits.argmax(-1)
  for row in range(B):
    n = int(np.argmax(greedy[row] == 1)) if 1 in greedy[row] else L
    np.testing.assert_array_equal(greedy[row, :n + 1 if n < L else L],
                                  argmax[row, :n + 1 if n < L else L])
  # Beam outputs: tokens up to an EOS, then padding.
  for row in beam:
    n = int(np.argmax(row == 1)) if 1 in row else L
    assert np.all(row[:n] > 1) and np.all(row[n + 1:] == 0), row
  # Trained to reverse: most of the decoded tokens are right.
  assert np.mean(greedy[:, :7] == targets[:, :7]) > 0.5


def test_while_loop_random_ops_and_pending_sums():
  """Decoding relies on mtf.while_loop fixes: random ops in the body draw
  new values each iteration (the same under every layout), and an outer
  tensor whose allreduce is still pending can be read in the body."""
  rows, cols, steps = mtf.Dimension("batch", 8), mtf.Dimension("d_ff", 8), mtf.Dimension("step", 3)
  x_np = _rng.randn(8, 8).astype(np.float32)

  def build(mesh):
    x = mtf.import_tf_tensor(mesh, tf.constant(x_np), [rows, cols])
    total = mtf.einsum([x], output_shape=[rows])  # sums the split d_ff: pending

    def body(i, acc):
      noise = mtf.random_uniform(mesh, [rows])
      return [i + 1, acc + mtf.one_hot(i, steps) * (noise + total)]
    _, acc = mtf.while_loop(lambda i, acc: mtf.less(i, 3), body,
                            [mtf.constant(mesh, 0, dtype=tf.int32), mtf.zeros(mesh, [rows, steps])])
    return {"acc": acc}
  single = _run(build)["acc"]
  split = _run(build, "rows:2;cols:4", "batch:rows;d_ff:cols")["acc"]
  np.testing.assert_allclose(split, single, rtol=1e-5)
  noise = single - x_np.sum(1, keepdims=True)
  assert np.all((noise > -1e-5) & (noise < 1 + 1e-5))
  assert not np.allclose(noise[:, 0], noise[:, 1]) and not np.allclose(noise[:, 1], noise[:, 2])


def test_parallel_multi_query_layers_run_megatrons_collectives():
  """PaLM's layer: attention (one memory head) and feed-forward side by side,
  heads and d_ff split over `model`. Per layer, one all-reduce of the
  activations in the forward pass (the two branches' sums folded into one)
  and one in the backward pass (the shared keys' and values' gradient paths
  join the queries' and feed-forward's), plus the keys' and values' own
  small ones; the single-device loss and gradients."""
  def run(mesh_shape, layout):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    targets = mtf.import_tf_tensor(mesh, tf.constant(TARGETS[:B]), [batch, length])
    att = lambda: tl.SelfAttention(num_heads=4, key_value_size=4, num_memory_heads=1)  # noqa: E731
    ffn = lambda: tl.DenseReluDense(hidden_size=32, activation=["swish", "linear"])  # noqa: E731
    stack = transformer.make_layer_stack([lambda: tl.ParallelLayer([att, ffn])], num_layers=2)
    model = transformer.Unitransformer(stack, d_model=D, input_vocab_size=V, output_vocab_size=V,
                                       autoregressive=True, max_length=L, vocab_divisor=8)
    _, loss = model.call_simple(mtf.shift(targets, 1, length, wrap=False), targets, True)
    variables = graph.trainable_variables
    grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
    lowering = mtf.Lowering(graph, {mesh: make_impl(mesh_shape, layout, share_replicas=False)})
    values = [lowering.export_to_tf_tensor(t).numpy() for t in [loss] + grads]
    sizes = collections.Counter(r.bytes_per_processor for r in lowering.collective_records
                                if r.kind == "allreduce" and r.mesh_axes == (1,))
    return values, sizes
  want, _ = run("all:1", "")
  got, sizes = run("data:2;model:4", "batch:data;heads:model;d_ff:model")
  for a, b in zip(got, want):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-6)
  activations = B // 2 * L * D * 4  # [batch / 2, length, d_model] floats
  keys = B // 2 * L * 4 * 4  # [batch / 2, length, d_kv]: keys or values
  assert sizes == {activations: 2 * 2, keys: 2 * 2}, sizes
