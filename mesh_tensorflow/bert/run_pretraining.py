"""BERT pre-training (masked LM + next sentence prediction) on mtf.training.Trainer.

Reads TFRecord files of tf.train.Examples with the features of Google BERT's
create_pretraining_data.py (input_ids, input_mask, segment_ids,
masked_lm_positions, masked_lm_ids, masked_lm_weights, next_sentence_labels).

    python -m mesh_tensorflow.bert.run_pretraining \\
      --bert_config_file=bert_config.json --input_train_files='train-*.tfrecord' \\
      --input_eval_files=eval.tfrecord --output_dir=/tmp/bert_pretrain \\
      --mesh_shape=batch:8 --layout=batch:batch --num_train_steps=1000

`model_fn_builder` returns a Trainer model function, `model_fn(mesh,
features, mode)`, instead of a TPUEstimator one; its `optimizer` attribute
is the optimizer to give the Trainer.
"""

from __future__ import annotations

import os
if __name__ == "__main__":
  os.environ.setdefault("MTF_COMMAND_LINE", "1")
from mesh_tensorflow import cli  # noqa: E402

import sys  # noqa: E402
from typing import Callable, Dict, List, Optional  # noqa: E402

from absl import logging  # noqa: E402
import tensorflow as tf  # noqa: E402

import mesh_tensorflow as mtf  # noqa: E402
from mesh_tensorflow.bert import _flags  # noqa: E402
from mesh_tensorflow.bert import _runner  # noqa: E402
from mesh_tensorflow.bert import bert as bert_lib  # noqa: E402
from mesh_tensorflow.bert import optimization as optimization_lib  # noqa: E402

flags = _flags.flags
# This program's flags (see _flags: they are not absl's global FLAGS).
FLAGS, _d = _runner.program_flags(__name__, fine_tuning=False)


_d("string", "input_train_files", None,
   "Training TFRecord files (globs, comma separated).")
_d("string", "input_eval_files", None, "Evaluation TFRecord files (globs, comma separated).")
_d("string", "output_dir", None, "Where checkpoints, events and eval results go.")
_d("string", "init_checkpoint", None, "Checkpoint to start from (a fresh run only).")
_d("integer", "max_seq_length", 128, "Sequence length of the data (must match it).")
_d("integer", "max_predictions_per_seq", 20,
   "Masked LM predictions per sequence (must match the data).")
_d("string", "mode", "train_and_eval", "One of train_and_eval, train, eval.")
_d("integer", "eval_batch_size", 8, "Total batch size for evaluation.")
_d("integer", "num_train_steps", 100000, "Number of training steps.")
_d("integer", "num_warmup_steps", 10000, "Number of warm-up steps.")
_d("integer", "steps_per_eval", 5000, "Evaluate every this many steps (train_and_eval).")
_d("integer", "iterations_per_loop", 1000,
   "Print a progress line every this many steps (TPUEstimator's loop size).")
_d("integer", "max_eval_steps", 100, "Maximum number of eval batches.")
_d("string", "mesh_shape", "batch:8", "Mesh shape, e.g. 'batch:8' or 'rows:2;cols:4'.")

TRAIN, EVAL = "train", "eval"


def feature_shapes(batch_size: int, max_seq_length: int,
                   max_predictions_per_seq: int) -> Dict[str, str]:
  """The Trainer's feature shapes of pre-training batches.

  Example:
    >>> feature_shapes(32, 128, 20)["masked_lm_ids"]
    'batch:32;max_pred_seq:20'
  """
  seq = f"batch:{batch_size};seq:{max_seq_length}"
  pred = f"batch:{batch_size};max_pred_seq:{max_predictions_per_seq}"
  return {"input_ids": seq, "input_mask": seq, "segment_ids": seq,
          "masked_lm_positions": pred, "masked_lm_ids": pred, "masked_lm_weights": pred,
          "next_sentence_labels": f"batch:{batch_size}"}


def model_fn_builder(bert_config: bert_lib.BertConfig, init_checkpoint: Optional[str],
                     learning_rate: float, num_train_steps: int, num_warmup_steps: int,
                     optimizer: Optional[str] = None, clip_gradients: Optional[bool] = None,
                     mesh_shape: Optional[str] = None, layout: Optional[str] = None
                     ) -> Callable:
  """The pre-training model function for `mtf.training.Trainer`.

  Args:
    bert_config: the model's `BertConfig`.
    init_checkpoint: checkpoint to start a fresh run from (kept on the
      function as `init_checkpoint`; `_runner.make_trainer` restores it).
    learning_rate, num_train_steps, num_warmup_steps: the optimizer's
      schedule (see `optimization.make_optimizer`).
    optimizer, clip_gradients: default to --optimizer and --clip_gradients.
    mesh_shape, layout: for "moe" layers; default to the flags.

  Returns:
    model_fn(mesh, features, mode) -> (total loss, metrics), with attributes
    `optimizer` (for the Trainer) and `init_checkpoint`. In eval mode the
    metrics are masked_lm_accuracy, masked_lm_loss, next_sentence_accuracy
    and next_sentence_loss.

  Example:
    >>> model_fn = model_fn_builder(config, None, 1e-4, 1000, 100)
    >>> trainer = mtf.training.Trainer(model_fn, feature_shapes(32, 128, 20), impl,
    ...                                model_fn.optimizer)
  """
  optimizer = optimizer or _flags.value(FLAGS, "optimizer", "adam")
  clip = _flags.value(FLAGS, "clip_gradients", True) if clip_gradients is None else clip_gradients
  mesh_shape = mesh_shape if mesh_shape is not None else _flags.value(FLAGS, "mesh_shape", "")
  layout = layout if layout is not None else _flags.value(FLAGS, "layout", "")

  def model_fn(mesh: mtf.Mesh, features: Dict[str, mtf.Tensor], mode: str):
    model = bert_lib.BertModel(
        config=bert_config, is_training=(mode == TRAIN), input_ids=features["input_ids"],
        input_mask=features["input_mask"], token_type_ids=features["segment_ids"],
        layout=layout, mesh_shape=mesh_shape)
    mlm_loss, mlm_example_loss, mlm_logits = model.get_masked_lm_output(
        features["masked_lm_positions"], features["masked_lm_ids"],
        features["masked_lm_weights"])
    ns_loss, _, ns_logits = model.get_next_sentence_output(features["next_sentence_labels"])
    total_loss = mlm_loss + ns_loss + model.get_extra_loss()
    if mode != EVAL:
      return total_loss, {"masked_lm_loss": mlm_loss, "next_sentence_loss": ns_loss}
    weights = mtf.to_float(features["masked_lm_weights"])
    vocab_dim = model.vocab_dim
    class_dim = ns_logits.shape.dims[-1]
    mlm_correct = mtf.to_float(mtf.equal(mtf.argmax(mlm_logits, vocab_dim),
                                         features["masked_lm_ids"]))
    ns_correct = mtf.to_float(mtf.equal(mtf.argmax(ns_logits, class_dim),
                                        features["next_sentence_labels"]))
    total_weight = mtf.reduce_sum(weights) + 1e-5
    return total_loss, {
        "masked_lm_accuracy": mtf.reduce_sum(mlm_correct * weights) / total_weight,
        "masked_lm_loss": mtf.reduce_sum(mlm_example_loss * weights) / total_weight,
        "next_sentence_accuracy": mtf.reduce_mean(ns_correct),
        "next_sentence_loss": ns_loss,
    }

  model_fn.optimizer = optimization_lib.make_optimizer(
      learning_rate, num_train_steps, num_warmup_steps, optimizer=optimizer,
      clip_gradients=clip)
  model_fn.init_checkpoint = init_checkpoint
  return model_fn


def input_fn_builder(input_files: List[str], max_seq_length: int,
                     max_predictions_per_seq: int, is_training: bool,
                     num_cpu_threads: int = 4) -> Callable:
  """input_fn(params) -> batched tf.data.Dataset of pre-training features.

  params["batch_size"] is the batch size. Training data is repeated,
  shuffled and interleaved over the files; evaluation data is read in order
  and repeated. int64 features become int32 and next_sentence_labels [batch].

  Example:
    >>> dataset = input_fn_builder(files, 128, 20, True)({"batch_size": 32})
  """
  spec = {
      "input_ids": tf.io.FixedLenFeature([max_seq_length], tf.int64),
      "input_mask": tf.io.FixedLenFeature([max_seq_length], tf.int64),
      "segment_ids": tf.io.FixedLenFeature([max_seq_length], tf.int64),
      "masked_lm_positions": tf.io.FixedLenFeature([max_predictions_per_seq], tf.int64),
      "masked_lm_ids": tf.io.FixedLenFeature([max_predictions_per_seq], tf.int64),
      "masked_lm_weights": tf.io.FixedLenFeature([max_predictions_per_seq], tf.float32),
      "next_sentence_labels": tf.io.FixedLenFeature([1], tf.int64),
  }

  def decode(record):
    example = tf.io.parse_single_example(record, spec)
    example = {k: tf.cast(v, tf.int32) if v.dtype == tf.int64 else v
               for k, v in example.items()}
    example["next_sentence_labels"] = tf.reshape(example["next_sentence_labels"], [])
    return example

  def input_fn(params):
    batch_size = params["batch_size"]
    files = list(input_files)
    if is_training:
      d = tf.data.Dataset.from_tensor_slices(tf.constant(files)).repeat()
      d = d.shuffle(len(files))
      d = d.interleave(tf.data.TFRecordDataset, cycle_length=min(num_cpu_threads, len(files)),
                       num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
      d = d.shuffle(100)
    else:
      d = tf.data.TFRecordDataset(files).repeat()
    return d.map(decode, num_parallel_calls=num_cpu_threads).batch(
        batch_size, drop_remainder=True)

  return input_fn


def main(_):
  if _flags.value(FLAGS, "use_tpu", False):
    raise cli.UserError(_runner.ESTIMATOR_ONLY.format(what="--use_tpu"),
                        hint="drop --use_tpu; give the devices' mesh with --mesh_shape")
  _runner.require(FLAGS.bert_config_file, "--bert_config_file")
  _runner.require(FLAGS.output_dir, "--output_dir")
  if FLAGS.mode not in ("train_and_eval", "train", "eval"):
    raise cli.UserError(f"--mode={FLAGS.mode} is not one of train_and_eval, train, eval")
  bert_config = bert_lib.BertConfig.from_json_file(FLAGS.bert_config_file)
  training = FLAGS.mode in ("train_and_eval", "train")
  evaluating = FLAGS.mode in ("train_and_eval", "eval")
  train_files = _runner.glob_files(FLAGS.input_train_files, "--input_train_files") \
      if training else []
  eval_files = _runner.glob_files(FLAGS.input_eval_files, "--input_eval_files") \
      if evaluating else []
  tf.io.gfile.makedirs(FLAGS.output_dir)
  impl = _runner.make_mesh_impl(FLAGS.mesh_shape, FLAGS.layout)
  model_fn = model_fn_builder(bert_config, FLAGS.init_checkpoint, FLAGS.learning_rate,
                              FLAGS.num_train_steps, FLAGS.num_warmup_steps)
  trainer = _runner.make_trainer(
      model_fn, feature_shapes(FLAGS.train_batch_size, FLAGS.max_seq_length,
                               FLAGS.max_predictions_per_seq),
      impl, model_fn.optimizer, FLAGS.output_dir, FLAGS.init_checkpoint,
      checkpoint_every=FLAGS.save_checkpoints_steps, log_every=FLAGS.iterations_per_loop,
      eval_feature_shapes=feature_shapes(FLAGS.eval_batch_size, FLAGS.max_seq_length,
                                         FLAGS.max_predictions_per_seq))
  train_data = input_fn_builder(train_files, FLAGS.max_seq_length,
                                FLAGS.max_predictions_per_seq, True)(
                                    {"batch_size": FLAGS.train_batch_size}) if training else None
  eval_data = input_fn_builder(eval_files, FLAGS.max_seq_length,
                               FLAGS.max_predictions_per_seq, False)(
                                   {"batch_size": FLAGS.eval_batch_size}) if evaluating else None
  step = trainer.global_step
  while True:
    if training:
      target = (min(step + FLAGS.steps_per_eval, FLAGS.num_train_steps)
                if FLAGS.mode == "train_and_eval" else FLAGS.num_train_steps)
      trainer.train(train_data, steps=target)
      step = trainer.global_step
    if evaluating:
      result = trainer.evaluate(eval_data, steps=FLAGS.max_eval_steps)
      path = _runner.write_results(FLAGS.output_dir, f"eval_results_{step}.txt", result)
      logging.info("eval results at step %d: %s (written to %s)", step, result, path)
      print(f"eval step={step} " + " ".join(f"{k}={v:.4f}" for k, v in sorted(result.items())),
            flush=True)
    if not training or step >= FLAGS.num_train_steps:
      break
  return 0


if __name__ == "__main__":
  sys.exit(_flags.run_main(main, FLAGS))
