"""Observers of the collectives that mesh implementations execute.

A mesh implementation announces every collective it runs (a `Collective`:
its kind, mesh axes and bytes per processor) and knows nothing of who
listens. Whoever wants to count subscribes a callback for a span of code with
`observe`, optionally only for some implementations: the Lowering does so
while it lowers, and so can a test or a tool. `Collective` is also what the
Lowering records (`collective_records`) and what the cost model prices: one
record type from execution to estimate. Where an
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
import math
from typing import Callable, Iterable, Iterator, NamedTuple, Optional, Sequence, Tuple


class Collective(NamedTuple):
  """One collective: as a mesh implementation runs it, as a Lowering records
  it, and as the cost model prices it.

  Its fields: `op_name`, the mtf operation it belongs to ("" until a
  Lowering files it); `kind`, "allreduce", "allgather", "alltoall",
  "reduce_scatter" or "permute"; `mesh_axes`, the mesh axes it communicates
  over; `bytes_per_processor`, the bytes each processor sends (its slice);
  `group_size`, the processors per group (product of the mesh axes' sizes);
  `num_groups`, the groups that run it at the same time.
  """
  op_name: str
  kind: str
  mesh_axes: Tuple[int, ...]
  bytes_per_processor: int
  group_size: int
  num_groups: int


def group_size(mesh_axes: Iterable[int], mesh_sizes: Sequence[int]) -> int:
  """Processors in each group of a collective over `mesh_axes`.

  Example:
    >>> group_size((0, 1), [2, 4])
    8
  """
  return math.prod(mesh_sizes[a] for a in mesh_axes)


def collective(kind: str, mesh_axes: Iterable[int], bytes_per_processor: int,
               mesh_sizes: Sequence[int], op_name: str = "") -> Collective:
  """The Collective of `kind` over `mesh_axes` of a mesh of `mesh_sizes`.

  Example:
    >>> collective("allreduce", [1], 64, [2, 4])
    Collective(op_name='', kind='allreduce', mesh_axes=(1,), bytes_per_processor=64, group_size=4, num_groups=2)
  """
  mesh_axes = tuple(mesh_axes)
  size = group_size(mesh_axes, mesh_sizes)
  return Collective(op_name, kind, mesh_axes, int(bytes_per_processor), size,
                    math.prod(mesh_sizes) // max(size, 1))


Observer = Callable[[Collective], None]

_observers: contextvars.ContextVar[Tuple[Tuple[Observer, Optional[frozenset]], ...]] = contextvars.ContextVar(
    "mesh_tensorflow_collective_observers", default=())
_silenced: contextvars.ContextVar[Tuple[int, ...]] = contextvars.ContextVar(
    "mesh_tensorflow_silenced_impls", default=())


@contextlib.contextmanager
def observe(observer: Observer, impls: Optional[Iterable[object]] = None) -> Iterator[None]:
  """Calls `observer(collective)` for every collective announced inside (by
  the mesh implementations in `impls` only, when given).

  Example:
    >>> with observe(lambda c: print(c.kind, c.bytes_per_processor)):
    ...   impl.allconcat(laid_out_x, 0, 0)
    allgather 64
  """
  only = None if impls is None else frozenset(id(i) for i in impls)
  token = _observers.set(_observers.get() + ((observer, only),))
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


def announce(impl, record: Collective) -> None:
  """Passes `record`, run by mesh implementation `impl`, to every observer of
  it, unless `impl` is silenced."""
  observers = _observers.get()
  if observers and id(impl) not in _silenced.get():
    for observer, only in observers:
      if only is None or id(impl) in only:
        observer(record)


def observing() -> bool:
  """Whether anyone observes now (implementations skip computing bytes
  otherwise)."""
  return bool(_observers.get())
