"""absl flag helpers shared by the BERT programs.

The BERT modules define overlapping flags (each program has its own
`--bert_config_file`, `--mesh_shape`, ...), as the original's did. Here a
flag that is already defined is left as it is, so the modules can be imported
together (e.g. run_classifier and run_squad in one process).
"""

from __future__ import annotations

from typing import Any

from absl import flags

FLAGS = flags.FLAGS


def define(kind: str, name: str, default: Any, help_text: str, **kwargs) -> None:
  """flags.DEFINE_<kind>(name, default, help_text) unless `name` exists.

  Example:
    >>> define("string", "vocab_file", None, "The vocabulary file.")
  """
  if name in FLAGS:
    return
  getattr(flags, f"DEFINE_{kind}")(name, default, help_text, **kwargs)


def value(name: str, default: Any = None) -> Any:
  """The flag's value, or its default before the command line is parsed (or
  `default` if no such flag exists), so library calls work without
  `app.run`.

  Example:
    >>> value("preserve_unused_tokens", False)
    False
  """
  if name not in FLAGS:
    return default
  if FLAGS.is_parsed():
    return getattr(FLAGS, name)
  return FLAGS[name].default
