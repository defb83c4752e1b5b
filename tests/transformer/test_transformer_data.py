"""Vocabularies, the tf.data pipelines (packing, determinism, splits) and the
gin files of mesh_tensorflow.transformer."""

import os
import sys

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import dataset
from mesh_tensorflow.transformer import gin_config
from mesh_tensorflow.transformer import inference
from mesh_tensorflow.transformer import vocabulary

TEXTS = ["hello", "", "naïve café ☕", "tab\there\nnewline", "\x00\x7f\xff"]


# ---------------------------------------------------------------- vocabulary
@pytest.mark.parametrize("text", TEXTS)
def test_byte_vocabulary_round_trip(text):
  vocab = vocabulary.ByteVocabulary()
  ids = vocab.encode(text)
  assert all(3 <= i < 259 for i in ids)
  assert vocab.decode(ids) == text
  assert vocab.decode(ids + [vocab.eos_id] + vocab.encode("ignored")) == text
  assert vocab.decode([0] + ids + [0]) == text  # padding is skipped
  assert vocab.encode_tf(text).numpy().tolist() == ids
  assert vocab.decode_tf(tf.constant(ids + [1, 50], tf.int32)).numpy().decode() == text


def test_byte_vocabulary_tf_batches_match_python():
  vocab = vocabulary.ByteVocabulary()
  ragged = vocab.encode_tf(tf.constant(TEXTS))
  assert ragged.to_list() == [vocab.encode(t) for t in TEXTS]
  ids = np.zeros([len(TEXTS), 40], np.int32)
  for row, text in enumerate(TEXTS):
    ids[row, :len(vocab.encode(text))] = vocab.encode(text)
  decoded = [s.decode() for s in vocab.decode_tf(tf.constant(ids)).numpy().tolist()]
  assert decoded == TEXTS == vocab.decode_batch(ids)
  assert vocab.vocab_size == 259
  assert vocabulary.ByteVocabulary(extra_ids=5).vocab_size == 264


def test_byte_vocabulary_invalid_utf8_is_replaced_alike():
  vocab = vocabulary.ByteVocabulary()
  ids = [0xC3 + 3, 0x28 + 3]  # an invalid two-byte sequence
  assert vocab.decode(ids) == vocab.decode_tf(tf.constant(ids)).numpy().decode() == "\ufffd("


def test_sentencepiece_without_the_package_says_what_to_install(monkeypatch):
  monkeypatch.setitem(sys.modules, "sentencepiece", None)
  with pytest.raises(ImportError, match="pip install sentencepiece"):
    vocabulary.SentencePieceVocabulary("/nonexistent.model")


def test_sentencepiece_round_trip(tmp_path):
  spm = pytest.importorskip("sentencepiece")
  corpus = tmp_path / "corpus.txt"
  corpus.write_text("\n".join(f"the quick brown fox {i} jumps over the lazy dog"
                              for i in range(200)))
  spm.SentencePieceTrainer.train(
      input=str(corpus), model_prefix=str(tmp_path / "spm"), vocab_size=40, pad_id=0,
      eos_id=1, unk_id=2, bos_id=-1)
  vocab = vocabulary.SentencePieceVocabulary(str(tmp_path / "spm.model"))
  ids = vocab.encode("the lazy fox")
  assert vocab.decode(ids + [1, 5]) == "the lazy fox"
  assert vocab.encode_tf("the lazy fox").numpy().tolist() == ids
  assert vocab.decode_tf(tf.constant([ids + [1]])).numpy()[0].decode() == "the lazy fox"


# ------------------------------------------------------------------ packing
def _examples(*rows):
  return tf.data.Dataset.from_tensor_slices(
      {"targets": tf.ragged.constant(list(rows), dtype=tf.int32)}).map(
          lambda ex: {"targets": ex["targets"]})


def test_pack_next_fit_with_segments_and_positions():
  rows = list(dataset.pack(_examples([5, 6, 1], [7, 1], [8, 9, 10, 11, 1], [], [2, 1],
                                     [3, 3, 3, 3, 3, 3]), 6).as_numpy_iterator())
  assert [r["targets"].tolist() for r in rows] == [
      [5, 6, 1, 7, 1, 0], [8, 9, 10, 11, 1, 0], [2, 1, 0, 0, 0, 0], [3, 3, 3, 3, 3, 3]]
  assert rows[0]["targets_segmentation"].tolist() == [1, 1, 1, 2, 2, 0]
  assert rows[0]["targets_position"].tolist() == [0, 1, 2, 0, 1, 0]
  assert rows[3]["targets_position"].tolist() == [0, 1, 2, 3, 4, 5]


def test_pack_pairs_keeps_inputs_and_targets_aligned():
  pairs = tf.data.Dataset.from_tensor_slices({
      "inputs": tf.ragged.constant([[4, 1], [5, 5, 1], [6, 1]]),
      "targets": tf.ragged.constant([[7, 7, 1], [8, 1], [9, 9, 9, 1]])}).map(
          lambda ex: {"inputs": ex["inputs"], "targets": ex["targets"]})
  rows = list(dataset.pack(pairs, {"inputs": 5, "targets": 6},
                           ["inputs", "targets"]).as_numpy_iterator())
  assert rows[0]["inputs"].tolist() == [4, 1, 5, 5, 1]
  assert rows[0]["inputs_segmentation"].tolist() == [1, 1, 2, 2, 2]
  assert rows[0]["targets"].tolist() == [7, 7, 1, 8, 1, 0]
  assert rows[0]["targets_segmentation"].tolist() == [1, 1, 1, 2, 2, 0]
  assert rows[1]["inputs"].tolist() == [6, 1, 0, 0, 0]
  assert rows[1]["targets"].tolist() == [9, 9, 9, 1, 0, 0]


def test_split_tokens_and_trim():
  pieces = dataset.split_tokens(_examples([1, 2, 3, 4, 5], [6, 7]), 2)
  assert [p["targets"].tolist() for p in pieces.as_numpy_iterator()] == [
      [1, 2], [3, 4], [5], [6, 7]]
  trimmed = dataset.trim(_examples([1, 2, 3, 4, 9], [6, 9]), {"targets": 3})
  assert [p["targets"].tolist() for p in trimmed.as_numpy_iterator()] == [[1, 2, 9], [6, 9]]


def test_packed_rows_reproduce_the_text(tmp_path):
  path = tmp_path / "a.txt"
  lines = [f"line number {i} " * (i % 5 + 1) for i in range(40)]
  path.write_text("\n".join(lines) + "\n")
  vocab = vocabulary.ByteVocabulary()
  ds = dataset.lm_dataset([str(path)], vocab, 64, 4, seed=None, repeat=False, unit="line")
  texts = []
  for batch in ds.as_numpy_iterator():
    for row, seg in zip(batch["targets"], batch["targets_segmentation"]):
      for s in range(1, seg.max() + 1):
        texts.append(vocab.decode(row[seg == s].tolist() + [1]))
  # Unshuffled and packed in order: the text comes back piece by piece
  # (a short last batch is dropped).
  assert "".join(texts) and "".join(lines).startswith("".join(texts))


def test_lm_dataset_is_deterministic_given_the_seed():
  files = dataset.stdlib_files(max_bytes=300_000)
  vocab = vocabulary.ByteVocabulary()

  def first(seed, n=3):
    ds = dataset.lm_dataset(files, vocab, 64, 8, seed=seed, shuffle_buffer=500)
    return [b["targets"] for b in ds.take(n).as_numpy_iterator()]

  a, b, c = first(1), first(1), first(2)
  assert all(np.array_equal(x, y) for x, y in zip(a, b))
  assert not all(np.array_equal(x, y) for x, y in zip(a, c))
  # Skipping (as a resumed Trainer does) gives the same later batches.
  ds = dataset.lm_dataset(files, vocab, 64, 8, seed=1, shuffle_buffer=500)
  assert np.array_equal(next(iter(ds.skip(2)))["targets"], a[2])


@pytest.mark.parametrize("model_type", ["lm", "bitransformer"])
def test_input_pipelines_are_not_rewritten_by_autograph(model_type, tmp_path):
  """The functions the pipelines hand to tf.data already use TensorFlow's
  control flow, so AutoGraph (whose rewritten functions are named tf__*) must
  leave them alone: converting them cost seconds at every start."""
  converted = []

  def watch(frame, event, arg):
    if event == "call" and frame.f_code.co_name.startswith("tf__"):
      converted.append(frame.f_code.co_name)
  text = tmp_path / "a.txt"
  text.write_text("first paragraph\n\nsecond one\n")
  pairs = tmp_path / "pairs.tsv"
  pairs.write_text("abc\tx\n")
  vocab = vocabulary.ByteVocabulary()
  sys.setprofile(watch)
  try:
    if model_type == "lm":
      for unit in ("line", "paragraph", "file"):
        ds = dataset.lm_dataset([str(text)], vocab, 16, 1, seed=1, repeat=False, unit=unit)
        assert next(iter(ds))["targets"].shape == [1, 16]
    else:
      for packed in (True, False):
        ds = dataset.pairs_dataset([str(pairs)], vocab, {"inputs": 8, "targets": 8}, 1, 1,
                                   packed=packed)
        assert next(iter(ds))["inputs"].shape == [1, 8]
  finally:
    sys.setprofile(None)
  assert not converted, sorted(set(converted))


def test_stdlib_corpus_splits_are_fixed_and_disjoint():
  train, held_out = dataset.stdlib_files("train"), dataset.stdlib_files("validation")
  assert train and held_out and not set(train) & set(held_out)
  assert train == sorted(train) and len(held_out) * 8 < len(train)
  assert sum(os.path.getsize(f) for f in train + held_out) <= dataset.DEFAULT_CORPUS_BYTES
  assert dataset.stdlib_files("train") == train
  pairs = dataset.stdlib_docstring_pairs("validation", max_pairs=5)
  assert len(pairs) == 5 and all(p[0].startswith("def ") and p[1] for p in pairs)


def test_tsv_pairs_dataset(tmp_path):
  path = tmp_path / "pairs.tsv"
  path.write_text("abc\tx\nno tab here\ndef\tyz\tw\n")
  ds = dataset.pairs_dataset([str(path)], vocabulary.ByteVocabulary(),
                             {"inputs": 8, "targets": 8}, batch_size=1, seed=None,
                             repeat=False)
  (batch,) = list(ds.as_numpy_iterator())
  vocab = vocabulary.ByteVocabulary()
  seg = batch["targets_segmentation"][0]
  assert vocab.decode(batch["inputs"][0][batch["inputs_segmentation"][0] == 2]) == "def"
  assert vocab.decode(batch["targets"][0][seg == 1]) == "x"
  assert vocab.decode(batch["targets"][0][seg == 2]) == "yz\tw"


def test_escaped_lines_round_trip(tmp_path):
  # Also the characters str.splitlines() breaks at besides newline and CR
  # (a model's output may hold any of them).
  texts = ["plain", "two\nlines", "back\\slash\\n", "tab\t", "fs\x1cvt\x0bff\x0c",
           "nel\x85ls\u2028ps\u2029", "literal \\x1c stays"]
  inference.write_lines(str(tmp_path / "f.txt"), texts)
  assert inference.read_lines(str(tmp_path / "f.txt")) == texts
  assert len((tmp_path / "f.txt").read_text().splitlines()) == len(texts)


# --------------------------------------------------------------------- gin
@pytest.fixture
def clean_gin():
  yield
  gin.clear_config()


@pytest.mark.parametrize("path", gin_config.gin_files("layouts"),
                         ids=lambda p: os.path.basename(p))
def test_every_layout_gin_file_parses_into_a_valid_mesh(path, clean_gin):
  gin_config.parse(["models/tiny_lm.gin", path])
  # Layout files set the macros that run.mesh_shape and run.layout_rules read.
  mesh_shape = mtf.convert_to_shape(gin.query_parameter("%mesh_shape"))
  rules = mtf.convert_to_layout_rules(gin.query_parameter("%layout"))
  rules.check_mesh_shape(mesh_shape)
  assert mesh_shape.size in (1, 8, 32, 128)
  if mesh_shape.size <= 8:
    # The tiny model's sizes divide whatever the layout splits.
    impl = mtf.placement_mesh_impl.PlacementMeshImpl(
        mesh_shape, rules, [f"cpu:{i}" for i in range(mesh_shape.size)])
    for dims in ("batch:32;length:128;d_model:128", "heads:8;d_kv:16;d_model:128",
                 "d_ff:512;d_model:128", "vocab:264;d_model:128", "experts:8;d_ff:512"):
      impl.slice_shape(mtf.convert_to_shape(dims))


@pytest.mark.parametrize("path", gin_config.gin_files("models")
                         + gin_config.gin_files("learning_rate_schedules"),
                         ids=lambda p: os.path.relpath(p, gin_config.GIN_DIR))
def test_model_and_schedule_gin_files_parse(path, clean_gin):
  gin_config.parse([path])
  assert gin.query_parameter("run.model_type") in ("lm", "bitransformer")
  schedule = gin.query_parameter("run.learning_rate_schedule")
  assert schedule is not None


def test_learning_rate_schedules_from_gin(clean_gin):
  gin_config.parse(["learning_rate_schedules/constant.gin"])
  from mesh_tensorflow.transformer import learning_rate_schedules as lrs  # pylint: disable=g-import-not-at-top
  assert lrs.constant_with_warmup(50) == pytest.approx(0.0005)
  assert lrs.constant_with_warmup(500) == pytest.approx(0.001)


def test_unknown_gin_file_is_a_clear_error(clean_gin):
  with pytest.raises(ValueError, match="No gin file 'models/huge.gin'"):
    gin_config.parse(["models/huge.gin"])


def test_too_small_corpus_or_no_files_is_one_clear_line():
  with pytest.raises(ValueError, match=r"corpus_bytes = 50000 .* too few for a validation "
                     r"split .* at least \d+"):
    dataset.stdlib_files("validation", 50000)
  train = dataset.stdlib_files("train", 300_000)
  assert train  # a large enough corpus still splits
  with pytest.raises(ValueError, match="No files given"):
    dataset.text_dataset([], unit="file")
