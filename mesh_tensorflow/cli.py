"""What the command-line tools share: user errors as one line, exit status 2.

Every entry point (`python -m mesh_tensorflow.transformer.main`,
`python -m mesh_tensorflow.report`, `python -m mesh_tensorflow.inspect_checkpoint`,
`python -m mesh_tensorflow.launch`, `python -m mesh_tensorflow.analysis.cost_model` and
the programs under examples/) runs its main function through `run_main`:

* a mistake of the user (a bad flag, gin binding, layout, mesh, file or
  checkpoint) prints one line `error: ...` and one line `hint: ...` on stderr
  and exits with status 2;
* anything else (a bug) keeps its Python traceback;
* `--verbose` anywhere on the command line, or the environment variable
  MTF_VERBOSE=1, shows the traceback of user errors too.

A user error is a `UserError`, an OSError (missing or unreadable file), one of
TensorFlow's NotFoundError, PermissionDeniedError or DataLossError, a gin
config error, or a ValueError raised by mesh_tensorflow's own validation (the
innermost frame of its traceback is in this package, in gin or in the program
itself), which is how the library reports bad shapes, layouts and settings.

    >>> from mesh_tensorflow import cli
    >>> def main(argv):
    ...   raise cli.UserError("--steps=-1: use a positive number", hint="e.g. --steps=100")
    >>> cli.run_main(main, ["prog"])   # prints the two lines, returns 2
    2

This module imports nothing heavy, so a program can use it before TensorFlow.
"""

from __future__ import annotations

import os
import re
import sys
import traceback
from typing import Callable, List, Optional, Sequence

EXIT_USER_ERROR = 2
VERBOSE_ENV = "MTF_VERBOSE"
VERBOSE_FLAG = "--verbose"
VERBOSE_HELP = ("  --verbose: on an error, print the traceback as well (or set the environment "
                "variable MTF_VERBOSE=1)")
DEFAULT_HINT = f"rerun with {VERBOSE_FLAG} (or {VERBOSE_ENV}=1) to see where it happened"

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_TF_FILE_ERRORS = ("NotFoundError", "PermissionDeniedError", "DataLossError")


class UserError(Exception):
  """A mistake in what the user gave (flag, file, setting), not a bug.

  Args:
    message: what is wrong, naming the flag, file or setting.
    hint: what to do about it (one line); None for the generic hint.

  Example:
    >>> raise UserError("--input_file=x.txt does not exist", hint="check the path")
  """

  def __init__(self, message: str, hint: Optional[str] = None):
    super().__init__(message)
    self.hint = hint


def verbose_requested(argv: Optional[Sequence[str]] = None) -> bool:
  """Whether --verbose is in argv (default sys.argv) or MTF_VERBOSE is set.

  Example:
    >>> verbose_requested(["prog", "--verbose"])
    True
  """
  argv = sys.argv if argv is None else argv
  env = os.environ.get(VERBOSE_ENV, "").strip().lower()
  return VERBOSE_FLAG in _own(argv) or env not in ("", "0", "false", "no")


def _own(argv: Sequence[str]) -> List[str]:
  """The arguments before "--" (after it: another program's, as in launch)."""
  argv = list(argv)
  return argv[:argv.index("--")] if "--" in argv else argv


def strip_verbose(argv: Sequence[str]) -> List[str]:
  """argv without --verbose before any "--" (the programs' own parsers do
  not know it).

  Example:
    >>> strip_verbose(["prog", "--verbose", "--", "client.py", "--verbose"])
    ['prog', '--', 'client.py', '--verbose']
  """
  argv = list(argv)
  own = _own(argv)
  return [a for a in own if a != VERBOSE_FLAG] + argv[len(own):]


def _innermost_file(exc: BaseException) -> str:
  tb = exc.__traceback__
  filename = ""
  while tb is not None:
    filename = tb.tb_frame.f_code.co_filename
    tb = tb.tb_next
  return os.path.abspath(filename) if filename else ""


def _from_validation(exc: BaseException) -> bool:
  """Raised by our own checks, by gin, or by the program itself."""
  path = _innermost_file(exc)
  if not path:
    return True  # Raised without frames (re-raised by a wrapper): trust the type.
  main = getattr(sys.modules.get("__main__"), "__file__", None)
  return (path.startswith(_PACKAGE_DIR + os.sep)
          or f"{os.sep}gin{os.sep}" in path
          or (main is not None and path == os.path.abspath(main)))


def is_user_error(exc: BaseException) -> bool:
  """Whether `exc` is the user's mistake (see the module docstring).

  Example:
    >>> is_user_error(FileNotFoundError("x.txt"))
    True
    >>> is_user_error(IndexError("list index out of range"))
    False
  """
  if isinstance(exc, UserError):
    return True
  if isinstance(exc, OSError):
    return True
  cls = type(exc)
  if cls.__module__.startswith("tensorflow") and cls.__name__ in _TF_FILE_ERRORS:
    return True
  if isinstance(exc, UnicodeDecodeError):
    return True
  if cls.__name__ == "UsageError" and cls.__module__.startswith("absl"):
    return True
  if cls.__module__.startswith("absl.flags") and isinstance(exc, Exception):
    return True  # absl's flags.Error and its subclasses
  if isinstance(exc, (ValueError, SyntaxError)):
    return _from_validation(exc)
  return False


def one_line(message: str) -> str:
  """A message as one line: gin's "In call to configurable" notes dropped,
  line breaks and runs of spaces made single spaces.

  Example:
    >>> one_line("bad value\\n  In call to configurable 'run' (<function run>)")
    'bad value'
  """
  message = re.sub(r"\n\s*In call to configurable '[^']*' \([^\n]*\)", "", message)
  return re.sub(r"\s+", " ", message).strip()


def describe(exc: BaseException) -> str:
  """The `error:` text of a user error."""
  if isinstance(exc, UnicodeDecodeError):
    return one_line(str(exc))
  if isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
    return f"{exc.filename}: {exc.strerror}"
  cls = type(exc)
  if cls.__module__.startswith("tensorflow") and hasattr(exc, "message"):
    return one_line(f"{cls.__name__}: {exc.message}")
  text = one_line(str(exc)) or cls.__name__
  return re.sub(r"^\[Errno \d+\] ", "", text)


def report_user_error(exc: BaseException, stream=None) -> None:
  """Prints `error: ...` and `hint: ...` for a user error."""
  stream = stream or sys.stderr
  hint = getattr(exc, "hint", None) or DEFAULT_HINT
  print(f"error: {describe(exc)}", file=stream)
  print(f"hint: {hint}", file=stream, flush=True)


def run_module_command(module: str, main: Callable[[List[str]], Optional[int]],
                       argv: Optional[Sequence[str]] = None) -> int:
  """`python -m <module> ARGS`: main(ARGS) through run_main, so a user's
  mistake is one `error:` line and exit status 2; argv defaults to
  sys.argv[1:].

  Example:
    >>> sys.exit(run_module_command("mesh_tensorflow.launch", _main))
  """
  argv = list(sys.argv[1:] if argv is None else argv)
  return run_main(lambda args: main(args[1:]), [f"python -m {module}"] + argv)


def run_main(main: Callable[[List[str]], Optional[int]],
             argv: Optional[Sequence[str]] = None) -> int:
  """Runs main(argv) and returns its exit status; user errors become two
  lines on stderr and status 2 (see the module docstring).

  Args:
    main: the program, main(argv) -> exit status (None means 0). It may also
      raise SystemExit.
    argv: the command line, program name first (default sys.argv); --verbose
      is taken out before main sees it.

  Example:
    >>> sys.exit(run_main(main))
  """
  argv = list(sys.argv if argv is None else argv)
  verbose = verbose_requested(argv)
  try:
    status = main(strip_verbose(argv))
  except KeyboardInterrupt:
    print("interrupted", file=sys.stderr)
    return 130
  except Exception as e:  # pylint: disable=broad-except
    if not is_user_error(e):
      raise
    if verbose:
      traceback.print_exc()
    report_user_error(e)
    return EXIT_USER_ERROR
  return 0 if status is None else int(status)


HELP_ARGS = ("-h", "--help", "--helpshort", "--helpfull", "-?")


def flag_error_message(error: Exception) -> str:
  """absl's parsing error as one line that names the flag as typed (--name)."""
  text = str(error)
  name = getattr(error, "flagname", None)
  if name and type(error).__name__ == "UnrecognizedFlagError":
    suggestion = text.split(". ", 1)[1] if ". Did you mean" in text else ""
    return f"unknown flag --{name}" + (f". {suggestion}" if suggestion else "")
  return text


def parse_flag_values(flag_values, argv: Sequence[str], program: str) -> List[str]:
  """Parses `argv` (program name first) into absl `flag_values`; returns the
  arguments left over. A bad flag raises `UserError` naming it as typed.

  Example:
    >>> rest = parse_flag_values(FLAGS, ["prog", "--quick"], "python -m mesh_tensorflow.check_devices")
  """
  from absl import flags  # pylint: disable=g-import-not-at-top
  try:
    return flag_values(list(argv))
  except flags.Error as e:
    raise UserError(flag_error_message(e), hint=f"{program} --help lists the flags") from None


class FlagParser:
  """A command's flags, parsed by absl (`absl.flags`) into their own
  `FlagValues`, with an `add_argument` / `parse_args` interface: each program
  lists its flags in one place and reads them as attributes of the result.

  `--name=value` and `--name value` both work, booleans also as `--noname`;
  a name without dashes is a positional argument. `--help` prints the flags
  and exits 0; a bad flag raises `UserError` (so `run_main` prints one
  `error:` line and returns 2).

  Example:
    >>> parser = FlagParser(prog="python -m mesh_tensorflow.inspect_checkpoint")
    >>> parser.add_argument("path", help="a model_dir or a checkpoint prefix")
    >>> parser.add_argument("--verify", action="store_true", help="read every slice back")
    >>> args = parser.parse_args(["ckpt-100", "--verify"])
    >>> args.path, args.verify
    ('ckpt-100', True)
  """

  def __init__(self, prog: str, description: str = "", usage: Optional[str] = None):
    self.prog = prog
    self.description = description
    self.usage = usage
    self._flags = []  # (name, kind, default, help)
    self._positionals = []  # (name, help)

  def add_argument(self, name: str, action: Optional[str] = None, default=None,
                   type=None, help: str = "") -> None:  # pylint: disable=redefined-builtin
    """Declares a flag (`--name`) or a positional argument (`name`)."""
    if not name.startswith("-"):
      self._positionals.append((name, help))
      return
    flag = name.lstrip("-")
    if action == "store_true":
      kind, default = "bool", bool(default)
    elif action == "append":
      kind, default = "multi_string", list(default or [])
    elif type is int:
      kind = "integer"
    elif type is float:
      kind = "float"
    else:
      kind = "string"
    self._flags.append((flag, kind, default, help))

  def error(self, message: str) -> None:
    """Reports a mistake in the flags' values as a `UserError`."""
    raise UserError(message, hint=f"{self.prog} --help lists the flags")

  def add_argument_group(self, title: str) -> "FlagParser":
    del title  # one flat list of flags in --help
    return self

  def _flag_values(self):
    from absl import flags  # pylint: disable=g-import-not-at-top
    values = flags.FlagValues()
    define = {"bool": flags.DEFINE_bool, "multi_string": flags.DEFINE_multi_string,
              "integer": flags.DEFINE_integer, "float": flags.DEFINE_float,
              "string": flags.DEFINE_string}
    for flag, kind, default, help_text in self._flags:
      define[kind](flag, default, help_text or flag, flag_values=values)
    return values

  def format_help(self) -> str:
    usage = self.usage or " ".join(
        [self.prog, "[flags]"] + [name.upper() for name, _ in self._positionals])
    lines = [f"usage: {usage}", ""]
    if self.description:
      lines += [self.description.strip(), ""]
    for name, help_text in self._positionals:
      lines.append(f"  {name.upper()}: {help_text}")
    if self._positionals:
      lines.append("")
    lines.append("flags:")
    for flag, kind, default, help_text in self._flags:
      name = f"--[no]{flag}" if kind == "bool" else f"--{flag}"
      shown = ("" if default in (None, [], "", False) or "(default" in help_text
               else f" (default: {default})")
      lines.append(f"  {name}: {help_text}{shown}")
    lines.append(VERBOSE_HELP)
    return "\n".join(lines)

  def parse_args(self, argv: Sequence[str]):
    """Parses `argv` (without the program name); returns a namespace."""
    import types  # pylint: disable=g-import-not-at-top
    argv = list(argv)
    if any(arg in HELP_ARGS for arg in argv):
      print(self.format_help())
      raise SystemExit(0)
    values = self._flag_values()
    rest = parse_flag_values(values, [self.prog] + argv, self.prog)[1:]
    hint = f"{self.prog} --help lists the flags"
    names = [name for name, _ in self._positionals]
    if len(rest) < len(names):
      missing = ", ".join(names[len(rest):])
      raise UserError(f"missing argument: {missing}", hint=hint)
    if len(rest) > len(names):
      raise UserError(f"unexpected argument(s): {' '.join(rest[len(names):])}", hint=hint)
    result = {flag: values[flag].value for flag, _, _, _ in self._flags}
    result.update(zip(names, rest))
    return types.SimpleNamespace(**result)


def run_absl_main(main: Callable[[List[str]], Optional[int]],
                  argv: Optional[Sequence[str]] = None) -> int:
  """`run_main` for a program with absl flags: parses them (a bad flag is a
  user error), then runs main like absl's app.run does.

  Example:
    >>> if __name__ == "__main__":
    ...   sys.exit(run_absl_main(main))
  """
  from absl import app  # pylint: disable=g-import-not-at-top
  from absl import flags  # pylint: disable=g-import-not-at-top

  def parse(args):
    try:
      return flags.FLAGS(args)
    except flags.Error as e:
      raise UserError(str(e), hint="pass --helpfull to list the flags") from None

  def program(args):
    try:
      app.run(main, argv=args, flags_parser=parse)
    except SystemExit as e:
      return e.code
    return 0

  return run_main(program, argv)


GIN_FLAG_HELP = {
    "gin_file": "gin config files, read in order after gin/defaults.gin: paths, or names "
                "under the package's gin directory (models/tiny_lm.gin, layouts/2x4.gin, "
                "learning_rate_schedules/cosine.gin, ...) or under --gin_location_prefix.",
    "gin_param": "gin bindings, e.g. 'run.train_steps = 100'.",
    "gin_location_prefix": "directories to look in for --gin_file names and the files they "
                           "include (comma-separated or repeated), e.g. T5's t5/models/gin.",
}


def define_gin_flags() -> None:
  """Defines the absl flags --gin_file, --gin_param and --gin_location_prefix
  (each repeatable) unless a program has already: the original's
  `mesh_tensorflow.transformer.utils` defined them on import, and programs
  written for it read them from `absl.flags.FLAGS`.

  Example:
    >>> define_gin_flags()
    >>> "gin_file" in flags.FLAGS
    True
  """
  from absl import flags  # pylint: disable=g-import-not-at-top
  for name, help_text in GIN_FLAG_HELP.items():
    if name not in flags.FLAGS:
      flags.DEFINE_multi_string(name, [], help_text)


def parse_own_flags(flag_values, argv: Sequence[str], program: str,
                    about: str = "") -> List[str]:
  """Parses `argv` with a program's own `absl.flags.FlagValues`; `--help`
  prints `about` and the flags and exits 0, a bad flag exits 2 with one
  `error:` line. Returns the arguments left over (program name first).

  Example:
    >>> FLAGS = flags.FlagValues()
    >>> argv = parse_own_flags(FLAGS, sys.argv, "python -m mesh_tensorflow.check_devices")
  """
  argv = list(argv)
  if any(arg in HELP_ARGS for arg in argv[1:]):
    text = (about.strip() + "\n\n") if about.strip() else ""
    print(f"usage: {program} [flags]\n\n{text}flags:\n{flag_values.get_help()}\n{VERBOSE_HELP}")
    sys.exit(0)
  try:
    return parse_flag_values(flag_values, argv, program)
  except UserError as e:
    print(f"error: {e} ({e.hint})", file=sys.stderr)
    sys.exit(EXIT_USER_ERROR)


def require(module: str, program: str, install: str) -> None:
  """Raises a UserError saying what to install if `module` is missing.

  Example:
    >>> require("sklearn", "examples/mnist.py", 'pip install -e ".[examples]"')
  """
  import importlib.util  # pylint: disable=g-import-not-at-top
  if importlib.util.find_spec(module) is None:
    package = {"sklearn": "scikit-learn"}.get(module, module)
    raise UserError(f"{program} needs {package}, which is not installed",
                    hint=f"{install}   (or: pip install {package})")


# ------------------------------------------------------ TensorFlow start-up
_LOG_LINE = re.compile(r"^([IWEF])\d{4} \d\d:\d\d:\d")
_SEVERITY = {"I": 0, "W": 1, "E": 2, "F": 3}
_QUIET_LEVEL = "3"


def started_as_command() -> bool:
  """Whether this process is one of the command-line tools starting: run with
  `python -m mesh_tensorflow...`, or by a program that set MTF_COMMAND_LINE=1
  before importing mesh_tensorflow (the examples do)."""
  if os.environ.get("MTF_COMMAND_LINE"):
    return True
  if sys.argv[:1] == ["-m"]:  # `python -m`, while the package is being found
    return True
  return os.path.basename(sys.argv[0] if sys.argv else "").startswith("mtf-")


def quiet_tensorflow_startup() -> None:
  """Imports TensorFlow without its start-up chatter, for the command-line
  tools.

  Unless the user set TF_CPP_MIN_LOG_LEVEL, it becomes 3 (TensorFlow's C++
  log lines off: the CUDA probe, `failed call to cuInit` on machines without
  a GPU, the CPU feature note). Lines TensorFlow prints while it is imported,
  before its own level applies, are held back and those below the level
  dropped; anything else (a crash, a real error) is printed. Does nothing if
  TensorFlow is already imported.

  Example:
    >>> quiet_tensorflow_startup()   # before the first `import tensorflow`
  """
  if "tensorflow" in sys.modules:
    return
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", _QUIET_LEVEL)
  try:
    level = int(os.environ["TF_CPP_MIN_LOG_LEVEL"])
  except ValueError:
    level = 0
  if level <= 0:
    import tensorflow  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
    return
  import tempfile  # pylint: disable=g-import-not-at-top
  try:
    sys.stderr.flush()
    saved = os.dup(2)
  except (OSError, ValueError):  # no usable stderr descriptor: import as it is
    import tensorflow  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import,redefined-outer-name
    return
  with tempfile.TemporaryFile(mode="w+b") as captured:
    os.dup2(captured.fileno(), 2)
    try:
      import tensorflow  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import,redefined-outer-name
    finally:
      os.dup2(saved, 2)
      os.close(saved)
      captured.seek(0)
      text = captured.read().decode("utf-8", errors="replace")
      kept = _filter_startup_lines(text, level)
      if kept:
        sys.stderr.write(kept)
        sys.stderr.flush()


def _filter_startup_lines(text: str, level: int) -> str:
  kept, dropping = [], False
  for line in text.splitlines(keepends=True):
    match = _LOG_LINE.match(line)
    if match:
      dropping = _SEVERITY[match.group(1)] < level
    elif line.startswith("WARNING: All log messages before absl::InitializeLog()"):
      dropping = level >= 1
    elif not line.startswith((" ", "To enable the following instructions")):
      dropping = False  # A line of its own (not a log line's continuation).
    if not dropping:
      kept.append(line)
  return "".join(kept)
