"""Sequence parallelism in the LayerStack (`sequence_parallel=True` with a
`residual_length:<mesh dim>` rule): the loss and gradients of the plain
stack under every recompute policy, pipelined or not; the model-parallel
all-reduces of the layers become a reduce-scatter and an all-gather each;
the planner prices it from the same graph."""

import collections

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.analysis.cost_model import hardware
from mesh_tensorflow.transformer import gin_config
from mesh_tensorflow.transformer import planner
from mesh_tensorflow.transformer import transformer
from mesh_tensorflow.transformer import transformer_layers as tl
from mtf_test_utils import make_impl

B, L, V, D = 8, 8, 32, 16
batch, length = mtf.Dimension("batch", B), mtf.Dimension("length", L)
_rng = np.random.RandomState(0)
TARGETS = _rng.randint(2, V, size=(B, L)).astype(np.int32)
SEGMENTS = np.ones((B, L), np.int32)
SEGMENTS[:2, 5:] = 2
SEGMENTS[5, 6:] = 0  # padding
TARGETS[SEGMENTS == 0] = 0
MESH = "data:2;model:4"
LAYOUT = "batch:data;heads:model;d_ff:model"
SP_LAYOUT = LAYOUT + ";residual_length:model"
DM_LAYOUT = LAYOUT + ";residual_d_model:model"  # sequence_parallel="d_model"


def _run(sequence_parallel, mesh_shape=MESH, layout=SP_LAYOUT, recompute="none", stages=1,
         schedule="gpipe", share_replicas=False, num_layers=2, recompute_layers=None):
  """Loss, {variable name: gradient} and the Lowering of a 2-layer LM."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")

  def imp(value):
    return mtf.import_tf_tensor(mesh, tf.constant(value), [batch, length])
  targets = imp(TARGETS)
  stack = transformer.make_layer_stack(
      # Dropout off explicitly: not whatever gin config another test left.
      [tl.SelfAttention(num_heads=4, key_value_size=4, dropout_rate=0.0),
       tl.DenseReluDense(hidden_size=32, dropout_rate=0.0)],
      num_layers=num_layers, recompute=recompute, sequence_parallel=sequence_parallel,
      num_stages=stages, num_microbatches=2 if stages > 1 else 1, pipeline_schedule=schedule,
      recompute_layers=recompute_layers, dropout_rate=0.0)
  model = transformer.Unitransformer(stack, d_model=D, input_vocab_size=V, output_vocab_size=V,
                                     autoregressive=True, max_length=L)
  _, loss = model.call_simple(mtf.shift(targets, 1, length, wrap=False), targets, True,
                              sequence_id=imp(SEGMENTS))
  variables = graph.trainable_variables
  first_backward = len(graph.operations)
  grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
  impl = make_impl(mesh_shape, layout, share_replicas=share_replicas)
  lowering = mtf.Lowering(graph, {mesh: impl})
  lowering.first_backward_op = first_backward
  values = {v.name: lowering.export_to_tf_tensor(g).numpy() for v, g in zip(variables, grads)}
  return float(lowering.export_to_tf_tensor(loss).numpy()), values, lowering


def _counts(lowering, axes=None):
  return collections.Counter(r.kind for r in lowering.collective_records
                             if axes is None or r.mesh_axes == axes)


@pytest.fixture(scope="module")
def plain():
  return _run(False, layout=LAYOUT)


def _assert_same(got, want):
  loss, grads, _ = got
  loss0, grads0, _ = want
  assert loss == pytest.approx(loss0, rel=1e-5)
  assert set(grads) == set(grads0)
  for name, g in grads.items():
    np.testing.assert_allclose(g, grads0[name], rtol=1e-4, atol=2e-6, err_msg=name)


@pytest.mark.parametrize("recompute", ["none", "layer", "selective", "projections"])
def test_sequence_parallel_gives_the_plain_stacks_loss_and_gradients(plain, recompute):
  _assert_same(_run(True, recompute=recompute), plain)


def test_layers_reduce_scatter_and_all_gather_instead_of_all_reducing(plain):
  """Per sublayer and direction, the plain stack all-reduces [batch, length,
  d_model] over `model` once (4 sublayers: 8); sequence parallel, that is a
  reduce-scatter into the stream and an all-gather of the next input, plus
  one all-gather (and its gradient's) where the stream leaves the stack, and
  per sublayer one more in the backward pass: the weights' gradients read
  the input gathered again, not a copy kept whole since the forward pass."""
  model_axis = (1,)
  assert _counts(plain[2], model_axis) == {"allreduce": 8}
  _, _, lowering = _run(True)
  assert _counts(lowering, model_axis) == {"reduce_scatter": 8, "allgather": 10 + 4}
  whole = B // 2 * L * D * 4  # one processor's [batch, length, d_model], float32
  for r in lowering.collective_records:
    if r.mesh_axes == model_axis:
      # A reduce-scatter sends the whole partial slice, an all-gather a block.
      assert r.bytes_per_processor == (whole if r.kind == "reduce_scatter" else whole // 4)
  # Recomputing whole layers replays the forward gather: no third one.
  _, _, lowering = _run(True, recompute="layer")
  assert _counts(lowering, model_axis)["allgather"] == 10 + 4


@pytest.mark.parametrize("mode,layout", [(True, SP_LAYOUT), ("d_model", DM_LAYOUT)])
def test_the_gathered_layer_input_is_not_kept_for_the_backward_pass(mode, layout):
  """No backward operation reads a layer's gathered input from the forward
  pass: the weights' gradients read the copy gathered again."""
  _, _, lowering = _run(mode, layout=layout)
  ops = lowering.graph.operations
  first = lowering.first_backward_op
  gathered = {op.outputs[0] for op in ops[:first]
              if getattr(op, "regathers_for_backward", False)
              and not getattr(op, "is_variable", False)}
  assert len(gathered) == 4  # one per sublayer
  read_later = {t for op in ops[first:] for t in op.inputs} & gathered
  assert not read_later
  again = [op for op in ops[first:] if op.name.endswith("_again")]
  assert len(again) == 4


def test_without_a_residual_length_rule_nothing_changes_but_names(plain):
  _, _, lowering = _run(True, layout=LAYOUT)
  assert _counts(lowering) == _counts(plain[2])


def test_shared_memory_placement_gives_the_same_values(plain):
  """The CPU placement whose processors share memory fuses the all-reduces
  of products; sequence parallel runs there too."""
  _assert_same(_run(True, share_replicas=True), plain)


def test_uneven_stages_keep_the_stream_split():
  """3 blocks on 2 stages (2 and 1, a padding slot on the second) with the
  stream split, 1F1B and selective recomputation: the loss and gradients of
  the same pipeline without sequence parallelism."""
  layout = "stages:pp;heads:model;d_ff:model"
  kw = dict(mesh_shape="pp:2;model:4", stages=2, schedule="1f1b", recompute="selective",
            num_layers=3)
  _assert_same(_run(True, layout=layout + ";residual_length:model", **kw),
               _run(False, layout=layout, **kw))


@pytest.mark.parametrize("recompute", ["layer", "projections"])
def test_pipeline_stages_recomputing_their_first_layer_only(recompute):
  """4 blocks on 2 stages, each stage recomputing its first block (all of
  it, or all but its projections) and keeping the second's activations
  (recompute_layers=1), the stream split: the loss and gradients of the
  same pipeline without recomputation."""
  layout = "stages:pp;heads:model;d_ff:model;residual_length:model"
  kw = dict(mesh_shape="pp:2;model:4", layout=layout, stages=2, schedule="1f1b",
            num_layers=4)
  _assert_same(_run(True, recompute=recompute, recompute_layers=1, **kw),
               _run(True, recompute="none", **kw))


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_pipelined_stream_stays_split_between_stages(plain, schedule):
  """pp:2 x model:4: the stages exchange the stream's blocks (a quarter of
  a micro-batch's activations) with no all-gather after the sends; the
  loss is the plain stack's, the gradients the pipelined plain stack's."""
  layout = "stages:pp;heads:model;d_ff:model"
  got = _run(True, mesh_shape="pp:2;model:4", layout=layout + ";residual_length:model",
             stages=2, schedule=schedule)
  assert got[0] == pytest.approx(plain[0], rel=1e-5)
  _assert_same(got, _run(False, mesh_shape="pp:2;model:4", layout=layout, stages=2,
                         schedule=schedule))
  micro = B // 2 * L * D * 4  # one micro-batch's [batch, length, d_model], float32
  permutes = collections.Counter(r.bytes_per_processor for r in got[2].collective_records
                                 if r.kind == "permute")
  assert permutes[micro // 4] > 0 and permutes[micro] == 0, permutes


@pytest.mark.parametrize("recompute", ["none", "layer", "selective", "projections"])
def test_a_d_model_split_stream_gives_the_plain_stacks_loss_and_gradients(plain, recompute):
  _assert_same(_run("d_model", layout=DM_LAYOUT, recompute=recompute), plain)


def test_a_d_model_split_stream_runs_the_same_collectives(plain):
  """sequence_parallel="d_model" (PaLM's split, for lengths the mesh
  dimension does not divide): per sublayer and direction a reduce-scatter
  into the stream's d_model blocks and an all-gather of the next input, as
  with a split length; the embedding enters the stream by slicing. The
  norms reduce over the split d_model: per norm, an all-reduce of the
  [batch, length] statistics each way, and their scale's gradient (D / 4
  floats) is gathered."""
  _, _, lowering = _run("d_model", layout=DM_LAYOUT)
  model_axis = (1,)
  whole = B // 2 * L * D * 4
  records = [r for r in lowering.collective_records if r.mesh_axes == model_axis]
  large = collections.Counter(r.kind for r in records if r.bytes_per_processor >= whole // 4)
  assert large == {"reduce_scatter": 8, "allgather": 10 + 4}
  for r in records:
    if r.kind == "reduce_scatter":
      assert r.bytes_per_processor == whole
    elif r.bytes_per_processor >= whole // 4:
      assert r.bytes_per_processor == whole // 4
  small = collections.Counter((r.kind, r.bytes_per_processor) for r in records
                              if r.bytes_per_processor < whole // 4)
  assert small == {("allreduce", B // 2 * L * 4): 8, ("allgather", D // 4 * 4): 4}, small
  # The stream between the layers is split over model: a quarter of d_model.
  streams = [t for op in lowering.graph.operations for t in op.outputs
             if "residual_d_model" in t.shape.dimension_names and len(t.shape.dims) == 3]
  assert streams and all(
      lowering.mesh_impl(t.operation).slice_shape(t.shape)[-1] == D // 4 for t in streams)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_a_pipelined_d_model_split_stream(schedule):
  layout = "stages:pp;heads:model;d_ff:model"
  got = _run("d_model", mesh_shape="pp:2;model:4", layout=layout + ";residual_d_model:model",
             stages=2, schedule=schedule)
  _assert_same(got, _run(False, mesh_shape="pp:2;model:4", layout=layout, stages=2,
                         schedule=schedule))
  micro = B // 2 * L * D * 4
  permutes = collections.Counter(r.bytes_per_processor for r in got[2].collective_records
                                 if r.kind == "permute")
  assert permutes[micro // 4] > 0 and permutes[micro] == 0, permutes


def test_an_unknown_sequence_parallel_mode_is_one_clear_error():
  with pytest.raises(ValueError, match=r"sequence_parallel = 'heads'.*'d_model'"):
    transformer.LayerStack([tl.DenseReluDense(hidden_size=8)], sequence_parallel="heads")


def test_custom_sublayers_reject_sequence_parallel():
  with pytest.raises(ValueError, match="sequence_parallel=True"):
    transformer.LayerStack([tl.DenseReluDense(hidden_size=8)], sequence_parallel=True,
                           sublayers_per_layer=[transformer.sublayer_call_layer])


def test_planner_prices_the_split_stream():
  """Same model FLOPs; less activation memory and elementwise time per
  device; the stream's norms and residuals split 8 ways."""
  model = ["num_layers = 8", "d_model = 1024", "d_ff = 4096", "num_heads = 16", "d_kv = 64",
           "run.sequence_length = {'inputs': 2048, 'targets': 2048}", "run.batch_size = 16",
           "run.activation_dtype = 'bfloat16'",
           "run.vocabulary = @vocabulary.SizedVocabulary()",
           "vocabulary.SizedVocabulary.size = 32000"]
  cluster = hardware.parse_cluster("a100-80gb:16")
  layout = "batch:data;d_ff:model;heads:model;vocab:model"
  gin_config.parse([], model)
  plain_plan = planner.plan_current_config(cluster, "data:2;model:8", layout)
  gin_config.parse([], model + ["transformer.make_layer_stack.sequence_parallel = True"])
  sp_plan = planner.plan_current_config(cluster, "data:2;model:8",
                                        layout + ";residual_length:model")
  assert sp_plan.model_flops_per_step == pytest.approx(plain_plan.model_flops_per_step)
  assert sp_plan.memory["activations"] < 0.9 * plain_plan.memory["activations"]
  assert sp_plan.time_breakdown["compute"] < plain_plan.time_breakdown["compute"]
  kinds = {c.kind for c in sp_plan.communications if c.mesh_dims == ("model",)}
  assert "reduce_scatter" in kinds and "allgather" in kinds


def _bitransformer(sequence_parallel):
  def stack(decoder):
    layers = [tl.SelfAttention(num_heads=4, key_value_size=4)]
    if decoder:
      layers.append(tl.EncDecAttention(num_heads=4, key_value_size=4))
    layers.append(tl.DenseReluDense(hidden_size=16))
    return transformer.make_layer_stack(layers, num_layers=1,
                                        sequence_parallel=sequence_parallel)
  encoder = transformer.Unitransformer(stack(False), d_model=D, input_vocab_size=V,
                                       output_vocab_size=None, autoregressive=False,
                                       max_length=L, name="encoder")
  decoder = transformer.Unitransformer(stack(True), d_model=D, input_vocab_size=V,
                                       output_vocab_size=V, autoregressive=True, max_length=L,
                                       name="decoder")
  return transformer.Bitransformer(encoder, decoder)


def test_encoder_decoder_trains_and_decodes_sequence_parallel():
  """Both stacks sequence parallel: the loss and gradients of the plain
  model, and the same greedy decode (incremental steps have no length
  dimension, so the decoder's stream is whole there)."""
  inputs = TARGETS.copy()
  inputs[:, 6:] = 0

  def run(sequence_parallel, layout):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    x = mtf.import_tf_tensor(mesh, tf.constant(inputs), [batch, length])
    y = mtf.import_tf_tensor(mesh, tf.constant(TARGETS), [batch, length])
    _, loss = _bitransformer(sequence_parallel).call_simple(x, y, True)
    variables = graph.trainable_variables
    grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
    greedy = _bitransformer(sequence_parallel).decode(x, beam_size=1)
    lowering = mtf.Lowering(graph, {mesh: make_impl(MESH, layout, share_replicas=False)})
    return (float(lowering.export_to_tf_tensor(loss).numpy()),
            {v.name: lowering.export_to_tf_tensor(g).numpy() for v, g in zip(variables, grads)},
            lowering.export_to_tf_tensor(greedy).numpy())
  loss0, grads0, greedy0 = run(False, LAYOUT)
  loss, grads, greedy = run(True, SP_LAYOUT)
  _assert_same((loss, grads, None), (loss0, grads0, None))
  np.testing.assert_array_equal(greedy, greedy0)
