"""What every optimizer shares: the step counter, gradient clipping, the
per-variable update target (ZeRO shards, CPU offload, master copies), slot
variables, hyperparameters resolved per step, and the `Optimizer` base class
whose `apply_grads` turns gradients into assign operations.

The optimizers themselves and this module's public names are served by
`mesh_tensorflow.training.optimize` (`mtf.optimize`).

    >>> counter = step_counter(mesh)     # an int64 mtf scalar, advanced by apply_grads
"""
from __future__ import annotations

import numbers
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import tensorflow as tf

from mesh_tensorflow.training import offload
from mesh_tensorflow.training import zero
from mesh_tensorflow.core.graph import Graph, Mesh, Operation, Tensor
from mesh_tensorflow.lowering import slice_variables
from mesh_tensorflow.operations import constant_ops as constant_ops
from mesh_tensorflow.operations import elementwise as ew
from mesh_tensorflow.operations import reduction
from mesh_tensorflow.operations import variables as var_ops
from mesh_tensorflow.core.shapes import Shape

# A hyperparameter: a number, a scalar (mtf or TensorFlow) tensor, or a
# function of the step (a float32 scalar mtf Tensor) returning one of those.
Hyperparameter = Union[float, Tensor, tf.Tensor, tf.Variable, Callable[[Tensor], object]]
LearningRate = Hyperparameter
StepLike = Union[int, float, Tensor, tf.Tensor, tf.Variable]

STEP_COUNTER_NAME = "optimizer_step"

# Graph.keeps[STEP_COUNTERS_KEY]: {counter Variable operation: whether
# apply_grads advanced it}. Kept on the graph (a module-level map keyed by the
# graph would keep every graph alive: its values refer to the graph).
STEP_COUNTERS_KEY = "optimize.step_counters"


def step_counter(mesh: Mesh, name: str = STEP_COUNTER_NAME) -> Tensor:
  """The optimizer step counter of `mesh`'s graph: a scalar int64 mtf Tensor.

  Its value is the number of updates applied so far. The counter is an mtf
  variable (replicated, non-trainable, checkpointed like any other) created on
  first use; `Optimizer.apply_grads` called without `step` advances it once per
  mtf graph. Use it to build schedules that the optimizer does not see, e.g.
  a learning rate passed as an mtf Tensor, or to export the step for logging.

  Args:
    mesh: the mesh to hold the counter.
    name: the variable name.

  Returns:
    The counter's value before this step's update.

  Example:
    >>> step = mtf.cast(mtf.optimize.step_counter(mesh), tf.float32)
    >>> lr = mtf.learning_rate_schedules.rsqrt_decay(step, warmup_steps=100)
    >>> ops = mtf.optimize.SgdOptimizer(lr).apply_grads(grads, variables)
  """
  value = var_ops.get_variable(mesh, name, Shape([]), dtype=tf.int64,
                               initializer=tf.zeros_initializer(), trainable=False)
  counters = mesh.graph.keeps.setdefault(STEP_COUNTERS_KEY, {})
  counters.setdefault(value.operation, False)
  return value


def step_num():
  """The original's `step_num`; always raises: this library keeps no TensorFlow global step.

  Raises:
    ValueError: always, naming the replacements: `step_counter(mesh)` (an mtf
      scalar, advanced by `apply_grads`) or `apply_grads(..., step=)`.
  """
  raise ValueError(
      "mtf.optimize.step_num(): there is no TensorFlow global step here. Use "
      "mtf.optimize.step_counter(mesh) (the number of updates applied, an int64 mtf "
      "scalar), pass the step to apply_grads(..., step=...), or give the optimizer a "
      "schedule: a function of the step such as mtf.learning_rate_schedules.rsqrt_decay.")


def _advance_step_counters(graph: Graph) -> List[Operation]:
  """Assignments that add one to each step counter of `graph` not yet advanced."""
  ops = []
  counters = graph.keeps.get(STEP_COUNTERS_KEY, {})
  for counter, advanced in list(counters.items()):
    if not advanced:
      ops.append(var_ops.assign(counter, counter.outputs[0] + 1,
                                name="advance_step_counter"))
      counters[counter] = True
  return ops


def reduce_rms(x: Tensor, output_shape=None) -> Tensor:
  """Root mean square of the elements of `x`: a scalar, or one value per
  position of `output_shape` (dimensions of x kept, the others averaged).

  Example:
    >>> scale = mtf.optimize.reduce_rms(weights)
  """
  return ew.sqrt(reduction.reduce_mean(ew.square(x), output_shape=output_shape))


def clip_by_global_norm(grads: Sequence[Optional[Tensor]],
                        clip_norm: Union[float, Tensor],
                        use_norm: Optional[Tensor] = None
                        ) -> Tuple[List[Optional[Tensor]], Tensor]:
  """Scales gradients so that their joint L2 norm is at most `clip_norm`.

  With global_norm = sqrt(sum of all squared elements of all gradients), each
  gradient becomes `g * clip_norm / max(global_norm, clip_norm)`: unchanged
  when the norm is within bounds, scaled down together otherwise (as
  `tf.clip_by_global_norm`). The norm is computed in float32 (float64 if a
  gradient is float64), whatever the gradients' dtype; a split gradient adds
  only the allreduce of one scalar.

  Args:
    grads: mtf Tensors on one mesh; None entries are passed through.
    clip_norm: the maximum norm, a positive Python number or a scalar mtf Tensor.
    use_norm: the global norm if already computed (a scalar mtf Tensor).

  Returns:
    (clipped gradients, in the order given, None where the input was None;
     the global norm before clipping, a scalar mtf Tensor).

  Example:
    >>> grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
    >>> grads, norm = mtf.optimize.clip_by_global_norm(grads, 1.0)
  """
  grads = list(grads)
  present = [g for g in grads if g is not None]
  if not present:
    raise ValueError("clip_by_global_norm: every gradient is None.")
  for g in present:
    if not isinstance(g, Tensor):
      raise TypeError(f"clip_by_global_norm: expected mtf Tensors, got {g!r}.")
    if g.mesh is not present[0].mesh:
      raise ValueError(
          f"clip_by_global_norm: gradients {present[0].name} and {g.name} live on "
          f"different meshes ({present[0].mesh.name!r}, {g.mesh.name!r}); clip each "
          "mesh's gradients separately.")
  if isinstance(clip_norm, (numbers.Number, np.number)) and not clip_norm > 0:
    raise ValueError(f"clip_by_global_norm: clip_norm must be positive, got {clip_norm}.")
  norm_dtype = tf.float64 if any(g.dtype == tf.float64 for g in present) else tf.float32
  if use_norm is None:
    squares = [reduction.reduce_sum(ew.square(ew.cast(g, norm_dtype))) for g in present]
    global_norm = ew.sqrt(ew.add_n(squares))
  else:
    global_norm = ew.cast(use_norm, norm_dtype)
  if isinstance(clip_norm, Tensor):
    clip_norm = ew.cast(clip_norm, norm_dtype)
  scale = clip_norm / ew.maximum(global_norm, clip_norm)
  clipped = [None if g is None else g * ew.cast(scale, g.dtype) for g in grads]
  return clipped, global_norm


class _ReadInMasterDtype(Operation):
  """A variable's value read from its slices in the master dtype (instead of
  the activation dtype of `var.outputs[0]`), in its storage shape (its
  shape, or its ZeRO stage-3 sharded twin, read without a gather)."""

  def __init__(self, var: var_ops.Variable):
    # It reads the slices, not the value; a value that gathers on read
    # (stage 3) is not an input, so that its gathered copy is not kept alive
    # for the optimizer.
    inputs = [] if var.gathers_on_read else [var.outputs[0]]
    super().__init__(inputs, mesh=var.mesh, name="read_master_value")
    self._variable = var
    self._outputs = [Tensor(self, var.storage_shape, var.master_dtype)]

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    dtype = self._variable.master_dtype

    def read(v):
      return tf.cast(v.read_value(), dtype)
    slices = lowering.variables[self._variable].laid_out_tensor
    lowering.set_tensor_lowering(self.outputs[0], impl.slicewise(read, slices))


def _master_value(var) -> Tensor:
  """The variable's (or update target's) current value in its master dtype."""
  if isinstance(var, _UpdateTarget):
    return var.value()
  if var.activation_dtype == var.master_dtype and var.storage_shape == var.shape:
    return var.outputs[0]
  return zero.relayout(_ReadInMasterDtype(var).outputs[0], var.shape)


class _UpdateTarget:
  """What `apply_grad` updates in place of a variable: the variable itself,
  its ZeRO-sharded twin (slots and the update then have the twin shape) or
  its host-side copy (offloaded slots). It has the attributes optimizers use
  (`name`, `shape`, `mesh`, `master_dtype`, `graph`); read it with
  `Optimizer.value` and write it with `Optimizer.assign`."""

  def __init__(self, var: var_ops.Variable, shape: Shape, mesh: Mesh,
               reduce_scatter: bool):
    self.variable = var
    self._reduce_scatter = reduce_scatter
    self.name = var.name
    self.shape = shape
    self.mesh = mesh
    self.master_dtype = var.master_dtype
    self.graph = var.graph
    self._value = None

  def __repr__(self):
    return (f"<update target of variable {self.name!r}, shape {self.shape}, mesh "
            f"{self.mesh.name!r}: write it with Optimizer.assign(target, value), not "
            "mtf.assign>")

  def gradient(self, grad: Tensor) -> Tensor:
    """The gradient in this target's shape, on its mesh."""
    grad = zero.relayout(grad, self.shape, reduce_scatter=self._reduce_scatter)
    return offload.to_mesh(grad, self.mesh)

  def value(self) -> Tensor:
    if self._value is None:
      var = self.variable
      if var.storage_shape == self.shape and var.storage_shape != var.shape:
        value = _ReadInMasterDtype(var).outputs[0]  # stage 3: the stored blocks
      else:
        value = zero.relayout(_master_value(var), self.shape)
      self._value = offload.to_mesh(value, self.mesh)
    return self._value

  def assign(self, value: Tensor) -> Operation:
    var = self.variable
    value = offload.to_mesh(value, var.mesh)
    if value.shape != var.storage_shape:
      value = zero.relayout(value, var.shape)  # stages 1, 2: allgather the blocks
    return var_ops.assign(var, value)


# Graph.keeps[MASTERS_READY_KEY]: the scalar variable that says whether the
# float32 master slots hold the variables' values (0 until the first update,
# also after restoring a checkpoint written without them).
MASTERS_READY_KEY = "optimize.masters_ready"


def _masters_ready(mesh: Mesh) -> Tensor:
  """The graph's float32 scalar "masters ready" variable (created on first use)."""
  ready = mesh.graph.keeps.get(MASTERS_READY_KEY)
  if ready is None:
    ready = var_ops.get_variable(mesh, slice_variables.MASTERS_READY, Shape([]),
                                 dtype=tf.float32, initializer=tf.zeros_initializer(),
                                 trainable=False)
    mesh.graph.keeps[MASTERS_READY_KEY] = ready
  return ready


class _MasterTarget(_UpdateTarget):
  """A variable stored in its 16-bit activation dtype whose float32 master
  copy is the optimizer slot "master" (in the slots' shape: under ZeRO, this
  processor's block). Updates read the master (the variable's own value,
  widened, before the first update) and write both."""

  def __init__(self, var: var_ops.Variable, shape: Shape, mesh: Mesh,
               reduce_scatter: bool):
    super().__init__(var, shape, mesh, reduce_scatter)
    self.master_dtype = tf.float32
    self.master = _slot(self, slice_variables.MASTER_SUFFIX[1:])
    self.extra_ops: List[Operation] = []

  def value(self) -> Tensor:
    if self._value is None:
      stored = ew.cast(super().value(), tf.float32)
      ready = offload.to_mesh(_masters_ready(self.variable.mesh), self.mesh) > 0.5
      self._value = ew.where(ready, self.master, stored)
    return self._value

  def assign(self, value: Tensor) -> Operation:
    self.extra_ops.append(var_ops.assign(self.master, value))
    return super().assign(ew.cast(value, self.variable.master_dtype))


def _update_target(var: var_ops.Variable, offload_slots: bool):
  """The variable, or an _UpdateTarget if ZeRO, offload or a float32 master
  kept by the optimizer change its update."""
  plan = zero.plan_for(var.graph)
  shape = plan.shapes[var] if plan is not None and plan.shards_slots(var) else var.shape
  mesh = offload.host_mesh(var.mesh) if offload_slots else var.mesh
  reduce_scatter = plan is not None and plan.shards_gradient(var)
  if plan is not None and plan.keeps_master(var):
    return _MasterTarget(var, shape, mesh, reduce_scatter)
  if shape == var.shape and mesh is var.mesh:
    return var
  return _UpdateTarget(var, shape, mesh, reduce_scatter)


def _master(t: Tensor, var: var_ops.Variable) -> Tensor:
  """`t` in the variable's master dtype (where updates are computed)."""
  return ew.cast(t, var.master_dtype)


def _slot(var: var_ops.Variable, slot_name: str, shape: Optional[Shape] = None) -> Tensor:
  """A zero-initialized, non-trainable variable in the master dtype, over the
  variable's dimensions (or the subset `shape`), hence laid out like it."""
  return var_ops.get_variable(
      var.mesh, f"{var.name}/{slot_name}", var.shape if shape is None else shape,
      dtype=var.master_dtype, initializer=tf.zeros_initializer(), trainable=False)


def _to_mtf_scalar(value, mesh: Mesh, dtype: tf.DType, what: str) -> Tensor:
  """A Python number, TF scalar or mtf scalar as a scalar mtf Tensor of dtype."""
  if isinstance(value, Tensor):
    if value.shape.ndims:
      raise ValueError(f"{what} must be a scalar; got {value.name} with shape {value.shape}.")
    if value.mesh.graph is not mesh.graph:
      raise ValueError(
          f"{what} ({value.name}) lives on mesh {value.mesh.name!r}, but the variables "
          f"it updates live on {mesh.name!r}.")
    return ew.cast(offload.to_mesh(value, mesh), dtype)
  if isinstance(value, (numbers.Number, np.number)):
    return constant_ops.constant(mesh, value, Shape([]), dtype=dtype)
  if isinstance(value, (tf.Tensor, tf.Variable)):
    if value.shape.rank:
      raise ValueError(f"{what} must be a scalar; got a TensorFlow tensor of shape "
                       f"{value.shape}.")
    return constant_ops.import_fully_replicated(mesh, tf.cast(value, dtype), Shape([]))
  raise TypeError(f"{what} must be a number, a scalar TensorFlow or mtf tensor, or a "
                  f"function of the step; got {value!r}.")


class _StepScope:
  """What one apply_grads call resolved: the step and step-dependent scalars."""

  def __init__(self, step: Optional[StepLike], apply_if: Optional[Tensor] = None,
               lr_multiplier: Optional[Tensor] = None):
    self.step = step
    self.apply_if = apply_if
    self.lr_multiplier = lr_multiplier
    self.cache: Dict[tuple, object] = {}
    self.assigns: set = set()


class Optimizer:
  """Base class: maps (gradient, variable) pairs to mtf assign operations.

  Subclasses implement `apply_grad`. Slot variables are named after their
  variable (`<variable name>/<slot>`), so building the same model again (for
  instance once per traced `tf.function`) finds the same slots.

  Read the variable with `self.value(var)` and write it and its slots with
  `self.assign(target, value)`: under ZeRO (`mtf.zero`), CPU offload or a
  conditional update (`apply_if`), `var` may be an update target standing for
  the variable (its sharded twin or host copy; same `name`, `mesh`, `shape`,
  `master_dtype` attributes), which `mtf.assign` does not accept.

  Args:
    clip_gradients_by_global_norm: if set, `apply_grads` first scales the
      gradients so that their global L2 norm is at most this value (see
      `clip_by_global_norm`).
    offload_slots: keep slot variables, and compute the update, on each
      processor's host CPU (see `mesh_tensorflow.training.offload`); lower with
      `mtf.offload.lowering_map` (the Trainer does).

  Example:
    >>> class HalfStep(mtf.optimize.Optimizer):
    ...   def apply_grad(self, grad, var):
    ...     return [self.assign(var, self.value(var) - 0.5 * grad)]
  """

  clip_gradients_by_global_norm: Optional[float] = None
  offload_slots: bool = False
  _step_scope: Optional[_StepScope] = None

  def __init__(self, clip_gradients_by_global_norm: Optional[float] = None,
               offload_slots: bool = False):
    if clip_gradients_by_global_norm is not None and not clip_gradients_by_global_norm > 0:
      raise ValueError(
          f"{type(self).__name__}: clip_gradients_by_global_norm must be positive or "
          f"None, got {clip_gradients_by_global_norm}.")
    self.clip_gradients_by_global_norm = clip_gradients_by_global_norm
    self.offload_slots = bool(offload_slots)

  def apply_grads(self, grads: Sequence[Optional[Tensor]], variables: Sequence,
                  step: Optional[StepLike] = None, apply_if: Optional[Tensor] = None,
                  lr_multiplier: Optional[Union[float, Tensor]] = None) -> List[Operation]:
    """Returns the assign operations that apply `grads` to `variables`.

    Args:
      grads: one mtf Tensor (or None, for no update) per variable, e.g. the
        result of `mtf.gradients([loss], [v.outputs[0] for v in variables])`.
      variables: mtf `Variable` operations (e.g. `graph.trainable_variables`)
        or their value tensors.
      step: the number of updates applied so far, for step-dependent
        hyperparameters: a Python number, a TensorFlow scalar or a scalar mtf
        Tensor. Without it the optimizer uses `step_counter(mesh)` where it
        needs a step. Either way every step counter of the graph advances
        (once per graph, however many optimizers run in it).
      apply_if: a scalar mtf bool: where it is false, every variable and slot
        keeps its value (e.g. a step with non-finite gradients under loss
        scaling); step counters advance either way.
      lr_multiplier: multiplies every learning rate (e.g. AdaScale's gain).

    Gradients may also have the ZeRO sharded shape of their variable
    (`mtf.zero.shard_gradients`).

    Returns:
      A list of mtf operations; lower each with `lowering.lowered_operation`.

    Example:
      >>> ops = mtf.optimize.SgdOptimizer(0.1).apply_grads(grads, variables)
    """
    grads, variables = list(grads), list(variables)
    if len(grads) != len(variables):
      raise ValueError(
          f"{type(self).__name__}.apply_grads: got {len(grads)} gradients for "
          f"{len(variables)} variables; pass one gradient (or None) per variable.")
    pairs = []
    for grad, var in zip(grads, variables):
      var = var_ops._as_variable(var)  # pylint: disable=protected-access
      if grad is None:
        continue
      plan = zero.plan_for(var.graph)
      if grad.shape != var.shape and not (plan and plan.shapes.get(var) == grad.shape):
        raise ValueError(
            f"{type(self).__name__}: gradient {grad.name} has shape {grad.shape} "
            f"but variable {var.name!r} has shape {var.shape}.")
      pairs.append((grad, var))
    if not pairs:
      return []
    if self.clip_gradients_by_global_norm is not None:
      clipped, _ = clip_by_global_norm([g for g, _ in pairs],
                                       self.clip_gradients_by_global_norm)
      pairs = [(g, v) for g, (_, v) in zip(clipped, pairs)]
    if apply_if is not None and (not isinstance(apply_if, Tensor) or apply_if.shape.ndims):
      raise ValueError(f"{type(self).__name__}.apply_grads: apply_if must be a scalar mtf "
                       f"bool Tensor, got {apply_if!r}.")
    outer = self._step_scope
    self._step_scope = _StepScope(step, apply_if, lr_multiplier)
    try:
      ops = []
      for grad, var in pairs:
        target = _update_target(var, self.offload_slots)
        if isinstance(target, _UpdateTarget):
          grad = target.gradient(grad)
        elif grad.shape != var.shape:
          grad = zero.relayout(grad, var.shape)
        new_ops = self.apply_grad(grad, target)
        if target is not var or apply_if is not None:
          self._check_assigns(new_ops, var)
        ops.extend(new_ops + getattr(target, "extra_ops", []))
      ready = pairs[0][1].graph.keeps.get(MASTERS_READY_KEY)
      if ready is not None:  # the master slots now hold the values
        ops.append(var_ops.assign(ready, constant_ops.ones_like(ready)))
      # Counters advance also when the caller gives the step (a Trainer), so
      # models that read step_counter() see the number of updates.
      ops.extend(_advance_step_counters(pairs[0][1].graph))
    finally:
      self._step_scope = outer
    return ops

  def apply_grad(self, grad: Tensor, var) -> List[Operation]:
    """Returns the assign operations that apply one gradient to one variable.

    Call `apply_grads` rather than this: it also clips gradients and advances
    the step counter.

    Args:
      grad: the gradient, an mtf Tensor of the variable's shape.
      var: an mtf `Variable` operation.

    Example:
      >>> ops = optimizer.apply_grad(grad, graph.trainable_variables[0])
    """
    raise NotImplementedError(f"{type(self).__name__} does not implement apply_grad.")

  def value(self, target) -> Tensor:
    """The current value of a variable, update target or slot in its master
    dtype (for a ZeRO-sharded target: its block; offloaded: on the host).

    Example:
      >>> new_value = self.value(var) - lr * grad
    """
    return _master_value(target if isinstance(target, _UpdateTarget)
                         else var_ops._as_variable(target))  # pylint: disable=protected-access

  def assign(self, target, value: Tensor) -> Operation:
    """Returns an op that sets a variable, update target or slot to `value`.

    Use it (not `mtf.assign`) in `apply_grad`: it writes a ZeRO-sharded or
    offloaded variable through its update target, and keeps the old value
    where `apply_grads(apply_if=...)` is false.

    Example:
      >>> ops = [self.assign(velocity, new_velocity),
      ...        self.assign(var, _master_value(var) + new_velocity)]
    """
    scope = self._step_scope or _StepScope(None)
    if isinstance(target, _UpdateTarget):
      old, write = target.value, target.assign
    else:
      variable = var_ops._as_variable(target)  # pylint: disable=protected-access
      old = lambda: _master_value(variable)  # noqa: E731
      write = lambda v: var_ops.assign(variable, v)  # noqa: E731
    if scope.apply_if is not None:
      condition = offload.to_mesh(scope.apply_if, value.mesh)
      value = ew.where(condition, value, ew.cast(old(), value.dtype))
    op = write(value)
    scope.assigns.add(op)
    return op

  def _check_assigns(self, ops: Sequence[Operation], var) -> None:
    scope = self._step_scope
    for op in ops:
      if op not in scope.assigns:
        raise ValueError(
            f"{type(self).__name__}.apply_grad returned {op.name!r} for variable "
            f"{var.name!r}, not made with self.assign; under ZeRO, offload_slots or "
            "apply_if, write variables and slots with self.assign(target, value).")

  def current_step(self, mesh: Mesh) -> Tensor:
    """The step of the update being built, as a float32 scalar mtf Tensor.

    It is the `step` given to `apply_grads`, or else the value of
    `step_counter(mesh)`: the number of updates applied before this one.

    Args:
      mesh: the mesh of the variables being updated.

    Example:
      >>> lr = mtf.minimum(0.01, mtf.rsqrt(self.current_step(var.mesh) + 1.0))
    """
    scope = self._step_scope or _StepScope(None)
    key = ("step", mesh)
    if key not in scope.cache:
      if scope.step is None:
        counter_mesh = offload.device_mesh_of(mesh) or mesh
        value = offload.to_mesh(ew.cast(step_counter(counter_mesh), tf.float32), mesh)
      else:
        value = _to_mtf_scalar(scope.step, mesh, tf.float32, "step")
      scope.cache[key] = value
    return scope.cache[key]

  def hyperparameter(self, value: Hyperparameter, mesh: Mesh, dtype: tf.DType,
                     what: str = "hyperparameter") -> Union[float, Tensor]:
    """Resolves a hyperparameter for an update on `mesh` in `dtype`.

    Python numbers are returned as floats (folded into the ops that use them);
    functions are called with `current_step(mesh)` (once per `apply_grads`);
    TensorFlow and mtf scalars become scalar mtf Tensors of `dtype`.

    Args:
      value: a number, a scalar mtf or TensorFlow tensor, or a function of the
        step returning one of those.
      mesh: the mesh of the variable being updated.
      dtype: the variable's master dtype.
      what: a name for error messages.

    Example:
      >>> lr = self.hyperparameter(self.learning_rate, var.mesh, var.master_dtype)
    """
    scope = self._step_scope or _StepScope(None)
    if (isinstance(value, (numbers.Number, np.number)) and not isinstance(value, bool)
        and (what != "learning rate" or scope.lr_multiplier is None)):
      return float(value)
    key = (what, id(value), mesh, dtype)
    if key not in scope.cache:
      resolved = value(self.current_step(mesh)) if callable(value) else value
      if isinstance(resolved, (numbers.Number, np.number)):
        resolved = float(resolved)
      else:
        resolved = _to_mtf_scalar(resolved, mesh, dtype, what)
      if what == "learning rate" and scope.lr_multiplier is not None:
        multiplier = scope.lr_multiplier
        if not isinstance(multiplier, (numbers.Number, np.number)):
          multiplier = _to_mtf_scalar(multiplier, mesh, dtype, "lr_multiplier")
        resolved = resolved * multiplier
      scope.cache[key] = (value, resolved)  # keeps `value` alive while id() is a key
    return scope.cache[key][1]


def _one_learning_rate(learning_rate, lr, what: str):
  """The learning rate given as `learning_rate` (the original's name) or `lr`."""
  if (learning_rate is None) == (lr is None):
    raise TypeError(f"{what}: give the learning rate once, as learning_rate= (or lr=).")
  return lr if learning_rate is None else learning_rate

from mesh_tensorflow.core import autograph_exempt as _autograph_exempt  # noqa: E402  pylint: disable=g-import-not-at-top
_autograph_exempt.exempt(globals())  # AutoGraph leaves this module's code alone
