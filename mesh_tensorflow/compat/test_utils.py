"""Helpers for testing layers: NumPy arrays in, NumPy arrays out, on a
single-processor mesh.

    >>> converter = NumpyConverter()
    >>> x = converter.convert_np_array_to_mtf_tensor(np.ones([2, 3]), ["batch", "d"],
    ...                                              dtype=tf.float32)
    >>> converter.convert_mtf_tensor_to_np_array(mtf.reduce_sum(x))
    6.0
    >>> lowering, tf_x = converter.convert_mtf_tensor_to_tf_tensor(x)

Works eagerly (TF2) and inside a `tf.compat.v1.Graph` (it then runs a
Session, initializing the variables the layers created).
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import tensorflow as tf

from mesh_tensorflow.core.graph import Graph, Mesh, Tensor
from mesh_tensorflow.core.shapes import Dimension, Shape
from mesh_tensorflow.compat.lowering import Lowering
from mesh_tensorflow.compat.placement_mesh_impl import PlacementMeshImpl
from mesh_tensorflow.operations.constant_ops import import_tf_tensor


class NumpyConverter:
  """Imports NumPy arrays into one mtf graph and exports its tensors back."""

  def __init__(self):
    self._graph = Graph()
    self._mesh = Mesh(self._graph, "mtf_mesh")
    self._mesh_impl = PlacementMeshImpl(
        shape=[], layout={}, devices=[""])
    self._session = None

  graph = property(lambda self: self._graph)
  mesh = property(lambda self: self._mesh)
  mesh_impl = property(lambda self: self._mesh_impl)

  def convert_np_array_to_mtf_tensor(self, x: np.ndarray, dim_names: Optional[Sequence[str]] = None,
                                     dtype=tf.int32) -> Tensor:
    """x as an mtf Tensor with dimensions `dim_names` (default dim0, dim1, ...).

    A tensor cannot have two dimensions of one name here. A name given twice
    (the original's tests build a kernel [d_model, d_model] for a layer whose
    output channels keep the input's name) names the last of those axes;
    the earlier ones get a "_" prefix ("_d_model"), the name this library's
    convolutions give such a kernel's input channels.
    """
    x = np.asarray(x)
    if dim_names is None:
      dim_names = [f"dim{i}" for i in range(x.ndim)]
    if len(dim_names) != x.ndim:
      raise ValueError(f"NumpyConverter: {len(dim_names)} dim_names for an array of rank "
                       f"{x.ndim}; give one name per axis.")
    dim_names = ["_" + n if n in dim_names[i + 1:] else n for i, n in enumerate(dim_names)]
    shape = Shape([Dimension(n, s) for n, s in zip(dim_names, x.shape)])
    return import_tf_tensor(self._mesh, tf.constant(x, dtype=dtype), shape)

  def convert_mtf_tensor_to_tf_tensor(self, mtf_tensor: Tensor):
    """(the lowering, the tensor's TensorFlow value): lowers the graph, as the
    original's converter did (`_, tf_x = convert_mtf_tensor_to_tf_tensor(x)`)."""
    lowering = Lowering(self._graph, {self._mesh: self._mesh_impl})
    return lowering, lowering.export_to_tf_tensor(mtf_tensor)

  def convert_mtf_tensor_to_np_array(self, mtf_tensor: Tensor) -> np.ndarray:
    """Lowers the graph and returns the tensor's value as a NumPy array."""
    _, value = self.convert_mtf_tensor_to_tf_tensor(mtf_tensor)
    if tf.executing_eagerly():
      return value.numpy()
    session = self.session
    session.run(tf.compat.v1.global_variables_initializer())
    return session.run(value)

  @property
  def session(self) -> tf.compat.v1.Session:
    """A Session on the current default graph (graph mode), made on first use."""
    if self._session is None or self._session.graph is not tf.compat.v1.get_default_graph():
      self._session = tf.compat.v1.Session()
    return self._session
