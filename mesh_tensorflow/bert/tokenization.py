"""WordPiece tokenization for BERT (pure Python).

`FullTokenizer` = `BasicTokenizer` (text cleanup, optional lower-casing and
accent stripping, splitting on whitespace, punctuation and CJK characters)
followed by `WordpieceTokenizer` (greedy longest-match-first split of each
word into vocabulary pieces; continuation pieces start with "##").

Example:
  >>> tokenizer = FullTokenizer("vocab.txt", do_lower_case=True)
  >>> tokenizer.tokenize("Unaffable!")
  ['un', '##aff', '##able', '!']
"""

from __future__ import annotations

import collections
import re
import unicodedata
from typing import Iterable, List, Mapping, Optional, Sequence

import tensorflow as tf

from mesh_tensorflow.bert import _flags

flags = _flags.flags
FLAGS = _flags.new()

_flags.define(FLAGS, "bool", "preserve_unused_tokens", False,
              "If True, words that are [unusedN] tokens of the vocabulary are kept whole "
              "(no WordPiece split).", module_name=__name__)

_UNUSED_TOKEN = re.compile(r"^\[unused\d+\]$")

# Google's released checkpoints whose casing is known (directory names).
_UNCASED_MODELS = ("uncased_L-24_H-1024_A-16", "uncased_L-12_H-768_A-12",
                   "multilingual_L-12_H-768_A-12", "chinese_L-12_H-768_A-12")
_CASED_MODELS = ("cased_L-12_H-768_A-12", "cased_L-24_H-1024_A-16",
                 "multi_cased_L-12_H-768_A-12")


def preserve_token(token: str, vocab: Mapping[str, int]) -> bool:
  """Whether `token` is an [unusedN] vocabulary token to keep whole (only with
  --preserve_unused_tokens).

  Example:
    >>> preserve_token("[unused3]", {"[unused3]": 7})   # False unless the flag is set
    False
  """
  if not _flags.value(FLAGS, "preserve_unused_tokens", False):
    return False
  return token in vocab and bool(_UNUSED_TOKEN.search(token))


def validate_case_matches_checkpoint(do_lower_case: bool,
                                     init_checkpoint: Optional[str]) -> None:
  """Raises ValueError if `do_lower_case` contradicts the casing of a Google
  BERT checkpoint recognized by its directory name (".../<model>/bert_model.ckpt").

  Example:
    >>> validate_case_matches_checkpoint(True, "/m/uncased_L-12_H-768_A-12/bert_model.ckpt")
  """
  if not init_checkpoint:
    return
  match = re.match(r"^.*?([A-Za-z0-9_-]+)/bert_model.ckpt", init_checkpoint)
  if match is None:
    return
  model = match.group(1)
  if model in _UNCASED_MODELS and not do_lower_case:
    wrong, kind, right = False, "lowercased", True
  elif model in _CASED_MODELS and do_lower_case:
    wrong, kind, right = True, "cased", False
  else:
    return
  raise ValueError(
      f"--do_lower_case={wrong} does not match --init_checkpoint={init_checkpoint}: "
      f"{model} is a {kind} model; pass --do_lower_case={right}.")


def convert_to_unicode(text) -> str:
  """`text` as str (bytes are decoded as UTF-8, dropping invalid bytes).

  Example:
    >>> convert_to_unicode(b"caf\\xc3\\xa9")
    'café'
  """
  if isinstance(text, str):
    return text
  if isinstance(text, bytes):
    return text.decode("utf-8", "ignore")
  raise ValueError(f"Unsupported string type: {type(text)}; pass str or bytes.")


def printable_text(text) -> str:
  """`text` as a str fit for printing and logging (same as `convert_to_unicode`).

  Example:
    >>> printable_text(b"abc")
    'abc'
  """
  return convert_to_unicode(text)


def load_vocab(vocab_file: str) -> "collections.OrderedDict[str, int]":
  """{token: id} from a vocabulary file of one token per line (ids count
  lines; a repeated token keeps its first id).

  Example:
    >>> vocab = load_vocab("vocab.txt")
  """
  vocab = collections.OrderedDict()
  try:
    with tf.io.gfile.GFile(vocab_file, "rb") as reader:
      data = reader.read()
  except tf.errors.NotFoundError:
    raise FileNotFoundError(f"vocabulary file {vocab_file} does not exist.") from None
  for line in convert_to_unicode(data).split("\n"):
    token = line.strip()
    if not token:
      continue
    if token not in vocab:
      vocab[token] = len(vocab)
  if not vocab:
    raise ValueError(f"vocabulary file {vocab_file} holds no tokens.")
  return vocab


def convert_by_vocab(vocab: Mapping, items: Iterable) -> List:
  """[vocab[item] for item in items], naming the first item not in vocab.

  Example:
    >>> convert_by_vocab({"a": 0, "b": 1}, ["b", "a"])
    [1, 0]
  """
  output = []
  for item in items:
    try:
      output.append(vocab[item])
    except KeyError:
      raise KeyError(f"{item!r} is not in the vocabulary") from None
  return output


def convert_tokens_to_ids(vocab: Mapping[str, int], tokens: Iterable[str]) -> List[int]:
  """Token strings to ids (see `convert_by_vocab`)."""
  return convert_by_vocab(vocab, tokens)


def convert_ids_to_tokens(inv_vocab: Mapping[int, str], ids: Iterable[int]) -> List[str]:
  """Ids to token strings (see `convert_by_vocab`)."""
  return convert_by_vocab(inv_vocab, ids)


def whitespace_tokenize(text: str) -> List[str]:
  """Splits stripped text on whitespace.

  Example:
    >>> whitespace_tokenize("  a  b ")
    ['a', 'b']
  """
  return text.split()


class FullTokenizer:
  """Basic then WordPiece tokenization with a vocabulary file.

  Args:
    vocab_file: one token per line.
    do_lower_case: lower-case and strip accents (for uncased models).

  Example:
    >>> tok = FullTokenizer("vocab.txt")
    >>> tok.convert_tokens_to_ids(tok.tokenize("hello world"))
  """

  def __init__(self, vocab_file: str, do_lower_case: bool = True):
    self.vocab = load_vocab(vocab_file)
    self.inv_vocab = {v: k for k, v in self.vocab.items()}
    self.basic_tokenizer = BasicTokenizer(do_lower_case=do_lower_case, vocab=self.vocab)
    self.wordpiece_tokenizer = WordpieceTokenizer(vocab=self.vocab)

  def tokenize(self, text) -> List[str]:
    pieces = []
    for token in self.basic_tokenizer.tokenize(text):
      if preserve_token(token, self.vocab):
        pieces.append(token)
      else:
        pieces.extend(self.wordpiece_tokenizer.tokenize(token))
    return pieces

  def convert_tokens_to_ids(self, tokens: Iterable[str]) -> List[int]:
    return convert_by_vocab(self.vocab, tokens)

  def convert_ids_to_tokens(self, ids: Iterable[int]) -> List[str]:
    return convert_by_vocab(self.inv_vocab, ids)


class BasicTokenizer:
  """Cleans text, optionally lower-cases and strips accents, and splits on
  whitespace, punctuation and CJK characters.

  Args:
    do_lower_case: lower-case and strip accents.
    vocab: tokens to keep unchanged when --preserve_unused_tokens is set.

  Example:
    >>> BasicTokenizer().tokenize(" Héllo,  World! ")
    ['hello', ',', 'world', '!']
  """

  def __init__(self, do_lower_case: bool = True, vocab: Sequence[str] = tuple()):
    self.do_lower_case = do_lower_case
    self.vocab = vocab

  def tokenize(self, text) -> List[str]:
    text = self._clean_text(convert_to_unicode(text))
    text = self._tokenize_chinese_chars(text)
    pieces = []
    for token in whitespace_tokenize(text):
      if preserve_token(token, self.vocab):
        pieces.append(token)
        continue
      if self.do_lower_case:
        token = self._run_strip_accents(token.lower())
      pieces.extend(self._run_split_on_punc(token))
    return whitespace_tokenize(" ".join(pieces))

  def _run_strip_accents(self, text: str) -> str:
    decomposed = unicodedata.normalize("NFD", text)
    return "".join(c for c in decomposed if unicodedata.category(c) != "Mn")

  def _run_split_on_punc(self, text: str) -> List[str]:
    words: List[str] = []
    new_word = True
    for char in text:
      if _is_punctuation(char):
        words.append(char)
        new_word = True
      elif new_word:
        words.append(char)
        new_word = False
      else:
        words[-1] += char
    return words

  def _tokenize_chinese_chars(self, text: str) -> str:
    return "".join(f" {c} " if self._is_chinese_char(ord(c)) else c for c in text)

  def _is_chinese_char(self, cp: int) -> bool:
    """Whether code point cp is in a CJK Unified Ideographs block (Hangul,
    Hiragana and Katakana are not: those scripts separate words by spaces)."""
    blocks = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
              (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))
    return any(lo <= cp <= hi for lo, hi in blocks)

  def _clean_text(self, text: str) -> str:
    out = []
    for char in text:
      if ord(char) in (0, 0xFFFD) or _is_control(char):
        continue
      out.append(" " if _is_whitespace(char) else char)
    return "".join(out)


class WordpieceTokenizer:
  """Greedy longest-match-first WordPiece split of whitespace-separated words.

  A word with no complete split, or longer than max_input_chars_per_word,
  becomes unk_token.

  Args:
    vocab: the vocabulary (a container of pieces).
    unk_token: token for words that cannot be split.
    max_input_chars_per_word: longer words become unk_token.

  Example:
    >>> WordpieceTokenizer({"un", "##aff", "##able"}).tokenize("unaffable")
    ['un', '##aff', '##able']
  """

  def __init__(self, vocab, unk_token: str = "[UNK]", max_input_chars_per_word: int = 200):
    self.vocab = vocab
    self.unk_token = unk_token
    self.max_input_chars_per_word = max_input_chars_per_word

  def tokenize(self, text) -> List[str]:
    output = []
    for word in whitespace_tokenize(convert_to_unicode(text)):
      if len(word) > self.max_input_chars_per_word:
        output.append(self.unk_token)
        continue
      pieces = self._split(word)
      output.extend(pieces if pieces is not None else [self.unk_token])
    return output

  def _split(self, word: str) -> Optional[List[str]]:
    pieces = []
    start = 0
    while start < len(word):
      for end in range(len(word), start, -1):
        piece = word[start:end] if start == 0 else "##" + word[start:end]
        if piece in self.vocab:
          pieces.append(piece)
          start = end
          break
      else:
        return None
    return pieces


def _is_whitespace(char: str) -> bool:
  return char in " \t\n\r" or unicodedata.category(char) == "Zs"


def _is_control(char: str) -> bool:
  if char in "\t\n\r":  # counted as whitespace
    return False
  return unicodedata.category(char) in ("Cc", "Cf")


def _is_punctuation(char: str) -> bool:
  # Every non-alphanumeric printable ASCII character counts, even where Unicode
  # does not call it punctuation ("^", "$", "`").
  cp = ord(char)
  if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
    return True
  return unicodedata.category(char).startswith("P")
