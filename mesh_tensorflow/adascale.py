"""AdaScale (Johnson et al., 2020): learning-rate adaptation for large batches.

Training with a batch S times larger than a base batch, AdaScale multiplies
the learning rate by the *gain ratio*

    r = (sigma^2 + mu^2) / (sigma^2 / S + mu^2),      1 <= r <= S,

where mu^2 = |E g|^2 is the squared norm of the true gradient and sigma^2 =
E|g - E g|^2 the variance (trace of the covariance) of a base-batch gradient
g. With little noise (sigma^2 << mu^2) r is near 1: a bigger batch buys
nothing; with much noise r approaches S: the bigger batch is worth S base
steps. The learning-rate schedule is evaluated at the *effective progress*
tau, which advances by r per update (instead of 1), so a run with scale S
reaches the end of its schedule in about 1/r as many updates.

Method. The S gradient samples are the gradients of the S micro-batches that
make up one update (Trainer `grad_accum_steps = S`; on a data-parallel mesh
each micro-batch is itself split over the replicas, so the base batch is one
micro-batch and an update sees S of them). With samples g_1..g_S of mean G:

    sigma^2_hat = S / (S - 1) * (mean_i |g_i|^2 - |G|^2)     (unbiased)
    mu^2_hat    = |G|^2 - sigma^2_hat / S                     (unbiased)

Each micro-batch adds |g_i|^2 (one scalar allreduce) to a checkpointed
accumulator; the update step adds the last sample and reads |G|^2 from the
averaged gradient. Both estimates are clipped at 0 and smoothed by
exponential moving averages with decay `smoothing` (bias-corrected, so the
first update uses the raw estimates). S = 1 gives r = 1 exactly (no variance
can be estimated from one sample, and none matters).

    >>> opt = mtf.adascale.AdaScale(mtf.optimize.MomentumOptimizer(0.1, 0.9), scale=4)
    >>> trainer = mtf.training.Trainer(model_fn, shapes, impl, opt, grad_accum_steps=4)
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import tensorflow as tf

from mesh_tensorflow.graph import Mesh, Operation, Tensor
from mesh_tensorflow.ops import elementwise as ew
from mesh_tensorflow.ops import reduction
from mesh_tensorflow.ops import variables as var_ops
from mesh_tensorflow.optimize import Optimizer
from mesh_tensorflow.shapes import Shape


def squared_norm(grads: Sequence[Optional[Tensor]]) -> Tensor:
  """Sum of squares of all elements of all gradients, a float32 mtf scalar.

  Example:
    >>> mtf.adascale.squared_norm(grads)
  """
  present = [g for g in grads if g is not None]
  if not present:
    raise ValueError("squared_norm: every gradient is None.")
  terms = [reduction.reduce_sum(ew.square(ew.cast(g, tf.float32))) for g in present]
  return ew.add_n(terms) if len(terms) > 1 else terms[0]


def gain_ratio(sigma2, mu2, scale: float, epsilon: float = 1e-30):
  """r = (sigma2 + mu2) / (sigma2 / scale + mu2) (mtf scalars or numbers).

  Example:
    >>> mtf.adascale.gain_ratio(3.0, 1.0, scale=4)
    2.2857142857142856
  """
  return (sigma2 + mu2 + epsilon) / (sigma2 * (1.0 / scale) + mu2 + epsilon)


class AdaScale(Optimizer):
  """Wraps an optimizer: its learning rate is multiplied by the gain ratio and
  its schedule follows the effective progress (see the module docstring).

  State (non-trainable, checkpointed, replicated scalars): `adascale/sample_sq_sum`
  (sum of |g_i|^2 of the micro-batches so far), `adascale/sigma2`,
  `adascale/mu2`, `adascale/weight` (the moving averages and their bias
  correction) and `adascale/progress` (tau). `mtf.scalar_summary` reports
  `adascale/gain`, `adascale/sigma2`, `adascale/mu2` and `adascale/progress`.

  Args:
    base_optimizer: an `mtf.optimize.Optimizer`, e.g. SGD or momentum.
    scale: S, the number of base-batch gradient samples per update.
    smoothing: decay of the moving averages of sigma^2 and mu^2, in [0, 1).

  Example:
    >>> opt = mtf.adascale.AdaScale(mtf.optimize.SgdOptimizer(0.1), scale=4)
  """

  def __init__(self, base_optimizer: Optimizer, scale: int, smoothing: float = 0.9):
    super().__init__()
    if not isinstance(base_optimizer, Optimizer):
      raise TypeError(f"AdaScale: base_optimizer must be an mtf Optimizer, got "
                      f"{base_optimizer!r}.")
    if int(scale) != scale or scale < 1:
      raise ValueError(f"AdaScale: scale must be a positive integer, got {scale!r}.")
    if not 0.0 <= smoothing < 1.0:
      raise ValueError(f"AdaScale: smoothing must be in [0, 1), got {smoothing}.")
    self.base_optimizer = base_optimizer
    self.scale = int(scale)
    self.smoothing = float(smoothing)

  @staticmethod
  def _state(mesh: Mesh, name: str) -> Tensor:
    return var_ops.get_variable(mesh, f"adascale/{name}", Shape([]), dtype=tf.float32,
                                initializer=tf.zeros_initializer(), trainable=False)

  def sample_ops(self, grads: Sequence[Optional[Tensor]]) -> List[Operation]:
    """Records one micro-batch's gradients (all samples but the last).

    Example:
      >>> ops = opt.sample_ops(micro_batch_grads)
    """
    if self.scale == 1:
      return []
    mesh = next(g for g in grads if g is not None).mesh
    total = self._state(mesh, "sample_sq_sum")
    return [var_ops.assign(total, total + squared_norm(grads))]

  def gain(self, mean_grads: Sequence[Optional[Tensor]],
           last_sample: Optional[Sequence[Optional[Tensor]]] = None,
           apply_if: Optional[Tensor] = None):
    """(gain ratio r, state update ops) for the update with mean gradient
    `mean_grads`, the other samples having gone through `sample_ops`. Where
    `apply_if` is false (a skipped step) the moving averages keep their values.

    Example:
      >>> r, ops = opt.gain(mean_grads, last_sample=grads)
    """
    mesh = next(g for g in mean_grads if g is not None).mesh
    if self.scale == 1:
      return 1.0, []
    if last_sample is None:
      raise ValueError("AdaScale: with scale > 1, pass last_sample (the last "
                       "micro-batch's gradients) to apply_grads.")
    s = float(self.scale)
    sample_sum = self._state(mesh, "sample_sq_sum")
    mean_sq = squared_norm(mean_grads)
    samples_mean_sq = (sample_sum + squared_norm(last_sample)) * (1.0 / s)
    sigma2 = ew.maximum((samples_mean_sq - mean_sq) * (s / (s - 1.0)), 0.0)
    mu2 = ew.maximum(mean_sq - sigma2 * (1.0 / s), 0.0)
    decay = self.smoothing
    avg_sigma2, avg_mu2 = self._state(mesh, "sigma2"), self._state(mesh, "mu2")
    weight = self._state(mesh, "weight")
    new_sigma2 = avg_sigma2 * decay + sigma2 * (1.0 - decay)
    new_mu2 = avg_mu2 * decay + mu2 * (1.0 - decay)
    new_weight = weight * decay + (1.0 - decay)
    if apply_if is not None:  # non-finite samples must not reach the averages
      new_sigma2 = ew.where(apply_if, new_sigma2, avg_sigma2)
      new_mu2 = ew.where(apply_if, new_mu2, avg_mu2)
      new_weight = ew.where(apply_if, new_weight, weight)
    correction = 1.0 / ew.maximum(new_weight, 1e-30)  # 0 / 0 before any kept sample
    r = gain_ratio(new_sigma2 * correction, new_mu2 * correction, s)
    from mesh_tensorflow.training import scalar_summary
    scalar_summary("adascale/gain", r)
    scalar_summary("adascale/sigma2", new_sigma2 * correction)
    scalar_summary("adascale/mu2", new_mu2 * correction)
    ops = [var_ops.assign(avg_sigma2, new_sigma2), var_ops.assign(avg_mu2, new_mu2),
           var_ops.assign(weight, new_weight),
           var_ops.assign(sample_sum, ew.zeros_like_fn(sample_sum))]
    return r, ops

  def apply_grads(self, grads, variables, step=None, apply_if=None, lr_multiplier=None,
                  last_sample=None) -> List[Operation]:
    """Applies the mean gradient of S samples with the base optimizer at
    learning rate x r, its schedule at the effective progress.

    Args:
      grads: the mean of the S sample gradients, one per variable.
      variables: the variables.
      step: unused for the schedule (the effective progress replaces it).
      apply_if: see `Optimizer.apply_grads`; a skipped step leaves the
        progress unchanged.
      lr_multiplier: an extra learning-rate factor.
      last_sample: the gradients of the last micro-batch (required for S > 1).

    Example:
      >>> ops = opt.apply_grads(mean_grads, variables, last_sample=grads)
    """
    del step
    grads = list(grads)
    present = [g for g in grads if g is not None]
    if not present:
      return []
    mesh = present[0].mesh
    r, ops = self.gain(grads, last_sample, apply_if)
    progress = self._state(mesh, "progress")
    multiplier = r if lr_multiplier is None else r * lr_multiplier
    ops += self.base_optimizer.apply_grads(grads, variables, step=progress,
                                           apply_if=apply_if, lr_multiplier=multiplier)
    advance = r if apply_if is None else ew.cast(apply_if, tf.float32) * r
    ops.append(var_ops.assign(progress, progress + advance))
    if isinstance(r, Tensor):
      from mesh_tensorflow.training import scalar_summary
      scalar_summary("adascale/progress", progress)
    return ops
