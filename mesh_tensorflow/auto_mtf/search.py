"""Layout search over the legal layouts of an mtf graph.

A layout maps each tensor-dimension name to at most one mesh dimension. It is
legal when the mesh dimension divides every dimension of that name and no
tensor of the graph has two dimensions on one mesh dimension. `search`
enumerates every legal layout where there are few (exhaustive) and otherwise
grows layouts one rule at a time, keeping the best few (a beam), within a
time limit; each layout is scored by the analytical cost model
(`mesh_tensorflow.analysis.cost_model`). The result explains the choice: the best
candidates with their estimates.

Integer programming (OR-Tools) is not used: OR-Tools' solver crashes when it
is imported after TensorFlow in one process, and exhaustive enumeration plus
a beam is fast enough for the graphs tried (the benchmark's two-layer
transformer has 457 legal layouts over the three mesh shapes of 8 devices,
all scored in about 3 seconds).

    >>> result = search(graph, "rows:2;cols:4", memory_budget_bytes=2**30)
    >>> result.layout, result.mesh_shape
    >>> print(result.explain(top=5))
"""

from __future__ import annotations

import dataclasses
import time
from typing import Dict, Iterator, List, Optional, Set, Tuple

from mesh_tensorflow.analysis import cost_model
from mesh_tensorflow.core.layout import LayoutRules, convert_to_layout_rules
from mesh_tensorflow.core.shapes import Dimension, Shape, convert_to_shape


class LayoutSearchError(ValueError):
  """No layout can be chosen (bad constraints, empty graph, ...)."""


class NoLayoutFitsError(LayoutSearchError):
  """Every legal layout needs more memory per processor than the budget."""


@dataclasses.dataclass
class Candidate:
  """One evaluated (mesh shape, layout) and its cost estimate."""
  mesh_shape: Shape
  layout: LayoutRules
  estimate: cost_model.CostEstimate
  fits: bool = True

  @property
  def step_time_s(self) -> float:
    return self.estimate.step_time_s

  @property
  def memory_bytes(self) -> int:
    return self.estimate.memory.peak_bytes

  def describe(self) -> str:
    return f"mesh '{self.mesh_shape.to_string()}' layout '{self.layout.to_string() or '(replicated)'}'"


@dataclasses.dataclass
class LayoutSearchResult:
  """What `search` found.

  Attributes:
    best: the chosen Candidate.
    candidates: the best candidates, fitting ones first, fastest first.
    evaluated: how many layouts were scored.
    legal: how many legal layouts exist (None when not counted: beam search).
    method: "exhaustive" or "beam".
    timed_out: the time limit stopped the search early.
    memory_budget_bytes: the budget applied (None: none).
    objective: "step_time" or "memory" (what `best` minimizes).
  """
  best: Candidate
  candidates: List[Candidate]
  evaluated: int
  legal: Optional[int]
  method: str
  timed_out: bool
  memory_budget_bytes: Optional[int]
  objective: str = "step_time"

  @property
  def layout(self) -> LayoutRules:
    return self.best.layout

  @property
  def mesh_shape(self) -> Shape:
    return self.best.mesh_shape

  def explain(self, top: int = 5) -> str:
    """The choice and the `top` best candidates with their estimates."""
    budget = ("no memory budget" if self.memory_budget_bytes is None else
              f"memory budget {cost_model.format_bytes(self.memory_budget_bytes)}/processor")
    fitting = sum(1 for c in self.candidates if c.fits)
    lines = [
        f"auto_mtf ({self.method}{', stopped by time limit' if self.timed_out else ''}): "
        f"{self.evaluated} layouts scored"
        + (f" of {self.legal} legal" if self.legal is not None else "")
        + f", {budget}.",
        f"picked {self.best.describe()}: "
        + ("least memory per processor (ties: lowest estimated step time)"
           if self.objective == "memory" else "lowest estimated step time")
        + (" among layouts that fit." if self.memory_budget_bytes is not None else "."),
        f"{'#':>3} {'mesh':<16} {'layout':<44} {'step ms':>9} {'mem/proc':>10} "
        f"{'comm/proc':>10} {'collectives':>11} fits",
    ]
    del fitting
    for i, c in enumerate(self.candidates[:top]):
      est = c.estimate
      lines.append(
          f"{i + 1:>3} {c.mesh_shape.to_string():<16} {(c.layout.to_string() or '(replicated)')[:44]:<44} "
          f"{est.step_time_s * 1e3:>9.3f} {cost_model.format_bytes(est.memory.peak_bytes):>10} "
          f"{cost_model.format_bytes(est.comm_bytes):>10} {len(est.collectives):>11} "
          f"{'yes' if c.fits else 'NO'}")
    return "\n".join(lines)

  def __str__(self):
    return self.explain()


# ----------------------------------------------------------------------------- the space


def _operations(graph, outputs) -> List:
  """The operations that `outputs` (tensors or operations) depend on, in
  graph order; all of the graph's when outputs is empty."""
  outputs = list(outputs or ())
  if not outputs:
    return list(graph.operations)
  needed = set()
  stack = [o.operation if hasattr(o, "operation") else o for o in outputs]
  while stack:
    op = stack.pop()
    if op in needed:
      continue
    needed.add(op)
    stack.extend(t.operation for t in op.inputs)
  return [op for op in graph.operations if op in needed]


def _dims_and_conflicts(operations):
  """({dim name: set of sizes}, {dim name: names sharing a tensor with it},
  {dim name: total bytes of the tensors that have it})."""
  sizes: Dict[str, Set[int]] = {}
  conflicts: Dict[str, Set[str]] = {}
  weight: Dict[str, int] = {}
  for op in operations:
    for t in op.outputs:
      names = t.shape.dimension_names
      nbytes = t.shape.size * t.dtype.size
      for d in t.shape.dims:
        sizes.setdefault(d.name, set()).add(d.size)
        conflicts.setdefault(d.name, set()).update(n for n in names if n != d.name)
        weight[d.name] = weight.get(d.name, 0) + nbytes
  return sizes, conflicts, weight


def _options(sizes, mesh_shape: Shape, fixed: Dict[str, str]):
  """{dim name: mesh dimension names that may split it}, biggest dims first."""
  out = {}
  for name, dim_sizes in sizes.items():
    if name in fixed:
      continue
    allowed = [m.name for m in mesh_shape.dims
               if m.size > 1 and all(s % m.size == 0 for s in dim_sizes)]
    if allowed and max(dim_sizes) > 1:
      out[name] = allowed
  return out


def _check_fixed(operations, mesh_shape: Shape, fixed: Dict[str, str]) -> None:
  rules = LayoutRules(list(fixed.items()))
  try:
    rules.check_mesh_shape(mesh_shape)
    for op in operations:
      for t in op.outputs:
        rules.tensor_layout(t.shape, mesh_shape, t.name)
  except ValueError as e:
    raise LayoutSearchError(
        f"auto_mtf: no legal layout contains the required rules "
        f"'{rules.to_string()}' on mesh '{mesh_shape.to_string()}': {e}") from None


def legal_layouts(graph, mesh_shape, outputs=(), fixed=None,
                  limit: Optional[int] = None) -> Iterator[LayoutRules]:
  """Every legal layout of the graph's dimensions on `mesh_shape`.

  Args:
    graph: an mtf.Graph.
    mesh_shape: e.g. "rows:2;cols:4".
    outputs: restrict to the operations these tensors/operations need.
    fixed: rules every layout must contain, e.g. {"batch": "rows"}.
    limit: stop after this many.

  Example:
    >>> len(list(legal_layouts(graph, "all:8")))
    4
  """
  mesh_shape = convert_to_shape(mesh_shape)
  fixed = dict(convert_to_layout_rules(fixed or {}).pairs)
  operations = _operations(graph, outputs)
  _check_fixed(operations, mesh_shape, fixed)
  sizes, conflicts, weight = _dims_and_conflicts(operations)
  return _enumerate(sizes, conflicts, weight, mesh_shape, fixed, limit)


def _enumerate(sizes, conflicts, weight, mesh_shape, fixed, limit):
  options = _options(sizes, mesh_shape, fixed)
  order = sorted(options, key=lambda n: -weight.get(n, 0))
  count = 0
  assignment = dict(fixed)

  def rec(i):
    nonlocal count
    if limit is not None and count >= limit:
      return
    if i == len(order):
      count += 1
      yield LayoutRules(list(assignment.items()))
      return
    name = order[i]
    yield from rec(i + 1)
    for m in options[name]:
      if any(assignment.get(other) == m for other in conflicts.get(name, ())):
        continue
      assignment[name] = m
      yield from rec(i + 1)
      del assignment[name]
  return rec(0)


def mesh_shapes(num_devices: int, max_mesh_dimensions: int = 2) -> List[Shape]:
  """The mesh shapes of `num_devices` processors with at most
  `max_mesh_dimensions` dimensions (each of size > 1; order matters).

  Names: "all" for one dimension, "rows"/"cols" for two, "d0", "d1", ...
  beyond.

  Example:
    >>> [s.to_string() for s in mesh_shapes(8)]
    ['all:8', 'rows:2;cols:4', 'rows:4;cols:2']
  """
  if not isinstance(num_devices, int) or num_devices < 1:
    raise LayoutSearchError(f"auto_mtf: num_devices must be a positive int, got {num_devices!r}.")
  if num_devices == 1:
    return [Shape([Dimension("all", 1)])]
  out = []

  def factorizations(n, k):
    if k == 1:
      yield (n,)
      return
    for f in range(2, n):
      if n % f == 0:
        for rest in factorizations(n // f, k - 1):
          yield (f,) + rest
  for k in range(1, max_mesh_dimensions + 1):
    for sizes in factorizations(num_devices, k):
      if any(s < 2 for s in sizes):
        continue
      if k == 1:
        names = ["all"]
      elif k == 2:
        names = ["rows", "cols"]
      else:
        names = [f"d{i}" for i in range(k)]
      out.append(Shape([Dimension(n, s) for n, s in zip(names, sizes)]))
  return out


def factorizations(num_devices: int, max_mesh_dimensions: Optional[int] = None
                   ) -> Iterator[List[int]]:
  """The ways to write `num_devices` as a product of factors >= 2 in
  non-increasing order, with at most `max_mesh_dimensions` factors (None: any);
  [1] for one device: each shape once, not its permutations.

  Example:
    >>> list(factorizations(8))
    [[8], [4, 2], [2, 2, 2]]
  """
  if not isinstance(num_devices, int) or num_devices < 1:
    raise LayoutSearchError(f"auto_mtf: num_devices must be a positive int, got {num_devices!r}.")
  limit = num_devices if max_mesh_dimensions is None else max_mesh_dimensions
  if num_devices == 1:
    yield [1]
    return

  def rec(n, largest, room):
    if n == 1:
      yield []
      return
    if room == 0:
      return
    for f in range(min(n, largest), 1, -1):
      if n % f == 0:
        for rest in rec(n // f, f, room - 1):
          yield [f] + rest
  yield from rec(num_devices, num_devices, limit)


# ----------------------------------------------------------------------------- search

OBJECTIVES = ("step_time", "memory")


def search(graph, mesh_shape=None, outputs=(), num_devices: Optional[int] = None,
           memory_budget_bytes: Optional[int] = None, params=None, method: str = "auto",
           time_limit_s: float = 60.0, beam_width: int = 4, top_k: int = 5,
           max_exhaustive: int = 5000, fixed=None,
           max_mesh_dimensions: int = 2, objective: str = "step_time") -> LayoutSearchResult:
  """Finds the layout (and mesh shape) with the lowest estimated step time
  whose memory per processor fits the budget (or, with objective="memory",
  the one needing the least memory per processor).

  Args:
    graph: an mtf.Graph (best: a whole training step, so that gradients and
      updates are costed too).
    mesh_shape: the mesh, e.g. "rows:2;cols:4"; a list of meshes to choose
      among; or None with num_devices to search the mesh shapes too.
    outputs: tensors/operations of interest (default: the whole graph).
    num_devices: with mesh_shape None, search every mesh shape of this many
      processors (see `mesh_shapes`).
    memory_budget_bytes: bytes per processor a layout may use (None: any).
    params: cost_model DeviceParams or "cpu"/"gpu"/"tpu" (default "cpu").
    method: "exhaustive", "beam", or "auto" (exhaustive when there are at
      most max_exhaustive legal layouts per mesh shape).
    time_limit_s: stop searching after this long and return the best so far.
    beam_width: layouts kept per step of the beam search.
    top_k: candidates kept in the result for explanation.
    max_exhaustive: see method.
    fixed: rules every layout must contain, e.g. "batch:rows".
    max_mesh_dimensions: with num_devices, the most mesh dimensions tried.
    objective: "step_time" (the fastest layout that fits) or "memory" (the
      least peak memory per processor, ties broken by step time).

  Returns:
    A LayoutSearchResult.

  Raises:
    NoLayoutFitsError: no legal layout fits the memory budget (the message
      names the smallest and what it needs).
    LayoutSearchError: the graph has no operations, or `fixed` is illegal.

  Example:
    >>> result = search(graph, "rows:2;cols:4", memory_budget_bytes=64 * 2**20)
    >>> print(result.explain())
  """
  start = time.perf_counter()
  operations = _operations(graph, outputs)
  if not operations:
    raise LayoutSearchError("auto_mtf: the graph has no operations to lay out; build the "
                            "model (and its training step) in the graph first.")
  if method not in ("auto", "exhaustive", "beam"):
    raise LayoutSearchError(f"auto_mtf: method={method!r}; use 'auto', 'exhaustive' or 'beam'.")
  if objective not in OBJECTIVES:
    raise LayoutSearchError(f"auto_mtf: objective={objective!r}; use one of {OBJECTIVES}.")
  params = cost_model.as_device_params(params)
  if isinstance(mesh_shape, (list, tuple)) and mesh_shape and not isinstance(
      mesh_shape[0], (Dimension, tuple)):
    shapes = [convert_to_shape(s) for s in mesh_shape]
    mesh_shape = None if len(shapes) > 1 else shapes[0]
  elif mesh_shape is not None:
    shapes = [convert_to_shape(mesh_shape)]
  elif num_devices is not None:
    shapes = mesh_shapes(num_devices, max_mesh_dimensions)
  else:
    raise LayoutSearchError("auto_mtf.search: give mesh_shape (e.g. 'rows:2;cols:4') or "
                            "num_devices.")
  fixed_rules = convert_to_layout_rules(fixed or {})
  sizes, conflicts, weight = _dims_and_conflicts(operations)
  evaluated: Dict[Tuple[str, LayoutRules], Candidate] = {}
  timed_out = False
  legal_total = 0
  methods = set()

  def score(shape, rules) -> Candidate:
    key = (shape.to_string(), rules)
    c = evaluated.get(key)
    if c is None:
      est = cost_model.estimate(graph, shape, rules, params=params, operations=operations,
                                check=False)
      fits = memory_budget_bytes is None or est.memory.peak_bytes <= memory_budget_bytes
      c = evaluated[key] = Candidate(shape, rules, est, fits)
    return c

  def out_of_time():
    return time.perf_counter() - start > time_limit_s

  for shape in shapes:
    fixed_here = {t: m for t, m in fixed_rules.pairs if m in shape.dimension_names}
    if len(fixed_here) < len(fixed_rules) and mesh_shape is not None:
      missing = [f"{t}:{m}" for t, m in fixed_rules.pairs if t not in fixed_here]
      raise LayoutSearchError(
          f"auto_mtf: required rules {missing} name mesh dimensions that mesh "
          f"'{shape.to_string()}' lacks.")
    if len(fixed_here) < len(fixed_rules):
      continue
    _check_fixed(operations, shape, fixed_here)
    use = method
    if method == "auto":
      n = sum(1 for _ in _enumerate(sizes, conflicts, weight, shape, fixed_here,
                                    max_exhaustive + 1))
      use = "exhaustive" if n <= max_exhaustive else "beam"
    methods.add(use)
    if use == "exhaustive":
      for rules in _enumerate(sizes, conflicts, weight, shape, fixed_here, None):
        legal_total += 1
        score(shape, rules)
        if out_of_time():
          timed_out = True
          break
    else:
      timed_out = _beam(score, sizes, conflicts, shape, fixed_here, beam_width,
                        memory_budget_bytes, out_of_time, objective) or timed_out
    if timed_out:
      break
  if not evaluated:
    raise LayoutSearchError(
        f"auto_mtf: no mesh shape can hold the required rules '{fixed_rules.to_string()}'.")
  if objective == "memory":
    ranked = sorted(evaluated.values(),
                    key=lambda c: (not c.fits, c.memory_bytes, c.step_time_s))
  else:
    ranked = sorted(evaluated.values(), key=lambda c: (not c.fits, c.step_time_s))
  if not ranked[0].fits:
    raise _no_fit_error(ranked, memory_budget_bytes, operations)
  return LayoutSearchResult(
      best=ranked[0], candidates=ranked[:max(top_k, 1)], evaluated=len(evaluated),
      legal=legal_total if methods == {"exhaustive"} else None,
      method="+".join(sorted(methods)), timed_out=timed_out,
      memory_budget_bytes=memory_budget_bytes, objective=objective)


def _beam(score, sizes, conflicts, shape, fixed, beam_width, budget, out_of_time,
          objective="step_time") -> bool:
  """Grows layouts one rule at a time from `fixed`, keeping the best
  `beam_width`; returns whether the time limit stopped it."""
  options = _options(sizes, shape, fixed)

  def key(c):
    if objective == "memory":
      return (c.memory_bytes, c.step_time_s)
    over = 0.0 if budget is None else max(0.0, c.memory_bytes / budget - 1.0)
    return (c.step_time_s * (1.0 + 10.0 * over),)
  beam = [score(shape, LayoutRules(list(fixed.items())))]
  best = min(key(c) for c in beam)
  while True:
    children = []
    for c in beam:
      current = dict(c.layout.pairs)
      for name, meshes in options.items():
        if name in current:
          continue
        for m in meshes:
          if any(current.get(o) == m for o in conflicts.get(name, ())):
            continue
          children.append(score(shape, LayoutRules(list(current.items()) + [(name, m)])))
          if out_of_time():
            return True
    if not children:
      return False
    children = sorted({id(c): c for c in children}.values(), key=key)
    beam = children[:beam_width]
    new_best = key(beam[0])
    if new_best >= best and all(c.fits for c in beam):
      return False
    best = min(best, new_best)


def _no_fit_error(ranked, budget, operations) -> NoLayoutFitsError:
  smallest = min(ranked, key=lambda c: c.memory_bytes)
  m = smallest.estimate.memory
  biggest = max(m.per_variable.items(), key=lambda kv: kv[1], default=None)
  var_text = (f" Its largest variable slice is {biggest[0]!r} "
              f"({cost_model.format_bytes(biggest[1])} per processor)." if biggest else "")
  return NoLayoutFitsError(
      f"auto_mtf: no legal layout fits memory_budget_bytes={budget} "
      f"({cost_model.format_bytes(budget)}) per processor. The smallest, "
      f"{smallest.describe()}, needs {cost_model.format_bytes(m.peak_bytes)}: "
      f"variables {cost_model.format_bytes(m.variables)}, optimizer slots "
      f"{cost_model.format_bytes(m.slots)}, activations {cost_model.format_bytes(m.activations)}."
      f"{var_text} Raise the budget, use more devices, or shrink the model or batch.")


# ----------------------------------------------------------------------------- least memory


def layout(mtf_graph, mesh_shape, mtf_outputs=(), objective: str = "memory",
           **kwargs) -> LayoutRules:
  """Layout rules for `mesh_shape` that need the least memory per processor
  (ties: the lowest estimated step time), so a layout is found wherever one
  fits. For the fastest layout
  that fits a budget, pass objective="step_time" (and memory_budget_bytes),
  or call `search`.

  Args:
    mtf_graph: an mtf.Graph.
    mesh_shape: e.g. "rows:2;cols:4".
    mtf_outputs: tensors/operations of interest (default: the whole graph).
    objective: "memory" (default) or "step_time".
    **kwargs: passed to `search` (memory_budget_bytes, params, time_limit_s,
      method, fixed, ...).

  Example:
    >>> rules = mtf.auto_mtf.layout(graph, "rows:2;cols:4", [loss])
    >>> impl = mtf.placement_mesh_impl.PlacementMeshImpl("rows:2;cols:4", rules, devices)
  """
  return search(mtf_graph, mesh_shape, outputs=mtf_outputs, objective=objective,
                **kwargs).layout


def original_mesh_shapes(num_devices: int, max_mesh_dimensions: Optional[int] = 2) -> List[Shape]:
  """The mesh shapes `layout_and_mesh_shape` tries: each factorization of
  `num_devices` (`factorizations`) once, its dimensions named "mesh_0",
  "mesh_1", ....

  Example:
    >>> [s.to_string() for s in original_mesh_shapes(8)]
    ['mesh_0:8', 'mesh_0:4;mesh_1:2']
  """
  return [Shape([Dimension(f"mesh_{i}", n) for i, n in enumerate(sizes)])
          for sizes in factorizations(num_devices, max_mesh_dimensions)]


def layout_and_mesh_shape(mtf_graph, num_devices: int, mtf_outputs=(),
                          max_mesh_dimensions: Optional[int] = 2,
                          objective: str = "memory", **kwargs):
  """(layout rules, mesh shape) over the
  mesh shapes of `num_devices` processors (`original_mesh_shapes`: "mesh_0:4;
  mesh_1:2", ...), chosen as `layout` chooses (least memory per processor by
  default; objective="step_time" for the fastest).

  Args:
    mtf_graph: an mtf.Graph.
    num_devices: processors in the mesh.
    mtf_outputs: tensors/operations of interest (default: the whole graph).
    max_mesh_dimensions: the most mesh dimensions tried (None: any).
    objective: "memory" (default) or "step_time".
    **kwargs: passed to `search`.

  Example:
    >>> rules, mesh_shape = mtf.auto_mtf.layout_and_mesh_shape(graph, 8, [loss])
  """
  result = search(mtf_graph, original_mesh_shapes(num_devices, max_mesh_dimensions),
                  outputs=mtf_outputs, objective=objective, **kwargs)
  return result.layout, result.mesh_shape


def explain(mtf_graph, mesh_shape=None, mtf_outputs=(), top: int = 5, **kwargs) -> str:
  """Runs `search` and returns its explanation (the top candidates).

  Example:
    >>> print(mtf.auto_mtf.explain(graph, "rows:2;cols:4"))
  """
  return search(mtf_graph, mesh_shape, outputs=mtf_outputs, top_k=top, **kwargs).explain(top)

