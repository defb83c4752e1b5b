"""Pipeline schedules: which stage works on which micro-batch at each tick
("gpipe") or slot ("1f1b": one forward, one backward; "interleaved": the
same over V layer chunks per stage), and the bubble fraction each leaves
idle. `mtf.pipeline.pipeline` and `pipeline_loss` follow them.

    >>> PipelineSchedule("gpipe", num_stages=4, num_microbatches=8).bubble_fraction
    0.2727...
"""

from __future__ import annotations

import functools
from typing import Dict, Tuple

SCHEDULES = ("gpipe", "1f1b", "interleaved")


# ---------------------------------------------------------------- schedules
class PipelineSchedule:
  """The static table of which stage does what at each slot.

  `table[u][s]` is None (idle), ("F", m) (forward of micro-batch m) or
  ("B", m) (backward of micro-batch m); for "interleaved" ("F", m, v) and
  ("B", m, v), v being the stage's layer chunk. For "gpipe" forward slots
  come first (stage s runs F(m) at slot m + s), then the backward slots in
  reverse. For "1f1b" each stage runs S - s - 1 warm-up forwards, then
  alternates one forward and one backward, then drains its backwards; a
  slot holds one forward or one backward per stage (equal costs assumed).

  "interleaved" (Narayanan et al. 2021, section 2.2.2): the layers are cut
  into S x V chunks and stage s holds chunks s, s + S, ..., s + (V - 1) S,
  so a micro-batch passes every stage V times (chunk c = v S + s; after
  stage S - 1 it wraps round to stage 0). Each stage runs its forwards in
  groups of S micro-batches, chunk by chunk, its backwards in the same
  groups with the chunks reversed, 2 (S - s - 1) + (V - 1) S of them as
  warm-up, then one forward and one backward in turn. A slot is one chunk
  (1/V of a stage's layers), so the S - 1 idle slots of the fill and drain
  cost 1/V of 1F1B's. M must be a multiple of S.

  Args:
    kind: "gpipe", "1f1b" or "interleaved".
    num_stages: S.
    num_microbatches: M.
    virtual_stages: V, layer chunks per stage ("interleaved" only; the
      others need 1).

  Example:
    >>> s = PipelineSchedule("gpipe", 4, 8)
    >>> s.bubble_fraction
    0.2727...
    >>> PipelineSchedule("interleaved", 4, 8, virtual_stages=2).bubble_fraction
    0.1578...
  """

  def __init__(self, kind: str, num_stages: int, num_microbatches: int,
               virtual_stages: int = 1):
    if kind not in SCHEDULES:
      raise ValueError(f"pipeline: schedule must be one of {SCHEDULES}, got {kind!r}.")
    if num_stages < 1 or num_microbatches < 1 or virtual_stages < 1:
      raise ValueError(f"pipeline: num_stages ({num_stages}), num_microbatches "
                       f"({num_microbatches}) and virtual_stages ({virtual_stages}) must be "
                       "positive.")
    if kind != "interleaved" and virtual_stages != 1:
      raise ValueError(f"pipeline: virtual_stages={virtual_stages} needs the 'interleaved' "
                       f"schedule, not {kind!r}.")
    if kind == "interleaved" and num_microbatches % num_stages:
      raise ValueError(f"pipeline: the interleaved schedule runs micro-batches in groups of "
                       f"the {num_stages} stages; num_microbatches={num_microbatches} is not a "
                       "multiple of it. Change num_microbatches (or the batch size).")
    self.kind = kind
    self.num_stages = num_stages
    self.num_microbatches = num_microbatches
    self.virtual_stages = virtual_stages
    if kind == "gpipe":
      self.table = _gpipe_table(num_stages, num_microbatches)
    elif kind == "1f1b":
      self.table = _one_f_one_b_table(num_stages, num_microbatches)
    else:
      self.table = _interleaved_table(num_stages, num_microbatches, virtual_stages)

  @property
  def num_slots(self) -> int:
    """Forward plus backward slots (a slot is one F or one B per stage)."""
    return len(self.table)

  @property
  def bubble_fraction(self) -> float:
    """The theoretical idle fraction (S - 1) / (V M + S - 1) (V = 1 but for
    "interleaved")."""
    s, m = self.num_stages, self.num_microbatches * self.virtual_stages
    return (s - 1) / (m + s - 1)

  @property
  def idle_fraction(self) -> float:
    """Idle stage-slots / all stage-slots, counted in `table`."""
    idle = sum(1 for row in self.table for cell in row if cell is None)
    return idle / (self.num_slots * self.num_stages)

  def max_in_flight(self) -> int:
    """The most micro-batches (for "interleaved": chunk passes of
    micro-batches) a stage holds between their F and their B."""
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
    chunks = f", virtual_stages={self.virtual_stages}" if self.virtual_stages > 1 else ""
    return (f"PipelineSchedule({self.kind!r}, stages={self.num_stages}, "
            f"microbatches={self.num_microbatches}{chunks}, slots={self.num_slots})")


@functools.lru_cache(maxsize=64)
def max_in_flight(kind: str, num_stages: int, num_microbatches: int,
                  virtual_stages: int = 1) -> int:
  """`PipelineSchedule(...).max_in_flight()`, remembered (a plan search asks
  for the same few schedules many times).

  Example:
    >>> max_in_flight("1f1b", 4, 8)
    4
  """
  return PipelineSchedule(kind, num_stages, num_microbatches, virtual_stages).max_in_flight()


def chunk_of(cell) -> int:
  """The layer chunk v of a table cell: its third entry ("interleaved"), else 0."""
  return cell[2] if len(cell) > 2 else 0


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
  return _simulate(order, s_count, 1)


def _interleaved_table(s_count: int, m_count: int, v_count: int):
  """Interleaved 1F1B (each stage's order as Megatron-LM runs it),
  simulated slot by slot with dependencies."""
  group = s_count * v_count
  total = m_count * v_count

  def pass_of(i, backward):
    v = (i % group) // s_count
    return ((i // group) * s_count + i % s_count, v_count - 1 - v if backward else v)
  order = []
  for s in range(s_count):
    warm = min(2 * (s_count - s - 1) + (v_count - 1) * s_count, total)
    ops = [("F",) + pass_of(i, False) for i in range(warm)]
    f, b = warm, 0
    while f < total:
      ops.append(("F",) + pass_of(f, False))
      f += 1
      ops.append(("B",) + pass_of(b, True))
      b += 1
    ops += [("B",) + pass_of(i, True) for i in range(b, total)]
    order.append(ops)
  return _simulate(order, s_count, v_count)


def _simulate(order, s_count: int, v_count: int):
  """Slot by slot, each stage runs its next operation once its input is
  ready: the forward of chunk c - 1 (the stage before, or the last stage
  one chunk earlier), or the backward of chunk c + 1 (or, for the last
  chunk, its own forward), finished in an earlier slot."""
  last = s_count * v_count - 1
  done: Dict[Tuple[str, int, int], int] = {}  # (kind, chunk, micro-batch) -> slot
  pos = [0] * s_count
  table = []
  u = 0
  while any(pos[s] < len(order[s]) for s in range(s_count)):
    row = [None] * s_count
    for s in range(s_count):
      if pos[s] >= len(order[s]):
        continue
      cell = order[s][pos[s]]
      kind, m = cell[0], cell[1]
      c = chunk_of(cell) * s_count + s
      if kind == "F":
        ready = c == 0 or done.get(("F", c - 1, m), u) < u
      else:
        ready = done.get(("F", c, m) if c == last else ("B", c + 1, m), u) < u
      if ready:
        row[s] = cell
    for s, cell in enumerate(row):
      if cell is not None:
        done[(cell[0], chunk_of(cell) * s_count + s, cell[1])] = u
        pos[s] += 1
    table.append(row)
    u += 1
    if u > 4 * (len(order[0]) + s_count) + 8:
      raise AssertionError("pipeline schedule did not terminate")
  return table

from mesh_tensorflow.core import autograph_exempt as _autograph_exempt  # noqa: E402  pylint: disable=g-import-not-at-top
_autograph_exempt.exempt(globals())  # AutoGraph leaves this module's code alone
