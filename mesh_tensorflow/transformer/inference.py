"""Running a trained transformer outside the training loop: decoding
(sampling, greedy, beam search) and scoring, batch by batch.

Each call builds a fresh mtf graph inside a `tf.function`, lowers it with the
run's mesh implementation and returns NumPy arrays. Variables are found in the
mesh implementation's store by name, so a model that was just trained (or
restored from a checkpoint, see `restore`) is used as it is.

    >>> lm_decode(setup, ["def ", "class "], decode_length=64, temperature=0.0)
    ['__init__(self):...', ...]

Texts in files are one per line; a newline inside a text is written as the
two characters backslash and n (see `escape`), so multi-line samples of code
stay one line each.
"""

from __future__ import annotations

import math
import sys
import time
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import modeling
from mesh_tensorflow.transformer import vocabulary as vocabulary_lib


def log(line: str) -> None:
  """Prints a progress line (flushed, so it shows when piped)."""
  print(line, flush=True)


# ---------------------------------------------------------------- text files
# What infer and score append to input_file without an output_file.
OUTPUT_SUFFIX = {"infer": ".outputs", "score": ".scores"}
# Characters besides newline and CR that str.splitlines() takes for line
# ends: written as \xNN / \uNNNN, so an output file has one line per text
# however it is read.
_OTHER_LINE_BREAKS = {"\x0b": "\\x0b", "\x0c": "\\x0c", "\x1c": "\\x1c", "\x1d": "\\x1d",
                      "\x1e": "\\x1e", "\x85": "\\x85", "\u2028": "\\u2028",
                      "\u2029": "\\u2029"}
_UNESCAPED = {"n": "\n", "r": "\r", "t": "\t", "\\": "\\"}
_UNESCAPED.update({code[1:]: char for char, code in _OTHER_LINE_BREAKS.items()})


def escape(text: str) -> str:
  """One line for any text: backslash, newline, CR and tab as escapes, and
  the other characters Python's str.splitlines() breaks lines at (vertical
  tab, form feed, \\x1c-\\x1e, \\x85, \\u2028, \\u2029) as \\xNN / \\uNNNN.

  Example:
    >>> escape("a\\n\\tb")
    'a\\\\n\\\\tb'
  """
  text = (text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
          .replace("\t", "\\t"))
  for char, code in _OTHER_LINE_BREAKS.items():
    text = text.replace(char, code)
  return text


def unescape(line: str) -> str:
  """The inverse of `escape`.

  Example:
    >>> unescape(escape("x\\ny"))
    'x\\ny'
  """
  out, i = [], 0
  while i < len(line):
    if line[i] == "\\":
      for code, char in _UNESCAPED.items():
        if line.startswith(code, i + 1):
          out.append(char)
          i += 1 + len(code)
          break
      else:
        out.append("\\")
        i += 1
    else:
      out.append(line[i])
      i += 1
  return "".join(out)


def ids_to_text(vocabulary, ids) -> str:
  """The text of token ids up to the first padding (0) or end of sequence.

  Example:
    >>> ids_to_text(vocabulary_lib.ByteVocabulary(), [107, 108, 1, 0])
    'hi'
  """
  ids = [int(t) for t in np.asarray(ids).reshape(-1)]
  for stop in (0, vocabulary.eos_id):
    if stop in ids:
      ids = ids[:ids.index(stop)]
  return vocabulary.decode(ids)


def read_lines(path: str, encoding: str = "utf-8", errors: str = "strict") -> List[str]:
  """The lines of a text file (unescaped, without line ends).

  Args:
    path: the file.
    encoding: its text encoding (any Python codec name).
    errors: "strict" (an undecodable line is an error), "replace" (such bytes
      become U+FFFD) or "ignore".

  Raises:
    ValueError: naming the file, line and byte that do not decode, or an
      unknown encoding; FileNotFoundError if there is no such file.

  Example:
    >>> read_lines("/tmp/prompts.txt")
  """
  try:
    "".encode(encoding)
  except LookupError:
    raise ValueError(f"input encoding {encoding!r} is not a known codec (try utf-8, "
                     "latin-1, cp1252, utf-16).") from None
  if errors not in ("strict", "replace", "ignore"):
    raise ValueError(f"input errors {errors!r}: use 'strict', 'replace' or 'ignore'.")
  if not tf.io.gfile.exists(path):
    raise FileNotFoundError(2, "no such input file", path)
  if tf.io.gfile.isdir(path):
    raise IsADirectoryError(21, "is a directory, not an input file with one text per line", path)
  with tf.io.gfile.GFile(path, "rb") as f:
    data = f.read()
  out = []
  for number, raw in enumerate(data.splitlines(), start=1):
    try:
      text = raw.decode(encoding, errors=errors)
    except UnicodeDecodeError as e:
      raise ValueError(
          f"{path}, line {number}: byte 0x{raw[e.start]:02x} at column {e.start + 1} is "
          f"not valid {encoding} ({e.reason}). Pass --input_encoding=latin-1 (or the "
          "file's encoding), or --input_errors=replace to replace such bytes "
          "(gin: run.input_encoding, run.input_errors).") from None
    out.append(unescape(text))
  return out


def read_input_file(mode: str, path: Optional[str], encoding: str = "utf-8",
                    errors: str = "strict") -> List[str]:
  """The texts of infer/score's input_file (see `read_lines`).

  Raises:
    ValueError: without a path, or for a line that does not decode.
    FileNotFoundError: for a missing file.

  Example:
    >>> read_input_file("infer", "/tmp/prompts.txt")
  """
  if not path:
    what = "one input per line" if mode == "infer" else "one text, or input<TAB>target, per line"
    raise ValueError(f"mode {mode!r} needs --input_file ({what}).")
  return read_lines(path, encoding, errors)


def write_lines(path: str, lines: Sequence[str]) -> None:
  """Writes one escaped line per text.

  Example:
    >>> write_lines("/tmp/outputs.txt", ["a", "b\\nc"])
  """
  with tf.io.gfile.GFile(path, "w") as f:
    f.write("")  # creates the file even when there are no lines
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
    if hasattr(mesh_impl, "run_all"):  # SIMD: the step is the program of every processor
      fn = lambda batch: mesh_impl.run(step, batch)
    else:
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


def prompt_room(length: int, decode_length: int) -> int:
  """How many tokens a prompt that fills the sequence keeps (its last ones):
  room is left for min(decode_length, length // 2) new tokens.

  Example:
    >>> prompt_room(128, 96)
    64
  """
  return max(1, length - max(1, min(decode_length, length // 2)))


def warn(line: str) -> None:
  """Prints a warning line (stderr, flushed)."""
  print(f"warning: {line}", file=sys.stderr, flush=True)


def encode_batch(vocabulary: vocabulary_lib.Vocabulary, texts: Sequence[str], length: int,
                 batch_size: int, append_eos: bool,
                 keep_last: Optional[int] = None) -> Tuple[np.ndarray, List[int]]:
  """Ids [batch_size, length] of `texts` (cut to `length`, zero-padded, with
  empty rows filling the batch) and the number of ids of each text.

  With keep_last, a text of `length` or more ids keeps only its last
  keep_last ids (a prompt that leaves room to generate).

  Example:
    >>> ids, lengths = encode_batch(ByteVocabulary(), ["hi"], 8, 2, append_eos=True)
    >>> ids[0].tolist(), lengths
    ([107, 108, 1, 0, 0, 0, 0, 0], [3])
  """
  ids = np.zeros([batch_size, length], np.int32)
  lengths = []
  for row, text in enumerate(texts):
    tokens = vocabulary.encode(text)
    if keep_last is not None and len(tokens) >= length:
      tokens = tokens[-keep_last:]
    if append_eos:
      tokens = tokens[:length - 1] + [vocabulary.eos_id]
    tokens = tokens[:length]
    ids[row, :len(tokens)] = tokens
    lengths.append(len(tokens))
  return ids, lengths


# --------------------------------------------------------- infer and score
def restore(mesh_impl, model_dir: str, checkpoint_path: Optional[str] = None) -> str:
  """Makes the variables of `mesh_impl` start from `checkpoint_path`, else
  model_dir's newest intact checkpoint; returns its path.

  Raises:
    ValueError: if model_dir has no checkpoint.

  Example:
    >>> restore(setup.mesh_impl, "/tmp/lm")
    '/tmp/lm/ckpt-600'
  """
  manager = mtf.checkpoint.CheckpointManager(mesh_impl, model_dir)
  restored = manager.restore_or_initialize(checkpoint_path)
  if not restored:
    raise ValueError(f"No checkpoint in {model_dir!r}: train first (--mode=train).")
  log(f"restored {restored}")
  return restored


def _chunks(items: Sequence, size: int) -> Iterator[Sequence]:
  for i in range(0, len(items), size):
    yield items[i:i + size]


def _top_k(top_k: Optional[int]) -> Optional[int]:
  return top_k if top_k and top_k > 0 else None


def _warn_cut(setup: modeling.Setup, texts: Sequence[str], length: int, what: str) -> None:
  """Warns about texts that do not fit `length` ids with their end token."""
  rows = [i for i, t in enumerate(texts) if len(setup.vocabulary.encode(t)) >= length]
  if rows:
    warn(f"{len(rows)} {what}(s) (input line(s) {', '.join(str(i + 1) for i in rows[:5])}"
         f"{', ...' if len(rows) > 5 else ''}) are longer than the sequence length {length}: "
         f"only their first {length - 1} tokens are used (raise run.sequence_length).")


def lm_decode(setup: modeling.Setup, prompts: Sequence[str], decode_length: int,
              temperature: float = 0.0, top_k: Optional[int] = None) -> List[str]:
  """Continuations of `prompts` by a language model (incremental decoding).

  Args:
    setup: the run's Setup (model_type "lm").
    prompts: texts to continue ("" starts from nothing).
    decode_length: at most this many new tokens (and at most the targets
      length minus the prompt).
    temperature: 0.0 for greedy decoding, else sampling temperature.
    top_k: sample among the k most likely tokens (None or 0: all).

  Returns:
    The new text after each prompt (up to the end-of-sequence token).

  Example:
    >>> lm_decode(setup, ["import "], decode_length=20)
    ['os']
  """
  length = setup.sequence_length["targets"]
  batch = padded_batch_size(min(len(prompts), setup.batch_size), setup.batch_split)
  keep = prompt_room(length, decode_length)
  long_rows = [i for i, p in enumerate(prompts) if len(setup.vocabulary.encode(p)) >= length]
  if long_rows:
    warn(f"{len(long_rows)} prompt(s) (input line(s) "
         f"{', '.join(str(i + 1) for i in long_rows[:5])}{', ...' if len(long_rows) > 5 else ''})"
         f" fill the sequence length {length}: each keeps its last {keep} tokens so that "
         f"{length - keep} can be generated (raise run.sequence_length to keep more).")
  cache, outputs = {}, []
  for chunk in _chunks(list(prompts), batch):
    ids, lengths = encode_batch(setup.vocabulary, chunk, length, batch, append_eos=False,
                                keep_last=keep)

    def build(mesh, features):
      del mesh
      out = modeling.call_with_supported(
          setup.new_model().sample_autoregressive, features["ids"],
          temperature=temperature, top_k=_top_k(top_k), variable_dtype=setup.variable_dtype,
          max_steps=min(decode_length, length), stop_at_token=setup.vocabulary.eos_id)
      return {"ids": out}

    out = run_mtf(setup.mesh_impl, {"ids": ids}, {"ids": f"batch:{batch};length:{length}"},
                  build, cache, "lm")
    for row, n in zip(out["ids"], lengths):
      outputs.append(setup.vocabulary.decode(row[n:]))
  return outputs


def decode_setting(name: str, given, default, model_type: str = "bitransformer"):
  """`given`, else the original's gin binding of the decoding method
  (`Bitransformer.decode.<name>`, or `Unitransformer.sample_autoregressive.<name>`
  for "lm": how the original and T5's beam_search.gin and sample_decode.gin
  set beam_size, alpha, temperature and sampling_keep_top_k), else `default`.

  Example:
    >>> decode_setting("beam_size", None, 1)  # with Bitransformer.decode.beam_size = 4
    4
  """
  if given is not None:
    return given
  method = "Unitransformer.sample_autoregressive" if model_type == "lm" else "Bitransformer.decode"
  try:
    import gin  # pylint: disable=g-import-not-at-top
    return gin.query_parameter(f"{method}.{name}")
  except (ImportError, ValueError):
    return default


def bi_decode(setup: modeling.Setup, sources: Sequence[str], temperature: float = 0.0,
              top_k: Optional[int] = None, beam_size: Optional[int] = None,
              alpha: Optional[float] = None) -> List[str]:
  """Outputs of an encoder-decoder for `sources`.

  Args:
    setup: the run's Setup (model_type "bitransformer").
    sources: the inputs.
    temperature: 0.0 for greedy decoding, else sampling temperature (beam
      search is always greedy).
    top_k: sample among the k most likely tokens (None or 0: all).
    beam_size: 1, or the beam search width (None: gin's
      `Bitransformer.decode.beam_size`, else 1).
    alpha: beam search length penalty (None: gin's
      `Bitransformer.decode.alpha`, else 0.6).

  Example:
    >>> bi_decode(setup, ["def add(a, b):"], beam_size=4)
    ['Return a + b.']
  """
  beam_size = decode_setting("beam_size", beam_size, 1)
  alpha = decode_setting("alpha", alpha, 0.6)
  in_length = setup.sequence_length["inputs"]
  batch = padded_batch_size(min(len(sources), setup.batch_size), setup.batch_split)
  _warn_cut(setup, sources, in_length, "input")
  cache, outputs = {}, []
  for chunk in _chunks(list(sources), batch):
    ids, _ = encode_batch(setup.vocabulary, chunk, in_length, batch, append_eos=True)

    def build(mesh, features):
      del mesh
      out = modeling.call_with_supported(
          setup.new_model().decode, features["inputs"], variable_dtype=setup.variable_dtype,
          beam_size=beam_size, temperature=temperature if beam_size == 1 else 0.0,
          alpha=alpha, top_k=_top_k(top_k), max_decode_length=setup.sequence_length["targets"])
      return {"ids": out}

    out = run_mtf(setup.mesh_impl, {"inputs": ids},
                  {"inputs": f"batch:{batch};length:{in_length}"}, build, cache, "bi")
    outputs.extend(setup.vocabulary.decode(row) for row in out["ids"][:len(chunk)])
  return outputs


def infer(setup: modeling.Setup, input_file: Optional[str], output_file: Optional[str],
          decode_length: int, temperature: float, top_k: Optional[int], beam_size: int,
          alpha: float, lines: Optional[Sequence[str]] = None) -> Dict[str, float]:
  """Decodes every line of input_file (prompts for "lm", inputs for
  "bitransformer") and writes one output per line to output_file (default
  input_file + ".outputs").

  Example:
    >>> infer(setup, "prompts.txt", None, 64, 0.0, None, 1, 0.6)
    {'examples': 2.0}
  """
  if lines is None:
    lines = read_input_file("infer", input_file)
  output_file = output_file or input_file + OUTPUT_SUFFIX["infer"]
  start = time.perf_counter()
  if not lines:
    outputs = []
  elif setup.model_type == "lm":
    outputs = lm_decode(setup, lines, decode_length, temperature, top_k)
  else:
    outputs = bi_decode(setup, lines, temperature, top_k, beam_size, alpha)
  write_lines(output_file, outputs)
  for line, out in list(zip(lines, outputs))[:3]:
    shown = line if len(line) <= 60 else f"...{line[-57:]}"
    log(f"{shown!r} -> {out!r}")
  log(f"decoded {len(lines)} inputs to {output_file} in {time.perf_counter() - start:.1f} s")
  return {"examples": float(len(lines))}


def _score_features(setup: modeling.Setup, lines: Sequence[str],
                    batch: int) -> Dict[str, np.ndarray]:
  """One unpacked batch: every line is one example (segmentation 1)."""
  features = {}
  for key in setup.feature_keys:
    if setup.model_type == "lm":
      texts = list(lines)
    else:
      parts = [line.split("\t", 1) + [""] for line in lines]
      texts = [p[0] if key == "inputs" else p[1] for p in parts]
    ids, _ = encode_batch(setup.vocabulary, texts, setup.sequence_length[key], batch,
                          append_eos=True)
    positions = np.broadcast_to(np.arange(ids.shape[1], dtype=np.int32), ids.shape)
    features[key] = ids
    features[key + "_segmentation"] = (ids != 0).astype(np.int32)
    features[key + "_position"] = np.where(ids != 0, positions, 0).astype(np.int32)
  return features


def score(setup: modeling.Setup, input_file: Optional[str],
          output_file: Optional[str], lines: Optional[Sequence[str]] = None) -> Dict[str, float]:
  """Writes the log-likelihood (nats) of every line of input_file, a text
  for "lm" or "input<TAB>target" for "bitransformer" (the target's), one per
  line to output_file (default input_file + ".scores"). Texts longer than the
  sequence length are cut.

  Example:
    >>> score(setup, "texts.txt", None)
    {'examples': 3.0, 'mean_score': -41.2}
  """
  if lines is None:
    lines = read_input_file("score", input_file)
  lines = list(lines)
  output_file = output_file or input_file + OUTPUT_SUFFIX["score"]
  if setup.model_type == "lm":
    _warn_cut(setup, lines, setup.sequence_length["targets"], "text")
  batch = padded_batch_size(setup.batch_size, setup.batch_split)
  batches = ((len(chunk), _score_features(setup, chunk, batch))
             for chunk in _chunks(lines, batch))
  return _write_scores(setup, batches, batch, output_file)


def score_dataset(setup: modeling.Setup, dataset: tf.data.Dataset,
                  output_file: str) -> Dict[str, float]:
  """Writes the log-likelihood (nats) of every example of `dataset`, one per
  line to output_file, in the dataset's order: T5's scoring of a task's
  examples. `dataset` yields unpacked examples, one per row (batched or not):
  {"targets": ids} for "lm", and "inputs" too for "bitransformer" (id 0 is
  padding, EOS included as the data gives it); ids past the sequence length
  are cut.

  Example:
    >>> ds = dataset_fn("validation", vocab, lengths, 1, None, False, packed=False)
    >>> score_dataset(setup, ds, "/tmp/validation.scores")
    {'examples': 120.0, 'mean_score': -35.7}
  """
  keys = setup.feature_keys
  missing = [k for k in keys if k not in dataset.element_spec]
  if missing:
    raise ValueError(f"score: the dataset has no {missing} feature(s); a {setup.model_type!r} "
                     f"model scores {list(keys)}.")
  batch = padded_batch_size(setup.batch_size, setup.batch_split)

  def rows():
    for example in dataset.as_numpy_iterator():
      ids = {k: np.asarray(example[k]) for k in keys}
      if ids[keys[0]].ndim == 1:
        yield ids
      else:
        for row in range(ids[keys[0]].shape[0]):
          yield {k: v[row] for k, v in ids.items()}

  def batches():
    chunk = []
    for row in rows():
      if not np.any(row["targets"]):
        continue  # an empty padding row
      chunk.append(row)
      if len(chunk) == batch:
        yield len(chunk), _rows_to_features(setup, chunk, batch)
        chunk = []
    if chunk:
      yield len(chunk), _rows_to_features(setup, chunk, batch)

  return _write_scores(setup, batches(), batch, output_file)


def _rows_to_features(setup: modeling.Setup, rows: Sequence[Dict[str, np.ndarray]],
                      batch: int) -> Dict[str, np.ndarray]:
  """One unpacked batch from id rows (cut to the sequence length, zero-padded)."""
  features = {}
  for key in setup.feature_keys:
    length = setup.sequence_length[key]
    ids = np.zeros([batch, length], np.int32)
    for i, row in enumerate(rows):
      row = row[key][:length]
      ids[i, :len(row)] = row
    positions = np.broadcast_to(np.arange(length, dtype=np.int32), ids.shape)
    features[key] = ids
    features[key + "_segmentation"] = (ids != 0).astype(np.int32)
    features[key + "_position"] = np.where(ids != 0, positions, 0).astype(np.int32)
  return features


def _write_scores(setup: modeling.Setup, batches: Iterable[Tuple[int, Dict[str, np.ndarray]]],
                  batch: int, output_file: str) -> Dict[str, float]:
  """Scores (rows used, features) batches and writes one score per row."""
  cache, scores = {}, []

  def build(mesh, features):
    del mesh
    logits, _ = modeling.call_model(setup, setup.new_model(), features, "eval",
                                    compute_loss=False)
    return {"score": modeling.log_likelihoods(logits, features["targets"])}

  for used, features in batches:
    out = run_mtf(setup.mesh_impl, features, setup.feature_shapes(batch), build, cache,
                  "score")
    scores.extend(float(s) for s in out["score"][:used])
  with tf.io.gfile.GFile(output_file, "w") as f:
    f.write("")  # creates the file even when there are no examples
    for s in scores:
      f.write(f"{s:.6f}\n")
  mean = float(np.mean(scores)) if scores else float("nan")
  log(f"scored {len(scores)} examples to {output_file} (log-likelihood in nats; mean "
      f"{mean:.4f})")
  return {"examples": float(len(scores)), "mean_score": mean}
