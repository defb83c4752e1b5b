r"""A plan for a large training run: step time, throughput, MFU, memory per
device and whether it fits, and where the time goes, for a transformer
configured by gin files on a cluster of accelerators.

    >>> gin_config.parse(["models/base_lm.gin"], ["run.batch_size = 256"])
    >>> plan = plan_current_config(hardware.parse_cluster("a100-80gb:64"),
    ...                            "batch:16;model:4", "batch:batch;d_ff:model;heads:model")
    >>> plan.step_time_s, plan.fits

How: the training step (model, loss, gradients, optimizer) is built as an
mtf graph, without allocating any tensor, for ONE and for TWO layers of the
model, at its real sizes, on the mesh without its pipeline dimension, for one
micro-batch. The cost model prices both (the plans the lowering executes:
FLOPs, bytes, kernels, every collective with its mesh axes and bytes);
their difference is one layer, and the model's L layers are the one-layer
graph plus L - 1 more layers (the layers of a stack are identical). Each
collective is priced on the cluster's links (`topology`). The plan then
adds what the graph of one micro-batch does not show:

* pipeline (`transformer.make_layer_stack.num_stages` over the mesh
  dimension that the layout's `stages` rule names): each stage runs L / S
  layers; a step is (M + (S - 1) / V) slots of one micro-batch's forward and
  backward (GPipe and 1F1B: V = 1; the interleaved schedule: V virtual
  stages per device), plus the sends between stages;
* activation recomputation ("layer": the forward of every layer runs again
  in the backward pass and only each layer's input is kept; "selective":
  the norms and the attention's operations on scores run again, their FLOPs
  counted as hardware FLOPs, and the scores are not kept; "projections": all
  but the projections run again, the outputs the backward pass reads kept
  with each layer's input);
* gradient reduction (the collectives the optimizer's inputs complete, once
  per step; merged as XLA merges them, `plan_combine`), overlapped with the
  last micro-batch's backward pass but for its last piece;
* ZeRO (`run.zero_stage`), as `mtf.zero` runs it: optimizer slots (stage
  >= 1), gradients (>= 2), variables (3) split over the data-parallel mesh
  dimension; each processor updates its 1/D of the variables; stages 1 and 2
  all-gather the new values after the update, stages 2 and 3 reduce-scatter
  the gradients; stage 3 gathers each layer's variables in the forward pass
  and again in the backward pass, under the compute of the layer before;
* mixed precision (`run.activation_dtype = "bfloat16"`): activations and
  their collectives in bf16, variables, gradients and slots in float32.
* kernel fusion (`PlanOptions.fusion`): by default the step is priced as
  XLA compiles it (`run.jit_compile = True`; a TPU always does): chains of
  elementwise operations and reductions are fused, so only what products,
  collectives and the backward pass read goes through memory; "none"
  prices TensorFlow running the step op by op;
* fused attention (`PlanOptions.attention = "fused"`, estimate only): the
  score tensors stay on chip and are made again in the backward pass, as
  FlashAttention-style kernels do, whose products run at the hardware's
  `attention_efficiency`; the library's own attention ("unfused") keeps them.

Compute time is FLOPs / (peak x matmul_efficiency) + bytes / (HBM bandwidth
x hbm_efficiency) + kernels x launch overhead; model FLOPs are every
einsum's full product (forward and backward) without the recomputed forward
(MFU); hardware FLOPs include it (HFU).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Dict, List, Optional, Tuple

from mesh_tensorflow.analysis.cost_model import estimator
from mesh_tensorflow.analysis.cost_model import hardware as hardware_lib
from mesh_tensorflow.analysis.cost_model import memory as memory_lib
from mesh_tensorflow.analysis.cost_model import topology
from mesh_tensorflow.lowering import observers
from mesh_tensorflow.transformer import plan_batch, plan_combine, plan_notes, plan_stacks, plan_zero

from mesh_tensorflow.transformer.plan_types import (  # noqa: F401 (re-exported)
    GIB, OVERLAP_LABELS, Communication, Plan, PlanOptions)

PHASES = ("forward", "backward", "optimizer")
# What each recomputation policy but "layer" (the forward phase) runs again.
RECOMPUTE_PHASES = ("selective", "projections")


def _binding(name: str, default=None):
  from mesh_tensorflow.transformer import gin_config  # pylint: disable=g-import-not-at-top
  return gin_config.query(name, default)


def configured_sequence_length() -> int:
  """The parsed config's target sequence length (`run.sequence_length`, an
  int or {"targets": n}; 128 when unset)."""
  import gin  # pylint: disable=g-import-not-at-top
  seq = dict(gin.get_bindings("run")).get("sequence_length") or {"targets": 128}
  return seq if isinstance(seq, int) else seq.get("targets", 128)


def options_from_gin() -> PlanOptions:
  """The plan options the parsed gin config states.

  Raises:
    ValueError: naming the binding, for a count that is not a whole number
      (`PlanOptions.check` refuses the values training refuses).
  """
  from mesh_tensorflow.transformer import report  # pylint: disable=g-import-not-at-top
  count, stack = plan_stacks.stack_count, plan_stacks.stack_setting
  return PlanOptions(
      num_stages=count("num_stages", 1), num_microbatches=count("num_microbatches", 1),
      schedule=str(stack("pipeline_schedule", "gpipe")),
      virtual_stages=count("virtual_stages", 1), recompute=str(stack("recompute", "none")),
      recompute_layers=stack("recompute_layers", None),
      zero_stage=report.configured_zero_stage(),
      zero_reshard_after_forward=report.configured_zero_reshard(),
      float32_master_in_optimizer=bool(_binding("run.float32_master_in_optimizer", False)))


# ------------------------------------------------------------ building
@dataclasses.dataclass
class _Step:
  graph: object
  boundaries: Tuple[int, int]  # op index of the first backward and optimizer op
  mesh_shape: object
  layout: object
  pipeline_refusal: Optional[str] = None


def _build_step(mesh_shape: str, layout: str, batch: int, num_layers: int, master: bool) -> _Step:
  """One micro-batch's training step of the parsed config with num_layers
  layers and no pipeline, recomputation or gradient accumulation: the step
  `python -m mesh_tensorflow.report` builds (`report.build_training_step`)."""
  import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top
  from mesh_tensorflow.transformer import report  # pylint: disable=g-import-not-at-top
  # ZeRO is priced by the plan (plan_current_config), not built.
  step = report.build_training_step(mesh_shape, layout, batch_size=batch,
                                    num_layers=num_layers, zero_stage=0, float32_master=master)
  return _Step(step.graph, (step.first_backward_op, step.first_optimizer_op),
               mtf.convert_to_shape(step.mesh_shape), mtf.convert_to_layout_rules(step.layout),
               step.pipeline_refusal)


# ------------------------------------------------------------ pricing
@dataclasses.dataclass
class _Phase:
  flops: float = 0.0          # per processor, matrix products
  model_flops: float = 0.0    # all processors, full einsum products
  extra_flops: float = 0.0    # all processors, not model FLOPs (fused attention's second q.k)
  attention_flops: float = 0.0  # per processor, of `flops`: a fused attention kernel's products
  bytes: float = 0.0          # per processor
  kernels: float = 0.0        # per processor
  comm: Dict[tuple, float] = dataclasses.field(default_factory=dict)  # key -> count
  # Collectives of tensors made again for the backward pass (a sequence-
  # parallel layer's input gathered again), issued ahead of their use.
  ahead: Dict[tuple, float] = dataclasses.field(default_factory=dict)

  _COUNTS = ("flops", "model_flops", "extra_flops", "attention_flops", "bytes", "kernels")

  def minus(self, other: "_Phase") -> "_Phase":
    return self.plus(other, -1.0)

  def collectives(self) -> Dict[tuple, float]:
    """Counts of all the phase's collectives, on the critical path or ahead."""
    return {k: self.comm.get(k, 0) + self.ahead.get(k, 0)
            for k in set(self.comm) | set(self.ahead)}

  def add(self, other: "_Phase") -> None:
    """Adds `other` to this phase in place."""
    for f in self._COUNTS:
      setattr(self, f, getattr(self, f) + getattr(other, f))
    for mine, theirs in ((self.comm, other.comm), (self.ahead, other.ahead)):
      for k, c in theirs.items():
        mine[k] = mine.get(k, 0) + c

  def plus(self, other: "_Phase", times: float = 1.0) -> "_Phase":
    # Sorted keys: the sums' order, hence their last bit, is the same in
    # every process.
    def combined(a, b):
      return {k: a.get(k, 0) + times * b.get(k, 0) for k in sorted(set(a) | set(b))}
    counts = {f: getattr(self, f) + times * getattr(other, f) for f in self._COUNTS}
    return _Phase(comm=combined(self.comm, other.comm), ahead=combined(self.ahead, other.ahead),
                  **counts)


@dataclasses.dataclass
class _Priced:
  # (xla fusion, fused attention) -> phase name -> _Phase
  variants: Dict[Tuple[bool, bool], Dict[str, _Phase]]
  variables: float
  slots: float
  layer_input_bytes: float
  attention_core_bytes: float  # score tensors among the kept activations
  parameters: int
  layer_input_dims: tuple = ()  # the Dimensions of a layer's input
  kept_activations: float = 0.0  # forward tensors the backward pass reads
  dimension_names: frozenset = frozenset()  # of every tensor of the step
  pipeline_refusal: Optional[str] = None  # why the layers cannot run pipelined
  # (xla fusion, fused attention) -> the peak of live activations over both
  # passes as that variant runs the step
  peaks: Dict[Tuple[bool, bool], float] = dataclasses.field(default_factory=dict)
  projection_bytes: float = 0.0  # the forward pass's projections' outputs
  own_stack: Optional[str] = None  # the binding of a layer stack of the model's own

  def phases(self, options: "PlanOptions") -> Dict[str, _Phase]:
    return self.variants[(options.fusion == "xla", options.attention == "fused")]


_CACHE: Dict[tuple, _Priced] = {}


def _priced(mesh_shape: str, layout: str, batch: int, num_layers: int, master: bool) -> _Priced:
  """`_price_step` of `_build_step`, remembered for the same gin config (a
  search prices the same sub-mesh under many options)."""
  import gin  # pylint: disable=g-import-not-at-top
  key = (gin.config_str(), mesh_shape, layout, batch, num_layers, master)
  if key not in _CACHE:
    if len(_CACHE) > 256:
      _CACHE.clear()
    _CACHE[key] = _price_step(_build_step(mesh_shape, layout, batch, num_layers, master))
  return _CACHE[key]


def _einsum_model_flops(op) -> float:
  dims = {d.name: d.size for t in list(op.inputs) + list(op.outputs) for d in t.shape.dims}
  return math.prod(dims.values(), start=2.0)


@dataclasses.dataclass
class _OpCost:
  """One operation of the step, as each pricing variant needs it."""
  phase: str
  cost: object            # the estimator's OpCost
  product: bool           # an einsum
  fusible: bool           # XLA would fuse it with its neighbours
  variable: bool
  scores: float           # bytes (per processor) of attention-score tensors it reads or writes
  makes_scores: bool      # a product whose output is a score tensor
  reads: List[Tuple[int, float]]   # (tensor id, bytes per processor) of its inputs
  writes: List[Tuple[int, float]]  # the same for its outputs
  model_flops: float
  ahead: bool = False     # made again for the backward pass, ahead of its use
  norm: bool = False      # part of a layer's norm
  saveable: bool = False  # a projection, which recompute = "projections" keeps


def _price_step(step: _Step) -> _Priced:
  import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top
  from mesh_tensorflow.analysis import cost_model  # pylint: disable=g-import-not-at-top
  from mesh_tensorflow.transformer import layer_stack  # pylint: disable=g-import-not-at-top
  from mesh_tensorflow.transformer import report  # pylint: disable=g-import-not-at-top
  from mesh_tensorflow.transformer import sequence_parallel  # pylint: disable=g-import-not-at-top
  # Counts only (FLOPs, bytes, kernels, collectives): the plan prices them
  # on the cluster itself, so the estimate's own times are not needed.
  counting = dataclasses.replace(cost_model.DeviceParams.default("gpu"), hardware=None)
  est = cost_model.estimate(step.graph, step.mesh_shape, step.layout, params=counting, check=False)
  ops = step.graph.operations
  first_bwd, first_opt = step.boundaries
  sizes: Dict[int, float] = {}

  def size(t) -> float:
    if id(t) not in sizes:
      sizes[id(t)] = float(est_slice_bytes(t, step))
    return sizes[id(t)]

  records = []
  for i, (op, cost) in enumerate(zip(ops, est.ops)):
    kind = type(op).__name__
    product = kind == "EinsumOperation"
    touched = list(op.inputs) + list(op.outputs)
    records.append(_OpCost(
        phase="forward" if i < first_bwd else "backward" if i < first_opt else "optimizer",
        cost=cost, product=product,
        fusible=not product and kind != "Variable" and not cost.collectives,
        variable=kind == "Variable",
        scores=sum(size(t) for t in touched if _is_score(t)),
        makes_scores=product and any(_is_score(t) for t in op.outputs),
        reads=[(id(t), size(t)) for t in op.inputs], writes=[(id(t), size(t)) for t in op.outputs],
        model_flops=_einsum_model_flops(op) if product else 0.0,
        ahead=getattr(op, "made_again", False),
        norm="/rms_norm/" in op.name or "/layer_norm/" in op.name,
        saveable=product and mtf.product_without_batch_dims(op)))
  variants = {(xla, fused): _phases(records, step.mesh_shape.size, xla, fused)
              for xla in (False, True) for fused in (False, True)}
  # The input of a layer: the activation slice of [batch, length, d_model]
  # (with sequence parallelism, the stream's [batch, residual_length,
  # d_model] or [batch, length, residual_d_model], which the layers pass on
  # and a pipeline sends), with [outer_batch] in front where the batch has one.
  forward = [t for op in ops[:first_bwd] for t in op.outputs]
  streams = [t for t in forward
             if len(t.shape.dims) - ("outer_batch" in t.shape.dimension_names) == 3
             and {"d_model", sequence_parallel.RESIDUAL_D_MODEL} & set(t.shape.dimension_names)]
  streams = [t for t in streams
             if set(sequence_parallel.STREAM_NAMES) & set(t.shape.dimension_names)] or streams
  layer_input = size(streams[0]) if streams else 0.0
  layer_input_dims = tuple(streams[0].shape.dims) if streams else ()
  kept, peak, kept_scores = memory_lib.step_activation_bytes(
      ops, first_bwd, first_opt, size, est.ops, _is_score)
  # The peak as each variant runs the step: what stays in an XLA fusion
  # (`_phases`), and with fused attention the score tensors, take no memory.
  fused = _fused_away(records)
  peaks = {(xla, attn): peak if not (xla or attn) else memory_lib.step_activation_bytes(
      ops, first_bwd, first_opt, lambda t, x=xla, a=attn: 0.0 if (
          (x and id(t) in fused) or (a and _is_score(t))) else size(t), est.ops, _is_score)[1]
      for xla, attn in variants}
  mem = est.memory
  count = sum(v.outputs[0].shape.size for v in step.graph.trainable_variables)
  projections = sum(size(op.outputs[0]) for op in memory_lib.outputs_the_backward_needs(
      ops, first_bwd, first_opt, mtf.kept_by_recompute(
          ops[:first_bwd], mtf.product_without_batch_dims), plan_stacks.layer_of))
  return _Priced(variants, mem.variables, mem.slots, layer_input, kept_scores,
                 count, layer_input_dims, kept, report.dimension_names(ops), step.pipeline_refusal,
                 peaks, projections, layer_stack.configured_own_stack())


def _phases(records: List[_OpCost], n: int, xla: bool, fused_attention: bool
            ) -> Dict[str, _Phase]:
  """FLOPs, bytes, kernels and collectives of each phase of the step.

  xla: elementwise operations, reductions and the like run fused (as XLA
    compiles a step, `run.jit_compile`): such an operation reads from memory
    only the inputs that a product, a variable, a collective or another phase
    made, and writes only the outputs that one of those, or another phase,
    reads (one kernel per operation that writes); the others stay in the
    fusion. Otherwise every operation reads and writes all its operands (the
    estimator's bytes).
  fused_attention: the attention is one kernel per pass that keeps the
    score tensors on chip: the operations on scores cost nothing of their
    own and products do not move scores; the backward pass computes the
    scores' product again (FLOPs, not model FLOPs).
  """
  phases = {p: _Phase() for p in PHASES + RECOMPUTE_PHASES}
  made_by_fused_op = {}  # tensor id -> phase of the fusible op that made it
  fused_away = _fused_away(records)
  in_attention = lambda r: fused_attention and r.scores and not r.product  # noqa: E731

  for r in records:
    ph = _Phase()  # this operation's share of its phase
    c = r.cost
    ph.flops += c.work_flops / n
    ph.attention_flops += c.work_flops / n if fused_attention and r.product and r.scores else 0
    ph.model_flops += r.model_flops
    for col in c.collectives:
      key = (col.kind, tuple(col.mesh_axes), int(col.bytes_per_processor))
      counts = ph.ahead if r.ahead else ph.comm
      counts[key] = counts.get(key, 0) + 1
    if in_attention(r) or (xla and r.variable):  # a variable's reader reads it
      pass
    elif r.product and fused_attention:
      ph.bytes += c.bytes_touched / n - min(c.bytes_touched / n, r.scores)
    elif xla and r.fusible:
      reads = sum(b for tid, b in r.reads if made_by_fused_op.get(tid) != r.phase)
      written = [b for tid, b in r.writes if tid not in fused_away]
      if not r.writes:  # an assignment: writes its value in place
        written = [b for _, b in r.reads[:1]]
      ph.bytes += reads + sum(written)
      ph.kernels += 1.0 if written else 0.0
      for tid, _ in r.writes:  # its fusion's later operations have it at hand
        made_by_fused_op[tid] = r.phase
    else:
      ph.bytes += c.bytes_touched / n
      ph.kernels += c.kernels / n
    phases[r.phase].add(ph)
    # What recompute = "selective" runs again: the norms, and unless a fused
    # kernel does it anyway, the attention's operations on scores.
    if r.phase == "forward" and (r.norm or (r.scores and not fused_attention)):
      phases["selective"].add(ph)
    # What recompute = "projections" runs again: all but the projections,
    # and of the collectives the gathers (a kept projection's sum is whole).
    if r.phase == "forward" and not r.saveable:
      phases["projections"].add(dataclasses.replace(
          ph, comm={k: c for k, c in ph.comm.items() if k[0] == "allgather"}))
    if r.makes_scores and fused_attention and r.phase == "forward":
      phases["backward"].flops += c.work_flops / n
      phases["backward"].attention_flops += c.work_flops / n
      phases["backward"].extra_flops += r.model_flops
  return phases


def _fused_away(records: List[_OpCost]) -> set:
  """Ids of the tensors XLA keeps inside a fusion: made by a fusible
  operation and read only by fusible operations of the same phase."""
  consumers: Dict[int, List[_OpCost]] = {}
  for r in records:
    for tid, _ in r.reads:
      consumers.setdefault(tid, []).append(r)
  return {tid for r in records if r.fusible for tid, _ in r.writes
          if consumers.get(tid) and all(u.fusible and u.phase == r.phase
                                        for u in consumers[tid])}


def _is_score(t) -> bool:
  """An attention score tensor: one query position per key position."""
  names = [d.name for d in t.shape.dims]
  return "memory_length" in names and "length" in names


def est_slice_bytes(t, step: _Step) -> int:
  from mesh_tensorflow.lowering import plans  # pylint: disable=g-import-not-at-top
  layout = step.layout.tensor_layout(t.shape, step.mesh_shape)
  return plans.slice_elements(t.shape, tuple(layout), step.mesh_shape.to_integer_list()) * \
      t.dtype.size


def _overlapped(comm_s: float, compute_s: float, ph: _Phase, sub_dims) -> float:
  """What shows of a layer's collectives (comm_s) pipelined with its compute:
  the time the compute does not cover, and at least one chunk (a collective's
  share per member of the largest group)."""
  sizes = [d.size for d in sub_dims]
  group = max((observers.group_size(axes, sizes) for _, axes, _ in ph.comm), default=1)
  return max(comm_s / group, comm_s - compute_s)


def _compute_time(ph: _Phase, h: hardware_lib.Hardware) -> float:
  attention = h.attention_efficiency or h.matmul_efficiency
  return ((ph.flops - ph.attention_flops) / (h.peak_flops_per_s * h.matmul_efficiency)
          + ph.attention_flops / (h.peak_flops_per_s * attention)
          + ph.bytes / (h.hbm_bytes_per_s * h.hbm_efficiency)
          + ph.kernels * h.kernel_overhead_s)


class _CommPricer:
  """Prices collectives of the sub-mesh on the full mesh's topology, through
  the cost model's `collective_seconds` (the estimate's own pricing)."""

  def __init__(self, full_sizes, axis_map, cluster, dim_names):
    self.full_sizes = full_sizes
    self.axis_map = axis_map  # sub-mesh axis -> full mesh axis
    self.cluster = cluster
    self.dim_names = dim_names

  def full_axes(self, axes):
    return [self.axis_map[a] for a in axes]

  def levels(self, axes):
    return estimator.collective_levels(self.full_sizes, self.full_axes(axes), self.cluster)

  def time(self, key) -> float:
    kind, axes, nbytes = key
    return estimator.collective_seconds(kind, nbytes, self.full_sizes, self.full_axes(axes),
                                        self.cluster)

  def total(self, ph: _Phase) -> float:
    """Seconds of the phase's collectives on the critical path."""
    return sum(count * self.time(k) for k, count in ph.comm.items())

  def total_ahead(self, ph: _Phase) -> float:
    """Seconds of the phase's collectives issued ahead of their use."""
    return sum(count * self.time(k) for k, count in ph.ahead.items())


# ------------------------------------------------------------ the plan
def _config_mesh_and_layout(mesh_shape, layout):
  import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top
  from mesh_tensorflow.transformer import report  # pylint: disable=g-import-not-at-top
  mesh_shape, layout = report.config_mesh_and_layout(mesh_shape, layout)
  return mtf.convert_to_shape(mesh_shape), mtf.convert_to_layout_rules(layout)


def plan_current_config(cluster: hardware_lib.Cluster, mesh_shape: Optional[str] = None,
                        layout: Optional[str] = None,
                        options: Optional[PlanOptions] = None) -> Plan:
  """The Plan of the parsed gin config's training step on `cluster`.

  Args:
    cluster: hardware and device count (`hardware.parse_cluster`).
    mesh_shape, layout: override the config's (the mesh must have
      cluster.count processors; a pipeline's mesh dimension is the one the
      layout's `stages` rule names).
    options: override the options the gin config states.

  Example:
    >>> plan = plan_current_config(hardware.parse_cluster("tpu-v4:64"), "d:8;m:8",
    ...                            "batch:d;d_ff:m;heads:m")
  """
  import gin  # pylint: disable=g-import-not-at-top
  import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top
  from mesh_tensorflow.transformer import report  # pylint: disable=g-import-not-at-top
  options = options or options_from_gin()
  if cluster.hardware.kind == "tpu" and options.fusion != "xla":
    raise ValueError(f"fusion = {options.fusion!r} on {cluster}: a TPU runs programs compiled "
                     "by XLA only; plan it with fusion 'xla'.")
  cluster.hardware.check_dtype(activation_dtype())
  full_shape, rules = _config_mesh_and_layout(mesh_shape, layout)
  if full_shape.size != cluster.count:
    raise ValueError(f"mesh {full_shape.to_string()} has {full_shape.size} processors but "
                     f"--hardware={cluster} has {cluster.count} devices; make them equal "
                     "(--mesh_shape and --layout, or --auto to search).")
  options.check()
  names = [d.name for d in full_shape.dims]
  sizes = full_shape.to_integer_list()
  rule_map = dict(rules.rules) if hasattr(rules, "rules") else dict((r[0], r[1]) for r in rules)
  pipe_dim = rule_map.get("stages")
  if options.num_stages > 1:
    if pipe_dim is None:
      raise ValueError(f"num_stages={options.num_stages} but the layout has no 'stages' rule: "
                       "add e.g. 'stages:pipe' and a mesh dimension pipe of that size.")
    if dict(zip(names, sizes))[pipe_dim] != options.num_stages:
      raise ValueError(f"num_stages={options.num_stages} but mesh dimension {pipe_dim!r} "
                       f"(layout rule stages:{pipe_dim}) has size {dict(zip(names, sizes))[pipe_dim]}.")
  elif pipe_dim is not None and dict(zip(names, sizes))[pipe_dim] > 1:
    raise ValueError(f"the layout splits 'stages' over {pipe_dim!r} but the config has "
                     "num_stages = 1: set transformer.make_layer_stack.num_stages.")
  sub_dims = [d for d in full_shape.dims if d.name != pipe_dim or options.num_stages == 1]
  sub_shape = mtf.Shape(sub_dims)
  axis_map = {i: names.index(d.name) for i, d in enumerate(sub_dims)}
  sub_rules = mtf.convert_to_layout_rules(
      [(k, v) for k, v in rule_map.items() if k != "stages" and v in sub_shape.dimension_names])
  b = dict(gin.get_bindings("run"))
  batch = report.configured_batch_size(full_shape.to_string(), rules.to_string())
  grad_accum = int(b.get("grad_accum_steps") or 1)
  m = options.num_microbatches * grad_accum
  micro = plan_batch.micro_batch(batch, m, int(b.get("outer_batch_size") or 1),
                                 dict(zip(names, sizes)), rule_map)
  num_layers = plan_stacks.stack_count("num_layers", 6)
  s = options.num_stages
  chunks = s * (options.virtual_stages if s > 1 else 1)
  if num_layers < chunks:
    raise ValueError(f"num_layers = {num_layers} is less than the {chunks} pipeline stages "
                     "(x virtual_stages).")
  seq_len = configured_sequence_length()

  sub_mesh = sub_shape.to_string()
  sub_layout = sub_rules.to_string()
  master = options.float32_master_in_optimizer
  # Bytes of a variable read in the activation dtype per byte stored.
  read_per_stored = 1.0 if master else activation_bytes() / 4
  one = _priced(sub_mesh, sub_layout, micro, 1, master)
  if s > 1 and one.pipeline_refusal:
    raise ValueError(f"num_stages={s}: {one.pipeline_refusal}")
  two = _priced(sub_mesh, sub_layout, micro, 2, master)
  h = cluster.hardware.for_products(activation_dtype())  # products at the dtype's rate
  pricer = _CommPricer(sizes, axis_map, cluster, names)
  one_phases, two_phases = one.phases(options), two.phases(options)
  layer = {p: two_phases[p].minus(one_phases[p]) for p in PHASES + RECOMPUTE_PHASES}
  extra = {p: one_phases[p].minus(layer[p]) for p in PHASES}
  # Uneven stages (LayerStack.chunk_block_counts): the busiest stage runs
  # ceil(L / (S V)) layers per chunk; in lockstep every stage takes as long.
  per_stage = -(-num_layers // chunks) * (chunks // s)
  executed_layers = per_stage * s  # with the padding blocks (their collectives run too)

  def stage_phase(p):
    return extra[p].plus(layer[p], per_stage)

  # Time of one micro-batch on the busiest stage: a layer's compute (c) and
  # with its model-parallel collectives (l); the embeddings and loss (x).
  fwd_c = _compute_time(layer["forward"], h)
  bwd_c = _compute_time(layer["backward"], h)
  fwd_xc = _compute_time(extra["forward"], h)
  bwd_xc = _compute_time(extra["backward"], h)
  # ... and their model-parallel collectives.
  fwd_lm, bwd_lm = pricer.total(layer["forward"]), pricer.total(layer["backward"])
  fwd_xm, bwd_xm = pricer.total(extra["forward"]), pricer.total(extra["backward"])
  # A sequence-parallel layer's input, gathered again for the backward pass,
  # is gathered under the backward compute of the layer after it.
  bwd_lm += max(0.0, pricer.total_ahead(layer["backward"]) - bwd_c)
  bwd_xm += pricer.total_ahead(extra["backward"])
  if "model_parallel" in options.overlap:
    # Estimate only: each collective cut into one chunk per member of its
    # group and pipelined with the layer's products; one chunk shows.
    fwd_lm = _overlapped(fwd_lm, fwd_c, layer["forward"], sub_dims)
    bwd_lm = _overlapped(bwd_lm, bwd_c, layer["backward"], sub_dims)
  fwd_l = fwd_c + fwd_lm
  bwd_l = bwd_c + bwd_lm
  fwd_x = fwd_xc + fwd_xm
  bwd_x = bwd_xc + bwd_xm
  recompute_l = 0.0
  recompute_flops_l = 0.0
  # Layers of the busiest stage recomputed (recompute_layers: the first of
  # each chunk), and the share of all layers that is.
  chunk_layers = per_stage // (options.virtual_stages if s > 1 else 1)
  recomputed = 0 if options.recompute == "none" else per_stage
  if recomputed and options.recompute_layers is not None:
    recomputed = min(options.recompute_layers, chunk_layers) * (per_stage // chunk_layers)
  share = recomputed / per_stage
  if options.recompute == "layer":
    recompute_l = fwd_l
    recompute_flops_l = layer["forward"].model_flops
  elif options.recompute == "selective":
    recompute_l = _compute_time(layer["selective"], h)
    recompute_flops_l = layer["selective"].model_flops
  elif options.recompute == "projections":
    recompute_l = _compute_time(layer["projections"], h) + pricer.total(layer["projections"])
    recompute_flops_l = layer["projections"].model_flops
  data = plan_batch.data_parallel(sub_dims, rule_map)
  dp_axes, dp = data.zero_axes, data.zero_size  # ZeRO's
  if options.zero_stage and not dp_axes:
    raise ValueError(f"run.zero_stage = {options.zero_stage} shards the training state over the "
                     f"data-parallel mesh dimension, but layout {rules.to_string()!r} does not "
                     "split 'batch': add a rule such as 'batch:data', or set run.zero_stage = 0.")
  micro_time = per_stage * (fwd_l + bwd_l) + recomputed * recompute_l + fwd_x + bwd_x
  p2p = 0.0
  if s > 1:
    hop = _stage_send_time(one, full_shape, rules, names.index(pipe_dim), cluster)
    p2p = 2 * hop * options.virtual_stages
  v = options.virtual_stages if options.schedule == "interleaved" else 1
  slots = m + (s - 1) / v if s > 1 else m
  pipeline_time = slots * (micro_time + p2p)
  bubble = (slots - m) * (micro_time + p2p)
  # Once per step: the gradient reduction and the optimizer's update.
  opt, after_update = plan_zero.optimizer_phase(stage_phase("optimizer"), dp_axes, dp,
                                                 options.zero_stage, read_per_stored, data.axes)
  if options.fusion == "xla":  # merged as XLA's combiner passes merge them
    size = lambda axes: observers.group_size(pricer.full_axes(axes), pricer.full_sizes)  # noqa
    opt = dataclasses.replace(opt, comm=plan_combine.combine(opt.comm, size))
    after_update = plan_combine.combine(after_update, size)
  grad_reduce = pricer.total(opt)
  optimizer_compute = _compute_time(opt, h)
  exposed = grad_reduce
  if options.overlap_grad_reduce and grad_reduce > 0:
    hidden = per_stage * bwd_l + recomputed * recompute_l
    exposed = max(grad_reduce / plan_combine.pieces(opt.comm, per_stage), grad_reduce - hidden)
  param_gather = sum(c * pricer.time(k) for k, c in after_update.items())
  if "param_gather" in options.overlap and param_gather > 0:
    # Estimate only: under the next step's first forward pass, a piece ahead.
    param_gather = max(param_gather / plan_combine.pieces(after_update, per_stage),
                       param_gather - per_stage * fwd_c)
  zero3 = plan_zero.Stage3Gathers()
  if options.zero_stage >= 3:
    zero3 = plan_zero.stage3_gathers(
        two.variables - one.variables, dp_axes, dp, read_per_stored, pricer.time, stages=s,
        layers_per_stage=per_stage, executed_layers=executed_layers, microbatches=m,
        grad_accum=grad_accum, reshard_after_forward=options.zero_reshard_after_forward,
        forward_s=fwd_c, backward_s=bwd_c + (share * fwd_c if options.recompute == "layer" else 0),
        grad_reduce_hidden_s=grad_reduce - exposed)
  step_time = pipeline_time + exposed + optimizer_compute + param_gather + zero3.exposed

  # FLOPs (whole step, all devices).
  model_flops_micro = (layer["forward"].model_flops + layer["backward"].model_flops) \
      * num_layers + extra["forward"].model_flops + extra["backward"].model_flops
  model_flops = model_flops_micro * m
  hw_flops = model_flops + (share * recompute_flops_l * num_layers * m
                            + (layer["backward"].extra_flops * num_layers
                               + extra["backward"].extra_flops) * m)
  peak = cluster.count * cluster.hardware.peak_flops_per_s
  memory = _memory_per_device(one, two, options, per_stage, recomputed, dp, m, read_per_stored)

  # Communications, per step.
  comms = []

  def add_communication(phase, key, count, seconds):
    kind, axes, nbytes = key
    comms.append(Communication(phase, kind, tuple(sub_dims[a].name for a in axes), nbytes,
                               count, seconds, topology.link_label(pricer.levels(axes))))

  for phase in PHASES:
    if phase == "optimizer":
      counts = {k: c for k, c in opt.comm.items()}
      mult = 1
    else:
      both, per_layer = extra[phase].collectives(), layer[phase].collectives()
      counts = {k: both.get(k, 0) + executed_layers * per_layer.get(k, 0)
                for k in sorted(set(both) | set(per_layer))}
      mult = m
      if phase == "backward" and options.recompute == "layer":
        for k, c in layer["forward"].comm.items():
          counts[k] = counts.get(k, 0) + share * executed_layers * c
    for k, c in counts.items():
      if c > 0:
        # Per device: the pipeline's stages each run their share of layers.
        add_communication(phase, k, c * mult,
                          c * mult * pricer.time(k) / (s if phase != "optimizer" else 1))
  for k, c in after_update.items():
    add_communication("optimizer", k, c, c * pricer.time(k))
  if zero3.seconds:
    add_communication("forward and backward" if options.zero_reshard_after_forward else "forward",
                      zero3.key, zero3.count, zero3.seconds)
  comms.sort(key=lambda c: -c.seconds)
  breakdown = {
      "compute": m * (per_stage * (fwd_c + bwd_c) + fwd_xc + bwd_xc),
      "model_parallel_comm": m * (per_stage * (fwd_lm + bwd_lm) + fwd_xm + bwd_xm),
      "recompute": m * recomputed * recompute_l,
      "zero3_gather": zero3.exposed, "zero_param_gather": param_gather,
      "pipeline_bubble": bubble, "pipeline_sends": m * p2p,
      "grad_reduce_exposed": exposed, "optimizer": optimizer_compute}
  params = one.parameters + (num_layers - 1) * (two.parameters - one.parameters)
  from mesh_tensorflow.transformer import sequence_parallel  # pylint: disable=g-import-not-at-top
  gpipe = plan_notes.gpipe_note(options, memory["total"], lambda: _memory_per_device(
      one, two, dataclasses.replace(options, schedule="1f1b"), per_stage, recomputed, dp, m,
      read_per_stored)["total"])
  notes = plan_notes.plan_notes(
      options, cluster.hardware, activation_dtype(),
      # A layout given here is checked; the config's may serve several models.
      [] if layout is None else report.unused_rule_notes(sub_rules, one.dimension_names),
      sequence_parallel.unsplit_stream_notes(
          plan_stacks.stack_setting("sequence_parallel", False), sub_rules), gpipe)
  notes += plan_notes.placement_notes(comms, full_shape, {sub_dims[a].name for a in data.axes},
                                      cluster)
  notes += plan_notes.config_size_notes()
  return Plan(str(cluster), full_shape.to_string(), rules.to_string(), options, step_time,
              batch * seq_len, model_flops, hw_flops, model_flops / (step_time * peak),
              hw_flops / (step_time * peak), memory, h.hbm_bytes, breakdown, comms, num_layers,
              params, notes, one.own_stack, plan_stacks.encoder_decoder())


def _memory_per_device(one: _Priced, two: _Priced, options: PlanOptions, per_stage: int,
                       recomputed: int, dp: int, microbatches: int,
                       read_per_stored: float) -> Dict[str, float]:
  """Bytes per device of the busiest stage (`per_stage` layers, `recomputed`
  of them recomputed; `dp` data-parallel processors ZeRO splits over) by
  kind, and their "total": variables, gradients, optimizer slots, live
  activations (after recomputation, times the micro-batches a pipeline holds
  in flight) and the pipeline's send and receive buffers."""
  s, m = options.num_stages, microbatches
  var_layer = two.variables - one.variables
  var_extra = one.variables - var_layer
  slot_layer = two.slots - one.slots
  slot_extra = one.slots - slot_layer
  variables = var_extra + per_stage * var_layer
  gradients = variables
  slots_bytes = slot_extra + per_stage * slot_layer
  if options.zero_stage >= 1:
    slots_bytes /= dp
  if options.zero_stage >= 2:
    gradients /= dp
  if options.zero_stage >= 3:
    # Stored in blocks, plus the gathered copies (activation dtype) alive at
    # once: the embeddings', and two layers' (a pipeline, or copies kept for
    # the backward pass: every layer's of the stage).
    kept = s > 1 or not options.zero_reshard_after_forward
    gathered = var_extra + (per_stage if kept else 2) * var_layer
    variables = variables / dp + gathered * read_per_stored
  # A layer's activations: what one more layer keeps for the backward pass
  # (the peaks' difference would count its gradients where the peak falls
  # late in the backward pass); the rest of the peak is the step's own.
  act_layer = max(two.kept_activations - one.kept_activations, 0.0)
  # A layer not recomputed keeps all but the score tensors a fused kernel
  # keeps on chip (one log-sum per row).
  kept_plain = (max(act_layer - one.attention_core_bytes, one.layer_input_bytes)
                if options.attention == "fused" else act_layer)
  peak = one.peaks[(options.fusion == "xla", options.attention == "fused")]
  act_extra = max(peak - kept_plain, 0.0)
  if options.recompute == "layer":
    kept_layer = one.layer_input_bytes
  elif options.recompute == "selective":
    kept_layer = max(act_layer - one.attention_core_bytes, one.layer_input_bytes)
  elif options.recompute == "projections":
    kept_layer = one.layer_input_bytes + max(two.projection_bytes - one.projection_bytes, 0.0)
  else:
    kept_layer = kept_plain
  if s > 1:
    in_flight = m if options.schedule == "gpipe" else min(m, s)
    if options.schedule == "interleaved":  # chunk passes of L / (S V) layers each
      from mesh_tensorflow.training import pipeline_schedule  # pylint: disable=g-import-not-at-top
      in_flight = pipeline_schedule.max_in_flight(
          "interleaved", s, m, options.virtual_stages) / options.virtual_stages
  else:
    in_flight = 1
  activations = (in_flight * (recomputed * kept_layer + (per_stage - recomputed) * kept_plain)
                 + act_extra)
  if recomputed:
    # One layer's working set while it is recomputed: what its recomputation
    # makes again, all it would keep without recomputation but what it keeps
    # (kept_layer, counted above already).
    activations += max(kept_plain - kept_layer, 0.0)
  buffers = 2 * one.layer_input_bytes * (2 if s > 1 else 0)
  memory = {"variables": variables, "gradients": gradients, "optimizer_slots": slots_bytes,
            "activations": activations, "pipeline_buffers": buffers}
  memory["total"] = sum(memory.values())
  return memory


def _stage_send_time(one: _Priced, full_shape, rules, pipe_axis: int,
                     cluster: hardware_lib.Cluster) -> float:
  """Seconds to move a layer's input to the next stage as `mtf.pipeline`
  sends it: the Redistribution `plans.plan_shift` builds for the
  [stages, ...] activations (the plan the lowering executes: blocks cut
  over the mesh axes that replicate them, a point-to-point send along the
  pipeline's axis, all-gathers on the receivers), each step priced by the
  cost model's `collective_seconds`."""
  import types  # pylint: disable=g-import-not-at-top
  import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top
  from mesh_tensorflow.lowering import plans  # pylint: disable=g-import-not-at-top
  sizes = full_shape.to_integer_list()
  if not one.layer_input_dims:  # no layer input found: one whole send of its bytes
    return topology.point_to_point_time(one.layer_input_bytes, sizes, pipe_axis, cluster)
  stages = mtf.Dimension("stages", sizes[pipe_axis])
  shape = mtf.Shape([stages] + list(one.layer_input_dims))
  layout_of = lambda s: tuple(rules.tensor_layout(s, full_shape))
  elems = plans.slice_elements(shape, layout_of(shape), sizes)
  dtype = types.SimpleNamespace(size=one.layer_input_bytes / max(elems, 1))
  shift = types.SimpleNamespace(inputs=[types.SimpleNamespace(shape=shape, dtype=dtype)],
                                wrap=False, split_replicas=True)
  send = plans.plan_shift(shift, stages, 1, layout_of, sizes).operands[1].move
  seconds = 0.0
  for step, layout in send.walk():
    if step.kind is None:
      continue
    axes = step.mesh_axes if isinstance(step, plans.AllReduce) else (step.mesh_axis,)
    nbytes = plans.slice_elements(shape, layout, sizes) * dtype.size
    seconds += estimator.collective_seconds(step.kind, nbytes, sizes, axes, cluster)
  return seconds


def activation_dtype() -> str:
  """The config's run.activation_dtype (`report.configured_activation_dtype`)."""
  from mesh_tensorflow.transformer import report  # pylint: disable=g-import-not-at-top
  return report.configured_activation_dtype()


def activation_bytes() -> int:
  """Bytes per element of the config's activations (run.activation_dtype)."""
  return 2 if "float16" in activation_dtype() else 4


