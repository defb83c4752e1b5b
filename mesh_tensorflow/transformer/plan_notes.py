"""The notes a plan carries: what its estimate leaves to assumption, rules
that split nothing, and a cheaper way to the same step where the config
missed one (a schedule, an order of the mesh's dimensions).
`mesh_tensorflow.transformer.planner` attaches them to each `Plan`; `plan`
prints them as `note:` lines (and in `--json`'s "notes").

    >>> options = plan_types.PlanOptions(num_stages=4, num_microbatches=16)
    >>> gpipe_note(options, 40 * 2**30, lambda: 16 * 2**30)[:38]
    "pipeline_schedule 'gpipe' keeps all 16"
"""

from __future__ import annotations

import math
from typing import Callable, Collection, List, Optional, Sequence

from mesh_tensorflow.analysis.cost_model import hardware as hardware_lib
from mesh_tensorflow.analysis.cost_model import topology
from mesh_tensorflow.transformer import plan_types

GIB = plan_types.GIB


def gpipe_note(options: plan_types.PlanOptions, total_bytes: float,
               one_f_one_b_bytes: Callable[[], float]) -> Optional[str]:
  """A note for a GPipe pipeline with more micro-batches than stages: 1F1B
  runs the same step (the same bubble) holding at most as many micro-batches
  in flight as there are stages, so its memory per device
  (`one_f_one_b_bytes()`, priced only for such a pipeline, against this
  plan's `total_bytes`) is what a user who left the library's default
  schedule most likely wants. None where the note does not apply."""
  s, m = options.num_stages, options.num_microbatches
  if options.schedule != "gpipe" or s < 2 or m <= s:
    return None
  one_f_one_b_bytes = one_f_one_b_bytes()
  if one_f_one_b_bytes >= total_bytes:
    return None
  return (f"pipeline_schedule 'gpipe' keeps all {m} micro-batches' activations; '1f1b' runs "
          f"the same step with at most {s} in flight: {one_f_one_b_bytes / GIB:.2f} GiB per "
          f"device instead of {total_bytes / GIB:.2f} (set "
          "transformer.make_layer_stack.pipeline_schedule = '1f1b')")


# The sizes defaults.gin gives its 128-wide demo model (the main job's), which
# a large model's config that leaves them out inherits.
DEMO_SIZES = {"d_kv": 16, "d_ff": 512}


def default_size_notes(d_model: int, num_heads: int, d_kv: int, d_ff: int) -> List[str]:
  """Notes for a model of `d_model` 512 or more whose attention head size
  (`d_kv`) or feed-forward size (`d_ff`) is still the demo model's: a config
  that states d_model and num_heads but not d_kv gets 16-wide heads, not
  d_model / num_heads, and the plan prices a different model.

    >>> default_size_notes(2048, 16, 16, 8192)[0].endswith("d_model / num_heads = 128")
    True
  """
  if d_model < 512:
    return []
  notes = []
  if d_kv == DEMO_SIZES["d_kv"] and num_heads and num_heads * d_kv != d_model:
    notes.append(f"d_kv = {d_kv} is the demo model's default (defaults.gin): {num_heads} heads "
                 f"of {d_kv} make the attention {num_heads * d_kv} wide beside d_model "
                 f"{d_model}; a GPT-style model sets d_kv = d_model / num_heads = "
                 f"{d_model // num_heads}")
  if d_ff == DEMO_SIZES["d_ff"]:
    notes.append(f"d_ff = {d_ff} is the demo model's default (defaults.gin) beside d_model "
                 f"{d_model}; set d_ff (usually 4 x d_model = {4 * d_model})")
  return notes


def config_size_notes() -> List[str]:
  """`default_size_notes` of the parsed gin config's sizes."""
  from mesh_tensorflow.transformer import gin_config  # pylint: disable=g-import-not-at-top
  return default_size_notes(*(int(gin_config.query(name, 0) or 0) for name in (
      "Unitransformer.d_model", "SelfAttention.num_heads", "SelfAttention.key_value_size",
      "DenseReluDense.hidden_size")))


def plan_notes(options: plan_types.PlanOptions, hardware: hardware_lib.Hardware,
               activation_dtype: str, rule_notes: List[str], stream_notes: List[str],
               schedule_note: Optional[str]) -> List[str]:
  """Every note of a plan, in the order `plan` prints them: the layout's
  rules that split nothing (`rule_notes`), an unsplit residual stream
  (`stream_notes`), products below the 16-bit peak, the schedule
  (`gpipe_note`), then what the estimate assumes beyond the library."""
  notes = list(rule_notes) + list(stream_notes)
  slower = hardware.slower_products_note(activation_dtype)
  if slower:
    notes.append(f"{slower}; MFU is against the 16-bit peak")
  if schedule_note:
    notes.append(schedule_note)
  if options.attention == "fused":
    notes.append("fused attention is an estimate only (the library's attention keeps its scores "
                 "in memory)")
  if options.overlap:
    labels = " and ".join(plan_types.OVERLAP_LABELS[o] for o in options.overlap)
    notes.append(f"overlapping {labels} with compute is an estimate only (the library runs them "
                 "after the compute they could hide under)")
  return notes


def placement_notes(communications: Sequence[plan_types.Communication], mesh_shape,
                    data_dims: Collection[str], cluster: hardware_lib.Cluster) -> List[str]:
  """A note where the forward and backward passes' collectives over a
  model-parallel mesh dimension (any but `data_dims`, those splitting the
  batch) cross hosts on the network, or TPU slices on the data-center
  network, though those dimensions together would fit in one: processors
  are numbered row-major (last dimension fastest) and a host or slice holds
  consecutive ones, so the note gives `mesh_shape` (an mtf.Shape) with them
  last.

  Example:
    >>> placement_notes(plan.communications, mtf.convert_to_shape("model:8;data:8"),
    ...                 {"data"}, hardware_lib.parse_cluster("a100-80gb:64"))[0][:26]
    "collectives over 'model' i"
  """
  h = cluster.hardware
  # Collectives over model-parallel dimensions alone: one that also spans a
  # data-parallel dimension may cross hosts because of it.
  between = (topology.LINK_NAMES["network"], topology.LINK_NAMES["dcn"])
  crossing = [c for c in communications if c.phase in ("forward", "backward")
              and c.mesh_dims and not set(c.mesh_dims) & set(data_dims)
              and any(name in c.link for name in between)]
  if not crossing:
    return []
  dims = sorted({d for c in crossing for d in c.mesh_dims})
  sizes = {d.name: d.size for d in mesh_shape.dims}
  group = math.prod(sizes[d] for d in dims)
  across_slices = h.kind == "tpu"
  room = (h.max_slice_devices or cluster.count) if across_slices else h.devices_per_host
  if group > room:
    return []
  order = [d for d in mesh_shape.dims if d.name not in dims] + \
      [d for d in mesh_shape.dims if d.name in dims]
  reordered = ";".join(f"{d.name}:{d.size}" for d in order)
  if reordered == mesh_shape.to_string():
    return []
  unit, link = ("slice", "data-center network") if across_slices else ("host", "network")
  names = " and ".join(repr(d) for d in dims)
  return [f"collectives over {names} in the forward and backward passes cross {unit}s "
          f"({sum(c.seconds for c in crossing):.2f} s a step on the {link}): processors are "
          f"numbered row-major and each {unit} holds consecutive numbers, so "
          f"--mesh_shape='{reordered}' keeps those groups inside a {unit}"]
