"""The original auto_mtf modules: graph_interface, valid_layouts,
memory_estimator, scheduler, layout_optimizer and print_cp_model_solution,
backed by this library's search and cost model (no OR-Tools)."""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.auto_mtf import graph_interface
from mesh_tensorflow.auto_mtf import layout_optimizer
from mesh_tensorflow.auto_mtf import memory_estimator
from mesh_tensorflow.auto_mtf import print_cp_model_solution
from mesh_tensorflow.auto_mtf import scheduler
from mesh_tensorflow.auto_mtf import valid_layouts
from mtf_test_utils import DEVICES, assert_allclose, ensure_eight_devices, lower_and_run

ensure_eight_devices()


def _constant(mesh, shape, name):
  return mtf.Constant(mesh, 0, mtf.convert_to_shape(shape), tf.int32, name).outputs[0]


def _xyz_graph(two_outputs=True):
  """X [a:3,b:4] and Y [b:4,c:5] (int32) and one or two einsums Z1, Z2 [a,c]."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "my_mesh")
  x = _constant(mesh, "a:3,b:4", "X")
  y = _constant(mesh, "b:4,c:5", "Y")
  mtf.EinsumOperation([x, y], mtf.convert_to_shape("a:3,c:5"), name="Z1")
  if two_outputs:
    mtf.EinsumOperation([x, y], mtf.convert_to_shape("a:3,c:5"), name="Z2")
  return graph


# ------------------------------------------------------------------ GraphInterface
def test_graph_interface_names_shapes_sizes():
  graph = graph_interface.GraphInterface(_xyz_graph())
  assert graph.get_num_operations() == 4
  assert list(graph.get_all_operation_names()) == ["X", "Y", "Z1", "Z2"]
  assert list(graph.get_operation_input_names("Z1")) == ["X:0", "Y:0"]
  assert list(graph.get_operation_output_names("Y")) == ["Y:0"]
  assert list(graph.get_all_tensor_names()) == ["X:0", "Y:0", "Z1:0", "Z2:0"]
  assert graph.get_tensor_dtype("X:0") == tf.int32
  assert graph.get_tensor_shape("Y:0") == tf.TensorShape([4, 5])
  assert graph.get_tensor_num_entries("Z1:0") == 15
  assert graph.get_tensor_size("X:0") == 48
  # Split a over a mesh dimension of 2: ceil(12 / 2) entries.
  assert graph.get_tensor_num_entries("X:0", {"a": "m"}, {"m": 2}) == 6
  assert graph.get_tensor_size("X:0", {"b": "m", "c": "n"}, {"m": 4, "n": 5}) == 12
  assert graph.get_tensor_mtf_dimension_names("Z1:0") == ["a", "c"]
  assert graph.get_operation_mtf_dimension_names("Z1") == {"a", "b", "c"}
  assert graph.get_tensor_device("X:0") is None and graph.get_operation_device("X") is None
  assert graph.is_tensor_on_canonical_device("X:0")
  assert not graph.is_tensor_final("Z1:0")
  graph.set_tensor_final("Z1:0")
  assert graph.is_tensor_final("Z1:0")
  with pytest.raises(KeyError, match="no tensor named 'W:0'"):
    graph.get_tensor_size("W:0")
  with pytest.raises(TypeError, match="mtf.Graph or a tf.Graph"):
    graph_interface.GraphInterface("graph")


def test_graph_interface_cost_graph():
  graph = graph_interface.GraphInterface(_xyz_graph())
  graph.set_tensor_final("Z1:0")
  cost = graph.compute_cost_graph()
  assert [n.name for n in cost.node] == ["X", "Y", "Z1", "Z2"]
  assert [n.id for n in cost.node] == [0, 1, 2, 3]
  z1 = cost.node[2]
  assert [(i.preceding_node, i.preceding_port) for i in z1.input_info] == [(0, 0), (1, 0)]
  assert z1.output_info[0].size == 60 and z1.output_info[0].alias_input_port == -1
  assert z1.output_info[0].dtype == tf.int32.as_datatype_enum
  assert [d.size for d in z1.output_info[0].shape.dim] == [3, 5]
  assert z1.is_final and not cost.node[3].is_final
  # A serialized CostGraphDef round-trips.
  assert type(cost).FromString(cost.SerializeToString()) == cost


def test_graph_interface_tf_graph_devices():
  with tf.Graph().as_default() as tf_graph:
    with tf.device("/device:CPU:0"):
      x = tf.constant(np.zeros((3, 4), np.float32), name="X")
    with tf.device("/device:CPU:1"):
      tf.identity(x, name="Y")
  graph = graph_interface.GraphInterface(tf_graph, canonical_device="/device:CPU:0")
  assert list(graph.get_all_operation_names()) == ["X", "Y"]
  assert graph.get_tensor_size("X:0") == 48
  assert graph.get_tensor_mtf_dimension_names("X:0") == []
  assert graph.is_tensor_on_canonical_device("X:0")
  assert not graph.is_tensor_on_canonical_device("Y:0")
  cost = graph.compute_cost_graph(devices=["/device:CPU:0"])
  assert cost.node[0].output_info[0].size == 48
  assert cost.node[1].output_info[0].size == 0  # on a device not listed


def test_memory_contents_under_schedule():
  graph = graph_interface.GraphInterface(_xyz_graph())
  graph.set_tensor_final("Z1:0")
  contents = graph.compute_memory_contents_under_schedule([0, 1, 2, 3])
  assert contents == [frozenset({"X:0"}), frozenset({"X:0", "Y:0"}),
                      frozenset({"X:0", "Y:0", "Z1:0"}),
                      frozenset({"X:0", "Y:0", "Z1:0", "Z2:0"})]
  # Z2 is not final and nothing uses it: freed right away, as are X and Y.
  contents = graph.compute_memory_contents_under_schedule([0, 1, 3, 2])
  assert contents[2] == frozenset({"X:0", "Y:0", "Z2:0"})
  assert contents[3] == frozenset({"X:0", "Y:0", "Z1:0"})


# ------------------------------------------------------------------------ scheduler
@pytest.mark.parametrize("alg", ["NAIVE", "LIST"])
def test_schedules_are_topological(alg):
  graph = graph_interface.GraphInterface(_xyz_graph())
  graph.set_tensor_final("Z1:0")
  graph.set_tensor_final("Z2:0")
  schedule = scheduler.minimize_peak_memory(graph, alg)
  assert sorted(schedule[:2]) == [0, 1] and sorted(schedule[2:]) == [2, 3]


def test_list_scheduler_frees_memory_first():
  mtf_graph = mtf.Graph()
  mesh = mtf.Mesh(mtf_graph, "my_mesh")
  x = _constant(mesh, "a:3,b:4", "X")
  y = _constant(mesh, "b:4,c:5", "Y")
  mtf.EinsumOperation([x, y], mtf.convert_to_shape("a:3,b:4,c:5"), name="Z")
  w = mtf.EinsumOperation([x, y], mtf.convert_to_shape("a:3,c:5"), name="W").outputs[0]
  mtf.BroadcastOperation(w, mtf.convert_to_shape("a:3,b:4,c:5"), name="V")
  graph = graph_interface.GraphInterface(mtf_graph)
  graph.set_tensor_final("Z:0")
  graph.set_tensor_final("V:0")
  # Bytes freed: X -48 before Y -80; then W -60 before Z -240; after W, Z is
  # the last user of X and Y (-240 + 128 = -112) and V of W (-240 + 60 =
  # -180): Z, then V.
  assert scheduler.minimize_peak_memory(graph, "LIST") == [0, 1, 3, 2, 4]


def test_list_scheduler_single_and_unused_tensors():
  mtf_graph = mtf.Graph()
  mesh = mtf.Mesh(mtf_graph, "my_mesh")
  _constant(mesh, "a:4", "X")
  y = _constant(mesh, "b:3", "Y")
  mtf.BroadcastOperation(y, mtf.convert_to_shape("b:3,c:2"), name="Z")
  graph = graph_interface.GraphInterface(mtf_graph)
  # Nothing final: X is never used, costs nothing and runs first.
  assert scheduler.minimize_peak_memory(graph, "LIST") == [0, 1, 2]
  graph.set_tensor_final("X:0")
  graph.set_tensor_final("Z:0")
  # X holds 16 bytes for good, Y 12 bytes until Z runs: Y, Z, then X.
  assert scheduler.minimize_peak_memory(graph, "LIST") == [1, 2, 0]
  with pytest.raises(NotImplementedError, match="'GREEDY'"):
    scheduler.minimize_peak_memory(graph, "GREEDY")


# ------------------------------------------------------- LayoutValidator, estimator
def test_layout_validator():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "my_mesh")
  a, b = mtf.Dimension("a", 5), mtf.Dimension("b", 10)
  x1 = mtf.zeros(mesh, mtf.Shape([a, b, mtf.Dimension("concat", 15)]))
  x2 = mtf.zeros(mesh, mtf.Shape([a, b, mtf.Dimension("concat", 20)]))
  mtf.ConcatOperation([x1, x2], "concat")
  mtf.zeros(mesh, mtf.anonymous_shape(mtf.Shape([a, b])))
  validator = valid_layouts.LayoutValidator(graph, "m1:4;m2:2")
  # concat is unsplittable (concatenated), anonymous dimensions are skipped.
  assert validator.splittable_mtf_dimension_names == {"a", "b"}
  assert validator.mesh_dimension_name_to_size == {"m1": 4, "m2": 2}
  assert validator.is_valid_assignment("b", "m2")
  assert not validator.is_valid_assignment("b", "m1")  # 10 % 4
  assert not validator.is_valid_assignment("a", "m2")  # 5 % 2
  assert not validator.is_valid_assignment("concat", "m1")
  with pytest.raises(ValueError, match="no mesh dimension named 'm3'"):
    validator.is_valid_assignment("a", "m3")


def test_memory_estimator():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "lowering_context_mesh")
  x = _constant(mesh, "a:3,b:4", "X")
  y = _constant(mesh, "b:4,c:5", "Y")
  z = mtf.EinsumOperation([x, y], mtf.convert_to_shape("a:3,c:5"), name="Z").outputs[0]
  estimator = memory_estimator.MemoryEstimator(graph, mtf.Shape([("m1", 4), ("m2", 3)]), [z])
  validator = estimator.get_layout_validator()
  assert validator is estimator.get_layout_validator()
  assert validator.splittable_mtf_dimension_names == {"a", "b", "c"}
  assert not validator.is_valid_assignment("a", "m1")
  assert validator.is_valid_assignment("a", "m2")
  interface = estimator.get_graph_interface()
  assert sorted(interface.get_all_operation_names()) == ["X", "Y", "Z"]
  assert interface.get_tensor_shape("Z:0") == tf.TensorShape([3, 5])
  assert interface.is_tensor_final("Z:0") and not interface.is_tensor_final("Y:0")


# ------------------------------------------------------------------- LayoutOptimizer
def _einsum_graph(repeat=1):
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "my_mesh")
  x1 = mtf.zeros(mesh, "a:10,b:5")
  x2 = mtf.zeros(mesh, "b:5,c:20")
  for _ in range(repeat):
    mtf.einsum([x1, x2], "a:10,c:20")
  return graph, mesh, x1, x2


def _optimizer(graph, mesh_shape, **kwargs):
  return layout_optimizer.LayoutOptimizer(
      memory_estimator.MemoryEstimator(graph, mtf.convert_to_shape(mesh_shape)), **kwargs)


@pytest.mark.parametrize("repeat", [1, 30])
def test_layout_optimizer_minimizes_peak_memory(repeat):
  graph, _, _, _ = _einsum_graph(repeat)
  optimizer = _optimizer(graph, "m1:4,m2:2")
  layout = optimizer.solve()
  # b (5) divides by neither mesh dimension; a (10) only by m2; the einsum
  # holds a, b and c, so a and c need different mesh dimensions.
  assert layout == "a:m2;c:m1"
  value = optimizer.evaluate_layout(layout)
  for other in ["a:m1;b:m2", "a:m1;c:m2", "b:m1;a:m2", "b:m1;c:m2", "c:m1;b:m2", "", "c:m1"]:
    assert value <= optimizer.evaluate_layout(other)
  assert value == optimizer.evaluate_layout("c:m1;a:m2")


def test_layout_optimizer_peak_memory_value():
  graph, _, x1, x2 = _einsum_graph()
  optimizer = _optimizer(graph, "m1:4,m2:2")
  # Under a:m2;c:m1: x1 [a/2, b] 25 floats, x2 [b, c/4] 25, y [a/2, c/4] 25;
  # the peak holds all three: 300 bytes.
  assert optimizer.evaluate_layout("a:m2;c:m1") == 300.0
  assert optimizer.evaluate_layout("") == (50 + 100 + 200) * 4.0
  with pytest.raises(layout_optimizer.SolverError, match="'m9'"):
    optimizer.evaluate_layout("a:m9")
  del x1, x2


def test_layout_optimizer_unsplittable_and_tiebreak():
  graph, _, x1, x2 = _einsum_graph()
  # A size-1 mesh dimension changes no size: the tie goes to more splits.
  assert _optimizer(graph, "m1:4,m2:2,m3:1").solve() == "a:m2;b:m3;c:m1"
  mtf.UnstackOperation(x1, mtf.Dimension("a", 10))
  mtf.UnstackOperation(x2, mtf.Dimension("c", 20))
  # a and c are unstacked (unsplittable) and b (5) divides by neither.
  assert _optimizer(graph, "m1:4,m2:2").solve() == ""
  with pytest.raises(layout_optimizer.SolverError, match="no operations"):
    _optimizer(mtf.Graph(), "m1:2").solve()


def test_layout_optimizer_beam_matches_exhaustive():
  graph, _, _, _ = _einsum_graph(3)
  exhaustive = _optimizer(graph, "m1:4,m2:2").solve()
  assert _optimizer(graph, "m1:4,m2:2", max_exhaustive=1).solve() == exhaustive


def test_layout_optimizer_layout_runs_and_matches_one_device():
  """The chosen layout lowers and gives the one-device result."""
  x = np.random.RandomState(0).normal(size=(8, 16)).astype(np.float32)
  w = np.random.RandomState(1).normal(size=(16, 4)).astype(np.float32)

  def build(mesh):
    tx = mtf.import_tf_tensor(mesh, x, "batch:8;hidden:16")
    tw = mtf.import_tf_tensor(mesh, w, "hidden:16;out:4")
    return {"y": mtf.relu(mtf.einsum([tx, tw], "batch:8;out:4"))}
  graph = mtf.Graph()
  outputs = build(mtf.Mesh(graph, "mesh"))
  layout = _optimizer(graph, "rows:2;cols:4").solve()
  assert layout  # something is split
  got = lower_and_run(build, "rows:2;cols:4", layout, DEVICES)
  assert_allclose(got["y"], np.maximum(x @ w, 0), rtol=1e-4)
  del outputs


def test_original_private_helpers():
  assert layout_optimizer._global_var_name("cake", "lie") == "x_(cake:lie)"  # pylint: disable=protected-access
  local = layout_optimizer._local_var_name  # pylint: disable=protected-access
  assert local(frozenset(), {}) == "y_()"
  assert local(frozenset(["channel", "hidden"]), {"hidden": "x", "channel": "y"}) == \
      "y_(channel:y,hidden:x)"
  assert local(frozenset(["channel", "hidden"]), {"channel": "y"}) == "y_(channel:y,hidden)"
  assignments = layout_optimizer._generate_assignments({"s1", "s2", "s3"}, {"m1": 4, "m2": 8})  # pylint: disable=protected-access
  assert {} in assignments and {"s3": "m2"} in assignments
  assert {"s1": "m2", "s2": "m1"} in assignments
  assert {"s1": "m2", "s3": "m2"} not in assignments
  assert len(assignments) == 13  # 1 empty + 6 with one entry + 6 with two


# ---------------------------------------------------------------------- print_solution
def test_print_solution_of_the_layout_optimizer(capsys):
  graph, _, _, _ = _einsum_graph()
  optimizer = _optimizer(graph, "m1:4,m2:2")
  with pytest.raises(layout_optimizer.SolverError, match="solve"):
    optimizer.objective_value()
  optimizer.solve(print_solution=True)
  out = capsys.readouterr().out
  assert "  x_(a:m2) = 1\n" in out and "  x_(a:m1) = 0\n" in out and "  x_(c:m1) = 1\n" in out
  assert "Objective value: 300.0" in out


class _Proto:
  """Stand-ins for OR-Tools' CpModel and CpSolver protocol buffers."""

  def __init__(self, **kwargs):
    self.__dict__.update(kwargs)

  def HasField(self, name):  # pylint: disable=invalid-name
    return name in self.__dict__


def test_print_solution_of_a_cp_model(capsys):
  variables = [_Proto(name="x"), _Proto(name=""), _Proto(name="y")]
  model = _Proto(Proto=lambda: _Proto(
      variables=variables, objective=_Proto(vars=[0, 2], coeffs=[3, -2], scaling_factor=1.0)))
  solver = _Proto(ResponseProto=lambda: _Proto(solution=[1, 7, 4]), ObjectiveValue=lambda: -5.0)
  print_cp_model_solution.print_solution(model, solver)
  assert capsys.readouterr().out == "  x = 1\n  y = 4\nMinimize: 3 * x - 2 * y\nObjective value: -5.0\n\n"
  with pytest.raises(TypeError, match="LayoutOptimizer or an OR-Tools CpModel"):
    print_cp_model_solution.print_solution(object(), object())
