"""Vocabulary embeddings: transformer.VocabEmbedding (the default, unchanged
variables), vocab_embeddings.py (factorized, adaptive, mixture of softmaxes,
Mixtape) and adaptive_softmax.py.

Every class's embeddings and logits against a NumPy version of its math, the
adaptive softmax's training loss against the exact cross-entropy (and with
positions dropped by length_projection_factor), greedy decoding through it,
gin configs (the new `Unitransformer.vocab_embedding_cls` and the original's
`get_vocab_embedding_cls.cls` and `loss_fn`) training tiny language models
whose losses fall and are the same on one device and on a 2x2 mesh that
splits "vocab" and "d_model", and the errors for bad settings.

Sizes are tiny; the file runs in well under a minute on two cores.
"""

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import adaptive_softmax
from mesh_tensorflow.transformer import gin_config
from mesh_tensorflow.transformer import transformer
from mesh_tensorflow.transformer import transformer_layers as tl
from mesh_tensorflow.transformer import vocab_embeddings
from mtf_test_utils import lower_and_run, make_impl

B, L, V, D = 8, 8, 64, 16
batch, length = mtf.Dimension("batch", B), mtf.Dimension("length", L)
vocab, d_model = mtf.Dimension("vocab", V), mtf.Dimension("d_model", D)
_rng = np.random.RandomState(0)
IDS = _rng.randint(0, V, size=(B, L)).astype(np.int32)
IDS[2, :4] = [50, 60, 55, 63]  # four targets in the last adaptive-softmax cluster
IDS[3, 6:] = 0                 # padding
HIDDEN = _rng.randn(B, L, D).astype(np.float32) * 2.0

ADAPTIVE_CLUSTERS = [{"token_count": 16, "embedding_size": D},
                     {"token_count": 48, "embedding_size": 4}]
SOFTMAX_CLUSTERS = [{"token_count": 16},
                    {"token_count": 32, "embedding_size": 8},
                    {"token_count": 16, "embedding_size": 4, "length_projection_factor": 0.25}]
MIXTAPE = dict(gate_embedding_size=4, frequent_token_fraction=0.25, extra_ids=3)
# The same settings in gin (the tests below build every model through gin).
GIN_BINDINGS = [
    "FactorizedVocabEmbedding.inner_dimension_size = 8",
    f"AdaptiveVocabEmbedding.clusters = {ADAPTIVE_CLUSTERS}",
    "MixtureOfSoftmaxes.num_softmaxes = 3",
    "Mixtape.gate_embedding_size = 4",
    "Mixtape.frequent_token_fraction = 0.25",
    "Mixtape.extra_ids = 3",
    f"AdaptiveSoftmaxVocabEmbedding.clusters = {SOFTMAX_CLUSTERS}",
    "Unitransformer.shared_embedding_and_softmax_weights = True",
    "factorized/Unitransformer.vocab_embedding_cls = "
    "@vocab_embeddings.FactorizedVocabEmbedding",
    "adaptive/Unitransformer.vocab_embedding_cls = @vocab_embeddings.AdaptiveVocabEmbedding",
    "mos/Unitransformer.vocab_embedding_cls = @vocab_embeddings.MixtureOfSoftmaxes",
    "mixtape/Unitransformer.vocab_embedding_cls = @vocab_embeddings.Mixtape",
    # The original's way, ported as it is.
    "adaptive_softmax/transformer.get_vocab_embedding_cls.cls = "
    "@adaptive_softmax.AdaptiveSoftmaxVocabEmbedding",
    "adaptive_softmax/Unitransformer.loss_fn = @adaptive_softmax.adaptive_softmax_loss_fn",
]
GIN_MODELS = ["factorized", "adaptive", "mos", "mixtape", "adaptive_softmax"]


@pytest.fixture
def clean_gin():
  yield
  gin.clear_config()


# ------------------------------------------------------------------ helpers
def _stack(attention=False):
  layers = [tl.DenseReluDense(hidden_size=16)]
  if attention:
    layers.insert(0, tl.SelfAttention(num_heads=2, key_value_size=4))
  return transformer.make_layer_stack(layers, num_layers=1)


def _lm(name, vocab_embedding_cls=None, z_loss=0.0, attention=False, **kwargs):
  return transformer.Unitransformer(
      _stack(attention), d_model=D, input_vocab_size=V, output_vocab_size=V,
      autoregressive=True, max_length=L, vocab_divisor=8, name=name, z_loss=z_loss,
      shared_embedding_and_softmax_weights=True, vocab_embedding_cls=vocab_embedding_cls,
      **kwargs)


def _run(outputs_fn, mesh_shape="all:1", layout=""):
  """Lowers outputs_fn(mesh) -> {key: tensor}: (numpy values, every
  variable's value under its name)."""
  return lower_and_run(outputs_fn, mesh_shape, layout, return_variables=True)


def _log_softmax(x, axis=-1):
  m = x.max(axis=axis, keepdims=True)
  return x - m - np.log(np.exp(x - m).sum(axis=axis, keepdims=True))


def _logsumexp(x, axis=-1):
  m = x.max(axis=axis, keepdims=True)
  return (m + np.log(np.exp(x - m).sum(axis=axis, keepdims=True))).squeeze(axis)


def _sigmoid(x):
  return 1.0 / (1.0 + np.exp(-x))


# --------------------------------------------- values against NumPy math
_VALUES = {}


def _embedding_outputs(mesh, keep=lambda key: True):
  """{class/embedding, class/logits}: every class (those `keep` accepts) on
  IDS and HIDDEN, and the adaptive softmax's losses in training and
  evaluation."""
  vdtype = mtf.VariableDType()
  classes = {
      "plain": (transformer.VocabEmbedding, {}),
      "classifier": (transformer.VocabEmbedding,
                     dict(scale_variable_like_classifier_weights=True)),
      "factorized": (vocab_embeddings.FactorizedVocabEmbedding,
                     dict(inner_dimension_size=8)),
      "adaptive": (vocab_embeddings.AdaptiveVocabEmbedding, dict(clusters=ADAPTIVE_CLUSTERS)),
      "mos": (vocab_embeddings.MixtureOfSoftmaxes, dict(num_softmaxes=3)),
      "mixtape": (vocab_embeddings.Mixtape, MIXTAPE),
      "softmax": (adaptive_softmax.AdaptiveSoftmaxVocabEmbedding,
                  dict(clusters=SOFTMAX_CLUSTERS)),
  }
  ids = mtf.import_tf_tensor(mesh, tf.constant(IDS), [batch, length])
  hidden = mtf.import_tf_tensor(mesh, tf.constant(HIDDEN), [batch, length, d_model])
  out = {}
  for key, (cls, kwargs) in classes.items():
    if not keep(key):
      continue
    with mtf.name_scope(mesh, key):
      emb = cls(mesh, vocab, d_model, vdtype, "embedding", None, **kwargs)
    out[f"{key}/embedding"] = emb.ids_to_embedding(ids, None)
    out[f"{key}/logits"] = emb.hidden_to_logits(hidden, None)
    if key == "softmax":
      train = transformer.Context(None, mesh, [batch], length, vdtype, mode="train")
      out["softmax/loss"] = emb.compute_loss(None, hidden, IDS_as(mesh), train)
      out["softmax/eval_loss"] = emb.compute_loss(None, hidden, IDS_as(mesh), None)
  return out


def _values():
  """_embedding_outputs (one lowering), the losses of an adaptive-softmax
  language model in training and eval, and a greedy decode through it."""
  if _VALUES:
    return _VALUES

  def build(mesh):
    out = _embedding_outputs(mesh)
    # Train-mode loss (the embedding's own, no full softmax) and eval-mode
    # cross-entropy of one adaptive-softmax model: equal without z-loss and
    # projection. Then a greedy decode and the teacher-forced log-probs.
    def cls(*args, **kwargs):
      clusters = [dict(c, length_projection_factor=1) for c in SOFTMAX_CLUSTERS]
      return adaptive_softmax.AdaptiveSoftmaxVocabEmbedding(*args, clusters=clusters, **kwargs)
    model = _lm("lm", cls, attention=True)
    # The same model (same variables) with the original's loss_fn.
    with_loss_fn = _lm("lm", cls, attention=True,
                       loss_fn=adaptive_softmax.adaptive_softmax_loss_fn)
    targets = IDS_as(mesh, nonzero=True)
    inputs = mtf.shift(targets, 1, length, wrap=False)
    out["lm/train_logits"], out["lm/train_loss"] = model.call_simple(inputs, targets, True)
    _, out["lm/eval_loss"] = model.call_simple(inputs, targets, True, mode="eval")
    _, out["lm/loss_fn_train"] = with_loss_fn.call_simple(inputs, targets, True)
    _, out["lm/loss_fn_eval"] = with_loss_fn.call_simple(inputs, targets, True, mode="eval")
    prompt = mtf.import_tf_tensor(mesh, tf.constant(_prompt()), [batch, length])
    greedy = model.sample_autoregressive(prompt, temperature=0.0, stop_at_token=None)
    out["lm/greedy"] = greedy
    out["lm/greedy_logits"], _ = model.call_simple(
        mtf.shift(greedy, 1, length, wrap=False), None, False, mode="infer")
    return out
  values, variables = _run(build)
  _VALUES.update(values)
  _VALUES["variables"] = variables
  return _VALUES


def IDS_as(mesh, nonzero=False):  # pylint: disable=invalid-name
  ids = np.maximum(IDS, 2) if nonzero else IDS
  return mtf.import_tf_tensor(mesh, tf.constant(ids), [batch, length])


def _prompt():
  prompt = np.zeros((B, L), np.int32)
  prompt[:, :2] = np.maximum(IDS[:, :2], 2)
  return prompt


def test_default_vocab_embedding_values():
  out, var = _values(), _values()["variables"]
  table = var["plain/embedding"]
  np.testing.assert_allclose(out["plain/embedding"], table[IDS], rtol=1e-6)
  np.testing.assert_allclose(out["plain/logits"], HIDDEN @ table.T * D ** -0.5,
                             rtol=1e-5, atol=1e-5)
  # Classifier scaling: a table of stddev D^-0.5, embeddings scaled up by sqrt(D).
  table = var["classifier/embedding"]
  assert 0.8 < table.std() * D ** 0.5 < 1.2
  np.testing.assert_allclose(out["classifier/embedding"], table[IDS] * D ** 0.5, rtol=1e-5)
  np.testing.assert_allclose(out["classifier/logits"], HIDDEN @ table.T, rtol=1e-5, atol=1e-5)


def test_factorized_is_two_matmuls():
  out, var = _values(), _values()["variables"]
  f1, f2 = var["factorized/embedding1"], var["factorized/embedding2"]
  assert f1.shape == (V, 8) and f2.shape == (8, D)
  assert out["factorized/embedding"].shape == (B, L, D)
  assert out["factorized/logits"].shape == (B, L, V)
  np.testing.assert_allclose(out["factorized/embedding"], f1[IDS] @ f2, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(out["factorized/logits"], (HIDDEN * D ** -0.5) @ f2.T @ f1.T,
                             rtol=1e-4, atol=1e-4)
  # stddev 8^-0.25 per factor: the product has about unit variance.
  assert 0.7 < (f1 @ f2).std() < 1.3


def test_adaptive_clusters_embed_and_concatenate():
  out, var = _values(), _values()["variables"]
  head, a1, a2 = (var["adaptive/embedding_0"], var["adaptive/embedding_11"],
                  var["adaptive/embedding_12"])
  assert head.shape == (16, D) and a1.shape == (48, 4) and a2.shape == (4, D)
  full = np.concatenate([head, a1 @ a2])  # the effective table [V, D]
  np.testing.assert_allclose(out["adaptive/embedding"], full[IDS], rtol=1e-5, atol=1e-5)
  h = HIDDEN * D ** -0.5
  expected = np.concatenate([h @ head.T, h @ a2.T @ a1.T], axis=-1)
  assert out["adaptive/logits"].shape == (B, L, V)
  np.testing.assert_allclose(out["adaptive/logits"], expected, rtol=1e-4, atol=1e-4)


def test_mixture_of_softmaxes_is_log_of_mixed_probabilities():
  out, var = _values(), _values()["variables"]
  emb = var["mos/embedding_embedding_weights"]
  mix = var["mos/embedding_mixture_weights"]
  ctx = var["mos/embedding_context_weights"]
  assert mix.shape == (3, D) and ctx.shape == (3, D, D)
  np.testing.assert_allclose(out["mos/embedding"], emb[IDS], rtol=1e-6)
  h = HIDDEN * D ** -0.5
  prior = np.exp(_log_softmax(h @ mix.T))                             # [B, L, K]
  contexts = np.tanh(np.einsum("blc,kcd->blkd", h, ctx))
  probs = np.exp(_log_softmax(np.einsum("blkd,vd->blkv", contexts, emb)))
  expected = np.log(np.einsum("blk,blkv->blv", prior, probs))
  np.testing.assert_allclose(out["mos/logits"], expected, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(_logsumexp(out["mos/logits"]), 0.0, atol=1e-5)


def test_mixtape_gates_mix_component_logits():
  out, var = _values(), _values()["variables"]
  v = {k.split("embedding_", 1)[1]: x for k, x in var.items() if k.startswith("mixtape/")}
  np.testing.assert_allclose(out["mixtape/embedding"], v["embedding_weights"][IDS], rtol=1e-6)
  h = HIDDEN * D ** -0.5
  contexts = np.tanh(np.einsum("blc,gcd->blgd", h, v["context_weights"])
                     + v["context_weights_bias"])
  components = np.einsum("blgd,vd->blgv", contexts, v["embedding_weights"])   # g = 4
  a = np.tanh(np.einsum("ned,bld->blne", v["prior_weights"], h) + v["prior_weights_bias"])
  shared = np.einsum("nd,bld->bln", v["prior_gates_vector"], h)               # n = 3
  # Frequency order: the 3 sentinels (ids 61..63) first, then ids 0, 1, ...
  extra, frequent = MIXTAPE["extra_ids"], int(MIXTAPE["frequent_token_fraction"] * V)
  rank = np.array([t + extra if t < V - extra else t - (V - extra) for t in range(V)])
  prior = np.repeat(shared[:, :, None, :], V, axis=2)                         # [B, L, V, 3]
  for t in range(V):
    if rank[t] < frequent:
      prior[:, :, t] += (np.einsum("e,blne->bln", v["prior_vocab_vector"][rank[t]], a)
                         + v["prior_bias"][rank[t]])
  s = _sigmoid(prior)
  gates = np.stack([s[..., 0] * s[..., 1], s[..., 0] * (1 - s[..., 1]),
                    (1 - s[..., 0]) * s[..., 2], (1 - s[..., 0]) * (1 - s[..., 2])], -1)
  expected = np.einsum("blgv,blvg->blv", components, gates)
  np.testing.assert_allclose(out["mixtape/logits"], expected, rtol=1e-4, atol=1e-4)
  assert v["prior_vocab_vector"].shape == (frequent, 4)


def _softmax_tables(var):
  h = HIDDEN * D ** -0.5
  # The head table (the original's layout): 16 token rows, then one per tail.
  assert var["softmax/embedding_0"].shape == (16 + 2, D)
  head = h @ var["softmax/embedding_0"][:16].T                                    # [B, L, 16]
  tails = h @ var["softmax/embedding_0"][16:].T                                   # [B, L, 2]
  t1 = h @ var["softmax/embedding_12"].T @ var["softmax/embedding_11"].T          # 32 ids
  t2 = h @ var["softmax/embedding_22"].T @ var["softmax/embedding_21"].T          # 16 ids
  return head, tails, t1, t2


def test_adaptive_softmax_log_probs_and_loss():
  out, var = _values(), _values()["variables"]
  head, tails, t1, t2 = _softmax_tables(var)
  log_z = _logsumexp(np.concatenate([head, tails], -1))[..., None]
  expected = np.concatenate([head - log_z, tails[..., :1] - log_z + _log_softmax(t1),
                             tails[..., 1:] - log_z + _log_softmax(t2)], -1)
  np.testing.assert_allclose(out["softmax/logits"], expected, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(_logsumexp(out["softmax/logits"]), 0.0, atol=1e-5)
  full = np.concatenate([var["softmax/embedding_0"][:16],
                         var["softmax/embedding_11"] @ var["softmax/embedding_12"],
                         var["softmax/embedding_21"] @ var["softmax/embedding_22"]])
  np.testing.assert_allclose(out["softmax/embedding"], full[IDS], rtol=1e-5, atol=1e-5)
  # Evaluation: the exact cross-entropy of those log-probabilities.
  counted = IDS != 0
  nll = -np.take_along_axis(expected, IDS[..., None], -1)[..., 0]
  np.testing.assert_allclose(out["softmax/eval_loss"], nll[counted].mean(), rtol=1e-5)
  # Training: head softmax for all, tail softmaxes for their tokens; the
  # last tail covers ceil(0.25 * L) = 2 positions per row (the first two).
  total, count = 0.0, 0
  for b in range(B):
    seen = 0
    for p in range(L):
      t = IDS[b, p]
      if t == 0:
        continue
      count += 1
      head_lp = np.concatenate([head[b, p], tails[b, p]]) - log_z[b, p]
      total -= head_lp[t] if t < 16 else head_lp[16 + (t >= 48)]
      if 16 <= t < 48:
        total -= _log_softmax(t1[b, p])[t - 16]
      elif t >= 48:
        seen += 1
        if seen <= 2:
          total -= _log_softmax(t2[b, p])[t - 48]
  assert (IDS[2] >= 48).sum() > 2  # some positions are really dropped
  np.testing.assert_allclose(out["softmax/loss"], total / count, rtol=1e-5)


def test_adaptive_softmax_trains_on_the_exact_cross_entropy_and_decodes():
  out = _values()
  # The training loss never forms the whole softmax; it equals the eval
  # cross-entropy (no z-loss, no projection). The logits are log-probs in
  # both modes.
  np.testing.assert_allclose(out["lm/train_loss"], out["lm/eval_loss"], rtol=1e-5)
  np.testing.assert_allclose(out["lm/loss_fn_train"], out["lm/train_loss"], rtol=1e-6)
  np.testing.assert_allclose(out["lm/loss_fn_eval"], out["lm/eval_loss"], rtol=1e-6)
  np.testing.assert_allclose(_logsumexp(out["lm/train_logits"]), 0.0, atol=1e-5)
  greedy, logits = out["lm/greedy"], out["lm/greedy_logits"]
  np.testing.assert_array_equal(greedy[:, :2], _prompt()[:, :2])
  np.testing.assert_allclose(_logsumexp(logits), 0.0, atol=1e-5)
  # Each decoded token is the argmax (over ids but padding) of the
  # teacher-forced log-probabilities at its position.
  np.testing.assert_array_equal(greedy[:, 2:], logits[:, 2:, 1:].argmax(-1) + 1)


def test_values_are_the_same_with_vocab_split_eight_ways():
  """The adaptive softmax's head table (16 tokens and 2 tail rows, as the
  original lays it out) does not split 8 ways: it is compared split 2 ways."""
  single = _values()
  split, _ = _run(lambda mesh: _embedding_outputs(mesh, lambda key: key != "softmax"),
                  "all:8", "vocab:all")
  assert split and not any(key.startswith("softmax/") for key in split)
  for key, value in split.items():
    np.testing.assert_allclose(value, single[key], rtol=1e-5, atol=1e-5, err_msg=key)
  halves, _ = _run(lambda mesh: _embedding_outputs(mesh, lambda key: key == "softmax"),
                   "all:2", "vocab:all")
  assert halves and all(key.startswith("softmax/") for key in halves)
  for key, value in halves.items():
    np.testing.assert_allclose(value, single[key], rtol=1e-5, atol=1e-5, err_msg=key)


# --------------------------------------------------- gin, training, layouts
def _gin_models():
  gin_config.parse([], GIN_BINDINGS, defaults=False)
  unitransformer = gin_config.configurable("Unitransformer")
  models = {}
  for name in GIN_MODELS:
    with gin.config_scope(name):
      models[name] = unitransformer(
          layer_stack=_stack(), d_model=D, input_vocab_size=V, output_vocab_size=V,
          autoregressive=True, max_length=L, vocab_divisor=8, name=name, z_loss=1e-4)
  return models


def _train(models, mesh_shape, layout, steps=3):
  """Trains all models at once (their losses summed; each model's
  gradients are its own) with SGD; returns each model's losses per step."""
  def model_fn(mesh, features, mode):
    t = features["targets"]
    inputs = mtf.shift(t, 1, length, wrap=False)
    losses = {k: m.call_simple(inputs, t, True, mode=mode)[1] for k, m in models.items()}
    return mtf.add_n(list(losses.values())), losses
  trainer = mtf.training.Trainer(
      model_fn, {"targets": f"batch:{B};length:{L}"}, make_impl(mesh_shape, layout),
      mtf.optimize.SgdOptimizer(0.5), log_every=0, log_fn=lambda line: None)
  # A learnable sequence: each token determines the next.
  rows = [[(5 * (b + 3 * p) + 2) % (V - 2) + 2 for p in range(L)] for b in range(B)]
  data = tf.data.Dataset.from_tensors({"targets": np.array(rows, np.int32)})
  history = trainer.train(data.repeat(), steps=steps)
  return {k: np.array(history[k]) for k in models}


def test_gin_configured_models_train_the_same_under_a_split_layout(clean_gin):
  models = _gin_models()
  assert isinstance(models["factorized"].vocab_embedding_cls(
      mtf.Mesh(mtf.Graph(), "m"), vocab, d_model, mtf.VariableDType(), "e", None),
      vocab_embeddings.FactorizedVocabEmbedding)
  assert issubclass(models["adaptive_softmax"].vocab_embedding_cls,
                    adaptive_softmax.AdaptiveSoftmaxVocabEmbedding)
  single = _train(models, "all:1", "")
  split = _train(models, "rows:2;cols:2", "d_model:rows;vocab:cols")
  for name in GIN_MODELS:
    assert np.all(np.isfinite(single[name])), name
    assert single[name][-1] < single[name][0] - 0.1, (name, single[name])
    np.testing.assert_allclose(split[name], single[name], rtol=5e-5, atol=5e-5,
                               err_msg=name)


def test_default_vocab_embedding_takes_gin_bindings(clean_gin):
  gin_config.parse([], ["VocabEmbedding.scale_variable_like_classifier_weights = True"],
                   defaults=False)
  model = _lm("lm")  # built in Python, without vocab_embedding_cls
  mesh = mtf.Mesh(mtf.Graph(), "mesh")
  emb = model.vocab_embedding_cls(mesh, vocab, d_model, mtf.VariableDType(), "embedding", None)
  assert isinstance(emb, transformer.VocabEmbedding)
  assert emb._classifier_scale  # pylint: disable=protected-access


# ------------------------------------------------- defaults and errors
def test_default_model_keeps_its_variable_names():
  def names(model_fn):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    t = mtf.zeros(mesh, mtf.Shape([batch, length]), dtype=tf.int32)
    model_fn(t)
    return {v.name: v.shape for v in graph.trainable_variables}

  def lm(shared):
    return lambda t: transformer.Unitransformer(
        _stack(), d_model=D, input_vocab_size=V, output_vocab_size=V, max_length=L,
        vocab_divisor=8, shared_embedding_and_softmax_weights=shared).call_simple(t, t, True)
  unshared = names(lm(False))
  assert unshared["transformer/embedding"] == mtf.Shape([vocab, d_model])
  assert unshared["transformer/logits/kernel"] == mtf.Shape([d_model, vocab])
  shared = names(lm(True))
  assert "transformer/embedding" in shared and "transformer/logits/kernel" not in shared

  def bi(cls):
    def fn(t):
      enc = transformer.Unitransformer(
          _stack(), d_model=D, input_vocab_size=V, output_vocab_size=None,
          autoregressive=False, max_length=L, vocab_divisor=8, name="encoder",
          vocab_embedding_cls=cls)
      dec = _lm("decoder", cls)
      transformer.Bitransformer(enc, dec).call_simple(t, t, True)
    return fn
  default = names(bi(None))
  assert "shared/embedding" in default
  assert not [n for n in default if n.startswith(("encoder/emb", "decoder/emb"))]
  factorized = names(bi(lambda *a, **k: vocab_embeddings.FactorizedVocabEmbedding(
      *a, inner_dimension_size=4, **k)))
  assert factorized["shared/embedding1"] == mtf.Shape([vocab, mtf.Dimension("inner_vocab", 4)])
  assert "shared/embedding" not in factorized


@pytest.mark.parametrize("cls,kwargs,match", [
    (vocab_embeddings.AdaptiveVocabEmbedding,
     dict(clusters=[{"token_count": 16, "embedding_size": 8},
                    {"token_count": 40, "embedding_size": 4}]),
     r"token counts \[16, 40\] add up to 56, not to the vocabulary size 64"),
    (adaptive_softmax.AdaptiveSoftmaxVocabEmbedding,
     dict(clusters=[{"token_count": 16}, {"token_count": 64}]), "add up to 80"),
    (adaptive_softmax.AdaptiveSoftmaxVocabEmbedding,
     dict(clusters=[{"token_count": 16}, {"token_count": 48, "length_projection_factor": 0}]),
     r"length_projection_factor must be in \(0, 1\]"),
    (vocab_embeddings.AdaptiveVocabEmbedding,
     dict(clusters=[{"token_count": 64, "embeding_size": 8}]), "unknown keys"),
    (vocab_embeddings.AdaptiveVocabEmbedding, {}, "clusters is required"),
    (vocab_embeddings.FactorizedVocabEmbedding, {}, "inner_dimension_size must be"),
    (vocab_embeddings.MixtureOfSoftmaxes, dict(num_softmaxes=0), "num_softmaxes must be"),
    (vocab_embeddings.Mixtape, dict(gate_embedding_size=4, frequent_token_fraction=2.0),
     "frequent_token_fraction"),
], ids=["adaptive_counts", "softmax_counts", "projection", "typo", "no_clusters",
        "factorized", "mos", "mixtape"])
def test_bad_settings_are_clear_errors(cls, kwargs, match):
  mesh = mtf.Mesh(mtf.Graph(), "mesh")
  with pytest.raises(ValueError, match=match):
    cls(mesh, vocab, d_model, mtf.VariableDType(), "embedding", None, **kwargs)


def test_softmax_classes_need_shared_weights_and_no_label_smoothing():
  with pytest.raises(ValueError, match="only does with shared_embedding_and_softmax_weights"):
    transformer.Unitransformer(
        _stack(), d_model=D, input_vocab_size=V, output_vocab_size=V, max_length=L,
        vocab_divisor=8, vocab_embedding_cls=vocab_embeddings.MixtureOfSoftmaxes)
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  t = mtf.zeros(mesh, mtf.Shape([batch, length]), dtype=tf.int32)
  model = _lm("lm", lambda *a, **k: adaptive_softmax.AdaptiveSoftmaxVocabEmbedding(
      *a, clusters=SOFTMAX_CLUSTERS, **k), label_smoothing=0.1)
  with pytest.raises(ValueError, match="does not support label_smoothing"):
    model.call_simple(t, t, True)
