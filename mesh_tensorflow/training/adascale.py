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

Gradient samples. AdaScale needs S gradients g_1..g_S of base batches per
update; it takes them from one of two places (`samples=`):

* "replicas" (the default when the layout splits "batch" over a mesh
  dimension of size R > 1 and the Trainer has grad_accum_steps == 1): the
  base batch is one replica's local batch and S = R. The per-replica
  gradients are the partial sums of the pending data-parallel allreduce of
  each weight gradient (`mtf.replica_stats.replica_squared_norm`): each
  processor squares and sums its partial slice, one scalar allreduce gives
  mean_r |g_r|^2 with g_r = R * partial_r. No micro-batching, no extra
  gradient memory, one scalar collective per weight.
* "microbatches" (the default with grad_accum_steps = S > 1): the samples are
  the gradients of the S micro-batches of one update. Each micro-batch adds
  |g_i|^2 (one scalar allreduce) to a checkpointed accumulator; the update
  step adds the last sample.

With samples g_1..g_S of mean G (the averaged gradient that is applied):

    sigma^2_hat = S / (S - 1) * (mean_i |g_i|^2 - |G|^2)     (unbiased)
    mu^2_hat    = |G|^2 - sigma^2_hat / S                     (unbiased)

Both estimates are clipped at 0 and smoothed by exponential moving averages
with decay `smoothing` (bias-corrected, so the first update uses the raw
estimates). S = 1 (one replica, no micro-batching) gives r = 1 exactly.

    >>> opt = mtf.adascale.AdaScale(mtf.optimize.MomentumOptimizer(0.1, 0.9))
    >>> trainer = mtf.training.Trainer(model_fn, shapes, impl, opt)  # "batch:rows"
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import tensorflow as tf

from mesh_tensorflow.core.graph import Mesh, Operation, Tensor
from mesh_tensorflow.operations import elementwise as ew
from mesh_tensorflow.operations import reduction
from mesh_tensorflow.operations import variables as var_ops
from mesh_tensorflow.training.optimize import Optimizer
from mesh_tensorflow.core.shapes import Shape


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


SAMPLES = ("replicas", "microbatches")


class AdaScale(Optimizer):
  """Wraps an optimizer: its learning rate is multiplied by the gain ratio and
  its schedule follows the effective progress (see the module docstring).

  State (non-trainable, checkpointed, replicated scalars): `adascale/sample_sq_sum`
  (micro-batch samples: sum of |g_i|^2 so far), `adascale/sigma2`,
  `adascale/mu2`, `adascale/weight` (the moving averages and their bias
  correction) and `adascale/progress` (tau). `mtf.scalar_summary` reports
  `adascale/gain`, `adascale/sigma2`, `adascale/mu2`, `adascale/sample_sq_mean`
  (mean_i |g_i|^2 of this update's samples) and `adascale/progress`.

  `mtf.training.Trainer` calls `configure(mesh_impl, grad_accum_steps)`,
  which settles `samples` and `scale`; without a Trainer, call it yourself.

  Args:
    base_optimizer: an `mtf.optimize.Optimizer`, e.g. SGD or momentum.
    scale: S, the number of base-batch gradient samples per update. None: the
      data-parallel replica count (samples "replicas") or grad_accum_steps.
    smoothing: decay of the moving averages of sigma^2 and mu^2, in [0, 1).
    samples: "replicas", "microbatches" or None (choose: "replicas" when the
      data-parallel mesh dimension has size > 1, grad_accum_steps is 1 and
      scale is None or equals that size; else "microbatches").
    mesh_dim: the data-parallel mesh dimension (default: the one the layout
      splits "batch" over).

  Example:
    >>> opt = mtf.adascale.AdaScale(mtf.optimize.SgdOptimizer(0.1))
    >>> opt.configure(impl)  # "all:8" with "batch:all": samples "replicas", scale 8
  """

  def __init__(self, base_optimizer: Optimizer, scale: Optional[int] = None,
               smoothing: float = 0.9, samples: Optional[str] = None,
               mesh_dim: Optional[str] = None):
    super().__init__()
    if not isinstance(base_optimizer, Optimizer):
      raise TypeError(f"AdaScale: base_optimizer must be an mtf Optimizer, got "
                      f"{base_optimizer!r}.")
    if scale is not None and (int(scale) != scale or scale < 1):
      raise ValueError(f"AdaScale: scale must be a positive integer, got {scale!r}.")
    if not 0.0 <= smoothing < 1.0:
      raise ValueError(f"AdaScale: smoothing must be in [0, 1), got {smoothing}.")
    if samples is not None and samples not in SAMPLES:
      raise ValueError(f"AdaScale: samples must be one of {SAMPLES} or None, got "
                       f"{samples!r}.")
    self.base_optimizer = base_optimizer
    self.requested_scale = None if scale is None else int(scale)
    self.requested_samples = samples
    self.smoothing = float(smoothing)
    self.mesh_dim = mesh_dim
    # Settled by configure(); before it, an explicit microbatch setup works.
    self.scale = self.requested_scale
    self.samples = ("microbatches" if samples == "microbatches"
                    or (samples is None and scale is not None) else None)
    self.replica_mesh_dim = None

  def configure(self, mesh_impl, grad_accum_steps: int = 1) -> None:
    """Settles `samples`, `scale` and `mesh_dim` for training on `mesh_impl`
    with `grad_accum_steps` micro-batches per update.

    Raises:
      ValueError: if the requested scale or samples do not fit the setup.

    Example:
      >>> opt.configure(impl)  # PlacementMeshImpl("all:8", "batch:all", devices)
      >>> opt.samples, opt.scale
      ('replicas', 8)
    """
    scale, samples = self.requested_scale, self.requested_samples
    mesh_dim = self.mesh_dim or mesh_impl.layout_rules.mesh_dimension_name("batch")
    names = mesh_impl.shape.dimension_names
    if self.mesh_dim is not None and self.mesh_dim not in names:
      raise ValueError(f"AdaScale: mesh_dim {self.mesh_dim!r} is not in the mesh "
                       f"'{mesh_impl.shape.to_string()}'; pass one of {names}.")
    replicas = mesh_impl.shape.dims[names.index(mesh_dim)].size if mesh_dim else 1
    if samples is None:
      auto_replicas = (grad_accum_steps == 1 and replicas > 1
                       and scale in (None, replicas))
      samples = "replicas" if auto_replicas else "microbatches"
    if samples == "replicas":
      if grad_accum_steps != 1:
        raise ValueError(
            f"AdaScale: samples='replicas' takes its samples from one step's replicas, "
            f"but grad_accum_steps={grad_accum_steps}. Use grad_accum_steps=1, or "
            "samples='microbatches' with scale=grad_accum_steps.")
      if mesh_dim is None:
        raise ValueError(
            f"AdaScale: samples='replicas' needs a data-parallel mesh dimension, but "
            f"the layout '{mesh_impl.layout_rules.to_string()}' does not split 'batch'. "
            "Pass mesh_dim (e.g. 'rows'), or use samples='microbatches'.")
      if scale is not None and scale != replicas:
        raise ValueError(
            f"AdaScale: scale={scale}, but samples='replicas' on mesh dimension "
            f"{mesh_dim!r} gives {replicas} samples. Leave scale=None (or {replicas}).")
      scale = replicas
    else:
      scale = grad_accum_steps if scale is None else scale
      if scale != grad_accum_steps:
        raise ValueError(
            f"Trainer: the AdaScale optimizer has scale={scale}, but grad_accum_steps="
            f"{grad_accum_steps}; its gradient samples are the micro-batches, so set "
            "grad_accum_steps to its scale (or, with grad_accum_steps=1 on a "
            f"data-parallel mesh, leave scale=None to sample the replicas).")
    self.samples, self.scale, self.replica_mesh_dim = samples, scale, mesh_dim

  @staticmethod
  def _state(mesh: Mesh, name: str) -> Tensor:
    return var_ops.get_variable(mesh, f"adascale/{name}", Shape([]), dtype=tf.float32,
                                initializer=tf.zeros_initializer(), trainable=False)

  def _check_configured(self) -> None:
    if self.samples is None or self.scale is None:
      raise ValueError(
          "AdaScale: samples and scale are not settled yet; call "
          "opt.configure(mesh_impl, grad_accum_steps) (mtf.training.Trainer does) or "
          "pass scale= with samples='microbatches'.")

  def replica_sample(self, grads: Sequence[Optional[Tensor]],
                     loss_scale=None) -> Optional[Tensor]:
    """mean_r |g_r|^2 over the data-parallel replicas (samples "replicas"),
    from the raw gradients of `mtf.gradients` (their allreduce still pending);
    None with one replica (the gain is then 1 and needs no sample).

    Args:
      grads: the gradients, as `mtf.gradients` returned them.
      loss_scale: the `DynamicLossScale` the loss was multiplied by, if any.

    Example:
      >>> sq = opt.replica_sample(mtf.gradients([loss], weights))
    """
    self._check_configured()
    if self.scale == 1:
      return None
    from mesh_tensorflow.operations.replica_stats import replica_squared_norm
    present = [g for g in grads if g is not None]
    if not present:
      raise ValueError("AdaScale.replica_sample: every gradient is None.")
    total = replica_squared_norm(present, self.replica_mesh_dim)
    if loss_scale is not None:
      inverse = 1.0 / loss_scale.scale(present[0].mesh)
      total = total * ew.cast(inverse * inverse, tf.float32)
    return total

  def sample_ops(self, grads: Sequence[Optional[Tensor]]) -> List[Operation]:
    """Records one micro-batch's gradients (all samples but the last).

    Example:
      >>> ops = opt.sample_ops(micro_batch_grads)
    """
    self._check_configured()
    if self.scale == 1 or self.samples != "microbatches":
      return []
    mesh = next(g for g in grads if g is not None).mesh
    total = self._state(mesh, "sample_sq_sum")
    return [var_ops.assign(total, total + squared_norm(grads))]

  def gain(self, mean_grads: Sequence[Optional[Tensor]],
           last_sample: Optional[Sequence[Optional[Tensor]]] = None,
           apply_if: Optional[Tensor] = None, replica_sample: Optional[Tensor] = None):
    """(gain ratio r, state update ops) for the update with mean gradient
    `mean_grads`. Samples "microbatches": the other samples went through
    `sample_ops`, `last_sample` is the last one. Samples "replicas":
    `replica_sample` is mean_r |g_r|^2 (default: computed from `mean_grads`,
    which must then be raw gradients). Where `apply_if` is false (a skipped
    step) the moving averages keep their values.

    Example:
      >>> r, ops = opt.gain(mean_grads, last_sample=grads)
    """
    self._check_configured()
    mesh = next(g for g in mean_grads if g is not None).mesh
    if self.scale == 1:
      return 1.0, []
    s = float(self.scale)
    mean_sq = squared_norm(mean_grads)
    reset = []
    if self.samples == "replicas":
      if replica_sample is None:
        replica_sample = self.replica_sample(mean_grads)
      samples_mean_sq = replica_sample
    else:
      if last_sample is None:
        raise ValueError("AdaScale: with scale > 1, pass last_sample (the last "
                         "micro-batch's gradients) to apply_grads.")
      sample_sum = self._state(mesh, "sample_sq_sum")
      samples_mean_sq = (sample_sum + squared_norm(last_sample)) * (1.0 / s)
      reset = [var_ops.assign(sample_sum, ew.zeros_like_fn(sample_sum))]
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
    from mesh_tensorflow.training.trainer import scalar_summary
    scalar_summary("adascale/gain", r)
    scalar_summary("adascale/sigma2", new_sigma2 * correction)
    scalar_summary("adascale/mu2", new_mu2 * correction)
    scalar_summary("adascale/sample_sq_mean", samples_mean_sq)
    ops = [var_ops.assign(avg_sigma2, new_sigma2), var_ops.assign(avg_mu2, new_mu2),
           var_ops.assign(weight, new_weight)] + reset
    return r, ops

  def apply_grads(self, grads, variables, step=None, apply_if=None, lr_multiplier=None,
                  last_sample=None, replica_sample=None) -> List[Operation]:
    """Applies the mean gradient of S samples with the base optimizer at
    learning rate x r, its schedule at the effective progress.

    Args:
      grads: the mean of the S sample gradients, one per variable.
      variables: the variables.
      step: unused for the schedule (the effective progress replaces it).
      apply_if: see `Optimizer.apply_grads`; a skipped step leaves the
        progress unchanged.
      lr_multiplier: an extra learning-rate factor.
      last_sample: samples "microbatches": the gradients of the last
        micro-batch (required for S > 1).
      replica_sample: samples "replicas": `replica_sample(raw grads)` (default:
        computed from `grads`, which must then be straight from mtf.gradients).

    Example:
      >>> ops = opt.apply_grads(mean_grads, variables, last_sample=grads)
    """
    del step
    grads = list(grads)
    present = [g for g in grads if g is not None]
    if not present:
      return []
    mesh = present[0].mesh
    r, ops = self.gain(grads, last_sample, apply_if, replica_sample)
    progress = self._state(mesh, "progress")
    multiplier = r if lr_multiplier is None else r * lr_multiplier
    ops += self.base_optimizer.apply_grads(grads, variables, step=progress,
                                           apply_if=apply_if, lr_multiplier=multiplier)
    advance = r if apply_if is None else ew.cast(apply_if, tf.float32) * r
    ops.append(var_ops.assign(progress, progress + advance))
    if isinstance(r, Tensor):
      from mesh_tensorflow.training.trainer import scalar_summary
      scalar_summary("adascale/progress", progress)
    return ops
