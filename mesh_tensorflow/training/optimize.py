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

import re
from typing import List, Optional, Sequence

from mesh_tensorflow.training import learning_rate_schedules as lrs
from mesh_tensorflow.training.adafactor import (  # noqa: F401  (served here)
    AdafactorOptimizer, adafactor_decay_rate_adam, adafactor_decay_rate_pow,
    adafactor_optimizer_from_hparams)
from mesh_tensorflow.training.optimizer_base import (  # noqa: F401  (served here)
    STEP_COUNTER_NAME, Hyperparameter, LearningRate, Optimizer, StepLike,
    _master, _master_value, _one_learning_rate, _slot, _update_target,
    clip_by_global_norm, reduce_rms, step_counter, step_num)
from mesh_tensorflow.core.graph import Operation, Tensor
from mesh_tensorflow.operations import elementwise as ew



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


# ---- multi-schedule optimizers ---------------------------------------------------
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

  Without `step`, each rate is a function of the step that the optimizers
  resolve per update (see `Optimizer.hyperparameter`);
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

  Each variable is updated once.

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
