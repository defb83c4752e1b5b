"""What mesh_tensorflow needs from its environment, said in one line.

`check_tensorflow()` runs first when the package is imported: TensorFlow is
not a hard requirement of the package (any of tensorflow, tensorflow-cpu,
tf-nightly or a GPU build provides it, and pip cannot tell them apart), so
the import says in one line, with the command that fixes it, when none is
importable or the one found is older than the tested range.

`require_optional(...)` is the same for the optional pieces (TensorBoard,
matplotlib, SentencePiece, TensorFlow Datasets): one `MissingOptionalPackage`
line naming the extra to install, which the command-line tools print as
their `error:` line.

    >>> from mesh_tensorflow import _environment
    >>> _environment.TESTED_TENSORFLOW
    ((2, 16), (2, 21))

This module imports nothing heavy: it runs before TensorFlow is imported.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from typing import Optional, Tuple

from mesh_tensorflow import cli

# The TensorFlow releases (major, minor) that oss_scripts/version_matrix.py
# passes on; setup.py's `tensorflow` extra says the same.
TESTED_TENSORFLOW: Tuple[Tuple[int, int], Tuple[int, int]] = ((2, 16), (2, 21))
DISTRIBUTION = "mesh-tensorflow"
INSTALL_TENSORFLOW = f'pip install "{DISTRIBUTION}[tensorflow]"'


def tested_range_text() -> str:
  """'2.16 to 2.21'."""
  (lo_major, lo_minor), (hi_major, hi_minor) = TESTED_TENSORFLOW
  return f"{lo_major}.{lo_minor} to {hi_major}.{hi_minor}"


def install_command(extra: str) -> str:
  """The pip command that installs one of the package's extras.

  Example:
    >>> install_command("sentencepiece")
    'pip install "mesh-tensorflow[sentencepiece]"'
  """
  return f'pip install "{DISTRIBUTION}[{extra}]"'


def parse_version(text: str) -> Optional[Tuple[int, int]]:
  """(major, minor) of a TensorFlow version string, None if it has none.

  Example:
    >>> parse_version("2.23.0-dev20261026")
    (2, 23)
  """
  match = re.match(r"\s*(\d+)\.(\d+)", str(text))
  return (int(match.group(1)), int(match.group(2))) if match else None


class TensorFlowUnavailable(ImportError):
  """No usable TensorFlow: none installed, one that fails to import, or one
  older than the tested range. The message is one line that ends with the
  command to fix it."""


def tensorflow_problem(version: Optional[str], import_error: Optional[BaseException] = None,
                       installed: bool = True) -> Tuple[Optional[str], Optional[str]]:
  """(error, warning): the one line to fail with, or the one line to print,
  for a TensorFlow of `version` (both None when it is in the tested range).

  Example:
    >>> tensorflow_problem("2.10.1")[0].startswith("mesh_tensorflow needs TensorFlow 2.16 to 2.21")
    True
  """
  wanted = f"mesh_tensorflow needs TensorFlow {tested_range_text()}"
  if not installed:
    return (f"{wanted} and none is installed; install it with: {INSTALL_TENSORFLOW} "
            f"(or install tensorflow-cpu or a GPU build of TensorFlow first)"), None
  if import_error is not None:
    reason = cli.one_line(str(import_error)) or type(import_error).__name__
    return (f"{wanted}; the installed TensorFlow fails to import ({reason}); reinstall a "
            f"tested release with: {INSTALL_TENSORFLOW}"), None
  parsed = parse_version(version) if version is not None else None
  if parsed is None:
    return (f"{wanted}; the installed `tensorflow` module has no version "
            f"({version!r}), so it is not TensorFlow; install it with: {INSTALL_TENSORFLOW}"), None
  low, high = TESTED_TENSORFLOW
  if parsed < low:
    return (f"{wanted}, found {version}; upgrade it with: "
            f'pip install --upgrade "{DISTRIBUTION}[tensorflow]" '
            f"(or upgrade the TensorFlow build you use)"), None
  if parsed > high:
    return None, (f"mesh_tensorflow: TensorFlow {version} is newer than the releases it is "
                  f"tested with ({tested_range_text()}); if something fails, "
                  f"{INSTALL_TENSORFLOW} installs a tested one")
  return None, None


def check_tensorflow() -> None:
  """Imports TensorFlow (quietly for the command-line tools) and checks its
  version. For a command (`python -m mesh_tensorflow...`, `mtf-...`) a
  problem is one `error:` line and exit status 2; for a program importing
  the package it is a `TensorFlowUnavailable` (an ImportError) whose message
  is that line. A TensorFlow newer than the tested range prints one line and
  is used.

  Example:
    >>> check_tensorflow()   # nothing happens with a tested TensorFlow
  """
  command = cli.started_as_command()
  installed = importlib.util.find_spec("tensorflow") is not None if (
      "tensorflow" not in sys.modules) else True
  version, import_error = None, None
  if installed:
    try:
      if command:
        cli.quiet_tensorflow_startup()
      tf = importlib.import_module("tensorflow")
      version = getattr(tf, "__version__", None)
    except ImportError as e:
      import_error = e
  error, warning = tensorflow_problem(version, import_error, installed)
  if warning:
    print(warning, file=sys.stderr, flush=True)
  if error is None:
    return
  if command and not cli.verbose_requested(sys.argv):
    print(f"error: {error}", file=sys.stderr, flush=True)
    raise SystemExit(cli.EXIT_USER_ERROR)
  raise TensorFlowUnavailable(error) from import_error


class MissingOptionalPackage(cli.UserError, ImportError):
  """An optional package that a feature needs is not installed; the message
  is one line naming the package and the extra that installs it (the
  command-line tools print it as their `error:` line)."""


def require_optional(module: str, feature: str, extra: str,
                     alternative: Optional[str] = None):
  """Imports and returns optional `module`, or raises MissingOptionalPackage
  saying that `feature` needs it and which extra installs it.

  Args:
    module: the module to import, e.g. "sentencepiece".
    feature: what needs it, e.g. "SentencePieceVocabulary".
    extra: the extra of this package that installs it, e.g. "sentencepiece".
    alternative: what to do instead, if anything (one clause).

  Example:
    >>> sentencepiece = require_optional("sentencepiece", "SentencePieceVocabulary",
    ...                                  "sentencepiece")
  """
  top = module.split(".")[0]
  try:
    return importlib.import_module(module)
  except ModuleNotFoundError as e:
    if e.name not in (top, module):
      raise  # the package is there, one of its own dependencies is missing
    package = _PACKAGE_OF_MODULE.get(top, top)
    raise MissingOptionalPackage(
        f"{feature} needs {package}, which is not installed; install it with: "
        f"{install_command(extra)} (or: pip install {package})",
        hint=alternative or "--verbose shows where it is needed") from None


_PACKAGE_OF_MODULE = {"tensorflow_datasets": "tensorflow-datasets", "sklearn": "scikit-learn"}

_warned_once = set()


def tensorboard_available(writing_to: str) -> bool:
  """Whether TensorBoard is installed, which tf.summary.scalar needs; if it
  is not, prints once (per place) one line saying that summaries are not
  written and how to install it.

  Example:
    >>> if tensorboard_available("the model directory"):
    ...   tf.summary.scalar("loss", 1.0, step=0)
  """
  if importlib.util.find_spec("tensorboard") is not None:
    return True
  if writing_to not in _warned_once:
    _warned_once.add(writing_to)
    print(f"warning: TensorBoard is not installed, so no summaries are written to "
          f"{writing_to}; install it with: {install_command('tensorboard')}",
          file=sys.stderr, flush=True)
  return False
