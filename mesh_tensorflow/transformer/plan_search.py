"""`plan --auto`: the best meshes, layouts and options for a device count.

For the parsed gin config and a cluster it tries every split of the devices
into pipeline x data x model parallelism (`pipe:P;data:D;model:T`, model
innermost so that its collectives stay inside a host where they can; T
divides the heads and d_ff, D the batch, P is at most the number of layers,
which it need not divide), the micro-batch sizes 1, 2 and 4 sequences per
replica when pipelining, each pipeline on the 1F1B schedule (GPipe takes
the same time and keeps more micro-batches in memory) and on the
interleaved one with 2 and 4 layer chunks per stage where every chunk has a
layer, recomputation ("none", "selective", "projections", "layer"; a stack of custom
sublayers, which cannot recompute selectively, without "selective"; where
recomputing every layer fits and recomputing none does not, also the
fewest layers of each chunk recomputed that fit: `recompute_layers`) and ZeRO
stages 0 and 2 (stage 2
costs no more time than stage 1 and holds less), and 3 without a pipeline
(FSDP-style, gathering each layer again for the backward pass or keeping
its copy), prices each with the planner, and keeps those that fit in
memory, fastest first (step times within 0.5% of each other are a tie,
ranked by memory per device). With model parallelism the stack is sequence
parallel (`residual_length:model`: the same collectives' bytes, less memory
and elementwise work per device; where T does not divide the length but
divides d_model, the stream's d_model is split instead,
`residual_d_model:model`) unless the config's stack cannot be. A config
with mixture-of-experts layers (`MoE1D.num_experts`) is also tried with its
experts split over the data dimension (`experts:data`, GShard's layout)
where D divides the number of experts. On TPU slices (`--hardware=NAME:SxN`)
and on GPU clusters of several hosts a mesh without a pipeline is also
tried as hybrid sharding, `slices:S;data:D/S;model:T` (`hosts:H;...` on
GPUs) with `outer_batch` split over the first dimension and
`run.outer_batch_size` its size, at ZeRO stages 2 and 3: the state is
sharded inside each slice or host and only the gradients' blocks cross
the network. Each
printed plan says why it is where it is: its largest time components and its
memory headroom.

The layout is the Megatron-style one (`batch:data;d_ff:model;heads:model;
vocab:model;stages:pipe`); auto_mtf's layout search (`report --auto`) picks
layouts for one fixed mesh and is not used here: at this scale the mesh
shape and the options decide. Steps are priced once per (mesh, micro-batch)
and reused across options.

    >>> result = search(hardware.parse_cluster("a100-80gb:1024"), top=5)
    >>> print(result.summary())
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from typing import Callable, List, Optional, Tuple

from mesh_tensorflow.analysis.cost_model import hardware as hardware_lib
from mesh_tensorflow.transformer import plan_stacks
from mesh_tensorflow.transformer import planner
from mesh_tensorflow.transformer import plan_types

LAYOUT = "stages:pipe;batch:data;d_ff:model;heads:model;vocab:model"
# Layer chunks per stage tried for every pipeline (1: the 1F1B schedule,
# more: the interleaved one).
VIRTUAL_STAGES = (1, 2, 4)
SEQUENCE_PARALLEL = "transformer.make_layer_stack.sequence_parallel"
SEQUENCE_PARALLEL_RULE = "residual_length:model"
# The rule that splits a mixture-of-experts layer's experts over the data dimension.
EXPERT_RULE = "experts:data"
# sequence_parallel mode -> the layout rule that splits the stream.
STREAM_RULES = {"length": SEQUENCE_PARALLEL_RULE, "d_model": "residual_d_model:model"}
# Hybrid sharding: the mesh dimension of the groups that ZeRO shards within
# (TPU slices; a GPU cluster's hosts), the rule splitting the batch's outer
# dimension over it, and its size's binding.
GROUP_DIMS = {"tpu": "slices", "gpu": "hosts"}
OUTER_RULE = "outer_batch:"
OUTER_BATCH = "run.outer_batch_size"
# Recomputation policies tried (LayerStack.recompute).
RECOMPUTE_POLICIES = ("none", "selective", "projections", "layer")


@dataclasses.dataclass
class SearchResult:
  """The plans that fit, fastest first, and what was tried."""
  plans: List[planner.Plan]
  tried: int
  rejected: List[str]  # why each plan was left out, the closest to fitting first
  seconds: float
  top: int
  stopped: bool = False  # the time budget ended the search early
  memory_budget_bytes: Optional[float] = None  # what a plan may use per device (None: HBM)

  def to_dict(self):
    return {"plans": [p.to_dict() for p in self.plans[:self.top]], "tried": self.tried,
            "rejected": self.rejected[:20], "seconds": self.seconds, "stopped": self.stopped,
            "memory_budget_bytes": self.memory_budget_bytes}

  def summary(self) -> str:
    budget = ("memory" if self.memory_budget_bytes is None
              else f"the budget of {self.memory_budget_bytes / 2**30:.1f} GiB per device")
    lines = [f"searched {self.tried} plans in {self.seconds:.0f} s; "
             f"{len(self.plans)} fit in {budget}"
             + ("; stopped by the time budget (--max_seconds): the ranking covers the plans "
                "priced so far" if self.stopped else "")]
    if not self.plans:
      lines.append("no plan fits; the closest: " + "; ".join(self.rejected[:5])
                   if self.rejected else "no plan was priced: raise --max_seconds")
      return "\n".join(lines)
    best = seconds_per_token(self.plans[0])
    for rank, p in enumerate(self.plans[:self.top], 1):
      o = p.options
      lines.append("")
      schedule = f"{schedule_label(o)}  " if o.num_stages > 1 else ""
      lines.append(f"#{rank}  mesh {p.mesh_shape}  micro-batches {o.num_microbatches}  "
                   f"{schedule}recompute={plan_types.recompute_label(o)}  "
                   f"zero={_zero_label(o)}")
      lines.append(f"    layout {p.layout}")
      lines.append(f"    step {p.step_time_s:.3f} s ({seconds_per_token(p) / best:.2f}x best), "
                   f"{p.tokens_per_s:,.0f} tokens/s, MFU {100 * p.mfu:.1f}%, "
                   f"{p.memory_bytes_per_device / 2**30:.1f} of {p.hbm_bytes / 2**30:.1f} GiB")
      lines.append(f"    why: {why(p)}")
    lines.append("")
    lines.append("gin for #1: " + "; ".join(gin_bindings(self.plans[0])))
    first = self.plans[0]
    if first.tight:
      lines.append(f"note: #1 leaves {first.spare_bytes / 2**30:.1f} GiB of "
                   f"{first.hbm_bytes / 2**30:.1f} spare: allocator fragmentation and compiler "
                   "scratch space often take a few GiB; --memory_budget=GIB keeps only plans that "
                   "leave room")
    return "\n".join(lines)


def schedule_label(options: planner.PlanOptions) -> str:
  """A pipeline's schedule as plans are listed: "1f1b", "gpipe" or
  "interleaved x4" (4 layer chunks per stage)."""
  if options.schedule == "interleaved":
    return f"interleaved x{options.virtual_stages}"
  return options.schedule


def why(plan: planner.Plan) -> str:
  t = plan.time_breakdown
  total = plan.step_time_s
  parts = sorted(((v / total, k) for k, v in t.items() if v > 0), reverse=True)
  shown = ", ".join(f"{k.replace('_', ' ')} {100 * f:.0f}%" for f, k in parts[:3])
  return f"{shown}; {plan.spare_bytes / 2**30:.1f} GiB spare"


def gin_bindings(plan: planner.Plan) -> List[str]:
  o = plan.options
  out = [f"run.mesh_shape = '{plan.mesh_shape}'", f"run.layout_rules = '{plan.layout}'",
         f"transformer.make_layer_stack.recompute = '{o.recompute}'",
         *([f"transformer.make_layer_stack.recompute_layers = {o.recompute_layers}"]
           if o.recompute_layers is not None else []),
         f"run.zero_stage = {o.zero_stage}"]
  rules = plan.layout.split(";")
  outer = _outer_batch_size(plan.mesh_shape, plan.layout)
  if outer > 1:
    out.append(f"{OUTER_BATCH} = {outer}")
  if SEQUENCE_PARALLEL_RULE in rules:
    out.append(f"{SEQUENCE_PARALLEL} = True")
  elif STREAM_RULES["d_model"] in rules:
    out.append(f"{SEQUENCE_PARALLEL} = 'd_model'")
  if not o.zero_reshard_after_forward:
    out.append("run.zero_reshard_after_forward = False")
  if o.float32_master_in_optimizer:
    out.append("run.float32_master_in_optimizer = True")
  if o.num_stages > 1:
    out += [f"transformer.make_layer_stack.num_stages = {o.num_stages}",
            f"transformer.make_layer_stack.num_microbatches = {o.num_microbatches}",
            f"transformer.make_layer_stack.pipeline_schedule = '{o.schedule}'"]
    if o.virtual_stages > 1:
      out.append(f"transformer.make_layer_stack.virtual_stages = {o.virtual_stages}")
  return plan_stacks.with_scoped_lines(out)


def _plan(cluster, mesh: str, layout: str, options, sequence_parallel: Optional[str]):
  """planner.plan_current_config, the stack's stream split as
  `sequence_parallel` says ("length", "d_model"; None: as configured) and
  the layout given its rule, for the duration; run.outer_batch_size the
  size of the mesh dimension that splits "outer_batch" (hybrid sharding),
  else 1 (the other layouts searched split only "batch")."""
  from mesh_tensorflow.transformer import gin_config  # pylint: disable=g-import-not-at-top
  bindings, defaults = {OUTER_BATCH: _outer_batch_size(mesh, layout)}, {OUTER_BATCH: 1}
  if sequence_parallel:
    bindings[SEQUENCE_PARALLEL], defaults[SEQUENCE_PARALLEL] = sequence_parallel, False
    layout += ";" + STREAM_RULES[sequence_parallel]
  with gin_config.overridden(plan_stacks.with_scoped(bindings), defaults):
    return planner.plan_current_config(cluster, mesh, layout, options)


def _outer_batch_size(mesh: str, layout: str) -> int:
  """The size of the mesh dimension that `layout` splits "outer_batch"
  over (hybrid sharding's run.outer_batch_size), else 1."""
  import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top
  name = mtf.convert_to_layout_rules(layout).mesh_dimension_name("outer_batch")
  return 1 if name is None else mtf.convert_to_shape(mesh).get_dim_by_name(name).size


def _stream_mode(t: int, seq_len: int, d_model: int) -> Optional[str]:
  """How a t-way model-parallel stack splits its stream: the length where t
  divides it, else d_model where t divides that, else not at all."""
  if t == 1:
    return None
  if seq_len % t == 0:
    return "length"
  return "d_model" if d_model % t == 0 else None


def _zero_label(o: planner.PlanOptions) -> str:
  notes = ([] if o.zero_reshard_after_forward else ["gathered once"]) + (
      ["masters in the optimizer"] if o.float32_master_in_optimizer else [])
  return f"{o.zero_stage}" + (f" ({', '.join(notes)})" if notes else "")


def _divisors(n: int) -> List[int]:
  return [d for d in range(1, n + 1) if n % d == 0]


def search(cluster: hardware_lib.Cluster, top: int = 5, micro_sizes=(1, 2, 4),
           max_pipeline: int = 64, memory_budget_bytes=None,
           virtual_stages=VIRTUAL_STAGES, attention: str = "unfused",
           fusion: str = "xla", overlap: Tuple[str, ...] = (),
           max_seconds: Optional[float] = None,
           progress: Optional[Callable[[int, float], None]] = None) -> SearchResult:
  """Searches plans for the parsed gin config on `cluster`; a plan fits when
  its memory per device is within the HBM and `memory_budget_bytes`.

  `max_seconds` ends the search once that much time has passed (the result
  says `stopped`); `progress(tried, seconds)` is called about every 10 s.

  Pipelines need not divide the layers (uneven stages,
  `LayerStack.stage_block_counts`). `virtual_stages` other than 1 also try
  the interleaved schedule with that many layer chunks per device, for
  pipelines with at least one layer per chunk (the chunks need not divide
  the layers either: `LayerStack.chunk_block_counts`).
  `attention`, `fusion` and `overlap` set those `PlanOptions` fields of
  every plan tried."""
  from mesh_tensorflow.transformer import gin_config  # pylint: disable=g-import-not-at-top
  from mesh_tensorflow.transformer import layer_stack  # pylint: disable=g-import-not-at-top
  from mesh_tensorflow.transformer import report  # pylint: disable=g-import-not-at-top
  cluster.hardware.check_dtype(planner.activation_dtype())
  start = time.time()
  num_layers = plan_stacks.stack_count("num_layers", 6)
  heads = int(gin_config.query("SelfAttention.num_heads", 8) or 8)
  d_ff = int(gin_config.query("DenseReluDense.hidden_size", 2048) or 2048)
  d_model = int(gin_config.query("Unitransformer.d_model", 512) or 512)
  seq_len = planner.configured_sequence_length()
  num_experts = int(gin_config.query("MoE1D.num_experts", 0) or 0)
  # Plans keep float32 masters in the optimizer state (split by ZeRO) where
  # the activations are 16-bit, unless the config says otherwise: with ZeRO
  # less memory and half the gathered bytes, without it the same bytes; the
  # same training. (One setting for every plan: one graph per mesh to price.)
  configured_master = gin_config.query("run.float32_master_in_optimizer", None)
  master = (bool(configured_master) if configured_master is not None
            else planner.activation_bytes() == 2)
  h = cluster.hardware
  n = cluster.count
  max_model = h.devices_per_host if h.kind == "gpu" else 64
  plans, tried = [], 0
  rejected = []  # (bytes per device, or inf for a mesh the config cannot take; why)
  last_report = start

  def fits(plan):
    return plan.fits and (memory_budget_bytes is None
                          or plan.memory_bytes_per_device <= memory_budget_bytes)

  stopped = False
  sequence_parallel_ok = plan_stacks.stack_setting("sequence_parallel", None) is not False
  # A stack of custom sublayers recomputes whole layers or nothing; a stack of
  # the model's own (a Universal Transformer's) neither recomputes nor pipelines.
  policies = tuple(x for x in RECOMPUTE_POLICIES if x != "selective"
                   or not layer_stack.configured_with_custom_sublayers())
  if layer_stack.configured_own_stack():
    policies, max_pipeline = ("none",), 1
  for t in _divisors(n):
    if t > max_model or heads % t or d_ff % t:
      continue
    for p in _divisors(n // t):
      if p > max_pipeline or p > num_layers:
        continue
      d = n // (t * p)
      batch = report.configured_batch_size(f"data:{d}", "batch:data")  # sequences
      if batch % d:
        continue
      per_replica = batch // d
      micros = sorted({per_replica // m for m in micro_sizes if per_replica % m == 0}) \
          if p > 1 else [1]
      dims = ([f"pipe:{p}"] if p > 1 else []) + [f"data:{d}"] + ([f"model:{t}"] if t > 1 else [])
      mesh = ";".join(dims)
      base_layout = ";".join(r for r in LAYOUT.split(";")
                             if r.split(":")[1] in {x.split(":")[0] for x in dims})
      # Mixture-of-experts layers: also the experts split over the data
      # dimension (GShard: tokens reach their experts by all-to-all).
      layouts = [base_layout] + ([base_layout + ";" + EXPERT_RULE]
                                 if num_experts and d > 1 and num_experts % d == 0 else [])
      chunks = [v for v in virtual_stages if v == 1 or (p > 1 and p * v <= num_layers)]
      # (stage, reshard_after_forward)
      zero_stages = ((0, True), (2, True)) + (((3, True), (3, False)) if p == 1 else ())
      sequence_parallel = _stream_mode(t, seq_len, d_model) if sequence_parallel_ok else None
      candidates = [(mesh, layout, zero_stages) for layout in layouts]
      hybrid = _hybrid(cluster, p, d, t, base_layout)
      if hybrid:  # ZeRO inside each slice or host, data parallelism across them
        candidates.append(hybrid + (zero_stages[1:],))
      combos = ((c, m, v, r, z) for c in candidates
                for m, v, r in itertools.product(micros, chunks, policies) for z in c[2])
      for (mesh, layout, _), m, v, recompute, (zero, reshard) in combos:
        if v > 1 and m % p:  # the interleaved schedule runs groups of p micro-batches
          continue
        now = time.time()
        if max_seconds is not None and now - start > max_seconds:
          stopped = True
          break
        if progress is not None and now - last_report >= 10:
          progress(tried, now - start)
          last_report = now
        tried += 1
        options = planner.PlanOptions(
            num_stages=p, num_microbatches=m,
            schedule="interleaved" if v > 1 else "1f1b" if p > 1 else "gpipe",
            virtual_stages=v, recompute=recompute, zero_stage=zero,
            zero_reshard_after_forward=reshard, attention=attention, fusion=fusion,
            float32_master_in_optimizer=master, overlap=tuple(overlap))
        try:
          plan = _plan(cluster, mesh, layout, options, sequence_parallel)
        except ValueError as e:
          if not sequence_parallel:  # the mesh does not suit the config
            rejected.append((math.inf, f"{mesh}: {e}"))
            break
          try:
            plan = _plan(cluster, mesh, layout, options, None)
          except ValueError as e2:  # nor without: the mesh, not sequence parallelism
            rejected.append((math.inf, f"{mesh}: {e2}"))
            break
          # Planned without: the config's stack cannot be sequence parallel.
          sequence_parallel_ok, sequence_parallel = False, None
        if fits(plan):
          plans.append(plan)
          if recompute != "none":
            chunk_layers = -(-num_layers // (p * v))
            partial, probes = _fewest_recomputed(
                lambda k, o=options: _plan(cluster, mesh, layout,
                                           dataclasses.replace(o, recompute_layers=k),
                                           sequence_parallel), fits, chunk_layers)
            tried += probes
            if partial is not None:
              plans.append(partial)
        else:
          rejected.append((plan.memory_bytes_per_device,
                           f"{mesh} m={m} v={v} recompute={recompute} "
                           f"zero={_zero_label(options)}: needs "
                           f"{plan.memory_bytes_per_device / 2**30:.1f} GiB"))
  closest_first = [why for _, why in sorted(rejected, key=lambda r: r[0])]
  return SearchResult(_ranked(plans), tried, closest_first, time.time() - start, top, stopped,
                      memory_budget_bytes)


def _hybrid(cluster: hardware_lib.Cluster, p: int, d: int, t: int,
            layout: str) -> Optional[Tuple[str, str]]:
  """(mesh, layout) of hybrid sharding for a mesh without a pipeline: on S
  TPU slices `slices:S;data:D/S;model:T`, on a GPU cluster of H hosts
  `hosts:H;data:D/H;model:T`, with "outer_batch" split over the first
  dimension (ZeRO then shards over `data`, inside a slice or host); None
  on one slice or host, with a pipeline, or where S (H) does not divide D
  into more than one."""
  kind, h = cluster.hardware.kind, cluster.hardware
  whole_hosts = cluster.count % h.devices_per_host == 0
  groups = (cluster.slices if kind == "tpu" else
            cluster.num_hosts if kind == "gpu" and whole_hosts else 0)
  if groups <= 1 or p > 1 or d % groups or d == groups:
    return None
  name = GROUP_DIMS[kind]
  return (f"{name}:{groups};data:{d // groups}" + (f";model:{t}" if t > 1 else ""),
          f"{OUTER_RULE}{name};{layout}")


def _fewest_recomputed(plan_with: Callable[[int], planner.Plan],
                       fits: Callable[[planner.Plan], bool], chunk_layers: int):
  """The plan recomputing the fewest layers of each chunk that fits
  (`recompute_layers`, by bisection; recomputing every layer fits), or None
  where recomputing none fits too (that plan is searched already) or all
  are needed; and how many plans it priced."""
  lo, hi, best, probes = 0, chunk_layers, None, 0  # hi layers fit; lo - 1 layers do not
  while lo < hi:
    k = (lo + hi) // 2
    candidate = plan_with(k)
    probes += 1
    if fits(candidate):
      hi, best = k, candidate
    else:
      lo = k + 1
  if best is None or best.options.recompute_layers == 0:
    return None, probes
  return best, probes


TIE = 0.005  # step times this close (relative) are a tie, below what the planner tells apart


def seconds_per_token(plan: planner.Plan) -> float:
  """What the search minimises: the step time per token of the step (the
  step time, where every plan has the config's batch; with a batch per
  replica, `("tokens_per_replica", N)`, meshes differ in batch)."""
  return plan.step_time_s / plan.tokens_per_step


def _ranked(plans: List[planner.Plan]) -> List[planner.Plan]:
  """Fastest first (`seconds_per_token`); plans within TIE of the fastest
  remaining one are a tie, ranked among themselves by memory per device
  (the headroom decides)."""
  rest = sorted(plans, key=lambda p: (float(f"{seconds_per_token(p):.6g}"),
                                      p.memory_bytes_per_device))
  out = []
  while rest:
    limit = seconds_per_token(rest[0]) * (1 + TIE)
    tied = [p for p in rest if seconds_per_token(p) <= limit]
    rest = rest[len(tied):]
    out += sorted(tied, key=lambda p: (p.memory_bytes_per_device, seconds_per_token(p)))
  return out
