"""fixup_layers: the Fixup initialisation (zero last projections, scaled
He/Glorot others) against its formula; a Bitransformer of Fixup layers and
Fixup sublayers gives the same loss and gradients on one device and under
split layouts; gin names; bad arguments."""

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import fixup_layers as fl
from mesh_tensorflow.transformer import gin_config, transformer
from mtf_test_utils import lower_and_run

B, L, D, V, H, KV, FF = 4, 8, 16, 16, 4, 4, 32
NUM_BLOCKS = 5
batch, length = mtf.Dimension("batch", B), mtf.Dimension("length", L)
RNG = np.random.RandomState(0)
INPUTS = RNG.randint(2, V, size=(B, L)).astype(np.int32)
TARGETS = RNG.randint(2, V, size=(B, L)).astype(np.int32)
TARGETS[2, 5:] = 0


def _stack(decoder: bool):
  layers = [fl.SelfAttentionFixup(num_blocks=NUM_BLOCKS, num_heads=H, key_value_size=KV)]
  if decoder:
    layers.append(fl.EncDecAttentionFixup(num_heads=H, key_value_size=KV))
  layers.append(fl.DenseReluDenseFixup(hidden_size=FF, num_blocks=NUM_BLOCKS))
  return transformer.LayerStack(
      layers, sublayers_per_layer=[fl.sublayer_fixup_shift, transformer.sublayer_call_layer,
                                   fl.sublayer_fixup_scale, transformer.sublayer_residual])


def _model(layout=None, mesh_shape=None):
  kw = dict(d_model=D, max_length=L, vocab_divisor=8, layout=layout, mesh_shape=mesh_shape)
  enc = transformer.Unitransformer(_stack(False), input_vocab_size=V, output_vocab_size=None,
                                   autoregressive=False, name="encoder", **kw)
  dec = transformer.Unitransformer(_stack(True), input_vocab_size=V, output_vocab_size=V,
                                   autoregressive=True, name="decoder", **kw)
  return transformer.Bitransformer(enc, dec)


def _build(layout=None, mesh_shape=None, init_only=False):
  def build(mesh):
    inputs = mtf.import_tf_tensor(mesh, tf.constant(INPUTS), [batch, length])
    targets = mtf.import_tf_tensor(mesh, tf.constant(TARGETS), [batch, length])
    _, loss = _model(layout, mesh_shape).call_simple(inputs, targets, True, mode="eval")
    variables = mesh.graph.trainable_variables
    if init_only:
      return {v.name: v.outputs[0] for v in variables}
    grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
    out = {"loss": loss}
    out.update({"grad/" + v.name: g for v, g in zip(variables, grads)})
    return out
  return build


def test_initialisation_follows_fixup():
  values = lower_and_run(_build(init_only=True), "all:1", "")
  names = sorted(values)
  q = [n for n in names if n.endswith("SelfAttentionFixup/q_fixup")]
  o = [n for n in names if n.endswith("_fixup") and n.endswith("o_fixup")]
  assert len(q) == 2 and len(o) == 2, names
  for n in o:
    assert np.all(values[n] == 0)
  wo = [n for n in names if "DenseReluDenseFixup/wo" in n]
  wi = [n for n in names if "DenseReluDenseFixup/wi" in n]
  assert wo and wi and all(np.all(values[n] == 0) for n in wo)
  # wi: He uniform scaled by 1/num_blocks in variance: limit sqrt(6 / (D * L_blocks)).
  w = np.concatenate([values[n].ravel() for n in wi])
  limit = np.sqrt(6.0 / (D * NUM_BLOCKS))
  assert np.abs(w).max() <= limit and np.abs(w).max() > 0.8 * limit
  assert np.var(w) == pytest.approx(limit ** 2 / 3, rel=0.15)
  # q: Glorot uniform (fan_avg of d_model and heads*d_kv) scaled by L^(-1/3).
  w = np.concatenate([values[n].ravel() for n in q])
  limit = np.sqrt(3.0 * NUM_BLOCKS ** (-1 / 3) / ((D + H * KV) / 2))
  assert np.abs(w).max() <= limit and np.var(w) == pytest.approx(limit ** 2 / 3, rel=0.15)
  for name in ("fixup_bias", "shift"):
    found = [n for n in names if n.endswith("/" + name)]
    assert found and all(np.all(values[n] == 0) for n in found), name
  scales = [n for n in names if n.endswith("fixup_scale_weight")]
  assert scales and all(np.all(values[n] == 1) for n in scales)


@pytest.mark.parametrize("mesh_shape,layout", [
    ("rows:2;cols:2", "batch:rows;heads:cols;d_ff:cols"),
    ("rows:2;cols:2", "d_model:rows;vocab:cols;d_ff:cols"),
], ids=["batch_and_heads", "d_model"])
def test_loss_and_gradients_do_not_depend_on_the_layout(mesh_shape, layout, monkeypatch):
  # Zero-initialised projections would make most gradients zero: start them
  # random instead (the layers' computation is what is tested here).
  monkeypatch.setattr(mtf.initializers, "zeros",
                      lambda: mtf.initializers.random_normal(stddev=0.3))
  single = lower_and_run(_build(), "all:1", "")
  split = lower_and_run(_build(layout, mesh_shape), mesh_shape, layout)
  assert sorted(split) == sorted(single) and len(single) > 20
  nonzero = [k for k in single if k.startswith("grad/") and np.abs(single[k]).max() > 1e-6]
  assert len(nonzero) >= len(single) - 3, sorted(set(single) - set(nonzero))
  for key in single:
    np.testing.assert_allclose(split[key], single[key], rtol=2e-4, atol=2e-5, err_msg=key)


def test_gin_names_and_errors():
  gin_config.parse([], ["SelfAttentionFixup.num_blocks = 7",
                        "DenseReluDenseFixup.num_blocks = 7"])
  try:
    sa = gin_config.configurable("SelfAttentionFixup")()
    drd = gin.get_configurable("mesh_tensorflow.transformer.fixup_layers."
                               "DenseReluDenseFixup")()
    assert sa.num_blocks == 7 and drd.num_blocks == 7
  finally:
    gin.clear_config()
  with pytest.raises(ValueError, match="num_blocks must be a positive int"):
    fl.DenseReluDenseFixup()
  with pytest.raises(ValueError, match="default_init 'lecun' is not supported"):
    fl.DenseReluDenseFixup(num_blocks=2, default_init="lecun")
  mesh = mtf.Mesh(mtf.Graph(), "m")
  d, h, k = mtf.Dimension("d_model", 8), mtf.Dimension("heads", 2), mtf.Dimension("d_kv", 4)
  with pytest.raises(ValueError, match="fold_scaling_into_initializer"):
    fl.AttentionParamsFixup(mesh, d, d, d, k, k, [h], [h], mtf.VariableDType(),
                            fold_scaling_into_initializer=True, num_blocks=3)
  x = mtf.zeros(mesh, mtf.Shape([d]))
  assert fl.get_single_scalar_bias(x, "s").shape == mtf.Shape([mtf.Dimension("single_bias", 1)])
