r"""Train, evaluate, decode and score transformers from gin configs.

With no flags this is the main job: a small decoder-only transformer trained
on the Python standard library's source (no download) on 8 logical CPU
devices with a 2x4 data x model layout; it prints progress and the corpus's
unigram entropy, writes checkpoints and TensorBoard events to --model_dir,
evaluates held-out loss and perplexity and prints generated samples. Run it
again and it resumes from its checkpoint (--fresh starts over):

    python -m mesh_tensorflow.transformer.main

Configs are gin files (paths, or names under the package's gin/ directory)
read after gin/defaults.gin, then single bindings:

    python -m mesh_tensorflow.transformer.main \
        --gin_file=models/tiny_bi.gin --gin_file=layouts/data_parallel.gin \
        --gin_param="run.train_steps = 500" --model_dir=/tmp/bi
    python -m mesh_tensorflow.transformer.main --model_dir=/tmp/bi \
        --gin_file=models/tiny_bi.gin --mode=infer --input_file=inputs.txt
    python -m mesh_tensorflow.transformer.main --mode=score --input_file=texts.txt

--mode is train (train, evaluate, print samples), eval (held-out loss,
perplexity, token accuracy), infer (decode each line of --input_file into
--output_file), score (log-likelihood of each line, in nats) or export (a
SavedModel in --export_dir that serves without this library; see
docs/serving.md).
"""

from __future__ import annotations

import os
import sys
import tempfile

from absl import app
from absl import flags
from absl import logging

NUM_CPU_DEVICES = 8
DEFAULT_MODEL_DIR = os.path.join(tempfile.gettempdir(), "mesh_tensorflow_transformer")

FLAGS = flags.FLAGS
flags.DEFINE_multi_string(
    "gin_file", [], "gin config files, read in order after gin/defaults.gin: paths, or "
    "names under the package's gin directory (models/tiny_lm.gin, layouts/2x4.gin, "
    "learning_rate_schedules/cosine.gin, ...).")
flags.DEFINE_multi_string("gin_param", [], "gin bindings, e.g. 'run.train_steps = 100'.")
flags.DEFINE_string("model_dir", DEFAULT_MODEL_DIR,
                    "Checkpoints and TensorBoard events; training resumes from here.")
flags.DEFINE_enum("mode", None, ["train", "eval", "infer", "score", "export"],
                  "What to do (default: run.mode of the config, 'train').")
flags.DEFINE_string("input_file", None, "infer/score: one input per line.")
flags.DEFINE_string("output_file", None,
                    "infer/score: where the outputs go (default: input_file + "
                    "'.outputs' or '.scores').")
flags.DEFINE_string("export_dir", None,
                    "export: where the SavedModel goes (default <model_dir>/export/<step>).")
flags.DEFINE_string("export_mesh_shape", None,
                    "export: the SavedModel's mesh, e.g. 'all:2' (default one device; gin "
                    "export_saved_model.mesh_shape).")
flags.DEFINE_string("export_layout", None,
                    "export: the SavedModel's layout rules, e.g. 'batch:all' (gin "
                    "export_saved_model.layout_rules).")
flags.DEFINE_bool("fresh", False, "train: delete model_dir's checkpoints and events first.")
flags.DEFINE_integer("cpu_devices", NUM_CPU_DEVICES,
                     "Logical CPU devices to create (the mesh may use fewer).")
flags.DEFINE_bool("print_layout_report", False,
                  "Print the layout report (tensor splits, per-op compute and "
                  "communication, memory per device) of the configured model first.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  if not FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)  # INFO shows TensorFlow's chatter on every save.
  # Logical devices must be configured before TensorFlow initializes them.
  from mesh_tensorflow.transformer import utils  # pylint: disable=g-import-not-at-top
  utils.configure_cpu_devices(FLAGS.cpu_devices)
  from mesh_tensorflow.transformer import gin_config  # pylint: disable=g-import-not-at-top
  bindings = list(FLAGS.gin_param)
  for flag, name in (("export_mesh_shape", "mesh_shape"), ("export_layout", "layout_rules")):
    if getattr(FLAGS, flag) is not None:
      bindings.append(f"export_saved_model.{name} = {getattr(FLAGS, flag)!r}")
  gin_config.parse(FLAGS.gin_file, bindings)
  if FLAGS.print_layout_report:
    from mesh_tensorflow import report  # pylint: disable=g-import-not-at-top
    print(report.report_for_current_config(), flush=True)
  overrides = {"model_dir": FLAGS.model_dir or None}
  for name in ("mode", "input_file", "output_file", "export_dir"):
    if getattr(FLAGS, name) is not None:
      overrides[name] = getattr(FLAGS, name)
  if FLAGS.fresh:
    overrides["fresh"] = True
  try:
    utils.run(**overrides)
  except ValueError as e:
    if FLAGS.model_dir and "heckpoint" in str(e):
      print(f"error: {e}\nIf --model_dir={FLAGS.model_dir} holds another model, pass --fresh "
            "to start over or choose another --model_dir.", file=sys.stderr)
      sys.exit(1)
    raise


def console_main():
  """Entry point of the `mtf-transformer` command."""
  app.run(main)


if __name__ == "__main__":
  console_main()
