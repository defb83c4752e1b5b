"""The walk over the graph that prices each operation's plan: which processors
hold the same TensorFlow tensor (by lowering/sharing.py's rules), the kernels
each operation runs (counted only where something needs them), the
collectives, and their time.

The two plan pricings (`local_plan`, `kernel_plan`) are here; operations.py
maps plan types to them and prices the operations that run no kernel.
"""

from __future__ import annotations

import functools
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from mesh_tensorflow.analysis.cost_model import hardware as hardware_lib
from mesh_tensorflow.analysis.cost_model import topology
from mesh_tensorflow.analysis.cost_model.params import DeviceParams
from mesh_tensorflow.analysis.cost_model.results import CostEstimate, OpCost
from mesh_tensorflow.core.layout import pnum_to_processor_coordinates, processor_groups
from mesh_tensorflow.core.shapes import Shape
from mesh_tensorflow.lowering import observers, plans, sharing


class _Lazy:
  """A pending allreduce over `axes` of partial sums (`nbytes` per
  processor; `ids` identifies each processor's partial-sum tensor)."""
  __slots__ = ("axes", "nbytes", "ids")

  def __init__(self, axes, nbytes, ids):
    self.axes = tuple(sorted(axes))
    self.nbytes = nbytes
    self.ids = ids


class _Bulk:
  """Kernels of one operation on every processor at once (processor j makes
  tensor `start + j` from `x[j]` for x in `inputs`): the form a kernel run
  on every processor takes without shared memory, recorded in one entry."""
  __slots__ = ("cost", "start", "inputs", "kernels", "nbytes", "flops")

  def __init__(self, cost, start, inputs, kernels, nbytes, flops):
    self.cost = cost
    self.start = start
    self.inputs = inputs
    self.kernels = kernels
    self.nbytes = int(nbytes)
    self.flops = int(flops)


class _Estimator:
  """Walks the graph once, pricing the plans the lowering executes.

  Besides the layouts it follows which processors hold the very same
  TensorFlow tensor, by the rules PlacementMeshImpl follows with shared
  memory (lowering/sharing.py): a slicewise op runs one kernel per distinct
  combination of input tensors, an allreduce makes one tensor per group, and
  so on. That gives the number of
  kernels (and the work) exactly, which replication alone does not: e.g. the
  result of an allreduce over rows is one tensor per column even when the
  layout replicates it over the columns. Each kernel is recorded with the
  tensors it reads; at the end only those that a variable update or an
  exported tensor needs are counted, since TensorFlow prunes the rest of a
  function (variable updates read the first processor holding each slice,
  so e.g. the other columns' copies above often never run).
  """

  def __init__(self, operations, mesh_shape: Shape, rules, params: DeviceParams,
               outputs=None):
    self.operations = operations
    self.outputs = outputs
    self.mesh_shape = mesh_shape
    self.rules = rules
    self.params = params
    self.mesh_sizes = mesh_shape.to_integer_list()
    self.mesh_size = mesh_shape.size
    # The mesh's processors as devices of params.hardware (if named).
    self.cluster = (hardware_lib.Cluster(hardware_lib.hardware_from_spec(params.hardware),
                                         self.mesh_size) if params.hardware else None)
    self.share = params.shares_memory
    self.coords = [tuple(pnum_to_processor_coordinates(mesh_shape, p))
                   for p in range(self.mesh_size)]
    self.pnum_of = {c: p for p, c in enumerate(self.coords)}
    self._layouts = {}
    self.state = {}  # tensor -> _Lazy, or a tuple of per-processor tensor ids
    self.completed = {}  # tensor -> the _Lazy it was before a consumer completed it
    self.plan_mesh = plans.PlanMesh(
        self.layout, tuple(self.mesh_sizes), self.share,
        self.pending_axes, tuple(mesh_shape.dimension_names),
        lambda t: self.pending_axes(t) or (self.completed[t].axes if t in self.completed
                                           else None))
    # Tensor ids are indexes here: the processor whose device computes each
    # (-1: none, a tensor no kernel makes).
    self.devices = [-1]
    # The kernels, as (op cost, output id, input ids, kernels, bytes, flops,
    # combine bytes) or _Bulk; only those that a sink needs are counted
    # (`_prune`).
    self.units = []
    self.sinks = set()  # ids of kernels with side effects (variable updates)
    # Per-processor ids made as blocks of one tensor (imports split along
    # one mesh axis, slice_along results, with shared memory): id -> (the
    # whole's id, mesh axis, tensor axis, block index). Gathering a group's
    # blocks back is the whole (sharing.whole_of): no kernel.
    self.block_records = {}
    self.current: Optional[OpCost] = None

  # ---- layouts --------------------------------------------------------------
  def layout(self, shape: Shape):
    try:
      return self._layouts[shape]
    except KeyError:
      pass
    lay = tuple(self.rules.tensor_layout(shape, self.mesh_shape))
    self._layouts[shape] = lay
    return lay

  def slice_elems(self, shape: Shape, layout=None) -> int:
    return plans.slice_elements(shape, self.layout(shape) if layout is None else layout,
                                self.mesh_sizes)

  def slice_bytes(self, t) -> int:
    return self.slice_elems(t.shape) * t.dtype.size

  def distinct(self, layout) -> int:
    """Distinct slices of a tensor of this layout."""
    n = 1
    for a in set(a for a in layout if a is not None):
      n *= self.mesh_sizes[a]
    return n

  # ---- which processors share a tensor ---------------------------------------
  def new_id(self, device: int = -1) -> int:
    """A new tensor id, computed on processor `device`'s device."""
    self.devices.append(device)
    return len(self.devices) - 1

  def _every_processor(self, count: bool, nbytes: int = 0, flops: int = 0, inputs=()):
    """Ids of a new tensor on every processor, each made from that
    processor's `inputs` (one _Bulk entry when counted)."""
    start = len(self.devices)
    self.devices.extend(range(self.mesh_size))
    if count:
      self.units.append(_Bulk(self.current, start, list(inputs), 1, nbytes, flops))
    return tuple(range(start, start + self.mesh_size))

  def _memo(self, keys: Callable[[], Sequence], count: bool, nbytes: int = 0, flops: int = 0,
            inputs=()):
    """Per-processor ids: one new tensor per distinct key (shared memory) or
    per processor; counts the kernels that make them, and the tensors they
    read from another device (each a send/receive pair in TensorFlow).
    `keys()` gives the keys (only shared memory needs them)."""
    if not self.share:  # every processor makes its own (sharing.makers)
      return self._every_processor(count, nbytes, flops, inputs)

    def make(p):
      new = self.new_id(p)
      if count:
        self.unit(new, tuple(x[p] for x in inputs), 1, nbytes, flops)
      return new
    return tuple(sharing.per_processor(keys(), self.share, make))

  def unit(self, out_id, input_ids, kernels: int = 1, nbytes: int = 0, flops: int = 0,
           combine_bytes: int = 0):
    """Records kernels of the current op making tensor `out_id` from
    `input_ids` (counted only if something needs the tensor): nbytes and
    flops per kernel; combine_bytes: a collective's combining kernel."""
    self.units.append((self.current, out_id, tuple(input_ids), kernels, int(nbytes), int(flops),
                       int(combine_bytes)))

  def _prune(self, ops: List[OpCost]):
    """Counts the kernels that the sinks (variable updates, exported
    tensors) need, as TensorFlow runs only those, with their cross-device
    reads (a send/receive pair per tensor and device; counted with shared
    memory, where they are priced)."""
    # Every kernel's inputs are older than its output: one sweep from the
    # newest kernel back finds all that the sinks need.
    live = np.zeros(len(self.devices), dtype=bool)
    live[list(self.sinks)] = True
    arrays = {}  # id(_Bulk) -> its inputs as arrays (kept for the transfers)

    def as_arrays(u):
      got = arrays.get(id(u))
      if got is None:
        got = [np.fromiter(x, dtype=np.int64, count=self.mesh_size) for x in u.inputs]
        if self.share:
          arrays[id(u)] = got
      return got

    for u in reversed(self.units):
      if type(u) is tuple:  # pylint: disable=unidiomatic-typecheck
        if live[u[1]] and u[2]:
          live[list(u[2])] = True
        continue
      mask = live[u.start:u.start + self.mesh_size]
      if mask.any():
        for x in as_arrays(u):
          live[x[mask]] = True
    for op in ops:
      op.kernels = op.bytes_touched = op.work_flops = op.transfers = 0
      op.combines = op.combine_bytes = 0
    devices = np.asarray(self.devices, dtype=np.int64) if self.share else None
    moved = set()
    for u in self.units:
      if type(u) is tuple:  # pylint: disable=unidiomatic-typecheck
        cost, out_id, ins, kernels, nbytes, flops, cbytes = u
        if not live[out_id]:
          continue
        cost.kernels += kernels
        cost.bytes_touched += kernels * nbytes
        cost.work_flops += kernels * flops
        if cbytes:
          cost.combines += 1
          cost.combine_bytes += cbytes
        if not self.share:
          continue
        dev = self.devices[out_id]
        for i in ins:
          src = self.devices[i]
          if src != dev and src != -1 and (i, dev) not in moved:
            moved.add((i, dev))
            cost.transfers += 1
        continue
      mask = live[u.start:u.start + self.mesh_size]
      made = int(mask.sum())
      if not made:
        continue
      cost = u.cost
      cost.kernels += made * u.kernels
      cost.bytes_touched += made * u.kernels * u.nbytes
      cost.work_flops += made * u.kernels * u.flops
      where = np.flatnonzero(mask)
      for x in (as_arrays(u) if self.share else ()):
        src = devices[x[where]]
        for k in np.flatnonzero((src != where) & (src != -1)).tolist():
          pair = (int(x[where[k]]), int(where[k]))
          if pair not in moved:
            moved.add(pair)
            cost.transfers += 1

  def add_exports(self, outputs=None):
    """Marks the slices of the exported tensors that export_to_tf_tensor
    reads as needed. outputs None: the tensors that no operation reads; in a
    training step (one that updates variables), only the scalar ones (the
    loss; the others are dead branches of the gradients)."""
    if outputs is None:
      consumed = {t for op in self.operations for t in op.inputs}
      outputs = [t for op in self.operations for t in op.outputs if t not in consumed]
      if self.sinks:
        outputs = [t for t in outputs if t.shape.ndims == 0]
    for t in outputs:
      s = self.state.get(t)
      if s is None:
        continue
      if isinstance(s, _Lazy):  # exporting completes the allreduce
        self.sinks.update(s.ids)
        continue
      split = {a for a in self.layout(t.shape) if a is not None}
      for p, c in enumerate(self.coords):
        if all(c[a] == 0 for a in range(len(c)) if a not in split):
          self.sinks.add(s[p])

  def slicewise(self, inputs, nbytes: int, flops: int = 0):
    """A slicewise op on the per-processor ids of its inputs; nbytes: bytes
    one kernel reads and writes."""
    return self._memo(lambda: list(zip(*inputs)) if inputs else [()] * self.mesh_size,
                      True, nbytes, flops, inputs)

  def by_layout(self, layout, count: bool = True, nbytes: int = 0, flops: int = 0,
                inputs=()):
    """make_slices / slice variables (and kernels writing them): one tensor
    per distinct slice of `layout`."""
    axes = [a for a in layout if a is not None]
    return self._memo(lambda: [tuple(c[a] for a in axes) for c in self.coords], count, nbytes,
                      flops, inputs)

  def combine_ids(self, ids, axes, nbytes: int, moved: int = 0,
                  tensor_axis: Optional[int] = None):
    """allreduce / allconcat result: one tensor per group (each group's
    members share it), or one per processor without shared memory.
    nbytes: the result's bytes; moved: bytes the combining kernel reads and
    writes; tensor_axis: an allconcat's, whose group of blocks of one
    tensor is that tensor (no kernel)."""
    axes = [a for a in axes if self.mesh_sizes[a] > 1]
    if not axes:
      return ids
    combined = [None] * self.mesh_size
    copied = []
    for group in processor_groups(self.mesh_shape, axes):
      maker, copies = sharing.group_result(group, self.share)
      whole = self.whole_of([ids[p] for p in group], axes, tensor_axis)
      if whole is not None:
        for p in group:
          combined[p] = whole
        continue
      new = self.new_id(maker)
      self.unit(new, [ids[p] for p in group], 1, 0, 0, max(int(moved or 2 * nbytes), 1))
      for p in group:
        combined[p] = new
      copied.extend(copies)
    if len(copied) == self.mesh_size:  # an identity on every device
      return self._every_processor(True, nbytes, inputs=[combined])
    for p in sorted(copied):  # an identity on each of those devices
      new = self.new_id(p)
      self.unit(new, (combined[p],), 1, nbytes)
      combined[p] = new
    return tuple(combined)

  def alltoall_ids(self, ids, axis: int, nbytes: int):
    if self.mesh_sizes[axis] == 1:
      return ids
    # A split on every processor, and a concat of the group's pieces.
    out = [None] * self.mesh_size
    for group in processor_groups(self.mesh_shape, [axis]):
      members = [ids[p] for p in group]
      for p in group:
        out[p] = self.new_id(p)
        self.unit(out[p], members, 2, nbytes)
    return tuple(out)

  def slice_along_ids(self, ids, axis: int, tensor_axis: int, nbytes: int):
    if self.mesh_sizes[axis] == 1:
      return ids
    sliced = self._memo(lambda: [(ids[p], self.coords[p][axis]) for p in range(self.mesh_size)],
                        True, nbytes, inputs=[ids])
    if self.share:
      for p, block in enumerate(sliced):
        self.note_block(block, ids[p], axis, tensor_axis, self.coords[p][axis])
    return sliced

  def note_block(self, block: int, whole: int, mesh_axis: int, tensor_axis: int,
                 index: int) -> None:
    """Records that tensor `block` is block `index` of tensor `whole`, as
    the placement implementation's block registry does (shared memory only)."""
    if self.share:
      self.block_records[block] = (whole, mesh_axis, tensor_axis, index)

  def whole_of(self, group_ids, axes, tensor_axis: Optional[int]):
    """The id of the tensor whose blocks `group_ids` are (gathered along
    one mesh axis `axes` and `tensor_axis`), or None."""
    if tensor_axis is None or len(axes) != 1 or not self.share:
      return None
    return sharing.whole_of([self.block_records.get(i) for i in group_ids], axes[0],
                            tensor_axis, same=lambda a, b: a == b)

  def gathers_without_copy(self, ids, mesh_axis: int, tensor_axis: int) -> bool:
    """Whether gathering `ids` along `mesh_axis` gives tensors that exist
    (every group's slices are blocks of one tensor), as
    PlacementMeshImpl.gathers_without_copy answers."""
    return all(self.whole_of([ids[p] for p in group], [mesh_axis], tensor_axis) is not None
               for group in processor_groups(self.mesh_shape, [mesh_axis]))

  # ---- recording ------------------------------------------------------------
  def collective(self, kind, nbytes, axes):
    self.current.collectives.append(
        observers.collective(kind, axes, nbytes, self.mesh_sizes, self.current.name))

  def allreduce(self, nbytes, axes, ids):
    axes = [a for a in axes if self.mesh_sizes[a] > 1]
    if not axes:
      return ids
    self.collective("allreduce", nbytes, axes)
    group = observers.group_size(axes, self.mesh_sizes)
    return self.combine_ids(ids, axes, nbytes, (group + 1) * nbytes)

  def laid_out(self, t):
    """Per-processor ids of t, completing a pending allreduce first, as
    Lowering.laid_out does."""
    s = self.state.get(t)
    if isinstance(s, _Lazy):
      self.completed[t] = s
      s = self.allreduce(s.nbytes, s.axes, s.ids)
      self.state[t] = s
    if s is None:  # produced by an op this estimate skipped: assume by layout
      s = self.state[t] = self.by_layout(self.layout(t.shape), count=False)
    return s

  def pending_axes(self, t):
    """The mesh axes of t's pending sum, or None."""
    s = self.state.get(t)
    return s.axes if isinstance(s, _Lazy) else None

  def partial_ids(self, t):
    """Per-processor ids of the summands of t's pending sum (completed by a
    consumer already or not)."""
    s = self.state.get(t)
    return (s if isinstance(s, _Lazy) else self.completed[t]).ids

  def permute_ids(self, ids, step: plans.Permute, nbytes: int):
    """Each processor's tensor after a Permute: the source's tensor (shared
    memory) or a copy on its device; zeros where there is no source."""
    out = []
    for p, c in enumerate(self.coords):
      src = step.sources[c[step.mesh_axis]]
      new = self.new_id(p)
      if src is None:
        self.unit(new, (), 1, nbytes)
      else:
        coords = list(c)
        coords[step.mesh_axis] = src
        source = ids[self.pnum_of[tuple(coords)]]
        if sharing.holds_source(self.share):
          new = source
        else:
          self.unit(new, (source,), 1, nbytes)
      out.append(new)
    return tuple(out)

  def execute(self, plan: plans.Redistribution, shape: Shape, dtype_size: int, ids,
              record: bool = True):
    """Prices the steps of a plan (the one the lowering executes) as the
    mesh implementation runs them: each collective sends the slice of the
    layout before it. Returns the per-processor ids."""
    for step, layout in plan.walk():
      nbytes = self.slice_elems(shape, layout) * dtype_size
      if isinstance(step, plans.AllReduce):
        ids = self.allreduce(nbytes, step.mesh_axes, ids) if record else ids
        continue
      if isinstance(step, plans.Permute):
        if record:
          self.collective(step.kind, nbytes, [step.mesh_axis])
        ids = self.permute_ids(ids, step, nbytes)
        continue
      size = self.mesh_sizes[step.mesh_axis]
      if size == 1:
        continue
      if isinstance(step, plans.SliceAlong):
        ids = self.slice_along_ids(ids, step.mesh_axis, step.tensor_axis,
                                   self.slice_elems(shape, step.apply(layout)) * dtype_size)
        continue
      if isinstance(step, plans.JoinBlocks):  # the blocks' tensor: nothing moves
        ids = self.combine_ids(ids, [step.mesh_axis], nbytes * size,
                               tensor_axis=step.tensor_axis)
        continue
      if record:
        self.collective(step.kind, nbytes, [step.mesh_axis])
      if isinstance(step, plans.AllGather):
        ids = self.combine_ids(ids, [step.mesh_axis], nbytes * size,
                               tensor_axis=step.tensor_axis)
      elif isinstance(step, plans.ReduceScatter):
        ids = self.combine_ids(ids, [step.mesh_axis], nbytes, (size + 1) * nbytes)
        ids = self.slice_along_ids(ids, step.mesh_axis, step.tensor_axis, nbytes // size)
      else:
        ids = self.alltoall_ids(ids, step.mesh_axis, nbytes)
    return ids

  # ---- operations -----------------------------------------------------------
  def run(self, plan_pricing: Dict[type, Callable], without_kernel: Dict[str, Callable]
          ) -> List[OpCost]:
    """Prices every operation: the plan it states (`op.plan`) with
    plan_pricing[the plan's type]. An operation that states none
    communicates nothing: it is priced as the LocalPlan of one kernel on its
    inputs' slices (`plans.plan_slicewise`), or, if it runs no kernel of its
    own (imports, constants, identities: `op.local_kernel`), by
    without_kernel[that kind]."""
    ops = []
    for op in self.operations:
      cost = OpCost(op.name, type(op).__name__)
      self.current = cost
      ops.append(cost)
      plan = op.plan(self.plan_mesh)
      if plan is None:
        if op.local_kernel in without_kernel:
          without_kernel[op.local_kernel](self, op)
          continue
        plan = plans.plan_slicewise(op, self.layout, self.mesh_sizes)
      try:
        pricing = plan_pricing[type(plan)]
      except KeyError:
        raise TypeError(f"cost model: operation {op.name!r} states a plan of type "
                        f"{type(plan).__name__}, which has no pricing.") from None
      pricing(self, op, plan)
    self.add_exports(self.outputs)
    self._prune(ops)
    for cost in ops:
      cost.time_s = self.time_of(cost)
    return ops

  def local_plan(self, op, plan: plans.LocalPlan) -> None:
    """Prices a LocalPlan as MeshImpl.execute_local runs it: the operands'
    moves, one kernel per distinct combination of slices, the results'
    moves and pending sums."""
    inputs = [self._input_ids(op, o) for o in plan.operands]
    counted = plan.counted_as
    if counted is not None:  # the moves realize this collective
      self.collective(counted.kind, counted.nbytes, counted.mesh_axes)
    args = [self.execute(o.move, op.inputs[o.input].shape, op.inputs[o.input].dtype.size, ids,
                         record=counted is None) for o, ids in zip(plan.operands, inputs)]
    self.current.flops += plan.flops
    if plan.kernel:
      operand_bytes = [self.slice_elems(op.inputs[o.input].shape, o.move.target)
                       * op.inputs[o.input].dtype.size for o in plan.operands]
      result_bytes = sum(self.slice_elems(r.shape, r.move.source) * r.dtype_size
                         for r in plan.results)
      nbytes = plan.kernel_bytes
      if nbytes is None:
        nbytes = sum(operand_bytes) + result_bytes
      flops = 0 if plan.memory_bound else (
          plan.flops if plan.kernel_flops is None else plan.kernel_flops)
      batched = None
      if plan.batch_axes is not None and self.share:
        batched = plans.batched_operand(plan.batch_axes, lambda i: len(set(args[i])) == 1,
                                        lambda i, axis: self.gathers_without_copy(args[i], axis, 0))
      if batched is not None:  # one kernel on the joined blocks
        i, axis = batched
        size = self.mesh_sizes[axis]
        args[i] = self.combine_ids(args[i], [axis], operand_bytes[i] * size, tensor_axis=0)
        nbytes, flops = nbytes * size, flops * size
      ids = self.slicewise(self._kernel_inputs(args, plan.coordinates), nbytes, flops)
      if batched is not None:  # each processor's rows
        ids = self.slice_along_ids(ids, batched[1], 0, result_bytes)
      args = [ids] * len(plan.results)
    results = [self._result(r, ids) for r, ids in zip(plan.results, args)]
    if plan.combined:
      out_bytes = sum(self.slice_bytes(t) for t in op.outputs)
      results = [self.slicewise(results, out_bytes)] * len(op.outputs)
    for t, value in zip(op.outputs, results):
      self.state[t] = value

  def kernel_plan(self, op, plan: plans.KernelPlan) -> None:
    """Prices a KernelPlan as MeshImpl.execute_kernels runs it: the
    operands' moves, then each kernel (one per distinct combination of its
    arguments' slices and slice variables) and its results' moves and
    pending sums; a kernel that writes slice variables is a side effect."""
    values = [self._operand(op, o) for o in plan.operands]
    for kernel in plan.kernels:
      args = [self._complete(values[a]) for a in kernel.args]
      if kernel.writes:
        self._write_state(args, kernel)
        continue
      inputs = self._kernel_inputs(args, kernel.coordinates)
      if kernel.state is not None:  # one distinct slice variable per block
        inputs.append(self.by_layout(kernel.state, count=False))
      ids = self.slicewise(inputs, kernel.nbytes, kernel.flops)
      values.extend(self._result(r, ids) for r in kernel.results)
    self.current.flops += plan.flops
    for t, i in zip(op.outputs, plan.outputs):
      self.state[t] = values[i]

  def _input_ids(self, op, operand: plans.Operand):
    """Per-processor ids of a plan operand's input (its summands where the
    operand takes a pending sum's partials; else completing the sum)."""
    t = op.inputs[operand.input]
    return self.partial_ids(t) if operand.partial else self.laid_out(t)

  def _write_state(self, args, kernel: plans.Kernel) -> None:
    """A kernel updating slice variables of layout `kernel.state`: one
    update per distinct slice variable (per processor without shared
    memory), on the first processor holding it and reading that
    processor's values; each is a side effect that the step runs."""
    self.sinks.update(self.by_layout(kernel.state, True, kernel.nbytes, kernel.flops, args))

  def _operand(self, op, operand: plans.Operand):
    """Per-processor ids of a plan's operand after its move."""
    t = op.inputs[operand.input]
    return self.execute(operand.move, t.shape, t.dtype.size, self._input_ids(op, operand))

  def _kernel_inputs(self, args, coordinates):
    """A kernel's inputs: its arguments, and the slice offsets of
    `coordinates` (one constant per block) when it reads them."""
    if coordinates is None:
      return list(args)
    return list(args) + [self.by_layout(coordinates)]

  def _result(self, result: plans.Result, ids):
    """A kernel's result after its move: per-processor ids, or a pending sum."""
    ids = self.execute(result.move, result.shape, result.dtype_size, ids)
    if not result.pending_sum_axes:
      return ids
    return _Lazy(result.pending_sum_axes,
                 self.slice_elems(result.shape, result.move.target) * result.dtype_size, ids)

  def _complete(self, value):
    """Per-processor ids of a plan's value, completing a pending sum."""
    if isinstance(value, _Lazy):
      return self.allreduce(value.nbytes, value.axes, value.ids)
    return value

  def time_of(self, cost: OpCost) -> float:
    cost.components = self.components(cost)
    return time_from_components(cost.components, self.params)

  def components(self, cost: OpCost) -> Tuple[float, float, float, float, float]:
    """(FLOPs, bytes, kernels, collective groups, collective bytes) on the
    critical path: the step time is their dot product with (1/flops_per_s,
    1/memory_bytes_per_s, op_overhead_s, collective_latency_s,
    1/collective_bytes_per_s)."""
    p = self.params
    parallel = max(p.parallel_processors or self.mesh_size, 1)
    if p.shares_memory:
      # Logical devices share the real cores: all kernels together (each
      # multi-threaded) do the work, `parallel` cores' worth at a time, and
      # each costs one dispatch.
      flops = cost.work_flops / parallel
      nbytes = cost.bytes_touched / parallel
      dispatched = float(cost.kernels)
    else:
      # Every processor runs its own kernels at the same time.
      flops = cost.work_flops / self.mesh_size
      nbytes = cost.bytes_touched / self.mesh_size
      dispatched = cost.kernels / self.mesh_size
    if p.shares_memory:
      # Each tensor read from another device is a send/receive pair whose
      # fixed cost is like a collective's latency; collectives are host
      # kernels that combine each group's slices in memory (add_n, concat),
      # counted (like all kernels) only where something needs the result.
      return (flops, nbytes, dispatched, float(cost.transfers + cost.combines),
              cost.combine_bytes / parallel)
    if p.hardware:
      # On the machine's links (as the planner prices them): the seconds, in
      # bytes at collective_bytes_per_s so that the step-time formula holds.
      seconds = sum(collective_seconds(c.kind, c.bytes_per_processor, self.mesh_sizes,
                                       c.mesh_axes, self.cluster)
                    for c in cost.collectives)
      return (flops, nbytes, dispatched, 0.0, seconds * p.collective_bytes_per_s)
    # The groups of a collective run concurrently, each on its own links.
    groups = float(len(cost.collectives))
    moved_total = sum(collective_traffic(c.kind, c.bytes_per_processor, c.group_size,
                                         c.mesh_axes) for c in cost.collectives)
    return (flops, nbytes, dispatched, groups, moved_total)


def collective_traffic(kind: str, bytes_per_processor: int, group_size: int,
                       mesh_axes) -> float:
  """Bytes each processor moves over its links for one collective (ring
  algorithms): the one place a collective's communication is priced.

  Example:
    >>> collective_traffic("allreduce", 1024, 4, (1,))
    1536.0
  """
  del mesh_axes  # every mesh axis has the same links here
  g = max(group_size, 1)
  if kind == "allreduce":
    return 2.0 * (g - 1) / g * bytes_per_processor
  if kind == "allgather":
    return float((g - 1) * bytes_per_processor)
  if kind in ("alltoall", "reduce_scatter"):
    return (g - 1) / g * bytes_per_processor
  return float(bytes_per_processor)


@functools.lru_cache(maxsize=4096)
def _levels(mesh_sizes: Tuple[int, ...], mesh_axes: Tuple[int, ...],
            cluster: "hardware_lib.Cluster"):
  return tuple(topology.group_levels(list(mesh_sizes), list(mesh_axes), cluster))


def collective_levels(mesh_sizes: Sequence[int], mesh_axes: Sequence[int],
                      cluster: "hardware_lib.Cluster") -> Tuple["topology.Level", ...]:
  """The links (fastest first) a collective over `mesh_axes` crosses when
  the mesh's processors are `cluster`'s devices (`topology.group_levels`)."""
  return _levels(tuple(mesh_sizes), tuple(mesh_axes), cluster)


def collective_seconds(kind: str, bytes_per_processor: float, mesh_sizes: Sequence[int],
                       mesh_axes: Sequence[int], cluster: "hardware_lib.Cluster") -> float:
  """Seconds of one collective on a cluster's links: hierarchical rings over
  the levels its groups span (NVLink then network; TPU chip, torus, slices).
  The estimate (parameters that name their `hardware`) and the planner
  (`python -m mesh_tensorflow.plan`) both price collectives here.

  Example:
    >>> cluster = hardware_lib.parse_cluster("a100-80gb:16")
    >>> inside = collective_seconds("allreduce", 2**20, [2, 8], [1], cluster)
    >>> across = collective_seconds("allreduce", 2**20, [2, 8], [0], cluster)
    >>> across > inside
    True
  """
  return topology.collective_time(kind, bytes_per_processor,
                                  collective_levels(mesh_sizes, mesh_axes, cluster))


def time_from_components(components, params: DeviceParams) -> float:
  """Seconds from `_Estimator.components` and the device parameters."""
  flops, nbytes, kernels, groups, moved = components
  return (flops / params.flops_per_s + nbytes / params.memory_bytes_per_s
          + kernels * params.op_overhead_s + groups * params.collective_latency_s
          + moved / params.collective_bytes_per_s)


def step_components(estimate_: "CostEstimate"):
  """The five components summed over the step (see `time_from_components`)."""
  total = [0.0] * 5
  for op in estimate_.ops:
    for i, v in enumerate(getattr(op, "components", (0.0,) * 5)):
      total[i] += v
  return tuple(total)
