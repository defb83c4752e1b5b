"""Mixed precision: low-precision activations, float32 master weights, and
dynamic loss scaling for float16.

Variables keep float32 masters (what optimizers update and checkpoints store)
and hand the model a bfloat16 or float16 copy (`VariableDType`, see
`mesh_tensorflow.operations.variables`):

    >>> w = mtf.get_variable(mesh, "w", "in:64;out:32",
    ...                      dtype=mtf.mixed_precision.variable_dtype("float16"))

bfloat16 has float32's exponent range and needs nothing more. float16 does
not: small gradients underflow to zero. `DynamicLossScale` multiplies the loss
by a scale S before differentiation and divides the (float32) gradients by S.
If any gradient is not finite, the step is skipped: every variable and
optimizer slot keeps its value (`Optimizer.apply_grads(apply_if=...)`), S is
halved (not below `min_scale`) and the skip is counted in the checkpointed
variable `loss_scale/skipped_steps` and logged by the Trainer (absl warning).
The global step and the optimizer's step counter still advance on a skipped
step (the Trainer's batches and schedules stay aligned with it). After
`growth_interval` finite steps in a row S doubles (up to `max_scale`).

    >>> trainer = mtf.training.Trainer(..., loss_scale=mtf.mixed_precision.DynamicLossScale())
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import tensorflow as tf

from mesh_tensorflow.core.graph import Mesh, Operation, Tensor
from mesh_tensorflow.operations import elementwise as ew
from mesh_tensorflow.operations import reduction
from mesh_tensorflow.operations import variables as var_ops
from mesh_tensorflow.core.shapes import Shape

_ACTIVATION_DTYPES = ("float32", "bfloat16", "float16")


def variable_dtype(activation_dtype="bfloat16") -> var_ops.VariableDType:
  """float32 master and stored weights, activations in `activation_dtype`.

  Example:
    >>> mtf.mixed_precision.variable_dtype("float16")
    VariableDType(master=float32, slice=float32, activation=float16)
  """
  dtype = tf.as_dtype(activation_dtype)
  if dtype.name not in _ACTIVATION_DTYPES:
    raise ValueError(f"activation_dtype must be one of {_ACTIVATION_DTYPES}, got "
                     f"{dtype.name!r}.")
  return var_ops.VariableDType(tf.float32, tf.float32, dtype)


def all_finite(tensors: Sequence[Optional[Tensor]]) -> Tensor:
  """A scalar mtf bool: whether every element of every tensor is finite.

  Example:
    >>> ok = mtf.mixed_precision.all_finite(grads)
  """
  present = [t for t in tensors if t is not None]
  if not present:
    raise ValueError("all_finite: every tensor is None.")
  # x * 0 is 0 for finite x and NaN for inf or NaN: one float sum per tensor.
  zeros = [reduction.reduce_sum(ew.cast(t, tf.float32) * 0.0) for t in present]
  return ew.equal(ew.add_n(zeros) if len(zeros) > 1 else zeros[0], 0.0)


class DynamicLossScale:
  """Dynamic loss scaling (state in checkpointed mtf variables).

  Args:
    initial_scale: the first loss scale.
    growth_interval: finite steps in a row after which the scale grows.
    factor: the scale is multiplied by it on growth and divided on overflow.
    min_scale: lower bound of the scale.
    max_scale: upper bound of the scale.
    name: prefix of the state variables (`<name>/scale`, `<name>/good_steps`,
      `<name>/skipped_steps`) and summaries (`<name>/scale`, `<name>/finite`).

  Example:
    >>> scaler = mtf.mixed_precision.DynamicLossScale(initial_scale=2.0 ** 12)
    >>> grads, finite = scaler.unscale(mtf.gradients([scaler.scale_loss(loss)], xs))
    >>> ops = optimizer.apply_grads(grads, variables, apply_if=finite)
    >>> ops += scaler.update(finite)
  """

  def __init__(self, initial_scale: float = 2.0 ** 15, growth_interval: int = 2000,
               factor: float = 2.0, min_scale: float = 1.0, max_scale: float = 2.0 ** 24,
               name: str = "loss_scale"):
    if not 0 < min_scale <= initial_scale <= max_scale:
      raise ValueError(
          f"DynamicLossScale: need 0 < min_scale <= initial_scale <= max_scale, got "
          f"{min_scale}, {initial_scale}, {max_scale}.")
    if factor <= 1:
      raise ValueError(f"DynamicLossScale: factor must be > 1, got {factor}.")
    if growth_interval < 1:
      raise ValueError(f"DynamicLossScale: growth_interval must be >= 1, got "
                       f"{growth_interval}.")
    self.initial_scale = float(initial_scale)
    self.growth_interval = int(growth_interval)
    self.factor = float(factor)
    self.min_scale = float(min_scale)
    self.max_scale = float(max_scale)
    self.name = name

  def _state(self, mesh: Mesh, what: str, initial: float) -> Tensor:
    return var_ops.get_variable(mesh, f"{self.name}/{what}", Shape([]), dtype=tf.float32,
                                initializer=tf.constant_initializer(initial),
                                trainable=False)

  def scale(self, mesh: Mesh) -> Tensor:
    """The current loss scale, a float32 mtf scalar."""
    return self._state(mesh, "scale", self.initial_scale)

  def scale_loss(self, loss: Tensor) -> Tensor:
    """`loss * scale` in float32 (differentiate this one)."""
    scaled = ew.cast(loss, tf.float32) * self.scale(loss.mesh)
    from mesh_tensorflow.training.trainer import scalar_summary
    scalar_summary(f"{self.name}/scale", self.scale(loss.mesh))
    return scaled

  def unscale(self, grads: Sequence[Optional[Tensor]], check: bool = True
              ) -> Tuple[List[Optional[Tensor]], Optional[Tensor]]:
    """(gradients / scale in float32, whether they are all finite).

    Gradients come back in float32 (float64 stays float64), so a master
    weight update never sees a float16 rounding of the gradient. With
    `check=False` the second result is None (e.g. for micro-batches whose sum
    is checked later with `check`).
    """
    present = [g for g in grads if g is not None]
    if not present:
      raise ValueError("DynamicLossScale.unscale: every gradient is None.")
    inverse = 1.0 / self.scale(present[0].mesh)
    out = []
    for g in grads:
      if g is None:
        out.append(None)
        continue
      dtype = tf.float64 if g.dtype == tf.float64 else tf.float32
      out.append(ew.cast(g, dtype) * ew.cast(inverse, dtype))
    return out, (self.check(out) if check else None)

  def check(self, grads: Sequence[Optional[Tensor]]) -> Tensor:
    """Whether all gradients are finite (a scalar mtf bool), also recorded as
    the summary `<name>/finite`."""
    finite = all_finite(grads)
    from mesh_tensorflow.training.trainer import scalar_summary
    scalar_summary(f"{self.name}/finite", ew.cast(finite, tf.float32))
    return finite

  def scale_after_overflow(self, scale: float) -> float:
    """The scale that follows `scale` after a non-finite step."""
    return max(scale / self.factor, self.min_scale)

  def update(self, finite: Tensor) -> List[Operation]:
    """The state updates of one step, given whether its gradients were finite."""
    mesh = finite.mesh
    scale = self.scale(mesh)
    good = self._state(mesh, "good_steps", 0.0)
    skipped = self._state(mesh, "skipped_steps", 0.0)
    good_next = ew.where(finite, good + 1.0, 0.0)
    grow = ew.greater_equal(good_next, float(self.growth_interval))
    grown = ew.minimum(scale * self.factor, self.max_scale)
    shrunk = ew.maximum(scale * (1.0 / self.factor), self.min_scale)
    new_scale = ew.where(finite, ew.where(grow, grown, scale), shrunk)
    return [var_ops.assign(scale, new_scale),
            var_ops.assign(good, ew.where(grow, 0.0, good_next)),
            var_ops.assign(skipped, skipped + 1.0 - ew.cast(finite, tf.float32))]

from mesh_tensorflow.core import autograph_exempt as _autograph_exempt  # noqa: E402  pylint: disable=g-import-not-at-top
_autograph_exempt.exempt(globals())  # AutoGraph leaves this module's code alone
