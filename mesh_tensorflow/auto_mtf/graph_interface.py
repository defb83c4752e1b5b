"""One view of an mtf.Graph or a tf.Graph for the layout tools
(`GraphInterface`): operations and tensors by name, tensor sizes
under a partial layout, final tensors, a `CostGraphDef`, and the tensors in
memory while a schedule runs.

    >>> graph = GraphInterface(mtf_graph)
    >>> graph.set_tensor_final(loss.name)
    >>> schedule = scheduler.minimize_peak_memory(graph, "LIST")
    >>> contents = graph.compute_memory_contents_under_schedule(schedule)
"""

from __future__ import annotations

import collections
import math
from typing import Dict, FrozenSet, Iterator, List, Optional, Sequence, Set, Tuple

import tensorflow as tf

from mesh_tensorflow.core.graph import Graph as MtfGraph
from mesh_tensorflow.core.graph import Operation as MtfOperation
from mesh_tensorflow.core.graph import Tensor as MtfTensor


def new_cost_graph_def():
  """An empty `CostGraphDef` protocol buffer (TensorFlow's cost_graph.proto),
  the type of `tf.compat.v1.RunMetadata().cost_graph`."""
  return type(tf.compat.v1.RunMetadata().cost_graph)()


class GraphInterface:
  """The operations and tensors of an mtf.Graph or tf.Graph, by name.

  Args:
    graph: an mtf.Graph or a tf.Graph.
    canonical_device: the device `is_tensor_on_canonical_device` compares
      with (tensors without a device, such as every mtf tensor, are on all).

  Example:
    >>> graph = GraphInterface(mtf_graph)
    >>> for op_name in graph.get_all_operation_names():
    ...   print(op_name, list(graph.get_operation_output_names(op_name)))
  """

  def __init__(self, graph, canonical_device: Optional[str] = None):
    if isinstance(graph, MtfGraph):
      operations = list(graph.operations)
    elif isinstance(graph, tf.Graph):
      operations = list(graph.get_operations())
    else:
      raise TypeError(f"GraphInterface: expected an mtf.Graph or a tf.Graph, got "
                      f"{type(graph).__name__}.")
    self._graph = graph
    self.canonical_device = canonical_device
    self._operations = operations
    self._operation_name_to_id = {op.name: i for i, op in enumerate(operations)}
    self._tensor_name_to_ids: Dict[str, Tuple[int, int]] = {}
    for i, op in enumerate(operations):
      for j, t in enumerate(op.outputs):
        self._tensor_name_to_ids[t.name] = (i, j)
    self._final_tensors: Set[str] = set()

  # ---- operations
  def get_num_operations(self) -> int:
    """The number of operations."""
    return len(self._operations)

  def get_all_operation_names(self) -> Iterator[str]:
    """The operations' names, in graph order."""
    for op in self._operations:
      yield op.name

  def get_operation_input_names(self, operation_name: str) -> Iterator[str]:
    """The names of an operation's input tensors, in order."""
    for t in self._operation(operation_name).inputs:
      yield t.name

  def get_operation_output_names(self, operation_name: str) -> Iterator[str]:
    """The names of an operation's output tensors, in order."""
    for t in self._operation(operation_name).outputs:
      yield t.name

  def get_operation_device(self, operation_name: str) -> Optional[str]:
    """The device of a tf operation; None for an mtf operation."""
    op = self._operation(operation_name)
    return None if isinstance(op, MtfOperation) else op.device

  def get_operation_mtf_dimension_names(self, operation_name: str) -> Set[str]:
    """The mtf dimension names of an operation's inputs and outputs."""
    names: Set[str] = set()
    for t in list(self.get_operation_input_names(operation_name)) + list(
        self.get_operation_output_names(operation_name)):
      names.update(self.get_tensor_mtf_dimension_names(t))
    return names

  # ---- tensors
  def get_all_tensor_names(self) -> Iterator[str]:
    """The names of every operation's outputs, in graph order."""
    for op in self._operations:
      for t in op.outputs:
        yield t.name

  def get_tensor_dtype(self, tensor_name: str) -> tf.DType:
    return self._tensor(tensor_name).dtype

  def get_tensor_shape(self, tensor_name: str) -> tf.TensorShape:
    t = self._tensor(tensor_name)
    if isinstance(t, MtfTensor):
      return tf.TensorShape(t.shape.to_integer_list)
    return t.shape

  def get_tensor_num_entries(self, tensor_name: str, partial_layout: Optional[Dict[str, str]] = None,
                             mesh_dimension_to_size: Optional[Dict[str, int]] = None) -> int:
    """The number of entries of a tensor, or of its slice on one processor
    when `partial_layout` ({mtf dimension name: mesh dimension name}) and
    `mesh_dimension_to_size` ({mesh dimension name: size}) are given.

    Example:
      >>> graph.get_tensor_num_entries("X:0", {"a": "m1"}, {"m1": 2})
    """
    shape = self.get_tensor_shape(tensor_name)
    if not shape.is_fully_defined():
      raise ValueError(f"GraphInterface: tensor {tensor_name!r} has shape {shape}, which is "
                       "not fully defined.")
    n = 1
    for size in shape.as_list():
      n *= size
    if not partial_layout:
      return n
    if mesh_dimension_to_size is None:
      raise ValueError("GraphInterface: a partial_layout needs mesh_dimension_to_size.")
    for name in self.get_tensor_mtf_dimension_names(tensor_name):
      if name in partial_layout:
        mesh_name = partial_layout[name]
        if mesh_name not in mesh_dimension_to_size:
          raise ValueError(f"GraphInterface: the layout puts {name!r} on mesh dimension "
                           f"{mesh_name!r}, which mesh_dimension_to_size lacks.")
        n = int(math.ceil(n / mesh_dimension_to_size[mesh_name]))
    return n

  def get_tensor_size(self, tensor_name: str, partial_layout: Optional[Dict[str, str]] = None,
                      mesh_dimension_to_size: Optional[Dict[str, int]] = None) -> int:
    """Bytes of a tensor (of its slice on one processor under a partial layout)."""
    return self.get_tensor_dtype(tensor_name).size * self.get_tensor_num_entries(
        tensor_name, partial_layout, mesh_dimension_to_size)

  def get_tensor_device(self, tensor_name: str) -> Optional[str]:
    """The device of a tf tensor; None for an mtf tensor."""
    t = self._tensor(tensor_name)
    return None if isinstance(t, MtfTensor) else t.device

  def is_tensor_on_canonical_device(self, tensor_name: str) -> bool:
    """Whether the tensor is on the canonical device (one without a device is
    on every device)."""
    device = self.get_tensor_device(tensor_name)
    return not device or device == self.canonical_device

  def get_tensor_mtf_dimension_names(self, tensor_name: str) -> List[str]:
    """The mtf dimension names of a tensor ([] for a tf tensor)."""
    t = self._tensor(tensor_name)
    return list(t.shape.dimension_names) if isinstance(t, MtfTensor) else []

  def set_tensor_final(self, tensor_name: str) -> None:
    """Marks a tensor as an output of the computation (kept in memory)."""
    self._tensor(tensor_name)  # checks the name
    self._final_tensors.add(tensor_name)

  def is_tensor_final(self, tensor_name: str) -> bool:
    self._tensor(tensor_name)
    return tensor_name in self._final_tensors

  # ---- whole-graph views
  def compute_cost_graph(self, devices: Optional[Sequence[str]] = None):
    """A `CostGraphDef` with one node per operation: inputs as (preceding
    node, port), outputs with size, dtype and shape; nodes with a final
    output are final. With `devices`, outputs of tf tensors on other devices
    count zero bytes (and no shape).

    Example:
      >>> cost_graph = graph.compute_cost_graph()
      >>> [node.name for node in cost_graph.node]
    """
    cost_graph = new_cost_graph_def()
    for i, op_name in enumerate(self.get_all_operation_names()):
      node = cost_graph.node.add(name=op_name, device=self.get_operation_device(op_name) or "",
                                 id=i)
      for input_name in self.get_operation_input_names(op_name):
        op_id, port = self._tensor_name_to_ids[input_name]
        node.input_info.add(preceding_node=op_id, preceding_port=port)
      for output_name in self.get_operation_output_names(op_name):
        device = self.get_tensor_device(output_name)
        dtype = self.get_tensor_dtype(output_name).as_datatype_enum
        if devices is None or device is None or device in devices:
          node.output_info.add(size=self.get_tensor_size(output_name), alias_input_port=-1,
                               dtype=dtype,
                               shape=self.get_tensor_shape(output_name).as_proto())
        else:
          node.output_info.add(size=0, alias_input_port=-1, dtype=dtype)
        if self.is_tensor_final(output_name):
          node.is_final = True
    return cost_graph

  def compute_memory_contents_under_schedule(self, schedule: Sequence[int]
                                             ) -> List[FrozenSet[str]]:
    """The tensors in memory while each operation of `schedule` (operation
    indices, a topological order) runs: its outputs and every earlier tensor
    still needed later or final.

    Example:
      >>> graph.compute_memory_contents_under_schedule([0, 1, 2])
      [frozenset({'X:0'}), frozenset({'X:0', 'Y:0'}), frozenset({'X:0', 'Y:0', 'Z:0'})]
    """
    remaining_uses = self._compute_initial_out_degree()
    in_memory: Set[str] = set()
    contents = []
    for op_id in schedule:
      op_name = self._operations[op_id].name
      outputs = list(self.get_operation_output_names(op_name))
      in_memory.update(outputs)
      contents.append(frozenset(in_memory))
      for name in outputs:
        if remaining_uses[name] == 0:
          in_memory.discard(name)
      for name in self.get_operation_input_names(op_name):
        remaining_uses[name] -= 1
        if remaining_uses[name] == 0:
          in_memory.discard(name)
    return contents

  # ---- helpers
  def _compute_initial_out_degree(self) -> Dict[str, int]:
    """{tensor name: number of uses}, plus one for a final tensor (never freed)."""
    uses: Dict[str, int] = collections.defaultdict(int)
    for name in self._final_tensors:
      uses[name] = 1
    for op_name in self.get_all_operation_names():
      for name in self.get_operation_input_names(op_name):
        uses[name] += 1
    return uses

  def _operation(self, operation_name: str):
    if operation_name not in self._operation_name_to_id:
      raise KeyError(f"GraphInterface: no operation named {operation_name!r}.")
    return self._operations[self._operation_name_to_id[operation_name]]

  def _tensor(self, tensor_name: str):
    if tensor_name not in self._tensor_name_to_ids:
      raise KeyError(f"GraphInterface: no tensor named {tensor_name!r}.")
    op_id, port = self._tensor_name_to_ids[tensor_name]
    return self._operations[op_id].outputs[port]
