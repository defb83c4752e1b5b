"""BERT's optimizer: Adam with decoupled weight decay (or Adafactor), a
linear warm-up then linear decay of the learning rate, and gradient clipping
to global norm 1.

Two call forms:

* `create_optimizer(loss, ...)`: computes the gradients of
  `loss` and returns the update operations, for code that lowers its own
  graph. In TF2 there is no implicit global step: pass `global_step`.
* `make_optimizer(...)`, for `mtf.training.Trainer` (which computes the
  gradients itself and supplies its checkpointed global step).

Example:
  >>> trainer = mtf.training.Trainer(model_fn, shapes, impl,
  ...                                make_optimizer(5e-5, 10000, 1000))
"""

from __future__ import annotations

from typing import Callable, List, Optional, Sequence, Tuple, Union

import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.training import optimize as mtf_optimize

_OPTIMIZERS = ("adam", "adafactor")
_NO_WEIGHT_DECAY = ["LayerNorm", "layer_norm", "bias"]


def clip_by_global_norm(grads: Sequence[Optional[mtf.Tensor]], clip_norm
                        ) -> Tuple[List[Optional[mtf.Tensor]], mtf.Tensor]:
  """Scales gradients so that their global L2 norm is at most clip_norm.

  Args:
    grads: mtf Tensors (None entries stay None).
    clip_norm: a number or a scalar mtf Tensor.

  Returns:
    (clipped gradients, global norm before clipping).

  Example:
    >>> grads, norm = clip_by_global_norm(grads, 1.0)
  """
  present = [g for g in grads if g is not None]
  if not present:
    raise ValueError("clip_by_global_norm: every gradient is None.")
  norm = mtf.sqrt(mtf.add_n([mtf.reduce_sum(mtf.square(g)) for g in present]))
  multiplier = clip_norm / mtf.maximum(norm, clip_norm)
  return [None if g is None else g * multiplier for g in grads], norm


def learning_rate_schedule(step: mtf.Tensor, init_lr: float, num_train_steps: int,
                           num_warmup_steps: Optional[int] = None) -> mtf.Tensor:
  """BERT's learning rate at `step` (a float mtf scalar): init_lr * step /
  num_warmup_steps during warm-up, then init_lr * (1 - step / num_train_steps)
  (zero from num_train_steps on).

  Example:
    >>> lr = learning_rate_schedule(step, 1e-4, 1000, 100)
  """
  if num_train_steps is None or num_train_steps <= 0:
    raise ValueError(f"BERT learning rate: num_train_steps must be positive, got "
                     f"{num_train_steps}.")
  step = mtf.to_float(step)
  progress = mtf.minimum(step, float(num_train_steps)) / float(num_train_steps)
  lr = init_lr * (1.0 - progress)
  if num_warmup_steps:
    warmup_lr = init_lr * step / float(num_warmup_steps)
    in_warmup = mtf.to_float(mtf.less(step, float(num_warmup_steps)))
    lr = (1.0 - in_warmup) * lr + in_warmup * warmup_lr
  return lr


class _SizeLimited(mtf_optimize.Optimizer):
  """Leaves variables with more than max_size elements untrained."""

  def __init__(self, inner: mtf_optimize.Optimizer, max_size: int):
    super().__init__()
    self.inner = inner
    self.max_size = max_size

  def apply_grads(self, grads, variables, **kwargs):
    sizes = [(v.outputs[0] if isinstance(v, mtf.Operation) else v).shape.size
             for v in variables]
    grads = [None if size > self.max_size else g for g, size in zip(grads, sizes)]
    return self.inner.apply_grads(grads, variables, **kwargs)

  def apply_grad(self, grad, var):
    return self.inner.apply_grad(grad, var)


def _build_optimizer(learning_rate, optimizer: str, clip_gradients: bool,
                     max_optimized_variable_size: Optional[int]) -> mtf_optimize.Optimizer:
  clip = 1.0 if clip_gradients else None
  if optimizer == "adam":
    if learning_rate is None:
      raise ValueError("BERT optimizer: Adam has no default learning rate; give init_lr "
                       "(--learning_rate) or use optimizer='adafactor'.")
    opt = mtf_optimize.AdamWeightDecayOptimizer(
        learning_rate=learning_rate, weight_decay_rate=0.01, beta_1=0.9, beta_2=0.999,
        epsilon=1e-6, exclude_from_weight_decay=_NO_WEIGHT_DECAY,
        clip_gradients_by_global_norm=clip)
  elif optimizer == "adafactor":
    opt = mtf_optimize.AdafactorOptimizer(learning_rate=learning_rate,
                                          min_dim_size_to_factor=32,
                                          clip_gradients_by_global_norm=clip)
  else:
    raise ValueError(f"BERT optimizer: unknown optimizer {optimizer!r}; use one of "
                     f"{list(_OPTIMIZERS)}.")
  if max_optimized_variable_size:
    opt = _SizeLimited(opt, max_optimized_variable_size)
  return opt


def make_optimizer(init_lr: Optional[float], num_train_steps: int,
                   num_warmup_steps: Optional[int],
                   max_optimized_variable_size: Optional[int] = None,
                   optimizer: str = "adam", clip_gradients: bool = True
                   ) -> Callable[[mtf.Tensor], mtf_optimize.Optimizer]:
  """BERT's optimizer for `mtf.training.Trainer`: a function of the global
  step returning the optimizer with the scheduled learning rate.

  Args:
    init_lr: peak learning rate (None or 0: Adafactor's own schedule; Adam
      needs one).
    num_train_steps: steps over which the rate decays linearly to zero.
    num_warmup_steps: steps of linear warm-up (0 or None: none).
    max_optimized_variable_size: leave variables with more elements untrained.
    optimizer: "adam" (AdamWeightDecayOptimizer, weight decay 0.01 except for
      layer norms and biases) or "adafactor".
    clip_gradients: clip the gradients to global norm 1.

  Example:
    >>> opt_fn = make_optimizer(1e-4, 1000, 100)
    >>> trainer = mtf.training.Trainer(model_fn, shapes, impl, opt_fn)
  """
  # Fail now, not at the Trainer's first step, on a bad name or a missing rate.
  _build_optimizer(init_lr or None, optimizer, clip_gradients, None)

  def optimizer_for_step(step: mtf.Tensor) -> mtf_optimize.Optimizer:
    lr = (learning_rate_schedule(step, init_lr, num_train_steps, num_warmup_steps)
          if init_lr else None)
    return _build_optimizer(lr, optimizer, clip_gradients, max_optimized_variable_size)
  return optimizer_for_step


def create_optimizer(loss: mtf.Tensor, init_lr: Optional[float], num_train_steps: int,
                     num_warmup_steps: Optional[int],
                     max_optimized_variable_size: Optional[int] = None,
                     optimizer: str = "adam", clip_gradients: bool = True,
                     global_step: Union[mtf.Tensor, tf.Tensor, tf.Variable, int, None] = None
                     ) -> Tuple[Optional[mtf.Tensor], List[mtf.Operation]]:
  """Gradients of `loss` and their update ops.

  Args:
    loss: scalar mtf loss.
    init_lr: the peak learning rate; it and the next five arguments mean
      what they mean for `make_optimizer`.
    num_train_steps: see `make_optimizer`.
    num_warmup_steps: see `make_optimizer`.
    max_optimized_variable_size: see `make_optimizer`.
    optimizer: see `make_optimizer`.
    clip_gradients: see `make_optimizer`.
    global_step: the number of updates so far (an mtf scalar, a TensorFlow
      scalar or variable, or an int); required with a learning-rate schedule
      (TF2 has no implicit global step). Incrementing it is the caller's job.

  Returns:
    (learning rate as a float mtf scalar, or None for Adafactor's own
    schedule; the mtf update operations: lower each with
    `lowering.lowered_operation`).

  Example:
    >>> lr, ops = create_optimizer(loss, 1e-4, 1000, 100, global_step=step_var)
  """
  mesh = loss.mesh
  learning_rate = None
  if init_lr:
    if global_step is None:
      raise ValueError(
          "create_optimizer: give global_step= (the updates applied so far) for the "
          "learning-rate schedule; with mtf.training.Trainer use "
          "make_optimizer(...) instead, which reads the Trainer's step.")
    if isinstance(global_step, mtf.Tensor):
      step = mtf.to_float(global_step)
    else:
      step = mtf.import_fully_replicated(mesh, tf.cast(global_step, tf.float32),
                                         mtf.Shape([]), name="global_step")
    learning_rate = learning_rate_schedule(step, init_lr, num_train_steps, num_warmup_steps)
  opt = _build_optimizer(learning_rate, optimizer, False, None)
  variables = list(mesh.graph.trainable_variables)
  if max_optimized_variable_size:
    variables = [v for v in variables if v.shape.size <= max_optimized_variable_size]
  grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
  if clip_gradients:
    grads, _ = clip_by_global_norm(grads, 1.0)
  return learning_rate, opt.apply_grads(grads, variables)
