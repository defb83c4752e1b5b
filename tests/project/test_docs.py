"""The documentation (README.md and docs/*.md) stays true to the code.

Every code block is checked by what it is: Python blocks compile, command
lines name modules, scripts and absl flags that exist, and gin blocks parse
with the transformer's configurables. The README's first Python block (the
quickstart) is run by tests/project/test_readme.py. Links between pages must resolve,
and the pages carry no run history (dates, session numbers) and no path
outside the repository.
"""

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))

_BLOCK = re.compile(r"^(?P<indent> *)```(?P<lang>[\w-]*)\n(?P<body>.*?)^(?P=indent)```", re.M | re.S)
# absl's own flags, accepted by every entry point.
_ABSL_FLAGS = {"helpfull", "helpshort", "help", "verbosity", "v", "logtostderr",
               "alsologtostderr", "log_dir", "flagfile"}


def _blocks(page):
  text = page.read_text()
  for m in _BLOCK.finditer(text):
    indent = len(m.group("indent"))
    body = "\n".join(line[indent:] for line in m.group("body").splitlines())
    yield m.group("lang"), body, text[:m.start()].count("\n") + 1


def _ids(items):
  return [f"{p.relative_to(ROOT)}:{line}" for p, _, _, line in items]


def _all_blocks(kinds):
  out = []
  for page in PAGES:
    for lang, body, line in _blocks(page):
      kind = _kind(lang, body)
      if kind in kinds:
        out.append((page, kind, body, line))
  return out


def _kind(lang, body):
  if lang == "python":
    return "python"
  if lang in ("bash", "sh", "shell", "console"):
    return "shell"
  if lang == "gin" or (not lang and re.search(r"^\s*[\w.]+\s*=", body, re.M)):
    return "gin"
  return "other"


def test_pages_have_code_blocks_of_known_kinds():
  unknown = [(p, line) for p, kind, _, line in _all_blocks({"other"})]
  assert not unknown, f"code blocks of no known kind (give them a language): {unknown}"


PY_BLOCKS = _all_blocks({"python"})


@pytest.mark.parametrize("page,kind,body,line", PY_BLOCKS, ids=_ids(PY_BLOCKS))
def test_python_blocks_compile(page, kind, body, line):
  del kind
  # `...` stands for the user's own code in a few blocks: still valid Python.
  ast.parse(body, filename=f"{page.name}:{line}")


def _commands(body):
  joined = re.sub(r"\\\n\s*", " ", body)
  for raw in joined.splitlines():
    command = raw.split(" #")[0].strip()
    for part in re.split(r"&&|;", command):
      part = part.strip()
      if part.startswith("python "):
        yield part


def _flag_names(source):
  return set(re.findall(r"DEFINE_\w+\(\s*[\"'](\w+)[\"']", source))


SHELL_BLOCKS = _all_blocks({"shell"})


@pytest.mark.parametrize("page,kind,body,line", SHELL_BLOCKS, ids=_ids(SHELL_BLOCKS))
def test_commands_name_existing_modules_and_flags(page, kind, body, line):
  del kind
  for command in _commands(body):
    words = command.split()
    if words[1] == "-m":
      if words[2] == "pip":
        continue
      module = words[2]
      path = ROOT / pathlib.Path(*module.split("."))
      source_file = path.with_suffix(".py")
      if not source_file.exists():
        source_file = path / "__main__.py"
      args = words[3:]
    else:
      source_file = ROOT / words[1]
      args = words[2:]
    where = f"{page.name}:{line}: {command!r}"
    assert source_file.exists(), f"{where}: no {source_file.relative_to(ROOT)}"
    source = source_file.read_text()
    defined = _flag_names(source)
    # Flags defined in modules the entry point imports from the package.
    for imported in re.findall(r"from mesh_tensorflow(?:\.(\w+(?:\.\w+)*))? import (\w+)", source):
      for candidate in (".".join(filter(None, imported)), imported[0] or ""):
        f = ROOT / "mesh_tensorflow" / pathlib.Path(*candidate.split("."))
        for file in (f.with_suffix(".py"), f / "__init__.py"):
          if candidate and file.exists():
            defined |= _flag_names(file.read_text())
    for arg in args:
      m = re.match(r"--(\w+)", arg)
      if m and "DEFINE_" in source:
        name = m.group(1)
        negated = name.startswith("no") and name[2:] in defined  # absl's --noflag
        assert name in defined or name in _ABSL_FLAGS or negated, (
            f"{where}: flag --{name} is not defined by {source_file.relative_to(ROOT)}")


GIN_BLOCKS = _all_blocks({"gin"})


@pytest.mark.parametrize("page,kind,body,line", GIN_BLOCKS, ids=_ids(GIN_BLOCKS))
def test_gin_blocks_parse(page, kind, body, line):
  del kind
  import gin  # pylint: disable=g-import-not-at-top
  from mesh_tensorflow.transformer import gin_config  # pylint: disable=g-import-not-at-top
  gin_config.register_configurables()
  gin.clear_config()
  try:
    # Blocks show alternatives one after another: a later binding of the same
    # parameter is fine in gin.
    gin.parse_config(body)
  except Exception as e:  # pylint: disable=broad-except
    pytest.fail(f"{page.name}:{line}: gin block does not parse: {e}")
  finally:
    gin.clear_config()


def test_links_between_pages_resolve():
  broken = []
  for page in PAGES:
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
      if re.match(r"\w+://", target):
        continue
      if not (page.parent / target).exists():
        broken.append(f"{page.relative_to(ROOT)} -> {target}")
  assert not broken, broken


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_pages_carry_no_run_history_or_outside_paths(page):
  text = page.read_text()
  for pattern in (r"\b20\d\d-[01]\d-[0-3]\d\b", r"\bstop \d+\b", r"previous head",
                  r"same hour", r"\.\./shared", r"/work/"):
    found = re.search(pattern, text)
    assert not found, f"{page.relative_to(ROOT)}: {found.group(0)!r} (history belongs in CHANGELOG.md)"


def test_readme_is_an_entry_point():
  lines = (ROOT / "README.md").read_text().splitlines()
  assert len(lines) <= 250, f"README.md has {len(lines)} lines; move subjects to docs/"
  for page in sorted((ROOT / "docs").glob("*.md")):
    assert f"docs/{page.name}" in "\n".join(lines), f"README.md does not link docs/{page.name}"
