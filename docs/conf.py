"""Sphinx configuration of the documentation site.

    pip install -e ".[docs]"
    sphinx-build -W -n docs docs/_build/html

The pages are Markdown (myst-parser); the API reference is autodoc of the
package's Google-style docstrings (napoleon). tests/project/test_docs_site.py
builds the site with warnings as errors.
"""

import os
import re
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, ROOT)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

project = "mesh_tensorflow"
author = "The mesh_tensorflow authors"
copyright = "The mesh_tensorflow authors, Apache-2.0"  # pylint: disable=redefined-builtin

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_ext"]

myst_enable_extensions = ["colon_fence"]
myst_heading_anchors = 3  # links such as layouts.md#the-cost-model

# Docstrings write code as `x` (Markdown style): show it as code.
default_role = "code"
autodoc_default_options = {"members": True, "member-order": "bysource"}
autodoc_typehints = "signature"
autodoc_typehints_format = "short"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
# Types named in docstrings ("a dict of name -> tensor") are prose, not
# cross-reference targets; links between pages are still checked (-n).
nitpick_ignore_regex = [(r"py:.*", r".*")]

html_theme = "alabaster"
html_title = "mesh_tensorflow"


_CODE_SPAN = re.compile(r"(``.*?``|`[^`]*`)")


def _escape_markup(line: str) -> str:
  """Escapes the characters reStructuredText would read as markup (`*`, `|`,
  a trailing `_`) outside code spans, so that plain-text docstrings
  ("x * y", "a | b", "**kwargs") render as written; a code span glued to a
  word ("`Dimension`s") gets the escaped space reStructuredText needs."""
  bullet = re.match(r"^(\s*[-*] )", line)
  head = bullet.group(1) if bullet else ""
  parts = _CODE_SPAN.split(line[len(head):])
  for i in range(0, len(parts), 2):
    parts[i] = re.sub(r"([*|])", r"\\\1", parts[i])
    parts[i] = re.sub(r"(\w)_\b", r"\1\\_", parts[i])
    if i > 0 and re.match(r"\w", parts[i]):
      parts[i] = "\\ " + parts[i]
    if i + 1 < len(parts) and re.search(r"\w$", parts[i]):
      parts[i] += "\\ "
  return head + "".join(parts)


def _indent(line: str) -> int:
  return len(line) - len(line.lstrip())


def _restructure(lines):
  """Docstrings are written as plain text: an indented block after a blank
  line is code, a list may follow its paragraph directly. reStructuredText
  reads the first as a block quote and the second as part of the paragraph;
  this makes the block literal and puts a blank line before the list."""
  out = []
  base = None  # indentation of the last paragraph line outside a block
  in_block = False
  for line in lines:
    stripped = line.strip()
    if not stripped:
      out.append(line)
      continue
    indent = _indent(line)
    previous = out[-1] if out else ""
    if in_block and indent > base:
      out.append(line)
      continue
    in_block = False
    if (base is not None and indent > base and not previous.strip()
        and not stripped.startswith((">>>", ".. ", ":"))
        and not re.match(r"^\s*([-*]|\d+\.) ", line)):
      last_text = next((l for l in reversed(out) if l.strip()), "")
      if not last_text.rstrip().endswith("::") and not last_text.lstrip().startswith((".. ", ":")):
        out.extend([" " * base + "::", ""])
      in_block = True
      out.append(line)
      continue
    if (re.match(r"^\s*[-*] ", line) and previous.strip()
        and not re.match(r"^\s*[-*] ", previous) and _indent(previous) == indent):
      out.append("")
    out.append(line)
    base = indent
  return out


def _process_docstring(app, what, name, obj, options, lines):  # pylint: disable=unused-argument
  lines[:] = _restructure(lines)
  in_literal = False
  literal_indent = 0
  for i, line in enumerate(lines):
    stripped = line.strip()
    if in_literal and stripped and _indent(line) <= literal_indent:
      in_literal = False
    if stripped.endswith("::"):
      in_literal, literal_indent = True, _indent(line)
      continue
    if in_literal or stripped.startswith((">>>", "...")) or stripped.startswith(".. "):
      continue
    lines[i] = _escape_markup(line)


def _skip_borrowed_function(app, what, name, obj, skip, options):  # pylint: disable=unused-argument
  """A dataclass field whose default is a function defined elsewhere (e.g.
  RunConfig.dataset_fn) is documented as the field, not as a method."""
  if what == "class" and callable(obj) and hasattr(obj, "__qualname__"):
    if "." not in obj.__qualname__ and not isinstance(obj, type):
      return True
  return None


def setup(app):
  from pygments.lexers.python import PythonLexer  # pylint: disable=g-import-not-at-top
  app.add_lexer("gin", PythonLexer)  # gin bindings are Python-like
  app.connect("autodoc-process-docstring", _process_docstring)
  app.connect("autodoc-skip-member", _skip_borrowed_function)
