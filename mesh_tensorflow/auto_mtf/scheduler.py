"""Operation orders that keep peak memory low, for
`GraphInterface.compute_memory_contents_under_schedule`.

    >>> schedule = minimize_peak_memory(GraphInterface(mtf_graph), "LIST")
"""

from __future__ import annotations

import collections
import heapq
from typing import Dict, List, Set

SCHEDULER_ALGORITHMS = ("NAIVE", "LIST")


def minimize_peak_memory(graph, scheduler_alg: str = "LIST") -> List[int]:
  """An order of the graph's operations (indices into
  `graph.get_all_operation_names()`).

  Args:
    graph: a `graph_interface.GraphInterface`.
    scheduler_alg: "NAIVE" (graph order) or "LIST" (greedy: next, the ready
      operation that frees the most bytes, ties by name).

  Returns:
    The schedule, a list of operation indices (a topological order).

  Example:
    >>> minimize_peak_memory(graph, "NAIVE")
    [0, 1, 2]
  """
  if scheduler_alg == "NAIVE":
    return list(range(graph.get_num_operations()))
  if scheduler_alg == "LIST":
    return _list_schedule(graph)
  raise NotImplementedError(f"minimize_peak_memory: scheduler_alg {scheduler_alg!r} is not "
                            f"one of {SCHEDULER_ALGORITHMS}.")


def _list_schedule(graph) -> List[int]:
  """Greedy list scheduling: among the operations whose inputs are all
  computed, run the one that frees the most memory (bytes of inputs it is the
  last user of, less bytes of its outputs that something uses or that are
  final)."""
  names = list(graph.get_all_operation_names())
  index = {name: i for i, name in enumerate(names)}
  inputs = {name: list(dict.fromkeys(graph.get_operation_input_names(name))) for name in names}
  outputs = {name: list(graph.get_operation_output_names(name)) for name in names}
  users: Dict[str, Set[str]] = collections.defaultdict(set)
  for name in names:
    for t in inputs[name]:
      users[t].add(name)
  waiting = {name: len(inputs[name]) for name in names}  # inputs not yet computed

  freed: Dict[str, int] = {}
  for name in names:
    gain = sum(graph.get_tensor_size(t) for t in inputs[name]
               if len(users[t]) == 1 and not graph.is_tensor_final(t))
    cost = sum(graph.get_tensor_size(t) for t in outputs[name]
               if users[t] or graph.is_tensor_final(t))
    freed[name] = gain - cost

  # A heap of (-bytes freed, name); entries whose value changed since are stale.
  heap = [(-freed[name], name) for name in names if waiting[name] == 0]
  heapq.heapify(heap)
  done: Set[str] = set()
  schedule = []
  while heap:
    neg, name = heapq.heappop(heap)
    if name in done or freed[name] != -neg:
      continue
    done.add(name)
    schedule.append(index[name])
    for t in outputs[name]:
      for user in users[t]:
        waiting[user] -= 1
        if waiting[user] == 0:
          heapq.heappush(heap, (-freed[user], user))
    for t in inputs[name]:
      users[t].discard(name)
      if len(users[t]) == 1 and not graph.is_tensor_final(t):
        # The one user left now frees t when it runs.
        (last,) = users[t]
        freed[last] += graph.get_tensor_size(t)
        if waiting[last] == 0:
          heapq.heappush(heap, (-freed[last], last))
  if len(schedule) != len(names):
    raise ValueError("minimize_peak_memory: the graph has a cycle or an input that no "
                     "operation computes.")
  return schedule
