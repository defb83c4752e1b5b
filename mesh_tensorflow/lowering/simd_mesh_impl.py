"""SIMD lowering: one program, traced once, run by every processor.

`PlacementMeshImpl` emits a copy of every op for every device, so its graph and
its lowering time grow with the mesh. `SimdMeshImpl` lowers the mtf graph once,
from the point of view of a single processor whose number `pnum` is a tensor:
the program computes its own mesh coordinates from `pnum`, slices inputs and
variables accordingly, and talks to the other processors through collectives
over the subgroups that each mesh dimension defines.

Two backends run the program:

* ``"devices"`` (CPU and GPU, the default): the program is one concrete
  `tf.function`; a step calls it once per processor, each call placed on that
  processor's device. Collectives are TensorFlow's V2 collective ops with
  group and instance keys computed from `pnum` (NCCL on GPU), ordered on a
  per-device token (without one, V2 collectives of several devices in one
  function hang). Verified on 8 logical CPUs.
* ``"tpu"``: the program is replicated with `tf.compat.v1.tpu.replicate`
  over a `tf.tpu.experimental.DeviceAssignment`, with `CrossReplicaSum`,
  `AllToAll` and `CollectivePermute` over static group assignments, and a
  logical-to-physical mapping that keeps each mesh row on neighbouring chips.
  It is built and checked here without a TPU (group assignments, device
  assignment, the program); it has never run on a TPU.

Example:
    >>> impl = SimdMeshImpl("rows:2;cols:4", "batch:rows;hidden:cols",
    ...                     ["cpu:%d" % i for i in range(8)])
    >>> def step(x):
    ...   graph, mesh, loss, updates = build(x)   # any mtf model
    ...   lowering = mtf.Lowering(graph, {mesh: impl})
    ...   for u in updates:
    ...     lowering.lowered_operation(u)
    ...     return lowering.export_to_tf_tensor(loss)
    >>> loss = impl.run(step, x_batch)          # processor 0's result
"""

from __future__ import annotations

import contextlib
import itertools
from typing import Callable, List, Optional, Sequence

import numpy as np
import tensorflow as tf

from mesh_tensorflow.lowering import observers
from mesh_tensorflow.lowering.collective_keys import allocate_simd_keys
from mesh_tensorflow.lowering.mesh_impl import LaidOutTensor, MeshImpl, as_laid_out
from mesh_tensorflow.core.shapes import convert_to_shape
from mesh_tensorflow.lowering.simd_program import (  # noqa: F401  (PerProcessor served here)
    PerProcessor, _device_sort_key, _has_loops, _local_devices, _ProcessorVariable, _ProgramState)
from mesh_tensorflow.lowering.slice_variables import NOT_CAPTURED_BY_TF_FUNCTION

_BACKENDS = ("auto", "devices", "tpu")


class SimdMeshImpl(MeshImpl):
  """Mesh implementation that lowers the graph once for all processors.

  Args:
    shape: mesh shape, e.g. "rows:2;cols:4".
    layout: layout rules, e.g. "batch:rows;hidden:cols".
    devices: one device per processor, in pnum order (CPU or GPU devices of
      this process, or `/job:worker/task:N/...` devices of a cluster). None:
      this process's first GPUs if it has enough, else its logical CPUs. Not
      needed for the "tpu" backend.
    device_assignment: for the TPU backend, a
      `tf.tpu.experimental.DeviceAssignment`; see `tpu_device_assignment`.
    logical_to_physical: a processor permutation: processor p
      runs on `devices[logical_to_physical[p]]` (devices listed in physical
      order; see `auto_logical_to_physical_tpu`). On TPUs, build the
      placement into the device assignment instead (`tpu_device_assignment`).
    allreduce_in_bfloat16_max_group_size: accepted for the original's call
      form; collectives here always reduce in the tensor's own dtype.
    backend: "devices", "tpu", or "auto" ("tpu" when TPU devices or a
      device_assignment are given).
    collective_timeout: seconds after which a collective whose peers never
      arrive fails with an error instead of waiting forever; 0 (the default)
      waits forever. TensorFlow keeps a thread alive per collective execution
      for the whole timeout, so with a long timeout and many collectives per
      step threads pile up (measured: 2 per collective per device); use a
      short one (seconds to minutes) to debug hangs or on multi-host meshes.
    communication: how the collective ops communicate: "auto" (NCCL on GPU
      when available), "nccl", or "ring" (for logical GPUs carved out of one
      physical GPU, where NCCL cannot run one rank per logical device).
    coalesce_sums: when a pending sum (`LazyAllreduceSum`, e.g. a weight
      gradient) must be reduced, reduce every other pending sum over the same
      mesh axes and of the same dtype in the same collective (flattened and
      concatenated): one allreduce for all the gradients of a step instead of
      one per variable. The collectives recorded in the lowering's counters
      stay one per sum, as the layout implies.
    jit_compile: compile each processor's program with XLA. True: always (an
      error where TensorFlow cannot compile the program's collectives, as on
      CPU); "auto": on GPUs, and on any device when the mesh has a single
      processor (no collectives); False: never.

  Example:
    >>> impl = mtf.simd_mesh_impl.SimdMeshImpl(
    ...     "all:8", "batch:all", ["cpu:%d" % i for i in range(8)])
  """

  def __init__(self, shape, layout, devices: Optional[Sequence[str]] = None,
               device_assignment=None, logical_to_physical: Optional[Sequence[int]] = None,
               allreduce_in_bfloat16_max_group_size: int = 8, backend: str = "auto",
               collective_timeout: float = 0.0, communication: str = "auto",
               jit_compile=False, coalesce_sums: bool = True):
    del allreduce_in_bfloat16_max_group_size
    self.coalesce_sums = bool(coalesce_sums)
    super().__init__(shape, layout)
    if backend not in _BACKENDS:
      raise ValueError(f"SimdMeshImpl: backend={backend!r}; choose one of {_BACKENDS}.")
    devices = list(devices) if devices is not None else None
    if backend == "auto":
      is_tpu = devices is not None and devices and all(
          "TPU" in (tf.DeviceSpec.from_string(d).device_type or "").upper() for d in devices)
      backend = "tpu" if (is_tpu or device_assignment is not None) else "devices"
    if backend == "devices":
      if devices is None:
        devices = _local_devices(self.size)
      if len(devices) != self.size:
        raise ValueError(
            f"SimdMeshImpl: mesh shape '{self.shape.to_string()}' has {self.size} "
            f"processors but {0 if devices is None else len(devices)} devices were "
            f"given. Pass one device per processor, e.g. ['cpu:%d' % i for i in "
            f"range({self.size})].")
      self._devices = [tf.DeviceSpec.from_string(d).to_string() for d in devices]
      if logical_to_physical is not None:
        order = [int(p) for p in logical_to_physical]
        if sorted(order) != list(range(self.size)):
          raise ValueError(
              f"SimdMeshImpl: logical_to_physical must be a permutation of "
              f"range({self.size}) (one physical device per processor), got {order}.")
        self._devices = [self._devices[p] for p in order]
    else:
      if logical_to_physical is not None:
        raise ValueError(
            "SimdMeshImpl: logical_to_physical is not used by the TPU backend; build the "
            "placement into device_assignment with mtf.simd_mesh_impl.tpu_device_assignment().")
      self._devices = list(devices) if devices else [""] * self.size
    if communication not in ("auto", "ring", "nccl"):
      raise ValueError(f"SimdMeshImpl: communication={communication!r}; choose one of "
                       "('auto', 'ring', 'nccl').")
    if jit_compile not in (True, False, "auto"):
      raise ValueError(f"SimdMeshImpl: jit_compile={jit_compile!r}; choose True, False or "
                       "'auto'.")
    self._communication = communication
    self.jit_compile = jit_compile
    self._backend = backend
    self._timeout = float(collective_timeout)
    self._device_assignment = device_assignment
    # Group key of the collective over mesh axes `mask` (a bit set) in group g:
    # base + mask * (size + 1) + g (see _keys).
    self._key_base = allocate_simd_keys((1 << self.ndims) * (self.size + 1))
    self._state: Optional[_ProgramState] = None
    self._programs = {}
    self._rank_tables = {}
    self._instance_keys = itertools.count(1)
    self._runners = {}

  backend = property(lambda self: self._backend)
  devices = property(lambda self: list(self._devices))
  num_local_slices = 1  # a LaidOutTensor holds this processor's slice only

  def variable_device(self, pnum: int) -> str:
    return self._devices[pnum]

  @property
  def host_device(self) -> str:
    return self._devices[0]

  def check_can_lower(self) -> None:
    if self._state is None:
      raise ValueError(
          "SimdMeshImpl: mtf.Lowering with a SimdMeshImpl must run inside "
          "SimdMeshImpl.run(step_fn, ...) (or run_all / trace_program): the graph is "
          "lowered once, as the program every processor runs. Move the Lowering and "
          "the exports into step_fn, or use PlacementMeshImpl.")

  # ---- the current processor ----------------------------------------------
  @property
  def pnum(self) -> tf.Tensor:
    """This processor's number: an int32 scalar tensor of the program."""
    if self._state is None:
      raise ValueError(
          "SimdMeshImpl: lower the mtf graph inside SimdMeshImpl.run(step_fn, ...) "
          "(or trace_program): the SIMD program needs its processor number, which "
          "only exists while the program is traced.")
    return self._state.pnum

  def coordinate(self, mesh_axis: int) -> tf.Tensor:
    """This processor's coordinate along `mesh_axis` (int32 tensor)."""
    stride = 1
    for d in self.shape.dims[mesh_axis + 1:]:
      stride *= d.size
    size = self.mesh_axis_size(mesh_axis)
    pnum = self.pnum
    return self._state.cached(("coordinate", mesh_axis), lambda: (pnum // stride) % size)

  def _group_index(self, mesh_axes) -> tf.Tensor:
    """Which of the groups over `mesh_axes` this processor belongs to,
    numbered like `processor_groups(mesh_axes)`."""
    return self._mixed_radix([a for a in range(self.ndims) if a not in mesh_axes])

  def _position_in_group(self, mesh_axes) -> tf.Tensor:
    return self._mixed_radix(sorted(mesh_axes))

  def _mixed_radix(self, axes) -> tf.Tensor:
    """The row-major index of this processor's coordinates along `axes`."""
    def make():
      index = None
      for a in axes:
        c = self.coordinate(a)
        index = c if index is None else index * self.mesh_axis_size(a) + c
      return tf.constant(0, tf.int32) if index is None else index
    return self._state.cached(("mixed radix", tuple(axes)), make)

  def _zero(self) -> tf.Tensor:
    return self._state.cached("zero", lambda: tf.constant(0, tf.int32))

  def _slice_begin_tensors(self, shape) -> List[tf.Tensor]:
    layout = self.tensor_layout(shape)
    sizes = self.slice_shape(shape)
    return [self._zero() if a is None else self._offset(a, s) for a, s in zip(layout, sizes)]

  def _offset(self, mesh_axis: int, size: int) -> tf.Tensor:
    """coordinate(mesh_axis) * size, once per program."""
    return self._state.cached(("offset", mesh_axis, size),
                              lambda: self.coordinate(mesh_axis) * size)

  # ---- computation ---------------------------------------------------------
  def slicewise(self, fn: Callable, *inputs):
    inputs = [as_laid_out(x) for x in inputs]
    args = [x.tensor_list[0] if isinstance(x, LaidOutTensor) else x for x in inputs]
    result = fn(*args)
    if isinstance(result, (tuple, list)):
      return tuple(LaidOutTensor([r]) for r in result)
    return LaidOutTensor([result])

  def laid_out_pnum(self) -> LaidOutTensor:
    return LaidOutTensor([self.pnum])

  def make_slices(self, fn, shape) -> LaidOutTensor:
    """fn(pnum, slice_begin) with pnum and slice_begin as int32 tensors."""
    return LaidOutTensor([fn(self.pnum, self._slice_begin_tensors(convert_to_shape(shape)))])

  def slice_along(self, x, mesh_axis: int, tensor_axis: int) -> LaidOutTensor:
    x = as_laid_out(x)
    n = self.mesh_axis_size(mesh_axis)
    if n == 1:
      return x
    t = x.tensor_list[0]
    size = t.shape.as_list()[tensor_axis] // n
    begin = [self._zero()] * t.shape.rank
    begin[tensor_axis] = self._offset(mesh_axis, size)
    sizes = [-1] * t.shape.rank
    sizes[tensor_axis] = size
    return LaidOutTensor([tf.slice(t, tf.stack(begin), sizes)])

  # ---- variables ------------------------------------------------------------
  def program_slices(self, sliced) -> list:
    """The slice variables this program reads for SlicedVariable `sliced`:
    one, this processor's own (an argument of the program)."""
    state = self._state
    if state is None:  # outside the program (e.g. reading a step counter)
      return sliced.slices
    if state.discover:
      if sliced not in state.used:
        state.used.append(sliced)
      return [sliced.slices[0]]
    if sliced.var_name not in state.handles:
      raise ValueError(
          f"SimdMeshImpl: variable {sliced.var_name!r} appeared while tracing the "
          "program but not in its first trace: step_fn must build the same mtf "
          "graph every time it is called.")
    if sliced.var_name not in state.wrappers:
      first = sliced.slices[0]
      state.wrappers[sliced.var_name] = _ProcessorVariable(
          state.handles[sliced.var_name], first.dtype, first.shape, sliced.var_name)
    return [state.wrappers[sliced.var_name]]

  def slice_device(self, pnum: int):
    """Device scope for per-slice ops: none, the caller places the program."""
    del pnum
    return None

  # ---- collectives ---------------------------------------------------------
  def pending_sum_made(self, lazy) -> None:
    """Keeps the pending sums made at the program's top level, to complete
    them together."""
    state = self._state
    if (state is not None and self.coalesce_sums and self._backend == "devices"
        and tf.compat.v1.get_default_graph() is state.graph):
      state.pending.append(lazy)

  def pending_sum_folded(self, lazy) -> None:
    """`lazy` was folded into another pending sum: reduce it only on demand."""
    state = self._state
    if state is not None:
      state.pending = [p for p in state.pending if p is not lazy]

  def complete_pending_sum(self, lazy):
    """Reduces `lazy` together with the other pending sums over its mesh
    axes and of its dtype (one collective), when it was made at the program's
    top level and is reduced there (a sum inside a loop body is reduced
    alone)."""
    state = self._state
    if (state is None or tf.compat.v1.get_default_graph() is not state.graph
        or not any(p is lazy for p in state.pending)):
      return super().complete_pending_sum(lazy)
    self._reduce_together(lazy, state)
    if lazy.is_pending:  # not of a shape that one collective reduces with others
      return super().complete_pending_sum(lazy)
    return lazy.to_laid_out_tensor()

  def _reduce_together(self, lazy, state) -> None:
    """Sets the reduced value of `lazy` and of the other pending sums that
    one collective can reduce with it."""
    dtype = lazy.laid_out_input.tensor_list[0].dtype
    group, rest = [], []
    for p in state.pending:
      if not p.is_pending:
        continue
      t = p.laid_out_input.tensor_list[0]
      if p.mesh_axes == lazy.mesh_axes and t.dtype == dtype and t.shape.is_fully_defined():
        group.append(p)
      else:
        rest.append(p)
    state.pending = rest
    axes = [a for a in lazy.mesh_axes if self.mesh_axis_size(a) > 1]
    if len(group) < 2 or not axes:
      for p in group:
        p.set_reduced(self.allreduce(p.laid_out_input, p.mesh_axes, "SUM"))
      return
    for p in group:  # counted as the layout implies: one allreduce per sum
      self.record_collective("allreduce", p.laid_out_input, axes)
    slices = [p.laid_out_input.tensor_list[0] for p in group]
    flat = tf.concat([tf.reshape(t, [-1]) for t in slices], 0)
    with self.unrecorded():
      total = self.allreduce(LaidOutTensor([flat]), axes, "SUM").tensor_list[0]
    pieces = tf.split(total, [t.shape.num_elements() for t in slices], 0)
    for p, t, piece in zip(group, slices, pieces):
      p.set_reduced(LaidOutTensor([tf.reshape(piece, t.shape)]))

  def _group_size(self, mesh_axes) -> int:
    return observers.group_size(mesh_axes, self.shape.to_integer_list())

  def _keys(self, mesh_axes):
    """(group_size, group_key, instance_key) tensors for a collective."""
    mask = sum(1 << a for a in mesh_axes)
    num_groups = self.size // self._group_size(mesh_axes)
    base = self._key_base + mask * (self.size + 1)
    if num_groups == 1:
      group_key = self._state.cached(("group key", mask), lambda: tf.constant(base, tf.int32))
    else:
      group_key = self._state.cached(("group key", mask),
                                     lambda: base + self._group_index(mesh_axes))
    # Unique over every program of this mesh (train and eval steps share
    # groups): a reused instance key would join two different collectives.
    instance_key = next(self._instance_keys)
    size = self._group_size(mesh_axes)
    # cached per mesh-axis set (not per size), so the program's op count does
    # not depend on the mesh's sizes
    group_size = self._state.cached(("group size", mask), lambda: tf.constant(size, tf.int32))
    return group_size, group_key, instance_key

  def _token(self) -> list:
    """The ordering token: collectives sharing it run in program order
    (tf.function orders stateful ops on one resource)."""
    token = self._state.token
    return [] if token is None else [token]

  def _rank_table(self, mesh_axes):
    """[num_groups, group_size] table: entry [g, i] is the collective rank of
    the processor at position i of group g (TensorFlow ranks the members of a
    group by device name), or None where ranks follow positions."""
    key = tuple(mesh_axes)
    if key not in self._rank_tables:
      groups = self.processor_groups(list(mesh_axes))
      table = []
      for group in groups:
        order = sorted(group, key=lambda p: _device_sort_key(self._devices[p]))
        table.append([order.index(p) for p in group])
      identity = all(row == list(range(len(row))) for row in table)
      self._rank_tables[key] = None if identity else np.array(table, np.int32)
    return self._rank_tables[key]

  def _gather_stacked(self, t: tf.Tensor, mesh_axes) -> tf.Tensor:
    """[group_size, *t.shape]: every member's slice, in group position order."""
    if self._backend == "tpu":
      return self._tpu_gather_stacked(t, mesh_axes)
    group_size, group_key, instance_key = self._keys(mesh_axes)
    dtype = t.dtype
    send = tf.cast(t, tf.int32) if dtype == tf.bool else t
    if dtype == tf.bfloat16:  # the op lacks bfloat16; a gather moves bits unchanged
      send = tf.bitcast(t, tf.float16)
    gathered = tf.raw_ops.CollectiveGatherV2(
        communication_hint=self._communication,
        input=tf.expand_dims(send, 0), group_size=group_size, group_key=group_key,
        instance_key=instance_key, ordering_token=self._token(), timeout_seconds=self._timeout)
    table = self._rank_table(mesh_axes)
    if table is not None:
      gathered = tf.gather(gathered, tf.gather(tf.constant(table), self._group_index(mesh_axes)))
    if dtype == tf.bfloat16:
      return tf.bitcast(gathered, dtype)
    return tf.cast(gathered, dtype) if dtype == tf.bool else gathered

  def allreduce(self, x, mesh_axes, reduction_fn_string: str) -> LaidOutTensor:
    x = as_laid_out(x)
    mesh_axes = sorted(a for a in mesh_axes if self.mesh_axis_size(a) > 1)
    if not mesh_axes:
      return x
    self.record_collective("allreduce", x, mesh_axes)
    t = x.tensor_list[0]
    if self._backend == "tpu":
      return LaidOutTensor([self._tpu_allreduce(t, mesh_axes, reduction_fn_string)])
    merge = {"SUM": "Add", "MAX": "Max", "MIN": "Min", "PROD": "Mul",
             "LOGICAL_OR": "Max", "LOGICAL_AND": "Min"}.get(reduction_fn_string)
    if merge is None:
      raise ValueError(f"Unknown reduction {reduction_fn_string!r}.")
    dtype = t.dtype
    send = tf.cast(t, tf.int32) if dtype == tf.bool else t
    if dtype == tf.bool and reduction_fn_string == "SUM":
      merge = "Max"  # a boolean sum is a logical or
    group_size, group_key, instance_key = self._keys(mesh_axes)
    out = tf.raw_ops.CollectiveReduceV2(
        communication_hint=self._communication,
        input=send, group_size=group_size, group_key=group_key, instance_key=instance_key,
        ordering_token=self._token(), merge_op=merge, final_op="Id", timeout_seconds=self._timeout)
    return LaidOutTensor([tf.cast(out, dtype) if dtype == tf.bool else out])

  def allconcat(self, x, mesh_axis: int, concat_axis: int) -> LaidOutTensor:
    x, n = self.begin_collective("allgather", x, mesh_axis)
    if n == 1:
      return x
    t = x.tensor_list[0]
    stacked = self._gather_stacked(t, [mesh_axis])  # [n, *t.shape]
    rank = t.shape.rank
    perm = list(range(1, concat_axis + 1)) + [0] + list(range(concat_axis + 1, rank + 1))
    moved = tf.transpose(stacked, perm) if concat_axis else stacked
    new_shape = t.shape.as_list()
    new_shape[concat_axis] *= n
    return LaidOutTensor([tf.reshape(moved, new_shape)])

  def alltoall(self, x, mesh_axis: int, split_axis: int, concat_axis: int) -> LaidOutTensor:
    x, n = self.begin_collective("alltoall", x, mesh_axis)
    if n == 1:
      return x
    t = x.tensor_list[0]
    chunks = tf.stack(tf.split(t, n, axis=split_axis), 0)  # [n, ...], chunk j for coord j
    if self._backend == "tpu":
      received = self._tpu_alltoall(chunks, mesh_axis)
    else:
      received = self._devices_alltoall(chunks, mesh_axis)
    return LaidOutTensor([tf.concat(tf.unstack(received, n, axis=0), axis=concat_axis)])

  def _devices_alltoall(self, chunks: tf.Tensor, mesh_axis: int) -> tf.Tensor:
    n = chunks.shape.as_list()[0]
    table = self._rank_table([mesh_axis])
    if table is not None:  # chunk for rank r goes in row r; rows come back by rank
      ranks = tf.gather(tf.constant(table), self._group_index([mesh_axis]))
      chunks = tf.scatter_nd(tf.expand_dims(ranks, 1), chunks, tf.shape(chunks))
    dtype = chunks.dtype
    send = tf.cast(chunks, tf.int32) if dtype == tf.bool else chunks
    flat = tf.reshape(send, [-1] + send.shape.as_list()[2:]) if send.shape.rank > 1 else send
    group_size, group_key, instance_key = self._keys([mesh_axis])
    out = tf.raw_ops.CollectiveAllToAllV2(
        communication_hint=self._communication,
        input=flat, group_size=group_size, group_key=group_key,
        instance_key=instance_key, ordering_token=self._token(), timeout_seconds=self._timeout)
    out = tf.reshape(out, [n] + chunks.shape.as_list()[1:])
    if table is not None:
      out = tf.gather(out, ranks)
    return tf.cast(out, dtype) if dtype == tf.bool else out

  def receive(self, x, mesh_axis: int, source_pcoord) -> LaidOutTensor:
    x = as_laid_out(x)
    self.record_collective("permute", x, [mesh_axis])
    t = x.tensor_list[0]
    n = self.mesh_axis_size(mesh_axis)
    if self._backend == "tpu":
      return LaidOutTensor([self._tpu_permute(t, mesh_axis, source_pcoord)])
    # TensorFlow has no point-to-point collective on CPU/GPU: gather the
    # group's slices and keep the source's.
    with self.unrecorded():
      stacked = self._gather_stacked(t, [mesh_axis]) if n > 1 else tf.expand_dims(t, 0)
    sources = [0 if s is None else s for s in source_pcoord]
    valid = [s is not None for s in source_pcoord]
    me = self.coordinate(mesh_axis)
    picked = tf.gather(stacked, tf.gather(tf.constant(sources, tf.int32), me))
    if all(valid):
      return LaidOutTensor([picked])
    keep = tf.gather(tf.constant(valid), me)
    return LaidOutTensor([tf.where(keep, picked, tf.zeros_like(picked))])

  # ---- import / export -----------------------------------------------------
  def import_tf_tensor(self, x, shape) -> LaidOutTensor:
    shape = convert_to_shape(shape)
    slice_shape = self.slice_shape(shape)
    x = tf.convert_to_tensor(x)
    if slice_shape == shape.to_integer_list():
      return LaidOutTensor([x])
    return LaidOutTensor([tf.slice(x, tf.stack(self._slice_begin_tensors(shape)), slice_shape)])

  def export_to_tf_tensor(self, x, shape) -> tf.Tensor:
    """The full tensor, on every processor (allgather over split axes)."""
    x = as_laid_out(x)
    layout = self.tensor_layout(shape)
    for mesh_axis, tensor_axis in enumerate(layout.mesh_axis_to_tensor_axis(self.ndims)):
      if tensor_axis is not None:
        x = self.allconcat(x, mesh_axis, tensor_axis)
    return x.tensor_list[0]

  # ---- running the program -------------------------------------------------
  def trace_program(self, step_fn: Callable, *args):
    """Traces step_fn as the SIMD program without running it.

    Returns the concrete function, which takes (pnum, variable handles, *args).
    Slice variables are created (once) for every processor on its device. This
    is what `run` calls; benchmarks call it for meshes whose devices do not
    exist here.
    """
    flat_specs = [self._spec(a) for a in args]
    key = (step_fn, tuple(str(s) for s in flat_specs), self.compiles_program)
    if key in self._programs:
      return self._programs[key]
    discovered = self._discover(step_fn, flat_specs)
    names = [s.var_name for s in discovered]

    # Pass 2: the program, with each processor's variable handles as arguments.
    def program(pnum, token, handles, *step_args):
      with self._program(_ProgramState(pnum, False, names, handles, token)):
        return step_fn(*step_args)
    handle_specs = [tf.TensorSpec([], tf.resource) for _ in names]
    # Inlined into the caller (one executor runs every processor's ops: fewer
    # function-call overheads per step), unless the program has a loop: a
    # collective's rendezvous key includes the id of the while-loop frame it
    # runs in, and that id is only the same on every processor when each runs
    # the program's own (identically named) loops. Inlined, each processor's
    # copy of a loop gets its own name and collectives inside mtf.while_loop
    # (decoding) never meet.
    jit = self.compiles_program
    specs = (tf.TensorSpec([], tf.int32), tf.TensorSpec([], tf.resource), handle_specs,
             *flat_specs)
    concrete = tf.function(program, autograph=False, jit_compile=True if jit else None
                           ).get_concrete_function(*specs)
    if _has_loops(concrete):
      concrete = tf.function(program, autograph=False, jit_compile=True if jit else None,
                             experimental_attributes={"_noinline": True}
                             ).get_concrete_function(*specs)
    if jit and not self._on_gpus():
      collectives = sorted({op.type for op in concrete.graph.get_operations()
                            if op.type.startswith("Collective")})
      if collectives:
        raise ValueError(
            f"SimdMeshImpl(jit_compile=True): XLA cannot compile collective ops on "
            f"{self._device_kinds()} devices, and this program has {', '.join(collectives)}. "
            "Use jit_compile='auto' (compiles the program on GPUs and on one-processor "
            "meshes, runs it uncompiled elsewhere) or jit_compile=False.")
    self._programs[key] = (concrete, discovered)
    return self._programs[key]

  @property
  def compiles_program(self) -> bool:
    """Whether each processor's program is compiled with XLA (jit_compile)."""
    if self.jit_compile == "auto":
      return self.size == 1 or self._on_gpus()
    return bool(self.jit_compile)

  def _device_kinds(self) -> str:
    return "/".join(sorted({(tf.DeviceSpec.from_string(d).device_type or "default").upper()
                            for d in self._devices}))

  def _on_gpus(self) -> bool:
    return self._device_kinds() == "GPU"

  def _discover(self, step_fn: Callable, arg_specs) -> list:
    """Traces step_fn once (never run) to find the SlicedVariables the program
    uses, creating each processor's slices on the way."""
    discovered = []

    def discover(pnum, *step_args):
      with self._program(_ProgramState(pnum, True)) as state:
        step_fn(*step_args)
        discovered.extend(state.used)
      return tf.constant(0)
    tf.function(discover, autograph=False).get_concrete_function(
        tf.TensorSpec([], tf.int32), *arg_specs)
    return discovered

  @contextlib.contextmanager
  def _program(self, state: _ProgramState):
    if self._state is not None:
      raise ValueError("SimdMeshImpl: run() cannot be nested.")
    self._state = state
    try:
      yield state
    finally:
      self._state = None

  @staticmethod
  def _spec(arg):
    """The TensorSpec structure of one argument (nested structures allowed)."""
    def leaf(a):
      if isinstance(a, PerProcessor):
        a = a.values[0]
      t = tf.convert_to_tensor(a)
      return tf.TensorSpec(t.shape, t.dtype)
    return tf.nest.map_structure(leaf, arg)

  @staticmethod
  def _args_for(args, pnum: int) -> list:
    return [tf.nest.map_structure(
        lambda a: a.values[pnum] if isinstance(a, PerProcessor) else a, arg) for arg in args]

  def run_all(self, step_fn: Callable, *args) -> list:
    """Runs the SIMD program on every processor; returns each one's outputs.

    step_fn(*args) builds the mtf graph (or reuses one), lowers it with
    `mtf.Lowering(graph, {mesh: this_impl})` and returns TensorFlow tensors
    (exports); assignments it lowers take effect. It is traced twice on the
    first call (once to find the variables), then reused. Arguments wrapped
    in `PerProcessor` give each processor its own value.

    Works inside a tf.function (it adds one call of the program per
    processor) and eagerly (it wraps those calls in a cached tf.function).
    """
    if self._backend == "tpu":
      raise ValueError(
          "SimdMeshImpl(backend='tpu'): use tpu_replicate(step_fn, ...) inside a "
          "tf.compat.v1 graph on a TPU system; run() is for CPU and GPU devices.")
    if tf.executing_eagerly():
      key = (step_fn, tuple(str(self._spec(a)) for a in args))
      if key not in self._runners:
        self._runners[key] = tf.function(
            lambda *a: self._call_program(step_fn, a), autograph=False)
      return self._runners[key](*args)
    return self._call_program(step_fn, args)

  def _call_program(self, step_fn: Callable, args) -> list:
    concrete, variables = self.trace_program(step_fn, *args)
    tokens = self._ordering_tokens()
    results = []
    for pnum in range(self.size):
      handles = [v.slices[pnum].handle for v in variables]
      with tf.device(self._devices[pnum]):
        results.append(concrete(tf.constant(pnum, tf.int32), tokens[pnum].handle, handles,
                                *self._args_for(args, pnum)))
    return results

  def _ordering_tokens(self) -> list:
    """One resource per processor that its collectives are ordered on: with
    it, TensorFlow runs collective ops of many devices in one function."""
    store = self.__dict__.setdefault("_tokens", {})
    with tf.init_scope():
      key = "eager" if tf.executing_eagerly() else id(tf.compat.v1.get_default_graph())
      if key not in store:
        tokens = []
        for device in self._devices:
          with tf.device(device):
            tokens.append(tf.Variable(0.0, trainable=False, name="mtf_collective_order",
                                      **NOT_CAPTURED_BY_TF_FUNCTION))
        store[key] = tokens
    return store[key]

  def run(self, step_fn: Callable, *args):
    """Like run_all, but returns processor 0's outputs (exports are the same
    on every processor)."""
    return self.run_all(step_fn, *args)[0]

  # ---- TPU backend ---------------------------------------------------------
  def group_assignment(self, mesh_axes) -> List[List[int]]:
    """Replica groups for a collective over `mesh_axes` (TPU replica ids are
    pnums): the same groups as `processor_groups`."""
    return self.processor_groups(sorted(mesh_axes))

  def _tpu_allreduce(self, t, mesh_axes, reduction_fn_string):
    if reduction_fn_string != "SUM":
      # CrossReplicaSum only sums; max/min via an all-gather and a local reduce.
      with self.unrecorded():
        stacked = self._tpu_gather_stacked(t, mesh_axes)
      fn = {"MAX": tf.reduce_max, "MIN": tf.reduce_min, "PROD": tf.reduce_prod,
            "LOGICAL_OR": tf.reduce_any, "LOGICAL_AND": tf.reduce_all}[reduction_fn_string]
      return fn(stacked, axis=0)
    return tf.raw_ops.CrossReplicaSum(
        input=t, group_assignment=tf.constant(self.group_assignment(mesh_axes), tf.int32))

  def _tpu_gather_stacked(self, t, mesh_axes):
    groups = self.group_assignment(mesh_axes)
    n = len(groups[0])
    # all-gather as an all-to-all of n copies: member j receives everyone's copy j.
    copies = tf.stack([t] * n, 0)
    return self._tpu_all_to_all(copies, groups)

  def _tpu_all_to_all(self, stacked, groups):
    n = len(groups[0])
    return tf.raw_ops.AllToAll(
        input=stacked, group_assignment=tf.constant(groups, tf.int32), concat_dimension=0,
        split_dimension=0, split_count=n)

  def _tpu_alltoall(self, chunks, mesh_axis):
    return self._tpu_all_to_all(chunks, self.group_assignment([mesh_axis]))

  def _tpu_permute(self, t, mesh_axis, source_pcoord):
    pairs = []
    for p in range(self.size):
      coords = self.pnum_to_processor_coordinates(p)
      src = source_pcoord[coords[mesh_axis]]
      if src is not None:
        coords[mesh_axis] = src
        pairs.append([self.processor_coordinates_to_pnum(coords), p])
    return tf.raw_ops.CollectivePermute(
        input=t, source_target_pairs=tf.constant(pairs, tf.int32))

  def tpu_replicate(self, step_fn: Callable, *args):
    """Builds the TPU program: `tf.compat.v1.tpu.replicate` of the SIMD
    program over this mesh's device assignment. Call it in a tf.compat.v1
    graph; it returns replicate's outputs (one list per processor).

    Variables must already exist for every processor (this backend feeds each
    replica its own slice handles); on a TPU system, create them on the TPU
    devices of `variable_device(pnum)`.
    """
    variables = self._discover(step_fn, [self._spec(a) for a in args])
    names = [v.var_name for v in variables]
    replica_inputs = []
    for pnum in range(self.size):
      step_args = self._args_for(args, pnum)
      handles = [v.slices[pnum].handle for v in variables]
      replica_inputs.append([tf.constant(pnum, tf.int32)] + handles + list(step_args))

    def computation(pnum, *inputs):
      handles, step_args = inputs[:len(names)], inputs[len(names):]
      with self._program(_ProgramState(pnum, False, names, handles)):
        return step_fn(*step_args)
    return tf.compat.v1.tpu.replicate(
        computation, inputs=replica_inputs, device_assignment=self._device_assignment)


from mesh_tensorflow.core import autograph_exempt as _autograph_exempt  # noqa: E402  pylint: disable=g-import-not-at-top
_autograph_exempt.exempt({"SimdMeshImpl": SimdMeshImpl})  # its methods; AutoGraph leaves them alone
