"""An encoder-decoder model's two layer stacks, configured apart by gin scopes, in a plan."""

import os
import subprocess
import sys

import pytest

from mesh_tensorflow.analysis.cost_model import hardware
from mesh_tensorflow.transformer import gin_config
from mesh_tensorflow.transformer import plan_stacks
from mesh_tensorflow.transformer import planner

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
T5_LIKE = ["run.model_type = 'bitransformer'", "d_model = 512", "d_ff = 2048", "num_heads = 8",
           "d_kv = 64", "run.sequence_length = {'inputs': 256, 'targets': 64}",
           "run.batch_size = 64", "run.activation_dtype = 'bfloat16'",
           "run.vocabulary = @vocabulary.SizedVocabulary()",
           "vocabulary.SizedVocabulary.size = 32000"]
STACK = "transformer.make_layer_stack."


def _plan(bindings):
  gin_config.parse([], T5_LIKE + bindings)
  return planner.plan_current_config(hardware.parse_cluster("tpu-v4:16"), "data:4;model:4",
                                     "batch:data;d_ff:model;heads:model;vocab:model",
                                     planner.options_from_gin())


def test_layers_bound_in_the_encoder_and_decoder_scopes_plan_as_the_same_count_unscoped():
  """T5's configs bind `num_layers` once; a config may bind each stack's in
  its scope. Both are planned alike: 5 layers in each stack, not the
  default depth with every layer priced as a fixed part."""
  unscoped = _plan(["num_layers = 5"])
  scoped = _plan([f"encoder/{STACK}num_layers = 5", f"decoder/{STACK}num_layers = 5"])
  assert scoped.num_layers == unscoped.num_layers == 5
  assert scoped.encoder_decoder and unscoped.encoder_decoder
  assert scoped.parameters == unscoped.parameters
  assert scoped.step_time_s == pytest.approx(unscoped.step_time_s, rel=1e-9)
  assert scoped.memory == pytest.approx(unscoped.memory, rel=1e-9)
  assert "5 layers in the encoder and in the decoder" in scoped.summary()
  assert scoped.to_dict()["encoder_decoder"] is True
  # Each layer is priced: a deeper model costs more per layer added.
  deeper = _plan([f"encoder/{STACK}num_layers = 6", f"decoder/{STACK}num_layers = 6"])
  assert deeper.step_time_s > scoped.step_time_s and deeper.parameters > scoped.parameters


def test_recomputation_bound_in_both_scopes_is_planned():
  none = _plan(["num_layers = 4"])
  scoped = _plan(["num_layers = 4", f"encoder/{STACK}recompute = 'layer'",
                  f"decoder/{STACK}recompute = 'layer'"])
  unscoped = _plan(["num_layers = 4", f"{STACK}recompute = 'layer'"])
  assert none.time_breakdown["recompute"] == 0
  assert scoped.options.recompute == "layer"
  assert scoped.time_breakdown["recompute"] == pytest.approx(
      unscoped.time_breakdown["recompute"], rel=1e-9) and scoped.time_breakdown["recompute"] > 0
  assert scoped.memory["activations"] < none.memory["activations"]


@pytest.mark.parametrize("bindings,parameter", [
    ([f"encoder/{STACK}num_layers = 12", f"decoder/{STACK}num_layers = 4"], "num_layers"),
    (["num_layers = 4", f"encoder/{STACK}recompute = 'layer'"], "recompute"),
])
def test_stacks_configured_apart_are_refused_naming_both_bindings(bindings, parameter):
  with pytest.raises(ValueError) as info:
    _plan(bindings)
  message = str(info.value)
  assert f"encoder/{STACK}{parameter}" in message and f"decoder/{STACK}{parameter}" in message
  assert f"bind {STACK}{parameter} once, without a scope" in message


def test_a_language_model_ignores_the_scopes_it_does_not_build():
  gin_config.parse([], ["num_layers = 3", f"encoder/{STACK}num_layers = 9"])
  assert plan_stacks.stack_count("num_layers", 6) == 3
  assert not plan_stacks.encoder_decoder()


def test_with_scoped_overrides_each_scope_that_binds_the_parameter():
  gin_config.parse([], ["run.model_type = 'bitransformer'", f"encoder/{STACK}num_layers = 5"])
  assert plan_stacks.with_scoped({f"{STACK}num_layers": 1, "run.batch_size": 2}) == {
      f"{STACK}num_layers": 1, f"encoder/{STACK}num_layers": 1, "run.batch_size": 2}


def test_the_plan_command_says_which_bindings_differ_and_exits_2(tmp_path):
  config = tmp_path / "t5_unequal.gin"
  config.write_text("\n".join(T5_LIKE + [f"encoder/{STACK}num_layers = 12",
                                         f"decoder/{STACK}num_layers = 4"]) + "\n")
  result = subprocess.run(
      [sys.executable, "-m", "mesh_tensorflow.plan", f"--gin_file={config}",
       "--hardware=tpu-v4:16", "--mesh_shape=data:4;model:4",
       "--layout=batch:data;d_ff:model;heads:model;vocab:model"],
      capture_output=True, text=True, cwd=str(tmp_path), check=False,
      env=dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2"))
  assert result.returncode == 2, result.stderr[-2000:]
  errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
  assert len(errors) == 1 and "num_layers = 12 and decoder/" in errors[0]
  assert "Traceback" not in result.stderr


@pytest.mark.parametrize("name,layer", [
    ("transformer/block_003/layer_001/wi/einsum", "transformer/block_003"),
    ("decoder/block_000/layer_002/EncDecAttention/q", "decoder/block_000"),
    ("transformer/layer_002/SelfAttention/einsum", "transformer/layer_002"),
    ("block_001/layer_000/add", "block_001"),
    ("transformer/gather", None),
])
def test_layer_of_names_the_stack_layer_an_operation_is_in(name, layer):
  class Op:  # pylint: disable=too-few-public-methods
    pass
  op = Op()
  op.name = name
  assert plan_stacks.layer_of(op) == layer


def test_auto_prints_the_stack_bindings_for_each_scope_the_config_sets():
  """A config that recomputes in both scopes: the gin lines `plan --auto`
  prints for a plan set every stack (an unscoped line alone would lose to
  the scoped bindings when pasted)."""
  from mesh_tensorflow.transformer import plan_search  # pylint: disable=g-import-not-at-top
  plan = _plan(["num_layers = 4", f"encoder/{STACK}recompute = 'layer'",
                f"decoder/{STACK}recompute = 'layer'"])
  lines = plan_search.gin_bindings(plan)
  for prefix in ("", "encoder/", "decoder/"):
    assert f"{prefix}{STACK}recompute = 'layer'" in lines, lines
  assert "encoder/run.zero_stage = 0" not in lines
  unscoped = _plan(["num_layers = 4", f"{STACK}recompute = 'layer'"])
  assert not [line for line in plan_search.gin_bindings(unscoped) if "/" in line.split(" = ")[0]]


def test_a_stack_setting_bound_to_none_in_a_scope_is_restored_after_a_plan():
  """The one- and two-layer builds override each scope's binding of the
  stack settings and give it back afterwards: a binding to None (the
  default of recompute_layers) is a binding, and comes back as None."""
  scoped = [f"{scope}/{STACK}recompute_layers = None" for scope in plan_stacks.SCOPES]
  plan = _plan(["num_layers = 3"] + scoped)
  assert plan.num_layers == 3 and plan.options.recompute_layers is None
  for scope in plan_stacks.SCOPES:
    assert gin_config.query(f"{scope}/{STACK}recompute_layers", "unbound") is None
