"""Learning-rate schedules: functions of the training step.

Every schedule takes the step first and returns a value of the same kind:

* an mtf Tensor (any numeric dtype, scalar) gives a float32 scalar mtf Tensor,
  to use inside an mtf graph (e.g. `mtf.optimize.step_counter(mesh)`);
* a TensorFlow tensor or variable gives a float32 TensorFlow scalar;
* a Python or NumPy number gives a Python float (handy for plotting a schedule
  or checking it in a test).

The step counts the updates already applied, so it is 0 for the first one.
Schedules compose by multiplication with `product`; bind their parameters with
`functools.partial` (or a lambda) to pass one to an optimizer, which calls it
with its step:

    >>> import functools
    >>> from mesh_tensorflow import learning_rate_schedules as lrs
    >>> schedule = lrs.product(
    ...     functools.partial(lrs.linear_warmup, warmup_steps=1000),
    ...     functools.partial(lrs.rsqrt_decay, warmup_steps=10000))
    >>> schedule(500)
    0.005
    >>> opt = mtf.optimize.AdafactorOptimizer(learning_rate=schedule)
"""

from __future__ import annotations

import collections.abc
import math
import numbers
from typing import Callable, Union

import numpy as np
import tensorflow as tf

from mesh_tensorflow.core.graph import Tensor
from mesh_tensorflow.operations import constant_ops as constant_ops
from mesh_tensorflow.operations import elementwise as ew
from mesh_tensorflow.core.shapes import Shape

Step = Union[int, float, tf.Tensor, tf.Variable, Tensor]
Value = Union[float, tf.Tensor, Tensor]
Schedule = Callable[[Step], Value]


class _PythonMath:
  """The handful of operations a schedule needs, on Python floats."""

  @staticmethod
  def to_float(x):
    return float(x)

  @staticmethod
  def fill(like, value):
    del like
    return float(value)

  minimum = staticmethod(min)
  maximum = staticmethod(max)
  sqrt = staticmethod(math.sqrt)
  cos = staticmethod(math.cos)
  exp = staticmethod(math.exp)
  log = staticmethod(math.log)


class _TfMath:
  """The same operations on TensorFlow float32 scalars."""

  @staticmethod
  def to_float(x):
    return tf.cast(x, tf.float32)

  @staticmethod
  def fill(like, value):
    del like
    return tf.constant(value, tf.float32)

  minimum = staticmethod(tf.minimum)
  maximum = staticmethod(tf.maximum)
  sqrt = staticmethod(tf.sqrt)
  cos = staticmethod(tf.cos)
  exp = staticmethod(tf.exp)
  log = staticmethod(tf.math.log)


class _MtfMath:
  """The same operations on float32 mtf scalars."""

  @staticmethod
  def to_float(x):
    return ew.cast(x, tf.float32)

  @staticmethod
  def fill(like, value):
    return constant_ops.constant(like.mesh, value, Shape([]), dtype=tf.float32)

  minimum = staticmethod(ew.minimum)
  maximum = staticmethod(ew.maximum)
  sqrt = staticmethod(ew.sqrt)
  cos = staticmethod(ew.cos)
  exp = staticmethod(ew.exp)
  log = staticmethod(ew.log)


def _math_for(step: Step):
  """Picks the arithmetic for `step` and returns it with step as a float."""
  if isinstance(step, Tensor):
    if step.shape.ndims:
      raise ValueError(
          f"Learning-rate schedules take a scalar step; got {step.name} with shape "
          f"{step.shape}.")
    ops = _MtfMath
  elif isinstance(step, (numbers.Number, np.number)) and not isinstance(step, bool):
    ops = _PythonMath
  elif isinstance(step, (tf.Tensor, tf.Variable)):
    ops = _TfMath
  else:
    raise TypeError(
        "A learning-rate schedule's step must be a Python number, a TensorFlow "
        f"scalar or a scalar mtf Tensor; got {step!r}.")
  return ops, ops.to_float(step)


def _check_non_negative(name: str, value: float) -> None:
  if value < 0:
    raise ValueError(f"{name} must be >= 0, got {value}.")


def constant(step: Step, value: float = 1.0) -> Value:
  """The same value at every step (as the step's kind: Python, TF or mtf).

  Args:
    step: the number of updates already applied.
    value: the learning rate.

  Returns:
    `value`, as a Python float, a float32 TF scalar or a float32 mtf scalar.

  Example:
    >>> lrs.constant(123, value=0.1)
    0.1
  """
  ops, s = _math_for(step)
  return ops.fill(s, value)


def linear_warmup(step: Step, warmup_steps: int, initial_value: float = 0.0) -> Value:
  """A factor rising linearly from `initial_value` at step 0 to 1 at
  `warmup_steps`, then 1 for ever. Multiply it with another schedule
  (`product`) to warm that one up.

  Args:
    step: the number of updates already applied.
    warmup_steps: steps until the factor reaches 1; 0 means no warmup.
    initial_value: the factor at step 0.

  Returns:
    min(1, initial_value + (1 - initial_value) * step / warmup_steps).

  Example:
    >>> lrs.linear_warmup(250, warmup_steps=1000)
    0.25
  """
  _check_non_negative("linear_warmup: warmup_steps", warmup_steps)
  ops, s = _math_for(step)
  if warmup_steps == 0:
    return ops.fill(s, 1.0)
  fraction = s * (1.0 / float(warmup_steps))
  return ops.minimum(initial_value + (1.0 - initial_value) * fraction, 1.0)


def rsqrt_decay(step: Step, warmup_steps: int = 10000) -> Value:
  """T5's inverse-square-root schedule: 1 / sqrt(max(step, warmup_steps)).

  Constant at 1/sqrt(warmup_steps) during the first `warmup_steps` steps, then
  decaying as 1/sqrt(step).

  Args:
    step: the number of updates already applied.
    warmup_steps: length of the constant phase; must be positive.

  Returns:
    1 / sqrt(max(step, warmup_steps)).

  Example:
    >>> lrs.rsqrt_decay(40000, warmup_steps=10000)
    0.005
  """
  if warmup_steps <= 0:
    raise ValueError(f"rsqrt_decay: warmup_steps must be positive, got {warmup_steps}.")
  ops, s = _math_for(step)
  return 1.0 / ops.sqrt(ops.maximum(s, float(warmup_steps)))


def cosine_decay(step: Step, total_steps: int, warmup_steps: int = 0,
                 final_value: float = 0.0) -> Value:
  """A factor following half a cosine from 1 down to `final_value`.

  With `warmup_steps`, the factor first rises linearly from 0 to 1 over
  `warmup_steps` steps and the cosine spans the remaining
  `total_steps - warmup_steps` steps. After `total_steps` it stays at
  `final_value`.

  Args:
    step: the number of updates already applied.
    total_steps: the step at which the decay ends (warmup included).
    warmup_steps: linear warmup steps before the decay starts.
    final_value: the factor at and after `total_steps`.

  Returns:
    warmup(step) * (final_value + (1 - final_value) * (1 + cos(pi * p)) / 2)
    with p = clip((step - warmup_steps) / (total_steps - warmup_steps), 0, 1).

  Example:
    >>> lrs.cosine_decay(50, total_steps=100)
    0.5
  """
  _check_non_negative("cosine_decay: warmup_steps", warmup_steps)
  if total_steps <= warmup_steps:
    raise ValueError(
        f"cosine_decay: total_steps ({total_steps}) must exceed warmup_steps "
        f"({warmup_steps}).")
  ops, s = _math_for(step)
  progress = (s - float(warmup_steps)) * (1.0 / float(total_steps - warmup_steps))
  progress = ops.minimum(ops.maximum(progress, 0.0), 1.0)
  cosine = 0.5 * (1.0 + ops.cos(math.pi * progress))
  value = final_value + (1.0 - final_value) * cosine
  if warmup_steps:
    value = value * linear_warmup(step, warmup_steps)
  return value


def linear_decay(step: Step, total_steps: int, offset: int = 0) -> Value:
  """A factor of 1 until step `offset`, then falling linearly to 0 at
  `total_steps` (and 0 after).

  Returns:
    clip((total_steps - step) / (total_steps - offset), 0, 1).

  Example:
    >>> lrs.linear_decay(75, total_steps=100, offset=50)
    0.5
  """
  _check_non_negative("linear_decay: offset", offset)
  if total_steps <= offset:
    raise ValueError(
        f"linear_decay: total_steps ({total_steps}) must exceed offset ({offset}).")
  ops, s = _math_for(step)
  remaining = (float(total_steps) - s) * (1.0 / float(total_steps - offset))
  return ops.minimum(ops.maximum(remaining, 0.0), 1.0)


def product(*factors: Union[float, Schedule]) -> Schedule:
  """A schedule that multiplies numbers and schedules.

  Args:
    *factors: Python numbers (constant factors) and schedules (functions of the
      step, e.g. `functools.partial(rsqrt_decay, warmup_steps=100)`).

  Returns:
    A function of the step returning the product, of the step's kind.

  Example:
    >>> schedule = lrs.product(
    ...     2.0, functools.partial(lrs.linear_warmup, warmup_steps=10),
    ...     functools.partial(lrs.rsqrt_decay, warmup_steps=100))
    >>> schedule(5)
    0.1
  """
  for f in factors:
    if not callable(f) and not isinstance(f, (numbers.Number, np.number)):
      raise TypeError(
          f"product: each factor must be a number or a function of the step, got {f!r}.")

  def schedule(step: Step) -> Value:
    ops, s = _math_for(step)
    result = ops.fill(s, 1.0)
    for f in factors:
      result = result * (f(step) if callable(f) else float(f))
    return result
  return schedule


def product_of_factors(step: Step, total_train_steps, factors, offset=0) -> Value:
  """The product of `factors` at `step`: numbers, and schedules called as
  f(step - offset, total_train_steps - offset) (the transformer library's and
  mtf.optimize's `product_learning_rate`).

  Example:
    >>> product_of_factors(10, 100, [0.5, lambda s, total: s / total])
    0.05
  """
  if isinstance(factors, (str, bytes)) or not isinstance(factors, collections.abc.Sequence):
    raise TypeError(f"product_learning_rate: factors must be a list of numbers and "
                    f"schedules, got {factors!r}.")
  ops, s = _math_for(step)
  s = s - offset
  total = total_train_steps - offset
  result = ops.fill(s, 1.0)
  for f in factors:
    if callable(f):
      result = result * f(s, total)
    elif isinstance(f, (numbers.Number, np.number)) and not isinstance(f, bool):
      result = result * float(f)
    else:
      raise TypeError(f"product_learning_rate: factor {f!r} is neither a number nor a "
                      "schedule.")
  return result

from mesh_tensorflow.core import autograph_exempt as _autograph_exempt  # noqa: E402  pylint: disable=g-import-not-at-top
_autograph_exempt.exempt(globals())  # AutoGraph leaves this module's code alone
