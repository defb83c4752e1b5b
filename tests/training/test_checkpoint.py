"""Layout-independent checkpoints (mesh_tensorflow.training.checkpoint).

A model trained a few Adam steps on a 2x4 mesh is saved, then restored under
other meshes and layouts: every variable and optimizer slot must come back
bit-identical, whatever slices it was saved as and is read into.
"""

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.lowering import slice_variables
from mtf_test_utils import make_impl

# The module's fixtures are computed once: its tests share one test worker.
pytestmark = pytest.mark.xdist_group("checkpoint")

BATCH, FEATURES, HIDDEN, CLASSES = 16, 8, 32, 4
SAVE_MESH, SAVE_LAYOUT = "rows:2;cols:4", "batch:rows;hidden:cols"
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _model(mesh, x, y, hidden=HIDDEN, extra=False):
  """An MLP with a bfloat16-slice variable (float32 master), a bfloat16
  variable and a name that needs escaping in the checkpoint."""
  b, f = mtf.Dimension("batch", BATCH), mtf.Dimension("features", FEATURES)
  h, c = mtf.Dimension("hidden", hidden), mtf.Dimension("classes", CLASSES)
  xs = mtf.import_tf_tensor(mesh, x, [b, f])
  ys = mtf.import_tf_tensor(mesh, y, [b])
  w1 = mtf.get_variable(mesh, "w1", [f, h])
  b1 = mtf.get_variable(mesh, "b1", [h], initializer=tf.zeros_initializer())
  scale = mtf.get_variable(mesh, "scale", [h], dtype=tf.float32, slice_dtype=tf.bfloat16,
                           initializer=tf.random_uniform_initializer(0.5, 1.5, seed=3))
  w2 = mtf.get_variable(mesh, "out.proj/w2", [h, c])
  bias16 = mtf.get_variable(mesh, "bias16", [c], dtype=tf.bfloat16,
                            initializer=tf.zeros_initializer())
  hid = mtf.relu(mtf.einsum([xs, w1], output_shape=[b, h]) + b1) * scale
  if extra:
    hid = hid * mtf.get_variable(mesh, "extra", [h], initializer=tf.ones_initializer())
  logits = mtf.einsum([hid, w2], output_shape=[b, c]) + mtf.cast(bias16, tf.float32)
  return mtf.reduce_mean(mtf.reduce_logsumexp(logits, c)
                         - mtf.reduce_sum(logits * mtf.one_hot(ys, c), reduced_dim=c))


def _make_step(impl, optimizer=None, **model_kwargs):
  """A compiled train step (the README's TF2 pattern) on `impl`."""
  optimizer = optimizer or mtf.optimize.AdamWeightDecayOptimizer(0.01)

  @tf.function(autograph=False)
  def step(x, y):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    loss = _model(mesh, x, y, **model_kwargs)
    variables = graph.trainable_variables
    grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
    updates = optimizer.apply_grads(grads, variables)
    lowering = mtf.Lowering(graph, {mesh: impl})
    with tf.control_dependencies([lowering.lowered_operation(u) for u in updates]):
      return tf.identity(lowering.export_to_tf_tensor(loss))
  return step


def _trace(step):
  """Traces `step` without running it: creates (and restores) the variables."""
  step.get_concrete_function(tf.TensorSpec([BATCH, FEATURES], tf.float32),
                             tf.TensorSpec([BATCH], tf.int32))


def _data():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(BATCH, FEATURES)).astype(np.float32)
  return x, (x[:, :CLASSES].argmax(axis=1)).astype(np.int32)


def _values(impl):
  return {name: (var.numpy(), var.slices[0].dtype)
          for name, var in slice_variables.variable_store(impl).items()}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
  """(directory, {name: (full value, slice dtype)}, losses) after 3 Adam
  steps on the 2x4 mesh, saved at step 3."""
  directory = str(tmp_path_factory.mktemp("ckpt"))
  impl = make_impl(SAVE_MESH, SAVE_LAYOUT)
  step = _make_step(impl)
  x, y = _data()
  losses = [float(step(x, y)) for _ in range(3)]
  manager = mtf.checkpoint.CheckpointManager(impl, directory)
  path = manager.save(3)
  assert path.endswith("ckpt-3") and manager.latest_checkpoint == path
  values = _values(impl)
  next_loss = float(step(x, y))
  return directory, values, losses, next_loss


def test_saved_state_has_variables_and_slots(saved):
  _, values, losses, _ = saved
  assert losses[-1] < losses[0]
  for name in ["w1", "b1", "scale", "out.proj/w2", "bias16"]:
    assert name in values
    slots = [n for n in values if n.startswith(name + "/")]
    assert len(slots) == 2, (name, slots)  # Adam's two moments
    for slot in slots:
      assert np.any(values[slot][0] != 0), slot
  assert values["scale"][1] == tf.bfloat16 and values["bias16"][1] == tf.bfloat16


@pytest.mark.parametrize("mesh_shape,layout,kwargs", [
    ("all:8", "hidden:all", {}),
    ("all:1", "", {}),
    ("rows:2;cols:4", "hidden:rows;batch:cols", {}),
    ("rows:2;cols:4", "batch:rows", {"share_replicas": False}),
])
def test_restore_under_other_meshes_is_exact(saved, mesh_shape, layout, kwargs):
  directory, values, _, next_loss = saved
  impl = make_impl(mesh_shape, layout, **kwargs)
  manager = mtf.checkpoint.CheckpointManager(impl, directory)
  assert manager.restore_or_initialize().endswith("ckpt-3")
  step = _make_step(impl)
  _trace(step)  # Variables are created now, from the checkpoint.
  restored = _values(impl)
  assert sorted(restored) == sorted(values)
  for name, (value, dtype) in values.items():
    assert restored[name][1] == dtype, name
    np.testing.assert_array_equal(restored[name][0], value, err_msg=name)
  # Training goes on as it would have on the saving mesh.
  np.testing.assert_allclose(float(step(*_data())), next_loss, rtol=1e-5)


def test_restore_into_existing_variables(saved):
  directory, values, _, _ = saved
  impl = make_impl("all:8", "batch:all")
  step = _make_step(impl)
  for _ in range(2):
    step(*_data())  # Different values from the checkpoint's.
  assert not np.array_equal(_values(impl)["w1"][0], values["w1"][0])
  mtf.checkpoint.CheckpointManager(impl, directory).restore()
  for name, (value, _) in values.items():
    np.testing.assert_array_equal(_values(impl)[name][0], value, err_msg=name)


def test_bfloat16_slices_round_trip(saved, tmp_path):
  directory, values, _, _ = saved
  scale = values["scale"][0]
  assert scale.dtype == tf.bfloat16.as_numpy_dtype
  # Saved in the float32 master dtype, holding exactly the bfloat16 values.
  reader = tf.train.load_checkpoint(directory + "/ckpt-3")
  key = slice_variables.checkpoint_key("scale")
  assert reader.get_variable_to_dtype_map()[key] == tf.float32
  np.testing.assert_array_equal(reader.get_tensor(key), scale.astype(np.float32))
  # Save again from a mesh that restored it, then restore that on one device.
  impl = make_impl("all:8", "hidden:all")
  mtf.checkpoint.CheckpointManager(impl, directory).restore()
  _trace(_make_step(impl))
  mtf.checkpoint.CheckpointManager(impl, str(tmp_path)).save(1)
  single = make_impl("all:1", "")
  mtf.checkpoint.CheckpointManager(single, str(tmp_path)).restore()
  _trace(_make_step(single))
  for name, (value, dtype) in values.items():
    assert _values(single)[name][1] == dtype, name
    np.testing.assert_array_equal(_values(single)[name][0], value, err_msg=name)


def test_missing_trainable_variable_is_an_error(saved):
  directory, values, _, _ = saved
  # Deferred restore: the error comes when the variable is created.
  impl = make_impl("all:8", "hidden:all")
  mtf.checkpoint.CheckpointManager(impl, directory).restore()
  with pytest.raises(ValueError, match=r"has no variable 'extra'.*allow_missing=True"):
    _trace(_make_step(impl, extra=True))
  # Existing variables: nothing is assigned when one is missing.
  impl = make_impl("all:8", "hidden:all")
  step = _make_step(impl, extra=True)
  _trace(step)
  before = _values(impl)["w1"][0]
  with pytest.raises(ValueError, match=r"has no variable 'extra'"):
    mtf.checkpoint.CheckpointManager(impl, directory).restore()
  np.testing.assert_array_equal(_values(impl)["w1"][0], before)
  # allow_missing: "extra" keeps its initializer, the rest is restored.
  mtf.checkpoint.CheckpointManager(impl, directory).restore(allow_missing=True)
  np.testing.assert_array_equal(_values(impl)["w1"][0], values["w1"][0])
  np.testing.assert_array_equal(_values(impl)["extra"][0], np.ones(HIDDEN, np.float32))


def test_missing_optimizer_slots_start_from_zero(saved):
  # Saved with Adam, resumed with momentum: its (new) slots start at zero.
  directory, values, _, _ = saved
  impl = make_impl("all:8", "hidden:all")
  mtf.checkpoint.CheckpointManager(impl, directory).restore()
  _trace(_make_step(impl, optimizer=mtf.optimize.MomentumOptimizer(0.1, momentum=0.9)))
  restored = _values(impl)
  np.testing.assert_array_equal(restored["w1"][0], values["w1"][0])
  new_slots = set(restored) - set(values)
  assert new_slots and all(not np.any(restored[n][0]) for n in new_slots)


def test_wrong_shape_is_an_error(saved):
  directory, _, _, _ = saved
  impl = make_impl("all:8", "hidden:all")
  mtf.checkpoint.CheckpointManager(impl, directory).restore()
  with pytest.raises(ValueError, match=r"variable 'w1' with shape \[8, 32\].*needs \[8, 64\]"):
    _trace(_make_step(impl, hidden=64))
  impl = make_impl("all:8", "hidden:all")
  _trace(_make_step(impl, hidden=64))
  with pytest.raises(ValueError, match=r"'w1' with shape \[8, 32\]; the model needs \[8, 64\]"):
    mtf.checkpoint.CheckpointManager(impl, directory).restore()


def test_no_checkpoint_is_an_error(tmp_path):
  impl = make_impl("all:8", "hidden:all")
  manager = mtf.checkpoint.CheckpointManager(impl, str(tmp_path))
  assert manager.restore_or_initialize() is None
  with pytest.raises(ValueError, match="No checkpoint found"):
    manager.restore()
  with pytest.raises(ValueError, match="no mtf variables exist yet"):
    manager.save(0)


def test_list_variables_and_inspect_checkpoint_cli(saved, tmp_path):
  directory, values, _, _ = saved
  listed = mtf.checkpoint.list_variables(directory)
  assert [name for name, _, _ in listed] == sorted(values)
  shapes = {name: (shape, dtype) for name, shape, dtype in listed}
  assert shapes["w1"] == ([FEATURES, HIDDEN], "float32")
  assert shapes["out.proj/w2"] == ([HIDDEN, CLASSES], "float32")
  assert shapes["bias16"] == ([CLASSES], "bfloat16")
  assert shapes["scale"] == ([HIDDEN], "float32")
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
  cmd = [sys.executable, "-m", "mesh_tensorflow.inspect_checkpoint"]
  proc = subprocess.run(cmd + [directory], capture_output=True, text=True, env=env,
                        cwd=REPO_ROOT, timeout=600, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  rows = {line.split()[0]: line for line in proc.stdout.splitlines()}
  assert "[8, 32]" in rows["w1"] and "float32" in rows["w1"]
  assert "[32, 4]" in rows["out.proj/w2"]
  assert f"{len(values)} variables" in proc.stdout
  bad = subprocess.run(cmd + [str(tmp_path)], capture_output=True, text=True, env=env,
                       cwd=REPO_ROOT, timeout=600, check=False)
  assert bad.returncode == 2 and "No checkpoint in directory" in bad.stderr


class _TaggedFormat:
  """A checkpoint format recognized by a marker file beside the prefix."""

  def __init__(self):
    self.restored = []

  def recognizes(self, prefix):
    return os.path.exists(prefix + ".tagged")

  def restore_into(self, variables, prefix, allow_missing, include_optimizer_state):
    self.restored.append((sorted(variables), prefix, allow_missing, include_optimizer_state))
    return self

  def pending_value(self, name, full_shape, begin, size, trainable, graph=None):
    del name, begin, graph
    return np.full(size, 7.0, np.float32) if trainable else None

  def list_variables(self, prefix):
    return [("tagged", [1], "float32")]


def test_a_registered_format_restores_and_lists(saved, tmp_path):
  directory, _, _, _ = saved
  prefix = mtf.checkpoint.resolve(directory)
  assert mtf.checkpoint.format_of(prefix) is None  # this library's own format
  tagged = _TaggedFormat()
  mtf.checkpoint.register_format(tagged)
  try:
    with open(prefix + ".tagged", "w", encoding="utf-8"):
      pass
    assert mtf.checkpoint.format_of(prefix) is tagged
    assert mtf.checkpoint.list_variables(directory) == [("tagged", [1], "float32")]
    impl = make_impl("all:8", "hidden:all")
    manager = mtf.checkpoint.CheckpointManager(impl, str(tmp_path))
    assert manager.restore(directory, allow_missing=True, verify=False) == prefix
    assert tagged.restored == [([], prefix, True, True)]
    # Variables created later start from what the format's restore returned.
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    w = mtf.get_variable(mesh, "w", [mtf.Dimension("hidden", 16)])
    lowering = mtf.Lowering(graph, {mesh: impl})
    np.testing.assert_array_equal(lowering.export_to_tf_tensor(w), np.full([16], 7.0))
  finally:
    os.remove(prefix + ".tagged")
    mtf.checkpoint._FORMATS.remove(tagged)  # pylint: disable=protected-access
  assert mtf.checkpoint.format_of(prefix) is None
