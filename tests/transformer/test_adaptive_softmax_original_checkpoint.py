"""A checkpoint of the adaptive softmax written by the original Mesh
TensorFlow 0.1.21 restores into `AdaptiveSoftmaxVocabEmbedding` and gives
the original's log-probabilities and embeddings.

tests/data/original_0.1.21/adaptive_softmax holds what the original created
and saved (oss_scripts/make_original_adaptive_softmax_checkpoint.py): the
variables of one AdaptiveSoftmaxVocabEmbedding (a factorized head whose table
has the head tokens and one row per tail cluster, a plain tail and a
factorized tail) and what the original computed from them.
"""

import json
import pathlib

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import adaptive_softmax
from mesh_tensorflow.transformer import inference
from mesh_tensorflow.transformer import modeling

DATA = (pathlib.Path(__file__).resolve().parents[2] / "tests" / "data" / "original_0.1.21" /
        "adaptive_softmax")


@pytest.mark.parametrize("mesh_shape,layout", [("all:1", ""), ("all:2", "vocab:all")])
def test_original_adaptive_softmax_checkpoint_restores(mesh_shape, layout):
  expected = json.loads((DATA / "expected.json").read_text())
  reader = tf.train.load_checkpoint(str(DATA / "model.ckpt-0"))
  saved = {name: {"shape": list(shape), "dtype": reader.get_variable_to_dtype_map()[name].name}
           for name, shape in reader.get_variable_to_shape_map().items()}
  assert saved == expected["variables"]
  impl = modeling.make_mesh_impl(mesh_shape, layout)
  inference.restore(impl, str(DATA))
  created = {}

  def build(mesh, features):
    embedding = adaptive_softmax.AdaptiveSoftmaxVocabEmbedding(
        mesh, mtf.Dimension("vocab", expected["vocab_size"]),
        mtf.Dimension("d_model", expected["d_model"]),
        mtf.VariableDType(tf.float32, tf.float32, tf.float32), name="embedding",
        clusters=expected["clusters"])
    for v in mesh.graph.trainable_variables:
      created[v.name] = {"shape": list(v.shape.to_integer_list()),
                         "dtype": v.variable_dtype.master_dtype.name}
    return {"log_probs": embedding.hidden_to_logits(features["hidden"]),
            "embeddings": embedding.ids_to_embedding(features["ids"])}

  hidden = np.asarray(expected["hidden"], np.float32)
  ids = np.asarray(expected["ids"], np.int32)
  out = inference.run_mtf(impl, {"hidden": hidden, "ids": ids},
                          {"hidden": "batch:2;length:6;d_model:8", "ids": "batch:2;length:6"},
                          build)
  # The same variables (names, shapes, dtypes) as the original saved.
  assert created == expected["variables"]
  np.testing.assert_allclose(out["log_probs"], expected["log_probs"], rtol=0, atol=1e-5)
  np.testing.assert_allclose(out["embeddings"], expected["embeddings"], rtol=0, atol=1e-6)
