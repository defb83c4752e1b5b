"""funnel_transformer: pooling against NumPy (mean, max, min, with padding
and a short last window) and without communication over a split length;
the pooled lengths, the context pooled along and the stack's output against
NumPy; the encoder's outputs and gradients under layouts that split the
batch and the heads, or the length and d_model; the same gradients with
recompute="layer"; a tiny BitransformerFunnel configured through gin that
trains (the same losses on one device and with the length split in two)
and decodes greedily like teacher forcing; the configuration checks.

Sizes are tiny: the file runs in about 20 seconds on two cores.
"""

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import funnel_transformer as ft
from mesh_tensorflow.transformer import gin_config
from mesh_tensorflow.transformer import modeling
from mesh_tensorflow.transformer import transformer
from mesh_tensorflow.transformer import transformer_layers as tl
from mtf_test_utils import lower_and_run, make_impl

B, L, D, VOCAB = 4, 8, 8, 16
batch, length = mtf.Dimension("batch", B), mtf.Dimension("length", L)
d_model = mtf.Dimension("d_model", D)
RNG = np.random.RandomState(0)
X = RNG.randn(B, 7, 3).astype(np.float32)
MASK = np.ones((B, 7), np.float32)
MASK[1, 5:] = 0.0   # row 1: 5 tokens, then padding
MASK[2, 1:] = 0.0   # row 2: 1 token
IDS = RNG.randint(2, VOCAB, size=(B, L)).astype(np.int32)
IDS[1, 5:] = 0
IDS[3, 3:] = 0


def _numpy_pool(x, mask, kind, p):
  """Pools axis 1 of x [b, n, c] over windows of p (last one short), over
  the positions where mask [b, n] is 1; windows without any give 0."""
  n = x.shape[1]
  out = []
  for start in range(0, n, p):
    xs, ms = x[:, start:start + p], mask[:, start:start + p, None] > 0
    if kind == "mean":
      v = (xs * ms).sum(1) / np.maximum(ms.sum(1), 1)
    elif kind == "max":
      v = np.where(ms, xs, -np.inf).max(1)
    else:
      v = np.where(ms, xs, np.inf).min(1)
    out.append(np.where(ms.any(1), v, 0.0))
  return np.stack(out, 1)


def test_pooling_matches_numpy():
  """pool_tensor_1d with and without a padding mask, windows of 2 and 3 over
  7 positions (a short last window), and stride_tensor_1d."""
  seq7, chans = mtf.Dimension("length", 7), mtf.Dimension("chans", 3)

  def build(mesh):
    x = mtf.import_tf_tensor(mesh, tf.constant(X), [batch, seq7, chans])
    mask = mtf.import_tf_tensor(mesh, tf.constant(MASK), [batch, seq7])
    ids = mtf.import_tf_tensor(mesh, tf.constant((MASK * 3).astype(np.int32)), [batch, seq7])
    out = {"stride3": ft.stride_tensor_1d(ids, seq7, 3)}
    for kind in ft.POOLING_TYPES:
      for p in (2, 3):
        out[f"{kind}/{p}/masked"] = ft.pool_tensor_1d(x, seq7, kind, p, nonpadding=mask)
        out[f"{kind}/{p}"] = ft.pool_tensor_1d(x, seq7, kind, p)
    out["reduce_max_fn"] = ft.pool_tensor_1d(x, seq7, mtf.reduce_max, 2)
    return out
  got = lower_and_run(build, "all:1", "")
  for kind in ft.POOLING_TYPES:
    for p in (2, 3):
      assert got[f"{kind}/{p}"].shape == (B, -(-7 // p), 3)
      np.testing.assert_allclose(got[f"{kind}/{p}/masked"], _numpy_pool(X, MASK, kind, p),
                                 rtol=1e-6, atol=1e-6, err_msg=f"{kind}/{p}/masked")
      np.testing.assert_allclose(got[f"{kind}/{p}"], _numpy_pool(X, np.ones_like(MASK), kind, p),
                                 rtol=1e-6, atol=1e-6, err_msg=f"{kind}/{p}")
  np.testing.assert_allclose(got["reduce_max_fn"], got["max/2"])
  np.testing.assert_array_equal(got["stride3"], (MASK * 3).astype(np.int32)[:, ::3])


def test_pooling_a_split_length_is_local():
  """With "length" split in two (8 -> 4, both even) pooling needs no
  communication; the results are those of one device."""
  seq8 = mtf.Dimension("length", 8)
  x8 = np.random.RandomState(2).randn(B, 8, 3).astype(np.float32)

  def build(mesh):
    x = mtf.import_tf_tensor(mesh, tf.constant(x8), [batch, seq8, mtf.Dimension("chans", 3)])
    mask = mtf.import_tf_tensor(mesh, tf.constant(np.minimum(IDS, 1).astype(np.float32)),
                                [batch, seq8])
    return {"max": ft.pool_tensor_1d(x, seq8, "max", 2, nonpadding=mask),
            "mean": ft.pool_tensor_1d(x, seq8, "mean", 2, nonpadding=mask),
            "stride": ft.stride_tensor_1d(mask, seq8, 2)}
  got, lowering = lower_and_run(build, "all:2", "length:all", return_lowering=True)
  assert {key for key, _ in lowering.counters} == {"flops"}, lowering.counters
  single = lower_and_run(build, "all:1", "")
  for key in single:
    np.testing.assert_allclose(got[key], single[key], err_msg=key)
  np.testing.assert_allclose(got["mean"], _numpy_pool(x8, np.minimum(IDS, 1), "mean", 2),
                             rtol=1e-6, atol=1e-6)


class _Zero(transformer.TransformerLayer):
  """A sublayer that adds nothing (so what follows it is the pooling alone)."""

  def call(self, context, x):
    return x * 0.0


def _stack(pooling_type="mean", n_blocks=3, **kwargs):
  kwargs.setdefault("block_param_size", [1] * n_blocks)
  kwargs.setdefault("block_repeat_size", [1, 2, 1][:n_blocks])
  return ft.FunnelTransformerLayerStack(
      [tl.SelfAttention(num_heads=4, key_value_size=4), tl.DenseReluDense(hidden_size=16)],
      n_blocks=n_blocks, pooling_type=pooling_type, **kwargs)


def _encoder(stack, name="encoder", **kwargs):
  return transformer.Unitransformer(stack, d_model=D, input_vocab_size=VOCAB,
                                    output_vocab_size=None, autoregressive=False,
                                    max_length=L, name=name, vocab_divisor=8, **kwargs)


def _rms(x):
  return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6)


def test_stack_pools_activations_and_context():
  """Lengths per block, the pooled context (sequence_id, position), the
  layer outputs, variables shared by repeated layers; and, with a block
  whose first sublayer adds nothing, the output against NumPy: the final
  RMS norm of the masked pooling of the previous block's output, zero at
  pooled padding."""
  stack = _stack()
  assert stack.block_lengths(L) == [8, 4, 2] and stack.block_lengths(7) == [7, 4, 2]
  assert len(stack.layers) == 6 and len(stack.schedule()) == 8
  model = _encoder(stack)
  probes = {kind: ft.FunnelTransformerLayerStack(
      [tl.DenseReluDense(hidden_size=16), _Zero()], n_blocks=2, block_param_size=[1, 1],
      block_repeat_size=[1, 1], n_submodules=1, pooling_type=kind)
            for kind in ft.POOLING_TYPES}

  def build(mesh):
    ids = mtf.import_tf_tensor(mesh, tf.constant(IDS), [batch, length])
    seq_id = mtf.minimum(ids, 1)
    layer_outputs = []
    out, _ = model.call_simple(ids, None, False, mode="eval", sequence_id=seq_id,
                               layer_outputs=layer_outputs)
    ctx = stack.context
    assert out.shape == mtf.Shape([batch, mtf.Dimension("length", 2), d_model])
    assert ctx.length_dim.size == 2 and ctx.layer_index == 8
    assert [t.shape.get_dim_by_name("length").size for t in layer_outputs] == (
        [8, 8, 8, 4, 4, 4, 4, 2, 2])
    names = [v.name for v in mesh.graph.trainable_variables]
    per_block = [sum(f"funnel_block_{b:03d}/" in n for n in names) for b in range(3)]
    assert per_block[0] == per_block[1] == per_block[2] > 0, per_block  # repeats share
    result = {"out": out, "sequence_id": ctx.sequence_id, "position": ctx.position}
    for kind, probe in probes.items():
      outputs = []
      result[f"{kind}/out"], _ = _encoder(probe, name=f"probe_{kind}").call_simple(
          ids, None, False, mode="eval", sequence_id=seq_id, layer_outputs=outputs)
      result[f"{kind}/block0"] = outputs[1]
    return result
  got = lower_and_run(build, "all:1", "")
  mask = np.minimum(IDS, 1)
  np.testing.assert_array_equal(got["sequence_id"], mask[:, ::4])
  np.testing.assert_array_equal(got["position"], np.arange(2))
  padding = np.broadcast_to(mask[:, ::4, None] == 0, got["out"].shape)
  assert np.all(got["out"][padding] == 0) and np.all(got["out"][~padding] != 0)
  for kind in ft.POOLING_TYPES:
    pooled = _numpy_pool(got[f"{kind}/block0"], mask, kind, 2)
    expected = _rms(pooled) * mask[:, ::2, None]
    np.testing.assert_allclose(got[f"{kind}/out"], expected, rtol=1e-5, atol=1e-5,
                               err_msg=kind)


R = np.random.RandomState(1).randn(B, 2, D).astype(np.float32)


def _build_encoder(layout=None, mesh_shape=None):
  """builder(mesh) -> the output of a max-pooling funnel encoder (3 blocks,
  padded inputs) and the gradients of sum(out * R) with respect to its
  variables. (The gin model below pools with the mean.)"""
  def build(mesh):
    ids = mtf.import_tf_tensor(mesh, tf.constant(IDS), [batch, length])
    model = _encoder(_stack("max", block_repeat_size=[1, 1, 1]), layout=layout,
                     mesh_shape=mesh_shape)
    y, _ = model.call_simple(ids, None, False, mode="train")
    loss = mtf.reduce_sum(y * mtf.import_tf_tensor(mesh, tf.constant(R), y.shape))
    variables = mesh.graph.trainable_variables
    grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
    out = {"out": y}
    for v, g in zip(variables, grads):
      out["grad/" + v.name] = g
    return out
  return build


_SINGLE = {}


@pytest.mark.parametrize("mesh_shape,layout", [
    ("rows:2;cols:2", "batch:rows;heads:cols;d_ff:cols"),
    ("rows:2;cols:2", "length:rows;d_model:cols"),
], ids=["batch_and_heads", "length_and_d_model"])
def test_outputs_and_gradients_do_not_depend_on_the_layout(mesh_shape, layout):
  if not _SINGLE:
    _SINGLE.update(lower_and_run(_build_encoder(), "all:1", ""))
  single = _SINGLE
  split = lower_and_run(_build_encoder(layout, mesh_shape), mesh_shape, layout)
  assert sorted(split) == sorted(single) and len(single) > 10
  assert np.abs(single["out"]).max() > 0.1
  for key in single:
    np.testing.assert_allclose(split[key], single[key], rtol=1e-4, atol=1e-5, err_msg=key)


_GIN = [
    "d_model = 16", "d_ff = 32", "num_heads = 4", "d_kv = 4", "num_layers = 1",
    # As the main job's gin files would say it (modeling.build_model).
    "build_model.encoder_layer_stack = @funnel_transformer.FunnelTransformerLayerStack()",
    "build_model.bitransformer_cls = @funnel_transformer.BitransformerFunnel",
    """FunnelTransformerLayerStack.layers = [
        @transformer_layers.SelfAttention,
        @transformer_layers.DenseReluDense,
    ]""",
    "FunnelTransformerLayerStack.n_blocks = 2",
    "FunnelTransformerLayerStack.block_param_size = [1, 1]",
    "FunnelTransformerLayerStack.block_repeat_size = [1, 2]",
    "FunnelTransformerLayerStack.pooling_type = 'mean'",
    "FunnelTransformerLayerStack.pooling_size = 2",
]


def _gin_model(layout, mesh_shape):
  """A BitransformerFunnel built as the main job builds its model, from gin."""
  return modeling.build_model("bitransformer", VOCAB, VOCAB, max_length=8, vocab_divisor=8,
                              layout=layout, mesh_shape=mesh_shape)


def _train_from_gin(mesh_shape, layout, steps=6):
  gin_config.parse([], _GIN)
  try:
    impl = make_impl(mesh_shape, layout)
    setup = modeling.Setup("bitransformer", None, impl, {"inputs": 8, "targets": 8}, 8,
                           VOCAB, 8, mtf.VariableDType())
    model = _gin_model(impl.layout_rules.to_string(), impl.shape.to_string())
    stack = model.encoder.layer_stack
    assert isinstance(model, ft.BitransformerFunnel)
    assert isinstance(stack, ft.FunnelTransformerLayerStack)
    assert (stack.n_blocks, stack.block_repeat_size, stack.pooling_type) == (2, [1, 2], "mean")
    assert type(model.decoder.layer_stack) is not type(stack)

    def model_fn(mesh, features, mode):
      del mesh
      logits, loss = modeling.call_model(setup, _gin_model(impl.layout_rules.to_string(),
                                                           impl.shape.to_string()),
                                         features, mode)
      return loss, {"cross_entropy": modeling.token_cross_entropy(logits,
                                                                   features["targets"])[0]}
    rng = np.random.RandomState(3)
    inputs = rng.randint(2, VOCAB, size=(8, 8)).astype(np.int32)
    inputs[::2, 6:] = 0
    targets = np.sort(inputs, axis=1)[:, ::-1].copy()
    trainer = mtf.training.Trainer(
        model_fn, {"inputs": "batch:8;length:8", "targets": "batch:8;length:8"}, impl,
        mtf.optimize.AdamWeightDecayOptimizer(1e-2), log_every=0, log_fn=lambda s: None)
    data = tf.data.Dataset.from_tensors({"inputs": inputs, "targets": targets}).repeat()
    return np.array(trainer.train(data, steps=steps)["loss"])
  finally:
    gin.clear_config()


def test_bitransformer_funnel_from_gin_trains_alike_on_any_layout():
  assert {"FunnelTransformerLayerStack", "BitransformerFunnel"} <= set(
      gin_config.register_configurables())
  single = _train_from_gin("all:1", "")
  assert np.all(np.isfinite(single)) and single[-1] < 0.8 * single[0], single
  split = _train_from_gin("all:2", "length:all")
  np.testing.assert_allclose(split, single, rtol=2e-4)


def test_bitransformer_funnel_decodes_like_teacher_forcing():
  """Greedy decoding attends to the pooled encoder output; its tokens are
  the argmax of the teacher-forced logits of its own output."""
  stack = _stack(n_blocks=2, block_param_size=[1, 1], block_repeat_size=[1, 1])
  decoder = transformer.Unitransformer(
      transformer.LayerStack([tl.SelfAttention(num_heads=2, key_value_size=4),
                              tl.EncDecAttention(num_heads=2, key_value_size=4)]),
      d_model=D, input_vocab_size=VOCAB, output_vocab_size=VOCAB, autoregressive=True,
      max_length=L, name="decoder", vocab_divisor=8)
  model = ft.BitransformerFunnel(_encoder(stack), decoder)

  def build(mesh):
    ids = mtf.import_tf_tensor(mesh, tf.constant(IDS), [batch, length])
    decoded = model.decode(ids, stop_at_token=None)
    assert stack.context.length_dim.size == 4
    logits, _ = model.call_simple(ids, decoded, False, mode="eval")
    return {"decoded": decoded, "logits": logits}
  got = lower_and_run(build, "rows:2;cols:2", "batch:rows;heads:cols")
  assert np.all(got["decoded"] > 0)
  np.testing.assert_array_equal(got["decoded"], got["logits"][..., 1:].argmax(-1) + 1)


def test_recomputation_gives_the_same_gradients():
  """recompute="layer" reruns each sublayer in the backward pass with the
  context of its forward pass (before the later poolings)."""
  def build(policy):
    def fn(mesh):
      ids = mtf.import_tf_tensor(mesh, tf.constant(IDS), [batch, length])
      model = _encoder(_stack(n_blocks=2, block_param_size=[1, 1], block_repeat_size=[1, 1],
                              recompute=policy))
      y, _ = model.call_simple(ids, None, False, mode="train")
      variables = mesh.graph.trainable_variables
      grads = mtf.gradients([mtf.reduce_sum(y * y)], [v.outputs[0] for v in variables])
      return {v.name: g for v, g in zip(variables, grads)}
    return fn
  plain = lower_and_run(build("none"), "all:1", "")
  again = lower_and_run(build("layer"), "all:1", "")
  for key in plain:
    np.testing.assert_allclose(again[key], plain[key], rtol=1e-5, atol=1e-6, err_msg=key)


@pytest.mark.parametrize("kwargs,message", [
    (dict(block_param_size=[1, 1]), r"block_param_size has 2 entries for n_blocks=3"),
    (dict(block_repeat_size=[1, 0, 1]),
     (r"every entry of block_repeat_size must be a positive integer, got 0")),
    (dict(block_param_size=[1, 2, 1], n_submodules=3), r"got 2 layers; .* = 12 are needed"),
    (dict(pooling_type="avg"), r"pooling_type must be one of \('mean', 'max', 'min'\)"),
    (dict(sublayers_final=[object()]), r"sublayers_final is not supported"),
], ids=["param_sizes", "repeat_sizes", "layer_count", "pooling_type", "sublayers"])
def test_bad_arguments_are_rejected(kwargs, message):
  with pytest.raises(ValueError, match=message):
    _stack(**kwargs)


def test_bad_placements_are_rejected():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  ids = mtf.zeros(mesh, mtf.Shape([batch, length]), dtype=tf.int32)
  # A layout splitting "length" 4 ways cannot pool 8 -> 4 -> 2 locally.
  model = _encoder(_stack(), layout="batch:rows;length:cols", mesh_shape="rows:2;cols:4")
  with pytest.raises(ValueError, match=r"splits 'length' over mesh dimension 'cols' \(size "
                                       r"4\).*block 2 pools it to 2 positions.*multiple of "
                                       r"16 or drop the layout rule 'length:cols'"):
    model.call_simple(ids, None, False)
  # Pooling lets a position see later ones: no language models.
  lm = transformer.Unitransformer(_stack(), d_model=D, input_vocab_size=VOCAB,
                                  output_vocab_size=VOCAB, autoregressive=True,
                                  max_length=L, vocab_divisor=8)
  with pytest.raises(ValueError, match="non-autoregressive encoder"):
    lm.call_simple(ids, ids, True)


def test_the_originals_default_sublayer_lists_are_accepted():
  """The original's funnel tests pass its default sublayer lists, which are
  the built-in body: accepted; anything else is refused above."""
  defaults = dict(
      sublayers_initial=[transformer.sublayer_dropout],
      sublayers_per_layer=[transformer.sublayer_rms_norm, transformer.sublayer_call_layer,
                           transformer.sublayer_dropout, transformer.sublayer_residual],
      sublayers_final=[transformer.sublayer_rms_norm, transformer.sublayer_dropout])
  stack = _stack(**defaults)
  assert stack.sublayers_per_layer is None  # the built-in body runs
  with pytest.raises(ValueError, match="sublayers_per_layer is not supported"):
    _stack(sublayers_per_layer=[transformer.sublayer_call_layer, transformer.sublayer_residual])
