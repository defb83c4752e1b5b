"""Pipeline schedules: which stage works on which micro-batch at each tick
("gpipe") or slot ("1f1b": one forward, one backward), and the bubble
fraction each leaves idle. `mtf.pipeline.pipeline` and `pipeline_loss` follow
them.

    >>> PipelineSchedule("gpipe", num_stages=4, num_microbatches=8).bubble_fraction
    0.2727...
"""

from __future__ import annotations

from typing import Dict, Tuple

SCHEDULES = ("gpipe", "1f1b")


# ---------------------------------------------------------------- schedules
class PipelineSchedule:
  """The static table of which stage does what at each slot.

  `table[u][s]` is None (idle), ("F", m) (forward of micro-batch m) or
  ("B", m) (backward of micro-batch m). For "gpipe" forward slots come
  first (stage s runs F(m) at slot m + s), then the backward slots in
  reverse. For "1f1b" each stage runs S - s - 1 warm-up forwards, then
  alternates one forward and one backward, then drains its backwards; a
  slot holds one forward or one backward per stage (equal costs assumed).

  Args:
    kind: "gpipe" or "1f1b".
    num_stages: S.
    num_microbatches: M.

  Example:
    >>> s = PipelineSchedule("gpipe", 4, 8)
    >>> s.bubble_fraction
    0.2727...
  """

  def __init__(self, kind: str, num_stages: int, num_microbatches: int):
    if kind not in SCHEDULES:
      raise ValueError(f"pipeline: schedule must be one of {SCHEDULES}, got {kind!r}.")
    if num_stages < 1 or num_microbatches < 1:
      raise ValueError(f"pipeline: num_stages ({num_stages}) and num_microbatches "
                       f"({num_microbatches}) must be positive.")
    self.kind = kind
    self.num_stages = num_stages
    self.num_microbatches = num_microbatches
    self.table = _gpipe_table(num_stages, num_microbatches) if kind == "gpipe" else \
        _one_f_one_b_table(num_stages, num_microbatches)

  @property
  def num_slots(self) -> int:
    """Forward plus backward slots (a slot is one F or one B per stage)."""
    return len(self.table)

  @property
  def bubble_fraction(self) -> float:
    """The theoretical idle fraction (S - 1) / (M + S - 1) (both schedules)."""
    s, m = self.num_stages, self.num_microbatches
    return (s - 1) / (m + s - 1)

  @property
  def idle_fraction(self) -> float:
    """Idle stage-slots / all stage-slots, counted in `table`."""
    idle = sum(1 for row in self.table for cell in row if cell is None)
    return idle / (self.num_slots * self.num_stages)

  def max_in_flight(self) -> int:
    """The most micro-batches a stage holds between their F and their B."""
    worst = 0
    for s in range(self.num_stages):
      live = 0
      for row in self.table:
        cell = row[s]
        if cell is not None:
          live += 1 if cell[0] == "F" else -1
          worst = max(worst, live)
    return worst

  def __repr__(self):
    return (f"PipelineSchedule({self.kind!r}, stages={self.num_stages}, "
            f"microbatches={self.num_microbatches}, slots={self.num_slots})")


def _gpipe_table(s_count: int, m_count: int):
  ticks = m_count + s_count - 1
  fwd = [[("F", t - s) if 0 <= t - s < m_count else None for s in range(s_count)]
         for t in range(ticks)]
  bwd = [[("B", m_count - 1 - (t - (s_count - 1 - s)))
          if 0 <= t - (s_count - 1 - s) < m_count else None for s in range(s_count)]
         for t in range(ticks)]
  return fwd + bwd


def _one_f_one_b_table(s_count: int, m_count: int):
  """Non-interleaved 1F1B, simulated slot by slot with dependencies."""
  order = []
  for s in range(s_count):
    warm = min(s_count - s - 1, m_count)
    ops = [("F", m) for m in range(warm)]
    f, b = warm, 0
    while f < m_count:
      ops.append(("F", f))
      f += 1
      ops.append(("B", b))
      b += 1
    ops += [("B", m) for m in range(b, m_count)]
    order.append(ops)
  done: Dict[Tuple[str, int, int], int] = {}
  pos = [0] * s_count
  table = []
  u = 0
  while any(pos[s] < len(order[s]) for s in range(s_count)):
    row = [None] * s_count
    for s in range(s_count):
      if pos[s] >= len(order[s]):
        continue
      kind, m = order[s][pos[s]]
      if kind == "F":
        ready = s == 0 or done.get(("F", s - 1, m), u) < u
      else:
        ready = (done.get(("F", s, m), u) < u if s == s_count - 1
                 else done.get(("B", s + 1, m), u) < u)
      if ready:
        row[s] = (kind, m)
    for s, cell in enumerate(row):
      if cell is not None:
        done[(cell[0], s, cell[1])] = u
        pos[s] += 1
    table.append(row)
    u += 1
    if u > 4 * (m_count + s_count) + 8:
      raise AssertionError("1f1b schedule did not terminate")
  return table

from mesh_tensorflow.core import autograph_exempt as _autograph_exempt  # noqa: E402  pylint: disable=g-import-not-at-top
_autograph_exempt.exempt(globals())  # AutoGraph leaves this module's code alone
