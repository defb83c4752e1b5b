"""The transformer library's faces and module sizes.

`transformer`, `transformer_layers`, `attention` and `dataset` keep the
original's names but define nothing: each name comes from the module of its
concern, imported explicitly (no module adds names to another with
`setattr`), and every module of the model library stays readable (at most
800 lines).
"""

import ast
import inspect
import os

import pytest

from mesh_tensorflow.transformer import attention
from mesh_tensorflow.transformer import dataset
from mesh_tensorflow.transformer import transformer
from mesh_tensorflow.transformer import transformer_layers

PACKAGE_DIR = os.path.dirname(inspect.getfile(transformer))
MAX_LINES = 800
FACES = [transformer, transformer_layers, attention, dataset]


@pytest.mark.parametrize("face", FACES, ids=lambda m: m.__name__.rpartition(".")[2])
def test_face_defines_nothing(face):
  with open(face.__file__, encoding="utf-8") as f:
    tree = ast.parse(f.read())
  defined = [node.name for node in tree.body
             if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))]
  assert defined == []
  imported = [name for name, value in vars(face).items()
              if not name.startswith("__") and (inspect.isclass(value) or inspect.isfunction(value))]
  assert len(imported) > 10
  assert all(getattr(face, name).__module__ != face.__name__ for name in imported)


def test_faces_keep_the_original_names():
  assert transformer_layers.TalkingHeadsSelfAttention.__module__.endswith(
      ".talking_heads_attention")
  assert transformer_layers.Synthesizer.__module__.endswith(".attention_variants")
  assert transformer_layers.SeparableConv1DLayer.__module__.endswith(".convolution_layers")
  assert transformer.Unitransformer.__module__.endswith(".unitransformer")
  assert transformer.Bitransformer.__module__.endswith(".bitransformer")
  assert dataset.packed_parallel_tsv_dataset.__module__.endswith(".dataset_readers")
  assert attention.local_attention_1d.__module__.endswith(".local_and_synthetic_attention")


def _modules():
  return sorted(name for name in os.listdir(PACKAGE_DIR) if name.endswith(".py"))


def test_no_module_sets_names_on_another_module():
  offenders = []
  for name in _modules():
    with open(os.path.join(PACKAGE_DIR, name), encoding="utf-8") as f:
      tree = ast.parse(f.read())
    imported = set()
    for node in ast.walk(tree):
      if isinstance(node, (ast.Import, ast.ImportFrom)):
        imported.update(alias.asname or alias.name.split(".")[0] for alias in node.names)
    for node in ast.walk(tree):
      if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setattr"
          and isinstance(node.args[0], ast.Name) and node.args[0].id in imported):
        offenders.append(f"{name}:{node.lineno}")
  assert offenders == []


def test_every_module_of_the_package_is_at_most_800_lines():
  root = os.path.dirname(PACKAGE_DIR)
  sizes = {}
  for directory, _, files in os.walk(root):
    for name in files:
      if name.endswith(".py"):
        path = os.path.join(directory, name)
        with open(path, encoding="utf-8") as f:
          sizes[os.path.relpath(path, root)] = sum(1 for _ in f)
  assert len(sizes) > 150
  too_long = {name: n for name, n in sizes.items() if n > MAX_LINES}
  assert too_long == {}
