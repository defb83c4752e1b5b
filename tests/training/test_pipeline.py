"""Pipeline parallelism (mtf.pipeline and the pipelined LayerStack): a
4-stage, 8-micro-batch transformer on a pp:4;dp:2 mesh gives the loss and
gradients of the unpipelined model; the explicit 1F1B schedule gives
GPipe's loss and gradients; the schedules' tables and the bubble measured
in the executed graph match the theory; bad settings are clear errors.
"""

import collections

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.training import pipeline as pl
from mesh_tensorflow.transformer import transformer
from mesh_tensorflow.transformer import transformer_layers as tl
from mtf_test_utils import make_impl

B, L, V, D = 16, 8, 32, 16
S, M = 4, 8
batch, length = mtf.Dimension("batch", B), mtf.Dimension("length", L)
_rng = np.random.RandomState(0)
TARGETS = _rng.randint(2, V, size=(B, L)).astype(np.int32)
# Packed rows: two segments in rows 0-3, padding at the end of row 5.
SEGMENTS = np.ones((B, L), np.int32)
SEGMENTS[:4, 5:] = 2
SEGMENTS[5, 6:] = 0
TARGETS[SEGMENTS == 0] = 0
POSITIONS = np.where(SEGMENTS == 2, np.arange(L) - 5, np.arange(L)).astype(np.int32)
PP_MESH, PP_LAYOUT = "pp:4;dp:2", "stages:pp;batch:dp"


def _model(num_stages, schedule="gpipe", recompute="none", virtual_stages=1, dropout=0.0,
           num_layers=4):
  stack = transformer.make_layer_stack(
      [tl.SelfAttention(num_heads=4, key_value_size=4, relative_attention_type="bias",
                        dropout_rate=dropout),
       tl.DenseReluDense(hidden_size=32, dropout_rate=dropout)],
      num_layers=num_layers, num_stages=num_stages, num_microbatches=M,
      pipeline_schedule=schedule,
      recompute=recompute, virtual_stages=virtual_stages)
  return transformer.Unitransformer(stack, d_model=D, input_vocab_size=V, output_vocab_size=V,
                                    autoregressive=True, max_length=L, vocab_divisor=8)


def _run(num_stages, mesh_shape, layout, mode="train", **kwargs):
  """Loss and {variable name: gradient} of the model on the packed batch
  (in eval mode no gradients)."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")

  def imp(value):
    return mtf.import_tf_tensor(mesh, tf.constant(value), [batch, length])
  targets = imp(TARGETS)
  model = _model(num_stages, **kwargs)
  _, loss = model.call_simple(mtf.shift(targets, 1, length, wrap=False), targets, True,
                              mode=mode, sequence_id=imp(SEGMENTS), position=imp(POSITIONS))
  variables = graph.trainable_variables if mode == "train" else []
  grads = mtf.gradients([loss], [v.outputs[0] for v in variables]) if variables else []
  lowering = mtf.Lowering(graph, {mesh: make_impl(mesh_shape, layout)})
  values = {v.name: lowering.export_to_tf_tensor(g).numpy() for v, g in zip(variables, grads)}
  return float(lowering.export_to_tf_tensor(loss).numpy()), values, lowering


def _unstacked(pipelined_grads, layers_per_stage, virtual_stages=1, stage_layers=None):
  """Pipelined gradients renamed as the unpipelined model's: row s of
  "pipeline/layer_00j/..." is layer i = s * layers_per_stage + j, which
  make_layer_stack names "block_%03d/layer_%03d" (blocks of two layers).
  With virtual stages, rows [v, s] are chunk v S + s (layers_per_stage is
  then the layers per chunk). Uneven stages: `stage_layers` gives each
  stage's (with virtual stages, each chunk's) layer count (a row then
  starts at the layers of the rows before it); the rows of padding slots
  are returned under "padding"."""
  out = {}
  for name, g in pipelined_grads.items():
    i = name.find("pipeline/layer_")
    if i < 0:
      out[name] = g
      continue
    if virtual_stages > 1:
      g = g.reshape((-1,) + g.shape[2:])
    j = int(name[i + 15:i + 18])
    for s in range(g.shape[0]):
      index = s * layers_per_stage + j
      if stage_layers is not None:
        if j >= stage_layers[s]:
          out.setdefault("padding", []).append(g[s])
          continue
        index = sum(stage_layers[:s]) + j
      out[name[:i] + "block_%03d/layer_%03d" % divmod(index, 2) + name[i + 18:]] = g[s]
  return out


@pytest.fixture(scope="module")
def unpipelined():
  loss, grads, _ = _run(1, "all:1", "")
  return loss, grads


def test_pipelined_transformer_matches_unpipelined(unpipelined):
  loss0, grads0 = unpipelined
  loss, grads, lowering = _run(S, PP_MESH, PP_LAYOUT)
  assert loss == pytest.approx(loss0, rel=1e-5)
  stacked = [n for n in grads if "pipeline/layer_" in n]
  assert stacked and all(grads[n].shape[0] == S for n in stacked)
  got = _unstacked(grads, 2)
  assert set(got) == set(grads0)
  for name, g in got.items():
    np.testing.assert_allclose(g, grads0[name], rtol=1e-4, atol=2e-6, err_msg=name)
  # Each processor holds one stage's weights of the stack: a quarter.
  impl = make_impl(PP_MESH, PP_LAYOUT)
  stage_vars = [v for v in lowering.graph.trainable_variables if "pipeline/layer_" in v.name]
  assert len(stage_vars) == len(stacked)
  for v in stage_vars:
    assert impl.slice_shape(v.shape) == [1] + v.shape.to_integer_list()[1:], v.name
  # Stages move between neighbours by permutes; the batch split stays local.
  counts = lowering.collective_counts()
  assert counts.get("permute", (0, 0))[0] > 0
  assert "allgather" not in counts and "alltoall" not in counts, counts


def test_pipeline_composes_with_data_and_model_parallelism(unpipelined):
  """2 stages x 2 data x 2 model (heads and d_ff split): same results."""
  loss0, grads0 = unpipelined
  loss, grads, lowering = _run(2, "pp:2;dp:2;mp:2", "stages:pp;batch:dp;heads:mp;d_ff:mp")
  assert loss == pytest.approx(loss0, rel=1e-5)
  got = _unstacked(grads, 4)
  assert set(got) == set(grads0)
  for name, g in got.items():
    np.testing.assert_allclose(g, grads0[name], rtol=1e-4, atol=2e-6, err_msg=name)
  assert lowering.collective_counts().get("permute", (0, 0))[0] > 0
  # The activations a stage sends, [stages, batch, length, d_model] sliced to
  # one sequence per processor, are replicated over mp: each replica sends
  # half (its block of d_model) and the next stage all-gathers the halves.
  # 2 stages, M micro-batches: M + 2 - 2 forward sends, as many backward.
  records = collections.Counter((r.kind, r.mesh_axes, r.bytes_per_processor)
                                for r in lowering.collective_records)
  half = L * D * 4 // 2
  assert records[("permute", (0,), half)] == records[("allgather", (2,), half)] == 2 * M
  assert records[("permute", (0,), 2 * half)] == 0


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_uneven_stages_match_unpipelined(unpipelined, schedule):
  """4 blocks on 3 stages: 2, 1 and 1 blocks, the last two stages' second
  slot a padding block that passes its input on. The unpipelined model's
  loss and gradients; the padding blocks' weights get zero gradients."""
  loss0, grads0 = unpipelined
  model = _model(3, schedule=schedule)
  assert model.layer_stack.stage_block_counts == (2, 1, 1)
  assert model.layer_stack.layers_per_stage == 4
  loss, grads, _ = _run(3, "pp:3;dp:2", "stages:pp;batch:dp", schedule=schedule)
  assert loss == pytest.approx(loss0, rel=1e-5)
  got = _unstacked(grads, 4, stage_layers=[4, 2, 2])
  padding = got.pop("padding")
  assert set(got) == set(grads0)
  for name, g in got.items():
    np.testing.assert_allclose(g, grads0[name], rtol=1e-4, atol=2e-6, err_msg=name)
  # Slots 2 and 3 (one block) of stages 1 and 2: half the stacked variables, twice.
  assert len(padding) == len([n for n in grads if "pipeline/layer_" in n])
  assert all(not np.any(g) for g in padding)


def test_uneven_interleaved_chunks_match_unpipelined():
  """5 blocks on 2 stages x 2 chunks: chunks of 2, 1, 1 and 1 blocks (each
  stage's second chunk and stage 1's first hold a padding slot): the
  unpipelined 5-block model's loss and gradients in training, its loss when
  evaluated chunk after chunk."""
  kw = dict(schedule="interleaved", virtual_stages=2, num_layers=5)
  assert _model(2, **kw).layer_stack.chunk_block_counts == (2, 1, 1, 1)
  loss0, grads0, _ = _run(1, "all:1", "", num_layers=5)
  loss, grads, _ = _run(2, "pp:2;dp:2", "stages:pp;batch:dp", **kw)
  assert loss == pytest.approx(loss0, rel=1e-5)
  # Layers per chunk c = v S + s: 4, 2, 2 and 2.
  got = _unstacked(grads, 4, virtual_stages=2, stage_layers=[4, 2, 2, 2])
  assert all(not np.any(g) for g in got.pop("padding"))
  assert set(got) == set(grads0)
  for name, g in got.items():
    np.testing.assert_allclose(g, grads0[name], rtol=1e-4, atol=2e-6, err_msg=name)
  assert _run(2, "pp:2;dp:4", "stages:pp;batch:dp", mode="eval", **kw)[0] == pytest.approx(
      _run(1, "all:1", "", mode="eval", num_layers=5)[0], rel=1e-5)


def test_uneven_stages_decode_like_unpipelined():
  """Decoding runs each stage's own blocks only: the unpipelined tokens."""
  prompt = np.zeros((B, L), np.int32)
  prompt[:, :2] = TARGETS[:, :2]

  def decode(num_stages, mesh_shape, layout):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    ids = mtf.import_tf_tensor(mesh, tf.constant(prompt), [batch, length])
    out = _model(num_stages).sample_autoregressive(ids, temperature=0.0, stop_at_token=None)
    lowering = mtf.Lowering(graph, {mesh: make_impl(mesh_shape, layout)})
    return lowering.export_to_tf_tensor(out).numpy()
  np.testing.assert_array_equal(decode(3, "pp:3", "stages:pp"), decode(1, "all:1", ""))


def test_one_f_one_b_stack_matches_unpipelined(unpipelined):
  """The 1F1B schedule (loss per micro-batch inside the schedule), with
  per-layer recomputation inside the stages."""
  loss0, grads0 = unpipelined
  loss, grads, lowering = _run(S, PP_MESH, PP_LAYOUT, schedule="1f1b", recompute="layer")
  assert any(op.name.startswith("transformer/pipeline_1f1b")
             for op in lowering.graph.operations), "the 1F1B schedule was not used"
  assert loss == pytest.approx(loss0, rel=1e-5)
  got = _unstacked(grads, 2)
  for name, g in got.items():
    np.testing.assert_allclose(g, grads0[name], rtol=1e-4, atol=2e-6, err_msg=name)


def test_one_f_one_b_stack_with_dropout_matches_gpipe():
  """Dropout in the layers (attention weights, feed-forward hidden units)
  under 1F1B with per-layer recomputation: GPipe's loss and gradients."""
  loss_g, grads_g, _ = _run(S, PP_MESH, PP_LAYOUT, dropout=0.3)
  loss_f, grads_f, _ = _run(S, PP_MESH, PP_LAYOUT, dropout=0.3, schedule="1f1b",
                            recompute="layer")
  assert loss_g != pytest.approx(_run(S, PP_MESH, PP_LAYOUT)[0], rel=1e-4)
  assert loss_f == pytest.approx(loss_g, rel=1e-5)
  for name, g in grads_g.items():
    np.testing.assert_allclose(grads_f[name], g, rtol=1e-4, atol=2e-6, err_msg=name)


def test_stages_in_turn_match_unpipelined_logits():
  """Collecting layer outputs (as decoding does) runs the stages one after
  another on the whole batch: same logits as the unpipelined model."""
  def logits(num_stages, mesh_shape, layout):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    targets = mtf.import_tf_tensor(mesh, tf.constant(TARGETS), [batch, length])
    out, _ = _model(num_stages).call_simple(
        mtf.shift(targets, 1, length, wrap=False), targets, False, mode="eval",
        layer_outputs=[])
    lowering = mtf.Lowering(graph, {mesh: make_impl(mesh_shape, layout)})
    return lowering.export_to_tf_tensor(out).numpy()
  np.testing.assert_allclose(logits(S, PP_MESH, PP_LAYOUT), logits(1, "all:1", ""),
                             rtol=1e-4, atol=1e-5)


def test_pipelined_stack_decodes_like_unpipelined():
  """Greedy incremental decoding (caches per layer) runs the stages in turn
  (with the interleaved schedule, the layer chunks in turn): the same
  tokens as the unpipelined model."""
  prompt = np.zeros((B, L), np.int32)
  prompt[:, :2] = TARGETS[:, :2]

  def decode(num_stages, mesh_shape, layout, **kwargs):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    ids = mtf.import_tf_tensor(mesh, tf.constant(prompt), [batch, length])
    out = _model(num_stages, **kwargs).sample_autoregressive(ids, temperature=0.0,
                                                             stop_at_token=None)
    lowering = mtf.Lowering(graph, {mesh: make_impl(mesh_shape, layout)})
    return lowering.export_to_tf_tensor(out).numpy()
  reference = decode(1, "all:1", "")
  assert (reference[:, 2:] != 0).any()
  np.testing.assert_array_equal(decode(S, PP_MESH, PP_LAYOUT), reference)
  np.testing.assert_array_equal(
      decode(2, "pp:2;dp:4", "stages:pp;batch:dp", schedule="interleaved",
             virtual_stages=2), reference)


def test_interleaved_stack_evaluates_chunk_after_chunk():
  """Outside training an interleaved stack runs its chunks in turn: the
  unpipelined model's loss."""
  def eval_loss(num_stages, mesh_shape, layout, **kwargs):
    return _run(num_stages, mesh_shape, layout, mode="eval", **kwargs)[0]
  reference = eval_loss(1, "all:1", "")
  got = eval_loss(2, "pp:2;dp:4", "stages:pp;batch:dp", schedule="interleaved",
                  virtual_stages=2)
  assert got == pytest.approx(reference, rel=1e-5)


def test_interleaved_stack_matches_unpipelined(unpipelined):
  """The interleaved schedule: 2 stages x 2 layer chunks of 2 layers each
  (stage 0 holds layers 0-1 and 4-5), with data and model parallelism:
  the unpipelined model's loss and gradients; the activations wrap round
  from the last stage to the first between chunks."""
  loss0, grads0 = unpipelined
  loss, grads, lowering = _run(2, "pp:2;dp:2;mp:2", "stages:pp;batch:dp;heads:mp;d_ff:mp",
                               schedule="interleaved", virtual_stages=2)
  assert any(op.name.startswith("transformer/pipeline_1f1b")
             for op in lowering.graph.operations), "the schedule was not used"
  assert loss == pytest.approx(loss0, rel=1e-5)
  stacked = [n for n in grads if "pipeline/layer_" in n]
  assert stacked and all(grads[n].shape[:2] == (2, 2) for n in stacked)
  got = _unstacked(grads, 2, virtual_stages=2)
  assert set(got) == set(grads0)
  for name, g in got.items():
    np.testing.assert_allclose(g, grads0[name], rtol=1e-4, atol=2e-6, err_msg=name)
  # Each processor holds its stage's two chunks, split over mp as usual.
  impl = make_impl("pp:2;dp:2;mp:2", "stages:pp;batch:dp;heads:mp;d_ff:mp")
  for v in lowering.graph.trainable_variables:
    if "pipeline/layer_" in v.name:
      assert impl.slice_shape(v.shape)[:2] == [2, 1], v.name


# ---------------------------------------------------------------- toy stages
W = mtf.Dimension("w", 4)


def _stage_fn(h):
  k = mtf.get_variable(h.mesh, "k", [W, mtf.Dimension("w2", 4)],
                       initializer=mtf.initializers.random_normal(stddev=0.5))
  y = mtf.einsum([h, k], output_shape=h.shape - [W] + [mtf.Dimension("w2", 4)])
  return h + mtf.tanh(mtf.rename_dimension(y, "w2", "w"))


def _dropout_stage_fn(h):
  return mtf.dropout(_stage_fn(h), True, rate=0.5)


def _recomputed_dropout_stage_fn(h):
  return mtf.recompute_grad(_dropout_stage_fn, [h])


def _toy(schedule, num_stages=S, virtual_stages=1, stage_fn=_stage_fn):
  xv = np.random.RandomState(1).normal(size=(B, 4)).astype(np.float32)
  tv = np.random.RandomState(2).normal(size=(B, 4)).astype(np.float32)
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.import_tf_tensor(mesh, tf.constant(xv), [batch, W])
  t = mtf.import_tf_tensor(mesh, tf.constant(tv), [batch, W])
  scale = mtf.get_variable(mesh, "scale", [W])

  def loss_fn(y, t):
    head = mtf.get_variable(y.mesh, "head", [W])
    return mtf.reduce_sum(mtf.square(y * head - t)) / B
  loss, stats = pl.pipeline_loss(stage_fn, loss_fn, x * scale,
                                 mtf.Dimension("stages", num_stages), M, schedule=schedule,
                                 loss_inputs=[t], return_stats=True,
                                 virtual_stages=virtual_stages)
  variables = graph.trainable_variables
  grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
  lowering = mtf.Lowering(graph, {mesh: make_impl(PP_MESH, PP_LAYOUT)})
  values = {v.name: lowering.export_to_tf_tensor(g).numpy() for v, g in zip(variables, grads)}
  stats["useful"] = float(lowering.export_to_tf_tensor(stats["useful_stage_slots"]).numpy())
  return float(lowering.export_to_tf_tensor(loss).numpy()), values, stats


def test_pipeline_loss_one_f_one_b_equals_gpipe():
  loss_g, grads_g, stats_g = _toy("gpipe")
  loss_f, grads_f, stats_f = _toy("1f1b")
  assert loss_f == pytest.approx(loss_g, rel=1e-6)
  assert set(grads_f) == {"k", "scale", "head"} == set(grads_g)
  for name in grads_g:
    assert np.abs(grads_g[name]).max() > 0, name
    np.testing.assert_allclose(grads_f[name], grads_g[name], rtol=1e-5, atol=1e-6, err_msg=name)
  assert stats_f["slots"] == stats_g["slots"] == 2 * (M + S - 1)
  # Measured in the executed graphs: flags moving with the activations (and
  # the cotangents, 1F1B) count the stage-slots that did real work.
  for stats in (stats_g, stats_f):
    assert stats["useful"] == 2 * S * M
    assert 1.0 - stats["useful"] / (S * stats["slots"]) == pytest.approx((S - 1) / (M + S - 1))


def test_graph_keeping_sets_an_entry_for_its_block_only():
  # What the schedules' keyed random numbers and stage chunks rely on.
  graph = mtf.Graph()
  with graph.keeping("k", 1):
    with graph.keeping("k", 2):
      assert graph.keeps["k"] == 2
    assert graph.keeps["k"] == 1
  assert "k" not in graph.keeps
  with pytest.raises(RuntimeError):
    with graph.keeping("k", 3):
      raise RuntimeError("in the block")
  assert "k" not in graph.keeps


def test_dropout_masks_are_the_same_in_every_schedule():
  """Dropout inside the stages: random numbers keyed by micro-batch and
  layer chunk, so 1F1B (whose backward slots recompute the stages, with
  recompute_grad inside the stage too) and the interleaved schedule draw
  GPipe's masks: the same loss and gradients."""
  loss_g, grads_g, _ = _toy("gpipe", stage_fn=_dropout_stage_fn)
  assert loss_g != pytest.approx(_toy("gpipe")[0], rel=1e-3)  # the masks matter
  for schedule, fn in (("1f1b", _dropout_stage_fn), ("1f1b", _recomputed_dropout_stage_fn)):
    loss_f, grads_f, _ = _toy(schedule, stage_fn=fn)
    assert loss_f == pytest.approx(loss_g, rel=1e-6), fn.__name__
    for name in grads_g:
      np.testing.assert_allclose(grads_f[name], grads_g[name], rtol=1e-5, atol=1e-6,
                                 err_msg=f"{fn.__name__}: {name}")
  loss_g8, grads_g8, _ = _toy("gpipe", num_stages=2 * S, stage_fn=_dropout_stage_fn)
  loss_i, grads_i, _ = _toy("interleaved", virtual_stages=2, stage_fn=_dropout_stage_fn)
  assert loss_i == pytest.approx(loss_g8, rel=1e-6)
  for name in grads_g8:
    np.testing.assert_allclose(grads_i[name], grads_g8[name].reshape(grads_i[name].shape),
                               rtol=1e-5, atol=1e-6, err_msg=name)


def test_interleaved_equals_gpipe_over_all_chunks():
  """4 stages x 2 chunks: the model of 8 GPipe stages (chunk v S + s is
  stage v S + s there, initialized alike), the same loss and gradients, a
  bubble of (S - 1) / (V M + S - 1) measured in the executed graph, and
  sends that wrap round from the last stage to the first."""
  loss_g, grads_g, _ = _toy("gpipe", num_stages=2 * S)
  loss_i, grads_i, stats = _toy("interleaved", virtual_stages=2)
  assert loss_i == pytest.approx(loss_g, rel=1e-6)
  assert grads_i["k"].shape == (2, S, 4, 4)
  for name in grads_g:
    assert np.abs(grads_g[name]).max() > 0, name
    np.testing.assert_allclose(grads_i[name], grads_g[name].reshape(grads_i[name].shape),
                               rtol=1e-5, atol=1e-6, err_msg=name)
  assert stats["useful"] == 2 * S * M * 2
  assert 1.0 - stats["useful"] / (S * stats["slots"]) == pytest.approx(
      (S - 1) / (2 * M + S - 1))
  # Without wrapping round, chunk 1 of stage 0 would never get its input.
  assert stats["schedule"].bubble_fraction < pl.PipelineSchedule("1f1b", S, M).bubble_fraction


def test_bubble_measured_in_executed_schedule():
  """A flag carried through the executed GPipe graph counts the stage-ticks
  that did useful work: S * M of S * (M + S - 1)."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.zeros(mesh, mtf.Shape([batch, W]))
  y, stats = pl.pipeline(_stage_fn, x, mtf.Dimension("stages", S), M, return_stats=True)
  lowering = mtf.Lowering(graph, {mesh: make_impl(PP_MESH, PP_LAYOUT)})
  useful = float(lowering.export_to_tf_tensor(stats["useful_stage_ticks"]).numpy())
  assert useful == S * M
  measured = 1.0 - useful / stats["stage_ticks"]
  assert measured == pytest.approx((S - 1) / (M + S - 1))
  assert lowering.export_to_tf_tensor(y).shape == (B, 4)


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
@pytest.mark.parametrize("stages,micro", [(4, 8), (2, 5), (3, 1), (1, 4)])
def test_schedule_tables(kind, stages, micro):
  sched = pl.PipelineSchedule(kind, stages, micro)
  assert sched.num_slots == 2 * (micro + stages - 1)
  assert sched.idle_fraction == pytest.approx(sched.bubble_fraction)
  assert sched.bubble_fraction == pytest.approx((stages - 1) / (micro + stages - 1))
  when = {}
  for u, row in enumerate(sched.table):
    for s, cell in enumerate(row):
      if cell is not None:
        when[(cell[0], s, cell[1])] = u
  assert len(when) == 2 * stages * micro  # each stage: one F and one B per micro-batch
  for s in range(stages):
    for m in range(micro):
      if s:
        assert when[("F", s, m)] > when[("F", s - 1, m)]
        assert when[("B", s - 1, m)] > when[("B", s, m)]
      assert when[("B", s, m)] > when[("F", stages - 1, m)]
  # 1F1B holds at most S micro-batches per stage; GPipe all M.
  assert sched.max_in_flight() == (min(stages, micro) if kind == "1f1b" else micro)


@pytest.mark.parametrize("stages,micro,chunks", [(4, 8, 2), (2, 4, 3), (3, 3, 2), (2, 2, 1)])
def test_interleaved_schedule_tables(stages, micro, chunks):
  sched = pl.PipelineSchedule("interleaved", stages, micro, virtual_stages=chunks)
  assert sched.idle_fraction == pytest.approx(sched.bubble_fraction)
  assert sched.bubble_fraction == pytest.approx((stages - 1) / (chunks * micro + stages - 1))
  when = {}
  for u, row in enumerate(sched.table):
    for s, cell in enumerate(row):
      if cell is not None:
        kind, m, v = cell
        when[(kind, v * stages + s, m)] = u
  last = stages * chunks - 1
  assert len(when) == 2 * stages * chunks * micro  # every chunk: one F and one B per micro-batch
  for c in range(last + 1):
    for m in range(micro):
      if c:
        assert when[("F", c, m)] > when[("F", c - 1, m)]
        assert when[("B", c - 1, m)] > when[("B", c, m)]
      assert when[("B", c, m)] > when[("F", last, m)]
  if chunks == 1:  # one chunk per stage is 1F1B
    assert [[c and c[:2] for c in row] for row in sched.table] == \
        pl.PipelineSchedule("1f1b", stages, micro).table


def test_errors_name_the_problem():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.zeros(mesh, mtf.Shape([batch, W]))
  stages = mtf.Dimension("stages", S)
  with pytest.raises(ValueError, match="num_microbatches=3 must divide"):
    pl.pipeline(_stage_fn, x, stages, 3)
  with pytest.raises(ValueError, match="pipeline_loss"):
    pl.pipeline(_stage_fn, x, stages, M, schedule="1f1b")
  with pytest.raises(ValueError, match="schedule must be one of"):
    pl.PipelineSchedule("zigzag", 2, 2)
  with pytest.raises(ValueError, match="num_microbatches=6 is not a multiple"):
    pl.PipelineSchedule("interleaved", 4, 6, virtual_stages=2)
  with pytest.raises(ValueError, match="virtual_stages=2 needs the 'interleaved'"):
    pl.PipelineSchedule("1f1b", 4, 8, virtual_stages=2)
  with pytest.raises(ValueError, match="pipeline_loss"):
    pl.pipeline(_stage_fn, x, stages, M, schedule="interleaved")
  with pytest.raises(ValueError, match=r"num_stages=2 x virtual_stages=3 = 6 is more than the "
                     r"stack's 4 blocks"):
    transformer.make_layer_stack([tl.DenseReluDense(hidden_size=8)], num_layers=4, num_stages=2,
                                 pipeline_schedule="interleaved", virtual_stages=3)
  with pytest.raises(ValueError, match="virtual_stages=2 needs pipeline_schedule='interleaved'"):
    transformer.make_layer_stack([tl.DenseReluDense(hidden_size=8)], num_layers=8, num_stages=2,
                                 pipeline_schedule="1f1b", virtual_stages=2)
  with pytest.raises(ValueError, match="num_stages=5 is more than the stack's 4 blocks"):
    transformer.make_layer_stack([tl.DenseReluDense(hidden_size=8)], num_layers=4, num_stages=5)
  with pytest.raises(ValueError, match="pipeline stages must have the same layers"):
    transformer.LayerStack([tl.SelfAttention(), tl.DenseReluDense()], num_stages=2)
