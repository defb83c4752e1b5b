"""Helpers of the mesh_tensorflow tests: the shared ones live in
`mesh_tensorflow.testing` (re-exported here), plus the tests' own."""

from __future__ import annotations

import contextlib

from typing import Callable, Dict

import numpy as np
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.testing import (  # noqa: F401 (re-exported)
    DEVICES, MESHES, assert_allclose, lower_and_run, make_impl, use_logical_cpus)


def ensure_eight_devices() -> None:
  """Eight logical CPU devices (see mesh_tensorflow.testing.use_logical_cpus)."""
  use_logical_cpus(8)


def full_and_incremental_logits(model, ids_np: np.ndarray, batch: mtf.Dimension,
                                length: mtf.Dimension) -> Callable[[mtf.Mesh], Dict[str, mtf.Tensor]]:
  """A lower_and_run builder for an autoregressive Unitransformer: "full",
  the logits of one pass over ids shifted right, and "incremental", the
  logits of decoding them one position at a time with cached keys and
  values; the two agree when incremental decoding is right."""
  def build(mesh):
    ids = mtf.import_tf_tensor(mesh, tf.constant(ids_np), [batch, length])
    full, _ = model.call_simple(mtf.shift(ids, 1, length, wrap=False), None, False,
                                mode="infer")
    vdtype = mtf.VariableDType()
    states, constants = model.first_part(mtf.zeros_like(ids), [batch], length, vdtype)
    fn = model.incremental_logits_fn([batch], length, vdtype, constants)
    steps = []
    for p in range(length.size):
      logits, states = fn(mtf.constant(mesh, p, dtype=tf.int32), ids, states)
      steps.append(logits)
    return {"full": full, "incremental": mtf.stack(steps, length.name, axis=1)}
  return build


def import_script(name: str, *path: str):
  """The repository file at `path` (e.g. "examples", "mnist.py") imported as
  module `name`, once per process (a script's absl flags may only be defined
  once); the directories stay off sys.path."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  import os  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  if name not in sys.modules:
    script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), *path)
    spec = importlib.util.spec_from_file_location(name, script)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    with _flags_left_as_they_were():
      spec.loader.exec_module(module)
  return sys.modules[name]


@contextlib.contextmanager
def _flags_left_as_they_were():
  """Runs a script's top level without changing absl's global flags: the
  absl flags it defines (often --model_dir, --train_steps, which programs
  imported elsewhere in this process define too) are removed afterwards and
  any it redefined are restored. Tests call a script's functions, not its
  main, so they never read its flags."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  registry = flags.FLAGS
  before = {flag_name: registry[flag_name] for flag_name in registry}
  overridable = {flag_name: flag.allow_override for flag_name, flag in before.items()}
  for flag in before.values():
    flag.allow_override = True  # the script may define the same names
  try:
    yield
  finally:
    for flag_name in list(registry):
      if before.get(flag_name) is not registry[flag_name]:
        delattr(registry, flag_name)
    for flag_name, flag in before.items():
      flag.allow_override = overridable[flag_name]
      if flag_name not in registry:
        registry[flag_name] = flag


def import_mnist_example():
  """examples/mnist.py imported as module "mnist_example"."""
  return import_script("mnist_example", "examples", "mnist.py")
