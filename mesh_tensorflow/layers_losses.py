"""Losses over named dimensions: softmax and sigmoid cross-entropy, label
smoothing, z-loss, padding weights.

Part of `mtf.layers` (import them from there). A split vocabulary costs only
allreduces of per-example scalars (the log-partition and the target term).

    >>> loss = mtf.layers.softmax_cross_entropy_with_logits(
    ...     logits, mtf.one_hot(ids, vocab), vocab, z_loss=1e-4, label_smoothing=0.1)
    >>> loss = mtf.reduce_sum(loss * mtf.layers.weights_nonzero(ids))
"""

from __future__ import annotations

import tensorflow as tf

from mesh_tensorflow.graph import Tensor
from mesh_tensorflow.ops import elementwise as ew
from mesh_tensorflow.ops.indexing import one_hot
from mesh_tensorflow.ops.reduction import reduce_logsumexp, reduce_sum
from mesh_tensorflow.shapes import Dimension, convert_to_dimension


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
