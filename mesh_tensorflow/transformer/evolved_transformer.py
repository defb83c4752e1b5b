"""The Evolved Transformer's layers (So et al., 2019), for `LayerStack`.

The Evolved Transformer mixes gated linear units, wide convolutions and
separable convolutions into the usual attention / feed-forward stack. Each
class here is a `TransformerLayer`; the layer stack adds the norm before and
the residual after each of them, as for any layer:

    >>> encoder_layers = [GatedLinearUnitLayer(), EncoderConvolutionalLayer(512, 0.1),
    ...                   SelfAttention(), DenseReluDense()]
    >>> decoder_layers = [DecoderAttentionLayer(8), DecoderConvolutionalLayer(512, 0.1),
    ...                   SelfAttention(), EncDecAttention(), DenseReluDense()]

The convolutions do not stop information from crossing between packed
examples; the decoder's are causal (they look only at
the current and earlier positions), so a language model may use them. They
keep no decoding caches: decode such models by running the whole prefix
(incremental decoding raises an error).
"""

from __future__ import annotations

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import transformer_layers
from mesh_tensorflow.transformer.layer_stack import Context, ModeKeys, TransformerLayer


def _pad_channels_dim(tensor: mtf.Tensor, size: int) -> mtf.Tensor:
  """Zero-pads the last dimension up to `size` channels."""
  channels = tensor.shape.dims[-1]
  if channels.size > size:
    raise ValueError(f"evolved_transformer: cannot pad {channels} down to {size} channels.")
  if channels.size == size:
    return tensor
  return mtf.pad(tensor, [0, size - channels.size], channels.name)


def _dropout(x: mtf.Tensor, context: Context, dropout_rate: float) -> mtf.Tensor:
  if not context.train or not dropout_rate:
    return x
  return mtf.dropout(x, True, rate=dropout_rate,
                     noise_shape=mtf.Shape(list(context.batch_dims) + x.shape.dims[-1:]))


def _refuse_incremental(context: Context, what: str) -> None:
  if context.mode in (ModeKeys.FIRST_PART, ModeKeys.INCREMENTAL):
    raise ValueError(f"{what}: incremental decoding is not supported (the convolution keeps "
                     "no cache); decode without it, or set run.num_samples = 0.")


class _SeparableConv1D:
  """A separable convolution over the length with the channels as depth:
  output[l] = pointwise(sum_r x[l + r] * depthwise_filter_r) for r from
  min_relative_pos to max_relative_pos (zero past the ends), padding zeroed
  first, then the activation. Variables "separable_conv1d/depthwise_filter_<r>"
  [depth] and ".../pointwise" (layout-independent initializers)."""

  def __init__(self, min_relative_pos: int, max_relative_pos: int, output_size: int,
               depthwise_filter_initializer_scale: float = 1.0,
               pointwise_filter_initializer_scale: float = 1.0, activation: str = "linear"):
    self.min_relative_pos = min_relative_pos
    self.max_relative_pos = max_relative_pos
    self.output_size = output_size
    self.depthwise_scale = depthwise_filter_initializer_scale
    self.pointwise_scale = pointwise_filter_initializer_scale
    self.activation = activation

  def call(self, context: Context, x: mtf.Tensor) -> mtf.Tensor:
    mask = context.nonpadding
    if mask is not None:
      x = x * mask
    length_dim, depth_dim = x.shape.dims[-2], x.shape.dims[-1]
    output_dim = mtf.Dimension(depth_dim.name, self.output_size)
    with mtf.name_scope(context.mesh, "separable_conv1d"):
      terms = []
      for offset in range(self.min_relative_pos, self.max_relative_pos + 1):
        w = mtf.get_variable(
            context.mesh, f"depthwise_filter_{offset}", mtf.Shape([depth_dim]),
            initializer=mtf.initializers.truncated_normal(stddev=self.depthwise_scale),
            dtype=context.variable_dtype)
        moved = x if offset == 0 else mtf.shift(x, -offset, length_dim, wrap=False)
        terms.append(moved * w)
      depthwise = mtf.add_n(terms)
      y = mtf.layers.dense(
          depthwise, new_dims=[output_dim], reduced_dims=[depth_dim], use_bias=True,
          variable_dtype=context.variable_dtype, name="pointwise",
          kernel_initializer=mtf.initializers.truncated_normal(
              stddev=self.pointwise_scale * depth_dim.size ** -0.5))
    return y if self.activation == "linear" else getattr(mtf, self.activation)(y)


class GatedLinearUnitLayer(TransformerLayer):
  """A gated linear unit over d_model: dense(x) * sigmoid(dense(x))
  (https://arxiv.org/abs/1612.08083); variables under "glu".

  Example:
    >>> layer = GatedLinearUnitLayer()
  """

  def call(self, context: Context, x: mtf.Tensor, losses=None) -> mtf.Tensor:
    del losses
    return mtf.layers.dense_product(
        x, reduced_dims=x.shape.dims[-1:], new_dims=x.shape.dims[-1:],
        activation_functions=["linear", "sigmoid"], variable_dtype=context.variable_dtype,
        name="glu")


class EncoderConvolutionalLayer(TransformerLayer):
  """The Evolved Transformer encoder's convolution block: relu(dense to
  4 * d_model) plus a 3-wide relu convolution to d_model / 2 (zero-padded to
  4 * d_model), layer-normed, then a 9-wide separable convolution to
  d_model / 2, zero-padded to d_model. It sees later positions: encoders only.

  Args:
    d_model: the model dimension's size (even).
    dropout_rate: dropout after each branch (training).
    initializer_scale: scale of the separable convolution's initializers.
    norm_epsilon: the layer norm's epsilon.

  Example:
    >>> layer = EncoderConvolutionalLayer(d_model=512, dropout_rate=0.1)
  """

  def __init__(self, d_model: int, dropout_rate: float, initializer_scale: float = 1.0,
               norm_epsilon: float = 1e-6):
    if d_model % 2:
      raise ValueError(f"EncoderConvolutionalLayer: d_model must be even, got {d_model}.")
    self._dropout_rate = dropout_rate
    self._norm_epsilon = norm_epsilon
    self._conv3x1 = transformer_layers.Conv1DLayer(filter_size=3, output_size=d_model // 2,
                                                   activation="relu")
    self._sep_conv9x1 = _SeparableConv1D(-4, 4, d_model // 2, initializer_scale,
                                         initializer_scale)

  def call(self, context: Context, x: mtf.Tensor, losses=None) -> mtf.Tensor:
    del losses
    _refuse_incremental(context, "EncoderConvolutionalLayer")
    model_dim = context.model.model_dim
    hidden_dim = mtf.Dimension(model_dim.name, 4 * model_dim.size)
    with mtf.name_scope(context.mesh, "conv1x1"):
      left = mtf.layers.dense(x, new_dims=[hidden_dim], reduced_dims=x.shape.dims[-1:],
                              activation=mtf.relu, use_bias=False,
                              variable_dtype=context.variable_dtype, name="dense")
      left = _dropout(left, context, self._dropout_rate)
    with mtf.name_scope(context.mesh, "conv3x1"):
      right = _dropout(self._conv3x1.call(context, x), context, self._dropout_rate)
      right = _pad_channels_dim(right, hidden_dim.size)
    hidden = mtf.layers.layer_norm(left + right, hidden_dim, self._norm_epsilon)
    with mtf.name_scope(context.mesh, "sep_conv9x1"):
      out = _dropout(self._sep_conv9x1.call(context, hidden), context, self._dropout_rate)
    return _pad_channels_dim(out, model_dim.size)


class DecoderAttentionLayer(TransformerLayer):
  """The Evolved Transformer decoder's attention block: self-attention with
  2 * base_num_heads heads plus encoder-decoder attention with
  base_num_heads heads (scopes "self_attention" and "enc_dec_attention").

  Args:
    base_num_heads: heads of the encoder-decoder attention.

  Example:
    >>> layer = DecoderAttentionLayer(base_num_heads=8)
  """

  def __init__(self, base_num_heads: int):
    self._self_attention = transformer_layers.SelfAttention(num_heads=2 * base_num_heads)
    self._enc_dec_attention = transformer_layers.EncDecAttention(num_heads=base_num_heads)

  def call(self, context: Context, x: mtf.Tensor, losses=None) -> mtf.Tensor:
    del losses
    with mtf.name_scope(context.mesh, "self_attention"):
      left = self._self_attention.call(context, x)
    with mtf.name_scope(context.mesh, "enc_dec_attention"):
      right = self._enc_dec_attention.call(context, x)
    return left + right


class DecoderConvolutionalLayer(TransformerLayer):
  """The Evolved Transformer decoder's convolution block: an 11-wide causal
  separable convolution to 2 * d_model (relu) plus a 7-wide one to
  d_model / 2 (zero-padded), layer-normed, then a 7-wide causal separable
  convolution to d_model.

  Args:
    d_model: the model dimension's size (even).
    dropout_rate: dropout after each convolution (training).
    initializer_scale: scale of the separable convolutions' initializers.
    norm_epsilon: the layer norm's epsilon.

  Example:
    >>> layer = DecoderConvolutionalLayer(d_model=512, dropout_rate=0.1)
  """

  def __init__(self, d_model: int, dropout_rate: float, initializer_scale: float = 1.0,
               norm_epsilon: float = 1e-6):
    if d_model % 2:
      raise ValueError(f"DecoderConvolutionalLayer: d_model must be even, got {d_model}.")
    self._d_model = d_model
    self._dropout_rate = dropout_rate
    self._norm_epsilon = norm_epsilon
    scale = initializer_scale
    self._sep_conv11x1 = _SeparableConv1D(-10, 0, 2 * d_model, scale, scale, "relu")
    self._sep_conv7x1_1 = _SeparableConv1D(-6, 0, d_model // 2, scale, scale)
    self._sep_conv7x1_2 = _SeparableConv1D(-6, 0, d_model, scale, scale)

  def call(self, context: Context, x: mtf.Tensor, losses=None) -> mtf.Tensor:
    del losses
    _refuse_incremental(context, "DecoderConvolutionalLayer")
    if x.shape.dims[-1].size != self._d_model:
      raise ValueError(f"DecoderConvolutionalLayer: d_model={self._d_model} but the input "
                       f"has {x.shape.dims[-1]}; set it to the model's d_model.")
    with mtf.name_scope(context.mesh, "sep_conv11x1"):
      left = _dropout(self._sep_conv11x1.call(context, x), context, self._dropout_rate)
    with mtf.name_scope(context.mesh, "sep_conv7x1_1"):
      right = _dropout(self._sep_conv7x1_1.call(context, x), context, self._dropout_rate)
      right = _pad_channels_dim(right, left.shape.dims[-1].size)
    hidden = mtf.layers.layer_norm(left + right, left.shape.dims[-1], self._norm_epsilon)
    with mtf.name_scope(context.mesh, "sep_conv7x1_2"):
      return _dropout(self._sep_conv7x1_2.call(context, hidden), context, self._dropout_rate)
