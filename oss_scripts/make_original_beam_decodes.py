"""Writes tests/data/original_0.1.21/<model>/beam_decodes.json: beam search
decodes that the original Mesh TensorFlow 0.1.21 itself computes from the
checkpoints it wrote there.

Run it with a Python that has mesh-tensorflow==0.1.21, TensorFlow and
gin-config installed and that cannot import this repository's package:

    python3.11 -m venv /tmp/orig
    /tmp/orig/bin/pip install tensorflow gin-config absl-py numpy mesh-tensorflow==0.1.21
    cd /tmp && /tmp/orig/bin/python /path/to/oss_scripts/make_original_beam_decodes.py \
        --data_dir=/path/to/tests/data/original_0.1.21

For each model directory the script parses its operative_config.gin (with
unknown T5 names skipped), builds the model in TensorFlow 1 graph mode on one
device, restores the checkpoint (bfloat16 or float32 masters as saved) and
decodes with the original's beam search:

- the encoder-decoders through `Bitransformer.decode` (the decode length is
  max input length * decode_length_multiplier + decode_length_constant,
  capped by the length dimension), one batch of every input;
- the language model through `Unitransformer.beam_search` from an empty
  prefix (the original's only beam search for a decoder-only model), with a
  given decode_length and bos_id.

Each setting stores the best beam's ids (what the model methods return) and,
captured from `mtf.beam_search.beam_search`, every beam's ids and score.
The original's TensorFlow 1 estimator module is absent from TensorFlow 2.16+;
its mesh_tensorflow imports `tf.compat.v1.estimator` only for names used by
training and serving, which a stand-in module supplies (as well as the TF 1
location of `register_tensor_conversion_function`, empty TPUEstimator
modules and, where
tensorflow-datasets is not installed, an empty `tensorflow_datasets`).
"""

import collections
import json
import os
import sys
import types

from absl import app
from absl import flags

FLAGS = flags.FLAGS
flags.DEFINE_string("data_dir", None, "tests/data/original_0.1.21 of the repository.")
flags.DEFINE_list("models", ["t5_v1_0_bi", "t5_1_1_bi", "lm"], "Model directories to decode.")

# Inputs of the encoder-decoders: all fit the 16-token length with their EOS.
BI_INPUTS = ["translate: cat", "hello world", "abc", "Katze", "x", "The fox jumps",
             "0123456789", "a b c d e f"]
# The nearly untrained models never give the real EOS (id 1) a high enough
# probability to end a beam, so the settings marked "eos" end hypotheses at
# a stand-in: the id the model most likely emits after the first position
# (the most frequent id after position 0 of the first setting's beams,
# among those no best decode starts with), passed to the original's
# `beam_search(eos_id=...)` as its gin binding `beam_search.eos_id` would.
# layout/mesh_shape given: the model's beam search takes the original's
# TPU path (a top-2 prefilter per beam and vocabulary split before the
# top 2 * beam), as a real run with run.layout_rules and run.mesh_shape does;
# without: its exact top 2 * beam over beam x vocabulary.
SPLIT4 = {"layout": "batch:batch;vocab:model", "mesh_shape": "batch:2;model:4"}
SPLIT2 = {"layout": "batch:batch;vocab:model", "mesh_shape": "batch:4;model:2"}
# The language model decodes one row: its batch is not split.
LM_SPLIT2 = {"layout": "vocab:model", "mesh_shape": "model:2"}
LM_SPLIT4 = {"layout": "vocab:model", "mesh_shape": "model:4"}
BI_SETTINGS = [
    ("beam4_alpha0.6", dict(beam_size=4, alpha=0.6, **SPLIT4)),
    ("beam2_alpha0", dict(beam_size=2, alpha=0.0, **SPLIT2)),
    ("beam4_alpha0.6_eos", dict(beam_size=4, alpha=0.6, eos_id="auto")),
    ("beam4_alpha0.6_eos_split", dict(beam_size=4, alpha=0.6, eos_id="auto", **SPLIT2)),
    ("beam2_alpha0_eos", dict(beam_size=2, alpha=0.0, eos_id="auto")),
    ("beam3_alpha1_short_eos", dict(beam_size=3, alpha=1.0, eos_id="auto",
                                    decode_length_multiplier=0.5, decode_length_constant=1)),
]
LM_SETTINGS = [
    ("beam4_alpha0.6", dict(beam_size=4, alpha=0.6, decode_length=16)),
    ("beam2_alpha0", dict(beam_size=2, alpha=0.0, decode_length=16, **LM_SPLIT2)),
    ("beam4_alpha0.6_eos", dict(beam_size=4, alpha=0.6, decode_length=16, eos_id="auto")),
    ("beam4_alpha0.6_eos_split", dict(beam_size=4, alpha=0.6, decode_length=16, eos_id="auto",
                                      **LM_SPLIT4)),
    ("beam2_alpha0_eos", dict(beam_size=2, alpha=0.0, decode_length=16, eos_id="auto")),
    ("beam3_alpha2_len6_eos", dict(beam_size=3, alpha=2.0, decode_length=6, eos_id="auto")),
    # The first position reads bos_id instead of 0 (Unitransformer.beam_search's bos_id).
    ("beam4_alpha0.6_bos2_eos_split", dict(beam_size=4, alpha=0.6, decode_length=16,
                                           eos_id="auto", bos_id=2, **LM_SPLIT2)),
]
LENGTH = 16
VOCAB_SIZE = 259  # the byte vocabulary: pad 0, EOS 1, UNK 2, then byte + 3


def _estimator_stand_in(tf1):
  """The names mesh_tensorflow 0.1.21 reads from tf.compat.v1.estimator."""
  module = types.ModuleType("estimator")

  class ModeKeys:  # pylint: disable=too-few-public-methods
    TRAIN, EVAL, PREDICT = "train", "eval", "infer"

  class _Base:  # pylint: disable=too-few-public-methods
    pass

  module.ModeKeys = ModeKeys
  module.CheckpointSaverListener = _Base
  module.SessionRunHook = _Base
  module.EstimatorSpec = _Base
  module.export = types.SimpleNamespace(ServingInputReceiver=_Base)
  module.tpu = types.SimpleNamespace(TPUEstimatorSpec=_Base, TPUEstimator=_Base,
                                     RunConfig=_Base, TPUConfig=_Base)
  tf1.estimator = module
  sys.modules["tensorflow.compat.v1.estimator"] = module
  sys.modules["tensorflow"].estimator = module  # gin.tf's hook subclasses it
  # tpu_variables.py registers a conversion through the TF 1 location of
  # register_tensor_conversion_function, which TF 2.16+ keeps elsewhere.
  tf_ops = sys.modules["tensorflow.python.framework.ops"]
  if not hasattr(tf_ops, "register_tensor_conversion_function"):
    tf_ops.register_tensor_conversion_function = tf1.register_tensor_conversion_function
  # transformer/utils.py imports the TPUEstimator modules that TF 2.16+ lacks
  # at the top; decoding uses neither.
  for tpu_module in ("tpu_config", "tpu_estimator"):
    sys.modules.setdefault("tensorflow.python.tpu." + tpu_module,
                           types.ModuleType(tpu_module))
  # transformer/dataset.py imports tensorflow_datasets at the top; decoding
  # reads no dataset.
  try:
    import tensorflow_datasets  # pylint: disable=g-import-not-at-top,unused-import
  except ImportError:
    sys.modules["tensorflow_datasets"] = types.ModuleType("tensorflow_datasets")


def _encode(text):
  return [b + 3 for b in text.encode("utf-8")] + [1]


def _decode_model(model_dir, name, settings):
  import gin  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top
  import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top
  from mesh_tensorflow.transformer import utils  # pylint: disable=g-import-not-at-top

  gin.clear_config()
  gin.parse_config_file(os.path.join(model_dir, "operative_config.gin"), skip_unknown=True)
  model_type = "lm" if name == "lm" else "bitransformer"
  variable_dtype = utils.get_variable_dtype()
  reader = tf.train.load_checkpoint(os.path.join(model_dir, "model.ckpt-2"))
  saved = reader.get_variable_to_dtype_map()
  results = []
  stand_in_eos = None
  for setting_name, setting in settings:
    setting = dict(setting)
    if setting.get("eos_id") == "auto":
      setting["eos_id"] = stand_in_eos
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "my_mesh")
    mesh_impl = mtf.placement_mesh_impl.PlacementMeshImpl(shape=[], layout={}, devices=[""])
    with tf.Graph().as_default():
      model = utils.build_model(model_type=model_type, input_vocab_size=VOCAB_SIZE,
                                output_vocab_size=VOCAB_SIZE,
                                layout_rules=setting.get("layout"),
                                mesh_shape=setting.get("mesh_shape"))
      captured = {}
      real_beam_search = mtf.beam_search.beam_search

      def capturing_beam_search(*args, eos_id=setting.get("eos_id", 1), **kwargs):
        beams, scores = real_beam_search(*args, eos_id=eos_id, **kwargs)
        captured["beams"], captured["scores"] = beams, scores
        return beams, scores

      mtf.beam_search.beam_search = capturing_beam_search
      try:
        length_dim = mtf.Dimension("length", LENGTH)
        if model_type == "bitransformer":
          rows = [_encode(t) for t in BI_INPUTS]
          ids = np.zeros([len(rows), LENGTH], np.int32)
          for i, row in enumerate(rows):
            ids[i, :len(row)] = row
          batch_dim = mtf.Dimension("batch", len(rows))
          inputs = mtf.import_tf_tensor(mesh, tf.constant(ids), mtf.Shape([batch_dim, length_dim]))
          kwargs = {k: v for k, v in setting.items()
                    if k in ("beam_size", "alpha", "decode_length_multiplier",
                             "decode_length_constant")}
          best = model.decode(inputs, variable_dtype=variable_dtype, **kwargs)
        else:
          ids = None
          batch_dim = mtf.Dimension("batch", 1)
          beam_dim = mtf.Dimension("beam", setting["beam_size"])
          zeros = mtf.zeros(mesh, mtf.Shape([batch_dim, beam_dim, length_dim]), tf.int32)
          best = model.beam_search(
              zeros, mtf.constant(mesh, setting["decode_length"], dtype=tf.int32),
              variable_dtype=variable_dtype, alpha=setting["alpha"],
              bos_id=setting.get("bos_id", 0))
      finally:
        mtf.beam_search.beam_search = real_beam_search
      lowering = mtf.Lowering(graph, {mesh: mesh_impl}, autostack=False)
      outputs = [lowering.export_to_tf_tensor(t)
                 for t in (best, captured["beams"], captured["scores"])]
      masters = {v.op.name: v for v in tf.global_variables() if v.op.name in saved}
      missing = sorted(v.op.name for v in graph.trainable_variables
                       if v.name not in masters)
      if missing:
        raise ValueError(f"{model_dir}: variables not in the checkpoint: {missing}")
      for var_name, var in masters.items():
        if var.dtype.base_dtype != saved[var_name]:
          raise ValueError(f"{var_name}: graph {var.dtype} != checkpoint {saved[var_name]}")
      saver = tf.train.Saver(list(masters.values()))
      with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        saver.restore(sess, os.path.join(model_dir, "model.ckpt-2"))
        sess.run(lowering.copy_masters_to_slices())
        best_ids, beams, scores = sess.run(outputs)
    entry = {"name": setting_name, "settings": setting,
             "best_ids": best_ids.reshape([-1, LENGTH]).tolist(),
             "beams": beams.tolist(), "scores": scores.tolist()}
    if ids is not None:
      entry["inputs"] = BI_INPUTS
      entry["input_ids"] = ids.tolist()
    results.append(entry)
    if stand_in_eos is None:
      starts = {row[0] for row in entry["best_ids"]}
      counts = collections.Counter(t for row in np.reshape(beams, [-1, LENGTH]).tolist()
                                   for t in row[1:] if t and t not in starts)
      stand_in_eos = counts.most_common(1)[0][0]
    eos = setting.get("eos_id", 1)
    ended = sum(eos in row for row in np.reshape(beams, [-1, LENGTH]).tolist())
    print(f"{name} {setting_name}: eos_id {eos}, {ended} of {np.size(scores)} beams end "
          f"with it; best: {entry['best_ids'][:2]}", flush=True)
  return results


def main(argv):
  del argv
  import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top
  _estimator_stand_in(tf)
  tf.disable_v2_behavior()
  import mesh_tensorflow  # pylint: disable=g-import-not-at-top
  if not mesh_tensorflow.__file__.endswith(
      os.path.join("site-packages", "mesh_tensorflow", "__init__.py")):
    raise SystemExit(f"error: mesh_tensorflow comes from {mesh_tensorflow.__file__}, not an "
                     "installed mesh-tensorflow==0.1.21: run from another directory.")
  for name in FLAGS.models:
    model_dir = os.path.join(FLAGS.data_dir, name)
    settings = LM_SETTINGS if name == "lm" else BI_SETTINGS
    results = _decode_model(model_dir, name, settings)
    doc = {"produced_by": "mesh-tensorflow 0.1.21 (oss_scripts/make_original_beam_decodes.py)",
           "tensorflow": tf.__version__, "length": LENGTH, "decodes": results}
    with open(os.path.join(model_dir, "beam_decodes.json"), "w") as f:
      json.dump(doc, f, indent=1)
      f.write("\n")


if __name__ == "__main__":
  flags.mark_flag_as_required("data_dir")
  app.run(main)
