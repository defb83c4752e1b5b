"""The models measured by the benchmarks, written twice: in mtf, and as plain
single-device TensorFlow with the same math (the baseline of every ratio).

The models live in `mesh_tensorflow.testing.reference_models` (the device check uses
them too); this module keeps the benchmarks' call forms, at the default sizes.
"""

from __future__ import annotations

import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.testing import reference_models as rm
from mesh_tensorflow.testing.reference_models import (  # noqa: F401  re-exported
    LR, MLP, MLP_INPUT_NAMES, TRANSFORMER, TRANSFORMER_INPUT_NAMES, mlp_loss, mlp_variables,
    sgd_step_fn, transformer_loss, transformer_variables)

_init = rm.initial_value


def mlp_data(seed=0):
  return rm.mlp_data(MLP, seed)


def transformer_data(seed=0):
  return rm.transformer_data(TRANSFORMER, seed)


def build_mtf_mlp(images, labels):
  """Returns (graph, mesh, loss, update_ops) for one SGD step."""
  graph, mesh, loss = rm.build_mtf_mlp(images, labels)
  return graph, mesh, loss, rm.sgd_updates(graph, loss)


def build_mtf_transformer(ids, targets):
  """Two transformer blocks (attention + ReLU FFN) with an embedding and a
  softmax output; one SGD step: (graph, mesh, loss, update_ops)."""
  graph, mesh, loss = rm.build_mtf_transformer(ids, targets)
  return graph, mesh, loss, rm.sgd_updates(graph, loss)


def mtf_step_fn(builder, data, mesh_shape, layout, devices):
  """A compiled train step (tf.function) of an mtf model under a layout."""
  impl = mtf.placement_mesh_impl.PlacementMeshImpl(mesh_shape, layout, devices)
  data = [tf.constant(d) for d in data]

  @tf.function
  def step():
    graph, mesh, loss, updates = builder(*data)
    lowering = mtf.Lowering(graph, {mesh: impl})
    tf_loss = lowering.export_to_tf_tensor(loss)
    with tf.control_dependencies([lowering.lowered_operation(u) for u in updates]):
      return tf.identity(tf_loss)
  return step


_plain_variable = rm.plain_variable


def plain_mlp_step_fn(images, labels):
  return sgd_step_fn(mlp_loss, mlp_variables(_plain_variable),
                     [tf.constant(images), tf.constant(labels)])


def plain_transformer_step_fn(ids, targets):
  return sgd_step_fn(transformer_loss, transformer_variables(_plain_variable),
                     [tf.constant(ids), tf.constant(targets)])
