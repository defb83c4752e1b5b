"""Product-key memory layers for `transformer.LayerStack` (Lample et al.
2019, "Large Memory Layers with Product Keys", arXiv:1907.05242).

A product-key memory is a very large table of value vectors (n_keys**2
rows) read by a handful of rows per token. Each token's query is cut into
two halves; half h is scored against its own set of n_keys sub-keys, and a
full key is a pair (i, j) of sub-keys whose score is the sum of the two
half scores. The best knn pairs are found without scoring all n_keys**2
pairs: the best pairs are always among the pairs of the knn best sub-keys
of each half, so only knn**2 candidates are ranked. Pair (i, j) reads row
i * n_keys + j of the value table; the knn rows are averaged with softmax
weights of their scores, and the results of the memory heads are summed.

The layer works position by position, so it needs no decoding cache: in
"incremental" mode (one position per sequence) it computes the same
outputs as over the whole sequence. Splitting the table's rows
("n_values", e.g. "n_values:cols") over a mesh dimension keeps a block of
rows on each processor; a lookup then reads its processor's rows and one
allreduce adds up the blocks, with the same results as on one device.

    >>> layers = [SelfAttention(num_heads=8, key_value_size=64),
    ...           ProductKeyValueMemory(key_size=256, n_keys=512, n_heads=4,
    ...                                 knn=32)]
"""

from __future__ import annotations

from typing import Tuple

import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import transformer


def _as_variable_dtype(dtype, activation_dtype: tf.DType) -> mtf.VariableDType:
  """A context's variable dtype as an mtf.VariableDType (a plain tf.DType or
  None, as some callers pass, means that dtype throughout)."""
  if isinstance(dtype, mtf.VariableDType):
    return dtype
  base = tf.as_dtype(dtype) if dtype is not None else activation_dtype
  return mtf.VariableDType(base, base, base)


class ProductKeyValueMemory(transformer.TransformerLayer):
  """A product-key memory: each token reads a softmax-weighted average of
  the knn best of n_keys**2 learned value vectors, per memory head, and the
  heads' results are summed (see the module docstring).

  Per head, the query is q = layer_norm(dense(x)) with two halves q_1, q_2
  of size key_size / 2 (the norm over each half, with a learned scale and
  bias); half h is scored against sub-keys K_h (score q_h . K_h[i]); pair
  (i, j) scores q_1 . K_1[i] + q_2 . K_2[j] and reads value row
  i * n_keys + j. Layout rules can refer to the dimensions "n_values" (the
  table's rows, the one worth splitting for a large memory), "n_keys" (the
  sub-keys), "n_heads" and "key" (a half of the query).

  Variables: "query/kernel" [d_model, n_heads, product_key, key] and
  "query/bias", "query_norm/layer_norm/layer_norm_scale" and "..._bias"
  [key], "keys" [n_heads, product_key, n_keys, key] (uniform in
  +-(key_size / 2)**-0.5) and "values" [n_values, d_model] (normal with
  standard deviation d_model**-0.5), where product_key has size 2 and
  n_values = n_keys**2.

  Args:
    key_size: the size of a query (both halves): each half has
      key_size // 2 (an odd size drops one).
    n_keys: sub-keys per half; the memory has n_keys**2 value rows.
    n_heads: memory heads (each with its own query, sub-keys and top knn).
    knn: rows read per head and token; at most n_keys.

  Example:
    >>> layer = ProductKeyValueMemory(key_size=128, n_keys=256, n_heads=2, knn=16)
    >>> y = layer.call(context, x)   # x: [batch, length, d_model] -> same shape
  """

  def __init__(self, key_size: int, n_keys: int, n_heads: int, knn: int):
    name = type(self).__name__
    for arg, value in (("key_size", key_size), ("n_keys", n_keys), ("n_heads", n_heads),
                       ("knn", knn)):
      transformer.positive_int(value, f"{name}: {arg}")
    if key_size < 2:
      raise ValueError(f"{name}: key_size must be at least 2 (the query is cut into two "
                       f"halves of key_size // 2), got {key_size}.")
    if knn > n_keys:
      raise ValueError(f"{name}: knn ({knn}) must not exceed n_keys ({n_keys}): each half "
                       f"of the query keeps its knn best of n_keys sub-keys.")
    self.key_size = key_size
    self.n_keys = n_keys
    self.n_values = n_keys ** 2
    self.n_heads = n_heads
    self.knn = knn

  # ---- dimensions ------------------------------------------------------------
  @property
  def heads_dim(self) -> mtf.Dimension:
    return mtf.Dimension("n_heads", self.n_heads)

  @property
  def halves_dim(self) -> mtf.Dimension:
    return mtf.Dimension("product_key", 2)

  @property
  def sub_keys_dim(self) -> mtf.Dimension:
    return mtf.Dimension("n_keys", self.n_keys)

  @property
  def half_key_dim(self) -> mtf.Dimension:
    return mtf.Dimension("key", self.key_size // 2)

  @property
  def values_dim(self) -> mtf.Dimension:
    return mtf.Dimension("n_values", self.n_values)

  @property
  def knn_dim(self) -> mtf.Dimension:
    return mtf.Dimension("knn", self.knn)

  # ---- call ------------------------------------------------------------------
  def call(self, context: transformer.Context, x: mtf.Tensor) -> mtf.Tensor:
    """The memory's read-out for every position of x ([batch..., (length,)
    d_model], d_model last), of x's shape."""
    mesh = context.mesh
    d_model = x.shape.dims[-1]
    vdtype = _as_variable_dtype(context.variable_dtype, x.dtype)
    half_key = self.half_key_dim
    bound = half_key.size ** -0.5
    keys = mtf.get_variable(
        mesh, "keys", mtf.Shape([self.heads_dim, self.halves_dim, self.sub_keys_dim, half_key]),
        initializer=mtf.initializers.random_uniform(-bound, bound), dtype=vdtype)
    values = mtf.layers.embedding_weights(
        mesh, self.values_dim, d_model, vdtype, name="values",
        initializer=mtf.initializers.random_normal(stddev=d_model.size ** -0.5))
    query = mtf.layers.dense(x, [self.heads_dim, self.halves_dim, half_key],
                             reduced_dims=[d_model], use_bias=True, variable_dtype=vdtype,
                             name="query")
    query = mtf.layers.layer_norm(query, half_key, name="query_norm")
    scores, rows = self.best_rows(query, mtf.cast(keys, query.dtype))
    weights = mtf.softmax(scores, self.knn_dim)
    read = mtf.gather(mtf.cast(values, x.dtype), rows, self.values_dim)
    return mtf.einsum([read, weights], output_shape=x.shape)

  def get_indices(self, keys: mtf.Tensor, query: mtf.Tensor) -> Tuple[mtf.Tensor, mtf.Tensor]:
    """best_rows(query, keys) under the original's name and argument order."""
    return self.best_rows(query, keys)

  def best_rows(self, query: mtf.Tensor,
                keys: mtf.Tensor) -> Tuple[mtf.Tensor, mtf.Tensor]:
    """The knn best value rows of each query and their scores.

    Args:
      query: [..., n_heads, product_key, key].
      keys: the sub-keys [n_heads, product_key, n_keys, key].

    Returns:
      (scores, rows), both [..., n_heads, knn]: the pair scores in
      decreasing order and their rows (int32) of the value table.

    Example:
      >>> scores, rows = layer.best_rows(query, keys)
    """
    knn, halves, sub_keys = self.knn_dim, self.halves_dim, self.sub_keys_dim
    per_key = mtf.Shape([d for d in query.shape.dims if d != self.half_key_dim] + [sub_keys])
    half_scores = mtf.einsum([query, keys], output_shape=per_key)
    # The knn best sub-keys of each half: [..., n_heads, product_key, knn].
    half_best, half_ids = mtf.top_k(half_scores, sub_keys, knn)
    first_scores, second_scores = mtf.unstack(half_best, halves)
    first_ids, second_ids = mtf.unstack(half_ids, halves)
    # Candidate pairs: [..., n_heads, knn, knn_second] -> [..., n_heads, knn_candidates].
    second = mtf.Dimension("knn_second", knn.size)
    candidates = mtf.Dimension("knn_candidates", knn.size * knn.size)
    pairs = mtf.Shape(first_scores.shape.dims + [second])
    pair_scores = mtf.add(first_scores, mtf.rename_dimension(second_scores, knn.name,
                                                             second.name), output_shape=pairs)
    pair_rows = mtf.add(first_ids * self.n_keys,
                        mtf.rename_dimension(second_ids, knn.name, second.name),
                        output_shape=pairs)
    pair_scores = mtf.replace_dimensions(pair_scores, [knn, second], candidates)
    pair_rows = mtf.replace_dimensions(pair_rows, [knn, second], candidates)
    scores, picked = mtf.top_k(pair_scores, candidates, knn)
    return scores, mtf.gather(pair_rows, picked, candidates)
