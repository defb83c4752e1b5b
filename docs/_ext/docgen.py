"""Writes the documentation's tables that come from the code.

    python docs/_ext/docgen.py            # rewrite them
    python docs/_ext/docgen.py --check    # exit 1 if any is out of date

Generated from the code, so they cannot go stale (tests/project/test_docs_site.py
regenerates them in memory and compares):

* docs/reference/commands.md: the flags of every command, read from the
  absl flag definitions (`--help` prints the same);
* docs/reference/run_parameters.md: the parameters of the transformer's
  `run` (`run_config.RunConfig`, the `run.*` gin bindings) with their
  defaults, the values `gin/defaults.gin` gives them, and their docstring;
* the coverage table of docs/original_api.md, from
  tests/data/original_public_names.json and the lists of names not yet
  provided in tests/compat/test_original_public_names.py;
* the requirements line of docs/support.md, from setup.py;
* the module list of every API reference page (docs/reference/api/*.md):
  every public module of the folders the page covers (`API_PAGES`), so a
  module added or moved is documented where it now lives.

A table inside a page sits between `<!-- generated: NAME -->` and
`<!-- end generated: NAME -->`; the rest of that page is ordinary prose.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import json
import pathlib
import re
import sys
import tempfile
from typing import Callable, Dict, List, Optional, Tuple

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

# The package's commands: (command line, the module that defines its flags,
# how they are found).
# "absl" modules define their flags in absl's global FLAGS when imported;
# "flag_values" modules keep them in their own module-level FlagValues
# (FLAGS); "parser" modules build a mesh_tensorflow.cli.FlagParser in _main.
COMMANDS: List[Tuple[str, str, str]] = [
    ("python -m mesh_tensorflow.transformer.main", "mesh_tensorflow.transformer.main", "absl"),
    ("python -m mesh_tensorflow.check_devices", "mesh_tensorflow.check_devices", "flag_values"),
    ("python -m mesh_tensorflow.report", "mesh_tensorflow.transformer.report", "parser"),
    ("python -m mesh_tensorflow.launch", "mesh_tensorflow.distributed.launch", "parser"),
    ("python -m mesh_tensorflow.inspect_checkpoint", "mesh_tensorflow.inspect_checkpoint",
     "parser"),
    ("python -m mesh_tensorflow.export_original_checkpoint",
     "mesh_tensorflow.export_original_checkpoint", "flag_values"),
    ("python -m mesh_tensorflow.analysis.cost_model",
     "mesh_tensorflow.analysis.cost_model.calibration", "parser"),
    ("python -m mesh_tensorflow.plan", "mesh_tensorflow.plan", "parser"),
]


# API reference page -> (the folders it documents, the modules it shows
# first, in reading order). Every other public module of those folders
# follows in alphabetical order. A module is public when no part of its name
# starts with "_"; a folder face (__init__) is shown only where listed first
# (most only re-export).
API_PAGES: Dict[str, Tuple[Tuple[str, ...], Tuple[str, ...]]] = {
    "core": (("core", "cli"), ("core.shapes", "core.layout", "core.graph")),
    "ops": (("operations",), ("operations.constant_ops", "operations.elementwise",
                              "operations.einsum_ops", "operations.reduction",
                              "operations.shape_ops", "operations.slicing",
                              "operations.indexing")),
    "lowering": (("lowering",), ("lowering.lowering", "lowering.mesh_impl",
                                 "lowering.placement_mesh_impl", "lowering.simd_mesh_impl",
                                 "lowering.plans", "lowering.observers")),
    "layers": (("layers",), ("layers.core", "layers.attention")),
    "training": (("training",), ("training.trainer", "training.optimize",
                                 "training.checkpoint")),
    "analysis": (("analysis", "auto_mtf"), ("analysis.cost_model",
                                            "analysis.cost_model.params")),
    "distributed": (("distributed",), ("distributed.cluster", "distributed.launch")),
    "transformer": (("transformer",), ("transformer.transformer", "transformer.layer_stack",
                                       "transformer.transformer_layers")),
    "bert": (("bert",), ("bert.bert", "bert.optimization", "bert.tokenization")),
    "experimental": (("experimental",), ("experimental.unet",)),
    "compat": (("compat",), ()),
    "testing": (("testing",), ()),
}
# The commands (`python -m mesh_tensorflow.NAME` files at the package's top)
# are documented by their flags in docs/reference/commands.md.


def _public_modules(folder: str) -> List[Tuple[str, bool]]:
  """(module name relative to the package, is a folder face) of the public
  modules under `folder`, sorted."""
  base = ROOT / "mesh_tensorflow" / folder.replace(".", "/")
  names = []
  paths = [base.with_suffix(".py")] if base.with_suffix(".py").exists() else base.rglob("*.py")
  for path in paths:
    rel = path.relative_to(ROOT / "mesh_tensorflow").with_suffix("")
    face = rel.name == "__init__"
    parts = rel.parts[:-1] if face else rel.parts
    if not parts or any(part.startswith("_") for part in parts):
      continue
    names.append((".".join(parts), face))
  return sorted(names)


def api_modules(page: str) -> List[str]:
  """The modules `docs/reference/api/<page>.md` documents, in page order."""
  folders, first = API_PAGES[page]
  every = [m for folder in folders for m in _public_modules(folder)]
  missing = [m for m in first if m not in {name for name, _ in every}]
  if missing:
    raise ValueError(f"API_PAGES[{page!r}] names modules that do not exist: {missing}")
  return list(first) + [name for name, face in every if not face and name not in first]


def api_module_list(page: str) -> str:
  """The autodoc block of one API page. Compatibility modules re-export the
  library's classes under the original's names: only what they define
  themselves is shown (`:ignore-module-all:`), the rest has its own page."""
  lines = ["```{eval-rst}"]
  for module in api_modules(page):
    lines += [f".. automodule:: mesh_tensorflow.{module}"]
    if page == "compat":
      lines += ["   :ignore-module-all:"]
    lines += [""]
  return "\n".join(lines[:-1] + ["```"])


# ----------------------------------------------------------------- helpers
def _cell(text: str) -> str:
  """Text for one cell of a Markdown table."""
  return " ".join(str(text).split()).replace("|", "\\|")


def _code(text: str) -> str:
  text = str(text)
  fence = "``" if "`" in text else "`"
  pad = " " if "`" in text else ""
  return f"{fence}{pad}{text}{pad}{fence}".replace("|", "\\|")


def _default(value) -> str:
  """How a default value is shown: machine-independent, as Python would write it."""
  if value is None or value == []:
    return "none"
  if isinstance(value, str):
    tmp = tempfile.gettempdir()
    if value.startswith(tmp):
      value = "<temp dir>" + value[len(tmp):]
    return _code(repr(value))
  if callable(value):
    module = getattr(value, "__module__", "") or ""
    name = getattr(value, "__qualname__", getattr(value, "__name__", repr(value)))
    return _code(f"{module.rsplit('.', 1)[-1]}.{name}" if module else name)
  if isinstance(value, bool):
    return _code(str(value))
  return _code(repr(value))


def _replace_between(text: str, name: str, body: str) -> str:
  begin, end = f"<!-- generated: {name} -->", f"<!-- end generated: {name} -->"
  if begin not in text or end not in text:
    raise ValueError(f"the page has no {begin} ... {end} section")
  head, rest = text.split(begin, 1)
  _, tail = rest.split(end, 1)
  return f"{head}{begin}\n{body.strip()}\n{end}{tail}"


# ----------------------------------------------------------------- commands
class _Captured(Exception):
  """Carries the FlagParser a command built, instead of parsing."""

  def __init__(self, parser):
    super().__init__("captured")
    self.parser = parser


def _parser_of(module) -> "object":
  """The cli.FlagParser that `module._main` builds, without running it."""
  from mesh_tensorflow import cli  # pylint: disable=g-import-not-at-top
  original = cli.FlagParser.parse_args

  def capture(self, argv):
    del argv
    raise _Captured(self)

  cli.FlagParser.parse_args = capture
  try:
    module._main([])  # pylint: disable=protected-access
  except _Captured as captured:
    return captured.parser
  finally:
    cli.FlagParser.parse_args = original
  raise RuntimeError(f"{module.__name__}._main parsed no flags")


def _flag_rows(flag_values, names: Optional[List[str]] = None) -> List[str]:
  rows = []
  for name in sorted(names if names is not None else flag_values):
    flag = flag_values[name]
    kind = flag.flag_type()
    enum_values = getattr(flag.parser, "enum_values", None)
    help_text = flag.help
    if enum_values:
      kind = " | ".join(enum_values)
      help_text = re.sub(r"^<[^>]*>: ", "", help_text)
    help_text = re.sub(r"\.?;\s*repeat this option to specify a list of values", "", help_text)
    if kind in ("multi_string", "multi string"):
      kind = "string, repeatable"
    shown = f"--[no]{name}" if kind == "bool" else f"--{name}"
    rows.append(f"| `{shown}` | {_cell(kind)} | {_default(flag.default)} | {_cell(help_text)} |")
  return rows


def cli_gin_flags() -> List[str]:
  from mesh_tensorflow import cli  # pylint: disable=g-import-not-at-top
  return list(cli.GIN_FLAG_HELP)


def _first_paragraph(doc: Optional[str]) -> str:
  return " ".join((doc or "").strip().split("\n\n")[0].split())


def _command_section(command: str, module_name: str, kind: str) -> str:
  from absl import flags  # pylint: disable=g-import-not-at-top
  module = importlib.import_module(module_name)
  lines = [f"## `{command}`", ""]
  positionals: List[Tuple[str, str]] = []
  if kind == "absl":
    values = flags.FLAGS
    names = [f.name for f in values.get_flags_for_module(module_name)]
    if "define_gin_flags()" in inspect.getsource(module):  # defined in cli for it
      names = sorted(set(names) | {name for name in cli_gin_flags() if name in values})
    about = _first_paragraph(module.__doc__)
  elif kind == "flag_values":
    values = module.FLAGS
    names = list(values)
    about = _first_paragraph(module.__doc__)
  else:
    parser = _parser_of(module)
    values = parser._flag_values()  # pylint: disable=protected-access
    names = list(values)
    positionals = parser._positionals  # pylint: disable=protected-access
    about = " ".join(parser.description.split())
    if parser.usage:
      lines += ["```shell", parser.usage, "```", ""]
  lines += [about, ""]
  for name, help_text in positionals:
    lines.append(f"Argument `{name.upper()}`: {_cell(help_text)}.")
    lines.append("")
  lines += ["| flag | type | default | meaning |", "|---|---|---|---|"]
  lines += _flag_rows(values, names)
  return "\n".join(lines) + "\n"


def commands_page() -> str:
  """docs/reference/commands.md."""
  parts = ['''# Command-line reference

<!-- Generated by docs/_ext/docgen.py from the commands' flag definitions; do not edit. -->

Every command of the package, with its flags as `--help` prints them. Flags
take `--name=value` or `--name value`; a boolean flag is `--name` or
`--noname`. Every command also accepts `--verbose` (or `MTF_VERBOSE=1`),
which adds the traceback to an error, and absl's `--helpfull`, which lists
the flags of absl itself too. A mistake prints one `error:` line and exits
with status 2 ([errors](../errors.md)).
''']
  for command, module, kind in COMMANDS:
    parts.append(_command_section(command, module, kind))
  return "\n".join(parts)


# ------------------------------------------------------------- run parameters
def _arg_docs(doc: str) -> Tuple[Dict[str, str], str]:
  """({parameter: text}, the section's own paragraphs) from a Google-style
  Args: or Attributes: section (parameters indented 4 spaces, paragraphs 2)."""
  out: Dict[str, str] = {}
  notes: List[str] = []
  current = None
  in_args = False
  for line in doc.splitlines():
    if line.strip() in ("Args:", "Attributes:"):
      in_args = True
      continue
    if not in_args:
      continue
    if line.strip() in ("Returns:", "Raises:", "Example:"):
      break
    m = re.match(r"^    (\w+): ?(.*)$", line)
    if m:
      current = m.group(1)
      out[current] = m.group(2).strip()
    elif current and line.startswith("      ") and line.strip():
      out[current] += " " + line.strip()
    else:
      current = None
      if line.startswith("  ") and not line.startswith("   "):
        notes.append(line.strip())
  return out, " ".join(notes)


def _gin_defaults(path: pathlib.Path, configurable: str) -> Dict[str, str]:
  """{parameter: value text} of `configurable.parameter = value` lines."""
  out: Dict[str, str] = {}
  lines = path.read_text().splitlines()
  i = 0
  while i < len(lines):
    m = re.match(rf"^{re.escape(configurable)}\.(\w+)\s*=\s*(.*)$", lines[i])
    i += 1
    if not m:
      continue
    value = m.group(2).split(" #")[0].strip()
    while value.count("[") + value.count("{") > value.count("]") + value.count("}"):
      value += " " + lines[i].split(" #")[0].strip()
      i += 1
    out[m.group(1)] = value
  return out


def run_parameters_page() -> str:
  """docs/reference/run_parameters.md."""
  from mesh_tensorflow.transformer import run_config  # pylint: disable=g-import-not-at-top
  config = run_config.RunConfig
  docs, note = _arg_docs(config.__doc__ or "")
  gin_values = _gin_defaults(ROOT / "mesh_tensorflow" / "transformer" / "gin" / "defaults.gin",
                             "run")
  ignored = config.ignored_parameters()
  rows = []
  for field in dataclasses.fields(config):
    name = field.name
    if name in ignored:
      continue
    default = ("required" if field.default is dataclasses.MISSING
               else _default(field.default))
    in_gin = _code(gin_values[name]) if name in gin_values else ""
    rows.append(f"| `{name}` | {default} | {in_gin} | {_cell(docs[name])} |")
  missing = sorted(set(gin_values) - {f.name for f in dataclasses.fields(config)})
  if missing:
    raise ValueError(f"defaults.gin binds run parameters that do not exist: {missing}")
  return "\n".join([
      "# `run.*` gin parameters",
      "",
      "<!-- Generated by docs/_ext/docgen.py from transformer/run_config.py's RunConfig; "
      "do not edit. -->",
      "",
      "`python -m mesh_tensorflow.transformer.main` calls "
      "`mesh_tensorflow.transformer.application.run`, whose settings are a "
      "`run_config.RunConfig`, configured by gin: "
      "`--gin_param=\"run.train_steps = 500\"` (or `utils.run.train_steps`, the "
      "original's spelling) sets its `train_steps`. The command's flags "
      "(`--model_dir`, `--mode`, `--input_file`, ...) override the parameters "
      "of the same name. *Default* is the default, *defaults.gin* "
      "the value that `mesh_tensorflow/transformer/gin/defaults.gin`, read "
      "before every `--gin_file`, gives it.",
      "",
      "| parameter | default | defaults.gin | meaning |",
      "|---|---|---|---|",
      *rows,
      "",
      note,
      "",
      "The original's parameters accepted and ignored with one warning that lists them:",
      "",
      "| parameter | why |",
      "|---|---|",
      *[f"| `{name}` | {_cell(reason)} |" for name, reason in ignored.items()],
      "",
  ])


# ------------------------------------------------------- original's names
def _not_yet_lists() -> Tuple[Dict[str, set], set]:
  source = (ROOT / "tests" / "compat" / "test_original_public_names.py").read_text()
  not_yet, not_yet_modules = {}, set()
  for node in ast.parse(source).body:
    target = None
    if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
      target = node.targets[0].id
    elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
      target = node.target.id
    if target not in ("NOT_YET", "NOT_YET_MODULES"):
      continue
    value = node.value
    if isinstance(value, ast.Call) and getattr(value.func, "id", "") == "set":
      parsed = set(ast.literal_eval(value.args[0])) if value.args else set()
    else:
      parsed = ast.literal_eval(value)
    if target == "NOT_YET":
      not_yet = {k: set(v) for k, v in parsed.items()}
    else:
      not_yet_modules = set(parsed)
  return not_yet, not_yet_modules


def original_names_table() -> str:
  """The coverage table of docs/original_api.md."""
  with open(ROOT / "tests" / "data" / "original_public_names.json", encoding="utf-8") as f:
    original = json.load(f)
  not_yet, not_yet_modules = _not_yet_lists()
  groups: Dict[str, List[str]] = {}
  for module in sorted(original):
    group = module
    for package in ("auto_mtf", "transformer", "bert", "experimental"):
      if module == f"mesh_tensorflow.{package}" or module.startswith(f"mesh_tensorflow.{package}."):
        group = f"mesh_tensorflow.{package}"
    groups.setdefault(group, []).append(module)
  rows = ["| module | modules | original names | provided | missing |",
          "|---|---:|---:|---:|---:|"]
  total = provided_total = 0
  order = sorted(groups, key=lambda g: (g.count(".") and g.split(".")[1] in (
      "auto_mtf", "transformer", "bert", "experimental"), g != "mesh_tensorflow", g))
  for group in order:
    modules = groups[group]
    names = sum(len(original[m]) for m in modules)
    missing = sum(len(original[m]) if m in not_yet_modules else len(not_yet.get(m, ()))
                  for m in modules)
    label = f"`{group}`" if len(modules) == 1 else f"`{group}` and its submodules"
    rows.append(f"| {label} | {len(modules)} | {names} | {names - missing} | {missing} |")
    total += names
    provided_total += names - missing
  rows.append(f"| all | {len(original)} | {total} | {provided_total} | "
              f"{total - provided_total} |")
  return "\n".join(rows)


# ------------------------------------------------------------ requirements
def requirements_line() -> str:
  """What setup.py requires of Python and TensorFlow, for docs/support.md
  (its module-level TENSORFLOW and PYTHON_VERSIONS, which setup() uses)."""
  constants = {}
  for node in ast.parse((ROOT / "setup.py").read_text()).body:
    if isinstance(node, ast.Assign) and len(node.targets) == 1:
      name = getattr(node.targets[0], "id", "")
      if name in ("TENSORFLOW", "PYTHON_VERSIONS"):
        constants[name] = ast.literal_eval(node.value)
  versions = constants["PYTHON_VERSIONS"]
  return (f"setup.py declares Python {versions[0]} to {versions[-1]} (`python_requires`) and "
          f"`tensorflow{constants['TENSORFLOW']}` (through the extras `tensorflow` and "
          "`tensorflow-cpu`; an installed TensorFlow is used as it is).")


# ------------------------------------------------------------------ the files
def generated_files() -> Dict[pathlib.Path, str]:
  """{path: the full text the file should have}."""
  out = {
      DOCS / "reference" / "commands.md": commands_page(),
      DOCS / "reference" / "run_parameters.md": run_parameters_page(),
  }
  api = DOCS / "original_api.md"
  out[api] = _replace_between(api.read_text(), "original-names", original_names_table())
  documented = {m for page in API_PAGES for m in api_modules(page)}
  commands = {module.split(".", 1)[1] for _, module, _ in COMMANDS} | {
      line.split(".", 1)[1] for line in ("mesh_tensorflow.report", "mesh_tensorflow.launch")}
  undocumented = [name for name, face in _public_modules("")
                  if not face and name not in documented and name not in commands]
  if undocumented:
    raise ValueError(f"modules on no API page: {undocumented}; add their folder to API_PAGES")
  for page in API_PAGES:
    path = DOCS / "reference" / "api" / f"{page}.md"
    out[path] = _replace_between(path.read_text(), "modules", api_module_list(page))
  support = DOCS / "support.md"
  out[support] = _replace_between(support.read_text(), "requirements", requirements_line())
  return out


def main(argv: List[str], write: Callable[[str], object] = print) -> int:
  stale = []
  for path, text in generated_files().items():
    if path.exists() and path.read_text() == text:
      continue
    stale.append(path.relative_to(ROOT))
    if "--check" not in argv:
      path.parent.mkdir(parents=True, exist_ok=True)
      path.write_text(text)
  if "--check" in argv and stale:
    write(f"out of date: {', '.join(map(str, stale))}; run python docs/_ext/docgen.py")
    return 1
  write(f"{'wrote' if stale else 'up to date:'} {', '.join(map(str, stale)) or 'all'}")
  return 0


if __name__ == "__main__":
  sys.path.insert(0, str(ROOT))
  sys.exit(main(sys.argv[1:]))
