"""Master variables (a mesh given a variable placer, as in the original):
full-size copies named as the mtf variables, placed by the placer, that the
slices start from, and the copy ops both ways, in a TF1 Session and in a
tf.function; without a placer there are none and the copies do nothing."""

import numpy as np
import tensorflow as tf

import mesh_tensorflow as mtf
from mtf_test_utils import make_impl

HIDDEN, OUT = mtf.Dimension("hidden", 8), mtf.Dimension("out", 4)
START = np.arange(32, dtype=np.float32).reshape(8, 4) / 10


def _build(placer, train=True):
  """The variables, and an update of u (lowered, a tf.function runs it: so
  only when `train`)."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh", placer)
  w = mtf.get_variable(mesh, "w", [HIDDEN, OUT])  # mtf's own (layout-invariant) initializer
  with tf.compat.v1.variable_scope("block"):
    v = mtf.get_variable(mesh, "v", [HIDDEN, OUT],
                         initializer=tf.compat.v1.random_normal_initializer())
  u = mtf.get_variable(mesh, "u", [HIDDEN, OUT], initializer=tf.constant_initializer(START))
  step = mtf.assign_add(u, mtf.ones(mesh, u.shape) * 2.0) if train else None
  return graph, mesh, (w, v, u), step


def test_masters_in_a_tf1_session_start_equal_and_copy_both_ways():
  with tf.Graph().as_default() as g:
    placer = mtf.utils.BalancedVariablePlacer(["/cpu:0", "/cpu:1", "/cpu:2"], [0, 10, 10])
    graph, mesh, (w, v, u), step = _build(placer)
    masters = {x.operation.master.name[:-2]: x.operation.master for x in (w, v, u)}
    assert list(masters) == ["w", "block/v", "u"]  # named as the mtf variables
    assert all(g.get_tensor_by_name(name + ":0") is not None for name in masters)
    # Each new variable goes to the device with the fewest bytes so far.
    assert [m.device for m in masters.values()] == ["/cpu:0", "/cpu:1", "/cpu:2"]
    assert [m.shape.as_list() for m in masters.values()] == [[8, 4]] * 3
    lowering = mtf.Lowering(graph, {mesh: make_impl("r:2;c:4", "hidden:r;out:c")})
    values = [lowering.export_to_tf_tensor(t) for t in (w, v, u)]
    train = lowering.lowered_operation(step)
    to_masters = lowering.copy_slices_to_masters()
    to_slices = lowering.copy_masters_to_slices()
    master_u = u.operation.master
    with tf.compat.v1.Session(graph=g) as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      got, want = sess.run(values), sess.run([m.value() for m in masters.values()])
      for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)  # the slices start from the masters
      np.testing.assert_array_equal(got[2], START)
      sess.run(train)
      np.testing.assert_array_equal(sess.run(master_u.value()), START)  # training moves slices only
      sess.run(to_masters)
      np.testing.assert_array_equal(sess.run(master_u.value()), START + 2.0)
      sess.run(master_u.assign(np.full([8, 4], 7.0, np.float32)))
      sess.run(to_slices)
      np.testing.assert_array_equal(sess.run(values[2]), np.full([8, 4], 7.0))


def test_masters_in_tf_functions_are_created_once_and_copy_both_ways():
  placer = mtf.utils.BalancedVariablePlacer(["cpu:0", "cpu:1"])
  impl = make_impl("r:2;c:4", "hidden:r;out:c")
  made = []

  @tf.function(autograph=False)
  def run(action):
    graph, mesh, (_, _, u), step = _build(placer, train=action == "train")
    made.append(u.operation.master)
    lowering = mtf.Lowering(graph, {mesh: impl})
    if action == "to_masters":
      lowering.copy_slices_to_masters()  # a tf.function runs its stateful ops
      return None
    if action == "to_slices":
      lowering.copy_masters_to_slices()
      return None
    deps = [lowering.lowered_operation(step)] if step is not None else []
    with tf.control_dependencies(deps):
      return tf.identity(lowering.export_to_tf_tensor(u))
  np.testing.assert_array_equal(run("read").numpy(), START)  # the slices start from the master
  master = made[0]
  assert master.name == "u:0" and master.device.endswith(("CPU:0", "CPU:1"))
  run("train")
  np.testing.assert_array_equal(run("read").numpy(), START + 2.0)
  np.testing.assert_array_equal(master.numpy(), START)  # training moves the slices only
  run("to_masters")
  np.testing.assert_array_equal(master.numpy(), START + 2.0)
  master.assign(np.zeros([8, 4], np.float32))
  run("to_slices")
  np.testing.assert_array_equal(run("read").numpy(), np.zeros([8, 4]))
  assert all(m is master for m in made)  # one master however many traces


def test_without_a_placer_there_are_no_masters():
  @tf.function(autograph=False)
  def run():
    graph, mesh, (w, v, u), step = _build(None)
    assert u.operation.master is None
    lowering = mtf.Lowering(graph, {mesh: make_impl("r:2;c:4", "hidden:r;out:c")})
    with tf.control_dependencies([lowering.copy_slices_to_masters(),
                                  lowering.copy_masters_to_slices()]):
      return tf.identity(lowering.export_to_tf_tensor(u))
  np.testing.assert_array_equal(run().numpy(), START)
