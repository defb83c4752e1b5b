r"""A cost model for mtf graphs: compute, communication, memory and step time
of a graph under a mesh shape and layout, without lowering it.

For every operation the model prices the plan the lowering executes under the
layout (`mesh_tensorflow.lowering.plans`: the same plan objects, so what is
communicated cannot differ): the FLOPs per processor, each collective (kind,
mesh axes, bytes per processor), pending sums, and how many TensorFlow
kernels run.
Peak memory per processor is the slice variables (trainable ones and
optimizer slots) plus the largest set of activation slices alive at once when
the operations run in graph order (which holds the activations that the
backward pass reads). A few device parameters turn these into a step time.

    >>> est = mtf.cost_model.estimate(graph, "rows:2;cols:4", "batch:rows;hidden:cols")
    >>> est.step_time_s, est.memory.peak_bytes
    >>> print(est.summary())

`estimate(..., exact=True)` lowers the graph into a throwaway TensorFlow graph
instead and reads the lowering's own counters (slower; every op supported).
The analytical mode prices einsum, reductions, softmax and its gradient,
elementwise ops, reshapes, broadcasts, gathers and their gradient, the fused
cross-entropy and variables; any other operation is costed as local work on
its inputs' slices (`OpCost.approximate` is then True).

Calibrate the device parameters on the machine at hand (8 logical CPUs):

    python -m mesh_tensorflow.analysis.cost_model --calibrate [--output params.json]
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import json
import os
import sys
from typing import Dict, List, Optional, Sequence, Tuple

from mesh_tensorflow.core.layout import convert_to_layout_rules, pnum_to_processor_coordinates
from mesh_tensorflow.core.shapes import Shape, convert_to_shape
# The plans the lowering executes, which the estimates price.
from mesh_tensorflow.lowering import plans
from mesh_tensorflow.lowering.policies import (  # noqa: F401  (former home of these names)
    fuses_allreduce, gathers_table_first, split_outermost)

# ----------------------------------------------------------------------------- parameters


@dataclasses.dataclass(frozen=True)
class DeviceParams:
  """Speeds of one kind of device, used to turn counts into seconds.

  Attributes:
    name: a label ("cpu", "gpu", "tpu", "calibrated").
    flops_per_s: matrix-product throughput of one processor.
    memory_bytes_per_s: bytes per second one processor reads and writes in
      elementwise and data-movement kernels.
    collective_bytes_per_s: bytes per second a processor sends in collectives.
    collective_latency_s: fixed cost of one collective (per group).
    op_overhead_s: fixed cost of dispatching one kernel.
    parallel_processors: how many processors compute at the same time (None:
      all of them; on logical CPU devices, the real cores).
    shares_memory: processors share one memory (logical CPU devices of one
      process): processors holding the same (replicated) slice share one
      kernel and one copy, as `PlacementMeshImpl` does there.

  Example:
    >>> p = DeviceParams.default("gpu")
    >>> p.flops_per_s
    1e+14
  """
  name: str
  flops_per_s: float
  memory_bytes_per_s: float
  collective_bytes_per_s: float
  collective_latency_s: float
  op_overhead_s: float
  parallel_processors: Optional[int] = None
  shares_memory: bool = False

  @staticmethod
  def default(kind: str = "cpu") -> "DeviceParams":
    """Default parameters for "cpu" (logical devices of this 2-core machine),
    "gpu" or "tpu"."""
    try:
      return _DEFAULTS[kind.lower()]
    except KeyError:
      raise ValueError(f"DeviceParams.default: unknown device kind {kind!r}; use one of "
                       f"{sorted(_DEFAULTS)} or calibrate (python -m "
                       "mesh_tensorflow.analysis.cost_model --calibrate).") from None

  def to_json(self) -> str:
    return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

  @staticmethod
  def from_json(text_or_path: str) -> "DeviceParams":
    """Reads parameters from a JSON string or file (as written by --calibrate)."""
    text = text_or_path
    if not text_or_path.lstrip().startswith("{"):
      with open(text_or_path) as f:
        text = f.read()
    values = json.loads(text)
    fields = {f.name for f in dataclasses.fields(DeviceParams)}
    unknown = sorted(set(values) - fields)
    if unknown:
      raise ValueError(f"DeviceParams.from_json: unknown fields {unknown}; expected {sorted(fields)}.")
    return DeviceParams(**values)


# "cpu": this project's 2-core machine with 8 logical CPU devices, rounded
# from a non-negative least-squares fit of measured step times
# (benchmarks/layout_search.py --fit; 44 MLP and 28 transformer layouts on a
# quiet machine). On 2 cores the 8 devices add no compute: what separates
# layouts is the work that shared replicas do NOT dedupe (e.g. one allreduce
# result per group of another mesh dimension feeding needed kernels), the
# number of kernels and the bytes they touch; flops_per_s and
# memory_bytes_per_s are per core (the counts are divided by
# parallel_processors). Fitted on either model alone, the parameters rank the
# other model's layouts as well (Spearman 0.94 both ways). GPU and TPU figures
# are round numbers for one modern accelerator and its interconnect.
_DEFAULTS = {
    "cpu": DeviceParams("cpu", flops_per_s=2.7e11, memory_bytes_per_s=2.5e10,
                        collective_bytes_per_s=1e10, collective_latency_s=5e-6,
                        op_overhead_s=1e-5, parallel_processors=2, shares_memory=True),
    "gpu": DeviceParams("gpu", flops_per_s=1e14, memory_bytes_per_s=1.5e12,
                        collective_bytes_per_s=1e11, collective_latency_s=15e-6,
                        op_overhead_s=5e-6),
    "tpu": DeviceParams("tpu", flops_per_s=1.2e14, memory_bytes_per_s=1.2e12,
                        collective_bytes_per_s=5e10, collective_latency_s=5e-6,
                        op_overhead_s=1e-6),
}


def as_device_params(params) -> DeviceParams:
  """None -> CPU defaults; "cpu"/"gpu"/"tpu"; a DeviceParams; a JSON path."""
  if params is None:
    return DeviceParams.default("cpu")
  if isinstance(params, DeviceParams):
    return params
  if isinstance(params, str):
    if params.lower() in _DEFAULTS:
      return DeviceParams.default(params)
    return DeviceParams.from_json(params)
  if isinstance(params, dict):
    return DeviceParams(**params)
  raise TypeError(f"device params must be a DeviceParams, 'cpu'/'gpu'/'tpu' or a JSON path, "
                  f"got {params!r}.")


# ----------------------------------------------------------------------------- results

Collective = collections.namedtuple(
    "Collective", ["op_name", "kind", "mesh_axes", "bytes_per_processor", "group_size",
                   "num_groups"])


@dataclasses.dataclass
class OpCost:
  """Cost of one mtf operation under a layout.

  Attributes:
    name, type: the operation's name and class name.
    flops: FLOPs per processor (counted as the lowering counts them).
    bytes_touched: bytes per processor its kernels read and write.
    kernels: TensorFlow kernels it runs (all processors together).
    collectives: the collectives the lowering emits for it (including a
      pending allreduce of an input that it completes).
    time_s: estimated seconds (compute, dispatch and communication).
    approximate: the analytical model has no rule for this op type and
      treats it as local work on its inputs.
    components: the time components (see `time_from_components`).
    work_flops: matrix-product FLOPs of all its distinct kernels together
      (what processors sharing cores compute in all).
    transfers: tensors its kernels read from another device (shared memory).
    combines: kernels that combine a group's slices for a collective
      (add_n, concat; shared memory).
    combine_bytes: bytes those kernels read and write.

  Kernels whose results nothing needed (no variable update or exported
  output depends on them) are not counted: TensorFlow prunes them from the
  function before it runs (e.g. the redundant groups of an allreduce whose
  result is replicated along another mesh dimension).
  """
  name: str
  type: str
  flops: int = 0
  bytes_touched: int = 0
  kernels: int = 0
  collectives: List[Collective] = dataclasses.field(default_factory=list)
  time_s: float = 0.0
  approximate: bool = False
  components: Tuple[float, float, float, float, float] = (0.0, 0.0, 0.0, 0.0, 0.0)
  work_flops: int = 0
  transfers: int = 0
  combines: int = 0
  combine_bytes: int = 0

  @property
  def comm_bytes(self) -> int:
    return sum(c.bytes_per_processor for c in self.collectives)


@dataclasses.dataclass
class MemoryEstimate:
  """Bytes per processor (the most loaded one; every processor holds the same
  amount under an even layout).

  Attributes:
    variables: trainable slice variables.
    slots: non-trainable slice variables (optimizer slots, step counters).
    activations: the most activation slices alive at once, running the
      operations in order (this includes those kept for the backward pass).
    peak_bytes: their sum.
    per_variable: {variable name: slice bytes per processor}.
  """
  variables: int
  slots: int
  activations: int
  per_variable: Dict[str, int]

  @property
  def variable_bytes(self) -> int:
    return self.variables + self.slots

  @property
  def peak_bytes(self) -> int:
    return self.variables + self.slots + self.activations


@dataclasses.dataclass
class CostEstimate:
  """What `estimate` returns.

  Attributes:
    mesh_shape: the mtf Shape of the mesh.
    layout: the LayoutRules.
    ops: one OpCost per operation, in graph order.
    memory: a MemoryEstimate.
    params: the DeviceParams used.
    exact: whether the communication and FLOPs came from a real lowering.
  """
  mesh_shape: Shape
  layout: object
  ops: List[OpCost]
  memory: MemoryEstimate
  params: DeviceParams
  exact: bool = False

  @property
  def collectives(self) -> List[Collective]:
    return [c for op in self.ops for c in op.collectives]

  @property
  def flops(self) -> int:
    """FLOPs per processor."""
    return sum(op.flops for op in self.ops)

  @property
  def step_time_s(self) -> float:
    return sum(op.time_s for op in self.ops)

  @property
  def comm_bytes(self) -> int:
    """Bytes per processor sent in collectives."""
    return sum(c.bytes_per_processor for c in self.collectives)

  def collective_counts(self, op_name_prefix: str = "") -> Dict[str, Tuple[int, int]]:
    """{kind: (number of collectives, bytes per processor)}, like
    `Lowering.collective_counts`."""
    out = {}
    for c in self.collectives:
      if c.op_name.startswith(op_name_prefix):
        n, b = out.get(c.kind, (0, 0))
        out[c.kind] = (n + 1, b + c.bytes_per_processor)
    return out

  @property
  def counters(self):
    """(key, value) pairs like `Lowering.counters`."""
    out = []
    for c in self.collectives:
      out.append((f"collectives/{c.kind}", 1))
      out.append((f"collective_bytes/{c.kind}", c.bytes_per_processor))
    out.append(("flops", self.flops))
    return out

  def summary(self) -> str:
    """A few lines: step time, FLOPs, communication, memory."""
    counts = ", ".join(f"{k} x{n} ({_fmt_bytes(b)})"
                       for k, (n, b) in sorted(self.collective_counts().items())) or "none"
    m = self.memory
    return (f"mesh '{self.mesh_shape.to_string()}', layout '{self.layout.to_string()}': "
            f"estimated step {self.step_time_s * 1e3:.3f} ms ({self.params.name}); "
            f"{self.flops:,} FLOPs/processor; collectives: {counts}; memory/processor "
            f"{_fmt_bytes(m.peak_bytes)} (variables {_fmt_bytes(m.variables)}, slots "
            f"{_fmt_bytes(m.slots)}, activations {_fmt_bytes(m.activations)})")


def _fmt_bytes(n: float) -> str:
  for unit in ("B", "KiB", "MiB", "GiB"):
    if abs(n) < 1024 or unit == "GiB":
      return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
    n /= 1024.0
  return f"{n} B"


# ----------------------------------------------------------------------------- the model


class _Lazy:
  """A pending allreduce over `axes` of partial sums (`nbytes` per
  processor; `ids` identifies each processor's partial-sum tensor)."""
  __slots__ = ("axes", "nbytes", "ids")

  def __init__(self, axes, nbytes, ids):
    self.axes = tuple(sorted(axes))
    self.nbytes = nbytes
    self.ids = ids


class _Estimator:
  """Walks the graph once, pricing the plans the lowering executes.

  Besides the layouts it follows which processors hold the very same
  TensorFlow tensor, as PlacementMeshImpl does with shared memory: a
  slicewise op runs one kernel per distinct combination of input tensors, an
  allreduce makes one tensor per group, and so on. That gives the number of
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
    self.share = params.shares_memory
    self.coords = [tuple(pnum_to_processor_coordinates(mesh_shape, p))
                   for p in range(self.mesh_size)]
    self._layouts = {}
    self._next_id = itertools.count(1)
    self.state = {}  # tensor -> _Lazy, or a tuple of per-processor tensor ids
    self.device = {}  # tensor id -> the processor whose device computes it
    # The kernels, as [op cost, output id, input ids, kernels, bytes, flops,
    # combine bytes]; only those that a sink needs are counted (`_prune`).
    self.units = []
    self.sinks = set()  # ids of kernels with side effects (variable updates)
    # Per-processor ids that are the blocks of one existing tensor (imports
    # split along one mesh axis, slice_along results): gathering them is free.
    self.blocks = set()
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
    layout = self.layout(shape) if layout is None else layout
    n = 1
    for d, a in zip(shape.dims, layout):
      n *= d.size // self.mesh_sizes[a] if a is not None else d.size
    return n

  def slice_bytes(self, t) -> int:
    return self.slice_elems(t.shape) * t.dtype.size

  def distinct(self, layout) -> int:
    """Distinct slices of a tensor of this layout."""
    n = 1
    for a in set(a for a in layout if a is not None):
      n *= self.mesh_sizes[a]
    return n

  # ---- which processors share a tensor ---------------------------------------
  def _memo(self, keys, count: bool, nbytes: int = 0, flops: int = 0, inputs=()):
    """Per-processor ids: one new tensor per distinct key (shared memory) or
    per processor; counts the kernels that make them, and the tensors they
    read from another device (each a send/receive pair in TensorFlow)."""
    memo = {}
    out = []
    for p, k in enumerate(keys):
      if self.share and k in memo:
        out.append(memo[k])
        continue
      new = next(self._next_id)
      memo[k] = new
      self.device[new] = p
      if count:
        self.unit(new, tuple(x[p] for x in inputs), 1, nbytes, flops)
      out.append(new)
    return tuple(out)

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
    reads (a send/receive pair per tensor and device)."""
    producer = {u[1]: u for u in self.units}
    live = set()
    stack = [i for i in self.sinks]
    while stack:
      i = stack.pop()
      if i in live:
        continue
      live.add(i)
      u = producer.get(i)
      if u is not None:
        stack.extend(u[2])
    for op in ops:
      op.kernels = op.bytes_touched = op.work_flops = op.transfers = 0
      op.combines = op.combine_bytes = 0
    moved = set()
    for cost, out_id, ins, kernels, nbytes, flops, cbytes in self.units:
      if out_id not in live:
        continue
      cost.kernels += kernels
      cost.bytes_touched += kernels * nbytes
      cost.work_flops += kernels * flops
      if cbytes:
        cost.combines += 1
        cost.combine_bytes += cbytes
      dev = self.device.get(out_id)
      for i in ins:
        src = self.device.get(i, dev)
        if src != dev and (i, dev) not in moved:
          moved.add((i, dev))
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
    keys = [tuple(x[p] for x in inputs) for p in range(self.mesh_size)]
    return self._memo(keys, True, nbytes, flops, inputs)

  def by_layout(self, layout, count: bool = True, nbytes: int = 0):
    """make_slices / slice variables: one tensor per distinct slice."""
    axes = [a for a in layout if a is not None]
    keys = [tuple(c[a] for a in axes) for c in self.coords]
    return self._memo(keys, count, nbytes)

  def _groups(self, axes):
    axes = set(axes)
    return [tuple(x for i, x in enumerate(c) if i not in axes) for c in self.coords]

  def combine_ids(self, ids, axes, nbytes: int, moved: int = 0):
    """allreduce / allconcat result: one tensor per group (each group's
    members share it), or one per processor without shared memory.
    nbytes: the result's bytes; moved: bytes the combining kernel reads and
    writes."""
    axes = [a for a in axes if self.mesh_sizes[a] > 1]
    if not axes:
      return ids
    keys = self._groups(axes)
    # Each group's slices are combined on its first member's device.
    first, members = {}, collections.defaultdict(list)
    for p, k in enumerate(keys):
      first.setdefault(k, p)
      members[k].append(ids[p])
    memo = {}
    for k, p in first.items():
      memo[k] = next(self._next_id)
      self.device[memo[k]] = p
      self.unit(memo[k], members[k], 1, 0, 0, max(int(moved or 2 * nbytes), 1))
    combined = tuple(memo[k] for k in keys)
    if not self.share:  # an identity on every device
      return self._memo(list(range(self.mesh_size)), True, nbytes, inputs=[combined])
    return combined

  def alltoall_ids(self, ids, axis: int, nbytes: int):
    if self.mesh_sizes[axis] == 1:
      return ids
    # A split on every processor, and a concat of the group's pieces.
    keys = self._groups([axis])
    members = collections.defaultdict(list)
    for p, k in enumerate(keys):
      members[k].append(ids[p])
    out = []
    for p, k in enumerate(keys):
      new = next(self._next_id)
      self.device[new] = p
      self.unit(new, members[k], 2, nbytes)
      out.append(new)
    return tuple(out)

  def slice_along_ids(self, ids, axis: int, nbytes: int):
    if self.mesh_sizes[axis] == 1:
      return ids
    keys = [(ids[p], self.coords[p][axis]) for p in range(self.mesh_size)]
    sliced = self._memo(keys, True, nbytes, inputs=[ids])
    self.blocks.add(tuple(sliced))
    return sliced

  # ---- recording ------------------------------------------------------------
  def collective(self, kind, nbytes, axes):
    axes = tuple(axes)
    group = 1
    for a in axes:
      group *= self.mesh_sizes[a]
    self.current.collectives.append(Collective(
        self.current.name, kind, axes, int(nbytes), group, self.mesh_size // max(group, 1)))

  def allreduce(self, nbytes, axes, ids):
    axes = [a for a in axes if self.mesh_sizes[a] > 1]
    if not axes:
      return ids
    self.collective("allreduce", nbytes, axes)
    group = 1
    for a in axes:
      group *= self.mesh_sizes[a]
    return self.combine_ids(ids, axes, nbytes, (group + 1) * nbytes)

  def laid_out(self, t):
    """Per-processor ids of t, completing a pending allreduce first, as
    Lowering.laid_out does."""
    s = self.state.get(t)
    if isinstance(s, _Lazy):
      s = self.allreduce(s.nbytes, s.axes, s.ids)
      self.state[t] = s
    if s is None:  # produced by an op this estimate skipped: assume by layout
      s = self.state[t] = self.by_layout(self.layout(t.shape), count=False)
    return s

  def execute(self, plan: plans.Redistribution, shape: Shape, dtype_size: int, ids,
              record: bool = True):
    """Prices the steps of a redistribution plan (the one the lowering
    executes) as the mesh implementation runs them: each collective sends
    the slice of the layout before it. Returns the per-processor ids."""
    for step, layout in plan.walk():
      size = self.mesh_sizes[step.mesh_axis]
      if size == 1:
        continue
      if isinstance(step, plans.SliceAlong):
        ids = self.slice_along_ids(ids, step.mesh_axis,
                                   self.slice_elems(shape, step.apply(layout)) * dtype_size)
        continue
      nbytes = self.slice_elems(shape, layout) * dtype_size
      if record:
        self.collective(step.kind, nbytes, [step.mesh_axis])
      if isinstance(step, plans.AllGather):
        ids = self.combine_ids(ids, [step.mesh_axis], nbytes * size)
      else:
        ids = self.alltoall_ids(ids, step.mesh_axis, nbytes)
    return ids

  # ---- operations -----------------------------------------------------------
  def run(self) -> List[OpCost]:
    ops = []
    for op in self.operations:
      cost = OpCost(op.name, type(op).__name__)
      self.current = cost
      handler = _HANDLERS.get(type(op).__name__)
      if handler is None:
        for klass in type(op).__mro__:
          handler = _HANDLERS.get(klass.__name__)
          if handler is not None:
            break
      if handler is None:
        cost.approximate = True
        handler = _generic
      handler(self, op)
      ops.append(cost)
    self.add_exports(self.outputs)
    self._prune(ops)
    for cost in ops:
      cost.time_s = self.time_of(cost)
    return ops

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
    groups = 0.0
    moved_total = 0.0
    for c in cost.collectives:
      g = c.group_size
      if c.kind == "allreduce":
        moved = 2.0 * (g - 1) / g * c.bytes_per_processor
      elif c.kind == "allgather":
        moved = (g - 1) * c.bytes_per_processor
      elif c.kind == "alltoall":
        moved = (g - 1) / g * c.bytes_per_processor
      else:
        moved = c.bytes_per_processor
      # The groups run concurrently, each on its own links.
      groups += 1.0
      moved_total += moved
    return (flops, nbytes, dispatched, groups, moved_total)


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


def _generic(est: _Estimator, op):
  ins = [est.laid_out(t) for t in op.inputs]
  nbytes = sum(est.slice_bytes(t) for t in op.inputs) + sum(est.slice_bytes(t) for t in op.outputs)
  ids = est.slicewise(ins, nbytes)
  for t in op.outputs:
    est.state[t] = ids


def _variable(est: _Estimator, op):
  out = op.outputs[0]
  slices = est.by_layout(est.layout(out.shape), count=False)
  est.state[out] = est.slicewise([slices], 2 * est.slice_bytes(out))


def _assign(est: _Estimator, op):
  for t in op.inputs:
    ids = est.laid_out(t)
    # One assign per distinct slice variable, on the first processor that
    # holds it, reading that processor's value.
    axes = [a for a in est.layout(t.shape) if a is not None]
    seen = set()
    for p, c in enumerate(est.coords):
      key = tuple(c[a] for a in axes) if est.share else p
      if key in seen:
        continue
      seen.add(key)
      new = next(est._next_id)  # pylint: disable=protected-access
      est.device[new] = p
      est.unit(new, (ids[p],), 1, 2 * est.slice_bytes(t))
      est.sinks.add(new)


def _elementwise(est: _Estimator, op):
  ins = [est.laid_out(t) for t in op.inputs]
  out = op.outputs[0]
  elems = est.slice_elems(out.shape)
  est.current.flops += elems
  nbytes = sum(est.slice_bytes(t) for t in op.inputs) + elems * out.dtype.size
  est.state[out] = est.slicewise(ins, nbytes)


def _lazy_add(est: _Estimator, op):
  a, b = (est.state.get(t) for t in op.inputs)
  out = op.outputs[0]
  if plans.adds_pending_sums(a.axes if isinstance(a, _Lazy) else None,
                             b.axes if isinstance(b, _Lazy) else None,
                             op.inputs[0].shape, op.inputs[1].shape, out.shape):
    ids = est.slicewise([a.ids, b.ids], 3 * a.nbytes)
    est.state[out] = _Lazy(a.axes, a.nbytes, ids)
    return
  _elementwise(est, op)


def _local(est: _Estimator, op):
  """Broadcast, transpose: local, one kernel per distinct input slice."""
  ins = [est.laid_out(t) for t in op.inputs]
  out = op.outputs[0]
  est.state[out] = est.slicewise(ins, est.slice_bytes(op.inputs[0]) + est.slice_bytes(out))


def _einsum(est: _Estimator, op):
  """Prices the EinsumPlan that EinsumOperation.lower executes."""
  out = op.outputs[0]
  plan = plans.plan_einsum(op.inputs, out, est.layout, est.mesh_sizes, est.share)
  est.current.flops += plan.flops
  per_kernel, local_bytes = plan.flops, plan.operand_bytes
  operands = [est.laid_out(t) for t in op.inputs]  # completes pending sums
  if plan.fused:
    # Shared memory: the operands are gathered along the summed dimensions
    # (counted as the allreduce) and multiplied once per group.
    est.collective("allreduce", plan.output_bytes, plan.reduced_axes)
    ins = [est.execute(move, t.shape, t.dtype.size, ids, record=False)
           for t, ids, move in zip(op.inputs, operands, plan.operand_moves)]
    group = 1
    for a in plan.reduced_axes:
      group *= est.mesh_sizes[a]
    per_kernel *= group
    local_bytes *= group
  else:
    ins = [est.execute(move, t.shape, t.dtype.size, ids)
           for t, ids, move in zip(op.inputs, operands, plan.operand_moves)]
  batched = None
  if est.share and not plan.reduced_axes:
    batched = plans.batchable_operand(
        op.inputs, out, est.layout, est.mesh_sizes,
        is_shared=lambda i: len(set(ins[i])) == 1,
        holds_blocks=lambda i, axis: tuple(ins[i]) in est.blocks)
  out_bytes = plan.output_bytes
  if batched is not None:
    # Shared memory: one product on the concatenated operand, then each
    # processor takes its rows.
    i, axis = batched
    ins[i] = est.combine_ids(ins[i], [axis], local_bytes)
    per_kernel = plan.flops * est.mesh_sizes[axis]
    ids = est.slicewise(ins, (local_bytes + out_bytes) * est.mesh_sizes[axis], per_kernel)
    ids = est.slice_along_ids(ids, axis, out_bytes)
  else:
    ids = est.slicewise(ins, local_bytes + out_bytes, per_kernel)
  est.state[out] = _Lazy(plan.pending_sum_axes, out_bytes, ids) if plan.pending_sum_axes else ids


def _reduce(est: _Estimator, op):
  """Prices the ReducePlan that ReduceOperation.lower executes."""
  x, out = op.inputs[0], op.outputs[0]
  s = est.state.get(x)
  pending = isinstance(s, _Lazy)
  plan = plans.plan_reduce(x.shape, out.shape, op.reduction_fn_string, x.dtype.name == "bool",
                           s.axes if pending else None, est.layout)
  out_bytes = est.slice_bytes(out)
  if plan.folds_pending:
    partial = est.slicewise([s.ids], s.nbytes + out_bytes)
  else:
    ids = est.laid_out(x)
    est.current.flops += est.slice_elems(x.shape)
    partial = est.slicewise([ids], est.slice_bytes(x) + out_bytes)
  if plan.pending:
    est.state[out] = _Lazy(plan.mesh_axes, out_bytes, partial)
  elif plan.allreduce is not None:
    est.state[out] = est.allreduce(out_bytes, plan.allreduce.mesh_axes, partial)
  else:
    est.state[out] = partial


def _reshape(est: _Estimator, op):
  """Prices the ReshapePlan that ReshapeOperation.lower executes."""
  x, out = op.inputs[0], op.outputs[0]
  plan = plans.plan_reshape(x.shape, out.shape, est.layout, est.mesh_sizes)
  ids = est.execute(plan.before, x.shape, x.dtype.size, est.laid_out(x))
  ids = est.slicewise([ids], 2 * est.slice_bytes(out))
  est.state[out] = est.execute(plan.after, out.shape, out.dtype.size, ids)


def _gather(est: _Estimator, op):
  """Prices the GatherPlan that GatherOperation.lower executes."""
  weights, indices = op.inputs
  out = op.outputs[0]
  plan = plans.plan_gather(weights, indices, out, op._dim, est.layout, est.mesh_sizes)  # pylint: disable=protected-access
  w_ids = est.execute(plan.table_move, weights.shape, weights.dtype.size, est.laid_out(weights))
  a = plan.masked_axis
  out_bytes = est.slice_bytes(out)
  ins = [w_ids, est.laid_out(indices)]
  if a is not None:
    ins.append(est.by_layout(est.layout(weights.shape)))  # slice offsets
  ids = est.slicewise(ins, out_bytes + est.slice_bytes(indices))
  est.state[out] = _Lazy([a], out_bytes, ids) if (
      a is not None and est.mesh_sizes[a] > 1) else ids


def _scatter_add_grad(est: _Estimator, op):
  """Prices the ScatterAddPlan that ScatterAddGradOperation.lower executes."""
  g, indices = op.inputs
  out = op.outputs[0]
  plan = plans.plan_scatter_add(out.shape, indices.shape, op._dim, est.layout)  # pylint: disable=protected-access
  ins = [est.laid_out(g), est.laid_out(indices)]
  if plan.uses_offsets:
    ins.append(est.by_layout(est.layout(out.shape)))  # slice offsets
  cur_bytes = est.slice_elems(out.shape, plan.computed_layout) * out.dtype.size
  ids = est.slicewise(ins, est.slice_bytes(g) + cur_bytes)
  if plan.allreduce is not None:
    ids = est.allreduce(cur_bytes, plan.allreduce.mesh_axes, ids)
  ids = est.execute(plan.after, out.shape, out.dtype.size, ids)
  axes = [a for a in plan.pending_sum_axes if est.mesh_sizes[a] > 1]
  est.state[out] = _Lazy(axes, est.slice_bytes(out), ids) if axes else ids


def _sparse_xent(est: _Estimator, op):
  """Prices SparseSoftmaxCrossEntropyOperation: TensorFlow's fused kernel,
  or, with vocab split, the statistics' allreduces of its plan."""
  logits, ids_t = op.inputs
  lg = est.laid_out(logits)
  idx = est.laid_out(ids_t)
  statistics = plans.plan_statistics(logits.shape, op._vocab_dim, est.layout,  # pylint: disable=protected-access
                                     ("MAX", "SUM", "SUM"))
  out = op.outputs[0]
  lg_bytes = est.slice_bytes(logits)
  prep = est.slicewise([lg, idx], 2 * lg_bytes)
  if not statistics:  # TensorFlow's fused kernel (and a logsumexp)
    result = est.slicewise([prep], 3 * lg_bytes)
  else:  # max, partial sums and target logits, three allreduces, finish
    max_step, sum_exp_step, target_step = statistics
    nbytes = est.slice_elems(out.shape) * 4  # float32 partials
    offsets = est.by_layout(est.layout(logits.shape))
    maxes = est.allreduce(nbytes, max_step.mesh_axes, est.slicewise([prep], lg_bytes))
    partial = est.slicewise([prep, idx, maxes, offsets], 2 * lg_bytes)
    sum_exp = est.allreduce(nbytes, sum_exp_step.mesh_axes, partial)
    target = est.allreduce(nbytes, target_step.mesh_axes, partial)
    result = est.slicewise([prep, idx, maxes, sum_exp, target, offsets], 3 * lg_bytes)
  est.state[op.outputs[0]] = result
  est.state[op.outputs[1]] = result
  est.state[op.outputs[2]] = est.slicewise([result], 2 * lg_bytes)


def _softmax(est: _Estimator, op):
  """One fused kernel per slice, or, with the dimension split: the MAX and
  SUM allreduces of the plan's per-slice statistics around four slicewise
  kernels."""
  x, out = op.inputs[0], op.outputs[0]
  ids = est.laid_out(x)
  nbytes = est.slice_bytes(x)
  est.current.flops += 5 * est.slice_elems(x.shape)
  dim = op.reduced_dim
  statistics = plans.plan_statistics(x.shape, dim, est.layout, ("MAX", "SUM"))
  if not statistics:
    est.state[out] = est.slicewise([ids], 2 * nbytes)
    return
  max_step, sum_step = statistics
  stats_bytes = est.slice_elems(x.shape - [dim]) * x.dtype.size
  maxes = est.allreduce(stats_bytes, max_step.mesh_axes,
                        est.slicewise([ids], nbytes + stats_bytes))
  shifted = est.slicewise([ids, maxes], 2 * nbytes)
  exps = est.slicewise([shifted], 2 * nbytes)
  sums = est.allreduce(stats_bytes, sum_step.mesh_axes,
                       est.slicewise([exps], nbytes + stats_bytes))
  est.state[out] = est.slicewise([shifted if op.log else exps, sums], 2 * nbytes)


def _softmax_grad(est: _Estimator, op):
  """Per slice a product and a sum that keeps the dimension, the plan's SUM
  allreduce of the sums when the dimension is split, then one elementwise
  kernel."""
  y, dy = op.inputs
  ids_y, ids_dy = est.laid_out(y), est.laid_out(dy)
  nbytes = est.slice_bytes(y)
  est.current.flops += 4 * est.slice_elems(y.shape)
  dim = op.reduced_dim
  stats_bytes = est.slice_elems(y.shape - [dim]) * y.dtype.size
  sums = est.slicewise([ids_y, ids_dy], 2 * nbytes + stats_bytes)
  for step in plans.plan_statistics(y.shape, dim, est.layout, ("SUM",)):
    sums = est.allreduce(stats_bytes, step.mesh_axes, sums)
  est.state[op.outputs[0]] = est.slicewise([ids_y, ids_dy, sums], 3 * nbytes)


def _source(est: _Estimator, op):
  """Imports and constants: one tensor per distinct slice (a fully
  replicated import: one identity of the shared input)."""
  for t in op.outputs:
    layout = est.layout(t.shape)
    if all(x is None for x in layout):
      est.state[t] = est.slicewise([], est.slice_bytes(t))
    else:
      est.state[t] = est.by_layout(layout, nbytes=est.slice_bytes(t))
      if type(op).__name__ == "ImportOperation" and sum(a is not None for a in layout) == 1:
        est.blocks.add(tuple(est.state[t]))


def _passthrough(est: _Estimator, op):
  """stop_gradient / depend: the input slices themselves (a pending
  allreduce completes), or an identity on every processor when there are
  dependencies."""
  ins = [est.laid_out(t) for t in op.inputs]
  extra = len(op.inputs) > len(op.outputs)
  for i, t in enumerate(op.outputs):
    if extra:
      new = []
      for p in range(est.mesh_size):
        new.append(next(est._next_id))  # pylint: disable=protected-access
        est.device[new[-1]] = p
        est.unit(new[-1], tuple(x[p] for x in ins))
      est.state[t] = tuple(new)
    else:
      est.state[t] = ins[i]


_HANDLERS = {
    "Variable": _variable,
    "Assign": _assign,
    "EinsumOperation": _einsum,
    "ReduceOperation": _reduce,
    "_LazyAwareAdd": _lazy_add,
    "ElementwiseOperation": _elementwise,
    "ReshapeOperation": _reshape,
    "BroadcastOperation": _local,
    "TransposeOperation": _local,
    "GatherOperation": _gather,
    "ScatterAddGradOperation": _scatter_add_grad,
    "SparseSoftmaxCrossEntropyOperation": _sparse_xent,
    "SoftmaxOperation": _softmax,
    "SoftmaxGradOperation": _softmax_grad,
    "_IdentityLike": _passthrough,
    "ImportOperation": _source,
    "ConstantOperation": _source,
}


# ----------------------------------------------------------------------------- memory


def memory_estimate(graph, mesh_shape, layout, shares_memory: bool = False) -> MemoryEstimate:
  """Peak bytes per processor: slice variables, optimizer slots, activations.

  Args:
    graph: the mtf.Graph.
    mesh_shape: e.g. "rows:2;cols:4".
    layout: layout rules.
    shares_memory: count replicated activation slices once per distinct
      slice, divided over the processors (logical CPU devices of one process).

  Example:
    >>> memory_estimate(graph, "all:8", "batch:all").variables
  """
  mesh_shape = convert_to_shape(mesh_shape)
  rules = convert_to_layout_rules(layout)
  est = _Estimator(graph.operations, mesh_shape, rules, DeviceParams.default("cpu"))
  return _memory(est, graph.operations, shares_memory)


def _memory(est: _Estimator, operations, shares_memory: bool) -> MemoryEstimate:
  variables = slots = 0
  per_variable = {}
  for op in operations:
    if getattr(op, "is_variable", False):
      n = est.slice_elems(op.shape) * op.slice_dtype.size
      per_variable[op.name] = n
      if op.trainable:
        variables += n
      else:
        slots += n
  # Liveness over graph order: a tensor lives from its op to its last reader.
  last_use = {}
  for i, op in enumerate(operations):
    for t in op.inputs:
      last_use[t] = i
  live = 0
  peak = 0
  dying = collections.defaultdict(int)
  for i, op in enumerate(operations):
    if not getattr(op, "is_variable", False):
      for t in op.outputs:
        if t in last_use:
          b = est.slice_bytes(t)
          if shares_memory:
            b = b * est.distinct(est.layout(t.shape)) // est.mesh_size
          live += b
          dying[last_use[t]] += b
    peak = max(peak, live)
    live -= dying.pop(i, 0)
  return MemoryEstimate(variables, slots, peak, per_variable)


# ----------------------------------------------------------------------------- entry points


def estimate(graph, mesh_shape, layout, params=None, exact: bool = False,
             operations: Optional[Sequence] = None, check: bool = True,
             outputs: Optional[Sequence] = None) -> CostEstimate:
  """Estimates compute, communication, memory and step time of `graph`.

  Args:
    graph: an mtf.Graph (a training step: model, gradients, updates).
    mesh_shape: e.g. "rows:2;cols:4" or an mtf Shape.
    layout: layout rules, e.g. "batch:rows;hidden:cols".
    params: DeviceParams, "cpu" (default), "gpu", "tpu" or a JSON file from
      `python -m mesh_tensorflow.analysis.cost_model --calibrate`.
    exact: take FLOPs and collectives from a real lowering into a throwaway
      TensorFlow graph (slower; exact for every op type).
    operations: cost only these operations of the graph (default: all).
    check: first check that the layout is legal for every tensor (searches
      that only try legal layouts skip this).
    outputs: the mtf tensors the step exports (fetches). Default: those no
      operation reads, and in a step that updates variables only the scalar
      ones (the loss). Kernels that neither an export nor a variable update
      needs are not counted, as TensorFlow prunes them.

  Returns:
    A CostEstimate.

  Raises:
    ValueError: if the layout is illegal for a tensor of the graph (the
      message names the tensor, dimension and rule).

  Example:
    >>> est = estimate(graph, "all:8", "batch:all")   # an MLP's training step
    >>> sorted(est.collective_counts())                 # the weight gradients
    ['allreduce']
  """
  mesh_shape = convert_to_shape(mesh_shape)
  if mesh_shape is None:
    raise ValueError("estimate: mesh_shape is empty; write e.g. 'all:8' or 'rows:2;cols:4'.")
  rules = convert_to_layout_rules(layout)
  rules.check_mesh_shape(mesh_shape)
  params = as_device_params(params)
  operations = list(graph.operations if operations is None else operations)
  if outputs is not None:
    outputs = list(outputs)
    produced = {t for op in operations for t in op.outputs}
    for t in outputs:
      if t not in produced:
        raise ValueError(f"estimate: output {getattr(t, 'name', t)!r} is not an mtf tensor "
                         "that the costed operations produce; pass tensors of this graph "
                         "(or leave outputs=None).")
  est = _Estimator(operations, mesh_shape, rules, params, outputs)
  if check:  # clear errors for illegal layouts first
    for op in operations:
      for t in op.outputs:
        rules.tensor_layout(t.shape, mesh_shape, t.name)
  ops = est.run()
  memory = _memory(est, operations, False)
  result = CostEstimate(mesh_shape, rules, ops, memory, params)
  if exact:
    _apply_exact(result, est, graph, mesh_shape, rules)
  return result


def _apply_exact(result: CostEstimate, est: _Estimator, graph, mesh_shape, rules):
  """Replaces FLOPs and collectives by those of a real lowering."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from mesh_tensorflow.lowering.lowering import Lowering  # pylint: disable=g-import-not-at-top
  from mesh_tensorflow.lowering.placement_mesh_impl import PlacementMeshImpl  # pylint: disable=g-import-not-at-top
  meshes = {op.mesh for op in graph.operations}
  swapped = []
  with tf.Graph().as_default():
    # Imported TensorFlow tensors and variables (eager, or from the graph of a
    # tf.function) cannot be used in this graph: import zeros of their shape.
    for op in graph.operations:
      source = getattr(op, "_source", None)
      if tf.is_tensor(source) or isinstance(source, tf.Variable):
        swapped.append((op, source))
        op._source = tf.zeros(op.outputs[0].shape.to_integer_list(), source.dtype)  # pylint: disable=protected-access
    impls = {m: PlacementMeshImpl(mesh_shape, rules, [f"/cpu:{i}" for i in range(mesh_shape.size)],
                                  share_replicas=result.params.shares_memory)
             for m in meshes}
    try:
      lowering = Lowering(graph, impls)
    finally:
      for op, source in swapped:
        op._source = source  # pylint: disable=protected-access
      graph._lowered_into.discard(tf.compat.v1.get_default_graph())  # pylint: disable=protected-access
  by_name = {op.name: op for op in result.ops}
  for op in result.ops:
    op.collectives = []
    op.flops = 0
    op.approximate = False
  for r in lowering.collective_records:
    target = by_name.get(r.op_name)
    if target is None:
      target = by_name.setdefault(r.op_name, OpCost(r.op_name, "export"))
      result.ops.append(target)
    target.collectives.append(Collective(*r))
  for name, fl in lowering.flops.items():
    if name in by_name:
      by_name[name].flops += fl
  for op in result.ops:
    op.time_s = est.time_of(op)
  result.exact = True


# ----------------------------------------------------------------------------- calibration


def calibrate(num_devices: int = 8, repeats: int = 5) -> DeviceParams:
  """Measures DeviceParams on the CPU devices of this machine.

  Run through `python -m mesh_tensorflow.analysis.cost_model --calibrate`, which
  creates `num_devices` logical CPU devices first. Measures: the fixed cost
  of a kernel (a chain of tiny ops), matrix-product FLOP/s, elementwise
  bytes/s, how many devices compute at once (the same products on 1 and on
  all devices), and the latency and bandwidth of an allreduce across the
  devices as PlacementMeshImpl performs it.

  Example:
    >>> params = calibrate()
    >>> params.op_overhead_s < 1e-3
    True
  """
  import time  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  devices = [d.name for d in tf.config.list_logical_devices("CPU")][:num_devices]
  if len(devices) < num_devices:
    raise ValueError(f"calibrate: {num_devices} CPU devices needed, {len(devices)} exist. "
                     "Run `python -m mesh_tensorflow.analysis.cost_model --calibrate`, which "
                     "creates them before TensorFlow starts.")

  def timed(fn, inner=1):
    fn()
    fn()
    samples = []
    for _ in range(repeats):
      t0 = time.perf_counter()
      fn()
      samples.append((time.perf_counter() - t0) / inner)
    samples.sort()
    return samples[len(samples) // 2]

  # Kernel overhead: a chain of 200 tiny ops minus an empty function.
  small = tf.constant([1.0])

  @tf.function
  def chain():
    x = small
    for i in range(200):
      with tf.device(devices[i % len(devices)]):
        x = x + 1.0
    return x

  @tf.function
  def empty():
    return small + 1.0
  overhead = max((timed(chain) - timed(empty)) / 199, 1e-7)

  # Matrix products: one device, then all devices at once.
  n = 512
  mats = [tf.random.normal([n, n], seed=i) for i in range(len(devices))]

  @tf.function
  def one_matmul():
    with tf.device(devices[0]):
      y = mats[0]
      for _ in range(4):
        y = tf.matmul(y, mats[0])
      return tf.reduce_sum(y)

  @tf.function
  def all_matmuls():
    outs = []
    for d, m in zip(devices, mats):
      with tf.device(d):
        y = m
        for _ in range(4):
          y = tf.matmul(y, m)
        outs.append(tf.reduce_sum(y))
    return tf.add_n(outs)
  t_one = timed(one_matmul)
  t_all = timed(all_matmuls)
  flops_per_s = 4 * 2 * n ** 3 / t_one
  parallel = max(1, min(len(devices), round(len(devices) * t_one / t_all)))

  # Elementwise bandwidth.
  big = tf.random.normal([4 * 1024 * 1024])

  @tf.function
  def elementwise():
    y = big
    for _ in range(4):
      y = y * 1.0001 + 0.5
    return y[0]
  mem_bw = 8 * 2 * big.shape.num_elements() * 4 / timed(elementwise)

  # Allreduce as the placement lowering does it on CPU: add_n of the slices.
  def allreduce_fn(size):
    parts = []
    for i, d in enumerate(devices):
      with tf.device(d):
        parts.append(tf.random.normal([size], seed=100 + i))

    @tf.function
    def f():
      outs = []
      for _ in range(4):
        with tf.device(devices[0]):
          total = tf.add_n(parts)
        outs.append(total[0])
      return tf.add_n(outs)
    return f
  t_small = timed(allreduce_fn(16)) / 4
  t_large = timed(allreduce_fn(1024 * 1024)) / 4
  latency = max(t_small - overhead, 1e-7)
  moved = 2.0 * (len(devices) - 1) / len(devices) * 1024 * 1024 * 4
  coll_bw = moved / max(t_large - t_small, 1e-9)
  return DeviceParams("calibrated", flops_per_s=float(f"{flops_per_s:.3g}"),
                      memory_bytes_per_s=float(f"{mem_bw:.3g}"),
                      collective_bytes_per_s=float(f"{coll_bw:.3g}"),
                      collective_latency_s=float(f"{latency:.3g}"),
                      op_overhead_s=float(f"{overhead:.3g}"),
                      parallel_processors=int(parallel), shares_memory=True)


def main(argv: Optional[Sequence[str]] = None) -> int:
  """`python -m mesh_tensorflow.analysis.cost_model`: returns the exit status (2, with one `error:` line, for a
  mistake on the command line; see mesh_tensorflow.cli).

  Example:
    >>> main(["--help"])
  """
  from mesh_tensorflow import cli as cli_lib  # pylint: disable=g-import-not-at-top
  argv = list(sys.argv[1:] if argv is None else argv)
  return cli_lib.run_main(lambda args: _main(args[1:]), ["python -m mesh_tensorflow.analysis.cost_model"] + argv)


def _main(argv: Sequence[str]) -> int:
  """`python -m mesh_tensorflow.analysis.cost_model --calibrate [--devices 8]
  [--output params.json]`: prints (and writes) calibrated DeviceParams."""
  from mesh_tensorflow import cli  # pylint: disable=g-import-not-at-top
  parser = cli.FlagParser(
      prog="python -m mesh_tensorflow.analysis.cost_model",
      description="Device parameters of the mtf cost model.")
  parser.add_argument("--calibrate", action="store_true",
                      help="measure the parameters on this machine's CPUs")
  parser.add_argument("--devices", type=int, default=8, help="logical CPU devices")
  parser.add_argument("--output", default=None, help="also write the JSON here")
  parser.add_argument("--show_defaults", action="store_true",
                      help="print the built-in defaults for cpu, gpu and tpu")
  args = parser.parse_args(argv)
  if args.devices < 1:
    parser.error(f"--devices={args.devices}: must be at least 1")
  if args.output and os.path.isdir(args.output):
    parser.error(f"--output={args.output} is a directory; give a file name such as "
                 "params.json")
  if args.show_defaults or not args.calibrate:
    print(json.dumps({k: dataclasses.asdict(v) for k, v in _DEFAULTS.items()}, indent=2))
    if not args.calibrate:
      return 0
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  cpu = tf.config.list_physical_devices("CPU")[0]
  try:
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * args.devices)
  except RuntimeError:
    pass  # TensorFlow already started (e.g. in tests): calibrate() checks the count.
  params = calibrate(args.devices)
  text = params.to_json()
  print(text)
  if args.output:
    with open(args.output, "w") as f:
      f.write(text + "\n")
  return 0

