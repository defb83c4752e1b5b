"""Vocabularies: text <-> token ids, in Python and inside tf.data.

Every vocabulary keeps two ids fixed, because the models and the data pipeline
rely on them: 0 is padding (and "no token yet" at the start of decoding) and 1
is end-of-sequence.

    >>> vocab = ByteVocabulary()
    >>> vocab.encode("hi")
    [107, 108]
    >>> vocab.decode([107, 108, 1, 50])
    'hi'
    >>> vocab.vocab_size
    259

`ByteVocabulary` needs no files and is the default. `SentencePieceVocabulary`
loads a trained SentencePiece model when the `sentencepiece` package is
installed.
"""

from __future__ import annotations

import abc
from typing import Iterable, List, Optional, Sequence, Union

import gin
import numpy as np
import tensorflow as tf

from mesh_tensorflow import _environment

PAD_ID = 0
EOS_ID = 1


class Vocabulary(abc.ABC):
  """Maps text to integer ids and back.

  Subclasses implement `vocab_size`, `encode`, `decode`, `encode_tf` and
  `decode_tf`. Ids 0 (`pad_id`) and 1 (`eos_id`) are reserved.

  Example:
    >>> ids = vocab.encode("text")
    >>> vocab.decode(ids + [vocab.eos_id])
    'text'
  """

  @property
  def pad_id(self) -> int:
    """The padding id (0)."""
    return PAD_ID

  @property
  def eos_id(self) -> int:
    """The end-of-sequence id (1)."""
    return EOS_ID

  @property
  @abc.abstractmethod
  def vocab_size(self) -> int:
    """Number of ids, special ones included (ids are 0..vocab_size-1)."""

  @abc.abstractmethod
  def encode(self, text: str) -> List[int]:
    """The ids of `text` (no end-of-sequence id added)."""

  @abc.abstractmethod
  def decode(self, ids: Iterable[int]) -> str:
    """The text of `ids`, stopping at the first end-of-sequence id.

    Padding and ids the vocabulary does not know are skipped.
    """

  @abc.abstractmethod
  def encode_tf(self, text: tf.Tensor) -> Union[tf.Tensor, tf.RaggedTensor]:
    """encode() as TensorFlow ops: a string scalar gives an int32 vector, a
    string tensor of rank >= 1 gives a ragged int32 tensor with one more
    dimension."""

  @abc.abstractmethod
  def decode_tf(self, ids: tf.Tensor) -> tf.Tensor:
    """decode() as TensorFlow ops: int ids [..., length] give strings [...]."""

  def decode_batch(self, ids: Union[np.ndarray, Sequence[Sequence[int]]]) -> List[str]:
    """decode() of every row of a 2-D array.

    Example:
      >>> vocab.decode_batch([[107, 108, 1], [108, 0, 0]])
      ['hi', 'i']
    """
    return [self.decode(row) for row in np.asarray(ids).tolist()]

  def _ids_before_eos(self, ids: Iterable[int]) -> List[int]:
    out = []
    for i in ids:
      i = int(i)
      if i == self.eos_id:
        break
      out.append(i)
    return out


@gin.configurable
class ByteVocabulary(Vocabulary):
  """UTF-8 bytes as tokens: id = byte + 3, after pad (0), EOS (1) and UNK (2).

  Needs no files, covers every string, and makes a model's vocabulary small
  (259 ids). Decoding turns invalid UTF-8 into U+FFFD.

  Args:
    extra_ids: more ids after the 256 bytes (e.g. sentinels); they decode to
      nothing.

  Example:
    >>> vocab = ByteVocabulary()
    >>> vocab.encode("é")
    [198, 172]
    >>> vocab.decode(vocab.encode("naïve"))
    'naïve'
  """

  OFFSET = 3
  UNK_ID = 2

  def __init__(self, extra_ids: int = 0):
    if extra_ids < 0:
      raise ValueError(f"ByteVocabulary: extra_ids must be >= 0, got {extra_ids}.")
    self._extra_ids = extra_ids

  @property
  def vocab_size(self) -> int:
    return self.OFFSET + 256 + self._extra_ids

  def encode(self, text: str) -> List[int]:
    return [b + self.OFFSET for b in text.encode("utf-8")]

  def decode(self, ids: Iterable[int]) -> str:
    data = bytes(i - self.OFFSET for i in self._ids_before_eos(ids)
                 if self.OFFSET <= i < self.OFFSET + 256)
    return data.decode("utf-8", errors="replace")

  def encode_tf(self, text: tf.Tensor) -> Union[tf.Tensor, tf.RaggedTensor]:
    text = tf.convert_to_tensor(text, tf.string)
    pieces = tf.strings.bytes_split(text)  # one-byte strings, ragged if rank >= 1

    def to_ids(flat_pieces):
      raw = tf.io.decode_raw(flat_pieces, tf.uint8, fixed_length=1)
      return tf.cast(tf.reshape(raw, [-1]), tf.int32) + self.OFFSET

    if isinstance(pieces, tf.RaggedTensor):
      return tf.ragged.map_flat_values(to_ids, pieces)
    return to_ids(pieces)

  def decode_tf(self, ids: tf.Tensor) -> tf.Tensor:
    ids = tf.cast(tf.convert_to_tensor(ids), tf.int32)
    # Everything from the first EOS on is dropped: mark it as id 0.
    after_eos = tf.cumsum(tf.cast(tf.equal(ids, self.eos_id), tf.int32), axis=-1) > 0
    ids = tf.where(after_eos, tf.zeros_like(ids), ids)
    # One string per id: the byte for byte ids, "" for special or unknown ids.
    table = tf.constant([b""] * self.OFFSET + [bytes([b]) for b in range(256)] + [b""])
    in_range = (ids >= self.OFFSET) & (ids < self.OFFSET + 256)
    index = tf.where(in_range, ids, tf.fill(tf.shape(ids), self.OFFSET + 256))
    joined = tf.strings.reduce_join(tf.gather(table, index), axis=-1)
    # Invalid UTF-8 becomes U+FFFD, as in decode().
    return tf.strings.unicode_transcode(joined, "UTF-8", "UTF-8", errors="replace")


@gin.configurable
class SizedVocabulary(ByteVocabulary):
  """A vocabulary of which only the size is known: enough to plan a run
  (`python -m mesh_tensorflow.plan`) or report a layout without a
  vocabulary file. It encodes and decodes as `ByteVocabulary`.

  gin: `run.vocabulary = @vocabulary.SizedVocabulary()` and
  `vocabulary.SizedVocabulary.size = 51200`.

  Args:
    size: the number of token ids (the model's vocabulary dimension, before
      `vocab_divisor` rounding).

  Example:
    >>> SizedVocabulary(51200).vocab_size
    51200
  """

  def __init__(self, size: int = 32000):
    super().__init__()
    if size <= 0:
      raise ValueError(f"SizedVocabulary.size must be positive, got {size}.")
    self._size = int(size)

  @property
  def vocab_size(self) -> int:
    return self._size


@gin.configurable
class SentencePieceVocabulary(Vocabulary):
  """A trained SentencePiece model (needs `pip install sentencepiece`).

  The model must use the ids this library reserves: pad 0, EOS 1 (and
  typically UNK 2, no BOS), as T5's models do. Train one with

      spm_train --input=text.txt --model_prefix=spm --vocab_size=8000 \\
          --pad_id=0 --eos_id=1 --unk_id=2 --bos_id=-1

  `extra_ids` sentinels follow the model's pieces, as T5 adds them: the
  pieces "▁<extra_id_N>" (user-defined, so that they are never split)
  in reverse order, so `<extra_id_0>` is the highest id (`vocab_size - 1`),
  `<extra_id_1>` the one below, and text holding them (span-corruption
  inputs and targets) encodes and decodes as with T5's vocabulary. T5's
  models use 32000 pieces and 100 extra ids: 32100 ids, which the model
  rounds up to 32128 (`Unitransformer.vocab_divisor = 128`).

  Args:
    sentencepiece_model_file: path of the `.model` file.
    extra_ids: sentinel ids after the model's pieces (T5: 100).

  Example:
    >>> vocab = SentencePieceVocabulary("/data/spm.model", extra_ids=100)
    >>> vocab.decode(vocab.encode("hello world"))
    'hello world'
    >>> vocab.encode("<extra_id_0>") == [vocab.vocab_size - 1]
    True
  """

  def __init__(self, sentencepiece_model_file: str, extra_ids: int = 0):
    sentencepiece = _environment.require_optional(
        "sentencepiece", "SentencePieceVocabulary", "sentencepiece",
        alternative="use ByteVocabulary, which needs no files")
    if not tf.io.gfile.exists(sentencepiece_model_file):
      raise ValueError(
          f"SentencePieceVocabulary: no model file {sentencepiece_model_file!r}.")
    with tf.io.gfile.GFile(sentencepiece_model_file, "rb") as f:
      self._model_proto = f.read()
    if extra_ids < 0:
      raise ValueError(f"SentencePieceVocabulary: extra_ids must be >= 0, got {extra_ids}.")
    if extra_ids:
      self._model_proto = _with_sentinel_pieces(self._model_proto, extra_ids,
                                                sentencepiece_model_file)
    self._sp = sentencepiece.SentencePieceProcessor()
    self._sp.LoadFromSerializedProto(self._model_proto)
    if self._sp.pad_id() != PAD_ID or self._sp.eos_id() != EOS_ID:
      raise ValueError(
          f"SentencePieceVocabulary: {sentencepiece_model_file!r} has pad id "
          f"{self._sp.pad_id()} and EOS id {self._sp.eos_id()}; this library needs pad 0 "
          "and EOS 1. Train the model with --pad_id=0 --eos_id=1 --unk_id=2 --bos_id=-1.")
    self._extra_ids = extra_ids
    self._file = sentencepiece_model_file

  @property
  def vocab_size(self) -> int:
    """The model's pieces plus the extra ids (the sentinels are pieces too)."""
    return self._sp.GetPieceSize()

  @property
  def extra_ids(self) -> int:
    return self._extra_ids

  @property
  def model_proto(self) -> bytes:
    """The serialized SentencePiece model, sentinel pieces included."""
    return self._model_proto

  def sentinel_id(self, index: int) -> int:
    """The id of `<extra_id_{index}>` (T5's: vocab_size - 1 - index).

    Example:
      >>> vocab.sentinel_id(0) == vocab.vocab_size - 1
      True
    """
    if not 0 <= index < self._extra_ids:
      raise ValueError(f"SentencePieceVocabulary: <extra_id_{index}> is not among the "
                       f"{self._extra_ids} extra ids.")
    return self.vocab_size - 1 - index

  def encode(self, text: str) -> List[int]:
    return list(self._sp.EncodeAsIds(text))

  def decode(self, ids: Iterable[int]) -> str:
    size = self._sp.GetPieceSize()
    return self._sp.DecodeIds([i for i in self._ids_before_eos(ids)
                               if 0 < i < size and i != self.eos_id])

  @property
  def exports_graph_ops(self) -> bool:
    """Whether encode_tf / decode_tf are TensorFlow ops a SavedModel holds:
    with tensorflow-text installed they run its SentencePiece op (a process
    loading such a SavedModel imports tensorflow_text first); without it they
    call the sentencepiece package from Python."""
    return self._tf_text_tokenizer() is not None

  def _tf_text_tokenizer(self):
    if not hasattr(self, "_tf_tokenizer"):
      try:
        import tensorflow_text  # pylint: disable=g-import-not-at-top
      except ImportError:
        self._tf_tokenizer = None
      else:
        # Made eagerly, so that the datasets and functions traced later
        # capture one model resource.
        with tf.init_scope():
          self._tf_tokenizer = tensorflow_text.SentencepieceTokenizer(
              model=self._model_proto, out_type=tf.int32)
    return self._tf_tokenizer

  def saved_model_resources(self) -> list:
    """The trackable objects a SavedModel using encode_tf / decode_tf holds."""
    tokenizer = self._tf_text_tokenizer()
    return [] if tokenizer is None else [tokenizer]

  def encode_tf(self, text: tf.Tensor) -> Union[tf.Tensor, tf.RaggedTensor]:
    text = tf.convert_to_tensor(text, tf.string)
    if text.shape.rank not in (0, 1):
      raise ValueError("SentencePieceVocabulary.encode_tf takes a string scalar or vector, "
                       f"got shape {text.shape}.")
    tokenizer = self._tf_text_tokenizer()
    if tokenizer is not None:
      return tokenizer.tokenize(text)

    def encode_bytes(b):
      b = b.item() if isinstance(b, np.ndarray) else b
      return np.asarray(self.encode(b.decode("utf-8")), np.int32)

    def encode_one(s):
      ids = tf.numpy_function(encode_bytes, [s], tf.int32, stateful=False)
      return tf.reshape(ids, [-1])

    if text.shape.rank == 0:
      return encode_one(text)
    return tf.map_fn(encode_one, text,
                     fn_output_signature=tf.RaggedTensorSpec([None], tf.int32))

  def decode_tf(self, ids: tf.Tensor) -> tf.Tensor:
    ids = tf.cast(tf.convert_to_tensor(ids), tf.int32)
    if ids.shape.rank is None or ids.shape.rank < 1:
      raise ValueError(f"decode_tf takes ids of rank >= 1, got shape {ids.shape}.")
    tokenizer = self._tf_text_tokenizer()
    if tokenizer is not None:
      # As decode: the ids before the first EOS, without padding and ids
      # beyond the vocabulary (the model's rounding rows).
      before_eos = tf.math.cumsum(tf.cast(tf.equal(ids, self.eos_id), tf.int32),
                                  axis=-1) == 0
      keep = before_eos & (ids > 0) & (ids < self.vocab_size)
      rows = tf.reshape(ids, [-1, tf.shape(ids)[-1]])
      texts = tokenizer.detokenize(tf.ragged.boolean_mask(
          rows, tf.reshape(keep, tf.shape(rows))))
      out = tf.reshape(texts, tf.shape(ids)[:-1])
      out.set_shape(ids.shape[:-1])
      return out

    def decode_rows(array):
      rows = array.reshape([-1, array.shape[-1]])
      out = np.asarray([self.decode(r).encode("utf-8") for r in rows.tolist()], dtype=object)
      return out.reshape(array.shape[:-1])

    out = tf.numpy_function(decode_rows, [ids], tf.string, stateful=False)
    out.set_shape(ids.shape[:-1])
    return out

  def __reduce__(self):
    return (SentencePieceVocabulary, (self._file, self._extra_ids))


def _with_sentinel_pieces(model_proto: bytes, extra_ids: int, where: str) -> bytes:
  """The SentencePiece model with T5's sentinel pieces appended:
  "▁<extra_id_N>" for N = extra_ids - 1 down to 0, user-defined."""
  try:
    from sentencepiece import sentencepiece_model_pb2  # pylint: disable=g-import-not-at-top
  except ImportError as e:  # older sentencepiece releases lack the module
    raise ImportError(
        f"SentencePieceVocabulary: extra_ids for {where!r} need sentencepiece>=0.1.99 "
        "(its sentencepiece_model_pb2 module): `pip install -U sentencepiece`.") from e
  model = sentencepiece_model_pb2.ModelProto.FromString(model_proto)
  existing = {piece.piece for piece in model.pieces}
  for index in reversed(range(extra_ids)):
    name = f"▁<extra_id_{index}>"
    if name in existing:
      raise ValueError(
          f"SentencePieceVocabulary: {where!r} already has the piece {name!r}; give "
          "extra_ids=0 for a model whose sentinels are pieces already.")
    model.pieces.add(piece=name, score=0.0,
                     type=sentencepiece_model_pb2.ModelProto.SentencePiece.USER_DEFINED)
  return model.SerializeToString()


def get_vocabulary(name: Optional[str] = None, **kwargs) -> Vocabulary:
  """A vocabulary by name: "byte" (default) or "sentencepiece".

  Example:
    >>> get_vocabulary("byte").vocab_size
    259
  """
  name = (name or "byte").lower()
  if name == "byte":
    return ByteVocabulary(**kwargs)
  if name in ("sentencepiece", "spm"):
    return SentencePieceVocabulary(**kwargs)
  raise ValueError(f"Unknown vocabulary {name!r}; choose 'byte' or 'sentencepiece'.")


def _python_encode_tf(vocab: Vocabulary, text: tf.Tensor, what: str):
  """encode_tf for a vocabulary with Python encode() (tf.numpy_function)."""
  text = tf.convert_to_tensor(text, tf.string)

  def encode_bytes(b):
    b = b.item() if isinstance(b, np.ndarray) else b
    return np.asarray(vocab.encode(b.decode("utf-8")), np.int32)

  def encode_one(s):
    return tf.reshape(tf.numpy_function(encode_bytes, [s], tf.int32, stateful=False), [-1])

  if text.shape.rank == 0:
    return encode_one(text)
  if text.shape.rank != 1:
    raise ValueError(f"{what}.encode_tf takes a string scalar or vector, got shape "
                     f"{text.shape}.")
  return tf.map_fn(encode_one, text, fn_output_signature=tf.RaggedTensorSpec([None], tf.int32))


def _python_decode_tf(vocab: Vocabulary, ids: tf.Tensor) -> tf.Tensor:
  """decode_tf for a vocabulary with Python decode() (tf.numpy_function)."""
  ids = tf.cast(tf.convert_to_tensor(ids), tf.int32)
  if ids.shape.rank is None or ids.shape.rank < 1:
    raise ValueError(f"decode_tf takes ids of rank >= 1, got shape {ids.shape}.")

  def decode_rows(array):
    rows = array.reshape([-1, array.shape[-1]])
    out = np.asarray([vocab.decode(r).encode("utf-8") for r in rows.tolist()], dtype=object)
    return out.reshape(array.shape[:-1])

  out = tf.numpy_function(decode_rows, [ids], tf.string, stateful=False)
  out.set_shape(ids.shape[:-1])
  return out


class TFDSVocabulary(Vocabulary):
  """A TensorFlow Datasets text encoder (anything with `vocab_size`,
  `encode(str)` and `decode(ids)`, e.g. a SubwordTextEncoder) as a
  Vocabulary. TFDS encoders reserve only id 0 (padding), so ids are shifted
  up by one to free 1 for EOS.

  Args:
    tfds_encoder: the encoder.

  Example:
    >>> vocab = TFDSVocabulary(info.features["text"].encoder)
    >>> vocab.decode(vocab.encode("hello"))
    'hello'
  """

  def __init__(self, tfds_encoder):
    for attribute in ("vocab_size", "encode", "decode"):
      if not hasattr(tfds_encoder, attribute):
        raise TypeError(f"TFDSVocabulary: {tfds_encoder!r} has no {attribute!r}; give a "
                        "tensorflow_datasets text encoder.")
    self._tfds_encoder = tfds_encoder

  @property
  def vocab_size(self) -> int:
    return self._tfds_encoder.vocab_size + 1

  def encode(self, text: str) -> List[int]:
    return [int(i) + 1 for i in self._tfds_encoder.encode(text)]

  def decode(self, ids: Iterable[int]) -> str:
    return self._tfds_encoder.decode([i - 1 for i in self._ids_before_eos(ids) if i > 1])

  def encode_tf(self, text: tf.Tensor) -> Union[tf.Tensor, tf.RaggedTensor]:
    return _python_encode_tf(self, text, "TFDSVocabulary")

  def decode_tf(self, ids: tf.Tensor) -> tf.Tensor:
    return _python_decode_tf(self, ids)


@gin.configurable
def get_tfds_vocabulary(dataset_name: str = gin.REQUIRED) -> TFDSVocabulary:
  """The TFDSVocabulary of a TFDS dataset's targets encoder (its supervised
  targets feature; the inputs are assumed to share it). Needs
  tensorflow-datasets.

  Example:
    >>> vocab = get_tfds_vocabulary("lm1b/subwords8k")
  """
  tfds = _environment.require_optional(
      "tensorflow_datasets", "get_tfds_vocabulary", "tfds",
      alternative="without it use ByteVocabulary or SentencePieceVocabulary")
  info = tfds.builder(dataset_name).info
  if not info.supervised_keys:
    raise ValueError(f"get_tfds_vocabulary: {dataset_name!r} has no supervised keys to find "
                     "its text encoder; build TFDSVocabulary(encoder) yourself.")
  return TFDSVocabulary(info.features[info.supervised_keys[1]].encoder)
