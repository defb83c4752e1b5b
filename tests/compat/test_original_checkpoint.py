"""Checkpoints in the original Mesh TensorFlow's format
(mesh_tensorflow/compat/original_checkpoint.py).

The fixtures are written with tf.raw_ops.SaveV2 from the published naming
scheme (names, 2-D attention shapes, bfloat16 or float32 masters, Adafactor
`_slot_*` variables, `global_step`), not by this library's writer. The
restored models' logits and scores are compared with a NumPy forward pass of
the T5 model computed directly from the checkpoint's arrays, under one
device, "all:8" and "rows:2;cols:4": the independent check of the names and
of the arithmetic.
"""

import logging
import math
import os
import subprocess
import sys

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.compat import original_checkpoint
from mesh_tensorflow.lowering import slice_variables
from mesh_tensorflow.transformer import transformer
from mesh_tensorflow.transformer import transformer_layers as tl
from mtf_test_utils import make_impl


@pytest.fixture(autouse=True)
def _models_from_their_arguments_alone():
  """The models here are built from their arguments: no gin binding left by
  an earlier test in the worker (a parsed operative config) may change them."""
  gin.clear_config()


REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
B, L, D, H, K, F, V, VPAD = 2, 6, 16, 4, 8, 32, 27, 32
batch, length = mtf.Dimension("batch", B), mtf.Dimension("length", L)
LAYOUTS = [("all:1", ""), ("all:8", "d_kv:all;d_ff:all;vocab:all"),
           ("rows:2;cols:4", "heads:rows;d_kv:cols;d_ff:cols;vocab:cols")]
INPUTS = np.array([[5, 9, 3, 8, 1, 0], [7, 2, 6, 1, 0, 0]], np.int32)
TARGETS = np.array([[4, 11, 26, 1, 0, 0], [3, 19, 8, 2, 25, 1]], np.int32)


# --------------------------------------------------------------- fixtures
def _normal(rng, shape, scale=0.5):
  return (rng.standard_normal(shape) * scale).astype(np.float32)


def _attention(rng, prefix, out):
  out[prefix + "/q"] = _normal(rng, [D, H * K])
  out[prefix + "/k"] = _normal(rng, [D, H * K])
  out[prefix + "/v"] = _normal(rng, [D, H * K])
  out[prefix + "/o"] = _normal(rng, [H * K, D])


def _norm(rng, name, out):
  out[name] = (1.0 + 0.2 * rng.standard_normal([D])).astype(np.float32)


def t5_arrays(seed=0):
  """A T5 v1.0-style encoder-decoder as the original names it (legacy norms,
  shared embedding and softmax, relative attention "bias_shared")."""
  rng = np.random.default_rng(seed)
  out = {"shared/embedding": _normal(rng, [VPAD, D], 1.0)}
  for stack, layers in (("encoder", ["SelfAttention", "DenseReluDense"]),
                        ("decoder", ["SelfAttention", "EncDecAttention", "DenseReluDense"])):
    out[f"{stack}/block_000/layer_000/SelfAttention/relative_attention_bias"] = _normal(
        rng, [H, 32])
    for b in range(2):
      for n, cls in enumerate(layers):
        scope = f"{stack}/block_{b:03d}/layer_{n:03d}"
        _norm(rng, scope + "/layer_norm/scale", out)
        if cls == "DenseReluDense":
          out[scope + "/DenseReluDense/wi/kernel"] = _normal(rng, [D, F])
          out[scope + "/DenseReluDense/wo/kernel"] = _normal(rng, [F, D], 0.2)
        else:
          _attention(rng, f"{scope}/{cls}", out)
    _norm(rng, f"{stack}/final_layer_norm/scale", out)
  return out


def lm_arrays(seed=1):
  """A decoder-only LM under "transformer/" (rms_norm model; the checkpoint
  uses the older "layer_norm" names), unshared logits, gated GELU, learned
  positions, relative attention "bias" per layer."""
  rng = np.random.default_rng(seed)
  out = {"transformer/embedding": _normal(rng, [VPAD, D], 1.0),
         "transformer/positional_embedding": _normal(rng, [L, D], 0.3),
         "transformer/logits/kernel": _normal(rng, [D, VPAD], 0.3)}
  for b in range(2):
    scope = f"transformer/block_{b:03d}"
    _norm(rng, scope + "/layer_000/layer_norm/scale", out)
    _attention(rng, scope + "/layer_000/SelfAttention", out)
    out[scope + "/layer_000/SelfAttention/relative_attention_bias"] = _normal(rng, [H, 32])
    _norm(rng, scope + "/layer_001/layer_norm/scale", out)
    out[scope + "/layer_001/DenseReluDense/wi_0/kernel"] = _normal(rng, [D, F])
    out[scope + "/layer_001/DenseReluDense/wi_1/kernel"] = _normal(rng, [D, F])
    out[scope + "/layer_001/DenseReluDense/wo/kernel"] = _normal(rng, [F, D], 0.2)
  _norm(rng, "transformer/final_layer_norm/scale", out)
  return out


def save_original(directory, arrays, step=1000, dtype=tf.float32):
  """Writes `arrays` (+ global_step) as the original did: a name-based
  checkpoint model.ckpt-STEP and its `checkpoint` state file."""
  os.makedirs(directory, exist_ok=True)
  prefix = os.path.join(directory, f"model.ckpt-{step}")
  names = sorted(arrays) + ["global_step"]
  tensors = [tf.cast(tf.constant(arrays[n]), dtype) if arrays[n].dtype == np.float32
             else tf.constant(arrays[n]) for n in sorted(arrays)]
  tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(names),
                    tensors=tensors + [tf.constant(step, tf.int64)])
  with open(os.path.join(directory, "checkpoint"), "w") as f:
    f.write(f'model_checkpoint_path: "model.ckpt-{step}"\n'
            f'all_model_checkpoint_paths: "model.ckpt-{step}"\n')
  return prefix


def adafactor_slots(arrays, min_dim_size_to_factor, rng):
  """The original AdafactorOptimizer's slots of `arrays`: X_slot_vr (shape
  without the largest dimension) and X_slot_vc (without the second largest),
  factored when the second largest is >= min_dim_size_to_factor, else
  X_slot_v; all consistent with one full second moment."""
  out = {}
  for name, value in arrays.items():
    shape = list(value.shape)
    full = rng.uniform(0.1, 2.0, shape).astype(np.float32)
    order = sorted(range(len(shape)), key=lambda i: -shape[i])
    if len(shape) >= 2 and shape[order[1]] >= min_dim_size_to_factor:
      out[name + "_slot_vr"] = full.mean(axis=order[0])
      out[name + "_slot_vc"] = full.mean(axis=order[1])
    else:
      out[name + "_slot_v"] = full
  return out


# ----------------------------------------------------- the NumPy T5 model
def _bucket(rel, bidirectional, num_buckets=32, max_distance=128):
  """The original's relative-position bucket, in float32 as it computes it."""
  n = -rel
  ret = np.zeros_like(n)
  if bidirectional:
    num_buckets //= 2
    ret += (n < 0).astype(n.dtype) * num_buckets
    n = np.abs(n)
  else:
    n = np.maximum(n, 0)
  max_exact = num_buckets // 2
  with np.errstate(divide="ignore", invalid="ignore"):
    large = max_exact + (np.log(n.astype(np.float32) / np.float32(max_exact))
                         / np.float32(math.log(max_distance / max_exact))
                         * np.float32(num_buckets - max_exact)).astype(n.dtype)
  return ret + np.where(n < max_exact, n, np.minimum(large, num_buckets - 1))


def _rms(x, scale):
  return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + 1e-6) * scale


def _softmax(x):
  x = x - x.max(-1, keepdims=True)
  e = np.exp(x)
  return e / e.sum(-1, keepdims=True)


def _mha(w, prefix, xq, xm, bias):
  """Multi-head attention with the original's 2-D weights (heads-major)."""
  def heads(x, name):
    return (x @ w[prefix + name]).reshape(x.shape[0], x.shape[1], H, K)
  q, k, v = heads(xq, "/q"), heads(xm, "/k"), heads(xm, "/v")
  logits = np.einsum("bqhk,bmhk->bhqm", q, k) + bias  # no 1/sqrt(d_kv)
  o = np.einsum("bhqm,bmhk->bqhk", _softmax(logits), v)
  return o.reshape(xq.shape[0], xq.shape[1], H * K) @ w[prefix + "/o"]


def _relative_bias(table, bidirectional):
  rel = np.arange(L)[None, :] - np.arange(L)[:, None]  # memory - query
  return table[:, _bucket(rel, bidirectional)][None]  # [1, heads, q, m]


def _gelu(x):
  return 0.5 * x * (1.0 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def _ffn(w, prefix, x):
  if prefix + "/wi/kernel" in w:
    return np.maximum(x @ w[prefix + "/wi/kernel"], 0) @ w[prefix + "/wo/kernel"]
  h = _gelu(x @ w[prefix + "/wi_0/kernel"]) * (x @ w[prefix + "/wi_1/kernel"])
  return h @ w[prefix + "/wo/kernel"]


def _shift_right(ids):
  return np.concatenate([np.zeros_like(ids[:, :1]), ids[:, :-1]], 1)


def _scores(logits, targets):
  logits = logits.astype(np.float64)
  logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
      - logits.max(-1, keepdims=True)
  picked = np.take_along_axis(logp, targets[..., None], -1)[..., 0]
  return (picked * (targets != 0)).sum(-1)


def t5_reference(w, inputs, targets):
  """Logits [B, L, VPAD] and scores [B] of t5_arrays' model."""
  causal = np.where(np.arange(L)[None, :] > np.arange(L)[:, None], -1e9, 0.0)
  enc_pad = np.where(inputs == 0, -1e9, 0.0)[:, None, None, :]  # [b, 1, 1, m]
  x = w["shared/embedding"][inputs]
  enc_bias = _relative_bias(
      w["encoder/block_000/layer_000/SelfAttention/relative_attention_bias"], True)
  for b in range(2):
    s = f"encoder/block_{b:03d}"
    h = _rms(x, w[s + "/layer_000/layer_norm/scale"])
    x = x + _mha(w, s + "/layer_000/SelfAttention", h, h, enc_bias + enc_pad)
    x = x + _ffn(w, s + "/layer_001/DenseReluDense", _rms(x, w[s + "/layer_001/layer_norm/scale"]))
  memory = _rms(x, w["encoder/final_layer_norm/scale"]) * (inputs != 0)[..., None]
  y = w["shared/embedding"][_shift_right(targets)]
  dec_bias = _relative_bias(
      w["decoder/block_000/layer_000/SelfAttention/relative_attention_bias"], False) + causal
  for b in range(2):
    s = f"decoder/block_{b:03d}"
    h = _rms(y, w[s + "/layer_000/layer_norm/scale"])
    y = y + _mha(w, s + "/layer_000/SelfAttention", h, h, dec_bias)
    h = _rms(y, w[s + "/layer_001/layer_norm/scale"])
    y = y + _mha(w, s + "/layer_001/EncDecAttention", h, memory, enc_pad)
    y = y + _ffn(w, s + "/layer_002/DenseReluDense", _rms(y, w[s + "/layer_002/layer_norm/scale"]))
  y = _rms(y, w["decoder/final_layer_norm/scale"])
  logits = (y * D ** -0.5) @ w["shared/embedding"].T
  return logits, _scores(logits, targets)


def lm_reference(w, targets):
  causal = np.where(np.arange(L)[None, :] > np.arange(L)[:, None], -1e9, 0.0)
  x = w["transformer/embedding"][_shift_right(targets)] + w["transformer/positional_embedding"]
  for b in range(2):
    s = f"transformer/block_{b:03d}"
    bias = _relative_bias(w[s + "/layer_000/SelfAttention/relative_attention_bias"], False)
    h = _rms(x, w[s + "/layer_000/layer_norm/scale"])
    x = x + _mha(w, s + "/layer_000/SelfAttention", h, h, bias + causal)
    x = x + _ffn(w, s + "/layer_001/DenseReluDense", _rms(x, w[s + "/layer_001/layer_norm/scale"]))
  logits = _rms(x, w["transformer/final_layer_norm/scale"]) @ w["transformer/logits/kernel"]
  return logits, _scores(logits, targets)


# --------------------------------------------------- this library's models
def t5_model():
  def stack(layers):  # both given: the original's legacy mode (layer_norm names)
    return transformer.make_layer_stack(layers, num_layers=2, dropout_rate=0.0,
                                        norm_epsilon=1e-6)
  attention = dict(num_heads=H, key_value_size=K)
  encoder = transformer.Unitransformer(
      stack([tl.SelfAttention(relative_attention_type="bias_shared", **attention),
             tl.DenseReluDense(hidden_size=F)]),
      d_model=D, input_vocab_size=V, output_vocab_size=None, autoregressive=False,
      name="encoder", positional_embedding=False, vocab_divisor=16)
  decoder = transformer.Unitransformer(
      stack([tl.SelfAttention(relative_attention_type="bias_shared", **attention),
             tl.EncDecAttention(**attention), tl.DenseReluDense(hidden_size=F)]),
      d_model=D, input_vocab_size=V, output_vocab_size=V, autoregressive=True,
      name="decoder", positional_embedding=False, vocab_divisor=16,
      shared_embedding_and_softmax_weights=True)
  return transformer.Bitransformer(encoder, decoder)


def lm_model():
  layers = [tl.SelfAttention(num_heads=H, key_value_size=K, relative_attention_type="bias"),
            tl.DenseReluDense(hidden_size=F, activation=["gelu", "linear"])]
  return transformer.Unitransformer(
      transformer.make_layer_stack(layers, num_layers=2), d_model=D, input_vocab_size=V,
      output_vocab_size=V, autoregressive=True, max_length=L, vocab_divisor=16)


def _logits(model, mesh):
  targets = mtf.import_tf_tensor(mesh, tf.constant(TARGETS), [batch, length])
  if isinstance(model, transformer.Bitransformer):
    inputs = mtf.import_tf_tensor(mesh, tf.constant(INPUTS), [batch, length])
    logits, _ = model.call_simple(inputs, targets, False, mode="eval")
  else:
    logits, _ = model.call_simple(mtf.shift(targets, 1, length, wrap=False), targets,
                                  False, mode="eval")
  return logits


def run_restored(make_model, checkpoint, mesh_shape, layout, tmp_path, before_trace=True,
                 optimizer=None, **restore_kwargs):
  """Logits of make_model() restored from `checkpoint` on a mesh, and the
  manager (restored before the first trace, or assigned after it). With an
  optimizer (whose slots are then created too) the step is only traced and
  the logits are None."""
  impl = make_impl(mesh_shape, layout)
  manager = mtf.checkpoint.CheckpointManager(impl, str(tmp_path / "run"))
  if before_trace:
    manager.restore(checkpoint, **restore_kwargs)

  @tf.function(autograph=False)
  def fn():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    logits = _logits(make_model(), mesh)
    if optimizer is not None:
      loss = mtf.reduce_sum(mtf.reduce_logsumexp(logits, logits.shape.dims[-1]))
      variables = graph.trainable_variables
      optimizer.apply_grads(mtf.gradients([loss], [v.outputs[0] for v in variables]),
                            variables)
    lowering = mtf.Lowering(graph, {mesh: impl})
    return lowering.export_to_tf_tensor(logits)
  if optimizer is not None:  # trace only: creates the variables, runs no update
    fn.get_concrete_function()
    slice_variables.scalar_state(impl, "global_step", tf.int64)  # as mtf.training.Trainer
    if not before_trace:
      manager.restore(checkpoint, **restore_kwargs)
    return None, manager
  out = fn().numpy()
  if not before_trace:
    manager.restore(checkpoint, **restore_kwargs)
    out = fn().numpy()
  return out, manager


# ------------------------------------------------------------------ tests
def test_attention_weight_mapping_is_a_heads_major_reshape():
  name = "encoder/block_000/layer_000/SelfAttention/"
  assert original_checkpoint.merged_axis(name + "q", [D, H, K]) == 1
  assert original_checkpoint.merged_axis(name + "kv", [D, H, K]) == 1
  assert original_checkpoint.merged_axis(name + "o", [H, K, D]) == 0
  assert original_checkpoint.merged_axis(name + "k", [D, K]) is None  # one memory head
  assert original_checkpoint.merged_axis("decoder/logits/kernel", [D, H, K]) is None
  assert original_checkpoint.original_shape([D, H, K], 1) == [D, H * K]
  # Column h * d_kv + k of the original's q is head h, channel k here.
  q2 = np.arange(D * H * K, dtype=np.float32).reshape(D, H * K)
  o2 = np.arange(H * K * D, dtype=np.float32).reshape(H * K, D)
  q3, o3 = q2.reshape(D, H, K), o2.reshape(H, K, D)
  assert q3[3, 2, 5] == q2[3, 2 * K + 5] and o3[1, 6, 4] == o2[1 * K + 6, 4]


@pytest.mark.parametrize("mesh_shape,layout", LAYOUTS)
def test_t5_bitransformer_from_bfloat16_checkpoint_matches_numpy(tmp_path, mesh_shape, layout):
  arrays = t5_arrays()
  model_dir = str(tmp_path / "t5")
  save_original(model_dir, arrays, dtype=tf.bfloat16)
  # The reference reads the checkpoint's (bfloat16-rounded) values.
  reader = tf.train.load_checkpoint(model_dir)
  w = {n: reader.get_tensor(n).astype(np.float32) for n in arrays}
  ref_logits, ref_scores = t5_reference(w, INPUTS, TARGETS)
  logits, manager = run_restored(t5_model, model_dir, mesh_shape, layout, tmp_path,
                                 before_trace=mesh_shape != "all:8")
  mask = TARGETS != 0
  np.testing.assert_allclose(logits[mask], ref_logits[mask], rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(_scores(logits, TARGETS), ref_scores, rtol=1e-5, atol=1e-4)
  variables = manager.variables()
  q = variables["decoder/block_001/layer_001/EncDecAttention/q"].numpy()
  np.testing.assert_array_equal(q.reshape(D, H * K),
                                w["decoder/block_001/layer_001/EncDecAttention/q"])


@pytest.mark.parametrize("mesh_shape,layout", LAYOUTS)
def test_language_model_with_older_norm_names_matches_numpy(tmp_path, mesh_shape, layout):
  arrays = lm_arrays()
  prefix = save_original(str(tmp_path / "lm"), arrays)
  ref_logits, ref_scores = lm_reference(arrays, TARGETS)
  logits, manager = run_restored(lm_model, prefix, mesh_shape, layout, tmp_path,
                                 before_trace=mesh_shape != "rows:2;cols:4")
  mask = TARGETS != 0
  np.testing.assert_allclose(logits[mask], ref_logits[mask], rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(_scores(logits, TARGETS), ref_scores, rtol=1e-5, atol=1e-4)
  # The model names its norms rms_norm; the checkpoint's layer_norm fed them.
  names = set(manager.variables())
  assert "transformer/block_001/layer_001/rms_norm/scale" in names
  assert "transformer/rms_norm/scale" in names
  np.testing.assert_array_equal(manager.variables()["transformer/rms_norm/scale"].numpy(),
                                arrays["transformer/final_layer_norm/scale"])


@pytest.mark.parametrize("before_trace", [True, False])
def test_every_problem_is_listed_in_one_error(tmp_path, before_trace):
  arrays = lm_arrays()
  arrays["transformer/block_000/layer_001/DenseReluDense/wi_0/kernel"] = np.zeros(
      [D, F + 1], np.float32)
  del arrays["transformer/block_001/layer_000/SelfAttention/k"]
  del arrays["transformer/logits/kernel"]
  arrays["transformer/block_009/layer_000/SelfAttention/q"] = np.zeros([D, H * K], np.float32)
  prefix = save_original(str(tmp_path / "bad"), arrays)
  with pytest.raises(ValueError) as info:
    run_restored(lm_model, prefix, "all:1", "", tmp_path, before_trace=before_trace)
  message = str(info.value)
  for expected in ("2 model variable(s) the checkpoint lacks",
                   "transformer/block_001/layer_000/SelfAttention/k",
                   "transformer/logits/kernel", "allow_missing=True",
                   "1 checkpoint variable(s) no model variable takes",
                   "transformer/block_009/layer_000/SelfAttention/q",
                   "1 shape mismatch(es)", f"[{D}, {F + 1}]"):
    assert expected in message, (expected, message)


def test_allow_missing_starts_missing_variables_from_initializers(tmp_path):
  arrays = lm_arrays()
  del arrays["transformer/logits/kernel"]
  prefix = save_original(str(tmp_path / "partial"), arrays)
  _, manager = run_restored(lm_model, prefix, "all:1", "", tmp_path, allow_missing=True)
  variables = manager.variables()
  np.testing.assert_array_equal(variables["transformer/embedding"].numpy(),
                                arrays["transformer/embedding"])
  assert np.std(variables["transformer/logits/kernel"].numpy()) > 0


def test_adafactor_slots_restore_renamed_and_skip_other_factorings(tmp_path, caplog):
  arrays = lm_arrays()
  rng = np.random.default_rng(5)
  slots = adafactor_slots(arrays, 16, rng)  # the original's factoring with min size 16
  prefix = save_original(str(tmp_path / "adafactor"), {**arrays, **slots}, step=77)
  optimizer = mtf.optimize.AdafactorOptimizer(min_dim_size_to_factor=8)
  with caplog.at_level(logging.WARNING):
    _, manager = run_restored(lm_model, prefix, "all:1", "", tmp_path, optimizer=optimizer)
  variables = {n: v.numpy() for n, v in manager.variables().items()}
  # [32, 16]: factored in both; the original's vr (without the largest
  # dimension) is this library's vc, and the other way round.
  np.testing.assert_array_equal(variables["transformer/embedding/adafactor_vc"],
                                slots["transformer/embedding_slot_vr"])
  np.testing.assert_array_equal(variables["transformer/embedding/adafactor_vr"],
                                slots["transformer/embedding_slot_vc"])
  kernel = "transformer/block_001/layer_001/DenseReluDense/wo/kernel"
  np.testing.assert_array_equal(variables[kernel + "/adafactor_vr"], slots[kernel + "_slot_vc"])
  bias = "transformer/block_000/layer_000/SelfAttention/relative_attention_bias"
  np.testing.assert_array_equal(variables[bias + "/adafactor_v"], slots[bias + "_slot_v"])
  norm = "transformer/rms_norm/scale"
  np.testing.assert_array_equal(variables[norm + "/adafactor_v"],
                                slots["transformer/final_layer_norm/scale_slot_v"])
  # q is [16, 4, 8] here (factored over d_model and d_kv) and [16, 32] there:
  # reported and started from zeros.
  q = "transformer/block_000/layer_000/SelfAttention/q"
  assert not variables[q + "/adafactor_vr"].any()
  assert any(q + "/adafactor_vr" in r.getMessage() for r in caplog.records)
  assert variables["global_step"] == 77


def test_full_second_moments_give_factored_slots_per_slice(tmp_path):
  arrays = lm_arrays()
  slots = adafactor_slots(arrays, 1000, np.random.default_rng(6))  # nothing factored there
  prefix = save_original(str(tmp_path / "unfactored"), {**arrays, **slots})
  optimizer = mtf.optimize.AdafactorOptimizer(min_dim_size_to_factor=8)
  _, manager = run_restored(lm_model, prefix, "rows:2;cols:4",
                            "d_model:rows;d_kv:cols", tmp_path, optimizer=optimizer)
  variables = {n: v.numpy() for n, v in manager.variables().items()}
  q = "transformer/block_001/layer_000/SelfAttention/q"
  full = slots[q + "_slot_v"].reshape(D, H, K)
  # Here q [d_model, heads, d_kv] factors over d_model (largest) and d_kv.
  np.testing.assert_allclose(variables[q + "/adafactor_vr"], full.mean(axis=2), rtol=1e-6)
  np.testing.assert_allclose(variables[q + "/adafactor_vc"], full.mean(axis=0), rtol=1e-6)


def test_include_optimizer_state_false_ignores_slots_and_step(tmp_path):
  arrays = lm_arrays()
  slots = adafactor_slots(arrays, 16, np.random.default_rng(7))
  prefix = save_original(str(tmp_path / "ft"), {**arrays, **slots}, step=500)
  optimizer = mtf.optimize.AdafactorOptimizer(min_dim_size_to_factor=8)
  _, manager = run_restored(lm_model, prefix, "all:1", "", tmp_path, optimizer=optimizer,
                            include_optimizer_state=False)
  variables = {n: v.numpy() for n, v in manager.variables().items()}
  assert not variables["transformer/embedding/adafactor_vr"].any()
  np.testing.assert_array_equal(variables["transformer/embedding"],
                                arrays["transformer/embedding"])
  assert variables.get("global_step", 0) == 0


def test_export_round_trip_and_cli(tmp_path, capsys):
  arrays = lm_arrays()
  slots = adafactor_slots(arrays, 16, np.random.default_rng(8))
  source = save_original(str(tmp_path / "src"), {**arrays, **slots}, step=42)
  optimizer = mtf.optimize.AdafactorOptimizer(min_dim_size_to_factor=8)
  _, manager = run_restored(lm_model, source, "all:1", "", tmp_path, optimizer=optimizer)
  saved = manager.save(42)
  exported = original_checkpoint.export(str(tmp_path / "run"), str(tmp_path / "out"),
                                        min_dim_size_to_factor=16)
  assert exported.endswith("model.ckpt-42")
  reader = tf.train.load_checkpoint(str(tmp_path / "out"))
  shapes = reader.get_variable_to_shape_map()
  assert reader.get_tensor("global_step") == 42
  for name, value in arrays.items():  # the original's names and shapes, same values
    model_name = name.replace("layer_norm", "rms_norm").replace("final_rms_norm", "rms_norm")
    np.testing.assert_array_equal(reader.get_tensor(model_name), value, err_msg=name)
  assert shapes["transformer/block_000/layer_000/SelfAttention/o"] == [H * K, D]
  np.testing.assert_array_equal(reader.get_tensor("transformer/embedding_slot_vr"),
                                slots["transformer/embedding_slot_vr"])
  # Reading the export back gives identical values, under another layout.
  tmp2 = tmp_path / "again"
  tmp2.mkdir()
  _, again = run_restored(lm_model, str(tmp_path / "out"), "rows:2;cols:4",
                          "heads:rows;d_kv:cols", tmp2, optimizer=optimizer)
  before = {n: v.numpy() for n, v in manager.variables().items()}
  after = {n: v.numpy() for n, v in again.variables().items()}
  assert sorted(before) == sorted(after)
  for name in before:
    np.testing.assert_array_equal(after[name], before[name], err_msg=name)
  # The CLI, as bfloat16; bad input is one error line and status 2.
  from mesh_tensorflow import export_original_checkpoint  # pylint: disable=import-outside-toplevel
  env = dict(os.environ, PYTHONPATH=REPO_ROOT)
  cmd = [sys.executable, "-m", "mesh_tensorflow.export_original_checkpoint",
         f"--checkpoint={saved}", f"--output_dir={tmp_path / 'cli'}", "--dtype=bfloat16",
         "--include_optimizer_state=false"]
  done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
  assert done.returncode == 0, done.stderr[-2000:]
  reader = tf.train.load_checkpoint(str(tmp_path / "cli"))
  dtypes = reader.get_variable_to_dtype_map()
  assert dtypes["transformer/embedding"] == tf.bfloat16 and dtypes["global_step"] == tf.int64
  assert not any("_slot_" in n for n in dtypes)
  code = export_original_checkpoint.main(
      ["export", f"--checkpoint={tmp_path / 'nothing'}", f"--output_dir={tmp_path / 'x'}"])
  assert code == 2 and "error: No checkpoint at" in capsys.readouterr().err
  assert export_original_checkpoint.main(["export", "--dtype=float16"]) == 2
  assert "error: " in capsys.readouterr().err


def test_make_layer_stack_names_slots_as_the_original():
  layers = [tl.SelfAttention, [tl.DenseReluDense, "ffn", {"hidden_size": 8}]]
  stack = transformer.make_layer_stack(layers, num_layers=2)
  assert [stack.layer_scope(i) for i in range(4)] == [
      "block_000/layer_000", "block_000/ffn", "block_001/layer_000", "block_001/ffn"]
  flat = transformer.make_layer_stack(layers, num_layers=2, block_scope=False)
  assert [flat.layer_scope(i) for i in range(4)] == ["layer_000", "ffn", "layer_002", "ffn"]
  # One instance in several slots: each slot has its own name.
  shared = tl.DenseReluDense(hidden_size=8)
  stack = transformer.make_layer_stack([shared], num_layers=3)
  assert [stack.layer_scope(i) for i in range(3)] == [
      "block_000/layer_000", "block_001/layer_000", "block_002/layer_000"]
  assert not stack.legacy and transformer.LayerStack([], dropout_rate=0.1,
                                                     norm_epsilon=1e-6).legacy


def test_the_format_needs_no_import_but_the_checkpoint_module():
  # A program importing only training.checkpoint restores and lists a model
  # directory written by the original (tests/data/original_0.1.21/lm).
  model_dir = os.path.join(REPO_ROOT, "tests", "data", "original_0.1.21", "lm")
  code = (
      "from mesh_tensorflow.training import checkpoint\n"
      "from mesh_tensorflow.lowering.placement_mesh_impl import PlacementMeshImpl\n"
      f"names = {{n: s for n, s, _ in checkpoint.list_variables({model_dir!r})}}\n"
      "assert names['global_step'] == [], names\n"
      "assert any(n.endswith('SelfAttention/q') and len(s) == 2 for n, s in names.items())\n"
      "impl = PlacementMeshImpl('all:2', '', ['cpu:0', 'cpu:0'])\n"
      "import tempfile\n"
      "manager = checkpoint.CheckpointManager(impl, tempfile.mkdtemp())\n"
      f"print(manager.restore({model_dir!r}, include_optimizer_state=False))\n")
  env = dict(os.environ, PYTHONPATH=REPO_ROOT, TF_CPP_MIN_LOG_LEVEL="3")
  done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                        timeout=300, check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  assert done.stdout.strip().endswith(os.path.join(model_dir, "model.ckpt-2"))
