"""What the planner takes and returns: `PlanOptions` (what a large run does
beyond one micro-batch's graph), `Plan` (the estimate: step time,
throughput, FLOPs, memory, where the time goes) and its `Communication`s.
`mesh_tensorflow.transformer.planner` makes them; import them from there.

    >>> plan = planner.plan_current_config(cluster, options=PlanOptions(num_stages=8))
    >>> plan.step_time_s, plan.fits
"""

from __future__ import annotations

import dataclasses
import json
from typing import Dict, List, Optional, Tuple

GIB = 2 ** 30
# A plan that fits with less than this share of HBM to spare is called tight:
# what the plan does not count (allocator fragmentation, compiler scratch
# space, the framework's own buffers) often takes a few GiB.
TIGHT_FRACTION = 0.05
# PlanOptions.overlap's values (estimate only) and how plans name them.
OVERLAP_LABELS = {"model_parallel": "tensor-parallel collectives",
                  "param_gather": "parameter gathering"}


# ------------------------------------------------------------ options
@dataclasses.dataclass
class PlanOptions:
  """What large runs do beyond one micro-batch's graph (read from gin).

  Attributes:
    num_stages: pipeline stages (transformer.make_layer_stack.num_stages).
    num_microbatches: micro-batches per step (...num_microbatches).
    schedule: "gpipe", "1f1b" (...pipeline_schedule) or "interleaved".
    virtual_stages: layer chunks per device with the interleaved schedule.
    recompute: "none", "layer", "selective" or "projections" (...recompute).
    recompute_layers: with recompute "layer" or "selective", the layers
      recomputed at the start of each pipeline chunk (of the stack without a
      pipeline); the others keep their activations. None: all
      (...recompute_layers).
    zero_stage: 0-3 (run.zero_stage).
    zero_reshard_after_forward: stage 3: the backward pass gathers each
      variable again (True) or keeps the forward pass's copy
      (run.zero_reshard_after_forward = False).
    float32_master_in_optimizer: variables stored in the activation dtype,
      their float32 masters in the optimizer's (ZeRO-sharded) state
      (run.float32_master_in_optimizer).
    overlap_grad_reduce: gradient reduction overlaps the last backward pass.
    fusion: "xla" (chains of elementwise operations and reductions fused,
      as XLA compiles the step: `run.jit_compile = True`, and always on
      TPUs) or "none" (every operation a kernel that reads and writes its
      operands in memory, as TensorFlow runs the step op by op); see
      `planner._phases`.
    attention: "unfused" (the library's attention: every op on the score
      tensors reads and writes them in memory, and the backward pass keeps
      them) or "fused" (estimate only: one kernel per pass that keeps the
      scores on chip, as FlashAttention-style kernels do; see `planner._phases`).
    overlap: estimate only, what a training stack other than this library
      overlaps with compute: "model_parallel" (each layer's tensor-parallel
      collectives pipelined with its matrix products, as Megatron-LM's
      --tp-comm-overlap does) and "param_gather" (ZeRO 1/2's all-gather of
      the updated variables under the next step's first forward pass, as
      Megatron-LM's --overlap-param-gather does).
  """
  num_stages: int = 1
  num_microbatches: int = 1
  schedule: str = "gpipe"
  virtual_stages: int = 1
  recompute: str = "none"
  zero_stage: int = 0
  zero_reshard_after_forward: bool = True
  overlap_grad_reduce: bool = True
  fusion: str = "xla"
  attention: str = "unfused"
  recompute_layers: Optional[int] = None
  float32_master_in_optimizer: bool = False
  overlap: Tuple[str, ...] = ()

  def check(self) -> None:
    """Raises ValueError, naming the gin binding, for options the library cannot run."""
    if self.schedule not in ("gpipe", "1f1b", "interleaved"):
      raise ValueError(f"pipeline_schedule = {self.schedule!r}: use 'gpipe', '1f1b' or "
                       "'interleaved'.")
    from mesh_tensorflow.transformer import layer_stack  # pylint: disable=g-import-not-at-top
    if self.recompute not in layer_stack.RECOMPUTE_POLICIES:
      raise ValueError(f"recompute = {self.recompute!r}: use 'none', 'layer', 'selective' or "
                       "'projections'.")
    if self.recompute == "selective" and layer_stack.configured_with_custom_sublayers():
      raise ValueError("recompute = 'selective': the config's layer stack has its own sublayers "
                       "(LayerStack.sublayers_*), which recompute whole layers or nothing; use "
                       "'layer' or 'none'.")
    # (The gin config is read only when it matters: check runs for every plan
    # --auto prices.)
    own_stack = ((self.num_stages > 1 or self.recompute != "none")
                 and layer_stack.configured_own_stack())
    if own_stack:
      raise ValueError(f"{own_stack}: a layer stack of its own, which "
                       "transformer.make_layer_stack's num_stages and recompute do not "
                       "reach; plan it with num_stages = 1 and recompute = 'none'.")
    if self.fusion not in ("none", "xla"):
      raise ValueError(f"fusion = {self.fusion!r}: use 'none' or 'xla' "
                       "(run.jit_compile = True).")
    if self.attention not in ("unfused", "fused"):
      raise ValueError(f"attention = {self.attention!r}: use 'unfused' or 'fused'.")
    unknown = [o for o in self.overlap if o not in OVERLAP_LABELS]
    if unknown:
      raise ValueError(f"overlap {', '.join(unknown)}: use {' or '.join(OVERLAP_LABELS)}.")
    if self.zero_stage not in (0, 1, 2, 3):
      raise ValueError(f"run.zero_stage = {self.zero_stage}: use 0, 1, 2 or 3.")
    if not self.zero_reshard_after_forward and self.zero_stage != 3:
      raise ValueError(f"run.zero_reshard_after_forward = False applies to run.zero_stage = 3, "
                       f"not {self.zero_stage}.")
    for name in ("num_stages", "num_microbatches", "virtual_stages"):
      if getattr(self, name) < 1:
        raise ValueError(f"transformer.make_layer_stack.{name} = {getattr(self, name)}: must "
                         "be positive.")
    if self.virtual_stages > 1 and self.schedule != "interleaved":
      raise ValueError(f"virtual_stages = {self.virtual_stages} needs the interleaved schedule.")
    if (self.schedule == "interleaved" and self.num_stages > 1
        and self.num_microbatches % self.num_stages):
      raise ValueError(f"the interleaved schedule needs num_microbatches "
                       f"({self.num_microbatches}) to be a multiple of num_stages "
                       f"({self.num_stages}).")
    layer_stack.check_recompute_layers(self.recompute, self.recompute_layers)


def recompute_label(options: PlanOptions) -> str:
  """The recomputation as plans are listed: "layer", or with
  recompute_layers "layer (first 3 layers)" ("... of each pipeline chunk"
  when pipelined).

  Example:
    >>> recompute_label(PlanOptions(recompute="layer", recompute_layers=3))
    'layer (first 3 layers)'
  """
  if options.recompute_layers is None or options.recompute == "none":
    return options.recompute
  k = options.recompute_layers
  where = " of each pipeline chunk" if options.num_stages > 1 else ""
  return f"{options.recompute} (first {k} layer{'' if k == 1 else 's'}{where})"


# ------------------------------------------------------------ results
@dataclasses.dataclass
class Communication:
  """One kind of collective of the step, all its occurrences together."""
  phase: str
  kind: str
  mesh_dims: Tuple[str, ...]
  bytes_per_processor: int
  count: float
  seconds: float
  link: str

  def as_dict(self):
    return dataclasses.asdict(self)


@dataclasses.dataclass
class Plan:
  """The estimate for one mesh, layout and set of options on a cluster."""
  cluster: str
  mesh_shape: str
  layout: str
  options: PlanOptions
  step_time_s: float
  tokens_per_step: int
  model_flops_per_step: float
  hardware_flops_per_step: float
  mfu: float
  hfu: float
  memory: Dict[str, float]
  hbm_bytes: float
  time_breakdown: Dict[str, float]
  communications: List[Communication]
  num_layers: int
  parameters: int
  notes: List[str] = dataclasses.field(default_factory=list)
  # The binding of a layer stack of the model's own (a Universal
  # Transformer's), priced whole: num_layers is then not its depth.
  own_stack: Optional[str] = None
  # An encoder-decoder model: num_layers layers in each of its two stacks.
  encoder_decoder: bool = False

  @property
  def tokens_per_s(self) -> float:
    return self.tokens_per_step / self.step_time_s

  @property
  def memory_bytes_per_device(self) -> float:
    return self.memory["total"]

  @property
  def fits(self) -> bool:
    return self.memory_bytes_per_device <= self.hbm_bytes

  @property
  def spare_bytes(self) -> float:
    """HBM left per device (negative: what is missing)."""
    return self.hbm_bytes - self.memory_bytes_per_device

  @property
  def tight(self) -> bool:
    """Fits with less than TIGHT_FRACTION of the HBM to spare."""
    return self.fits and self.spare_bytes < TIGHT_FRACTION * self.hbm_bytes

  def to_dict(self) -> dict:
    return {
        "cluster": self.cluster, "mesh_shape": self.mesh_shape, "layout": self.layout,
        "options": dataclasses.asdict(self.options),
        "step_time_s": self.step_time_s, "tokens_per_step": self.tokens_per_step,
        "tokens_per_s": self.tokens_per_s, "model_flops_per_step": self.model_flops_per_step,
        "hardware_flops_per_step": self.hardware_flops_per_step, "mfu": self.mfu,
        "hfu": self.hfu, "memory_bytes_per_device": self.memory_bytes_per_device,
        "memory_breakdown_bytes": self.memory, "hbm_bytes_per_device": self.hbm_bytes,
        "fits": self.fits, "time_breakdown_s": self.time_breakdown,
        "top_communications": [c.as_dict() for c in self.communications[:5]],
        "communications": [c.as_dict() for c in self.communications],
        "num_layers": self.num_layers, "parameters": self.parameters, "notes": self.notes,
        "own_layer_stack": self.own_stack, "encoder_decoder": self.encoder_decoder}

  def to_json(self) -> str:
    return json.dumps(self.to_dict(), indent=2, sort_keys=True)

  def summary(self) -> str:
    o = self.options
    lines = [f"plan: {self.cluster}, mesh {self.mesh_shape}, layout {self.layout}"]
    depth = (f"{self.num_layers} layers" + (" in the encoder and in the decoder"
                                            if self.encoder_decoder else "")
             if self.own_stack is None else
             f"its own layer stack ({self.own_stack}), priced whole")
    extras = [depth, f"{self.parameters / 1e9:.2f}B parameters"]
    if o.num_stages > 1:
      extras.append(f"pipeline {o.num_stages} stages x {o.num_microbatches} micro-batches "
                    f"({o.schedule}{', %d virtual' % o.virtual_stages if o.virtual_stages > 1 else ''})")
    elif o.num_microbatches > 1:
      extras.append(f"{o.num_microbatches} micro-batches")
    extras.append(f"recompute={recompute_label(o)}")
    extras.append(f"ZeRO stage {o.zero_stage}" + (
        ", gathered once" if o.zero_stage == 3 and not o.zero_reshard_after_forward else "")
        + (", float32 masters in the optimizer" if o.float32_master_in_optimizer else ""))
    if o.fusion != "xla":
      extras.append("unfused (op by op)")
    if o.attention == "fused":
      extras.append("fused attention")
    if o.overlap:
      extras.append("overlapped " + " and ".join(OVERLAP_LABELS[x] for x in o.overlap))
    lines.append("  " + ", ".join(extras))
    lines.append(f"step time        {self.step_time_s:.3f} s")
    lines.append(f"tokens/s         {self.tokens_per_s:,.0f}")
    lines.append(f"model FLOPs/step {self.model_flops_per_step:.3e}")
    lines.append(f"MFU              {100 * self.mfu:.1f}%   (HFU {100 * self.hfu:.1f}%, "
                 "recomputed forward counted)")
    t = self.time_breakdown
    lines.append("time: " + ", ".join(f"{k} {v:.3f} s" for k, v in t.items() if v > 0))
    m = self.memory
    lines.append("memory per device:")
    for key in ("variables", "gradients", "optimizer_slots", "activations", "pipeline_buffers"):
      lines.append(f"  {key:<17}{m[key] / GIB:9.2f} GiB")
    verdict = ("fits" if self.fits else f"does NOT fit by {-self.spare_bytes / GIB:.2f} GiB")
    if self.tight:
      verdict += (f" with {self.spare_bytes / GIB:.2f} GiB to spare (tight: allocator "
                  "fragmentation and compiler scratch space often take a few GiB; plan --auto "
                  "--memory_budget=GIB keeps room)")
    lines.append(f"  {'total':<17}{m['total'] / GIB:9.2f} GiB of {self.hbm_bytes / GIB:.2f} GiB "
                 f"HBM: {verdict}")
    lines.append("top communications (per step):")
    for c in self.communications[:5]:
      lines.append(f"  {c.seconds:8.4f} s  {c.count:6.0f} x {c.kind:<14} over "
                   f"{','.join(c.mesh_dims):<10} {c.bytes_per_processor / 2**20:10.2f} MiB  "
                   f"[{c.phase}] on {c.link}")
    for n in self.notes:
      lines.append(f"note: {n}")
    return "\n".join(lines)
