"""Vocabulary embeddings beyond one table: factorized, adaptive (clusters of
tokens with their own capacity), a mixture of softmaxes, and Mixtape.

Each class has the constructor and the two methods of
`transformer.VocabEmbedding`, so a `Unitransformer` takes it as its
`vocab_embedding_cls`:

* `ids_to_embedding(ids, context)`: int ids [...] -> states [..., d_model];
* `hidden_to_logits(hidden, context)`: states [..., d_model] -> logits
  [..., vocab] (used when the model shares its embedding and softmax
  weights, `Unitransformer.shared_embedding_and_softmax_weights = True`).

In gin, as in the original Mesh TensorFlow:

    Unitransformer.vocab_embedding_cls = @vocab_embeddings.FactorizedVocabEmbedding
    FactorizedVocabEmbedding.inner_dimension_size = 64

(or the original's `transformer.get_vocab_embedding_cls.cls = @...`).

Variables are created with layout-invariant initializers, so the model is the
same under every layout, including layouts that split "vocab" or "d_model".
Classes whose tables are slices of the vocabulary (`AdaptiveVocabEmbedding`)
name those slices "vocab" too, so that they are split like the vocabulary: a
layout splitting "vocab" n ways then needs every cluster's token count to be
a multiple of n.

    >>> emb = FactorizedVocabEmbedding(mesh, vocab_dim, model_dim,
    ...                                mtf.VariableDType(), name="embedding",
    ...                                ensemble_dim=None, inner_dimension_size=32)
    >>> logits = emb.hidden_to_logits(emb.ids_to_embedding(ids, None), None)
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence

import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import transformer


def _ensemble_dims(ensemble_dim) -> List[mtf.Dimension]:
  if ensemble_dim is None:
    return []
  if isinstance(ensemble_dim, mtf.Dimension):
    return [ensemble_dim]
  return list(ensemble_dim)


def check_clusters(clusters: Optional[Sequence[Mapping[str, Any]]], vocab_dim: mtf.Dimension,
                   output_dim: mtf.Dimension, owner: str,
                   allowed_keys=("token_count", "embedding_size")) -> List[Dict[str, Any]]:
  """Validated cluster specs: token counts that add up to the vocabulary,
  positive embedding sizes (default: d_model), no unknown keys.

  Raises:
    ValueError: if a spec is malformed or the clusters do not cover the
      vocabulary exactly.

  Example:
    >>> check_clusters([{"token_count": 96, "embedding_size": 64},
    ...                 {"token_count": 32, "embedding_size": 16}],
    ...                vocab_dim, model_dim, "AdaptiveVocabEmbedding")
  """
  hint = f" (gin: {owner}.clusters = [{{'token_count': ..., 'embedding_size': ...}}, ...])"
  if not clusters:
    raise ValueError(f"{owner}: clusters is required, a list of dicts with 'token_count' "
                     f"and 'embedding_size'{hint}.")
  out = []
  for i, spec in enumerate(clusters):
    if not isinstance(spec, Mapping):
      raise ValueError(f"{owner}: cluster {i} must be a dict, got {spec!r}.")
    unknown = sorted(set(spec) - set(allowed_keys))
    if unknown:
      raise ValueError(f"{owner}: cluster {i} has unknown keys {unknown}; the keys are "
                       f"{list(allowed_keys)}.")
    if "token_count" not in spec:
      raise ValueError(f"{owner}: cluster {i} lacks 'token_count'.")
    spec = dict(spec)
    transformer.positive_int(spec["token_count"], f"{owner}: cluster {i}'s token_count", "")
    spec["embedding_size"] = transformer.positive_int(
        spec.get("embedding_size", output_dim.size), f"{owner}: cluster {i}'s embedding_size", "")
    out.append(spec)
  counts = [spec["token_count"] for spec in out]
  if sum(counts) != vocab_dim.size:
    raise ValueError(
        f"{owner}: the clusters' token counts {counts} add up to {sum(counts)}, not to the "
        f"vocabulary size {vocab_dim.size}. The Unitransformer's vocabulary is its "
        "vocab size rounded up to a multiple of vocab_divisor; the clusters must cover "
        "it exactly.")
  return out


class FactorizedVocabEmbedding:
  """An embedding table factorized through a small inner dimension, as in
  ALBERT (https://arxiv.org/abs/1909.11942): [vocab, inner] x [inner,
  d_model], so that a large vocabulary costs vocab * inner parameters.

  embedding(id) = factor1[id] . factor2; with shared embedding and softmax
  weights, logits = (hidden * d_model^-0.5) . factor2^T . factor1^T. Both
  factors start normal with stddev inner^-0.25 (so their product has unit
  variance, like the plain table).

  Args:
    mesh: the mtf.Mesh.
    vocab_dim: the vocabulary dimension.
    output_dim: the model dimension.
    variable_dtype: an mtf.VariableDType.
    name: the variables are `name`1 [vocab, inner_vocab] and `name`2
      [inner_vocab, d_model].
    ensemble_dim: optional leading dimension(s) of the variables.
    inner_dimension_size: the size of the inner dimension ("inner_vocab");
      required.

  Example:
    >>> emb = FactorizedVocabEmbedding(mesh, vocab_dim, model_dim, vdtype,
    ...                                "embedding", None, inner_dimension_size=32)
    >>> x = emb.ids_to_embedding(ids, context)   # [batch, length, d_model]
  """

  def __init__(self, mesh: mtf.Mesh, vocab_dim: mtf.Dimension, output_dim: mtf.Dimension,
               variable_dtype: mtf.VariableDType, name: str = "embedding",
               ensemble_dim=None, inner_dimension_size: Optional[int] = None):
    size = transformer.positive_int(
        inner_dimension_size, "FactorizedVocabEmbedding: inner_dimension_size",
        " (gin: FactorizedVocabEmbedding.inner_dimension_size = 128)")
    self._vocab_dim = vocab_dim
    self._output_dim = output_dim
    self._inner_dim = mtf.Dimension("inner_vocab", size)
    init = mtf.initializers.random_normal_or_replaced(stddev=size ** -0.25)
    self._factor1 = mtf.layers.embedding_weights(
        mesh, vocab_dim, self._inner_dim, variable_dtype, name=f"{name}1",
        ensemble_dim=ensemble_dim, initializer=init)
    self._factor2 = mtf.layers.embedding_weights(
        mesh, self._inner_dim, output_dim, variable_dtype, name=f"{name}2",
        ensemble_dim=ensemble_dim, initializer=init)

  @property
  def factors(self):
    """(factor1 [..., vocab, inner_vocab], factor2 [..., inner_vocab, d_model])."""
    return self._factor1, self._factor2

  def ids_to_embedding(self, ids: mtf.Tensor,
                       context: Optional[transformer.Context] = None) -> mtf.Tensor:
    """factor1[ids] . factor2: [ids dims..., d_model]."""
    del context
    inner = mtf.gather(self._factor1, ids, self._vocab_dim)
    return mtf.einsum([inner, self._factor2], reduced_dims=[self._inner_dim])

  def hidden_to_logits(self, hidden: mtf.Tensor,
                       context: Optional[transformer.Context] = None) -> mtf.Tensor:
    """(hidden * d_model^-0.5) . factor2^T . factor1^T: [..., vocab]."""
    del context
    hidden = hidden * (self._output_dim.size ** -0.5)
    inner = mtf.einsum([hidden, self._factor2], reduced_dims=[self._output_dim])
    return mtf.einsum([inner, self._factor1], reduced_dims=[self._inner_dim])


class _Cluster:
  """A contiguous range [start, end) of token ids with its own embedding
  over a vocabulary dimension of end - start entries."""

  def __init__(self, embedding, start: int, end: int, vocab_dim: mtf.Dimension):
    self.embedding = embedding
    self.start = start
    self.end = end
    self.vocab_dim = vocab_dim

  def contains(self, ids: mtf.Tensor) -> mtf.Tensor:
    """bool: whether each id falls in this cluster."""
    return mtf.logical_and(mtf.greater_equal(ids, self.start), mtf.less(ids, self.end))

  def local_ids(self, ids: mtf.Tensor, inside: mtf.Tensor) -> mtf.Tensor:
    """ids - start inside the cluster, 0 outside (always a valid index)."""
    return (ids - self.start) * mtf.to_int32(inside)

  def ids_to_embedding(self, ids: mtf.Tensor, context) -> mtf.Tensor:
    """The cluster's embedding of ids in it, zeros for the others."""
    inside = self.contains(ids)
    x = self.embedding.ids_to_embedding(self.local_ids(ids, inside), context)
    return x * mtf.cast(inside, x.dtype)

  def hidden_to_logits(self, hidden: mtf.Tensor, context) -> mtf.Tensor:
    """Logits of the cluster's tokens: [..., vocab (end - start)]."""
    return self.embedding.hidden_to_logits(hidden, context)


def make_cluster(mesh: mtf.Mesh, vocab_dim: mtf.Dimension, output_dim: mtf.Dimension,
                 variable_dtype: mtf.VariableDType, name: str, ensemble_dim,
                 start: int, token_count: int, embedding_size: int) -> _Cluster:
  """A cluster of `token_count` ids from `start`: a plain table when its
  embedding size is d_model, else a factorized one, named `name`.

  Example:
    >>> head = make_cluster(mesh, vocab, d_model, vdtype, "embedding_0", None,
    ...                     0, 96, 128)
  """
  cluster_dim = mtf.Dimension(vocab_dim.name, token_count)
  if embedding_size == output_dim.size:
    embedding = transformer.VocabEmbedding(mesh, cluster_dim, output_dim, variable_dtype,
                                           name=name, ensemble_dim=ensemble_dim)
  else:
    embedding = FactorizedVocabEmbedding(mesh, cluster_dim, output_dim, variable_dtype,
                                         name=name, ensemble_dim=ensemble_dim,
                                         inner_dimension_size=embedding_size)
  return _Cluster(embedding, start, start + token_count, cluster_dim)


class AdaptiveVocabEmbedding:
  """Adaptive input representations (https://arxiv.org/abs/1809.10853) with
  a plain softmax: the vocabulary is cut into contiguous clusters of ids
  (most frequent first, for a frequency-sorted vocabulary), each with its
  own embedding size. A cluster whose size is d_model has a plain table;
  the others are factorized (`FactorizedVocabEmbedding`) through their size.

  The logits are the clusters' logits side by side (each cluster's
  `hidden_to_logits`), one softmax over the whole vocabulary.

  Args:
    mesh, vocab_dim, output_dim, variable_dtype, name, ensemble_dim: as
      `transformer.VocabEmbedding`; cluster i's variables are named
      `name`_i (plain) or `name`_i1 and `name`_i2 (factorized).
    clusters: a list of dicts {"token_count": n, "embedding_size": e} (e
      defaults to d_model); the token counts must add up to the vocabulary
      size. Cluster tables are split like "vocab": a layout splitting
      "vocab" n ways needs every token count to be a multiple of n.

  Raises:
    ValueError: if the clusters do not cover the vocabulary exactly or a
      spec is malformed.

  Example:
    >>> emb = AdaptiveVocabEmbedding(
    ...     mesh, mtf.Dimension("vocab", 512), model_dim, vdtype, "embedding",
    ...     None, clusters=[{"token_count": 128, "embedding_size": 64},
    ...                     {"token_count": 384, "embedding_size": 16}])
  """

  def __init__(self, mesh: mtf.Mesh, vocab_dim: mtf.Dimension, output_dim: mtf.Dimension,
               variable_dtype: mtf.VariableDType, name: str = "embedding",
               ensemble_dim=None, clusters: Optional[Sequence[Mapping[str, int]]] = None):
    specs = check_clusters(clusters, vocab_dim, output_dim, "AdaptiveVocabEmbedding")
    self._vocab_dim = vocab_dim
    self._output_dim = output_dim
    self._clusters = []
    start = 0
    for i, spec in enumerate(specs):
      self._clusters.append(make_cluster(
          mesh, vocab_dim, output_dim, variable_dtype, f"{name}_{i}", ensemble_dim, start,
          spec["token_count"], spec["embedding_size"]))
      start += spec["token_count"]

  def ids_to_embedding(self, ids: mtf.Tensor,
                       context: Optional[transformer.Context] = None) -> mtf.Tensor:
    """Each id embedded by its cluster: [ids dims..., d_model]."""
    parts = [c.ids_to_embedding(ids, context) for c in self._clusters]
    return parts[0] if len(parts) == 1 else mtf.add_n(parts)

  def hidden_to_logits(self, hidden: mtf.Tensor,
                       context: Optional[transformer.Context] = None) -> mtf.Tensor:
    """The clusters' logits concatenated along "vocab": [..., vocab]."""
    parts = [c.hidden_to_logits(hidden, context) for c in self._clusters]
    return parts[0] if len(parts) == 1 else mtf.concat(parts, self._vocab_dim.name)


class MixtureOfSoftmaxes:
  """A mixture of softmaxes (https://arxiv.org/abs/1711.03953): the output
  distribution is a weighted mixture of K softmaxes, which lifts the rank
  limit of a single softmax (the "softmax bottleneck").

  With h = hidden * d_model^-0.5::

    prior_k = softmax_k(h . mixture_weights[k]),
    context_k = tanh(h . context_weights[k]),
    p(v) = sum_k prior_k softmax_v(context_k . embedding[v]),

  and the logits are log p(v) (log-probabilities, so the model's softmax of
  them is p itself). The input embedding is a plain table.

  Only makes the output softmax when the model shares its embedding and
  softmax weights (a Unitransformer without them says so).

  Args:
    mesh, vocab_dim, output_dim, variable_dtype, ensemble_dim: as
      `transformer.VocabEmbedding`.
    name: the variables are `name`_embedding_weights [vocab, d_model],
      `name`_mixture_weights [softmax_components, d_model] and
      `name`_context_weights [softmax_components, _d_model_copy, d_model].
    num_softmaxes: K, the number of mixture components
      ("softmax_components"); required.

  Example:
    >>> emb = MixtureOfSoftmaxes(mesh, vocab_dim, model_dim, vdtype,
    ...                          "embedding", None, num_softmaxes=4)
    >>> log_probs = emb.hidden_to_logits(hidden, context)   # [..., vocab]
  """

  logits_need_shared_weights = True

  def __init__(self, mesh: mtf.Mesh, vocab_dim: mtf.Dimension, output_dim: mtf.Dimension,
               variable_dtype: mtf.VariableDType, name: str = "embedding",
               ensemble_dim=None, num_softmaxes: Optional[int] = None):
    k = transformer.positive_int(
        num_softmaxes, "MixtureOfSoftmaxes: num_softmaxes",
        " (gin: MixtureOfSoftmaxes.num_softmaxes = 4)")
    self._vocab_dim = vocab_dim
    self._output_dim = output_dim
    self._copy_dim = mtf.Dimension(f"_{output_dim.name}_copy", output_dim.size)
    self._components_dim = mtf.Dimension("softmax_components", k)
    ensemble = _ensemble_dims(ensemble_dim)
    self._embedding_weights = mtf.layers.embedding_weights(
        mesh, vocab_dim, output_dim, variable_dtype, name=f"{name}_embedding_weights",
        ensemble_dim=ensemble)
    self._mixture_weights = mtf.layers.embedding_weights(
        mesh, self._components_dim, output_dim, variable_dtype,
        name=f"{name}_mixture_weights", ensemble_dim=ensemble)
    self._context_weights = mtf.layers.embedding_weights(
        mesh, self._copy_dim, output_dim, variable_dtype, name=f"{name}_context_weights",
        ensemble_dim=ensemble + [self._components_dim])

  def ids_to_embedding(self, ids: mtf.Tensor,
                       context: Optional[transformer.Context] = None) -> mtf.Tensor:
    """embedding_weights[ids]: [ids dims..., d_model]."""
    del context
    return mtf.gather(self._embedding_weights, ids, self._vocab_dim)

  def hidden_to_logits(self, hidden: mtf.Tensor,
                       context: Optional[transformer.Context] = None) -> mtf.Tensor:
    """log of the mixture's probabilities: [..., vocab].

    Sums probabilities in log space (a logsumexp over the components), so
    it is stable in float32; in bfloat16 the log-probabilities of rare
    tokens lose precision.
    """
    del context
    h = hidden * (self._output_dim.size ** -0.5)
    log_prior = mtf.log_softmax(
        mtf.einsum([h, self._mixture_weights], reduced_dims=[self._output_dim]),
        self._components_dim)
    contexts = mtf.tanh(mtf.einsum(
        [mtf.rename_dimension(h, self._output_dim.name, self._copy_dim.name),
         self._context_weights], reduced_dims=[self._copy_dim]))
    log_probs = mtf.log_softmax(
        mtf.einsum([contexts, self._embedding_weights], reduced_dims=[self._output_dim]),
        self._vocab_dim)
    return mtf.reduce_logsumexp(log_prior + log_probs, self._components_dim)


class Mixtape:
  """Mixtape (Yang et al., "Mixtape: Breaking the Softmax Bottleneck
  Efficiently", NeurIPS 2019): four context vectors make four logit
  vectors, mixed per token by gates from a sigmoid tree.

  With h = hidden * d_model^-0.5::

    context_g = tanh(h . context_weights[g] + context_weights_bias[g]),
      for the 4 gates g ("gates");
    component_g(v) = context_g . embedding[v];
    a = tanh(prior_weights . h + prior_weights_bias)  [3, gate_embedding];
    prior(v) = prior_gates_vector . h  (3 values, one per tree node)
      + [for frequent tokens] prior_vocab_vector[v] . a + prior_bias[v];
    the tree's three sigmoids s0, s1, s2 give the gates
      (s0 s1, s0 (1 - s1), (1 - s0) s2, (1 - s0)(1 - s2));
    logits(v) = sum_g gate_g(v) component_g(v).

  Rare tokens share the gates of the context (no per-token prior), which is
  what makes Mixtape cheaper than a mixture of softmaxes.

  Frequency order: the vocabulary is taken as sorted by decreasing frequency
  with `extra_ids` sentinels at its end, which count as the most frequent;
  the first frequent_token_fraction of that order is "frequent".

  Only makes the output softmax when the model shares its embedding and
  softmax weights (a Unitransformer without them says so).

  Args:
    mesh, vocab_dim, output_dim, variable_dtype, ensemble_dim: as
      `transformer.VocabEmbedding`.
    name: the variables are `name`_embedding_weights, _context_weights,
      _context_weights_bias, _prior_weights, _prior_weights_bias,
      _prior_vocab_vector, _prior_gates_vector and _prior_bias.
    extra_ids: the number of sentinel ids at the end of the vocabulary.
    dropout_rate: dropout on the component logits and on a (training).
    gate_embedding_size: the size of a ("gate_embedding"), usually much
      smaller than d_model; required.
    frequent_token_fraction: the fraction of tokens with their own prior.
    noise_std_dev: Gaussian noise added to the gate logits (training).

  Example:
    >>> emb = Mixtape(mesh, vocab_dim, model_dim, vdtype, "embedding", None,
    ...               gate_embedding_size=16, frequent_token_fraction=0.25)
  """

  logits_need_shared_weights = True

  def __init__(self, mesh: mtf.Mesh, vocab_dim: mtf.Dimension, output_dim: mtf.Dimension,
               variable_dtype: mtf.VariableDType, name: str = "embedding",
               ensemble_dim=None, extra_ids: int = 0, dropout_rate: float = 0.0,
               gate_embedding_size: Optional[int] = None,
               frequent_token_fraction: float = 0.1, noise_std_dev: float = 0.0):
    gate_size = transformer.positive_int(
        gate_embedding_size, "Mixtape: gate_embedding_size",
        " (gin: Mixtape.gate_embedding_size = 16)")
    if not 0.0 <= frequent_token_fraction <= 1.0:
      raise ValueError(f"Mixtape: frequent_token_fraction must be in [0, 1], got "
                       f"{frequent_token_fraction}.")
    if not 0 <= extra_ids <= vocab_dim.size:
      raise ValueError(f"Mixtape: extra_ids must be in [0, {vocab_dim.size}], got {extra_ids}.")
    if not 0.0 <= dropout_rate < 1.0:
      raise ValueError(f"Mixtape: dropout_rate must be in [0, 1), got {dropout_rate}.")
    if noise_std_dev < 0.0:
      raise ValueError(f"Mixtape: noise_std_dev must be >= 0, got {noise_std_dev}.")
    self._mesh = mesh
    self._vocab_dim = vocab_dim
    self._output_dim = output_dim
    self._extra_ids = extra_ids
    self._dropout_rate = dropout_rate
    self._noise_std_dev = noise_std_dev
    self._num_frequent = int(frequent_token_fraction * vocab_dim.size)
    self._copy_dim = mtf.Dimension(f"_{output_dim.name}_copy", output_dim.size)
    self._gates_dim = mtf.Dimension("gates", 4)
    self._nodes_dim = mtf.Dimension("gate_nodes", 3)
    self._gate_embedding_dim = mtf.Dimension("gate_embedding", gate_size)
    ensemble = _ensemble_dims(ensemble_dim)
    normal = mtf.initializers.random_normal_or_replaced(stddev=1.0)
    zeros = mtf.initializers.zeros()

    def variable(suffix, dims, initializer):
      return mtf.get_variable(mesh, f"{name}_{suffix}", mtf.Shape(ensemble + dims),
                              dtype=variable_dtype, initializer=initializer)
    self._embedding_weights = variable("embedding_weights", [vocab_dim, output_dim], normal)
    self._context_weights = variable(
        "context_weights", [self._gates_dim, self._copy_dim, output_dim], normal)
    self._context_weights_bias = variable("context_weights_bias",
                                          [self._gates_dim, output_dim], zeros)
    self._prior_weights = variable(
        "prior_weights", [self._nodes_dim, self._gate_embedding_dim, output_dim], normal)
    self._prior_weights_bias = variable("prior_weights_bias",
                                        [self._nodes_dim, self._gate_embedding_dim], zeros)
    self._prior_gates_vector = variable("prior_gates_vector",
                                        [self._nodes_dim, output_dim], normal)
    if self._num_frequent:
      # Rows in frequency order (sentinels first), looked up per token.
      self._frequent_dim = mtf.Dimension("frequent_vocab", self._num_frequent)
      self._prior_vocab_vector = variable(
          "prior_vocab_vector", [self._frequent_dim, self._gate_embedding_dim], normal)
      self._prior_bias = variable("prior_bias", [self._frequent_dim, self._nodes_dim], normal)

  def ids_to_embedding(self, ids: mtf.Tensor,
                       context: Optional[transformer.Context] = None) -> mtf.Tensor:
    """embedding_weights[ids]: [ids dims..., d_model]."""
    del context
    return mtf.gather(self._embedding_weights, ids, self._vocab_dim)

  def _dropout(self, x: mtf.Tensor, context) -> mtf.Tensor:
    """Dropout in training, with one mask for all positions."""
    if context is None or not context.train or not self._dropout_rate:
      return x
    length = context.length_dim
    noise = x.shape - [length] if length is not None and length in x.shape.dims else x.shape
    return mtf.dropout(x, True, rate=self._dropout_rate, noise_shape=noise)

  def _frequency_rank(self):
    """(rank [vocab] int32, frequent [vocab] bool): each token's place in the
    frequency order (sentinels first) and whether it is frequent."""
    v = mtf.range(self._mesh, self._vocab_dim, dtype=tf.int32)
    size, extra = self._vocab_dim.size, self._extra_ids
    rank = v + extra - size * mtf.to_int32(mtf.greater_equal(v, size - extra))
    return rank, mtf.less(rank, self._num_frequent)

  def _gate_logits(self, h: mtf.Tensor, context) -> mtf.Tensor:
    """The sigmoid tree's pre-activations [..., vocab, gate_nodes]."""
    shared = mtf.einsum([self._prior_gates_vector, h], reduced_dims=[self._output_dim])
    logits = shared + mtf.zeros(self._mesh, mtf.Shape([self._vocab_dim]), dtype=shared.dtype)
    if self._num_frequent:
      a = mtf.tanh(mtf.einsum([self._prior_weights, h], reduced_dims=[self._output_dim])
                   + self._prior_weights_bias)
      a = self._dropout(a, context)
      rank, frequent = self._frequency_rank()
      row = rank * mtf.to_int32(frequent)  # any valid row for rare tokens
      vectors = mtf.gather(self._prior_vocab_vector, row, self._frequent_dim)
      bias = mtf.gather(self._prior_bias, row, self._frequent_dim)
      own = mtf.einsum([vectors, a], reduced_dims=[self._gate_embedding_dim]) + bias
      logits = logits + own * mtf.cast(frequent, own.dtype)
    if context is not None and context.train and self._noise_std_dev:
      logits = logits + mtf.random_normal(self._mesh, logits.shape, stddev=self._noise_std_dev,
                                          dtype=logits.dtype)
    return logits

  def _sigmoid_tree(self, logits: mtf.Tensor) -> mtf.Tensor:
    """Gate weights [..., gates] (summing to 1) from three node logits."""
    s0, s1, s2 = mtf.unstack(mtf.sigmoid(logits), self._nodes_dim)
    gates = [s0 * s1, s0 * (1.0 - s1), (1.0 - s0) * s2, (1.0 - s0) * (1.0 - s2)]
    return mtf.stack(gates, self._gates_dim.name, axis=gates[0].shape.ndims)

  def hidden_to_logits(self, hidden: mtf.Tensor,
                       context: Optional[transformer.Context] = None) -> mtf.Tensor:
    """The gate-weighted sum of the four component logits: [..., vocab]."""
    h = hidden * (self._output_dim.size ** -0.5)
    contexts = mtf.tanh(
        mtf.einsum([mtf.rename_dimension(h, self._output_dim.name, self._copy_dim.name),
                    self._context_weights], reduced_dims=[self._copy_dim])
        + self._context_weights_bias)
    components = mtf.einsum([contexts, self._embedding_weights], reduced_dims=[self._output_dim])
    components = self._dropout(components, context)
    gates = self._sigmoid_tree(self._gate_logits(h, context))
    return mtf.einsum([components, gates], reduced_dims=[self._gates_dim])
