"""The projections of attention: `AttentionParams` (queries, keys, values
and the output projection of a layer, with the original's variable names
and head layouts), `ExpertsAttentionParams` (queries and keys from a
mixture of experts) and `attention_params_simple`.

    >>> params = AttentionParams(mesh, query_input_dim=d_model, memory_input_dim=d_model,
    ...                          output_dim=d_model, key_dim=d_kv, value_dim=d_kv,
    ...                          query_heads_dims=[heads], memory_heads_dims=[heads],
    ...                          variable_dtype=mtf.VariableDType())
    >>> q = params.compute_q(x)
"""

from __future__ import annotations

from typing import Optional

import mesh_tensorflow as mtf


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

  # Attributes under the original's names.
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
