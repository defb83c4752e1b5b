"""The original mtf.layers functions added for ported code: incremental
attention steps, local attention over spatial blocks (1D and 2D) and their
halo exchanges, memory-compressed attention, reversible residual blocks,
transposed convolutions over blocks, and the unit-scaling einsum.

Each is checked against NumPy / plain TensorFlow (or, for the incremental
steps, against the whole-sequence layer), under one device and two split
layouts (blocks, lengths, heads and caches split), which must also agree
with each other. All the layers live in one graph, so a layout costs one
lowering.
"""

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mtf_test_utils import DEVICES, lower_and_run

B, H, K, D = 2, 2, 2, 4
batch, heads = mtf.Dimension("batch", B), mtf.Dimension("heads", H)
d_kv, d_model = mtf.Dimension("d_kv", K), mtf.Dimension("d_model", D)
# 1D blocks: a sequence of 4 blocks of 2.
w_blocks, w = mtf.Dimension("w_blocks", 4), mtf.Dimension("w", 2)
# 2D blocks: an 8 x 6 image of 4 x 2 blocks of 2 x 3.
img_hb, img_wb = mtf.Dimension("img_hb", 4), mtf.Dimension("img_wb", 2)
img_h, img_w = mtf.Dimension("img_h", 2), mtf.Dimension("img_w", 3)
# Incremental decoding: 4 decoder positions, 3 encoder positions.
L, E = 4, 3
length, memory_length = mtf.Dimension("length", L), mtf.Dimension("memory_length", L)
enc_length = mtf.Dimension("enc_length", E)
# Local incremental: 6 positions, window 3.
LL, WINDOW = 6, 3
loc_length, window = mtf.Dimension("loc_length", LL), mtf.Dimension("window", WINDOW)
# Memory-compressed attention: 8 positions in groups of 2.
S, CF = 8, 2
seq = mtf.Dimension("seq", S)
# Reversible blocks.
rev_d = mtf.Dimension("rev_d", 4)
# Transposed convolutions: a 4 x 6 image in 2 x 2 blocks of 2 x 3, and a
# 4 x 2 x 2 volume in 2 depth blocks.
cb_h, c_h, cb_w, c_w = (mtf.Dimension("cb_h", 2), mtf.Dimension("c_h", 2),
                        mtf.Dimension("cb_w", 2), mtf.Dimension("c_w", 3))
c_in, c_out = mtf.Dimension("c_in", 2), mtf.Dimension("c_out", 3)
v_db, v_d, v_h, v_w = (mtf.Dimension("v_db", 2), mtf.Dimension("v_d", 2),
                       mtf.Dimension("v_h", 2), mtf.Dimension("v_w", 2))
# (filter, strides) of the 2D transposed convolutions, incl. a filter smaller
# than its stride and an odd one.
CONV2D_T = [((2, 2), (2, 2)), ((3, 4), (2, 2)), ((1, 3), (2, 1))]
CONV3D_T = [((2, 2, 2), (2, 2, 2)), ((3, 1, 2), (2, 1, 1))]

CONFIGS = {
    "single": ("all:1", ""),
    "2x2x2": ("a:2;b:2;c:2", ("w_blocks:a;heads:c;img_hb:a;img_wb:b;length:b;memory_length:a;"
                              "seq:b;cb_h:a;cb_w:b;v_db:a;rev_d:b")),
    "2x4": ("rows:2;cols:4", ("w_blocks:cols;heads:rows;img_hb:cols;memory_length:cols;"
                              "seq:cols;cb_h:rows;v_db:rows;rev_d:cols")),
}

_rng = np.random.RandomState(0)
X1 = _rng.randn(B, 4, 2, D).astype(np.float32)              # [batch, w_blocks, w, d]
X2 = _rng.randn(B, 4, 2, 2, 3, D).astype(np.float32)        # [batch, hb, wb, h, w, d]
XL = _rng.randn(B, L, D).astype(np.float32)
MEM = _rng.randn(B, E, D).astype(np.float32)
ENC_BIAS = np.where(_rng.rand(B, E) < 0.3, -1e9, 0.0).astype(np.float32)
ENC_BIAS[:, 0] = 0.0
XLOC = _rng.randn(B, LL, D).astype(np.float32)
XS = _rng.randn(B, S, D).astype(np.float32)
XR = _rng.randn(B, 4).astype(np.float32)
IMG = _rng.randn(B, 2, 2, 2, 3, 2).astype(np.float32)      # [batch, cb_h, c_h, cb_w, c_w, c_in]
VOL = _rng.randn(B, 2, 2, 2, 2, 2).astype(np.float32)      # [batch, v_db, v_d, v_h, v_w, c_in]
HALO_1D = np.arange(8, dtype=np.float32).reshape(4, 2) + 1   # [w_blocks, w]
HALO_2D = np.arange(48, dtype=np.float32).reshape(4, 2, 2, 3) + 1  # [hb, wb, h, w]


def _import(mesh, value, dims):
  return mtf.import_tf_tensor(mesh, tf.constant(value), mtf.Shape(dims))


def _rev_f(i, rate=0.0, named=True):
  def f(t):
    h = mtf.layers.dense(t, rev_d, reduced_dims=[rev_d], activation=mtf.tanh,
                         name=f"rev_f{i}" if named else None)
    return mtf.dropout(h, True, rate=rate) if rate else h
  return f


def _reversible(x, recompute, num_layers=2, rate=0.0, named=True):
  x1, b1, x2, b2 = x, None, x, None
  for i in range(num_layers):
    x1, b1, x2, b2 = mtf.layers.reversible_half_residual_and_swap(
        x1, b1, x2, b2, _rev_f(i, rate, named), recompute_grads=recompute)
  return (x1 + x2) * 0.5


def _build(mesh):
  """Every new layer on one graph: returns ({name: output}, {name: input})."""
  out = {}
  x1 = _import(mesh, X1, [batch, w_blocks, w, d_model])
  x2 = _import(mesh, X2, [batch, img_hb, img_wb, img_h, img_w, d_model])
  img = _import(mesh, IMG, [batch, cb_h, c_h, cb_w, c_w, c_in])
  vol = _import(mesh, VOL, [batch, v_db, v_d, v_h, v_w, c_in])
  xr = _import(mesh, XR, [batch, rev_d])
  inputs = {"x1": x1, "x2": x2, "img": img, "vol": vol, "xr": xr}

  # Halo exchanges alone.
  h1 = _import(mesh, HALO_1D, [w_blocks, w])
  out["halo1d"], out["halo1d_left"] = (
      mtf.layers.local_1d_halo_exchange(h1, h1 * 2.0, w_blocks, w, mask_right)[0]
      for mask_right in (False, True))
  out["halo1d_none"], out["halo1d_none_v"] = mtf.layers.local_1d_halo_exchange(
      h1, h1 * 2.0, None, w, True)
  h2 = _import(mesh, HALO_2D, [img_hb, img_wb, img_h, img_w])
  out["halo2d"], out["halo2d_left"] = (
      mtf.layers.local_2d_halo_exchange(h2, h2, img_hb, img_h, img_wb, img_w, mask_right)[0]
      for mask_right in (False, True))
  out["bias2d"] = mtf.layers.attention_bias_local_2d_block(
      mesh, img_h, img_w, mtf.Dimension("mh", 1), mtf.Dimension("mw", 1))

  # Local attention over spatial blocks.
  out["local1d"] = mtf.layers.local_self_attention_spatial_blocks(
      x1, d_kv, heads, name="local1d")
  out["local1d_causal"] = mtf.layers.local_self_attention_spatial_blocks(
      x1, d_kv, heads, memory_w_dim=w, mask_right=True, name="local1d_causal")
  out["local2d"] = mtf.layers.local_2d_self_attention_spatial_blocks(
      x2, d_kv, heads, memory_h_dim=img_hb, memory_w_dim=img_wb, name="local2d")
  out["local2d_causal"] = mtf.layers.local_2d_self_attention_spatial_blocks(
      x2, d_kv, heads, mask_right=True, name="local2d_causal")

  # Incremental self-attention against the whole-sequence layer.
  xl = _import(mesh, XL, [batch, length, d_model])
  pos = mtf.range(mesh, length, tf.int32)
  out["self_full"] = mtf.layers.multihead_attention(
      xl, None, mtf.layers.attention_mask_autoregressive(pos), d_kv, heads, name="self_att")
  k = v = mtf.zeros(mesh, [batch, heads, memory_length, d_kv])
  for t in range(L):
    step = t if t % 2 else mtf.constant(mesh, t, dtype=tf.int32)
    out[f"self_step{t}"], k, v = mtf.layers.multihead_self_attention_incremental(
        _import(mesh, XL[:, t], [batch, d_model]), k, v, step, tf.float32, tf.float32,
        name="self_att")
  out["self_k"], out["self_v"] = k, v

  # Incremental encoder-decoder attention.
  mem = _import(mesh, MEM, [batch, enc_length, d_model])
  enc_bias = _import(mesh, ENC_BIAS, [batch, enc_length])
  out["encdec_full"] = mtf.layers.multihead_attention(xl, mem, enc_bias, d_kv, heads,
                                                      name="encdec")
  with mtf.layers.layer_scope(mesh, "encdec", "encdec"):
    wq, wk, wv, wo = mtf.layers.multihead_attention_vars(mesh, heads, d_model, d_kv,
                                                         tf.float32, tf.float32, tf.float32)
  ek = mtf.einsum([mem, wk], output_shape=[batch, heads, enc_length, d_kv])
  ev = mtf.einsum([mem, wv], output_shape=[batch, heads, enc_length, d_kv])
  out["encdec_all"] = mtf.layers.multihead_encdec_attention_incremental(
      xl, wq, wo, ek, ev, enc_bias)
  out["encdec_step2"] = mtf.layers.multihead_encdec_attention_incremental(
      _import(mesh, XL[:, 2], [batch, d_model]), wq, wo, ek, ev, enc_bias)

  # Incremental local attention against masked_local_attention_1d.
  xloc = _import(mesh, XLOC, [batch, loc_length, d_model])
  out["local_inc_full"] = mtf.layers.masked_local_attention_1d(
      xloc, d_kv, heads, window_size=WINDOW, name="local_inc")
  k = v = mtf.zeros(mesh, [batch, heads, window, d_kv])
  for t in range(LL):
    out[f"local_inc_step{t}"], k, v = mtf.layers.masked_local_attention_1d_incremental(
        _import(mesh, XLOC[:, t], [batch, d_model]), k, v, t, name="local_inc")

  # Memory-compressed attention.
  xs = _import(mesh, XS, [batch, seq, d_model])
  out["compressed"] = mtf.layers.multihead_self_attention_memory_compressed(
      xs, False, CF, d_kv, heads, name="compressed")
  out["compressed_causal"] = mtf.layers.multihead_self_attention_memory_compressed(
      xs, True, CF, d_kv, heads, name="compressed_causal")

  # Reversible blocks (shared variables rev_f0, rev_f1).
  out["rev_recompute"] = _reversible(xr, True)
  out["rev_plain"] = _reversible(xr, False)

  # Transposed convolutions over blocks, and the whole-image layer.
  for i, (fs, st) in enumerate(CONV2D_T):
    out[f"conv2d_t{i}"] = mtf.layers.conv2d_transpose_with_blocks(
        img, c_out, fs, st, "SAME", h_blocks_dim=cb_h, w_blocks_dim=cb_w, name=f"ct{i}")
  h_only = mtf.reshape(img, [batch, cb_h, c_h, mtf.Dimension("iw", 6), c_in])
  out["conv2d_t_h_only"] = mtf.layers.conv2d_transpose_with_blocks(
      h_only, c_out, (3, 3), (2, 2), h_blocks_dim=cb_h, name="ct_h")
  whole = mtf.reshape(img, [batch, mtf.Dimension("ih", 4), mtf.Dimension("iw", 6), c_in])
  out["conv2d_t_whole"] = mtf.layers.conv2d_transpose_with_blocks(
      whole, c_out, (3, 4), (2, 2), name="ct1")
  for i, (fs, st) in enumerate(CONV3D_T):
    out[f"conv3d_t{i}"] = mtf.layers.conv3d_transpose_with_blocks(
        vol, c_out, fs, st, "SAME", v_db, name=f"ct3_{i}")
  return out, inputs


_GRAD_OUTPUTS = ["local1d", "local1d_causal", "local2d", "local2d_causal", "compressed_causal",
                 "conv2d_t1", "conv3d_t1"]


def _run(mesh_shape, layout):
  size = mtf.convert_to_shape(mesh_shape).size
  impl = mtf.placement_mesh_impl.PlacementMeshImpl(mesh_shape, layout, DEVICES[:size])

  @tf.function(autograph=False)
  def run():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    out, inputs = _build(mesh)
    variables = {v.name: v.outputs[0] for v in graph.trainable_variables}
    rev_vars = [t for n, t in variables.items() if n.startswith("rev_f")]
    wrt = [inputs["xr"]] + rev_vars
    grads = {}
    for kind in ("recompute", "plain"):
      loss = mtf.reduce_sum(out[f"rev_{kind}"] * out[f"rev_{kind}"])
      grads[kind] = mtf.gradients([loss], wrt)
    # Gradients through the halo exchanges, for layout invariance.
    loss = mtf.add_n([mtf.reduce_sum(mtf.square(out[k])) for k in _GRAD_OUTPUTS])
    names = ["x1", "x2", "img", "vol"]
    spatial_grads = mtf.gradients([loss], [inputs[n] for n in names])
    lowering = mtf.Lowering(graph, {mesh: impl})
    result = {f"out/{k}": lowering.export_to_tf_tensor(t) for k, t in out.items()}
    result.update({f"var/{k}": lowering.export_to_tf_tensor(t) for k, t in variables.items()})
    for kind, gs in grads.items():
      result.update({f"grad_{kind}/{i}": lowering.export_to_tf_tensor(g)
                     for i, g in enumerate(gs)})
    result.update({f"grad/{n}": lowering.export_to_tf_tensor(g)
                   for n, g in zip(names, spatial_grads)})
    return result
  return {k: v.numpy() for k, v in run().items()}


@pytest.fixture(scope="module")
def runs():
  return {cid: _run(*config) for cid, config in CONFIGS.items()}


# ---------------------------------------------------------------- NumPy references
def _attention(xq, xm, qkvo, visible, extra_logit=False):
  """Multi-head attention [b, p, d] x [b, m, d] -> [b, p, d]; visible [p, m]
  or [b, p, m] (bool)."""
  q = np.einsum("bpd,hdk->bhpk", xq, qkvo[0])
  k = np.einsum("bmd,hdk->bhmk", xm, qkvo[1])
  v = np.einsum("bmd,hdk->bhmk", xm, qkvo[2])
  visible = np.broadcast_to(visible, (xq.shape[0],) + visible.shape[-2:])[:, None]
  logits = np.where(visible, np.einsum("bhpk,bhmk->bhpm", q, k), -np.inf)
  top = np.maximum(logits.max(-1, keepdims=True), 0.0 if extra_logit else -np.inf)
  e = np.exp(logits - top)
  norm = e.sum(-1, keepdims=True) + (np.exp(-top) if extra_logit else 0.0)
  o = np.einsum("bhpm,bhmk->bhpk", e / norm, v)
  return np.einsum("bhpk,hdk->bpd", o, qkvo[3])


def _qkvo(values, scope):
  return values[f"var/{scope}/qkvo"].astype(np.float64)


def _close(actual, expected, msg, rtol=2e-4, atol=2e-5):
  np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol, err_msg=msg)


@pytest.mark.xdist_group("test_layers_original_extra_runs")  # shares the module's `runs` fixture
@pytest.mark.parametrize("config", list(CONFIGS))
def test_halo_exchanges_and_2d_bias(runs, config):
  values = runs[config]
  flat = HALO_1D.reshape(-1)
  padded = np.concatenate([np.zeros(2), flat, np.zeros(2)])
  want = np.stack([padded[b * 2:b * 2 + 6] for b in range(4)])
  _close(values["out/halo1d"], want, "halo1d")
  _close(values["out/halo1d_left"], want[:, :4], "halo1d_left")
  _close(values["out/halo1d_none"], np.concatenate([np.zeros((4, 2)), HALO_1D], 1), "none")
  _close(values["out/halo1d_none_v"], 2 * np.concatenate([np.zeros((4, 2)), HALO_1D], 1),
         "none_v")
  image = HALO_2D.transpose(0, 2, 1, 3).reshape(8, 6)
  padded = np.pad(image, [(2, 2), (3, 3)])
  want = np.array([[padded[bh * 2:bh * 2 + 6, bw * 3:bw * 3 + 9] for bw in range(2)]
                   for bh in range(4)])
  _close(values["out/halo2d"], want, "halo2d")
  _close(values["out/halo2d_left"], want[:, :, :4, :6], "halo2d_left")
  qh, qw, mh, mw = np.meshgrid(range(2), range(3), range(4), range(6), indexing="ij")
  later = (mh - 2 > qh) | ((mh - 2 == qh) & (mw - 3 > qw))
  assert values["out/bias2d"].shape == (2, 3, 4, 6)
  assert values["out/bias2d"].dtype == np.float32
  _close(values["out/bias2d"], np.where(later, -1e9, 0.0), "bias2d")


@pytest.mark.xdist_group("test_layers_original_extra_runs")  # shares the module's `runs` fixture
@pytest.mark.parametrize("config", list(CONFIGS))
def test_local_attention_spatial_blocks_match_brute_force(runs, config):
  values = runs[config]
  # 1D: position p = block * 2 + i.
  p = np.arange(8)
  near = np.abs(p[:, None] // 2 - p[None, :] // 2) <= 1
  causal = (p[None, :] <= p[:, None]) & (p[:, None] // 2 - p[None, :] // 2 <= 1)
  x = X1.reshape(B, 8, D).astype(np.float64)
  for key, visible in (("local1d", near), ("local1d_causal", causal)):
    want = _attention(x, x, _qkvo(values, key), visible).reshape(X1.shape)
    _close(values[f"out/{key}"], want, f"{config} {key}")
  # 2D: pixel (r, c) = (hb * 2 + i, wb * 3 + j), flattened r * 6 + c.
  r, c = np.meshgrid(range(8), range(6), indexing="ij")
  r, c = r.reshape(-1), c.reshape(-1)
  dr = r[:, None] // 2 - r[None, :] // 2   # query block - memory block
  dc = c[:, None] // 3 - c[None, :] // 3
  near = (np.abs(dr) <= 1) & (np.abs(dc) <= 1)
  raster = (r[None, :] < r[:, None]) | ((r[None, :] == r[:, None]) & (c[None, :] <= c[:, None]))
  causal = (dr >= 0) & (dr <= 1) & (dc >= 0) & (dc <= 1) & raster
  image = X2.transpose(0, 1, 3, 2, 4, 5).reshape(B, 48, D).astype(np.float64)
  for key, visible in (("local2d", near), ("local2d_causal", causal)):
    got = _attention(image, image, _qkvo(values, key), visible)
    want = got.reshape(B, 4, 2, 2, 3, D).transpose(0, 1, 3, 2, 4, 5)
    _close(values[f"out/{key}"], want, f"{config} {key}")


@pytest.mark.xdist_group("test_layers_original_extra_runs")  # shares the module's `runs` fixture
@pytest.mark.parametrize("config", list(CONFIGS))
def test_incremental_steps_equal_whole_sequence_layers(runs, config):
  values = runs[config]
  full = values["out/self_full"]
  for t in range(L):
    _close(values[f"out/self_step{t}"], full[:, t], f"{config} self step {t}")
  qkvo = _qkvo(values, "self_att")
  _close(values["out/self_k"], np.einsum("bld,hdk->bhlk", XL, qkvo[1]), "k cache")
  _close(values["out/self_v"], np.einsum("bld,hdk->bhlk", XL, qkvo[2]), "v cache")
  ar = np.tril(np.ones((L, L), bool))
  _close(full, _attention(XL.astype(np.float64), XL, qkvo, ar), "self reference")
  enc = values["out/encdec_full"]
  _close(values["out/encdec_all"], enc, "encdec all")
  _close(values["out/encdec_step2"], enc[:, 2], "encdec step")
  visible = np.broadcast_to((ENC_BIAS == 0)[:, None, :], (B, L, E))
  _close(enc, _attention(XL.astype(np.float64), MEM, _qkvo(values, "encdec"), visible),
         "encdec reference")
  local = values["out/local_inc_full"]
  for t in range(LL):
    _close(values[f"out/local_inc_step{t}"], local[:, t], f"{config} local step {t}")
  q, m = np.arange(LL)[:, None], np.arange(LL)[None, :]
  _close(local, _attention(XLOC.astype(np.float64), XLOC, _qkvo(values, "local_inc"),
                           (q - m >= 0) & (q - m < WINDOW)), "local reference")


@pytest.mark.xdist_group("test_layers_original_extra_runs")  # shares the module's `runs` fixture
@pytest.mark.parametrize("config", list(CONFIGS))
def test_memory_compressed_attention_matches_numpy(runs, config):
  values = runs[config]
  x = XS.astype(np.float64)
  memory = x.reshape(B, S // CF, CF, D).mean(2)
  group_end = np.arange(S // CF) * CF + CF - 1
  for key, visible in (("compressed", np.ones((S, S // CF), bool)),
                       ("compressed_causal", group_end[None, :] <= np.arange(S)[:, None])):
    want = _attention(x, memory, _qkvo(values, key), visible, extra_logit=True)
    _close(values[f"out/{key}"], want, f"{config} {key}")


@pytest.mark.xdist_group("test_layers_original_extra_runs")  # shares the module's `runs` fixture
@pytest.mark.parametrize("config", list(CONFIGS))
def test_reversible_gradient_equals_plain_backpropagation(runs, config):
  values = runs[config]
  _close(values["out/rev_recompute"], values["out/rev_plain"], "forward")
  grads = sorted(k for k in values if k.startswith("grad_plain/"))
  assert len(grads) == 1 + 4   # x and two dense layers' kernel and bias
  for key in grads:
    _close(values[key.replace("plain", "recompute")], values[key], f"{config} {key}")
  # And the forward against NumPy.
  x1 = x2 = XR.astype(np.float64)
  for i in range(2):
    f = np.tanh(x2 @ values[f"var/rev_f{i}/kernel"] + values[f"var/rev_f{i}/bias"])
    x1, x2 = x2, x1 + f
  _close(values["out/rev_plain"], (x1 + x2) / 2, "reversible reference")


@pytest.mark.xdist_group("test_layers_original_extra_runs")  # shares the module's `runs` fixture
@pytest.mark.parametrize("config", list(CONFIGS))
def test_transposed_convolutions_over_blocks_match_tensorflow(runs, config):
  values = runs[config]
  image = IMG.reshape(B, 4, 6, 2)   # [b, cb_h * c_h, cb_w * c_w, c]

  def to_image(y):   # [b, cb_h, h', cb_w, w', c] -> [b, H', W', c]
    b, nh, h, nw, ww, c = y.shape
    return y.reshape(b, nh * h, nw * ww, c)

  for i, (_, st) in enumerate(CONV2D_T):
    kernel = values[f"var/ct{i}/kernel"]
    want = tf.nn.conv2d_transpose(image, kernel, [B, 4 * st[0], 6 * st[1], 3], st,
                                  "SAME").numpy()
    _close(to_image(values[f"out/conv2d_t{i}"]), want, f"{config} conv2d_t{i}")
  want = tf.nn.conv2d_transpose(image, values["var/ct_h/kernel"], [B, 8, 12, 3], 2,
                                "SAME").numpy()
  _close(values["out/conv2d_t_h_only"].reshape(want.shape), want, "h blocks only")
  _close(values["out/conv2d_t_whole"], to_image(values["out/conv2d_t1"]), "unblocked layer")
  volume = VOL.reshape(B, 4, 2, 2, 2)
  for i, (_, st) in enumerate(CONV3D_T):
    want = tf.nn.conv3d_transpose(volume, values[f"var/ct3_{i}/kernel"],
                                  [B, 4 * st[0], 2 * st[1], 2 * st[2], 3], st, "SAME").numpy()
    got = values[f"out/conv3d_t{i}"]
    _close(got.reshape(want.shape), want, f"{config} conv3d_t{i}")


@pytest.mark.xdist_group("test_layers_original_extra_runs")  # shares the module's `runs` fixture
def test_results_and_gradients_are_layout_invariant(runs):
  base = runs["single"]
  for cid in list(CONFIGS)[1:]:
    values = runs[cid]
    assert sorted(values) == sorted(base)
    for key in base:
      if key.startswith("var/"):
        np.testing.assert_array_equal(values[key], base[key], err_msg=f"{cid} {key}")
      else:
        _close(values[key], base[key], f"{cid} {key}", rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------- smaller checks
def test_reversible_recomputation_replays_dropout_and_layer_names():
  """With dropout and default-named layers inside f, the recomputed f finds
  the same variables and masks: gradients equal plain backpropagation's."""

  def build(recompute):
    def builder(mesh):
      xr = _import(mesh, XR, [batch, rev_d])
      y = _reversible(xr, recompute, num_layers=2, rate=0.5, named=False)
      graph = mesh.graph
      variables = [v.outputs[0] for v in graph.trainable_variables]
      grads = mtf.gradients([mtf.reduce_sum(y * y)], [xr] + variables)
      assert len(graph.trainable_variables) == 4
      return dict({"y": y}, **{f"g{i}": g for i, g in enumerate(grads)})
    return lower_and_run(builder, "all:1", "", mode="eager")
  plain, recompute = build(False), build(True)
  assert sorted(plain) == sorted(recompute)
  for key in plain:
    _close(recompute[key], plain[key], key)


def test_us_einsum_follows_the_unit_scaling_convention():
  a, b, c = mtf.Dimension("a", 2), mtf.Dimension("b", 3), mtf.Dimension("c", 4)
  xa = np.arange(6, dtype=np.float32).reshape(2, 3)
  wa = np.arange(12, dtype=np.float32).reshape(3, 4) / 7.0
  assert mtf.layers.unit_scaling_convention() is False
  with gin.unlock_config():   # scoped: nothing outside "us_test_scope" changes
    gin.bind_parameter("us_test_scope/unit_scaling_convention.value", True)

  def builder(mesh):
    x, wt = _import(mesh, xa, [a, b]), _import(mesh, wa, [b, c])
    out = {"off": mtf.layers.us_einsum([x, wt], [a, c])}
    with gin.config_scope("us_test_scope"):
      assert mtf.layers.unit_scaling_convention() is True
      out["on"] = mtf.layers.us_einsum([x, wt], output_shape=[a, c])
      out["on_sum_all"] = mtf.layers.us_einsum([x, wt], output_shape=[])
    return out
  values = lower_and_run(builder, "all:1", "", mode="eager")
  _close(values["off"], xa @ wa, "off")
  _close(values["on"], xa @ wa / np.sqrt(3), "on")
  _close(values["on_sum_all"], (xa @ wa).sum() / np.sqrt(24), "all dims summed")


def test_dense_and_its_initializer_follow_the_unit_scaling_convention():
  """Under the convention dense's kernel has unit scale (fan_in ignored) and
  its product is divided by sqrt(fan_in): the output's scale is unchanged."""
  d_in, d_out = mtf.Dimension("d_in", 256), mtf.Dimension("d_out", 64)
  init = mtf.layers.VarianceScalingInitializer(scale=2.0)
  assert init.stddev([256, 64]) == pytest.approx(np.sqrt(2.0 / 256))
  with gin.unlock_config():
    gin.bind_parameter("us_dense_scope/unit_scaling_convention.value", True)

  def builder(mesh):
    x = mtf.ones(mesh, [batch, d_in])
    assert init.stddev([256, 64]) == pytest.approx(np.sqrt(2.0))
    with pytest.raises(ValueError, match="mode 'fan_avg' does not work"):
      mtf.layers.VarianceScalingInitializer(mode="fan_avg").stddev([256, 64])
    y = mtf.layers.dense(x, d_out, reduced_dims=[d_in], use_bias=False,
                         kernel_initializer=mtf.layers.VarianceScalingInitializer(),
                         name="us_dense")
    kernel = mesh.graph.all_variables[-1].outputs[0]
    return {"y": y, "kernel": kernel}
  # Variables take their values when lowered: the convention must hold then too.
  with gin.config_scope("us_dense_scope"):
    values = lower_and_run(builder, "all:1", "", mode="eager")
  assert 0.8 < values["kernel"].std() < 1.2   # unit scale, not 1/sqrt(256)
  _close(values["y"], np.ones((batch.size, 256)) @ values["kernel"] / 16.0, "dense")


def test_bad_inputs_raise_value_errors():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x1 = mtf.zeros(mesh, [batch, w_blocks, w, d_model])
  with pytest.raises(ValueError, match="at least 3 dimensions"):
    mtf.layers.local_self_attention_spatial_blocks(mtf.zeros(mesh, [w, d_model]), d_kv, heads)
  with pytest.raises(ValueError, match="at least 5 dimensions"):
    mtf.layers.local_2d_self_attention_spatial_blocks(x1, d_kv, heads)
  with pytest.raises(ValueError, match="no dimension 'img_h'"):
    mtf.layers.local_1d_halo_exchange(x1, x1, w_blocks, img_h, False)
  x = mtf.zeros(mesh, [batch, d_model])
  cache = mtf.zeros(mesh, [heads, memory_length, d_kv])
  with pytest.raises(ValueError, match="batch dimensions"):
    mtf.layers.multihead_self_attention_incremental(x, cache, cache, 0, tf.float32, tf.float32)
  cache = mtf.zeros(mesh, [batch, heads, window, d_kv])
  with pytest.raises(ValueError, match="one shape"):
    mtf.layers.masked_local_attention_1d_incremental(
        x, cache, mtf.zeros(mesh, [batch, heads, memory_length, d_kv]), 0)
  with pytest.raises(ValueError, match="integer dtype"):
    mtf.layers.masked_local_attention_1d_incremental(
        x, cache, cache, mtf.constant(mesh, 1.0, dtype=tf.float32))
  with pytest.raises(ValueError, match="wq"):
    mtf.layers.multihead_encdec_attention_incremental(
        x, mtf.zeros(mesh, [heads, d_model, w]), mtf.zeros(mesh, [heads, d_model, d_kv]),
        cache, cache, None)
  with pytest.raises(ValueError, match="compression_factor 3"):
    mtf.layers.multihead_self_attention_memory_compressed(
        mtf.zeros(mesh, [batch, seq, d_model]), True, 3, d_kv, heads)
  with pytest.raises(ValueError, match="one shape and dtype"):
    mtf.layers.reversible_half_residual_and_swap(x, None, mtf.zeros(mesh, [batch, rev_d]),
                                                 None, lambda t: t)
  with pytest.raises(ValueError, match="f must return"):
    mtf.layers.reversible_half_residual_and_swap(x, None, x, None,
                                                 lambda t: mtf.reduce_sum(t, reduced_dim=batch))
  img = mtf.zeros(mesh, [batch, cb_h, c_h, cb_w, c_w, c_in])
  with pytest.raises(ValueError, match="padding='SAME'"):
    mtf.layers.conv2d_transpose_with_blocks(img, c_out, padding="VALID", h_blocks_dim=cb_h)


def test_split_blocks_only_exchange_neighbours():
  """With the blocks dimensions split, the halos travel as permutes between
  neighbouring processors (one per direction for k and for v), nothing else."""

  def build(mesh):
    x1 = _import(mesh, X1, [batch, w_blocks, w, d_model])
    x2 = _import(mesh, X2, [batch, img_hb, img_wb, img_h, img_w, d_model])
    return {"local1d_causal": mtf.layers.local_self_attention_spatial_blocks(
                x1, d_kv, heads, mask_right=True),
            "local2d": mtf.layers.local_2d_self_attention_spatial_blocks(x2, d_kv, heads)}
  got, lowering = lower_and_run(build, "all:4", "w_blocks:all;img_hb:all", mode="eager",
                                return_lowering=True)
  assert [r.kind for r in lowering.collective_records] == ["permute"] * (2 + 4)
  single = lower_and_run(build, "all:1", "", mode="eager")
  for key in got:
    _close(got[key], single[key], key, rtol=1e-5, atol=1e-6)
