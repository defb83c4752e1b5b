"""Attention arithmetic shared by the transformer layers: projections,
scaled-free dot-product attention over a memory dimension, masks as additive
biases, and T5-style bucketed relative position biases.

Tensors use the dimension names of the transformer: queries
[batch..., heads, length, d_kv], keys and values [batch..., heads,
memory_length, d_kv]; during incremental decoding the query has no length
dimension.

    >>> q, k, v = project_qkv(x, memory, params)
    >>> o = attend(q, k, v, memory_dim, params.key_dim, bias)
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np
import tensorflow as tf

import mesh_tensorflow as mtf

NEG_INF = -1e9


class AttentionParams:
  """The projection weights of one (multi-head) attention layer, with the
  original Mesh TensorFlow's call form.

  Variables (under the caller's scope): "q" [query_input_dim,
  query_heads_dims..., key_dim] (absent with `no_query`), "k" and "v"
  [memory_input_dim, memory_heads_dims..., key_dim / value_dim] or, with
  `shared_kv`, one "kv"; "o" [query_heads_dims..., value_dim, output_dim];
  with an `ensemble_dim` each gets it first. The heads and channel
  dimensions are kept separate in the variables (`combine_dims` is accepted
  and changes nothing: the original's combined [d_model, heads * d_kv] is
  the same matrix, heads-major). Initialized normal with stddev
  query_input_dim^-0.5 (times key_dim^-0.5 when
  `fold_scaling_into_initializer`, which takes the place of the scores'
  1/sqrt(d_kv)) for q, memory_input_dim^-0.5 for k and v and
  (query heads * value_dim)^-0.5 for o; all 1.0 under
  `mtf.layers.unit_scaling_convention()`.

  Args:
    mesh: the mesh.
    query_input_dim: the channels of the queries' input (d_model).
    memory_input_dim: the channels of the memory's input.
    output_dim: the channels of the output.
    key_dim: the "d_kv" dimension of queries and keys.
    value_dim: the channel dimension of the values.
    query_heads_dims: the heads dimensions of the queries (a list, or None).
    memory_heads_dims: the heads dimensions of keys and values (a subset of
      query_heads_dims; [] or None for a single memory head).
    variable_dtype: an mtf.VariableDType.
    shared_kv: one projection "kv" for keys and values (key_dim == value_dim).
    no_query: make no "q" variable.
    combine_dims: accepted for compatibility (see above).
    ensemble_dim: an optional leading dimension of every variable.
    keep_query_heads_dims: `compute_output` keeps the query heads dimensions.
    fold_scaling_into_initializer: see above; if False, `compute_q` scales
      the queries by key_dim^-0.5.
    make_attention_vars: make q, k, v (False: only "o", as
      `ExpertsAttentionParams`).

  Example:
    >>> heads, d_kv = mtf.Dimension("heads", 8), mtf.Dimension("d_kv", 64)
    >>> params = AttentionParams(mesh, d_model, d_model, d_model, d_kv, d_kv,
    ...                          [heads], [heads], mtf.VariableDType())
    >>> q = params.compute_q(x)    # [batch, heads, length, d_kv]
  """

  def __init__(self, mesh: mtf.Mesh, query_input_dim: mtf.Dimension,
               memory_input_dim: mtf.Dimension, output_dim: mtf.Dimension,
               key_dim: mtf.Dimension, value_dim: mtf.Dimension,
               query_heads_dims, memory_heads_dims, variable_dtype: mtf.VariableDType,
               shared_kv: bool = False, no_query: bool = False, combine_dims: bool = True,
               ensemble_dim: Optional[mtf.Dimension] = None,
               keep_query_heads_dims: bool = False,
               fold_scaling_into_initializer: bool = True, make_attention_vars: bool = True):
    for what, d in (("query_input_dim", query_input_dim), ("memory_input_dim", memory_input_dim),
                    ("output_dim", output_dim), ("key_dim", key_dim), ("value_dim", value_dim)):
      if not isinstance(d, mtf.Dimension):
        raise TypeError(f"AttentionParams: {what} must be an mtf.Dimension, got {d!r}.")
    if shared_kv and key_dim != value_dim:
      raise ValueError(f"AttentionParams: shared_kv needs key_dim == value_dim, got {key_dim} "
                       f"and {value_dim}.")
    self.mesh = mesh
    self.query_input_dim = query_input_dim
    self.memory_input_dim = memory_input_dim
    self.output_dim = output_dim
    self.key_dim = key_dim
    self.value_dim = value_dim
    self.query_heads_dims = list(query_heads_dims or [])
    self.memory_heads_dims = list(memory_heads_dims or [])
    missing = [d for d in self.memory_heads_dims if d not in self.query_heads_dims]
    if missing:
      raise ValueError(f"AttentionParams: memory_heads_dims {missing} are not among "
                       f"query_heads_dims {self.query_heads_dims}.")
    self.variable_dtype = variable_dtype
    self.shared_kv = shared_kv
    self.no_query = no_query
    self.combine_dims = combine_dims
    self.ensemble_dim = ensemble_dim
    self.keep_query_heads_dims = keep_query_heads_dims
    self.fold_scaling_into_initializer = fold_scaling_into_initializer
    self.make_attention_vars = make_attention_vars
    lead = [ensemble_dim] if ensemble_dim else []
    self.q_shape = lead + [query_input_dim] + self.q_dims
    self.k_shape = lead + [memory_input_dim] + self.k_dims
    self.v_shape = lead + [memory_input_dim] + self.v_dims
    self.o_shape = lead + self.o_dims + [output_dim]
    self.init_weights()

  # The original's names of the library's earlier attributes.
  @property
  def heads(self) -> Optional[mtf.Dimension]:
    return self.query_heads_dims[0] if self.query_heads_dims else None

  @property
  def d_model(self) -> mtf.Dimension:
    return self.query_input_dim

  def init_weights(self) -> None:
    """Creates the variables (see the class docstring)."""
    if mtf.layers.unit_scaling_convention():
      q_std = kv_std = o_std = 1.0
    else:
      q_std = self.query_input_dim.size ** -0.5
      if self.fold_scaling_into_initializer:
        q_std *= self.key_dim.size ** -0.5
      kv_std = self.memory_input_dim.size ** -0.5
      o_std = mtf.Shape(self.query_heads_dims + [self.value_dim]).size ** -0.5

    def var(name, shape, stddev):
      return mtf.get_variable(self.mesh, name, mtf.Shape(shape),
                              initializer=mtf.initializers.random_normal(stddev=stddev),
                              dtype=self.variable_dtype)
    self.wq = self.wk = self.wv = self.wkv = None
    if self.make_attention_vars:
      if not self.no_query:
        self.wq = var("q", self.q_shape, q_std)
      if self.shared_kv:
        self.wkv = var("kv", self.k_shape, kv_std)
        self.wk = self.wv = self.wkv
      else:
        self.wk = var("k", self.k_shape, kv_std)
        self.wv = var("v", self.v_shape, kv_std)
    self.wo = var("o", self.o_shape, o_std)

  def _project(self, x: mtf.Tensor, w: mtf.Tensor, input_dim: mtf.Dimension,
               heads, channels: mtf.Dimension) -> mtf.Tensor:
    """einsum of x [..., (length,) input_dim] with w: [..., heads..., (length,)
    channels], the heads before the sequence dimension."""
    if input_dim not in x.shape.dims:
      raise ValueError(f"AttentionParams: the input {x.shape} has no {input_dim}.")
    rest = [d for d in x.shape.dims if d != input_dim]
    if self.ensemble_dim and self.ensemble_dim not in rest:
      rest = [self.ensemble_dim] + rest
    lead, last = rest[:-1], rest[-1:]
    if last and last[0].name not in ("length", "memory_length"):
      lead, last = rest, []
    return mtf.layers.us_einsum([x, w], output_shape=mtf.Shape(lead + heads + last + [channels]))

  def compute_q(self, query_antecedent: mtf.Tensor) -> mtf.Tensor:
    """Queries [batch..., query_heads..., (length,) key_dim]."""
    if self.wq is None:
      raise ValueError("AttentionParams.compute_q: made with no_query=True (no q variable).")
    q = self._project(query_antecedent, self.wq, self.query_input_dim, self.query_heads_dims,
                      self.key_dim)
    if not self.fold_scaling_into_initializer:
      q *= self.key_dim.size ** -0.5
    return q

  def compute_kv(self, memory_antecedent: mtf.Tensor) -> mtf.Tensor:
    """Keys (= values) of shared_kv params."""
    if not self.shared_kv:
      raise ValueError("AttentionParams.compute_kv needs shared_kv=True; use compute_k and "
                       "compute_v.")
    return self._project(memory_antecedent, self.wkv, self.memory_input_dim,
                         self.memory_heads_dims, self.key_dim)

  def compute_k(self, memory_antecedent: mtf.Tensor) -> mtf.Tensor:
    """Keys [batch..., memory_heads..., (memory_length,) key_dim] (with
    shared_kv: the shared projection)."""
    return self._project(memory_antecedent, self.wk, self.memory_input_dim,
                         self.memory_heads_dims, self.key_dim)

  def compute_v(self, memory_antecedent: mtf.Tensor) -> mtf.Tensor:
    """Values [batch..., memory_heads..., (memory_length,) value_dim]."""
    return self._project(memory_antecedent, self.wv, self.memory_input_dim,
                         self.memory_heads_dims, self.value_dim)

  def compute_output(self, o: mtf.Tensor, output_shape=None) -> mtf.Tensor:
    """o [batch..., query_heads..., (length,) value_dim] back to output_dim
    (output_shape, if given, orders the result)."""
    reduced = [self.value_dim] if self.keep_query_heads_dims else self.o_dims
    if output_shape is None:
      kept = [d for d in o.shape.dims if d not in reduced]
      if self.keep_query_heads_dims:
        kept += [d for d in self.query_heads_dims if d not in kept]
      output_shape = mtf.Shape(kept + [self.output_dim])
    return mtf.layers.us_einsum([o, self.wo], output_shape=mtf.Shape(output_shape))

  @property
  def q_dims(self):
    return self.query_heads_dims + [self.key_dim]

  @property
  def k_dims(self):
    return self.memory_heads_dims + [self.key_dim]

  @property
  def v_dims(self):
    return self.memory_heads_dims + [self.value_dim]

  @property
  def o_dims(self):
    return self.query_heads_dims + [self.value_dim]


class ExpertsAttentionParams(AttentionParams):
  """Attention whose queries and keys come from a mixture-of-experts layer
  (`moe.MoE1D` with use_experts_attention): the experts read the query
  antecedent and output queries ("q_wo") and keys ("k_wo", also the values),
  over one combined dimension (named like the first heads dimension, of size
  heads * key_dim) split back into heads and key_dim. Only the output
  projection "o" is a plain variable. The arguments are AttentionParams'
  plus `context` (the layer's Context) and `experts_hparams` (MoE1D's
  arguments: num_experts, hidden_size, moe_gating, ...; an object with those
  attributes or a dict). shared_kv must be True, and the memory heads must
  be the query heads.

  With `memory_from_query=False` (`ExpertsEncDecAttention`) the keys come
  from the experts applied to the memory antecedent instead.

  Example:
    >>> params = ExpertsAttentionParams(mesh, d_model, d_model, d_model, d_kv, d_kv,
    ...                                 [heads], [heads], vdtype, shared_kv=True,
    ...                                 context=context,
    ...                                 experts_hparams={"num_experts": 4, "hidden_size": 64})
    >>> q = params.compute_q(x)
  """

  _HPARAMS = ("moe_gating", "num_experts", "loss_coef", "group_size", "min_expert_capacity",
              "capacity_factor_train", "capacity_factor_eval", "switch_policy_train",
              "switch_policy_eval", "switch_dropout", "switch_temperature", "switch_jitter",
              "hidden_size")

  def __init__(self, mesh, query_input_dim, memory_input_dim, output_dim, key_dim, value_dim,
               query_heads_dims, memory_heads_dims, variable_dtype, shared_kv=False,
               no_query=False, combine_dims=True, ensemble_dim=None,
               keep_query_heads_dims=False, fold_scaling_into_initializer=True, context=None,
               experts_hparams=None, memory_from_query: bool = True):
    super().__init__(mesh, query_input_dim, memory_input_dim, output_dim, key_dim, value_dim,
                     query_heads_dims, memory_heads_dims, variable_dtype, shared_kv=shared_kv,
                     no_query=no_query, combine_dims=combine_dims, ensemble_dim=ensemble_dim,
                     keep_query_heads_dims=keep_query_heads_dims,
                     fold_scaling_into_initializer=fold_scaling_into_initializer,
                     make_attention_vars=False)
    if not shared_kv:
      raise ValueError("ExpertsAttentionParams: shared_kv must be True (keys are also the "
                       "values).")
    if not combine_dims:
      raise ValueError("ExpertsAttentionParams: combine_dims must be True.")
    if mtf.layers.unit_scaling_convention():
      raise ValueError("ExpertsAttentionParams does not follow the unit scaling convention; "
                       "turn mtf.layers.unit_scaling_convention off.")
    if self.k_dims != self.q_dims:
      raise ValueError(f"ExpertsAttentionParams: the memory heads {self.memory_heads_dims} must "
                       f"be the query heads {self.query_heads_dims} (num_memory_heads=0).")
    if context is None or experts_hparams is None:
      raise ValueError("ExpertsAttentionParams needs context and experts_hparams.")
    from mesh_tensorflow.transformer import moe  # pylint: disable=g-import-not-at-top
    get = (experts_hparams.get if isinstance(experts_hparams, dict)
           else lambda k: getattr(experts_hparams, k, None))
    kwargs = {k: get(k) for k in self._HPARAMS if get(k) is not None}
    self.context = context
    self.memory_from_query = memory_from_query
    self.combined_dim = mtf.Dimension(self.q_dims[0].name, mtf.Shape(self.q_dims).size)
    # The experts' hidden dimension is "expert_hidden" (as the original's MoE
    # layers name it), so a layout may split "d_ff" and "heads" alike.
    self.moe_layer = moe.MoE1D(output_dim=self.combined_dim, use_experts_attention=True,
                               hidden_dim_name="expert_hidden", **kwargs)
    self._q = self._k = self._memory = self._memory_k = None

  def _experts(self, antecedent: mtf.Tensor):
    q, k = self.moe_layer.call(self.context, antecedent)
    q = mtf.replace_dimensions(q, self.combined_dim, self.q_dims) * self.key_dim.size ** -0.5
    return q, mtf.replace_dimensions(k, self.combined_dim, self.k_dims)

  def compute_q(self, query_antecedent: mtf.Tensor) -> mtf.Tensor:
    self._q, self._k = self._experts(query_antecedent)
    return self._q

  def compute_k(self, memory_antecedent: mtf.Tensor) -> mtf.Tensor:
    if not self.memory_from_query:
      if self._memory is not memory_antecedent:  # compute_k then compute_v: one MoE call
        self._memory, self._memory_k = memory_antecedent, self._experts(memory_antecedent)[1]
      return self._memory_k
    if self._k is None:
      raise ValueError("ExpertsAttentionParams: call compute_q first (it computes the keys).")
    k = self._k
    for d in memory_antecedent.shape.dims:
      if d.name.startswith("memory_") and d.name[len("memory_"):] in k.shape.dimension_names:
        k = mtf.rename_dimension(k, d.name[len("memory_"):], d.name)
    return k

  compute_kv = compute_k
  compute_v = compute_k


def attention_params_simple(mesh: mtf.Mesh, io_dim: mtf.Dimension, kv_dim: mtf.Dimension,
                            heads_dim: mtf.Dimension,
                            variable_dtype: mtf.VariableDType) -> AttentionParams:
  """AttentionParams of ordinary multi-head attention: io_dim in and out,
  heads_dim for queries and memory, kv_dim for keys and values.

  Example:
    >>> params = attention_params_simple(mesh, d_model, d_kv, heads, mtf.VariableDType())
  """
  return AttentionParams(mesh, io_dim, io_dim, io_dim, kv_dim, kv_dim, [heads_dim], [heads_dim],
                         variable_dtype)


def attend(q: mtf.Tensor, k: mtf.Tensor, v: mtf.Tensor, memory_dim: mtf.Dimension,
           key_dim: mtf.Dimension, bias: Optional[mtf.Tensor] = None,
           dropout_rate: float = 0.0, train: bool = False, scale: Optional[float] = None,
           log_z: Optional[list] = None) -> mtf.Tensor:
  """softmax(scale * q.k + bias) . v over memory_dim (no 1/sqrt(d_kv) unless
  `scale` says so: see AttentionParams).

  Args:
    q: [batch..., heads, (length,) d_kv].
    k: [batch..., (heads,) memory_length, d_kv].
    v: like k.
    memory_dim: the dimension attended over.
    key_dim: the dimension summed in q.k (also v's depth).
    bias: additive, broadcastable to the logits, or None.
    dropout_rate: dropout on the attention weights (training only).
    train: whether training.
    scale: multiplies the scores q.k (None: 1).
    log_z: if a list, the log-partition of the softmax, [batch..., heads,
      (length)], is appended to it (for an auxiliary z-loss).

  Returns:
    [batch..., heads, (length,) d_kv], q's shape.

  Example:
    >>> o = attend(q, k, v, memory_length, d_kv, bias)
  """
  logits_dims = [d for d in q.shape.dims if d != key_dim]
  logits_dims += [d for d in k.shape.dims if d not in logits_dims and d != key_dim]
  logits = mtf.einsum([q, k], output_shape=mtf.Shape(logits_dims))
  if scale is not None:
    logits = logits * scale
  if bias is not None:
    logits = logits + mtf.cast(bias, logits.dtype)
  if log_z is not None:
    log_z.append(mtf.reduce_logsumexp(logits, memory_dim))
  weights = mtf.softmax(logits, memory_dim)
  if train and dropout_rate > 0.0:
    weights = mtf.dropout(weights, True, rate=dropout_rate)
  return mtf.einsum([weights, v], output_shape=q.shape)


def bias_where(hidden: mtf.Tensor, dtype=tf.float32) -> mtf.Tensor:
  """NEG_INF where `hidden` (bool) is true, else 0 (-3e4 in float16, whose
  range ends at 65504: 0 * -inf would be NaN)."""
  return mtf.cast(hidden, dtype) * (-3e4 if tf.as_dtype(dtype) == tf.float16 else NEG_INF)


def add_bias(a: Optional[mtf.Tensor], b: Optional[mtf.Tensor]) -> Optional[mtf.Tensor]:
  if a is None:
    return b
  if b is None:
    return a
  return a + b


def to_memory(x: mtf.Tensor, length_name: str = "length") -> mtf.Tensor:
  """x with its "length" dimension renamed "memory_length"."""
  return mtf.rename_dimension(x, length_name, "memory_" + length_name)


# ------------------------------------------------------------ relative positions
def relative_position_bucket(relative_position: np.ndarray, bidirectional: bool = True,
                             num_buckets: int = 32, max_distance: int = 128) -> np.ndarray:
  """T5's bucket of each relative position (memory position - query position).

  Half the buckets (all of them if not bidirectional, where positions after
  the query share bucket 0) cover exact small distances, the rest distances
  growing logarithmically up to max_distance; farther ones share the last
  bucket. Computed in NumPy, so the buckets are exact integers whatever the
  layout.

  Example:
    >>> relative_position_bucket(np.array([-1, 0, 1]), bidirectional=False)
    array([1, 0, 0])
  """
  n = -np.asarray(relative_position, np.int64)
  bucket = np.zeros_like(n)
  if bidirectional:
    num_buckets //= 2
    bucket += (n < 0).astype(np.int64) * num_buckets
    n = np.abs(n)
  else:
    n = np.maximum(n, 0)
  max_exact = num_buckets // 2
  is_small = n < max_exact
  with np.errstate(divide="ignore"):
    large = max_exact + (np.log(np.maximum(n, 1) / max_exact) / math.log(max_distance / max_exact)
                         * (num_buckets - max_exact)).astype(np.int64)
  large = np.minimum(large, num_buckets - 1)
  return bucket + np.where(is_small, n, large)


def relative_position_bias(weights: mtf.Tensor, query_position: mtf.Tensor,
                           memory_dim: mtf.Dimension, bidirectional: bool,
                           max_distance: int = 128) -> mtf.Tensor:
  """The learned bias of each (query, memory position) pair.

  Args:
    weights: [heads, buckets] bias variable.
    query_position: int positions of the queries ([length] or, when
      decoding, a scalar or [batch...]).
    memory_dim: the memory dimension; memory positions are its indices.
    bidirectional: use separate buckets for memory after the query.
    max_distance: see `relative_position_bucket`.

  Returns:
    [query_position dims..., memory_dim, heads].

  Example:
    >>> bias = relative_position_bias(w, mtf.range(mesh, length), memory_length, False)
  """
  mesh = weights.mesh
  buckets_dim = weights.shape.dims[-1]
  size = memory_dim.size
  rel_dim = mtf.Dimension("relative_position", 2 * size - 1)
  table = relative_position_bucket(np.arange(-(size - 1), size), bidirectional,
                                   buckets_dim.size, max_distance).astype(np.int32)
  table = mtf.constant(mesh, table, mtf.Shape([rel_dim]), dtype=tf.int32)
  rel = mtf.range(mesh, memory_dim, tf.int32) - query_position + (size - 1)
  rel = mtf.minimum(mtf.maximum(rel, 0), 2 * size - 2)
  buckets = mtf.gather(table, rel, rel_dim)
  return mtf.gather(weights, buckets, buckets_dim)


# ------------------------------------------------------ the original's functions
def visibility_mask_to_attention_bias(visible: mtf.Tensor, dtype) -> mtf.Tensor:
  """An additive attention bias: 0 where `visible` (bool) is true, a large
  negative number where it is false (-1e9; -3e4 in float16, whose range ends
  at 65504).

  Example:
    >>> bias = visibility_mask_to_attention_bias(mtf.less_equal(m_pos, q_pos), tf.float32)
  """
  return bias_where(mtf.logical_not(visible), dtype)


def _is_training(context) -> bool:
  return True if context is None else bool(context.train)


def _dropout_weights(weights: mtf.Tensor, context, dropout_rate: float,
                     dropout_broadcast_dims) -> mtf.Tensor:
  """Dropout on attention weights, the same mask along dropout_broadcast_dims."""
  if not dropout_rate or not _is_training(context):
    return weights
  noise_shape = weights.shape - list(dropout_broadcast_dims or [])
  return mtf.dropout(weights, True, rate=dropout_rate, noise_shape=noise_shape)


def _output_shape(q: mtf.Tensor, key_dim: mtf.Dimension, value_dim: mtf.Dimension) -> mtf.Shape:
  """q's shape with key_dim replaced (in place) by value_dim."""
  return mtf.Shape([value_dim if d == key_dim else d for d in q.shape.dims])


def attention(q: mtf.Tensor, k: mtf.Tensor, v: mtf.Tensor, memory_length_dim: mtf.Dimension,
              key_dim: mtf.Dimension, value_dim: mtf.Dimension,
              bias: Optional[mtf.Tensor] = None, dropout_rate: float = 0.0,
              dropout_broadcast_dims=None, extra_logit=None, context=None,
              float32_logits: bool = True) -> mtf.Tensor:
  """Dot-product attention: softmax(q.k + bias) over memory_length_dim, times v.

  The scores are not scaled (fold 1/sqrt(d_kv) into q, as `AttentionParams`
  does). q has other_query_dims + key_dim, k other_memory_dims +
  memory_length_dim + key_dim and v other_memory_dims + memory_length_dim +
  value_dim, other_memory_dims a subset of other_query_dims (typically q
  [batch, heads, length, d_kv], k and v [batch, heads, memory_length, d_kv]).

  Args:
    q, k, v: the queries, keys and values.
    memory_length_dim: the dimension attended over.
    key_dim: the channels of q and k (summed).
    value_dim: the channels of v.
    bias: added to the scores (broadcast), e.g. from
      `visibility_mask_to_attention_bias`.
    dropout_rate: dropout on the attention weights (when training: the
      context's mode, or always without a context).
    dropout_broadcast_dims: dimensions along which the dropout mask is shared.
    extra_logit: an extra logit (scalar or tensor) in each softmax's
      denominator, as if attending to a zero value.
    context: an optional transformer.Context (training flag; layout for
      `maybe_reshape_attention_input_for_2d_sharding`).
    float32_logits: compute the scores in float32.

  Returns:
    q.shape with key_dim replaced by value_dim.

  Example:
    >>> o = attention(q, k, v, memory_length, d_kv, d_kv, bias)
  """
  out_shape = _output_shape(q, key_dim, value_dim)
  q, k, v, bias = maybe_reshape_attention_input_for_2d_sharding(
      context, q, k, v, bias, [key_dim, value_dim])
  if float32_logits:
    q, k = mtf.cast(q, tf.float32), mtf.cast(k, tf.float32)
  logits = mtf.layers.us_einsum([q, k], reduced_dims=[key_dim])
  if bias is not None:
    logits += mtf.cast(bias, logits.dtype)
  weights = mtf.softmax(logits, memory_length_dim, extra_logit=extra_logit)
  weights = _dropout_weights(mtf.cast(weights, v.dtype), context, dropout_rate,
                             dropout_broadcast_dims)
  o = mtf.einsum([weights, v], output_shape=_output_shape(q, key_dim, value_dim))
  return mtf.reshape(o, out_shape) if o.shape != out_shape else o


def hybrid_attention(q: mtf.Tensor, k: mtf.Tensor, v: mtf.Tensor, context,
                     memory_length_dim: mtf.Dimension, key_dim: mtf.Dimension,
                     value_dim: mtf.Dimension, bias: Optional[mtf.Tensor] = None,
                     dropout_rate: float = 0.0, dropout_broadcast_dims=None,
                     extra_logit=None) -> mtf.Tensor:
  """A learned mixture of ordinary and doubly-normalized attention.

  With scores s = q.k + bias, the weights are
  c * softmax_memory(log_softmax_length(s)) + (1 - c) * softmax_memory(s),
  where the second normalization first normalizes over the queries ("length",
  of memory_length_dim's size) and c is the scalar variable "doubly_coeff"
  (initialized 0.5, clipped to [0, 1]). It needs every query position, so it
  works on whole sequences only (not in incremental decoding).

  Example:
    >>> o = hybrid_attention(q, k, v, context, memory_length, d_kv, d_kv, bias)
  """
  query_length_dim = mtf.Dimension("length", memory_length_dim.size)
  if query_length_dim not in q.shape.dims:
    raise ValueError(f"hybrid_attention: q {q.shape} has no {query_length_dim}: doubly-"
                     "normalized attention needs whole sequences (it cannot decode one "
                     "position at a time); use attention_func=None for decoding.")
  logits = mtf.layers.us_einsum([q, k], reduced_dims=[key_dim])
  if bias is not None:
    logits += mtf.cast(bias, logits.dtype)
  coeff = mtf.get_variable(context.mesh, "doubly_coeff", mtf.Shape([]),
                           initializer=mtf.initializers.constant(0.5),
                           dtype=context.variable_dtype)
  coeff = mtf.maximum(mtf.minimum(coeff, 1.0), 0.0)
  upper = mtf.softmax(logits, memory_length_dim, extra_logit=extra_logit)
  lower = mtf.log_softmax(logits, query_length_dim, extra_logit=extra_logit)
  doubly = mtf.softmax(lower, memory_length_dim, extra_logit=extra_logit)
  weights = coeff * doubly + (1.0 - coeff) * upper
  weights = _dropout_weights(weights, context, dropout_rate, dropout_broadcast_dims)
  return mtf.einsum([weights, v], output_shape=_output_shape(q, key_dim, value_dim))


SYNTHESIZE_MODES = ("random", "factorized", "dense_minus", "random_plus_alpha", "random_plus",
                    "dense_plus_alpha", "dense_plus")


def _slice_synthetic(r: mtf.Tensor, q: mtf.Tensor, memory_length_dim: mtf.Dimension,
                     context, gather_position: bool) -> mtf.Tensor:
  """r [..., length:max, memory_length:max] cut to the memory length and to
  the queries' length (or, decoding, the row of context.position)."""
  max_memory = r.shape.get_dim_by_name(memory_length_dim.name).size
  if memory_length_dim.size > max_memory:
    raise ValueError(f"synthetic_attention: memory length {memory_length_dim.size} exceeds the "
                     f"synthesizer's max_length {max_memory}; raise max_length.")
  r = mtf.slice(r, 0, memory_length_dim.size, memory_length_dim.name)
  if context is not None and context.mode == "incremental":
    if gather_position:
      r = mtf.gather(r, context.position, r.shape.get_dim_by_name("length"))
    return r
  length_dim = q.shape.get_dim_by_name("length")
  return mtf.slice(r, 0, length_dim.size, "length")


def _alpha_mix(context, logits: mtf.Tensor, r: mtf.Tensor, with_alpha: bool) -> mtf.Tensor:
  if not with_alpha:
    return logits + r
  alpha = mtf.get_variable(context.mesh, "alpha", mtf.Shape([mtf.Dimension("alpha", 1)]),
                           initializer=mtf.initializers.zeros(), dtype=context.variable_dtype)
  alpha = mtf.reduce_sum(mtf.sigmoid(alpha))  # the one value, as a scalar
  return (1.0 - alpha) * logits + alpha * r


def synthetic_attention(q: mtf.Tensor, k: mtf.Tensor, v: mtf.Tensor,
                        memory_length_dim: mtf.Dimension, key_dim: mtf.Dimension,
                        value_dim: mtf.Dimension, bias: Optional[mtf.Tensor] = None,
                        dropout_rate: float = 0.0, dropout_broadcast_dims=None,
                        extra_logit=None, synthesize: bool = True,
                        synthesize_mode: str = "random_plus_alpha", factorized_dim: int = 16,
                        max_length: int = 512, context=None) -> mtf.Tensor:
  """Synthesizer attention (Tay et al., "Synthesizer: Rethinking
  Self-Attention in Transformer Models"): scores that are learned rather than
  (or as well as) computed from query-key dot products.

  Modes (variables under the caller's scope):

  * "random": learned scores "R" [length:max_length, heads,
    memory_length:max_length]; q is not used (only its dimensions).
  * "factorized": R = R1 . R2 over "tmp":factorized_dim, "R1" and "R2"
    [tmp, heads, memory_length:512] (R1's memory_length indexes the queries).
  * "dense_minus": scores dense(relu(q)) -> memory_length:max_length
    (variable "pi/kernel" [d_kv, memory_length]).
  * "random_plus" / "random_plus_alpha": q.k plus R [length:512, heads,
    memory_length:512], or (1 - a) q.k + a R with a = sigmoid("alpha").
  * "dense_plus" / "dense_plus_alpha": the same with the dense scores.

  Learned scores are cut to the actual lengths; in incremental decoding the
  row of the position being decoded is used. With synthesize=False this is
  plain dot-product attention.

  Args:
    q: as `attention`, and so are k, v, memory_length_dim, key_dim,
      value_dim, bias, dropout_rate, dropout_broadcast_dims and extra_logit.
    synthesize: use the synthetic scores.
    synthesize_mode: one of the modes above.
    factorized_dim: the size of "tmp" (factorized mode).
    max_length: the longest sequence of the random and dense_minus modes.
    context: the transformer.Context (required: mesh, mode, variable dtype).

  Returns:
    [other query dims..., heads, value_dim] ("random", "factorized"), q.shape
    with key_dim replaced by value_dim (the others).

  Example:
    >>> o = synthetic_attention(q, k, v, memory_length, d_kv, d_kv, bias,
    ...                         synthesize_mode="random_plus_alpha", context=context)
  """
  if synthesize and synthesize_mode not in SYNTHESIZE_MODES:
    raise ValueError(f"synthetic_attention: synthesize_mode must be one of "
                     f"{SYNTHESIZE_MODES}, got {synthesize_mode!r}.")
  if synthesize and context is None:
    raise ValueError("synthetic_attention: synthesize=True needs the layer's context.")
  heads = None
  if synthesize:
    if "heads" not in [d.name for d in v.shape.dims]:
      raise ValueError(f"synthetic_attention: v {v.shape} needs a \"heads\" dimension.")
    heads = v.shape.get_dim_by_name("heads")

    def table(name, dims):
      return mtf.get_variable(context.mesh, name, mtf.Shape(dims), dtype=context.variable_dtype)
    if synthesize_mode == "random":
      r = table("R", [mtf.Dimension("length", max_length), heads,
                      mtf.Dimension("memory_length", max_length)])
      logits = _slice_synthetic(r, q, memory_length_dim, context, True)
    elif synthesize_mode == "factorized":
      tmp, mem = mtf.Dimension("tmp", factorized_dim), mtf.Dimension("memory_length", 512)
      r1 = mtf.rename_dimension(table("R1", [tmp, heads, mem]), "memory_length", "length")
      r2 = table("R2", [tmp, heads, mem])
      r = mtf.einsum([r1, r2], output_shape=mtf.Shape(
          [mtf.Dimension("length", 512), heads, mem]))
      logits = _slice_synthetic(r, q, memory_length_dim, context, True)
    elif synthesize_mode.startswith("dense"):
      size = max_length if synthesize_mode == "dense_minus" else 512
      r = mtf.layers.dense(mtf.relu(q), [mtf.Dimension("memory_length", size)], use_bias=False,
                           name="pi", reduced_dims=[key_dim])
      r = _slice_synthetic(r, q, memory_length_dim, context, False)
      if synthesize_mode == "dense_minus":
        logits = r
      else:
        logits = _alpha_mix(context, mtf.einsum([q, k], reduced_dims=[key_dim]), r,
                            "alpha" in synthesize_mode)
    else:
      r = table("R", [mtf.Dimension("length", 512), heads, mtf.Dimension("memory_length", 512)])
      r = _slice_synthetic(r, q, memory_length_dim, context, True)
      logits = _alpha_mix(context, mtf.einsum([q, k], reduced_dims=[key_dim]), r,
                          "alpha" in synthesize_mode)
  else:
    logits = mtf.einsum([q, k], reduced_dims=[key_dim])
  if bias is not None:
    logits += mtf.cast(bias, logits.dtype)
  weights = mtf.softmax(logits, memory_length_dim, extra_logit=extra_logit)
  weights = _dropout_weights(weights, context, dropout_rate, dropout_broadcast_dims)
  if synthesize and synthesize_mode in ("random", "factorized"):
    rest = [d for d in q.shape.dims if d != key_dim and d != heads][:-1] if (
        key_dim in q.shape.dims) else q.shape.dims[:-1]
    out_shape = mtf.Shape([d for d in rest if d != heads] + [heads, value_dim])
  else:
    out_shape = _output_shape(q, key_dim, value_dim)
  return mtf.einsum([weights, v], output_shape=out_shape)


def local_attention_1d(q: mtf.Tensor, k: mtf.Tensor, v: Optional[mtf.Tensor],
                       length_dim: mtf.Dimension, key_dim: mtf.Dimension,
                       value_dim: mtf.Dimension, fully_autoregressive: bool = True,
                       length_dim_num_splits: int = 1, radius: int = 128, sequence_id=1,
                       write_priority: Optional[mtf.Tensor] = None,
                       read_priority: Optional[mtf.Tensor] = None,
                       attention_kwargs: Optional[dict] = None) -> mtf.Tensor:
  """Attention to a neighbourhood, computed block by block.

  Query position p sees memory positions in (p - radius, p] if
  fully_autoregressive, else in (p - radius, p + radius]; only positions of
  its own sequence (equal sequence_id); and, given priorities, only where
  read_priority[p] >= write_priority[m]. The length is cut into blocks (the
  largest divisor of length / length_dim_num_splits not above
  max(radius, 128)) whose keys and values are extended by `radius` positions
  of the neighbouring blocks (a halo exchange, which stays between
  neighbouring processors when the length is split), so memory is
  O(length * (block + radius)).

  Args:
    q: [..., length_dim, ..., key_dim].
    k: like q.
    v: like k with value_dim, or None for v = k.
    length_dim: the sequence dimension.
    key_dim: the channels of q and k.
    value_dim: the channels of v.
    fully_autoregressive: look back only.
    length_dim_num_splits: how many ways the layout splits length_dim.
    radius: how far each position looks.
    sequence_id: packed-example ids [..., length_dim] (or an int: one example).
    write_priority: optional int [..., length_dim].
    read_priority: optional int [..., length_dim].
    attention_kwargs: keyword arguments for `attention` (dropout_rate, ...).

  Returns:
    q's shape with key_dim replaced by value_dim.

  Example:
    >>> o = local_attention_1d(q, k, v, length, d_kv, d_kv, radius=16)
  """
  if radius < 1:
    raise ValueError(f"local_attention_1d: radius must be positive, got {radius}.")
  if length_dim.size % length_dim_num_splits:
    raise ValueError(f"local_attention_1d: length_dim_num_splits={length_dim_num_splits} must "
                     f"divide {length_dim}.")
  per_split = length_dim.size // length_dim_num_splits
  block = max(radius, 128)
  while per_split % block:
    block -= 1
  query_block = mtf.Dimension("query_block_length", block)
  memory_block = mtf.Dimension("memory_block_length", block)
  num_blocks = mtf.Dimension(length_dim.name, length_dim.size // block)
  exchange = mtf.left_halo_exchange if fully_autoregressive else mtf.halo_exchange

  def as_query(x):
    return mtf.replace_dimensions(x, length_dim, [num_blocks, query_block])

  def as_memory(x):
    x = mtf.replace_dimensions(x, length_dim, [num_blocks, memory_block])
    return exchange(x, num_blocks, memory_block, radius)
  mesh = q.mesh
  q = as_query(q)
  k = as_memory(k)
  v = k if v is None else as_memory(v)
  if sequence_id is None:
    sequence_id = 1
  if not isinstance(sequence_id, mtf.Tensor) or length_dim not in sequence_id.shape.dims:
    sequence_id = sequence_id + mtf.zeros(mesh, mtf.Shape([length_dim]), tf.int32)
  pos = mtf.range(mesh, length_dim, tf.int32)
  # Memory past the sequence's ends comes back from the halo as zeros: give
  # it sequence id -1 so that no query sees it.
  m_sequence_id = as_memory(sequence_id + 1) - 1
  relative = as_memory(pos) - as_query(pos)
  visible = mtf.equal(as_query(sequence_id), m_sequence_id)
  visible = mtf.logical_and(visible, mtf.greater(relative, -radius))
  visible = mtf.logical_and(
      visible, mtf.less_equal(relative, 0 if fully_autoregressive else radius))
  if read_priority is not None:
    visible = mtf.logical_and(visible, mtf.greater_equal(as_query(read_priority),
                                                         as_memory(write_priority)))
  padded = mtf.Dimension("memory_block_length",
                         (1 if fully_autoregressive else 2) * radius + block)
  bias = visibility_mask_to_attention_bias(visible, q.dtype)
  o = attention(q, k, v, padded, key_dim, value_dim, bias, **(attention_kwargs or {}))
  return mtf.replace_dimensions(o, [num_blocks, query_block], length_dim)


def maybe_reshape_attention_input_for_2d_sharding(context, q, k, v, bias, unsplittable_dims):
  """q, k, v and bias, reshaped so that a mesh dimension the attention would
  leave idle splits it too (2-D model parallelism), or unchanged.

  When the model has a layout and a mesh shape (context.model.layout and
  mesh_shape) and some mesh dimension splits none of q, k, v and bias, a
  dimension present in q, k and v (not in `unsplittable_dims`, e.g. batch or
  heads) is cut into its high part (same name) and low part (named after a
  tensor dimension the layout maps to the idle mesh dimension), so the
  attention computation is split over that mesh dimension too. The values
  are the same; only where they are computed changes.

  Example:
    >>> q, k, v, bias = maybe_reshape_attention_input_for_2d_sharding(
    ...     context, q, k, v, bias, [d_kv])
  """
  inputs = (q, k, v, bias)
  model = getattr(context, "model", None)
  layout, mesh_shape = getattr(model, "layout", None), getattr(model, "mesh_shape", None)
  if not layout or not mesh_shape:
    return inputs
  mesh_shape = mtf.convert_to_shape(mesh_shape)
  rules = mtf.convert_to_layout_rules(layout)
  used = [False] * mesh_shape.ndims
  for x in inputs:
    if x is None:
      continue
    for axis in rules.tensor_layout(x.shape, mesh_shape):
      if axis is not None:
        used[axis] = True
  if all(used):
    return inputs
  idle = mesh_shape.dims[used.index(False)]
  names = [name for name, mesh_name in rules if mesh_name == idle.name]
  if not names:
    return inputs
  resplit = None
  for d in q.shape.dims:
    if d in k.shape.dims and d in v.shape.dims and d not in unsplittable_dims:
      splits = mtf.tensor_dim_to_mesh_dim_size(layout, mesh_shape, d)
      if d.size % (splits * idle.size) == 0:
        resplit = d
        break
  if resplit is None:
    return inputs
  high = mtf.Dimension(resplit.name, splits)
  low = mtf.Dimension(names[0], resplit.size // splits)

  def reshape(x):
    if x is not None and resplit in x.shape.dims:
      return mtf.replace_dimensions(x, resplit, [high, low])
    return x
  return tuple(reshape(x) for x in inputs)
