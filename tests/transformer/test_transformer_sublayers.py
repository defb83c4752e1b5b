"""LayerStack's sublayer lists (the original's `sublayers_initial`,
`sublayers_per_layer`, `sublayers_final`) and the sublayer functions: the
original's default lists train exactly like the built-in body, a custom body
trains alike under a 2x4 layout and with recomputation, decodes
incrementally, is configured from the original's gin bindings, each
function matches NumPy, and misuse raises clear errors.
"""

import functools
import types

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import gin_config
from mesh_tensorflow.transformer import layer_stack as layer_stack_lib
from mesh_tensorflow.transformer import modeling
from mesh_tensorflow.transformer import sublayers
from mesh_tensorflow.transformer import transformer
from mesh_tensorflow.transformer import transformer_layers as tl
from mtf_test_utils import full_and_incremental_logits, lower_and_run, make_impl

B, L, V, D = 8, 8, 32, 16
batch, length = mtf.Dimension("batch", B), mtf.Dimension("length", L)
d_model = mtf.Dimension("d_model", D)
_rng = np.random.RandomState(0)
# A learnable sequence (each token determines the next), two rows padded.
TARGETS = np.array([[(5 * (b + 3 * p) + 2) % (V - 2) + 2 for p in range(L)]
                    for b in range(B)], np.int32)
TARGETS[2, 5:] = 0
TARGETS[6, 3:] = 0

ORIGINAL_DEFAULTS = dict(
    sublayers_initial=[transformer.sublayer_dropout],
    sublayers_per_layer=[transformer.sublayer_rms_norm, transformer.sublayer_call_layer,
                         transformer.sublayer_dropout, transformer.sublayer_residual],
    sublayers_final=[transformer.sublayer_rms_norm, transformer.sublayer_dropout])
LEGACY = dict(
    sublayers_initial=[transformer.sublayer_legacy_dropout],
    sublayers_per_layer=[transformer.sublayer_legacy_rms_norm, transformer.sublayer_call_layer,
                         transformer.sublayer_legacy_dropout, transformer.sublayer_residual],
    sublayers_final=[transformer.sublayer_legacy_final_rms_norm,
                     transformer.sublayer_legacy_dropout])
_drop = functools.partial(transformer.sublayer_dropout, dropout_rate=0.1)
CUSTOM = dict(
    sublayers_initial=[_drop],
    sublayers_per_layer=[transformer.sublayer_true_layer_norm, transformer.sublayer_call_layer,
                         functools.partial(transformer.sublayer_rezero, initial_value=0.5),
                         _drop, transformer.sublayer_residual],
    sublayers_final=[transformer.sublayer_scale_norm, _drop])


@pytest.fixture
def clean_gin():
  yield
  gin.clear_config()


def _lm(dropout=0.0, **stack_kwargs):
  stack = transformer.make_layer_stack(
      [tl.SelfAttention(num_heads=4, key_value_size=4, dropout_rate=dropout),
       tl.DenseReluDense(hidden_size=32, dropout_rate=dropout)], num_layers=1,
      **stack_kwargs)
  return transformer.Unitransformer(stack, d_model=D, input_vocab_size=V, output_vocab_size=V,
                                    autoregressive=True, max_length=L, vocab_divisor=8)


def _loss(model, targets, mode, layer_outputs=None):
  inputs = mtf.shift(targets, 1, length, wrap=False)
  sequence_id = mtf.cast(mtf.not_equal(targets, 0), tf.int32)
  return model.call_simple(inputs, targets, True, mode=mode, sequence_id=sequence_id,
                           layer_outputs=layer_outputs)[1]


def _train(stack_kwargs, mesh_shape="all:1", layout="", steps=4, dropout=0.0):
  """Losses of `steps` SGD steps of a one-block language model."""
  def model_fn(mesh, features, mode):
    del mesh
    return _loss(_lm(dropout, **stack_kwargs), features["targets"], mode)
  trainer = mtf.training.Trainer(
      model_fn, {"targets": f"batch:{B};length:{L}"}, make_impl(mesh_shape, layout),
      mtf.optimize.SgdOptimizer(0.5), log_every=0, log_fn=lambda line: None)
  data = tf.data.Dataset.from_tensors({"targets": TARGETS}).repeat()
  return np.array(trainer.train(data, steps=steps)["loss"])


def _variable_names(stack_kwargs):
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  _loss(_lm(**stack_kwargs), mtf.zeros(mesh, mtf.Shape([batch, length]), dtype=tf.int32),
        "train")
  return sorted(v.name for v in graph.trainable_variables)


# ------------------------------------------------ the original's defaults
def test_original_default_sublayers_train_like_the_built_in_body():
  builtin = _variable_names({})
  # The built-in body names its norms as the original's default lists do
  # ("rms_norm"); the legacy lists, and the legacy mode (dropout_rate and
  # norm_epsilon both given), name them "layer_norm" / "final_layer_norm".
  assert "transformer/block_000/layer_000/rms_norm/scale" in builtin
  assert "transformer/rms_norm/scale" in builtin
  legacy = _variable_names(LEGACY)
  assert "transformer/final_layer_norm/scale" in legacy
  assert sorted(n.replace("final_layer_norm", "rms_norm").replace("layer_norm", "rms_norm")
                for n in legacy) == builtin != legacy
  assert _variable_names(ORIGINAL_DEFAULTS) == builtin
  assert _variable_names({"dropout_rate": 0.0, "norm_epsilon": 1e-6}) == legacy
  # Other weights are initialized by name and the norm scales are ones, so
  # the same training steps must give the same losses.
  reference = _train({})
  assert np.all(np.isfinite(reference)) and reference[-1] < reference[0] - 0.1, reference
  for kwargs in (ORIGINAL_DEFAULTS, LEGACY):
    np.testing.assert_allclose(_train(kwargs), reference, rtol=1e-5, atol=1e-6)


def test_layer_outputs_are_those_of_the_built_in_body():
  def outputs_of(kwargs):
    def build(mesh):
      targets = mtf.import_tf_tensor(mesh, tf.constant(TARGETS), [batch, length])
      outputs = []
      _loss(_lm(**kwargs), targets, "eval", layer_outputs=outputs)
      return {i: t for i, t in enumerate(outputs)}
    return lower_and_run(build, "all:1", "")
  builtin, custom = outputs_of({}), outputs_of(LEGACY)
  # The embeddings, after layer 0, the output: one per layer and one more.
  assert sorted(builtin) == sorted(custom) == [0, 1, 2]
  for i in range(3):
    np.testing.assert_allclose(custom[i], builtin[i], rtol=1e-6, atol=1e-7)
  assert np.all(custom[2][2, 5:] == 0) and np.all(custom[2][2, :5] != 0)  # padding masked


# --------------------------------------------------------- a custom body
def test_custom_sublayers_train_alike_on_2x4_and_with_recompute():
  single = _train(CUSTOM, dropout=0.1)
  assert np.all(np.isfinite(single)) and single[-1] < single[0] - 0.1, single
  split = _train(CUSTOM, "rows:2;cols:4", "batch:rows;heads:cols;d_ff:cols;vocab:cols",
                 dropout=0.1)
  np.testing.assert_allclose(split, single, rtol=2e-5, atol=2e-5)
  recomputed = _train(dict(CUSTOM, recompute="layer"), dropout=0.1)
  np.testing.assert_allclose(recomputed, single, rtol=2e-5, atol=2e-5)
  # The body really is the custom one: its own variables, no built-in norms.
  names = _variable_names(CUSTOM)
  assert "transformer/block_000/layer_000/rezero_weight" in names
  assert ("transformer/block_000/layer_001/true_layer_norm/layer_prepostprocess/layer_norm/"
          "layer_norm_scale") in names
  assert "transformer/scale_norm/scale" in names
  assert not any("layer_norm/scale" in n or "rms_norm" in n for n in names)


def test_recompute_layer_wraps_each_layer():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  model = _lm(**dict(CUSTOM, recompute="layer"))
  _loss(model, mtf.zeros(mesh, mtf.Shape([batch, length]), dtype=tf.int32), "train")
  assert [policy for policy, _ in model.layer_stack.recompute_ops] == ["layer", "layer"]


def test_custom_sublayers_decode_incrementally():
  """Each decoding step's logits (cached keys and values; the norms find
  their variables again) equal one pass over the whole sequence."""
  model = _lm(**CUSTOM)

  build = full_and_incremental_logits(model, np.abs(TARGETS), batch, length)
  out = lower_and_run(build, "all:1", "")
  np.testing.assert_allclose(out["incremental"][..., 1:], out["full"][..., 1:], rtol=1e-4,
                             atol=1e-5)


# -------------------------------------------------------------------- gin
_GIN = [
    "num_layers = 1", "d_model = 16", "d_ff = 32", "num_heads = 4", "d_kv = 4",
    "dropout_rate = 0.5",
    """transformer.LayerStack.sublayers_per_layer = [
        @transformer.sublayer_rms_norm,
        @transformer.sublayer_call_layer,
        @transformer.sublayer_dropout,
        @transformer.sublayer_residual]""",
    "transformer.LayerStack.sublayers_final = [@transformer.sublayer_true_layer_norm]",
    "transformer.sublayer_rms_norm.name = 'pre_norm'",
]


def test_original_gin_bindings_build_and_run_a_model(clean_gin):
  configurables = gin_config.register_configurables()
  functions = [n for n in dir(sublayers) if n.startswith("sublayer_")]
  assert len(functions) == 13 and set(functions) <= set(configurables)
  gin_config.parse([], _GIN)
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  model = modeling.build_model("lm", V, V, max_length=L)
  stack = model.layer_stack
  assert [f.__name__ for f in stack.sublayers_per_layer] == [
      "sublayer_rms_norm", "sublayer_call_layer", "sublayer_dropout", "sublayer_residual"]
  # The list not bound is the original's default, through gin too.
  assert stack.sublayers_initial == [configurables["sublayer_dropout"]]
  targets = mtf.import_tf_tensor(mesh, tf.constant(TARGETS), [batch, length])
  loss = _loss(model, targets, "eval")
  names = {v.name for v in graph.trainable_variables}
  # A language model is named "transformer" (Unitransformer's default), as
  # in the original.
  assert {"transformer/block_000/layer_000/pre_norm/scale",
          "transformer/block_000/layer_001/pre_norm/scale",
          "transformer/true_layer_norm/layer_prepostprocess/layer_norm/layer_norm_scale"} <= names
  assert not any("rms_norm" in n or "final_layer_norm" in n for n in names)
  # defaults.gin binds sublayer_dropout.dropout_rate to the dropout_rate macro.
  ones = mtf.ones(mesh, mtf.Shape([batch, length, d_model]))
  context = transformer.Context(model, mesh, [batch], length, mtf.VariableDType(), mode="train")
  dropped = stack.sublayers_initial[0](ones, stack, context)
  impl = make_impl("all:1", "")

  @tf.function(autograph=False)
  def run():
    lowering = mtf.Lowering(graph, {mesh: impl})
    return lowering.export_to_tf_tensor(loss), lowering.export_to_tf_tensor(dropped)
  loss_value, dropped_value = (t.numpy() for t in run())
  assert np.isfinite(loss_value) and 0.5 * np.log(V) < loss_value < 2 * np.log(V)
  assert set(np.unique(dropped_value)) == {0.0, 2.0}


# ---------------------------------------------- each function against NumPy
def test_sublayer_functions_match_numpy_under_a_split_layout():
  x_np = _rng.randn(B, L, D).astype(np.float32)
  w_np = _rng.randn(B, L, D).astype(np.float32)
  seq_np = (TARGETS != 0).astype(np.int32)

  def build(mesh):
    x = mtf.import_tf_tensor(mesh, tf.constant(x_np), [batch, length, d_model])
    w = mtf.import_tf_tensor(mesh, tf.constant(w_np), [batch, length, d_model])
    seq = mtf.import_tf_tensor(mesh, tf.constant(seq_np), [batch, length])
    model = types.SimpleNamespace(model_dim=d_model)
    stack = transformer.LayerStack([], dropout_rate=0.5, norm_epsilon=1e-3,
                                   sublayers_per_layer=[transformer.sublayer_residual])
    ctx = {mode: transformer.Context(model, mesh, [batch], length, mtf.VariableDType(),
                                     mode=mode, sequence_id=seq)
           for mode in ("train", "eval")}
    ctx["train"].current_layer_input = w

    def call(fn, mode="eval", **kwargs):
      return fn(x, stack, ctx[mode], **kwargs)
    clipped = call(transformer.sublayer_clip_activation_gradient, rms_norm=0.5)
    grad_x, = mtf.gradients([mtf.reduce_sum(clipped * w)], [x])
    return {
        "rms": call(transformer.sublayer_rms_norm, epsilon=0.1),
        "legacy_rms": call(transformer.sublayer_legacy_rms_norm),
        "sub_rms": call(transformer.sublayer_rms_norm_subsampled, percentage=40.0),
        "layer_norm": call(transformer.sublayer_true_layer_norm),
        "scale_norm": call(transformer.sublayer_scale_norm),
        "rezero": call(transformer.sublayer_rezero, initial_value=0.3),
        "mask": call(transformer.sublayer_mask_padding),
        "residual": call(transformer.sublayer_residual, "train"),
        "dropout_eval": call(transformer.sublayer_dropout, dropout_rate=0.5),
        "dropout_train": call(transformer.sublayer_dropout, "train", dropout_rate=0.5),
        "legacy_dropout": call(transformer.sublayer_legacy_dropout, "train"),
        "clipped": clipped, "grad_x": grad_x,
    }
  out = lower_and_run(build, "rows:2;cols:4", "batch:rows;d_model:cols")
  ms = np.mean(x_np ** 2, -1, keepdims=True)
  close = functools.partial(np.testing.assert_allclose, rtol=1e-5, atol=1e-5)
  close(out["rms"], x_np / np.sqrt(ms + 0.1))
  close(out["legacy_rms"], x_np / np.sqrt(ms + 1e-3))  # the stack's norm_epsilon
  close(out["sub_rms"], x_np / np.sqrt(np.mean(x_np[..., :7] ** 2, -1, keepdims=True) + 1e-6))
  centered = x_np - x_np.mean(-1, keepdims=True)
  close(out["layer_norm"], centered / np.sqrt(np.mean(centered ** 2, -1, keepdims=True) + 1e-6))
  close(out["scale_norm"], x_np / np.sqrt(ms + 1e-6))
  close(out["rezero"], 0.3 * x_np)
  close(out["mask"], x_np * seq_np[..., None])
  close(out["residual"], x_np + w_np)
  close(out["dropout_eval"], x_np)
  for key in ("dropout_train", "legacy_dropout"):
    ratio = out[key] / x_np
    assert set(np.round(np.unique(ratio), 5)) == {0.0, 2.0}, key
    # One mask per example and channel, the same at every position.
    np.testing.assert_array_equal(ratio, np.broadcast_to(ratio[:, :1], ratio.shape))
  close(out["clipped"], x_np)
  close(out["grad_x"], w_np / max(1.0, np.sqrt(np.mean(w_np ** 2)) / 0.5))


# ------------------------------------------------------------------ errors
def _stack_output(**stack_kwargs):
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  return _loss(_lm(**stack_kwargs), mtf.zeros(mesh, mtf.Shape([batch, length]),
                                               dtype=tf.int32), "train")


def test_misshaped_sublayer_output_names_the_layer():
  def shrink(x, layer_stack, context):
    del layer_stack
    return mtf.reduce_sum(x, reduced_dim=context.model.model_dim)
  with pytest.raises(ValueError, match=r"layer 0 \(SelfAttention\) returned shape"):
    _stack_output(sublayers_per_layer=[transformer.sublayer_call_layer, shrink])


def test_unsupported_combinations_are_refused():
  layers = [tl.SelfAttention(num_heads=4, key_value_size=4), tl.DenseReluDense(hidden_size=8)]
  lists = {"sublayers_final": [transformer.sublayer_rms_norm]}
  with pytest.raises(ValueError, match="do not support recompute='selective'"):
    transformer.LayerStack(layers, recompute="selective", **lists)
  with pytest.raises(ValueError, match="do not support num_stages=2 .pipelining"):
    transformer.make_layer_stack(layers, num_layers=2, num_stages=2, **lists)
  with pytest.raises(ValueError, match="norm_type='layer'.*sublayer_true_layer_norm"):
    transformer.LayerStack(layers, norm_type="layer", **lists)
  # Both still work without sublayer lists.
  assert transformer.LayerStack(layers, recompute="selective").sublayers_per_layer is None
  with pytest.raises(TypeError, match="sublayers_per_layer must be a list"):
    transformer.LayerStack(layers, sublayers_per_layer=transformer.sublayer_rms_norm)
  with pytest.raises(TypeError, match="sublayers_initial holds 'dropout'"):
    transformer.LayerStack(layers, sublayers_initial=["dropout"])


def test_misplaced_or_broken_sublayers_raise_clear_errors():
  with pytest.raises(ValueError, match="current_layer_input is not set.*sublayers_per_layer"):
    _stack_output(sublayers_final=[transformer.sublayer_residual])
  with pytest.raises(ValueError, match="current_layer is not set"):
    _stack_output(sublayers_initial=[transformer.sublayer_call_layer])
  with pytest.raises(TypeError, match="'<lambda>' returned NoneType, not an mtf.Tensor"):
    _stack_output(sublayers_final=[lambda x, stack, context: None])


def test_built_in_body_is_unchanged():
  stack = layer_stack_lib.make_layer_stack([tl.DenseReluDense(hidden_size=8)], num_layers=2)
  assert (stack.sublayers_initial, stack.sublayers_per_layer, stack.sublayers_final) == (
      None, None, None)
  assert (stack.dropout_rate, stack.norm_epsilon) == (0.0, 1e-6)
