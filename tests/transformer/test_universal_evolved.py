"""Universal Transformer (UTLayerStack) and Evolved Transformer layers:
NumPy references, weight sharing across recurrence steps, layouts."""

import types

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import evolved_transformer as et
from mesh_tensorflow.transformer import transformer
from mesh_tensorflow.transformer import transformer_layers as tl
from mesh_tensorflow.transformer import universal_transformer as ut
from mtf_test_utils import lower_and_run

B, L, D, FF = 8, 6, 8, 16
batch, length = mtf.Dimension("batch", B), mtf.Dimension("length", L)
d_model = mtf.Dimension("d_model", D)
X = np.random.RandomState(0).randn(B, L, D).astype(np.float32)
R = np.random.RandomState(1).randn(B, L, D).astype(np.float32)


def _context(mesh, mode="train"):
  model = types.SimpleNamespace(model_dim=d_model, layout=None, mesh_shape=None,
                                ensemble_dims=[])
  return transformer.Context(model, mesh, [batch], length, mtf.VariableDType(), mode=mode,
                             losses=[])


def _build(make_layer):
  def build(mesh):
    x = mtf.import_tf_tensor(mesh, tf.constant(X), [batch, length, d_model])
    y = make_layer().call(_context(mesh), x)
    loss = mtf.reduce_sum(y * mtf.import_tf_tensor(mesh, tf.constant(R), y.shape))
    variables = mesh.graph.trainable_variables
    grads = mtf.gradients([loss], [x] + [v.outputs[0] for v in variables])
    out = {"y": y, "grad/x": grads[0]}
    for v, g in zip(variables, grads[1:]):
      out[v.name] = v.outputs[0]
      out["grad/" + v.name] = g
    return out
  return build


def _ln(x, scale, bias):
  mu = x.mean(-1, keepdims=True)
  var = ((x - mu) ** 2).mean(-1, keepdims=True)
  return (x - mu) / np.sqrt(var + 1e-6) * scale + bias


def _ut(**kwargs):
  return lambda: ut.UTLayerStack([tl.DenseReluDense(hidden_size=FF)], **kwargs)


def test_basic_recurrence_matches_numpy_and_shares_weights():
  got = lower_and_run(_build(_ut(num_rec_steps=3)), "all:1", "")
  names = sorted(k for k in got if not k.startswith("grad/") and k not in ("y",))
  # One set of block weights whatever the number of steps, one step table.
  assert names == sorted([
      "final_layer_norm/layer_norm/layer_norm_bias",
      "final_layer_norm/layer_norm/layer_norm_scale", "layer_embedding",
      "ut/layer_000/DenseReluDense/wi/kernel", "ut/layer_000/DenseReluDense/wo/kernel",
      "ut/layer_000/layer_prepostprocess/layer_norm/layer_norm_bias",
      "ut/layer_000/layer_prepostprocess/layer_norm/layer_norm_scale"])
  assert got["layer_embedding"].shape == (3, D)
  p = "ut/layer_000/"
  x = X
  for step in range(3):
    x = x + got["layer_embedding"][step] * np.sqrt(D)
    h = _ln(x, got[p + "layer_prepostprocess/layer_norm/layer_norm_scale"],
            got[p + "layer_prepostprocess/layer_norm/layer_norm_bias"])
    x = x + np.maximum(h @ got[p + "DenseReluDense/wi/kernel"], 0) @ got[
        p + "DenseReluDense/wo/kernel"]
  expected = _ln(x, got["final_layer_norm/layer_norm/layer_norm_scale"],
                 got["final_layer_norm/layer_norm/layer_norm_bias"])
  np.testing.assert_allclose(got["y"], expected, rtol=1e-4, atol=1e-5)


def test_act_halts_and_weights_the_states():
  got = lower_and_run(_build(_ut(recurrence_type="act", act_max_steps=3)), "all:1", "")
  assert got["layer_embedding"].shape == (4, D)
  assert "sigmoid_activation_for_pondering/dense/kernel" in got
  assert np.abs(got["grad/sigmoid_activation_for_pondering/dense/kernel"]).max() > 0
  assert np.isfinite(got["y"]).all() and np.abs(got["y"]).max() > 0


STACKS = {
    "basic_attention": lambda: ut.UTLayerStack(
        [tl.SelfAttention(num_heads=2, key_value_size=4), tl.DenseReluDense(hidden_size=FF)],
        num_rec_steps=2, add_position_timing_signal=True, position_start_index="step"),
    "act": _ut(recurrence_type="act", act_max_steps=2, mix_with_transformer_after_ut=True,
               num_vanilla_transformer_layers=1),
    "highway_gated": _ut(recurrence_type="highway", num_rec_steps=2, gates_inputs="sti",
                         couple_carry_transform_gates=False, use_gated_transformer=True,
                         gating_type="gru"),
    "evolved_encoder": lambda: et.EncoderConvolutionalLayer(D, 0.0),
    "evolved_decoder": lambda: et.DecoderConvolutionalLayer(D, 0.0),
    "glu": et.GatedLinearUnitLayer,
}


SPLIT = ("rows:2;cols:4", "batch:rows;d_model:cols")
ALL8 = ("all:8", "d_ff:all")


@pytest.mark.parametrize("name,mesh_shape,layout", [
    ("basic_attention",) + ALL8, ("basic_attention",) + SPLIT, ("act",) + ALL8,
    ("highway_gated",) + SPLIT, ("evolved_encoder",) + SPLIT, ("evolved_decoder",) + SPLIT,
    ("evolved_decoder", "all:8", "batch:all"), ("glu",) + SPLIT])
def test_layers_do_not_depend_on_the_layout(name, mesh_shape, layout):
  single = lower_and_run(_build(STACKS[name]), "all:1", "")
  split = lower_and_run(_build(STACKS[name]), mesh_shape, layout)
  assert sorted(split) == sorted(single)
  for key in single:
    np.testing.assert_allclose(split[key], single[key], rtol=1e-4, atol=1e-5, err_msg=key)
  assert np.abs(single["grad/x"]).max() > 0


def test_decoder_convolution_is_causal():
  def build(mesh):
    x = mtf.import_tf_tensor(mesh, tf.constant(X), [batch, length, d_model])
    y = et.DecoderConvolutionalLayer(D, 0.0).call(_context(mesh), x)
    first = mtf.reduce_sum(mtf.slice(y, 2, 1, "length"))
    return {"g": mtf.gradients([first], [x])[0]}
  g = lower_and_run(build, "all:1", "")["g"]
  assert np.abs(g[:, :3]).max() > 0 and not g[:, 3:].any()


def test_glu_matches_numpy():
  got = lower_and_run(_build(et.GatedLinearUnitLayer), "all:1", "")
  kernels = sorted(k for k in got if k.startswith("glu_") and "kernel" in k)
  # Named as Mesh TensorFlow 0.1.21 names them, so its checkpoints load.
  assert kernels == ["glu_0/kernel", "glu_1/kernel"]
  lin = X @ got[kernels[0]] + got.get(kernels[0].replace("kernel", "bias"), 0)
  gate = X @ got[kernels[1]] + got.get(kernels[1].replace("kernel", "bias"), 0)
  np.testing.assert_allclose(got["y"], lin / (1 + np.exp(-gate)), rtol=1e-4, atol=1e-5)


def test_bad_options_are_clear_errors():
  with pytest.raises(ValueError, match="recurrence_type must be one of"):
    ut.UTLayerStack([tl.DenseReluDense()], recurrence_type="lstm")
  with pytest.raises(ValueError, match="step_timing_signal_type must be one of"):
    ut.UTLayerStack([tl.DenseReluDense()], step_timing_signal_type="sinusoid")
  with pytest.raises(ValueError, match="d_model must be even"):
    et.DecoderConvolutionalLayer(7, 0.0)
  with pytest.raises(ValueError, match="incremental decoding is not supported"):
    lower_and_run(lambda mesh: {"y": et.DecoderConvolutionalLayer(D, 0.0).call(
        _context(mesh, mode="incremental"), mtf.ones(mesh, mtf.Shape([batch, length, d_model])))},
        "all:1", "")


# ------------------------------------------------ through utils.run (the CLI's path)
TINY = [
    "num_layers = 1", "d_model = 32", "d_ff = 64", "num_heads = 4", "d_kv = 8",
    "run.sequence_length = {'inputs': 32, 'targets': 32}", "run.batch_size = 8",
    "run.train_steps = 6", "run.eval_steps = 1", "run.log_every = 0", "run.num_samples = 0",
    "cosine_with_warmup.warmup_steps = 0", "cosine_with_warmup.peak = 0.05",
    "dataset_fn.corpus_bytes = 200000", "dataset_fn.shuffle_buffer = 100",
    "UTLayerStack.num_rec_steps = 2",
]


@pytest.mark.parametrize("gin_file", ["models/tiny_universal_lm.gin",
                                      "models/tiny_evolved_lm.gin"])
def test_tiny_configs_train_and_the_loss_falls(gin_file):
  import gin  # pylint: disable=g-import-not-at-top
  from mesh_tensorflow.transformer import gin_config, utils  # pylint: disable=g-import-not-at-top
  gin_config.parse([gin_file, "layouts/2x4.gin"], TINY)
  try:
    result = utils.run(model_dir=None, mode="train")
  finally:
    gin.clear_config()
  losses = result["losses"]
  assert len(losses) == 6 and np.isfinite(losses).all()
  assert losses[-1] < losses[0] - 0.3, losses
