"""absl flags of the BERT programs.

Each program (run_pretraining, run_classifier, run_squad) and the tokenizer
keeps its flags in its own `flags.FlagValues` (its `FLAGS`), not in absl's
global one: the programs share flag names (--bert_config_file, --mode,
--mesh_shape, ...) with each other and with other entry points of the
package, and each must be importable next to them. `run_main` parses a
program's command line into its FLAGS.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence

from absl import flags

from mesh_tensorflow import cli


def new() -> flags.FlagValues:
  """An empty FlagValues for one program.

  Example:
    >>> FLAGS = new()
  """
  return flags.FlagValues()


def define(flag_values: flags.FlagValues, kind: str, name: str, default: Any,
           help_text: str, module_name: Optional[str] = None) -> None:
  """flags.DEFINE_<kind>(name, default, help_text) in flag_values.

  Example:
    >>> define(FLAGS, "string", "vocab_file", None, "The vocabulary file.")
  """
  getattr(flags, f"DEFINE_{kind}")(name, default, help_text, flag_values=flag_values,
                                   module_name=module_name)


def program(module_name: str, *included: flags.FlagValues):
  """A program's FLAGS (holding the flags of `included` too, e.g. the
  tokenizer's) and its `define(kind, name, default, help_text)`.

  Example:
    >>> FLAGS, define_flag = program(__name__, tokenization.FLAGS)
    >>> define_flag("string", "data_dir", None, "Directory of the task's .tsv files.")
  """
  flag_values = new()
  for other in included:
    flag_values.append_flag_values(other)

  def define_flag(kind: str, name: str, default: Any, help_text: str) -> None:
    define(flag_values, kind, name, default, help_text, module_name=module_name)
  return flag_values, define_flag


def define_shared(define_flag: Callable[[str, str, Any, str], None], layout_default: str) -> None:
  """Defines the flags of every BERT program: the model config, the batch
  size and optimizer, checkpoint saving, the layout, and the
  TPUEstimator flags (accepted, unused).

  Example:
    >>> define_shared(define_flag, layout_default="batch:batch")
  """
  define_flag("string", "bert_config_file", None,
              "The BERT config JSON file (the model architecture).")
  define_flag("integer", "train_batch_size", 32, "Total batch size for training.")
  define_flag("float", "learning_rate", 5e-5, "Peak learning rate.")
  define_flag("bool", "clip_gradients", True, "Clip gradients to global norm 1.")
  define_flag("string", "optimizer", "adam", "adam or adafactor.")
  define_flag("integer", "save_checkpoints_steps", 1000,
              "Save a checkpoint every this many steps.")
  define_flag("bool", "use_tpu", False, "Must stay False: TPUEstimator does not exist in TF2.")
  define_flag("string", "layout", layout_default,
              "Layout rules (in this default, rules naming a mesh dimension the mesh lacks "
              "are ignored).")
  for name in ("tpu_name", "tpu_zone", "gcp_project", "master"):
    define_flag("string", name, None, "Unused (TPUEstimator only).")


def define_fine_tuning(define_flag: Callable[[str, str, Any, str], None]) -> None:
  """Defines the flags of the fine-tuning programs (run_classifier,
  run_squad): the vocabulary, the starting checkpoint, cached training data,
  epochs and warm-up.

  Example:
    >>> define_fine_tuning(define_flag)
  """
  define_flag("string", "vocab_file", None, "The vocabulary the BERT model was trained on.")
  define_flag("string", "init_checkpoint", None,
              "Checkpoint (e.g. of pre-training) whose variables a fresh run starts from.")
  define_flag("string", "cached_train_file", None,
              "Prepared training TFRecord file (made if missing).")
  define_flag("bool", "do_lower_case", True, "Lower-case the text (uncased models).")
  define_flag("float", "max_optimized_variable_size", 1e7, "Leave larger variables untrained.")
  define_flag("bool", "do_train", False, "Train.")
  define_flag("float", "num_train_epochs", 3.0, "Training epochs.")
  define_flag("float", "warmup_proportion", 0.1, "Fraction of training for linear warm-up.")
  define_flag("integer", "iterations_per_loop", 1000,
              "Print a progress line every this many steps.")


def value(flag_values: flags.FlagValues, name: str, default: Any = None) -> Any:
  """The flag's value (its default until a command line sets it), or
  `default` if flag_values has no such flag; library calls need no parsing.

  Example:
    >>> value(FLAGS, "optimizer", "adam")
    'adam'
  """
  if name not in flag_values:
    return default
  return flag_values[name].value


def run_main(main: Callable[[List[str]], Optional[int]], flag_values: flags.FlagValues,
             argv: Optional[Sequence[str]] = None) -> int:
  """Parses argv into flag_values and runs main(remaining args) through
  `cli.run_main`: mistakes print one `error:` line and return 2; --help
  lists the flags.

  Example:
    >>> sys.exit(run_main(main, FLAGS))
  """
  def program(args):
    if any(a in ("--help", "--helpfull", "-h", "--helpshort") for a in args[1:]):
      for name in sorted(flag_values):
        flag = flag_values[name]
        if name == flag.name and name not in ("flagfile", "undefok"):
          print(f"  --{name}: {flag.help} (default: {flag.default!r})")
      return 0
    try:
      rest = flag_values(list(args))
    except flags.Error as e:
      raise cli.UserError(str(e), hint=f"{args[0]} --help lists the flags") from None
    return main(rest)
  return cli.run_main(program, argv)
