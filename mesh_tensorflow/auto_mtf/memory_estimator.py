"""The inputs of the layout optimizer for one graph and mesh
(`MemoryEstimator`): a `LayoutValidator` and a `GraphInterface`
whose final tensors are the computation's outputs. Memory is estimated from
the sizes of the mtf tensors, without lowering the graph.

    >>> estimator = MemoryEstimator(mtf_graph, "m1:4;m2:2", [loss])
    >>> optimizer = layout_optimizer.LayoutOptimizer(estimator)
"""

from __future__ import annotations

from typing import Iterable, Optional

from mesh_tensorflow.auto_mtf import graph_interface
from mesh_tensorflow.auto_mtf import valid_layouts
from mesh_tensorflow.core.shapes import convert_to_shape


class MemoryEstimator:
  """Estimates the memory of an mtf graph from the sizes of its tensors.

  Args:
    mtf_graph: an mtf.Graph.
    mesh_shape: an mtf.Shape (or its string).
    mtf_outputs: the computation's outputs (mtf Tensors), kept in memory.

  Example:
    >>> estimator = MemoryEstimator(mtf_graph, "m1:4;m2:2", [loss])
    >>> estimator.get_layout_validator().splittable_mtf_dimension_names
  """

  def __init__(self, mtf_graph, mesh_shape, mtf_outputs: Iterable = ()):
    self.mtf_graph = mtf_graph
    self.mesh_shape = convert_to_shape(mesh_shape)
    self.mtf_outputs = list(mtf_outputs)
    self._layout_validator: Optional[valid_layouts.LayoutValidator] = None
    self._graph_interface: Optional[graph_interface.GraphInterface] = None

  def get_layout_validator(self) -> valid_layouts.LayoutValidator:
    if self._layout_validator is None:
      self._layout_validator = valid_layouts.LayoutValidator(self.mtf_graph, self.mesh_shape)
    return self._layout_validator

  def get_graph_interface(self) -> graph_interface.GraphInterface:
    if self._graph_interface is None:
      graph = graph_interface.GraphInterface(self.mtf_graph)
      for t in self.mtf_outputs:
        graph.set_tensor_final(t.name)
      self._graph_interface = graph
    return self._graph_interface
