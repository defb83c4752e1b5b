"""BERT fine-tuning for SQuAD question answering (v1.1 and v2.0) on
mtf.training.Trainer.

    python -m mesh_tensorflow.bert.run_squad --vocab_file=vocab.txt \\
      --bert_config_file=bert_config.json --init_checkpoint=/tmp/bert_pretrain \\
      --train_file=train-v1.1.json --predict_file=dev-v1.1.json \\
      --output_dir=/tmp/squad --do_train --do_predict

Documents longer than --max_seq_length are cut into overlapping windows
(--doc_stride); each wordpiece's answer scores come from the window where
it has the most context. Predictions go to <output_dir>/predictions.json and
nbest_predictions.json (and null_odds.json with --version_2_with_negative).
"""

from __future__ import annotations

import os
if __name__ == "__main__":
  os.environ.setdefault("MTF_COMMAND_LINE", "1")
from mesh_tensorflow import cli  # noqa: E402

import collections  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
from typing import Callable, Dict, List, Optional  # noqa: E402

from absl import logging  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import mesh_tensorflow as mtf  # noqa: E402
from mesh_tensorflow.bert import _flags  # noqa: E402
from mesh_tensorflow.bert import _runner  # noqa: E402
from mesh_tensorflow.bert import bert as bert_lib  # noqa: E402
from mesh_tensorflow.bert import optimization as optimization_lib  # noqa: E402
from mesh_tensorflow.bert import tokenization  # noqa: E402

flags = _flags.flags
# This program's flags (see _flags: they are not absl's global FLAGS).
FLAGS, _d = _runner.program_flags(__name__, fine_tuning=True)


_d("string", "output_dir", None, "Where checkpoints and predictions go.")
_d("string", "train_file", None, "SQuAD json for training, e.g. train-v1.1.json.")
_d("string", "predict_file", None, "SQuAD json to predict, e.g. dev-v1.1.json.")
_d("integer", "max_seq_length", 384, "Wordpieces per window (question + document).")
_d("integer", "doc_stride", 128, "Stride between document windows.")
_d("integer", "max_query_length", 64, "Questions are cut to this many wordpieces.")
_d("bool", "do_predict", False, "Predict --predict_file.")
_d("integer", "predict_batch_size", 8, "Total batch size for predictions.")
_d("integer", "n_best_size", 20, "Candidates per question in nbest_predictions.json.")
_d("integer", "max_answer_length", 30, "Longest answer, in wordpieces.")
_d("string", "mesh_shape", "batch:8", "Mesh shape.")
_d("bool", "verbose_logging", False, "Log every answer-alignment warning.")
_d("bool", "version_2_with_negative", False, "Some questions have no answer (SQuAD 2.0).")
_d("float", "null_score_diff_threshold", 0.0,
   "Predict no answer when null score - best answer score exceeds this.")

TRAIN = "train"
RawResult = collections.namedtuple("RawResult", ["unique_id", "start_logits", "end_logits"])


class SquadExample:
  """A question with its document (whitespace tokens) and, for training, the
  answer's word positions (-1 for an impossible question)."""

  def __init__(self, qas_id, question_text, doc_tokens, orig_answer_text=None,
               start_position=None, end_position=None, is_impossible=False):
    self.qas_id = qas_id
    self.question_text = question_text
    self.doc_tokens = doc_tokens
    self.orig_answer_text = orig_answer_text
    self.start_position = start_position
    self.end_position = end_position
    self.is_impossible = is_impossible

  def __str__(self):
    return self.__repr__()

  def __repr__(self):
    text = (f"qas_id: {self.qas_id}, question_text: {self.question_text}, "
            f"doc_tokens: [{' '.join(self.doc_tokens)}]")
    if self.start_position:
      text += (f", start_position: {self.start_position}, end_position: "
               f"{self.end_position}, is_impossible: {self.is_impossible!r}")
    return text


class InputFeatures:
  """Model inputs of one document window."""

  def __init__(self, unique_id, example_index, doc_span_index, tokens, token_to_orig_map,
               token_is_max_context, input_ids, input_mask, segment_ids,
               start_position=None, end_position=None, is_impossible=None):
    self.unique_id = unique_id
    self.example_index = example_index
    self.doc_span_index = doc_span_index
    self.tokens = tokens
    self.token_to_orig_map = token_to_orig_map
    self.token_is_max_context = token_is_max_context
    self.input_ids = input_ids
    self.input_mask = input_mask
    self.segment_ids = segment_ids
    self.start_position = start_position
    self.end_position = end_position
    self.is_impossible = is_impossible


def _is_whitespace(c: str) -> bool:
  return c in " \t\r\n" or ord(c) == 0x202F


def read_squad_examples(input_file: str, is_training: bool) -> List[SquadExample]:
  """SquadExamples of a SQuAD json file. In training, answers whose text is
  not found at their offset are skipped (with a warning).

  Example:
    >>> examples = read_squad_examples("dev-v1.1.json", is_training=False)
  """
  try:
    with tf.io.gfile.GFile(input_file, "r") as f:
      data = json.load(f)["data"]
  except tf.errors.NotFoundError:
    raise FileNotFoundError(f"SQuAD file {input_file} does not exist") from None
  except (ValueError, KeyError, TypeError) as e:
    raise ValueError(f"{input_file} is not a SQuAD json file (with a 'data' list): {e}") \
        from None
  v2 = _flags.value(FLAGS, "version_2_with_negative", False)
  examples = []
  for entry in data:
    for paragraph in entry["paragraphs"]:
      text = paragraph["context"]
      doc_tokens: List[str] = []
      char_to_word = []
      previous_space = True
      for c in text:
        if _is_whitespace(c):
          previous_space = True
        else:
          if previous_space:
            doc_tokens.append(c)
          else:
            doc_tokens[-1] += c
          previous_space = False
        char_to_word.append(len(doc_tokens) - 1)
      for qa in paragraph["qas"]:
        start = end = None
        answer_text = None
        impossible = False
        if is_training:
          impossible = bool(v2 and qa.get("is_impossible", False))
          if not impossible and len(qa["answers"]) != 1:
            raise ValueError(f"{input_file}: question {qa['id']} needs exactly one answer "
                             "for training")
          if impossible:
            start, end, answer_text = -1, -1, ""
          else:
            answer = qa["answers"][0]
            answer_text = answer["text"]
            offset = answer["answer_start"]
            start = char_to_word[offset]
            end = char_to_word[offset + len(answer_text) - 1]
            found = " ".join(doc_tokens[start:end + 1])
            wanted = " ".join(tokenization.whitespace_tokenize(answer_text))
            if wanted not in found:
              logging.warning("could not find answer %r (found %r); skipping", wanted, found)
              continue
        examples.append(SquadExample(qa["id"], qa["question"], doc_tokens, answer_text,
                                     start, end, impossible))
  return examples


def convert_examples_to_features(examples, tokenizer, max_seq_length: int, doc_stride: int,
                                 max_query_length: int, is_training: bool,
                                 output_fn: Callable[[InputFeatures], None]) -> None:
  """Cuts each example into windows "[CLS] question [SEP] document part
  [SEP]" and calls output_fn(InputFeatures) for each. In training, a window
  without the answer points at [CLS] (position 0).

  Example:
    >>> features = []
    >>> convert_examples_to_features(examples, tok, 384, 128, 64, False, features.append)
  """
  unique_id = 1000000000
  for example_index, example in enumerate(examples):
    query = tokenizer.tokenize(example.question_text)[:max_query_length]
    tok_to_orig, orig_to_tok, doc_pieces = [], [], []
    for i, token in enumerate(example.doc_tokens):
      orig_to_tok.append(len(doc_pieces))
      for piece in tokenizer.tokenize(token):
        tok_to_orig.append(i)
        doc_pieces.append(piece)
    tok_start = tok_end = None
    if is_training and example.is_impossible:
      tok_start = tok_end = -1
    elif is_training:
      tok_start = orig_to_tok[example.start_position]
      tok_end = (orig_to_tok[example.end_position + 1] - 1
                 if example.end_position < len(example.doc_tokens) - 1
                 else len(doc_pieces) - 1)
      tok_start, tok_end = _improve_answer_span(doc_pieces, tok_start, tok_end, tokenizer,
                                                example.orig_answer_text)
    max_doc = max_seq_length - len(query) - 3
    if max_doc < 1:
      raise ValueError(f"max_seq_length={max_seq_length} leaves no room for the document "
                       f"after a {len(query)}-piece question; raise it above "
                       "max_query_length + 3")
    spans = []
    start = 0
    while start < len(doc_pieces):
      length = min(len(doc_pieces) - start, max_doc)
      spans.append((start, length))
      if start + length == len(doc_pieces):
        break
      start += min(length, doc_stride)
    for span_index, (span_start, span_length) in enumerate(spans):
      tokens = ["[CLS]"] + query + ["[SEP]"]
      segment_ids = [0] * len(tokens)
      token_to_orig_map, token_is_max_context = {}, {}
      for i in range(span_length):
        position = span_start + i
        token_to_orig_map[len(tokens)] = tok_to_orig[position]
        token_is_max_context[len(tokens)] = _check_is_max_context(spans, span_index, position)
        tokens.append(doc_pieces[position])
        segment_ids.append(1)
      tokens.append("[SEP]")
      segment_ids.append(1)
      input_ids = tokenizer.convert_tokens_to_ids(tokens)
      input_mask = [1] * len(input_ids)
      pad = max_seq_length - len(input_ids)
      input_ids += [0] * pad
      input_mask += [0] * pad
      segment_ids += [0] * pad
      start_position = end_position = None
      if is_training:
        inside = (not example.is_impossible and span_start <= tok_start
                  and tok_end <= span_start + span_length - 1)
        if inside:
          offset = len(query) + 2 - span_start
          start_position, end_position = tok_start + offset, tok_end + offset
        else:
          start_position = end_position = 0
      output_fn(InputFeatures(unique_id, example_index, span_index, tokens, token_to_orig_map,
                              token_is_max_context, input_ids, input_mask, segment_ids,
                              start_position, end_position, example.is_impossible))
      unique_id += 1


def _improve_answer_span(doc_tokens, input_start: int, input_end: int, tokenizer,
                         orig_answer_text: str):
  """The tightest wordpiece span whose text equals the tokenized answer (the
  word-level span may include extra pieces, e.g. "1895" of "(1895-1943).")."""
  wanted = " ".join(tokenizer.tokenize(orig_answer_text))
  for new_start in range(input_start, input_end + 1):
    for new_end in range(input_end, new_start - 1, -1):
      if " ".join(doc_tokens[new_start:new_end + 1]) == wanted:
        return new_start, new_end
  return input_start, input_end


def _check_is_max_context(doc_spans, cur_span_index: int, position: int) -> bool:
  """Whether the window cur_span_index gives `position` the most context
  (min of left and right context, plus a small bonus for longer windows)."""
  best_score, best_index = None, None
  for index, (start, length) in enumerate(doc_spans):
    end = start + length - 1
    if position < start or position > end:
      continue
    score = min(position - start, end - position) + 0.01 * length
    if best_score is None or score > best_score:
      best_score, best_index = score, index
  return cur_span_index == best_index


def create_model(bert_config, is_training, input_ids, input_mask, segment_ids,
                 mesh_shape: Optional[str] = None, layout: Optional[str] = None):
  """Start and end logits [batch, seq] from BERT's sequence output
  (dense layer "cls/squad/output" to 2 classes).

  Example:
    >>> start_logits, end_logits = create_model(config, False, ids, mask, types)
  """
  model = bert_lib.BertModel(
      config=bert_config, is_training=is_training, input_ids=input_ids,
      input_mask=input_mask, token_type_ids=segment_ids,
      mesh_shape=mesh_shape if mesh_shape is not None else _flags.value(FLAGS, "mesh_shape", ""),
      layout=layout if layout is not None else _flags.value(FLAGS, "layout", ""))
  class_dim = mtf.Dimension("class", 2)
  logits = mtf.layers.dense(model.get_sequence_output(), reduced_dims=[model.model_dim],
                            new_dims=[class_dim],
                            kernel_initializer=mtf.initializers.truncated_normal(stddev=0.02),
                            name="cls/squad/output")
  start_logits, end_logits = mtf.unstack(logits, dim=class_dim)
  return start_logits, end_logits


def feature_shapes(batch_size: int, seq_length: int, is_training: bool) -> Dict[str, str]:
  """The Trainer's feature shapes of SQuAD batches.

  Example:
    >>> feature_shapes(32, 384, True)["start_positions"]
    'batch:32'
  """
  seq = f"batch:{batch_size};seq:{seq_length}"
  shapes = {"unique_ids": f"batch:{batch_size}", "input_ids": seq, "input_mask": seq,
            "segment_ids": seq}
  if is_training:
    shapes.update(start_positions=f"batch:{batch_size}", end_positions=f"batch:{batch_size}")
  return shapes


def model_fn_builder(bert_config, init_checkpoint, learning_rate, num_train_steps,
                     num_warmup_steps, use_tpu=False, optimizer: Optional[str] = None,
                     clip_gradients: Optional[bool] = None) -> Callable:
  """The SQuAD training model function for `mtf.training.Trainer`: the mean
  of the start and end positions' cross-entropies. Attributes `optimizer`,
  `init_checkpoint`, and `predict(mesh, features)` -> start/end logits.

  Example:
    >>> model_fn = model_fn_builder(config, None, 5e-5, 1000, 100, False)
  """
  if use_tpu:
    raise ValueError(_runner.ESTIMATOR_ONLY.format(what="use_tpu=True"))

  def model_fn(mesh, features, mode):
    start_logits, end_logits = create_model(
        bert_config, mode == TRAIN, features["input_ids"], features["input_mask"],
        features["segment_ids"])
    seq_dim = start_logits.shape.dims[-1]

    def loss_for(logits, positions):
      log_probs = mtf.log_softmax(logits, seq_dim)
      one_hot = mtf.one_hot(positions, seq_dim, dtype=log_probs.dtype)
      return -mtf.reduce_mean(mtf.reduce_sum(one_hot * log_probs, reduced_dim=seq_dim))
    return (loss_for(start_logits, features["start_positions"])
            + loss_for(end_logits, features["end_positions"])) / 2.0

  def predict(mesh, features):
    start_logits, end_logits = create_model(bert_config, False, features["input_ids"],
                                            features["input_mask"], features["segment_ids"])
    return {"unique_ids": mtf.anonymize(features["unique_ids"]),
            "start_logits": mtf.anonymize(start_logits),
            "end_logits": mtf.anonymize(end_logits)}

  model_fn.optimizer = optimization_lib.make_optimizer(
      learning_rate, num_train_steps, num_warmup_steps,
      max_optimized_variable_size=int(_flags.value(FLAGS, "max_optimized_variable_size", 0) or 0)
      or None,
      optimizer=optimizer or _flags.value(FLAGS, "optimizer", "adam"),
      clip_gradients=(_flags.value(FLAGS, "clip_gradients", True) if clip_gradients is None
                      else clip_gradients))
  model_fn.init_checkpoint = init_checkpoint
  model_fn.predict = predict
  return model_fn


def input_fn_builder(input_file: str, seq_length: int, is_training: bool,
                     drop_remainder: bool) -> Callable:
  """input_fn(params) -> batches of a TFRecord file written by `FeatureWriter`.

  Example:
    >>> ds = input_fn_builder("train.tf_record", 384, True, True)({"batch_size": 32})
  """
  spec = {"unique_ids": tf.io.FixedLenFeature([], tf.int64),
          "input_ids": tf.io.FixedLenFeature([seq_length], tf.int64),
          "input_mask": tf.io.FixedLenFeature([seq_length], tf.int64),
          "segment_ids": tf.io.FixedLenFeature([seq_length], tf.int64)}
  if is_training:
    spec["start_positions"] = tf.io.FixedLenFeature([], tf.int64)
    spec["end_positions"] = tf.io.FixedLenFeature([], tf.int64)

  def decode(record):
    example = tf.io.parse_single_example(record, spec)
    return {k: tf.cast(v, tf.int32) for k, v in example.items()}

  def input_fn(params):
    d = tf.data.TFRecordDataset(input_file)
    if is_training:
      d = d.repeat().shuffle(100)
    return d.map(decode).batch(params["batch_size"], drop_remainder=drop_remainder)
  return input_fn


def _get_best_indexes(logits, n_best_size: int) -> List[int]:
  return [int(i) for i in np.argsort(-np.asarray(logits), kind="stable")[:n_best_size]]


def _compute_softmax(scores) -> List[float]:
  if not scores:
    return []
  top = max(scores)
  exps = [math.exp(s - top) for s in scores]
  total = sum(exps)
  return [e / total for e in exps]


def write_predictions(all_examples, all_features, all_results, n_best_size: int,
                      max_answer_length: int, do_lower_case: bool, output_prediction_file: str,
                      output_nbest_file: str, output_null_log_odds_file: str) -> None:
  """Picks each question's best answer span over its windows and writes
  predictions.json ({qas_id: text}), the n-best lists and (SQuAD 2.0) the
  null-score differences.

  Example:
    >>> write_predictions(examples, features, results, 20, 30, True,
    ...                   "predictions.json", "nbest.json", "null_odds.json")
  """
  v2 = _flags.value(FLAGS, "version_2_with_negative", False)
  threshold = _flags.value(FLAGS, "null_score_diff_threshold", 0.0)
  by_example = collections.defaultdict(list)
  for feature in all_features:
    by_example[feature.example_index].append(feature)
  results = {r.unique_id: r for r in all_results}
  predictions, nbest_json, null_odds = collections.OrderedDict(), collections.OrderedDict(), \
      collections.OrderedDict()
  for example_index, example in enumerate(all_examples):
    candidates = []  # (score, feature, start, end)
    null_score, null_feature = None, None
    for feature in by_example[example_index]:
      result = results.get(feature.unique_id)
      if result is None:
        continue
      if v2:
        score = result.start_logits[0] + result.end_logits[0]
        if null_score is None or score < null_score:
          null_score, null_feature = score, feature
      for s in _get_best_indexes(result.start_logits, n_best_size):
        for e in _get_best_indexes(result.end_logits, n_best_size):
          if (s not in feature.token_to_orig_map or e not in feature.token_to_orig_map
              or not feature.token_is_max_context.get(s, False) or e < s
              or e - s + 1 > max_answer_length):
            continue
          candidates.append((result.start_logits[s] + result.end_logits[e], feature, s, e))
    candidates.sort(key=lambda c: -c[0])
    nbest, seen = [], set()
    for score, feature, s, e in candidates:
      if len(nbest) >= n_best_size:
        break
      orig_start, orig_end = feature.token_to_orig_map[s], feature.token_to_orig_map[e]
      pieces = " ".join(feature.tokens[s:e + 1]).replace(" ##", "").replace("##", "")
      pieces = " ".join(pieces.strip().split())
      orig_text = " ".join(example.doc_tokens[orig_start:orig_end + 1])
      text = get_final_text(pieces, orig_text, do_lower_case)
      if text in seen:
        continue
      seen.add(text)
      nbest.append((text, score))
    if v2 and null_feature is not None and "" not in seen:
      nbest.append(("", null_score))
    if not nbest:
      nbest.append(("empty", 0.0))
    probs = _compute_softmax([s for _, s in nbest])
    nbest_json[example.qas_id] = [{"text": t, "probability": p, "score": float(s)}
                                  for (t, s), p in zip(nbest, probs)]
    best_non_null = next(((t, s) for t, s in nbest if t), None)
    if not v2:
      predictions[example.qas_id] = nbest[0][0]
    else:
      diff = null_score - (best_non_null[1] if best_non_null else 0.0) \
          if null_score is not None else float("-inf")
      null_odds[example.qas_id] = float(diff)
      predictions[example.qas_id] = ("" if diff > threshold or best_non_null is None
                                     else best_non_null[0])
  for path, value in ((output_prediction_file, predictions), (output_nbest_file, nbest_json)):
    with tf.io.gfile.GFile(path, "w") as f:
      f.write(json.dumps(value, indent=2) + "\n")
  if v2:
    with tf.io.gfile.GFile(output_null_log_odds_file, "w") as f:
      f.write(json.dumps(null_odds, indent=2) + "\n")


def get_final_text(pred_text: str, orig_text: str, do_lower_case: bool) -> str:
  """Maps a normalized predicted span back onto the original text: finds the
  tokenized prediction inside the basic-tokenized original and returns the
  corresponding characters of orig_text (orig_text if that fails).

  Example:
    >>> get_final_text("steve smith", "Steve Smith's", True)
    'Steve Smith'
  """
  def strip_spaces(text):
    kept, mapping = [], {}
    for i, c in enumerate(text):
      if c == " ":
        continue
      mapping[len(kept)] = i
      kept.append(c)
    return "".join(kept), mapping

  tokenized = " ".join(tokenization.BasicTokenizer(do_lower_case=do_lower_case)
                       .tokenize(orig_text))
  start = tokenized.find(pred_text)
  if start == -1:
    if _flags.value(FLAGS, "verbose_logging", False):
      logging.info("could not find %r in %r", pred_text, orig_text)
    return orig_text
  end = start + len(pred_text) - 1
  orig_stripped, orig_map = strip_spaces(orig_text)
  tok_stripped, tok_map = strip_spaces(tokenized)
  if len(orig_stripped) != len(tok_stripped):
    return orig_text
  tok_index_to_stripped = {v: k for k, v in tok_map.items()}
  s = tok_index_to_stripped.get(start)
  e = tok_index_to_stripped.get(end)
  if s is None or e is None or s not in orig_map or e not in orig_map:
    return orig_text
  return orig_text[orig_map[s]:orig_map[e] + 1]


class FeatureWriter:
  """Writes InputFeatures as tf.train.Examples to a TFRecord file.

  Example:
    >>> writer = FeatureWriter("train.tf_record", is_training=True)
    >>> convert_examples_to_features(examples, tok, 384, 128, 64, True,
    ...                              writer.process_feature)
    >>> writer.close()
  """

  def __init__(self, filename: str, is_training: bool):
    self.filename = filename
    self.is_training = is_training
    self.num_features = 0
    self._writer = tf.io.TFRecordWriter(filename)

  def process_feature(self, feature: InputFeatures) -> None:
    self.num_features += 1

    def ints(values):
      return tf.train.Feature(int64_list=tf.train.Int64List(value=list(values)))
    values = collections.OrderedDict(
        unique_ids=ints([feature.unique_id]), input_ids=ints(feature.input_ids),
        input_mask=ints(feature.input_mask), segment_ids=ints(feature.segment_ids))
    if self.is_training:
      values["start_positions"] = ints([feature.start_position])
      values["end_positions"] = ints([feature.end_position])
      values["is_impossible"] = ints([int(bool(feature.is_impossible))])
    example = tf.train.Example(features=tf.train.Features(feature=values))
    self._writer.write(example.SerializeToString())

  def close(self) -> None:
    self._writer.close()


def validate_flags_or_throw(bert_config) -> None:
  """Raises ValueError on inconsistent flags (casing vs checkpoint, missing
  files, sequence lengths).

  Example:
    >>> validate_flags_or_throw(bert_lib.BertConfig.from_json_file(FLAGS.bert_config_file))
  """
  tokenization.validate_case_matches_checkpoint(_flags.value(FLAGS, "do_lower_case", True),
                                                _flags.value(FLAGS, "init_checkpoint"))
  do_train = _flags.value(FLAGS, "do_train", False)
  do_predict = _flags.value(FLAGS, "do_predict", False)
  if not do_train and not do_predict:
    raise ValueError("At least one of --do_train or --do_predict must be set.")
  if do_train and not _flags.value(FLAGS, "train_file"):
    raise ValueError("--do_train needs --train_file.")
  if do_predict and not _flags.value(FLAGS, "predict_file"):
    raise ValueError("--do_predict needs --predict_file.")
  max_seq_length = _flags.value(FLAGS, "max_seq_length", 384)
  if max_seq_length > bert_config.max_position_embeddings:
    raise ValueError(f"--max_seq_length={max_seq_length} exceeds the model's "
                     f"max_position_embeddings={bert_config.max_position_embeddings}.")
  if max_seq_length <= _flags.value(FLAGS, "max_query_length", 64) + 3:
    raise ValueError(f"--max_seq_length={max_seq_length} must exceed --max_query_length="
                     f"{_flags.value('max_query_length', 64)} + 3.")


def main(_):
  if FLAGS.use_tpu:
    raise cli.UserError(_runner.ESTIMATOR_ONLY.format(what="--use_tpu"),
                        hint="drop --use_tpu; give the devices' mesh with --mesh_shape")
  for name in ("vocab_file", "bert_config_file", "output_dir"):
    _runner.require(getattr(FLAGS, name), f"--{name}")
  bert_config = bert_lib.BertConfig.from_json_file(FLAGS.bert_config_file)
  try:
    validate_flags_or_throw(bert_config)
  except ValueError as e:
    raise cli.UserError(str(e)) from None
  tf.io.gfile.makedirs(FLAGS.output_dir)
  tokenizer = tokenization.FullTokenizer(FLAGS.vocab_file, FLAGS.do_lower_case)
  seq = FLAGS.max_seq_length
  num_train_steps = num_warmup_steps = 0
  train_file = None
  if FLAGS.do_train:
    examples = read_squad_examples(FLAGS.train_file, is_training=True)
    train_file = FLAGS.cached_train_file or os.path.join(FLAGS.output_dir, "train.tf_record")
    writer = FeatureWriter(train_file, is_training=True)
    convert_examples_to_features(examples, tokenizer, seq, FLAGS.doc_stride,
                                 FLAGS.max_query_length, True, writer.process_feature)
    writer.close()
    num_train_steps = int(writer.num_features / FLAGS.train_batch_size
                          * FLAGS.num_train_epochs)
    num_warmup_steps = int(num_train_steps * FLAGS.warmup_proportion)
    if num_train_steps < 1:
      raise cli.UserError(f"{writer.num_features} training windows make no step of "
                          f"--train_batch_size={FLAGS.train_batch_size}")
  model_fn = model_fn_builder(bert_config, FLAGS.init_checkpoint, FLAGS.learning_rate,
                              max(num_train_steps, 1), num_warmup_steps)
  impl = _runner.make_mesh_impl(FLAGS.mesh_shape, FLAGS.layout)
  trainer = _runner.make_trainer(
      model_fn, feature_shapes(FLAGS.train_batch_size, seq, True), impl, model_fn.optimizer,
      FLAGS.output_dir, FLAGS.init_checkpoint, checkpoint_every=FLAGS.save_checkpoints_steps,
      log_every=FLAGS.iterations_per_loop)
  if FLAGS.do_train:
    data = input_fn_builder(train_file, seq, True, True)({"batch_size": FLAGS.train_batch_size})
    trainer.train(data, steps=num_train_steps)
  if FLAGS.do_predict:
    examples = read_squad_examples(FLAGS.predict_file, is_training=False)
    features: List[InputFeatures] = []
    convert_examples_to_features(examples, tokenizer, seq, FLAGS.doc_stride,
                                 FLAGS.max_query_length, False, features.append)
    batch = FLAGS.predict_batch_size
    padded = features + [features[-1]] * (-len(features) % batch) if features else []
    data = {"unique_ids": np.asarray([f.unique_id for f in padded], np.int32),
            "input_ids": np.asarray([f.input_ids for f in padded], np.int32),
            "input_mask": np.asarray([f.input_mask for f in padded], np.int32),
            "segment_ids": np.asarray([f.segment_ids for f in padded], np.int32)}
    dataset = tf.data.Dataset.from_tensor_slices(data).batch(batch, drop_remainder=True)
    outputs = _runner.predict(impl, model_fn.predict, feature_shapes(batch, seq, False),
                              dataset)
    results = []
    for out in outputs:
      for uid, s, e in zip(out["unique_ids"], out["start_logits"], out["end_logits"]):
        results.append(RawResult(int(uid), [float(x) for x in s], [float(x) for x in e]))
    write_predictions(examples, features, results[:len(features)], FLAGS.n_best_size,
                      FLAGS.max_answer_length, FLAGS.do_lower_case,
                      os.path.join(FLAGS.output_dir, "predictions.json"),
                      os.path.join(FLAGS.output_dir, "nbest_predictions.json"),
                      os.path.join(FLAGS.output_dir, "null_odds.json"))
    print(f"predictions: {os.path.join(FLAGS.output_dir, 'predictions.json')}", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(_flags.run_main(main, FLAGS))
