"""The package's import structure: imports only go downhill, without cycles.

Every module of `mesh_tensorflow` is read with `ast` (imports at the top of
the module AND inside functions, plus `importlib.import_module("...")` with a
literal name) to build the import graph. A function-level import counts like
any other: hiding a cycle inside a function does not remove it.

Layers, lowest first (a module may import only from its own layer or below):

  0 core         core/*, the lowering's shared data (lowering.mesh_impl,
                 slice/master variables, lowering.policies, ...), cli helpers
  1 ops          ops/* (the operations, gradients, signal_ops)
  2 lowering     lowering.lowering, placement_mesh_impl, simd_mesh_impl,
                 training.zero, training.offload
  3 layers       layers/*, training/*, compat.legacy_classes
  4 api          the `mesh_tensorflow` package itself (`import mesh_tensorflow
                 as mtf`): it loads layers 0-3; the layers above it load on
                 first use of `mtf.<name>` (PEP 562), not at import
  5 analysis     analysis/* (cost model, layout report), auto_mtf/*
  6 models       transformer/*
  7 programs     commands (report, check_devices, launch, ...), the original's
                 top-level module paths, the `mesh_tensorflow.ops` namespace,
                 testing

A module not listed below counts as a program (top layer): it may import
anything, and no listed module may import it. Importing a submodule also runs
its packages' `__init__` (Python does so); those edges are not in the graph:
the package `__init__`s are aggregators that import nothing from above the
layers they gather.

`ALLOWED_CYCLE_EDGES` lists the edges that still close cycles (inside the ops
layer: gradients of one operation family use another family, and the other
way round; and `transformer.utils` re-exporting the original's entry points). The list can only shrink: each must still exist, and the graph
without them must be acyclic.
"""

import ast
import importlib
import os
import subprocess
import sys

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE = "mesh_tensorflow"
LAYER_NAMES = ("core", "ops", "lowering", "layers", "api", "analysis", "models", "programs")

# Module (or package prefix, ending in ".") -> layer. The longest match wins.
LAYERS = {
    # 0 core
    "core.": "core", "lowering.mesh_impl": "core", "lowering.slice_variables": "core",
    "lowering.master_variables": "core", "lowering.collective_keys": "core",
    "lowering.tpu_topology": "core", "lowering.policies": "core", "lowering.plans": "core",
    "lowering.observers": "core",
    "lowering.tpu_variables": "core", "cli": "core", "_environment": "core",
    "training.checkpoint_verify": "core",
    "training.original_checkpoint": "core", "distributed.cluster": "core",
    "compat.utils": "core", "compat.moved_modules": "core",
    # 1 ops
    "ops.": "ops",
    # 2 lowering
    "lowering": "lowering", "lowering.lowering": "lowering",
    "lowering.placement_mesh_impl": "lowering", "lowering.simd_mesh_impl": "lowering",
    "training.zero": "lowering", "training.offload": "lowering",
    # 3 layers / training
    "layers": "layers", "layers.": "layers", "training": "layers", "training.": "layers",
    "compat.legacy_classes": "layers",  # the original's classes, some over training
    "testing.reference_models": "layers",
    # 4 api
    "": "api",
    # 5 analysis
    "analysis.": "analysis", "auto_mtf": "analysis", "auto_mtf.": "analysis",
    # 6 models
    "transformer": "models", "transformer.": "models",
    # 7 programs and compatibility namespaces: everything else (the commands,
    # the original's top-level module paths, `mesh_tensorflow.ops`,
    # compat.ops_with_redefined_builtins, compat.test_utils, testing)
}

# Edges that still close import cycles. Only remove entries (see the docstring).
ALLOWED_CYCLE_EDGES = {
    ("ops.shape_ops", "ops.elementwise"),  # broadcast's gradient sums (reduce_to_shape)
    ("ops.elementwise", "ops.reduction"),  # reduce_to_shape sums with reduce_sum
    ("ops.indexing", "ops.reduction"),  # sampling takes a reduce_max
    ("ops.reduction", "ops.control"),  # softmax's gradient stops gradients
    # utils re-exports the original's entry points (utils.train_model, ...),
    # which parse gin files through gin_config, itself above utils; goes when
    # run's own body moves out of the module users import as `utils`.
    ("transformer.utils", "transformer.utils_original"),
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
  for key, layer in LAYERS.items():
    if short == key or (key.endswith(".") and short.startswith(key)):
      if best is None or len(key) > len(best[0]):
        best = (key, layer)
  return best[1] if best else "programs"


def import_graph():
  """{module: {imported modules of the package}} (short names, "" = package)."""
  modules = _modules()

  def resolve(name):
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


def test_every_module_has_a_known_layer():
  graph = import_graph()
  assert graph, "no modules found"
  assert all(_layer(_named(m)) in LAYER_NAMES for m in graph)
  # Spot checks of the table itself.
  assert _layer("mesh_tensorflow.core.graph") == "core"
  assert _layer("mesh_tensorflow.ops.einsum_ops") == "ops"
  assert _layer("mesh_tensorflow.ops") == "programs"
  assert _layer("mesh_tensorflow.transformer.utils") == "models"
  assert _layer(PACKAGE) == "api"


def test_allowed_cycle_edges_still_exist():
  graph = import_graph()
  gone = sorted(e for e in ALLOWED_CYCLE_EDGES if e[1] not in graph.get(e[0], ()))
  assert not gone, (f"{gone} no longer exist: remove them from ALLOWED_CYCLE_EDGES "
                    "(the list only shrinks)")


def test_no_import_cycles():
  graph = import_graph()
  pruned = {m: {t for t in targets if (m, t) not in ALLOWED_CYCLE_EDGES}
            for m, targets in graph.items()}
  cycles = find_cycles(pruned)
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


def test_import_mesh_tensorflow_loads_no_transformer_or_cost_model():
  out = _run_python(
      "import sys\n"
      "import mesh_tensorflow as mtf\n"
      "print(mtf.__file__)\n"
      "print(' '.join(sorted(m for m in sys.modules if m.startswith('mesh_tensorflow.'))))\n")
  path, loaded = out.strip().splitlines()[-2:]
  assert path.startswith(REPO_ROOT), path
  loaded = set(loaded.split())
  assert "mesh_tensorflow.core.graph" in loaded  # the check sees the package's modules
  for name in ("mesh_tensorflow.transformer", "mesh_tensorflow.analysis.cost_model",
               "mesh_tensorflow.auto_mtf", "mesh_tensorflow.analysis.layout_report"):
    assert name not in loaded, f"import mesh_tensorflow loaded {name}"


def test_lazy_names_resolve_on_first_use():
  out = _run_python(
      "import sys, types\n"
      "import mesh_tensorflow as mtf\n"
      "import mesh_tensorflow.analysis.layout_report\n"  # the module of the same name
      "assert callable(mtf.layout_report) and hasattr(mtf.layout_report, 'LayoutReport')\n"
      "assert isinstance(mtf.transformer, types.ModuleType)\n"
      "assert mtf.transformer.transformer.Unitransformer\n"
      "assert mtf.cost_model.estimate and mtf.auto_mtf.search\n"
      "assert mtf.ops_with_redefined_builtins.abs is mtf.ops.mtf_abs\n"
      "print('ok')\n")
  assert out.strip().endswith("ok")


def test_every_public_name_still_resolves():
  import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top
  with open(os.path.join(REPO_ROOT, "tests", "data", "mtf_public_names.txt"),
            encoding="utf-8") as f:
    names = [line.strip() for line in f if line.strip()]
  assert len(names) > 300 and "transformer" in names and "cost_model" in names
  missing = sorted(n for n in names if n not in dir(mtf))
  assert not missing, f"dir(mtf) lost {missing}"
  unresolved = [n for n in names if not hasattr(mtf, n)]
  assert not unresolved, f"mtf.<name> fails for {unresolved}"
  assert importlib.import_module("mesh_tensorflow.transformer") is mtf.transformer


@pytest.mark.parametrize("module", ["mesh_tensorflow.report"])
def test_report_command_still_runs(module):
  env = dict(os.environ, PYTHONPATH=REPO_ROOT, TF_CPP_MIN_LOG_LEVEL="3")
  proc = subprocess.run([sys.executable, "-m", module, "--help"], cwd=REPO_ROOT, env=env,
                        capture_output=True, text=True, timeout=300, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "--gin_file" in proc.stdout


FORMER_PATHS = {  # this library's former flat paths -> the module now
    "mesh_tensorflow.graph": "mesh_tensorflow.core.graph",
    "mesh_tensorflow.shapes": "mesh_tensorflow.core.shapes",
    "mesh_tensorflow.layers_core": "mesh_tensorflow.layers.core",
    "mesh_tensorflow.lowering_policies": "mesh_tensorflow.lowering.policies",
    "mesh_tensorflow.zero": "mesh_tensorflow.training.zero",
    "mesh_tensorflow.checkpoint": "mesh_tensorflow.training.checkpoint",
    "mesh_tensorflow.cost_model": "mesh_tensorflow.analysis.cost_model",
    "mesh_tensorflow.ops.legacy_classes": "mesh_tensorflow.compat.legacy_classes",
}
ORIGINAL_PATHS = {  # the original's top-level modules -> the module now
    "mesh_tensorflow.placement_mesh_impl": "mesh_tensorflow.lowering.placement_mesh_impl",
    "mesh_tensorflow.simd_mesh_impl": "mesh_tensorflow.lowering.simd_mesh_impl",
    "mesh_tensorflow.optimize": "mesh_tensorflow.training.optimize",
    "mesh_tensorflow.utils": "mesh_tensorflow.compat.utils",
    "mesh_tensorflow.beam_search": "mesh_tensorflow.layers.beam_search",
    "mesh_tensorflow.tpu_variables": "mesh_tensorflow.lowering.tpu_variables",
    "mesh_tensorflow.test_utils": "mesh_tensorflow.compat.test_utils",
    "mesh_tensorflow.ops_with_redefined_builtins":
        "mesh_tensorflow.compat.ops_with_redefined_builtins",
}


def test_former_and_original_paths_give_the_same_module():
  code = ["import importlib, sys"]
  for former, current in {**FORMER_PATHS, **ORIGINAL_PATHS}.items():
    code.append(f"a = importlib.import_module({former!r}); b = importlib.import_module({current!r})")
    code.append(f"assert a is b and a.__name__ == {current!r} and a.__spec__.name == {current!r}, {former!r}")
  code.append("from mesh_tensorflow.graph import Graph\nfrom mesh_tensorflow.core.graph import Graph as G\nassert Graph is G")
  code.append("import mesh_tensorflow.cost_model.__main__ as m\nassert m.__name__ == 'mesh_tensorflow.analysis.cost_model.__main__'")
  code.append("import mesh_tensorflow as mtf\nassert mtf.training.Trainer is mtf.training.trainer.Trainer")
  code.append("from mesh_tensorflow.lowering import Lowering\nassert Lowering is mtf.Lowering")
  code.append("print('ok')")
  assert _run_python("\n".join(code)).strip().endswith("ok")


def test_every_folder_is_documented_and_its_init_is_light():
  package = os.path.join(REPO_ROOT, PACKAGE)
  with open(os.path.join(REPO_ROOT, "docs", "architecture.md"), encoding="utf-8") as f:
    doc = f.read()
  for folder in ("core", "ops", "lowering", "layers", "training", "distributed", "analysis",
                 "compat", "testing", "transformer"):
    assert os.path.isfile(os.path.join(package, folder, "__init__.py")), folder
    assert f"`{folder}/`" in doc, f"docs/architecture.md does not describe {folder}/"
  for folder in ("core", "lowering", "training", "distributed", "analysis", "compat"):
    with open(os.path.join(package, folder, "__init__.py"), encoding="utf-8") as f:
      tree = ast.parse(f.read())
    eager = [n for n in tree.body if isinstance(n, ast.ImportFrom) and
             (n.module or "").startswith(PACKAGE)]
    assert not eager, f"{folder}/__init__.py imports {[n.module for n in eager]} eagerly"
  top = sorted(n for n in os.listdir(package) if n.endswith(".py"))
  assert len(top) <= 16, f"the package's top level has grown to {len(top)} modules: {top}"


TEST_FOLDERS = {"ops", "lowering", "layers", "training", "distributed", "analysis", "transformer",
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
