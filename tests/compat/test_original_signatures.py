"""Call forms of the original Mesh TensorFlow 0.1.21 that ported code relies on:
argument order (is_training before dropout, top_k's name after k_dim, pooling's
name third), keyword names (learning_rate=, explicit_inputs=, if_true=),
result order and shapes (top_1 gives values then indices; top_k puts k last),
the operation classes' constructors, and the TPU topology helpers. Each case
was found by running the original's own unit tests against this library."""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import simd_mesh_impl
from mesh_tensorflow import test_utils
from mtf_test_utils import assert_allclose, lower_and_run

a_dim, b_dim, k_dim = mtf.Dimension("a", 8), mtf.Dimension("b", 6), mtf.Dimension("k", 2)
X = np.random.RandomState(0).permutation(48).reshape(8, 6).astype(np.float32)


def _x(mesh):
  return mtf.import_tf_tensor(mesh, tf.constant(X), [a_dim, b_dim])


@pytest.mark.parametrize("mesh_shape,layout", [("all:1", ""), ("rows:2;cols:4", "a:cols;b:rows"),
                                               ("all:2", "k:all")])
def test_top_k_puts_k_last_and_top_1_returns_values_then_indices(mesh_shape, layout):
  def build(mesh):
    x = _x(mesh)
    values, indices = mtf.top_k(x, a_dim, k_dim, "top2")  # name fourth, as in the original
    best, where = mtf.top_1(x, a_dim)
    assert values.shape == mtf.Shape([b_dim, k_dim]) == indices.shape
    d_x = mtf.gradients([mtf.reduce_sum(values * mtf.range(mesh, k_dim, tf.float32))], [x])[0]
    return {"values": values, "indices": indices, "best": best, "where": where,
            "argmax": mtf.argmax(x, a_dim, "am"), "argmax64": mtf.argmax(x, a_dim, tf.int64),
            "d_x": d_x}
  got = lower_and_run(build, mesh_shape, layout)
  order = np.argsort(-X, axis=0)
  assert_allclose(got["values"], np.take_along_axis(X, order[:2], 0).T)
  np.testing.assert_array_equal(got["indices"], order[:2].T)
  assert_allclose(got["best"], X.max(axis=0))
  np.testing.assert_array_equal(got["where"], X.argmax(axis=0))
  np.testing.assert_array_equal(got["argmax"], X.argmax(axis=0))
  assert got["argmax64"].dtype == np.int64
  d_x = np.zeros_like(X)
  d_x[order[1], np.arange(6)] = 1.0  # the second largest has weight range(k)[1]
  assert_allclose(got["d_x"], d_x)


def test_legacy_conv_classes_take_is_transpose_and_report_every_dim_splittable():
  batch, h, w = mtf.Dimension("batch", 2), mtf.Dimension("h", 6), mtf.Dimension("w", 4)
  c_in, c_out = mtf.Dimension("in", 3), mtf.Dimension("out", 4)
  fh, fw = mtf.Dimension("fh", 3), mtf.Dimension("fw", 3)
  rs = np.random.RandomState(1)
  x_np = rs.randn(2, 6, 4, 3).astype(np.float32)
  k_np = rs.randn(3, 3, 3, 4).astype(np.float32)
  dy_np = rs.randn(2, 6, 4, 4).astype(np.float32)
  kt_np = rs.randn(3, 3, 4, 3).astype(np.float32)  # a transposed conv's [fh, fw, out, in]
  strides = [1, 1, 1, 1]

  def build(mesh):
    x = mtf.import_tf_tensor(mesh, tf.constant(x_np), [batch, h, w, c_in])
    k = mtf.import_tf_tensor(mesh, tf.constant(k_np), [fh, fw, c_in, c_out])
    kt = mtf.import_tf_tensor(mesh, tf.constant(kt_np), [fh, fw, c_out, c_in])
    dy = mtf.import_tf_tensor(mesh, tf.constant(dy_np), [batch, h, w, c_out])
    dx_op = mtf.Conv2or3dBackpropInputOperation(2, False, x.shape, k, dy, strides, "SAME")
    dk_op = mtf.Conv2or3dBackpropFilterOperation(2, False, x, k.shape, dy, strides, "SAME")
    up = mtf.conv2d_transpose(x, kt, strides=(1, 1), padding="SAME")
    t_dx_op = mtf.Conv2or3dBackpropInputOperation(2, True, x.shape, kt, up, strides, "SAME")
    t_dk_op = mtf.Conv2or3dBackpropFilterOperation(2, True, x, kt.shape, up, strides, "SAME")
    everything = {"batch", "h", "w", "in", "out", "fh", "fw"}
    for op in (dx_op, dk_op):
      assert op.splittable_dims == everything and not op.unsplittable_dims
    return {
        "dx": dx_op.outputs[0], "dk": dk_op.outputs[0],
        "dx_ref": mtf.conv2d_backprop_input(x.shape, k, dy, (1, 1), "SAME"),
        "dk_ref": mtf.conv2d_backprop_filter(x, k.shape, dy, (1, 1), "SAME"),
        "t_dx": t_dx_op.outputs[0], "t_dk": t_dk_op.outputs[0],
        "t_dx_ref": mtf.conv2d_transpose_backprop_input(x.shape, kt, up, (1, 1), "SAME"),
        "t_dk_ref": mtf.conv2d_transpose_backprop_filter(x, kt.shape, up, (1, 1), "SAME")}
  # h split although the legacy classes call it splittable: the lowering gathers it
  got = lower_and_run(build, "rows:2;cols:4", "h:rows;out:cols")
  for key in ("dx", "dk", "t_dx", "t_dk"):
    assert_allclose(got[key], got[key + "_ref"], rtol=1e-4, atol=1e-4, msg=key)
  dx_tf = tf.compat.v1.nn.conv2d_backprop_input([2, 6, 4, 3], k_np, dy_np, strides, "SAME")
  assert_allclose(got["dx"], dx_tf.numpy(), rtol=1e-4, atol=1e-4)
  with pytest.raises(ValueError, match="conv_dimension must be 2 or 3"):
    mtf.Conv2or3dBackpropFilterOperation(
        1, False, mtf.zeros(mtf.Mesh(mtf.Graph(), "m"), [batch, h, w, c_in]),
        [fh, fw, c_in, c_out], None, strides, "SAME")


def test_generic_grad_is_reported_splittable_and_gathers_what_the_forward_op_needs():
  def build(mesh):
    x = _x(mesh)
    op = mtf.SlicewiseOperation(lambda t: tf.math.cumsum(t, axis=1) * t, [x], [x.shape],
                                [x.dtype], splittable_dims=[a_dim])
    assert op.unsplittable_dims == {"b"}
    (d_x,) = mtf.gradients([mtf.reduce_sum(op.outputs[0])], [x])
    grad_op = d_x.operation
    while not isinstance(grad_op, mtf.GenericGradOperation):
      grad_op = grad_op.inputs[0].operation
    assert grad_op.splittable_dims == {"a", "b"} and not grad_op.unsplittable_dims
    return {"d_x": d_x}
  # d/dx_j sum_i x_i * cumsum(x)_i = cumsum(x)_j + sum_{i >= j} x_i
  expected = np.cumsum(X, axis=1) + np.cumsum(X[:, ::-1], axis=1)[:, ::-1]
  assert_allclose(lower_and_run(build, "all:2", "b:all")["d_x"], expected, rtol=1e-5)


def test_numpy_converter_returns_the_lowering_and_names_dims_like_the_original():
  converter = test_utils.NumpyConverter()
  x = converter.convert_np_array_to_mtf_tensor(np.array([[1, 2, 3], [4, 5, 6]]))
  assert x.shape.dimension_names == ["dim0", "dim1"]
  lowering, tf_x = converter.convert_mtf_tensor_to_tf_tensor(x)
  assert isinstance(lowering, mtf.Lowering)
  np.testing.assert_array_equal(tf_x.numpy(), [[1, 2, 3], [4, 5, 6]])


@pytest.mark.parametrize("physical,spec,mesh", [
    ([8, 8, 2], [("dp", None), ("mp", [1, 1, 2])], "dp:64;mp:2"),
    ([8, 8, 2], [("dp", [8, 8, 1]), ("mp", [1, 1, 2])], "dp:64;mp:2"),
    ([8, 8, 2], [("dp", None), ("mp1", [2, 2, 1]), ("mp2", [2, 2, 1])], "dp:8;mp1:4;mp2:4"),
    ([9, 15, 7], [("d1", [3, 5, 1]), ("d2", [3, 3, 7])], "d1:15;d2:63"),
])
def test_hierarchical_tiling_is_a_permutation_with_compact_last_tiles(physical, spec, mesh):
  tiling = simd_mesh_impl.HierarchicalTiling(spec, physical)
  assert tiling.mesh_shape == mtf.convert_to_shape(mesh)
  assert tiling.mesh_shape == simd_mesh_impl.HierarchicalTiling.spec_to_mesh_shape(
      spec, int(np.prod(physical)))
  assert sorted(tiling.logical_to_physical) == list(range(int(np.prod(physical))))
  # the processors of one last-dimension group fill exactly the last tile
  last_tile = spec[-1][1]
  group = np.array(tiling.physical_coordinates[:tiling.mesh_shape.dims[-1].size])
  assert list(group.max(axis=0) - group.min(axis=0) + 1) == last_tile


def test_hierarchical_tiling_and_auto_mapping_reject_bad_specs():
  with pytest.raises(ValueError, match="multiply to"):
    simd_mesh_impl.HierarchicalTiling([("a", [2, 2]), ("b", [2, 1])], [4, 4])
  with pytest.raises(ValueError, match="one size per physical axis"):
    simd_mesh_impl.HierarchicalTiling([("a", None), ("b", [2])], [4, 4])
  with pytest.raises(ValueError, match="not 16 processors"):
    simd_mesh_impl.HierarchicalTiling.spec_to_mesh_shape([("a", [2]), ("b", [2])], 16)
  with pytest.raises(ValueError, match="device_assignment is not supported"):
    simd_mesh_impl.auto_logical_to_physical_tpu([4], [4], device_assignment=object())


@pytest.mark.parametrize("logical,physical", [([128], [8, 8, 2]), ([8, 16], [8, 8, 2]),
                                              ([2, 32, 4], [256]), ([16, 8], [8, 8, 1, 2])])
def test_auto_logical_to_physical_tpu_is_a_permutation_of_neighbours(logical, physical):
  pnums = simd_mesh_impl.auto_logical_to_physical_tpu(logical, physical)
  assert sorted(pnums) == list(range(int(np.prod(physical))))
  coords = simd_mesh_impl.auto_logical_to_physical_tpu(logical, physical,
                                                       return_coordinates=True)
  chips = [tuple(c[:3]) for c in coords]
  # consecutive logical processors sit on the same chip or on neighbouring chips
  for p, q in zip(chips, chips[1:]):
    assert sum(abs(i - j) for i, j in zip(p, q)) <= 1, (p, q)


def test_layers_take_is_training_where_the_original_did():
  batch, length = mtf.Dimension("batch", 2), mtf.Dimension("length", 8)
  d_model, d_ff = mtf.Dimension("d_model", 4), mtf.Dimension("d_ff", 8)
  heads, d_kv = mtf.Dimension("heads", 2), mtf.Dimension("d_kv", 2)
  x_np = np.random.RandomState(2).randn(2, 8, 4).astype(np.float32)

  def build(mesh):
    x = mtf.import_tf_tensor(mesh, tf.constant(x_np), [batch, length, d_model])
    init = tf.constant_initializer(0.1)
    out = {
        # training with a dropout rate: positional as in the original
        "drd_train": mtf.layers.dense_relu_dense(x, d_ff, True, 0.5, name="drd"),
        "drd_eval": mtf.layers.dense_relu_dense(x, d_ff, False, 0.5, name="drd"),
        "drd_plain": mtf.layers.dense_relu_dense(x, d_ff, name="drd"),
        "mha_eval": mtf.layers.multihead_attention(x, None, None, d_kv, heads, False, 0.5,
                                                   name="mha"),
        "mha_plain": mtf.layers.multihead_attention(x, None, None, d_kv, heads, name="mha"),
        "local": mtf.layers.masked_local_attention_1d(x, d_kv, heads, False, 4, name="loc"),
        "local_kw": mtf.layers.masked_local_attention_1d(x, d_kv, heads, window_size=4,
                                                         name="loc"),
        "compressed_eval": mtf.layers.multihead_self_attention_memory_compressed(
            x, True, 2, d_kv, heads, False, 0.5, name="mc"),
        "compressed_plain": mtf.layers.multihead_self_attention_memory_compressed(
            x, True, 2, d_kv, heads, name="mc"),
        # kernel_initializer is dense's tenth argument, name its twelfth
        "dense": mtf.layers.dense(x, d_ff, [d_model], None, False, None, tf.float32,
                                  tf.float32, None, init, None, "dense_pos"),
    }
    q = mtf.import_tf_tensor(mesh, tf.constant(x_np), [batch, length, d_model])
    k = mtf.rename_dimension(q, "length", "memory")
    out["dot_eval"] = mtf.layers.dot_product_attention(q, k, k, None, False, 0.9)
    out["dot_plain"] = mtf.layers.dot_product_attention(q, k, k, None)
    for bad in (lambda: mtf.layers.dense_relu_dense(x, d_ff, 0.1),
                lambda: mtf.layers.dot_product_attention(q, k, k, None, 0.1)):
      with pytest.raises(TypeError, match="is_training must be a bool"):
        bad()
    return out
  got = lower_and_run(build, "rows:2;cols:4", "batch:rows;d_ff:cols")
  for key in ("drd", "mha", "compressed", "dot"):
    assert_allclose(got[key + "_eval"], got[key + "_plain"], msg=key)
  assert_allclose(got["local"], got["local_kw"])
  assert not np.allclose(got["drd_train"], got["drd_plain"])
  assert_allclose(got["dense"], np.einsum("bld,df->blf", x_np, np.full((4, 8), 0.1)),
                  rtol=1e-5)


def test_layer_pools_take_name_third_and_spatial_attention_takes_is_training():
  batch, hh, ww, c = (mtf.Dimension("batch", 2), mtf.Dimension("hh", 4),
                      mtf.Dimension("ww", 4), mtf.Dimension("c", 3))
  x_np = np.random.RandomState(3).randn(2, 4, 4, 3).astype(np.float32)

  def build(mesh):
    x = mtf.import_tf_tensor(mesh, tf.constant(x_np), [batch, hh, ww, c])
    return {"max": mtf.layers.max_pool2d(x, (2, 2), "pool_a"),
            "avg": mtf.layers.avg_pool2d(x, (2, 2), "pool_b")}
  got = lower_and_run(build, "all:2", "batch:all")
  windows = x_np.reshape(2, 2, 2, 2, 2, 3)
  assert_allclose(got["max"], windows.max(axis=(2, 4)))
  assert_allclose(got["avg"], windows.mean(axis=(2, 4)), rtol=1e-5)


def test_optimizers_take_the_original_keywords():
  assert mtf.optimize.SgdOptimizer(learning_rate=0.5).lr == 0.5
  assert mtf.optimize.SgdOptimizer(lr=0.25).lr == 0.25
  assert mtf.optimize.MomentumOptimizer(learning_rate=0.1, momentum=0.9).lr == 0.1
  with pytest.raises(TypeError, match="once"):
    mtf.optimize.SgdOptimizer(learning_rate=0.1, lr=0.1)
  with pytest.raises(TypeError, match="once"):
    mtf.optimize.SgdOptimizer()
  with pytest.raises(TypeError, match="momentum"):
    mtf.optimize.MomentumOptimizer(0.1)
  decay = mtf.optimize.adafactor_decay_rate_pow(0.5, offset=100)
  assert decay(100) == 0.0 and decay(50) == 0.0
  assert decay(103) == pytest.approx(1 - 4 ** -0.5)


def test_adafactor_stacked_dims_and_parameter_scale_exclusion():
  layers, rows, cols = mtf.Dimension("layers", 2), mtf.Dimension("rows", 4), mtf.Dimension("cols", 3)
  w_np = np.stack([np.full((4, 3), 1.0), np.full((4, 3), 4.0)]).astype(np.float32)
  g_np = np.random.RandomState(4).randn(2, 4, 3).astype(np.float32)
  opt = mtf.optimize.AdafactorOptimizer(min_dim_size_to_factor=1, stacked_dim_names=["layers"],
                                        learning_rate=0.1, clipping_threshold=None)
  assert opt.factored_dims(mtf.Shape([layers, rows, cols])) == (rows, cols)

  def run(optimizer, name):
    def build(mesh):
      w = mtf.get_variable(mesh, name, [layers, rows, cols],
                           initializer=tf.constant_initializer(w_np))
      g = mtf.import_tf_tensor(mesh, tf.constant(g_np), [layers, rows, cols])
      after = mtf.depend(w * 1.0, optimizer.apply_grads([g], [w.operation]))
      return {"delta": after - mtf.import_tf_tensor(mesh, tf.constant(w_np), w.shape)}
    return lower_and_run(build, "all:2", "layers:all", mode="eager")["delta"]
  scaled = run(opt, "w_scaled")
  # per-layer parameter scales 1 and 4: the second layer's update is 4 times larger
  unscaled = run(mtf.optimize.AdafactorOptimizer(
      min_dim_size_to_factor=1, stacked_dim_names=["layers"], learning_rate=0.1,
      clipping_threshold=None, exclude_from_parameter_scale=["w_excluded"]), "w_excluded")
  assert_allclose(scaled[0], unscaled[0], rtol=1e-5)
  assert_allclose(scaled[1], 4 * unscaled[1], rtol=1e-5)


def test_while_loop_accumulators_sum_the_extra_outputs():
  def build(mesh):
    x = _x(mesh)
    i0 = mtf.constant(mesh, 0, dtype=tf.int32)
    i, total = mtf.while_loop(lambda i: mtf.less(i, 3),
                              lambda i: [i + 1, x * mtf.cast(i, tf.float32)], [i0],
                              has_accumulators=True)
    _, none = mtf.while_loop(lambda i: mtf.less(i, 0), lambda i: [i + 1, x], [i0],
                             has_accumulators=True)
    with pytest.raises(ValueError, match="has_accumulators=True"):
      mtf.while_loop(lambda i: mtf.less(i, 3), lambda i: [i + 1, x], [i0])
    return {"i": i, "total": total, "none": none}
  got = lower_and_run(build, "rows:2;cols:4", "a:cols;b:rows")
  assert got["i"] == 3
  assert_allclose(got["total"], 3 * X)  # 0x + 1x + 2x
  assert_allclose(got["none"], np.zeros_like(X))


def test_control_and_where_keywords():
  def build(mesh):
    x = _x(mesh)
    y = mtf.custom_gradient(lambda t: t * 2.0, lambda xs, cap, ys, gs: [gs[0] * 3.0],
                            explicit_inputs=[x])
    r = mtf.recompute_grad(lambda t: mtf.square(t), [x], control_dependencies=False)
    picked = mtf.where(mtf.greater(x, 20.0), if_true=x, if_false=0.0)
    d_y, d_r = mtf.gradients([mtf.reduce_sum(y), mtf.reduce_sum(r)], [x, x])[:2]
    return {"y": y, "picked": picked,
            "d_y": mtf.gradients([mtf.reduce_sum(y)], [x])[0],
            "d_r": mtf.gradients([mtf.reduce_sum(r)], [x])[0]}
  got = lower_and_run(build, "all:2", "a:all")
  assert_allclose(got["y"], 2 * X)
  assert_allclose(got["d_y"], np.full_like(X, 3.0))
  assert_allclose(got["d_r"], 2 * X)
  assert_allclose(got["picked"], np.where(X > 20, X, 0))


def test_unitransformer_loss_fn_takes_the_model_first_as_in_the_original():
  from mesh_tensorflow.transformer import transformer
  calls = []

  def original_style(decoder, context, logits, targets, output_vocab_dim):
    calls.append(("original", decoder, context, logits, targets, output_vocab_dim))
    return "loss"

  def four_arguments(context, logits, targets, vocab_dim):
    calls.append(("four", context, logits, targets, vocab_dim))
    return "loss"
  for fn in (original_style, four_arguments, lambda *args: calls.append(args) or "loss"):
    assert transformer._call_loss_fn(fn, "model", "ctx", "logits", "targets", "vocab") == "loss"
  assert calls == [("original", "model", "ctx", "logits", "targets", "vocab"),
                   ("four", "ctx", "logits", "targets", "vocab"),
                   ("model", "ctx", "logits", "targets", "vocab")]


def test_simd_mesh_impl_takes_the_original_logical_to_physical_permutation():
  devices = [f"/job:localhost/replica:0/task:0/device:CPU:{i}" for i in range(8)]
  impl = simd_mesh_impl.SimdMeshImpl("rows:2;cols:4", "batch:rows", devices, None,
                                     list(reversed(range(8))))
  assert impl.devices == list(reversed(devices))
  with pytest.raises(ValueError, match="permutation of range"):
    simd_mesh_impl.SimdMeshImpl("all:8", "", devices, logical_to_physical=[0] * 8)


def test_transformer_keeps_the_original_stack_and_context_arguments():
  from mesh_tensorflow.transformer import transformer, transformer_layers
  layers = [transformer_layers.SelfAttention(), transformer_layers.DenseReluDense()]
  assert transformer.LayerStack(layers, recompute_grads=True).recompute == "layer"
  assert transformer.LayerStack(layers).recompute == "none"
  with pytest.raises(ValueError, match="recompute_grads=True"):
    transformer.LayerStack(layers, recompute="selective", recompute_grads=True)

  class MyStack(transformer.LayerStack):
    pass
  stack = transformer.make_layer_stack(layers, num_layers=2, layer_stack_cls=MyStack)
  assert isinstance(stack, MyStack) and stack.num_layers == 4
  mesh = mtf.Mesh(mtf.Graph(), "m")
  batch, length = mtf.Dimension("batch", 2), mtf.Dimension("length", 4)
  ids = mtf.zeros(mesh, [batch, length], tf.int32)
  context = transformer.Context(None, mesh, [batch], length, mtf.VariableDType(), inputs=ids,
                                num_microbatches=2)
  assert context.inputs is ids and context.encoder_inputs is None
  assert context.num_microbatches == 2


@pytest.mark.parametrize("layout", ["", "b:all", "a:all"])
def test_shift_without_wrap(layout):
  """Shifts that stay within a slice (also run with V1 TensorShapes by
  test_v1_tensorshape.py, where they once failed)."""
  def build(mesh):
    x = _x(mesh)
    return {"right": mtf.shift(x, 2, b_dim, wrap=False), "left": mtf.shift(x, -1, b_dim,
                                                                          wrap=False)}
  got = lower_and_run(build, "all:2", layout)
  right = np.zeros_like(X)
  right[:, 2:] = X[:, :-2]
  left = np.zeros_like(X)
  left[:, :-1] = X[:, 1:]
  assert_allclose(got["right"], right)
  assert_allclose(got["left"], left)


def test_unitransformer_sinusoid_positional_embedding_is_the_original_table():
  from mesh_tensorflow.transformer import transformer, transformer_layers
  stack = transformer.LayerStack([transformer_layers.DenseReluDense(hidden_size=8)])
  model = transformer.Unitransformer(stack, d_model=8, input_vocab_size=16,
                                     output_vocab_size=16, max_length=10,
                                     sinusoid_positional_embedding=True)
  batch, length = mtf.Dimension("batch", 2), mtf.Dimension("length", 6)

  def build(mesh):
    context = transformer.Context(model, mesh, [batch], length, mtf.VariableDType(),
                                  position=mtf.range(mesh, length, tf.int32),
                                  position_is_default=True)
    x = mtf.zeros(mesh, [batch, length, model.model_dim])
    return {"emb": model._position_embedding(context, x)}
  got = lower_and_run(build, "all:2", "d_model:all")
  angle = np.arange(6)[:, None] * np.exp(-np.log(1e4) / 3 * np.arange(4))
  assert_allclose(got["emb"], np.concatenate([np.sin(angle), np.cos(angle)], 1), atol=1e-5)
  with pytest.raises(ValueError, match="sinusoid_positional_embedding=True"):
    transformer.Unitransformer(stack, d_model=8, input_vocab_size=16, output_vocab_size=16,
                               positional_embedding="none", sinusoid_positional_embedding=True)


def test_mesh_impl_import_and_export_take_the_originals_argument_order():
  """A custom operation written against the original lowers with
  impl.import_tf_tensor(mtf_output, tf_value) and
  impl.export_to_tf_tensor(mtf_tensor, laid_out); ours are (value, shape)."""
  value = np.arange(8 * 4, dtype=np.float32).reshape(8, 4)

  class Doubled(mtf.Operation):
    def __init__(self, x):
      super().__init__([x], name="doubled")
      self._outputs = [mtf.Tensor(self, x.shape, x.dtype)]

    def lower(self, lowering):
      impl = lowering.mesh_impl(self)
      x = self.inputs[0]
      full = impl.export_to_tf_tensor(x, lowering.tensors[x])
      lowering.set_tensor_lowering(self.outputs[0],
                                   impl.import_tf_tensor(self.outputs[0], full * 2.0))

  def build(mesh):
    x = mtf.import_tf_tensor(mesh, value, "rows:8;cols:4")
    return {"y": Doubled(x).outputs[0]}
  for mesh_shape, layout in [("all:1", ""), ("r:2;c:4", "rows:r;cols:c")]:
    np.testing.assert_array_equal(lower_and_run(build, mesh_shape, layout)["y"], 2 * value)
