"""Pre-train a tiny BERT, then fine-tune it as a classifier, on 8 logical CPUs.

The text is generated: a small language whose sentences count through a
ring of words with a fixed stride ("w3 w5 w7 w9 ..." has stride 2), so a
masked word can be inferred from its neighbours. Documents are runs of
sentences continuing one another.

1. Pre-training (mesh_tensorflow.bert.run_pretraining's model function):
   masked LM on 15% of the wordpieces and next-sentence prediction (the
   second sentence continues the first, or is a random one).
2. Fine-tuning (mesh_tensorflow.bert.run_classifier's model function),
   starting from the pre-trained checkpoint: classify whether a sentence's
   words come from the first or the second half of the ring.

Both run on `mtf.training.Trainer` with the same mesh and layout (default
'batch:rows;num_heads:cols;intermediate:cols' on 'rows:2;cols:4'):

    python examples/bert_pretrain_and_classify.py
    python examples/bert_pretrain_and_classify.py --mesh_shape=all:8 --layout=batch:all

The last line printed is machine readable (each "first" and "last" loss is
the mean over the first or last three steps; the accuracy is on held-out
sentences):

    final: pretrain_loss_first=... pretrain_loss_last=... classify_loss_first=...
      classify_loss_last=... classify_accuracy=... seconds=...
"""

from __future__ import annotations

import os
if __name__ == "__main__":
  os.environ.setdefault("MTF_COMMAND_LINE", "1")  # quiet TensorFlow's start-up lines
from mesh_tensorflow import cli  # noqa: E402

import shutil  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from typing import Dict, List, Tuple  # noqa: E402

from absl import flags  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

# absl's global flags; the BERT programs imported below keep theirs apart.
FLAGS = flags.FLAGS
flags.DEFINE_string("mesh_shape", "rows:2;cols:4", "Mesh shape.")
flags.DEFINE_string("layout", "batch:rows;num_heads:cols;intermediate:cols", "Layout rules.")
flags.DEFINE_integer("pretrain_steps", 40, "Pre-training steps.")
flags.DEFINE_integer("classify_steps", 60, "Fine-tuning steps.")
flags.DEFINE_integer("batch_size", 16, "Examples per step.")
flags.DEFINE_integer("seq_length", 16, "Wordpieces per example.")
flags.DEFINE_integer("hidden_size", 32, "BERT hidden size (d_model).")
flags.DEFINE_integer("num_layers", 2, "Transformer blocks.")
flags.DEFINE_float("learning_rate", 1e-3, "Peak learning rate of both phases.")
flags.DEFINE_integer("seed", 1, "Seed of the generated data.")
flags.DEFINE_string("model_dir", "",
                    "Checkpoints go to <model_dir>/pretrain and <model_dir>/classify "
                    "(default: a temporary directory, deleted at the end).")
flags.DEFINE_integer("log_every", 10, "Print a progress line every this many steps.")

from mesh_tensorflow.bert import _runner  # noqa: E402
from mesh_tensorflow.bert import bert as bert_lib  # noqa: E402
from mesh_tensorflow.bert import run_classifier  # noqa: E402
from mesh_tensorflow.bert import run_pretraining  # noqa: E402
from mesh_tensorflow.bert import tokenization  # noqa: E402

NUM_CPU_DEVICES = 8
RING = 24  # words w0 .. w23
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
MAX_PREDICTIONS = 3


def write_vocab(path: str) -> None:
  """The vocabulary: special tokens, then the ring's words."""
  with open(path, "w", encoding="utf-8") as f:
    f.write("\n".join(SPECIAL + [f"w{i}" for i in range(RING)]) + "\n")


def sentence(start: int, stride: int, length: int) -> str:
  return " ".join(f"W{(start + stride * i) % RING}" for i in range(length))  # cased on purpose


def pretraining_data(tokenizer, num: int, seq_length: int, rng: np.random.RandomState
                     ) -> Dict[str, np.ndarray]:
  """Masked-LM and next-sentence examples in run_pretraining's feature format."""
  vocab = tokenizer.vocab
  half = (seq_length - 3) // 2
  rows = {k: [] for k in run_pretraining.feature_shapes(1, 1, 1)}
  for _ in range(num):
    start, stride = rng.randint(RING), rng.randint(1, 3)
    a = tokenizer.tokenize(sentence(start, stride, half))
    is_random = rng.rand() < 0.5
    b_start = rng.randint(RING) if is_random else start + stride * half
    b = tokenizer.tokenize(sentence(b_start, rng.randint(1, 3) if is_random else stride, half))
    tokens = ["[CLS]"] + a + ["[SEP]"] + b + ["[SEP]"]
    segments = [0] * (len(a) + 2) + [1] * (len(b) + 1)
    ids = tokenizer.convert_tokens_to_ids(tokens)
    candidates = [i for i, t in enumerate(tokens) if t not in ("[CLS]", "[SEP]")]
    positions = sorted(rng.choice(candidates, MAX_PREDICTIONS, replace=False))
    labels = [ids[p] for p in positions]
    for p in positions:
      ids[p] = vocab["[MASK]"]
    pad = seq_length - len(ids)
    rows["input_ids"].append(ids + [0] * pad)
    rows["input_mask"].append([1] * len(tokens) + [0] * pad)
    rows["segment_ids"].append(segments + [0] * pad)
    rows["masked_lm_positions"].append(positions)
    rows["masked_lm_ids"].append(labels)
    rows["masked_lm_weights"].append([1.0] * MAX_PREDICTIONS)
    rows["next_sentence_labels"].append(int(is_random))
  return {k: np.asarray(v, np.float32 if k == "masked_lm_weights" else np.int32)
          for k, v in rows.items()}


def classification_examples(num: int, seq_length: int, rng: np.random.RandomState
                            ) -> List[run_classifier.InputExample]:
  """Sentences of random words from one half of the ring, labelled "low"
  (w0 .. w11) or "high" (w12 .. w23)."""
  examples = []
  half = RING // 2
  for i in range(num):
    high = rng.rand() < 0.5
    words = rng.randint(half, size=seq_length - 2) + (half if high else 0)
    text = " ".join(f"W{w}" for w in words)
    examples.append(run_classifier.InputExample(f"gen-{i}", text, None,
                                                "high" if high else "low"))
  return examples


def repeated(data: Dict[str, np.ndarray], batch_size: int, seed: int) -> tf.data.Dataset:
  d = tf.data.Dataset.from_tensor_slices(data).shuffle(len(next(iter(data.values()))),
                                                         seed=seed)
  return d.repeat().batch(batch_size, drop_remainder=True)


def run(model_dir: str) -> Tuple[List[float], List[float], float]:
  """Pre-trains, then fine-tunes; returns (pre-training losses, fine-tuning
  losses, held-out accuracy of the classifier)."""
  rng = np.random.RandomState(FLAGS.seed)
  vocab_file = os.path.join(model_dir, "vocab.txt")
  write_vocab(vocab_file)
  tokenizer = tokenization.FullTokenizer(vocab_file, do_lower_case=True)
  config = bert_lib.BertConfig(
      vocab_size=len(tokenizer.vocab), d_model=FLAGS.hidden_size, num_blocks=FLAGS.num_layers,
      attention_num_heads=4, feedforward_intermediate_size=2 * FLAGS.hidden_size,
      max_position_embeddings=FLAGS.seq_length, type_vocab_size=2,
      layer_output_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
  impl = _runner.make_mesh_impl(FLAGS.mesh_shape, FLAGS.layout)
  batch, seq = FLAGS.batch_size, FLAGS.seq_length
  log = lambda line: print(line, flush=True)  # noqa: E731

  # 1. Pre-training.
  pre_dir = os.path.join(model_dir, "pretrain")
  model_fn = run_pretraining.model_fn_builder(
      config, None, FLAGS.learning_rate, FLAGS.pretrain_steps,
      max(1, FLAGS.pretrain_steps // 10), optimizer="adam", clip_gradients=True,
      mesh_shape=FLAGS.mesh_shape, layout=FLAGS.layout)
  trainer = _runner.make_trainer(
      model_fn, run_pretraining.feature_shapes(batch, seq, MAX_PREDICTIONS), impl,
      model_fn.optimizer, pre_dir, log_every=FLAGS.log_every, log_fn=log)
  data = pretraining_data(tokenizer, 512, seq, rng)
  pre_losses = trainer.train(repeated(data, batch, FLAGS.seed), FLAGS.pretrain_steps)["loss"]

  # 2. Fine-tuning from the pre-trained checkpoint.
  labels = ["low", "high"]
  train_features = run_classifier.convert_examples_to_features(
      classification_examples(512, seq, rng), labels, seq, tokenizer)
  test_examples = classification_examples(60, seq, rng)
  test_examples += [run_classifier.PaddingInputExample()] * (-len(test_examples) % batch)
  test_features = run_classifier.convert_examples_to_features(test_examples, labels, seq,
                                                              tokenizer)
  model_fn = run_classifier.model_fn_builder(
      config, len(labels), pre_dir, FLAGS.learning_rate, FLAGS.classify_steps,
      max(1, FLAGS.classify_steps // 10), optimizer="adam", clip_gradients=True,
      max_optimized_variable_size=0, mesh_shape=FLAGS.mesh_shape, layout=FLAGS.layout)
  impl = _runner.make_mesh_impl(FLAGS.mesh_shape, FLAGS.layout)  # a fresh variable store
  trainer = _runner.make_trainer(
      model_fn, run_classifier.feature_shapes(batch, seq), impl, model_fn.optimizer,
      os.path.join(model_dir, "classify"), init_checkpoint=pre_dir,
      log_every=FLAGS.log_every, log_fn=log)
  train_data = run_classifier.input_fn_builder(train_features, seq, True, True)(
      {"batch_size": batch})
  cls_losses = trainer.train(train_data, FLAGS.classify_steps)["loss"]
  test_data = run_classifier.input_fn_builder(test_features, seq, False, True)(
      {"batch_size": batch})
  accuracy = trainer.evaluate(test_data)["eval_accuracy"]
  return pre_losses, cls_losses, accuracy


def main(argv):
  del argv
  for name in ("pretrain_steps", "classify_steps", "batch_size", "hidden_size", "num_layers"):
    if getattr(FLAGS, name) < 1:
      raise cli.UserError(f"--{name}={getattr(FLAGS, name)} must be at least 1")
  if FLAGS.seq_length < 8:
    raise cli.UserError(f"--seq_length={FLAGS.seq_length} must be at least 8")
  if FLAGS.hidden_size % 4:
    raise cli.UserError(f"--hidden_size={FLAGS.hidden_size} must be a multiple of 4 "
                        "(the number of attention heads)")
  _runner.devices_for(NUM_CPU_DEVICES)
  start = time.time()
  model_dir = FLAGS.model_dir or tempfile.mkdtemp(prefix="mtf_bert_")
  try:
    if FLAGS.model_dir:
      for sub in ("pretrain", "classify"):
        shutil.rmtree(os.path.join(model_dir, sub), ignore_errors=True)
      os.makedirs(model_dir, exist_ok=True)
    pre, cls, accuracy = run(model_dir)
  finally:
    if not FLAGS.model_dir:
      shutil.rmtree(model_dir, ignore_errors=True)
  def head(losses):
    return float(np.mean(losses[:3]))

  def tail(losses):
    return float(np.mean(losses[-3:]))
  print(f"final: pretrain_loss_first={head(pre):.4f} pretrain_loss_last={tail(pre):.4f} "
        f"classify_loss_first={head(cls):.4f} classify_loss_last={tail(cls):.4f} "
        f"classify_accuracy={accuracy:.4f} seconds={time.time() - start:.1f}", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(cli.run_absl_main(main))
