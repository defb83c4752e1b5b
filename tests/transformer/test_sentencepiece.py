"""SentencePiece vocabularies as T5 uses them, end to end.

A small SentencePiece model is trained on the fly with T5's settings (pad 0,
EOS 1, UNK 2, no BOS) and 100 extra ids on top, as T5's. Its sentinels and
span-corruption text follow T5's vocabulary; through the command line it
scores, fine-tunes, evaluates, decodes and exports a model directory written
by the original Mesh TensorFlow 0.1.21 (tests/data/original_0.1.21/t5_1_1_bi,
whose vocabulary rows, 384, are what 200 pieces + 100 extra ids round up to
with vocab_divisor 128), with the five commands of docs/porting_t5_models.md.
"""

import io
import os
import pathlib
import random
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from cli_driver import run_commands

sentencepiece = pytest.importorskip(
    "sentencepiece", reason="the `sentencepiece` extra: pip install -e '.[sentencepiece]'")

from mesh_tensorflow.transformer import transformer  # pylint: disable=g-import-not-at-top
from mesh_tensorflow.transformer import vocabulary  # pylint: disable=g-import-not-at-top

ROOT = pathlib.Path(__file__).resolve().parents[2]
ORIGINAL_DIR = ROOT / "tests" / "data" / "original_0.1.21" / "t5_1_1_bi"
PIECES, EXTRA_IDS = 200, 100

pytestmark = pytest.mark.xdist_group("sentencepiece")


def _sentences(count, seed=0):
  rng = random.Random(seed)
  syllables = [c + v for c in "bcdfghklmnprstvwz" for v in "aeiou"]
  words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 3)))
           for _ in range(300)]
  words += "the quick brown fox thank you for inviting me to your party last week".split()
  return [" ".join(rng.choice(words) for _ in range(rng.randint(3, 12)))
          for _ in range(count)]


@pytest.fixture(scope="module")
def spm_file(tmp_path_factory):
  """A SentencePiece model trained with T5's special ids (about a second)."""
  model = io.BytesIO()
  sentencepiece.SentencePieceTrainer.train(
      sentence_iterator=iter(_sentences(3000)), model_writer=model, vocab_size=PIECES,
      pad_id=0, eos_id=1, unk_id=2, bos_id=-1, model_type="unigram",
      character_coverage=1.0, minloglevel=2)
  path = tmp_path_factory.mktemp("spm") / "sentencepiece.model"
  path.write_bytes(model.getvalue())
  return path


def test_t5_sentinels_span_corruption_and_vocabulary_rounding(spm_file):
  vocab = vocabulary.SentencePieceVocabulary(str(spm_file), extra_ids=EXTRA_IDS)
  assert vocab.vocab_size == PIECES + EXTRA_IDS
  assert (vocab.pad_id, vocab.eos_id) == (0, 1)
  # <extra_id_0> is the highest id, <extra_id_99> the first after the pieces.
  assert vocab.encode("<extra_id_0>") == [vocab.vocab_size - 1] == [vocab.sentinel_id(0)]
  assert vocab.encode("<extra_id_99>") == [PIECES]
  assert vocab.decode([vocab.vocab_size - 2]) == "<extra_id_1>"
  # T5's span corruption example: the dropped spans in the inputs and the
  # targets are marked by the same sentinels, which stay single ids.
  inputs = "thank you <extra_id_0> me to your party <extra_id_1> week"
  targets = "<extra_id_0> for inviting <extra_id_1> last <extra_id_2>"
  input_ids, target_ids = vocab.encode(inputs), vocab.encode(targets)
  assert [i for i in input_ids if i >= PIECES] == [vocab.sentinel_id(0), vocab.sentinel_id(1)]
  assert [i for i in target_ids if i >= PIECES] == [vocab.sentinel_id(n) for n in range(3)]
  assert vocab.decode(input_ids) == inputs and vocab.decode(target_ids) == targets
  # Decoding stops at EOS and drops padding, on the graph side too.
  padded = target_ids + [1, 0, 0]
  assert vocab.decode(padded) == targets
  assert vocab.decode_tf(tf.constant([padded])).numpy().tolist() == [targets.encode()]
  assert vocab.encode_tf(tf.constant([inputs])).to_list() == [input_ids]
  # 300 ids are rounded up to 384 rows by the original's vocab_divisor 128
  # (T5: 32000 pieces + 100 = 32100 -> 32128).
  model = transformer.Unitransformer(
      layer_stack=transformer.LayerStack([]), d_model=8, input_vocab_size=vocab.vocab_size,
      output_vocab_size=vocab.vocab_size, autoregressive=True, max_length=8,
      vocab_divisor=128)
  assert model.input_vocab_dim.size == model.output_vocab_dim.size == 384
  with pytest.raises(ValueError, match="extra_ids must be >= 0"):
    vocabulary.SentencePieceVocabulary(str(spm_file), extra_ids=-1)
  with pytest.raises(ValueError, match="<extra_id_100> is not among"):
    vocab.sentinel_id(100)


def _main(args, cwd):
  env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="3")
  proc = subprocess.run([sys.executable, "-m", "mesh_tensorflow.transformer.main", *args],
                        capture_output=True, text=True, env=env, cwd=cwd, timeout=600,
                        check=False)
  assert proc.returncode == 0, f"{args}\n{proc.stdout[-3000:]}\n{proc.stderr[-4000:]}"
  return proc.stdout


def test_five_commands_and_export_on_an_original_model_dir(spm_file, tmp_path):
  """docs/porting_t5_models.md's workflow with a SentencePiece vocabulary."""
  model_dir = tmp_path / "t5_small"
  shutil.copytree(ORIGINAL_DIR, model_dir)
  lines = [f"{s}\t{' '.join(reversed(s.split()))}" for s in _sentences(40, seed=1)]
  (tmp_path / "train.tsv").write_text("\n".join(lines) + "\n")
  (tmp_path / "valid.tsv").write_text("\n".join(lines[:8]) + "\n")
  (tmp_path / "pairs.tsv").write_text(
      "thank you <extra_id_0> me\t<extra_id_0> for inviting <extra_id_1>\n"
      + lines[0] + "\n")
  (tmp_path / "inputs.txt").write_text("thank you <extra_id_0> me\n" + lines[1].split("\t")[0]
                                       + "\n")
  # 1. The user's settings, as on the porting page.
  (tmp_path / "local.gin").write_text(f"""\
utils.run.mesh_shape = 'model:1,batch:1'
utils.run.vocabulary = @vocabulary.SentencePieceVocabulary()
SentencePieceVocabulary.sentencepiece_model_file = '{spm_file}'
SentencePieceVocabulary.extra_ids = {EXTRA_IDS}
dataset_fn.train_files = ['train.tsv']
dataset_fn.eval_files = ['valid.tsv']
utils.run.num_samples = 0
utils.run.batch_size = 8
""")
  base = [f"--gin_file={model_dir / 'operative_config.gin'}", "--gin_file=local.gin"]
  # 2. Score with the pretrained checkpoint.
  out = _main([f"--model_dir={model_dir}", *base, "--mode=score", "--input_file=pairs.tsv",
               "--output_file=pairs.scores"], tmp_path)
  assert "(300 ids, model 384)" in out, out
  scores = [float(s) for s in (tmp_path / "pairs.scores").read_text().split()]
  assert len(scores) == 2 and all(np.isfinite(scores)) and all(s < 0 for s in scores)
  # 3. Fine-tune into a new model directory, 4. held-out loss and
  # perplexity, 5. decode one input per line, and export: one fresh process
  # runs the four commands (tests/cli_driver.py).
  tuned = tmp_path / "t5_small_tuned"
  export_dir = tmp_path / "export"
  env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="3")
  tuned_out, evaluated, _, _ = run_commands("transformer", [
      [f"--model_dir={tuned}", *base, f"--init_checkpoint={model_dir}",
       "--init_checkpoint_reset_optimizer", "--mode=train",
       "--gin_param=utils.run.train_steps = 2"],
      [f"--model_dir={tuned}", *base, "--mode=eval"],
      [f"--model_dir={tuned}", *base, "--mode=infer", "--input_file=inputs.txt",
       "--output_file=outputs.txt"],
      [f"--model_dir={tuned}", *base, "--mode=export", f"--export_dir={export_dir}"],
  ], cwd=str(tmp_path), env=env)
  assert re.search(r"initialized from .*model.ckpt-2 \(step 0", tuned_out), tuned_out
  assert "trained steps 1..2" in tuned_out, tuned_out
  assert "final: step=2" in evaluated and "perplexity=" in evaluated, evaluated
  assert len((tmp_path / "outputs.txt").read_text().splitlines()) == 2
  # With tensorflow-text installed the SavedModel holds its
  # SentencePiece op: strings in, strings out (sentinels included). Without
  # it (core TensorFlow has no SentencePiece op) the SavedModel takes and
  # returns ids, and the vocabulary turns them into text outside it.
  vocab = vocabulary.SentencePieceVocabulary(str(spm_file), extra_ids=EXTRA_IDS)
  ids = vocab.encode("thank you <extra_id_0> me") + [vocab.eos_id]
  has_tensorflow_text = _has_tensorflow_text()  # imported first: it registers its ops
  signatures = tf.saved_model.load(str(export_dir)).signatures
  if has_tensorflow_text:
    assert {"decode", "decode_ids", "score", "score_ids"} <= set(signatures)
    text = tf.constant(["thank you <extra_id_0> me"])
    strings = signatures["decode"](inputs=text)["outputs"].numpy().tolist()
    id_outputs = signatures["decode_ids"](inputs=tf.constant([ids], tf.int32))["outputs"]
    # The string signature equals the id signature decoded by the vocabulary.
    assert [s.decode() for s in strings] == [vocab.decode(id_outputs.numpy()[0].tolist())]
    scores = signatures["score"](inputs=text,
                                 targets=tf.constant(["<extra_id_0> for inviting"]))["scores"]
    assert scores.shape == [1] and scores.numpy()[0] < 0
  else:
    assert "decode_ids" in signatures and "decode" not in signatures
  decoded = signatures["decode_ids"](inputs=tf.constant([ids], tf.int32))["outputs"]
  assert decoded.dtype == tf.int32 and decoded.shape[0] == 1
  assert isinstance(vocab.decode(decoded.numpy()[0].tolist()), str)


def _has_tensorflow_text():
  try:
    import tensorflow_text  # pylint: disable=g-import-not-at-top,unused-import
  except ImportError:
    return False
  return True
