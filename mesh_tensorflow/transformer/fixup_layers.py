"""Transformer layers with Fixup initialisation (Zhang et al., 2019,
arXiv:1901.09321): training without normalisation layers, by initialising
each residual branch's last projection to zero and scaling the others down
with the number of residual blocks.

With L = `num_blocks` (the layers of the whole model: 2 per encoder layer,
3 per decoder layer of an encoder-decoder) and m matrix products per branch,
the branch's other weights are drawn from the He ("he": variance 2 / fan_in)
or Glorot ("glorot": variance 1 / fan_avg) initialiser times L^(-1/(m-1))
in variance (DenseReluDense: m = 2; attention: m = 4). Scalar shifts and
scales (`sublayer_fixup_shift`, `sublayer_fixup_scale`) replace the
normalisation sublayers:

    >>> from mesh_tensorflow.transformer import fixup_layers, transformer
    >>> stack = transformer.LayerStack(
    ...     [fixup_layers.SelfAttentionFixup(num_blocks=4),
    ...      fixup_layers.DenseReluDenseFixup(hidden_size=64, num_blocks=4)] * 2,
    ...     sublayers_initial=[], sublayers_final=[],
    ...     sublayers_per_layer=[fixup_layers.sublayer_fixup_shift,
    ...                          transformer.sublayer_call_layer,
    ...                          fixup_layers.sublayer_fixup_scale,
    ...                          transformer.sublayer_residual])
"""

from __future__ import annotations

from typing import Optional

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import attention
from mesh_tensorflow.transformer import base_layers
from mesh_tensorflow.transformer import transformer
from mesh_tensorflow.transformer import transformer_layers

__all__ = ["get_single_scalar_bias", "dense_product_fixup", "AttentionParamsFixup",
           "DenseReluDenseFixup", "SelfAttentionFixup", "EncDecAttentionFixup",
           "sublayer_fixup_scale", "sublayer_fixup_shift"]

_INITS = ("he", "glorot")


def _fixup_initializer(default_init: str, distribution: str, variance_factor: float,
                       fan_in_dims=None, fan_out_dims=None):
  """He or Glorot variance scaling with its variance times variance_factor."""
  if default_init == "he":
    return mtf.initializers.variance_scaling(2.0 * variance_factor, "fan_in", distribution,
                                             fan_in_dims, fan_out_dims)
  if default_init == "glorot":
    return mtf.initializers.variance_scaling(variance_factor, "fan_avg", distribution,
                                             fan_in_dims, fan_out_dims)
  raise ValueError(f"Fixup: default_init {default_init!r} is not supported; choose 'he' or "
                   "'glorot'.")


def _check_blocks(num_blocks, who: str) -> int:
  if not isinstance(num_blocks, int) or isinstance(num_blocks, bool) or num_blocks < 1:
    raise ValueError(f"{who}: num_blocks must be a positive int (the model's residual "
                     f"blocks), got {num_blocks!r}.")
  return num_blocks


def get_single_scalar_bias(x: mtf.Tensor, name: str) -> mtf.Tensor:
  """A trainable zero-initialised scalar "name" [single_bias:1] of x's dtype
  (the Fixup shift before a projection).

  Example:
    >>> shift = get_single_scalar_bias(x, "shift")
  """
  return mtf.get_variable(x.mesh, name, mtf.Shape([mtf.Dimension("single_bias", 1)]),
                          initializer=mtf.initializers.zeros(), dtype=x.dtype)


def dense_product_fixup(x: mtf.Tensor, reduced_dims, new_dims, kernel_initializer,
                        activation_functions=None, name: str = "dense_product",
                        **kwargs) -> mtf.Tensor:
  """`mtf.layers.dense_product` with an explicit kernel initialiser.

  Example:
    >>> h = dense_product_fixup(x, [d_model], d_ff, he_init, "relu", name="wi")
  """
  return mtf.layers.dense_product(x, reduced_dims, new_dims, activation_functions, name,
                                  kernel_initializer=kernel_initializer, **kwargs)


def _add_scalar(x: mtf.Tensor, scalar: mtf.Tensor, multiply: bool = False) -> mtf.Tensor:
  out = mtf.multiply(x, scalar) if multiply else mtf.add(x, scalar)
  return mtf.reshape(out, x.shape)


class AttentionParamsFixup(attention.AttentionParams):
  """Attention projections with Fixup initialisation: "q_fixup",
  "k_fixup", "v_fixup" (or "kv_fixup") from He/Glorot scaled by
  num_blocks^(-1/3) in variance (fan-in: the input channels; fan-out: the
  heads and channels), "o_fixup" zero.

  Args:
    (as AttentionParams), and:
    num_blocks: the model's residual blocks.
    default_init: "he" or "glorot".
    init_distribution: "uniform", "normal", "truncated_normal", ...

  Example:
    >>> params = AttentionParamsFixup(mesh, d_model, d_model, d_model, d_kv, d_kv,
    ...                               [heads], [heads], mtf.VariableDType(),
    ...                               fold_scaling_into_initializer=False, num_blocks=12)
  """

  def __init__(self, mesh, query_input_dim, memory_input_dim, output_dim, key_dim,
               value_dim, query_heads_dims, memory_heads_dims, variable_dtype,
               shared_kv: bool = False, fold_scaling_into_initializer: bool = False,
               num_blocks: Optional[int] = None, default_init: str = "he",
               init_distribution: str = "uniform", **kwargs):
    self.num_blocks = _check_blocks(num_blocks, "AttentionParamsFixup")
    if default_init not in _INITS:
      raise ValueError(f"AttentionParamsFixup: default_init {default_init!r} is not "
                       "supported; choose 'he' or 'glorot'.")
    self.default_init = default_init
    self.init_distribution = init_distribution
    if mtf.layers.unit_scaling_convention():
      raise ValueError("AttentionParamsFixup: Fixup initialisation does not combine with "
                       "mtf.layers.unit_scaling_convention(); turn one off.")
    if fold_scaling_into_initializer:
      raise ValueError("AttentionParamsFixup: Fixup initialisation does not combine with "
                       "fold_scaling_into_initializer=True; pass False.")
    super().__init__(mesh, query_input_dim, memory_input_dim, output_dim, key_dim, value_dim,
                     query_heads_dims, memory_heads_dims, variable_dtype, shared_kv=shared_kv,
                     fold_scaling_into_initializer=False, **kwargs)

  def init_weights(self) -> None:
    factor = self.num_blocks ** (-1.0 / 3.0)

    def var(name, shape, input_dim, zero=False):
      if zero:
        init = mtf.initializers.zeros()
      else:
        outs = [d for d in shape if d != input_dim and d != self.ensemble_dim]
        init = _fixup_initializer(self.default_init, self.init_distribution, factor,
                                  [input_dim], outs)
      return mtf.get_variable(self.mesh, name, mtf.Shape(shape), initializer=init,
                              dtype=self.variable_dtype)

    self.wq = self.wk = self.wv = self.wkv = None
    if self.make_attention_vars:
      if not self.no_query:
        self.wq = var("q_fixup", self.q_shape, self.query_input_dim)
      if self.shared_kv:
        self.wkv = var("kv_fixup", self.k_shape, self.memory_input_dim)
        self.wk = self.wv = self.wkv
      else:
        self.wk = var("k_fixup", self.k_shape, self.memory_input_dim)
        self.wv = var("v_fixup", self.v_shape, self.memory_input_dim)
    self.wo = var("o_fixup", self.o_shape, None, zero=True)


class DenseReluDenseFixup(transformer.TransformerLayer):
  """Two dense layers ("wi" d_model -> d_ff with the activation, "wo" back)
  with Fixup initialisation: wi from He/Glorot scaled by 1/num_blocks in
  variance, wo zero, and a scalar "shift" added to the hidden units.

  Args:
    hidden_size: d_ff.
    dropout_rate: dropout on the hidden units in training.
    activation: an activation or list of them (see mtf.layers.dense_product).
    use_bias: biases in both layers.
    default_init: "he" or "glorot".
    init_distribution: "uniform", "normal", "truncated_normal", ...
    num_blocks: the model's residual blocks (required).

  Example:
    >>> layer = DenseReluDenseFixup(hidden_size=2048, num_blocks=60)
  """

  def __init__(self, hidden_size: int = 4096, dropout_rate: float = 0.0, activation="relu",
               use_bias: bool = False, default_init: str = "he",
               init_distribution: str = "uniform", num_blocks: Optional[int] = None):
    self.hidden_size = hidden_size
    self.dropout_rate = dropout_rate
    self.activation = activation
    self.use_bias = use_bias
    self.num_blocks = _check_blocks(num_blocks, "DenseReluDenseFixup")
    self.downproject_initializer = mtf.initializers.zeros()
    self.upproject_initializer = _fixup_initializer(default_init, init_distribution,
                                                    1.0 / self.num_blocks)

  def call(self, context: transformer.Context, x: mtf.Tensor, losses=None) -> mtf.Tensor:
    del losses
    io_dim = x.shape.dims[-1]
    hidden = mtf.Dimension("d_ff", self.hidden_size)
    expert_dims = getattr(context.model, "ensemble_dims", None) or None
    h = dense_product_fixup(x, reduced_dims=[io_dim], new_dims=hidden,
                            kernel_initializer=self.upproject_initializer,
                            activation_functions=self.activation, use_bias=self.use_bias,
                            variable_dtype=context.variable_dtype, name="wi",
                            expert_dims=expert_dims)
    if context.train and self.dropout_rate:
      h = mtf.dropout(h, context.train, 1.0 - self.dropout_rate,
                      noise_shape=h.shape - context.length_dim)
    h = _add_scalar(h, get_single_scalar_bias(x, "shift"))
    return mtf.layers.dense(h, io_dim, use_bias=self.use_bias, activation=None,
                            variable_dtype=context.variable_dtype, reduced_dims=[hidden],
                            name="wo", expert_dims=expert_dims,
                            kernel_initializer=self.downproject_initializer)


class SelfAttentionFixup(transformer_layers.SelfAttention):
  """Multi-head self-attention whose projections have Fixup initialisation
  (`AttentionParamsFixup`); everything else is `SelfAttention`'s.

  Args:
    num_blocks: the model's residual blocks (required).
    default_init: "glorot" (default) or "he".
    init_distribution: "uniform", "normal", "truncated_normal", ...
    **kwargs: SelfAttention's arguments.

  Example:
    >>> layer = SelfAttentionFixup(num_blocks=60, num_heads=8)
  """

  def __init__(self, num_blocks: Optional[int] = None, default_init: str = "glorot",
               init_distribution: str = "uniform", **kwargs):
    super().__init__(**kwargs)
    self.num_blocks = _check_blocks(num_blocks, "SelfAttentionFixup")
    self.default_init = default_init
    self.init_distribution = init_distribution

  def make_params(self, context: transformer.Context) -> AttentionParamsFixup:
    query_heads, memory_heads = base_layers._heads_dims(  # pylint: disable=protected-access
        self.num_heads, self.num_memory_heads)
    d_model = context.model.model_dim
    return AttentionParamsFixup(
        context.mesh, d_model, d_model, d_model, self.kv_dim, self.kv_dim, query_heads,
        memory_heads, context.variable_dtype, shared_kv=self.shared_kv,
        ensemble_dim=getattr(context.model, "ensemble_dim", None),
        combine_dims=getattr(self, "combine_dims", True),
        keep_query_heads_dims=getattr(self, "keep_query_heads_dims", False),
        fold_scaling_into_initializer=False, num_blocks=self.num_blocks,
        default_init=self.default_init, init_distribution=self.init_distribution)


class EncDecAttentionFixup(transformer_layers.EncDecAttention):
  """Attention over the encoder's output, as `EncDecAttention` (its standard
  initialisation; only relative_attention_type defaults to None).

  Example:
    >>> layer = EncDecAttentionFixup(num_heads=8)
  """

  def call(self, context: transformer.Context, x: mtf.Tensor, losses=None) -> mtf.Tensor:
    del losses
    return super().call(context, x)


def sublayer_fixup_scale(x: mtf.Tensor, layer_stack, context) -> mtf.Tensor:
  """x times a trainable scalar "fixup_scale_weight" initialised to 1 (a
  LayerStack sublayer).

  Example:
    >>> LayerStack(layers, sublayers_per_layer=[..., sublayer_fixup_scale, ...])
  """
  del layer_stack
  weight = mtf.get_variable(x.mesh, "fixup_scale_weight",
                            mtf.Shape([mtf.Dimension("single_scale", 1)]),
                            initializer=mtf.initializers.ones(),
                            dtype=context.variable_dtype)
  return _add_scalar(x, weight, multiply=True)


def sublayer_fixup_shift(x: mtf.Tensor, layer_stack, context) -> mtf.Tensor:
  """x plus a trainable scalar "fixup_bias" initialised to 0 (a LayerStack
  sublayer).

  Example:
    >>> LayerStack(layers, sublayers_per_layer=[sublayer_fixup_shift, ...])
  """
  del layer_stack
  bias = mtf.get_variable(x.mesh, "fixup_bias", mtf.Shape([mtf.Dimension("single_bias", 1)]),
                          initializer=mtf.initializers.zeros(), dtype=context.variable_dtype)
  return _add_scalar(x, bias)
