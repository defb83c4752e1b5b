"""Helpers shared by the mesh_tensorflow tests and oss_scripts/stress_layouts.py."""

from __future__ import annotations

from typing import Callable, Dict, Sequence

import numpy as np
import tensorflow as tf

import mesh_tensorflow as mtf

DEVICES = ["cpu:%d" % i for i in range(8)]

# Mesh shapes and legal layouts for tensors over batch:8, hidden:16, mid:8
# and out:4 (the dimensions of the small models in the tests).
MESHES = {
    "all:8": ["", "batch:all", "hidden:all", "mid:all"],
    "rows:2;cols:4": ["", "batch:rows;hidden:cols", "hidden:rows;out:cols",
                      "batch:cols;out:rows", "mid:cols;batch:rows"],
    "a:2;b:2;c:2": ["", "batch:a;hidden:b;out:c", "hidden:a;batch:c;mid:b"],
}


def ensure_eight_devices() -> None:
  """Splits the CPU into 8 logical devices if TF has not initialized yet."""
  cpu = tf.config.list_physical_devices("CPU")[0]
  try:
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * 8)
  except RuntimeError:
    # Already initialized: fine if the split was done before.
    if len(tf.config.list_logical_devices("CPU")) < 8:
      raise


def make_impl(mesh_shape, layout, devices: Sequence[str] = DEVICES, **kwargs):
  """A PlacementMeshImpl on the first mesh-size devices."""
  size = mtf.convert_to_shape(mesh_shape).size
  return mtf.placement_mesh_impl.PlacementMeshImpl(
      mesh_shape, layout, list(devices)[:size], **kwargs)


def lower_and_run(builder: Callable[[mtf.Mesh], Dict[str, mtf.Tensor]], mesh_shape,
                  layout, devices: Sequence[str] = DEVICES, mode: str = "function",
                  return_lowering: bool = False, **impl_kwargs):
  """Builds a graph with builder(mesh) -> {key: mtf.Tensor}, lowers it with a
  PlacementMeshImpl and returns {key: numpy value}.

  Args:
    builder: builds the mtf graph on the given mesh; returns the tensors to
      export (keys are free-form).
    mesh_shape: e.g. "rows:2;cols:4".
    layout: layout rules, e.g. "batch:rows".
    devices: one device per processor (the first mesh-size are used).
    mode: "function" (lower inside a tf.function) or "eager".
    return_lowering: also return the Lowering (its counters).
    **impl_kwargs: passed to PlacementMeshImpl (e.g. collectives=...).
  """
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  outputs = builder(mesh)
  impl = make_impl(mesh_shape, layout, devices, **impl_kwargs)
  keys = sorted(outputs)
  holder = {}

  def run():
    lowering = mtf.Lowering(graph, {mesh: impl})
    holder["lowering"] = lowering
    return [lowering.export_to_tf_tensor(outputs[k]) for k in keys]
  values = tf.function(run)() if mode == "function" else run()
  result = {k: v.numpy() for k, v in zip(keys, values)}
  if return_lowering:
    return result, holder["lowering"]
  return result


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


def assert_allclose(actual, expected, rtol=1e-5, atol=1e-5, msg=""):
  np.testing.assert_allclose(np.asarray(actual), np.asarray(expected), rtol=rtol,
                             atol=atol, err_msg=msg)


def import_mnist_example():
  """examples/mnist.py imported as module "mnist_example", once per process
  (its absl flags may only be defined once)."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  import os  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  name = "mnist_example"
  if name not in sys.modules:
    script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                          "examples", "mnist.py")
    spec = importlib.util.spec_from_file_location(name, script)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
  return sys.modules[name]
