"""Learning-rate schedules for `utils.run`, configurable with gin.

Each schedule is a function of the step (the updates applied so far) whose
other arguments gin binds, so a gin file picks one and sets its parameters:

    run.learning_rate_schedule = @learning_rate_schedules.cosine_with_warmup
    cosine_with_warmup.peak = 0.003
    cosine_with_warmup.warmup_steps = 50

They are built from `mesh_tensorflow.training.learning_rate_schedules`, so a step may
be a Python number (handy for checks), a TensorFlow scalar or an mtf scalar:

    >>> cosine_with_warmup(0, peak=0.01, warmup_steps=10, total_steps=110)
    0.0
    >>> cosine_with_warmup(60, peak=0.01, warmup_steps=10, total_steps=110,
    ...                    final_fraction=0.0)
    0.005

The schedules below take the step and the total number of training steps,
`fn(step, total_train_steps, ...)`, with the original's names and defaults
(`product_learning_rate`, `constant`, `constant_learning_rate`, `linear_decay`,
`linear_warmup`, `truncated_rsqrt`, `slanted_triangular`,
`learning_rate_schedule_noam`, `linear_decay_learning_rate`), so their gin
bindings port unchanged; `utils.run` passes its `train_steps` as
`total_train_steps` (see `bind_total_train_steps`):

    run.learning_rate_schedule = @learning_rate_schedules.product_learning_rate
    product_learning_rate.factors = [
        @learning_rate_schedules.linear_warmup, @learning_rate_schedules.linear_decay]
    linear_warmup.steps_or_fraction = 1000
"""

from __future__ import annotations

import inspect
import math
import numbers
from typing import Callable, Optional, Sequence, Union

import gin
import numpy as np
import tensorflow as tf

from mesh_tensorflow.training import learning_rate_schedules as lrs
from mesh_tensorflow.training.learning_rate_schedules import _math_for  # the step's arithmetic

_MODULE = "learning_rate_schedules"


@gin.configurable(module=_MODULE)
def constant_with_warmup(step: lrs.Step, value: float = 0.001,
                         warmup_steps: int = 0) -> lrs.Value:
  """`value`, reached linearly from 0 over `warmup_steps`.

  Example:
    >>> constant_with_warmup(5, value=0.1, warmup_steps=10)
    0.05
  """
  return value * lrs.linear_warmup(step, warmup_steps)


@gin.configurable(module=_MODULE)
def rsqrt_with_warmup(step: lrs.Step, warmup_steps: int = 10000,
                      scale: float = 1.0, linear_warmup_steps: int = 0) -> lrs.Value:
  """T5's schedule: scale / sqrt(max(step, warmup_steps)), optionally ramped
  up linearly over `linear_warmup_steps`.

  Example:
    >>> rsqrt_with_warmup(40000, warmup_steps=10000)
    0.005
  """
  return (scale * lrs.rsqrt_decay(step, warmup_steps)
          * lrs.linear_warmup(step, linear_warmup_steps))


@gin.configurable(module=_MODULE)
def cosine_with_warmup(step: lrs.Step, peak: float = 0.001, warmup_steps: int = 100,
                       total_steps: int = 10000, final_fraction: float = 0.1) -> lrs.Value:
  """Linear warmup to `peak`, then half a cosine down to peak * final_fraction
  at `total_steps`.

  Example:
    >>> cosine_with_warmup(10, peak=0.01, warmup_steps=10, total_steps=110)
    0.01
  """
  return peak * lrs.cosine_decay(step, total_steps, warmup_steps, final_fraction)


@gin.configurable(module=_MODULE)
def noam(step: lrs.Step, d_model: int = 512, warmup_steps: int = 4000,
         multiplier: float = 1.0) -> lrs.Value:
  """The schedule of "Attention Is All You Need": multiplier / sqrt(d_model)
  times min(step / warmup^1.5, 1 / sqrt(step)) (linear rise, rsqrt decay).

  Example:
    >>> round(noam(4000, d_model=512, warmup_steps=4000), 6)
    0.000699
  """
  return (multiplier * d_model ** -0.5 * lrs.linear_warmup(step, warmup_steps)
          * lrs.rsqrt_decay(step, warmup_steps))


@gin.configurable(module=_MODULE)
def linear_decay_learning_rate(step: lrs.Step, total_train_steps: int,
                               initial_lr: float = 0.1, offset: int = 0) -> lrs.Value:
  """`initial_lr` until step `offset`, then linearly down to 0 at
  `total_train_steps` (a fine-tuning schedule). The result is a TensorFlow
  scalar even for a Python step (an mtf scalar for an mtf step).

  Example:
    >>> float(linear_decay_learning_rate(50, total_train_steps=100, initial_lr=0.001))
    0.0005
  """
  if isinstance(step, (int, float)):
    step = tf.constant(step, tf.float32)
  return initial_lr * lrs.linear_decay(step, total_train_steps, offset)


def bind_total_train_steps(schedule: Optional[Callable], train_steps: int) -> Optional[Callable]:
  """`schedule` as a function of the step alone: a schedule that takes
  `total_train_steps` gets `train_steps` for it.

  Example:
    >>> lr = bind_total_train_steps(linear_decay, 100)
    >>> lr(95)
    0.5
  """
  if not callable(schedule):
    return schedule
  try:
    parameters = inspect.signature(schedule).parameters
  except (TypeError, ValueError):  # a builtin or C function: no signature
    return schedule
  if "total_train_steps" not in parameters:
    return schedule
  return lambda step: schedule(step, total_train_steps=train_steps)


# ------------------------------------------- (step, total_train_steps) schedules
Number = Union[int, float]


def _steps_from(steps_or_fraction: Number, total_train_steps: Number, fn_name: str) -> float:
  """A number of steps: steps_or_fraction itself if above 1, else that
  fraction of total_train_steps."""
  steps = (steps_or_fraction * total_train_steps if steps_or_fraction <= 1
           else steps_or_fraction)
  if steps <= 0:
    raise ValueError(
        f"{fn_name}: steps_or_fraction={steps_or_fraction} with total_train_steps="
        f"{total_train_steps} gives {steps} steps; it must give a positive number.")
  return float(steps)


def _constant_value(step: lrs.Step, value, fn_name: str) -> lrs.Value:
  if isinstance(value, (numbers.Number, np.number)) and not isinstance(value, bool):
    return lrs.constant(step, float(value))
  if isinstance(value, (tf.Tensor, tf.Variable)):
    return tf.cast(value, tf.float32)
  raise TypeError(f"{fn_name}: the learning rate must be a number or a TensorFlow "
                  f"scalar, got {value!r}.")


@gin.configurable(module=_MODULE)
def product_learning_rate(step: lrs.Step, total_train_steps: Number,
                          factors: Sequence[Union[Number, Callable]] = gin.REQUIRED,
                          offset: Number = 0) -> lrs.Value:
  """The product of `factors`: numbers, and schedules called as
  f(step - offset, total_train_steps - offset).

  Example:
    >>> product_learning_rate(50, 100, factors=[0.1, linear_decay], offset=0)
    0.1
  """
  return lrs.product_of_factors(step, total_train_steps, factors, offset=offset)


@gin.configurable(module=_MODULE)
def constant(step: lrs.Step, total_train_steps: Number, value=1.0) -> lrs.Value:
  """`value` at every step (a factor for `product_learning_rate`).

  Example:
    >>> constant(7, 100, value=0.5)
    0.5
  """
  del total_train_steps
  return _constant_value(step, value, "constant")


@gin.configurable(module=_MODULE)
def constant_learning_rate(step: lrs.Step, total_train_steps: Number,
                           learning_rate=gin.REQUIRED) -> lrs.Value:
  """`learning_rate` at every step (the original's other name for `constant`).

  Example:
    >>> constant_learning_rate(7, 100, learning_rate=0.01)
    0.01
  """
  del total_train_steps
  return _constant_value(step, learning_rate, "constant_learning_rate")


@gin.configurable(module=_MODULE)
def linear_decay(step: lrs.Step, total_train_steps: Number,
                 steps_or_fraction: Number = 0.1) -> lrs.Value:
  """A factor of 1, falling linearly to 0 over the last steps of training:
  min(1, (total_train_steps - step) / decay_steps), decay_steps being
  steps_or_fraction if above 1, else that fraction of total_train_steps.

  Example:
    >>> linear_decay(95, 100, steps_or_fraction=0.1)
    0.5
  """
  decay_steps = _steps_from(steps_or_fraction, total_train_steps, "linear_decay")
  ops, s = _math_for(step)
  return ops.minimum((float(total_train_steps) - s) * (1.0 / decay_steps), 1.0)


@gin.configurable(module=_MODULE)
def linear_warmup(step: lrs.Step, total_train_steps: Number,
                  steps_or_fraction: Number = 10000) -> lrs.Value:
  """A factor rising linearly from 0 to 1 over the first warmup steps, then 1:
  min(1, step / warmup_steps), warmup_steps being steps_or_fraction if above
  1, else that fraction of total_train_steps.

  Example:
    >>> linear_warmup(250, 10000, steps_or_fraction=1000)
    0.25
  """
  warmup_steps = _steps_from(steps_or_fraction, total_train_steps, "linear_warmup")
  return lrs.linear_warmup(step, warmup_steps)


@gin.configurable(module=_MODULE)
def truncated_rsqrt(step: lrs.Step, total_train_steps: Number,
                    warmup_steps: Number = 10000) -> lrs.Value:
  """1 / sqrt(max(step, warmup_steps)).

  Example:
    >>> truncated_rsqrt(40000, 100000, warmup_steps=10000)
    0.005
  """
  del total_train_steps
  return lrs.rsqrt_decay(step, warmup_steps)


@gin.configurable(module=_MODULE)
def learning_rate_schedule_noam(step: lrs.Step, total_train_steps: Number,
                                warmup_steps: Number = 10000,
                                linear_decay_fraction: float = 0.1,
                                multiplier: float = 1.0, offset: Number = 0) -> lrs.Value:
  """multiplier / sqrt(max(s, warmup_steps)), times (if linear_decay_fraction
  > 0) min(1, (n - s) / (n * linear_decay_fraction)), where s = step - offset
  and n = total_train_steps - offset.

  Example:
    >>> learning_rate_schedule_noam(25, 100, warmup_steps=25)
    0.2
  """
  ops, s = _math_for(step)
  s = s - offset
  train_steps = float(total_train_steps) - offset
  learning_rate = multiplier * lrs.rsqrt_decay(s, warmup_steps)
  if linear_decay_fraction > 0:
    remaining = (train_steps - s) * (1.0 / (train_steps * linear_decay_fraction))
    learning_rate = learning_rate * ops.minimum(remaining, 1.0)
  return learning_rate


@gin.configurable(module=_MODULE)
def slanted_triangular(step: lrs.Step, total_train_steps: Number, cut_fraction: float = 0.1,
                       ratio: float = 32, max_learning_rate: float = 0.01,
                       start_step: Number = 0) -> lrs.Value:
  """ULMFiT's schedule (arXiv:1801.06146): from max_learning_rate / ratio up
  linearly to max_learning_rate over the first cut = floor(cut_fraction *
  total_train_steps) steps after `start_step`, then linearly back down over
  the rest.

  Example:
    >>> slanted_triangular(10, 100, cut_fraction=0.1, ratio=32, max_learning_rate=0.032)
    0.032
  """
  if not 0 < cut_fraction < 1:
    raise ValueError(f"slanted_triangular: cut_fraction must be in (0, 1), got {cut_fraction}.")
  cut = math.floor(float(total_train_steps) * cut_fraction)
  if cut < 1:
    raise ValueError(
        f"slanted_triangular: cut_fraction * total_train_steps = {cut_fraction} * "
        f"{total_train_steps} is below one step.")
  ops, s = _math_for(step)
  s = s - float(start_step)
  rising = s * (1.0 / cut)
  falling = 1.0 - (s - cut) * (1.0 / (cut * (1.0 / cut_fraction - 1.0)))
  p = ops.minimum(rising, falling)  # rising below 1 before the cut, falling after
  return max_learning_rate * (1.0 + p * (ratio - 1.0)) * (1.0 / ratio)
