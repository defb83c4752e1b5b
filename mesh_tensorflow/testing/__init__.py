"""Shared support for the tests, benchmarks and stress scripts: eight logical
CPU devices, lowering a graph under a layout and comparing with NumPy.

Split the CPU before TensorFlow initializes its devices (before any tensor is
made), then build, lower and compare:

    >>> from mesh_tensorflow import testing
    >>> testing.use_logical_cpus(8)
    >>> def build(mesh):
    ...   x = mtf.import_tf_tensor(mesh, tf.ones([8, 4]), "batch:8;d:4")
    ...   return {"sum": mtf.reduce_sum(x, reduced_dim=mtf.Dimension("d", 4))}
    >>> values = testing.lower_and_run(build, "rows:2;cols:4", "batch:rows")
    >>> testing.assert_allclose(values["sum"], np.full([8], 4.0))
"""

from __future__ import annotations

from typing import Callable, Dict, Sequence

import numpy as np
import tensorflow as tf

import mesh_tensorflow as mtf

DEVICES = ["cpu:%d" % i for i in range(8)]

# Mesh shapes and legal layouts for tensors over batch:8, hidden:16, mid:8
# and out:4 (the dimensions of the small models of the tests).
MESHES = {
    "all:8": ["", "batch:all", "hidden:all", "mid:all"],
    "rows:2;cols:4": ["", "batch:rows;hidden:cols", "hidden:rows;out:cols",
                      "batch:cols;out:rows", "mid:cols;batch:rows"],
    "a:2;b:2;c:2": ["", "batch:a;hidden:b;out:c", "hidden:a;batch:c;mid:b"],
}


def use_logical_cpus(num_devices: int = 8) -> None:
  """Splits the first CPU into `num_devices` logical devices ("cpu:0", ...).

  Call it before TensorFlow initializes its devices. Afterwards it is a no-op
  when at least `num_devices` logical CPUs exist already.

  Raises:
    RuntimeError: TensorFlow has initialized fewer logical CPUs; call this
      before anything makes a tensor.

  Example:
    >>> use_logical_cpus(8)
  """
  cpu = tf.config.list_physical_devices("CPU")[0]
  try:
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * num_devices)
  except RuntimeError as e:
    have = len(tf.config.list_logical_devices("CPU"))
    if have < num_devices:
      raise RuntimeError(
          f"use_logical_cpus({num_devices}): TensorFlow already initialized {have} "
          "logical CPU(s); call it before anything creates a tensor.") from e


def make_impl(mesh_shape, layout, devices: Sequence[str] = DEVICES,
              **kwargs) -> mtf.MeshImpl:
  """A PlacementMeshImpl of `mesh_shape` and `layout` on the first mesh-size
  `devices`; `kwargs` go to PlacementMeshImpl (e.g. collectives=...).

  Example:
    >>> impl = make_impl("rows:2;cols:4", "batch:rows")
  """
  size = mtf.convert_to_shape(mesh_shape).size
  return mtf.placement_mesh_impl.PlacementMeshImpl(
      mesh_shape, layout, list(devices)[:size], **kwargs)


def lower_and_run(builder: Callable[[mtf.Mesh], Dict[str, mtf.Tensor]], mesh_shape,
                  layout, devices: Sequence[str] = DEVICES, mode: str = "function",
                  return_lowering: bool = False, return_variables: bool = False,
                  **impl_kwargs):
  """Builds a graph with `builder(mesh) -> {key: mtf.Tensor}`, lowers it with a
  PlacementMeshImpl and returns {key: NumPy value}.

  Args:
    builder: builds the mtf graph on the given mesh; returns the tensors to
      export (keys are free-form).
    mesh_shape: e.g. "rows:2;cols:4".
    layout: layout rules, e.g. "batch:rows".
    devices: one device per processor (the first mesh-size are used).
    mode: "function" (lower inside a tf.function) or "eager".
    return_lowering: also return the Lowering (its counters).
    return_variables: also return {variable name: NumPy value} of the
      graph's trainable variables.
    **impl_kwargs: passed to PlacementMeshImpl (e.g. collectives=...).

  Returns:
    The values; with return_variables, (values, variable values); with
    return_lowering, the Lowering last.

  Example:
    >>> values = lower_and_run(build, "all:8", "batch:all")
  """
  if mode not in ("function", "eager"):
    raise ValueError(f"lower_and_run: mode must be 'function' or 'eager', got {mode!r}.")
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  outputs = builder(mesh)
  variables = ({v.name: v.outputs[0] for v in graph.trainable_variables}
               if return_variables else {})
  impl = make_impl(mesh_shape, layout, devices, **impl_kwargs)
  keys, names = sorted(outputs), sorted(variables)
  holder = {}

  def run():
    lowering = mtf.Lowering(graph, {mesh: impl})
    holder["lowering"] = lowering
    return ([lowering.export_to_tf_tensor(outputs[k]) for k in keys],
            [lowering.export_to_tf_tensor(variables[n]) for n in names])
  values, variable_values = tf.function(run)() if mode == "function" else run()
  result = ({k: v.numpy() for k, v in zip(keys, values)},)
  if return_variables:
    result += ({n: v.numpy() for n, v in zip(names, variable_values)},)
  if return_lowering:
    result += (holder["lowering"],)
  return result[0] if len(result) == 1 else result


def assert_allclose(actual, expected, rtol: float = 1e-5, atol: float = 1e-5,
                    msg: str = "") -> None:
  """NumPy's assert_allclose with this library's default tolerances.

  Example:
    >>> assert_allclose(values["y"], x @ w, rtol=1e-4)
  """
  np.testing.assert_allclose(np.asarray(actual), np.asarray(expected), rtol=rtol,
                             atol=atol, err_msg=msg)
