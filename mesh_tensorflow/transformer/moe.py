"""Mixture-of-experts feed-forward layers with top-2 gating (GShard /
Switch style), for `transformer.LayerStack`.

Tokens are cut into groups; within a group a learned gate sends each token
to its two most likely experts, each expert taking at most `capacity`
tokens per group. Dispatch and combine are einsums with an "experts"
dimension, so a layout that splits "experts" (expert parallelism, e.g.
"experts:all") keeps each expert's weights and work on its own processors
and the lowering adds the collectives that moving tokens to and from the
experts needs.

Capacity and dropped tokens: within a group, tokens claim slots of their
first-choice expert in order of position, then (after all first choices)
slots of their second-choice expert, also in order. A choice that finds its
expert's `capacity` slots taken is dropped: its combine weight is 0. A token
whose two choices are both dropped gets an all-zero layer output, so the
residual connection of the layer stack passes it on unchanged. Gate weights
are normalized over the two choices before dropping and not renormalized
after.

Groups: the tokens of a batch are cut into groups of at most `group_size`
consecutive tokens, the number of groups being a multiple of the number of
processors that split "batch" (when the model is given its layout and mesh
shape) or else of the batch size, so that groups never straddle processors.
During incremental decoding a step has one token per sequence, so groups
are small and routing (what is dropped) can differ from a pass over the
whole sequence.

Balancing loss: with f_e the fraction of a group's (non-padding) tokens whose
first choice is expert e and P_e the mean gate probability of e over the
group, loss = num_experts * sum_e f_e * P_e, averaged over groups, times
`loss_coef`, added to the context's losses. When every expert receives the
same fraction of tokens the loss is exactly 1 (times loss_coef) whatever the
gate probabilities; routing concentrated on experts with high mean gate
probability makes it larger.

Switch gating (`moe_gating="switch"`, Fedus et al. 2021): each token goes to
its single most likely expert (or, with the "sample" policy, to one sampled
from the gate's softmax at `switch_temperature`), scaled by that expert's
gate probability (not renormalized). In training the gate's input may be
perturbed first: "input_jitter" multiplies it by noise uniform in
[1 - switch_jitter, 1 + switch_jitter], "input_dropout" drops it at rate
`switch_dropout`; "argmax" leaves it alone. Slots are taken in order of
position, the balancing loss is the one above, and `z_loss` (if set) adds
z_loss * mean(logsumexp(gate logits)^2) over the non-padding tokens (the
router z-loss of ST-MoE), which keeps the gate's logits small.

    >>> layer = MoE1D(num_experts=8, hidden_size=256, capacity_factor_train=1.25)
    >>> switch = MoE1D(num_experts=8, moe_gating="switch", z_loss=1e-3)
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import transformer

_POLICIES = ("all", "none", "threshold", "random")
_GATINGS = ("top_2", "switch")
_SWITCH_POLICIES = ("argmax", "input_jitter", "input_dropout", "sample")


def split_into_groups(num_tokens: int, max_group_size: int, multiple: int) -> Tuple[int, int]:
  """(num_groups, group_size): the largest group size <= max_group_size that
  divides num_tokens into a number of groups divisible by `multiple`.

  Example:
    >>> split_into_groups(512, 100, 8)
    (8, 64)
  """
  if num_tokens % multiple:
    raise ValueError(f"MoE: {num_tokens} tokens cannot form a multiple of {multiple} groups.")
  for size in range(min(max_group_size, num_tokens // multiple), 0, -1):
    if num_tokens % size == 0 and (num_tokens // size) % multiple == 0:
      return num_tokens // size, size
  return num_tokens, 1


def expert_capacity(group_size: int, num_experts: int, capacity_factor: float,
                    min_capacity: int = 4) -> int:
  """Slots per expert and group: ceil(group_size * capacity_factor /
  num_experts), at least min_capacity, at most group_size.

  Example:
    >>> expert_capacity(64, 8, 1.25)
    10
  """
  c = math.ceil(group_size * capacity_factor / num_experts)
  return max(1, min(group_size, max(min_capacity, c)))


class MoE1D(transformer.TransformerLayer):
  """Mixture of experts replacing DenseReluDense (see the module docstring).

  Each expert is a feed-forward block d_model -> hidden (activation) ->
  d_model with weights "wi/kernel" [experts, d_model, d_ff] and "wo/kernel"
  [experts, d_ff, d_model]; the gate is "gate/kernel" [d_model, experts].
  With a list of activations the hidden layer is the product of one
  projection per activation, "wi_0/kernel", "wi_1/kernel", ...
  (`activation=["swish", "linear"]`: SwiGLU experts, as Mixtral's).

  Args:
    num_experts: size of the "experts" dimension.
    loss_coef: weight of the balancing loss.
    hidden_size: experts' hidden size (dimension named hidden_dim_name).
    group_size: the largest number of tokens in a group.
    capacity_factor_train: capacity = group_size * factor / num_experts.
    capacity_factor_eval: the same outside training.
    expert_capacity: a fixed capacity (overrides the factors).
    min_expert_capacity: the smallest capacity the factors give.
    use_second_place_loss: not supported (must be False).
    second_policy_train: whether a token also goes to its second expert:
      "all", "none", "threshold" (if its normalized gate exceeds the
      threshold) or "random" (with probability gate / threshold).
    second_policy_eval: the same outside training.
    second_threshold_train: the threshold of those policies.
    second_threshold_eval: the same outside training.
    activation: the experts' activation (an mtf function name or callable),
      or a list of them for gated experts (see above).
    dropout_rate: dropout on the experts' hidden activations (training).
    hidden_dim_name: name of the experts' hidden dimension ("d_ff", so the
      layout rule of the feed-forward layers applies to experts too).
    moe_gating: "top_2" or "switch" (one expert per token; module docstring).
    switch_policy_train: "input_jitter", "input_dropout", "argmax" or
      "sample": how switch gating perturbs or samples in training.
    switch_policy_eval: the same outside training (where jitter and dropout
      do nothing).
    switch_dropout: rate of the "input_dropout" policy.
    switch_temperature: temperature of the "sample" policy.
    switch_jitter: epsilon of the "input_jitter" policy.
    z_loss: weight of the router z-loss of switch gating (None: none).
    ntlb_top_k, top_n_num_experts_per_token: accepted for compatibility
      (options of gatings not provided here).
    output_dim: the experts' output dimension (default d_model).
    use_experts_attention: the experts have two output projections, "q_wo"
      and "k_wo", and the layer returns [queries, keys] (for
      attention.ExpertsAttentionParams).
    use_second_place_loss, word_embed_mode, use_second_place_expert_prob(_temp):
      experimental variants, not supported: anything but the default is a
      ValueError.

  The positional order is the original's (`MoE1D(16, 1e-2, 1024, 512)`);
  expert_capacity and hidden_dim_name, this library's, come last.

  Example:
    >>> layer = MoE1D(num_experts=16, hidden_size=1024, group_size=512)
  """

  def __init__(self, num_experts: int = 16, loss_coef: float = 1e-2, hidden_size: int = 4096,
               group_size: int = 1024, capacity_factor_train: float = 1.25,
               capacity_factor_eval: float = 2.0, use_second_place_loss: bool = False,
               second_policy_train: str = "random", second_policy_eval: str = "random",
               second_threshold_train: float = 0.2, second_threshold_eval: float = 0.2,
               dropout_rate: float = 0.0, activation="relu", moe_gating: str = "top_2",
               min_expert_capacity: int = 4, switch_policy_train: str = "input_jitter",
               switch_policy_eval: str = "input_jitter", switch_dropout: float = 0.1,
               switch_temperature: float = 1.0, switch_jitter: float = 1e-2,
               ntlb_top_k: int = 4, output_dim=None, use_experts_attention: bool = False,
               z_loss: Optional[float] = None, word_embed_mode=None,
               use_second_place_expert_prob=None, use_second_place_expert_prob_temp=None,
               top_n_num_experts_per_token: int = 3, expert_capacity: Optional[int] = None,
               hidden_dim_name: str = "d_ff"):
    transformer.refuse_unsupported("MoE1D", {
        "use_second_place_loss": (use_second_place_loss, False),
        "word_embed_mode": (word_embed_mode, None),
        "use_second_place_expert_prob": (use_second_place_expert_prob, None),
        "use_second_place_expert_prob_temp": (use_second_place_expert_prob_temp, None)})
    # Used only by the "ntlb" and expert-choice gatings, which
    # _GATINGS does not include: accepted so that gin files setting them parse.
    del ntlb_top_k, top_n_num_experts_per_token
    if moe_gating not in _GATINGS:
      raise ValueError(f"MoE1D: moe_gating must be one of {_GATINGS}, got {moe_gating!r}.")
    for p in (switch_policy_train, switch_policy_eval):
      if p not in _SWITCH_POLICIES:
        raise ValueError(f"MoE1D: switch policy must be one of {_SWITCH_POLICIES}, got {p!r}.")
    if z_loss is not None and moe_gating != "switch":
      raise ValueError("MoE1D: z_loss is applied by switch gating only; set "
                       "moe_gating='switch' or leave z_loss unset.")
    for p in (second_policy_train, second_policy_eval):
      if p not in _POLICIES:
        raise ValueError(f"MoE1D: second policy must be one of {_POLICIES}, got {p!r}.")
    if num_experts < 2 and moe_gating == "top_2":
      raise ValueError(f"MoE1D: top-2 gating needs num_experts >= 2, got {num_experts}.")
    self.num_experts = num_experts
    self.loss_coef = loss_coef
    self.hidden_size = hidden_size
    self.group_size = group_size
    self.capacity_factor_train = capacity_factor_train
    self.capacity_factor_eval = capacity_factor_eval
    self.expert_capacity = expert_capacity
    self.min_expert_capacity = min_expert_capacity
    self.second_policy_train = second_policy_train
    self.second_policy_eval = second_policy_eval
    self.second_threshold_train = second_threshold_train
    self.second_threshold_eval = second_threshold_eval
    self.activation = activation
    self.dropout_rate = dropout_rate
    self.hidden_dim_name = hidden_dim_name
    self.moe_gating = moe_gating
    self.switch_policy_train = switch_policy_train
    self.switch_policy_eval = switch_policy_eval
    self.switch_dropout = switch_dropout
    self.switch_temperature = switch_temperature
    self.switch_jitter = switch_jitter
    self.z_loss = z_loss
    if output_dim is not None and not isinstance(output_dim, mtf.Dimension):
      raise ValueError(f"MoE1D: output_dim must be an mtf.Dimension or None, got "
                       f"{output_dim!r}.")
    self.output_dim = output_dim
    self.use_experts_attention = bool(use_experts_attention)

  @staticmethod
  def _split_ways(context: transformer.Context, name: str) -> Optional[int]:
    """How many ways the model's layout splits a dimension called `name`
    (1: unsplit), or None when the model does not know its layout."""
    model = context.model
    if model.layout is None or model.mesh_shape is None:
      return None
    rules = mtf.convert_to_layout_rules(model.layout)
    mesh_shape = mtf.convert_to_shape(model.mesh_shape)
    axis = rules.tensor_dimension_to_mesh_axis(mtf.Dimension(name, 1), mesh_shape)
    return 1 if axis is None else mesh_shape.dims[axis].size

  def _group_multiple(self, context: transformer.Context, x: mtf.Tensor) -> int:
    """Number of groups must be a multiple of this, so the "batch"-named groups
    split like the batch (the mesh dimension's size when the model knows its
    layout, else the batch size)."""
    ways = self._split_ways(context, "batch")
    return x.shape.dims[0].size if ways is None else ways

  def _experts_stay_local(self, context: transformer.Context) -> bool:
    """Whether the model's layout (when it knows it) leaves "experts" unsplit
    (no rule for it, or one naming a mesh dimension of size 1):
    then each processor runs every expert on its own groups, with no
    all-to-all (FSDP or data parallelism over the experts' weights, as
    MaxText and PyTorch FSDP run Mixtral); otherwise the tokens travel to
    the processors holding their experts."""
    return self._split_ways(context, "experts") == 1

  def call(self, context: transformer.Context, x: mtf.Tensor) -> mtf.Tensor:
    d_model = context.model.model_dim
    token_dims = [d for d in x.shape.dims if d != d_model]
    num_tokens = mtf.Shape(token_dims).size
    num_groups, group_size = split_into_groups(num_tokens, self.group_size,
                                               self._group_multiple(context, x))
    groups_dim = mtf.Dimension("batch", num_groups)
    group_dim = mtf.Dimension("group", group_size)
    xg = mtf.reshape(x, mtf.Shape([groups_dim, group_dim, d_model]))
    nonpadding = context.nonpadding
    if nonpadding is not None and not context.incremental:
      nonpadding = mtf.broadcast(nonpadding, mtf.Shape(token_dims))
      nonpadding = mtf.reshape(nonpadding, mtf.Shape([groups_dim, group_dim]))
    else:
      nonpadding = None
    factor = self.capacity_factor_train if context.train else self.capacity_factor_eval
    capacity = self.expert_capacity or expert_capacity(
        group_size, self.num_experts, factor, self.min_expert_capacity)
    capacity = min(capacity, group_size)
    experts_unsplit = mtf.Dimension("experts_unsplit", self.num_experts)
    capacity_dim = mtf.Dimension("expert_capacity", capacity)
    if self.moe_gating == "switch":
      dispatch, combine, loss = switch_gating(
          xg, experts_unsplit, capacity_dim, context.variable_dtype, train=context.train,
          policy=self.switch_policy_train if context.train else self.switch_policy_eval,
          jitter=self.switch_jitter, dropout_rate=self.switch_dropout,
          temperature=self.switch_temperature, z_loss=self.z_loss, nonpadding=nonpadding)
    else:
      dispatch, combine, loss = top_2_gating(
          xg, experts_unsplit, capacity_dim, context.variable_dtype, train=context.train,
          policy=self.second_policy_train if context.train else self.second_policy_eval,
          threshold=(self.second_threshold_train if context.train
                     else self.second_threshold_eval),
          nonpadding=nonpadding)
    y = self._experts(context, xg, dispatch, combine, groups_dim, capacity_dim,
                      local=self._experts_stay_local(context))
    if context.losses is not None:
      context.losses.append(loss * self.loss_coef)
    if self.use_experts_attention:
      return [mtf.reshape(t, mtf.Shape(token_dims + [t.shape.dims[-1]])) for t in y]
    return mtf.reshape(y, mtf.Shape(token_dims + [y.shape.dims[-1]]))

  def _experts(self, context, xg, dispatch, combine, groups_dim, capacity_dim, local=False):
    """Dispatch -> expert feed-forward -> combine; [groups, group, d_model].
    `local`: the groups stay split like the batch and "experts" unsplit (no
    all-to-all; see `_experts_stay_local`)."""
    d_model = context.model.model_dim
    experts_unsplit = dispatch.shape.get_dim_by_name("experts_unsplit")
    experts = mtf.Dimension("experts", self.num_experts)
    groups_unsplit = groups_dim if local else mtf.Dimension("batch_unsplit", groups_dim.size)
    hidden = mtf.Dimension(self.hidden_dim_name, self.hidden_size)
    dispatch = mtf.cast(dispatch, xg.dtype)
    # [experts_unsplit, groups, capacity, d_model]: split like the batch ...
    expert_in = mtf.einsum([xg, dispatch], output_shape=mtf.Shape(
        [experts_unsplit, groups_dim, capacity_dim, d_model]))
    # ... then moved so that "experts" is split instead (all-to-all); a
    # renaming only where the experts stay local.
    expert_in = mtf.reshape(expert_in, mtf.Shape([experts, groups_unsplit, capacity_dim, d_model]))
    # A list of activations makes gated experts (["swish", "linear"]: SwiGLU,
    # Mixtral's), with kernels "wi_0", "wi_1", ... as the original names them.
    h = mtf.layers.dense_product(expert_in, [d_model], hidden, self.activation,
                                 name="wi", expert_dims=[experts], use_bias=False,
                                 variable_dtype=context.variable_dtype)
    if context.train and self.dropout_rate > 0.0:
      h = mtf.dropout(h, True, rate=self.dropout_rate)
    out_dim = self.output_dim or d_model
    combine = mtf.cast(combine, xg.dtype)

    def output(name):
      expert_out = mtf.layers.dense(h, out_dim, reduced_dims=[hidden], expert_dims=[experts],
                                    use_bias=False, variable_dtype=context.variable_dtype,
                                    name=name)
      expert_out = mtf.reshape(expert_out, mtf.Shape(
          [experts_unsplit, groups_dim, capacity_dim, out_dim]))
      return mtf.einsum([expert_out, combine],
                        output_shape=mtf.Shape(xg.shape.dims[:-1] + [out_dim]))

    if self.use_experts_attention:
      # Queries and keys (= values): two output projections of the same experts.
      return [output("q_wo"), output("k_wo")]
    return output("wo")


class MoE2D(MoE1D):
  """Kept for compatibility: a one-level mixture of expert_x * expert_y
  experts (two-level routing is not implemented). Arguments
  in the original's positional order; capacity_factor_second_level has no
  effect (one level), other MoE1D arguments go by keyword.

  Example:
    >>> layer = MoE2D(expert_x=4, expert_y=4, hidden_size=1024)
  """

  def __init__(self, expert_x: int = 8, expert_y: int = 8, loss_coef: float = 1e-2,
               hidden_size: int = 4096, group_size: int = 1024,
               capacity_factor_train: float = 1.25, capacity_factor_eval: float = 2.0,
               capacity_factor_second_level=None, use_second_place_loss: bool = False,
               second_policy_train: str = "random", second_policy_eval: str = "random",
               second_threshold_train: float = 0.2, second_threshold_eval: float = 0.2,
               **kwargs):
    del capacity_factor_second_level
    super().__init__(
        num_experts=expert_x * expert_y, loss_coef=loss_coef, hidden_size=hidden_size,
        group_size=group_size, capacity_factor_train=capacity_factor_train,
        capacity_factor_eval=capacity_factor_eval, use_second_place_loss=use_second_place_loss,
        second_policy_train=second_policy_train, second_policy_eval=second_policy_eval,
        second_threshold_train=second_threshold_train,
        second_threshold_eval=second_threshold_eval, **kwargs)

  @property
  def scope_name(self) -> str:
    return "MoE2D"


def top_2_gating(x: mtf.Tensor, experts_dim: mtf.Dimension, capacity_dim: mtf.Dimension,
                 variable_dtype: mtf.VariableDType, train: bool = True, policy: str = "all",
                 threshold: float = 0.2, nonpadding: Optional[mtf.Tensor] = None):
  """The learned gate "gate/kernel" [d_model, experts] and `top_2_routing`.

  Args:
    x: [groups, group, d_model].
    experts_dim: the experts dimension of the gate.
    capacity_dim: slots per expert and group.
    variable_dtype: dtype of the gate variable.
    train: whether training.
    policy: second-choice policy ("all", "none", "threshold", "random").
    threshold: of the "threshold" and "random" policies.
    nonpadding: optional float [groups, group], 0 at padding (not routed).

  Returns:
    (dispatch, combine, balancing loss), see `top_2_routing`.

  Example:
    >>> dispatch, combine, loss = top_2_gating(xg, experts, capacity, vdtype)
  """
  del train
  d_model = x.shape.dims[2]
  gate_logits = mtf.layers.dense(x, experts_dim, reduced_dims=[d_model], use_bias=False,
                                 variable_dtype=variable_dtype, name="gate")
  return top_2_routing(gate_logits, capacity_dim, policy, threshold, nonpadding)


def top_2_routing(gate_logits: mtf.Tensor, capacity_dim: mtf.Dimension, policy: str = "all",
                  threshold: float = 0.2, nonpadding: Optional[mtf.Tensor] = None):
  """Top-2 routing of grouped tokens given their gate logits (see the module
  docstring for the order in which slots are taken and what is dropped).

  Args:
    gate_logits: [groups, group, experts].
    capacity_dim: slots per expert and group.
    policy: second-choice policy ("all", "none", "threshold", "random").
    threshold: of the "threshold" and "random" policies.
    nonpadding: optional float [groups, group], 0 at padding (not routed).

  Returns:
    (dispatch, combine, balancing loss): dispatch is 0/1 and combine holds
    the normalized gate weights, both float32 [groups, group, experts,
    capacity]; a token's row of combine is all zero when both its choices
    were dropped.

  Example:
    >>> dispatch, combine, loss = top_2_routing(logits, mtf.Dimension("expert_capacity", 4))
  """
  group_dim, experts_dim = gate_logits.shape.dims[1], gate_logits.shape.dims[2]
  raw = mtf.softmax(mtf.to_float(gate_logits), experts_dim)
  if nonpadding is not None:  # routing is float32 whatever the activation dtype
    nonpadding = mtf.to_float(nonpadding)
  choice1 = mtf.one_hot(mtf.argmax(raw, experts_dim), experts_dim, dtype=tf.float32)
  gate1 = mtf.reduce_sum(raw * choice1, reduced_dim=experts_dim)
  choice2 = mtf.one_hot(mtf.argmax(raw * (1.0 - choice1), experts_dim), experts_dim,
                        dtype=tf.float32)
  gate2 = mtf.reduce_sum(raw * choice2, reduced_dim=experts_dim)
  mask1, mask2 = choice1, choice2
  if nonpadding is not None:
    mask1 = mask1 * nonpadding
    mask2 = mask2 * nonpadding
  loss = balancing_loss(raw, mask1, group_dim, experts_dim, nonpadding)
  total = gate1 + gate2 + 1e-9
  gate1, gate2 = gate1 / total, gate2 / total
  if policy == "none":
    mask2 = mask2 * 0.0
  elif policy == "threshold":
    mask2 = mask2 * mtf.to_float(mtf.greater(gate2, threshold))
  elif policy == "random":
    u = mtf.random_uniform(gate_logits.mesh, gate2.shape, dtype=tf.float32,
                           name="second_expert_noise")
    mask2 = mask2 * mtf.to_float(mtf.less(u, gate2 / max(threshold, 1e-9)))
  # Slot of each choice in its expert's queue, first choices before second.
  dispatch1 = _take_slots(mask1, capacity_dim)
  taken1 = mtf.reduce_sum(dispatch1, output_shape=mask1.shape - [group_dim])
  dispatch2 = _take_slots(mask2, capacity_dim, taken1)
  dispatch = dispatch1 + dispatch2
  combine = gate1 * dispatch1 + gate2 * dispatch2
  return dispatch, combine, loss


def _take_slots(mask: mtf.Tensor, capacity_dim: mtf.Dimension,
                taken: Optional[mtf.Tensor] = None) -> mtf.Tensor:
  """0/1 [groups, group, experts, capacity]: each token of `mask` [groups,
  group, experts] (one-hot choices) takes its expert's next free slot, in
  order of position after the `taken` [groups, experts] slots already used;
  choices past the capacity get no slot."""
  group_dim, experts_dim = mask.shape.dims[1], mask.shape.dims[2]
  position = mtf.cumsum(mask, group_dim, exclusive=True)
  if taken is not None:
    position = position + taken
  position = position * mask
  mask = mask * mtf.to_float(mtf.less(position, float(capacity_dim.size)))
  slot = mtf.one_hot(mtf.to_int32(mtf.reduce_sum(position * mask, reduced_dim=experts_dim)),
                     capacity_dim, dtype=tf.float32)
  return mask * slot


def switch_gating(x: mtf.Tensor, experts_dim: mtf.Dimension, capacity_dim: mtf.Dimension,
                  variable_dtype: mtf.VariableDType, train: bool = True,
                  policy: str = "argmax", jitter: float = 1e-2, dropout_rate: float = 0.1,
                  temperature: float = 1.0, z_loss: Optional[float] = None,
                  nonpadding: Optional[mtf.Tensor] = None):
  """Switch (top-1) gating: the learned gate "gate/kernel" [d_model, experts]
  on x perturbed by `policy` (module docstring), then `top_1_routing`.

  Args:
    x: [groups, group, d_model].
    experts_dim: the experts dimension of the gate.
    capacity_dim: slots per expert and group.
    variable_dtype: dtype of the gate variable.
    train: whether training (jitter and dropout apply only then).
    policy: "argmax", "input_jitter", "input_dropout" or "sample".
    jitter: epsilon of "input_jitter".
    dropout_rate: rate of "input_dropout".
    temperature: of "sample".
    z_loss: weight of the router z-loss, or None.
    nonpadding: optional float [groups, group], 0 at padding (not routed).

  Returns:
    (dispatch, combine, balancing loss + z_loss * router z-loss).

  Example:
    >>> dispatch, combine, loss = switch_gating(xg, experts, capacity, vdtype)
  """
  if policy not in _SWITCH_POLICIES:
    raise ValueError(f"switch_gating: policy must be one of {_SWITCH_POLICIES}, got {policy!r}.")
  d_model = x.shape.dims[2]
  gate_inputs = mtf.to_float(x)
  if train and policy == "input_jitter":
    gate_inputs = mtf.layers.multiplicative_jitter(gate_inputs, jitter)
  elif train and policy == "input_dropout" and dropout_rate > 0.0:
    gate_inputs = mtf.dropout(gate_inputs, True, rate=dropout_rate)
  gate_logits = mtf.layers.dense(gate_inputs, experts_dim, reduced_dims=[d_model],
                                 use_bias=False, variable_dtype=variable_dtype, name="gate")
  choice = None
  if policy == "sample":
    choice = mtf.sample_with_temperature(mtf.to_float(gate_logits), experts_dim, temperature)
  dispatch, combine, loss = top_1_routing(gate_logits, capacity_dim, nonpadding, choice)
  if z_loss is not None:
    loss = loss + z_loss * router_z_loss(gate_logits, experts_dim, nonpadding)
  return dispatch, combine, loss


def top_1_routing(gate_logits: mtf.Tensor, capacity_dim: mtf.Dimension,
                  nonpadding: Optional[mtf.Tensor] = None,
                  choice: Optional[mtf.Tensor] = None):
  """Top-1 (Switch) routing of grouped tokens given their gate logits: each
  token takes the next free slot of its expert, in order of position, or is
  dropped (all-zero combine row) when the expert's `capacity` slots are taken.

  Args:
    gate_logits: [groups, group, experts].
    capacity_dim: slots per expert and group.
    nonpadding: optional float [groups, group], 0 at padding (not routed).
    choice: optional int [groups, group] expert of each token (default: the
      argmax of the gate).

  Returns:
    (dispatch, combine, balancing loss): dispatch is 0/1 and combine the
    chosen expert's gate probability, float32 [groups, group, experts,
    capacity].

  Example:
    >>> dispatch, combine, loss = top_1_routing(logits, mtf.Dimension("expert_capacity", 4))
  """
  group_dim, experts_dim = gate_logits.shape.dims[1], gate_logits.shape.dims[2]
  raw = mtf.softmax(mtf.to_float(gate_logits), experts_dim)
  if nonpadding is not None:  # routing is float32 whatever the activation dtype
    nonpadding = mtf.to_float(nonpadding)
  if choice is None:
    choice = mtf.argmax(raw, experts_dim)
  mask = mtf.one_hot(choice, experts_dim, dtype=tf.float32)
  gate = mtf.reduce_sum(raw * mask, reduced_dim=experts_dim)
  if nonpadding is not None:
    mask = mask * nonpadding
  loss = balancing_loss(raw, mask, group_dim, experts_dim, nonpadding)
  dispatch = _take_slots(mask, capacity_dim)
  return dispatch, gate * dispatch, loss


def router_z_loss(gate_logits: mtf.Tensor, experts_dim: mtf.Dimension,
                  nonpadding: Optional[mtf.Tensor] = None) -> mtf.Tensor:
  """mean over (non-padding) tokens of logsumexp(gate logits)^2.

  Example:
    >>> loss = loss + 1e-3 * router_z_loss(gate_logits, experts_dim)
  """
  z = mtf.square(mtf.reduce_logsumexp(mtf.to_float(gate_logits), experts_dim))
  if nonpadding is None:
    return mtf.reduce_mean(z)
  return mtf.reduce_sum(z * nonpadding) / mtf.maximum(mtf.reduce_sum(nonpadding), 1.0)


def balancing_loss(gates: mtf.Tensor, first_choice: mtf.Tensor, group_dim: mtf.Dimension,
                   experts_dim: mtf.Dimension,
                   nonpadding: Optional[mtf.Tensor] = None) -> mtf.Tensor:
  """num_experts * sum_e f_e * P_e averaged over groups (module docstring).

  Args:
    gates: softmax gate probabilities [groups, group, experts].
    first_choice: one-hot first choices (0 at padding) [groups, group, experts].
    group_dim: the tokens of a group.
    experts_dim: the experts.
    nonpadding: optional [groups, group] 0/1 weights of the tokens.

  Example:
    >>> loss = balancing_loss(gates, choice1, group, experts)
  """
  if nonpadding is None:
    count = float(group_dim.size)
    mean_gate = mtf.reduce_sum(gates, reduced_dim=group_dim) / count
  else:
    count = mtf.maximum(mtf.reduce_sum(nonpadding, reduced_dim=group_dim), 1.0)
    mean_gate = mtf.reduce_sum(gates * nonpadding, reduced_dim=group_dim) / count
  fraction = mtf.reduce_sum(first_choice, reduced_dim=group_dim) / count
  per_group = mtf.reduce_sum(fraction * mean_gate, reduced_dim=experts_dim)
  return mtf.reduce_mean(per_group) * float(experts_dim.size)


# ------------------------------------------- the functional MoE API
class HParams:
  """A bag of hyperparameters (a stand-in for
  tf.contrib.training.HParams): keyword arguments become attributes.

  Example:
    >>> hparams = HParams(moe_num_experts=8)
    >>> hparams.add_hparam("moe_hidden_size", 64)
  """

  def __init__(self, **kwargs):
    for k, v in kwargs.items():
      setattr(self, k, v)

  def add_hparam(self, name: str, value) -> None:
    setattr(self, name, value)


def set_default_moe_hparams(hparams) -> None:
  """Adds the original's mixture-of-experts defaults to `hparams`.

  Example:
    >>> hparams = HParams()
    >>> set_default_moe_hparams(hparams)
    >>> hparams.moe_num_experts, hparams.moe_group_size
    (16, 1024)
  """
  hparams.moe_num_experts = 16
  hparams.moe_loss_coef = 1e-2
  for name, value in (("moe_gating", "top_2"), ("moe_capacity_factor_train", 1.25),
                      ("moe_capacity_factor_eval", 2.0),
                      ("moe_capacity_factor_second_level", 1.0),
                      ("moe_hidden_size", 4096), ("moe_group_size", 1024),
                      ("moe_use_second_place_loss", 0),
                      ("moe_second_policy_train", "random"),
                      ("moe_second_policy_eval", "random"),
                      ("moe_second_threshold_train", 0.2),
                      ("moe_second_threshold_eval", 0.2)):
    hparams.add_hparam(name, value)


class _Model:
  def __init__(self, model_dim, layout, mesh_shape):
    self.model_dim, self.layout, self.mesh_shape = model_dim, layout, mesh_shape


class _Context:
  """What MoE1D.call reads of a transformer Context."""

  def __init__(self, mesh, model, train, variable_dtype, nonpadding):
    self.mesh, self.model, self.train = mesh, model, train
    self.variable_dtype, self.nonpadding = variable_dtype, nonpadding
    self.incremental = False
    self.losses = []


def _hparam(hparams, name: str, default):
  return getattr(hparams, name, default)


def _moe_layer(inputs, output_dim, hparams, train, variable_dtype, layout, mesh_shape,
               nonpadding, activation, num_experts, what):
  if not isinstance(output_dim, mtf.Dimension):
    raise TypeError(f"{what}: output_dim must be an mtf.Dimension, got {output_dim!r}.")
  gating = _hparam(hparams, "moe_gating", "top_2")
  if gating not in _GATINGS:
    raise ValueError(f"{what}: hparams.moe_gating must be one of {_GATINGS}, got {gating!r}.")
  layer = MoE1D(
      num_experts=num_experts, loss_coef=_hparam(hparams, "moe_loss_coef", 1e-2),
      hidden_size=_hparam(hparams, "moe_hidden_size", 4096),
      group_size=_hparam(hparams, "moe_group_size", 1024),
      capacity_factor_train=_hparam(hparams, "moe_capacity_factor_train", 1.25),
      capacity_factor_eval=_hparam(hparams, "moe_capacity_factor_eval", 2.0),
      second_policy_train=_hparam(hparams, "moe_second_policy_train", "random"),
      second_policy_eval=_hparam(hparams, "moe_second_policy_eval", "random"),
      second_threshold_train=_hparam(hparams, "moe_second_threshold_train", 0.2),
      second_threshold_eval=_hparam(hparams, "moe_second_threshold_eval", 0.2),
      min_expert_capacity=_hparam(hparams, "moe_min_expert_capacity", 4),
      activation=activation, moe_gating=gating, hidden_dim_name="expert_hidden")
  layer.output_dim = output_dim
  model = _Model(inputs.shape.dims[-1], layout, mesh_shape)
  if nonpadding is not None:
    nonpadding = mtf.cast(nonpadding, inputs.dtype)
  context = _Context(inputs.mesh, model, train, variable_dtype, nonpadding)
  y = layer.call(context, inputs)
  return y, context.losses[0]


def transformer_moe_layer_v1(inputs: mtf.Tensor, output_dim: mtf.Dimension, hparams,
                             train: bool, variable_dtype: mtf.VariableDType, layout=None,
                             mesh_shape=None, nonpadding: Optional[mtf.Tensor] = None,
                             activation=mtf.relu, num_microbatches=None):
  """A functional mixture of experts: MoE1D's routing and
  experts on [batch..., length, input_dim], configured by `hparams`
  (moe_num_experts, moe_hidden_size, moe_group_size, moe_capacity_factor_*,
  moe_gating, moe_second_policy_*, moe_second_threshold_*, moe_loss_coef;
  see set_default_moe_hparams). Variables: "gate/kernel", "wi/kernel",
  "wo/kernel" (the experts' hidden dimension is "expert_hidden").

  Args:
    inputs: [batch..., length, input_dim].
    output_dim: the output's last dimension (input_dim for a transformer).
    hparams: HParams (see set_default_moe_hparams).
    train: whether training (capacity factor and second-expert policy).
    variable_dtype: an mtf.VariableDType.
    layout: layout rules (groups follow how the batch is split).
    mesh_shape: the mesh shape, likewise.
    nonpadding: optional [batch..., length], 0 at padding (not routed).
    activation: the experts' activation.
    num_microbatches: accepted for compatibility.

  Returns:
    (outputs [batch..., length, output_dim], balancing loss times moe_loss_coef).

  Example:
    >>> hparams = HParams(); set_default_moe_hparams(hparams)
    >>> y, loss = transformer_moe_layer_v1(x, d_model, hparams, True, mtf.VariableDType())
  """
  del num_microbatches
  num_experts = hparams.moe_num_experts
  if isinstance(num_experts, (list, tuple)):
    raise ValueError("transformer_moe_layer_v1: hparams.moe_num_experts must be an int; a "
                     "pair [x, y] is for transformer_moe_layer_v2.")
  return _moe_layer(inputs, output_dim, hparams, train, variable_dtype, layout, mesh_shape,
                    nonpadding, activation, int(num_experts), "transformer_moe_layer_v1")


def transformer_moe_layer_v2(inputs: mtf.Tensor, output_dim: mtf.Dimension, hparams,
                             train: bool, variable_dtype: mtf.VariableDType, layout=None,
                             mesh_shape=None, nonpadding: Optional[mtf.Tensor] = None,
                             num_microbatches=None):
  """A mixture of x * y experts, as `MoE2D` provides it: one level of
  x * y experts for hparams.moe_num_experts = [x, y] (a second routing
  level, and moe_capacity_factor_second_level, are not implemented).
  Otherwise as transformer_moe_layer_v1 (relu experts).

  Example:
    >>> hparams = HParams(); set_default_moe_hparams(hparams)
    >>> hparams.moe_num_experts = [4, 4]
    >>> y, loss = transformer_moe_layer_v2(x, d_model, hparams, True, mtf.VariableDType())
  """
  del num_microbatches
  num_experts = hparams.moe_num_experts
  if not isinstance(num_experts, (list, tuple)) or len(num_experts) != 2:
    raise ValueError(f"transformer_moe_layer_v2: hparams.moe_num_experts must be a pair "
                     f"[x, y], got {num_experts!r}.")
  return _moe_layer(inputs, output_dim, hparams, train, variable_dtype, layout, mesh_shape,
                    nonpadding, mtf.relu, int(num_experts[0]) * int(num_experts[1]),
                    "transformer_moe_layer_v2")
