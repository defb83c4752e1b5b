"""Checks that the original Mesh TensorFlow 0.1.21 restores a checkpoint that
`python -m mesh_tensorflow.export_original_checkpoint` wrote with its default
flags, and scores examples there as this library scores them.

Run it with a Python that has mesh-tensorflow==0.1.21 (see
make_original_beam_decodes.py), from a directory outside this repository:

    # here: fine-tune an original model directory, export it, score pairs
    python -m mesh_tensorflow.transformer.main --model_dir=tuned \\
        --gin_file=SRC/operative_config.gin --gin_file=local.gin \\
        --init_checkpoint=SRC --mode=train --gin_param="utils.run.train_steps = 4"
    python -m mesh_tensorflow.export_original_checkpoint --checkpoint=tuned \\
        --output_dir=exported
    python -m mesh_tensorflow.transformer.main --model_dir=tuned \\
        --gin_file=SRC/operative_config.gin --gin_file=local.gin \\
        --mode=score --input_file=pairs.tsv --output_file=scores_here
    # the original: restore the export (its own Saver, its own dtypes), score
    /tmp/orig/bin/python check_original_round_trip.py --source_dir=SRC \\
        --export_dir=exported --pairs=pairs.tsv --scores_here=scores_here

SRC is a model directory the original wrote (its operative_config.gin builds
the model); pairs.tsv holds `inputs<TAB>targets` lines (targets only for a
language model), byte vocabulary. Prints each example's log-likelihood in
nats from both and exits 1 when one differs by more than --tolerance.
"""

import os
import sys

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_original_beam_decodes as stand_ins  # pylint: disable=g-import-not-at-top,wrong-import-position

FLAGS = flags.FLAGS
flags.DEFINE_string("source_dir", None, "Model directory the original wrote (its config).")
flags.DEFINE_string("export_dir", None, "export_original_checkpoint's output directory.")
flags.DEFINE_string("pairs", None, "inputs<TAB>targets lines (targets only for an LM).")
flags.DEFINE_string("scores_here", None, "This library's --mode=score output for pairs.")
flags.DEFINE_float("tolerance", 5e-4, "Largest allowed difference, nats.")
LENGTH = 16


def main(argv):
  del argv
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top
  stand_ins._estimator_stand_in(tf)  # pylint: disable=protected-access
  tf.disable_v2_behavior()
  import gin  # pylint: disable=g-import-not-at-top
  import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top
  from mesh_tensorflow.transformer import transformer  # pylint: disable=g-import-not-at-top
  from mesh_tensorflow.transformer import utils  # pylint: disable=g-import-not-at-top
  if "site-packages" not in mesh_tensorflow_path(mtf):
    raise SystemExit(f"error: mesh_tensorflow comes from {mtf.__file__}: run from elsewhere.")

  gin.parse_config_file(os.path.join(FLAGS.source_dir, "operative_config.gin"),
                        skip_unknown=True)
  model_type = gin.query_parameter("run.model_type")
  lines = [l for l in open(FLAGS.pairs, encoding="utf-8").read().split("\n") if l]
  rows = [l.split("\t") for l in lines]

  def ids(texts):
    out = np.zeros([len(texts), LENGTH], np.int32)
    for i, text in enumerate(texts):
      row = stand_ins._encode(text)[:LENGTH]  # pylint: disable=protected-access
      out[i, :len(row)] = row
    return out

  targets_np = ids([r[-1] for r in rows])
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "my_mesh")
  mesh_impl = mtf.placement_mesh_impl.PlacementMeshImpl(shape=[], layout={}, devices=[""])
  batch = mtf.Dimension("batch", len(rows))
  length = mtf.Dimension("length", LENGTH)
  shape = mtf.Shape([batch, length])
  model = utils.build_model(model_type=model_type, input_vocab_size=stand_ins.VOCAB_SIZE,
                            output_vocab_size=stand_ins.VOCAB_SIZE, layout_rules=None,
                            mesh_shape=None)
  variable_dtype = utils.get_variable_dtype()
  targets = mtf.import_tf_tensor(mesh, tf.constant(targets_np), shape)
  if model_type == "lm":
    logits, _ = model.call_simple(inputs=transformer.autoregressive_inputs(targets),
                                  targets=targets, compute_loss=False, mode="eval",
                                  variable_dtype=variable_dtype)
  else:
    inputs = mtf.import_tf_tensor(mesh, tf.constant(ids([r[0] for r in rows])), shape)
    logits, _ = model.call_simple(inputs=inputs, targets=targets, compute_loss=False,
                                  mode="eval", variable_dtype=variable_dtype)
  vocab_dim = logits.shape.dims[-1]
  cross_entropy = mtf.layers.softmax_cross_entropy_with_logits(
      logits, mtf.one_hot(targets, vocab_dim, dtype=logits.dtype), vocab_dim)
  weights = mtf.cast(mtf.not_equal(targets, 0), cross_entropy.dtype)
  scores = -mtf.reduce_sum(cross_entropy * weights, reduced_dim=length)
  lowering = mtf.Lowering(graph, {mesh: mesh_impl}, autostack=False)
  scores = lowering.export_to_tf_tensor(scores)
  prefix = tf.train.latest_checkpoint(FLAGS.export_dir)
  saved = tf.train.load_checkpoint(prefix).get_variable_to_dtype_map()
  masters = [v for v in tf.global_variables() if v.op.name in saved]
  missing = sorted(v.name for v in graph.trainable_variables
                   if v.name not in {m.op.name for m in masters})
  if missing:
    raise SystemExit(f"error: the export lacks {missing}")
  with tf.Session() as sess:
    sess.run(tf.global_variables_initializer())
    tf.train.Saver(masters).restore(sess, prefix)  # refuses a dtype it does not expect
    sess.run(lowering.copy_masters_to_slices())
    theirs = sess.run(scores)
  ours = [float(s) for s in open(FLAGS.scores_here).read().split()]
  worst = max(abs(a - b) for a, b in zip(theirs, ours))
  for line, a, b in zip(lines, theirs, ours):
    print(f"{line!r}: original {a:.5f}, here {b:.5f}")
  dtypes = sorted({saved[m.op.name].name for m in masters})
  print(f"restored {prefix} in mesh-tensorflow 0.1.21 ({len(masters)} variables, dtypes "
        f"{dtypes}, master dtype {variable_dtype.master_dtype.name}); {len(ours)} scores, "
        f"largest difference {worst:.2e} nats")
  if len(ours) != len(theirs) or worst > FLAGS.tolerance:
    sys.exit(1)


def mesh_tensorflow_path(module):
  return module.__file__


if __name__ == "__main__":
  flags.mark_flags_as_required(["source_dir", "export_dir", "pairs", "scores_here"])
  app.run(main)
