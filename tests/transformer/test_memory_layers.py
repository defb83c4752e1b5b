"""memory_layers.ProductKeyValueMemory: its output against a NumPy version
that scores all n_keys**2 pairs, the same outputs and gradients under
layouts that split the batch, the value table's rows, the sub-keys or the
heads, incremental decoding against a pass over the whole sequence, a
tiny language model configured through gin that trains (the same losses
on one device and on a 2x4 mesh splitting the table), and the argument
checks.

Sizes are tiny: the file runs in about half a minute on two cores.
"""

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import gin_config
from mesh_tensorflow.transformer import memory_layers
from mesh_tensorflow.transformer import modeling
from mesh_tensorflow.transformer import transformer
from mesh_tensorflow.transformer import transformer_layers as tl
from mesh_tensorflow.transformer import vocabulary
from mtf_test_utils import lower_and_run, make_impl

B, L, D = 2, 3, 8
KEY_SIZE, N_KEYS, N_HEADS, KNN = 8, 4, 2, 3
batch, length = mtf.Dimension("batch", B), mtf.Dimension("length", L)
d_model = mtf.Dimension("d_model", D)
X = np.random.RandomState(0).randn(B, L, D).astype(np.float32)
R = np.random.RandomState(1).randn(B, L, D).astype(np.float32)


def _build_layer(knn=KNN):
  """builder(mesh) -> the layer's output, its variables and the gradients of
  sum(y * R) with respect to x and the variables."""
  def build(mesh):
    ctx = transformer.Context(None, mesh, [batch], length, mtf.VariableDType(), mode="eval")
    layer = memory_layers.ProductKeyValueMemory(KEY_SIZE, N_KEYS, N_HEADS, knn)
    x = mtf.import_tf_tensor(mesh, tf.constant(X), [batch, length, d_model])
    y = layer.call(ctx, x)
    loss = mtf.reduce_sum(y * mtf.import_tf_tensor(mesh, tf.constant(R), y.shape))
    variables = mesh.graph.trainable_variables
    grads = mtf.gradients([loss], [x] + [v.outputs[0] for v in variables])
    out = {"y": y, "grad/x": grads[0]}
    for v, g in zip(variables, grads[1:]):
      out[v.name] = v.outputs[0]
      out["grad/" + v.name] = g
    return out
  return build


def _numpy_memory(x, w, knn):
  """The layer's math on NumPy arrays, ranking all n_keys**2 pairs."""
  q = np.einsum("bld,dhpk->blhpk", x, w["query/kernel"]) + w["query/bias"]
  q = q - q.mean(-1, keepdims=True)
  q = q / np.sqrt((q * q).mean(-1, keepdims=True) + 1e-6)
  q = (q * w["query_norm/layer_norm/layer_norm_scale"]
       + w["query_norm/layer_norm/layer_norm_bias"])
  half = np.einsum("blhpk,hpnk->blhpn", q, w["keys"])  # [b, l, heads, 2, n_keys]
  n = half.shape[-1]
  # Pair (i, j) is row i * n_keys + j of the value table.
  pair = (half[..., 0, :, None] + half[..., 1, None, :]).reshape(half.shape[:3] + (n * n,))
  rows = np.argsort(-pair, axis=-1)[..., :knn]
  scores = np.take_along_axis(pair, rows, axis=-1)
  p = np.exp(scores - scores.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  return np.einsum("blhk,blhkd->bld", p, w["values"][rows])


@pytest.mark.parametrize("knn", [KNN, N_KEYS])
def test_output_matches_numpy_reference(knn):
  got = lower_and_run(_build_layer(knn), "all:1", "")
  expected = _numpy_memory(X, got, knn)
  np.testing.assert_allclose(got["y"], expected, rtol=1e-5, atol=1e-6)
  assert np.abs(got["y"]).max() > 1e-3
  # Initial scales: keys uniform in +-(key_size / 2)**-0.5, values d_model**-0.5.
  assert np.abs(got["keys"]).max() <= (KEY_SIZE // 2) ** -0.5
  assert 0.2 < got["values"].std() * np.sqrt(D) < 2.0
  # Gradients reach the table's read rows only, and the keys and query.
  read_rows = np.abs(got["grad/values"]).sum(-1) > 0
  assert 0 < read_rows.sum() <= min(N_KEYS ** 2, B * L * N_HEADS * knn)
  for name in ("grad/keys", "grad/query/kernel", "grad/x"):
    assert np.abs(got[name]).max() > 0, name


@pytest.mark.parametrize("mesh_shape,layout", [
    ("all:2", "batch:all"),
    ("all:8", "n_values:all"),
    ("rows:2;cols:4", "batch:rows;n_values:cols;n_keys:cols"),
    ("rows:2;cols:4", "n_heads:rows;key:cols"),
], ids=["batch", "table_rows", "batch_and_table", "heads_and_key"])
def test_outputs_and_gradients_do_not_depend_on_the_layout(mesh_shape, layout):
  single = lower_and_run(_build_layer(), "all:1", "")
  split = lower_and_run(_build_layer(), mesh_shape, layout)
  assert sorted(split) == sorted(single)
  for key in single:
    np.testing.assert_allclose(split[key], single[key], rtol=1e-5, atol=1e-6, err_msg=key)


def test_incremental_decoding_matches_a_pass_over_the_sequence():
  """Logits of each decoding step equal those of a whole-sequence pass, on a
  mesh that splits the batch and the value table."""
  n, vocab = 6, 16
  seq, rows = mtf.Dimension("length", n), mtf.Dimension("batch", 4)
  stack = transformer.LayerStack([
      tl.SelfAttention(num_heads=2, key_value_size=4),
      memory_layers.ProductKeyValueMemory(key_size=8, n_keys=4, n_heads=2, knn=2)])
  model = transformer.Unitransformer(stack, d_model=D, input_vocab_size=vocab,
                                     output_vocab_size=vocab, autoregressive=True,
                                     max_length=n, vocab_divisor=8)
  ids_np = np.random.RandomState(2).randint(2, vocab, size=(4, n)).astype(np.int32)

  def build(mesh):
    ids = mtf.import_tf_tensor(mesh, tf.constant(ids_np), [rows, seq])
    full, _ = model.call_simple(mtf.shift(ids, 1, seq, wrap=False), None, False, mode="infer")
    vdtype = mtf.VariableDType()
    states, constants = model.first_part(mtf.zeros_like(ids), [rows], seq, vdtype)
    fn = model.incremental_logits_fn([rows], seq, vdtype, constants)
    steps = []
    for p in range(n):
      logits, states = fn(mtf.constant(mesh, p, dtype=tf.int32), ids, states)
      steps.append(logits)
    return {"full": full, "incremental": mtf.stack(steps, "length", axis=1)}
  out = lower_and_run(build, "rows:2;cols:4", "batch:rows;n_values:cols")
  np.testing.assert_allclose(out["incremental"][..., 1:], out["full"][..., 1:], rtol=1e-4,
                             atol=1e-5)


_GIN = [
    "num_layers = 1", "d_model = 16", "num_heads = 4", "d_kv = 4",
    """transformer.make_layer_stack.layers = [
        @transformer_layers.SelfAttention,
        @memory_layers.ProductKeyValueMemory,
    ]""",
    "ProductKeyValueMemory.key_size = 8",
    "ProductKeyValueMemory.n_keys = 8",
    "ProductKeyValueMemory.n_heads = 2",
    "ProductKeyValueMemory.knn = 4",
]


def _train_from_gin(mesh_shape, layout, steps=6):
  gin_config.parse([], _GIN)
  try:
    impl = make_impl(mesh_shape, layout)
    vocab = vocabulary.ByteVocabulary()
    setup = modeling.Setup("lm", vocab, impl, {"targets": 8}, 8, vocab.vocab_size, 8,
                           mtf.VariableDType())
    model = setup.new_model()
    assert [type(layer).__name__ for layer in model.layer_stack.layers] == [
        "SelfAttention", "ProductKeyValueMemory"]
    memory = model.layer_stack.layers[1]
    assert (memory.key_size, memory.n_keys, memory.n_values, memory.n_heads,
            memory.knn) == (8, 8, 64, 2, 4)
    tokens = np.random.RandomState(3).randint(3, 40, size=(8, 8)).astype(np.int32)
    trainer = mtf.training.Trainer(
        modeling.make_model_fn(setup), {"targets": "batch:8;length:8"}, impl,
        mtf.optimize.AdamWeightDecayOptimizer(1e-2), log_every=0, log_fn=lambda s: None)
    data = tf.data.Dataset.from_tensors({"targets": tokens}).repeat()
    return np.array(trainer.train(data, steps=steps)["loss"])
  finally:
    gin.clear_config()


def test_language_model_from_gin_trains_alike_on_any_layout():
  assert "ProductKeyValueMemory" in gin_config.register_configurables()
  single = _train_from_gin("all:1", "")
  assert np.all(np.isfinite(single)) and single[-1] < 0.8 * single[0], single
  split = _train_from_gin("rows:2;cols:4", "batch:rows;n_values:cols;heads:cols")
  np.testing.assert_allclose(split, single, rtol=2e-4)


@pytest.mark.parametrize("kwargs,message", [
    (dict(key_size=8, n_keys=4, n_heads=2, knn=5), r"knn \(5\) must not exceed n_keys \(4\)"),
    (dict(key_size=1, n_keys=4, n_heads=2, knn=2), "key_size must be at least 2"),
    (dict(key_size=8, n_keys=0, n_heads=2, knn=2), "n_keys must be a positive integer"),
])
def test_bad_arguments_are_rejected(kwargs, message):
  with pytest.raises(ValueError, match=message):
    memory_layers.ProductKeyValueMemory(**kwargs)


def test_odd_key_size_and_the_originals_get_indices():
  """As in the original: an odd key_size gives halves of key_size // 2, and
  get_indices(keys, query) is best_rows(query, keys)."""
  layer = memory_layers.ProductKeyValueMemory(key_size=5, n_keys=4, n_heads=2, knn=2)
  assert layer.half_key_dim.size == 2

  def build(mesh):
    rng = np.random.RandomState(4)
    query = mtf.import_tf_tensor(mesh, rng.randn(3, 2, 2, 2).astype(np.float32),
                                 "length:3;n_heads:2;product_key:2;key:2")
    keys = mtf.import_tf_tensor(mesh, rng.randn(2, 2, 4, 2).astype(np.float32),
                                "n_heads:2;product_key:2;n_keys:4;key:2")
    s1, r1 = layer.get_indices(keys, query)
    s2, r2 = layer.best_rows(query, keys)
    return {"s1": s1, "r1": r1, "s2": s2, "r2": r2}
  got = lower_and_run(build, "all:1", "")
  np.testing.assert_array_equal(got["s1"], got["s2"])
  np.testing.assert_array_equal(got["r1"], got["r2"])
