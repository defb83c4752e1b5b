"""Mistakes users make get a clear error that names what is wrong.

ERROR_CASES is the table of cases; tests/ERRORS.md mirrors it for readers (a
test below keeps the two in sync). Each case builds what it needs, triggers
the mistake, and lists substrings the message must contain: the offending
tensor, dimension, mesh dimension or rule.
"""

import dataclasses
import os
import re
from typing import Callable, Tuple, Type

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf

from mtf_test_utils import DEVICES, make_impl


@dataclasses.dataclass(frozen=True)
class ErrorCase:
  id: str
  description: str
  trigger: Callable[[], object]
  error: Type[Exception]
  message_has: Tuple[str, ...]


def _mesh(name="mesh"):
  graph = mtf.Graph()
  return graph, mtf.Mesh(graph, name)


def _lower(graph, mesh, mesh_shape, layout, outputs):
  impl = make_impl(mesh_shape, layout)
  lowering = mtf.Lowering(graph, {mesh: impl})
  return [lowering.export_to_tf_tensor(t) for t in outputs]


def _binary_size_mismatch():
  _, mesh = _mesh()
  x = mtf.zeros(mesh, "batch:4;hidden:8", name="x")
  y = mtf.zeros(mesh, "hidden:6", name="y")
  return x + y


def _einsum_unknown_output_dim():
  _, mesh = _mesh()
  x = mtf.zeros(mesh, "batch:4;hidden:8", name="x")
  w = mtf.zeros(mesh, "hidden:8;out:2", name="w")
  return mtf.einsum([x, w], output_shape="batch:4;heads:2")


def _reshape_size_change():
  _, mesh = _mesh()
  x = mtf.zeros(mesh, "batch:4;hidden:8", name="x")
  return mtf.reshape(x, "batch:4;hidden:9")


def _einsum_two_sizes():
  _, mesh = _mesh()
  x = mtf.zeros(mesh, "batch:4;hidden:8", name="x")
  w = mtf.zeros(mesh, "hidden:16;out:2", name="w")
  return mtf.einsum([x, w], output_shape="batch:4;out:2")


def _shape_repeats_a_name():
  return mtf.convert_to_shape("hidden:8;hidden:4")


def _two_dims_one_mesh_dim():
  graph, mesh = _mesh()
  x = mtf.zeros(mesh, "batch:8;hidden:8", name="x")
  return _lower(graph, mesh, "all:8", "batch:all;hidden:all", [x])


def _mesh_dim_does_not_divide():
  graph, mesh = _mesh()
  x = mtf.zeros(mesh, "batch:6;hidden:8", name="x")
  return _lower(graph, mesh, "rows:4;cols:2", "batch:rows", [x])


def _rule_names_unknown_mesh_dim():
  return make_impl("rows:2;cols:4", "batch:columns")


def _too_few_devices():
  return mtf.placement_mesh_impl.PlacementMeshImpl("rows:2;cols:4", "", DEVICES[:6])


def _mesh_dim_of_size_zero():
  return mtf.placement_mesh_impl.PlacementMeshImpl("rows:0;cols:4", "", DEVICES)


def _run_negative_train_steps():
  from mesh_tensorflow.transformer import utils  # pylint: disable=g-import-not-at-top
  return utils.check_settings("train", train_steps=-5)


def _tensor_from_another_graph():
  _, mesh1 = _mesh()
  _, mesh2 = _mesh()
  x = mtf.zeros(mesh1, "batch:4", name="x")
  y = mtf.zeros(mesh2, "batch:4", name="from_other_graph")
  return x * y


def _tensor_from_another_mesh():
  graph = mtf.Graph()
  mesh1, mesh2 = mtf.Mesh(graph, "mesh_a"), mtf.Mesh(graph, "mesh_b")
  x = mtf.zeros(mesh1, "batch:4", name="x")
  y = mtf.zeros(mesh2, "batch:4", name="y")
  return x + y


def _lowered_twice_in_one_function():
  graph, mesh = _mesh()
  x = mtf.zeros(mesh, "batch:8", name="x")
  impl = make_impl("all:8", "batch:all")

  @tf.function
  def step():
    first = mtf.Lowering(graph, {mesh: impl}).export_to_tf_tensor(x)
    second = mtf.Lowering(graph, {mesh: impl}).export_to_tf_tensor(x)
    return first + second
  return step()


def _assign_wrong_shape():
  _, mesh = _mesh()
  w = mtf.get_variable(mesh, "weights", "hidden:8;out:2")
  return mtf.assign(w, mtf.zeros(mesh, "hidden:8;out:3", name="update"))


def _variable_other_shape():
  _, mesh = _mesh()
  mtf.get_variable(mesh, "weights", "hidden:8;out:2")
  return mtf.get_variable(mesh, "weights", "hidden:8;out:4")


def _gradient_through_op_without_gradient():
  _, mesh = _mesh()
  x = mtf.import_tf_tensor(mesh, tf.ones([4]), "batch:4", name="x")
  i0 = mtf.constant(mesh, 0, dtype=tf.int32)
  _, y = mtf.while_loop(lambda i, v: mtf.less(i, 3),
                        lambda i, v: [i + 1, v * 2.0], [i0, x], name="doubling_loop")
  return mtf.gradients([mtf.reduce_sum(y)], [x])


def _shape_string_missing_size():
  return mtf.convert_to_shape("batch:8;hidden")


def _shape_string_bad_size():
  return mtf.convert_to_shape("batch:8;hidden:big")


def _layout_string_missing_mesh_dim():
  return mtf.convert_to_layout_rules("batch:rows;hidden")


def _layout_two_mesh_dims_for_one_dim():
  return mtf.convert_to_layout_rules("batch:rows;batch:cols")


def _import_wrong_shape():
  _, mesh = _mesh()
  return mtf.import_tf_tensor(mesh, tf.zeros([4, 8]), "batch:4;hidden:6", name="images")


def _binary_dtype_mismatch():
  _, mesh = _mesh()
  x = mtf.zeros(mesh, "batch:4", name="x")
  n = mtf.zeros(mesh, "batch:4", dtype=tf.int32, name="counts")
  return x * n


def _python_truth_value():
  _, mesh = _mesh()
  return bool(mtf.zeros(mesh, "batch:4", name="x") > 0.0)


def _slice_out_of_range():
  _, mesh = _mesh()
  return mtf.slice(mtf.zeros(mesh, "length:8", name="x"), 6, 4, "length")


def _lowering_without_impl_for_mesh():
  graph = mtf.Graph()
  mesh1, mesh2 = mtf.Mesh(graph, "mesh_a"), mtf.Mesh(graph, "mesh_b")
  mtf.zeros(mesh1, "batch:4")
  mtf.zeros(mesh2, "batch:4")
  return mtf.Lowering(graph, {mesh1: make_impl("all:8", "")})


def _laid_out_wrong_slice_count():
  graph, mesh = _mesh()
  x = mtf.import_laid_out_tensor(mesh, [tf.zeros([2])] * 4, "batch:2", name="slices")
  return _lower(graph, mesh, "all:8", "", [x])


def _softmax_of_integers():
  graph, mesh = _mesh()
  ids = mtf.import_tf_tensor(mesh, tf.zeros([4, 8], tf.int32), "batch:4;vocab:8", name="ids")
  return mtf.softmax(ids, "vocab")


def _rate_where_is_training_goes():
  graph, mesh = _mesh()
  x = mtf.zeros(mesh, "batch:4;d_model:8")
  return mtf.layers.dense_relu_dense(x, mtf.Dimension("d_ff", 16), 0.1)


def _simd_lowering_outside_run():
  graph, mesh = _mesh()
  mtf.zeros(mesh, "batch:8")
  impl = mtf.simd_mesh_impl.SimdMeshImpl("all:8", "batch:all", DEVICES)
  return mtf.Lowering(graph, {mesh: impl})


ERROR_CASES = [
    ErrorCase("binary_size_mismatch",
              "Binary op on tensors whose same-named dimension has different sizes",
              _binary_size_mismatch, ValueError, ("'hidden'", "8", "6", "x:0", "y:0")),
    ErrorCase("einsum_unknown_output_dim",
              "einsum output_shape names a dimension that no input has",
              _einsum_unknown_output_dim, ValueError, ("'heads'", "no input")),
    ErrorCase("reshape_size_change",
              "reshape to a shape with a different number of elements",
              _reshape_size_change, ValueError, ("x:0", "32", "36")),
    ErrorCase("einsum_two_sizes",
              "One dimension name with two sizes among an op's inputs",
              _einsum_two_sizes, ValueError, ("'hidden'", "8", "16")),
    ErrorCase("shape_repeats_name",
              "A shape that repeats a dimension name",
              _shape_repeats_a_name, ValueError, ("'hidden'", "repeats")),
    ErrorCase("two_dims_one_mesh_dim",
              "Layout splitting two dimensions of one tensor over the same mesh dimension",
              _two_dims_one_mesh_dim, ValueError, ("'batch'", "'hidden'", "'all'")),
    ErrorCase("mesh_dim_does_not_divide",
              "Mesh dimension size does not divide the tensor dimension it splits",
              _mesh_dim_does_not_divide, ValueError, ("'rows'", "'batch'", "6", "4")),
    ErrorCase("rule_names_unknown_mesh_dim",
              "Layout rule names a mesh dimension the mesh does not have",
              _rule_names_unknown_mesh_dim, ValueError, ("'columns'", "batch:columns")),
    ErrorCase("simd_lowering_outside_run",
              "mtf.Lowering with a SimdMeshImpl outside SimdMeshImpl.run",
              _simd_lowering_outside_run, ValueError, ("SimdMeshImpl.run", "step_fn")),
    ErrorCase("device_count",
              "Number of devices differs from the number of processors in the mesh",
              _too_few_devices, ValueError, ("8 processors", "6 devices")),
    ErrorCase("mesh_dim_size_zero",
              "A mesh dimension of size 0",
              _mesh_dim_of_size_zero, ValueError, ("'rows'", "size 0")),
    ErrorCase("run_negative_train_steps",
              "A negative step count for the transformer's run",
              _run_negative_train_steps, ValueError, ("run.train_steps", "-5")),
    ErrorCase("tensor_from_other_graph",
              "Combining a tensor from another mtf.Graph",
              _tensor_from_another_graph, ValueError, ("from_other_graph", "mtf.Graph")),
    ErrorCase("tensor_from_other_mesh",
              "Combining tensors that live on different meshes",
              _tensor_from_another_mesh, ValueError, ("'mesh_a'", "'mesh_b'")),
    ErrorCase("lowered_twice",
              "Lowering the same graph twice inside one tf.function",
              _lowered_twice_in_one_function, ValueError, ("already lowered",)),
    ErrorCase("assign_wrong_shape",
              "assign a value whose shape differs from the variable's",
              _assign_wrong_shape, ValueError, ("'weights'", "out=3", "out=2")),
    ErrorCase("variable_other_shape",
              "get_variable again with the same name but another shape",
              _variable_other_shape, ValueError, ("'weights'", "out=2", "out=4")),
    ErrorCase("gradient_without_gradient",
              "Gradient through an op that has no gradient (while_loop)",
              _gradient_through_op_without_gradient, ValueError,
              ("doubling_loop", "no gradient", "x:0")),
    ErrorCase("shape_string_missing_size",
              "Shape string with a dimension lacking its size",
              _shape_string_missing_size, ValueError, ("'hidden'",)),
    ErrorCase("shape_string_bad_size",
              "Shape string whose size is not an integer",
              _shape_string_bad_size, ValueError, ("'hidden'", "'big'")),
    ErrorCase("layout_string_missing_mesh_dim",
              "Layout string with a rule lacking its mesh dimension",
              _layout_string_missing_mesh_dim, ValueError, ("'hidden'",)),
    ErrorCase("layout_two_mesh_dims",
              "Layout mapping one tensor dimension to two mesh dimensions",
              _layout_two_mesh_dims_for_one_dim, ValueError, ("'batch'", "'rows'", "'cols'")),
    ErrorCase("import_wrong_shape",
              "import_tf_tensor of a TensorFlow tensor whose shape differs from the mtf shape",
              _import_wrong_shape, ValueError, ("'images'", "[4, 8]", "[4, 6]")),
    ErrorCase("binary_dtype_mismatch",
              "Binary op on tensors of different dtypes",
              _binary_dtype_mismatch, TypeError, ("counts:0", "int32", "float32")),
    ErrorCase("python_truth_value",
              "Using an mtf tensor as a Python bool",
              _python_truth_value, TypeError, ("truth value", "mtf.where")),
    ErrorCase("slice_out_of_range",
              "slice beyond the end of the dimension",
              _slice_out_of_range, ValueError, ("'length'", "[6, 10)", "8")),
    ErrorCase("lowering_missing_mesh",
              "Lowering without a mesh implementation for every mesh",
              _lowering_without_impl_for_mesh, ValueError, ("'mesh_b'",)),
    ErrorCase("laid_out_slice_count",
              "import_laid_out_tensor with a slice count other than the mesh size",
              _laid_out_wrong_slice_count, ValueError, ("'slices'", "4 slices", "8 processors")),
    ErrorCase("softmax_of_integers",
              "softmax of an integer tensor",
              _softmax_of_integers, TypeError, ("ids:0", "int32", "cast")),
    ErrorCase("rate_where_is_training_goes",
              "A dropout rate passed where the original's is_training argument goes",
              _rate_where_is_training_goes, TypeError,
              ("dense_relu_dense", "is_training", "0.1", "dropout=")),
]


@pytest.mark.parametrize("case", ERROR_CASES, ids=[c.id for c in ERROR_CASES])
def test_error_message_names_the_culprit(case):
  with pytest.raises(case.error) as info:
    case.trigger()
  message = str(info.value)
  missing = [s for s in case.message_has if s not in message]
  assert not missing, f"{case.description}: message lacks {missing}:\n{message}"


def test_errors_md_mirrors_the_table():
  path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ERRORS.md")
  with open(path) as f:
    text = f.read()
  rows = re.findall(r"^\| `([a-z_]+)` \| (.+?) \| `(\w+)` \|", text, flags=re.M)
  assert [(i, d, e) for i, d, e in rows] == [
      (c.id, c.description, c.error.__name__) for c in ERROR_CASES]


def test_failed_op_constructor_leaves_graph_usable():
  """An op rejected by its constructor must not stay half-built in the graph."""
  graph, mesh = _mesh()
  x = mtf.import_tf_tensor(mesh, tf.constant(np.arange(8, dtype=np.float32)), "batch:8")
  n_ops = len(graph.operations)
  with pytest.raises(ValueError):
    mtf.import_tf_tensor(mesh, tf.zeros([3]), "batch:4")
  with pytest.raises(ValueError):
    mtf.constant(mesh, np.zeros([3]), "batch:4")
  with pytest.raises(ValueError):
    mtf.argmax(x, "no_such_dim")
  with pytest.raises(ValueError):
    mtf.cumsum(x, "no_such_dim")
  with pytest.raises(ValueError):
    mtf.add(x, mtf.zeros(mesh, "batch:4"))
  # Only the zeros of the last case were added; the graph still lowers.
  assert len(graph.operations) == n_ops + 1
  [y] = _lower(graph, mesh, "all:8", "", [x * 2.0])
  np.testing.assert_array_equal(y.numpy(), np.arange(8) * 2.0)


def test_illegal_layout_error_names_the_tensor_dims_in_tf_function():
  graph, mesh = _mesh()
  x = mtf.zeros(mesh, "batch:8;hidden:8", name="x")
  impl = make_impl("all:8", "batch:all;hidden:all")

  @tf.function
  def step():
    return mtf.Lowering(graph, {mesh: impl}).export_to_tf_tensor(x)
  with pytest.raises(ValueError, match="'batch' and 'hidden'"):
    step()
