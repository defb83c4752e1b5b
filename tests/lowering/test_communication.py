"""Exact communication costs, read from the Lowering's counters.

Each test lowers a small graph and checks which collectives the lowering
recorded (kind, mesh axes, bytes per processor), that the values are right,
and, for the TensorFlow collective ops mode, which ops were emitted.
"""

import inspect

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.lowering import observers

import mtf_test_utils
from mtf_test_utils import lower_and_run

F32 = 4  # bytes

_HAS_SHARE_OPTION = "share_replicas" in inspect.signature(
    mtf.placement_mesh_impl.PlacementMeshImpl).parameters
# Every count must hold whether or not replicas share tensors on CPU.
IMPL_VARIANTS = [{}] + ([{"share_replicas": False}] if _HAS_SHARE_OPTION else [])


def _records(lowering, kind=None):
  return [r for r in lowering.collective_records if kind is None or r.kind == kind]


def _kinds(lowering):
  return sorted({r.kind for r in lowering.collective_records})


# ----------------------------------------------------------- data parallel
def _mlp(train: bool):
  xv = np.random.default_rng(0).normal(size=(8, 16)).astype(np.float32)

  def builder(mesh):
    x = mtf.import_tf_tensor(mesh, tf.constant(xv), "batch:8;hidden:16")
    w1 = mtf.get_variable(mesh, "w1", "hidden:16;mid:8")
    w2 = mtf.get_variable(mesh, "w2", "mid:8;out:4")
    h = mtf.relu(mtf.einsum([x, w1], output_shape="batch:8;mid:8"))
    y = mtf.einsum([h, w2], output_shape="batch:8;out:4")
    loss = mtf.reduce_sum(mtf.square(y))
    g1, g2 = mtf.gradients([loss], [w1, w2])
    if train:
      updates = [mtf.assign(w1, w1 - 0.01 * g1), mtf.assign(w2, w2 - 0.01 * g2)]
      return {"loss": mtf.depend(loss, updates)}
    return {"g1": g1, "g2": g2, "loss": loss}
  return builder


@pytest.mark.parametrize("impl_kwargs", IMPL_VARIANTS)
@pytest.mark.parametrize("mesh_shape,layout,axis,group", [
    ("all:8", "batch:all", 0, 8),
    ("rows:2;cols:4", "batch:rows", 0, 2),
    ("rows:2;cols:4", "batch:cols", 1, 4),
    ("a:2;b:2;c:2", "batch:c", 2, 2),
])
def test_data_parallel_gradients_one_allreduce_per_weight(mesh_shape, layout, axis, group,
                                                          impl_kwargs):
  got, lowering = lower_and_run(_mlp(train=False), mesh_shape, layout,
                                return_lowering=True, **impl_kwargs)
  assert _kinds(lowering) == ["allreduce"], lowering.report()
  allreduces = _records(lowering, "allreduce")
  # One per weight gradient (full weight: 16*8 and 8*4 floats) plus the loss.
  assert sorted(r.bytes_per_processor for r in allreduces) == sorted(
      [16 * 8 * F32, 8 * 4 * F32, F32]), lowering.report()
  for r in allreduces:
    assert r.mesh_axes == (axis,)
    assert r.group_size == group
    assert r.num_groups == 8 // group
  assert lowering.collective_counts() == {"allreduce": (3, (16 * 8 + 8 * 4 + 1) * F32)}
  reference = lower_and_run(_mlp(train=False), "all:8", "")
  for key in reference:
    np.testing.assert_allclose(got[key], reference[key], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("impl_kwargs", IMPL_VARIANTS)
def test_data_parallel_training_step_one_allreduce_per_weight(impl_kwargs):
  _, lowering = lower_and_run(_mlp(train=True), "all:8", "batch:all",
                              return_lowering=True, **impl_kwargs)
  allreduces = _records(lowering, "allreduce")
  assert _kinds(lowering) == ["allreduce"], lowering.report()
  assert sorted(r.bytes_per_processor for r in allreduces) == sorted(
      [16 * 8 * F32, 8 * 4 * F32, F32])


def test_replicated_layout_has_no_collectives():
  _, lowering = lower_and_run(_mlp(train=False), "all:8", "", return_lowering=True)
  assert lowering.collective_records == []
  assert not [k for k, _ in lowering.counters if k.startswith("collective")]


# ----------------------------------------------------------- model parallel
def _einsum_builder(hidden=16, reduce_to=None, two_products=False):
  rng = np.random.default_rng(1)
  xv = rng.normal(size=(8, hidden)).astype(np.float32)
  wv = rng.normal(size=(hidden, 4)).astype(np.float32)

  def builder(mesh):
    x = mtf.import_tf_tensor(mesh, tf.constant(xv), f"batch:8;hidden:{hidden}")
    w = mtf.import_tf_tensor(mesh, tf.constant(wv), f"hidden:{hidden};out:4")
    y = mtf.einsum([x, w], output_shape="batch:8;out:4")
    if two_products:
      y = y + mtf.einsum([x * 2.0, w], output_shape="batch:8;out:4")
    if reduce_to is not None:
      y = mtf.reduce_sum(y, output_shape=reduce_to)
    return {"y": y}
  scale = 3.0 if two_products else 1.0
  y = scale * (xv @ wv)
  if reduce_to == "batch:8":
    y = y.sum(axis=1)
  elif reduce_to == "":
    y = y.sum()
  return builder, y


@pytest.mark.parametrize("impl_kwargs", IMPL_VARIANTS)
@pytest.mark.parametrize("mesh_shape,layout,axis,out_bytes", [
    ("all:8", "hidden:all", 0, 8 * 4 * F32),
    ("rows:2;cols:4", "hidden:cols;batch:rows", 1, 4 * 4 * F32),
    ("rows:2;cols:4", "hidden:rows;out:cols", 0, 8 * 1 * F32),
    ("a:2;b:2;c:2", "hidden:b", 1, 8 * 4 * F32),
])
def test_einsum_reducing_split_dim_costs_one_allreduce(mesh_shape, layout, axis, out_bytes,
                                                       impl_kwargs):
  builder, expected = _einsum_builder()
  got, lowering = lower_and_run(builder, mesh_shape, layout, return_lowering=True,
                                **impl_kwargs)
  np.testing.assert_allclose(got["y"], expected, rtol=1e-5, atol=1e-5)
  [r] = lowering.collective_records
  assert (r.kind, r.mesh_axes, r.bytes_per_processor) == ("allreduce", (axis,), out_bytes)


@pytest.mark.parametrize("mesh_shape,layout", [
    ("all:8", "batch:all"),
    ("rows:2;cols:4", "batch:rows;out:cols"),
    ("a:2;b:2;c:2", "batch:a;out:b"),
])
def test_einsum_not_reducing_split_dims_costs_nothing(mesh_shape, layout):
  builder, expected = _einsum_builder()
  got, lowering = lower_and_run(builder, mesh_shape, layout, return_lowering=True)
  np.testing.assert_allclose(got["y"], expected, rtol=1e-5, atol=1e-5)
  assert lowering.collective_records == []
  # Local FLOPs of the einsum: 2 * (local batch) * hidden * (local out).
  mesh = mtf.convert_to_shape(mesh_shape)
  rules = mtf.convert_to_layout_rules(layout)
  local = {"batch": 8, "hidden": 16, "out": 4}
  for name in local:
    m = rules.mesh_dimension_name(name)
    if m:
      local[name] //= mesh.get_dim_by_name(m).size
  einsum_flops = [v for k, v in lowering.flops.items() if k.startswith("einsum")]
  assert einsum_flops == [2 * local["batch"] * local["hidden"] * local["out"]]


@pytest.mark.parametrize("impl_kwargs", IMPL_VARIANTS)
@pytest.mark.parametrize("reduce_to,nbytes", [("batch:8", 8 * F32), ("", F32)])
@pytest.mark.parametrize("two_products", [False, True])
def test_reduce_of_einsum_allreduces_the_smaller_tensor(reduce_to, nbytes, two_products,
                                                        impl_kwargs):
  """The einsum's allreduce stays pending through the sum (and through adding
  a second pending product), so only the reduced tensor is communicated. The
  operands (8x64 and 64x4) are larger than the product, so no implementation
  has a reason to communicate them instead."""
  builder, expected = _einsum_builder(hidden=64, reduce_to=reduce_to,
                                      two_products=two_products)
  got, lowering = lower_and_run(builder, "all:8", "hidden:all", return_lowering=True,
                                **impl_kwargs)
  np.testing.assert_allclose(got["y"], expected, rtol=1e-4, atol=1e-4)
  [r] = lowering.collective_records
  assert (r.kind, r.bytes_per_processor, r.group_size) == ("allreduce", nbytes, 8)


# ----------------------------------------------------------- shift / reshape
def _shift_builder(offset, wrap, dim="length", split_replicas=False):
  xv = np.arange(16 * 4, dtype=np.float32).reshape(16, 4)

  def builder(mesh):
    x = mtf.import_tf_tensor(mesh, tf.constant(xv), "length:16;d:4")
    return {"y": mtf.shift(x, offset, dim, wrap, split_replicas=split_replicas)}
  axis = 0 if dim == "length" else 1
  if wrap:
    ref = np.roll(xv, offset, axis)
  else:
    ref = np.zeros_like(xv)
    src = [slice(None)] * 2
    dst = [slice(None)] * 2
    if offset > 0:
      dst[axis], src[axis] = slice(offset, None), slice(None, -offset)
    else:
      dst[axis], src[axis] = slice(None, offset), slice(-offset, None)
    ref[tuple(dst)] = xv[tuple(src)]
  return builder, ref


@pytest.mark.parametrize("offset", [1, -1, 2, -2])
@pytest.mark.parametrize("wrap", [False, True])
def test_shift_across_split_dim_uses_one_permute(offset, wrap):
  builder, ref = _shift_builder(offset, wrap)
  got, lowering = lower_and_run(builder, "all:8", "length:all", return_lowering=True)
  np.testing.assert_array_equal(got["y"], ref)
  [r] = lowering.collective_records
  # Each processor receives its neighbour's whole slice (2 x 4 floats).
  assert (r.kind, r.mesh_axes, r.bytes_per_processor) == ("permute", (0,), 2 * 4 * F32)


@pytest.mark.parametrize("impl_kwargs", IMPL_VARIANTS)
@pytest.mark.parametrize("offset,wrap", [(1, False), (-1, True)])
def test_shift_with_split_replicas_sends_blocks_and_gathers_them(offset, wrap, impl_kwargs):
  """x [length:16 split 4 ways over cols, d:4] is replicated over rows (2):
  each replica sends half its neighbour's slice, the receivers all-gather."""
  builder, ref = _shift_builder(offset, wrap, split_replicas=True)
  got, lowering = lower_and_run(builder, "rows:2;cols:4", "length:cols", return_lowering=True,
                                **impl_kwargs)
  np.testing.assert_array_equal(got["y"], ref)
  records = sorted((r.kind, r.mesh_axes, r.bytes_per_processor)
                   for r in lowering.collective_records)
  # A slice is 4 x 4 floats; its block (d cut over rows) 4 x 2.
  assert records == [("allgather", (0,), 4 * 2 * F32), ("permute", (1,), 4 * 2 * F32)]
  # Without replicas to split over, the same shift is one whole-slice permute.
  got, lowering = lower_and_run(builder, "all:8", "length:all", return_lowering=True,
                                **impl_kwargs)
  np.testing.assert_array_equal(got["y"], ref)
  assert [(r.kind, r.bytes_per_processor) for r in lowering.collective_records] == [
      ("permute", 2 * 4 * F32)]


def test_shift_farther_than_a_slice_gathers_the_dimension():
  builder, ref = _shift_builder(3, False)
  got, lowering = lower_and_run(builder, "all:8", "length:all", return_lowering=True)
  np.testing.assert_array_equal(got["y"], ref)
  assert _kinds(lowering) == ["allgather"]
  assert len(lowering.collective_records) == 1


def test_shift_along_unsplit_dim_is_local():
  builder, ref = _shift_builder(1, True, dim="d")
  got, lowering = lower_and_run(builder, "rows:2;cols:4", "length:cols", return_lowering=True)
  np.testing.assert_array_equal(got["y"], ref)
  assert lowering.collective_records == []


@pytest.mark.parametrize("new_shape,layout,moved", [
    ("ab:32", "a:all", 1),                 # merging away the split dim
    ("a2:8;b:4", "a:all", 1),              # renaming it to an unsplit name
    ("b:4;a:8", "a:all", 1),               # the split dim moves to another place
    ("a:8;b1:2;b2:2", "a:all", 0),         # the split dim stays in place
    ("a2:8;b:4", "a:all;a2:all", 0),       # renamed, but split the same way
])
def test_reshape_communicates_only_when_a_split_dim_moves(new_shape, layout, moved):
  xv = np.arange(32, dtype=np.float32).reshape(8, 4)

  def builder(mesh):
    x = mtf.import_tf_tensor(mesh, tf.constant(xv), "a:8;b:4")
    return {"y": mtf.reshape(x, new_shape)}
  got, lowering = lower_and_run(builder, "all:8", layout, return_lowering=True)
  np.testing.assert_array_equal(got["y"].reshape(-1), xv.reshape(-1))
  counts = lowering.collective_counts()
  assert set(counts) <= {"allgather", "alltoall"}, counts
  assert sum(n for n, _ in counts.values()) == moved, counts
  for r in lowering.collective_records:
    assert r.bytes_per_processor == 1 * 4 * F32  # one row of x per processor


def test_rename_dimension_moving_split_uses_allgather():
  xv = np.arange(32, dtype=np.float32).reshape(8, 4)

  def builder(mesh):
    x = mtf.import_tf_tensor(mesh, tf.constant(xv), "a:8;b:4")
    return {"y": mtf.rename_dimension(x, "a", "c")}
  got, lowering = lower_and_run(builder, "rows:2;cols:4", "a:rows;b:cols",
                                return_lowering=True)
  np.testing.assert_array_equal(got["y"], xv)
  [r] = lowering.collective_records
  assert r.kind in ("allgather", "alltoall") and r.mesh_axes == (0,)


@pytest.mark.parametrize("impl_kwargs", IMPL_VARIANTS)
def test_renaming_that_moves_a_split_to_another_dimension_is_one_all_to_all(impl_kwargs):
  """[experts_unsplit, groups, d] with groups split -> [experts, groups_unsplit,
  d] with experts split (a mixture-of-experts layer sending tokens to their
  experts): one all-to-all of the slice, not an all-gather of the tensor."""
  xv = np.arange(8 * 16 * 3, dtype=np.float32).reshape(8, 16, 3)

  def builder(mesh):
    x = mtf.import_tf_tensor(mesh, tf.constant(xv), "experts_unsplit:8;groups:16;d:3")
    return {"y": mtf.reshape(x, "experts:8;groups_unsplit:16;d:3")}
  got, lowering = lower_and_run(builder, "all:8", "groups:all;experts:all",
                                return_lowering=True, **impl_kwargs)
  np.testing.assert_array_equal(got["y"], xv)
  [r] = lowering.collective_records
  assert (r.kind, r.mesh_axes, r.bytes_per_processor) == ("alltoall", (0,), 8 * 2 * 3 * F32)


# ----------------------------------------------------------- local ops
def test_fully_local_ops_emit_no_collectives():
  rng = np.random.default_rng(2)
  xv = rng.normal(size=(8, 16)).astype(np.float32)
  bv = rng.normal(size=(16,)).astype(np.float32)

  def builder(mesh):
    x = mtf.import_tf_tensor(mesh, tf.constant(xv), "batch:8;hidden:16")
    b = mtf.import_tf_tensor(mesh, tf.constant(bv), "hidden:16")
    w = mtf.get_variable(mesh, "w", "hidden:16;out:4")
    y = mtf.relu(x + b) * 2.0 - mtf.exp(mtf.tanh(x))
    y = mtf.transpose(y, "hidden:16;batch:8")
    z = mtf.einsum([y, w], output_shape="batch:8;hidden:16;out:4")
    z = mtf.reduce_sum(z, reduced_dim=mtf.Dimension("out", 4))
    s = mtf.softmax(mtf.broadcast(x, "batch:8;hidden:16;out:4"), mtf.Dimension("out", 4))
    r = mtf.cast(mtf.range(mesh, mtf.Dimension("hidden", 16), tf.int32), tf.float32)
    oh = mtf.one_hot(mtf.range(mesh, mtf.Dimension("batch", 8), tf.int32),
                     mtf.Dimension("out", 4))
    d = mtf.dropout(x, rate=0.5)
    u = mtf.random_uniform(mesh, "batch:8;hidden:16")
    c = mtf.where(mtf.greater(u, 0.5), d, mtf.stop_gradient(x))
    upd = mtf.assign(w, w * 0.5)
    total = mtf.depend(z + r + c, [upd])
    return {"total": total, "s": s, "oh": oh}
  for mesh_shape, layout in [("rows:2;cols:4", "batch:rows;hidden:cols"),
                             ("all:8", "hidden:all"), ("a:2;b:2;c:2", "batch:a;hidden:c")]:
    _, lowering = lower_and_run(builder, mesh_shape, layout, return_lowering=True)
    assert lowering.collective_records == [], lowering.report()
    assert lowering.collective_counts() == {}
    assert dict(lowering.counters)["flops"] > 0


# ----------------------------------------------------------- counters API
def test_counters_report_and_pretty_print():
  builder, _ = _einsum_builder()
  _, lowering = lower_and_run(builder, "rows:2;cols:4", "hidden:cols;batch:rows",
                              return_lowering=True)
  counters = dict()
  for key, value in lowering.counters:
    counters[key] = counters.get(key, 0) + value
  assert counters["collectives/allreduce"] == 1
  assert counters["collective_bytes/allreduce"] == 4 * 4 * F32
  assert counters["flops"] == 2 * 4 * 4 * 4  # local batch 4, hidden 4, out 4
  assert lowering.collective_counts("export/") == {"allreduce": (1, 4 * 4 * F32)}
  assert lowering.collective_counts("no_such_op") == {}
  report = lowering.report()
  assert "allreduce[1]:64" in report
  assert "flops: 128" in report
  printed = mtf.pretty_print_counters(
      [("collectives/allreduce", 1), ("collectives/allgather", 1),
       ("collectives/allreduce", 1), ("collective_bytes/allreduce", 1024), ("flops", 5)])
  assert printed.splitlines() == [
      "collective_bytes: 1,024",
      "  allreduce: 1,024",
      "collectives: 3",
      "  allgather: 1",
      "  allreduce: 2",
      "flops: 5",
  ]


# ----------------------------------------------------------- collective ops
def _lower_in_function(builder, mesh_shape, layout, collectives, **impl_kwargs):
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  outputs = builder(mesh)
  impl = mtf_test_utils.make_impl(mesh_shape, layout, collectives=collectives, **impl_kwargs)
  keys = sorted(outputs)
  holder = {}

  @tf.function
  def run():
    lowering = mtf.Lowering(graph, {mesh: impl})
    holder["lowering"] = lowering
    return [lowering.export_to_tf_tensor(outputs[k]) for k in keys]
  concrete = run.get_concrete_function()
  op_types = [op.type for op in concrete.graph.get_operations()]
  values = {k: v.numpy() for k, v in zip(keys, concrete())}
  return values, holder["lowering"], op_types


@pytest.mark.parametrize("mesh_shape,layout", [
    ("all:8", "batch:all"),
    ("rows:2;cols:4", "batch:rows;mid:cols"),
    ("a:2;b:2;c:2", "batch:a;hidden:b;out:c"),
])
def test_collective_ops_mode_matches_direct(mesh_shape, layout):
  # Direct combination without shared replicas emits the same allreduces as
  # collective ops do (shared replicas may realize some differently).
  direct, low_d, types_d = _lower_in_function(_mlp(False), mesh_shape, layout, "direct",
                                              **IMPL_VARIANTS[-1])
  coll, low_c, types_c = _lower_in_function(_mlp(False), mesh_shape, layout, "collective")
  for key in direct:
    np.testing.assert_allclose(coll[key], direct[key], rtol=1e-5, atol=1e-5)
  assert "CollectiveReduce" not in types_d
  # Every processor takes part in each recorded allreduce with one op.
  n_allreduce = len(_records(low_c, "allreduce"))
  assert n_allreduce >= 1
  assert types_c.count("CollectiveReduce") == 8 * n_allreduce
  # Same logical collectives either way.
  def summary(lowering):
    return sorted((r.kind, r.mesh_axes, r.bytes_per_processor)
                  for r in lowering.collective_records)
  assert summary(low_c) == summary(low_d)


def test_collective_mode_subgroups_reduce_independently():
  """Allreduce over one axis of a 2-D mesh: two independent groups of four."""
  builder, expected = _einsum_builder()
  values, lowering, types = _lower_in_function(builder, "rows:2;cols:4",
                                               "hidden:cols;batch:rows", "collective")
  np.testing.assert_allclose(values["y"], expected, rtol=1e-5, atol=1e-5)
  [r] = lowering.collective_records
  assert (r.group_size, r.num_groups) == (4, 2)
  assert types.count("CollectiveReduce") == 8


def test_collective_mode_lowered_eagerly_combines_directly():
  """Eagerly, collective ops would wait for each other forever: the same
  allreduce is then done by combining the slices."""
  builder, expected = _einsum_builder()
  got, lowering = lower_and_run(builder, "rows:2;cols:4", "hidden:cols;batch:rows",
                                mode="eager", return_lowering=True, collectives="collective")
  np.testing.assert_allclose(got["y"], expected, rtol=1e-5, atol=1e-5)
  [r] = lowering.collective_records
  assert r.kind == "allreduce"


def test_collective_mode_in_v1_graph_session():
  builder, expected = _einsum_builder()
  with tf.Graph().as_default() as tf_graph:
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    y = builder(mesh)["y"]
    impl = mtf_test_utils.make_impl("all:8", "hidden:all", collectives="collective")
    y_t = mtf.Lowering(graph, {mesh: impl}).export_to_tf_tensor(y)
    types = [op.type for op in tf_graph.get_operations()]
    with tf.compat.v1.Session(graph=tf_graph) as sess:
      value = sess.run(y_t)
  assert types.count("CollectiveReduce") == 8
  np.testing.assert_allclose(value, expected, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------- shared memory reuse
def test_allgather_of_imported_blocks_is_the_input_itself():
  """On shared memory, gathering the blocks of an imported tensor (as the
  fused weight-gradient einsum does) returns the imported tensor, not a copy;
  the allgather is still counted. Computed slices are still concatenated."""
  impl = mtf_test_utils.make_impl("rows:2;cols:4", "batch:rows")
  assert impl.shares_replicas
  shape = mtf.convert_to_shape("batch:8;hidden:4")
  with tf.Graph().as_default():
    x = tf.constant(np.arange(32, dtype=np.float32).reshape(8, 4))
    blocks = impl.import_tf_tensor(x, shape)
    assert blocks.tensor_list[0] is not x  # each processor holds a block
    kinds = []
    with observers.observe(lambda event: kinds.append(event.kind)):
      gathered = impl.allconcat(blocks, 0, 0)
    assert all(t is x for t in gathered.tensor_list)
    assert kinds == ["allgather"]
    doubled = impl.slicewise(lambda t: t * 2, blocks)
    concatenated = impl.allconcat(doubled, 0, 0)
    assert concatenated.tensor_list[0].op.type == "ConcatV2"
    # A block of another tensor does not stand for x.
    mixed = mtf.LaidOutTensor(
        [blocks.tensor_list[0]] * 4 + [doubled.tensor_list[4]] * 4)
    assert impl.allconcat(mixed, 0, 0).tensor_list[0].op.type == "ConcatV2"


def test_fused_einsum_still_counts_the_allreduce_completing_its_operand():
  """On shared memory the second einsum below is fused (its operands, 544
  bytes per processor, are smaller than its output, 1024: it gathers them
  over cols and multiplies once per group, counted as one allreduce of the
  output). Its operand p is a pending sum over rows (k is split there), and
  completing it is an allreduce of p's own 32-byte slice: counted too, under
  the einsum that completes it. The cost model counts the same."""
  av = np.random.default_rng(3).normal(size=(4, 64)).astype(np.float32)
  wv = np.random.default_rng(4).normal(size=(64, 8)).astype(np.float32)
  vv = np.random.default_rng(5).normal(size=(8, 64)).astype(np.float32)

  def builder(mesh):
    a = mtf.import_tf_tensor(mesh, tf.constant(av), "b:4;k:64")
    w = mtf.import_tf_tensor(mesh, tf.constant(wv), "k:64;n:8")
    v = mtf.import_tf_tensor(mesh, tf.constant(vv), "n:8;m:64")
    p = mtf.einsum([a, w], output_shape="b:4;n:8", name="first")
    return {"q": mtf.einsum([p, v], output_shape="b:4;m:64", name="second")}
  got, lowering = lower_and_run(builder, "rows:2;cols:4", "k:rows;n:cols",
                                return_lowering=True)
  np.testing.assert_allclose(got["q"], av @ wv @ vv, rtol=1e-4, atol=1e-4)
  second = sorted((r.kind, r.mesh_axes, r.bytes_per_processor)
                  for r in lowering.collective_records if r.op_name == "second")
  assert second == [("allreduce", (0,), 4 * 2 * F32), ("allreduce", (1,), 4 * 64 * F32)]
  graph = mtf.Graph()
  builder(mtf.Mesh(graph, "mesh"))
  from mesh_tensorflow.analysis import cost_model  # pylint: disable=g-import-not-at-top
  est = cost_model.estimate(graph, "rows:2;cols:4", "k:rows;n:cols")
  (op,) = [op for op in est.ops if op.name == "second"]
  assert sorted((c.kind, c.mesh_axes, c.bytes_per_processor) for c in op.collectives) == second


# ----------------------------------------------------------- softmax
@pytest.mark.parametrize("log", [False, True])
def test_softmax_over_a_split_dimension_costs_one_max_and_one_sum_allreduce(log):
  """mtf.softmax is one operation: over a dimension the layout keeps whole, one
  kernel per slice and no collective; over a split one, a MAX allreduce and a
  SUM allreduce of the per-row statistics (batch x 1 floats per processor)."""
  xv = np.random.default_rng(5).normal(size=(4, 16)).astype(np.float32)
  fn = mtf.log_softmax if log else mtf.softmax

  def builder(mesh):
    x = mtf.import_tf_tensor(mesh, tf.constant(xv), "batch:4;vocab:16")
    return {"y": fn(x, "vocab", name="sm")}
  z = xv - xv.max(axis=1, keepdims=True)
  want = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
  want = want if log else np.exp(want)
  got, lowering = lower_and_run(builder, "rows:2;cols:4", "batch:rows", return_lowering=True)
  np.testing.assert_allclose(got["y"], want, rtol=1e-5, atol=1e-6)
  assert lowering.collective_counts("sm") == {}
  got, lowering = lower_and_run(builder, "rows:2;cols:4", "batch:rows;vocab:cols",
                                return_lowering=True)
  np.testing.assert_allclose(got["y"], want, rtol=1e-5, atol=1e-6)
  records = [r for r in lowering.collective_records if r.op_name.startswith("sm")]
  assert [r.kind for r in records] == ["allreduce", "allreduce"], lowering.report()
  assert all(r.mesh_axes == (1,) and r.bytes_per_processor == 2 * F32 for r in records)


def _vocab_whole_then_split(builder, op_name: str, impl_kwargs):
  """Runs `builder` on `rows:2;cols:4` with the vocabulary whole (checking
  that operation `op_name` communicates nothing), then split over `cols`.
  Returns both runs' outputs and the split run's records of the operation,
  as (kind, mesh axes, bytes per processor)."""
  whole, lowering = lower_and_run(builder, "rows:2;cols:4", "batch:rows", return_lowering=True,
                                  **impl_kwargs)
  assert lowering.collective_counts(op_name) == {}, lowering.report()
  split, lowering = lower_and_run(builder, "rows:2;cols:4", "batch:rows;vocab:cols",
                                  return_lowering=True, **impl_kwargs)
  records = [(r.kind, r.mesh_axes, r.bytes_per_processor) for r in lowering.collective_records
             if r.op_name.startswith(op_name)]
  return whole, split, records


def _estimated_collectives(builder, op_name: str):
  """The cost model's collectives of operation `op_name`, as (kind, bytes
  per processor), with the vocabulary split over `cols`."""
  from mesh_tensorflow.analysis import cost_model  # pylint: disable=g-import-not-at-top
  graph = mtf.Graph()
  builder(mtf.Mesh(graph, "mesh"))
  est = cost_model.estimate(graph, "rows:2;cols:4", "batch:rows;vocab:cols")
  (op,) = [op for op in est.ops if op.name == op_name]
  return [(c.kind, c.bytes_per_processor) for c in op.collectives]


@pytest.mark.parametrize("impl_kwargs", IMPL_VARIANTS)
def test_argmax_over_a_split_dimension_costs_a_max_and_a_min_allreduce(impl_kwargs):
  """mtf.argmax over a split dimension does not gather its input (a
  vocabulary's logits): a MAX allreduce of the blocks' maxima and a MIN
  allreduce of the blocks' first indices, each of the output's size, and the
  first index on ties across blocks, as np.argmax gives it."""
  xv = np.random.default_rng(3).integers(0, 4, size=(4, 16)).astype(np.float32)  # ties
  xv[1] = 7.0  # a row of one value: index 0, in the first block
  xv[2, 13] = xv[2, 5] = 9.0  # the maximum in two blocks

  def builder(mesh):
    x = mtf.import_tf_tensor(mesh, tf.constant(xv), "batch:4;vocab:16")
    return {"i": mtf.argmax(x, "vocab", name="am")}
  whole, split, records = _vocab_whole_then_split(builder, "am", impl_kwargs)
  np.testing.assert_array_equal(whole["i"], np.argmax(xv, axis=1))
  np.testing.assert_array_equal(split["i"], np.argmax(xv, axis=1))
  assert records == [("allreduce", (1,), 2 * F32), ("allreduce", (1,), 2 * 4)]
  # The cost model prices the plan the lowering ran.
  assert _estimated_collectives(builder, "am") == [("allreduce", 2 * F32), ("allreduce", 2 * 4)]


def _run_simd(layout: str, xv: np.ndarray, shape: str, build) -> list:
  """The values of the tensors `build(x)` makes from `xv` (imported with
  `shape`), lowered by the SIMD lowering on `rows:2;cols:4` with `layout`."""
  impl = mtf.simd_mesh_impl.SimdMeshImpl("rows:2;cols:4", layout, mtf_test_utils.DEVICES)

  def step():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    outputs = build(mtf.import_tf_tensor(mesh, tf.constant(xv), shape))
    lowering = mtf.Lowering(graph, {mesh: impl})
    return tuple(lowering.export_to_tf_tensor(t) for t in outputs)
  return [t.numpy() for t in impl.run(step)]


def test_argmax_over_a_split_dimension_under_simd_matches_numpy():
  xv = np.random.default_rng(4).integers(0, 3, size=(2, 4, 16)).astype(np.float32)
  [best] = _run_simd("vocab:cols;batch:rows", xv, "batch:2;length:4;vocab:16",
                     lambda x: [mtf.argmax(x, "vocab")])
  np.testing.assert_array_equal(best, np.argmax(xv, axis=-1))


@pytest.mark.parametrize("impl_kwargs", IMPL_VARIANTS)
@pytest.mark.parametrize("k", [3, 6])
def test_top_k_over_a_split_dimension_allgathers_only_the_blocks_candidates(k, impl_kwargs):
  """mtf.top_k over a split dimension does not gather its input: each block's
  own top min(k, block) values and indices are allgathered (k of each per
  row and block), then the top k of those is taken. Values and indices as
  a stable descending sort gives them (ties: the lower index first, also
  across blocks), k within a block (3 of 4) and beyond it (6)."""
  xv = np.random.default_rng(3).integers(0, 4, size=(4, 16)).astype(np.float32)  # ties
  xv[2, 13] = xv[2, 5] = 9.0  # the maximum in two blocks

  def builder(mesh):
    x = mtf.import_tf_tensor(mesh, tf.constant(xv), "batch:4;vocab:16")
    values, indices = mtf.top_k(x, "vocab", k=k, name="tk")
    return {"v": values, "i": indices}
  want = np.argsort(-xv, axis=1, kind="stable")[:, :k]
  whole, split, records = _vocab_whole_then_split(builder, "tk", impl_kwargs)
  np.testing.assert_array_equal(whole["i"], want)
  np.testing.assert_array_equal(split["i"], want)
  np.testing.assert_array_equal(split["v"], np.take_along_axis(xv, want, axis=1))
  kept = min(k, 4)  # candidates per block and row; 2 rows per processor
  assert records == [("allgather", (1,), 2 * kept * F32), ("allgather", (1,), 2 * kept * 4)]
  # The cost model prices the plan the lowering ran.
  assert _estimated_collectives(builder, "tk") == [
      ("allgather", 2 * kept * F32), ("allgather", 2 * kept * 4)]


def test_top_k_over_a_split_inner_dimension_under_simd_matches_numpy():
  """The reduced dimension not last (the kernel transposes it), split over
  the mesh's first axis under the SIMD lowering; its gradient, a one-hot of
  the indices, lands on the chosen elements."""
  xv = np.random.default_rng(4).integers(0, 3, size=(2, 16, 4)).astype(np.float32)

  def build(x):
    values, indices = mtf.top_k(x, "vocab", k=5)
    return [values, indices] + mtf.gradients([mtf.reduce_sum(values)], [x])
  values, indices, dx = _run_simd("vocab:rows;length:cols", xv, "batch:2;vocab:16;length:4",
                                  build)
  want = np.moveaxis(np.argsort(-xv, axis=1, kind="stable")[:, :5], 1, -1)  # [batch, length, k]
  np.testing.assert_array_equal(indices, want)
  np.testing.assert_array_equal(values, np.take_along_axis(np.moveaxis(xv, 1, -1), want, -1))
  chosen = np.zeros_like(xv)
  np.put_along_axis(chosen, np.moveaxis(want, -1, 1), 1.0, axis=1)
  np.testing.assert_array_equal(dx, chosen)


@pytest.mark.parametrize("impl_kwargs", IMPL_VARIANTS)
@pytest.mark.parametrize("exclusive", [False, True])
def test_cumsum_over_a_split_dimension_allgathers_only_the_blocks_totals(exclusive, impl_kwargs):
  """mtf.cumsum over a split dimension does not gather its input: each block
  sums its own part, the blocks' totals (one per row and block) are
  allgathered, and each block adds those of the blocks before it. Its
  gradient (a reverse cumulative sum) adds those after it."""
  xv = np.random.default_rng(6).integers(-3, 4, size=(4, 16)).astype(np.float32)

  def builder(mesh):
    x = mtf.import_tf_tensor(mesh, tf.constant(xv), "batch:4;vocab:16")
    w = mtf.import_tf_tensor(mesh, tf.constant(np.arange(64, dtype=np.float32).reshape(4, 16)),
                             "batch:4;vocab:16")
    y = mtf.cumsum(x, "vocab", exclusive=exclusive, name="cs")
    [dx] = mtf.gradients([mtf.reduce_sum(y * w)], [x])
    return {"y": y, "dx": dx}
  inclusive = np.cumsum(xv, axis=1)
  want = inclusive - xv if exclusive else inclusive
  w = np.arange(64, dtype=np.float32).reshape(4, 16)
  want_dx = np.cumsum(w[:, ::-1], axis=1)[:, ::-1] - (w if exclusive else 0)
  whole, split, records = _vocab_whole_then_split(builder, "cs", impl_kwargs)
  np.testing.assert_array_equal(whole["y"], want)
  np.testing.assert_array_equal(split["y"], want)
  np.testing.assert_array_equal(split["dx"], want_dx)
  # 2 rows per processor, one total each.
  assert records == [("allgather", (1,), 2 * F32)]
  assert _estimated_collectives(
      lambda mesh: {"y": mtf.cumsum(mtf.import_tf_tensor(mesh, tf.constant(xv), "batch:4;vocab:16"),
                                    "vocab", name="cs")}, "cs") == [("allgather", 2 * F32)]


def test_cumsum_over_a_split_inner_dimension_under_simd_matches_numpy():
  xv = np.random.default_rng(7).integers(-3, 4, size=(2, 16, 4)).astype(np.int32)
  [y] = _run_simd("length:rows;d:cols", xv, "batch:2;length:16;d:4",
                  lambda x: [mtf.cumsum(x, "length", exclusive=True)])
  np.testing.assert_array_equal(y, np.cumsum(xv, axis=1) - xv)


def test_softmax_over_a_whole_dimension_is_one_kernel_per_slice():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.import_tf_tensor(mesh, tf.zeros([4, 16]), "batch:4;vocab:16")
  y = mtf.softmax(x, "vocab")
  impl = mtf_test_utils.make_impl("all:2", "batch:all")

  @tf.function(autograph=False)
  def run():
    return mtf.Lowering(graph, {mesh: impl}).export_to_tf_tensor(y)
  types = [op.type for op in run.get_concrete_function().graph.get_operations()]
  assert types.count("Softmax") == 2, types
  assert not {"Exp", "Max", "Sum", "Log"} & set(types), types


# ----------------------------------------------------------- embedding lookup
@pytest.mark.parametrize("impl_kwargs", IMPL_VARIANTS)
@pytest.mark.parametrize("vocab,batch,gathers_table", [
    (16, 64, True),    # table 16x4 floats <= output 64x4 floats per processor
    (256, 8, False),   # table 256x4 floats > output 8x4 floats
])
def test_lookup_in_a_split_table_moves_the_smaller_of_table_and_output(
    vocab, batch, gathers_table, impl_kwargs):
  """mtf.gather from a table split along the looked-up dimension: a table no
  larger (whole) than a processor's output is allgathered once, and every
  processor looks up locally; a larger one is looked up block by block, with
  ids from other blocks masked to zero, then allreduced."""
  rng = np.random.default_rng(6)
  table = rng.normal(size=(vocab, 4)).astype(np.float32)
  ids = rng.integers(0, vocab, size=(batch,)).astype(np.int32)

  def builder(mesh):
    t = mtf.import_tf_tensor(mesh, tf.constant(table), f"vocab:{vocab};d:4")
    i = mtf.import_tf_tensor(mesh, tf.constant(ids), f"batch:{batch}")
    return {"y": mtf.gather(t, i, "vocab", name="lookup")}
  got, lowering = lower_and_run(builder, "rows:2;cols:4", "vocab:cols",
                                return_lowering=True, **impl_kwargs)
  np.testing.assert_allclose(got["y"], table[ids])
  records = [r for r in lowering.collective_records if "lookup" in r.op_name]
  if gathers_table:
    assert [(r.kind, r.mesh_axes) for r in records] == [("allgather", (1,))], lowering.report()
    assert records[0].bytes_per_processor == vocab // 4 * 4 * F32
  else:
    assert [(r.kind, r.mesh_axes) for r in records] == [("allreduce", (1,))], lowering.report()
    assert records[0].bytes_per_processor == batch * 4 * F32


def test_collective_mode_after_dtensor_collectives_in_the_same_process():
  """TensorFlow's collective group keys are process-wide: DTensor numbers its
  groups from 1 too, and a key it took for a group of four must not be the
  one our group of two joins."""
  dtensor = tf.experimental.dtensor
  dmesh = dtensor.create_mesh([("rows", 2), ("cols", 4)], device_type="CPU")
  x = dtensor.call_with_layout(tf.ones, dtensor.Layout(["rows", "cols"], dmesh), [2, 8])
  total = tf.function(lambda t: tf.reduce_sum(t, axis=1))(x)  # an allreduce over cols
  np.testing.assert_allclose(dtensor.unpack(total)[0], [8.0])
  builder, expected = _einsum_builder()
  values, lowering, _ = _lower_in_function(builder, "rows:2;cols:4", "hidden:rows", "collective")
  np.testing.assert_allclose(values["y"], expected, rtol=1e-5, atol=1e-5)
  [r] = lowering.collective_records
  assert (r.group_size, r.num_groups) == (2, 4)


@pytest.mark.parametrize("layout,products", [
    # Batch split in the operands' outermost dimension: one product per group.
    ("batch:all", 1),
    # The summed dimension split in an inner dimension: one product per processor.
    ("length:all", 8),
])
def test_data_parallel_weight_gradient_is_one_product_in_shared_memory(layout, products):
  """A weight gradient summed over a split batch, with operands up to 3x the
  gradient (here 2x), is one product on the gathered batch where processors
  share memory (cost_model.fuses_allreduce); counted as the one allreduce
  the layout implies either way, and equal to NumPy."""
  rng = np.random.default_rng(5)
  xv = rng.normal(size=(16, 8, 16)).astype(np.float32)   # [batch, length, d]
  dyv = rng.normal(size=(16, 8, 16)).astype(np.float32)  # [batch, length, f]

  def builder(mesh):
    x = mtf.import_tf_tensor(mesh, tf.constant(xv), "batch:16;length:8;d:16")
    dy = mtf.import_tf_tensor(mesh, tf.constant(dyv), "batch:16;length:8;f:16")
    return {"dw": mtf.einsum([x, dy], output_shape="d:16;f:16")}
  got, lowering, op_types = _lower_in_function(builder, "all:8", layout, "direct")
  np.testing.assert_allclose(got["dw"], np.einsum("bld,blf->df", xv, dyv), rtol=1e-4, atol=1e-4)
  assert sum(t in ("Einsum", "MatMul", "BatchMatMulV2") for t in op_types) == products
  [r] = lowering.collective_records
  assert (r.kind, r.bytes_per_processor) == ("allreduce", 16 * 16 * F32)


def _pending_sum_setup(a_np, b_np, **impl_kwargs):
  """The pending-sum tests' mesh and operands: rows:2;cols:4 with k split
  over rows, so the product of a [m:4, k:8] and b [k:8, n:2] leaves a sum
  pending over rows. Returns (impl, graph, mesh, a, b)."""
  impl = mtf_test_utils.make_impl("rows:2;cols:4", "k:rows", **impl_kwargs)
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  a = mtf.import_tf_tensor(mesh, a_np, "m:4;k:8")
  b = mtf.import_tf_tensor(mesh, b_np, "k:8;n:2")
  return impl, graph, mesh, a, b


@pytest.mark.parametrize("impl_kwargs", IMPL_VARIANTS)
def test_renaming_reshape_moves_a_pending_sum_by_all_to_all_and_keeps_it_pending(impl_kwargs):
  """A mixture-of-experts layer's expert output: a product pending over the
  axis splitting its hidden dimension (rows), renamed so that the split over
  cols moves from the experts to the groups. The renaming is an all-to-all
  over cols of the partial sums, and the one allreduce over rows comes after
  the reduction that follows, on the smaller tensor (not an allreduce and an
  allgather of the renamed tensor)."""
  rng = np.random.default_rng(6)
  hv = rng.normal(size=(4, 4, 8)).astype(np.float32)  # [experts, groups_unsplit, hidden]
  wv = rng.normal(size=(4, 8, 2)).astype(np.float32)  # [experts, hidden, d]

  def builder(mesh):
    h = mtf.import_tf_tensor(mesh, tf.constant(hv), "experts:4;groups_unsplit:4;hidden:8")
    w = mtf.import_tf_tensor(mesh, tf.constant(wv), "experts:4;hidden:8;d:2")
    out = mtf.einsum([h, w], output_shape="experts:4;groups_unsplit:4;d:2")
    back = mtf.reshape(out, "experts_unsplit:4;groups:4;d:2", name="rename")
    return {"y": mtf.reduce_sum(back, reduced_dim=back.shape.dims[0], name="total")}
  want = np.einsum("egh,ehd->egd", hv, wv).sum(axis=0)
  got, lowering = lower_and_run(builder, "rows:2;cols:4", "hidden:rows;experts:cols;groups:cols",
                                return_lowering=True, **impl_kwargs)
  np.testing.assert_allclose(got["y"], want, rtol=1e-5, atol=1e-5)
  assert [(r.kind, r.mesh_axes) for r in lowering.collective_records
          if r.op_name == "rename"] == [("alltoall", (1,))], lowering.report()
  allreduces = [r for r in _records(lowering, "allreduce") if r.mesh_axes == (0,)]
  # One, of the reduction's output (groups split over cols: 1 x 2 floats per
  # processor), made when it is read.
  assert [r.bytes_per_processor for r in allreduces] == [2 * F32], lowering.report()


def test_computed_slices_of_a_pending_sum_do_not_complete_it():
  """`Lowering.computed_slices` (what a read waits on) gives a pending sum's
  partial slices; only `laid_out` completes it."""
  impl, graph, mesh, a, b = _pending_sum_setup(np.ones((4, 8), np.float32),
                                                np.ones((8, 2), np.float32))
  p = mtf.einsum([a, b], output_shape="m:4;n:2")
  lowering = mtf.Lowering(graph, {mesh: impl})
  parts = lowering.computed_slices(p)
  assert len(parts) == 8 and not _records(lowering, "allreduce")
  # Each part is a partial sum over one half of k.
  np.testing.assert_allclose(parts[0].numpy(), np.full((4, 2), 4.0))
  # Completing it (laid_out) adds the halves.
  whole = lowering.laid_out(p).tensor_list
  np.testing.assert_allclose(whole[0].numpy(), np.full((4, 2), 8.0))
  with pytest.raises(ValueError, match="was not lowered"):
    lowering.computed_slices(mtf.zeros(mesh, "m:4"))


@pytest.mark.parametrize("whole_first", [False, True])
def test_a_whole_tensor_joins_a_pending_sum_without_completing_it(whole_first):
  """p + w (or w + p) with p a pending sum over rows and w whole: w joins
  the partial sums of the processors at row 0, the result stays pending, and
  one allreduce completes it together with another pending sum added later.
  Values as NumPy's, both CPU modes."""
  a_np = np.arange(32, dtype=np.float32).reshape(4, 8) / 7.0
  b_np = np.arange(16, dtype=np.float32).reshape(8, 2) / 5.0
  w_np = np.full((4, 2), 3.0, np.float32)
  q_np = np.full((4, 2), 0.5, np.float32)
  p_np = a_np @ b_np
  x_np = w_np + p_np
  want = x_np + 2.0 * q_np + p_np
  for kwargs in ({}, {"share_replicas": False}):
    impl, graph, mesh, a, b = _pending_sum_setup(a_np, b_np, **kwargs)
    w = mtf.import_tf_tensor(mesh, w_np, "m:4;n:2")
    q = mtf.import_tf_tensor(mesh, q_np, "m:4;n:2")
    p = mtf.einsum([a, b], output_shape="m:4;n:2")
    x = mtf.add(w, p) if whole_first else mtf.add(p, w)
    # Whole tensors and another pending sum fold in: still the one allreduce
    # (completing p at the first addition would take a second one for p2).
    p2 = mtf.einsum([a, b], output_shape="m:4;n:2")
    y = mtf.add(mtf.add(mtf.add(x, q), q), p2)
    lowering = mtf.Lowering(graph, {mesh: impl})
    got = lowering.export_to_tf_tensor(y).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6)
    ars = [(r.mesh_axes, r.bytes_per_processor) for r in _records(lowering, "allreduce")]
    if kwargs:  # shared memory may fuse the product's sum into its gathers instead
      assert ars == [((0,), 4 * 2 * 4)], ars  # the export completes the one sum


@pytest.mark.parametrize("scale", ["x * 3", "3 * x", "x / 4"])
def test_scaling_by_a_number_keeps_a_pending_sum_pending(scale):
  """p = p1 + p2 (a sum of pending sums, as a ParallelLayer's branches):
  p * 3, 3 * p and p / 4 are linear, the partial sums are scaled and one
  allreduce completes (p * 3) + p3; 4 / p is not, and completes p first."""
  a_np = np.arange(32, dtype=np.float32).reshape(4, 8) / 7.0 + 1.0
  b_np = np.arange(16, dtype=np.float32).reshape(8, 2) / 5.0 + 1.0
  fns = {"x * 3": lambda x: x * 3.0, "3 * x": lambda x: 3.0 * x, "x / 4": lambda x: x / 4.0}
  for fn, allreduces in ((fns[scale], 1), (lambda x: 4.0 / x, 2)):
    impl, graph, mesh, a, b = _pending_sum_setup(a_np, b_np, share_replicas=False)
    p = (mtf.einsum([a, b], output_shape="m:4;n:2")
         + mtf.einsum([a, b * 2.0], output_shape="m:4;n:2"))
    y = fn(p) + mtf.einsum([a, b], output_shape="m:4;n:2")
    lowering = mtf.Lowering(graph, {mesh: impl})
    got = lowering.export_to_tf_tensor(y).numpy()
    np.testing.assert_allclose(got, fn(3 * a_np @ b_np) + a_np @ b_np, rtol=1e-5)
    assert len(_records(lowering, "allreduce")) == allreduces


@pytest.mark.parametrize("whole_first", [False, True])
def test_subtracting_keeps_a_pending_sum_pending(whole_first):
  """w - p, p - w and p - p2 with p, p2 pending sums over rows: subtraction is
  linear, so the result stays pending and one allreduce completes it;
  values and gradients as NumPy's."""
  a_np = np.arange(32, dtype=np.float32).reshape(4, 8) / 7.0
  b_np = np.arange(16, dtype=np.float32).reshape(8, 2) / 5.0
  c_np = np.linspace(-1.0, 1.0, 16, dtype=np.float32).reshape(8, 2)
  w_np = np.full((4, 2), 3.0, np.float32)
  x_np = (w_np - a_np @ b_np) if whole_first else (a_np @ b_np - w_np)
  want = x_np - a_np @ c_np
  impl, graph, mesh, a, b = _pending_sum_setup(a_np, b_np, share_replicas=False)
  c = mtf.import_tf_tensor(mesh, c_np, "k:8;n:2")
  w = mtf.import_tf_tensor(mesh, w_np, "m:4;n:2")
  p = mtf.einsum([a, b], output_shape="m:4;n:2")
  x = mtf.sub(w, p) if whole_first else p - w
  y = x - mtf.einsum([a, c], output_shape="m:4;n:2")
  [dw, dc] = mtf.gradients([mtf.reduce_sum(y * y)], [w, c])
  lowering = mtf.Lowering(graph, {mesh: impl})
  got = lowering.export_to_tf_tensor(y).numpy()
  np.testing.assert_allclose(got, want, rtol=1e-5)
  forward = [r for r in _records(lowering, "allreduce") if r.bytes_per_processor == 4 * 2 * 4]
  assert len(forward) == 1, forward  # y's one sum (the export completes it)
  np.testing.assert_allclose(lowering.export_to_tf_tensor(dw).numpy(),
                             2 * want * (1.0 if whole_first else -1.0), rtol=1e-5)
  np.testing.assert_allclose(lowering.export_to_tf_tensor(dc).numpy(), a_np.T @ (-2 * want),
                             rtol=1e-5)
