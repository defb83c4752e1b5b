"""TFDSVocabulary / get_tfds_vocabulary and t2t_vocabulary.T2tVocabulary
(read-only Tensor2Tensor subword files)."""

import sys

import numpy as np
import pytest
import tensorflow as tf

from mesh_tensorflow.transformer import t2t_vocabulary, vocabulary


class FakeSubwordEncoder:
  """The TFDS text-encoder interface: ids from 1, 0 reserved for padding."""
  vocab_size = 4

  def encode(self, s):
    return [{"a": 1, "b": 2, "c": 3}[c] for c in s]

  def decode(self, ids):
    return "".join("?abc"[i] for i in ids)


def test_tfds_vocabulary_shifts_ids_to_free_eos():
  vocab = vocabulary.TFDSVocabulary(FakeSubwordEncoder())
  assert vocab.vocab_size == 5
  assert vocab.encode("cab") == [4, 2, 3]
  assert vocab.decode([4, 2, 3, 1, 2]) == "cab"
  assert vocab.decode([0, 4, 0]) == "c"
  assert vocab.encode_tf(tf.constant("ab")).numpy().tolist() == [2, 3]
  assert vocab.encode_tf(tf.constant(["a", "cc"])).to_list() == [[2], [4, 4]]
  assert vocab.decode_tf(tf.constant([[2, 3, 1, 4], [4, 0, 0, 0]])).numpy().tolist() == \
      [b"ab", b"c"]
  with pytest.raises(TypeError, match="has no 'vocab_size'"):
    vocabulary.TFDSVocabulary(object())


def test_get_tfds_vocabulary_without_the_package(monkeypatch):
  monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)
  with pytest.raises(ImportError, match="pip install tensorflow-datasets"):
    vocabulary.get_tfds_vocabulary("lm1b/subwords8k")


# A Tensor2Tensor subword file as SubwordTextEncoder stores it: one quoted
# subtoken per line, the line number its id, "<pad>" and "<EOS>" first.
DIGITS = [str(d) for d in range(10)]
SUBTOKENS = (["<pad>", "<EOS>", "hello_", "world_", "h", "e", "l", "o", "_", " ", "!", "\\",
              ";"] + DIGITS + ["u", "w", "r", "d"])
ID = {s: i for i, s in enumerate(SUBTOKENS)}


@pytest.fixture
def t2t_file(tmp_path):
  path = tmp_path / "vocab.subwords"
  path.write_text("".join(f"'{s}'\n" for s in SUBTOKENS))
  return str(path)


def test_t2t_vocabulary_encodes_and_decodes_like_tensor2tensor(t2t_file):
  vocab = t2t_vocabulary.get_t2t_vocabulary(*t2t_file.rsplit("/", 1))
  assert vocab.vocab_size == len(SUBTOKENS)
  # "hello", "world" (the space between two words is implied) and "!".
  ids = vocab.encode("hello world!")
  assert ids == [ID["hello_"], ID["world_"], ID["!"], ID["_"]]
  assert vocab.decode(ids) == "hello world!"
  # A character outside the alphabet is escaped as \<code point>;
  ids = vocab.encode("he\u20ac")
  assert ids == [ID["h"], ID["e"], ID["_"], ID["\\"], ID["8"], ID["3"], ID["6"], ID["4"],
                 ID[";"], ID["_"]]
  assert vocab.decode(ids + [1, ID["h"]]) == "he\u20ac"
  # "_" in text is escaped as \u.
  assert vocab.decode(vocab.encode("h_e")) == "h_e"
  assert vocab.encode_tf(tf.constant("hello")).numpy().tolist() == [ID["hello_"]]
  np.testing.assert_array_equal(
      vocab.decode_tf(tf.constant([[ID["hello_"], 1, 0]])).numpy(), [b"hello"])


def test_t2t_vocabulary_bad_files(tmp_path):
  with pytest.raises(ValueError, match="no vocabulary file"):
    t2t_vocabulary.T2tVocabulary(str(tmp_path / "missing"))
  bad = tmp_path / "bad.subwords"
  bad.write_text("'a_'\n'b_'\n")
  with pytest.raises(ValueError, match="must start with '<pad>' and '<EOS>'"):
    t2t_vocabulary.T2tVocabulary(str(bad))
  short = tmp_path / "short.subwords"
  short.write_text("'<pad>'\n'<EOS>'\n'a'\n'_'\n")
  with pytest.raises(ValueError, match="cannot spell"):
    t2t_vocabulary.T2tVocabulary(str(short)).encode("b")
