"""Losses over named dimensions: softmax and sigmoid cross-entropy, label
smoothing, z-loss, padding weights.

Part of `mtf.layers` (import them from there). A split vocabulary costs only
allreduces of per-example scalars (the log-partition and the target term).

    >>> loss = mtf.layers.softmax_cross_entropy_with_logits(
    ...     logits, mtf.one_hot(ids, vocab), vocab, z_loss=1e-4, label_smoothing=0.1)
    >>> loss = mtf.reduce_sum(loss * mtf.layers.weights_nonzero(ids))
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from mesh_tensorflow.core.graph import Operation, Tensor
from mesh_tensorflow.lowering import statistics_plans
from mesh_tensorflow.lowering.mesh_impl import expand_to_shape, int_constant, reshape_slice, shared_constant
from mesh_tensorflow.operations import elementwise as ew
from mesh_tensorflow.operations.indexing import local_ids, one_hot, slice_offsets
from mesh_tensorflow.operations.reduction import reduce_logsumexp, reduce_sum
from mesh_tensorflow.core.shapes import Dimension, convert_to_dimension


def _check_vocab(logits: Tensor, vocab_dim) -> Dimension:
  vocab_dim = convert_to_dimension(vocab_dim)
  if vocab_dim not in logits.shape.dims:
    raise ValueError(f"{vocab_dim} is not a dimension of logits {logits.name} {logits.shape}.")
  return vocab_dim


def smoothed_targets(targets: Tensor, vocab_dim: Dimension, label_smoothing: float = 0.0,
                     dtype=tf.float32) -> Tensor:
  """Target distribution with label smoothing: (1 - s) * targets + s / vocab.

  `targets` is either integer class ids (without vocab_dim) or a distribution
  over vocab_dim (floating point, summing to one along it).

  Example:
    >>> t = smoothed_targets(ids, vocab, 0.1)   # [batch, vocab]
  """
  if not 0.0 <= label_smoothing <= 1.0:
    raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing}.")
  if targets.dtype.is_integer:
    if targets.shape.has_dim_name(vocab_dim.name):
      raise ValueError(f"Integer targets {targets.name} {targets.shape} must not have "
                       f"the vocabulary dimension {vocab_dim.name!r}; soft targets must "
                       "be floating point.")
    targets = one_hot(targets, vocab_dim, dtype=dtype)
  elif vocab_dim not in targets.shape.dims:
    raise ValueError(f"Soft targets {targets.name} {targets.shape} need the vocabulary "
                     f"dimension {vocab_dim}.")
  if label_smoothing:
    targets = targets * (1.0 - label_smoothing) + label_smoothing / vocab_dim.size
  return targets


def softmax_cross_entropy_with_logits(logits: Tensor, targets: Tensor, vocab_dim: Dimension,
                                      z_loss: float = 0.0,
                                      label_smoothing: float = 0.0) -> Tensor:
  """Per-example softmax cross-entropy, optionally with label smoothing and z-loss.

  loss = -sum_vocab(targets * log_softmax(logits)) + z_loss * log(Z)^2, where
  Z is the softmax partition function (the z-loss keeps logits near
  normalized, which helps in bfloat16; 1e-4 is a typical weight).

  Args:
    logits: floating point tensor with vocab_dim.
    targets: a distribution over vocab_dim with logits' dimensions (soft or
      one-hot targets), or integer class ids with logits' other dimensions.
    vocab_dim: the class dimension.
    z_loss: weight of the z-loss.
    label_smoothing: mixes targets with the uniform distribution, see
      `smoothed_targets`.

  Returns:
    a tensor with logits' dimensions minus vocab_dim.

  Example:
    >>> loss = softmax_cross_entropy_with_logits(logits, ids, vocab, z_loss=1e-4)
  """
  vocab_dim = _check_vocab(logits, vocab_dim)
  if not logits.dtype.is_floating:
    raise TypeError(f"logits {logits.name} must be floating point, got {logits.dtype.name}.")
  expected = set(logits.shape.dims) - ({vocab_dim} if targets.dtype.is_integer else set())
  if set(targets.shape.dims) != expected:
    kind = "integer" if targets.dtype.is_integer else "soft"
    raise ValueError(
        f"softmax_cross_entropy_with_logits: {kind} targets {targets.name} "
        f"{targets.shape} must have the dimensions {sorted(d.name for d in expected)} "
        f"of logits {logits.shape}{'' if kind == 'soft' else ' other than vocab_dim'}.")
  if targets.dtype.is_integer and not label_smoothing:
    # Integer targets: one fused op (one pass over the logits per processor).
    op = SparseSoftmaxCrossEntropyOperation(logits, targets, vocab_dim)
    loss, log_z, _ = op.outputs
    if z_loss:
      loss = loss + z_loss * ew.square(log_z)
    return loss
  targets = smoothed_targets(targets, vocab_dim, label_smoothing, dtype=logits.dtype)
  if targets.dtype != logits.dtype:
    targets = ew.cast(targets, logits.dtype)
  log_z = reduce_logsumexp(logits, vocab_dim)
  # sum(t * (logits - log_z)) = sum(t * logits) - log_z * sum(t): one reduction
  # of the product, and sum(t) is 1 for a distribution.
  loss = log_z * reduce_sum(targets, reduced_dim=vocab_dim) - reduce_sum(
      targets * logits, reduced_dim=vocab_dim)
  if z_loss:
    loss = loss + z_loss * ew.square(log_z)
  return loss


class SparseSoftmaxCrossEntropyOperation(Operation):
  """Cross-entropy of softmax(logits) over vocab_dim against integer ids.

  Outputs (loss, log_z), both with logits' dimensions minus vocab_dim, and
  the gradient of the loss with respect to the logits (softmax - one_hot,
  logits' shape), computed in the same pass as TensorFlow's own kernel does.
  With vocab_dim whole on each processor this is TensorFlow's fused kernel;
  split, each processor works on its part of the vocabulary and three small
  allreduces (max, sum of exponentials, target logit) combine them.
  """

  def __init__(self, logits: Tensor, ids: Tensor, vocab_dim: Dimension, name=None):
    super().__init__([logits, ids], name=name or "softmax_cross_entropy")
    self._vocab_dim = vocab_dim
    self.has_gradient = True
    out_shape = logits.shape - [vocab_dim]
    self._outputs = [Tensor(self, out_shape, logits.dtype, index=0),
                     Tensor(self, out_shape, logits.dtype, index=1),
                     Tensor(self, logits.shape, logits.dtype, index=2)]

  def gradient(self, grad_ys):
    logits, ids = self.inputs
    g_loss, g_log_z, g_backprop = grad_ys
    if g_backprop is not None:
      raise ValueError(f"{self.name}: its backprop output is not differentiable.")
    backprop = self.outputs[2]  # softmax(logits) - one_hot(ids)
    grad = None
    if g_loss is not None:
      grad = backprop * g_loss
    if g_log_z is not None:
      probs = backprop + one_hot(ids, self._vocab_dim, dtype=logits.dtype)
      grad = probs * g_log_z if grad is None else grad + probs * g_log_z
    return [grad, None]

  def plan(self, mesh):
    logits, ids = self.inputs
    return statistics_plans.plan_cross_entropy(logits, ids, self._vocab_dim, mesh.layout_of,
                                               mesh.sizes)

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    logits, ids = self.inputs
    out_shape = self.outputs[0].shape
    vocab = self._vocab_dim
    plan = self.plan(lowering.plan_mesh(self))
    # Logits with vocab last, ids in the same order as the other dimensions.
    ordered = out_shape + [vocab]
    dtype = logits.dtype

    def prepare(lg, i):
      return expand_to_shape(lg, logits.shape, ordered), expand_to_shape(i, ids.shape, out_shape)

    def back(b):  # the backprop in the logits' dimension order
      return expand_to_shape(b, ordered, logits.shape)
    last_axis = int_constant(-1)
    if len(plan.kernels) == 3:  # vocab whole
      def fused(lg, idx):
        lg32 = tf.cast(lg, tf.float32)
        shape = lg32.shape.as_list()
        # The kernel takes [examples, classes]: flatten the other dimensions.
        examples = int(np.prod(shape[:-1], dtype=np.int64))
        flat_logits = reshape_slice(lg32, [examples, shape[-1]])
        flat_ids = reshape_slice(tf.cast(idx, tf.int32), [examples])
        loss, backprop = tf.raw_ops.SparseSoftmaxCrossEntropyWithLogits(
            features=flat_logits, labels=flat_ids)
        # loss = log_z - target logit, so log_z costs a gather and an add
        # (tf.reduce_logsumexp would add about ten ops per processor).
        target = tf.raw_ops.GatherV2(params=flat_logits, indices=flat_ids, axis=last_axis,
                                     batch_dims=1)
        log_z = reshape_slice(loss + target, shape[:-1])
        loss = reshape_slice(loss, shape[:-1])
        backprop = reshape_slice(backprop, shape)
        return tf.cast(loss, dtype), tf.cast(log_z, dtype), tf.cast(backprop, dtype)
      lowering.lower_kernels(self, plan, [prepare, fused, back])
      return
    local_vocab = vocab.size // impl.mesh_axis_size(impl.tensor_dimension_to_mesh_axis(vocab))
    offsets = slice_offsets(impl, ordered, ordered.ndims - 1)
    # Constants shared by every processor's ops (fewer ops to create).
    zero, one = shared_constant(0.0, tf.float32), shared_constant(1.0, tf.float32)

    def maxima(lg):  # keeps the vocab axis (size 1) to broadcast
      return tf.reduce_max(tf.cast(lg, tf.float32), axis=last_axis, keepdims=True)

    def partial(lg, idx, m, offset):
      lg32 = tf.cast(lg, tf.float32)
      exps = tf.exp(lg32 - m)
      sum_exp = tf.reduce_sum(exps, axis=last_axis, keepdims=True)
      # Ids outside the block (negative or past its end) give rows of zeros,
      # so only the processor holding the id's logit contributes it. The
      # one-hot is the gradient's too.
      onehot = tf.raw_ops.OneHot(indices=local_ids(idx, offset),
                                 depth=int_constant(local_vocab), on_value=one,
                                 off_value=zero)
      # MulNoNan: a -inf logit elsewhere in the row must not turn 0 * -inf into NaN.
      target = tf.reduce_sum(tf.raw_ops.MulNoNan(x=lg32, y=onehot), axis=last_axis)
      return exps, sum_exp, onehot, target

    def finish(exps, onehot, m, s, t):
      log_z = tf.squeeze(tf.math.log(s) + m, axis=-1)
      return (tf.cast(log_z - t, dtype), tf.cast(log_z, dtype),
              tf.cast(exps / s - onehot, dtype))
    lowering.lower_kernels(self, plan, [prepare, maxima, partial, finish, back],
                           extra={2: (offsets,)})


def sigmoid_cross_entropy_with_logits(logits: Tensor, targets: Tensor) -> Tensor:
  """Elementwise binary cross-entropy of sigmoid(logits) against targets in
  [0, 1]: softplus(logits) - logits * targets, computed stably.

  Example:
    >>> loss = sigmoid_cross_entropy_with_logits(logits, labels)
  """
  if logits.shape != targets.shape:
    raise ValueError(f"sigmoid_cross_entropy_with_logits: logits {logits.name} "
                     f"{logits.shape} and targets {targets.name} {targets.shape} must "
                     "have the same shape.")
  if targets.dtype != logits.dtype:
    targets = ew.cast(targets, logits.dtype)
  return ew.softplus(logits) - logits * targets


def weights_nonzero(targets: Tensor, dtype=tf.float32) -> Tensor:
  """1 where targets is nonzero (not padding), else 0, in dtype.

  Example:
    >>> w = weights_nonzero(ids)   # mask out padding (id 0) from a loss
  """
  return ew.cast(ew.not_equal(targets, 0), dtype)

from mesh_tensorflow.core import autograph_exempt as _autograph_exempt  # noqa: E402  pylint: disable=g-import-not-at-top
_autograph_exempt.exempt(globals())  # AutoGraph leaves this module's code alone
