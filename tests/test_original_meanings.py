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
