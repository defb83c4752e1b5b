"""auto_mtf: legal layouts, mesh shapes, search, budgets and clear errors."""

import math

import numpy as np
import pytest

import mesh_tensorflow as mtf
from mesh_tensorflow import auto_mtf
from mesh_tensorflow.analysis import cost_model


def mlp_graph(batch=16, features=8, hidden=64, classes=4, optimizer=None):
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  b = mtf.Dimension("batch", batch)
  f = mtf.Dimension("features", features)
  h = mtf.Dimension("hidden", hidden)
  c = mtf.Dimension("classes", classes)
  x = mtf.import_tf_tensor(mesh, np.ones((batch, features), np.float32), [b, f])
  y = mtf.import_tf_tensor(mesh, np.zeros((batch,), np.int32), [b])
  w1 = mtf.get_variable(mesh, "w1", [f, h])
  w2 = mtf.get_variable(mesh, "w2", [h, c])
  logits = mtf.einsum([mtf.relu(mtf.einsum([x, w1], output_shape=[b, h])), w2],
                      output_shape=[b, c])
  loss = mtf.reduce_mean(mtf.layers.softmax_cross_entropy_with_logits(logits, y, c))
  variables = graph.trainable_variables
  grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
  opt = optimizer or mtf.optimize.SgdOptimizer(0.1)
  opt.apply_grads(grads, variables)
  return graph, loss


def is_legal(graph, mesh_shape, rules):
  try:
    for op in graph.operations:
      for t in op.outputs:
        rules.tensor_layout(t.shape, mtf.convert_to_shape(mesh_shape), t.name)
    return True
  except ValueError:
    return False


def test_package_and_original_import_paths():
  assert mtf.auto_mtf is auto_mtf
  from mesh_tensorflow.auto_mtf import layout, layout_and_mesh_shape
  assert layout is mtf.auto_mtf.layout and callable(layout_and_mesh_shape)


def test_mesh_shapes_are_factorizations():
  assert [s.to_string() for s in auto_mtf.mesh_shapes(8)] == [
      "all:8", "rows:2;cols:4", "rows:4;cols:2"]
  three = [s.to_string() for s in auto_mtf.mesh_shapes(8, max_mesh_dimensions=3)]
  assert "d0:2;d1:2;d2:2" in three and len(three) == 4
  assert all(s.size == 12 for s in auto_mtf.mesh_shapes(12))
  with pytest.raises(auto_mtf.LayoutSearchError, match="num_devices must be a positive int"):
    auto_mtf.mesh_shapes(0)


def test_legal_layouts_are_all_legal_and_complete():
  graph, _ = mlp_graph()
  layouts = list(auto_mtf.legal_layouts(graph, "rows:2;cols:4"))
  assert len(layouts) == len(set(layouts))
  assert all(is_legal(graph, "rows:2;cols:4", r) for r in layouts)
  # Complete: every assignment of the four dimension names that is legal appears.
  names = ["batch", "features", "hidden", "classes"]
  count = 0
  for choice in np.ndindex(*([3] * len(names))):
    rules = mtf.LayoutRules([(n, ["rows", "cols"][c - 1]) for n, c in zip(names, choice) if c])
    count += is_legal(graph, "rows:2;cols:4", rules)
  assert count == len(layouts)
  # On one mesh dimension at most one name can be split (all co-occur), and
  # classes:4 is not divisible by 8.
  one_d = {r.to_string() for r in auto_mtf.legal_layouts(graph, "all:8")}
  assert one_d == {"", "batch:all", "features:all", "hidden:all"}


def test_layout_picks_the_lowest_estimate():
  graph, loss = mlp_graph()
  rules = auto_mtf.layout(graph, "rows:2;cols:4", [loss], objective="step_time")
  assert isinstance(rules, mtf.LayoutRules)
  best = min(cost_model.estimate(graph, "rows:2;cols:4", r).step_time_s
             for r in auto_mtf.legal_layouts(graph, "rows:2;cols:4"))
  assert cost_model.estimate(graph, "rows:2;cols:4", rules).step_time_s == pytest.approx(best)


def test_layout_defaults_to_least_memory_as_the_original():
  graph, loss = mlp_graph()
  rules = auto_mtf.layout(graph, "rows:2;cols:4", [loss])
  estimates = {r: cost_model.estimate(graph, "rows:2;cols:4", r)
               for r in auto_mtf.legal_layouts(graph, "rows:2;cols:4")}
  least = min(e.memory.peak_bytes for e in estimates.values())
  assert estimates[rules].memory.peak_bytes == least
  fastest_at_least = min(e.step_time_s for e in estimates.values()
                         if e.memory.peak_bytes == least)
  assert estimates[rules].step_time_s == pytest.approx(fastest_at_least)
  # The fastest layout of this small MLP on 2 shared cores needs more memory.
  fast = auto_mtf.layout(graph, "rows:2;cols:4", [loss], objective="step_time")
  assert estimates[fast].memory.peak_bytes > least
  with pytest.raises(auto_mtf.LayoutSearchError, match="objective='speed'"):
    auto_mtf.layout(graph, "rows:2;cols:4", [loss], objective="speed")


def test_original_auto_mtf_example():
  """The original's api example: a:10, b:5, c:20 on m1:4;m2:2 split a over
  m2 and c over m1 (each processor holds an eighth of z), b stays whole."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "my_mesh")
  x = mtf.zeros(mesh, "a:10,b:5")
  y = mtf.zeros(mesh, "b:5,c:20")
  z = mtf.einsum([x, y], "a:10,c:20")
  mesh_shape = mtf.convert_to_shape("m1:4,m2:2")
  a, b, c = (mtf.Dimension(*d) for d in [("a", 10), ("b", 5), ("c", 20)])
  rules = mtf.auto_mtf.layout(graph, mesh_shape, [z])
  assert [rules.tensor_dimension_to_mesh_axis(d, mesh_shape) for d in (a, b, c)] == [1, None, 0]

  rules, shape = mtf.auto_mtf.layout_and_mesh_shape(graph, 8, [z])
  assert shape == mtf.Shape([mtf.Dimension("mesh_0", 4), mtf.Dimension("mesh_1", 2)])
  assert [rules.tensor_dimension_to_mesh_axis(d, shape) for d in (a, b, c)] == [1, None, 0]
  # One mesh dimension of 8 divides neither a nor c.
  rules, shape = mtf.auto_mtf.layout_and_mesh_shape(graph, 8, [z], 1)
  assert shape == mtf.Shape([mtf.Dimension("mesh_0", 8)]) and not rules.pairs


def test_factorizations_are_the_original_mesh_shapes():
  from mesh_tensorflow.auto_mtf import api  # pylint: disable=g-import-not-at-top
  assert list(auto_mtf.factorizations(1)) == [[1]]
  assert list(auto_mtf.factorizations(8)) == [[8], [4, 2], [2, 2, 2]]
  assert list(auto_mtf.factorizations(512, 2)) == [[512], [256, 2], [128, 4], [64, 8], [32, 16]]
  all_512 = list(api._mesh_shape_iterator(512))  # pylint: disable=protected-access
  assert len(all_512) == 30 and len(set(map(tuple, all_512))) == 30
  assert all(math.prod(s) == 512 and s == sorted(s, reverse=True) for s in all_512)
  assert [s.to_string() for s in auto_mtf.original_mesh_shapes(8, None)] == [
      "mesh_0:8", "mesh_0:4;mesh_1:2", "mesh_0:2;mesh_1:2;mesh_2:2"]


def test_layout_and_mesh_shape_returns_rules_and_shape():
  graph, loss = mlp_graph()
  for objective in ("memory", "step_time"):
    rules, shape = auto_mtf.layout_and_mesh_shape(graph, 8, [loss], objective=objective)
    assert shape.size == 8 and shape.to_string() in {
        s.to_string() for s in auto_mtf.original_mesh_shapes(8)}
    assert is_legal(graph, shape, rules)


def test_memory_budget_excludes_layouts_that_do_not_fit():
  graph, _ = mlp_graph(hidden=2048, optimizer=mtf.optimize.AdamWeightDecayOptimizer(0.01))
  free = auto_mtf.search(graph, "all:8")
  budget = int(free.best.memory_bytes * 0.5)
  result = auto_mtf.search(graph, "all:8", memory_budget_bytes=budget)
  assert result.best.memory_bytes <= budget < free.best.memory_bytes
  assert result.layout != free.layout
  assert all(c.fits == (c.memory_bytes <= budget) for c in result.candidates)
  text = result.explain()
  assert "picked mesh 'all:8'" in text and "memory budget" in text


def test_budget_nothing_fits_names_what_does_not_fit():
  graph, _ = mlp_graph(hidden=2048)
  with pytest.raises(auto_mtf.NoLayoutFitsError) as info:
    auto_mtf.search(graph, "all:8", memory_budget_bytes=1000)
  message = str(info.value)
  assert "no legal layout fits memory_budget_bytes=1000" in message
  assert "largest variable slice is 'w1'" in message
  assert "Raise the budget" in message


def test_required_rules_that_are_illegal_give_a_clear_error():
  graph, _ = mlp_graph(batch=12)
  with pytest.raises(auto_mtf.LayoutSearchError,
                     match=r"no legal layout contains the required rules 'batch:all'.*"
                     r"does not divide dimension 'batch'"):
    auto_mtf.search(graph, "all:8", fixed="batch:all")
  with pytest.raises(auto_mtf.LayoutSearchError, match="has no operations"):
    auto_mtf.search(mtf.Graph(), "all:8")
  with pytest.raises(auto_mtf.LayoutSearchError, match="give mesh_shape"):
    auto_mtf.search(graph)


def test_fixed_rules_are_kept():
  graph, _ = mlp_graph()
  result = auto_mtf.search(graph, "rows:2;cols:4", fixed="batch:rows")
  assert ("batch", "rows") in result.layout.pairs
  assert all(("batch", "rows") in c.layout.pairs for c in result.candidates)


def test_beam_search_and_time_limit():
  graph, _ = mlp_graph()
  exhaustive = auto_mtf.search(graph, "rows:2;cols:4", method="exhaustive")
  beam = auto_mtf.search(graph, "rows:2;cols:4", method="beam", beam_width=3)
  assert beam.method == "beam" and exhaustive.method == "exhaustive"
  assert exhaustive.legal == exhaustive.evaluated
  assert beam.best.step_time_s >= exhaustive.best.step_time_s
  assert beam.best.step_time_s <= 1.5 * exhaustive.best.step_time_s
  quick = auto_mtf.search(graph, "rows:2;cols:4", method="exhaustive", time_limit_s=0.0)
  assert quick.timed_out and quick.evaluated >= 1
  assert "stopped by time limit" in quick.explain()


def test_explain_lists_top_candidates():
  graph, loss = mlp_graph()
  text = auto_mtf.explain(graph, "rows:2;cols:4", [loss], top=3)
  lines = [l for l in text.splitlines() if l.strip()[:2].strip().isdigit()]
  assert len(lines) == 3
  assert "step ms" in text and "mem/proc" in text
