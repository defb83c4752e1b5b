"""mtf.layers: every layer's values and gradients (w.r.t. its inputs and its
variables) match a float64 TensorFlow reference written independently here,
under a single device and four layouts; attention masks, label smoothing and
z-loss against NumPy; initializers' statistics and layout invariance.

One graph holds all the layers, so each layout costs a single lowering.
"""

import math

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mtf_test_utils import DEVICES

B, L, D, H, K, F, V = 4, 8, 8, 4, 2, 8, 8
batch, length, d_model = mtf.Dimension("batch", B), mtf.Dimension("length", L), mtf.Dimension(
    "d_model", D)
heads, d_kv, d_ff = mtf.Dimension("heads", H), mtf.Dimension("d_kv", K), mtf.Dimension("d_ff", F)
vocab, memory_length = mtf.Dimension("vocab", V), mtf.Dimension("memory_length", L)

# (mesh shape, layout, length per processor).
CONFIGS = [
    ("all:1", "", L),
    ("all:8", "length:all", 1),
    ("rows:2;cols:4", "batch:rows;heads:cols;d_ff:cols;vocab:cols", L),
    ("a:2;b:2;c:2", "batch:a;d_model:b;length:c", L // 2),
    ("rows:2;cols:4", "length:cols;memory_length:rows;vocab:rows", L // 4),
]
CONFIG_IDS = ["single", "length_split", "data_model_2x4", "2x2x2", "query_and_memory_split"]
WINDOWS = (3, 7)
LABEL_SMOOTHING, Z_LOSS = 0.1, 1e-2

_rng = np.random.RandomState(0)
X = _rng.randn(B, L, D).astype(np.float32)
MEM = _rng.randn(B, L, D).astype(np.float32)
IDS = _rng.randint(1, V, size=(B, L)).astype(np.int32)
IDS[1, 5:] = 0   # padding at the end of two examples
IDS[3, 2:] = 0
MEM_IDS = _rng.randint(1, V, size=(B, L)).astype(np.int32)
MEM_IDS[0, 6:] = 0
MEM_IDS[2, 1:] = 0
SEGMENTS = np.array([[1] * 3 + [2] * 4 + [3], [1] * 8, [1] * 4 + [2] * 4, [1, 2] * 4],
                    np.int32)
SOFT_LOGITS = _rng.randn(B, L, V).astype(np.float32)
BINARY = _rng.uniform(size=(B, L, F)).astype(np.float32)


def _import(mesh, value, shape):
  return mtf.import_tf_tensor(mesh, tf.constant(value), shape)


def _build(mesh, length_per_split):
  """All the layers on one graph; returns {name: output} and the inputs."""
  x = _import(mesh, X, [batch, length, d_model])
  mem = _import(mesh, MEM, [batch, memory_length, d_model])
  ids = _import(mesh, IDS, [batch, length])
  mem_ids = _import(mesh, MEM_IDS, [batch, memory_length])
  segments = _import(mesh, SEGMENTS, [batch, length])
  pos = mtf.range(mesh, length, tf.int32)
  out = {}
  out["dense"] = mtf.layers.dense(x, d_ff, reduced_dims=[d_model], activation=mtf.tanh)
  out["dense_same_dim"] = mtf.layers.dense(x, d_model, reduced_dims=[d_model], use_bias=False)
  out["dense_multi"] = mtf.layers.dense(x, output_dim=[heads, d_kv], reduced_dims=[d_model])
  out["dense_expert"] = mtf.layers.dense(x, [d_ff], reduced_dims=[d_model],
                                         expert_dims=[length], activation="sigmoid")
  out["glu"] = mtf.layers.dense_product(x, [d_model], [d_ff], ["linear", "sigmoid"])
  out["drd"] = mtf.layers.dense_relu_dense(x, d_ff)
  out["layer_norm"] = mtf.layers.layer_norm(x, d_model)
  out["rms_norm"] = mtf.layers.rms_norm(x, d_model)
  out["batch_norm"], _ = mtf.layers.batch_norm(x, True, dims_idx_start=0, dims_idx_end=2)
  out["embedding"] = mtf.layers.embedding(ids, vocab, d_model, mtf.VariableDType())
  ar = mtf.layers.attention_mask_autoregressive(pos)
  same = mtf.layers.attention_mask_same_segment(segments)
  pad = mtf.layers.attention_mask_ignore_padding(mem_ids)
  out["mask_ar"], out["mask_same"], out["mask_pad"] = ar, same, pad
  out["self_attention"] = mtf.layers.multihead_attention(x, None, ar + same, d_kv, heads)
  out["encdec_attention"] = mtf.layers.multihead_attention(x, mem, pad, d_kv, heads)
  for w in WINDOWS:
    out[f"local_{w}"] = mtf.layers.masked_local_attention_1d(
        x, d_kv, heads, window_size=w, length_per_split=length_per_split)
  out["dot_extra_logit"] = mtf.layers.dot_product_attention(
      x, mem, mem, mask=None, extra_logit=0.0)
  logits = mtf.layers.dense(x, vocab, reduced_dims=[d_model], name="logits")
  out["xent"] = mtf.layers.softmax_cross_entropy_with_logits(
      logits, ids, vocab, z_loss=Z_LOSS, label_smoothing=LABEL_SMOOTHING)
  soft = mtf.softmax(_import(mesh, SOFT_LOGITS, [batch, length, vocab]), vocab)
  out["xent_soft"] = mtf.layers.softmax_cross_entropy_with_logits(logits, soft, vocab)
  out["sigmoid_xent"] = mtf.layers.sigmoid_cross_entropy_with_logits(
      out["dense"], _import(mesh, BINARY, [batch, length, d_ff]))
  out["weights_nonzero"] = mtf.layers.weights_nonzero(ids)
  return out, {"x": x, "mem": mem}


COTANGENT_SEED = 1


def _cotangents(shapes):
  rng = np.random.RandomState(COTANGENT_SEED)
  return {k: rng.randn(*s).astype(np.float32) for k, s in sorted(shapes.items())}


def _differentiable(out):
  return {k: t for k, t in out.items()
          if t.dtype.is_floating and not k.startswith("mask") and k != "weights_nonzero"}


def _run(mesh_shape, layout, length_per_split):
  """Values of all outputs, variables and gradients under one layout."""
  size = mtf.convert_to_shape(mesh_shape).size
  impl = mtf.placement_mesh_impl.PlacementMeshImpl(mesh_shape, layout, DEVICES[:size])
  probe_graph = mtf.Graph()
  probe, _ = _build(mtf.Mesh(probe_graph, "mesh"), length_per_split)
  cot = _cotangents({k: t.shape.to_integer_list() for k, t in _differentiable(probe).items()})

  @tf.function(autograph=False)
  def run():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    out, inputs = _build(mesh, length_per_split)
    loss = mtf.add_n([mtf.reduce_sum(t * _import(mesh, cot[k], t.shape))
                      for k, t in sorted(_differentiable(out).items())])
    variables = {v.name: v.outputs[0] for v in graph.trainable_variables}
    wrt = dict(inputs, **variables)
    grads = mtf.gradients([loss], list(wrt.values()))
    lowering = mtf.Lowering(graph, {mesh: impl})
    result = {f"out/{k}": lowering.export_to_tf_tensor(t) for k, t in out.items()}
    result.update({f"var/{k}": lowering.export_to_tf_tensor(t) for k, t in variables.items()})
    result.update({f"grad/{k}": lowering.export_to_tf_tensor(g)
                   for k, g in zip(wrt, grads) if g is not None})
    return result
  return {k: v.numpy() for k, v in run().items()}, cot


# ---------------------------------------------------------------- reference
def _softmax(logits, axis=-1):
  return tf.nn.softmax(logits, axis=axis)


def _attention(xq, xm, qkvo, mask):
  """[b, l, d] x [b, m, d] -> [b, l, d]; qkvo [4, h, d, k]; mask [b, l, m]."""
  q = tf.einsum("bld,hdk->bhlk", xq, qkvo[0])
  k = tf.einsum("bmd,hdk->bhmk", xm, qkvo[1])
  v = tf.einsum("bmd,hdk->bhmk", xm, qkvo[2])
  logits = tf.einsum("bhlk,bhmk->bhlm", q, k) + mask[:, None]
  o = tf.einsum("bhlm,bhmk->bhlk", _softmax(logits), v)
  return tf.einsum("bhlk,hdk->bld", o, qkvo[3])


def _norm(x, axes, eps):
  mean = tf.reduce_mean(x, axes, keepdims=True)
  var = tf.reduce_mean(tf.square(x - mean), axes, keepdims=True)
  return (x - mean) / tf.sqrt(var + eps)


def _masks():
  """NumPy attention masks: autoregressive [l, m], same segment [b, l, m],
  memory padding [b, m], and the local windows [l, m]."""
  q = np.arange(L)[:, None]
  m = np.arange(L)[None, :]
  ar = np.where(q < m, -1e9, 0.0)
  same = np.where(SEGMENTS[:, :, None] != SEGMENTS[:, None, :], -1e9, 0.0)
  pad = np.where(MEM_IDS == 0, -1e9, 0.0)
  local = {w: np.where((q - m >= 0) & (q - m < w), 0.0, -1e9) for w in WINDOWS}
  return ar, same, pad, local


def _reference(values, cot):
  """float64 reference outputs and gradients from the variables of a run."""
  var = {k[4:]: tf.constant(v, tf.float64) for k, v in values.items() if k.startswith("var/")}
  x, mem = tf.constant(X, tf.float64), tf.constant(MEM, tf.float64)
  ar, same, pad, local = _masks()
  with tf.GradientTape() as tape:
    tape.watch([x, mem] + list(var.values()))
    out = {}
    out["dense"] = tf.tanh(tf.einsum("bld,df->blf", x, var["dense/kernel"]) + var["dense/bias"])
    out["dense_same_dim"] = tf.einsum("bld,de->ble", x, var["dense_1/kernel"])
    out["dense_multi"] = tf.einsum("bld,dhk->blhk", x, var["dense_2/kernel"]) + var[
        "dense_2/bias"]
    out["dense_expert"] = tf.sigmoid(tf.einsum("bld,ldf->blf", x, var["dense_3/kernel"])
                                     + var["dense_3/bias"])
    # The original's names: one variable scope per factor, "<name>_<i>".
    lin = tf.einsum("bld,df->blf", x, var["dense_product_0/kernel"]) + var[
        "dense_product_0/bias"]
    gate = tf.einsum("bld,df->blf", x, var["dense_product_1/kernel"]) + var[
        "dense_product_1/bias"]
    out["glu"] = lin * tf.sigmoid(gate)
    h = tf.nn.relu(tf.einsum("bld,df->blf", x, var["dense_relu_dense/wi/kernel"]))
    out["drd"] = tf.einsum("blf,fd->bld", h, var["dense_relu_dense/wo/kernel"])
    ln = "layer_prepostprocess/layer_norm/layer_norm_"
    out["layer_norm"] = _norm(x, [2], 1e-6) * var[ln + "scale"] + var[ln + "bias"]
    out["rms_norm"] = x / tf.sqrt(tf.reduce_mean(x * x, 2, keepdims=True) + 1e-6) * var[
        "rms_norm/scale"]
    out["batch_norm"] = _norm(x, [0, 1], 1e-9) * var["batch_norm/batch_norm_scale"] + var[
        "batch_norm/batch_norm_bias"]
    out["embedding"] = tf.gather(var["embedding"], IDS)
    self_mask = tf.constant(ar[None] + same)
    out["self_attention"] = _attention(x, x, var["multihead_attention/qkvo"], self_mask)
    pad_mask = tf.constant(np.broadcast_to(pad[:, None, :], (B, L, L)))
    out["encdec_attention"] = _attention(x, mem, var["multihead_attention_1/qkvo"], pad_mask)
    for i, w in enumerate(WINDOWS):
      scope = "masked_local_attention_1d" + (f"_{i}" if i else "")
      out[f"local_{w}"] = _attention(x, x, var[scope + "/qkvo"],
                                     tf.constant(np.broadcast_to(local[w], (B, L, L))))
    dots = tf.einsum("bld,bmd->blm", x, mem)
    norm = tf.reduce_logsumexp(tf.concat([dots, tf.zeros([B, L, 1], tf.float64)], 2), 2)
    out["dot_extra_logit"] = tf.einsum("blm,bmd->bld", tf.exp(dots - norm[..., None]), mem)
    logits = tf.einsum("bld,dv->blv", x, var["logits/kernel"]) + var["logits/bias"]
    log_z = tf.reduce_logsumexp(logits, 2)
    targets = tf.one_hot(IDS, V, dtype=tf.float64) * (1 - LABEL_SMOOTHING) + LABEL_SMOOTHING / V
    out["xent"] = -tf.reduce_sum(targets * (logits - log_z[..., None]), 2) + Z_LOSS * log_z ** 2
    soft = tf.nn.softmax(tf.constant(SOFT_LOGITS, tf.float64), 2)
    out["xent_soft"] = -tf.reduce_sum(soft * tf.nn.log_softmax(logits, 2), 2)
    z = tf.constant(BINARY, tf.float64)
    out["sigmoid_xent"] = tf.nn.sigmoid_cross_entropy_with_logits(labels=z, logits=out["dense"])
    loss = tf.add_n([tf.reduce_sum(out[k] * tf.constant(c, tf.float64)) for k, c in cot.items()])
  sources = dict({"x": x, "mem": mem}, **var)
  grads = tape.gradient(loss, list(sources.values()))
  result = {f"out/{k}": v.numpy() for k, v in out.items()}
  result.update({f"grad/{k}": tf.convert_to_tensor(g).numpy()
                 for k, g in zip(sources, grads) if g is not None})
  result["out/mask_ar"], result["out/mask_same"], result["out/mask_pad"] = ar, same, pad
  result["out/weights_nonzero"] = (IDS != 0).astype(np.float32)
  return result


@pytest.fixture(scope="module")
def runs():
  return {cid: _run(*config) for cid, config in zip(CONFIG_IDS, CONFIGS)}


@pytest.mark.xdist_group("test_layers_runs")  # shares the module's `runs` fixture
@pytest.mark.parametrize("config", CONFIG_IDS)
def test_layers_match_reference(runs, config):
  values, cot = runs[config]
  want = _reference(values, cot)
  missing = sorted(set(want) - set(values))
  assert not missing, missing
  for key in sorted(want):
    np.testing.assert_allclose(values[key], want[key], rtol=2e-4, atol=2e-5, err_msg=key)
  # Every trainable variable got a gradient that was checked.
  for key in values:
    if key.startswith("var/"):
      assert "grad/" + key[4:] in want, key


@pytest.mark.xdist_group("test_layers_runs")  # shares the module's `runs` fixture
def test_variables_and_results_are_layout_invariant(runs):
  base, _ = runs[CONFIG_IDS[0]]
  for cid in CONFIG_IDS[1:]:
    values, _ = runs[cid]
    assert sorted(values) == sorted(base)
    for key in base:
      if key.startswith("var/"):
        np.testing.assert_array_equal(values[key], base[key], err_msg=f"{cid} {key}")
      else:
        np.testing.assert_allclose(values[key], base[key], rtol=1e-4, atol=1e-5,
                                   err_msg=f"{cid} {key}")


def test_local_attention_over_a_split_length_only_exchanges_neighbours():
  """Blocks are split like the length: the reshapes into blocks are local and
  each block fetches the previous one with a permute (one for k, one for v)."""
  import mtf_test_utils  # pylint: disable=g-import-not-at-top

  def build(mesh):
    x = _import(mesh, X, [batch, length, d_model])
    params = mtf.layers.multihead_attention_params(
        mesh, heads, d_model, d_kv, mtf.VariableDType(), combine=False)
    kv = []
    y = mtf.layers.masked_local_attention_1d(x, d_kv, heads, window_size=2,
                                             length_per_split=2, params=params, return_kv=kv)
    # k is x . wk: the separate variables were used.
    k_direct = mtf.einsum([x, params[1]], output_shape=kv[0].shape)
    return {"y": y, "k": kv[0], "k_direct": k_direct, "v": kv[1]}
  got, lowering = mtf_test_utils.lower_and_run(build, "all:4", "length:all",
                                               return_lowering=True)
  assert [r.kind for r in lowering.collective_records] == ["permute", "permute"]
  single = mtf_test_utils.lower_and_run(build, "all:1", "")
  for key in got:
    np.testing.assert_allclose(got[key], single[key], rtol=1e-5, atol=1e-6, err_msg=key)
  np.testing.assert_allclose(got["k"], got["k_direct"], rtol=1e-6)
  assert got["k"].shape == (B, H, L, K)


def test_attention_bias_local_block_and_bfloat16_layers():
  import mtf_test_utils  # pylint: disable=g-import-not-at-top
  block, memory = mtf.Dimension("block", 4), mtf.Dimension("memory_block", 4)

  def build(dtype):
    def fn(mesh):
      x = mtf.cast(_import(mesh, X, [batch, length, d_model]), dtype)
      h = mtf.layers.layer_norm(mtf.layers.dense(x, d_ff, reduced_dims=[d_model]), d_ff)
      logits = mtf.layers.dense(h, vocab, reduced_dims=[d_ff], name="logits")
      ids = _import(mesh, IDS, [batch, length])
      loss = mtf.layers.softmax_cross_entropy_with_logits(logits, ids, vocab, z_loss=1e-4)
      return {"bias": mtf.layers.attention_bias_local_block(mesh, block, memory),
              "loss": mtf.cast(loss, tf.float32), "h": mtf.cast(h, tf.float32)}
    return fn
  f32 = mtf_test_utils.lower_and_run(build(tf.float32), "all:1", "")
  bf16 = mtf_test_utils.lower_and_run(build(tf.bfloat16), "all:2", "d_ff:all")
  q, m = np.arange(4)[:, None], np.arange(8)[None, :]
  np.testing.assert_array_equal(f32["bias"], np.where(m - 4 > q, -1e9, 0.0))
  assert f32["bias"].shape == (4, 8)
  np.testing.assert_allclose(bf16["h"], f32["h"], rtol=0.05, atol=0.05)
  np.testing.assert_allclose(bf16["loss"], f32["loss"], rtol=0.05, atol=0.05)


def test_dropout_layers_are_layout_invariant():
  def build(mesh):
    x = _import(mesh, X, [batch, length, d_model])
    return {
        "dropout": mtf.layers.dropout(x, True, rate=0.5),
        "broadcast": mtf.layers.dropout(x, True, keep_prob=0.75, noise_shape=[batch, d_model]),
        "eval": mtf.layers.dropout(x, False, rate=0.5),
        "drd": mtf.layers.dense_relu_dense(x, d_ff, dropout=0.5, dropout_broadcast_dims=[length]),
    }
  import mtf_test_utils  # pylint: disable=g-import-not-at-top
  runs = [mtf_test_utils.lower_and_run(build, m, l) for m, l in
          [("all:1", ""), ("rows:2;cols:4", "batch:rows;d_ff:cols"),
                                        ("all:8", "length:all")]]
  for run in runs[1:]:
    for key in runs[0]:
      np.testing.assert_allclose(run[key], runs[0][key], rtol=1e-5, atol=1e-6, err_msg=key)
  got = runs[0]
  np.testing.assert_array_equal(got["eval"], X)
  kept = got["dropout"] != 0
  np.testing.assert_allclose(got["dropout"][kept], 2 * X[kept], rtol=1e-6)
  assert 0.35 < kept.mean() < 0.65
  kept = got["broadcast"] != 0   # one mask for every position along length
  assert (kept == kept[:, :1, :]).all()
  np.testing.assert_allclose(got["broadcast"][kept], X[kept] / 0.75, rtol=1e-6)


def test_label_smoothing_and_z_loss_numbers():
  """Two classes, logits (0, log 3): log Z = log 4 and p = (1/4, 3/4)."""
  two = mtf.Dimension("two", 2)

  def build(mesh):
    logits = _import(mesh, np.array([0.0, math.log(3.0)], np.float32), [two])
    target = mtf.constant(mesh, 1, shape=[], dtype=tf.int32)
    return {
        "plain": mtf.layers.softmax_cross_entropy_with_logits(logits, target, two),
        "smooth": mtf.layers.softmax_cross_entropy_with_logits(
            logits, target, two, label_smoothing=0.2),
        "z": mtf.layers.softmax_cross_entropy_with_logits(logits, target, two, z_loss=0.5),
        "targets": mtf.layers.smoothed_targets(target, two, 0.2),
    }
  import mtf_test_utils  # pylint: disable=g-import-not-at-top
  got = mtf_test_utils.lower_and_run(build, "all:2", "two:all")
  np.testing.assert_allclose(got["plain"], -math.log(0.75), rtol=1e-6)
  # Smoothed targets (0.1, 0.9): 0.1 * log 4 + 0.9 * (log 4 - log 3).
  np.testing.assert_allclose(got["targets"], [0.1, 0.9], rtol=1e-6)
  np.testing.assert_allclose(got["smooth"], math.log(4.0) - 0.9 * math.log(3.0), rtol=1e-6)
  np.testing.assert_allclose(got["z"], -math.log(0.75) + 0.5 * math.log(4.0) ** 2, rtol=1e-6)


def test_batch_norm_updates_moving_statistics_and_uses_them_in_eval():
  momentum = 0.9
  channels = mtf.Dimension("d_model", D)
  impl = mtf.placement_mesh_impl.PlacementMeshImpl("rows:2;cols:4", "batch:rows;d_model:cols",
                                                   DEVICES)

  def graph_with(is_training):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    x = _import(mesh, X, [batch, length, channels])
    y, updates = mtf.layers.batch_norm(x, is_training, momentum=momentum, dims_idx_end=2,
                                       name="bn")
    return graph, mesh, y, updates

  @tf.function(autograph=False)
  def train():
    graph, mesh, _, updates = graph_with(True)
    assert len(updates) == 2
    lowering = mtf.Lowering(graph, {mesh: impl})
    with tf.control_dependencies([lowering.lowered_operation(u) for u in updates]):
      return tf.constant(0)

  @tf.function(autograph=False)
  def evaluate():
    graph, mesh, y, updates = graph_with(False)
    assert not updates
    lowering = mtf.Lowering(graph, {mesh: impl})
    return lowering.export_to_tf_tensor(y)
  train()
  train()
  mean, var = X.mean(axis=(0, 1)), X.var(axis=(0, 1))
  keep = momentum ** 2
  moving_mean = (1 - keep) * mean
  moving_var = keep * 1.0 + (1 - keep) * var
  np.testing.assert_allclose(evaluate().numpy(), (X - moving_mean) / np.sqrt(moving_var + 1e-9),
                             rtol=1e-5, atol=1e-5)


def test_dense_reuses_variables_by_name_and_uniquifies_default_names():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.zeros(mesh, [batch, d_model])
  mtf.layers.dense(x, d_ff, reduced_dims=[d_model])
  mtf.layers.dense(x, d_ff, reduced_dims=[d_model])
  mtf.layers.dense(x, d_ff, reduced_dims=[d_model], name="shared")
  mtf.layers.dense(x, d_ff, reduced_dims=[d_model], name="shared")
  with mtf.name_scope(mesh, "block"):
    mtf.layers.layer_norm(x, d_model)
  assert sorted(v.name for v in graph.all_variables) == [
      "block/layer_prepostprocess/layer_norm/layer_norm_bias",
      "block/layer_prepostprocess/layer_norm/layer_norm_scale",
      "dense/bias", "dense/kernel", "dense_1/bias", "dense_1/kernel",
      "shared/bias", "shared/kernel"]
  with pytest.raises(ValueError, match="new dimension"):
    mtf.layers.dense(x, batch, reduced_dims=[d_model])
  with pytest.raises(ValueError, match="give new_dims"):
    mtf.layers.dense(x, reduced_dims=[d_model])


# ---------------------------------------------------------------- initializers
fan_a, fan_b, fan_c = mtf.Dimension("fa", 16), mtf.Dimension("fb", 8), mtf.Dimension("fc", 64)
INIT_LAYOUTS = [("all:1", ""), ("rows:2;cols:4", "fa:rows;fc:cols"), ("all:8", "fb:all")]


def _initializers():
  """name -> (initializer, expected mean, expected stddev, bound or None);
  variables are [fa:16, fb:8, fc:64]: explicit fans are fan_in = 16 * 8 and
  fan_out = 64; the Keras default fan_in (fb times the receptive field fa) is
  also 128."""
  li = mtf.layers
  fan_in, fan_out = 16 * 8, 64
  dims_in, dims_out = [fan_a, fan_b], [fan_c]
  return {
      "he_normal": (li.he_normal(dims_in), 0.0, math.sqrt(2.0 / fan_in), None),
      "lecun_normal": (li.lecun_normal(dims_in), 0.0, math.sqrt(1.0 / fan_in), None),
      "glorot_uniform": (li.glorot_uniform(dims_in, dims_out), 0.0,
                         math.sqrt(2.0 / (fan_in + fan_out)),
                         math.sqrt(6.0 / (fan_in + fan_out))),
      "fan_out_normal": (li.VarianceScalingInitializer(3.0, "fan_out", "normal").for_dims(
          dims_in, dims_out), 0.0, math.sqrt(3.0 / fan_out), None),
      "fan_avg_truncated": (li.VarianceScalingInitializer(
          2.0, "fan_avg", "truncated_normal", fan_in_dims=[fan_c], fan_out_dims=[fan_c]),
                            0.0, math.sqrt(2.0 / 64), 2.0 * math.sqrt(2.0 / 64) / 0.8796),
      "keras_default_fans": (li.he_uniform(), 0.0, math.sqrt(2.0 / fan_in),
                             math.sqrt(6.0 / fan_in)),
      "constant": (mtf.initializers.constant(0.25), 0.25, 0.0, None),
      "random_uniform": (mtf.initializers.random_uniform(1.0, 3.0), 2.0, 2.0 / math.sqrt(12),
                         None),
  }


def _init_values(mesh_shape, layout):
  size = mtf.convert_to_shape(mesh_shape).size
  impl = mtf.placement_mesh_impl.PlacementMeshImpl(mesh_shape, layout, DEVICES[:size])

  @tf.function(autograph=False)
  def run():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    tensors = {name: mtf.get_variable(mesh, name, [fan_a, fan_b, fan_c], initializer=init)
               for name, (init, _, _, _) in _initializers().items()}
    tensors["dense_kernel"] = mtf.layers.get_dense_kernel_weights(
        mtf.zeros(mesh, [fan_a, fan_b]), [fan_c], [fan_a, fan_b], name="d")
    lowering = mtf.Lowering(graph, {mesh: impl})
    return {k: lowering.export_to_tf_tensor(t) for k, t in tensors.items()}
  return {k: v.numpy() for k, v in run().items()}


def test_initializers_statistics_and_layout_invariance():
  runs = [_init_values(*c) for c in INIT_LAYOUTS]
  specs = dict(_initializers(), dense_kernel=(None, 0.0, math.sqrt(1.0 / 128), None))
  for name, (_, mean, std, bound) in specs.items():
    v = runs[0][name]
    assert v.shape == (16, 8, 64)
    n = v.size
    # Sample mean within 5 standard errors; stddev within 3%.
    assert abs(v.mean() - mean) < 5 * max(std, 1e-6) / math.sqrt(n), name
    np.testing.assert_allclose(v.std(), std, rtol=0.03, atol=1e-7, err_msg=name)
    if bound is not None:
      assert np.abs(v).max() <= bound * 1.0001, name
    for other in runs[1:]:
      np.testing.assert_array_equal(other[name], v, err_msg=name)
  # Different names give different values.
  assert not np.allclose(runs[0]["he_normal"], runs[0]["lecun_normal"] * math.sqrt(2))


def test_variance_scaling_binds_fans_like_the_original_dense_initializer():
  init = mtf.layers.VarianceScalingInitializer(1.0, "fan_avg", "uniform")
  bound = init([fan_a, fan_b], [fan_c])   # DenseInitializer API
  assert bound.fans([1, 2, 3]) == (128, 64)
  assert init.fans([16, 8, 64]) == (8 * 16, 64 * 16)   # Keras: receptive field 16
  assert mtf.initializers.default_fans([3, 3, 16, 32]) == (144, 288)
  full = init([4, 6], tf.float32, name="w")      # Keras API: the full tensor
  assert full.shape == (4, 6)
  with pytest.raises(ValueError, match="mode"):
    mtf.layers.VarianceScalingInitializer(mode="fan_sideways")

  # dense binds the fans of a VarianceScalingInitializer, and calls the
  # original API's DenseInitializers with its reduced and new dimensions.
  calls = []

  class Recording(mtf.layers.DenseInitializer):
    def __call__(self, reduced_dims, new_dims):
      calls.append((list(reduced_dims), list(new_dims)))
      return mtf.initializers.zeros()
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.zeros(mesh, [batch, fan_a, fan_b])
  mtf.layers.dense(x, [fan_c], reduced_dims=[fan_a, fan_b], kernel_initializer=Recording())
  mtf.layers.dense(x, [fan_c], reduced_dims=[fan_a, fan_b],
                   kernel_initializer=mtf.layers.he_normal())
  assert calls == [([fan_a, fan_b], [fan_c])]
  kernel = graph.name_to_variable["dense_1/kernel"]
  assert kernel._initializer.fans([1]) == (128, 64)  # pylint: disable=protected-access


def _kept_for_backward(graph, first_backward):
  """The forward tensors that operations of the backward pass read."""
  forward = graph.operations[:first_backward]
  read = {id(t) for op in graph.operations[first_backward:] for t in op.inputs}
  return [t for op in forward for t in op.outputs if id(t) in read]


@pytest.mark.parametrize("mesh_shape,layout", [("all:1", ""),
                                               ("rows:2;cols:4", "batch:rows;d_model:cols")])
def test_scale_normalized_differentiates_like_the_plain_product_without_keeping_it(
    mesh_shape, layout):
  """scale_normalized(x, r, s) has the values and gradients of x * r * s, and
  its backward pass reads x, r and s but not the full-size product x * r
  (which the plain expression keeps)."""
  cotangent = np.random.RandomState(3).randn(B, L, D).astype(np.float32)
  scale_value = np.linspace(0.5, 1.5, D).astype(np.float32)
  kept = {}

  def build(custom):
    def fn(mesh):
      x = _import(mesh, X, [batch, length, d_model])
      scale = _import(mesh, scale_value, [d_model])
      r = mtf.rsqrt(mtf.reduce_mean(mtf.square(x), reduced_dim=d_model) + 1e-6)
      y = mtf.layers.scale_normalized(x, r, scale) if custom else x * r * scale
      loss = mtf.reduce_sum(y * _import(mesh, cotangent, [batch, length, d_model]))
      graph = mesh.graph
      first_backward = len(graph.operations)
      dx, dscale = mtf.gradients([loss], [x, scale])
      products = [t for t in _kept_for_backward(graph, first_backward)
                  if t.operation.inputs[:2] == [x, r]]
      kept[custom] = products
      return {"y": y, "dx": dx, "dscale": dscale}
    return fn
  import mtf_test_utils  # pylint: disable=g-import-not-at-top
  plain = mtf_test_utils.lower_and_run(build(False), mesh_shape, layout)
  custom = mtf_test_utils.lower_and_run(build(True), mesh_shape, layout)
  for key in ("y", "dx", "dscale"):
    np.testing.assert_allclose(custom[key], plain[key], rtol=1e-6, atol=1e-6, err_msg=key)
  rms = np.sqrt((X ** 2).mean(axis=2, keepdims=True) + 1e-6)
  np.testing.assert_allclose(custom["y"], X / rms * scale_value, rtol=1e-5)
  np.testing.assert_allclose(custom["dscale"], (cotangent * X / rms).sum(axis=(0, 1)),
                             rtol=1e-4)
  assert len(kept[False]) == 1 and kept[True] == []
