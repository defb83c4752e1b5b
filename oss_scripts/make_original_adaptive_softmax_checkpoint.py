"""Writes tests/data/original_0.1.21/adaptive_softmax/: a checkpoint of an
`adaptive_softmax.AdaptiveSoftmaxVocabEmbedding` that the original Mesh
TensorFlow 0.1.21 itself created and saved, with what the original computes
from it (`expected.json`: every variable's name, shape and dtype, the
log-probabilities `hidden_to_logits` gives in evaluation and the embeddings
`ids_to_embedding` gives).

Run it as make_original_beam_decodes.py is run: with a Python that has
mesh-tensorflow==0.1.21, TensorFlow and gin-config installed and that cannot
import this repository's package:

    cd /tmp && /tmp/orig/bin/python /path/to/oss_scripts/make_original_adaptive_softmax_checkpoint.py \
        --output_dir=/path/to/tests/data/original_0.1.21/adaptive_softmax

The clusters cover both of the original's table kinds: a factorized head
(its table has the head tokens and one row per tail cluster), a plain tail
and a factorized tail.
"""

import json
import os
import sys
import types

from absl import app
from absl import flags

FLAGS = flags.FLAGS
flags.DEFINE_string("output_dir", None, "Where the checkpoint and expected.json go.")

VOCAB_SIZE = 16
D_MODEL = 8
CLUSTERS = [
    {"token_count": 6, "embedding_size": 4},
    {"token_count": 6, "embedding_size": 8},
    {"token_count": 4, "embedding_size": 2, "length_projection_factor": 0.5},
]
IDS = [[0, 1, 5, 6, 11, 12], [15, 3, 7, 13, 2, 14]]


def main(argv):
  del argv
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  import make_original_beam_decodes  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top
  make_original_beam_decodes._estimator_stand_in(tf)  # pylint: disable=protected-access
  tf.disable_v2_behavior()
  import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top
  from mesh_tensorflow.transformer import adaptive_softmax  # pylint: disable=g-import-not-at-top
  if not mesh_tensorflow_is_installed(mtf):
    raise SystemExit(f"error: mesh_tensorflow comes from {mtf.__file__}, not an installed "
                     "mesh-tensorflow==0.1.21: run from another directory.")
  tf.set_random_seed(1)
  hidden_value = np.random.RandomState(0).normal(size=[2, 6, D_MODEL]).astype(np.float32)
  with tf.Graph().as_default():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "my_mesh")
    batch_dim, length_dim = mtf.Dimension("batch", 2), mtf.Dimension("length", 6)
    model_dim = mtf.Dimension("d_model", D_MODEL)
    embedding = adaptive_softmax.AdaptiveSoftmaxVocabEmbedding(
        mesh, mtf.Dimension("vocab", VOCAB_SIZE), output_dim=model_dim,
        variable_dtype=mtf.VariableDType(tf.float32, tf.float32, tf.float32),
        name="embedding", ensemble_dim=None, clusters=CLUSTERS)
    context = types.SimpleNamespace(mode="eval", activation_dtype=tf.float32)
    hidden = mtf.import_tf_tensor(mesh, tf.constant(hidden_value),
                                  mtf.Shape([batch_dim, length_dim, model_dim]))
    ids = mtf.import_tf_tensor(mesh, tf.constant(IDS, tf.int32),
                               mtf.Shape([batch_dim, length_dim]))
    log_probs = embedding.hidden_to_logits(hidden, context)
    embedded = embedding.ids_to_embedding(ids, context)
    mesh_impl = mtf.placement_mesh_impl.PlacementMeshImpl(shape=[], layout={}, devices=[""])
    lowering = mtf.Lowering(graph, {mesh: mesh_impl}, autostack=False)
    outputs = [lowering.export_to_tf_tensor(t) for t in (log_probs, embedded)]
    masters = [v for v in tf.global_variables() if "_slice_" not in v.op.name]
    saver = tf.train.Saver(masters)
    with tf.Session() as sess:
      sess.run(tf.global_variables_initializer())
      sess.run(lowering.copy_masters_to_slices())
      log_probs_value, embedded_value = sess.run(outputs)
      os.makedirs(FLAGS.output_dir, exist_ok=True)
      saver.save(sess, os.path.join(FLAGS.output_dir, "model.ckpt"), global_step=0,
                 write_meta_graph=False)
  # The checkpoint file names the checkpoint relative to its folder.
  with open(os.path.join(FLAGS.output_dir, "checkpoint"), "w") as f:
    f.write('model_checkpoint_path: "model.ckpt-0"\n'
            'all_model_checkpoint_paths: "model.ckpt-0"\n')
  reader = tf.train.load_checkpoint(os.path.join(FLAGS.output_dir, "model.ckpt-0"))
  shapes, dtypes = reader.get_variable_to_shape_map(), reader.get_variable_to_dtype_map()
  doc = {"produced_by": "mesh-tensorflow 0.1.21 "
                        "(oss_scripts/make_original_adaptive_softmax_checkpoint.py)",
         "vocab_size": VOCAB_SIZE, "d_model": D_MODEL, "clusters": CLUSTERS,
         "variables": {name: {"shape": list(shapes[name]), "dtype": dtypes[name].name}
                       for name in sorted(shapes)},
         "hidden": hidden_value.tolist(), "ids": IDS,
         "log_probs": log_probs_value.tolist(), "embeddings": embedded_value.tolist()}
  with open(os.path.join(FLAGS.output_dir, "expected.json"), "w") as f:
    json.dump(doc, f, indent=1)
    f.write("\n")
  print(json.dumps(doc["variables"]))


def mesh_tensorflow_is_installed(mtf) -> bool:
  return mtf.__file__.endswith(os.path.join("site-packages", "mesh_tensorflow", "__init__.py"))


if __name__ == "__main__":
  flags.mark_flag_as_required("output_dir")
  app.run(main)
