"""Placement lowering: each processor's slice is computed on its own device.

Every mtf op becomes one TensorFlow op per device, each under `tf.device`.
Collectives either combine slices directly (on CPU, where logical devices share
memory, this is the fastest) or use TensorFlow's collective ops (NCCL on GPU).

Example:
    >>> impl = PlacementMeshImpl("rows:2;cols:4", "batch:rows;hidden:cols",
    ...                          ["cpu:%d" % i for i in range(8)])
"""

from __future__ import annotations

import functools
import itertools
from typing import Callable, Sequence

import tensorflow as tf

from mesh_tensorflow.lowering import sharing
from mesh_tensorflow.lowering.collective_keys import placement_group_key
from mesh_tensorflow.lowering.mesh_impl import (LaidOutTensor, MeshImpl, as_laid_out, graph_cache,
                                      int_constant)
from mesh_tensorflow.core.shapes import convert_to_shape

_COLLECTIVE_CHOICES = ("auto", "direct", "collective")
COMMUNICATION_CHOICES = ("auto", "ring", "nccl")

_instance_counter = itertools.count(1)


def _normalize_device(d: str) -> str:
  if d is None or d == "":
    return ""
  try:
    return tf.DeviceSpec.from_string(d).to_string()
  except ValueError as e:
    raise ValueError(f"Invalid device string {d!r}: {e}") from None


class PlacementMeshImpl(MeshImpl):
  """Mesh implementation that places each processor on its own device.

  Args:
    shape: mesh shape, e.g. "rows:2;cols:4" or a list of Dimensions.
    layout: layout rules, e.g. "batch:rows;hidden:cols".
    devices: one device string per processor, in pnum (row-major) order, e.g.
      ["cpu:0", ..., "cpu:7"], ["/device:GPU:0", ...] or
      ["/job:worker/task:1/device:CPU:0", ...]. "" means TensorFlow's default.
    collectives: "direct" combines slices with ordinary ops (add_n, concat) on
      the devices; "collective" uses TensorFlow collective ops for allreduce
      (NCCL on GPU) when lowering into a graph (a tf.function), and combines
      directly when lowering eagerly; "auto" picks "collective" when all devices are GPUs and
      "direct" otherwise (measured fastest on CPU, see benchmarks/).
    share_replicas: when all devices share one memory (CPU devices of one
      process), processors holding identical slices (replicated along some mesh
      dimension) share one TensorFlow tensor or variable instead of each
      computing and storing a copy. Same results, less work and memory. "auto"
      enables it exactly in that case.
    collective_timeout: seconds after which a collective op whose peers never
      arrive fails with an error instead of waiting forever; 0 (the default)
      waits forever. TensorFlow keeps a thread alive per collective execution
      for the whole timeout (measured: 2 per collective per device), so a
      long timeout with many collectives per step piles up threads.
    communication: how TensorFlow's collective ops communicate: "auto"
      (NCCL on GPU when available), "nccl", or "ring" (needed for logical
      GPUs carved out of one physical GPU, where NCCL cannot run one rank
      per logical device).

  Example:
    >>> impl = mtf.placement_mesh_impl.PlacementMeshImpl(
    ...     "all:8", "batch:all", ["cpu:%d" % i for i in range(8)])
  """

  def __init__(self, shape, layout, devices: Sequence[str], collectives: str = "auto",
               share_replicas="auto", collective_timeout: float = 0.0,
               communication: str = "auto"):
    super().__init__(shape, layout)
    devices = list(devices)
    if len(devices) != self.size:
      raise ValueError(
          f"PlacementMeshImpl: mesh shape '{self.shape.to_string()}' has "
          f"{self.size} processors but {len(devices)} devices were given. Pass "
          f"exactly one device per processor (e.g. ['cpu:%d' % i for i in "
          f"range({self.size})]).")
    self._devices = [_normalize_device(d) for d in devices]
    if collectives not in _COLLECTIVE_CHOICES:
      raise ValueError(
          f"PlacementMeshImpl: collectives={collectives!r}; choose one of "
          f"{_COLLECTIVE_CHOICES}.")
    if collectives == "auto":
      all_gpu = self._devices and all(
          (tf.DeviceSpec.from_string(d).device_type or "").upper() == "GPU"
          for d in self._devices)
      collectives = "collective" if all_gpu and self.size > 1 else "direct"
    if communication not in COMMUNICATION_CHOICES:
      raise ValueError(
          f"PlacementMeshImpl: communication={communication!r}; choose one of "
          f"{COMMUNICATION_CHOICES}.")
    self._communication = communication
    self._collectives = collectives
    self._collective_timeout = float(collective_timeout)
    if share_replicas == "auto":
      share_replicas = _all_cpus_of_one_process(self._devices)
    self._share = bool(share_replicas) and collectives == "direct"

  devices = property(lambda self: list(self._devices))
  collectives = property(lambda self: self._collectives)
  shares_replicas = property(lambda self: self._share)

  def variable_device(self, pnum: int) -> str:
    return self._devices[pnum]

  @property
  def host_device(self) -> str:
    return self._devices[0]

  # ---- computation ---------------------------------------------------------
  def slicewise(self, fn: Callable, *inputs):
    """Applies fn to each processor's slices, on that processor's device.

    Inputs may be LaidOutTensors (or lazy sums) or plain values shared by all.
    Returns a LaidOutTensor, or a tuple of them if fn returns a tuple.
    """
    inputs = [as_laid_out(x) for x in inputs]
    args_of = [[x.tensor_list[pnum] if isinstance(x, LaidOutTensor) else x for x in inputs]
               for pnum in range(self.size)]

    def run(pnum):
      with _on_device(self._devices[pnum]):
        return fn(*args_of[pnum])
    results = sharing.per_processor([tuple(id(a) for a in args) for args in args_of],
                                    self._share, run)
    if isinstance(results[0], (tuple, list)):
      return tuple(LaidOutTensor(list(r)) for r in zip(*results))
    return LaidOutTensor(results)

  def make_slices(self, fn, shape) -> LaidOutTensor:
    """fn(pnum, slice_begin) on each device; with shared replicas, fn must
    depend on pnum only through slice_begin."""
    begins = [self.slice_begin(shape, pnum) for pnum in range(self.size)]

    def make(pnum):
      with _on_device(self._devices[pnum]):
        return fn(pnum, begins[pnum])
    return LaidOutTensor(sharing.per_processor([tuple(b) for b in begins], self._share, make))

  def laid_out_pnum(self) -> LaidOutTensor:
    out = []
    for pnum, device in enumerate(self._devices):
      with _on_device(device):
        out.append(tf.constant(pnum, tf.int32))
    return LaidOutTensor(out)

  # ---- collectives ---------------------------------------------------------
  def allreduce(self, x, mesh_axes, reduction_fn_string: str) -> LaidOutTensor:
    x = as_laid_out(x)
    mesh_axes = [a for a in mesh_axes if self.mesh_axis_size(a) > 1]
    if not mesh_axes:
      return x
    self.record_collective("allreduce", x, mesh_axes)
    out = [None] * self.size
    for group in self.processor_groups(mesh_axes):
      slices = [x.tensor_list[p] for p in group]
      # Collective ops run only in graphs (tf.function, tf.compat.v1): eagerly,
      # each member would wait for the others forever.
      if (self._collectives == "collective" and reduction_fn_string in ("SUM", "MAX", "MIN")
          and not tf.executing_eagerly()):
        merge = {"SUM": "Add", "MAX": "Max", "MIN": "Min"}[reduction_fn_string]
        gkey = placement_group_key([self._devices[p] for p in group])
        ikey = next(_instance_counter)
        reduced = []
        for p, s in zip(group, slices):
          # Each device launches its collectives in one global order, so no two
          # devices can wait on each other's later collective.
          previous = self._last_collective(p)
          with _on_device(self._devices[p]), tf.control_dependencies(previous):
            reduced.append(tf.raw_ops.CollectiveReduce(
                input=s, group_size=len(group), group_key=gkey, instance_key=ikey,
                merge_op=merge, final_op="Id", subdiv_offsets=[0],
                communication_hint=self._communication,
                timeout_seconds=self._collective_timeout))
          self._set_last_collective(p, reduced[-1])
        # Every member must run, or those that do wait forever: using any one
        # result (e.g. only processor 0's, when exporting) runs the group.
        for p, r in zip(group, reduced):
          with _on_device(self._devices[p]), tf.control_dependencies(reduced):
            out[p] = tf.identity(r)
      else:
        maker, copies = sharing.group_result(group, self._share)
        with _on_device(self._devices[maker]):
          total = reduce_n(slices, reduction_fn_string)
        for p in group:
          out[p] = _identity_on(self._devices[p], total) if copies else total
    return LaidOutTensor(out)

  def _last_collective(self, pnum: int):
    cache = graph_cache(tf.compat.v1.get_default_graph())
    last = cache.get(("last collective", id(self), pnum))
    return [] if last is None else [last]

  def _set_last_collective(self, pnum: int, op) -> None:
    graph_cache(tf.compat.v1.get_default_graph())[("last collective", id(self), pnum)] = op

  def allconcat(self, x, mesh_axis: int, concat_axis: int) -> LaidOutTensor:
    x, n = self.begin_collective("allgather", x, mesh_axis)
    if n == 1:
      return x
    out = [None] * self.size
    for group in self.processor_groups([mesh_axis]):
      maker, copies = sharing.group_result(group, self._share)
      full = self._whole_of([x.tensor_list[p] for p in group], mesh_axis, concat_axis)
      if full is None:
        with _on_device(self._devices[maker]):
          full = tf.concat([x.tensor_list[p] for p in group], axis=int_constant(concat_axis))
      for p in group:
        out[p] = _identity_on(self._devices[p], full) if copies else full
    return LaidOutTensor(out)

  def alltoall(self, x, mesh_axis: int, split_axis: int, concat_axis: int) -> LaidOutTensor:
    x, n = self.begin_collective("alltoall", x, mesh_axis)
    if n == 1:
      return x
    out = [None] * self.size
    for group in self.processor_groups([mesh_axis]):
      parts = []
      for p in group:
        with _on_device(self._devices[p]):
          parts.append(tf.split(x.tensor_list[p], n, axis=split_axis))
      for j, p in enumerate(group):
        with _on_device(self._devices[p]):
          out[p] = tf.concat([parts[i][j] for i in range(n)], axis=concat_axis)
    return LaidOutTensor(out)

  def receive(self, x, mesh_axis: int, source_pcoord) -> LaidOutTensor:
    x = as_laid_out(x)
    self.record_collective("permute", x, [mesh_axis])
    out = []
    for pnum, device in enumerate(self._devices):
      coords = self.pnum_to_processor_coordinates(pnum)
      src = source_pcoord[coords[mesh_axis]]
      if src is None:
        with _on_device(device):
          out.append(tf.zeros_like(x.tensor_list[pnum]))
      else:
        coords[mesh_axis] = src
        t = x.tensor_list[self.processor_coordinates_to_pnum(coords)]
        out.append(t if sharing.holds_source(self._share) else _identity_on(device, t))
    return LaidOutTensor(out)

  def slice_along(self, x, mesh_axis: int, tensor_axis: int) -> LaidOutTensor:
    x = as_laid_out(x)
    n = self.mesh_axis_size(mesh_axis)
    if n == 1:
      return x
    coordinate = [self.pnum_to_processor_coordinates(p)[mesh_axis] for p in range(self.size)]

    def take(pnum):
      t, c = x.tensor_list[pnum], coordinate[pnum]
      with _on_device(self._devices[pnum]):
        block = _take_block(t, tensor_axis, c, n)
      self._note_block(block, t, mesh_axis, tensor_axis, c)
      return block
    return LaidOutTensor(sharing.per_processor(
        [(id(t), c) for t, c in zip(x.tensor_list, coordinate)], self._share, take))

  def _block_registry(self):
    """The block records of the graph being built (None: not sharing, or eager).

    With shared memory, they say which slices are blocks of one whole tensor
    (imports, slice_along), so that concatenating them back is that tensor, not
    a copy.
    """
    if not self._share or tf.executing_eagerly():
      return None
    return graph_cache(tf.compat.v1.get_default_graph()).setdefault(("blocks", id(self)), {})

  def _note_block(self, block, whole, mesh_axis: int, tensor_axis: int, index: int) -> None:
    registry = self._block_registry()
    if registry is not None:
      registry[block.ref()] = (whole, mesh_axis, tensor_axis, index)

  def gathers_without_copy(self, x, mesh_axis: int, concat_axis: int) -> bool:
    """Whether allconcat(x, mesh_axis, concat_axis) returns tensors that
    already exist (x's slices are the blocks of imported or sliced tensors)."""
    x = as_laid_out(x)
    return all(
        self._whole_of([x.tensor_list[p] for p in group], mesh_axis, concat_axis) is not None
        for group in self.processor_groups([mesh_axis]))

  def _whole_of(self, slices, mesh_axis: int, concat_axis: int):
    """The tensor whose blocks 0..n-1 along concat_axis (split on mesh_axis)
    are `slices`, in order, or None."""
    registry = self._block_registry()
    if registry is None:
      return None
    return sharing.whole_of([registry.get(t.ref()) for t in slices], mesh_axis, concat_axis)

  # ---- import / export -----------------------------------------------------
  def import_tf_tensor(self, x, shape) -> LaidOutTensor:
    slice_shape = self.slice_shape(shape)
    full = convert_to_shape(shape).to_integer_list()
    if slice_shape == full:
      return self.slicewise(tf.identity, LaidOutTensor([x] * self.size))
    laid = self.make_slices(lambda pnum, begin: _slice(x, begin, slice_shape), shape)
    layout = tuple(self.tensor_layout(shape))
    if sharing.blocks_of_one_tensor(layout):  # each slice is one block of x along one mesh axis
      [(mesh_axis, tensor_axis)] = [(m, t) for t, m in enumerate(layout) if m is not None]
      for pnum, block in enumerate(laid.tensor_list):
        index = self.pnum_to_processor_coordinates(pnum)[mesh_axis]
        self._note_block(block, x, mesh_axis, tensor_axis, index)
    return laid

  def export_to_tf_tensor(self, x, shape) -> tf.Tensor:
    x = as_laid_out(x)
    layout = self.tensor_layout(shape)
    if layout.is_fully_replicated:
      return x.tensor_list[0]
    # Concatenate the slices along each split mesh axis, last mesh axis first.
    mesh_to_tensor = layout.mesh_axis_to_tensor_axis(self.ndims)
    blocks = {}
    for pnum in range(self.size):
      coords = self.pnum_to_processor_coordinates(pnum)
      if all(c == 0 for a, c in enumerate(coords) if mesh_to_tensor[a] is None):
        blocks[tuple(c if mesh_to_tensor[a] is not None else 0
                     for a, c in enumerate(coords))] = x.tensor_list[pnum]
    with _on_device(self.host_device):
      for mesh_axis in reversed(range(self.ndims)):
        t_axis = mesh_to_tensor[mesh_axis]
        if t_axis is None:
          continue
        merged = {}
        for key in sorted(blocks):
          if key[mesh_axis] != 0:
            continue
          parts = []
          for c in range(self.mesh_axis_size(mesh_axis)):
            k = list(key)
            k[mesh_axis] = c
            parts.append(blocks[tuple(k)])
          merged[key] = tf.concat(parts, axis=t_axis)
        blocks = merged
      (result,) = blocks.values()
      return tf.identity(result)


def _on_device(device: str):
  """Places the ops created in its scope on `device`, like `tf.device`.

  While a graph is built (tf.function, tf.compat.v1), this enters the graph's
  own device scope: `tf.device` there also builds a new decorated context
  manager and sets the eager context's device on every call, which made it a
  tenth of the time of lowering a large mesh. Ops get the same device.
  """
  if tf.executing_eagerly():
    return tf.device(device)
  return tf.compat.v1.get_default_graph().device(device)


def _all_cpus_of_one_process(devices) -> bool:
  specs = [tf.DeviceSpec.from_string(d) for d in devices]
  if not specs or any((s.device_type or "").upper() != "CPU" for s in specs):
    return False
  return len({(s.job, s.replica, s.task) for s in specs}) == 1


def _identity_on(device, t):
  with _on_device(device):
    return tf.identity(t)


def _unique(tensors):
  seen, out = set(), []
  for t in tensors:
    if id(t) not in seen:
      seen.add(id(t))
      out.append(t)
  return out


def _take_block(t: tf.Tensor, axis: int, index: int, num_blocks: int) -> tf.Tensor:
  size = t.shape.as_list()[axis] // num_blocks
  begin = [0] * t.shape.rank
  sizes = [-1] * t.shape.rank
  begin[axis] = index * size
  sizes[axis] = size
  return _slice(t, begin, sizes)


def _slice(t, begin, sizes):
  return tf.slice(t, int_constant(list(begin)), int_constant(list(sizes)))


def reduce_n(tensors, reduction_fn_string: str) -> tf.Tensor:
  """Reduces a list of tensors. A tensor shared by k processors counts k
  times in a sum (and once in a max, min or logical reduction)."""
  unique = _unique(tensors)
  if len(unique) < len(tensors):
    if reduction_fn_string == "SUM" and tensors[0].dtype != tf.bool:
      counts = [sum(1 for t in tensors if t is u) for u in unique]
      scaled = [u if c == 1 else u * tf.cast(c, u.dtype) for u, c in zip(unique, counts)]
      return tf.add_n(scaled) if len(scaled) > 1 else scaled[0]
    tensors = unique
  if len(tensors) == 1:
    return tf.identity(tensors[0])
  if reduction_fn_string == "SUM":
    if tensors[0].dtype == tf.bool:
      return functools.reduce(tf.logical_or, tensors)
    return tf.add_n(tensors)
  fn = {"MAX": tf.maximum, "MIN": tf.minimum, "PROD": tf.multiply,
        "LOGICAL_OR": tf.logical_or, "LOGICAL_AND": tf.logical_and}.get(reduction_fn_string)
  if fn is None:
    raise ValueError(f"Unknown reduction {reduction_fn_string!r}.")
  return functools.reduce(fn, tensors)


from mesh_tensorflow.core import autograph_exempt as _autograph_exempt  # noqa: E402  pylint: disable=g-import-not-at-top
_autograph_exempt.exempt({"PlacementMeshImpl": PlacementMeshImpl})  # its methods; AutoGraph leaves them alone
