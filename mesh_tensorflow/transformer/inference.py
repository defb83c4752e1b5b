"""Running a trained transformer outside the training loop: decoding
(sampling, greedy, beam search) and scoring, batch by batch.

Each call builds a fresh mtf graph inside a `tf.function`, lowers it with the
run's mesh implementation and returns NumPy arrays. Variables are found in the
mesh implementation's store by name, so a model that was just trained (or
restored from a checkpoint) is used as it is.

    >>> ids = lm_sample(mesh_impl, build_model, vocab, ["def "], length=128)
    >>> vocab.decode(ids[0])

Texts in files are one per line; a newline inside a text is written as the
two characters backslash and n (see `escape`), so multi-line samples of code
stay one line each.
"""

from __future__ import annotations

import inspect
import math
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import vocabulary as vocabulary_lib

BATCH, LENGTH = "batch", "length"


# ---------------------------------------------------------------- text files
def escape(text: str) -> str:
  """One line for any text: backslash, newline, CR and tab as escapes.

  Example:
    >>> escape("a\\n\\tb")
    'a\\\\n\\\\tb'
  """
  return (text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
          .replace("\t", "\\t"))


def unescape(line: str) -> str:
  """The inverse of `escape`.

  Example:
    >>> unescape(escape("x\\ny"))
    'x\\ny'
  """
  out, i = [], 0
  table = {"n": "\n", "r": "\r", "t": "\t", "\\": "\\"}
  while i < len(line):
    c = line[i]
    if c == "\\" and i + 1 < len(line) and line[i + 1] in table:
      out.append(table[line[i + 1]])
      i += 2
    else:
      out.append(c)
      i += 1
  return "".join(out)


def read_lines(path: str) -> List[str]:
  """The lines of a text file (unescaped, without line ends).

  Example:
    >>> read_lines("/tmp/prompts.txt")
  """
  with tf.io.gfile.GFile(path, "r") as f:
    return [unescape(line.rstrip("\r\n")) for line in f]


def write_lines(path: str, lines: Sequence[str]) -> None:
  """Writes one escaped line per text.

  Example:
    >>> write_lines("/tmp/outputs.txt", ["a", "b\\nc"])
  """
  with tf.io.gfile.GFile(path, "w") as f:
    for line in lines:
      f.write(escape(line) + "\n")


# ----------------------------------------------------------- graph running
def run_mtf(mesh_impl, features: Dict[str, np.ndarray], feature_shapes: Dict[str, str],
            build_fn: Callable[[mtf.Mesh, Dict[str, mtf.Tensor]], Dict[str, mtf.Tensor]],
            cache: Optional[dict] = None, cache_key=None) -> Dict[str, np.ndarray]:
  """Builds `build_fn`'s mtf graph on `features`, lowers and runs it.

  Args:
    mesh_impl: the mesh implementation (its variables are used).
    features: {name: array} of one batch.
    feature_shapes: {name: mtf shape string}.
    build_fn: build_fn(mesh, mtf features) -> {name: mtf Tensor}.
    cache: a dict keeping the traced tf.function between calls.
    cache_key: the key of this build_fn in `cache`.

  Returns:
    {name: NumPy array} of the outputs.

  Example:
    >>> out = run_mtf(impl, {"ids": ids}, {"ids": "batch:8;length:64"}, build)
  """
  shapes = {k: mtf.convert_to_shape(v) for k, v in feature_shapes.items()}
  key = (cache_key, tuple(sorted(feature_shapes.items())))
  fn = cache.get(key) if cache is not None else None
  if fn is None:
    def step(batch):
      graph = mtf.Graph()
      mesh = mtf.Mesh(graph, "mesh")
      inputs = {k: mtf.import_tf_tensor(mesh, batch[k], shapes[k], name=k) for k in shapes}
      outputs = build_fn(mesh, inputs)
      lowering = mtf.Lowering(graph, {mesh: mesh_impl})
      return {k: lowering.export_to_tf_tensor(v) for k, v in outputs.items()}

    signature = {k: tf.TensorSpec(s.to_integer_list(), tf.as_dtype(features[k].dtype))
                 for k, s in shapes.items()}
    fn = tf.function(step, input_signature=[signature], autograph=False)
    if cache is not None:
      cache[key] = fn
  out = fn({k: tf.convert_to_tensor(features[k]) for k in shapes})
  return {k: v.numpy() for k, v in out.items()}


def padded_batch_size(n: int, multiple: int) -> int:
  """n rounded up to a multiple of `multiple` (at least one multiple).

  Example:
    >>> padded_batch_size(3, 8)
    8
  """
  return max(1, math.ceil(n / multiple)) * multiple


def encode_batch(vocabulary: vocabulary_lib.Vocabulary, texts: Sequence[str], length: int,
                 batch_size: int, append_eos: bool) -> Tuple[np.ndarray, List[int]]:
  """Ids [batch_size, length] of `texts` (cut to `length`, zero-padded, with
  empty rows filling the batch) and the number of ids of each text.

  Example:
    >>> ids, lengths = encode_batch(ByteVocabulary(), ["hi"], 8, 2, append_eos=True)
    >>> ids[0].tolist(), lengths
    ([107, 108, 1, 0, 0, 0, 0, 0], [3])
  """
  ids = np.zeros([batch_size, length], np.int32)
  lengths = []
  for row, text in enumerate(texts):
    tokens = vocabulary.encode(text)
    if append_eos:
      tokens = tokens[:length - 1] + [vocabulary.eos_id]
    tokens = tokens[:length]
    ids[row, :len(tokens)] = tokens
    lengths.append(len(tokens))
  return ids, lengths


def call_with_supported(fn: Callable, *args, **kwargs):
  """Calls fn with the keyword arguments it accepts (others are dropped),
  so decoding options reach models whose signatures differ.

  Example:
    >>> call_with_supported(lambda a, b=1: a + b, 1, b=2, c=3)
    3
  """
  params = inspect.signature(fn).parameters
  if any(p.kind == p.VAR_KEYWORD for p in params.values()):
    return fn(*args, **kwargs)
  return fn(*args, **{k: v for k, v in kwargs.items() if k in params})


def log_likelihoods(logits: mtf.Tensor, targets: mtf.Tensor) -> mtf.Tensor:
  """Per-row sum of log p(target) over the non-padding target tokens.

  Args:
    logits: [batch, length, vocab] mtf Tensor.
    targets: [batch, length] int mtf Tensor (0 is padding).

  Returns:
    A [batch] float32 mtf Tensor.

  Example:
    >>> scores = log_likelihoods(logits, features["targets"])
  """
  vocab_dim = logits.shape.dims[-1]
  length_dim = targets.shape.dims[-1]
  logits = mtf.cast(logits, tf.float32)
  log_probs = mtf.log_softmax(logits, vocab_dim)
  picked = mtf.reduce_sum(log_probs * mtf.one_hot(targets, vocab_dim, dtype=tf.float32),
                          reduced_dim=vocab_dim)
  weights = mtf.cast(mtf.not_equal(targets, 0), tf.float32)
  return mtf.reduce_sum(picked * weights, reduced_dim=length_dim)


def token_cross_entropy(logits: mtf.Tensor, targets: mtf.Tensor) -> Tuple[mtf.Tensor, mtf.Tensor]:
  """Mean cross-entropy (nats per token) and accuracy over non-padding tokens.

  Example:
    >>> xent, accuracy = token_cross_entropy(logits, features["targets"])
  """
  vocab_dim = logits.shape.dims[-1]
  logits = mtf.cast(logits, tf.float32)
  one_hot = mtf.one_hot(targets, vocab_dim, dtype=tf.float32)
  per_token = (mtf.reduce_logsumexp(logits, vocab_dim)
               - mtf.reduce_sum(logits * one_hot, reduced_dim=vocab_dim))
  weights = mtf.cast(mtf.not_equal(targets, 0), tf.float32)
  total = mtf.maximum(mtf.reduce_sum(weights), 1.0)
  correct = mtf.cast(mtf.equal(mtf.argmax(logits, vocab_dim), targets), tf.float32)
  return (mtf.reduce_sum(per_token * weights) / total,
          mtf.reduce_sum(correct * weights) / total)
