"""The documentation (README.md and docs/*.md) stays true to the code.

Every code block is checked by what it is: Python blocks compile, command
lines name modules, scripts and absl flags that exist, and gin blocks parse
with the transformer's configurables. The README's first Python block (the
quickstart) is run by tests/project/test_readme.py. Links between pages must
resolve, docs/index.md reaches every page, and the pages read as user
documentation: no run history (dates, run and issue numbers, before/after),
no lab notes (load averages, "by hand", targets, remarks about the machine or
CI) and no path outside the repository. tests/project/test_docs_site.py
builds the Sphinx site and checks the generated tables.
"""

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md"] + sorted(
    p for p in (ROOT / "docs").rglob("*.md") if "_build" not in p.parts)

_BLOCK = re.compile(r"^(?P<indent> *)```(?P<lang>[\w-]*|\{[\w-]+\})\n(?P<body>.*?)^(?P=indent)```",
                    re.M | re.S)
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
  if lang.startswith("{"):
    return "directive"  # a Sphinx directive ({eval-rst}: the API reference)
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
    if "define_gin_flags()" in source:  # --gin_file, --gin_param, --gin_location_prefix
      from mesh_tensorflow import cli  # pylint: disable=g-import-not-at-top
      defined |= set(cli.GIN_FLAG_HELP)
    for arg in args:
      m = re.match(r"--(\w+)", arg)
      if m and ("DEFINE_" in source or "define_gin_flags()" in source):
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
  gin_config.parse([], [])  # as the commands parse: `include 'models/...'` resolves in the package
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
    prose = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)  # code is not links
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", prose):
      if re.match(r"\w+://", target):
        continue
      if not (page.parent / target).exists():
        broken.append(f"{page.relative_to(ROOT)} -> {target}")
  assert not broken, broken


# What a user page must not say: run history belongs in CHANGELOG.md (as
# release notes), measurements with their command in benchmarks/RESULTS.md,
# and notes about how the project is developed nowhere in the documentation.
_NOT_FOR_USERS = [
    (r"\b20\d\d-[01]\d-[0-3]\d\b", "a date"),
    (r"\bstop \d+\b|previous head|same hour", "run history"),
    (r"\b(?:issues?|runs?) #?\d+\b", "an issue or run number"),
    (r"\bissue tracker\b", "the issue tracker"),
    (r"\b(?:development|work|later|previous|this) sessions?\b", "development sessions"),
    (r"before/after|\bbefore \(\w{7,}\)", "a before/after comparison"),
    (r"\bload average\b|\bload \d", "the machine's load"),
    (r"\bby hand\b", "'by hand'"),
    (r"\(target\s*(?:<|>|:|under|at most)|\btargets?: (?:at most|under)|\btarget <", "a target"),
    (r"\bfirst version\b", "the project's history"),
    (r"\bCI runs?\b|\bwhat CI\b|\bnot in CI\b", "the project's CI"),
    (r"\bshared (?:2-core )?machine\b|\bthis 2-core machine\b|(?:quiet|loaded) 2-core",
     "the machine the project is developed on"),
    (r"\bother jobs\b|\bmeasured here\b", "the machine the project is developed on"),
    (r"\.\./shared|/work/", "a path outside the repository"),
    (r"benchmarks/RESULTS\.md", "the measurement log (not user documentation)"),
]


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_pages_carry_no_run_history_or_lab_notes(page):
  text = page.read_text()
  found = [f"{m.group(0)!r} ({what})" for pattern, what in _NOT_FOR_USERS
           for m in re.finditer(pattern, text, re.I)]
  assert not found, f"{page.relative_to(ROOT)}: {found} (see tests/project/test_docs.py)"


def test_lab_note_patterns_catch_lab_notes():
  notes = ["load average 4.7 on the shared 2-core machine", "checked by hand",
           "(target <= 1.2)", "the hang of the first version", "a failure a CI run met",
           "Two runs on the shared machine", "this is what CI runs", "issue 24, run 3",
           "before/after", "measured on 2026-12-01"]
  for note in notes:
    assert any(re.search(p, note, re.I) for p, _ in _NOT_FOR_USERS), note
  # ... and not the words users need.
  for fine in ["a `Session` runs only the assignments", "`self.assign(target, value)`",
               "the mesh of this machine", "inputs and targets"]:
    assert not any(re.search(p, fine, re.I) for p, _ in _NOT_FOR_USERS), fine


def test_readme_is_an_entry_point():
  text = (ROOT / "README.md").read_text()
  assert len(text.splitlines()) <= 120, "README.md is the entry point; move subjects to docs/"
  assert "](docs/index.md)" in text, "README.md must link the documentation's index"


DOC_PAGES = sorted(p for p in (ROOT / "docs").rglob("*.md") if "_build" not in p.parts)


def test_index_reaches_every_page():
  """Every page is in a toctree (the site's navigation), reached from
  docs/index.md through Markdown links (the reading path on GitHub)."""
  reached, todo = set(), [ROOT / "docs" / "index.md"]
  in_toctree = set()
  while todo:
    page = todo.pop()
    if page in reached:
      continue
    reached.add(page)
    text = page.read_text()
    for target in re.findall(r"\]\(([^)#\s]+\.md)(?:#[^)]*)?\)", text):
      todo.append((page.parent / target).resolve())
    for block in re.findall(r"^:::\{toctree\}\n(.*?)^:::", text, re.M | re.S):
      for entry in block.splitlines():
        if entry.strip() and not entry.startswith(":"):
          in_toctree.add((page.parent / (entry.strip() + ".md")).resolve())
  missing = [str(p.relative_to(ROOT)) for p in DOC_PAGES if p.resolve() not in reached]
  assert not missing, f"pages that docs/index.md does not lead to: {missing}"
  untoc = [str(p.relative_to(ROOT)) for p in DOC_PAGES
           if p.name != "index.md" or p.parent.name != "docs"
           if p.resolve() not in in_toctree]
  assert not untoc, f"pages in no toctree: {untoc}"


def test_install_page_names_every_extra():
  """docs/quickstart.md's install section names every extra of setup.py."""
  extras = [key.value for node in ast.walk(ast.parse((ROOT / "setup.py").read_text()))
            if isinstance(node, ast.keyword) and node.arg == "extras_require"
            for key in node.value.keys]
  assert "tensorflow" in extras and "docs" in extras, extras
  page = (ROOT / "docs" / "quickstart.md").read_text().split("## The two commands")[0]
  missing = [name for name in extras if name != "auto_mtf" and f"`{name}`" not in page
             and f".[{name}]" not in page]
  assert not missing, f"docs/quickstart.md does not name the extras {missing}"
