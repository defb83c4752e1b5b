"""The original's attention functions (transformer.attention) and further
transformer layers (transformer_layers): values and gradients against plain
TensorFlow references on one device and split layouts, every layer's
loss and gradients layout-invariant, incremental decoding equal to the
whole-sequence pass, a small model with them trains, and their gin names
and call forms."""

import types

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import attention
from mesh_tensorflow.transformer import gin_config
from mesh_tensorflow.transformer import transformer
from mesh_tensorflow.transformer import transformer_layers as tl
from mtf_test_utils import full_and_incremental_logits, lower_and_run, make_impl

B, H, L, K = 8, 4, 8, 4
V, D = 16, 16
batch, heads = mtf.Dimension("batch", B), mtf.Dimension("heads", H)
length, memory = mtf.Dimension("length", L), mtf.Dimension("memory_length", L)
d_kv = mtf.Dimension("d_kv", K)
LAYOUTS = [("all:1", ""), ("all:8", "batch:all"), ("rows:2;cols:4", "batch:rows;heads:cols")]
LAYOUT_IDS = ["single", "batch_split_8", "batch_heads_2x4"]

_rng = np.random.RandomState(0)
Q, KK, VV, W = (_rng.randn(B, H, L, K).astype(np.float32) for _ in range(4))
SEQ = np.array([[1] * 3 + [2] * 5] * (B // 2) + [[1] * 8] * (B // 2), np.int32)


def _qkv(mesh, memory_dim=memory):
  q = mtf.import_tf_tensor(mesh, tf.constant(Q), [batch, heads, length, d_kv])
  k = mtf.import_tf_tensor(mesh, tf.constant(KK), [batch, heads, memory_dim, d_kv])
  v = mtf.import_tf_tensor(mesh, tf.constant(VV), [batch, heads, memory_dim, d_kv])
  return q, k, v


def _with_grads(mesh, o, q, k, v, extra=()):
  """o and the gradients of sum(o * W) with respect to q, k, v (and extra)."""
  w = mtf.import_tf_tensor(mesh, tf.constant(W), [batch, heads, length, d_kv])
  loss = mtf.reduce_sum(o * w)
  xs = [q, k, v] + list(extra)
  grads = mtf.gradients([loss], xs)
  return {"o": o, **{f"d{i}": g for i, g in enumerate(grads)}}


def _reference(fn):
  """fn(q, k, v) in TensorFlow: its value and the gradients of sum(o * W)."""
  q, k, v = (tf.constant(a) for a in (Q, KK, VV))
  with tf.GradientTape() as tape:
    tape.watch([q, k, v])
    o = fn(q, k, v)
    loss = tf.reduce_sum(o * W)
  grads = tape.gradient(loss, [q, k, v])
  return {"o": o.numpy(), **{f"d{i}": g.numpy() for i, g in enumerate(grads)}}


def _check(got, want, keys=("o", "d0", "d1", "d2")):
  for key in keys:
    np.testing.assert_allclose(got[key], want[key], rtol=1e-4, atol=1e-5, err_msg=key)


def _np_bias(visible):
  return np.where(visible, 0.0, -1e9).astype(np.float32)


CAUSAL = np.tril(np.ones((L, L), bool))


@pytest.mark.parametrize("mesh_shape,layout", LAYOUTS, ids=LAYOUT_IDS)
def test_attention_with_bias_and_extra_logit_matches_tensorflow(mesh_shape, layout):
  def build(mesh):
    q, k, v = _qkv(mesh)
    visible = mtf.less_equal(mtf.range(mesh, memory, tf.int32), mtf.range(mesh, length, tf.int32))
    bias = attention.visibility_mask_to_attention_bias(visible, tf.float32)
    o = attention.attention(q, k, v, memory, d_kv, d_kv, bias, extra_logit=0.5)
    return _with_grads(mesh, o, q, k, v)

  def ref(q, k, v):
    logits = tf.einsum("bhld,bhmd->bhlm", q, k) + _np_bias(CAUSAL)
    z = tf.reduce_sum(tf.exp(logits), -1, keepdims=True) + np.exp(0.5)
    return tf.einsum("bhlm,bhmd->bhld", tf.exp(logits) / z, v)
  _check(lower_and_run(build, mesh_shape, layout), _reference(ref))


def _local_visible(radius, autoregressive):
  rel = np.arange(L)[None, :] - np.arange(L)[:, None]   # memory - query
  visible = (rel > -radius) & (rel <= (0 if autoregressive else radius))
  same = SEQ[:, :, None] == SEQ[:, None, :]
  return visible[None] & same   # [batch, query, memory]


@pytest.mark.parametrize("autoregressive", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("mesh_shape,layout", LAYOUTS + [("all:2", "length:all")],
                         ids=LAYOUT_IDS + ["length_split_2"])
def test_local_attention_1d_matches_masked_full_attention(mesh_shape, layout, autoregressive):
  radius = 3

  def build(mesh):
    q, k, v = _qkv(mesh, memory_dim=length)
    seq = mtf.import_tf_tensor(mesh, tf.constant(SEQ), [batch, length])
    # Two splits of the length: blocks of 4 with halos of 3 from the neighbours.
    o = attention.local_attention_1d(q, k, v, length, d_kv, d_kv, autoregressive,
                                     length_dim_num_splits=2, radius=radius, sequence_id=seq)
    return _with_grads(mesh, o, q, k, v)

  bias = _np_bias(_local_visible(radius, autoregressive))[:, None]

  def ref(q, k, v):
    weights = tf.nn.softmax(tf.einsum("bhld,bhmd->bhlm", q, k) + bias, -1)
    return tf.einsum("bhlm,bhmd->bhld", weights, v)
  _check(lower_and_run(build, mesh_shape, layout), _reference(ref))


def _fake_context(mesh, mode="eval"):
  return types.SimpleNamespace(mesh=mesh, variable_dtype=mtf.VariableDType(), mode=mode,
                               train=mode == "train", model=None)


@pytest.mark.parametrize("mesh_shape,layout", LAYOUTS, ids=LAYOUT_IDS)
def test_hybrid_attention_matches_tensorflow(mesh_shape, layout):
  def build(mesh):
    q, k, v = _qkv(mesh)
    o = attention.hybrid_attention(q, k, v, _fake_context(mesh), memory, d_kv, d_kv)
    return _with_grads(mesh, o, q, k, v)

  def ref(q, k, v):
    logits = tf.einsum("bhld,bhmd->bhlm", q, k)
    upper = tf.nn.softmax(logits, -1)
    doubly = tf.nn.softmax(tf.nn.log_softmax(logits, 2), -1)
    return tf.einsum("bhlm,bhmd->bhld", 0.5 * doubly + 0.5 * upper, v)   # doubly_coeff 0.5
  _check(lower_and_run(build, mesh_shape, layout), _reference(ref))


@pytest.mark.parametrize("mesh_shape,layout", LAYOUTS, ids=LAYOUT_IDS)
def test_synthetic_attention_random_plus_alpha_matches_tensorflow(mesh_shape, layout):
  def build(mesh):
    q, k, v = _qkv(mesh)
    o = attention.synthetic_attention(q, k, v, memory, d_kv, d_kv,
                                      synthesize_mode="random_plus_alpha",
                                      context=_fake_context(mesh))
    r = [t for t in mesh.graph.all_variables if t.name.endswith("R")][0].outputs[0]
    out = _with_grads(mesh, o, q, k, v, extra=[r])
    out["R"] = r
    return out
  got = lower_and_run(build, mesh_shape, layout)
  r = got["R"][:L, :, :L].transpose(1, 0, 2)   # [length, heads, memory] -> [heads, l, m]
  assert got["R"].shape == (512, H, 512)

  def ref(q, k, v):
    logits = 0.5 * tf.einsum("bhld,bhmd->bhlm", q, k) + 0.5 * r    # sigmoid(alpha = 0)
    return tf.einsum("bhlm,bhmd->bhld", tf.nn.softmax(logits, -1), v)
  _check(got, _reference(ref))
  assert np.abs(got["d3"][L:]).max() == 0.0 and np.abs(got["d3"][:L, :, :L]).max() > 0


def test_attention_params_original_call_form_and_shapes():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  d_model = mtf.Dimension("d_model", 16)
  q_heads = [mtf.Dimension("heads", 2), mtf.Dimension("query_heads", 3)]
  params = attention.AttentionParams(mesh, d_model, d_model, d_model, d_kv, d_kv, q_heads,
                                     q_heads[:1], mtf.VariableDType(), shared_kv=True)
  shapes = {v.name: v.shape for v in graph.all_variables}
  assert shapes["q"] == mtf.Shape([d_model] + q_heads + [d_kv])
  assert shapes["kv"] == mtf.Shape([d_model, q_heads[0], d_kv])
  assert shapes["o"] == mtf.Shape(q_heads + [d_kv, d_model])
  x = mtf.zeros(mesh, mtf.Shape([batch, length, d_model]))
  assert set(params.compute_q(x).shape.dims) == {batch, length, d_kv, *q_heads}
  assert params.compute_kv(x).shape.dims == [batch, q_heads[0], length, d_kv]
  with mtf.name_scope(mesh, "simple"):
    simple = attention.attention_params_simple(mesh, d_model, d_kv, heads, mtf.VariableDType())
  assert simple.query_heads_dims == [heads] and simple.memory_heads_dims == [heads]
  with pytest.raises(ValueError, match="shared_kv needs key_dim == value_dim"):
    attention.AttentionParams(mesh, d_model, d_model, d_model, d_kv, mtf.Dimension("d_v", 4),
                              [heads], [heads], mtf.VariableDType(), shared_kv=True)


# ---------------------------------------------------------------- the layers
def _branched(layer):
  layer.dense_layer = tl.DenseReluDense(hidden_size=8)   # its default d_ff is 4096
  return layer


def _lm_layers():
  return [
      tl.TalkingHeadsSelfAttention([("key_heads", 2)], [("heads", H)], [("value_heads", 2)],
                                   4, 4, relative_attention_type="bias",
                                   dynamic_projections=["x2l", "x2w"]),
      tl.GeneralBilinearSelfAttention([("heads", H)]),
      _branched(tl.BranchedSelfAttention(num_heads=H, key_value_size=4)),
      tl.Synthesizer(H, 0, 4, synthesize_mode="random_plus_alpha"),
      tl.ParallelLayer([lambda: tl.DenseReluDense(hidden_size=32),
                        lambda: tl.SelfAttention(num_heads=H, num_memory_heads=2,
                                                 key_value_size=4)]),
      tl.LocalConvAttnBlock(-2, 0, D, attention_type="dynamic_conv"),
      tl.LightweightConv1DLocalAttn(-1, 0, D, num_unique_depth_filters=2),
  ]


def _lm():
  stack = transformer.LayerStack(_lm_layers())
  return transformer.Unitransformer(stack, d_model=D, input_vocab_size=V, output_vocab_size=V,
                                    autoregressive=True, max_length=L, vocab_divisor=8)


IDS = np.random.RandomState(1).randint(2, V, size=(B, L)).astype(np.int32)
IDS[2, 6:] = 0  # padding


def _loss_and_grads(model_fn):
  def build(mesh):
    loss = model_fn(mesh)
    variables = mesh.graph.trainable_variables
    grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
    return {"loss": loss, **{v.name: g for v, g in zip(variables, grads)}}
  return build


def _lm_loss(mesh):
  targets = mtf.import_tf_tensor(mesh, tf.constant(IDS), [batch, length])
  inputs = mtf.shift(targets, 1, length, wrap=False)
  return _lm().call_simple(inputs, targets, True, mode="eval")[1]


# Split layouts for the models: smaller meshes than above keep the lowering quick.
LAYER_LAYOUTS = [("all:2", "batch:all"),
                 ("rows:2;cols:2", "batch:rows;heads:cols;vocab:cols")]


_SINGLE = {}


def _single_device(key, build):
  """lower_and_run(build) on one device, once per key."""
  if key not in _SINGLE:
    _SINGLE[key] = lower_and_run(build, "all:1", "")
  return _SINGLE[key]


def _assert_same_loss_and_grads(key, build):
  ref = _single_device(key, build)
  assert len(ref) > 10 and all(np.all(np.isfinite(v)) for v in ref.values())
  for mesh_shape, layout in LAYER_LAYOUTS:
    got = lower_and_run(build, mesh_shape, layout)
    assert sorted(got) == sorted(ref)
    for key in ref:
      np.testing.assert_allclose(got[key], ref[key], rtol=1e-4, atol=1e-5,
                                 err_msg=f"{key} under {layout}")


def test_decoder_layers_are_layout_invariant_with_gradients():
  build = _loss_and_grads(_lm_loss)
  _assert_same_loss_and_grads("lm", build)
  names = set(_single_device("lm", build))
  for name in ["layer_000/TalkingHeadsSelfAttention/logits/kernel",
               "layer_000/TalkingHeadsSelfAttention/weights/weights_dynamic_0",
               "layer_001/GeneralBilinearSelfAttention/y/kernel",
               "layer_002/BranchedSelfAttention/kappa", "layer_002/BranchedSelfAttention/wi",
               "layer_003/Synthesizer/R", "layer_003/Synthesizer/alpha",
               "layer_004/ParallelLayer/wo/kernel", "layer_004/ParallelLayer/q",
               "layer_005/LocalConvAttnBlock/dyn_conv_depthwise_dense_2/kernel",
               "layer_005/LocalConvAttnBlock/local_conv_inp_1/kernel",
               "layer_005/LocalConvAttnBlock/separable_conv1d/pointwise/kernel",
               "layer_006/LightweightConv1DLocalAttn/lightwt_depthwise_dense_1/kernel"]:
    assert any(name in n for n in names), (name, sorted(names))


def test_decoder_layers_decode_incrementally_like_the_whole_sequence():
  out = lower_and_run(full_and_incremental_logits(_lm(), IDS, batch, length), "all:1", "")
  np.testing.assert_allclose(out["incremental"][..., 1:], out["full"][..., 1:], rtol=1e-4,
                             atol=1e-4)


def _bitransformer(relative_attention_type="bias"):
  def stack(layers):
    return transformer.LayerStack(layers)
  encoder = transformer.Unitransformer(
      stack([tl.SelfAttention(num_heads=H, key_value_size=4), tl.DenseReluDense(hidden_size=32),
             tl.SelfAttention(num_heads=H, key_value_size=4)]),
      d_model=D, input_vocab_size=V, output_vocab_size=None, autoregressive=False,
      max_length=L, name="encoder", vocab_divisor=8)
  decoder = transformer.Unitransformer(
      stack([tl.TalkingHeadsEncDecAttention(key_heads_dims=[("heads", H)],
                                            softmax_heads_dims=[("heads", H)],
                                            value_heads_dims=[("value_heads", 2)], key_size=4,
                                            value_size=4,
                                            relative_attention_type=relative_attention_type),
             tl.GeneralBilinearEncDecAttention(heads_dims=[("heads", H)]),
             _branched(tl.BranchedEncDecAttention(num_heads=H, key_value_size=4)),
             tl.TransparentEncDecAttention(1, 2, 3, 2, num_heads=H, key_value_size=4),
             tl.EncDecAttention(relative_attention_type, num_heads=H, key_value_size=4)]),
      d_model=D, input_vocab_size=V, output_vocab_size=V, autoregressive=True, max_length=L,
      name="decoder", vocab_divisor=8)
  return transformer.Bitransformer(encoder, decoder)


INPUTS = np.random.RandomState(2).randint(2, V, size=(B, L)).astype(np.int32)
INPUTS[:, 2] = V - 1   # a sentinel (num_sentinels = 2: ids 14 and 15)
INPUTS[3, 5:] = 0


@pytest.fixture
def sentinels():
  gin_config.register_configurables()
  gin.clear_config()
  gin.bind_parameter("transformer_layers.relative_position_spans.num_sentinels", 2)
  yield
  gin.clear_config()


def _bi_loss(mesh):
  inputs = mtf.import_tf_tensor(mesh, tf.constant(INPUTS), [batch, length])
  targets = mtf.import_tf_tensor(mesh, tf.constant(IDS), [batch, length])
  return _bitransformer().call_simple(inputs, targets, True, mode="eval")[1]


def test_encoder_decoder_layers_are_layout_invariant_with_gradients(sentinels):
  build = _loss_and_grads(_bi_loss)
  _assert_same_loss_and_grads("bi", build)
  names = set(_single_device("bi", build))
  for name in ["TalkingHeadsEncDecAttention/enc_dec_relative_attention_bias",
               "layer_004/EncDecAttention/enc_dec_relative_attention_bias",
               "TransparentEncDecAttention/w", "BranchedEncDecAttention/alpha"]:
    assert any(name in n for n in names), name


def test_encoder_decoder_layers_decode_like_teacher_forcing(sentinels):
  """Greedy decoding re-scored by teacher forcing: each decoded token is
  the argmax of the teacher-forced logits at its position."""
  def build(mesh):
    inputs = mtf.import_tf_tensor(mesh, tf.constant(INPUTS), [batch, length])
    model = _bitransformer(None)   # span positions are not those of training when decoding
    decoded = model.decode(inputs, temperature=0.0, max_decode_length=L, stop_at_token=None)
    logits, _ = model.call_simple(inputs, decoded, False, mode="infer")
    return {"decoded": decoded, "logits": logits}
  out = lower_and_run(build, "all:1", "")
  logits = out["logits"].copy()
  logits[..., 0] = -np.inf
  np.testing.assert_array_equal(out["decoded"], logits.argmax(-1))


def test_relative_position_spans_match_numpy():
  def build(mesh):
    model = types.SimpleNamespace(input_vocab_size=V, input_vocab_dim=mtf.Dimension("vocab", V))
    ctx = transformer.Context(
        model, mesh, [batch], length, mtf.VariableDType(), mode="eval",
        inputs=mtf.import_tf_tensor(mesh, tf.constant(IDS_SPANS), [batch, length]),
        encoder_inputs=mtf.import_tf_tensor(mesh, tf.constant(INPUTS_SPANS), [batch, length]))
    return {"rel": tl.relative_position_spans(ctx, num_sentinels=2)}
  got = lower_and_run(build, "all:2", "batch:all")["rel"]
  # Target token j sits at its sentinel's input position (0 before any).
  want = np.zeros((B, L, L), np.int32)
  for b in range(B):
    enc_seg = np.cumsum(INPUTS_SPANS[b] >= V - 2)
    dec_seg = np.cumsum(IDS_SPANS[b] >= V - 2)
    for j in range(L):
      want[b, j] = (enc_seg < dec_seg[j]).sum() - np.arange(L)
  np.testing.assert_array_equal(got, want)


INPUTS_SPANS = np.array([[3, 4, 15, 6, 7, 14, 8, 0]] * B, np.int32)
IDS_SPANS = np.array([[0, 15, 9, 9, 14, 5, 5, 0]] * B, np.int32)


def test_small_lm_with_the_layers_trains():
  impl = make_impl("all:1", "")

  def model_fn(mesh, features, mode):
    t = features["targets"]
    layers = [tl.TalkingHeadsSelfAttention([("heads", H)], [("heads", H)], [("heads", H)], 4, 4),
              tl.SeparableConv1DLayer(-2, 0, D), tl.GeneralBilinearSelfAttention([("heads", 2)])]
    model = transformer.Unitransformer(transformer.LayerStack(layers), d_model=D,
                                       input_vocab_size=V, output_vocab_size=V, max_length=L,
                                       autoregressive=True, vocab_divisor=8)
    return model.call_simple(mtf.shift(t, 1, length, wrap=False), t, True, mode=mode)[1]
  trainer = mtf.training.Trainer(model_fn, {"targets": f"batch:{B};length:{L}"}, impl,
                                 mtf.optimize.AdamWeightDecayOptimizer(1e-2), log_every=0,
                                 log_fn=lambda line: None)
  data = tf.data.Dataset.from_tensor_slices({"targets": IDS}).batch(B).repeat()
  losses = np.array(trainer.train(data, steps=8)["loss"])
  assert np.all(np.isfinite(losses))
  assert losses[-1] < losses[0] - 0.3, losses


# ---------------------------------------------------------------- call forms
def test_call_forms_and_gin_names():
  th = tl.TalkingHeadsSelfAttention([("k", 2)], [("h", 3)], [("v", 4)], 8, 16, 0.1)
  assert (th.key_heads_dims, th.key_dim.size, th.value_dim.size, th.dropout_rate) == (
      [mtf.Dimension("k", 2)], 8, 16, 0.1)
  syn = tl.Synthesizer(4, 0, 8, False, 0.0, None, None, 32, None, True, False, "dense_minus")
  assert (syn.synthesize_mode, syn.shared_kv, syn.no_query) == ("dense_minus", True, False)
  sep = tl.SeparableConv1DLayer(-3, 1, 32)
  assert sep.filter_size == 5
  tr = tl.TransparentEncDecAttention(1, 2, 3, 4, 0.1, num_heads=2)
  assert (tr.layers_per_decoder_module, tr.decoder_num_modules, tr.num_heads) == (2, 4, 2)
  assert tl.SelfAttention(num_heads=6, num_memory_heads=3).num_memory_heads == 3
  configurables = gin_config.register_configurables()
  for name in ["TalkingHeadsSelfAttention", "TalkingHeadsEncDecAttention",
               "GeneralBilinearSelfAttention", "GeneralBilinearEncDecAttention",
               "BranchedSelfAttention", "BranchedEncDecAttention", "TransparentEncDecAttention",
               "Synthesizer", "ParallelLayer", "SeparableConv1DLayer", "Conv1DLocalAttn",
               "LightweightConv1DLocalAttn", "DynamicConv1DLocalAttn", "LocalConvAttnBlock",
               "ExpertsSelfAttention", "ExpertsEncDecAttention", "enc_dec_attention",
               "enc_dec_attention_bias", "relative_position_spans"]:
    assert name in configurables, name
  gin.clear_config()
  try:
    gin.parse_config("transformer_layers.TalkingHeadsSelfAttention.key_size = 12")
    assert configurables["TalkingHeadsSelfAttention"]().key_dim.size == 12
  finally:
    gin.clear_config()


@pytest.mark.parametrize("make,match", [
    (lambda: tl.TalkingHeadsSelfAttention(dynamic_projections=["x2q"]), "dynamic_projections"),
    (lambda: tl.Synthesizer(synthesize_mode="dense"), "synthesize_mode"),
    (lambda: tl.SeparableConv1DLayer(1, 0, 8), "max_relative_pos"),
    (lambda: tl.LightweightConv1DLocalAttn(-1, 0, 6, num_unique_depth_filters=4),
     "num_unique_depth_filters"),
    (lambda: tl.LocalConvAttnBlock(-1, 0, 8, attention_type="conv"), "attention_type"),
    (lambda: tl.BranchedSelfAttention(num_heads=4, num_memory_heads=1), "num_memory_heads"),
    (lambda: tl.ExpertsSelfAttention(shared_kv=False), "shared_kv"),
    (lambda: tl.SelfAttention(num_heads=6, num_memory_heads=4), "num_memory_heads"),
    (lambda: tl.TransparentEncDecAttention(1, 2, 3), "decoder_num_modules"),
])
def test_bad_arguments_are_clear_errors(make, match):
  with pytest.raises(ValueError, match=match):
    make()


def test_whole_sequence_only_variants_say_so():
  def build(mesh):
    x = mtf.zeros(mesh, mtf.Shape([batch, heads, d_kv]))
    k = mtf.zeros(mesh, mtf.Shape([batch, heads, memory, d_kv]))
    return {"o": attention.hybrid_attention(x, k, k, _fake_context(mesh), memory, d_kv, d_kv)}
  with pytest.raises(ValueError, match="whole sequences"):
    lower_and_run(build, "all:1", "")


def test_conv1d_decoding_states_match_numpy():
  """Conv1D's state helpers: the prefix before initial_position (zeros before
  the start), the window shifted by one step, and a bare context (inputs
  and mode only) for SeparableConv1DLayer, as the original's tests use."""
  f, rng = 3, np.random.RandomState(4)
  x = rng.randn(2, L, D).astype(np.float32)
  state = rng.randn(2, f, D).astype(np.float32)
  step = rng.randn(2, D).astype(np.float32)
  two = mtf.Dimension("batch", 2)

  def build(mesh):
    d_model = mtf.Dimension("d_model", D)
    model = transformer.Unitransformer(transformer.LayerStack([]), d_model=D,
                                       input_vocab_size=V, output_vocab_size=V, max_length=L)
    first = transformer.Context(
        model, mesh, [two], length, mtf.VariableDType(), mode="first_part", new_states=[],
        sequence_id=1, initial_position=mtf.constant(mesh, 2, shape=mtf.Shape([two]),
                                                     dtype=tf.int32))
    x_m = mtf.import_tf_tensor(mesh, tf.constant(x), [two, length, d_model])
    tl.Conv1D().record_states_first_part_mode(first, x_m, f)
    old = mtf.import_tf_tensor(mesh, tf.constant(state), [two, mtf.Dimension("length", f), d_model])
    inc = transformer.Context(model, mesh, [two], length, mtf.VariableDType(), mode="incremental",
                              states=[old], new_states=[], sequence_id=1)
    window = tl.Conv1D().record_states_incremental_mode(
        inc, mtf.import_tf_tensor(mesh, tf.constant(step), [two, d_model]), f)
    bare = types.SimpleNamespace(inputs=mtf.zeros(mesh, mtf.Shape([two, length]), tf.int32),
                                 activation_dtype=tf.float32, mode="train")
    y = tl.SeparableConv1DLayer(-1, 2, D).call(bare, x_m)
    return {"first": first.new_states[0], "window": window, "recorded": inc.new_states[0],
            "y": y}
  got = lower_and_run(build, "all:2", "batch:all")
  want = np.zeros((2, f, D), np.float32)
  want[:, 1:] = x[:, :2]
  np.testing.assert_allclose(got["first"], want)
  shifted = np.concatenate([state[:, 1:], step[:, None]], axis=1)
  np.testing.assert_allclose(got["window"], shifted)
  np.testing.assert_allclose(got["recorded"], shifted)
  # All inputs are padding (id 0): only the pointwise bias (zero) is left.
  np.testing.assert_allclose(got["y"], np.zeros((2, L, D)), atol=1e-6)


def test_self_attention_hybrid_attention_func():
  """SelfAttention(attention_func="hybrid") is hybrid_attention over the
  layer's projections: its own scalar doubly_coeff; the loss differs from
  softmax attention's (same weights otherwise); decoding with it says no."""
  def loss(attention_func):
    def build(mesh):
      targets = mtf.import_tf_tensor(mesh, tf.constant(IDS), [batch, length])
      stack = transformer.LayerStack([tl.SelfAttention(num_heads=H, key_value_size=4,
                                                       attention_func=attention_func)])
      model = transformer.Unitransformer(stack, d_model=D, input_vocab_size=V,
                                         output_vocab_size=V, max_length=L, vocab_divisor=8)
      out = {"loss": model.call_simple(mtf.shift(targets, 1, length, wrap=False), targets,
                                       True, mode="eval")[1]}
      coeff = [v for v in mesh.graph.all_variables if v.name.endswith("doubly_coeff")]
      if coeff:
        out["coeff"] = coeff[0].outputs[0]
      return out
    return build
  hybrid = lower_and_run(loss("hybrid"), "all:2", "batch:all")
  plain = lower_and_run(loss(None), "all:2", "batch:all")
  assert hybrid["coeff"] == 0.5 and "coeff" not in plain
  assert np.isfinite(hybrid["loss"]) and abs(hybrid["loss"] - plain["loss"]) > 1e-4
  model = transformer.Unitransformer(
      transformer.LayerStack([tl.SelfAttention(num_heads=H, key_value_size=4,
                                               attention_func="hybrid")]),
      d_model=D, input_vocab_size=V, output_vocab_size=V, max_length=L, vocab_divisor=8)
  with pytest.raises(ValueError, match="attention_func='hybrid'"):
    lower_and_run(full_and_incremental_logits(model, IDS, batch, length), "all:1", "")


def test_attention_resplits_over_an_idle_mesh_dimension():
  """With the model's layout leaving "cols" idle in the attention (only d_ff
  is laid out there), `attention` cuts the batch into batch x d_ff so that
  cols splits it too; the values and gradients are the same."""
  mesh_shape, layout = "rows:2;cols:4", "batch:rows;d_ff:cols"
  seen = {}

  def build(mesh):
    q, k, v = _qkv(mesh)
    context = types.SimpleNamespace(
        train=False, model=types.SimpleNamespace(layout=layout, mesh_shape=mesh_shape))
    seen["q"] = attention.maybe_reshape_attention_input_for_2d_sharding(
        context, q, k, v, None, [d_kv])[0].shape
    o = attention.attention(q, k, v, memory, d_kv, d_kv, context=context)
    return _with_grads(mesh, o, q, k, v)
  got = lower_and_run(build, mesh_shape, layout)
  assert seen["q"].dims[:2] == [mtf.Dimension("batch", 2), mtf.Dimension("d_ff", 4)]

  def ref(q, k, v):
    return tf.einsum("bhlm,bhmd->bhld",
                     tf.nn.softmax(tf.einsum("bhld,bhmd->bhlm", q, k), -1), v)
  _check(got, _reference(ref))
