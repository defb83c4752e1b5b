"""Which processors hold the same tensor: the rules of shared memory.

Where processors share one memory (logical CPU devices of one process with
shared replicas, `PlacementMeshImpl(share_replicas=True)`), a tensor that
several processors would make alike is made once and held by all of them:
a kernel runs once per distinct combination of inputs, a collective's result
once per group. Elsewhere every processor holds its own copy. The placement
implementation follows these functions when it creates TensorFlow ops, and
the cost model follows the same functions to count the kernels the lowering
creates, so the two cannot disagree.

    >>> makers([("x", 0), ("x", 1), ("x", 0)], shares_memory=True)
    [0, 1, 0]
    >>> group_result([2, 3], shares_memory=False)
    (2, [2, 3])
"""

from __future__ import annotations

from typing import Any, Callable, Hashable, List, Optional, Sequence, Tuple


def makers(keys: Sequence[Hashable], shares_memory: bool) -> List[int]:
  """For each processor, the processor whose kernel makes its tensor.

  `keys[p]` identifies what processor p's kernel would compute (its inputs,
  its slice's offsets). With shared memory, the first processor with an
  equal key makes it and the others hold that tensor; without, each
  processor makes its own.

  Example:
    >>> makers(["a", "b", "a", "b"], shares_memory=False)
    [0, 1, 2, 3]
  """
  if not shares_memory:
    return list(range(len(keys)))
  first = {}
  return [first.setdefault(key, p) for p, key in enumerate(keys)]


def per_processor(keys: Sequence[Hashable], shares_memory: bool,
                  make: Callable[[int], Any]) -> List[Any]:
  """Each processor's tensor: `make(p)` for the processors that make theirs
  (`makers`), the maker's tensor for the others.

  Example:
    >>> per_processor(["a", "b", "a"], True, lambda p: f"t{p}")
    ['t0', 't1', 't0']
  """
  out = []
  for p, maker in enumerate(makers(keys, shares_memory)):
    out.append(make(p) if maker == p else out[maker])
  return out


def group_result(group: Sequence[int], shares_memory: bool) -> Tuple[int, List[int]]:
  """(maker, copies) of a collective's result in one group of processors:
  the group's first member combines the members' slices; with shared memory
  every member holds that one tensor, without it each member (`copies`)
  gets a copy on its own device.

  Example:
    >>> group_result([4, 5, 6, 7], shares_memory=True)
    (4, [])
  """
  return group[0], ([] if shares_memory else list(group))


def holds_source(shares_memory: bool) -> bool:
  """Whether a processor that receives another's slice (a permute) holds
  the sender's tensor itself (shared memory) rather than a copy on its own
  device."""
  return shares_memory


def blocks_of_one_tensor(layout: Sequence) -> bool:
  """Whether the slices of a tensor imported (or sliced) with `layout` are
  the blocks of one tensor along one mesh axis, so that joining them back
  (an allgather along that axis) is that tensor and copies nothing."""
  return sum(a is not None for a in layout) == 1


def whole_of(records: Sequence[Optional[Tuple[Any, int, int, int]]], mesh_axis: int,
             tensor_axis: int, same: Callable[[Any, Any], bool] = lambda a, b: a is b):
  """The tensor whose blocks 0..n-1 along `tensor_axis` (split over
  `mesh_axis`) a group's slices are, or None. `records[i]` is what is known
  of the group's i-th slice: (whole, mesh axis, tensor axis, block index)
  when it was made as a block of `whole` (an import, a slice_along), else
  None. Where it is found, gathering the group's slices is that tensor: no
  kernel runs and nothing is copied.

  Example:
    >>> whole_of([("x", 1, 0, 0), ("x", 1, 0, 1)], mesh_axis=1, tensor_axis=0)
    'x'
  """
  if not records or any(r is None for r in records):
    return None
  whole = records[0][0]
  for i, (w, m, axis, index) in enumerate(records):
    if not same(w, whole) or m != mesh_axis or axis != tensor_axis or index != i:
      return None
  return whole
