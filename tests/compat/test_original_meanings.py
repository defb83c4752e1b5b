"""Names ported from the original Mesh TensorFlow keep the original's meaning:
units, totals vs per-processor numbers, argument and return order."""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf

import mtf_test_utils


@pytest.mark.parametrize("mesh_shape,layout,slice_elems", [
    ("all:8", "", 32),              # replicated: every processor holds all 32
    ("all:8", "batch:all", 4),
    ("rows:2;cols:4", "batch:rows;d:cols", 4),
    ("rows:2;cols:4", "batch:rows", 16),
])
def test_laid_out_size_is_the_total_over_all_slices(mesh_shape, layout, slice_elems):
  impl = mtf_test_utils.make_impl(mesh_shape, layout)
  shape = mtf.convert_to_shape("batch:8;d:4")
  assert impl.slice_size(shape) == slice_elems
  assert impl.laid_out_size(shape) == slice_elems * 8
  assert impl.laid_out_size(shape) == impl.slice_size(shape) * impl.size


def test_lowering_laid_out_size_agrees_with_the_mesh_impl():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.zeros(mesh, "batch:8;d:4")
  impl = mtf_test_utils.make_impl("rows:2;cols:4", "batch:rows;d:cols")
  lowering = mtf.Lowering(graph, {mesh: impl})
  assert lowering.laid_out_size(x) == impl.laid_out_size(x.shape) == 32


def test_simd_laid_out_size_is_the_total_over_all_slices():
  impl = mtf.simd_mesh_impl.SimdMeshImpl("rows:2;cols:4", "batch:rows",
                                         mtf_test_utils.DEVICES)
  assert impl.laid_out_size("batch:8;d:4") == 16 * 8


@pytest.mark.parametrize("mesh_shape,layout", [("all:1", ""), ("rows:2;cols:4", "b:rows;c:cols")])
def test_batch_norm_default_epsilon_is_the_originals(mesh_shape, layout):
  # A variance of 1e-4: an epsilon of 1e-3 would shrink the output ~3.3x.
  x_np = (np.random.RandomState(0).randn(8, 4) * 1e-2).astype(np.float32)
  b, c = mtf.Dimension("b", 8), mtf.Dimension("c", 4)

  def build(mesh):
    x = mtf.import_tf_tensor(mesh, tf.constant(x_np), [b, c])
    y, _ = mtf.layers.batch_norm(x, True, dims_idx_start=0, dims_idx_end=1)
    return {"y": y}
  got = mtf_test_utils.lower_and_run(build, mesh_shape, layout)["y"]
  mean, var = x_np.mean(0), x_np.var(0)
  np.testing.assert_allclose(got, (x_np - mean) / np.sqrt(var + 1e-9), rtol=1e-3, atol=1e-3)
  assert np.allclose(got.std(0), 1.0, atol=1e-3)


def test_simd_bfloat16_allreduce_group_size_default_is_the_originals():
  import inspect  # pylint: disable=g-import-not-at-top
  params = inspect.signature(mtf.simd_mesh_impl.SimdMeshImpl).parameters
  assert params["allreduce_in_bfloat16_max_group_size"].default == 8
