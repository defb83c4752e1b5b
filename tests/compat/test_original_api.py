"""Names, spellings and small behaviours of the original Mesh TensorFlow API that
ported code relies on: string separators,
TensorLayout and Graph helpers, splittability, legacy class names, the
`mtf.*` utility functions, three-argument assign functions."""

import io

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mtf_test_utils import DEVICES, assert_allclose, ensure_eight_devices, lower_and_run

ensure_eight_devices()

A, B, C = mtf.Dimension("a", 4), mtf.Dimension("b", 8), mtf.Dimension("c", 2)


@pytest.mark.parametrize("text", ["x:4;y:8", "x:4,y:8", "x:4.y:8", "x:4 y:8", " x:4 ; y:8 "])
def test_shape_strings_accept_every_original_separator(text):
  assert mtf.convert_to_shape(text) == mtf.Shape([mtf.Dimension("x", 4), mtf.Dimension("y", 8)])


@pytest.mark.parametrize("text", ["d_ff:model;heads:model", "d_ff:model.heads:model",
                                  "d_ff:model heads:model", "d_ff:model,heads:model"])
def test_layout_rule_strings_accept_every_original_separator(text):
  rules = mtf.convert_to_layout_rules(text)
  assert rules == mtf.LayoutRules([("d_ff", "model"), ("heads", "model")])
  assert rules.mesh_dimension_name_to_tensor_dimension_names("model") == ["d_ff", "heads"]
  with pytest.raises(ValueError, match="name:value"):
    mtf.convert_to_layout_rules("d_ff;heads")


def test_tensor_layout_mesh_axis_to_tensor_axis_is_a_tuple_per_mesh_axis():
  layout = mtf.TensorLayout([0, 2, 1])
  assert layout.mesh_axis_to_tensor_axis(0) == ()
  assert layout.mesh_axis_to_tensor_axis(1) == (0,)
  assert layout.mesh_axis_to_tensor_axis(3) == (0, 2, 1)
  assert mtf.TensorLayout([None, 1]).mesh_axis_to_tensor_axis(2) == (None, 1)


def test_unique_names_are_case_insensitive_like_tensorflow():
  graph = mtf.Graph()
  assert [graph.unique_name(n) for n in ("a", "A", "a_1", "a")] == ["a", "A_1", "a_1_1", "a_2"]


def test_to_string_is_a_property_that_can_also_be_called():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.zeros(mesh, [A, B])
  y = mtf.reduce_sum(x, output_shape=[A])
  assert x.shape.to_string == "a:4;b:8" == x.shape.to_string()
  assert "a:4" in y.operation.to_string and y.operation.name in graph.to_string
  assert x.to_string() == x.to_string
  assert x.shape.cumprod_to_tensor_axis(4) == 1 and x.shape.cumprod_to_tensor_axis(3) is None


def test_reflected_floordiv_and_mod():
  got = lower_and_run(lambda mesh: {
      "div": 7.0 // mtf.constant(mesh, 2.0, [A]), "mod": 7.0 % mtf.constant(mesh, 4.0, [A])},
      "all:1", "", DEVICES[:1])
  assert_allclose(got["div"], np.full(4, 3.0))
  assert_allclose(got["mod"], np.full(4, 3.0))


def test_mesh_impl_and_lowering_compatibility_members():
  impl = mtf.MeshImpl("batch:4;model:8", "batch:batch;d_ff:model")
  assert impl.supports_control_dependencies
  assert impl.slice_size("batch:128;d_ff:2048") == 32 * 256
  assert impl.tensor_layout(mtf.convert_to_shape("batch:128;length:5;d_ff:2048")) == \
      mtf.TensorLayout([0, None, 1])

  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.import_tf_tensor(mesh, tf.constant(3.0), shape=[])
  lowering = mtf.Lowering(graph, {mesh: mtf.placement_mesh_impl.PlacementMeshImpl(
      shape=[], layout={}, devices=[""])})
  lowering.copy_masters_to_slices()
  lowering.copy_slices_to_masters()
  lowering.add_counter("my_op/calls", 2)
  assert ("my_op/calls", 2) in lowering.counters
  assert float(lowering.export_to_tf_tensor(x)) == 3.0


def test_splittability_of_operations():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.zeros(mesh, [A, B])
  stack_dim = mtf.Dimension("stack", 2)
  cases = [
      (mtf.ReshapeOperation(x, "p:16;q:2"), {"a", "b", "p", "q"}, set()),
      (mtf.SliceOperation(x, begin=1, size=2, slice_dim_name="b"), {"a"}, {"b"}),
      (mtf.PadOperation(x, [1, 2], "a"), {"b"}, {"a"}),
      (mtf.ConcatOperation([x, x], "b"), {"a"}, {"b"}),
      (mtf.StackOperation([x, x], stack_dim.name, axis=0), {"a", "b"}, {"stack"}),
      (mtf.UnstackOperation(x, B), {"a"}, {"b"}),
      (mtf.ShiftOperation(x, -1, B, wrap=True), {"a", "b"}, set()),
      (mtf.EinsumOperation([x, mtf.zeros(mesh, [A, C])], mtf.Shape([B, C])), {"a", "b", "c"},
       set()),
      (mtf.ScalarMultiplyOperation(x, 2.0), {"a", "b"}, set()),
      (mtf.Constant(mesh, 0, mtf.Shape([A, B]), dtype=tf.int32), {"a", "b"}, set()),
      (mtf.ImportLaidOutTensorOperation(mesh, [tf.zeros([4, 8])], [A, B]), set(), {"a", "b"}),
  ]
  for op, splittable, unsplittable in cases:
    assert op.splittable_dims == frozenset(splittable), op
    assert op.unsplittable_dims == frozenset(unsplittable), op


def test_legacy_operation_classes_compute_like_their_functions():
  def build(mesh):
    x = mtf.import_tf_tensor(mesh, np.arange(32, dtype=np.float32).reshape(4, 8), [A, B])
    var = mtf.get_variable(mesh, "v", [A], initializer=tf.ones_initializer())
    doubled = mtf.ScalarMultiplyOperation(x, 2.0).outputs[0]
    shifted = mtf.ScalarAddOperation(doubled, 1.0).outputs[0]
    less = mtf.binary_op_with_broadcasting(tf.less, x, 10.0, output_dtype=tf.bool)
    read = mtf.ReadVariable(var).outputs[0]
    frozen = mtf.StopGradient(shifted).outputs[0]
    printed = mtf.PrintOperation(frozen, [read], "value: ").outputs[0]
    loss = mtf.reduce_sum(shifted) + mtf.reduce_sum(printed)
    (dx,) = mtf.gradients([loss], [x])
    return {"shifted": shifted, "less": mtf.cast(less, tf.float32), "read": read, "dx": dx,
            "printed": mtf.Depend(printed, [read]).outputs[0]}
  want = np.arange(32, dtype=np.float32).reshape(4, 8)
  for mesh_shape, layout in [("all:1", ""), ("rows:2;cols:4", "a:rows;b:cols")]:
    got = lower_and_run(build, mesh_shape, layout, DEVICES[:mtf.convert_to_shape(mesh_shape).size])
    assert_allclose(got["shifted"], 2 * want + 1)
    assert_allclose(got["printed"], 2 * want + 1)
    assert_allclose(got["less"], (want < 10).astype(np.float32))
    assert_allclose(got["read"], np.ones(4))
    assert_allclose(got["dx"], np.full((4, 8), 2.0))  # StopGradient blocks the second term


def test_utility_functions():
  assert mtf.list_product([2, 3, 4]) == 24 and mtf.list_product([]) == 1
  assert mtf.transpose_list_of_lists([[1, 2], [3, 4], [5, 6]]) == [[1, 3, 5], [2, 4, 6]]
  assert mtf.is_subsequence([1, 3], [1, 2, 3]) and not mtf.is_subsequence([3, 1], [1, 2, 3])
  mtf.verify_no_new_dims([mtf.Shape([A, B])], mtf.Shape([B]))
  with pytest.raises(ValueError, match="'c'"):
    mtf.verify_no_new_dims([mtf.Shape([A, B])], mtf.Shape([B, C]))
  assert mtf.combined_dimension([A, B], name="ab") == mtf.Dimension("ab", 32)
  # Processors of a rows:2;cols:4 mesh grouped along cols: one group per row.
  assert [mtf.pnum_to_group("rows:2;cols:4", [1], p) for p in range(8)] == [0] * 4 + [1] * 4
  assert [mtf.pnum_to_group("rows:2;cols:4", [0], p) for p in range(8)] == [0, 1, 2, 3] * 2
  assert mtf.tensor_dim_to_mesh_dim_size("b:cols", "rows:2;cols:4", B) == 4
  assert mtf.tensor_dim_to_size_per_split("b:cols", "rows:2;cols:4", B) == 2
  assert mtf.tensor_dim_to_size_per_split("b:cols", "rows:2;cols:4", A) == 4
  assert mtf.reduction_fn("MAX") is tf.reduce_max and mtf.binary_reduction_fn("SUM") is tf.add
  with pytest.raises(ValueError, match="Unknown reduction 'MEDIAN'"):
    mtf.reduction_fn("MEDIAN")
  assert mtf.pool_fn("AVG_2D") is tf.nn.avg_pool2d
  assert mtf.parallel(["cpu:0", "cpu:1"], lambda a, b: a + b, [1, 2], b=[10, 20]) == [11, 22]
  assert mtf.parallel(["cpu:0", "cpu:1"], lambda a: (a, -a), [1, 2]) == ([1, 2], [-1, -2])
  with pytest.raises(ValueError, match="one per device"):
    mtf.parallel(["cpu:0", "cpu:1"], lambda a: a, [1])
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  mtf.get_variable(mesh, "w1", [A, B])
  mtf.get_variable(mesh, "w2", [C])
  log = io.StringIO()
  total = mtf.log_variable_sizes(graph.trainable_variables, "trainable", log_file=log,
                                 mesh_to_impl={mesh: mtf.MeshImpl("all:2", "b:all")})
  assert total == 34 and "total size 34" in log.getvalue() and "slice 16" in log.getvalue()
  var = graph.trainable_variables[0]
  assert var.size == 32 and var.dtype.master_dtype == tf.float32


def test_anonymize_nth_element_and_left_halo_exchange():
  values = np.random.RandomState(0).randn(4, 8).astype(np.float32)
  blocks = mtf.Dimension("blocks", 4)
  block = mtf.Dimension("block", 2)

  def build(mesh):
    x = mtf.import_tf_tensor(mesh, values, [A, B])
    anonymous = mtf.anonymize(x)
    h = mtf.import_tf_tensor(mesh, np.arange(8, dtype=np.float32).reshape(4, 2),
                             [blocks, block])
    return {"anonymous": anonymous, "second": mtf.nth_largest_element(x, 1, B),
            "smallest": mtf.nth_smallest_element(x, 0, B),
            "halo": mtf.left_halo_exchange(h, blocks, block, 1),
            "halo_wrap": mtf.left_halo_exchange(h, "blocks", "block", 1, wrap=True)}
  got, lowering = lower_and_run(build, "rows:2;cols:4", "a:rows;b:cols;blocks:cols",
                                return_lowering=True)
  assert_allclose(got["anonymous"], values)
  assert all(not d.name.startswith("a") or d.name.startswith("_anonymous_")
             for d in mtf.anonymous_shape([A, B]).dims)
  assert_allclose(got["second"], np.sort(values, axis=1)[:, -2])
  assert_allclose(got["smallest"], values.min(axis=1))
  assert_allclose(got["halo"], [[0, 0, 1], [1, 2, 3], [3, 4, 5], [5, 6, 7]])
  assert_allclose(got["halo_wrap"], [[7, 0, 1], [1, 2, 3], [3, 4, 5], [5, 6, 7]])


def test_three_argument_assign_functions_of_the_original():
  seen = []

  def my_assign(variable, slice_var, val):
    seen.append(variable.name)
    return slice_var.assign(val * 2.0)

  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  var = mtf.get_variable(mesh, "w", [A], initializer=tf.ones_initializer())
  ops = [mtf.assign(var, var.operation.outputs[0] + 1.0, assign_fn=my_assign),
         mtf.assign(var, mtf.constant(mesh, 3.0, [A]), assign_fn=mtf.assign_add_slice)]
  impl = mtf.placement_mesh_impl.PlacementMeshImpl("all:2", "a:all", DEVICES[:2])

  @tf.function
  def step(k):
    lowering = mtf.Lowering(graph, {mesh: impl})
    op = lowering.lowered_operation(ops[k])
    with tf.control_dependencies([op]):
      return tf.identity(lowering.export_to_tf_tensor(var.operation.outputs[0]))
  step(0)
  assert_allclose(step(1), np.full(4, 4.0 + 3.0))  # (1 + 1) * 2, then + 3
  assert seen and set(seen) == {"w"}


def test_shape_integer_list_and_cumprod_are_properties_that_can_be_called():
  shape = mtf.Shape([A, B, C])
  assert shape.to_integer_list == [4, 8, 2] == shape.to_integer_list()
  assert shape.cumprod == [1, 4, 32] == shape.cumprod()


def test_initializers_that_are_mocks_are_called_like_functions():
  """The original's layer tests pass unittest.mock objects as initializers; any
  attribute lookup on a mock succeeds, so the library must not mistake them
  for its own slice-aware or dense initializers."""
  from unittest import mock

  def by_shape(shape, dtype=None, **unused):
    values = {(2,): [1.0, 2.0], (2, 2): [[1.0, 0.0], [1.0, -1.0]]}
    return tf.reshape(tf.constant(values[tuple(shape)], dtype), shape)
  initializer = mock.MagicMock(side_effect=by_shape)
  length, depth, out = mtf.Dimension("length", 4), mtf.Dimension("depth", 2), \
      mtf.Dimension("output", 2)
  x_value = np.array([[1, 0], [0, 1], [1, 1], [2, 1]], np.float32)

  def build(mesh):
    x = mtf.import_tf_tensor(mesh, x_value, [length, depth])
    with mock.patch.object(tf.compat.v1, "truncated_normal_initializer",
                           return_value=initializer):
      y = mtf.layers.separable_conv1d(x, out, min_relative_pos=-1, max_relative_pos=1)
    return {"y": y}
  # depthwise: [1, 2] * (x[l-1] + x[l] + x[l+1]); pointwise [[1, 0], [1, -1]]; bias 0
  got = lower_and_run(build, "all:1", "", DEVICES[:1])
  assert_allclose(got["y"], [[3, -2], [6, -4], [9, -6], [7, -4]])
  assert initializer.call_count == 4


def test_convolution_output_may_reuse_the_input_channel_name():
  from mesh_tensorflow.transformer import transformer_layers
  batch, length, d_model = mtf.Dimension("batch", 2), mtf.Dimension("length", 5), \
      mtf.Dimension("d_model", 3)
  x_value = np.random.RandomState(0).randn(2, 5, 3).astype(np.float32)
  context = type("Context", (), {"variable_dtype": None})()

  def build(mesh):
    x = mtf.import_tf_tensor(mesh, x_value, [batch, length, d_model])
    same = mtf.layers.conv1d(x, d_model, filter_size=1, filter_initializer=tf.ones_initializer())
    layer = transformer_layers.Conv1DLayer(filter_size=3, output_size=4, activation="relu")
    return {"same": same, "layer": layer.call(context, x)}
  for mesh_shape, layout in [("all:1", ""), ("all:2", "batch:all")]:
    got = lower_and_run(build, mesh_shape, layout, DEVICES[:mtf.convert_to_shape(mesh_shape).size])
    assert_allclose(got["same"], np.repeat(x_value.sum(-1, keepdims=True), 3, axis=-1))
    assert got["layer"].shape == (2, 5, 4) and (got["layer"] >= 0).all()


def test_compress_mean_and_multiplicative_jitter():
  values = np.arange(16, dtype=np.float32).reshape(2, 8)
  two, eight = mtf.Dimension("a", 2), mtf.Dimension("l", 8)

  def build(mesh):
    x = mtf.import_tf_tensor(mesh, values, [two, eight])
    return {"mean": mtf.layers.compress_mean(x, eight, 4),
            "jitter": mtf.layers.multiplicative_jitter(x + 1.0, epsilon=0.1),
            "none": mtf.layers.multiplicative_jitter(x, epsilon=0)}
  got = lower_and_run(build, "all:2", "l:all", DEVICES[:2])
  assert_allclose(got["mean"], values.reshape(2, 2, 4).mean(-1))
  ratio = got["jitter"] / (values + 1.0)
  assert ((ratio >= 0.9) & (ratio < 1.1)).all() and ratio.std() > 0
  assert_allclose(got["none"], values)
  with pytest.raises(ValueError, match="must divide dimension 'l'"):
    mtf.layers.compress_mean(mtf.zeros(mtf.Mesh(mtf.Graph(), "m"), [eight]), eight, 3)


def test_numpy_converter_eagerly_and_in_a_graph():
  from mesh_tensorflow import test_utils
  converter = test_utils.NumpyConverter()
  x = converter.convert_np_array_to_mtf_tensor(np.ones([2, 3]), ["batch", "d"], dtype=tf.float32)
  assert converter.convert_mtf_tensor_to_np_array(mtf.reduce_sum(x)) == 6.0
  with tf.Graph().as_default():
    converter = test_utils.NumpyConverter()
    x = converter.convert_np_array_to_mtf_tensor(np.ones([2, 3]), ["batch", "d"],
                                                 dtype=tf.float32)
    y = mtf.layers.dense(x, mtf.Dimension("e", 2), kernel_initializer=tf.ones_initializer())
    assert_allclose(converter.convert_mtf_tensor_to_np_array(y), np.full((2, 2), 3.0))


def test_balanced_variable_placer():
  placer = mtf.utils.BalancedVariablePlacer(["cpu:0", "cpu:1", "cpu:2"], [100, 0, 0])
  with tf.Graph().as_default(), tf.compat.v1.device(placer.device_function):
    devices = [tf.compat.v1.get_variable(f"w{i}", [10]).device for i in range(4)]
  # 40 bytes each: the empty cpu:1 and cpu:2 first, then again, cpu:0 last
  assert devices == ["cpu:1", "cpu:2", "cpu:1", "cpu:2"]
  with pytest.raises(ValueError, match="one per device"):
    mtf.utils.BalancedVariablePlacer(["cpu:0"], [1, 2])


def test_transformer_utilities_of_the_original():
  from mesh_tensorflow.transformer import dataset, learning_rate_schedules, utils
  lr = learning_rate_schedules.linear_decay_learning_rate
  assert [float(lr(s, 100, 0.001, o)) for s, o in [(0, 0), (50, 0), (100, 0), (40, 50)]] == \
      pytest.approx([0.001, 0.0005, 0.0, 0.001])
  assert isinstance(lr(10, 100), tf.Tensor)
  cleaned = utils.clean_decodes([[2, 0, 2, 1, 3, 2, 0], [1, 2, 2, 2, 2, 2, 2]])
  assert cleaned.numpy().tolist() == [[2, 0, 2, 1, 0, 0, 0], [1, 0, 0, 0, 0, 0, 0]]
  rows = tf.data.Dataset.from_generator(
      lambda: iter([{"inputs": [7, 8, 5, 1], "targets": [3, 9, 1]},
                    {"inputs": [8, 4, 9, 3, 5, 7, 9, 1], "targets": [4, 1]}]),
      output_signature={"inputs": tf.TensorSpec([None], tf.int64),
                        "targets": tf.TensorSpec([None], tf.int64)})
  packed = list(dataset.pack_dataset(rows, length=7).as_numpy_iterator())
  assert packed[1]["inputs"].tolist() == [8, 4, 9, 3, 5, 7, 9]  # cut to the row, EOS too
  assert packed[0]["targets_segmentation"].tolist() == [1, 1, 1, 0, 0, 0, 0]


def test_laid_out_processor_numbers_and_coordinates():
  impl = mtf.placement_mesh_impl.PlacementMeshImpl("rows:2;cols:4", "", DEVICES)

  @tf.function
  def numbers():
    return (impl.laid_out_pnum().tensor_list, impl.laid_out_pcoord(0).tensor_list,
            impl.laid_out_pcoord(1).tensor_list)
  pnums, rows, cols = numbers()
  assert [int(p) for p in pnums] == list(range(8))
  assert [int(r) for r in rows] == [0] * 4 + [1] * 4
  assert [int(c) for c in cols] == [0, 1, 2, 3] * 2


def test_split_conv2d_and_random_operations_with_the_original_signatures():
  values = np.random.RandomState(0).randn(4, 8).astype(np.float32)
  image = np.random.RandomState(1).randn(2, 4, 4, 3).astype(np.float32)
  kernel = np.random.RandomState(2).randn(3, 3, 3, 2).astype(np.float32)
  batch, h, w = mtf.Dimension("batch", 2), mtf.Dimension("h", 4), mtf.Dimension("w", 4)
  cin, cout = mtf.Dimension("cin", 3), mtf.Dimension("cout", 2)
  fh, fw = mtf.Dimension("fh", 3), mtf.Dimension("fw", 3)

  def build(mesh):
    x = mtf.import_tf_tensor(mesh, values, [A, B])
    parts = mtf.SplitOperation(x, B, [2, 6]).outputs
    loss = mtf.reduce_sum(parts[0] * parts[0]) + mtf.reduce_sum(parts[1])
    (dx,) = mtf.gradients([loss], [x])
    img = mtf.import_tf_tensor(mesh, image, [batch, h, w, cin])
    filt = mtf.import_tf_tensor(mesh, kernel, [fh, fw, cin, cout])
    conv = mtf.Conv2dOperation(img, filt, [1, 1, 1, 1], "SAME").outputs[0]
    noise = mtf.RandomOperation(mesh, [A, B], tf.random.uniform, minval=2.0, maxval=3.0,
                                seed=7).outputs[0]
    return {"first": parts[0], "second": parts[1], "dx": dx, "conv": conv,
            "reference": mtf.conv2d(img, filt, padding="SAME"), "noise": noise}
  single = lower_and_run(build, "all:1", "", DEVICES[:1])
  split = lower_and_run(build, "all:2", "b:all;batch:all", DEVICES[:2])
  for got in (single, split):
    assert_allclose(got["first"], values[:, :2])
    assert_allclose(got["second"], values[:, 2:])
    assert_allclose(got["dx"], np.concatenate([2 * values[:, :2], np.ones((4, 6))], axis=1))
    assert_allclose(got["conv"], got["reference"], atol=1e-5)
    assert ((got["noise"] >= 2.0) & (got["noise"] < 3.0)).all()
  assert_allclose(single["noise"], split["noise"])  # layout-invariant samples
  with pytest.raises(ValueError, match="tf.random.uniform or tf.random.normal"):
    mtf.RandomOperation(mtf.Mesh(mtf.Graph(), "m"), [A], tf.random.truncated_normal)


def test_graph_and_mesh_impl_helpers_of_the_original():
  values = np.arange(32, dtype=np.float32).reshape(4, 8)
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.import_tf_tensor(mesh, values, [A, B])
  w1 = mtf.get_variable(mesh, "w1", [A], initializer=tf.ones_initializer())
  w2 = mtf.get_variable(mesh, "w2", [B], initializer=tf.ones_initializer())
  updates = graph.combine_assignments([
      mtf.assign_add(w1, mtf.reduce_sum(x, output_shape=[A])),
      mtf.assign_add(w2, mtf.reduce_sum(x, output_shape=[B])),
      mtf.assign_sub(w2, mtf.ones(mesh, [B]))])
  assert len(updates) == 2  # the two assign_adds share one assign function
  assert sum(isinstance(op, mtf.Assign) for op in graph.operations) == 2  # replaced
  with pytest.raises(ValueError, match="not an mtf.Assign"):
    graph.combine_assignments([x.operation])
  impl = mtf.placement_mesh_impl.PlacementMeshImpl("rows:2;cols:4", "a:rows;b:cols", DEVICES)
  y = x * 1.0

  @tf.function
  def run():
    lowering = mtf.Lowering(graph, {mesh: impl})
    laid = lowering.laid_out(x)
    lowering.verify_slice_shapes(x, laid)
    with pytest.raises(ValueError, match="Slice 0 of"):
      lowering.verify_slice_shapes(y, mtf.LaidOutTensor([t[:1] for t in laid.tensor_list]))
    shifted = impl.shift_by_n_processors(laid, 1, 1, wrap=False)
    squared = impl.einsum("ab,ab->ab", laid, laid)
    with tf.control_dependencies([lowering.lowered_operation(u) for u in updates]):
      return (tf.identity(impl.combine_slices(shifted.tensor_list, x.shape)),
              impl.combine_slices(squared.tensor_list, x.shape), lowering.laid_out_size(x))

  @tf.function
  def read():
    lowering = mtf.Lowering(graph, {mesh: impl})
    return lowering.export_to_tf_tensor(w1), lowering.export_to_tf_tensor(w2)
  shifted, squared, size = run()
  new_w1, new_w2 = read()
  want = values.copy()
  want[:, 2:] = values[:, :-2]  # each column block of 2 comes from the processor before
  want[:, :2] = 0
  assert_allclose(shifted, want)
  assert_allclose(squared, values * values)
  assert_allclose(new_w1, 1 + values.sum(1))
  assert_allclose(new_w2, values.sum(0))
  assert int(size) == 32
  graph.make_variables_untrainable()
  assert graph.trainable_variables == [] and len(graph.all_variables) == 2


def test_conv3d_operation_with_the_original_signature():
  image = np.random.RandomState(0).randn(1, 3, 4, 4, 2).astype(np.float32)
  kernel = np.random.RandomState(1).randn(2, 2, 2, 2, 3).astype(np.float32)
  dims = [mtf.Dimension(n, s) for n, s in [("batch", 1), ("d", 3), ("h", 4), ("w", 4),
                                           ("cin", 2)]]
  fdims = [mtf.Dimension(n, s) for n, s in [("fd", 2), ("fh", 2), ("fw", 2), ("cin", 2),
                                            ("cout", 3)]]

  def build(mesh):
    img = mtf.import_tf_tensor(mesh, image, dims)
    filt = mtf.import_tf_tensor(mesh, kernel, fdims)
    return {"op": mtf.Conv3dOperation(img, filt, [1, 1, 1, 1, 1], "VALID").outputs[0],
            "fn": mtf.conv3d(img, filt, padding="VALID")}
  got = lower_and_run(build, "all:1", "", DEVICES[:1])
  assert got["op"].shape == (1, 2, 3, 3, 3)
  assert_allclose(got["op"], got["fn"], atol=1e-5)


@pytest.mark.parametrize("mesh_shape,layout", [
    ("all:1", ""), ("rows:2;cols:4", "batch:rows;length:cols"),
    ("rows:2;cols:4", "segments:cols;batch:rows"), ("all:8", "d:all")])
def test_gather_with_shared_dimensions_is_a_batched_lookup(mesh_shape, layout):
  """weights [batch, segments, d] and indices [batch, length] share batch:
  out[b, l, :] = weights[b, indices[b, l], :] (tf.gather with batch_dims)."""
  rng = np.random.default_rng(3)
  w = rng.normal(size=(2, 4, 8)).astype(np.float32)
  idx = rng.integers(0, 4, size=(2, 8)).astype(np.int32)
  batch, segments, d, length = (mtf.Dimension("batch", 2), mtf.Dimension("segments", 4),
                                mtf.Dimension("d", 8), mtf.Dimension("length", 8))
  scale = rng.normal(size=(2, 8, 8)).astype(np.float32)

  def build(mesh):
    weights = mtf.import_tf_tensor(mesh, w, [batch, segments, d])
    ids = mtf.import_tf_tensor(mesh, idx, [batch, length])
    out = mtf.gather(weights, ids, segments)
    loss = mtf.reduce_sum(out * mtf.import_tf_tensor(mesh, scale, [batch, length, d]))
    int_out = mtf.gather(mtf.cast(weights * 10.0, tf.int32), ids, segments)
    return {"out": out, "grad": mtf.gradients([loss], [weights])[0], "int": int_out}
  got = lower_and_run(build, mesh_shape, layout, DEVICES[:mtf.convert_to_shape(mesh_shape).size])
  expected = np.take_along_axis(w, idx[:, :, None], axis=1)
  assert got["out"].shape == (2, 8, 8)
  assert_allclose(got["out"], expected)
  assert got["int"].dtype == np.int32
  np.testing.assert_array_equal(got["int"], np.take_along_axis(
      (w * 10.0).astype(np.int32), idx[:, :, None], axis=1))
  grad = np.zeros_like(w)
  for b in range(2):
    for l in range(8):
      grad[b, idx[b, l]] += scale[b, l]
  assert_allclose(got["grad"], grad)


@pytest.mark.parametrize("mesh_shape,layout", [
    ("all:1", ""), ("rows:2;cols:4", "batch:rows;length:cols")])
def test_concat_inputs_and_targets_packs_each_example_inputs_then_targets(mesh_shape, layout):
  from mesh_tensorflow.transformer import utils  # pylint: disable=g-import-not-at-top
  features = {
      "inputs": [[3, 1, 4, 1, 0, 0, 0, 0], [1, 4, 3, 2, 1, 5, 0, 0]],
      "inputs_segmentation": [[1, 1, 2, 2, 0, 0, 0, 0], [1, 2, 2, 2, 2, 3, 0, 0]],
      "inputs_position": [[0, 1, 0, 1, 0, 0, 0, 0], [0, 0, 1, 2, 3, 0, 0, 0]],
      "targets": [[1, 7, 7, 0, 0, 0, 0, 0], [9, 8, 1, 2, 1, 6, 6, 0]],
      "targets_segmentation": [[1, 2, 2, 0, 0, 0, 0, 0], [1, 1, 1, 2, 2, 3, 3, 0]],
      "targets_position": [[0, 0, 1, 0, 0, 0, 0, 0], [0, 1, 2, 0, 1, 0, 1, 0]],
  }
  batch, length = mtf.Dimension("batch", 2), mtf.Dimension("length", 8)

  def build(mesh, keys):
    mtf_features = {k: mtf.import_tf_tensor(mesh, np.array(features[k], np.int32),
                                            [batch, length]) for k in keys}
    return utils.concat_inputs_and_targets(mtf_features)
  devices = DEVICES[:mtf.convert_to_shape(mesh_shape).size]
  got = lower_and_run(lambda mesh: build(mesh, features), mesh_shape, layout, devices)
  pad = [0] * 16
  assert got["targets"].tolist() == [
      [3, 1, 1, 4, 1, 7, 7] + pad[:9], [1, 9, 8, 1, 4, 3, 2, 1, 2, 1, 5, 6, 6] + pad[:3]]
  assert got["targets_segmentation"].tolist() == [
      [1, 1, 1, 2, 2, 2, 2] + pad[:9], [1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 3, 3, 3] + pad[:3]]
  assert got["targets_position"].tolist() == [
      [0, 1, 2, 0, 1, 2, 3] + pad[:9], [0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 0, 1, 2] + pad[:3]]
  # Unpacked: the nonzero ids of each row are one example.
  got = lower_and_run(lambda mesh: build(mesh, ["inputs", "targets"]), mesh_shape, layout,
                      devices)
  assert sorted(got) == ["targets"]
  assert got["targets"].tolist() == [[3, 1, 4, 1, 1, 7, 7] + pad[:9],
                                     [1, 4, 3, 2, 1, 5, 9, 8, 1, 2, 1, 6, 6] + pad[:3]]
  assert utils._dynamic_text2self is utils.concat_inputs_and_targets  # pylint: disable=protected-access


def test_original_optimizer_helpers():
  import types  # pylint: disable=g-import-not-at-top
  opt = mtf.optimize.AdafactorOptimizer(min_dim_size_to_factor=4)
  shape = mtf.convert_to_shape("a:2;b:8;c:4")
  assert opt._factored_dims(shape) == [mtf.Dimension("b", 8), mtf.Dimension("c", 4)]  # pylint: disable=protected-access
  assert opt._factored_dims(mtf.convert_to_shape("a:2;b:3")) is None  # pylint: disable=protected-access
  assert opt._learning_rate_default(True)(0) == pytest.approx(0.01)  # pylint: disable=protected-access
  assert opt._learning_rate_default(False)(0) == pytest.approx(0.0005)  # pylint: disable=protected-access
  assert opt._decay_rate_default()(3) == pytest.approx(1 - 4 ** -0.8)  # pylint: disable=protected-access
  got = lower_and_run(lambda mesh: {"scale": opt._parameter_scale(  # pylint: disable=protected-access
      mtf.constant(mesh, 3.0, [A]))}, "all:1", "", DEVICES[:1])
  assert_allclose(got["scale"], 3.0)

  hp = types.SimpleNamespace(
      optimizer="Adafactor", optimizer_adafactor_decay_type="pow",
      optimizer_adafactor_memory_exponent=0.5, optimizer_adafactor_beta1=0.9,
      optimizer_adafactor_multiply_by_parameter_scale=False,
      optimizer_adafactor_clipping_threshold=None, optimizer_adafactor_factored=False)
  ada = mtf.optimize.make_optimizer(hp, 0.1)
  assert isinstance(ada, mtf.optimize.AdafactorOptimizer)
  assert (ada.beta1, ada.learning_rate, ada.factored, ada.clipping_threshold) == (0.9, 0.1, False, None)
  assert ada.decay_rate(3) == pytest.approx(0.5)
  assert isinstance(mtf.optimize.make_optimizer(types.SimpleNamespace(optimizer="SGD"), 0.1),
                    mtf.optimize.SgdOptimizer)
  with pytest.raises(ValueError, match="step_counter"):
    mtf.optimize.step_num()
  with pytest.raises(ValueError, match="hparams.optimizer is 'Adam'"):
    mtf.optimize.make_optimizer(types.SimpleNamespace(optimizer="Adam"), 0.1)
  hp.optimizer_adafactor_decay_type = "exp"
  with pytest.raises(ValueError, match="optimizer_adafactor_decay_type is 'exp'"):
    mtf.optimize.adafactor_optimizer_from_hparams(hp, 0.1)


def test_pool_and_transposed_conv_classes_with_the_original_signatures():
  image = np.random.RandomState(4).randn(2, 4, 4, 3).astype(np.float32)
  kernel = np.random.RandomState(5).randn(3, 3, 2, 3).astype(np.float32)  # [fh, fw, out, in]
  batch, h, w = mtf.Dimension("batch", 2), mtf.Dimension("h", 4), mtf.Dimension("w", 4)
  cin, cout = mtf.Dimension("cin", 3), mtf.Dimension("cout", 2)
  fh, fw = mtf.Dimension("fh", 3), mtf.Dimension("fw", 3)

  def build(mesh):
    img = mtf.import_tf_tensor(mesh, image, [batch, h, w, cin])
    filt = mtf.import_tf_tensor(mesh, kernel, [fh, fw, cout, cin])
    return {
        "max": mtf.PoolOperation(img, [2, 2], [2, 2], "MAX_2D").outputs[0],
        "avg": mtf.PoolOperation(img, [2, 2], [2, 2], "AVG_2D").outputs[0],
        "up": mtf.Conv2dTransposeOperation(img, filt, [2, 2], "SAME").outputs[0],
        "up_reference": mtf.conv2d_transpose(img, filt, strides=(2, 2), padding="SAME"),
    }
  for mesh_shape, layout in [("all:1", ""), ("all:2", "batch:all")]:
    got = lower_and_run(build, mesh_shape, layout,
                        DEVICES[:mtf.convert_to_shape(mesh_shape).size])
    blocks = image.reshape(2, 2, 2, 2, 2, 3)
    assert_allclose(got["max"], blocks.max(axis=(2, 4)))
    assert_allclose(got["avg"], blocks.mean(axis=(2, 4)))
    assert got["up"].shape == (2, 8, 8, 2)
    assert_allclose(got["up"], got["up_reference"])
  with pytest.raises(ValueError, match="pool_fn_string 'MAX'"):
    graph = mtf.Graph()
    mtf.PoolOperation(mtf.zeros(mtf.Mesh(graph, "m"), [batch, h, w, cin]), [2, 2], [2, 2], "MAX")
  assert issubclass(mtf.Conv3dTransposeOperation, mtf.Operation)


def test_placement_module_collectives_over_lists_of_tensors():
  pmi = mtf.placement_mesh_impl
  devices = DEVICES[:4]
  xs = [tf.constant(np.arange(8, dtype=np.float32).reshape(2, 4) + 10 * i) for i in range(4)]
  total = sum(x.numpy() for x in xs)
  for fn in (pmi.allreduce_ring, pmi.allreduce_ring_single_shard):
    ys = fn(xs, devices)
    assert len(ys) == 4 and all(np.allclose(y.numpy(), total) for y in ys)
    assert [y.device.endswith(f"CPU:{i}") for i, y in enumerate(ys)] == [True] * 4
  assert np.allclose(pmi.allreduce_ring(xs, devices, "MAX")[2].numpy(), xs[3].numpy())
  ys = pmi.allconcat_ring(xs, devices, 0)
  assert all(np.allclose(y.numpy(), np.concatenate([x.numpy() for x in xs])) for y in ys)
  for fn in (pmi.alltoall_ring, pmi.alltoall_pointtwise):
    ys = fn(xs, devices, split_axis=1, concat_axis=0)
    for j, y in enumerate(ys):
      assert np.allclose(y.numpy(), np.concatenate([x.numpy()[:, j:j + 1] for x in xs]))
  with pytest.raises(ValueError, match="one device per tensor"):
    pmi.allreduce_ring(xs, devices[:3])
  with pytest.raises(ValueError, match="not divisible by 3"):
    pmi.alltoall_ring(xs[:3], devices[:3], split_axis=1, concat_axis=0)


def test_mesh_impl_print_and_laid_out_tensor_class(capfd):
  impl = mtf.placement_mesh_impl.PlacementMeshImpl("all:2", "a:all", DEVICES[:2])
  laid = impl.LaidOutTensor([tf.constant([1.0, 2.0]), tf.constant([3.0, 4.0])])
  assert isinstance(laid, mtf.LaidOutTensor)
  printed = impl.Print(laid, [laid], "slices are")
  assert [t.numpy().tolist() for t in printed.tensor_list] == [[1.0, 2.0], [3.0, 4.0]]
  printed_text = "".join(capfd.readouterr())
  assert "slices are [1 2]" in printed_text and "slices are [3 4]" in printed_text


def test_lazy_allreduce_sums_add_before_their_one_allreduce():
  impl = mtf.placement_mesh_impl.PlacementMeshImpl("all:2", "", DEVICES[:2])
  a = mtf.LazyAllreduceSum(impl, mtf.LaidOutTensor([tf.constant(1.0), tf.constant(2.0)]), [0])
  b = mtf.LazyAllreduceSum(impl, mtf.LaidOutTensor([tf.constant(10.0), tf.constant(20.0)]), [0])
  total = a + b
  assert isinstance(total, mtf.LazyAllreduceSum) and total.mesh_axes == (0,)
  assert [float(t) for t in total.to_laid_out_tensor().tensor_list] == [33.0, 33.0]
  plain = a + mtf.LaidOutTensor([tf.constant(5.0), tf.constant(6.0)])
  assert [float(t) for t in plain.tensor_list] == [8.0, 9.0]


def test_lazy_allreduce_sum_calls_add_counter_fn_once_when_the_allreduce_is_made():
  impl = mtf.placement_mesh_impl.PlacementMeshImpl("all:2", "", DEVICES[:2])
  calls = []
  lazy = mtf.LazyAllreduceSum(impl, mtf.LaidOutTensor([tf.constant(1.0), tf.constant(2.0)]), [0],
                              add_counter_fn=lambda: calls.append(1))
  assert not calls  # nothing is reduced while the sum is pending
  first = lazy.to_laid_out_tensor()
  second = lazy.to_laid_out_tensor()
  assert len(calls) == 1 and first is second
  assert [float(t) for t in first.tensor_list] == [3.0, 3.0]


def test_slice_numbers_cumprods_and_laid_out_args_for_custom_lowerings():
  """The MeshImpl helpers that the original's custom operations call."""
  impl = mtf.placement_mesh_impl.PlacementMeshImpl("rows:2;cols:4", "d:rows;batch:cols", DEVICES)
  simd = mtf.simd_mesh_impl.SimdMeshImpl("rows:2;cols:4", "d:rows;batch:cols", DEVICES)
  shape = mtf.convert_to_shape("batch:8;e:3;d:2")
  # rows split d (axis 2: 8 * 3 before it), cols split batch (axis 0: 1).
  for mesh_impl in (impl, simd):
    assert mesh_impl.mesh_axis_to_cumprod(shape) == [24, 1]
    assert mesh_impl.mesh_axis_to_cumprod("e:3") == [None, None]

  @tf.function
  def numbers():
    return [impl.laid_out_slice_num(s).tensor_list for s in (shape, "batch:8")]
  slice_num, replicated = numbers()
  # pnum = 4 * row + col; batch (split by col) is the major axis, d (row) minor;
  # "batch:8" is split over cols only, so the two rows hold the same slices.
  assert [int(t) for t in slice_num] == [2 * (p % 4) + p // 4 for p in range(8)]
  assert [int(t) for t in replicated] == [p % 4 for p in range(8)]

  lazy = mtf.LazyAllreduceSum(impl, mtf.LaidOutTensor([tf.constant(float(p)) for p in range(8)]),
                              [0])
  laid, number = mtf.convert_args_to_laid_out_tensors([lazy, 2.0])
  assert isinstance(laid, mtf.LaidOutTensor) and number == 2.0
  assert [float(t) for t in laid.tensor_list] == [p % 4 * 2 + 4.0 for p in range(8)]
  graph = mtf.Graph()
  assert mtf.Lowering(graph, {mtf.Mesh(graph, "m"): impl}, autostack=False).autostack is False


def test_estimator_checkpoint_hooks_say_what_replaces_them():
  for hook in (mtf.MtfRestoreHook, mtf.MtfCheckpointSaverListener):
    with pytest.raises(NotImplementedError, match="Estimator.*CheckpointManager"):
      hook(object())
