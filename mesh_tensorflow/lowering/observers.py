"""Observers of the collectives that mesh implementations execute.

A mesh implementation announces every collective it runs (its kind, mesh
axes and bytes per processor) and knows nothing of who listens. Whoever wants
to count subscribes a callback for a span of code with `observe`: the
Lowering does so while it lowers, and so can a test or a tool. Where an
implementation realizes one collective with other data movement (a fused
allreduce made by gathering operands), it announces the collective the layout
implies and executes the realization `silenced`.

Observers are kept per thread of execution (a `contextvars` stack), so
lowerings in different threads never see each other's collectives.

    >>> seen = []
    >>> with observers.observe(seen.append):
    ...   impl.allreduce(laid_out_x, [0], "SUM")
    >>> seen[0].kind, seen[0].mesh_axes
    ('allreduce', (0,))
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from typing import Callable, Iterator, Tuple


@dataclasses.dataclass(frozen=True)
class CollectiveEvent:
  """One collective as a mesh implementation executed it.

  Attributes:
    impl: the MeshImpl that ran it (observers filter on it).
    kind: "allreduce", "allgather", "alltoall", "reduce_scatter" or "permute".
    mesh_axes: the mesh axes it communicates over.
    bytes_per_processor: bytes each processor sends (its slice).
    group_size: processors per group (product of the mesh axes' sizes).
    num_groups: groups that run it at the same time.
  """
  impl: object
  kind: str
  mesh_axes: Tuple[int, ...]
  bytes_per_processor: int
  group_size: int
  num_groups: int


Observer = Callable[[CollectiveEvent], None]

_observers: contextvars.ContextVar[Tuple[Observer, ...]] = contextvars.ContextVar(
    "mesh_tensorflow_collective_observers", default=())
_silenced: contextvars.ContextVar[Tuple[int, ...]] = contextvars.ContextVar(
    "mesh_tensorflow_silenced_impls", default=())


@contextlib.contextmanager
def observe(observer: Observer) -> Iterator[None]:
  """Calls `observer(event)` for every collective announced inside.

  Example:
    >>> with observe(lambda e: print(e.kind, e.bytes_per_processor)):
    ...   impl.allconcat(laid_out_x, 0, 0)
    allgather 64
  """
  token = _observers.set(_observers.get() + (observer,))
  try:
    yield
  finally:
    _observers.reset(token)


@contextlib.contextmanager
def silenced(impl) -> Iterator[None]:
  """Collectives that `impl` announces inside reach no observer (they realize
  a collective announced already)."""
  token = _silenced.set(_silenced.get() + (id(impl),))
  try:
    yield
  finally:
    _silenced.reset(token)


def announce(event: CollectiveEvent) -> None:
  """Passes `event` to every observer, unless its implementation is silenced."""
  observers = _observers.get()
  if observers and id(event.impl) not in _silenced.get():
    for observer in observers:
      observer(event)


def observing() -> bool:
  """Whether anyone observes now (implementations skip computing bytes
  otherwise)."""
  return bool(_observers.get())
