"""Transformer options from the original: SelfAttention's positional order
(and LocalSelfAttention's, EncDecAttention's), fold_scaling_into_initializer,
z_loss_coeff, clear errors for the experimental variants not provided,
Unitransformer's token_dropout_rate, and make_layer_stack's list-form layer
specs (also from gin)."""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import attention
from mesh_tensorflow.transformer import transformer
from mesh_tensorflow.transformer import transformer_layers as tl
from mtf_test_utils import lower_and_run

B, L, V, D = 4, 8, 16, 16
TARGETS = np.random.RandomState(5).randint(1, V, size=(B, L)).astype(np.int32)
TARGETS[1, 6:] = 0  # padding


def test_positional_order_is_the_originals():
  layer = tl.SelfAttention(4, 0, 8, True, 0.1, None, "bias", 16)
  assert (layer.num_heads, layer.key_value_size, layer.shared_kv, layer.dropout_rate,
          layer.relative_attention_type, layer.relative_attention_num_buckets) == (
              4, 8, True, 0.1, "bias", 16)
  local = tl.LocalSelfAttention(3, 2, 0, 8)
  assert (local.radius, local.num_heads, local.key_value_size) == (3, 2, 8)
  assert tl.EncDecAttention("bias", num_heads=2).relative_attention_type == "bias"


@pytest.mark.parametrize("option,value", [
    ("attention_func", "doubly"), ("keep_query_heads_dims", True),
    ("use_hyperprompt", True), ("hyperprompt_length_encoder", 4)])
def test_experimental_variants_are_clear_errors(option, value):
  with pytest.raises(ValueError, match=option):
    tl.SelfAttention(**{option: value})


def _loss(layer_kwargs, mode="train", mesh_shape="all:1", layout=""):
  def build(mesh):
    batch, length = mtf.Dimension("batch", B), mtf.Dimension("length", L)
    stack = transformer.make_layer_stack(
        [tl.SelfAttention(num_heads=4, key_value_size=4, **layer_kwargs),
         tl.DenseReluDense(hidden_size=32)], num_layers=2, dropout_rate=0.0)
    model = transformer.Unitransformer(stack, d_model=D, input_vocab_size=V,
                                       output_vocab_size=V, autoregressive=True, max_length=L)
    targets = mtf.import_tf_tensor(mesh, tf.constant(TARGETS), [batch, length])
    inputs = mtf.shift(targets, 1, length, wrap=False)
    return {"loss": model.call_simple(inputs, targets, True, mode=mode)[1]}
  return float(lower_and_run(build, mesh_shape, layout)["loss"])


def test_z_loss_is_added_in_training_only_and_scales_with_its_coefficient():
  base = _loss({})
  assert _loss({"z_loss_coeff": None}) == pytest.approx(base, rel=1e-6)
  one = _loss({"z_loss_coeff": 1e-2}) - base
  two = _loss({"z_loss_coeff": 2e-2}) - base
  assert one > 1e-4, one                     # log(Z)^2 of the attention scores is positive
  assert two == pytest.approx(2 * one, rel=1e-3)
  assert _loss({"z_loss_coeff": 1e-2}, mode="eval") == pytest.approx(
      _loss({}, mode="eval"), rel=1e-6)
  # The same under a layout that splits the heads and the batch.
  split = _loss({"z_loss_coeff": 1e-2}, mesh_shape="rows:2;cols:4",
                layout="batch:rows;heads:cols")
  assert split == pytest.approx(base + one, rel=1e-5)


def test_attend_log_z_and_scale_match_numpy():
  rng = np.random.RandomState(2)
  q_np, k_np, v_np = (rng.randn(2, 3, 4).astype(np.float32) for _ in range(3))

  def build(mesh):
    heads, length = mtf.Dimension("heads", 2), mtf.Dimension("length", 3)
    memory, d_kv = mtf.Dimension("memory_length", 3), mtf.Dimension("d_kv", 4)
    q = mtf.import_tf_tensor(mesh, q_np, [heads, length, d_kv])
    k = mtf.import_tf_tensor(mesh, k_np, [heads, memory, d_kv])
    v = mtf.import_tf_tensor(mesh, v_np, [heads, memory, d_kv])
    log_z = []
    o = attention.attend(q, k, v, memory, d_kv, scale=0.5, log_z=log_z)
    return {"o": o, "log_z": log_z[0]}
  got = lower_and_run(build, "all:2", "heads:all")
  scores = 0.5 * np.einsum("hlk,hmk->hlm", q_np, k_np)
  log_z = np.log(np.exp(scores).sum(-1))
  np.testing.assert_allclose(got["log_z"], log_z, rtol=1e-5)
  weights = np.exp(scores - log_z[..., None])
  np.testing.assert_allclose(got["o"], np.einsum("hlm,hmk->hlk", weights, v_np), rtol=1e-5,
                             atol=1e-6)


def test_unfolded_scaling_is_the_same_model():
  """fold_scaling_into_initializer=False initializes the query weights
  sqrt(d_kv) times larger and scales the scores by 1/sqrt(d_kv): the same
  function at initialization, so the same loss."""
  assert _loss({"fold_scaling_into_initializer": False}) == pytest.approx(_loss({}), rel=1e-5)


def test_token_dropout_replaces_inputs_by_padding_in_training_only():
  with pytest.raises(ValueError, match="token_dropout_rate"):
    transformer.Unitransformer(transformer.make_layer_stack([], num_layers=0),
                               input_vocab_size=V, output_vocab_size=V, token_dropout_rate=1.0)

  def loss_with(rate, mode):
    def build(mesh):
      batch, length = mtf.Dimension("batch", B), mtf.Dimension("length", L)
      stack = transformer.make_layer_stack([tl.DenseReluDense(hidden_size=8)], num_layers=1)
      model = transformer.Unitransformer(stack, d_model=D, input_vocab_size=V,
                                         output_vocab_size=V, max_length=L,
                                         token_dropout_rate=rate)
      targets = mtf.import_tf_tensor(mesh, tf.constant(TARGETS), [batch, length])
      return {"loss": model.call_simple(targets, targets, True, mode=mode)[1]}
    return float(lower_and_run(build, "all:1", "")["loss"])
  assert loss_with(0.5, "eval") == pytest.approx(loss_with(0.0, "eval"), rel=1e-6)
  assert loss_with(0.5, "train") != pytest.approx(loss_with(0.0, "train"), rel=1e-3)


def test_layer_specs_in_the_original_list_form():
  """make_layer_stack's layers may be [class, name, {kwargs}] as in the
  original's gin files; block_scope is accepted."""
  stack = transformer.make_layer_stack(
      [tl.SelfAttention, [tl.DenseReluDense, "feedforward", {"hidden_size": 24}]],
      num_layers=2, block_scope=False)
  kinds = [(type(layer).__name__, getattr(layer, "hidden_size", None)) for layer in stack.layers]
  assert kinds == [("SelfAttention", None), ("DenseReluDense", 24)] * 2
  with pytest.raises(ValueError, match="names no layer class"):
    transformer.make_layer_stack([["feedforward", {"hidden_size": 24}]], num_layers=1)


def test_layer_specs_in_the_list_form_from_gin():
  import gin
  from mesh_tensorflow.transformer import gin_config
  gin_config.register_configurables()
  try:
    gin.parse_config("""
        make_layer_stack.layers = [
            @transformer_layers.SelfAttention,
            [@transformer_layers.DenseReluDense, "feedforward", {"hidden_size": 12}]]
        make_layer_stack.num_layers = 1
        transformer_layers.SelfAttention.z_loss_coeff = 1e-3
    """)
    stack = gin_config.register_configurables()["make_layer_stack"]()
  finally:
    gin.clear_config()
  attention_layer, ffn = stack.layers
  assert attention_layer.z_loss_coeff == 1e-3 and ffn.hidden_size == 12


def test_moe1d_takes_the_originals_positional_order_and_options():
  from mesh_tensorflow.transformer import moe
  layer = moe.MoE1D(8, 1e-3, 32, 16, 1.5, 3.0, False, "all", "none", 0.3, 0.4, 0.1, "gelu",
                    "switch", 2)
  assert (layer.num_experts, layer.loss_coef, layer.hidden_size, layer.group_size,
          layer.capacity_factor_train, layer.capacity_factor_eval, layer.second_policy_train,
          layer.second_policy_eval, layer.second_threshold_train, layer.second_threshold_eval,
          layer.dropout_rate, layer.activation, layer.moe_gating, layer.min_expert_capacity) == (
              8, 1e-3, 32, 16, 1.5, 3.0, "all", "none", 0.3, 0.4, 0.1, "gelu", "switch", 2)
  moe.MoE1D(ntlb_top_k=2, top_n_num_experts_per_token=1)  # gin files may set them
  for option, value in [("use_second_place_loss", True), ("output_dim", 8),
                        ("word_embed_mode", "concat"),
                        ("use_second_place_expert_prob", 0.5)]:
    with pytest.raises(ValueError, match=option):
      moe.MoE1D(**{option: value})
  layer = moe.MoE2D(2, 4, 1e-3, 32, 16)
  assert (layer.num_experts, layer.loss_coef, layer.hidden_size, layer.group_size) == (
      8, 1e-3, 32, 16)


def test_call_simple_num_microbatches_and_encoder_inputs():
  """As in the original: num_microbatches divides the token loss (the caller
  sums the micro-batches' losses) and encoder_inputs reaches the context."""
  seen = {}

  class Probe(tl.DenseReluDense):
    def call(self, context, x):
      seen["encoder_inputs"] = context.encoder_inputs
      seen["num_microbatches"] = context.num_microbatches
      return super().call(context, x)

  def build(mesh, num_microbatches):
    batch, length = mtf.Dimension("batch", B), mtf.Dimension("length", L)
    stack = transformer.make_layer_stack([Probe(hidden_size=8)], num_layers=1)
    model = transformer.Unitransformer(stack, d_model=D, input_vocab_size=V,
                                       output_vocab_size=V, max_length=L)
    targets = mtf.import_tf_tensor(mesh, tf.constant(TARGETS), [batch, length])
    marker = mtf.zeros_like(targets)
    loss = model.call_simple(targets, targets, True, "eval", None, None, None, None, None,
                             None, marker, num_microbatches=num_microbatches)[1]
    assert seen["encoder_inputs"] is marker and seen["num_microbatches"] == num_microbatches
    return {"loss": loss}
  whole = float(lower_and_run(lambda m: build(m, 1), "all:1", "")["loss"])
  quarter = float(lower_and_run(lambda m: build(m, 4), "all:1", "")["loss"])
  assert quarter == pytest.approx(whole / 4, rel=1e-6)


def test_decoding_signatures_take_encoder_inputs_and_reject_other_bos_ids():
  import inspect
  params = lambda fn: list(inspect.signature(fn).parameters)
  assert params(transformer.Unitransformer.sample_autoregressive)[8:10] == [
      "encoder_inputs", "shared_params"]
  assert params(transformer.Unitransformer.beam_search)[6:8] == ["encoder_inputs", "alpha"]
  assert params(transformer.Bitransformer.decode)[6] == "sampling_keep_top_k"
  assert params(transformer.LayerStack)[1:4] == [
      "sublayers_initial", "sublayers_per_layer", "sublayers_final"]
  assert params(transformer.make_layer_stack)[1:4] == ["layer_stack_cls", "num_layers",
                                                        "block_scope"]
  with pytest.raises(ValueError, match="ensemble"):
    transformer.Unitransformer(transformer.LayerStack([]), input_vocab_size=V,
                               output_vocab_size=V, ensemble=2)
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  model = transformer.Unitransformer(transformer.LayerStack([]), d_model=D, input_vocab_size=V,
                                     output_vocab_size=V, max_length=L)
  with pytest.raises(ValueError, match="bos_id=2"):
    model.sample_autoregressive(mtf.zeros(mesh, f"batch:{B};length:{L}", dtype=tf.int32),
                                bos_id=2)
