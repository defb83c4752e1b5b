"""BERT fine-tuning for sequence (pair) classification (GLUE-style tasks:
CoLA, MRPC, MNLI, XNLI) on mtf.training.Trainer.

    python -m mesh_tensorflow.bert.run_classifier --task_name=mrpc \\
      --data_dir=glue/MRPC --vocab_file=vocab.txt --bert_config_file=bert_config.json \\
      --init_checkpoint=/tmp/bert_pretrain --output_dir=/tmp/mrpc --do_train --do_eval

`model_fn_builder` returns a Trainer model function `model_fn(mesh,
features, mode)` (with an `optimizer` attribute) instead of a TPUEstimator
one; `input_fn_builder` and `file_based_input_fn_builder` return
input_fn(params) -> tf.data.Dataset as before.
"""

from __future__ import annotations

import os
if __name__ == "__main__":
  os.environ.setdefault("MTF_COMMAND_LINE", "1")
from mesh_tensorflow import cli  # noqa: E402

import csv  # noqa: E402
import sys  # noqa: E402
from typing import Callable, Dict, List, Optional, Sequence  # noqa: E402

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


_d("string", "data_dir", None, "Directory of the task's .tsv files.")
_d("string", "task_name", None, "The task: cola, mnli, mrpc or xnli.")
_d("string", "output_dir", None, "Where checkpoints, events and results go.")
_d("integer", "max_seq_length", 128, "Sequence length after WordPiece tokenization.")
_d("bool", "do_eval", False, "Evaluate on the dev set.")
_d("bool", "do_predict", False, "Predict the test set.")
_d("integer", "eval_batch_size", 32, "Total batch size for eval.")
_d("integer", "predict_batch_size", 8, "Total batch size for predict.")
_d("string", "mesh_shape", "batch:8", "Mesh shape.")

TRAIN, EVAL = "train", "eval"


class InputExample:
  """One example: guid, text_a, optional text_b (pair tasks) and label.

  Example:
    >>> InputExample("train-1", "the cat sat", label="1")
  """

  def __init__(self, guid, text_a, text_b=None, label=None):
    self.guid = guid
    self.text_a = text_a
    self.text_b = text_b
    self.label = label


class PaddingInputExample:
  """A placeholder example that pads a set to a multiple of the batch size;
  its features are all zero with is_real_example=False (weight out of metrics)."""


class InputFeatures:
  """Model inputs of one example (lists of length max_seq_length).

  Example:
    >>> InputFeatures([101, 7, 102, 0], [1, 1, 1, 0], [0, 0, 0, 0], label_id=1)
  """

  def __init__(self, input_ids, input_mask, segment_ids, label_id, is_real_example=True):
    self.input_ids = input_ids
    self.input_mask = input_mask
    self.segment_ids = segment_ids
    self.label_id = label_id
    self.is_real_example = is_real_example


class DataProcessor:
  """Reads a task's train/dev/test examples and names its labels."""

  def get_train_examples(self, data_dir):
    raise NotImplementedError()

  def get_dev_examples(self, data_dir):
    raise NotImplementedError()

  def get_test_examples(self, data_dir):
    raise NotImplementedError()

  def get_labels(self):
    raise NotImplementedError()

  def _lines(self, data_dir, name):
    return self._read_tsv(os.path.join(data_dir, name))

  @classmethod
  def _read_tsv(cls, input_file, quotechar=None):
    """Rows of a tab-separated file."""
    try:
      with tf.io.gfile.GFile(input_file, "r") as f:
        return list(csv.reader(f, delimiter="\t", quotechar=quotechar))
    except tf.errors.NotFoundError:
      raise FileNotFoundError(f"{input_file} does not exist") from None


def _u(text):
  return tokenization.convert_to_unicode(text)


def _column(line, index, path_hint):
  try:
    return _u(line[index])
  except IndexError:
    raise ValueError(f"{path_hint}: a row has {len(line)} columns, fewer than "
                     f"{index + 1}: {line!r}") from None


def _pair_examples(lines: Sequence[Sequence[str]], set_type: str, text_a_column: int,
                   text_b_column: int, label_column: int, test_label: str,
                   guid_column: Optional[int] = None) -> List[InputExample]:
  """The sentence-pair examples of a GLUE file's rows (the first is a header).

  Args:
    lines: the file's rows.
    set_type: "train", "dev", "test", ...: the guids' prefix; the "test" set
      has no labels.
    text_a_column: the column of the first sentence.
    text_b_column: the column of the second sentence.
    label_column: the column of the label.
    test_label: the label of every test example.
    guid_column: the column of the example's id (None: the row number).

  Returns:
    One InputExample per row after the header.
  """
  path = f"the {set_type} file"
  examples = []
  for i, line in enumerate(lines):
    if i == 0:
      continue
    label = test_label if set_type == "test" else _column(line, label_column, path)
    guid = i if guid_column is None else _column(line, guid_column, path)
    examples.append(InputExample(f"{set_type}-{guid}", _column(line, text_a_column, path),
                                 _column(line, text_b_column, path), label))
  return examples


class XnliProcessor(DataProcessor):
  """XNLI (Chinese by default: `language`)."""

  def __init__(self):
    self.language = "zh"

  def get_train_examples(self, data_dir):
    path = os.path.join(data_dir, "multinli", f"multinli.train.{self.language}.tsv")
    examples = []
    for i, line in enumerate(self._read_tsv(path)):
      if i == 0:
        continue
      label = _column(line, 2, path)
      examples.append(InputExample(f"train-{i}", _column(line, 0, path), _column(line, 1, path),
                                   "contradiction" if label == "contradictory" else label))
    return examples

  def get_dev_examples(self, data_dir):
    path = os.path.join(data_dir, "xnli.dev.tsv")
    examples = []
    for i, line in enumerate(self._read_tsv(path)):
      if i == 0 or _column(line, 0, path) != self.language:
        continue
      examples.append(InputExample(f"dev-{i}", _column(line, 6, path), _column(line, 7, path),
                                   _column(line, 1, path)))
    return examples

  def get_labels(self):
    return ["contradiction", "entailment", "neutral"]


class _GlueFilesProcessor(DataProcessor):
  """A GLUE task whose sets are the files `SETS` names in data_dir, each
  read by `_create_examples(rows, set_type)`."""

  # set -> (file name, set_type passed to _create_examples)
  SETS = {"train": ("train.tsv", "train"), "dev": ("dev.tsv", "dev"),
          "test": ("test.tsv", "test")}

  def _create_examples(self, lines, set_type):
    raise NotImplementedError()

  def _examples(self, data_dir, which):
    name, set_type = self.SETS[which]
    return self._create_examples(self._lines(data_dir, name), set_type)

  def get_train_examples(self, data_dir):
    return self._examples(data_dir, "train")

  def get_dev_examples(self, data_dir):
    return self._examples(data_dir, "dev")

  def get_test_examples(self, data_dir):
    return self._examples(data_dir, "test")


class MnliProcessor(_GlueFilesProcessor):
  """MultiNLI (GLUE), matched dev and test sets."""

  SETS = {"train": ("train.tsv", "train"), "dev": ("dev_matched.tsv", "dev_matched"),
          "test": ("test_matched.tsv", "test")}

  def get_labels(self):
    return ["contradiction", "entailment", "neutral"]

  def _create_examples(self, lines, set_type):
    return _pair_examples(lines, set_type, 8, 9, -1, "contradiction", guid_column=0)


class MrpcProcessor(_GlueFilesProcessor):
  """Microsoft Research Paraphrase Corpus (GLUE)."""

  def get_labels(self):
    return ["0", "1"]

  def _create_examples(self, lines, set_type):
    return _pair_examples(lines, set_type, 3, 4, 0, "0")


class ColaProcessor(_GlueFilesProcessor):
  """Corpus of Linguistic Acceptability (GLUE); single sentences."""

  def get_labels(self):
    return ["0", "1"]

  def _create_examples(self, lines, set_type):
    path = f"the {set_type} file"
    examples = []
    for i, line in enumerate(lines):
      if set_type == "test":
        if i == 0:  # only the test file has a header
          continue
        text, label = _column(line, 1, path), "0"
      else:
        text, label = _column(line, 3, path), _column(line, 1, path)
      examples.append(InputExample(f"{set_type}-{i}", text, None, label))
    return examples


PROCESSORS = {"cola": ColaProcessor, "mnli": MnliProcessor, "mrpc": MrpcProcessor,
              "xnli": XnliProcessor}


def _truncate_seq_pair(tokens_a: List[str], tokens_b: List[str], max_length: int) -> None:
  """Drops tokens from the end of the longer list until both fit, in place."""
  while len(tokens_a) + len(tokens_b) > max_length:
    (tokens_a if len(tokens_a) > len(tokens_b) else tokens_b).pop()


def convert_single_example(ex_index: int, example, label_list: Sequence[str],
                           max_seq_length: int, tokenizer) -> InputFeatures:
  """Tokenizes one example into "[CLS] a [SEP] (b [SEP])", segment ids 0 for
  a and 1 for b, zero-padded to max_seq_length.

  Example:
    >>> f = convert_single_example(0, InputExample("1", "a b", label="1"), ["0", "1"],
    ...                            8, tokenizer)
  """
  if isinstance(example, PaddingInputExample):
    zeros = [0] * max_seq_length
    return InputFeatures(list(zeros), list(zeros), list(zeros), 0, is_real_example=False)
  label_map = {label: i for i, label in enumerate(label_list)}
  if example.label not in label_map:
    raise ValueError(f"example {example.guid}: label {example.label!r} is not one of "
                     f"{list(label_list)}")
  tokens_a = tokenizer.tokenize(example.text_a)
  tokens_b = tokenizer.tokenize(example.text_b) if example.text_b else None
  if tokens_b:
    _truncate_seq_pair(tokens_a, tokens_b, max_seq_length - 3)
  else:
    tokens_a = tokens_a[:max_seq_length - 2]
  tokens = ["[CLS]"] + tokens_a + ["[SEP]"]
  segment_ids = [0] * len(tokens)
  if tokens_b:
    tokens += tokens_b + ["[SEP]"]
    segment_ids += [1] * (len(tokens_b) + 1)
  input_ids = tokenizer.convert_tokens_to_ids(tokens)
  input_mask = [1] * len(input_ids)
  pad = max_seq_length - len(input_ids)
  input_ids += [0] * pad
  input_mask += [0] * pad
  segment_ids += [0] * pad
  if ex_index < 5:
    logging.info("example %s: tokens %s label %s", example.guid,
                 " ".join(tokenization.printable_text(t) for t in tokens), example.label)
  return InputFeatures(input_ids, input_mask, segment_ids, label_map[example.label])


def convert_examples_to_features(examples, label_list, max_seq_length, tokenizer
                                 ) -> List[InputFeatures]:
  """`convert_single_example` of every example.

  Example:
    >>> features = convert_examples_to_features(examples, ["0", "1"], 128, tokenizer)
  """
  return [convert_single_example(i, ex, label_list, max_seq_length, tokenizer)
          for i, ex in enumerate(examples)]


def file_based_convert_examples_to_features(examples, label_list, max_seq_length, tokenizer,
                                            output_file: str) -> None:
  """Writes the examples' features as tf.train.Examples to a TFRecord file.

  Example:
    >>> file_based_convert_examples_to_features(examples, labels, 128, tok, "train.tfrecord")
  """
  def ints(values):
    return tf.train.Feature(int64_list=tf.train.Int64List(value=list(values)))
  with tf.io.TFRecordWriter(output_file) as writer:
    for i, example in enumerate(examples):
      f = convert_single_example(i, example, label_list, max_seq_length, tokenizer)
      record = tf.train.Example(features=tf.train.Features(feature={
          "input_ids": ints(f.input_ids), "input_mask": ints(f.input_mask),
          "segment_ids": ints(f.segment_ids), "label_ids": ints([f.label_id]),
          "is_real_example": ints([int(f.is_real_example)])}))
      writer.write(record.SerializeToString())


def _finish(d: tf.data.Dataset, is_training: bool, batch_size: int,
            drop_remainder: bool) -> tf.data.Dataset:
  if is_training:
    d = d.repeat().shuffle(100)
  return d.batch(batch_size, drop_remainder=drop_remainder)


def file_based_input_fn_builder(input_file: str, seq_length: int, is_training: bool,
                                drop_remainder: bool) -> Callable:
  """input_fn(params) -> batches of a TFRecord file written by
  `file_based_convert_examples_to_features` (int32 features).

  Example:
    >>> ds = file_based_input_fn_builder("train.tfrecord", 128, True, True)({"batch_size": 32})
  """
  spec = {"input_ids": tf.io.FixedLenFeature([seq_length], tf.int64),
          "input_mask": tf.io.FixedLenFeature([seq_length], tf.int64),
          "segment_ids": tf.io.FixedLenFeature([seq_length], tf.int64),
          "label_ids": tf.io.FixedLenFeature([], tf.int64),
          "is_real_example": tf.io.FixedLenFeature([], tf.int64)}

  def decode(record):
    example = tf.io.parse_single_example(record, spec)
    return {k: tf.cast(v, tf.int32) for k, v in example.items()}

  def input_fn(params):
    d = tf.data.TFRecordDataset(input_file).map(decode)
    return _finish(d, is_training, params["batch_size"], drop_remainder)
  return input_fn


def input_fn_builder(features: Sequence[InputFeatures], seq_length: int, is_training: bool,
                     drop_remainder: bool) -> Callable:
  """input_fn(params) -> batches of in-memory features.

  Example:
    >>> ds = input_fn_builder(features, 128, True, True)({"batch_size": 32})
  """
  def column(name, dtype=np.int32):
    return np.asarray([getattr(f, name) for f in features], dtype)
  data = {"input_ids": column("input_ids"), "input_mask": column("input_mask"),
          "segment_ids": column("segment_ids"), "label_ids": column("label_id"),
          "is_real_example": column("is_real_example")}
  if data["input_ids"].ndim != 2 or data["input_ids"].shape[1] != seq_length:
    raise ValueError(f"input_fn_builder: features have shape {data['input_ids'].shape}, "
                     f"not [examples, {seq_length}]")

  def input_fn(params):
    d = tf.data.Dataset.from_tensor_slices(data)
    return _finish(d, is_training, params["batch_size"], drop_remainder)
  return input_fn


def feature_shapes(batch_size: int, seq_length: int) -> Dict[str, str]:
  """The Trainer's feature shapes of classification batches.

  Example:
    >>> feature_shapes(32, 128)["label_ids"]
    'batch:32'
  """
  seq = f"batch:{batch_size};seq:{seq_length}"
  return {"input_ids": seq, "input_mask": seq, "segment_ids": seq,
          "label_ids": f"batch:{batch_size}", "is_real_example": f"batch:{batch_size}"}


def create_model(bert_config, is_training, input_ids, input_mask, segment_ids, labels,
                 num_labels_dim, layout, mesh_shape):
  """A classifier on BERT's pooled output.

  Variables output_weights [num_labels, hidden] and output_bias [num_labels]
  (outside the "bert" scope); dropout 0.1 in training.

  Returns:
    (loss: mean cross-entropy plus the model's extra loss, per-example loss
    [batch], logits [batch, num_labels], probabilities [batch, num_labels]).

  Example:
    >>> loss, _, logits, probs = create_model(config, True, ids, mask, types, labels,
    ...                                       mtf.Dimension("num_labels", 2), "", "")
  """
  model = bert_lib.BertModel(config=bert_config, is_training=is_training,
                             input_ids=input_ids, input_mask=input_mask,
                             token_type_ids=segment_ids, layout=layout, mesh_shape=mesh_shape)
  pooled = model.get_pooled_output()
  hidden_dim = pooled.shape.dims[-1]
  mesh = input_ids.mesh
  weights = mtf.get_variable(mesh, "output_weights", [num_labels_dim, hidden_dim],
                             initializer=mtf.initializers.truncated_normal(stddev=0.02))
  bias = mtf.get_variable(mesh, "output_bias", [num_labels_dim],
                          initializer=tf.zeros_initializer())
  with tf.compat.v1.variable_scope("loss"):
    if is_training:
      pooled = mtf.dropout(pooled, True, rate=0.1)
    logits = mtf.einsum([pooled, weights], reduced_dims=[hidden_dim]) + bias
    probabilities = mtf.softmax(logits, reduced_dim=num_labels_dim)
    per_example_loss = mtf.layers.softmax_cross_entropy_with_logits(
        logits, labels, vocab_dim=num_labels_dim)
    loss = mtf.reduce_mean(per_example_loss) + model.get_extra_loss()
  return loss, per_example_loss, logits, probabilities


def model_fn_builder(bert_config, num_labels: int, init_checkpoint: Optional[str],
                     learning_rate: float, num_train_steps: int, num_warmup_steps: int,
                     use_tpu: bool = False, optimizer: Optional[str] = None,
                     clip_gradients: Optional[bool] = None,
                     max_optimized_variable_size: Optional[float] = None,
                     mesh_shape: Optional[str] = None, layout: Optional[str] = None
                     ) -> Callable:
  """The classifier's model function for `mtf.training.Trainer`.

  Returns:
    model_fn(mesh, features, mode) -> (loss, metrics); in eval mode the
    metrics are eval_accuracy and eval_loss over real examples
    (is_real_example). Attributes: `optimizer`, `init_checkpoint` and
    `predict(mesh, features)` -> {"probabilities"} (see `_runner.predict`).

  Example:
    >>> model_fn = model_fn_builder(config, 2, None, 5e-5, 1000, 100)
    >>> trainer = mtf.training.Trainer(model_fn, feature_shapes(32, 128), impl,
    ...                                model_fn.optimizer)
  """
  if use_tpu:
    raise ValueError(_runner.ESTIMATOR_ONLY.format(what="use_tpu=True"))
  optimizer = optimizer or _flags.value(FLAGS, "optimizer", "adam")
  clip = _flags.value(FLAGS, "clip_gradients", True) if clip_gradients is None else clip_gradients
  if max_optimized_variable_size is None:
    max_optimized_variable_size = _flags.value(FLAGS, "max_optimized_variable_size", None)
  mesh_shape = mesh_shape if mesh_shape is not None else _flags.value(FLAGS, "mesh_shape", "")
  layout = layout if layout is not None else _flags.value(FLAGS, "layout", "")
  num_labels_dim = mtf.Dimension("num_labels", num_labels)

  def model_fn(mesh: mtf.Mesh, features: Dict[str, mtf.Tensor], mode: str):
    loss, per_example_loss, logits, _ = create_model(
        bert_config, mode == TRAIN, features["input_ids"], features["input_mask"],
        features["segment_ids"], features["label_ids"], num_labels_dim, layout, mesh_shape)
    if mode != EVAL:
      return loss
    real = mtf.to_float(features["is_real_example"])
    correct = mtf.to_float(mtf.equal(mtf.argmax(logits, num_labels_dim),
                                     features["label_ids"]))
    count = mtf.reduce_sum(real) + 1e-5
    return loss, {"eval_accuracy": mtf.reduce_sum(correct * real) / count,
                  "eval_loss": mtf.reduce_sum(per_example_loss * real) / count}

  def predict(mesh: mtf.Mesh, features: Dict[str, mtf.Tensor]):
    _, _, _, probabilities = create_model(
        bert_config, False, features["input_ids"], features["input_mask"],
        features["segment_ids"], features["label_ids"], num_labels_dim, layout, mesh_shape)
    return {"probabilities": mtf.anonymize(probabilities)}

  model_fn.predict = predict
  model_fn.optimizer = optimization_lib.make_optimizer(
      learning_rate, num_train_steps, num_warmup_steps,
      max_optimized_variable_size=int(max_optimized_variable_size or 0) or None,
      optimizer=optimizer, clip_gradients=clip)
  model_fn.init_checkpoint = init_checkpoint
  return model_fn


def _padded(examples, batch_size):
  return list(examples) + [PaddingInputExample()] * (-len(examples) % batch_size)


def main(_):
  if _flags.value(FLAGS, "use_tpu", False):
    raise cli.UserError(_runner.ESTIMATOR_ONLY.format(what="--use_tpu"),
                        hint="drop --use_tpu; give the devices' mesh with --mesh_shape")
  if not (FLAGS.do_train or FLAGS.do_eval or FLAGS.do_predict):
    raise cli.UserError("at least one of --do_train, --do_eval, --do_predict must be set")
  for name in ("task_name", "data_dir", "vocab_file", "bert_config_file", "output_dir"):
    _runner.require(getattr(FLAGS, name), f"--{name}")
  task = FLAGS.task_name.lower()
  if task not in PROCESSORS:
    raise cli.UserError(f"--task_name={FLAGS.task_name} is not one of {sorted(PROCESSORS)}")
  tokenization.validate_case_matches_checkpoint(FLAGS.do_lower_case, FLAGS.init_checkpoint)
  bert_config = bert_lib.BertConfig.from_json_file(FLAGS.bert_config_file)
  if FLAGS.max_seq_length > bert_config.max_position_embeddings:
    raise cli.UserError(f"--max_seq_length={FLAGS.max_seq_length} exceeds the model's "
                        f"max_position_embeddings={bert_config.max_position_embeddings}")
  processor = PROCESSORS[task]()
  labels = processor.get_labels()
  tokenizer = tokenization.FullTokenizer(FLAGS.vocab_file, FLAGS.do_lower_case)
  tf.io.gfile.makedirs(FLAGS.output_dir)
  train_examples = processor.get_train_examples(FLAGS.data_dir) if FLAGS.do_train else []
  num_train_steps = int(len(train_examples) / FLAGS.train_batch_size * FLAGS.num_train_epochs)
  num_warmup_steps = int(num_train_steps * FLAGS.warmup_proportion)
  if FLAGS.do_train and num_train_steps < 1:
    raise cli.UserError(f"{len(train_examples)} training examples, --train_batch_size="
                        f"{FLAGS.train_batch_size} and --num_train_epochs="
                        f"{FLAGS.num_train_epochs} make no training step")
  model_fn = model_fn_builder(bert_config, len(labels), FLAGS.init_checkpoint,
                              FLAGS.learning_rate, max(num_train_steps, 1), num_warmup_steps)
  impl = _runner.make_mesh_impl(FLAGS.mesh_shape, FLAGS.layout)
  eval_batch = FLAGS.eval_batch_size
  trainer = _runner.make_trainer(
      model_fn, feature_shapes(FLAGS.train_batch_size, FLAGS.max_seq_length), impl,
      model_fn.optimizer, FLAGS.output_dir, FLAGS.init_checkpoint,
      checkpoint_every=FLAGS.save_checkpoints_steps, log_every=FLAGS.iterations_per_loop,
      eval_feature_shapes=feature_shapes(eval_batch, FLAGS.max_seq_length))
  if FLAGS.do_train:
    train_file = FLAGS.cached_train_file or os.path.join(FLAGS.output_dir, "train.tf_record")
    if not tf.io.gfile.exists(train_file):
      file_based_convert_examples_to_features(train_examples, labels, FLAGS.max_seq_length,
                                              tokenizer, train_file)
    data = file_based_input_fn_builder(train_file, FLAGS.max_seq_length, True, True)(
        {"batch_size": FLAGS.train_batch_size})
    trainer.train(data, steps=num_train_steps)
  if FLAGS.do_eval:
    examples = _padded(processor.get_dev_examples(FLAGS.data_dir), eval_batch)
    features = convert_examples_to_features(examples, labels, FLAGS.max_seq_length, tokenizer)
    data = input_fn_builder(features, FLAGS.max_seq_length, False, True)(
        {"batch_size": eval_batch})
    result = trainer.evaluate(data)
    result["global_step"] = trainer.global_step
    _runner.write_results(FLAGS.output_dir, "eval_results.txt", result)
    print("eval " + " ".join(f"{k}={v}" for k, v in sorted(result.items())), flush=True)
  if FLAGS.do_predict:
    batch = FLAGS.predict_batch_size
    examples = processor.get_test_examples(FLAGS.data_dir)
    features = convert_examples_to_features(_padded(examples, batch), labels,
                                            FLAGS.max_seq_length, tokenizer)
    data = input_fn_builder(features, FLAGS.max_seq_length, False, True)({"batch_size": batch})
    outputs = _runner.predict(impl, model_fn.predict,
                              feature_shapes(batch, FLAGS.max_seq_length), data)
    probabilities = np.concatenate([o["probabilities"] for o in outputs])[:len(examples)]
    path = os.path.join(FLAGS.output_dir, "test_results.tsv")
    with tf.io.gfile.GFile(path, "w") as f:
      for row in probabilities:
        f.write("\t".join(str(float(p)) for p in row) + "\n")
    print(f"predictions: {path}", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(_flags.run_main(main, FLAGS))
