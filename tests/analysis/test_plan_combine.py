"""Collectives merged as XLA's combiner passes merge them (plan_combine)."""

import pytest

from mesh_tensorflow.transformer import plan_combine

MIB = 2**20


def _moved(collectives):
  return sum(nbytes * count for (_, _, nbytes), count in collectives.items())


def test_collectives_of_one_size_merge_up_to_the_threshold_and_the_rest_pool():
  # 70 all-reduces of 1 MiB: two merged ones of 30, the 10 left in one.
  merged = plan_combine.combine({("allreduce", (0,), MIB): 70}, lambda axes: 8)
  assert merged == {("allreduce", (0,), 30 * MIB): 2, ("allreduce", (0,), 10 * MIB): 1}


def test_the_threshold_counts_each_collectives_larger_buffer():
  group = lambda axes: 48  # noqa: E731
  merged = plan_combine.combine({
      # A reduce-scatter's input is its larger buffer: 30 of 1 MiB to a merge,
      # though each result is only 1/48 MiB (XLA would merge by the result).
      ("reduce_scatter", (0,), MIB): 60,
      # One of 48 MiB is over the threshold alone.
      ("reduce_scatter", (0,), 48 * MIB): 5,
      # An all-gather's result is 48 of its 1 MiB inputs: over 30 MiB alone.
      ("allgather", (0,), MIB): 60,
      # Over other axes: merged apart from the reduce-scatters over (0,).
      ("allreduce", (0, 1), 14336): 96}, group)
  assert merged == {("reduce_scatter", (0,), 30 * MIB): 2, ("reduce_scatter", (0,), 48 * MIB): 5,
                    ("allgather", (0,), MIB): 60, ("allreduce", (0, 1), 96 * 14336): 1}


def test_leftovers_of_different_sizes_pool_and_bytes_are_kept():
  collectives = {("reduce_scatter", (0,), 12845056): 191, ("reduce_scatter", (0,), 2 * MIB): 7,
                 ("reduce_scatter", (0,), 51380224): 96, ("allreduce", (1,), 4096): 3}
  merged = plan_combine.combine(collectives, lambda axes: 48)
  assert _moved(merged) == pytest.approx(_moved(collectives), rel=1e-6)
  # 49 MiB each: alone. 12.25 MiB each: 95 pairs and one left; 2 MiB each:
  # 15 to a merge, none full; the leftovers' 26.25 MiB pool into one.
  assert merged[("reduce_scatter", (0,), 51380224)] == 96
  assert merged[("reduce_scatter", (0,), 2 * 12845056)] == 95
  assert merged[("reduce_scatter", (0,), 12845056 + 7 * 2 * MIB)] == 1
  assert merged[("allreduce", (1,), 3 * 4096)] == 1
  assert len(merged) == 4


def test_the_planner_merges_the_step_gradient_reduction_when_xla_compiles_it():
  from tests.analysis.test_plan import _plan  # pylint: disable=g-import-not-at-top
  args = dict(extra=["run.optimizer = @optimize.AdamWeightDecayOptimizer", "run.zero_stage = 2"],
              cluster="a100-80gb:32", mesh="data:4;model:8")
  xla, op_by_op = _plan(**args), _plan(fusion="none", **args)

  def optimizer_comm(plan):
    comm = [c for c in plan.communications if c.phase == "optimizer"]
    return (sum(c.count for c in comm), sum(c.count * c.bytes_per_processor for c in comm),
            sum(c.seconds for c in comm))
  (n_xla, bytes_xla, s_xla), (n_tf, bytes_tf, s_tf) = optimizer_comm(xla), optimizer_comm(op_by_op)
  # One collective per variable op by op; a few merged ones compiled, the
  # same bytes, less time (each ring step's latency paid once per merge).
  assert n_tf >= 8 * 4 and n_xla <= n_tf / 4
  assert bytes_xla == pytest.approx(bytes_tf, rel=1e-6)
  assert s_xla < s_tf


def test_a_merged_collective_is_hidden_only_as_a_whole():
  """Overlap hides what compute covers but leaves at least the last piece:
  a layer's share op by op, a merged collective's when merging leaves
  fewer collectives than layers."""
  from tests.analysis.test_plan import _plan  # pylint: disable=g-import-not-at-top
  args = dict(extra=["run.zero_stage = 2", "run.activation_dtype = 'bfloat16'"],
              cluster="a100-80gb:64", mesh="data:8;model:8", overlap=("param_gather",))
  xla, op_by_op = _plan(**args), _plan(fusion="none", **args)
  gathers = [c for c in xla.communications if c.kind == "allgather" and c.phase == "optimizer"]
  assert [c.count for c in gathers] == [1]
  # The one merged gather waits whole; op by op, the first forward pass
  # hides part of the 8 layers' gathers (never the last layer's share).
  assert xla.time_breakdown["zero_param_gather"] == pytest.approx(gathers[0].seconds)
  per_variable = sum(c.seconds for c in op_by_op.communications
                     if c.kind == "allgather" and c.phase == "optimizer")
  assert per_variable / 8 <= op_by_op.time_breakdown["zero_param_gather"] < per_variable
