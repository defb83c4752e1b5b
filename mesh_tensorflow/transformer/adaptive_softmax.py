"""The adaptive softmax (Grave et al., https://arxiv.org/abs/1609.04309) with
adaptive input embeddings (Baevski and Auli, https://arxiv.org/abs/1809.10853).

The vocabulary (sorted by decreasing frequency) is cut into contiguous
clusters. The first, the head, holds the frequent tokens; each other cluster
(a tail) is one more entry of the head's softmax:

    p(v | h) = p_head(v | h)                       for v in the head,
    p(v | h) = p_head(tail c | h) p_c(v | h)       for v in tail cluster c.

Training needs only the head softmax for every token and a tail softmax for
the tokens of that tail (optionally for a fixed fraction of the positions,
`length_projection_factor`), never the softmax over the whole vocabulary.
Each cluster has its own embedding size, like `AdaptiveVocabEmbedding`, and
the same tables embed the inputs.

    Unitransformer.vocab_embedding_cls = @adaptive_softmax.AdaptiveSoftmaxVocabEmbedding
    Unitransformer.shared_embedding_and_softmax_weights = True
    AdaptiveSoftmaxVocabEmbedding.clusters = [
        {"token_count": 128, "embedding_size": 128},
        {"token_count": 384, "embedding_size": 32, "length_projection_factor": 0.5},
    ]

The original's gin lines (`transformer.get_vocab_embedding_cls.cls = ...` and
`Unitransformer.loss_fn = @adaptive_softmax.adaptive_softmax_loss_fn`) work
too; without the loss_fn the Unitransformer uses the embedding's own loss in
training (`compute_loss`) and the cross-entropy of the log-probabilities in
evaluation.
"""

from __future__ import annotations

import math
from typing import Dict, Optional, Sequence, Union

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import transformer
from mesh_tensorflow.transformer import vocab_embeddings


def _is_training(context) -> bool:
  return context is not None and context.mode == transformer.ModeKeys.TRAIN


def _token_weights(decoder, targets: mtf.Tensor, dtype) -> mtf.Tensor:
  """1 at the target tokens that count in the loss (not padding, and only
  the targets part with loss_on_targets_only), else 0."""
  weights = mtf.layers.weights_nonzero(targets, dtype=dtype)
  if _setting(decoder, "loss_on_targets_only", False):
    weights = weights * mtf.cast(mtf.logical_not(transformer.inputs_prefix_mask(targets)),
                                 dtype)
  return weights


def _setting(decoder, name: str, default):
  """decoder's `name` when it is a plain number or bool, else default."""
  value = getattr(decoder, name, default)
  return value if isinstance(value, (bool, int, float)) else default


def _mean_loss(decoder, total: mtf.Tensor, weights: mtf.Tensor) -> mtf.Tensor:
  """total over the model's loss denominator (default: the counted tokens),
  as Unitransformer divides its cross-entropy."""
  denominator = getattr(decoder, "loss_denominator", None)
  if denominator is not None:
    return total * (1.0 / float(denominator))
  return total / mtf.maximum(mtf.reduce_sum(weights), 1.0)


class _TailCluster(vocab_embeddings._Cluster):  # pylint: disable=protected-access
  """A tail cluster and the share of positions its training loss covers."""

  def __init__(self, cluster, length_projection_factor: float):
    super().__init__(cluster.embedding, cluster.start, cluster.end, cluster.vocab_dim)
    self.length_projection_factor = length_projection_factor

  def positions(self, hidden: mtf.Tensor, local: mtf.Tensor, weights: mtf.Tensor,
                length_dim: mtf.Dimension):
    """(hidden, local ids, weights) of the positions whose targets are in
    this cluster, moved to a shorter "cluster_length" dimension of
    ceil(factor * length) slots, in order; positions past the last slot are
    left out of this cluster's loss."""
    slots = mtf.Dimension("cluster_length",
                          int(math.ceil(self.length_projection_factor * length_dim.size)))
    counted = mtf.to_int32(mtf.greater(weights, 0.0))
    slot = mtf.cumsum(counted, length_dim) - 1
    # One-hot of an index outside [0, slots) is all zeros: dropped positions.
    move = mtf.one_hot(slot, slots, dtype=hidden.dtype) * mtf.cast(counted, hidden.dtype)
    hidden = mtf.einsum([move, hidden], reduced_dims=[length_dim])
    local = mtf.to_int32(mtf.einsum([move, mtf.cast(local, hidden.dtype)],
                                    reduced_dims=[length_dim]))
    weights = mtf.einsum([move, weights], reduced_dims=[length_dim])
    return hidden, local, weights


class AdaptiveSoftmaxVocabEmbedding:
  """A vocabulary embedding with an adaptive softmax over clusters of ids.

  The variables are named and laid out as the original's, so its
  checkpoints restore: the head cluster's table (plain, or factorized when its
  embedding_size is not d_model) has one row per head token followed by one
  row per tail cluster (the tail entries of the head softmax), and each tail
  cluster has its own table over its tokens (see `AdaptiveVocabEmbedding`).

  `hidden_to_logits` returns log-probabilities over the whole vocabulary
  in every mode. The training loss (`compute_loss`, which Unitransformer and
  `adaptive_softmax_loss_fn` use in training) works from the hidden states
  without forming the whole softmax, so its gradients never go through the
  log-probabilities (which the main job still reads for its token-accuracy
  metric). It equals their cross-entropy when every
  length_projection_factor is 1 and z_loss is 0; with a z_loss each softmax
  (head and tails) adds its own.

  Needs Unitransformer.shared_embedding_and_softmax_weights = True.
  label_smoothing is not supported (a clear error);
  loss_on_targets_only and loss_denominator are honoured.

  Args:
    mesh, vocab_dim, output_dim, variable_dtype, ensemble_dim: as
      `transformer.VocabEmbedding`.
    name: cluster i's variables are `name`_i (plain) or `name`_i1 and
      `name`_i2 (factorized); cluster 0's vocabulary dimension has
      token_count + (number of tail clusters) entries.
    clusters: a list of dicts, the first being the head. "token_count" is
      the number of ids in the cluster (the counts must add up to the
      vocabulary size); "embedding_size" (default d_model) is the cluster's
      embedding size; "length_projection_factor" (tails only; default 1, in
      (0, 1]) limits the tail's training loss to at most this fraction of
      each sequence's positions (the first ones with targets in the tail),
      while evaluation counts every position. Clusters are split like
      "vocab": a layout splitting "vocab" n ways needs every tail's token
      count, and the head's plus the number of tails, to be a multiple of n.

  Raises:
    ValueError: if the clusters do not cover the vocabulary exactly, a
      spec is malformed or a length_projection_factor is outside (0, 1].

  Example:
    >>> emb = AdaptiveSoftmaxVocabEmbedding(
    ...     mesh, mtf.Dimension("vocab", 512), model_dim, vdtype, "embedding",
    ...     None, clusters=[{"token_count": 128},
    ...                     {"token_count": 384, "embedding_size": 32,
    ...                      "length_projection_factor": 0.25}])
  """

  logits_need_shared_weights = True

  def __init__(self, mesh: mtf.Mesh, vocab_dim: mtf.Dimension, output_dim: mtf.Dimension,
               variable_dtype: mtf.VariableDType, name: str = "embedding",
               ensemble_dim=None,
               clusters: Optional[Sequence[Dict[str, Union[int, float]]]] = None):
    specs = vocab_embeddings.check_clusters(
        clusters, vocab_dim, output_dim, "AdaptiveSoftmaxVocabEmbedding",
        allowed_keys=("token_count", "embedding_size", "length_projection_factor"))
    self._vocab_dim = vocab_dim
    self._output_dim = output_dim
    self._clusters = []
    start = 0
    num_tails = len(specs) - 1
    for i, spec in enumerate(specs):
      factor = spec.get("length_projection_factor", 1.0)
      if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor <= 1:
        raise ValueError(f"AdaptiveSoftmaxVocabEmbedding: cluster {i}'s "
                         f"length_projection_factor must be in (0, 1], got {factor!r}.")
      # The head's table also holds one row per tail cluster, after its tokens.
      rows = spec["token_count"] + (num_tails if i == 0 else 0)
      cluster = vocab_embeddings.make_cluster(
          mesh, vocab_dim, output_dim, variable_dtype, f"{name}_{i}", ensemble_dim, start,
          rows, spec["embedding_size"])
      if i == 0:
        cluster = vocab_embeddings._Cluster(  # pylint: disable=protected-access
            cluster.embedding, start, start + spec["token_count"], cluster.vocab_dim)
      self._clusters.append(cluster if i == 0 else _TailCluster(cluster, float(factor)))
      start += spec["token_count"]
    self._head, self._tails = self._clusters[0], self._clusters[1:]
    self._head_count = specs[0]["token_count"]
    self._tails_dim = mtf.Dimension("tail_clusters", num_tails) if num_tails else None

  def ids_to_embedding(self, ids: mtf.Tensor,
                       context: Optional[transformer.Context] = None) -> mtf.Tensor:
    """Each id embedded by its cluster: [ids dims..., d_model]."""
    parts = [c.ids_to_embedding(ids, context) for c in self._clusters]
    return parts[0] if len(parts) == 1 else mtf.add_n(parts)

  def _head_logits(self, hidden: mtf.Tensor, context):
    """(the head table's logits [..., vocab (head tokens, then one entry per
    tail cluster)], their log-normalizer)."""
    logits = self._head.hidden_to_logits(hidden, context)
    return logits, mtf.reduce_logsumexp(logits, self._head.vocab_dim)

  def _split_head(self, logits: mtf.Tensor):
    """(the head tokens' entries [..., vocab (head tokens)], the tail
    clusters' entries [..., tail_clusters]) of the head table's logits."""
    name = self._head.vocab_dim.name
    tokens = mtf.slice(logits, 0, self._head_count, name)
    tails = mtf.slice(logits, self._head_count, self._tails_dim.size, name)
    return tokens, mtf.rename_dimension(tails, name, self._tails_dim.name)

  def hidden_to_logits(self, hidden: mtf.Tensor,
                       context: Optional[transformer.Context] = None) -> mtf.Tensor:
    """log p(v | hidden) over the whole vocabulary: [..., vocab].

    Example:
      >>> log_probs = emb.hidden_to_logits(hidden, context)   # logsumexp 0
    """
    logits, log_z = self._head_logits(hidden, context)
    if not self._tails:
      return logits - log_z
    tokens, tails = self._split_head(logits)
    parts = [tokens - log_z]
    tail_log_p = mtf.unstack(tails - log_z, self._tails_dim)
    for cluster, log_p in zip(self._tails, tail_log_p):
      tail_logits = cluster.hidden_to_logits(hidden, context)
      parts.append(log_p + mtf.log_softmax(tail_logits, cluster.vocab_dim))
    return mtf.concat(parts, self._vocab_dim.name)

  def compute_loss(self, decoder, hidden: mtf.Tensor, targets: mtf.Tensor,
                   context: Optional[transformer.Context] = None,
                   training: Optional[bool] = None) -> mtf.Tensor:
    """The mean cross-entropy of the targets, from the hidden states, with
    the head softmax for every token and each tail's softmax for its tokens.

    Args:
      decoder: the Unitransformer (its z_loss, label_smoothing,
        loss_on_targets_only and loss_denominator apply; None: defaults).
      hidden: the stack's output [batch..., length, d_model].
      targets: int32 [batch..., length] (0 is padding).
      context: the call's Context (z_loss and length_projection_factor
        apply in training).
      training: whether this is the training loss (None: context's mode
        says).

    Returns:
      a scalar.

    Example:
      >>> loss = emb.compute_loss(model, hidden, targets, context)
    """
    if _setting(decoder, "label_smoothing", 0.0):
      raise ValueError("AdaptiveSoftmaxVocabEmbedding does not support label_smoothing "
                       f"(got {decoder.label_smoothing}); set Unitransformer.label_smoothing "
                       "= 0.0.")
    training = _is_training(context) if training is None else training
    z_loss = _setting(decoder, "z_loss", 0.0) if training else 0.0
    dtype = hidden.dtype
    weights = _token_weights(decoder, targets, dtype)
    length_dim = targets.shape.dims[-1]
    logits, log_z = self._head_logits(hidden, context)
    # The head's target: the token itself, or the entry of its tail cluster
    # (the head table's row head_count + i for tail i).
    in_head = self._head.contains(targets)
    head_target = self._head.local_ids(targets, in_head)
    for i, cluster in enumerate(self._tails):
      head_target = head_target + (self._head_count + i) * mtf.to_int32(
          cluster.contains(targets))
    picked = mtf.reduce_sum(
        logits * mtf.one_hot(head_target, self._head.vocab_dim, dtype=dtype),
        reduced_dim=self._head.vocab_dim)
    tail_losses = []
    for cluster in self._tails:
      inside = cluster.contains(targets)
      local = cluster.local_ids(targets, inside)
      w = weights * mtf.cast(inside, dtype)
      h = hidden
      if training and cluster.length_projection_factor < 1.0:
        h, local, w = cluster.positions(hidden, local, w, length_dim)
      xent = mtf.layers.softmax_cross_entropy_with_logits(
          cluster.hidden_to_logits(h, context), local, cluster.vocab_dim, z_loss=z_loss)
      tail_losses.append(mtf.reduce_sum(xent * w))
    head_xent = log_z - picked
    if z_loss:
      head_xent = head_xent + z_loss * mtf.square(log_z)
    total = mtf.add_n([mtf.reduce_sum(head_xent * weights)] + tail_losses)
    return _mean_loss(decoder, total, weights)


def adaptive_softmax_loss_fn(decoder, context: transformer.Context, logits: mtf.Tensor,
                             targets: Optional[mtf.Tensor] = None,
                             output_vocab_dim: Optional[mtf.Dimension] = None) -> mtf.Tensor:
  """The original's Unitransformer.loss_fn for the adaptive softmax, with its
  signature (decoder, context, logits, targets, output_vocab_dim); the
  four-argument form (context, logits, targets, output_vocab_dim) works too.
  The same loss as the Unitransformer computes without it.

  In training, the embedding's `compute_loss` of the stack's output (which
  the Unitransformer leaves in context.cache["vocab_embedding_hidden"]; a
  `logits` argument without the vocabulary dimension is taken as that
  output and gets the training loss); otherwise the cross-entropy of the
  log-probabilities `logits`. The embedding is the context's
  shared_params["embedding"] or the one the Unitransformer left in
  context.cache["vocab_embedding"].

  Example:
    >>> # gin: Unitransformer.loss_fn = @adaptive_softmax.adaptive_softmax_loss_fn
    >>> loss = adaptive_softmax_loss_fn(model, context, logits, targets, vocab_dim)
  """
  if isinstance(decoder, transformer.Context):  # (context, logits, targets[, dim])
    decoder, context, logits, targets, output_vocab_dim = (
        decoder.model, decoder, context, logits, targets)
  if targets is None:
    raise TypeError("adaptive_softmax_loss_fn(decoder, context, logits, targets, "
                    "output_vocab_dim): targets is missing.")
  found = [context.shared_params.get("embedding"), context.cache.get("vocab_embedding")]
  embedding = next((e for e in found if isinstance(e, AdaptiveSoftmaxVocabEmbedding)),
                   found[-1] if found[-1] is not None else found[0])
  if not isinstance(embedding, AdaptiveSoftmaxVocabEmbedding):
    raise ValueError("adaptive_softmax_loss_fn needs the model's vocab_embedding_cls to be "
                     "adaptive_softmax.AdaptiveSoftmaxVocabEmbedding, got "
                     f"{type(embedding).__name__}.")
  vocab_name = (output_vocab_dim.name if output_vocab_dim is not None
                else embedding._vocab_dim.name)  # pylint: disable=protected-access
  if not logits.shape.has_dim_name(vocab_name):
    # Hidden states passed as logits (the original's convention in training).
    return embedding.compute_loss(decoder, logits, targets, context, training=True)
  hidden = context.cache.get("vocab_embedding_hidden")
  if _is_training(context) and hidden is not None:
    return embedding.compute_loss(decoder, hidden, targets, context)
  vocab_dim = logits.shape.get_dim_by_name(vocab_name)
  weights = _token_weights(decoder, targets, logits.dtype)
  xent = mtf.layers.softmax_cross_entropy_with_logits(logits, targets, vocab_dim)
  return _mean_loss(decoder, mtf.reduce_sum(xent * weights), weights)
