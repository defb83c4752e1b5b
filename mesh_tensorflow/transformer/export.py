"""SavedModel export of a trained transformer, for serving without this library.

`export_saved_model` restores a model directory's latest checkpoint onto a
mesh chosen at export time (default: one device), lowers the model's greedy
decoding and its scoring inside `tf.function`s, and writes a SavedModel whose
variables are the mesh's slice variables. The SavedModel needs only
TensorFlow: `tf.saved_model.load` in a process that never imports
`mesh_tensorflow` runs it. Its signatures:

* `serving_default` (and `decode`): `inputs` strings [n] -> `outputs` strings
  [n]. For a language model the inputs are prompts and the outputs their
  continuations; for an encoder-decoder the inputs are the sources and the
  outputs the decoded targets. The same as `--mode=infer` with greedy
  decoding (`run.temperature = 0.0`), or beam search when `run.beam_size > 1`
  (encoder-decoder).
* `decode_ids`: `inputs` int32 ids [n, any length] (0 is padding) -> `outputs`
  int32 ids [n, targets length]: the same, on ids (a language model's
  prompt is the ids before the first 0; its outputs are the new ids only).
* `score`: `targets` strings [n] (and `inputs` strings [n] for an
  encoder-decoder) -> `scores` float32 [n]: the log-likelihood of each target
  in nats, end-of-sequence token included, as `--mode=score` writes them.
* `score_ids`: the same on int32 ids [n, any length] (0 is padding; an
  end-of-sequence id is not added).

The string signatures exist when the vocabulary's encode and decode are
TensorFlow ops: `ByteVocabulary` (core ops), and `SentencePieceVocabulary`
when tensorflow-text is installed (its SentencePiece op, with T5's sentinel
pieces; a process that loads the SavedModel imports `tensorflow_text` first,
as for T5's exports). Without tensorflow-text a SentencePiece vocabulary runs
the sentencepiece Python package, which a SavedModel cannot hold (core
TensorFlow has no SentencePiece op), so its SavedModel has only `decode_ids`
and `score_ids` (then also under `serving_default`).

Inside, each call of n examples runs in chunks of `batch_size` rows (the last
padded), so any n works. A prompt that fills a language model's sequence
keeps its last tokens, leaving room to generate, as the CLI does.

    >>> info = export_saved_model("/tmp/lm", model_type="lm", vocabulary=ByteVocabulary(),
    ...                           sequence_length={"targets": 64})
    >>> loaded = tf.saved_model.load(info["export_dir"])
    >>> loaded.signatures["serving_default"](inputs=tf.constant(["def "]))["outputs"]
"""

from __future__ import annotations

import os
import re
from typing import Callable, Dict, Mapping, Optional

import gin
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.lowering import slice_variables
from mesh_tensorflow.transformer import inference
from mesh_tensorflow.transformer import modeling
from mesh_tensorflow.transformer import vocabulary as vocabulary_lib

DEFAULT_MESH_SHAPE = "all:1"


def has_graph_ops(vocabulary: vocabulary_lib.Vocabulary) -> bool:
  """Whether `vocabulary.encode_tf` / `decode_tf` are TensorFlow ops a
  SavedModel can hold (no Python callbacks).

  Example:
    >>> has_graph_ops(vocabulary_lib.ByteVocabulary())
    True
  """
  return bool(getattr(vocabulary, "exports_graph_ops",
                      isinstance(vocabulary, vocabulary_lib.ByteVocabulary)))


def checkpoint_step(path: str) -> int:
  """The step number of a checkpoint path such as ".../ckpt-600".

  Example:
    >>> checkpoint_step("/tmp/lm/ckpt-600")
    600
  """
  match = re.search(r"-(\d+)$", path)
  return int(match.group(1)) if match else 0


class ExportModule(tf.Module):
  """What the SavedModel holds: the slice variables and the functions."""

  def __init__(self):
    super().__init__(name="mesh_tensorflow_export")
    self.slice_variables = []


def _lower(mesh_impl, features: Mapping[str, tf.Tensor], shapes: Mapping[str, str],
           build_fn: Callable) -> Dict[str, tf.Tensor]:
  """build_fn's mtf graph on `features`, lowered into the current tf graph."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  inputs = {k: mtf.import_tf_tensor(mesh, features[k], mtf.convert_to_shape(shapes[k]), name=k)
            for k in shapes}
  outputs = build_fn(mesh, inputs)
  lowering = mtf.Lowering(graph, {mesh: mesh_impl})
  return {k: lowering.export_to_tf_tensor(v) for k, v in outputs.items()}


def _in_chunks(fn: Callable, tensors: Dict[str, tf.Tensor], batch: int,
               out_dtype: tf.DType, out_tail) -> tf.Tensor:
  """fn(dict of [batch, ...] tensors) -> [batch, *out_tail], applied to every
  `batch` rows of `tensors` (n rows; the last chunk zero-padded)."""
  n = tf.shape(next(iter(tensors.values())))[0]
  chunks = (n + batch - 1) // batch
  padded = {}
  for k, t in tensors.items():
    pad = chunks * batch - n
    t = tf.pad(t, [[0, pad]] + [[0, 0]] * (t.shape.rank - 1))
    padded[k] = tf.reshape(t, tf.concat([[chunks, batch], tf.shape(t)[1:]], 0))
  out = tf.map_fn(fn, padded, fn_output_signature=tf.TensorSpec([batch] + list(out_tail),
                                                                 out_dtype))
  out = tf.reshape(out, tf.concat([[chunks * batch], tf.shape(out)[2:]], 0))
  return out[:n]


def _fit(ids: tf.Tensor, length: int) -> tf.Tensor:
  """int32 ids [n, any] cut or zero-padded to [n, length]."""
  ids = tf.cast(ids, tf.int32)[:, :length]
  return tf.pad(ids, [[0, 0], [0, length - tf.shape(ids)[1]]])


def _encode(vocabulary, texts: tf.Tensor, length: int, append_eos: bool,
            keep_last: Optional[int] = None) -> tf.Tensor:
  """inference.encode_batch as TensorFlow ops: ids [n, length] (with
  keep_last, a text of `length` or more ids keeps its last keep_last)."""
  ragged = vocabulary.encode_tf(texts)
  if keep_last is not None:
    ends = ragged.row_lengths()
    starts = tf.where(ends >= length, ends - keep_last, tf.zeros_like(ends))
    ragged = tf.gather(ragged, tf.ragged.range(starts, ends), batch_dims=1)
  if append_eos:
    ragged = ragged[:, :length - 1]
    eos = tf.fill([ragged.nrows(), 1], tf.constant(vocabulary.eos_id, tf.int32))
    ragged = tf.concat([ragged, eos], axis=1)
  return ragged.to_tensor(default_value=0, shape=[None, length])


class _Exporter:
  """Builds the tf.functions of one Setup (mesh, model, vocabulary)."""

  def __init__(self, setup: modeling.Setup, decode_length: int, beam_size: int, alpha: float):
    self.setup = setup
    self.decode_length = decode_length
    self.beam_size = beam_size
    self.alpha = alpha
    self.batch = setup.batch_size
    self.lm = setup.model_type == "lm"

  # ---- one batch (fixed shapes) inside the mtf graph -----------------------
  def _decode_batch(self, ids: tf.Tensor) -> tf.Tensor:
    setup, batch = self.setup, self.batch
    if self.lm:
      length = setup.sequence_length["targets"]

      def build(mesh, features):
        del mesh
        out = modeling.call_with_supported(
            setup.new_model().sample_autoregressive, features["ids"], temperature=0.0,
            top_k=None, variable_dtype=setup.variable_dtype,
            max_steps=min(self.decode_length, length), stop_at_token=setup.vocabulary.eos_id)
        return {"ids": out}
      full = _lower(setup.mesh_impl, {"ids": ids}, {"ids": f"batch:{batch};length:{length}"},
                    build)["ids"]
      # The continuation only: the ids after each prompt, moved to the front.
      prompt = tf.reduce_sum(tf.cast(tf.not_equal(ids, 0), tf.int32), axis=1, keepdims=True)
      index = prompt + tf.range(length)[tf.newaxis, :]
      moved = tf.gather(full, tf.minimum(index, length - 1), batch_dims=1)
      return tf.where(index < length, moved, tf.zeros_like(moved))
    in_length = setup.sequence_length["inputs"]

    def build_bi(mesh, features):
      del mesh
      out = modeling.call_with_supported(
          setup.new_model().decode, features["inputs"], variable_dtype=setup.variable_dtype,
          beam_size=self.beam_size, temperature=0.0, alpha=self.alpha, top_k=None,
          max_decode_length=setup.sequence_length["targets"])
      return {"ids": out}
    return _lower(setup.mesh_impl, {"inputs": ids},
                  {"inputs": f"batch:{batch};length:{in_length}"}, build_bi)["ids"]

  def _score_batch(self, features: Dict[str, tf.Tensor]) -> tf.Tensor:
    setup = self.setup
    full = {}
    for key in setup.feature_keys:
      ids = features[key]
      length = setup.sequence_length[key]
      nonzero = tf.not_equal(ids, 0)
      full[key] = ids
      full[key + "_segmentation"] = tf.cast(nonzero, tf.int32)
      full[key + "_position"] = tf.where(
          nonzero, tf.broadcast_to(tf.range(length), tf.shape(ids)), 0)

    def build(mesh, mtf_features):
      del mesh
      logits, _ = modeling.call_model(setup, setup.new_model(), mtf_features, "eval",
                                      compute_loss=False)
      return {"score": modeling.log_likelihoods(logits, mtf_features["targets"])}
    return _lower(setup.mesh_impl, full, setup.feature_shapes(self.batch), build)["score"]

  # ---- whole requests ------------------------------------------------------
  def decode_ids(self, inputs: tf.Tensor) -> Dict[str, tf.Tensor]:
    key = "targets" if self.lm else "inputs"
    ids = _fit(inputs, self.setup.sequence_length[key])
    out = _in_chunks(lambda c: self._decode_batch(c["ids"]), {"ids": ids}, self.batch,
                     tf.int32, [self.setup.sequence_length["targets"]])
    return {"outputs": out}

  def score_ids(self, features: Dict[str, tf.Tensor]) -> Dict[str, tf.Tensor]:
    fitted = {k: _fit(features[k], self.setup.sequence_length[k])
              for k in self.setup.feature_keys}
    return {"scores": _in_chunks(self._score_batch, fitted, self.batch, tf.float32, [])}

  def decode_text(self, inputs: tf.Tensor) -> Dict[str, tf.Tensor]:
    vocab = self.setup.vocabulary
    key = "targets" if self.lm else "inputs"
    length = self.setup.sequence_length[key]
    keep = inference.prompt_room(length, self.decode_length) if self.lm else None
    ids = _encode(vocab, inputs, length, append_eos=not self.lm, keep_last=keep)
    return {"outputs": vocab.decode_tf(self.decode_ids(ids)["outputs"])}

  def score_text(self, features: Dict[str, tf.Tensor]) -> Dict[str, tf.Tensor]:
    vocab = self.setup.vocabulary
    ids = {k: _encode(vocab, features[k], self.setup.sequence_length[k], append_eos=True)
           for k in self.setup.feature_keys}
    return self.score_ids(ids)


def _signatures(exporter: _Exporter, text: bool) -> Dict[str, tf.types.experimental.ConcreteFunction]:
  """The concrete functions of every signature (tracing creates the
  variables, restored from the pending checkpoint)."""
  keys = exporter.setup.feature_keys
  ids_spec = tf.TensorSpec([None, None], tf.int32)
  str_spec = tf.TensorSpec([None], tf.string)
  out = {
      "decode_ids": tf.function(lambda inputs: exporter.decode_ids(inputs), autograph=False)
                    .get_concrete_function(tf.TensorSpec([None, None], tf.int32, "inputs")),
  }

  def score_ids(**features):
    return exporter.score_ids(features)
  out["score_ids"] = tf.function(score_ids, autograph=False).get_concrete_function(
      **{k: tf.TensorSpec(ids_spec.shape, tf.int32, k) for k in keys})
  if text:
    out["decode"] = tf.function(lambda inputs: exporter.decode_text(inputs),
                                autograph=False).get_concrete_function(
                                    tf.TensorSpec(str_spec.shape, tf.string, "inputs"))

    def score_text(**features):
      return exporter.score_text(features)
    out["score"] = tf.function(score_text, autograph=False).get_concrete_function(
        **{k: tf.TensorSpec(str_spec.shape, tf.string, k) for k in keys})
  out["serving_default"] = out["decode" if text else "decode_ids"]
  return out


@gin.configurable("export_saved_model", denylist=[
    "model_dir", "model_type", "vocabulary", "sequence_length", "vocab_divisor",
    "activation_dtype", "decode_length", "beam_size", "alpha"])
def export_saved_model(model_dir: str,
                       export_dir: Optional[str] = None,
                       model_type: str = "lm",
                       vocabulary: Optional[vocabulary_lib.Vocabulary] = None,
                       sequence_length: Optional[Mapping[str, int]] = None,
                       vocab_divisor: int = 8,
                       activation_dtype: str = "float32",
                       decode_length: int = 96,
                       beam_size: int = 1,
                       alpha: float = 0.6,
                       mesh_shape: str = DEFAULT_MESH_SHAPE,
                       layout_rules: str = "",
                       batch_size: int = 8) -> Dict[str, object]:
  """Writes a SavedModel of model_dir's latest checkpoint (see module docstring).

  Args:
    model_dir: the model directory (its latest checkpoint is exported).
    export_dir: where the SavedModel goes (default
      `<model_dir>/export/<checkpoint step>`).
    model_type: "lm" or "bitransformer".
    vocabulary: the run's vocabulary (default ByteVocabulary()).
    sequence_length: {"inputs": n, "targets": m}, as the model was trained.
    vocab_divisor: as in training (the model's vocabulary size rounding).
    activation_dtype: "float32", "bfloat16" or "float16".
    decode_length: a language model generates at most this many ids.
    beam_size: encoder-decoder: 1 for greedy decoding, else beam search.
    alpha: beam search length penalty.
    mesh_shape: the mesh the SavedModel computes on (gin:
      `export_saved_model.mesh_shape`; flag `--export_mesh_shape`), default one
      device.
    layout_rules: its layout (gin: `export_saved_model.layout_rules`; flag
      `--export_layout`).
    batch_size: rows per chunk inside the SavedModel (gin:
      `export_saved_model.batch_size`), rounded up to a multiple of how many
      ways the layout splits "batch".

  Returns:
    {"export_dir": path, "checkpoint": path restored, "step": int,
     "signatures": [names]}.

  Raises:
    ValueError: if model_dir has no checkpoint, or the mesh needs more devices
      than there are.

  Example:
    >>> export_saved_model("/tmp/bi", model_type="bitransformer",
    ...                    sequence_length={"inputs": 64, "targets": 64})["export_dir"]
    '/tmp/bi/export/600'
  """
  if not model_dir:
    raise ValueError("--mode=export needs --model_dir with a checkpoint (train first).")
  if model_type not in modeling.MODEL_TYPES:
    raise ValueError(f"model_type must be one of {modeling.MODEL_TYPES}, got {model_type!r}.")
  vocabulary = vocabulary or vocabulary_lib.ByteVocabulary()
  sequence_length = dict(sequence_length or {"inputs": 128, "targets": 128})
  mesh_impl = modeling.make_mesh_impl(mesh_shape or DEFAULT_MESH_SHAPE, layout_rules or "")
  split = modeling.batch_split(mesh_impl)
  batch = inference.padded_batch_size(batch_size, split)
  setup = modeling.Setup(
      model_type=model_type, vocabulary=vocabulary, mesh_impl=mesh_impl,
      sequence_length=sequence_length, batch_size=batch, vocab_size=vocabulary.vocab_size,
      vocab_divisor=vocab_divisor,
      variable_dtype=mtf.VariableDType(tf.float32, tf.float32, activation_dtype))
  checkpoint = inference.restore(mesh_impl, model_dir)
  step = checkpoint_step(checkpoint)
  export_dir = export_dir or os.path.join(model_dir, "export", str(step))
  text = has_graph_ops(vocabulary)
  if not text:
    inference.log(f"warning: {type(vocabulary).__name__} encodes with Python code, which a "
                  "SavedModel cannot hold: exporting the ids signatures only (decode_ids, "
                  "score_ids).")
  module = ExportModule()
  signatures = _signatures(_Exporter(setup, decode_length, beam_size, alpha), text)
  module.slice_variables = [
      v for var in slice_variables.variable_store(mesh_impl).values()
      for _, _, v in var.unique_slices()]
  # A vocabulary whose ops hold resources (tensorflow-text's SentencePiece
  # model) is saved with the functions that use them.
  module.vocabulary_resources = getattr(vocabulary, "saved_model_resources", lambda: [])()
  tf.saved_model.save(module, export_dir, signatures=signatures)
  inference.log(f"exported {checkpoint} (step {step}, mesh '{mesh_impl.shape.to_string()}', "
                f"layout '{mesh_impl.layout_rules.to_string()}', batch {batch}) to "
                f"{export_dir}: signatures {', '.join(sorted(signatures))}")
  return {"export_dir": export_dir, "checkpoint": checkpoint, "step": step,
          "signatures": sorted(signatures)}
