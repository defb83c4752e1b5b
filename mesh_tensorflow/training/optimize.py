"""Optimizers that update mtf variables in place, slice by slice.

An optimizer turns gradients into mtf assign operations. Its per-variable
state (momentum, Adam moments, Adafactor's second-moment statistics) lives in
"slot" variables created with `mtf.get_variable`. A slot has its variable's
dimensions (Adafactor's factored slots a subset of them), so the layout rules
lay it out like its variable and every elementwise update is local to each
processor.

    >>> variables = graph.trainable_variables
    >>> grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
    >>> optimizer = mtf.optimize.AdafactorOptimizer()
    >>> update_ops = optimizer.apply_grads(grads, variables)
    >>> # inside a tf.function: tf.group(*[lowering.lowered_operation(op)
    >>> #                                  for op in update_ops])

Dtypes. A variable has a master dtype (the precision of its updates), a slice
dtype (how each processor stores it) and an activation dtype (what the model
reads). Optimizers read the stored slices, compute the update in the master
dtype and store the result in the slice dtype; they never round the weights
through the activation dtype. So a model with bfloat16 activations and float32
master weights accumulates small updates exactly as a float32 model does.

The step. Learning rates and hyperparameters may be Python numbers, scalar mtf
or TensorFlow tensors, or functions of the step (see
`mesh_tensorflow.training.learning_rate_schedules`). The step is the number of updates
applied before the current one (0 for the first). `apply_grads(..., step=s)`
takes it from the caller (a Python number, a TensorFlow scalar or a scalar mtf
tensor); without `step`, it comes from the step counter `step_counter(mesh)`, a
non-trainable int64 mtf variable named "optimizer_step". That counter is
created only if something reads it, is checkpointed with the other variables,
and is advanced once per mtf graph (i.e. per training step) by `apply_grads`.
"""

from __future__ import annotations

import math
import numbers
import re
import weakref
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import tensorflow as tf

from mesh_tensorflow.training import learning_rate_schedules as lrs
from mesh_tensorflow.training import offload
from mesh_tensorflow.training import zero
from mesh_tensorflow.core.graph import Graph, Mesh, Operation, Tensor
from mesh_tensorflow.ops import constant_ops as constant_ops
from mesh_tensorflow.ops import elementwise as ew
from mesh_tensorflow.ops import reduction
from mesh_tensorflow.ops import variables as var_ops
from mesh_tensorflow.core.shapes import Dimension, Shape

# A hyperparameter: a number, a scalar (mtf or TensorFlow) tensor, or a
# function of the step (a float32 scalar mtf Tensor) returning one of those.
Hyperparameter = Union[float, Tensor, tf.Tensor, tf.Variable, Callable[[Tensor], object]]
LearningRate = Hyperparameter
StepLike = Union[int, float, Tensor, tf.Tensor, tf.Variable]

STEP_COUNTER_NAME = "optimizer_step"

# mtf.Graph -> {counter Variable operation: whether apply_grads advanced it}.
_STEP_COUNTERS: "weakref.WeakKeyDictionary[Graph, Dict[Operation, bool]]" = (
    weakref.WeakKeyDictionary())


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
  counters = _STEP_COUNTERS.setdefault(mesh.graph, {})
  counters.setdefault(value.operation, False)
  return value


def step_num():
  """The original's TensorFlow global step, which this library does not keep.

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
  counters = _STEP_COUNTERS.get(graph, {})
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
    super().__init__([var.outputs[0]], mesh=var.mesh, name="read_master_value")
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


def _update_target(var: var_ops.Variable, offload_slots: bool):
  """The variable, or an _UpdateTarget if ZeRO or offload change its update."""
  plan = zero.plan_for(var.graph)
  shape = plan.shapes[var] if plan is not None and plan.shards_slots(var) else var.shape
  mesh = offload.host_mesh(var.mesh) if offload_slots else var.mesh
  if shape == var.shape and mesh is var.mesh:
    return var
  return _UpdateTarget(var, shape, mesh, plan is not None and plan.shards_gradient(var))


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
        ops.extend(new_ops)
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


class SgdOptimizer(Optimizer):
  """Plain gradient descent: `var <- var - lr * grad`.

  Args:
    learning_rate: a number, a scalar mtf or TensorFlow tensor, or a
      function of the step (see `mesh_tensorflow.training.learning_rate_schedules`).
    clip_gradients_by_global_norm: see `Optimizer`.
    offload_slots: see `Optimizer`.
    lr: another name for learning_rate.

  Example:
    >>> ops = mtf.optimize.SgdOptimizer(0.1).apply_grads(grads, variables)
    >>> opt = mtf.optimize.SgdOptimizer(learning_rate=0.1)   # the original's keyword
  """

  def __init__(self, learning_rate: Optional[LearningRate] = None,
               clip_gradients_by_global_norm: Optional[float] = None,
               offload_slots: bool = False, lr: Optional[LearningRate] = None):
    super().__init__(clip_gradients_by_global_norm, offload_slots)
    self._lr = _one_learning_rate(learning_rate, lr, "SgdOptimizer")

  @property
  def lr(self) -> LearningRate:
    return self._lr

  def apply_grad(self, grad: Tensor, var) -> List[Operation]:
    lr = self.hyperparameter(self._lr, var.mesh, var.master_dtype, "learning rate")
    value = _master_value(var)
    return [self.assign(var, value - lr * _master(grad, var))]


class MomentumOptimizer(Optimizer):
  """Gradient descent with (heavy-ball) momentum.

  With velocity slot `v` (initially zero):
  `v <- momentum * v - lr * grad; var <- var + v`.

  Args:
    learning_rate: a number, a scalar mtf or TensorFlow tensor, or a
      function of the step.
    momentum: decay of the velocity, e.g. 0.9.
    clip_gradients_by_global_norm: see `Optimizer`.
    offload_slots: see `Optimizer`.
    lr: another name for learning_rate.

  Example:
    >>> opt = mtf.optimize.MomentumOptimizer(0.1, momentum=0.9)
    >>> ops = opt.apply_grads(grads, variables)
  """

  def __init__(self, learning_rate: Optional[LearningRate] = None,
               momentum: Optional[float] = None,
               clip_gradients_by_global_norm: Optional[float] = None,
               offload_slots: bool = False, lr: Optional[LearningRate] = None):
    super().__init__(clip_gradients_by_global_norm, offload_slots)
    if momentum is None:
      raise TypeError("MomentumOptimizer: give momentum (e.g. 0.9).")
    self._lr = _one_learning_rate(learning_rate, lr, "MomentumOptimizer")
    self._momentum = momentum

  lr = property(lambda self: self._lr)
  momentum = property(lambda self: self._momentum)

  def apply_grad(self, grad: Tensor, var) -> List[Operation]:
    lr = self.hyperparameter(self._lr, var.mesh, var.master_dtype, "learning rate")
    velocity = _slot(var, "momentum")
    new_velocity = velocity * self._momentum - lr * _master(grad, var)
    return [self.assign(velocity, new_velocity),
            self.assign(var, _master_value(var) + new_velocity)]


class AdamWeightDecayOptimizer(Optimizer):
  """Adam with decoupled weight decay, as in BERT (no bias correction).

  With slots `m` and `v` (initially zero), for each step:

      m <- beta_1 * m + (1 - beta_1) * grad
      v <- beta_2 * v + (1 - beta_2) * grad**2
      update = m / (sqrt(v) + epsilon) + weight_decay_rate * var
      var <- var - learning_rate * update

  The decay term is left out for variables whose name matches (`re.search`)
  one of `exclude_from_weight_decay`.

  Args:
    learning_rate: a number, a scalar mtf or TensorFlow tensor, or a function
      of the step.
    weight_decay_rate: decoupled weight decay coefficient.
    beta_1: decay of the first-moment estimate.
    beta_2: decay of the second-moment estimate.
    epsilon: added to the denominator.
    exclude_from_weight_decay: regular expressions of variable names that get
      no weight decay, e.g. ["bias", "layer_norm"].
    clip_gradients_by_global_norm: see `Optimizer`.
    offload_slots: see `Optimizer`.

  Example:
    >>> opt = mtf.optimize.AdamWeightDecayOptimizer(
    ...     learning_rate=1e-3, weight_decay_rate=0.01,
    ...     exclude_from_weight_decay=["bias"])
    >>> ops = opt.apply_grads(grads, graph.trainable_variables)
  """

  def __init__(self, learning_rate: LearningRate, weight_decay_rate: float = 0.0,
               beta_1: float = 0.9, beta_2: float = 0.999, epsilon: float = 1e-6,
               exclude_from_weight_decay: Optional[Sequence[str]] = None,
               clip_gradients_by_global_norm: Optional[float] = None,
               offload_slots: bool = False):
    super().__init__(clip_gradients_by_global_norm, offload_slots)
    self.learning_rate = learning_rate
    self.weight_decay_rate = weight_decay_rate
    self.beta_1 = beta_1
    self.beta_2 = beta_2
    self.epsilon = epsilon
    self.exclude_from_weight_decay = list(exclude_from_weight_decay or [])

  def apply_grad(self, grad: Tensor, var) -> List[Operation]:
    lr = self.hyperparameter(self.learning_rate, var.mesh, var.master_dtype,
                             "learning rate")
    grad = _master(grad, var)
    value = _master_value(var)
    m = _slot(var, "adam_m")
    v = _slot(var, "adam_v")
    next_m = self.beta_1 * m + (1.0 - self.beta_1) * grad
    next_v = self.beta_2 * v + (1.0 - self.beta_2) * ew.square(grad)
    update = next_m / (ew.sqrt(next_v) + self.epsilon)
    if self._do_use_weight_decay(var.name):
      update = update + self.weight_decay_rate * value
    return [self.assign(m, next_m),
            self.assign(v, next_v),
            self.assign(var, value - lr * update)]

  def _do_use_weight_decay(self, param_name: str) -> bool:
    if not self.weight_decay_rate:
      return False
    return not any(re.search(p, param_name) for p in self.exclude_from_weight_decay)


def adafactor_decay_rate_pow(exponent: float = 0.8, offset: int = 0) -> lrs.Schedule:
  """Adafactor's second-moment decay `1 - (step - offset + 1) ** -exponent`.

  The averaging window grows like step**exponent; the first update (step
  `offset`) uses the squared gradient alone.

  Args:
    exponent: in (0, 1]; the paper uses 0.8.
    offset: the step the averaging starts from, e.g. the first step of a
      fine-tuning run (steps before it count as `offset`).

  Returns:
    A function of the step (Python, TensorFlow or mtf scalar) giving the rate.

  Example:
    >>> opt = mtf.optimize.AdafactorOptimizer(
    ...     decay_rate=mtf.optimize.adafactor_decay_rate_pow(0.5))
    >>> mtf.optimize.adafactor_decay_rate_pow(1.0)(3)
    0.75
  """
  if not 0 < exponent <= 1:
    raise ValueError(f"adafactor_decay_rate_pow: exponent must be in (0, 1], got {exponent}.")
  if offset < 0:
    raise ValueError(f"adafactor_decay_rate_pow: offset must be >= 0, got {offset}.")

  def decay_rate(step: lrs.Step) -> lrs.Value:
    ops, s = lrs._math_for(step)  # pylint: disable=protected-access
    if offset:
      s = ops.maximum(s - float(offset), 0.0)
    return 1.0 - ops.exp(-exponent * ops.log(s + 1.0))
  return decay_rate


def adafactor_decay_rate_adam(beta2: float) -> lrs.Schedule:
  """Adam's second-moment decay with its bias correction folded in.

  `beta2 * (1 - beta2 ** t) / (1 - beta2 ** (t + 1))` at step t (0 at the
  first update, approaching beta2 later): an exponential average of squared
  gradients that needs no separate correction.

  Args:
    beta2: Adam's beta_2, in (0, 1).

  Returns:
    A function of the step (Python, TensorFlow or mtf scalar) giving the rate.

  Example:
    >>> opt = mtf.optimize.AdafactorOptimizer(
    ...     decay_rate=mtf.optimize.adafactor_decay_rate_adam(0.999))
  """
  if not 0 < beta2 < 1:
    raise ValueError(f"adafactor_decay_rate_adam: beta2 must be in (0, 1), got {beta2}.")
  log_beta2 = math.log(beta2)

  def decay_rate(step: lrs.Step) -> lrs.Value:
    ops, s = lrs._math_for(step)  # pylint: disable=protected-access
    power = ops.exp(s * log_beta2)  # beta2 ** step
    return beta2 * (1.0 - power) / (1.0 - power * beta2)
  return decay_rate


def _adafactor_relative_step_size(step: lrs.Step) -> lrs.Value:
  """min(0.01, 1 / sqrt(step + 1)): Adafactor's default relative step size."""
  ops, s = lrs._math_for(step)  # pylint: disable=protected-access
  return ops.minimum(1.0 / ops.sqrt(s + 1.0), 0.01)


def _adafactor_absolute_step_size(step: lrs.Step) -> lrs.Value:
  """The default step size without parameter scaling: 0.05 times the relative one."""
  return 0.05 * _adafactor_relative_step_size(step)


class AdafactorOptimizer(Optimizer):
  """Adafactor (Shazeer and Stern, 2018): Adam-like updates with factored
  second moments, update clipping and relative step sizes.

  For a gradient g of a variable x, at step t (updates applied so far):

      decay = decay_rate(t)                  # default 1 - (t + 1) ** -0.8
      s = g**2 + epsilon1
      if factored (d0, d1 the two largest dims, both >= min_dim_size_to_factor):
        vr <- decay * vr + (1 - decay) * mean(s over d1)   # keeps d0
        vc <- decay * vc + (1 - decay) * mean(s over d0)   # keeps d1
        v = vr * vc / mean(vr over d0)
      else:
        v <- decay * v + (1 - decay) * s
      u = g / sqrt(v)
      u = u / max(1, rms(u) / clipping_threshold)      # if clipping_threshold
      step_size = learning_rate(t)                     # default min(0.01, 1/sqrt(t+1))
      if multiply_by_parameter_scale:
        step_size = step_size * max(epsilon2, rms(x))
      delta = step_size * u
      if beta1: m <- beta1 * m + (1 - beta1) * delta; delta = m
      x <- x - delta

  rms is over all elements of a tensor. Dimensions other than d0 and d1 are
  batch dimensions of the factorization (each [d0, d1] matrix is factored on
  its own). Factored slots (`<var>/adafactor_vr` over the variable's
  dimensions without d1, `<var>/adafactor_vc` without d0) need memory of order
  d0 + d1 instead of d0 * d1 per matrix; they are ordinary mtf variables, so
  the layout rules lay them out like their variable. A split d0 or d1 costs one
  allreduce of a slot-sized tensor; the rms values cost scalar allreduces.

  Steps come from `apply_grads(..., step=)` or the step counter (see the
  module docstring), so the defaults need no global TensorFlow state.

  Args:
    multiply_by_parameter_scale: scale the step size by the parameter's rms
      (a relative step size).
    learning_rate: the (relative) step size: a number, a scalar mtf or
      TensorFlow tensor, or a function of the step. Default: min(0.01,
      1/sqrt(step + 1)), times 0.05 when multiply_by_parameter_scale is False.
    decay_rate: second-moment decay: a number, a scalar tensor, or a function
      of the step. Default: `adafactor_decay_rate_pow(0.8)`.
    beta1: first-moment (momentum) decay of the scaled update; 0 keeps no
      first moment (and no `adafactor_m` slot).
    clipping_threshold: the largest rms an update may have, or None for no
      update clipping.
    factored: whether to factor second moments of variables with two large
      enough dimensions.
    epsilon1: added to squared gradients.
    epsilon2: lower bound of the parameter scale, so that zero-initialized
      variables still move.
    min_dim_size_to_factor: factor only when the second largest dimension has
      at least this size.
    stacked_dim_names: names of dimensions that stack independent parameters
      (e.g. "layers"): never factored over, and the parameter scale is taken
      per entry of them.
    exclude_from_parameter_scale: substrings of variable names whose step
      size is not multiplied by the parameter scale.
    clip_gradients_by_global_norm: see `Optimizer`.
    offload_slots: see `Optimizer`.

  Example:
    >>> opt = mtf.optimize.AdafactorOptimizer(beta1=0.9, min_dim_size_to_factor=32)
    >>> ops = opt.apply_grads(grads, graph.trainable_variables)
  """

  def __init__(self, multiply_by_parameter_scale: bool = True,
               learning_rate: Optional[Hyperparameter] = None,
               decay_rate: Optional[Hyperparameter] = None,
               beta1: float = 0.0,
               clipping_threshold: Optional[float] = 1.0,
               factored: bool = True,
               epsilon1: float = 1e-30,
               epsilon2: float = 1e-3,
               min_dim_size_to_factor: int = 128,
               stacked_dim_names: Optional[Sequence[str]] = None,
               exclude_from_parameter_scale: Optional[Sequence[str]] = None,
               clip_gradients_by_global_norm: Optional[float] = None,
               offload_slots: bool = False):
    super().__init__(clip_gradients_by_global_norm, offload_slots)
    if not 0.0 <= beta1 < 1.0:
      raise ValueError(f"AdafactorOptimizer: beta1 must be in [0, 1), got {beta1}.")
    if clipping_threshold is not None and not clipping_threshold > 0:
      raise ValueError(
          "AdafactorOptimizer: clipping_threshold must be positive or None, got "
          f"{clipping_threshold}.")
    if min_dim_size_to_factor < 1:
      raise ValueError(
          "AdafactorOptimizer: min_dim_size_to_factor must be >= 1, got "
          f"{min_dim_size_to_factor}.")
    self.multiply_by_parameter_scale = multiply_by_parameter_scale
    if learning_rate is None:
      learning_rate = self._learning_rate_default(multiply_by_parameter_scale)
    self.learning_rate = learning_rate
    self.decay_rate = self._decay_rate_default() if decay_rate is None else decay_rate
    self.beta1 = beta1
    self.clipping_threshold = clipping_threshold
    self.factored = factored
    self.epsilon1 = epsilon1
    self.epsilon2 = epsilon2
    self.min_dim_size_to_factor = min_dim_size_to_factor
    self.stacked_dim_names = list(stacked_dim_names or [])
    self.exclude_from_parameter_scale = list(exclude_from_parameter_scale or [])

  def factored_dims(self, shape: Shape) -> Optional[Tuple[Dimension, Dimension]]:
    """The two dimensions (largest first) to factor over, or None.

    Ties in size keep the shape's order; stacked dimensions are never picked.

    Args:
      shape: the variable's mtf Shape.

    Example:
      >>> AdafactorOptimizer(min_dim_size_to_factor=2).factored_dims(
      ...     mtf.convert_to_shape("a:2;b:8;c:4"))
      (Dimension(name='b', size=8), Dimension(name='c', size=4))
    """
    dims = [d for d in shape.dims if d.name not in self.stacked_dim_names]
    if not self.factored or len(dims) < 2:
      return None
    largest = sorted(dims, key=lambda d: -d.size)[:2]
    if largest[1].size < self.min_dim_size_to_factor:
      return None
    return largest[0], largest[1]

  # The original's private spellings, kept for ported code and tests.
  def _factored_dims(self, shape: Shape) -> Optional[List[Dimension]]:
    dims = self.factored_dims(shape)
    return None if dims is None else list(dims)

  def _parameter_scale(self, var) -> Tensor:
    """max(rms(var), epsilon2): the scale a relative step size is multiplied by
    (one per entry of the stacked dimensions)."""
    value = var.value if isinstance(var, var_ops.Variable) else var
    stacked = [d for d in value.shape.dims if d.name in self.stacked_dim_names]
    return ew.maximum(reduce_rms(value, output_shape=stacked), self.epsilon2)

  def _decay_rate_default(self) -> lrs.Schedule:
    return adafactor_decay_rate_pow(0.8)

  def _learning_rate_default(self, multiply_by_parameter_scale: bool) -> lrs.Schedule:
    return (_adafactor_relative_step_size if multiply_by_parameter_scale
            else _adafactor_absolute_step_size)

  def apply_grad(self, grad: Tensor, var) -> List[Operation]:
    mesh, dtype = var.mesh, var.master_dtype
    lr = self.hyperparameter(self.learning_rate, mesh, dtype, "learning rate")
    decay = self.hyperparameter(self.decay_rate, mesh, dtype, "decay rate")
    grad = _master(grad, var)
    value = _master_value(var)
    squared = ew.square(grad) + self.epsilon1
    ops = []
    dims = self.factored_dims(var.shape)
    if dims is not None:
      d0, d1 = dims
      vr = _slot(var, "adafactor_vr", var.shape - [d1])
      vc = _slot(var, "adafactor_vc", var.shape - [d0])
      new_vr = decay * vr + (1.0 - decay) * reduction.reduce_mean(squared, reduced_dim=d1)
      new_vc = decay * vc + (1.0 - decay) * reduction.reduce_mean(squared, reduced_dim=d0)
      ops += [self.assign(vr, new_vr), self.assign(vc, new_vc)]
      row_factor = ew.rsqrt(new_vr / reduction.reduce_mean(new_vr, reduced_dim=d0))
      update = grad * row_factor * ew.rsqrt(new_vc)
    else:
      v = _slot(var, "adafactor_v")
      new_v = decay * v + (1.0 - decay) * squared
      ops.append(self.assign(v, new_v))
      update = grad * ew.rsqrt(new_v)
    if self.clipping_threshold is not None:
      update = update / ew.maximum(reduce_rms(update) * (1.0 / self.clipping_threshold),
                                   1.0)
    step_size = lr
    if self.multiply_by_parameter_scale and not any(
        s in var.name for s in self.exclude_from_parameter_scale):
      step_size = lr * self._parameter_scale(value)
    delta = update * step_size
    if self.beta1:
      m = _slot(var, "adafactor_m")
      delta = self.beta1 * m + (1.0 - self.beta1) * delta
      ops.append(self.assign(m, delta))
    ops.append(self.assign(var, value - delta))
    return ops


def adafactor_optimizer_from_hparams(hparams, lr: Hyperparameter) -> AdafactorOptimizer:
  """An AdafactorOptimizer from tensor2tensor-style hyperparameters.

  Reads `optimizer_adafactor_decay_type` ("Adam": `optimizer_adafactor_beta2`;
  "pow": `optimizer_adafactor_memory_exponent`),
  `optimizer_adafactor_multiply_by_parameter_scale`, `optimizer_adafactor_beta1`,
  `optimizer_adafactor_clipping_threshold` and `optimizer_adafactor_factored`
  from any object with those attributes.

  Example:
    >>> hp = types.SimpleNamespace(optimizer="Adafactor", optimizer_adafactor_decay_type="pow",
    ...     optimizer_adafactor_memory_exponent=0.8, optimizer_adafactor_beta1=0.0,
    ...     optimizer_adafactor_multiply_by_parameter_scale=True,
    ...     optimizer_adafactor_clipping_threshold=1.0, optimizer_adafactor_factored=True)
    >>> opt = mtf.optimize.adafactor_optimizer_from_hparams(hp, 0.01)
  """
  decay_type = getattr(hparams, "optimizer_adafactor_decay_type", None)
  if decay_type == "Adam":
    decay_rate = adafactor_decay_rate_adam(hparams.optimizer_adafactor_beta2)
  elif decay_type == "pow":
    decay_rate = adafactor_decay_rate_pow(hparams.optimizer_adafactor_memory_exponent)
  else:
    raise ValueError(
        f"adafactor_optimizer_from_hparams: optimizer_adafactor_decay_type is {decay_type!r}; "
        "use 'Adam' (with optimizer_adafactor_beta2) or 'pow' (with "
        "optimizer_adafactor_memory_exponent).")
  return AdafactorOptimizer(
      multiply_by_parameter_scale=hparams.optimizer_adafactor_multiply_by_parameter_scale,
      learning_rate=lr, decay_rate=decay_rate, beta1=hparams.optimizer_adafactor_beta1,
      clipping_threshold=hparams.optimizer_adafactor_clipping_threshold,
      factored=hparams.optimizer_adafactor_factored)


def make_optimizer(hparams, lr: Hyperparameter) -> Optimizer:
  """The optimizer `hparams.optimizer` names ("SGD" or "Adafactor") at rate `lr`.

  Example:
    >>> opt = mtf.optimize.make_optimizer(types.SimpleNamespace(optimizer="SGD"), 0.1)
  """
  name = getattr(hparams, "optimizer", None)
  if name == "SGD":
    return SgdOptimizer(lr)
  if name == "Adafactor":
    return adafactor_optimizer_from_hparams(hparams, lr)
  raise ValueError(f"make_optimizer: hparams.optimizer is {name!r}; use 'SGD' or 'Adafactor' "
                   "(or build an mtf.optimize optimizer directly).")


# ---- the original's multi-schedule optimizers -----------------------------------
def product_learning_rate(step, total_train_steps, factors=None, offset=0):
  """The product of `factors`: numbers and schedules called as
  f(step - offset, total_train_steps - offset) (the original's
  `optimize.product_learning_rate`; the gin-configurable one is
  `mesh_tensorflow.transformer.learning_rate_schedules.product_learning_rate`).

  Args:
    step: the step: a number, a TensorFlow scalar or a scalar mtf Tensor.
    total_train_steps: a number.
    factors: a list of numbers and functions (step, total_train_steps) -> rate.
    offset: subtracted from step and total_train_steps first.

  Returns:
    The learning rate, of step's kind.

  Example:
    >>> mtf.optimize.product_learning_rate(10, 100, factors=[0.5, 2.0])
    1.0
  """
  if factors is None:
    raise TypeError("product_learning_rate: factors is required (a list of numbers and "
                    "schedules).")
  return lrs.product_of_factors(step, total_train_steps, factors, offset=offset)


def compute_lr_for_step(schedules, learning_rate, train_steps: int = 524288, step=None):
  """One learning rate per entry of `schedules` (the original's
  `compute_lr_for_step`): `learning_rate` for a None entry, else the product
  of the entry's factors (see `product_learning_rate`) over `train_steps`.

  The original evaluated the schedules at TensorFlow's global step, which TF2
  does not keep: here, without `step`, each rate is a function of the step
  that the optimizers resolve per update (see `Optimizer.hyperparameter`);
  with `step` (a number or scalar tensor), the rates at that step.

  Example:
    >>> lrs = mtf.optimize.compute_lr_for_step([None, [0.1, 2.0]], 0.01, step=5)
    >>> [float(r) for r in lrs]
    [0.01, 0.2]
  """
  rates = []
  for factors in schedules:
    if factors is None:
      rates.append(learning_rate)
      continue

    def schedule(s, factors=factors):
      return product_learning_rate(s, train_steps, factors=factors)
    rates.append(schedule if step is None else schedule(step))
  return rates


class _MultiLRSchedule:
  """apply_grad with another learning rate for the variables whose name
  matches a pattern of `variable_search` (the first match wins)."""

  def _init_multi(self, variable_search, alt_lr_schedules, train_steps):
    variable_search = list(variable_search) if variable_search is not None else None
    alt_lr_schedules = list(alt_lr_schedules) if alt_lr_schedules is not None else None
    if (variable_search is not None and alt_lr_schedules is not None
        and len(variable_search) != len(alt_lr_schedules)):
      raise ValueError(f"{type(self).__name__}: variable_search has {len(variable_search)} "
                       f"patterns but alt_lr_schedules has {len(alt_lr_schedules)} "
                       "schedules; give one schedule per pattern.")
    self.variable_search = variable_search
    self.alt_lr_schedules = alt_lr_schedules
    self.train_steps = train_steps
    # One schedule function per pattern (None: the optimizer's own rate), made
    # once so that every update in a step shares its resolved value.
    self._alt_rates = None if alt_lr_schedules is None else compute_lr_for_step(
        alt_lr_schedules, None, train_steps)

  def apply_grad(self, grad: Tensor, var) -> List[Operation]:
    if self.alt_lr_schedules is None or self.variable_search is None:
      return super().apply_grad(grad, var)
    name = getattr(var, "name", "")
    for pattern, rate in zip(self.variable_search, self._alt_rates):
      if rate is None:
        rate = self.learning_rate
      if re.search(pattern, name) is not None:
        default = self.learning_rate
        self.learning_rate = rate
        try:
          return super().apply_grad(grad, var)
        finally:
          self.learning_rate = default
    return super().apply_grad(grad, var)


class AdafactorWithMultiLRSchedule(_MultiLRSchedule, AdafactorOptimizer):
  """Adafactor where the variables whose name matches `variable_search[i]`
  (a regular expression; the first match wins) use the learning rate
  `alt_lr_schedules[i]` (a list of `product_learning_rate` factors over
  `train_steps`, or None for the default), the others the optimizer's own.

  The original applied a matched variable's update once per pattern; here
  each variable is updated once.

  Example:
    >>> opt = mtf.optimize.AdafactorWithMultiLRSchedule(
    ...     variable_search=["embedding"], alt_lr_schedules=[[0.1]], learning_rate=0.01)
  """

  def __init__(self, variable_search=None, alt_lr_schedules=None,
               train_steps: int = 524288, **kwargs):
    super().__init__(**kwargs)
    self._init_multi(variable_search, alt_lr_schedules, train_steps)


class AdamWithMultiLRSchedule(_MultiLRSchedule, AdamWeightDecayOptimizer):
  """AdamWeightDecayOptimizer with per-variable learning-rate schedules (see
  `AdafactorWithMultiLRSchedule`).

  Example:
    >>> opt = mtf.optimize.AdamWithMultiLRSchedule(
    ...     variable_search=["bias"], alt_lr_schedules=[[0.0]], learning_rate=1e-3)
  """

  def __init__(self, variable_search=None, alt_lr_schedules=None,
               train_steps: int = 524288, **kwargs):
    super().__init__(**kwargs)
    self._init_multi(variable_search, alt_lr_schedules, train_steps)

from mesh_tensorflow.core import autograph_exempt as _autograph_exempt  # noqa: E402  pylint: disable=g-import-not-at-top
_autograph_exempt.exempt(globals())  # AutoGraph leaves this module's code alone
