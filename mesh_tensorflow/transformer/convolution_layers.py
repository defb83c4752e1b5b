"""Convolution layers: separable 1-D convolutions
(`SeparableConv1DLayer`) and the local convolutional attention family
(`Conv1DLocalAttn`, `LightweightConv1DLocalAttn`, `DynamicConv1DLocalAttn`,
`LocalConvAttnBlock`), all decoding incrementally through
`base_layers.Conv1D`'s cache.

    >>> layer = SeparableConv1DLayer(min_relative_pos=-3, max_relative_pos=0,
    ...                              output_size=512)
"""

from __future__ import annotations


import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import base_layers as tl
from mesh_tensorflow.transformer import transformer
from mesh_tensorflow.transformer.attention_layer_helpers import (
    FIRST_PART, INCREMENTAL)


Conv1D = tl.Conv1D


def _activation(owner, activation):
  if activation in (None, "linear"):
    return None
  fn = getattr(mtf, activation, None) if isinstance(activation, str) else activation
  if not callable(fn):
    raise ValueError(f"{owner}: activation must be 'linear' or the name of an mtf function, "
                     f"got {activation!r}.")
  return fn


class SeparableConv1DLayer(Conv1D):
  """Depthwise-separable 1D convolution along the length with d_model as the
  channels (`mtf.layers.separable_conv1d`, bias on): output position l sums
  the inputs at l + r for r in [min_relative_pos, max_relative_pos], each
  times a per-channel filter, then mixes channels. Padding (sequence id 0)
  is zeroed first; nothing stops information crossing between packed examples.
  Decodes incrementally (exactly so when max_relative_pos <= 0, i.e.
  causal). Variables "separable_conv1d/depthwise_filter_<r>" [d_model] and
  "separable_conv1d/pointwise/kernel", "/bias".

  Args:
    min_relative_pos: the leftmost offset (<= 0 looks back).
    max_relative_pos: the rightmost offset.
    output_size: the output channels (keeping d_model's name).
    depthwise_filter_initializer_scale: stddev of the depthwise filters.
    pointwise_filter_initializer_scale: scale of the pointwise kernel.
    activation: "linear" or the name of an mtf function.

  Example:
    >>> layer = SeparableConv1DLayer(-2, 0, output_size=512)   # causal, width 3
  """

  def __init__(self, min_relative_pos: int, max_relative_pos: int, output_size: int,
               depthwise_filter_initializer_scale: float = 1.0,
               pointwise_filter_initializer_scale: float = 1.0, activation: str = "linear"):
    if max_relative_pos < min_relative_pos:
      raise ValueError(f"{type(self).__name__}: max_relative_pos ({max_relative_pos}) is below "
                       f"min_relative_pos ({min_relative_pos}).")
    self._min_relative_pos = min_relative_pos
    self._max_relative_pos = max_relative_pos
    self._output_size = output_size
    self._depthwise_filter_initializer_scale = depthwise_filter_initializer_scale
    self._pointwise_filter_initializer_scale = pointwise_filter_initializer_scale
    self._activation = activation
    _activation(type(self).__name__, activation)

  @property
  def filter_size(self) -> int:
    return self._max_relative_pos - self._min_relative_pos + 1

  def call(self, context, x, losses=None, all_kernel_wts=None):
    del losses
    if context.mode == FIRST_PART:
      self.record_states_first_part_mode(context, x, self.filter_size)
    if context.mode == INCREMENTAL:
      x = self.record_states_incremental_mode(context, x, self.filter_size)
    else:
      x = self._mask_padding(context, x)
    model_dim = x.shape.dims[-1]
    output = mtf.layers.separable_conv1d(
        x, mtf.Dimension(model_dim.name, self._output_size),
        min_relative_pos=self._min_relative_pos, max_relative_pos=self._max_relative_pos,
        depthwise_filter_initializer_scale=self._depthwise_filter_initializer_scale,
        pointwise_filter_initializer_scale=self._pointwise_filter_initializer_scale,
        use_bias=True, kernel_depth_weights=all_kernel_wts, name="separable_conv1d")
    if context.mode == INCREMENTAL:
      filter_dim = mtf.Dimension("length", self.filter_size)
      last = mtf.one_hot(mtf.constant(x.mesh, self.filter_size - 1, dtype=tf.int32),
                         filter_dim, dtype=output.dtype)
      output = mtf.reduce_sum(output * last, reduced_dim=filter_dim)
    fn = _activation(type(self).__name__, self._activation)
    return output if fn is None else fn(output)


class Conv1DLocalAttn(SeparableConv1DLayer):
  """A separable convolution whose depthwise filters are normalized by a
  softmax over the window (convolution as local attention, Wu et al. 2019,
  arXiv:1901.10430), with num_unique_depth_filters filters of d_model /
  num_unique_depth_filters channels tiled over d_model. Subclasses say where
  the filters come from (`get_kernel_wt`): `LightweightConv1DLocalAttn`
  (learned) or `DynamicConv1DLocalAttn` (computed from each position's
  input).

  Args:
    min_relative_pos: as SeparableConv1DLayer.
    max_relative_pos: as SeparableConv1DLayer.
    output_size: as SeparableConv1DLayer.
    depthwise_filter_initializer_scale: as SeparableConv1DLayer.
    pointwise_filter_initializer_scale: as SeparableConv1DLayer.
    activation: as SeparableConv1DLayer.
    num_unique_depth_filters: how many times the filter repeats along d_model
      (must divide output_size).

  Example:
    >>> layer = LightweightConv1DLocalAttn(-2, 0, output_size=512, num_unique_depth_filters=8)
  """

  def __init__(self, min_relative_pos: int, max_relative_pos: int, output_size: int,
               depthwise_filter_initializer_scale: float = 1.0,
               pointwise_filter_initializer_scale: float = 1.0, activation: str = "linear",
               num_unique_depth_filters: int = 1):
    super().__init__(min_relative_pos, max_relative_pos, output_size,
                     depthwise_filter_initializer_scale, pointwise_filter_initializer_scale,
                     activation)
    transformer.positive_int(num_unique_depth_filters,
                             f"{type(self).__name__}: num_unique_depth_filters")
    if output_size % num_unique_depth_filters:
      raise ValueError(f"{type(self).__name__}: num_unique_depth_filters="
                       f"{num_unique_depth_filters} must divide output_size={output_size}.")
    self._num_unique_depth_filters = num_unique_depth_filters

  def get_kernel_wt(self, x, repeated_kernel_dim, kernel_initializer, i, context,
                    variable_dtype, master_dtype=tf.float32, slice_dtype=tf.float32):
    raise NotImplementedError(f"{type(self).__name__}: use LightweightConv1DLocalAttn or "
                              "DynamicConv1DLocalAttn (they define get_kernel_wt).")

  def call(self, context, x, losses=None):
    depth_dim = x.shape.dims[-1]
    if depth_dim.size % self._num_unique_depth_filters:
      raise ValueError(f"{type(self).__name__}: num_unique_depth_filters="
                       f"{self._num_unique_depth_filters} must divide {depth_dim}.")
    window = self.filter_size
    scale = self._depthwise_filter_initializer_scale or 1.0
    init = mtf.layers.VarianceScalingInitializer(scale=scale / window)
    repeated = [mtf.Dimension("repeated_kernel_dim",
                              depth_dim.size // self._num_unique_depth_filters)]
    source = x
    if context.mode == INCREMENTAL:
      # The dynamic filters of the window's positions, from the window.
      state, = context.get_states(1)
      source = self.update_state(
          state, x, mtf.constant(x.mesh, window - 1, shape=mtf.Shape(x.shape.dims[:-1]),
                                 dtype=tf.int32),
          mtf.Dimension("length", window), x.dtype)
    kernels = []
    for i in range(window):
      w = self.get_kernel_wt(source, repeated_kernel_dim=repeated, kernel_initializer=init, i=i,
                             context=context, variable_dtype=context.variable_dtype)
      tiled = mtf.concat([w] * self._num_unique_depth_filters, "repeated_kernel_dim")
      kernels.append(mtf.rename_dimension(tiled, "repeated_kernel_dim", depth_dim.name))
    stacked = mtf.stack(kernels, "new_stack_dim")
    stack_dim = stacked.shape.get_dim_by_name("new_stack_dim")
    kernels = mtf.unstack(mtf.softmax(stacked, reduced_dim=stack_dim), stack_dim)
    return super().call(context, x, all_kernel_wts=kernels)


class LightweightConv1DLocalAttn(Conv1DLocalAttn):
  """Lightweight convolution: learned depthwise filters, softmax-normalized
  over the window, variables "lightwt_depthwise_dense_<i>/kernel"
  [repeated_kernel_dim] (see Conv1DLocalAttn).

  Example:
    >>> layer = LightweightConv1DLocalAttn(-2, 0, output_size=512, num_unique_depth_filters=8)
  """

  def get_kernel_wt(self, x, repeated_kernel_dim, kernel_initializer, i, context,
                    variable_dtype, master_dtype=tf.float32, slice_dtype=tf.float32):
    return mtf.layers.get_dense_kernel_weights(
        x, new_dims=[], reduced_dims=[], expert_dims=repeated_kernel_dim,
        kernel_initializer=kernel_initializer, name="lightwt_depthwise_dense_%d" % i,
        variable_dtype=variable_dtype)


class DynamicConv1DLocalAttn(Conv1DLocalAttn):
  """Dynamic convolution: each position's depthwise filters are computed from
  its input by dense layers "dyn_conv_depthwise_dense_<i>" (kernel [d_model,
  repeated_kernel_dim], bias), softmax-normalized over the window (see
  Conv1DLocalAttn).

  Example:
    >>> layer = DynamicConv1DLocalAttn(-2, 0, output_size=512)
  """

  def get_kernel_wt(self, x, repeated_kernel_dim, kernel_initializer, i, context,
                    variable_dtype, master_dtype=tf.float32, slice_dtype=tf.float32):
    return mtf.layers.dense(x, new_dims=repeated_kernel_dim,
                            reduced_dims=[context.model.model_dim], expert_dims=[],
                            kernel_initializer=kernel_initializer,
                            name="dyn_conv_depthwise_dense_%d" % i, variable_dtype=variable_dtype)


class LocalConvAttnBlock(transformer.TransformerLayer):
  """A gated convolution block: GLU input projection ("local_conv_inp_0"
  linear times "local_conv_inp_1" sigmoid, d_model -> d_model), a
  lightweight or dynamic convolution, and an output projection
  "local_conv_attn_op_projection" (with bias).

  Args:
    min_relative_pos: as Conv1DLocalAttn.
    max_relative_pos: as Conv1DLocalAttn.
    output_size: as Conv1DLocalAttn.
    depthwise_filter_initializer_scale: as Conv1DLocalAttn.
    pointwise_filter_initializer_scale: as Conv1DLocalAttn.
    activation: as Conv1DLocalAttn.
    num_unique_depth_filters: accepted and ignored.
    attention_type: "lightweight_conv" or "dynamic_conv".

  Example:
    >>> layer = LocalConvAttnBlock(-2, 0, output_size=512, attention_type="dynamic_conv")
  """

  def __init__(self, min_relative_pos: int, max_relative_pos: int, output_size: int,
               depthwise_filter_initializer_scale: float = 1.0,
               pointwise_filter_initializer_scale: float = 1.0, activation: str = "linear",
               num_unique_depth_filters: int = 1, attention_type: str = "lightweight_conv"):
    del num_unique_depth_filters
    classes = {"lightweight_conv": LightweightConv1DLocalAttn,
               "dynamic_conv": DynamicConv1DLocalAttn}
    if attention_type not in classes:
      raise ValueError(f"LocalConvAttnBlock: attention_type must be one of {sorted(classes)}, "
                       f"got {attention_type!r}.")
    self.conv_local_attn_layer = classes[attention_type](
        min_relative_pos, max_relative_pos, output_size, depthwise_filter_initializer_scale,
        pointwise_filter_initializer_scale, activation)

  def call(self, context, x, losses=None):
    d_model = context.model.model_dim
    gate = [mtf.layers.dense(x, new_dims=[d_model], reduced_dims=[d_model], activation=a,
                             variable_dtype=context.variable_dtype, name="local_conv_inp_%d" % i)
            for i, a in enumerate([None, "sigmoid"])]
    h = self.conv_local_attn_layer.call(context, gate[0] * gate[1], losses)
    if h.shape.dims[-1] != d_model:
      raise ValueError(f"LocalConvAttnBlock: output_size must equal d_model ({d_model.size}), "
                       f"got {h.shape.dims[-1].size}.")
    return mtf.layers.dense(h, new_dims=[d_model], reduced_dims=[d_model],
                            variable_dtype=context.variable_dtype,
                            name="local_conv_attn_op_projection")
