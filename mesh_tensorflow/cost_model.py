r"""A cost model for mtf graphs: compute, communication, memory and step time
of a graph under a mesh shape and layout, without lowering it.

For every operation the model works out what the lowering would do under the
layout (the same decisions as `mesh_impl.relayout`, `LazyAllreduceSum`, the
einsum and reduction lowerings): the FLOPs per processor, each collective
(kind, mesh axes, bytes per processor) and how many TensorFlow kernels run.
Peak memory per processor is the slice variables (trainable ones and
optimizer slots) plus the largest set of activation slices alive at once when
the operations run in graph order (which holds the activations that the
backward pass reads). A few device parameters turn these into a step time.

    >>> est = mtf.cost_model.estimate(graph, "rows:2;cols:4", "batch:rows;hidden:cols")
    >>> est.step_time_s, est.memory.peak_bytes
    >>> print(est.summary())

`estimate(..., exact=True)` lowers the graph into a throwaway TensorFlow graph
instead and reads the lowering's own counters (slower; every op supported).
The analytical mode mirrors einsum, reductions, elementwise ops, reshapes,
broadcasts, gathers, the fused cross-entropy and variables; any other
operation is costed as local work on its inputs' slices (`OpCost.approximate`
is then True).

Calibrate the device parameters on the machine at hand (8 logical CPUs):

    python -m mesh_tensorflow.cost_model --calibrate [--output params.json]
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
from typing import Dict, List, Optional, Sequence, Tuple

from mesh_tensorflow.layout import convert_to_layout_rules
from mesh_tensorflow.shapes import Shape, convert_to_shape

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
                       "mesh_tensorflow.cost_model --calibrate).") from None

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


# Calibrated on this project's 2-core machine with 8 logical CPU devices (see
# README, "Choosing layouts"); GPU and TPU figures are round numbers for one
# modern accelerator and its interconnect.
_DEFAULTS = {
    "cpu": DeviceParams("cpu", flops_per_s=6e10, memory_bytes_per_s=4e9,
                        collective_bytes_per_s=4e9, collective_latency_s=30e-6,
                        op_overhead_s=12e-6, parallel_processors=2, shares_memory=True),
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
  """A pending allreduce: partial sums of `nbytes` per processor over `axes`."""
  __slots__ = ("axes", "nbytes")

  def __init__(self, axes, nbytes):
    self.axes = tuple(sorted(axes))
    self.nbytes = nbytes


class _Estimator:
  """Walks the graph once, mirroring the lowering's decisions."""

  def __init__(self, operations, mesh_shape: Shape, rules, params: DeviceParams):
    self.operations = operations
    self.mesh_shape = mesh_shape
    self.rules = rules
    self.params = params
    self.mesh_sizes = mesh_shape.to_integer_list()
    self.mesh_size = mesh_shape.size
    self.axis_of_name = {}
    names = mesh_shape.dimension_names
    for t, m in rules:
      if m in names:
        self.axis_of_name[t] = names.index(m)
    self.share = params.shares_memory
    self._layouts = {}
    self.state = {}  # tensor -> _Lazy or None (laid out)
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

  def axis(self, dim):
    return self.axis_of_name.get(dim.name)

  def slice_elems(self, shape: Shape, layout=None) -> int:
    layout = self.layout(shape) if layout is None else layout
    n = 1
    for d, a in zip(shape.dims, layout):
      n *= d.size // self.mesh_sizes[a] if a is not None else d.size
    return n

  def slice_bytes(self, t) -> int:
    return self.slice_elems(t.shape) * t.dtype.size

  def distinct(self, layout) -> int:
    """Kernels per slicewise op: distinct slices under shared memory, else
    one per processor."""
    if not self.share:
      return self.mesh_size
    n = 1
    for a in set(a for a in layout if a is not None):
      n *= self.mesh_sizes[a]
    return n

  # ---- recording ------------------------------------------------------------
  def collective(self, kind, nbytes, axes):
    axes = tuple(axes)
    group = 1
    for a in axes:
      group *= self.mesh_sizes[a]
    self.current.collectives.append(Collective(
        self.current.name, kind, axes, int(nbytes), group, self.mesh_size // max(group, 1)))

  def kernels(self, n, nbytes=0):
    self.current.kernels += int(n)
    self.current.bytes_touched += int(nbytes)

  def allreduce(self, nbytes, axes):
    axes = [a for a in axes if self.mesh_sizes[a] > 1]
    if not axes:
      return
    self.collective("allreduce", nbytes, axes)

  def laid_out(self, t):
    """Completes a pending allreduce of t, as Lowering.laid_out does."""
    s = self.state.get(t)
    if isinstance(s, _Lazy):
      self.allreduce(s.nbytes, s.axes)
      self.state[t] = None

  def gather_dims(self, shape: Shape, dtype_size: int, names, layout=None):
    """allconcats of gather_dims/relayout: in mesh-axis order, each sending
    the current slice. Returns the resulting layout."""
    layout = list(self.layout(shape) if layout is None else layout)
    for mesh_axis in range(len(self.mesh_sizes)):
      for i, (d, a) in enumerate(zip(shape.dims, layout)):
        if a == mesh_axis and d.name in names:
          if self.mesh_sizes[a] > 1:
            self.collective("allgather", self.slice_elems(shape, layout) * dtype_size,
                            [mesh_axis])
          layout[i] = None
    return tuple(layout)

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
      cost.time_s = self.time_of(cost)
      ops.append(cost)
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
    parallel = p.parallel_processors or self.mesh_size
    kernels = max(cost.kernels, 0)
    if p.shares_memory:
      # Logical devices share the real cores: the distinct slices' kernels
      # (each one multi-threaded) together do all the work, `parallel` cores'
      # worth at a time, and each costs one dispatch.
      flops = cost.work_flops / max(parallel, 1)
      nbytes = cost.bytes_touched * kernels / max(parallel, 1)
      dispatched = float(kernels)
    else:
      # Every processor runs its own kernel at the same time.
      flops = float(cost.flops) if cost.type == "EinsumOperation" else 0.0
      nbytes = float(cost.bytes_touched) if kernels else 0.0
      dispatched = kernels / self.mesh_size
    groups = moved_total = 0.0
    for c in cost.collectives:
      g = c.group_size
      if p.shares_memory:
        # Host kernels combine each group's slices in memory (add_n, concat,
        # split): about g slices read and one written per group (an
        # all-to-all: every processor's slice split and rejoined).
        groups += c.num_groups
        factor = 2 * g if c.kind == "alltoall" else (g + 1 if c.kind != "permute" else 0)
        moved_total += c.num_groups * factor * c.bytes_per_processor / max(parallel, 1)
        continue
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
  for t in op.inputs:
    est.laid_out(t)
  nbytes = sum(est.slice_bytes(t) for t in op.inputs) + sum(est.slice_bytes(t) for t in op.outputs)
  n = max([est.distinct(est.layout(t.shape)) for t in op.outputs] or [1])
  est.kernels(n, nbytes)
  for t in op.outputs:
    est.state[t] = None


def _variable(est: _Estimator, op):
  out = op.outputs[0]
  est.kernels(est.distinct(est.layout(out.shape)), est.slice_bytes(out))
  est.state[out] = None


def _assign(est: _Estimator, op):
  nbytes = 0
  n = 0
  for t in op.inputs:
    est.laid_out(t)
    nbytes += 2 * est.slice_bytes(t)
    n += est.distinct(est.layout(t.shape))
  est.kernels(n, nbytes)


def _elementwise(est: _Estimator, op):
  for t in op.inputs:
    est.laid_out(t)
  out = op.outputs[0]
  elems = est.slice_elems(out.shape)
  est.current.flops += elems
  nbytes = sum(est.slice_bytes(t) for t in op.inputs) + elems * out.dtype.size
  est.kernels(est.distinct(est.layout(out.shape)), nbytes)
  est.state[out] = None


def _lazy_add(est: _Estimator, op):
  a, b = (est.state.get(t) for t in op.inputs)
  out = op.outputs[0]
  if (isinstance(a, _Lazy) and isinstance(b, _Lazy) and a.axes == b.axes
      and op.inputs[0].shape == op.inputs[1].shape == out.shape):
    nbytes = 3 * a.nbytes
    est.kernels(est.distinct(est.layout(out.shape)), nbytes)
    est.state[out] = _Lazy(a.axes, a.nbytes)
    return
  _elementwise(est, op)


def _local(est: _Estimator, op):
  """Broadcast, transpose: local, one kernel per distinct slice."""
  for t in op.inputs:
    est.laid_out(t)
  out = op.outputs[0]
  est.kernels(est.distinct(est.layout(out.shape)),
              est.slice_bytes(op.inputs[0]) + est.slice_bytes(out))
  est.state[out] = None


def _einsum(est: _Estimator, op):
  out = op.outputs[0]
  out_names = set(out.shape.dimension_names)
  owner = {}
  for t in [out] + op.inputs:
    for d, a in zip(t.shape.dims, est.layout(t.shape)):
      if a is not None:
        owner.setdefault(a, d.name)
  gather, reduced_axes, local_bytes = [], set(), 0
  for t in op.inputs:
    names = set()
    size = t.dtype.size
    for d, a in zip(t.shape.dims, est.layout(t.shape)):
      if a is not None and owner[a] != d.name:
        names.add(d.name)
      elif a is not None and d.name not in out_names:
        reduced_axes.add(a)
      size *= d.size if (a is None or d.name in names) else d.size // est.mesh_sizes[a]
    gather.append(names)
    local_bytes += size
  out_bytes = est.slice_bytes(out)
  fuse = bool(reduced_axes) and est.share and local_bytes < out_bytes
  if fuse:
    est.collective("allreduce", out_bytes, sorted(reduced_axes))
    for t in op.inputs:  # the lowering gathers these unrecorded, as part of it
      est.state[t] = None
  else:
    for t, names in zip(op.inputs, gather):
      est.laid_out(t)
      if names:
        est.gather_dims(t.shape, t.dtype.size, names)
  flops = 2
  sizes = {}
  for t in op.inputs:
    for d in t.shape.dims:
      sizes.setdefault(d.name, d.size)
  by_name = {n: a for a, n in owner.items()}
  for name, size in sizes.items():
    a = by_name.get(name)
    flops *= size // est.mesh_sizes[a] if a is not None else size
  est.current.flops += flops
  # Distinct products: one per combination of the mesh axes that split any
  # dimension (all processors' without shared memory). Shared memory runs
  # them as one kernel per output slice (fused allreduce) or one batched
  # kernel (batchable), or one each.
  distinct_all = est.distinct(tuple(owner))
  if fuse:
    kernels = est.distinct(est.layout(out.shape))
  elif est.share and not reduced_axes and _batchable(est, op):
    kernels = 1
  else:
    kernels = distinct_all
  est.kernels(kernels, local_bytes + out_bytes)
  est.current.work_flops += flops * distinct_all
  est.state[out] = _Lazy(sorted(reduced_axes), out_bytes) if (reduced_axes and not fuse) else None


def _batchable(est: _Estimator, op) -> bool:
  """Mirror of einsum's _batchable_axis: one operand split along one mesh
  axis in its outermost (output-outermost) dimension, others replicated."""
  out = op.outputs[0]
  if not out.shape.ndims:
    return False
  found = False
  for t in op.inputs:
    lay = est.layout(t.shape)
    split = [a for a in lay if a is not None]
    if not split:
      continue
    if found or len(split) != 1 or lay[0] is None or t.shape.dims[0] != out.shape.dims[0]:
      return False
    found = True
  return found


def _reduce(est: _Estimator, op):
  x, out = op.inputs[0], op.outputs[0]
  reduced = [d for d in x.shape.dims if d not in out.shape.dims]
  axes = [est.axis(d) for d in reduced]
  axes = [a for a in axes if a is not None]
  s = est.state.get(x)
  kind = op.reduction_fn_string
  is_bool = x.dtype.name == "bool"
  out_bytes = est.slice_bytes(out)
  if kind == "SUM" and isinstance(s, _Lazy) and not is_bool:
    axes = sorted(set(axes) | set(s.axes))
    in_bytes = s.nbytes
  else:
    est.laid_out(x)
    in_bytes = est.slice_bytes(x)
    est.current.flops += est.slice_elems(x.shape)
  est.kernels(est.distinct(est.layout(x.shape)), in_bytes + out_bytes)
  if not axes:
    est.state[out] = None
  elif kind == "SUM" and not is_bool:
    est.state[out] = _Lazy(axes, out_bytes)
  else:
    est.allreduce(out_bytes, axes)
    est.state[out] = None


def _reshape(est: _Estimator, op):
  x, out = op.inputs[0], op.outputs[0]
  est.laid_out(x)
  in_layout, out_layout = est.layout(x.shape), est.layout(out.shape)
  in_strides, out_strides = x.shape.cumprod(), out.shape.cumprod()
  kept_in = set()
  for i, a in enumerate(in_layout):
    if a is None:
      continue
    for j, b in enumerate(out_layout):
      if (b == a and out.shape.dims[j].size % est.mesh_sizes[a] == 0
          and out_strides[j] == in_strides[i]):
        kept_in.add(i)
  names = {d.name for i, d in enumerate(x.shape.dims)
           if in_layout[i] is not None and i not in kept_in}
  if names:
    est.gather_dims(x.shape, x.dtype.size, names)
  est.kernels(est.distinct(out_layout), est.slice_bytes(x) + est.slice_bytes(out))
  est.state[out] = None


def _gather(est: _Estimator, op):
  weights, indices = op.inputs
  out = op.outputs[0]
  dim = op._dim  # pylint: disable=protected-access
  a = est.axis(dim)
  est.laid_out(weights)
  if a is not None and any(est.axis(d) == a for d in indices.shape.dims):
    est.gather_dims(weights.shape, weights.dtype.size, {dim.name})
    a = None
  est.laid_out(indices)
  out_bytes = est.slice_bytes(out)
  est.kernels(est.distinct(est.layout(out.shape)), out_bytes + est.slice_bytes(indices))
  est.state[out] = _Lazy([a], out_bytes) if (a is not None and est.mesh_sizes[a] > 1) else None


def _scatter_add_grad(est: _Estimator, op):
  g, indices = op.inputs
  out = op.outputs[0]
  dim = op._dim  # pylint: disable=protected-access
  a = est.axis(dim)
  est.laid_out(g)
  est.laid_out(indices)
  idx_axes = {est.axis(d) for d in indices.shape.dims} - {None}
  gather_out = a is not None and a in idx_axes
  out_layout = est.layout(out.shape)
  cur = tuple(None if (gather_out and d.name == dim.name) else x
              for d, x in zip(out.shape.dims, out_layout))
  est.kernels(est.distinct(out_layout), est.slice_bytes(g) + est.slice_elems(out.shape, cur) * 4)
  if gather_out:
    est.allreduce(est.slice_elems(out.shape, cur) * out.dtype.size, sorted(idx_axes))
    est.state[out] = None
  else:
    axes = sorted(idx_axes - {x for x in out_layout if x is not None})
    axes = [x for x in axes if est.mesh_sizes[x] > 1]
    est.state[out] = _Lazy(axes, est.slice_bytes(out)) if axes else None


def _sparse_xent(est: _Estimator, op):
  logits, ids = op.inputs
  est.laid_out(logits)
  est.laid_out(ids)
  vocab = op._vocab_dim  # pylint: disable=protected-access
  a = est.axis(vocab)
  out = op.outputs[0]
  lg_bytes = est.slice_bytes(logits)
  n = est.distinct(est.layout(logits.shape))
  if a is None:  # TensorFlow's fused kernel, a logsumexp and reshapes
    est.kernels(3 * n, 3 * lg_bytes)
  else:  # max, partial sums, target logits, offsets, finish: ~8 passes
    est.kernels(8 * n, 5 * lg_bytes)
  if a is not None:
    nbytes = est.slice_elems(out.shape) * 4  # float32 partials
    est.allreduce(nbytes, [a])
    est.allreduce(nbytes, [a])
    est.allreduce(nbytes, [a])
  for t in op.outputs:
    est.state[t] = None


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
}


def _source(est: _Estimator, op):
  """Ops without inputs (imports, constants): one kernel per distinct slice."""
  for t in op.inputs:
    est.laid_out(t)
  for t in op.outputs:
    est.kernels(est.distinct(est.layout(t.shape)), est.slice_bytes(t))
    est.state[t] = None


def _passthrough(est: _Estimator, op):
  """stop_gradient / depend: the input slices themselves (a pending
  allreduce completes), plus identities when there are dependencies."""
  for t in op.inputs:
    est.laid_out(t)
  extra = len(op.inputs) > len(op.outputs)
  for t in op.outputs:
    if extra:
      est.kernels(est.distinct(est.layout(t.shape)), 0)
    est.state[t] = None


_HANDLERS["_IdentityLike"] = _passthrough
_HANDLERS["ImportOperation"] = _source
_HANDLERS["ConstantOperation"] = _source


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
             operations: Optional[Sequence] = None, check: bool = True) -> CostEstimate:
  """Estimates compute, communication, memory and step time of `graph`.

  Args:
    graph: an mtf.Graph (a training step: model, gradients, updates).
    mesh_shape: e.g. "rows:2;cols:4" or an mtf Shape.
    layout: layout rules, e.g. "batch:rows;hidden:cols".
    params: DeviceParams, "cpu" (default), "gpu", "tpu" or a JSON file from
      `python -m mesh_tensorflow.cost_model --calibrate`.
    exact: take FLOPs and collectives from a real lowering into a throwaway
      TensorFlow graph (slower; exact for every op type).
    operations: cost only these operations of the graph (default: all).
    check: first check that the layout is legal for every tensor (searches
      that only try legal layouts skip this).

  Returns:
    A CostEstimate.

  Raises:
    ValueError: if the layout is illegal for a tensor of the graph (the
      message names the tensor, dimension and rule).

  Example:
    >>> est = estimate(graph, "all:8", "batch:all")
    >>> est.collective_counts()
    {'allreduce': (2, 4136960)}
  """
  mesh_shape = convert_to_shape(mesh_shape)
  if mesh_shape is None:
    raise ValueError("estimate: mesh_shape is empty; write e.g. 'all:8' or 'rows:2;cols:4'.")
  rules = convert_to_layout_rules(layout)
  rules.check_mesh_shape(mesh_shape)
  params = as_device_params(params)
  operations = list(graph.operations if operations is None else operations)
  est = _Estimator(operations, mesh_shape, rules, params)
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
  from mesh_tensorflow.lowering import Lowering  # pylint: disable=g-import-not-at-top
  from mesh_tensorflow.placement_mesh_impl import PlacementMeshImpl  # pylint: disable=g-import-not-at-top
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

  Run through `python -m mesh_tensorflow.cost_model --calibrate`, which
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
                     "Run `python -m mesh_tensorflow.cost_model --calibrate`, which "
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
  """`python -m mesh_tensorflow.cost_model --calibrate [--devices 8]
  [--output params.json]`: prints (and writes) calibrated DeviceParams."""
  import argparse  # pylint: disable=g-import-not-at-top
  import os  # pylint: disable=g-import-not-at-top
  parser = argparse.ArgumentParser(
      prog="python -m mesh_tensorflow.cost_model",
      description="Device parameters of the mtf cost model.")
  parser.add_argument("--calibrate", action="store_true",
                      help="measure the parameters on this machine's CPUs")
  parser.add_argument("--devices", type=int, default=8, help="logical CPU devices")
  parser.add_argument("--output", default=None, help="also write the JSON here")
  parser.add_argument("--show_defaults", action="store_true",
                      help="print the built-in defaults for cpu, gpu and tpu")
  args = parser.parse_args(argv)
  if args.show_defaults or not args.calibrate:
    print(json.dumps({k: dataclasses.asdict(v) for k, v in _DEFAULTS.items()}, indent=2))
    if not args.calibrate:
      return 0
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  cpu = tf.config.list_physical_devices("CPU")[0]
  tf.config.set_logical_device_configuration(
      cpu, [tf.config.LogicalDeviceConfiguration()] * args.devices)
  params = calibrate(args.devices)
  text = params.to_json()
  print(text)
  if args.output:
    with open(args.output, "w") as f:
      f.write(text + "\n")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
