"""ZeRO-style sharded training state, as layouts.

Data parallelism replicates every variable, its optimizer slots and its
gradient on each processor of the data-parallel mesh dimension (say `rows`).
ZeRO (Rajbhandari et al., 2020) splits that state over `rows` instead. Here it
is a renaming: layouts are per dimension name, so a variable of shape
`[d_model, d_ff]` gets a *sharded twin* of shape `[zero_rows, d_ff]`
(`zero_rows` has `d_model`'s size) and one extra layout rule `zero_rows:rows`
splits the twin over `rows`. The twin has the same logical (integer) shape, so
checkpoints, which store every variable by name with its full shape, do not
change with the stage.

* stage 1: optimizer slots have the twin shape. The gradient is allreduced as
  in stage 0, each processor updates its block and the new value is
  allgathered into the (replicated) variable.
* stage 2: also the gradient: its pending allreduce over `rows` becomes a
  reduce-scatter straight into the twin layout (counter kind
  "reduce_scatter").
* stage 3: also the variable: its slices are stored in the twin layout
  (`Variable.storage_shape`) and allgathered just before use, in the forward
  pass and again in the backward pass; the update writes the blocks
  directly, with no gather. With `reshard_after_forward=False` (FSDP's
  SHARD_GRAD_OP, Megatron-LM's distributed optimizer with its parameter
  gather overlapped) the backward pass keeps the forward pass's gathered
  copies instead: half the gathers, and every layer's copy alive until its
  backward pass.

For each variable the renamed dimension is its largest dimension that the
layout does not split yet and that the data-parallel mesh dimension divides;
a variable already split over that mesh dimension, or with no such dimension
(a scalar, a small bias), keeps its stage-0 form. Composes with model
parallelism: on `rows:2;cols:4` with `batch:rows;d_ff:cols`, `[d_model, d_ff]`
becomes `[zero_rows, d_ff]`, split 2 x 4 ways.

    >>> plan = mtf.zero.shard_training_state(graph, mesh_impl, stage=2)
    >>> grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
    >>> update_ops = optimizer.apply_grads(grads, variables)  # follows the plan

The Trainer does this for you: `Trainer(..., zero_stage=2)`.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import tensorflow as tf

from mesh_tensorflow.core.graph import Graph, Operation, Tensor
from mesh_tensorflow.core.layout import LayoutRules
from mesh_tensorflow.lowering import plans
from mesh_tensorflow.operations.variables import STORAGE_DTYPE_KEY, STORAGE_KEY
from mesh_tensorflow.core.shapes import Dimension, Shape

ZERO_DIM_PREFIX = "zero_"
STAGES = (0, 1, 2, 3)

# Graph.keeps[PLAN_KEY]: the graph's ZeroPlan (kept on the graph: a module-level
# map keyed by the graph would keep every graph alive, the plan referring to it).
PLAN_KEY = "zero.plan"


def zero_dimension_name(mesh_dim: str) -> str:
  """The name of the renamed dimension that mesh dimension `mesh_dim` splits.

  Example:
    >>> mtf.zero.zero_dimension_name("rows")
    'zero_rows'
  """
  return ZERO_DIM_PREFIX + mesh_dim


def data_parallel_mesh_dim(mesh_impl, batch_dim_name: str = "batch") -> str:
  """The mesh dimension that the layout splits `batch_dim_name` over.

  Raises:
    ValueError: if the layout does not split that dimension.

  Example:
    >>> mtf.zero.data_parallel_mesh_dim(impl)   # layout "batch:rows;d_ff:cols"
    'rows'
  """
  mesh_dim = mesh_impl.layout_rules.mesh_dimension_name(batch_dim_name)
  if mesh_dim is None:
    raise ValueError(
        f"ZeRO: the layout '{mesh_impl.layout_rules.to_string()}' does not split "
        f"{batch_dim_name!r}, so there is no data-parallel mesh dimension to shard "
        "training state over. Pass zero_mesh_dim (e.g. 'rows') explicitly.")
  return mesh_dim


def add_zero_rule(mesh_impl, mesh_dim: str) -> str:
  """Adds the layout rule `zero_<mesh_dim>:<mesh_dim>` to `mesh_impl`.

  Only tensors with the new dimension name are affected (no other tensor has
  it), so adding the rule never changes an existing layout.

  Returns:
    The dimension name, `zero_<mesh_dim>`.

  Example:
    >>> mtf.zero.add_zero_rule(impl, "rows")
    'zero_rows'
  """
  if mesh_dim not in mesh_impl.shape.dimension_names:
    raise ValueError(
        f"ZeRO: mesh dimension {mesh_dim!r} is not in the mesh "
        f"'{mesh_impl.shape.to_string()}'; pick one of {mesh_impl.shape.dimension_names}.")
  name = zero_dimension_name(mesh_dim)
  rules = mesh_impl.layout_rules
  existing = rules.mesh_dimension_name(name)
  if existing == mesh_dim:
    return name
  if existing is not None:
    raise ValueError(
        f"ZeRO: the layout maps {name!r} to {existing!r}; ZeRO over {mesh_dim!r} needs "
        f"'{name}:{mesh_dim}'. Remove that rule from the layout.")
  mesh_impl._layout_rules = LayoutRules(rules.pairs + [(name, mesh_dim)])  # pylint: disable=protected-access
  return name


def sharded_shape(shape: Shape, mesh_impl, mesh_dim: str) -> Optional[Shape]:
  """The twin of `shape` split over `mesh_dim`, or None if it cannot be.

  The largest dimension that the layout leaves unsplit and that the mesh
  dimension's size divides is renamed `zero_<mesh_dim>` (the first of equal
  sizes). None for a shape already split over `mesh_dim` or without such a
  dimension.

  Example:
    >>> mtf.zero.sharded_shape(mtf.convert_to_shape("d_model:64;d_ff:256"), impl, "rows")
    Shape([Dimension(name='zero_rows', size=64), Dimension(name='d_ff', size=256)])
  """
  axis = mesh_impl.shape.dimension_names.index(mesh_dim)
  n = mesh_impl.shape.dims[axis].size
  layout = mesh_impl.tensor_layout(shape)
  if n == 1 or axis in layout:
    return None
  best = None
  for i, (d, a) in enumerate(zip(shape.dims, layout)):
    if a is None and d.size % n == 0 and (best is None or d.size > shape.dims[best].size):
      best = i
  if best is None:
    return None
  dims = list(shape.dims)
  dims[best] = Dimension(zero_dimension_name(mesh_dim), dims[best].size)
  return Shape(dims)


class ZeroPlan:
  """Which variables of one graph are sharded, and how.

  Attributes:
    stage: 0 to 3.
    mesh_dim: the data-parallel mesh dimension name.
    reshard_after_forward: stage 3: whether the backward pass gathers the
      variables again (True) or keeps the forward pass's copies.
    shapes: {Variable operation: its sharded twin shape}; variables missing
      here keep their stage-0 form.
    masters: the variables stored in their 16-bit activation dtype whose
      float32 master copy the optimizer keeps (`float32_master_in_optimizer`).
  """

  def __init__(self, stage: int, mesh_dim: Optional[str], reshard_after_forward: bool = True):
    self.stage = stage
    self.mesh_dim = mesh_dim
    self.reshard_after_forward = reshard_after_forward
    self.shapes: Dict[Operation, Shape] = {}
    # Variables stored in their 16-bit activation dtype whose float32 master
    # copy is an optimizer slot ("master"), sharded like the other slots.
    self.masters: set = set()

  def keeps_master(self, var) -> bool:
    return var in self.masters

  def shards_slots(self, var) -> bool:
    return self.stage >= 1 and var in self.shapes

  def shards_gradient(self, var) -> bool:
    return self.stage >= 2 and var in self.shapes

  def shards_variable(self, var) -> bool:
    return self.stage >= 3 and var in self.shapes

  def __repr__(self):
    return (f"ZeroPlan(stage={self.stage}, mesh_dim={self.mesh_dim!r}, "
            f"{len(self.shapes)} sharded variables)")


def shard_training_state(graph: Graph, mesh_impl, stage: int,
                         mesh_dim: Optional[str] = None,
                         reshard_after_forward: bool = True,
                         float32_master_in_optimizer: bool = False) -> ZeroPlan:
  """Plans ZeRO stage `stage` for the trainable variables of `graph`.

  Call it after the model is built and before `apply_grads` and the
  Lowering. For stage 3 it sets each sharded variable's `storage_shape`.
  Optimizers (`mtf.optimize`) read the plan of their variables' graph.

  Args:
    graph: the mtf Graph.
    mesh_impl: the mesh implementation that will lower it (its layout decides
      which dimensions are free to split; the rule `zero_<mesh_dim>:<mesh_dim>`
      is added to it).
    stage: 0 (nothing sharded) to 3.
    mesh_dim: the data-parallel mesh dimension; default: the one that splits
      "batch".
    reshard_after_forward: stage 3 only: False keeps each gathered variable
      from its forward use to its backward use (gathered once per step).
    float32_master_in_optimizer: store each trainable float32 variable with
      16-bit activations in the activation dtype (bfloat16 or float16), and
      keep its float32 master copy as an optimizer slot, which stages >= 1
      shard: DeepSpeed's mixed-precision layout and Megatron-LM's
      distributed optimizer (2 bytes per parameter replicated instead of 4,
      and 4 more in the sharded state). Updates are computed in float32 on
      the master; gradients are reduced in the activation dtype either way.

  Returns:
    The ZeroPlan (also kept with the graph, see `plan_for`).

  Example:
    >>> plan = mtf.zero.shard_training_state(graph, impl, stage=3)
  """
  if stage not in STAGES:
    raise ValueError(f"ZeRO: zero_stage must be one of {STAGES}, got {stage!r}.")
  check_reshard(stage, reshard_after_forward)
  if stage == 0:
    plan = ZeroPlan(0, mesh_dim)
  else:
    mesh_dim = mesh_dim or data_parallel_mesh_dim(mesh_impl)
    add_zero_rule(mesh_impl, mesh_dim)
    plan = ZeroPlan(stage, mesh_dim, reshard_after_forward)
    for var in graph.trainable_variables:
      twin = sharded_shape(var.shape, mesh_impl, mesh_dim)
      if twin is None:
        continue
      plan.shapes[var] = twin
      if stage >= 3:
        _check_not_stored_whole(mesh_impl, var, twin)
        var.storage_shape = twin
        var.regathers_for_backward = reshard_after_forward
        # Other graphs lowered with mesh_impl (evaluation, decoding) find the
        # variable stored this way too (Variable.lower reads this).
        mesh_impl.keeps.setdefault(STORAGE_KEY, {})[var.name] = twin
  if float32_master_in_optimizer:
    plan.masters = _store_in_activation_dtype(graph)
    stored = mesh_impl.keeps.setdefault(STORAGE_DTYPE_KEY, {})
    stored.update({var.name: var.slice_dtype for var in plan.masters})
  if stage >= 3:
    _gather_a_little_ahead(graph, [v for v in plan.shapes if v.gathers_on_read])
  graph.keeps[PLAN_KEY] = plan
  return plan


def _store_in_activation_dtype(graph: Graph) -> set:
  """The trainable variables with 16-bit activations, now stored in that
  dtype (their float32 masters become optimizer slots)."""
  half = (tf.bfloat16, tf.float16)
  chosen = set()
  for var in graph.trainable_variables:
    if var.activation_dtype in half and var.master_dtype in (tf.float32, var.activation_dtype):
      var.store_in_activation_dtype()
      chosen.add(var)
  if graph.trainable_variables and not chosen:
    raise ValueError("ZeRO: float32_master_in_optimizer keeps float32 masters of variables "
                     "used in bfloat16 or float16, but no trainable variable is (set "
                     "run.activation_dtype = 'bfloat16', or drop the option).")
  return chosen


def check_reshard(stage: int, reshard_after_forward: bool) -> None:
  """Raises unless `reshard_after_forward` is True or the stage is 3 (the
  only stage that stores variables in blocks)."""
  if not reshard_after_forward and stage != 3:
    raise ValueError(f"ZeRO: reshard_after_forward=False applies to stage 3 (variables stored "
                     f"in blocks), not stage {stage}; set zero_stage = 3 or drop it.")


def _gather_a_little_ahead(graph: Graph, variables) -> None:
  """Stage 3: each variable's forward gather waits until the first reader of
  the variable two before it (in graph order) has run, so that only a few
  gathered copies are alive at once; TensorFlow would otherwise run every
  gather at the start of the step. (The backward pass reads them again one
  operation ahead: `mtf.gradients`.)"""
  index = {op: i for i, op in enumerate(graph.operations)}
  wanted = set(variables)
  first_reader = {}
  for op in graph.operations:
    for t in op.inputs:
      if t.operation in wanted and t.operation not in first_reader and op.outputs:
        first_reader[t.operation] = op
  ordered = sorted((v for v in variables if v in first_reader), key=index.get)
  for k, var in enumerate(ordered):
    earlier = [first_reader[v] for v in ordered[:max(k - 1, 0)]
               if index[first_reader[v]] < index[var]]
    if earlier:
      var.read_after = list(max(earlier, key=index.get).outputs)


def _check_not_stored_whole(mesh_impl, var, twin: Shape) -> None:
  """Stage 3 cannot take over slices that an earlier graph created whole."""
  from mesh_tensorflow.lowering import slice_variables
  existing = slice_variables.variable_store(mesh_impl).get(var.name)
  if existing is not None and existing.slices[0].shape.as_list() != mesh_impl.slice_shape(twin):
    raise ValueError(
        f"ZeRO stage 3: variable {var.name!r} already has slices of shape "
        f"{existing.slices[0].shape.as_list()} on this mesh implementation (made at a "
        f"lower stage); stage 3 stores it as {mesh_impl.slice_shape(twin)}. Save a "
        "checkpoint and restore it into a new mesh implementation to change stages.")


def plan_for(graph: Graph) -> Optional[ZeroPlan]:
  """The ZeroPlan of `graph` (None if `shard_training_state` was not called)."""
  return graph.keeps.get(PLAN_KEY)


class ZeroRelayout(Operation):
  """`x` with the same sizes and other dimension names, hence another layout.

  Moving a pending sum (the gradient of a replicated variable before its
  allreduce) into a layout that splits a dimension over a mesh axis the sum
  runs over emits a reduce-scatter instead of an allreduce followed by a
  slice (unless `reduce_scatter` is False: ZeRO stage 1 keeps the whole
  allreduced gradient). The gradient of a relayout is the opposite relayout.

  With `regathers_for_backward`, gradients that read the output (a weight's
  gradient reading its product's input) read a copy made again in the
  backward pass (`read_again`, through `mtf.gradients`), so the forward
  pass's copy is not kept: a sequence-parallel stack all-gathers a layer's
  input once more instead of keeping it whole (Korthikanti et al. 2022).
  """

  has_gradient = True
  moves_only = True  # no arithmetic: what recompute_grad(saveable=...) may keep in a product's place

  def __init__(self, x: Tensor, new_shape: Shape, name: Optional[str] = None,
               reduce_scatter: bool = True, regathers_for_backward: bool = False):
    if new_shape.to_integer_list() != x.shape.to_integer_list():
      raise ValueError(
          f"ZeroRelayout: {x.name} {x.shape} and {new_shape} differ in sizes; only "
          "dimension names may change.")
    super().__init__([x], name=name or "zero_relayout")
    self._reduce_scatter = reduce_scatter
    self.regathers_for_backward = regathers_for_backward
    self._outputs = [Tensor(self, new_shape, x.dtype)]

  def gradient(self, grad_ys):
    return [relayout(grad_ys[0], self.inputs[0].shape)]

  def read_again(self, after) -> Tensor:
    """The output made again from the input once the tensors `after` exist."""
    from mesh_tensorflow.operations.control import depend  # pylint: disable=g-import-not-at-top
    again = ZeroRelayout(depend(self.inputs[0], after), self.outputs[0].shape,
                         name=self.name + "_again", reduce_scatter=self._reduce_scatter)
    again.made_again = True  # the planner prices its collectives as issued ahead
    return again.outputs[0]

  def plan(self, mesh):
    x = self.inputs[0]
    return plans.plan_sum_relayout(x, self.outputs[0], mesh.layout_of,
                                   mesh.partial_sum_axes_of(x), self._reduce_scatter)

  def lower(self, lowering):
    lowering.lower_with_plan(self, self.plan(lowering.plan_mesh(self)))


def relayout(x: Tensor, new_shape: Shape, reduce_scatter: bool = True,
             regathers_for_backward: bool = False) -> Tensor:
  """`x` renamed to `new_shape` (same sizes); returns x if the shapes match.

  A pending sum is reduce-scattered into the new layout where it can be,
  unless `reduce_scatter` is False (then it is allreduced, then sliced).
  With `regathers_for_backward` the backward pass makes its own copy of the
  result rather than keeping this one (see ZeroRelayout).

  Example:
    >>> w_shard = mtf.zero.relayout(w, plan.shapes[w.operation])
  """
  if x.shape == new_shape:
    return x
  return ZeroRelayout(x, new_shape, reduce_scatter=reduce_scatter,
                      regathers_for_backward=regathers_for_backward).outputs[0]


def shard_gradients(grads: Sequence[Optional[Tensor]], variables: Sequence) -> List[Optional[Tensor]]:
  """The gradients as stage 2 and 3 keep them: reduce-scattered into the
  sharded twin shape for the variables the plan shards; others unchanged.

  Call it on the gradients before `apply_grads` (which accepts either form)
  to keep or accumulate them sharded, or to measure them.

  Example:
    >>> grads = mtf.zero.shard_gradients(grads, graph.trainable_variables)
  """
  out = []
  for g, v in zip(grads, variables):
    v = v.operation if isinstance(v, Tensor) else v
    plan = plan_for(v.graph) if g is not None else None
    if plan is not None and plan.shards_gradient(v):
      g = relayout(g, plan.shapes[v])
    out.append(g)
  return out


def state_bytes_per_processor(mesh_impl) -> List[int]:
  """Bytes of variable and slot slices that each processor holds (every
  variable of `mesh_impl`'s store: parameters, slots, counters,
  accumulators), counting a slice shared by replicas once per processor, as
  on devices with separate memories.

  Example:
    >>> max(mtf.zero.state_bytes_per_processor(impl))
  """
  from mesh_tensorflow.lowering import slice_variables
  totals = [0] * mesh_impl.size
  for sliced in slice_variables.variable_store(mesh_impl).values():
    for pnum, v in enumerate(sliced.slices):
      totals[pnum] += v.shape.num_elements() * v.dtype.size
  return totals


def tensor_bytes_per_processor(lowering, tensors: Sequence[Optional[Tensor]]) -> List[int]:
  """Bytes of the lowered slices of `tensors` on each processor (e.g. the
  gradients an optimizer consumes).

  Example:
    >>> max(mtf.zero.tensor_bytes_per_processor(lowering, grads))
  """
  totals = None
  for t in tensors:
    if t is None:
      continue
    laid = lowering.laid_out(t)
    if totals is None:
      totals = [0] * len(laid.tensor_list)
    for pnum, s in enumerate(laid.tensor_list):
      totals[pnum] += s.shape.num_elements() * tf.as_dtype(s.dtype).size
  return totals or []

from mesh_tensorflow.core import autograph_exempt as _autograph_exempt  # noqa: E402  pylint: disable=g-import-not-at-top
_autograph_exempt.exempt(globals())  # AutoGraph leaves this module's code alone
