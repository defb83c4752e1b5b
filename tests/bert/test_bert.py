"""mesh_tensorflow.bert: the model (layout-invariant values and gradients,
against NumPy), its config, the tokenizer, the optimizer and the data
handling of the classifier and SQuAD programs."""

import json
import math
import os

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.bert import bert as bert_lib
from mesh_tensorflow.bert import optimization
from mesh_tensorflow.bert import run_classifier
from mesh_tensorflow.bert import run_pretraining
from mesh_tensorflow.bert import run_squad
from mesh_tensorflow.bert import tokenization
from tests import mtf_test_utils as tu

BATCH, SEQ, PRED = 8, 6, 2
VOCAB_SIZE = 50

CONFIG = bert_lib.BertConfig(
    vocab_size=VOCAB_SIZE, d_model=16, num_blocks=2, attention_num_heads=4,
    feedforward_intermediate_size=32, max_position_embeddings=8, type_vocab_size=2)
# A second model exercising the other position signal and residual structure.
VARIANT = bert_lib.BertConfig(
    vocab_size=VOCAB_SIZE, d_model=16, num_blocks=1, attention_num_heads=4,
    feedforward_intermediate_size=32, position_signal="relative_attention_bias",
    residual_structure="direct", block_layers="attention,feedforward,feedforward",
    initializer_range=0.0)

_rs = np.random.RandomState(0)
IDS = _rs.randint(0, VOCAB_SIZE, [BATCH, SEQ]).astype(np.int32)
MASK = np.ones([BATCH, SEQ], np.int32)
MASK[:, 4:] = 0
MASK[0, 2:] = 0
TYPES = np.zeros([BATCH, SEQ], np.int32)
TYPES[:, 2:] = 1
POSITIONS = _rs.randint(0, SEQ, [BATCH, PRED]).astype(np.int32)
LABELS = _rs.randint(0, VOCAB_SIZE, [BATCH, PRED]).astype(np.int32)
WEIGHTS = np.ones([BATCH, PRED], np.float32)
WEIGHTS[1, 1] = 0.0
NSP = _rs.randint(0, 2, [BATCH]).astype(np.int32)


def _build(mesh):
  b, s, p = mtf.Dimension("batch", BATCH), mtf.Dimension("seq", SEQ), \
      mtf.Dimension("max_pred_seq", PRED)

  def imp(x, dims):
    return mtf.import_tf_tensor(mesh, tf.constant(x), dims)
  ids, mask, types = imp(IDS, [b, s]), imp(MASK, [b, s]), imp(TYPES, [b, s])
  model = bert_lib.BertModel(CONFIG, False, ids, mask, types)
  mlm_loss, _, _ = model.get_masked_lm_output(imp(POSITIONS, [b, p]), imp(LABELS, [b, p]),
                                              imp(WEIGHTS, [b, p]))
  nsp_loss, _, _ = model.get_next_sentence_output(imp(NSP, [b]))
  variant = bert_lib.BertModel(VARIANT, False, ids, mask, types, scope="variant")
  loss = mlm_loss + nsp_loss + mtf.reduce_mean(mtf.square(variant.get_pooled_output()))
  variables = mesh.graph.trainable_variables
  grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
  out = {"loss": loss, "mlm_loss": mlm_loss, "nsp_loss": nsp_loss,
         "sequence": model.get_sequence_output(), "pooled": model.get_pooled_output(),
         "variant": variant.get_sequence_output()}
  for v, g in zip(variables, grads):
    out["var/" + v.name] = v.outputs[0]
    out["grad/" + v.name] = g
  return out


@pytest.fixture(scope="module")
def single():
  return tu.lower_and_run(_build, "all:1", "")


def test_variable_names_and_shapes_follow_the_original(single):
  shapes = {k[4:]: v.shape for k, v in single.items() if k.startswith("var/")}
  assert shapes["bert/embeddings/word_embeddings"] == (128, 16)  # vocab padded to 128
  assert shapes["bert/embeddings/token_type_embeddings"] == (2, 16)
  assert shapes["bert/embeddings/position_embeddings"] == (8, 16)
  assert shapes["bert/embeddings/layer_norm/scale"] == (16,)
  assert shapes["bert/encoder/block_1/attention/query/kernel"] == (16, 4, 4)
  assert shapes["bert/encoder/block_1/attention/output/kernel"] == (4, 4, 16)
  assert shapes["bert/encoder/block_0/feedforward/dense_1/kernel"] == (16, 32)
  assert shapes["bert/pooler/dense/kernel"] == (16, 16)
  assert shapes["cls/predictions/output_bias"] == (128,)
  assert shapes["cls/predictions/transform/layer_norm/bias"] == (16,)
  assert shapes["cls/seq_relationship/kernel"] == (16, 2)
  assert shapes["variant/encoder/relative_attention_bias"] == (4, 32)
  assert "variant/encoder/block_0/feedforward_1/dense_2/kernel" in shapes
  assert "variant/embeddings/position_embeddings" not in shapes
  std = single["var/bert/encoder/block_0/attention/key/kernel"].std()
  assert 0.01 < std < 0.03  # truncated normal, stddev 0.02


def _layer_norm(x, scale, bias, eps=1e-6):
  x = x - x.mean(-1, keepdims=True)
  return x / np.sqrt((x ** 2).mean(-1, keepdims=True) + eps) * scale + bias


def _gelu(x):
  return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def test_forward_matches_numpy(single):
  v = {k[4:]: val for k, val in single.items() if k.startswith("var/")}

  def dense(x, name, act=None):
    k = v[name + "/kernel"]
    y = np.tensordot(x, k, axes=[[x.ndim - 1], [0]]) + v[name + "/bias"]
    return act(y) if act else y
  e = "bert/embeddings/"
  x = v[e + "word_embeddings"][IDS] + v[e + "token_type_embeddings"][TYPES] \
      + v[e + "position_embeddings"][:SEQ]
  x = _layer_norm(x, v[e + "layer_norm/scale"], v[e + "layer_norm/bias"])
  bias = (1.0 - MASK[:, None, None, :]) * -10000.0
  for block in range(2):
    a = f"bert/encoder/block_{block}/attention/"
    q, k, val = (dense(x, a + n) for n in ("query", "key", "value"))  # [b, s, h, d]
    scores = np.einsum("bqhd,bkhd->bhqk", q, k) / 2.0 + bias
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    context = np.einsum("bhqk,bkhd->bqhd", probs, val)
    out = np.tensordot(context, v[a + "output/kernel"], axes=[[2, 3], [0, 1]]) \
        + v[a + "output/bias"]
    x = _layer_norm(x + out, v[a + "layer_norm/scale"], v[a + "layer_norm/bias"])
    f = f"bert/encoder/block_{block}/feedforward/"
    out = dense(dense(x, f + "dense_1", _gelu), f + "dense_2")
    x = _layer_norm(x + out, v[f + "layer_norm/scale"], v[f + "layer_norm/bias"])
  tu.assert_allclose(single["sequence"], x, rtol=1e-4, atol=2e-4)
  pooled = dense(x[:, 0], "bert/pooler/dense", np.tanh)
  tu.assert_allclose(single["pooled"], pooled, rtol=1e-4, atol=2e-4)
  # Next sentence loss: mean cross-entropy plus the z-loss 1e-4 * logZ^2.
  logits = dense(pooled, "cls/seq_relationship")
  log_z = np.log(np.exp(logits).sum(-1))
  nsp = (log_z - logits[np.arange(BATCH), NSP] + 1e-4 * log_z ** 2).mean()
  tu.assert_allclose(single["nsp_loss"], nsp, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mesh_shape,layout", [
    ("rows:2;cols:4", "batch:rows;num_heads:cols;intermediate:cols;vocab:cols"),
])
def test_values_and_gradients_do_not_depend_on_the_layout(single, mesh_shape, layout):
  split = tu.lower_and_run(_build, mesh_shape, layout)
  assert set(split) == set(single)
  grads = [k for k in single if k.startswith("grad/")]
  assert len(grads) > 40
  assert any(np.abs(single[k]).max() > 1e-3 for k in grads)
  for key in single:
    tu.assert_allclose(split[key], single[key], rtol=2e-4, atol=2e-5, msg=key)


def test_model_rejects_bad_inputs():
  mesh = mtf.Mesh(mtf.Graph(), "m")
  b, s = mtf.Dimension("batch", 2), mtf.Dimension("seq", 4)
  ids = mtf.zeros(mesh, [b, s], dtype=tf.int32)
  with pytest.raises(ValueError, match="max_position_embeddings=2"):
    bert_lib.BertModel(bert_lib.BertConfig(10, d_model=8, attention_num_heads=2,
                                           max_position_embeddings=2), False, ids)
  with pytest.raises(ValueError, match="not a multiple of attention_num_heads=3"):
    bert_lib.BertModel(bert_lib.BertConfig(10, d_model=8, attention_num_heads=3), False, ids)
  with pytest.raises(ValueError, match="unknown layer types \\['conv'\\]"):
    bert_lib.BertModel(bert_lib.BertConfig(10, d_model=8, attention_num_heads=2,
                                           block_layers="attention,conv"), False, ids)
  with pytest.raises(ValueError, match="input_mask has shape"):
    bert_lib.BertModel(bert_lib.BertConfig(10, d_model=8, attention_num_heads=2), False, ids,
                       input_mask=mtf.zeros(mesh, [b], dtype=tf.int32))


def test_config_round_trips_and_reads_google_names(tmp_path):
  path = tmp_path / "bert_config.json"
  # The published Google BERT-Base config's fields.
  path.write_text(json.dumps({
      "attention_probs_dropout_prob": 0.1, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
      "hidden_size": 768, "initializer_range": 0.02, "intermediate_size": 3072,
      "max_position_embeddings": 512, "num_attention_heads": 12, "num_hidden_layers": 12,
      "type_vocab_size": 2, "vocab_size": 30522}))
  config = bert_lib.BertConfig.from_json_file(str(path))
  assert (config.d_model, config.num_blocks, config.attention_num_heads) == (768, 12, 12)
  assert config.feedforward_intermediate_size == 3072
  assert config.layer_output_dropout_prob == 0.1 and config.vocab_size == 30522
  again = bert_lib.BertConfig.from_dict(json.loads(config.to_json_string()))
  assert again.to_dict() == config.to_dict()
  assert config.to_json_string().endswith("\n")
  d = config.to_dict()
  d["d_model"] = 1
  assert config.d_model == 768  # a copy
  with pytest.raises(ValueError, match="unknown field 'hiden_size'"):
    bert_lib.BertConfig.from_dict({"hiden_size": 3})
  with pytest.raises(ValueError, match="position_signal='rotary'"):
    bert_lib.BertConfig(10, position_signal="rotary")
  with pytest.raises(FileNotFoundError, match="nothing.json"):
    bert_lib.BertConfig.from_json_file(str(tmp_path / "nothing.json"))


def test_get_activation():
  assert bert_lib.get_activation("GELU") is mtf.gelu
  assert bert_lib.get_activation("relu") is mtf.relu
  assert bert_lib.get_activation("linear") is None and bert_lib.get_activation("") is None
  assert bert_lib.get_activation(mtf.tanh) is mtf.tanh
  with pytest.raises(ValueError, match="Unsupported activation: 'swish'"):
    bert_lib.get_activation("swish")


def test_relative_position_bucket_matches_formula():
  mesh = mtf.Mesh(mtf.Graph(), "m")
  n = mtf.Dimension("n", 11)
  values = np.array([-300, -128, -40, -9, -8, -1, 0, 1, 7, 8, 200], np.int32)

  def build(mesh):
    rel = mtf.import_tf_tensor(mesh, tf.constant(values), [n])
    return {"b": bert_lib._relative_position_bucket(rel)}  # pylint: disable=protected-access
  del mesh
  got = tu.lower_and_run(build, "all:1", "")["b"]
  expected = []
  for r in values:
    k = -int(r)
    bucket = 16 if k < 0 else 0
    k = abs(k)
    if k < 8:
      bucket += k
    else:
      bucket += min(15, 8 + int(math.log(k / 8) / math.log(128 / 8) * 8))
    expected.append(bucket)
  np.testing.assert_array_equal(got, expected)


# ---- tokenization ------------------------------------------------------------------
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[unused1]", "the", "un", "##aff",
         "##able", "runn", "##ing", ",", "!", "hello", "world", "中", "国", "cafe"]


@pytest.fixture()
def vocab_file(tmp_path):
  path = tmp_path / "vocab.txt"
  path.write_text("\n".join(VOCAB + ["the"]) + "\n", encoding="utf-8")
  return str(path)


def test_full_tokenizer(vocab_file):
  tok = tokenization.FullTokenizer(vocab_file, do_lower_case=True)
  assert len(tok.vocab) == len(VOCAB)  # a repeated token keeps its first id
  assert tok.tokenize("UNaffable, running!") == ["un", "##aff", "##able", ",", "runn",
                                                 "##ing", "!"]
  assert tok.tokenize(" Café\tHELLO\x00 wörld\u00a0中国 xyz") == [
      "cafe", "hello", "world", "中", "国", "[UNK]"]  # accents stripped
  ids = tok.convert_tokens_to_ids(["[CLS]", "the", "[SEP]"])
  assert ids == [2, 6, 3]
  assert tok.convert_ids_to_tokens(ids) == ["[CLS]", "the", "[SEP]"]
  with pytest.raises(KeyError, match="'zzz' is not in the vocabulary"):
    tok.convert_tokens_to_ids(["zzz"])
  cased = tokenization.FullTokenizer(vocab_file, do_lower_case=False)
  assert cased.tokenize("The the") == ["[UNK]", "the"]


def test_basic_and_wordpiece_tokenizers():
  basic = tokenization.BasicTokenizer(do_lower_case=True)
  assert basic.tokenize(" \tHeLLo!how  \n Are yoU?  ") == ["hello", "!", "how", "are",
                                                           "you", "?"]
  assert basic.tokenize("H\u00E9llo") == ["hello"]
  assert tokenization.BasicTokenizer(do_lower_case=False).tokenize("HäLLo!") == ["HäLLo", "!"]
  wp = tokenization.WordpieceTokenizer(vocab=set(VOCAB), max_input_chars_per_word=9)
  assert wp.tokenize("unaffable running") == ["un", "##aff", "##able", "runn", "##ing"]
  assert wp.tokenize("unaffableness") == ["[UNK]"]  # longer than 9 characters
  assert wp.tokenize("") == []


def test_tokenization_helpers():
  assert tokenization.convert_to_unicode(b"caf\xc3\xa9\xff") == "café"
  assert tokenization.printable_text("x") == "x"
  with pytest.raises(ValueError, match="Unsupported string type"):
    tokenization.convert_to_unicode(3)
  assert tokenization.whitespace_tokenize("  a \n b ") == ["a", "b"]
  assert tokenization.convert_by_vocab({"a": 1}, ["a", "a"]) == [1, 1]
  assert not tokenization.preserve_token("[unused1]", {"[unused1]": 5})  # flag off
  tokenization.validate_case_matches_checkpoint(True, "/m/uncased_L-12_H-768_A-12/bert_model.ckpt")
  tokenization.validate_case_matches_checkpoint(False, None)
  with pytest.raises(ValueError, match="pass --do_lower_case=True"):
    tokenization.validate_case_matches_checkpoint(
        False, "/m/uncased_L-12_H-768_A-12/bert_model.ckpt")
  with pytest.raises(ValueError, match="pass --do_lower_case=False"):
    tokenization.validate_case_matches_checkpoint(
        True, "gs://b/cased_L-12_H-768_A-12/bert_model.ckpt")


# ---- optimization ------------------------------------------------------------------
def test_learning_rate_schedule_and_clipping():
  steps = np.array([0, 5, 10, 55, 100, 150], np.float32)
  n = mtf.Dimension("n", len(steps))

  def build(mesh):
    step = mtf.import_tf_tensor(mesh, tf.constant(steps), [n])
    g1 = mtf.import_tf_tensor(mesh, tf.constant([3.0, 0.0]), [mtf.Dimension("a", 2)])
    g2 = mtf.import_tf_tensor(mesh, tf.constant([4.0]), [mtf.Dimension("c", 1)])
    (c1, none, c2), norm = optimization.clip_by_global_norm([g1, None, g2], 1.0)
    assert none is None
    return {"lr": optimization.learning_rate_schedule(step, 0.1, 100, 10),
            "c1": c1, "c2": c2, "norm": norm}
  out = tu.lower_and_run(build, "all:1", "")
  expected = [0.1 * s / 10 if s < 10 else 0.1 * (1 - min(s, 100) / 100) for s in steps]
  tu.assert_allclose(out["lr"], expected, rtol=1e-6, atol=1e-7)
  tu.assert_allclose(out["norm"], 5.0)
  tu.assert_allclose(out["c1"], [0.6, 0.0])
  tu.assert_allclose(out["c2"], [0.8])


def test_create_optimizer_updates_like_adam_weight_decay():
  x0 = np.array([1.0, -2.0], np.float32)

  def build(mesh):
    w = mtf.get_variable(mesh, "w", [mtf.Dimension("k", 2)],
                         initializer=tf.constant_initializer(x0))
    loss = mtf.reduce_sum(mtf.square(w)) * 0.5
    lr, ops = optimization.create_optimizer(loss, 0.1, 10, 2, global_step=1)
    return {"lr": lr, "ops": ops}
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  out = build(mesh)
  impl = tu.make_impl("all:1", "")

  @tf.function(autograph=False)
  def run():
    lowering = mtf.Lowering(graph, {mesh: impl})
    with tf.control_dependencies([lowering.lowered_operation(o) for o in out["ops"]]):
      return lowering.export_to_tf_tensor(out["lr"])
  lr = float(run())
  assert lr == pytest.approx(0.05)  # step 1 of 2 warm-up steps

  # Read the updated variable back through a second graph on the same impl.
  graph2 = mtf.Graph()
  mesh2 = mtf.Mesh(graph2, "m")
  w_value = mtf.get_variable(mesh2, "w", [mtf.Dimension("k", 2)])
  w = tf.function(lambda: mtf.Lowering(graph2, {mesh2: impl}).export_to_tf_tensor(
      w_value), autograph=False)().numpy()
  # The gradient x0 has norm sqrt(5) > 1: clipped to x0 / sqrt(5). Adam without
  # bias correction (m = 0.1 g, v = 0.001 g^2) plus weight decay 0.01 * w.
  g = x0 / math.sqrt(5)
  expected = x0 - 0.05 * ((0.1 * g) / (np.sqrt(0.001 * g * g) + 1e-6) + 0.01 * x0)
  tu.assert_allclose(w, expected, rtol=1e-5)


def test_optimizer_errors():
  mesh = mtf.Mesh(mtf.Graph(), "m")
  w = mtf.get_variable(mesh, "w", [mtf.Dimension("k", 2)])
  loss = mtf.reduce_sum(w)
  with pytest.raises(ValueError, match="give global_step="):
    optimization.create_optimizer(loss, 0.1, 10, 2)
  with pytest.raises(ValueError, match="Adam has no default learning rate"):
    optimization.make_optimizer(None, 10, 2)
  with pytest.raises(ValueError, match="unknown optimizer 'sgd'"):
    optimization.make_optimizer(0.1, 10, 2, optimizer="sgd")
  _, ops = optimization.create_optimizer(loss, None, 10, 2, optimizer="adafactor")
  assert ops


# ---- classifier and pre-training data ---------------------------------------------------
def _tsv(path, rows):
  path.write_text("\n".join("\t".join(r) for r in rows) + "\n", encoding="utf-8")


def test_processors_read_glue_files(tmp_path):
  # MRPC: Quality, #1 ID, #2 ID, #1 String, #2 String (with a header).
  _tsv(tmp_path / "train.tsv", [["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"],
                                ["1", "10", "11", "He ran.", "He was running."]])
  examples = run_classifier.MrpcProcessor().get_train_examples(str(tmp_path))
  assert [(e.guid, e.text_a, e.text_b, e.label) for e in examples] == [
      ("train-1", "He ran.", "He was running.", "1")]
  # CoLA train/dev: source, label, original label, sentence (no header).
  _tsv(tmp_path / "dev.tsv", [["gj04", "0", "*", "Bill whistled past."]])
  cola = run_classifier.ColaProcessor().get_dev_examples(str(tmp_path))
  assert (cola[0].text_a, cola[0].label, cola[0].text_b) == ("Bill whistled past.", "0", None)
  assert run_classifier.MnliProcessor().get_labels() == ["contradiction", "entailment",
                                                         "neutral"]
  with pytest.raises(FileNotFoundError, match="test_matched.tsv"):
    run_classifier.MnliProcessor().get_test_examples(str(tmp_path))
  with pytest.raises(NotImplementedError):
    run_classifier.DataProcessor().get_labels()


def test_convert_single_example_and_files(vocab_file, tmp_path):
  tok = tokenization.FullTokenizer(vocab_file)
  example = run_classifier.InputExample("g", "the unaffable the the", "hello world !", "b")
  f = run_classifier.convert_single_example(0, example, ["a", "b"], 9, tok)
  # [CLS] a(truncated to 3 pieces) [SEP] b(3) [SEP] = 9; the longer side loses pieces.
  assert f.input_ids == [2, 6, 7, 8, 3, 14, 15, 13, 3]
  assert f.segment_ids == [0, 0, 0, 0, 0, 1, 1, 1, 1]
  assert f.input_mask == [1] * 9 and f.label_id == 1 and f.is_real_example
  short = run_classifier.convert_single_example(
      1, run_classifier.InputExample("h", "hello", None, "a"), ["a", "b"], 6, tok)
  assert short.input_ids == [2, 14, 3, 0, 0, 0] and short.input_mask == [1, 1, 1, 0, 0, 0]
  pad = run_classifier.convert_single_example(2, run_classifier.PaddingInputExample(),
                                              ["a"], 4, tok)
  assert pad.input_ids == [0] * 4 and not pad.is_real_example
  with pytest.raises(ValueError, match="label 'c' is not one of"):
    run_classifier.convert_single_example(
        0, run_classifier.InputExample("x", "the", None, "c"), ["a", "b"], 6, tok)
  record = str(tmp_path / "train.tf_record")
  run_classifier.file_based_convert_examples_to_features([example, example], ["a", "b"], 9,
                                                         tok, record)
  batch = next(iter(run_classifier.file_based_input_fn_builder(record, 9, False, True)(
      {"batch_size": 2})))
  np.testing.assert_array_equal(batch["input_ids"].numpy()[0], f.input_ids)
  np.testing.assert_array_equal(batch["label_ids"].numpy(), [1, 1])
  assert batch["input_ids"].dtype == tf.int32
  mem = next(iter(run_classifier.input_fn_builder([f, f], 9, False, True)({"batch_size": 2})))
  assert set(mem) == set(run_classifier.feature_shapes(2, 9))


def test_pretraining_input_fn_reads_create_pretraining_data_records(tmp_path):
  # The feature names, shapes and dtypes Google BERT's create_pretraining_data writes.
  def ints(v):
    return tf.train.Feature(int64_list=tf.train.Int64List(value=v))
  path = str(tmp_path / "pre.tfrecord")
  with tf.io.TFRecordWriter(path) as w:
    for i in range(3):
      w.write(tf.train.Example(features=tf.train.Features(feature={
          "input_ids": ints([2, 6, 4, 3, i]), "input_mask": ints([1] * 5),
          "segment_ids": ints([0, 0, 0, 0, 1]), "masked_lm_positions": ints([2, 0]),
          "masked_lm_ids": ints([7, 0]),
          "masked_lm_weights": tf.train.Feature(float_list=tf.train.FloatList(
              value=[1.0, 0.0])),
          "next_sentence_labels": ints([i % 2])})).SerializeToString())
  d = run_pretraining.input_fn_builder([path], 5, 2, is_training=False)({"batch_size": 2})
  batch = next(iter(d))
  assert batch["input_ids"].shape == (2, 5) and batch["input_ids"].dtype == tf.int32
  np.testing.assert_array_equal(batch["next_sentence_labels"].numpy(), [0, 1])
  np.testing.assert_array_equal(batch["masked_lm_weights"].numpy(), [[1, 0], [1, 0]])
  assert set(batch) == set(run_pretraining.feature_shapes(2, 5, 2))


# ---- SQuAD ---------------------------------------------------------------------------
SQUAD_VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "who", "wrote", "it", "?", "the", "book",
               "was", "written", "by", "steve", "smith", "in", "1990", ".", "'", "s"]


def test_squad_examples_features_and_predictions(tmp_path):
  vocab = tmp_path / "vocab.txt"
  vocab.write_text("\n".join(SQUAD_VOCAB) + "\n")
  tok = tokenization.FullTokenizer(str(vocab))
  context = "The book was written by Steve Smith in 1990."
  data = {"version": "1.1", "data": [{"title": "t", "paragraphs": [{
      "context": context, "qas": [{"id": "q1", "question": "Who wrote it?", "answers": [
          {"text": "Steve Smith", "answer_start": context.index("Steve")}]}]}]}]}
  path = tmp_path / "train.json"
  path.write_text(json.dumps(data))
  examples = run_squad.read_squad_examples(str(path), is_training=True)
  assert len(examples) == 1
  ex = examples[0]
  assert ex.doc_tokens[ex.start_position:ex.end_position + 1] == ["Steve", "Smith"]
  features = []
  # 4 question pieces + 3 specials leave 5 document pieces per window; stride 3.
  run_squad.convert_examples_to_features(examples, tok, 12, 3, 64, True, features.append)
  assert [f.doc_span_index for f in features] == [0, 1, 2]
  for f in features:
    assert f.tokens[:6] == ["[CLS]", "who", "wrote", "it", "?", "[SEP]"]
    if f.start_position:
      assert f.tokens[f.start_position:f.end_position + 1] == ["steve", "smith"]
  assert sum(1 for f in features if f.start_position) >= 1
  # Each document piece is the "max context" piece of exactly one window.
  total = sum(sum(f.token_is_max_context.values()) for f in features)
  assert total == len(tok.tokenize(context))
  writer = run_squad.FeatureWriter(str(tmp_path / "f.tf_record"), is_training=True)
  for f in features:
    writer.process_feature(f)
  writer.close()
  assert writer.num_features == 3
  batch = next(iter(run_squad.input_fn_builder(str(tmp_path / "f.tf_record"), 12, True, True)(
      {"batch_size": 2})))
  assert set(batch) == set(run_squad.feature_shapes(2, 12, True))
  # Predictions: logits that point at "steve smith" in the window holding it.
  results = []
  for f in features:
    start, end = np.full(12, -5.0), np.full(12, -5.0)
    if f.start_position:
      start[f.start_position], end[f.end_position] = 5.0, 5.0
    results.append(run_squad.RawResult(f.unique_id, list(start), list(end)))
  out = [str(tmp_path / n) for n in ("p.json", "n.json", "o.json")]
  run_squad.write_predictions(examples, features, results, 5, 10, True, *out)
  assert json.loads(open(out[0]).read()) == {"q1": "Steve Smith"}
  nbest = json.loads(open(out[1]).read())["q1"]
  assert nbest[0]["text"] == "Steve Smith" and nbest[0]["probability"] > 0.9


def test_get_final_text_and_flag_validation():
  assert run_squad.get_final_text("steve smith", "Steve Smith's", True) == "Steve Smith"
  assert run_squad.get_final_text("1990", "(1990).", True) == "1990"
  assert run_squad.get_final_text("nothing", "Steve", True) == "Steve"
  config = bert_lib.BertConfig(10, max_position_embeddings=512)
  with pytest.raises(ValueError, match="At least one of --do_train or --do_predict"):
    run_squad.validate_flags_or_throw(config)


def test_estimator_only_arguments_name_the_replacement():
  with pytest.raises(ValueError, match="mtf.training.Trainer"):
    run_classifier.model_fn_builder(CONFIG, 2, None, 1e-4, 10, 1, use_tpu=True)
  with pytest.raises(ValueError, match="mtf.training.Trainer"):
    run_squad.model_fn_builder(CONFIG, None, 1e-4, 10, 1, use_tpu=True)


def test_docs_examples_run():
  import re  # pylint: disable=g-import-not-at-top
  page = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "docs",
                      "bert.md")
  with open(page, encoding="utf-8") as f:
    blocks = re.findall(r"```python\n(.*?)```", f.read(), re.S)
  assert blocks
  for block in blocks:
    exec(compile(block, "docs/bert.md", "exec"), {})  # pylint: disable=exec-used


def test_moe_blocks_add_their_load_balancing_loss():
  config = bert_lib.BertConfig(vocab_size=50, d_model=16, num_blocks=1,
                               block_layers="attention,moe", attention_num_heads=4,
                               moe_num_experts=4, moe_intermediate_size=16,
                               max_position_embeddings=8)

  def build(mesh):
    b, s = mtf.Dimension("batch", BATCH), mtf.Dimension("seq", SEQ)
    ids = mtf.import_tf_tensor(mesh, tf.constant(IDS), [b, s])
    model = bert_lib.BertModel(config, False, ids, mesh_shape="all:1", layout="")
    names = [v.name for v in mesh.graph.trainable_variables]
    assert any(n.startswith("bert/encoder/block_0/moe/") for n in names), names
    return {"seq": model.get_sequence_output(), "extra": model.get_extra_loss()}
  out = tu.lower_and_run(build, "all:1", "")
  assert np.isfinite(out["seq"]).all()
  assert 0.0 < out["extra"] < 1.0


def test_make_optimizer_leaves_large_variables_untrained():
  impl = tu.make_impl("all:1", "")

  def variables(mesh):
    small = mtf.get_variable(mesh, "small", [mtf.Dimension("k", 2)],
                             initializer=tf.ones_initializer())
    big = mtf.get_variable(mesh, "big", [mtf.Dimension("k", 2), mtf.Dimension("j", 3)],
                           initializer=tf.ones_initializer())
    return small, big
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  small, big = variables(mesh)
  loss = mtf.reduce_sum(small) + mtf.reduce_sum(big)
  opt = optimization.make_optimizer(0.1, 10, 0, max_optimized_variable_size=2)(
      mtf.constant(mesh, 1.0))
  grads = mtf.gradients([loss], [small, big])
  ops = opt.apply_grads(grads, graph.trainable_variables)
  @tf.function(autograph=False)
  def update():
    lowering = mtf.Lowering(graph, {mesh: impl})
    for o in ops:
      lowering.lowered_operation(o)
  update()
  graph2 = mtf.Graph()
  mesh2 = mtf.Mesh(graph2, "m")
  small2, big2 = variables(mesh2)

  @tf.function(autograph=False)
  def read():
    lowering = mtf.Lowering(graph2, {mesh2: impl})
    return lowering.export_to_tf_tensor(small2), lowering.export_to_tf_tensor(big2)
  small_value, big_value = (t.numpy() for t in read())
  assert (small_value < 1.0).all()  # trained
  np.testing.assert_array_equal(big_value, np.ones([2, 3]))  # 6 elements > 2: untouched


def test_original_default_layout_fits_any_mesh_but_given_layouts_must_fit():
  from mesh_tensorflow.bert import _runner  # pylint: disable=g-import-not-at-top
  impl = _runner.make_mesh_impl("batch:2", _runner.DEFAULT_LAYOUT)
  layout = impl.tensor_layout(mtf.Shape([mtf.Dimension("batch", 4),
                                         mtf.Dimension("vocab", 128)]))
  assert str(layout) == "TensorLayout(0, None)"
  with pytest.raises(ValueError, match="'vocab:model' names mesh dimension 'model'"):
    _runner.make_mesh_impl("batch:2", "batch:batch;vocab:model")
