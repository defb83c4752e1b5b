"""What the cost model returns: per-operation costs, memory, and the whole estimate.

    >>> est = mtf.cost_model.estimate(graph, "all:8", "batch:all")
    >>> est.collective_counts(), est.memory.peak_bytes
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Tuple

from mesh_tensorflow.analysis.cost_model.params import DeviceParams
from mesh_tensorflow.core.shapes import Shape
from mesh_tensorflow.lowering.observers import Collective  # the lowering's record type


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
    approximate: always False: every operation states its plan (kept for
      callers that read it).
    components: the time components (see `time_from_components`).
    work_flops: matrix-product FLOPs of all its distinct kernels together
      (what processors sharing cores compute in all).
    transfers: tensors its kernels read from another device (counted with
      shared memory only, where they are priced).
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
    counts = ", ".join(f"{k} x{n} ({format_bytes(b)})"
                       for k, (n, b) in sorted(self.collective_counts().items())) or "none"
    m = self.memory
    return (f"mesh '{self.mesh_shape.to_string()}', layout '{self.layout.to_string()}': "
            f"estimated step {self.step_time_s * 1e3:.3f} ms ({self.params.name}); "
            f"{self.flops:,} FLOPs/processor; collectives: {counts}; memory/processor "
            f"{format_bytes(m.peak_bytes)} (variables {format_bytes(m.variables)}, slots "
            f"{format_bytes(m.slots)}, activations {format_bytes(m.activations)})")


def format_bytes(n: float) -> str:
  """Bytes with a binary unit: "512 B", "1.5 KiB", "2.0 GiB"."""
  for unit in ("B", "KiB", "MiB", "GiB"):
    if abs(n) < 1024 or unit == "GiB":
      return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
    n /= 1024.0
  return f"{n} B"
