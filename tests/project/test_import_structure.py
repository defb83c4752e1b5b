"""The package's import structure: folders are floors, imports only go down.

Every module of `mesh_tensorflow` is read with `ast` (imports at the top of
the module AND inside functions, plus `importlib.import_module("...")` with a
literal name) to build the import graph. A function-level import counts like
any other: hiding a cycle inside a function does not remove it.

Each folder is one floor (`FOLDERS`, lowest first); a module may import only
from its own floor or below, and the graph has no cycles. A module outside
the table (the commands, bert/, experimental/, testing/) is a program, on the
top floor: it may import anything, and no listed module may import it.
Importing a submodule also runs its packages' `__init__` (Python does so);
those edges are not in the graph, and each folder's `__init__` is a plain
re-export of its own modules (checked below).
"""

import ast
import importlib
import inspect
import os
import subprocess
import sys

import pytest

from mesh_tensorflow.compat import original_paths

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE = "mesh_tensorflow"
LAYER_NAMES = ("core", "lowering", "ops", "training", "layers", "compat", "api", "analysis",
               "models", "models_compat", "programs")

# Folder (or top-level module) -> floor, one line each.
FOLDERS = {
    "core": "core",  # shapes, layout rules, the mtf graph, layout-independent random numbers
    "cli": "core",  # the commands' error convention (a module; the package imports it first)
    "_environment": "core",  # the TensorFlow and optional-package checks (imported first)
    "lowering": "lowering",  # the implementation interface, plans, observers, implementations, the walk
    "distributed": "lowering",  # meshes over several processes
    "operations": "ops",  # the operations and automatic differentiation
    "training": "training",  # optimizers, trainer, checkpoints, ZeRO, offload, pipeline
    "layers": "layers",  # neural-network layers (annealed dropout reads the optimizer's step)
    "compat": "compat",  # what exists only for the original's users
    "": "api",  # the package itself: `import mesh_tensorflow as mtf`
    "analysis": "analysis",  # cost model and layout report
    "auto_mtf": "analysis",  # the layout search, over the cost model
    "transformer": "models",  # the transformer library and its command
    # The original's transformer-era paths (transformer.utils and its
    # Estimator-era entry points), served on top of the transformer library.
    "compat.transformer": "models_compat",
}


def _modules():
  """{module name: path} of every module of the package."""
  found = {}
  for directory, _, files in os.walk(os.path.join(REPO_ROOT, PACKAGE)):
    for name in files:
      if name.endswith(".py"):
        path = os.path.join(directory, name)
        module = os.path.relpath(path, REPO_ROOT)[:-3].replace(os.sep, ".")
        found[module[:-len(".__init__")] if module.endswith(".__init__") else module] = path
  return found


def _short(module):
  return module[len(PACKAGE) + 1:] if module != PACKAGE else ""


def _layer(module):
  short = _short(module)
  best = None
  for key, layer in FOLDERS.items():
    if short == key or (key and short.startswith(key + ".")):
      if best is None or len(key) > len(best[0]):
        best = (key, layer)
  return best[1] if best else "programs"


def import_graph():
  """{module: {imported modules of the package}} (short names, "" = package)."""
  modules = _modules()

  def resolve(name):
    # An original module path counts as the module that serves it.
    name = original_paths.current_name(name) or name
    while name and name not in modules:
      name = name.rpartition(".")[0]
    return name or None

  graph = {}
  for module, path in modules.items():
    with open(path, encoding="utf-8") as f:
      tree = ast.parse(f.read(), path)
    is_package = path.endswith("__init__.py")
    targets = []
    for node in ast.walk(tree):
      if isinstance(node, ast.Import):
        targets += [alias.name for alias in node.names]
      elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
          parts = module.split(".")
          parts = parts if is_package else parts[:-1]
          parts = parts[:len(parts) - node.level + 1]
          base = ".".join(parts + ([base] if base else []))
        for alias in node.names:
          full = f"{base}.{alias.name}"
          targets.append(full if full in modules else base)
      elif (isinstance(node, ast.Call) and node.args
            and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
            and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"):
        targets.append(node.args[0].value)
    edges = set()
    for target in targets:
      if target == PACKAGE or target.startswith(PACKAGE + "."):
        resolved = resolve(target)
        if resolved and resolved != module:
          edges.add(_short(resolved))
    graph[_short(module)] = edges
  return graph


def find_cycles(graph):
  """The strongly connected components of more than one module, each with one
  cycle through it (a list of modules, first repeated at the end)."""
  index, low, stack, on_stack, components = {}, {}, [], set(), []
  counter = [0]

  def visit(v):
    index[v] = low[v] = counter[0]
    counter[0] += 1
    stack.append(v)
    on_stack.add(v)
    for w in sorted(graph.get(v, ())):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        component.append(w)
        if w == v:
          break
      if len(component) > 1:
        components.append(sorted(component))

  limit = sys.getrecursionlimit()
  sys.setrecursionlimit(max(limit, 10000))
  try:
    for v in sorted(graph):
      if v not in index:
        visit(v)
  finally:
    sys.setrecursionlimit(limit)
  cycles = []
  for component in components:
    members = set(component)
    # Shortest path back to the start, inside the component (BFS).
    start = component[0]
    parents, frontier, found = {start: None}, [start], None
    while frontier and found is None:
      nxt = []
      for v in frontier:
        for w in sorted(graph[v] & members):
          if w == start:
            found = v
            break
          if w not in parents:
            parents[w] = v
            nxt.append(w)
        if found is not None:
          break
      frontier = nxt
    path = [start]
    v = found
    while v is not None and v != start:
      path.insert(1, v)
      v = parents[v]
    cycles.append(path + [start])
  return cycles


def _named(module):
  return f"{PACKAGE}.{module}" if module else PACKAGE


def floor_table(graph=None):
  """The floors as docs/architecture.md draws them: a Markdown table, top
  floor first, with the folders of each and the floors its modules import."""
  graph = import_graph() if graph is None else graph
  rank = {name: i for i, name in enumerate(LAYER_NAMES)}
  folders = {name: [] for name in LAYER_NAMES}
  for key, layer in FOLDERS.items():
    if key == "":
      folders[layer].append("the package (`import mesh_tensorflow as mtf`)")
    elif os.path.isdir(os.path.join(REPO_ROOT, PACKAGE, *key.split("."))):
      folders[layer].append(f"`{key.replace('.', '/')}/`")
    else:
      folders[layer].append(f"`{key}`")
  folders["programs"].append("the commands, `bert/`, `experimental/`, `testing/`")
  imports = {name: set() for name in LAYER_NAMES}
  for module, targets in graph.items():
    mine = _layer(_named(module))
    imports[mine] |= {_layer(_named(t)) for t in targets} - {mine}
  rows = ["| Floor | Folders | Imports from the floors |", "| --- | --- | --- |"]
  for name in reversed(LAYER_NAMES):
    below = ", ".join(sorted(imports[name], key=rank.get, reverse=True)) or "none"
    rows.append(f"| {rank[name]} {name} | {', '.join(folders[name])} | {below} |")
  return "\n".join(rows) + "\n"


def test_architecture_page_draws_the_floors_of_the_code():
  table = floor_table()
  with open(os.path.join(REPO_ROOT, "docs", "architecture.md"), encoding="utf-8") as f:
    doc = f.read()
  assert table in doc, ("docs/architecture.md does not show the floors as the code has "
                        "them; the table is now:\n" + table)


def test_every_module_has_a_known_layer():
  graph = import_graph()
  assert graph, "no modules found"
  assert all(_layer(_named(m)) in LAYER_NAMES for m in graph)
  # Spot checks of the table itself.
  assert _layer("mesh_tensorflow.core.graph") == "core"
  assert _layer("mesh_tensorflow.operations.einsum_ops") == "ops"
  assert _layer("mesh_tensorflow.compat.original_ops") == "compat"
  assert _layer("mesh_tensorflow.lowering.plans") == "lowering"
  assert _layer("mesh_tensorflow.training.zero") == "training"
  assert _layer("mesh_tensorflow.transformer.application") == "models"
  assert _layer("mesh_tensorflow.compat.transformer.utils") == "models_compat"
  assert _layer(PACKAGE) == "api"


def test_no_import_cycles():
  cycles = find_cycles(import_graph())
  assert not cycles, "import cycles:\n" + "\n".join(
      " -> ".join(_named(m) for m in cycle) for cycle in cycles)


def test_imports_only_go_downhill():
  graph = import_graph()
  rank = {name: i for i, name in enumerate(LAYER_NAMES)}
  uphill = []
  for module, targets in sorted(graph.items()):
    mine = _layer(_named(module))
    for target in sorted(targets):
      theirs = _layer(_named(target))
      if rank[theirs] > rank[mine]:
        uphill.append(f"{_named(module)} ({mine}) imports {_named(target)} ({theirs})")
  assert not uphill, "imports from a higher layer:\n" + "\n".join(uphill)


def test_the_checks_catch_a_cycle_and_an_uphill_import():
  graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
  assert find_cycles(graph) == [["a", "b", "c", "a"]]
  assert find_cycles({"a": {"b"}, "b": set()}) == []
  assert _layer("mesh_tensorflow.core.graph") == "core" and _layer("mesh_tensorflow.report") == "programs"


def _run_python(code):
  env = dict(os.environ, PYTHONPATH=REPO_ROOT, TF_CPP_MIN_LOG_LEVEL="3")
  proc = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env,
                        capture_output=True, text=True, timeout=300, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return proc.stdout


# What a fresh interpreter sees, checked in one: first the modules that
# `import mesh_tensorflow` loads (before anything else is imported), then the
# original's import paths, this library's former paths, and the names that
# load their module on first use. Each check prints "<name>: ..." lines.
_FRESH_PROCESS_CHECKS = """
import importlib, sys, types
import mesh_tensorflow as mtf
print('loaded:', mtf.__file__)
print('loaded:', ' '.join(sorted(m for m in sys.modules if m.startswith('mesh_tensorflow.'))))
for original, current in ORIGINAL_PATHS.items():
  a, b = importlib.import_module(original), importlib.import_module(current)
  assert a is b and a.__name__ == current and a.__spec__.name == current, original
from mesh_tensorflow import optimize, utils
assert optimize is mtf.training.optimize and utils is mtf.compat.utils
assert mtf.training.Trainer is mtf.training.trainer.Trainer
from mesh_tensorflow.lowering import Lowering
assert issubclass(mtf.Lowering, Lowering)
print('original: ok')
for former in FORMER_PATHS:
  try:
    importlib.import_module(former)
    print('former: imports', former)
  except ImportError:
    pass
print('former: ok')
import mesh_tensorflow.analysis.layout_report  # the module of the same name
assert callable(mtf.layout_report) and hasattr(mtf.layout_report, 'LayoutReport')
assert isinstance(mtf.transformer, types.ModuleType)
assert mtf.transformer.transformer.Unitransformer
assert mtf.cost_model.estimate and mtf.auto_mtf.search
assert mtf.ops_with_redefined_builtins.abs is mtf.ops.mtf_abs
print('lazy: ok')
"""


@pytest.fixture(scope="module")
def fresh_process():
  """{check: its printed lines} of _FRESH_PROCESS_CHECKS in a new interpreter."""
  code = (f"ORIGINAL_PATHS = {ORIGINAL_PATHS!r}\nFORMER_PATHS = {FORMER_PATHS!r}\n"
          + _FRESH_PROCESS_CHECKS)
  lines = {}
  for line in _run_python(code).splitlines():
    check, _, text = line.partition(": ")
    lines.setdefault(check, []).append(text)
  return lines


@pytest.mark.xdist_group("import_structure_fresh_process")  # shares `fresh_process`
def test_import_mesh_tensorflow_loads_no_transformer_or_cost_model(fresh_process):
  path, loaded = fresh_process["loaded"]
  assert path.startswith(REPO_ROOT), path
  loaded = set(loaded.split())
  assert "mesh_tensorflow.core.graph" in loaded  # the check sees the package's modules
  for name in ("mesh_tensorflow.transformer", "mesh_tensorflow.analysis.cost_model",
               "mesh_tensorflow.auto_mtf", "mesh_tensorflow.analysis.layout_report"):
    assert name not in loaded, f"import mesh_tensorflow loaded {name}"


@pytest.mark.xdist_group("import_structure_fresh_process")
def test_lazy_names_resolve_on_first_use(fresh_process):
  assert fresh_process["lazy"] == ["ok"]


def test_every_public_name_still_resolves():
  import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top
  with open(os.path.join(REPO_ROOT, "tests", "data", "mtf_public_names.txt"),
            encoding="utf-8") as f:
    names = [line.strip() for line in f if line.strip()]
  assert len(names) > 250 and "transformer" in names and "cost_model" in names
  missing = sorted(n for n in names if n not in dir(mtf))
  assert not missing, f"dir(mtf) lost {missing}"
  unresolved = [n for n in names if not hasattr(mtf, n)]
  assert not unresolved, f"mtf.<name> fails for {unresolved}"
  # Each module marks its own functions for AutoGraph to leave alone
  # (core.autograph_exempt); the package sets nothing on other modules.
  plain = [n for n in names if inspect.isfunction(getattr(mtf, n))
           and not getattr(getattr(mtf, n), "_mtf_autograph_exempt", False)]
  assert not plain, f"mtf.<name> not exempt from AutoGraph: {plain}"
  assert importlib.import_module("mesh_tensorflow.transformer") is mtf.transformer


@pytest.mark.parametrize("module", ["mesh_tensorflow.report"])
def test_report_command_still_runs(module):
  env = dict(os.environ, PYTHONPATH=REPO_ROOT, TF_CPP_MIN_LOG_LEVEL="3")
  proc = subprocess.run([sys.executable, "-m", module, "--help"], cwd=REPO_ROOT, env=env,
                        capture_output=True, text=True, timeout=300, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "--gin_file" in proc.stdout


ORIGINAL_PATHS = {  # the original's top-level modules -> the module now
    "mesh_tensorflow.placement_mesh_impl": "mesh_tensorflow.compat.placement_mesh_impl",
    "mesh_tensorflow.simd_mesh_impl": "mesh_tensorflow.compat.simd_mesh_impl",
    "mesh_tensorflow.optimize": "mesh_tensorflow.training.optimize",
    "mesh_tensorflow.utils": "mesh_tensorflow.compat.utils",
    "mesh_tensorflow.beam_search": "mesh_tensorflow.layers.beam_search",
    "mesh_tensorflow.tpu_variables": "mesh_tensorflow.lowering.tpu_variables",
    "mesh_tensorflow.transformer.utils": "mesh_tensorflow.compat.transformer.utils",
    "mesh_tensorflow.test_utils": "mesh_tensorflow.compat.test_utils",
    "mesh_tensorflow.ops_with_redefined_builtins":
        "mesh_tensorflow.compat.ops_with_redefined_builtins",
    "mesh_tensorflow.ops": "mesh_tensorflow.compat.original_ops",
}
FORMER_PATHS = ("mesh_tensorflow.graph", "mesh_tensorflow.layers_core", "mesh_tensorflow.zero",
                "mesh_tensorflow.cost_model", "mesh_tensorflow.ops.legacy_classes",
                "mesh_tensorflow.ops.einsum_ops")


@pytest.mark.xdist_group("import_structure_fresh_process")
def test_original_paths_give_the_same_module(fresh_process):
  from mesh_tensorflow.compat import original_paths  # pylint: disable=g-import-not-at-top
  assert original_paths.ORIGINAL_PATHS == ORIGINAL_PATHS
  assert fresh_process["original"] == ["ok"]


@pytest.mark.xdist_group("import_structure_fresh_process")
def test_this_librarys_former_flat_paths_are_gone(fresh_process):
  assert fresh_process["former"] == ["ok"], fresh_process["former"]


def test_no_stub_module_swaps_itself_in_sys_modules():
  offenders = []
  for module, path in sorted(_modules().items()):
    with open(path, encoding="utf-8") as f:
      if "sys.modules[__name__]" in f.read():
        offenders.append(module)
  assert not offenders, f"modules replacing themselves in sys.modules: {offenders}"


def _is_plain_reexport(node, folder):
  if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
    return True  # the docstring
  if isinstance(node, ast.ImportFrom):
    return (node.module or "").startswith(f"{PACKAGE}.{folder}")
  if isinstance(node, ast.Assign):  # __all__ = [...]
    return [getattr(t, "id", None) for t in node.targets] == ["__all__"]
  return False


def test_every_folder_is_documented_and_its_init_is_a_plain_reexport():
  package = os.path.join(REPO_ROOT, PACKAGE)
  with open(os.path.join(REPO_ROOT, "docs", "architecture.md"), encoding="utf-8") as f:
    doc = f.read()
  for folder in ("core", "operations", "lowering", "layers", "training", "distributed",
                 "analysis", "compat", "testing", "transformer"):
    assert os.path.isfile(os.path.join(package, folder, "__init__.py")), folder
    assert f"`{folder}/`" in doc, f"docs/architecture.md does not describe {folder}/"
  for folder in ("core", "lowering", "distributed", "operations", "training", "layers", "compat",
                 "analysis", "auto_mtf", "bert", "experimental"):
    with open(os.path.join(package, folder, "__init__.py"), encoding="utf-8") as f:
      tree = ast.parse(f.read())
    other = [ast.unparse(n)[:80] for n in tree.body if not _is_plain_reexport(n, folder)]
    assert not other, f"{folder}/__init__.py is more than a re-export of its modules: {other}"
  top = sorted(n for n in os.listdir(package) if n.endswith(".py"))
  assert len(top) <= 9, f"the package's top level has grown to {len(top)} modules: {top}"


TEST_FOLDERS = {"operations", "lowering", "layers", "training", "distributed", "analysis", "transformer",
                "compat", "bert", "experimental", "project"}


def test_tests_are_organised_like_the_package():
  tests_dir = os.path.join(REPO_ROOT, "tests")
  loose = sorted(n for n in os.listdir(tests_dir) if n.startswith("test_") and n.endswith(".py"))
  assert not loose, f"test files outside a folder: {loose} (put each in the folder of its subject)"
  folders = {n for n in os.listdir(tests_dir)
             if os.path.isdir(os.path.join(tests_dir, n)) and n not in ("data", "__pycache__")}
  assert folders == TEST_FOLDERS, f"tests/ folders {sorted(folders)} != {sorted(TEST_FOLDERS)}"
  package = os.path.join(REPO_ROOT, PACKAGE)
  for folder in TEST_FOLDERS - {"project"}:
    assert os.path.isdir(os.path.join(package, folder)), f"tests/{folder} names no package folder"
    files = [n for n in os.listdir(os.path.join(tests_dir, folder)) if n.startswith("test_")]
    assert files, f"tests/{folder} is empty"
