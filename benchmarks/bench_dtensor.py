"""The benchmark models in TensorFlow's own DTensor, for comparison in the same
run: the plain TF math of bench_models.py, with each variable and input laid
out by DTensor according to the same mtf mesh shape and layout rules.

DTensor propagates layouts to the activations and inserts the collectives
itself; only variables and inputs are annotated, as a DTensor user would.

    >>> step = dtensor_step_fn("mlp", bm.mlp_data(), "rows:2;cols:4",
    ...                        "batch:rows;hidden:cols")
    >>> float(step())
"""

from __future__ import annotations

from typing import Sequence

import tensorflow as tf
from tensorflow.experimental import dtensor

import bench_models as bm
import mesh_tensorflow as mtf


def _layout_fn(mesh: dtensor.Mesh, mesh_shape: str, layout: str):
  """Maps (value, mtf dimension names) to the dtensor.Layout that mtf's own
  layout rules give a tensor of that shape on that mesh."""
  rules = mtf.convert_to_layout_rules(layout)
  mesh_shape = mtf.convert_to_shape(mesh_shape)

  def layout_of(value, names: Sequence[str]) -> dtensor.Layout:
    shape = mtf.Shape([mtf.Dimension(n, s) for n, s in zip(names, value.shape)])
    axes = rules.tensor_layout(shape, mesh_shape)
    return dtensor.Layout(
        [dtensor.UNSHARDED if a is None else mesh_shape.dims[a].name for a in axes], mesh)
  return layout_of


def dtensor_step_fn(model: str, data, mesh_shape: str, layout: str):
  """A compiled SGD step (tf.function) of model "mlp" or "transformer" on a
  DTensor mesh of the logical CPUs."""
  dims = mtf.convert_to_shape(mesh_shape).dims
  mesh = dtensor.create_mesh([(d.name, d.size) for d in dims], device_type="CPU")
  layout_of = _layout_fn(mesh, mesh_shape, layout)

  def put(value, names):
    whole = dtensor.copy_to_mesh(tf.constant(value), dtensor.Layout.replicated(mesh, len(names)))
    return dtensor.relayout(whole, layout_of(value, names))

  def make_variable(value, names):
    return dtensor.DVariable(put(value, names))

  if model == "mlp":
    make_variables, loss_fn, input_names = bm.mlp_variables, bm.mlp_loss, bm.MLP_INPUT_NAMES
  else:
    # DTensor cannot gather from a variable split along the looked-up
    # dimension (ResourceGather wants dimension 0 unsharded); it can from the
    # value read from it.
    lookup = lambda table, ids: tf.gather(tf.convert_to_tensor(table), ids)
    make_variables, input_names = bm.transformer_variables, bm.TRANSFORMER_INPUT_NAMES
    loss_fn = lambda variables, *xs: bm.transformer_loss(variables, *xs, lookup=lookup)
  inputs = [put(value, names) for value, names in zip(data, input_names)]
  # DTensor cannot lay out ResourceScatterSub ("does not implement layout
  # propagation", whatever the table's layout): densify the embedding's
  # gradient.
  return bm.sgd_step_fn(loss_fn, make_variables(make_variable), inputs, sparse_updates=False)
