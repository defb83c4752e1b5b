"""Lazily defined absl flags shared by the experimental modules.

The experimental modules' absl flags are defined on request, not at
import. Several of their names (`mesh_shape`, `layout`, `ct_resolution`, ...) are
common, so defining them at import would clash with any other program or
example that defines the same names in the same process. Here each module
lists its flags; `define(specs)` defines the ones no other module has
defined yet (a program's `main` or a test calls it), and `value(specs, name)`
reads a flag: its parsed or assigned value when this package defined it, its
listed default otherwise (so the functions work in a library that never
parses flags).
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, NamedTuple

from absl import flags

FLAGS = flags.FLAGS

_DEFINED_HERE = set()


class FlagSpec(NamedTuple):
  kind: str      # "string", "integer", "float" or "boolean"
  default: Any
  help: str


def define(specs: Dict[str, FlagSpec], flag_values: flags.FlagValues = FLAGS) -> List[str]:
  """Defines every flag of `specs` that `flag_values` does not have yet;
  returns the names it defined."""
  definers = {"string": flags.DEFINE_string, "integer": flags.DEFINE_integer,
              "float": flags.DEFINE_float, "boolean": flags.DEFINE_boolean}
  defined = []
  for name, spec in specs.items():
    if name in flag_values:
      continue
    definers[spec.kind](name, spec.default, spec.help, flag_values=flag_values)
    defined.append(name)
    if flag_values is FLAGS:
      _DEFINED_HERE.add(name)
  return defined


def forget(names: Iterable[str]) -> None:
  """Removes flags that `define` defined (so a test leaves the process's
  flags as it found them, free for programs that define the same names)."""
  for name in names:
    if name in _DEFINED_HERE and name in FLAGS:
      delattr(FLAGS, name)
    _DEFINED_HERE.discard(name)


def value(specs: Dict[str, FlagSpec], name: str) -> Any:
  """The flag's current value (its default when this package has not defined it)."""
  if name in _DEFINED_HERE and name in FLAGS:
    return FLAGS[name].value
  return specs[name].default
