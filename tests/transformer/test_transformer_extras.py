"""The original's remaining transformer.py and moe.py names: the reversible
layer stack, distillation, ensemble reductions, annealed dropout and the
functional mixture-of-experts layers, against NumPy and across layouts."""

import types

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import gin_config, moe, transformer
from mesh_tensorflow.transformer import transformer_layers as tl
from mtf_test_utils import lower_and_run

B, L, D, FF, V = 4, 3, 8, 16, 12
batch, length = mtf.Dimension("batch", B), mtf.Dimension("length", L)
d_model, vocab = mtf.Dimension("d_model", D), mtf.Dimension("vocab", V)
X = np.random.RandomState(0).randn(B, L, D).astype(np.float32)
R = np.random.RandomState(1).randn(B, L, D).astype(np.float32)
LAYOUTS = [("all:8", "d_ff:all"), ("rows:2;cols:4", "batch:rows;d_ff:cols")]


def _context(mesh, mode="train", losses=None):
  model = types.SimpleNamespace(model_dim=d_model, layout=None, mesh_shape=None)
  return transformer.Context(model, mesh, [batch], length, mtf.VariableDType(), mode=mode,
                             losses=losses)


def _with_grads(mesh, x, y, out):
  loss = mtf.reduce_sum(y * mtf.import_tf_tensor(mesh, tf.constant(R[..., :y.shape[-1].size]),
                                                 y.shape))
  variables = mesh.graph.trainable_variables
  grads = mtf.gradients([loss], [x] + [v.outputs[0] for v in variables])
  out.update({"y": y, "grad/x": grads[0]})
  for v, g in zip(variables, grads[1:]):
    out[v.name] = v.outputs[0]
    out["grad/" + v.name] = g
  return out


def _reversible(recompute):
  def build(mesh):
    stack = transformer.ReversibleLayerStack(
        [tl.DenseReluDense(hidden_size=FF), tl.DenseReluDense(hidden_size=FF)],
        recompute_grads=recompute)
    x = mtf.import_tf_tensor(mesh, tf.constant(X), [batch, length, d_model])
    return _with_grads(mesh, x, stack.call(_context(mesh), x), {})
  return build


def _rms(x, scale):
  return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * scale


def test_reversible_layer_stack_matches_numpy_and_plain_backprop():
  got = lower_and_run(_reversible(True), "all:1", "")
  x1 = x2 = X
  for i in range(2):
    p = f"layer_{i:03d}/"
    h = np.maximum(_rms(x2, got[p + "rms_norm/scale"]) @ got[p + "DenseReluDense/wi/kernel"], 0)
    x1, x2 = x2, x1 + h @ got[p + "DenseReluDense/wo/kernel"]
  np.testing.assert_allclose(got["y"], _rms(x1 + x2, got["rms_norm/scale"]),
                             rtol=1e-5, atol=1e-5)
  plain = lower_and_run(_reversible(False), "all:1", "")
  assert sorted(plain) == sorted(got)
  for key in got:
    np.testing.assert_allclose(got[key], plain[key], rtol=1e-4, atol=1e-5, err_msg=key)
  assert np.abs(got["grad/layer_000/DenseReluDense/wi/kernel"]).max() > 0


@pytest.mark.parametrize("mesh_shape,layout", LAYOUTS)
def test_reversible_layer_stack_does_not_depend_on_the_layout(mesh_shape, layout):
  single = lower_and_run(_reversible(True), "all:1", "")
  split = lower_and_run(_reversible(True), mesh_shape, layout)
  for key in single:
    np.testing.assert_allclose(split[key], single[key], rtol=1e-4, atol=1e-5, err_msg=key)


def test_reversible_layer_stack_refuses_pipelining():
  with pytest.raises(ValueError, match="num_stages must be 1"):
    transformer.ReversibleLayerStack([tl.DenseReluDense(), tl.DenseReluDense()],
                                     num_stages=2)


ENSEMBLE = mtf.Dimension("ensemble", 2)
LOGITS = np.random.RandomState(2).randn(2, B, V).astype(np.float32)


def _ensemble(mesh):
  logits = mtf.import_tf_tensor(mesh, tf.constant(LOGITS), [ENSEMBLE, batch, vocab])
  select = lambda lg, e, v: transformer.reduce_ensemble_logits_select(lg, e, v, model_id=3)  # noqa
  return {"prob": transformer.reduce_ensemble_logits(logits, ENSEMBLE, vocab),
          "logit": transformer.reduce_ensemble_logits_mean_logit(logits, ENSEMBLE, vocab),
          "select": transformer.reduce_ensemble_logits(logits, ENSEMBLE, vocab, select)}


@pytest.mark.parametrize("mesh_shape,layout", [("all:1", "")] + [
    ("all:2", "ensemble:all"), ("rows:2;cols:4", "batch:cols;vocab:rows")])
def test_ensemble_reductions_match_numpy(mesh_shape, layout):
  got = lower_and_run(_ensemble, mesh_shape, layout)
  probs = np.exp(LOGITS) / np.exp(LOGITS).sum(-1, keepdims=True)
  np.testing.assert_allclose(got["prob"], np.log(probs.mean(0)), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(got["logit"], LOGITS.mean(0), rtol=1e-6)
  np.testing.assert_allclose(got["select"], LOGITS[1], rtol=1e-6)  # 3 % 2


def _annealed(rate, start, end):
  def build(mesh):
    x = mtf.ones(mesh, mtf.Shape([batch, length, d_model]))
    return {"y": transformer.sublayer_annealed_dropout(
        x, None, _context(mesh), init_dropout_rate=rate, start_step=start, end_step=end)}
  return build


@pytest.mark.parametrize("mesh_shape,layout", [("all:1", ""), ("rows:2;cols:4", "batch:rows;d_model:cols")])
def test_annealed_dropout_rate_falls_with_the_step(mesh_shape, layout):
  # The step counter is 0: before the start the rate is the initial one;
  # half-way (start -4, end 4) half of it; past the end no dropout.
  for (start, end), keep in (((0, 10), 0.5), ((-4, 4), 0.75), ((-9, -1), 1.0)):
    y = lower_and_run(_annealed(0.5, start, end), mesh_shape, layout)["y"]
    values = np.unique(y)
    assert len(values) <= 2 and values[0] in (0.0, np.float32(1 / keep))
    np.testing.assert_allclose(values[-1], 1.0 / keep, rtol=1e-6)
    # One mask per example and channel, shared by all positions.
    assert (y == y[:, :1, :]).all()
    if keep < 1.0:
      assert 0 < (y == 0).mean() < 1
  with pytest.raises(ValueError, match="start_step and end_step are required"):
    lower_and_run(_annealed(0.5, None, 3), "all:1", "")


def _lm(d):
  stack = transformer.LayerStack([tl.DenseReluDense(hidden_size=FF)])
  return transformer.Unitransformer(stack, d_model=d, input_vocab_size=V, output_vocab_size=V,
                                    autoregressive=True, vocab_divisor=1, z_loss=0.0)


IDS = np.random.RandomState(3).randint(1, V, size=(B, L)).astype(np.int32)
IDS[0, -1] = 0  # padding


def _distill(mesh):
  model = transformer.StudentTeacher(_lm(8), _lm(16), temperature=2.0, fraction_soft=0.25,
                                     distill_start_step=-1)
  targets = mtf.import_tf_tensor(mesh, tf.constant(IDS), [batch, length])
  inputs = mtf.shift(targets, 1, length, wrap=False)
  logits, loss = model.call_simple(inputs, targets, True)
  teacher_vars = [v for v in mesh.graph.all_variables if v.name.startswith("teacher/")]
  assert teacher_vars and not any(v.trainable for v in teacher_vars)
  # The teacher logits, from the teacher's own variables.
  with mtf.name_scope(mesh, "teacher"):
    teacher_logits, _ = model.teacher.call_simple(inputs, targets, True)
  grads = mtf.gradients([loss], [v.outputs[0] for v in mesh.graph.trainable_variables
                                 if v.name.startswith("student/")])
  return {"logits": logits, "loss": loss, "teacher": teacher_logits,
          "grad_norm": mtf.add_n([mtf.reduce_sum(mtf.square(g)) for g in grads])}


@pytest.mark.parametrize("mesh_shape,layout", [("all:1", ""), ("rows:2;cols:4",
                                                               "batch:rows;d_ff:cols")])
def test_student_teacher_loss_matches_numpy(mesh_shape, layout):
  got = lower_and_run(_distill, mesh_shape, layout)
  s, t = got["logits"] / 2.0, got["teacher"] / 2.0
  log_p = s - np.log(np.exp(s).sum(-1, keepdims=True))
  q = np.exp(t) / np.exp(t).sum(-1, keepdims=True)
  weights = (IDS > 0).astype(np.float32)
  soft = (-(q * log_p).sum(-1) * weights).sum() / weights.sum()
  s1 = got["logits"]
  log_p1 = s1 - np.log(np.exp(s1).sum(-1, keepdims=True))
  hard = -(np.take_along_axis(log_p1, IDS[..., None], -1)[..., 0] * weights).sum() / weights.sum()
  np.testing.assert_allclose(got["loss"], 0.75 * hard + 4.0 * 0.25 * soft, rtol=1e-5)
  assert got["grad_norm"] > 0
  if mesh_shape != "all:1":
    single = lower_and_run(_distill, "all:1", "")
    for key in single:
      np.testing.assert_allclose(got[key], single[key], rtol=1e-4, atol=1e-6, err_msg=key)


def test_student_teacher_before_the_start_step_is_the_hard_loss():
  def build(mesh):
    model = transformer.StudentTeacher(_lm(8), _lm(8), temperature=2.0, fraction_soft=0.5,
                                       distill_start_step=0)
    targets = mtf.import_tf_tensor(mesh, tf.constant(IDS), [batch, length])
    inputs = mtf.shift(targets, 1, length, wrap=False)
    _, loss = model.call_simple(inputs, targets, True)
    with mtf.name_scope(mesh, "student"):
      _, hard = model.student.call_simple(inputs, targets, True)
    return {"loss": loss, "hard": hard}
  got = lower_and_run(build, "all:1", "")
  np.testing.assert_allclose(got["loss"], got["hard"], rtol=1e-6)
  with pytest.raises(ValueError, match="fraction_soft must be in"):
    transformer.StudentTeacher(_lm(8), _lm(8), fraction_soft=2.0)


@pytest.fixture
def clean_gin():
  gin.clear_config()
  yield
  gin.clear_config()


def test_make_bi_student_teacher_from_gin(clean_gin):
  gin_config.parse([], [
      "transformer.make_layer_stack.layers = [@transformer_layers.DenseReluDense]",
      "transformer.make_layer_stack.num_layers = 1",
      "student/Unitransformer.d_model = 8", "teacher/Unitransformer.d_model = 16",
      "StudentTeacher.temperature = 3.0"], defaults=False)
  model = transformer.make_bi_student_teacher(input_vocab_size=16, output_vocab_size=16)
  assert model.temperature == 3.0
  assert model.student.encoder.model_dim.size == 8
  assert model.teacher.decoder.model_dim.size == 16


def _hparams(**overrides):
  hparams = moe.HParams()
  moe.set_default_moe_hparams(hparams)
  hparams.moe_num_experts = 4
  hparams.moe_hidden_size = FF
  hparams.moe_group_size = 6
  hparams.moe_second_policy_train = "all"
  for k, v in overrides.items():
    setattr(hparams, k, v)
  return hparams


def _moe(version, out_size):
  def build(mesh):
    x = mtf.import_tf_tensor(mesh, tf.constant(X), [batch, length, d_model])
    out_dim = d_model if out_size == D else mtf.Dimension("d_out", out_size)
    fn = moe.transformer_moe_layer_v1 if version == 1 else moe.transformer_moe_layer_v2
    hparams = _hparams() if version == 1 else _hparams(moe_num_experts=[2, 2])
    y, loss = fn(x, out_dim, hparams, True, mtf.VariableDType())
    return _with_grads(mesh, x, y, {"loss": loss})
  return build


def _moe1d(mesh):
  x = mtf.import_tf_tensor(mesh, tf.constant(X), [batch, length, d_model])
  losses = []
  layer = moe.MoE1D(num_experts=4, hidden_size=FF, group_size=6, second_policy_train="all",
                    hidden_dim_name="expert_hidden")
  y = layer.call(_context(mesh, losses=losses), x)
  return _with_grads(mesh, x, y, {"loss": losses[0]})


def test_moe_layer_v1_is_moe1d():
  got = lower_and_run(_moe(1, D), "all:1", "")
  ref = lower_and_run(_moe1d, "all:1", "")
  assert sorted(got) == sorted(ref)
  for key in ref:
    np.testing.assert_allclose(got[key], ref[key], rtol=1e-5, atol=1e-6, err_msg=key)
  assert got["y"].shape == (B, L, D) and np.abs(got["y"]).max() > 0


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("mesh_shape,layout", [("all:8", "expert_hidden:all"),
                                               ("rows:2;cols:4", "batch:rows;experts:cols")])
def test_moe_layers_do_not_depend_on_the_layout(version, mesh_shape, layout):
  single = lower_and_run(_moe(version, 6), "all:1", "")
  assert single["y"].shape == (B, L, 6)
  assert single["wo/kernel"].shape == (4, FF, 6)
  split = lower_and_run(_moe(version, 6), mesh_shape, layout)
  for key in single:
    np.testing.assert_allclose(split[key], single[key], rtol=1e-4, atol=1e-5, err_msg=key)


def test_moe_hparams_errors():
  hparams = _hparams(moe_num_experts=[2, 2])
  with pytest.raises(ValueError, match="must be an int"):
    lower_and_run(lambda mesh: {"y": moe.transformer_moe_layer_v1(
        mtf.ones(mesh, mtf.Shape([batch, length, d_model])), d_model, hparams, True,
        mtf.VariableDType())[0]}, "all:1", "")
  with pytest.raises(ValueError, match="must be a pair"):
    lower_and_run(lambda mesh: {"y": moe.transformer_moe_layer_v2(
        mtf.ones(mesh, mtf.Shape([batch, length, d_model])), d_model, _hparams(), True,
        mtf.VariableDType())[0]}, "all:1", "")


def test_trainer_advances_the_step_counter_models_read(tmp_path):
  # The Trainer gives the optimizer its own step; the graph's step counter,
  # which annealed dropout and StudentTeacher read, must count updates too.
  from mtf_test_utils import make_impl
  seen = []

  def model_fn(mesh, features, mode):
    x = features["x"]
    w = mtf.get_variable(mesh, "w", mtf.Shape([batch]))
    counter = mtf.cast(mtf.optimize.step_counter(mesh), tf.float32)
    return mtf.reduce_sum(w * x), {"counter": counter}

  trainer = mtf.training.Trainer(model_fn, {"x": "batch:4"}, make_impl("all:1", ""),
                                 mtf.optimize.SgdOptimizer(0.1), log_every=0,
                                 model_dir=str(tmp_path), checkpoint_every=None)
  ds = tf.data.Dataset.from_tensors({"x": tf.ones([4])}).repeat()
  history = trainer.train(ds, steps=3, hooks=[lambda step, out: seen.append(out["counter"])])
  assert seen == [0.0, 1.0, 2.0], (seen, history)


def test_student_teacher_initialize_loads_the_teacher_checkpoint(tmp_path):
  from mtf_test_utils import make_impl

  def lower(build, impl):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    build(mesh)
    mtf.Lowering(graph, {mesh: impl})  # eager: creates the variables
    return graph

  def teacher_alone(mesh):
    targets = mtf.import_tf_tensor(mesh, tf.constant(IDS), [batch, length])
    _lm(16).call_simple(mtf.shift(targets, 1, length, wrap=False), targets, True)

  teacher_impl = make_impl("all:2", "batch:all")
  lower(teacher_alone, teacher_impl)
  from mesh_tensorflow.training import checkpoint
  from mesh_tensorflow.lowering import slice_variables
  saved = checkpoint.CheckpointManager(teacher_impl, str(tmp_path)).save(5)
  teacher_values = {n: v.numpy() for n, v in slice_variables.variable_store(teacher_impl).items()}

  model = transformer.StudentTeacher(_lm(16), _lm(16), temperature=2.0, fraction_soft=0.5,
                                     teacher_checkpoint=saved, initialize_student_weights=True)

  def pair(mesh):
    targets = mtf.import_tf_tensor(mesh, tf.constant(IDS), [batch, length])
    model.call_simple(mtf.shift(targets, 1, length, wrap=False), targets, True)

  impl = make_impl("rows:2;cols:4", "batch:rows;d_ff:cols")
  lower(pair, impl)
  store = slice_variables.variable_store(impl)
  before = store["student/transformer/layer_000/DenseReluDense/wi/kernel"].numpy()
  model.initialize(impl)
  for name, value in teacher_values.items():
    np.testing.assert_array_equal(store["teacher/" + name].numpy(), value, err_msg=name)
    np.testing.assert_array_equal(store["student/" + name].numpy(), value, err_msg=name)
  assert not np.array_equal(before, teacher_values["transformer/layer_000/DenseReluDense/wi/kernel"])
  with pytest.raises(ValueError, match="teacher_checkpoint is not set"):
    transformer.StudentTeacher(_lm(8), _lm(8), fraction_soft=0.5).initialize(impl)
