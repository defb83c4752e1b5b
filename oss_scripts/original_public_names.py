"""Lists the public names of every module of the original Mesh TensorFlow, by AST.

Reads the original package's source (a source tree, or a revision of a git
repository) without importing it, and writes a JSON object mapping each module
path to the sorted list of its public names:

- names a module defines at top level (``def``, ``class``, assignments, also
  inside top-level ``if``/``try``/``with`` blocks) that do not start with
  ``_``, less the names bound to modules it imports (``tf``, ``np``, ``gin``,
  ``absl``, ...), even where it rebinds them (``tf = tf.compat.v1``);
- for a package ``__init__.py`` and for a module made only of imports (such as
  ``ops_with_redefined_builtins``), also the public names it re-exports from the
  package itself (``from mesh_tensorflow.ops import *``,
  ``from mesh_tensorflow.ops import mtf_abs as abs``,
  ``from mesh_tensorflow import layers``).

Test modules (``*_test.py``) and the package's test helpers are left out.

Usage (shell)::

    python oss_scripts/original_public_names.py --git-dir ORIGINAL.git \
        --rev HEAD > tests/data/original_public_names.json
    python oss_scripts/original_public_names.py --src ORIGINAL_CHECKOUT
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
from typing import Callable, Dict, Iterable, List, Optional, Set

PACKAGE = "mesh_tensorflow"


def _module_path(file_path: str) -> Optional[str]:
  """'mesh_tensorflow/auto_mtf/api.py' -> 'mesh_tensorflow.auto_mtf.api'."""
  if not file_path.endswith(".py") or not file_path.startswith(PACKAGE + "/"):
    return None
  base = os.path.basename(file_path)
  if base.endswith("_test.py") or base == "test_utils.py":
    return None
  parts = file_path[:-3].split("/")
  if parts[-1] == "__init__":
    parts = parts[:-1]
  return ".".join(parts)


def _top_level_statements(body: Iterable[ast.stmt]) -> Iterable[ast.stmt]:
  """The module's statements, with those of top-level if/try/with blocks."""
  for node in body:
    yield node
    if isinstance(node, ast.If):
      yield from _top_level_statements(node.body)
      yield from _top_level_statements(node.orelse)
    elif isinstance(node, ast.Try):
      yield from _top_level_statements(node.body)
      for handler in node.handlers:
        yield from _top_level_statements(handler.body)
      yield from _top_level_statements(node.orelse)
      yield from _top_level_statements(node.finalbody)
    elif isinstance(node, ast.With):
      yield from _top_level_statements(node.body)


def _target_names(target: ast.expr) -> List[str]:
  if isinstance(target, ast.Name):
    return [target.id]
  if isinstance(target, (ast.Tuple, ast.List)):
    return [n for elt in target.elts for n in _target_names(elt)]
  if isinstance(target, ast.Starred):
    return _target_names(target.value)
  return []


def _absolute_module(node: ast.ImportFrom, module: str, is_package: bool) -> str:
  if not node.level:
    return node.module or ""
  base = module.split(".")
  if not is_package:
    base = base[:-1]
  base = base[:len(base) - (node.level - 1)]
  return ".".join(base + ([node.module] if node.module else []))


class _Analyzer:
  """Computes public names, following star imports within the package."""

  def __init__(self, sources: Dict[str, str], packages: Set[str]):
    self._sources = sources  # module path -> source text
    self._packages = packages  # module paths that are packages
    self._cache: Dict[str, List[str]] = {}

  def public_names(self, module: str) -> List[str]:
    if module in self._cache:
      return self._cache[module]
    self._cache[module] = []  # guards against import cycles
    tree = ast.parse(self._sources[module], filename=module)
    is_package = module in self._packages
    statements = list(_top_level_statements(tree.body))
    only_imports = all(
        isinstance(s, (ast.Import, ast.ImportFrom, ast.Expr)) for s in tree.body)
    reexports = is_package or only_imports
    module_aliases: Set[str] = set()
    defined: List[str] = []
    for node in statements:
      if isinstance(node, ast.Import):
        for alias in node.names:
          module_aliases.add(alias.asname or alias.name.split(".")[0])
      elif isinstance(node, ast.ImportFrom):
        source = _absolute_module(node, module, is_package)
        internal = source == PACKAGE or source.startswith(PACKAGE + ".")
        for alias in node.names:
          if alias.name == "*":
            if internal and source in self._sources:
              defined.extend(self.public_names(source))
            continue
          bound = alias.asname or alias.name
          if internal and reexports:
            defined.append(bound)
          elif f"{source}.{alias.name}" in self._sources or not internal:
            # A submodule, or a name from outside the package (``from
            # tensorflow.python.ops import x``): not this module's own.
            module_aliases.add(bound)
      elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        defined.append(node.name)
      elif isinstance(node, ast.Assign):
        for target in node.targets:
          defined.extend(_target_names(target))
      elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        defined.extend(_target_names(node.target))
    names = sorted({n for n in defined
                    if not n.startswith("_") and (n not in module_aliases or reexports)})
    self._cache[module] = names
    return names


def _read_git(git_dir: str, rev: str) -> Dict[str, str]:
  def git(*args: str) -> str:
    return subprocess.run(["git", "--git-dir", git_dir, *args], check=True,
                          capture_output=True, text=True).stdout
  files = git("ls-tree", "-r", "--name-only", rev, "--", PACKAGE).split()
  return {f: git("show", f"{rev}:{f}") for f in files if f.endswith(".py")}


def _read_tree(src: str) -> Dict[str, str]:
  out = {}
  for root, _, files in os.walk(os.path.join(src, PACKAGE)):
    for f in files:
      if f.endswith(".py"):
        path = os.path.join(root, f)
        with open(path, encoding="utf-8") as fh:
          out[os.path.relpath(path, src).replace(os.sep, "/")] = fh.read()
  return out


def public_names_by_module(files: Dict[str, str]) -> Dict[str, List[str]]:
  """Maps each module path of the package to its public names.

  Args:
    files: repository-relative file path -> Python source.

  Returns:
    module path -> sorted public names (modules without any are kept, empty).

  Example:
    >>> public_names_by_module({"mesh_tensorflow/m.py": "import numpy as np\\n"
    ...                         "def f(): pass\\n_g = 1\\nnp = np\\n"})
    {'mesh_tensorflow.m': ['f']}
  """
  sources: Dict[str, str] = {}
  packages: Set[str] = set()
  for path, text in files.items():
    module = _module_path(path)
    if module is None:
      continue
    sources[module] = text
    if path.endswith("/__init__.py"):
      packages.add(module)
  analyzer = _Analyzer(sources, packages)
  return {m: analyzer.public_names(m) for m in sorted(sources)}


def main(argv: Optional[List[str]] = None,
         write: Callable[[str], object] = sys.stdout.write) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  group = parser.add_mutually_exclusive_group(required=True)
  group.add_argument("--git-dir", help="a git repository of the original")
  group.add_argument("--src", help="a checkout of the original (holding mesh_tensorflow/)")
  parser.add_argument("--rev", default="HEAD", help="revision to read with --git-dir")
  args = parser.parse_args(argv)
  files = _read_git(args.git_dir, args.rev) if args.git_dir else _read_tree(args.src)
  if not any(_module_path(f) for f in files):
    parser.error(f"no {PACKAGE}/*.py found in "
                 f"{args.git_dir + ' at ' + args.rev if args.git_dir else args.src}")
  write(json.dumps(public_names_by_module(files), indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
  main()
