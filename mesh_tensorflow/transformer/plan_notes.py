"""The notes a plan carries: what its estimate leaves to assumption, rules
that split nothing, and a cheaper way to the same step where the config
missed one. `mesh_tensorflow.transformer.planner` attaches them to each
`Plan`; `plan` prints them as `note:` lines (and in `--json`'s "notes").

    >>> options = plan_types.PlanOptions(num_stages=4, num_microbatches=16)
    >>> gpipe_note(options, 40 * 2**30, 16 * 2**30)[:38]
    "pipeline_schedule 'gpipe' keeps all 16"
"""

from __future__ import annotations

from typing import List, Optional

from mesh_tensorflow.analysis.cost_model import hardware as hardware_lib
from mesh_tensorflow.transformer import plan_types

GIB = plan_types.GIB


def gpipe_note(options: plan_types.PlanOptions, total_bytes: float,
               one_f_one_b_bytes: float) -> Optional[str]:
  """A note for a GPipe pipeline with more micro-batches than stages: 1F1B
  runs the same step (the same bubble) holding at most as many micro-batches
  in flight as there are stages, so its memory per device
  (`one_f_one_b_bytes`, against this plan's `total_bytes`) is what a user
  who left the library's default schedule most likely wants. None where
  the note does not apply."""
  s, m = options.num_stages, options.num_microbatches
  if options.schedule != "gpipe" or s < 2 or m <= s or one_f_one_b_bytes >= total_bytes:
    return None
  return (f"pipeline_schedule 'gpipe' keeps all {m} micro-batches' activations; '1f1b' runs "
          f"the same step with at most {s} in flight: {one_f_one_b_bytes / GIB:.2f} GiB per "
          f"device instead of {total_bytes / GIB:.2f} (set "
          "transformer.make_layer_stack.pipeline_schedule = '1f1b')")


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
