"""The BERT programs (run_pretraining, run_classifier, run_squad) run in
process on tiny models and files: training, evaluation and predictions,
and command-line mistakes as one `error:` line with exit status 2."""

import importlib

import pytest

from mesh_tensorflow.bert import _flags


@pytest.mark.parametrize("module,args,message", [
    ("run_pretraining", ["--output_dir=/tmp/x"], "error: --bert_config_file is required"),
    ("run_pretraining", ["--bert_config_file=/nonexistent/c.json", "--output_dir=/tmp/x",
                         "--mode=train"], "error: BERT config file /nonexistent/c.json"),
    ("run_classifier", ["--do_train", "--task_name=sst", "--data_dir=d", "--vocab_file=v",
                        "--bert_config_file=c", "--output_dir=o"],
     "error: --task_name=sst is not one of ['cola', 'mnli', 'mrpc', 'xnli']"),
    ("run_classifier", ["--use_tpu"], "TPUEstimator"),
    ("run_squad", ["--do_train=maybe"], "error: "),
    ("run_pretraining", ["--num_train_step=3"],
     "error: Unknown command line flag 'num_train_step'"),
    ("run_squad", ["--vocab_file=v", "--bert_config_file=/nonexistent/c.json",
                   "--output_dir=o"], "error: BERT config file"),
])
def test_programs_report_user_errors_in_one_line(module, args, message, capsys):
  program = importlib.import_module(f"mesh_tensorflow.bert.{module}")
  try:
    status = _flags.run_main(program.main, program.FLAGS, [module, *args])
  finally:
    program.FLAGS.unparse_flags()
  err = capsys.readouterr().err
  assert status == 2, err
  assert message in err
  assert "Traceback" not in err


TINY_CONFIG = {"vocab_size": 24, "hidden_size": 8, "num_hidden_layers": 1,
               "num_attention_heads": 2, "intermediate_size": 16,
               "max_position_embeddings": 16, "type_vocab_size": 2}
WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "a", "cat", "dog", "sat", "ran",
         "on", "mat", "who", "what", "?", ".", "good", "bad"]


def _run_main(module, args, capsys):
  program = importlib.import_module(f"mesh_tensorflow.bert.{module}")
  try:
    status = _flags.run_main(program.main, program.FLAGS, [module, *args])
  finally:
    program.FLAGS.unparse_flags()
  out = capsys.readouterr()
  assert status == 0, out.err[-3000:]
  return out.out


def _common(tmp_path):
  import json  # pylint: disable=g-import-not-at-top
  (tmp_path / "config.json").write_text(json.dumps(TINY_CONFIG))
  (tmp_path / "vocab.txt").write_text("\n".join(WORDS) + "\n")
  return [f"--bert_config_file={tmp_path / 'config.json'}", "--mesh_shape=batch:2",
          "--layout=batch:batch", f"--output_dir={tmp_path / 'out'}", "--iterations_per_loop=2",
          "--learning_rate=1e-3"]


def test_run_pretraining_main_trains_and_evaluates(tmp_path, capsys):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  def ints(v):
    return tf.train.Feature(int64_list=tf.train.Int64List(value=v))
  path = str(tmp_path / "data.tfrecord")
  with tf.io.TFRecordWriter(path) as w:
    for i in range(8):
      w.write(tf.train.Example(features=tf.train.Features(feature={
          "input_ids": ints([2, 5 + i % 4, 4, 3, 7, 3, 0, 0]),
          "input_mask": ints([1] * 6 + [0, 0]), "segment_ids": ints([0] * 4 + [1, 1, 0, 0]),
          "masked_lm_positions": ints([2, 0]), "masked_lm_ids": ints([9, 0]),
          "masked_lm_weights": tf.train.Feature(float_list=tf.train.FloatList(
              value=[1.0, 0.0])),
          "next_sentence_labels": ints([i % 2])})).SerializeToString())
  out = _run_main("run_pretraining", _common(tmp_path) + [
      f"--input_train_files={path}", f"--input_eval_files={path}", "--max_seq_length=8",
      "--max_predictions_per_seq=2", "--train_batch_size=4", "--eval_batch_size=4",
      "--num_train_steps=4", "--num_warmup_steps=1", "--steps_per_eval=2",
      "--max_eval_steps=1"], capsys)
  assert out.count("eval step=") == 2 and "masked_lm_accuracy=" in out
  assert (tmp_path / "out" / "eval_results_4.txt").exists()
  assert any(p.name.startswith("ckpt-4") for p in (tmp_path / "out").iterdir())
  # The checkpoint's variables, as get_assignment_map_from_checkpoint matches them.
  from mesh_tensorflow.bert import bert as bert_lib  # pylint: disable=g-import-not-at-top

  class Var:
    def __init__(self, name):
      self.name = name
  amap, names = bert_lib.get_assignment_map_from_checkpoint(
      [Var("bert/pooler/dense/kernel:0"), Var("cls/predictions/output_bias"), Var("other")],
      str(tmp_path / "out"))
  assert dict(amap) == {"bert/pooler/dense/kernel": "bert/pooler/dense/kernel",
                        "cls/predictions/output_bias": "cls/predictions/output_bias"}
  assert "bert/pooler/dense/kernel:0" in names and "other" not in names
  with pytest.raises(ValueError, match="no readable checkpoint"):
    bert_lib.get_assignment_map_from_checkpoint([], str(tmp_path / "nothing"))


def test_run_classifier_main_trains_evaluates_and_predicts(tmp_path, capsys):
  rows = [["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"]]
  for i in range(8):
    rows.append([str(i % 2), str(i), str(i + 100), "the cat sat", "a dog ran ?"])
  for name in ("train.tsv", "dev.tsv", "test.tsv"):
    (tmp_path / name).write_text("\n".join("\t".join(r) for r in rows) + "\n")
  out = _run_main("run_classifier", _common(tmp_path) + [
      "--task_name=MRPC", f"--data_dir={tmp_path}", f"--vocab_file={tmp_path / 'vocab.txt'}",
      "--do_train", "--do_eval", "--do_predict", "--max_seq_length=12",
      "--train_batch_size=4", "--eval_batch_size=4", "--predict_batch_size=4",
      "--num_train_epochs=1"], capsys)
  assert "eval eval_accuracy=" in out and "global_step=2" in out
  lines = (tmp_path / "out" / "test_results.tsv").read_text().splitlines()
  assert len(lines) == 8
  assert all(abs(sum(float(p) for p in line.split("\t")) - 1.0) < 1e-5 for line in lines)


def test_run_squad_main_trains_and_predicts(tmp_path, capsys):
  import json  # pylint: disable=g-import-not-at-top
  context = "the cat sat on the mat ."
  data = {"data": [{"title": "t", "paragraphs": [{"context": context, "qas": [
      {"id": f"q{i}", "question": "who sat ?",
       "answers": [{"text": "the cat", "answer_start": 0}]} for i in range(4)]}]}]}
  (tmp_path / "squad.json").write_text(json.dumps(data))
  _run_main("run_squad", _common(tmp_path) + [
      f"--vocab_file={tmp_path / 'vocab.txt'}", f"--train_file={tmp_path / 'squad.json'}",
      f"--predict_file={tmp_path / 'squad.json'}", "--do_train", "--do_predict",
      "--max_seq_length=16", "--max_query_length=4", "--doc_stride=4",
      "--train_batch_size=4", "--predict_batch_size=2", "--num_train_epochs=1"], capsys)
  predictions = json.loads((tmp_path / "out" / "predictions.json").read_text())
  assert sorted(predictions) == ["q0", "q1", "q2", "q3"]
  assert all(p in context for p in predictions.values())
