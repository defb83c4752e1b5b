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
