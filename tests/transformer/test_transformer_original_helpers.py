"""The original transformer.py's helpers: `make_bitransformer` built from
scoped gin bindings (and its errors without them), `shift_targets`,
`autoregressive_inputs`, `delimited_lm_inputs_mask` and
`sinusoid_positional_embedding_weights`, each against NumPy on one device
and under a layout that splits the length (or position) dimension.
"""

import functools
import sys

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import bitransformer
from mesh_tensorflow.transformer import gin_config
from mesh_tensorflow.transformer import transformer
from mesh_tensorflow.transformer import transformer_layers as tl
from mtf_test_utils import lower_and_run

B, L, V = 8, 8, 32
batch, length = mtf.Dimension("batch", B), mtf.Dimension("length", L)
LAYOUTS = [("all:1", ""), ("rows:2;cols:4", "batch:rows;length:cols")]
LAYOUT_IDS = ["single", "length_split_2x4"]

_rng = np.random.RandomState(0)


def _packed_ids(eos_id=1, seed=0):
  """Rows of packed EOS-terminated sequences, then padding; ids are never
  0 or eos_id inside a sequence. Row 0 is hand-made so that it has an EOS
  right before a slice boundary of the split layout (length 8 over 4)."""
  rng = np.random.RandomState(seed)
  ids = np.zeros((B, L), np.int32)
  segments = np.zeros((B, L), np.int32)
  for row in range(B):
    pos, seg = 0, 1
    while pos < L - 1 and rng.rand() < 0.9:
      n = rng.randint(1, 4)
      body = rng.randint(3, V, size=n)
      body[body == eos_id] = eos_id + 1
      piece = list(body) + [eos_id]
      piece = piece[:L - pos]
      ids[row, pos:pos + len(piece)] = piece
      segments[row, pos:pos + len(piece)] = seg
      pos, seg = pos + len(piece), seg + 1
  ids[0] = [7, eos_id, 9, 4, 5, eos_id, 6, eos_id]
  segments[0] = [1, 1, 2, 2, 2, 2, 3, 3]
  return ids, segments


def _import(mesh, values):
  return mtf.import_tf_tensor(mesh, tf.constant(values), [batch, length])


# ---------------------------------------------------------------- NumPy references
def _np_shift_targets(targets, bos_id, eos_id):
  """Position by position: read the previous target (0 first); an EOS read
  becomes 0; a 0 read at a non-padding target becomes bos_id."""
  out = np.zeros_like(targets)
  for row in range(targets.shape[0]):
    for i in range(targets.shape[1]):
      prev = targets[row, i - 1] if i else 0
      if prev == eos_id:
        prev = 0
      if prev == 0 and targets[row, i] != 0:
        prev = bos_id
      out[row, i] = prev
  return out


def _np_autoregressive_inputs(targets, sequence_id=None):
  out = np.zeros_like(targets)
  out[:, 1:] = np.abs(targets[:, :-1])
  if sequence_id is not None:
    out[:, 1:] *= sequence_id[:, 1:] == sequence_id[:, :-1]
  return out


def _np_delimited_mask(ids, eos_id):
  out = np.zeros(ids.shape, bool)
  for row in range(ids.shape[0]):
    seen = 0
    for i in range(ids.shape[1]):
      out[row, i] = seen % 2 == 0
      seen += ids[row, i] == eos_id
  return out


def _np_sinusoids(positions, channels, min_timescale=1.0, max_timescale=1.0e4):
  """tensor2tensor's get_timing_signal_1d: [sin | cos] halves."""
  half = channels // 2
  increment = np.log(max_timescale / min_timescale) / max(half - 1, 1)
  inv = min_timescale * np.exp(-increment * np.arange(half))
  angle = np.arange(positions)[:, None] * inv[None, :]
  return np.concatenate([np.sin(angle), np.cos(angle)], axis=1)


# ------------------------------------------------- the id helpers against NumPy
@pytest.mark.parametrize("mesh_shape,layout", LAYOUTS, ids=LAYOUT_IDS)
def test_id_helpers_match_numpy(mesh_shape, layout):
  ids, segments = _packed_ids()
  ids2, _ = _packed_ids(eos_id=2, seed=1)
  ids2[1, 3] = 0  # padding inside a row: the next token gets bos_id too
  signed = ids * np.where(_rng.rand(B, L) < 0.3, -1, 1).astype(np.int32)

  def build(mesh):
    t, t2 = _import(mesh, ids), _import(mesh, ids2)
    seg, neg = _import(mesh, segments), _import(mesh, signed)
    return {
        "shift_default": transformer.shift_targets(t),
        "shift_bos": transformer.shift_targets(t, bos_id=2),
        "shift_eos2": transformer.shift_targets(t2, bos_id=5, eos_id=2),
        "ar": transformer.autoregressive_inputs(t),
        "ar_packed": transformer.autoregressive_inputs(neg, sequence_id=seg),
        "mask": transformer.delimited_lm_inputs_mask(t),
        "mask_eos2": transformer.delimited_lm_inputs_mask(t2, eos_id=2),
    }
  out = lower_and_run(build, mesh_shape, layout)
  np.testing.assert_array_equal(out["shift_default"], _np_shift_targets(ids, 0, 1))
  np.testing.assert_array_equal(out["shift_bos"], _np_shift_targets(ids, 2, 1))
  np.testing.assert_array_equal(out["shift_eos2"], _np_shift_targets(ids2, 5, 2))
  np.testing.assert_array_equal(out["ar"], _np_autoregressive_inputs(ids))
  np.testing.assert_array_equal(out["ar_packed"], _np_autoregressive_inputs(signed, segments))
  np.testing.assert_array_equal(out["mask"], _np_delimited_mask(ids, 1))
  np.testing.assert_array_equal(out["mask_eos2"], _np_delimited_mask(ids2, 2))
  # Row 0 by hand: [7, EOS, 9, 4, 5, EOS, 6, EOS], segments [1 1 2 2 2 2 3 3].
  np.testing.assert_array_equal(out["shift_bos"][0], [2, 7, 2, 9, 4, 5, 2, 6])
  np.testing.assert_array_equal(out["shift_default"][0], [0, 7, 0, 9, 4, 5, 0, 6])
  np.testing.assert_array_equal(out["ar"][0], [0, 7, 1, 9, 4, 5, 1, 6])
  np.testing.assert_array_equal(out["ar_packed"][0] != 0, [0, 1, 0, 1, 1, 1, 0, 1])
  np.testing.assert_array_equal(out["mask"][0], [1, 1, 0, 0, 0, 0, 1, 1])
  assert out["ar_packed"].min() >= 0 and signed.min() < 0
  # Padding after the last complete example reads 0 and counts as input.
  padded = np.nonzero(ids[:, -1] == 0)[0]
  assert padded.size and np.all(out["shift_bos"][padded, -1] == 0)


def test_id_helpers_reject_bad_input(graph_and_mesh):
  _, mesh = graph_and_mesh
  floats = mtf.zeros(mesh, mtf.Shape([batch, length]))
  ints = mtf.zeros(mesh, mtf.Shape([batch, length]), dtype=tf.int32)
  with pytest.raises(TypeError, match="shift_targets: targets must hold integer"):
    transformer.shift_targets(floats)
  with pytest.raises(TypeError, match="delimited_lm_inputs_mask: ids must be an mtf.Tensor"):
    transformer.delimited_lm_inputs_mask(np.zeros((B, L), np.int32))
  other = mtf.zeros(mesh, mtf.Shape([batch, mtf.Dimension("other", 3)]), dtype=tf.int32)
  with pytest.raises(ValueError, match="sequence_id .* must have targets' length"):
    transformer.autoregressive_inputs(ints, sequence_id=other)


# --------------------------------------------------------------- the sinusoids
@pytest.mark.parametrize("mesh_shape,layout", [
    ("all:1", ""), ("rows:2;cols:4", "max_length:cols;d_model:rows")], ids=LAYOUT_IDS)
def test_sinusoid_table_matches_tensor2tensor_formula(mesh_shape, layout):
  positions, channels = 16, 12
  max_length = mtf.Dimension("max_length", positions)
  model = mtf.Dimension("d_model", channels)

  def build(mesh):
    return {
        "f32": transformer.sinusoid_positional_embedding_weights(
            mesh, max_length, model, tf.float32),
        "custom": transformer.sinusoid_positional_embedding_weights(
            mesh, max_length, model, tf.bfloat16, min_timescale=2.0, max_timescale=100.0),
    }
  out = lower_and_run(build, mesh_shape, layout)
  assert out["f32"].shape == (positions, channels) and out["custom"].dtype.name == "bfloat16"
  np.testing.assert_allclose(out["f32"], _np_sinusoids(positions, channels), atol=2e-6)
  np.testing.assert_allclose(out["custom"].astype(np.float32),
                             _np_sinusoids(positions, channels, 2.0, 100.0), atol=1e-2)
  half = channels // 2
  # Row 0: sines 0, cosines 1; channel 0 has timescale 1; the last sine 1e4.
  np.testing.assert_array_equal(out["f32"][0], [0.0] * half + [1.0] * half)
  np.testing.assert_allclose(out["f32"][:, 0], np.sin(np.arange(positions)), atol=2e-6)
  np.testing.assert_allclose(out["f32"][:, half], np.cos(np.arange(positions)), atol=2e-6)
  np.testing.assert_allclose(out["f32"][:, half - 1], np.sin(np.arange(positions) / 1e4),
                             rtol=1e-5, atol=1e-8)


def test_sinusoid_table_rejects_odd_model_dim(graph_and_mesh):
  _, mesh = graph_and_mesh
  with pytest.raises(ValueError, match="model_dim .* must have an even size"):
    transformer.sinusoid_positional_embedding_weights(
        mesh, mtf.Dimension("max_length", 4), mtf.Dimension("d_model", 5), tf.float32)
  with pytest.raises(TypeError, match="max_length_dim must be an mtf.Dimension"):
    transformer.sinusoid_positional_embedding_weights(
        mesh, 4, mtf.Dimension("d_model", 4), tf.float32)


# --------------------------------------------------------- make_bitransformer
_GIN = [
    """encoder/transformer.make_layer_stack.layers = [
        @transformer_layers.SelfAttention, @transformer_layers.DenseReluDense]""",
    """decoder/make_layer_stack.layers = [
        @transformer_layers.SelfAttention, @transformer_layers.EncDecAttention,
        @transformer_layers.DenseReluDense]""",
    "make_layer_stack.num_layers = 1",
    "encoder/make_layer_stack.num_layers = 2",
    "transformer.make_bitransformer.input_vocab_size = 20",
    "transformer.make_bitransformer.output_vocab_size = 32",
    "Unitransformer.d_model = 16",
    "Unitransformer.vocab_divisor = 8",
    "Unitransformer.max_length = 8",
    "decoder/Unitransformer.z_loss = 0.0",
    "Bitransformer.shared_embedding = False",
    "SelfAttention.num_heads = 4",
    "SelfAttention.key_value_size = 4",
    "EncDecAttention.num_heads = 4",
    "EncDecAttention.key_value_size = 4",
    "DenseReluDense.hidden_size = 16",
]


@pytest.fixture
def clean_gin():
  gin.clear_config()
  yield
  gin.clear_config()


def _layer_names(unitransformer):
  return [type(layer).__name__ for layer in unitransformer.layer_stack.layers]


def test_make_bitransformer_from_scoped_gin_bindings_trains(clean_gin):
  gin_config.parse([], _GIN, defaults=False)
  model = gin_config.configurable("make_bitransformer")(
      layout="batch:rows", mesh_shape="rows:2;cols:4")
  assert isinstance(model, transformer.Bitransformer) and not model.shared_embedding
  enc, dec = model.encoder, model.decoder
  assert _layer_names(enc) == ["SelfAttention", "DenseReluDense"] * 2
  assert _layer_names(dec) == ["SelfAttention", "EncDecAttention", "DenseReluDense"]
  assert (enc.name, enc.autoregressive, enc.output_vocab_dim) == ("encoder", False, None)
  assert (dec.name, dec.autoregressive) == ("decoder", True)
  assert enc.input_vocab_dim.size == 24 and dec.output_vocab_dim.size == 32
  assert enc.z_loss == 1e-4 and dec.z_loss == 0.0  # the scoped binding: decoder only
  assert enc.model_dim.size == dec.model_dim.size == 16
  assert enc.layout == dec.layout == "batch:rows" and dec.mesh_shape == "rows:2;cols:4"
  inputs_np = _rng.randint(2, 20, size=(B, L)).astype(np.int32)
  targets_np = _rng.randint(2, V, size=(B, L)).astype(np.int32)

  def build(mesh, with_gradients=True):
    inputs, targets = _import(mesh, inputs_np), _import(mesh, targets_np)
    _, loss = model.call_simple(inputs, targets, compute_loss=True)
    if not with_gradients:
      return {"loss": loss}
    variables = mesh.graph.trainable_variables
    grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
    norms = {v.name: mtf.reduce_sum(mtf.square(g)) for v, g in zip(variables, grads)
             if g is not None}
    enc_norm = mtf.add_n([n for k, n in norms.items() if k.startswith("encoder/")])
    return {"loss": loss, "encoder_grad": enc_norm, "count": mtf.constant(
        mesh, len([k for k in norms if k.startswith("encoder/")]), dtype=tf.int32)}
  single = lower_and_run(build, "all:1", "")
  split = lower_and_run(functools.partial(build, with_gradients=False), "rows:2;cols:4",
                        "batch:rows;heads:cols;d_ff:cols")
  assert np.isfinite(single["loss"]) and 0.5 * np.log(V) < single["loss"] < 2 * np.log(V)
  assert single["encoder_grad"] > 0 and single["count"] > 0
  np.testing.assert_allclose(split["loss"], single["loss"], rtol=1e-5)


def test_make_bitransformer_without_layer_bindings_says_what_to_bind(clean_gin):
  gin_config.parse([], ["decoder/make_layer_stack.layers = [@transformer_layers.SelfAttention]"],
                   defaults=False)
  with pytest.raises(ValueError, match=r"encoder/make_layer_stack\.layers = "):
    transformer.make_bitransformer(input_vocab_size=16, output_vocab_size=16)
  gin_config.parse([], ["encoder/make_layer_stack.layers = [@transformer_layers.SelfAttention]"],
                   defaults=False)
  with pytest.raises(ValueError, match=r"the decoder needs a gin binding"):
    transformer.make_bitransformer(input_vocab_size=16, output_vocab_size=16)
  with pytest.raises(ValueError, match="make_bitransformer: input_vocab_size must be a "
                                       "positive integer, got None"):
    transformer.make_bitransformer(output_vocab_size=16)
  with pytest.raises(ValueError, match="output_vocab_size must be a positive integer"):
    transformer.make_bitransformer(16, 0)


def test_make_bitransformer_from_python_without_gin(monkeypatch):
  # Before gin_config is imported, the plain functions are used.
  monkeypatch.delitem(sys.modules, "mesh_tensorflow.transformer.gin_config")
  with pytest.raises(ValueError, match="no default layers.*register_configurables"):
    transformer.make_bitransformer(16, 16)
  # A make_layer_stack with default layers builds both sides, any class.
  layers = [tl.SelfAttention(num_heads=2, key_value_size=4),
            tl.EncDecAttention(num_heads=2, key_value_size=4),
            tl.DenseReluDense(hidden_size=8)]
  monkeypatch.setattr(bitransformer, "make_layer_stack",
                      functools.partial(transformer.make_layer_stack, layers, num_layers=1))
  built = []

  def bitransformer_cls(encoder, decoder):
    built.append((encoder, decoder))
    return "made"
  made = transformer.make_bitransformer(
      130, 300, encoder_name="enc", decoder_name="dec", bitransformer_cls=bitransformer_cls)
  assert made == "made"
  [(enc, dec)] = built
  assert (enc.name, dec.name) == ("enc", "dec") and len(enc.layer_stack.layers) == 3
  assert enc.input_vocab_dim.size == 256 and dec.input_vocab_dim.size == 384
  assert dec.output_vocab_dim.size == 384 and enc.output_vocab_dim is None
