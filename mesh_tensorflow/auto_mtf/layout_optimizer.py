"""The layout that needs the least memory per processor
(`LayoutOptimizer`), without an integer-programming solver.

A layout maps each splittable tensor dimension to at most one mesh dimension
(whose size divides it), and no operation may have two of its dimensions on
one mesh dimension. Its value is the peak, over a schedule of the graph's
operations, of the bytes per processor of the tensors in memory
(`evaluate_layout`). `solve` enumerates the layouts when there are at most
`max_exhaustive` of them and otherwise grows layouts one assignment at a time
keeping the best `beam_width`; among layouts of equal value it prefers more
assigned dimensions, then the lowest step time
estimated by this library's cost model (`mesh_tensorflow.analysis.cost_model`).

    >>> estimator = memory_estimator.MemoryEstimator(mtf_graph, "m1:4;m2:2")
    >>> LayoutOptimizer(estimator).solve()
    'a:m2;c:m1'
"""

from __future__ import annotations

import itertools
from typing import Dict, FrozenSet, Iterable, List, NamedTuple, Optional, Tuple

from absl import logging

from mesh_tensorflow.analysis import cost_model
from mesh_tensorflow.auto_mtf import print_cp_model_solution
from mesh_tensorflow.auto_mtf import scheduler
from mesh_tensorflow.core.layout import LayoutRules

Assignment = Dict[str, str]


class SolverError(Exception):
  """No layout could be found (or a layout given is not one)."""


class LayoutOptimizer:
  """Finds the layout that needs the least memory per processor.

  Args:
    memory_estimator: a `memory_estimator.MemoryEstimator`.
    scheduler_alg: the operation order memory is measured under, see
      `scheduler.minimize_peak_memory` ("LIST" or "NAIVE").
    max_exhaustive: enumerate every layout when there are at most this many.
    beam_width: layouts kept per step otherwise.

  Example:
    >>> optimizer = LayoutOptimizer(memory_estimator.MemoryEstimator(graph, "m1:4;m2:2"))
    >>> layout = optimizer.solve()
    >>> optimizer.evaluate_layout(layout) <= optimizer.evaluate_layout("")
    True
  """

  def __init__(self, memory_estimator, scheduler_alg: str = "LIST",
               max_exhaustive: int = 5000, beam_width: int = 8):
    self._estimator = memory_estimator
    self._scheduler_alg = scheduler_alg
    self._max_exhaustive = max_exhaustive
    self._beam_width = beam_width
    self._layout_validator = memory_estimator.get_layout_validator()
    self._graph = memory_estimator.get_graph_interface()
    self._memory_contents: Optional[List[FrozenSet[str]]] = None
    self._solution: Optional[Assignment] = None
    self._solution_value: Optional[float] = None
    validator = self._layout_validator
    splittable = validator.splittable_mtf_dimension_names
    # The sets of splittable dimensions that one operation has: no two of a
    # set may share a mesh dimension.
    self._operation_dimension_sets = {
        frozenset(self._graph.get_operation_mtf_dimension_names(op) & splittable)
        for op in self._graph.get_all_operation_names()}
    self._tensor_dimensions = {
        t: [d for d in self._graph.get_tensor_mtf_dimension_names(t) if d in splittable]
        for t in self._graph.get_all_tensor_names()}
    self._options = {
        d: [m for m in validator.mesh_dimension_name_to_size if validator.is_valid_assignment(d, m)]
        for d in sorted(splittable)}
    self._conflicts: Dict[str, set] = {d: set() for d in splittable}
    for dims in self._operation_dimension_sets:
      for d in dims:
        self._conflicts[d].update(dims - {d})

  # ---- the solver interface
  def solve(self, print_solution: bool = False) -> str:
    """The layout with the least peak memory per processor, as a string
    ("a:m2;c:m1", pairs sorted; "" for all replicated).

    Args:
      print_solution: also print the assignment and its value.

    Raises:
      SolverError: the graph has no operation.
    """
    if not self._graph.get_num_operations():
      raise SolverError("LayoutOptimizer: the graph has no operations to lay out; build the "
                        "model in the graph first.")
    candidates = list(self._enumerate(self._max_exhaustive + 1))
    if len(candidates) > self._max_exhaustive:
      logging.info("LayoutOptimizer: more than %d layouts; searching with a beam of %d.",
                   self._max_exhaustive, self._beam_width)
      candidates = self._beam()
    best = self._best(candidates)
    self._solution = best
    self._solution_value = self._peak_memory(best)
    if print_solution:
      print_cp_model_solution.print_solution(self, self)
    return _layout_string(best)

  def evaluate_layout(self, layout: str) -> float:
    """The peak bytes per processor of the tensors in memory under `layout`
    (e.g. "d_ff:m1;heads:m2"); rules for unsplittable dimensions are skipped
    with a warning.

    Raises:
      SolverError: a rule names a mesh dimension the mesh lacks.
    """
    assignment: Assignment = {}
    for pair in filter(None, (p.strip() for p in (layout or "").split(";"))):
      if ":" not in pair:
        raise SolverError(f"LayoutOptimizer.evaluate_layout: {pair!r} in {layout!r} is not "
                          "'tensor_dim:mesh_dim'.")
      dim, mesh_dim = (s.strip() for s in pair.split(":", 1))
      if mesh_dim not in self._layout_validator.mesh_dimension_name_to_size:
        raise SolverError(f"LayoutOptimizer.evaluate_layout: {layout!r} puts {dim!r} on "
                          f"{mesh_dim!r}, which the mesh "
                          f"{sorted(self._layout_validator.mesh_dimension_name_to_size)} lacks.")
      if dim in self._layout_validator.splittable_mtf_dimension_names:
        assignment[dim] = mesh_dim
      else:
        logging.warning("LayoutOptimizer.evaluate_layout: skipping unsplittable dimension %s.",
                        dim)
    return float(self._peak_memory(assignment))

  @property
  def _model(self) -> "IntegerProgram":
    """The integer program over this graph, as a description:
    `_model.Proto().variables` lists its 0/1 and integer variables (one per
    tensor dimension and mesh dimension, one per assignment of each distinct
    set of dimensions an operation or tensor has, and the peak memory "z").
    This optimizer searches the same assignments directly; the description
    shows how the problem's size grows with the graph (operations with the
    same dimensions share variables)."""
    return IntegerProgram(self)

  # ---- what print_cp_model_solution prints for this optimizer
  def solution_variables(self) -> List[Tuple[str, int]]:
    """(name, 0 or 1) of each "x_(tensor_dim:mesh_dim)" assignment variable
    of the last `solve`."""
    if self._solution is None:
      raise SolverError("LayoutOptimizer: call solve() first.")
    return [(_global_var_name(d, m), int(self._solution.get(d) == m))
            for d in sorted(self._layout_validator.splittable_mtf_dimension_names)
            for m in self._layout_validator.mesh_dimension_name_to_size]

  def objective_value(self) -> float:
    """The peak bytes per processor of the last `solve`'s layout."""
    if self._solution_value is None:
      raise SolverError("LayoutOptimizer: call solve() first.")
    return float(self._solution_value)

  # ---- search
  def _get_memory_contents(self) -> List[FrozenSet[str]]:
    if self._memory_contents is None:
      schedule = scheduler.minimize_peak_memory(self._graph, self._scheduler_alg)
      self._memory_contents = self._graph.compute_memory_contents_under_schedule(schedule)
    return self._memory_contents

  def _peak_memory(self, assignment: Assignment) -> int:
    sizes = self._layout_validator.mesh_dimension_name_to_size
    tensor_bytes = {}
    for t in self._graph.get_all_tensor_names():
      if self._graph.is_tensor_on_canonical_device(t):
        tensor_bytes[t] = self._graph.get_tensor_size(t, assignment, sizes)
      else:
        tensor_bytes[t] = 0
    return max((sum(tensor_bytes[t] for t in contents)
                for contents in self._get_memory_contents()), default=0)

  def _allowed(self, assignment: Assignment, dim: str, mesh_dim: str) -> bool:
    return not any(assignment.get(other) == mesh_dim for other in self._conflicts[dim])

  def _enumerate(self, limit: int) -> Iterable[Assignment]:
    """Every legal assignment (at most `limit`)."""
    dims = list(self._options)
    count = 0
    assignment: Assignment = {}

    def rec(i):
      nonlocal count
      if count >= limit:
        return
      if i == len(dims):
        count += 1
        yield dict(assignment)
        return
      yield from rec(i + 1)
      for m in self._options[dims[i]]:
        if self._allowed(assignment, dims[i], m):
          assignment[dims[i]] = m
          yield from rec(i + 1)
          del assignment[dims[i]]
    return rec(0)

  def _key(self, assignment: Assignment):
    return (self._peak_memory(assignment), -len(assignment))

  def _beam(self) -> List[Assignment]:
    """Grows assignments one pair at a time, keeping the best beam_width."""
    beam: List[Assignment] = [{}]
    seen = {_layout_string({})}
    kept = list(beam)
    while True:
      children = []
      for a in beam:
        for d, meshes in self._options.items():
          if d in a:
            continue
          for m in meshes:
            if self._allowed(a, d, m):
              child = dict(a, **{d: m})
              key = _layout_string(child)
              if key not in seen:
                seen.add(key)
                children.append(child)
      if not children:
        return kept
      children.sort(key=self._key)
      beam = children[:self._beam_width]
      kept.extend(beam)

  def _best(self, candidates: List[Assignment]) -> Assignment:
    keyed = sorted(((self._key(a), _layout_string(a), a) for a in candidates),
                   key=lambda x: (x[0], x[1]))
    tied = [a for k, _, a in keyed if k == keyed[0][0]]
    if len(tied) == 1:
      return tied[0]
    # Equal memory and number of splits: the cost model's step time decides.
    graph = self._estimator.mtf_graph
    mesh_shape = self._estimator.mesh_shape
    return min(tied, key=lambda a: (cost_model.estimate(
        graph, mesh_shape, LayoutRules(sorted(a.items())), check=False).step_time_s,
                                    _layout_string(a)))


class ProgramVariable(NamedTuple):
  """One variable of the integer program: its name and [low, high] domain."""
  name: str
  domain: Tuple[int, int]


class ProgramDescription(NamedTuple):
  """What `IntegerProgram.Proto()` returns: the program's variables."""
  variables: List[ProgramVariable]


class IntegerProgram:
  """The integer program of least memory for a graph, described (not
  solved): `Proto().variables` as in a CP-SAT model.

  Example:
    >>> program = IntegerProgram(optimizer)
    >>> [v.name for v in program.Proto().variables][:1]
    ['x_(a:m1)']
  """

  def __init__(self, optimizer: "LayoutOptimizer"):
    self._optimizer = optimizer

  def Proto(self) -> ProgramDescription:  # pylint: disable=invalid-name
    """The program's variables (a CP-SAT model's proto)."""
    optimizer = self._optimizer
    validator = optimizer._layout_validator  # pylint: disable=protected-access
    graph = optimizer._graph  # pylint: disable=protected-access
    sizes = validator.mesh_dimension_name_to_size
    splittable = validator.splittable_mtf_dimension_names
    variables = [ProgramVariable(_global_var_name(d, m), (0, 1))
                 for d in sorted(splittable) for m in sizes]
    dimension_sets = set(optimizer._operation_dimension_sets)  # pylint: disable=protected-access
    dimension_sets.update(frozenset(d) for d in optimizer._tensor_dimensions.values())  # pylint: disable=protected-access
    for dims in sorted(dimension_sets, key=sorted):
      for assignment in _generate_assignments(dims, sizes):
        variables.append(ProgramVariable(_local_var_name(dims, assignment), (0, 1)))
    upper = sum(int(graph.get_tensor_size(t)) for t in graph.get_all_tensor_names()
                if graph.is_tensor_on_canonical_device(t))
    variables.append(ProgramVariable("z", (0, upper)))
    return ProgramDescription(variables)


def _layout_string(assignment: Assignment) -> str:
  return ";".join(sorted(f"{d}:{m}" for d, m in assignment.items()))


def _global_var_name(splittable_dimension: str, mesh_dimension: str) -> str:
  """The name of the 0/1 variable "dimension on mesh dimension"."""
  return f"x_({splittable_dimension}:{mesh_dimension})"


def _local_var_name(splittable_dimensions, assignment: Assignment) -> str:
  """The name of the variable for one assignment of a set of
  dimensions, e.g. "y_(channel:y,hidden)"."""
  parts = [f"{d}:{assignment[d]}" if d in assignment else d
           for d in sorted(splittable_dimensions)]
  return "y_(" + ",".join(parts) + ")"


def _generate_assignments(splittable_dimensions, mesh_dimension_to_size) -> List[Assignment]:
  """Every map of some of the dimensions to distinct mesh dimensions
  (including the empty one); divisibility is not checked."""
  splittable_dimensions = sorted(splittable_dimensions)
  mesh_dimensions = list(mesh_dimension_to_size)
  out = []
  for k in range(1 + min(len(splittable_dimensions), len(mesh_dimensions))):
    for dims in itertools.combinations(splittable_dimensions, k):
      for meshes in itertools.permutations(mesh_dimensions, k):
        out.append(dict(zip(dims, meshes)))
  return out
