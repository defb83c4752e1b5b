"""The embedded default corpus: the Python standard library's own source.

Real text (code, comments, docstrings) present on every machine with Python,
so training and tests need no download. The files are a fixed sorted list;
every tenth is held out for evaluation.

    >>> len(stdlib_files("train")) > len(stdlib_files("validation")) > 0
    True
"""

from __future__ import annotations

import ast
import glob
import os
import sysconfig
from typing import List, Optional, Tuple

TRAIN, VALIDATION = "train", "validation"
HOLDOUT_EVERY = 10  # every tenth file (and docstring pair) is held out
DEFAULT_CORPUS_BYTES = 3_000_000


def stdlib_files(split: str = TRAIN, max_bytes: int = DEFAULT_CORPUS_BYTES,
                 stdlib_dir: Optional[str] = None) -> List[str]:
  """The embedded default corpus: Python standard library source files.

  The top-level `*.py` files of the standard library, sorted by name; the
  first files whose sizes add up to `max_bytes` are used, and of those every
  tenth (the 10th, 20th, ...) is held out as the validation split. The list
  depends only on the Python installation, never on a seed.

  Args:
    split: "train" or "validation".
    max_bytes: size limit of the corpus (both splits together).
    stdlib_dir: the standard library directory (default: this Python's).

  Returns:
    Sorted file paths.

  Example:
    >>> files = stdlib_files("validation")
    >>> [os.path.basename(f) for f in files][:2]
    ['_py_abc.py', 'antigravity.py']
  """
  if split not in (TRAIN, VALIDATION):
    raise ValueError(f"stdlib_files: split must be 'train' or 'validation', got {split!r}.")
  stdlib_dir = stdlib_dir or sysconfig.get_paths()["stdlib"]
  paths = sorted(glob.glob(os.path.join(glob.escape(stdlib_dir), "*.py")))
  if not paths:
    raise ValueError(f"No Python files in {stdlib_dir!r}: cannot build the stdlib corpus.")
  chosen, total = [], 0
  for path in paths:
    size = os.path.getsize(path)
    if chosen and total + size > max_bytes:
      break
    chosen.append(path)
    total += size
  holdout = [p for i, p in enumerate(chosen) if i % HOLDOUT_EVERY == HOLDOUT_EVERY - 1]
  if not holdout:
    needed = sum(os.path.getsize(p) for p in paths[:HOLDOUT_EVERY])
    raise ValueError(
        f"dataset_fn.corpus_bytes = {max_bytes} holds {len(chosen)} stdlib file(s), too few "
        f"for a validation split (every {HOLDOUT_EVERY}th file is held out): set it to at "
        f"least {needed}.")
  if split == VALIDATION:
    return holdout
  return [p for p in chosen if p not in set(holdout)]


def stdlib_docstring_pairs(split: str = TRAIN, max_bytes: int = DEFAULT_CORPUS_BYTES,
                           max_pairs: Optional[int] = None) -> List[Tuple[str, str]]:
  """(signature, docstring summary) pairs of the stdlib corpus's functions.

  A real sequence-to-sequence task that needs no download: the input is a
  function's `def name(args):` line, the target the first line of its
  docstring. The pairs come from the files of both splits of `stdlib_files`
  in order; every tenth pair is held out as the validation split.

  Args:
    split: "train" or "validation".
    max_bytes: size limit of the corpus the pairs come from.
    max_pairs: stop after this many pairs of the split.

  Example:
    >>> source, target = stdlib_docstring_pairs("validation")[0]
    >>> source.startswith("def ")
    True
  """
  if split not in (TRAIN, VALIDATION):
    raise ValueError(f"stdlib_docstring_pairs: split must be 'train' or 'validation', "
                     f"got {split!r}.")
  files = sorted(stdlib_files(TRAIN, max_bytes) + stdlib_files(VALIDATION, max_bytes))
  pairs, index = [], 0
  for path in files:
    with open(path, encoding="utf-8", errors="replace") as f:
      source = f.read()
    try:
      tree = ast.parse(source)
    except SyntaxError:
      continue
    for node in ast.walk(tree):
      if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        continue
      doc = ast.get_docstring(node)
      if not doc or not doc.strip():
        continue
      held_out = index % HOLDOUT_EVERY == HOLDOUT_EVERY - 1
      index += 1
      if held_out != (split == VALIDATION):
        continue
      summary = doc.strip().splitlines()[0].strip()
      pairs.append((f"def {node.name}({ast.unparse(node.args)}):", summary))
      if max_pairs is not None and len(pairs) >= max_pairs:
        return pairs
  return pairs
