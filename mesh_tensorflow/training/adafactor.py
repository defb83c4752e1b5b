"""Adafactor (Shazeer and Stern, 2018): Adam-like updates whose second-moment
statistics of a matrix are factored into row and column means, with a
relative step size and update clipping; its decay-rate schedules and the
tensor2tensor-style hyperparameter constructor. Served as
`mtf.optimize.AdafactorOptimizer` etc.

    >>> opt = AdafactorOptimizer(learning_rate=0.01)
"""
from __future__ import annotations

import math
from typing import List, Optional, Sequence, Tuple

from mesh_tensorflow.training import learning_rate_schedules as lrs
from mesh_tensorflow.training.optimizer_base import (
    Hyperparameter, Optimizer, _master, _master_value, _slot, reduce_rms)
from mesh_tensorflow.core.graph import Operation, Tensor
from mesh_tensorflow.operations import elementwise as ew
from mesh_tensorflow.operations import reduction
from mesh_tensorflow.operations import variables as var_ops
from mesh_tensorflow.core.shapes import Dimension, Shape



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


from mesh_tensorflow.core import autograph_exempt as _autograph_exempt  # noqa: E402  pylint: disable=g-import-not-at-top
_autograph_exempt.exempt(globals())  # AutoGraph leaves this module's code alone
