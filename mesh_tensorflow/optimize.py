"""Optimizers that update mtf variables in place, slice by slice.

An optimizer turns gradients into mtf assign operations. Its per-variable
state (momentum, Adam moments) lives in "slot" variables created with
`mtf.get_variable`: a slot has its variable's shape, hence its layout, so every
update is local to each processor and costs no communication.

    >>> variables = graph.trainable_variables
    >>> grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
    >>> optimizer = mtf.optimize.AdamWeightDecayOptimizer(learning_rate=1e-3)
    >>> update_ops = optimizer.apply_grads(grads, variables)
    >>> # inside a tf.function: tf.group(*[lowering.lowered_operation(op)
    >>> #                                  for op in update_ops])
"""

from __future__ import annotations

import re
from typing import List, Optional, Sequence, Union

import tensorflow as tf

from mesh_tensorflow.graph import Operation, Tensor
from mesh_tensorflow.ops import elementwise as ew
from mesh_tensorflow.ops import variables as var_ops

LearningRate = Union[float, Tensor]


class Optimizer:
  """Base class: maps (gradient, variable) pairs to mtf assign operations.

  Subclasses implement `apply_grad`. Slot variables are named after their
  variable (`<variable name>/<slot>`), so building the same model again (for
  instance once per traced `tf.function`) finds the same slots.

  Example:
    >>> class HalfStep(mtf.optimize.Optimizer):
    ...   def apply_grad(self, grad, var):
    ...     return [mtf.assign_sub(var, 0.5 * grad)]
  """

  def apply_grads(self, grads: Sequence[Optional[Tensor]],
                  variables: Sequence) -> List[Operation]:
    """Returns the assign operations that apply `grads` to `variables`.

    Args:
      grads: one mtf Tensor (or None, for no update) per variable, e.g. the
        result of `mtf.gradients([loss], [v.outputs[0] for v in variables])`.
      variables: mtf `Variable` operations (e.g. `graph.trainable_variables`)
        or their value tensors.

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
    ops = []
    for grad, var in zip(grads, variables):
      var = var_ops._as_variable(var)  # pylint: disable=protected-access
      if grad is None:
        continue
      if grad.shape != var.shape:
        raise ValueError(
            f"{type(self).__name__}: gradient {grad.name} has shape {grad.shape} "
            f"but variable {var.name!r} has shape {var.shape}.")
      ops.extend(self.apply_grad(grad, var))
    return ops

  def apply_grad(self, grad: Tensor, var) -> List[Operation]:
    """Returns the assign operations that apply one gradient to one variable.

    Args:
      grad: the gradient, an mtf Tensor of the variable's shape.
      var: an mtf `Variable` operation.

    Example:
      >>> ops = optimizer.apply_grad(grad, graph.trainable_variables[0])
    """
    raise NotImplementedError(f"{type(self).__name__} does not implement apply_grad.")


def _master(t: Tensor, var) -> Tensor:
  """`t` in the variable's master dtype (where updates are computed)."""
  return ew.cast(t, var.master_dtype)


def _slot(var, slot_name: str) -> Tensor:
  """A zero-initialized, non-trainable variable shaped (and laid out) like var."""
  return var_ops.get_variable(
      var.mesh, f"{var.name}/{slot_name}", var.shape, dtype=var.master_dtype,
      initializer=tf.zeros_initializer(), trainable=False)


class SgdOptimizer(Optimizer):
  """Plain gradient descent: `var <- var - lr * grad`.

  Args:
    lr: learning rate, a Python float or a scalar mtf Tensor.

  Example:
    >>> ops = mtf.optimize.SgdOptimizer(0.1).apply_grads(grads, variables)
  """

  def __init__(self, lr: LearningRate):
    self._lr = lr

  @property
  def lr(self) -> LearningRate:
    return self._lr

  def apply_grad(self, grad: Tensor, var) -> List[Operation]:
    value = _master(var.outputs[0], var)
    return [var_ops.assign(var, value - self._lr * _master(grad, var))]


class MomentumOptimizer(Optimizer):
  """Gradient descent with (heavy-ball) momentum.

  With velocity slot `v` (initially zero):
  `v <- momentum * v - lr * grad; var <- var + v`.

  Args:
    lr: learning rate, a Python float or a scalar mtf Tensor.
    momentum: decay of the velocity, e.g. 0.9.

  Example:
    >>> opt = mtf.optimize.MomentumOptimizer(0.1, momentum=0.9)
    >>> ops = opt.apply_grads(grads, variables)
  """

  def __init__(self, lr: LearningRate, momentum: float):
    self._lr = lr
    self._momentum = momentum

  lr = property(lambda self: self._lr)
  momentum = property(lambda self: self._momentum)

  def apply_grad(self, grad: Tensor, var) -> List[Operation]:
    velocity = _slot(var, "momentum")
    new_velocity = velocity * self._momentum - self._lr * _master(grad, var)
    return [var_ops.assign(velocity, new_velocity),
            var_ops.assign(var, _master(var.outputs[0], var) + new_velocity)]


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
    learning_rate: a Python float or a scalar mtf Tensor.
    weight_decay_rate: decoupled weight decay coefficient.
    beta_1: decay of the first-moment estimate.
    beta_2: decay of the second-moment estimate.
    epsilon: added to the denominator.
    exclude_from_weight_decay: regular expressions of variable names that get
      no weight decay, e.g. ["bias", "layer_norm"].

  Example:
    >>> opt = mtf.optimize.AdamWeightDecayOptimizer(
    ...     learning_rate=1e-3, weight_decay_rate=0.01,
    ...     exclude_from_weight_decay=["bias"])
    >>> ops = opt.apply_grads(grads, graph.trainable_variables)
  """

  def __init__(self, learning_rate: LearningRate, weight_decay_rate: float = 0.0,
               beta_1: float = 0.9, beta_2: float = 0.999, epsilon: float = 1e-6,
               exclude_from_weight_decay: Optional[Sequence[str]] = None):
    self.learning_rate = learning_rate
    self.weight_decay_rate = weight_decay_rate
    self.beta_1 = beta_1
    self.beta_2 = beta_2
    self.epsilon = epsilon
    self.exclude_from_weight_decay = list(exclude_from_weight_decay or [])

  def apply_grad(self, grad: Tensor, var) -> List[Operation]:
    grad = _master(grad, var)
    value = _master(var.outputs[0], var)
    m = _slot(var, "adam_m")
    v = _slot(var, "adam_v")
    next_m = self.beta_1 * m + (1.0 - self.beta_1) * grad
    next_v = self.beta_2 * v + (1.0 - self.beta_2) * ew.square(grad)
    update = next_m / (ew.sqrt(next_v) + self.epsilon)
    if self._do_use_weight_decay(var.name):
      update = update + self.weight_decay_rate * value
    return [var_ops.assign(m, next_m),
            var_ops.assign(v, next_v),
            var_ops.assign(var, value - self.learning_rate * update)]

  def _do_use_weight_decay(self, param_name: str) -> bool:
    if not self.weight_decay_rate:
      return False
    return not any(re.search(p, param_name) for p in self.exclude_from_weight_decay)
