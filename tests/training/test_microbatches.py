"""mtf.serialize_training_step: micro-batches give the whole batch's loss,
gradients and per-example outputs, under any layout, and run one after the
other (each waits for the previous one's gradients)."""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mtf_test_utils import DEVICES, lower_and_run

BATCH, D_IN, D_OUT = 8, 6, 4
X = np.random.RandomState(0).randn(BATCH, D_IN).astype(np.float32)
Y = np.random.RandomState(1).randn(BATCH, D_OUT).astype(np.float32)
batch = mtf.Dimension("batch", BATCH)
d_in, d_out, d_h = mtf.Dimension("d_in", D_IN), mtf.Dimension("d_out", D_OUT), mtf.Dimension("h", 8)


def _model_fn():
  """The loss is summed over examples and divided by the whole batch size, so
  micro-batch losses add up to the whole batch's."""
  def model_fn(features):
    x, y = features["x"], features["y"]
    h = mtf.layers.dense(x, d_h, reduced_dims=[d_in], activation=mtf.tanh)   # default name
    pred = mtf.layers.dense(h, d_out, reduced_dims=[d_h], name="out")
    err = mtf.reduce_sum(mtf.square(pred - y) * features["weight"])
    return {"loss": err * (1.0 / BATCH), "pred": pred}
  return model_fn


def _build(mesh, num_splits):
  features = {"x": mtf.import_tf_tensor(mesh, X, [batch, d_in]),
              "y": mtf.import_tf_tensor(mesh, Y, [batch, d_out]),
              "weight": mtf.constant(mesh, 0.5, [d_out])}   # no batch dim: given whole
  if num_splits is None:
    outputs = _model_fn()(features)
    variables = mesh.graph.trainable_variables
    grads = mtf.gradients([outputs["loss"]], [v.outputs[0] for v in variables])
  else:
    grads, outputs = mtf.serialize_training_step(features, _model_fn(), batch,
                                                 num_splits)
    variables = mesh.graph.trainable_variables
  assert sorted(v.name for v in variables) == ["dense/bias", "dense/kernel", "out/bias",
                                               "out/kernel"]
  result = {"loss": outputs["loss"], "pred": outputs["pred"]}
  result.update({f"grad/{v.name}": g for v, g in zip(variables, grads)})
  return result


@pytest.mark.parametrize("mesh_shape,layout,num_splits", [
    ("all:1", "", 4), ("all:2", "batch:all", 2), ("rows:2;cols:4", "batch:rows;h:cols", 4)])
def test_micro_batches_give_the_whole_batch_results(mesh_shape, layout, num_splits):
  devices = DEVICES[:mtf.convert_to_shape(mesh_shape).size]
  whole = lower_and_run(lambda mesh: _build(mesh, None), "all:1", "", DEVICES[:1])
  got = lower_and_run(lambda mesh: _build(mesh, num_splits), mesh_shape, layout, devices)
  assert sorted(got) == sorted(whole)
  for key in whole:
    np.testing.assert_allclose(got[key], whole[key], rtol=1e-5, atol=1e-6, err_msg=key)


def test_each_micro_batch_waits_for_the_previous_gradients():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  _build(mesh, 4)
  waits = [op for op in graph.operations if isinstance(op, mtf.Depend)]
  # Micro-batches 1..3 wait, for each of their two batched features.
  assert len(waits) == 3 * 2


def test_bad_arguments():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  features = {"x": mtf.import_tf_tensor(mesh, X, [batch, d_in])}
  with pytest.raises(ValueError, match="num_splits=3 must be a positive int dividing"):
    mtf.serialize_training_step(features, _model_fn(), batch, 3)
  with pytest.raises(ValueError, match="no feature has the batch dimension 'examples'"):
    mtf.serialize_training_step(features, _model_fn(), "examples", 2)
  with pytest.raises(ValueError, match="must return a dict with a scalar 'loss'"):
    mtf.serialize_training_step(features, lambda f: {"pred": f["x"]}, batch, 2)
  calls = []

  def new_variable_each_call(f):
    calls.append(1)
    w = mtf.get_variable(mesh, f"w{len(calls)}", [d_in])
    return {"loss": mtf.reduce_sum(f["x"] * w)}
  with pytest.raises(ValueError, match=r"made new variables \['w2'\] on micro-batch 1"):
    mtf.serialize_training_step(features, new_variable_each_call, batch, 2)


def test_cutting_and_joining_a_split_batch_moves_no_data():
  def build(mesh):
    x = mtf.import_tf_tensor(mesh, X, [batch, d_in])

    def model_fn(features):
      return {"loss": mtf.reduce_sum(features["x"]) * 0.0, "y": features["x"] * 2.0}
    _, outputs = mtf.serialize_training_step({"x": x}, model_fn, batch, 2)
    return {"y": outputs["y"]}
  got, lowering = lower_and_run(build, "rows:4;cols:2", "batch:rows;d_in:cols", DEVICES,
                                return_lowering=True)
  np.testing.assert_allclose(got["y"], X * 2.0)
  # Only the loss's scalar allreduce communicates.
  assert set(lowering.collective_counts()) <= {"allreduce"}
