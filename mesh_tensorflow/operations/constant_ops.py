"""Constants and the import/export of TensorFlow tensors.

    >>> x = mtf.import_tf_tensor(mesh, tf_images, "batch:256;pixels:784")
    >>> ones = mtf.ones(mesh, "batch:256", dtype=tf.float32)
"""

from __future__ import annotations


import numpy as np
import tensorflow as tf

from mesh_tensorflow.core.graph import Mesh, Operation, Tensor
from mesh_tensorflow.lowering.mesh_impl import LaidOutTensor
from mesh_tensorflow.core.shapes import Shape, convert_to_shape


class ConstantOperation(Operation):
  """A constant; each processor builds only its own slice."""

  local_kernel = "constant"  # the kind of local work the cost model prices

  def __init__(self, mesh: Mesh, value, shape, dtype, name=None):
    # Validate before joining the graph: a failed constructor leaves no op.
    shape = convert_to_shape(shape)
    dtype = tf.as_dtype(dtype)
    arr = np.asarray(value)
    if arr.ndim and list(arr.shape) != shape.to_integer_list():
      raise ValueError(
          f"mtf.constant {name or 'constant'!r}: value has shape {list(arr.shape)} but "
          f"the mtf shape {shape} needs {shape.to_integer_list()}; pass a scalar or an "
          "array of the full shape.")
    super().__init__([], mesh=mesh, name=name or "constant")
    self._value = arr.astype(dtype.as_numpy_dtype) if arr.ndim else value
    self._outputs = [Tensor(self, shape, dtype)]

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    shape = self.outputs[0].shape
    dtype = self.outputs[0].dtype
    slice_shape = impl.slice_shape(shape)
    value = self._value
    if np.ndim(value) == 0:
      fn = lambda pnum, begin: tf.fill(slice_shape, tf.constant(value, dtype))
    else:
      def fn(pnum, begin):
        if all(isinstance(b, int) for b in begin):
          return tf.constant(value[tuple(
              slice(b, b + s) for b, s in zip(begin, slice_shape))], dtype)
        # SIMD lowering: the offsets are tensors of the one program.
        return tf.slice(tf.constant(value, dtype), tf.stack(begin), slice_shape)
    lowering.set_tensor_lowering(self.outputs[0], impl.make_slices(fn, shape))


def constant(mesh: Mesh, value, shape=None, dtype=tf.float32, name=None) -> Tensor:
  """A constant tensor from a scalar (filled) or an array of the full shape.

  Example:
    >>> c = mtf.constant(mesh, 0.5, "batch:8;hidden:4")
  """
  if shape is None:
    if np.ndim(value):
      raise ValueError(
          "mtf.constant: give a shape (e.g. 'batch:8') for a non-scalar value.")
    shape = Shape([])
  return ConstantOperation(mesh, value, shape, dtype, name=name).outputs[0]


def zeros(mesh: Mesh, shape, dtype=tf.float32, name=None) -> Tensor:
  return constant(mesh, 0, shape=shape, dtype=dtype, name=name or "zeros")


def ones(mesh: Mesh, shape, dtype=tf.float32, name=None) -> Tensor:
  return constant(mesh, 1, shape=shape, dtype=dtype, name=name or "ones")


def zeros_like(x: Tensor, name=None) -> Tensor:
  return zeros(x.mesh, x.shape, dtype=x.dtype, name=name)


def ones_like(x: Tensor, name=None) -> Tensor:
  return ones(x.mesh, x.shape, dtype=x.dtype, name=name)


def fill(mesh, shape, value, dtype=tf.float32, name=None) -> Tensor:
  return constant(mesh, value, shape=shape, dtype=dtype, name=name)


class ImportOperation(Operation):
  """Brings a TensorFlow tensor (full value) into the mtf graph."""

  local_kernel = "import"  # the kind of local work the cost model prices

  has_gradient = False

  def __init__(self, mesh: Mesh, tf_tensor, shape, name=None):
    # Validate before joining the graph: a failed constructor leaves no op.
    shape = convert_to_shape(shape)
    # A tf.Variable is read when the graph is lowered (every step), not now.
    source = tf_tensor if isinstance(tf_tensor, tf.Variable) else tf.convert_to_tensor(tf_tensor)
    static = source.shape
    if static.rank is not None and (static.rank != shape.ndims or any(
        s is not None and s != d.size for s, d in zip(static.as_list(), shape.dims))):
      raise ValueError(
          f"import_tf_tensor {name or 'import'!r}: TensorFlow tensor has shape "
          f"{static.as_list()} but the mtf shape {shape} needs "
          f"{shape.to_integer_list()}.")
    super().__init__([], mesh=mesh, name=name or "import")
    self._source = source
    self._outputs = [Tensor(self, shape, source.dtype)]

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    shape = self.outputs[0].shape
    value = lowering.imported_value(self._source, shape)
    lowering.set_tensor_lowering(self.outputs[0], impl.import_tf_tensor(value, shape))


def import_tf_tensor(mesh: Mesh, tf_tensor, shape=None, name=None) -> Tensor:
  """Imports a full TensorFlow tensor; each processor takes its own slice.

  Example:
    >>> x = mtf.import_tf_tensor(mesh, images, mtf.Shape([batch, pixels]))
  """
  if shape is None:
    raise ValueError(
        "import_tf_tensor: pass the mtf shape, e.g. 'batch:256;pixels:784'.")
  return ImportOperation(mesh, tf_tensor, shape, name=name).outputs[0]


def import_fully_replicated(mesh: Mesh, tf_tensor, shape, name=None) -> Tensor:
  """Imports a tensor whose full value is available wherever the program runs."""
  return import_tf_tensor(mesh, tf_tensor, shape, name=name or "import_fully_replicated")


class ImportLaidOutOperation(Operation):
  """Brings per-processor slices (already laid out) into the mtf graph."""

  def __init__(self, mesh: Mesh, laid_out_tensor, shape, name=None):
    super().__init__([], mesh=mesh, name=name or "import_laid_out")
    self._laid_out = laid_out_tensor
    self._outputs = [Tensor(self, convert_to_shape(shape),
                            _first_slice(laid_out_tensor).dtype)]

  def _unsplittable_dim_names(self):
    # The slices are given as they are: no layout may re-split them.
    return self._outputs[0].shape.dimension_names

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    laid = self._laid_out
    if not isinstance(laid, LaidOutTensor):
      laid = LaidOutTensor(list(getattr(laid, "tensor_list", laid)))
    if len(laid.tensor_list) != impl.num_local_slices:
      raise ValueError(
          f"import_laid_out_tensor {self.name!r}: got {len(laid.tensor_list)} slices "
          f"where this mesh implementation holds {impl.num_local_slices} per program "
          f"({impl.size} processors; the SIMD lowering takes this processor's slice only).")
    expected = impl.slice_shape(self.outputs[0].shape)
    for pnum, t in enumerate(laid.tensor_list):
      if t.shape.is_fully_defined() and t.shape.as_list() != expected:
        raise ValueError(
            f"import_laid_out_tensor {self.name!r}: slice {pnum} has shape "
            f"{t.shape.as_list()}, expected {expected} for {self.outputs[0].shape} "
            "under this layout.")
    lowering.set_tensor_lowering(self.outputs[0], laid)


def _first_slice(laid):
  if hasattr(laid, "tensor_list"):  # a LaidOutTensor, or any holder of slices
    return laid.tensor_list[0]
  if not isinstance(laid, (list, tuple)) or not laid:
    raise TypeError("import_laid_out_tensor: pass a LaidOutTensor or a list of slices.")
  return laid[0]


def import_laid_out_tensor(mesh: Mesh, laid_out_tensor, shape, name=None) -> Tensor:
  """Imports slices that are already laid out (one tf.Tensor per processor)."""
  return ImportLaidOutOperation(mesh, laid_out_tensor, shape, name=name).outputs[0]

from mesh_tensorflow.core import autograph_exempt as _autograph_exempt  # noqa: E402  pylint: disable=g-import-not-at-top
_autograph_exempt.exempt(globals())  # AutoGraph leaves this module's code alone
