"""Communication plans (mesh_tensorflow/lowering/plans.py) and the observers
that count what the mesh implementations execute (lowering/observers.py).

A redistribution plan must reach its target layout with at most one
collective per mesh axis, and executing it must give exactly the slices the
target layout gives the full tensor. Observers must see every collective an
implementation runs, and nothing that a `silenced` realization runs.
"""

import threading

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import mesh_tensorflow as mtf
from mesh_tensorflow.lowering import observers
from mesh_tensorflow.lowering import einsum_plans, plans, statistics_plans
import mtf_test_utils

_SETTINGS = dict(deadline=None, derandomize=True,
                 suppress_health_check=[HealthCheck.too_slow])
SHAPE = mtf.convert_to_shape("a:4;b:8;c:2")
MESH = "rows:2;cols:2"


def _layouts(ndims: int, mesh_ndims: int):
  """Layouts of a tensor of ndims axes: each mesh axis splits at most one."""
  return st.lists(st.sampled_from([None] + list(range(mesh_ndims))), min_size=ndims,
                  max_size=ndims).filter(
      lambda l: len([a for a in l if a is not None]) == len({a for a in l if a is not None}))


@settings(max_examples=200, **_SETTINGS)
@given(_layouts(3, 3), _layouts(3, 3))
def test_relayout_plan_reaches_the_target_with_one_step_per_mesh_axis(source, target):
  plan = plans.plan_relayout(source, target)
  layout = tuple(source)
  for step, before in plan.walk():
    assert before == layout
    # Never a tensor axis split by two mesh axes at once.
    if isinstance(step, plans.AllToAll):
      assert before[step.split_axis] is None and before[step.concat_axis] == step.mesh_axis
    elif isinstance(step, plans.SliceAlong):
      assert before[step.tensor_axis] is None and step.mesh_axis not in before
    layout = step.apply(layout)
  assert layout == plan.target == tuple(target)
  communicating = [s.mesh_axis for s in plan.steps if s.kind]
  assert len(communicating) == len(set(communicating))  # one collective per mesh axis
  for step in plan.steps:
    if step.kind is not None:  # communication only where the source splits
      assert step.mesh_axis in source
  assert not plans.plan_relayout(source, source).steps


def _rules(layout):
  """Layout rules giving SHAPE the per-axis mesh axes of `layout` on MESH."""
  names = mtf.convert_to_shape(MESH).dimension_names
  return ";".join(f"{d.name}:{names[a]}" for d, a in zip(SHAPE.dims, layout) if a is not None)


@settings(max_examples=25, **_SETTINGS)
@given(_layouts(3, 2), _layouts(3, 2))
@example([1, 0, None], [0, None, None])  # an all-to-all waits for a gather
@example([0, 1, None], [1, 0, None])     # two mesh axes swap tensor axes
def test_executing_a_plan_gives_the_target_layouts_slices(source, target):
  value = np.arange(SHAPE.size, dtype=np.float32).reshape(SHAPE.to_integer_list())
  source_impl = mtf_test_utils.make_impl(MESH, _rules(source))
  target_impl = mtf_test_utils.make_impl(MESH, _rules(target))
  seen = []
  with tf.Graph().as_default(), observers.observe(seen.append):
    laid = source_impl.import_tf_tensor(tf.constant(value), SHAPE)
    moved = source_impl.execute(laid, plans.plan_relayout(source, target))
    want = target_impl.import_tf_tensor(tf.constant(value), SHAPE)
    with tf.compat.v1.Session() as sess:
      got, want = sess.run([moved.tensor_list, want.tensor_list])
  for g, w in zip(got, want):
    np.testing.assert_array_equal(g, w)
  kinds = [s.kind for s in plans.plan_relayout(source, target).steps if s.kind]
  assert [e.kind for e in seen] == kinds


def test_plans_name_their_collectives():
  shape = mtf.convert_to_shape("batch:8;hidden:4")
  plan = plans.plan_gather_dims(shape, (0, 1), {"hidden"})
  assert plan.steps == (plans.AllGather(mesh_axis=1, tensor_axis=1),)
  assert plan.target == (0, None)
  assert plans.plan_relayout((0, None), (None, 0)).steps == (
      plans.AllToAll(mesh_axis=0, split_axis=1, concat_axis=0),)
  assert plans.plan_relayout((None, None), (None, 1)).steps == (plans.SliceAlong(1, 1),)


def test_softmax_plan_allreduces_its_statistics_only_where_the_dimension_is_split():
  """With vocab split over cols: five kernels, the maxima MAX- and the sums
  SUM-allreduced over cols (statistics 1/16 the logits' size); with it
  whole, one fused kernel and no communication."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  batch, vocab = mtf.Dimension("batch", 8), mtf.Dimension("vocab", 16)
  x = mtf.zeros(mesh, [batch, vocab])
  mesh_shape = mtf.convert_to_shape("rows:2;cols:4")

  def plan_for(layout):
    rules = mtf.convert_to_layout_rules(layout)
    return statistics_plans.plan_softmax(x, vocab, False,
                              lambda s: tuple(rules.tensor_layout(s, mesh_shape)), (2, 4))
  split = plan_for("vocab:cols;batch:rows")
  moves = [r.move.steps for k in split.kernels for r in k.results]
  assert moves == [(plans.AllReduce((1,), "MAX"),), (), (), (plans.AllReduce((1,), "SUM"),), ()]
  assert [k.args for k in split.kernels] == [(0,), (0, 1), (2,), (3,), (3, 4)]
  slice_bytes = 8 * 16 // 8 * 4
  assert split.kernels[0].nbytes == slice_bytes + slice_bytes // 4  # slice + its maxima
  whole = plan_for("batch:rows")
  assert len(whole.kernels) == 1 and whole.kernels[0].results[0].move.steps == ()
  assert whole.outputs == (1,)


def test_einsum_plan_is_what_the_lowering_counts():
  """x[batch, hidden] @ w[hidden, out], hidden split: partial sums pending
  over its mesh axis (not fused without shared memory), 2 * the local sizes
  FLOPs; the lowering counts exactly the plan's allreduce."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.zeros(mesh, "hidden:64;batch:16")
  w = mtf.zeros(mesh, "hidden:64;out:4")
  y = mtf.einsum([x, w], output_shape="batch:16;out:4")
  rules = mtf.convert_to_layout_rules("hidden:all")
  mesh_shape = mtf.convert_to_shape("all:8")
  plan = einsum_plans.plan_einsum([x, w], y, lambda s: rules.tensor_layout(s, mesh_shape), [8], False)
  assert plan.reduced_axes == (0,) and plan.pending_sum_axes == (0,) and not plan.fused
  assert plan.flops == 2 * 16 * 8 * 4 and plan.output_bytes == 16 * 4 * 4
  assert all(not move for move in plan.operand_moves)
  shared = einsum_plans.plan_einsum([x, w], y, lambda s: rules.tensor_layout(s, mesh_shape), [8], True)
  # Shared memory: operands (640 B) under 3x the output (256 B), hidden outermost.
  assert shared.fused and shared.pending_sum_axes == ()


def test_observers_see_each_collective_once_and_not_silenced_ones():
  impl = mtf_test_utils.make_impl("all:8", "batch:all")
  shape = mtf.convert_to_shape("batch:8;d:4")
  outer, inner = [], []
  with tf.Graph().as_default():
    laid = impl.import_tf_tensor(tf.zeros([8, 4]), shape)
    impl.allreduce(laid, [0], "SUM")  # nobody observes: nothing recorded anywhere
    with observers.observe(outer.append):
      impl.allreduce(laid, [0], "SUM")
      with observers.observe(inner.append):
        impl.allconcat(laid, 0, 0)
        with impl.unrecorded():
          impl.allreduce(laid, [0], "MAX")
  assert [e.kind for e in outer] == ["allreduce", "allgather"]
  assert [e.kind for e in inner] == ["allgather"]
  record = outer[0]
  assert record.mesh_axes == (0,) and record.bytes_per_processor == 16
  assert (record.group_size, record.num_groups) == (8, 1)
  assert record == observers.collective("allreduce", [0], 16, [8])


def test_a_lowering_counts_only_its_own_implementations():
  """Observers are per thread: a lowering in another thread, and an
  implementation the lowering does not use (an observer subscribed for some
  implementations only), add nothing to its counters."""
  impl = mtf_test_utils.make_impl("all:8", "batch:all")
  other = mtf_test_utils.make_impl("all:8", "batch:all")

  def build():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    x = mtf.import_tf_tensor(mesh, tf.ones([8, 4]), "batch:8;d:4")
    return graph, mesh, mtf.reduce_sum(x)

  with tf.Graph().as_default():
    graph, mesh, total = build()
    lowering = mtf.Lowering(graph, {mesh: impl})
    lowering.export_to_tf_tensor(total)
    seen = []
    with observers.observe(lowering._count_collective, [impl]), observers.observe(seen.append):  # pylint: disable=protected-access
      laid = other.import_tf_tensor(tf.zeros([8, 4]), mtf.convert_to_shape("batch:8;d:4"))
      other.allreduce(laid, [0], "SUM")
  counts = {}

  def lower_elsewhere():
    with tf.Graph().as_default():
      g, m, t = build()
      elsewhere = mtf.Lowering(g, {m: impl})
      elsewhere.export_to_tf_tensor(t)
      counts["elsewhere"] = elsewhere.collective_counts()
  thread = threading.Thread(target=lower_elsewhere)
  thread.start()
  thread.join()
  assert lowering.collective_counts() == {"allreduce": (1, 4)}
  assert [r.kind for r in seen] == ["allreduce"]
  assert counts["elsewhere"] == {"allreduce": (1, 4)}


def test_unknown_plan_step_is_a_clear_error():
  impl = mtf_test_utils.make_impl("all:8", "")
  bogus = plans.Redistribution((None,), (None,), ("not a step",))
  with pytest.raises(TypeError, match="unknown plan step"):
    impl.execute(None, bogus)


@pytest.mark.parametrize("target_rule", ["p2:rows", "p2:rows;q2:cols"])
def test_renaming_relayout_keeps_values_when_mesh_axes_trade_tensor_axes(target_rule):
  """mtf.zero.relayout to renamed dimensions: mesh axis rows moves from q to
  p (which cols splits until it gathers, or, with q2:cols, hands over in
  exchange). The values must stay those of x (they came back interleaved
  when the all-to-all over rows ran before cols freed p)."""
  xv = np.arange(32, dtype=np.float32).reshape(4, 8)

  def builder(mesh):
    x = mtf.import_tf_tensor(mesh, tf.constant(xv), "p:4;q:8")
    y = mtf.zero.relayout(x, mtf.convert_to_shape("p2:4;q2:8"))
    return {"y": y}
  got = mtf_test_utils.lower_and_run(builder, "rows:2;cols:2", f"p:cols;q:rows;{target_rule}")
  np.testing.assert_array_equal(got["y"], xv)


def test_execute_runs_an_allreduce_step_as_the_implementations_allreduce():
  impl = mtf_test_utils.make_impl("rows:2;cols:4", "batch:rows")
  shape = mtf.convert_to_shape("batch:8;d:4")
  seen = []
  with tf.Graph().as_default(), observers.observe(seen.append):
    laid = impl.import_tf_tensor(tf.ones([8, 4]), shape)
    total = impl.execute(laid, plans.AllReduce((0,), "SUM"))
    with tf.compat.v1.Session() as sess:
      values = sess.run(total.tensor_list)
  assert [(e.kind, e.mesh_axes, e.bytes_per_processor) for e in seen] == [("allreduce", (0,), 64)]
  for v in values:  # the two row blocks of ones, summed
    np.testing.assert_array_equal(v, np.full([4, 4], 2.0, np.float32))


def test_permute_and_reduce_scatter_steps_run_as_their_collectives():
  """A Permute step is the implementation's receive (each processor gets
  its left neighbour's slice, zeros at the start); a ReduceScatter step sums
  over its mesh axis and keeps each processor's block, counted once as
  "reduce_scatter" with the partial slice's bytes."""
  impl = mtf_test_utils.make_impl("rows:2;cols:4", "batch:cols")
  shape = mtf.convert_to_shape("batch:8;d:4")
  xv = np.arange(32, dtype=np.float32).reshape(8, 4)
  seen = []
  with tf.Graph().as_default(), observers.observe(seen.append):
    laid = impl.import_tf_tensor(tf.constant(xv), shape)
    shifted = impl.execute(laid, plans.stay((1, None)).then(plans.Permute(1, (None, 0, 1, 2))))
    whole = impl.import_tf_tensor(tf.constant(xv), mtf.convert_to_shape("b:8;d:4"))
    scattered = impl.execute(whole, plans.ReduceScatter(0, 1))
    with tf.compat.v1.Session() as sess:
      got_shift, got_scatter = sess.run([shifted.tensor_list, scattered.tensor_list])
  assert [(e.kind, e.mesh_axes, e.bytes_per_processor) for e in seen] == [
      ("permute", (1,), 32), ("reduce_scatter", (0,), 128)]
  for p in range(8):
    col, row = p % 4, p // 4
    want = np.zeros([2, 4]) if col == 0 else xv[2 * (col - 1):2 * col]
    np.testing.assert_array_equal(got_shift[p], want)
    np.testing.assert_array_equal(got_scatter[p], 2 * xv[:, 2 * row:2 * row + 2])


def test_local_plans_of_shift_and_sum_relayout():
  """plan_shift exchanges only the boundary (a Permute) when the offset fits
  in a slice and gathers otherwise; plan_sum_relayout reduce-scatters a
  pending sum into the axis the new layout splits, then allreduces the
  block over its other axes (the smaller tensor on those links)."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  x = mtf.zeros(mesh, "batch:4;length:16")
  rules = mtf.convert_to_layout_rules("length:cols;l2:rows")
  mesh_shape = mtf.convert_to_shape("rows:2;cols:4")

  def layout_of(shape):
    return tuple(rules.tensor_layout(shape, mesh_shape))
  near = mtf.shift(x, 1, "length", wrap=True).operation.plan(plans.PlanMesh(layout_of, (2, 4)))
  assert [o.move.steps for o in near.operands] == [(), (plans.Permute(1, (3, 0, 1, 2)),)]
  far = mtf.shift(x, 5, "length", wrap=False).operation.plan(plans.PlanMesh(layout_of, (2, 4)))
  assert [o.move.steps for o in far.operands] == [(plans.AllGather(1, 1),)]
  assert far.results[0].move.steps == (plans.SliceAlong(1, 1),)
  grad = mtf.zeros(mesh, "batch:4;d:16")
  y = mtf.zero.relayout(grad, mtf.convert_to_shape("batch:4;l2:16"))
  plan = y.operation.plan(plans.PlanMesh(layout_of, (2, 4),
                                         partial_sum_axes_of=lambda t: (0, 1)))
  (operand,) = plan.operands
  assert operand.partial == plans.TAKES_PARTIAL and not plan.kernel
  assert operand.move.steps == (plans.ReduceScatter(0, 1), plans.AllReduce((1,)))


def test_replica_splits_cut_the_largest_whole_axis_each_replica_axis_divides():
  shape = mtf.convert_to_shape("stages:4;batch:8;length:6;d:16")
  # Mesh axis 0 splits stages; axis 1 (size 2) replicates: d is the largest.
  assert plans.replica_splits(shape, (0, None, None, None), (4, 2)) == ((1, 3),)
  # Two replica axes take two different tensor axes, largest first.
  assert plans.replica_splits(shape, (0, None, None, None), (4, 2, 2)) == ((1, 3), (2, 1))
  # Kept whole, already split, or not divisible: not cut.
  assert plans.replica_splits(shape, (0, None, None, None), (4, 5)) == ()
  assert plans.replica_splits(shape, (0, None, None, 1), (4, 2)) == ()
  assert plans.replica_splits(shape, (0, None, None, None), (4, 3), keep_whole=(2,)) == ()
  assert plans.replica_splits(shape, (0, None, None, None), (4, 1)) == ()


def _zeros_and_layout_of(shape, rules, mesh_shape):
  """An mtf zeros tensor of `shape` and the layout function of the rules."""
  x = mtf.zeros(mtf.Mesh(mtf.Graph(), "m"), shape)
  rules, mesh_shape = mtf.convert_to_layout_rules(rules), mtf.convert_to_shape(mesh_shape)
  return x, lambda s: tuple(rules.tensor_layout(s, mesh_shape))


def test_shift_with_split_replicas_plans_blocks_around_the_permute():
  x, layout_of = _zeros_and_layout_of("stages:4;d:16", "stages:pp", "pp:4;mp:2")
  plan = mtf.shift(x, 1, "stages", wrap=False, split_replicas=True).operation.plan(
      plans.PlanMesh(layout_of, (4, 2)))
  assert plan.operands[1].move.steps == (
      plans.SliceAlong(1, 1), plans.Permute(0, (None, 0, 1, 2)), plans.AllGather(1, 1))


def test_reshape_keeps_a_pending_sum_where_nothing_moves():
  """A rename of a pending sum passes the summands on; a reshape that must
  slice along the summed mesh axis completes the sum first."""
  x, layout_of = _zeros_and_layout_of("a:8;b:4", "a:rows;c:cols", "rows:2;cols:4")
  renamed = mtf.rename_dimension(x, "b", "b2").operation
  plan = renamed.plan(plans.PlanMesh(layout_of, (2, 4), partial_sum_axes_of=lambda t: (1,)))
  assert plan.operands[0].partial == plans.TAKES_PARTIAL
  assert plan.results[0].pending_sum_axes == (1,)
  sliced = mtf.rename_dimension(x, "b", "c").operation  # c is split over cols (axis 1)
  plan = sliced.plan(plans.PlanMesh(layout_of, (2, 4), partial_sum_axes_of=lambda t: (1,)))
  assert not plan.operands[0].partial and plan.results[0].pending_sum_axes == ()
  plan = renamed.plan(plans.PlanMesh(layout_of, (2, 4)))  # no pending sum
  assert not plan.operands[0].partial
