"""Tensor2Tensor subword vocabularies (read-only), without tensor2tensor.

A Tensor2Tensor `SubwordTextEncoder` vocabulary file lists one subtoken per
line, in single (or double) quotes, its line number being its id; the first
lines are the reserved "<pad>" (0) and "<EOS>" (1). Text is cut into runs of
letters/digits and runs of other characters (a single space between two
word runs is dropped); each run is escaped ("\\" -> "\\\\", "_" -> "\\u",
characters absent from the vocabulary -> "\\<code point>;") and ended with
"_", then split greedily into the longest subtokens of the file. `T2tVocabulary`
reads such a file and encodes and decodes as Tensor2Tensor does:

    >>> vocab = T2tVocabulary("/data/t2t/vocab.translate_ende_wmt32k.32768.subwords")
    >>> vocab.decode(vocab.encode("Hello world"))
    'Hello world'
"""

from __future__ import annotations

import os
import re
import unicodedata
from typing import Dict, Iterable, List

import gin
import tensorflow as tf

from mesh_tensorflow.transformer import vocabulary

_UNESCAPE = re.compile(r"\\u|\\\\|\\([0-9]+);")


def _is_alnum(c: str) -> bool:
  return unicodedata.category(c)[0] in ("L", "N")


def _split_runs(text: str) -> List[str]:
  """Runs of word and non-word characters; lone spaces between words dropped."""
  if not text:
    return []
  tokens, start = [], 0
  for pos in range(1, len(text)):
    if _is_alnum(text[pos]) != _is_alnum(text[pos - 1]):
      token = text[start:pos]
      if token != " " or start == 0:
        tokens.append(token)
      start = pos
  tokens.append(text[start:])
  return tokens


def _join_runs(tokens: List[str]) -> str:
  out = []
  for i, token in enumerate(tokens):
    if i > 0 and _is_alnum(tokens[i - 1][0]) and _is_alnum(token[0]):
      out.append(" ")
    out.append(token)
  return "".join(out)


def _unescape(token: str) -> str:
  def replace(match):
    if match.group(1) is None:
      return "_" if match.group(0) == "\\u" else "\\"
    try:
      return chr(int(match.group(1)))
    except (ValueError, OverflowError):
      return "\u3013"  # the "geta mark" Tensor2Tensor decodes bad escapes to
  return _UNESCAPE.sub(replace, token[:-1] if token.endswith("_") else token)


class T2tVocabulary(vocabulary.Vocabulary):
  """A Tensor2Tensor SubwordTextEncoder vocabulary file (see the module
  docstring); ids 0 and 1 are already pad and EOS, so they are not shifted.

  Args:
    filepath: the vocabulary file.

  Example:
    >>> vocab = T2tVocabulary("vocab.subwords")
    >>> ids = vocab.encode("hello")
  """

  def __init__(self, filepath: str):
    if not tf.io.gfile.exists(filepath):
      raise ValueError(f"T2tVocabulary: no vocabulary file {filepath!r}.")
    with tf.io.gfile.GFile(filepath, "r") as f:
      lines = f.read().splitlines()
    subtokens = []
    for number, line in enumerate(lines, 1):
      line = line.strip()
      if len(line) >= 2 and line[0] == line[-1] and line[0] in "'\"":
        line = line[1:-1]
      if not line:
        raise ValueError(f"T2tVocabulary: {filepath!r} line {number} is empty; a Tensor2Tensor "
                         "subword file has one quoted subtoken per line.")
      subtokens.append(line)
    if len(subtokens) < 2 or subtokens[0] != "<pad>" or subtokens[1] != "<EOS>":
      raise ValueError(f"T2tVocabulary: {filepath!r} must start with '<pad>' and '<EOS>' "
                       f"(ids 0 and 1), got {subtokens[:2]}.")
    self._filepath = filepath
    self._subtokens = subtokens
    self._ids: Dict[str, int] = {}
    for i, s in enumerate(subtokens):
      self._ids.setdefault(s, i)
    self._alphabet = {c for s in subtokens[2:] for c in s}
    self._max_len = max(len(s) for s in subtokens)

  @property
  def vocab_size(self) -> int:
    return len(self._subtokens)

  def _escape(self, token: str) -> str:
    token = token.replace("\\", "\\\\").replace("_", "\\u")
    return "".join(c if c in self._alphabet and c != "\n" else f"\\{ord(c)};"
                   for c in token) + "_"

  def encode(self, text: str) -> List[int]:
    ids = []
    for token in _split_runs(text):
      escaped = self._escape(token)
      start = 0
      while start < len(escaped):
        for end in range(min(len(escaped), start + self._max_len), start, -1):
          piece = escaped[start:end]
          if piece in self._ids and self._ids[piece] > 1:
            ids.append(self._ids[piece])
            start = end
            break
        else:
          raise ValueError(f"T2tVocabulary: {self._filepath!r} cannot spell "
                           f"{escaped[start]!r} (its alphabet lacks the escape characters "
                           "'\\', ';' or digits).")
    return ids

  def decode(self, ids: Iterable[int]) -> str:
    pieces = [self._subtokens[i] for i in self._ids_before_eos(ids)
              if 1 < i < len(self._subtokens)]
    tokens = [_unescape(t + "_") for t in "".join(pieces).split("_") if t]
    return _join_runs([t for t in tokens if t])

  def encode_tf(self, text: tf.Tensor):
    return vocabulary._python_encode_tf(self, text, "T2tVocabulary")  # pylint: disable=protected-access

  def decode_tf(self, ids: tf.Tensor) -> tf.Tensor:
    return vocabulary._python_decode_tf(self, ids)  # pylint: disable=protected-access

  def __reduce__(self):
    return (T2tVocabulary, (self._filepath,))


@gin.configurable
def get_t2t_vocabulary(data_dir: str = gin.REQUIRED,
                       vocabulary_filename: str = gin.REQUIRED) -> T2tVocabulary:
  """T2tVocabulary(data_dir/vocabulary_filename).

  Example:
    >>> vocab = get_t2t_vocabulary("/data/t2t", "vocab.translate_ende_wmt32k.32768.subwords")
  """
  return T2tVocabulary(os.path.join(data_dir, vocabulary_filename))
