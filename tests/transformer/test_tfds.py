"""`dataset_fn` reads TensorFlow Datasets datasets by name and split.

A tiny TFDS dataset is built in a temporary data_dir from in-memory examples
(no download): text for a language model, inputs/targets strings for an
encoder-decoder, with train and validation splits.
"""

import numpy as np
import pytest

tfds = pytest.importorskip("tensorflow_datasets",
                           reason="the `tfds` extra: pip install -e '.[tfds]'")

from mesh_tensorflow.transformer import dataset  # pylint: disable=g-import-not-at-top
from mesh_tensorflow.transformer import vocabulary  # pylint: disable=g-import-not-at-top

pytestmark = pytest.mark.xdist_group("tfds")

PAIRS = [("red green", "green red"), ("blue", "blue"), ("cyan magenta black", "black"),
         ("white yellow", "yellow white")]


class MtfTinyPairs(tfds.core.GeneratorBasedBuilder):
  """Four string pairs, two splits (the test's local dataset)."""

  VERSION = tfds.core.Version("1.0.0")

  def _info(self):
    return tfds.core.DatasetInfo(
        builder=self, features=tfds.features.FeaturesDict({
            "question": tfds.features.Text(), "answer": tfds.features.Text(),
            "text": tfds.features.Text()}))

  def _split_generators(self, dl_manager):
    del dl_manager
    return {"train": self._generate_examples(PAIRS),
            "validation": self._generate_examples(PAIRS[:2])}

  def _generate_examples(self, pairs):
    for i, (a, b) in enumerate(pairs):
      yield i, {"question": a, "answer": b, "text": f"{a} {b}"}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  path = tmp_path_factory.mktemp("tfds")
  MtfTinyPairs(data_dir=str(path)).download_and_prepare()
  return str(path)


def _rows(ds, key):
  return [row for batch in tfds.as_numpy(ds) for row in batch[key].tolist()]


def _unpadded(row):
  return row[:len(row) - next((i for i, t in enumerate(reversed(row)) if t), len(row))]


def test_encoder_decoder_reads_tfds_by_name_and_split(data_dir):
  vocab = vocabulary.ByteVocabulary()
  common = dict(vocabulary=vocab, sequence_length={"inputs": 24, "targets": 24},
                batch_size=2, seed=None, repeat=False, model_type="bitransformer",
                tfds_name="mtf_tiny_pairs", tfds_data_dir=data_dir,
                tfds_inputs_key="question", tfds_targets_key="answer", packed=False,
                shuffle_buffer=1)
  train = dataset.dataset_fn("train", **common)
  inputs = sorted(vocab.decode(_unpadded(r)) for r in _rows(train, "inputs"))
  targets = sorted(vocab.decode(_unpadded(r)) for r in _rows(train, "targets"))
  assert inputs == sorted(p[0] for p in PAIRS) and targets == sorted(p[1] for p in PAIRS)
  # Every example ends with EOS (1), padding is 0.
  assert all(_unpadded(r)[-1] == 1 for r in _rows(train, "targets"))
  evaluation = dataset.dataset_fn("validation", **common)
  assert len(_rows(evaluation, "inputs")) == 2
  # A TFDS split expression picks the examples.
  one = dataset.dataset_fn("validation", **dict(common, tfds_eval_split="train[:1]", batch_size=1))
  assert len([r for r in _rows(one, "inputs") if any(r)]) == 1
  # Packed: several examples per row, with segment ids and positions.
  packed = dataset.dataset_fn("train", **dict(common, packed=True, batch_size=1))
  batch = next(iter(tfds.as_numpy(packed)))
  assert set(batch) >= {"inputs", "inputs_segmentation", "inputs_position", "targets",
                        "targets_segmentation", "targets_position"}
  assert np.max(batch["inputs_segmentation"]) >= 2
  with pytest.raises(ValueError, match="has no feature 'inputs'.*tfds_inputs_key"):
    dataset.dataset_fn("train", **dict(common, tfds_inputs_key="inputs"))


def test_language_model_reads_a_tfds_text_feature(data_dir):
  vocab = vocabulary.ByteVocabulary()
  ds = dataset.dataset_fn("validation", vocab, {"targets": 32}, batch_size=1, seed=None,
                          repeat=False, model_type="lm", tfds_name="mtf_tiny_pairs",
                          tfds_data_dir=data_dir, packed=False, shuffle_buffer=1)
  texts = sorted(vocab.decode(_unpadded(r)) for r in _rows(ds, "targets"))
  assert texts == sorted(f"{a} {b}" for a, b in PAIRS[:2])
