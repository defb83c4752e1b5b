"""`plan_zero`: ZeRO's collectives and gathers as the planner prices them."""

import pytest

from mesh_tensorflow.transformer import plan_zero
from mesh_tensorflow.transformer import planner


def _optimizer_phase():
  # Two gradient all-reduces over the data axis (0), one over the model axis.
  return planner._Phase(flops=800.0, bytes=1600.0, comm={
      ("allreduce", (0,), 1024): 2, ("allreduce", (1,), 64): 1})


@pytest.mark.parametrize("stage, kinds, gathered", [
    (0, {"allreduce"}, 0),
    (1, {"allreduce"}, 2),
    (2, {"allreduce", "reduce_scatter"}, 2),
    (3, {"allreduce", "reduce_scatter"}, 0)])
def test_optimizer_phase_follows_the_stage(stage, kinds, gathered):
  opt, after = plan_zero.optimizer_phase(_optimizer_phase(), (0,), 8, stage)
  assert {k[0] for k in opt.comm} == kinds
  # The model axis's all-reduce is never touched.
  assert opt.comm[("allreduce", (1,), 64)] == 1
  assert sum(after.values()) == gathered
  if stage:
    assert (opt.flops, opt.bytes) == (100.0, 200.0)  # 1/8 of the update each
  if gathered:
    # Float32 variables: an eighth of the gradient's bytes each.
    assert after == {("allgather", (0,), 128): 2}


def test_optimizer_phase_gathers_16_bit_values_from_16_bit_gradients_at_twice_the_bytes():
  # Gradients in bfloat16 (1024 bytes), variables stored in float32: the
  # gather moves 4-byte values, twice the gradient's bytes over 8.
  _, as_float32 = plan_zero.optimizer_phase(_optimizer_phase(), (0,), 8, 2, read_per_stored=0.5)
  _, as_masters = plan_zero.optimizer_phase(_optimizer_phase(), (0,), 8, 2, read_per_stored=1.0)
  assert as_float32 == {("allgather", (0,), 256): 2}
  assert as_masters == {("allgather", (0,), 128): 2}


def _gathers(**kw):
  args = dict(stages=1, layers_per_stage=4, executed_layers=4, microbatches=1, grad_accum=1,
              reshard_after_forward=True, forward_s=1.0, backward_s=2.0,
              grad_reduce_hidden_s=0.0)
  args.update(kw)
  return plan_zero.stage3_gathers(800.0, (0,), 8, 0.5, lambda key: 0.5, **args)


def test_stage3_gathers_hide_under_the_layer_before():
  g = _gathers()
  assert g.key == ("allgather", (0,), 50)
  assert g.count == 8 and g.seconds == 4.0
  # Only the first gather of each pass shows: 0.5 s forward, 0.5 s backward.
  assert g.exposed == 1.0


def test_stage3_gathers_once_when_the_copies_are_kept():
  g = _gathers(reshard_after_forward=False)
  assert g.count == 4 and g.seconds == 2.0 and g.exposed == 0.5


def test_stage3_gathers_show_when_slower_than_the_compute():
  g = _gathers(forward_s=0.1, backward_s=0.2)
  # First gather 0.5 s, then three of 0.5 - 0.1 (forward) and 0.5 - 0.2 (backward).
  assert g.exposed == pytest.approx(0.5 + 3 * 0.4 + 0.5 + 3 * 0.3)


def test_stage3_backward_gathers_share_links_with_the_gradient_reduction():
  g = _gathers(grad_reduce_hidden_s=20.0)
  # 4 s of gathers + 20 s of reduction under 4 x (1 + 2) s of compute.
  assert g.exposed == pytest.approx(4.0 + 20.0 - 12.0)


def test_stage3_without_data_parallelism_gathers_nothing():
  assert plan_zero.stage3_gathers(800.0, (), 1, 1.0, lambda key: 1.0, stages=1,
                                  layers_per_stage=4, executed_layers=4, microbatches=1,
                                  grad_accum=1, reshard_after_forward=True, forward_s=1.0,
                                  backward_s=1.0, grad_reduce_hidden_s=0.0).seconds == 0.0
