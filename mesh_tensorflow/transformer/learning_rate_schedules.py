"""Learning-rate schedules for `utils.run`, configurable with gin.

Each schedule is a function of the step (the updates applied so far) whose
other arguments gin binds, so a gin file picks one and sets its parameters:

    run.learning_rate_schedule = @learning_rate_schedules.cosine_with_warmup
    cosine_with_warmup.peak = 0.003
    cosine_with_warmup.warmup_steps = 50

They are built from `mesh_tensorflow.learning_rate_schedules`, so a step may
be a Python number (handy for checks), a TensorFlow scalar or an mtf scalar:

    >>> cosine_with_warmup(0, peak=0.01, warmup_steps=10, total_steps=110)
    0.0
    >>> cosine_with_warmup(60, peak=0.01, warmup_steps=10, total_steps=110,
    ...                    final_fraction=0.0)
    0.005
"""

from __future__ import annotations

import gin
import tensorflow as tf

from mesh_tensorflow import learning_rate_schedules as lrs

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
  `total_train_steps` (the original Mesh TensorFlow's fine-tuning schedule).
  As in the original, the result is a TensorFlow scalar even for a Python
  step (an mtf scalar for an mtf step).

  Example:
    >>> float(linear_decay_learning_rate(50, total_train_steps=100, initial_lr=0.001))
    0.0005
  """
  if isinstance(step, (int, float)):
    step = tf.constant(step, tf.float32)
  return initial_lr * lrs.linear_decay(step, total_train_steps, offset)
