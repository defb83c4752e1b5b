"""A seqio task name feeds `dataset_fn` (training and evaluation data).

The task is registered from in-memory examples with seqio's own byte
vocabulary (the same 259 ids as this library's ByteVocabulary), tokenized and
given EOS by seqio's preprocessors; `dataset_fn` packs or pads its features.
"""

import functools

import numpy as np
import pytest
import tensorflow as tf

seqio = pytest.importorskip("seqio", reason="seqio is not installed (pip install seqio)")

from mesh_tensorflow.transformer import dataset  # pylint: disable=g-import-not-at-top
from mesh_tensorflow.transformer import vocabulary  # pylint: disable=g-import-not-at-top

pytestmark = pytest.mark.xdist_group("seqio")

PAIRS = [("red green", "green red"), ("blue", "blue"), ("cyan black", "black cyan")]
TASK = "mtf_test_reverse_words"


def _source(split, shuffle_files, seed=None):
  del shuffle_files, seed
  pairs = PAIRS if split == "train" else PAIRS[:1]
  return tf.data.Dataset.from_tensor_slices(
      {"inputs": [p[0] for p in pairs], "targets": [p[1] for p in pairs]})


@pytest.fixture(scope="module", autouse=True)
def registered_task():
  if TASK not in seqio.TaskRegistry.names():
    features = {k: seqio.Feature(seqio.ByteVocabulary()) for k in ("inputs", "targets")}
    seqio.TaskRegistry.add(
        TASK, source=seqio.FunctionDataSource(_source, splits=["train", "validation"]),
        preprocessors=[seqio.preprocessors.tokenize, seqio.preprocessors.append_eos],
        output_features=features)
  yield


def _rows(ds, key):
  return [row for batch in ds.as_numpy_iterator() for row in batch[key].tolist()]


def test_seqio_task_feeds_dataset_fn():
  vocab = vocabulary.ByteVocabulary()
  common = dict(vocabulary=vocab, sequence_length={"inputs": 16, "targets": 16},
                batch_size=1, seed=None, repeat=False, model_type="bitransformer",
                seqio_task=TASK, packed=False, shuffle_buffer=1)
  train = dataset.dataset_fn("train", **common)
  decoded = sorted(vocab.decode(r) for r in _rows(train, "targets"))
  assert decoded == sorted(p[1] for p in PAIRS)
  # seqio appended EOS: the last non-padding id of every row is 1.
  assert all([t for t in r if t][-1] == 1 for r in _rows(train, "inputs"))
  assert len(_rows(dataset.dataset_fn("validation", **common), "inputs")) == 1
  packed = next(dataset.dataset_fn("train", **dict(common, packed=True)).as_numpy_iterator())
  assert np.max(packed["targets_segmentation"]) >= 2
  with pytest.raises(ValueError, match="is not registered.*seqio_modules"):
    dataset.dataset_fn("train", **dict(common, seqio_task="no_such_task"))
  with pytest.raises(ValueError, match="vocabulary of 259 ids.*has 359"):
    dataset.dataset_fn("train", **dict(common, vocabulary=vocabulary.ByteVocabulary(100)))


def test_scoring_reads_every_validation_example_of_a_task():
  """--mode=score without --input_file reads the task's validation split one
  example per row (application.unpacked_validation_data), each once."""
  from mesh_tensorflow.transformer import application  # pylint: disable=g-import-not-at-top
  vocab = vocabulary.ByteVocabulary()
  data_fn = functools.partial(dataset.dataset_fn, seqio_task=TASK, shuffle_buffer=1)
  ds = application.unpacked_validation_data(data_fn, vocab, {"inputs": 16, "targets": 16},
                                      "bitransformer")
  rows = list(ds.as_numpy_iterator())
  assert len(rows) == len(PAIRS[:1])
  assert vocab.decode([t for t in rows[0]["inputs"][0] if t > 1]) == PAIRS[0][0]
