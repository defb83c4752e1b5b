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

Devices: the CPU is first split into --cpu_devices logical devices (default
8); the mesh then runs on the machine's GPUs if there are at least as many
GPUs as mesh processors, else on the logical CPUs.

A mistake (bad flag, gin binding, layout, mesh, file, checkpoint) is one
`error:` line and one `hint:` line with exit status 2; --verbose (or
MTF_VERBOSE=1) adds the traceback. A damaged newest checkpoint is reported and
the newest intact one restored; --checkpoint_path picks one.

A model directory of the original Mesh TensorFlow or T5 runs with its own
operative config (see docs/porting_t5_models.md):

    python -m mesh_tensorflow.transformer.main --model_dir=DIR \
        --gin_file=DIR/operative_config.gin --mode=score --input_file=pairs.tsv \
        --gin_param="utils.run.mesh_shape = 'batch:2,model:4'"

and --init_checkpoint=DIR fine-tunes it into a new --model_dir.
"""

from __future__ import annotations

import os
import sys
import tempfile

from absl import flags
from absl import logging

from mesh_tensorflow import cli

NUM_CPU_DEVICES = 8
DEFAULT_MODEL_DIR = os.path.join(tempfile.gettempdir(), "mesh_tensorflow_transformer")

FLAGS = flags.FLAGS
cli.define_gin_flags()
flags.DEFINE_string("model_dir", DEFAULT_MODEL_DIR,
                    "Checkpoints and TensorBoard events; training resumes from here.")
flags.DEFINE_enum("mode", None, ["train", "eval", "infer", "score", "export"],
                  "What to do (default: run.mode of the config, 'train').")
flags.DEFINE_string("input_file", None, "infer/score: one input per line.")
flags.DEFINE_string("output_file", None,
                    "infer/score: where the outputs go (default: input_file + "
                    "'.outputs' or '.scores').")
flags.DEFINE_string("targets_file", None,
                    "score: the targets, one per line, of --input_file's inputs (without "
                    "it, --input_file holds input<TAB>target lines).")
flags.DEFINE_string("export_dir", None,
                    "export: where the SavedModel goes (default <model_dir>/export/<step>).")
flags.DEFINE_string("export_mesh_shape", None,
                    "export: the SavedModel's mesh, e.g. 'all:2' (default one device; gin "
                    "export_saved_model.mesh_shape).")
flags.DEFINE_string("export_layout", None,
                    "export: the SavedModel's layout rules, e.g. 'batch:all' (gin "
                    "export_saved_model.layout_rules).")
flags.DEFINE_bool("fresh", False, "train: delete model_dir's checkpoints and events first.")
flags.DEFINE_string(
    "init_checkpoint", None,
    "train: start a model_dir without checkpoints from this checkpoint (a path prefix, "
    "or a model directory for its latest; this library's format or the original Mesh "
    "TensorFlow's): fine-tuning. Same as gin's run.init_checkpoint.")
flags.DEFINE_bool(
    "init_checkpoint_reset_optimizer", None,
    "With --init_checkpoint: start the optimizer state and the step afresh (gin: "
    "run.init_checkpoint_reset_optimizer).")
flags.DEFINE_integer("cpu_devices", NUM_CPU_DEVICES,
                     "Logical CPU devices to create (the mesh may use fewer).")
flags.DEFINE_string("checkpoint_path", None,
                    "Restore this checkpoint (e.g. MODEL_DIR/ckpt-400) instead of the newest "
                    "intact one of --model_dir.")
flags.DEFINE_string("input_encoding", None,
                    "infer/score: the text encoding of --input_file (default utf-8).")
flags.DEFINE_enum("input_errors", None, ["strict", "replace", "ignore"],
                  "infer/score: what an undecodable byte of --input_file does: strict "
                  "(an error naming the line, the default), replace or ignore.")
flags.DEFINE_bool("print_layout_report", False,
                  "Print the layout report (tensor splits, per-op compute and "
                  "communication, memory per device) of the configured model first.")


def main(argv):
  if len(argv) > 1:
    raise cli.UserError(f"unexpected arguments {argv[1:]}: every setting is a --flag",
                        hint="pass --helpfull to list the flags")
  if not FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)  # INFO shows TensorFlow's chatter on every save.
  # Logical devices must be configured before TensorFlow initializes them.
  from mesh_tensorflow.transformer import application  # pylint: disable=g-import-not-at-top
  application.configure_cpu_devices(FLAGS.cpu_devices)
  from mesh_tensorflow.transformer import gin_config  # pylint: disable=g-import-not-at-top
  bindings = list(FLAGS.gin_param)
  for flag, name in (("export_mesh_shape", "mesh_shape"), ("export_layout", "layout_rules")):
    if getattr(FLAGS, flag) is not None:
      bindings.append(f"export_saved_model.{name} = {getattr(FLAGS, flag)!r}")
  gin_config.add_search_paths(FLAGS.gin_location_prefix)
  gin_config.parse(FLAGS.gin_file, bindings)
  if FLAGS.print_layout_report:
    from mesh_tensorflow.transformer import report  # pylint: disable=g-import-not-at-top
    print(report.report_for_current_config(), flush=True)
  overrides = {"model_dir": FLAGS.model_dir or None}
  for name in ("mode", "input_file", "output_file", "targets_file", "checkpoint_path",
               "input_encoding", "input_errors", "init_checkpoint",
               "init_checkpoint_reset_optimizer", "export_dir"):
    if getattr(FLAGS, name) is not None:
      overrides[name] = getattr(FLAGS, name)
  if FLAGS.fresh:
    overrides["fresh"] = True
  try:
    application.run(**overrides)
  except ValueError as e:
    if (FLAGS.model_dir and "heckpoint" in str(e) and cli.is_user_error(e)
        and "intact" not in str(e)):
      raise cli.UserError(
          str(e), hint=f"if --model_dir={FLAGS.model_dir} holds another model, pass --fresh "
          "to start over or choose another --model_dir") from e
    raise


def console_main():
  """Entry point of the `mtf-transformer` command."""
  sys.exit(cli.run_absl_main(main))


if __name__ == "__main__":
  console_main()
