"""The rules of shared memory (lowering/sharing.py) and the placement
implementation that follows them: which processors make a tensor and which
hold another's."""

import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import testing as tu
from mesh_tensorflow.lowering import sharing
from mesh_tensorflow.lowering.mesh_impl import LaidOutTensor


def test_makers_share_equal_keys_only_with_shared_memory():
  keys = [("w", 0), ("w", 1), ("w", 0), ("w", 1), ("x", 0)]
  assert sharing.makers(keys, True) == [0, 1, 0, 1, 4]
  assert sharing.makers(keys, False) == [0, 1, 2, 3, 4]
  assert sharing.makers([], True) == []


def test_per_processor_makes_once_per_maker():
  made = []
  out = sharing.per_processor(["a", "b", "a"], True, lambda p: made.append(p) or f"t{p}")
  assert (out, made) == (["t0", "t1", "t0"], [0, 1])
  made.clear()
  out = sharing.per_processor(["a", "b", "a"], False, lambda p: made.append(p) or f"t{p}")
  assert (out, made) == (["t0", "t1", "t2"], [0, 1, 2])


def test_group_result_is_made_by_the_first_member_and_copied_without_shared_memory():
  assert sharing.group_result([3, 5, 7], True) == (3, [])
  assert sharing.group_result([3, 5, 7], False) == (3, [3, 5, 7])
  assert sharing.holds_source(True) and not sharing.holds_source(False)


def test_blocks_of_one_tensor_need_exactly_one_split_axis():
  assert sharing.blocks_of_one_tensor((None, 1))
  assert not sharing.blocks_of_one_tensor((None, None))
  assert not sharing.blocks_of_one_tensor((0, 1))


def _kernels_run(share):
  """How many times slicewise calls its function on a tensor split over
  rows and replicated over cols (rows:2;cols:4), and how many distinct
  results the processors hold."""
  impl = tu.make_impl("rows:2;cols:4", "batch:rows", share_replicas=share,
                      collectives="direct")
  calls = []

  @tf.function
  def run():
    x = LaidOutTensor([tf.constant([float(p // 4)]) for p in range(8)])
    # One tensor per row, shared along cols when memory is shared.
    rows = impl.slicewise(tf.identity, impl.slicewise(lambda t: t, x))
    per_row = [rows.tensor_list[0]] * 4 + [rows.tensor_list[4]] * 4
    y = impl.slicewise(lambda t: calls.append(1) or t * 2.0, LaidOutTensor(per_row))
    return len({id(t) for t in y.tensor_list})
  distinct = int(run())
  return len(calls), distinct


def test_placement_slicewise_runs_one_kernel_per_distinct_input_when_sharing():
  calls, distinct = _kernels_run(True)
  assert (calls, distinct) == (2, 2)
  calls, distinct = _kernels_run(False)
  assert (calls, distinct) == (8, 8)


def test_slice_variables_are_shared_by_processors_holding_the_same_slice():
  for share, expected in ((True, 2), (False, 8)):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "m")
    mtf.get_variable(mesh, "w", "batch:4;d:3")
    impl = tu.make_impl("rows:2;cols:4", "batch:rows", share_replicas=share,
                        collectives="direct")
    lowering = mtf.Lowering(graph, {mesh: impl})
    slices = lowering.variables[graph.all_variables[0]].slices
    assert len({id(v) for v in slices}) == expected, share


def test_processor_groups_are_the_processors_that_differ_only_along_the_axes():
  """Against the definition, on meshes of 1 to 4 axes (axes in any order,
  repeated): groups in row-major order of the other axes, members in
  row-major order of the group's."""
  import itertools  # pylint: disable=g-import-not-at-top
  for mesh in ("a:2;b:3;c:4", "a:1;b:5", "x:8", "a:2;b:2;c:2;d:3"):
    shape = mtf.convert_to_shape(mesh)
    coords = [mtf.pnum_to_processor_coordinates(shape, p) for p in range(shape.size)]
    for k in range(shape.ndims + 1):
      for axes in itertools.combinations(range(shape.ndims), k):
        expected = {}
        for p, c in enumerate(coords):
          key = tuple(x for i, x in enumerate(c) if i not in axes)
          expected.setdefault(key, []).append(p)
        for given in (list(axes), list(reversed(axes)), list(axes) + list(axes[:1])):
          assert mtf.processor_groups(shape, given) == list(expected.values())
