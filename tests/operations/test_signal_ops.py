"""mtf.signal_ops.fft3d / ifft3d: NumPy's 3-D FFT, transposed as the original's,
under layouts that split the transformed dimensions; asking for gradients
through them is a clear error (mtf has no complex gradients)."""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mtf_test_utils import DEVICES, lower_and_run

rng = np.random.RandomState(0)
FIELD = (rng.randn(2, 4, 4, 8) + 1j * rng.randn(2, 4, 4, 8)).astype(np.complex64)
batch, x_dim, y_dim, z_dim = (mtf.Dimension("batch", 2), mtf.Dimension("x", 4),
                              mtf.Dimension("y", 4), mtf.Dimension("z", 8))
kx, ky, kz = mtf.Dimension("kx", 4), mtf.Dimension("ky", 4), mtf.Dimension("kz", 8)


def _build(mesh):
  field = mtf.import_tf_tensor(mesh, FIELD, [batch, x_dim, y_dim, z_dim])
  spectrum = mtf.signal_ops.fft3d(field, [kx, ky, kz])
  back = mtf.signal_ops.ifft3d(spectrum, [x_dim, y_dim, z_dim])
  return {"spectrum": spectrum, "back": back}


@pytest.mark.parametrize("mesh_shape,layout", [
    ("all:1", ""), ("rows:2;cols:4", "x:rows;z:cols;kx:rows;kz:cols"),
    ("rows:2;cols:2", "y:rows;batch:cols;kx:rows")])
def test_fft3d_is_numpys_transposed_and_ifft3d_inverts_it(mesh_shape, layout):
  got = lower_and_run(_build, mesh_shape, layout, DEVICES[:mtf.convert_to_shape(mesh_shape).size])
  expected = np.transpose(np.fft.fftn(FIELD, axes=(1, 2, 3)), (0, 2, 3, 1))
  np.testing.assert_allclose(got["spectrum"], expected, rtol=1e-4, atol=1e-3)
  np.testing.assert_allclose(got["back"], FIELD, rtol=1e-4, atol=1e-4)
  assert got["spectrum"].dtype == np.complex64


def test_bad_inputs():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  real = mtf.zeros(mesh, [batch, x_dim, y_dim, z_dim])
  with pytest.raises(ValueError, match="need complex64 or complex128"):
    mtf.signal_ops.fft3d(real, [kx, ky, kz])
  field = mtf.cast(real, tf.complex64)
  with pytest.raises(ValueError, match="must have the size of"):
    mtf.signal_ops.fft3d(field, [kx, ky, mtf.Dimension("kz", 4)])
  with pytest.raises(ValueError, match="give 3 dimensions"):
    mtf.signal_ops.fft3d(field, [kx, ky])
  spectrum = mtf.signal_ops.fft3d(field, [kx, ky, kz])
  with pytest.raises(ValueError, match="complex64; mtf differentiates with respect to real"):
    mtf.gradients([mtf.reduce_sum(mtf.cast(spectrum, tf.float32))], [field])
