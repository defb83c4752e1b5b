"""Prints a layout solution (`print_solution`).

Works for this library's `layout_optimizer.LayoutOptimizer` and for an
OR-Tools CP-SAT model and solver (read through their protocol buffers;
OR-Tools is not needed otherwise).

    >>> optimizer = layout_optimizer.LayoutOptimizer(estimator)
    >>> optimizer.solve()
    >>> print_solution(optimizer, optimizer)
"""

from __future__ import annotations

from typing import List, Tuple


def print_solution(model, solver) -> None:
  """Prints each named variable's value, the objective and its value.

  Args:
    model: a solved `LayoutOptimizer`, or an OR-Tools `CpModel`.
    solver: the same `LayoutOptimizer`, or the OR-Tools `CpSolver` that
      solved the model.

  Example:
    >>> print_solution(optimizer, optimizer)
      x_(a:m1) = 0
      x_(a:m2) = 1
    ...
    Minimize: peak bytes per processor
    Objective value: 3000.0
  """
  if hasattr(model, "solution_variables"):
    lines = [f"  {name} = {value}" for name, value in model.solution_variables()]
    print("\n".join(lines))
    print("Minimize: peak bytes per processor")
    print(f"Objective value: {model.objective_value()}\n")
    return
  if not (hasattr(model, "Proto") and hasattr(solver, "ResponseProto")):
    raise TypeError(f"print_solution: expected a solved LayoutOptimizer or an OR-Tools CpModel "
                    f"and CpSolver, got {type(model).__name__} and {type(solver).__name__}.")
  model_proto, response = model.Proto(), solver.ResponseProto()
  terms: List[Tuple[int, float]] = []
  maximize = False
  if model_proto.HasField("objective"):
    objective = model_proto.objective
    terms = list(zip(objective.vars, objective.coeffs))
    maximize = objective.scaling_factor < 0.0
  coefficient_of = dict(terms)
  lines, objective_terms = [], []
  for i, var in enumerate(model_proto.variables):
    if not var.name:
      continue
    c = coefficient_of.get(i, 0)
    if c:
      c = -c if maximize else c
      objective_terms.append(f" {'-' if c < 0 else '+'} {abs(c)} * {var.name}")
    lines.append(f"  {var.name} = {response.solution[i]}")
  print("\n".join(lines))
  text = "".join(objective_terms)
  if text.startswith(" + "):
    text = text[3:]
  print(f"{'Maximize' if maximize else 'Minimize'}: {text}")
  print(f"Objective value: {solver.ObjectiveValue()}\n")
