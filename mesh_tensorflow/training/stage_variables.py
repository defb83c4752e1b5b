"""Stage variables of a pipeline: the variables a stage function creates,
stacked along the `stages` dimension (stage s's weights are row s), with
per-stage views that the stage function reads as if it were alone.

    >>> variables = StageVariables(mesh, stages_dim)
"""

from __future__ import annotations

import contextlib
from typing import Callable, Dict, Optional, Tuple

import numpy as np
import tensorflow as tf

from mesh_tensorflow.core.graph import Mesh, Tensor
from mesh_tensorflow.operations import constant_ops as const_ops
from mesh_tensorflow.operations import einsum_ops as einsum_ops
from mesh_tensorflow.operations import elementwise as ew
from mesh_tensorflow.operations import variables as var_ops
from mesh_tensorflow.core.shapes import Dimension, Shape


VIRTUAL_STAGES = "virtual_stages"  # the dimension of a stage's layer chunks (not split)


# ------------------------------------------------------ stacked stage variables
class _PerStageView:
  """What get_variable sees inside a stage: the per-stage shape, and the
  tensor it returns (the stacked variable, or one stage's slice of it)."""

  def __init__(self, shape: Shape, value: Tensor):
    self.shape = shape
    self._value = value

  @property
  def outputs(self):
    return [self._value]


class _StagedNameMap(dict):
  """Stands in for graph.name_to_variable while a stage function runs."""

  def __init__(self, real: dict, lookup: Callable[[str], Optional[_PerStageView]]):
    super().__init__(real)
    self._lookup = lookup

  def get(self, key, default=None):
    view = self._lookup(key)
    return view if view is not None else super().get(key, default)

  def __setitem__(self, key, value):
    raise ValueError(
        f"pipeline: the stage function created variable {key!r} on a later call "
        "than its first. A stage must create the same variables every time it "
        "is called (no variables created conditionally).")


class _StackedInitializer:
  """Initializes each stage's row (with virtual stages, each (chunk, stage)
  row: chunk c = v S + s) as the per-stage variable named `name_fn(c)` would
  be initialized."""

  def __init__(self, inner, name_fn: Callable[[int], str], lead: int = 1, num_stages: int = 1):
    self._inner = inner
    self._name_fn = name_fn
    self._lead = lead
    self._num_stages = num_stages

  def _row(self, chunk, full_shape, begin, slice_shape, dtype):
    stage_name = self._name_fn(chunk)
    if hasattr(type(self._inner), "slice_value"):
      return self._inner.slice_value(stage_name, list(full_shape), list(begin),
                                     list(slice_shape), dtype)
    full = var_ops._call_initializer(self._inner, list(full_shape), dtype, stage_name)  # pylint: disable=protected-access
    return tf.slice(full, list(begin), list(slice_shape))

  def slice_value(self, name, full_shape, begin, slice_shape, dtype):
    del name
    n = self._lead
    rest = (list(full_shape[n:]), list(begin[n:]), list(slice_shape[n:]), dtype)
    stages = range(begin[n - 1], begin[n - 1] + slice_shape[n - 1])
    if n == 1:
      return tf.stack([self._row(s, *rest) for s in stages], axis=0)
    return tf.stack([tf.stack([self._row(v * self._num_stages + s, *rest) for s in stages], 0)
                     for v in range(begin[0], begin[0] + slice_shape[0])], axis=0)


class StageVariables:
  """Gives the variables a stage function creates a leading `stages`
  dimension (with virtual stages, leading [virtual_stages, stages]: row
  (v, s) is layer chunk v S + s).

  `discover(fn, *args)` calls fn once to learn which variables it creates
  (names, shapes, dtypes, initializers), removes what that call added to the
  graph and creates each variable again as [stages] + shape under the same
  name. Inside `with sv.stacked():` `mtf.get_variable` returns the stacked
  variables (for a stage function vectorized over `stages`); inside
  `with sv.stage(s):` it returns stage s's row (for running stages one after
  another, e.g. when decoding).

  With `virtual_stages` V > 1 (the interleaved schedule) stage s holds V
  chunks; `stacked(pick)` gives each stage the chunk that a one-hot
  [virtual_stages, stages] tensor `pick` names (`pick_chunks`), and
  `stage(c)` chunk c.

  Args:
    mesh: the mesh.
    stages_dim: the `stages` dimension (its size is the number of stages).
    init_name_fn: init_name_fn(variable_name, stage) -> the name whose
      initial value stage s's row gets (so a pipelined model can start from
      the unpipelined model's weights); default "<name>/stage_<s>". With
      virtual stages it gets the chunk c = v S + s instead of s.
    virtual_stages: V, layer chunks per stage (1: none).

  Example:
    >>> sv = StageVariables(mesh, stages)
    >>> sv.discover(stage_fn, h)
    >>> with sv.stacked():
    ...   h = stage_fn(h)
  """

  def __init__(self, mesh: Mesh, stages_dim: Dimension,
               init_name_fn: Optional[Callable[[str, int], str]] = None,
               virtual_stages: int = 1):
    self.mesh = mesh
    self.stages_dim = stages_dim
    self.virtual_dim = (Dimension(VIRTUAL_STAGES, virtual_stages) if virtual_stages > 1
                        else None)
    self._lead = [self.virtual_dim, stages_dim] if self.virtual_dim else [stages_dim]
    self._init_name_fn = init_name_fn or (lambda name, s: f"{name}/stage_{s}")
    self.variables: Dict[str, var_ops.Variable] = {}
    self._per_stage_shapes: Dict[str, Shape] = {}
    self._stage_cache: Dict[Tuple[str, int], Tensor] = {}

  def discover(self, fn: Callable, *args, **kwargs):
    """Calls fn to find its variables, then undoes that call (its ops and
    variables leave the graph) and creates the stacked variables."""
    graph = self.mesh.graph
    start = len(graph.operations)
    before = set(graph.name_to_variable)
    real = graph.name_to_variable

    def existing(name):
      """A stacked variable made by an earlier call (the same model called
      again in this graph): reused, with a placeholder value here."""
      var = real.get(name)
      n = len(self._lead)
      if var is None or var.shape.dims[:n] != self._lead:
        return None
      per_stage = Shape(var.shape.dims[n:])
      self.variables[name] = var
      self._per_stage_shapes[name] = per_stage
      return _PerStageView(per_stage, const_ops.zeros(self.mesh, per_stage, dtype=var.outputs[0].dtype))

    class _DiscoveryMap(_StagedNameMap):
      def __setitem__(self, key, value):
        dict.__setitem__(self, key, value)
    graph.name_to_variable = _DiscoveryMap(real, existing)
    try:
      fn(*args, **kwargs)
      created = graph.name_to_variable
    finally:
      graph.name_to_variable = real
    found = [created[n] for n in created if n not in before]
    del graph.operations[start:]
    for var in found:
      if self.stages_dim in var.shape.dims:
        raise ValueError(f"pipeline: stage variable {var.name!r} already has a "
                         f"{self.stages_dim.name!r} dimension ({var.shape}).")
      name = var.name
      init = _StackedInitializer(getattr(var, "_initializer"),
                                 lambda s, name=name: self._init_name_fn(name, s),
                                 len(self._lead), self.stages_dim.size)
      stacked = var_ops.Variable(self.mesh, name, Shape(self._lead + var.shape.dims),
                                 var.variable_dtype, init, trainable=var.trainable)
      graph.name_to_variable[name] = stacked
      self.variables[name] = stacked
      self._per_stage_shapes[name] = var.shape
    return found

  @contextlib.contextmanager
  def _swap(self, lookup):
    graph = self.mesh.graph
    real = graph.name_to_variable
    graph.name_to_variable = _StagedNameMap(real, lookup)
    try:
      yield
    finally:
      graph.name_to_variable = real

  def stacked(self, pick: Optional[Tensor] = None):
    """Context: get_variable returns [stages] + shape variables (with virtual
    stages, each stage's chunk that `pick` names)."""
    if (pick is None) != (self.virtual_dim is None):
      raise ValueError("StageVariables.stacked: give `pick` exactly when there are virtual "
                       "stages.")

    def lookup(name):
      if name not in self.variables:
        return None
      shape = self._per_stage_shapes[name]
      value = self.variables[name].outputs[0]
      if pick is not None:
        value = einsum_ops.einsum([value, ew.cast(pick, value.dtype)],
                                  output_shape=Shape([self.stages_dim] + shape.dims))
      return _PerStageView(shape, value)
    return self._swap(lookup)

  def pick_chunks(self, chunks: Dict[int, int]) -> Tensor:
    """One-hot [virtual_stages, stages]: stage s's row at chunk `chunks[s]`
    (v, 0 for stages not given)."""
    return self._one_hot([(chunks.get(s, 0), s) for s in range(self.stages_dim.size)],
                         tf.float32)

  def _one_hot(self, positions, dtype) -> Tensor:
    """A constant of the leading dimensions ([stages] or [virtual_stages,
    stages]): 1 at each index tuple in `positions`, 0 elsewhere."""
    value = np.zeros([d.size for d in self._lead], dtype=np.float32)
    for position in positions:
      value[position] = 1.0
    return const_ops.constant(self.mesh, value, Shape(self._lead), dtype=dtype)

  def stage(self, s: int):
    """Context: get_variable returns stage s's row of each variable (with
    virtual stages: chunk s, 0 <= s < V S)."""

    def lookup(name):
      if name not in self.variables:
        return None
      key = (name, s)
      if key not in self._stage_cache:
        value = self.variables[name].outputs[0]
        pick = self._one_hot([divmod(s, self.stages_dim.size) if self.virtual_dim else (s,)],
                             value.dtype)
        self._stage_cache[key] = einsum_ops.einsum([value, pick],
                                                   output_shape=self._per_stage_shapes[name])
      return _PerStageView(self._per_stage_shapes[name], self._stage_cache[key])
    return self._swap(lookup)

from mesh_tensorflow.core import autograph_exempt as _autograph_exempt  # noqa: E402  pylint: disable=g-import-not-at-top
_autograph_exempt.exempt(globals())  # AutoGraph leaves this module's code alone
