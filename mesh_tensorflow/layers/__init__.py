"""mtf.layers: neural-network layers over named dimensions.

The layers live in these modules and are all exported here, so models use
`mtf.layers.<name>`:

* core.py: `dense`, `dense_product`, `dense_relu_dense`,
  `layer_norm`, `rms_norm`, `batch_norm`, `dropout`, `embedding`,
  `embedding_weights`, `corr` (Pearson correlation) and
  `clip_activation_gradient` (gin-configurable).
* attention.py: `dot_product_attention`, `multihead_attention`,
  `masked_local_attention_1d`, `attention_mask_ignore_padding`,
  `attention_mask_autoregressive`, `attention_mask_same_segment`,
  `attention_bias_local_block`, `multihead_attention_params`,
  `multihead_self_attention_memory_compressed`.
* local_attention.py: attention within neighbouring blocks of a
  sequence or an image, `local_self_attention_spatial_blocks`,
  `local_2d_self_attention_spatial_blocks`, their halo exchanges
  `local_1d_halo_exchange`, `local_2d_halo_exchange`, and
  `attention_bias_local_2d_block`.
* incremental.py: one decoding step with key/value caches,
  `multihead_self_attention_incremental`,
  `multihead_encdec_attention_incremental`,
  `masked_local_attention_1d_incremental`.
* reversible.py: `reversible_half_residual_and_swap` (RevNet blocks
  whose gradient recomputes their inputs).
* unit_scaling.py: `unit_scaling_convention` (gin-configurable) and
  `us_einsum`.
* losses.py: `softmax_cross_entropy_with_logits` (with z-loss and
  label smoothing), `smoothed_targets`, `sigmoid_cross_entropy_with_logits`,
  `weights_nonzero`.
* convolution.py: convolutions (also over blocks: `conv2d_with_blocks`,
  `conv2d_transpose_with_blocks`, ...) and pooling.

Layout-invariant initializers (`VarianceScalingInitializer`,
`glorot_uniform`, `he_normal`, `lecun_normal`, ...) come from
initializers.py and are exported here too
(`mtf.layers.VarianceScalingInitializer`).

    >>> h = mtf.layers.dense(x, d_ff, reduced_dims=[d_model], activation="relu")
    >>> h = mtf.layers.layer_norm(h, d_ff)
    >>> loss = mtf.layers.softmax_cross_entropy_with_logits(logits, ids, vocab)
"""

from mesh_tensorflow.layers.initializers import (
    Constant, DenseInitializer, Initializer, RandomNormal, RandomUniform, TruncatedNormal,
    VarianceScalingInitializer, glorot_normal, glorot_uniform, he_normal, he_uniform,
    lecun_normal, lecun_uniform, variance_scaling)
from mesh_tensorflow.layers.attention import (
    attention_bias_local_block, attention_mask_autoregressive, attention_mask_ignore_padding,
    attention_mask_same_segment, dot_product_attention, masked_local_attention_1d,
    memory_name, multihead_attention, multihead_attention_params, multihead_attention_vars,
    multihead_self_attention_memory_compressed, rename_length_to_memory_length)
from mesh_tensorflow.layers.core import (
    annealed_dropout, summary_for_clip_activation_gradient)
from mesh_tensorflow.layers.core import (
    batch_norm, clip_activation_gradient, compress_mean, corr, dense, dense_product,
    dense_relu_dense, dropout, embedding, embedding_weights, get_dense_kernel_weights,
    layer_norm, layer_scope, multiplicative_jitter, rms_norm, scale_normalized,
    unique_layer_name)
from mesh_tensorflow.layers.incremental import (
    masked_local_attention_1d_incremental, multihead_encdec_attention_incremental,
    multihead_self_attention_incremental)
from mesh_tensorflow.layers.local_attention import (
    attention_bias_local_2d_block, local_1d_halo_exchange, local_2d_halo_exchange,
    local_2d_self_attention_spatial_blocks, local_self_attention_spatial_blocks)
from mesh_tensorflow.layers.losses import (
    sigmoid_cross_entropy_with_logits, smoothed_targets, softmax_cross_entropy_with_logits,
    weights_nonzero)
from mesh_tensorflow.layers.reversible import reversible_half_residual_and_swap
from mesh_tensorflow.layers.unit_scaling import unit_scaling_convention, us_einsum
# Convolution and pooling layers (convolution.py).
from mesh_tensorflow.layers.convolution import *  # noqa: F401,F403  pylint: disable=wildcard-import
from mesh_tensorflow.layers.convolution import __all__ as _convolution_names

__all__ = [
    "annealed_dropout",
    "summary_for_clip_activation_gradient",
    "Constant",
    "DenseInitializer",
    "Initializer",
    "RandomNormal",
    "RandomUniform",
    "TruncatedNormal",
    "VarianceScalingInitializer",
    "attention_bias_local_2d_block",
    "attention_bias_local_block",
    "attention_mask_autoregressive",
    "attention_mask_ignore_padding",
    "attention_mask_same_segment",
    "batch_norm",
    "clip_activation_gradient",
    "compress_mean",
    "corr",
    "dense",
    "dense_product",
    "dense_relu_dense",
    "dot_product_attention",
    "dropout",
    "embedding",
    "embedding_weights",
    "get_dense_kernel_weights",
    "glorot_normal",
    "glorot_uniform",
    "he_normal",
    "he_uniform",
    "layer_norm",
    "layer_scope",
    "lecun_normal",
    "lecun_uniform",
    "local_1d_halo_exchange",
    "local_2d_halo_exchange",
    "local_2d_self_attention_spatial_blocks",
    "local_self_attention_spatial_blocks",
    "masked_local_attention_1d",
    "masked_local_attention_1d_incremental",
    "memory_name",
    "multihead_attention",
    "multihead_attention_params",
    "multihead_attention_vars",
    "multihead_encdec_attention_incremental",
    "multihead_self_attention_incremental",
    "multihead_self_attention_memory_compressed",
    "multiplicative_jitter",
    "rename_length_to_memory_length",
    "reversible_half_residual_and_swap",
    "rms_norm",
    "scale_normalized",
    "sigmoid_cross_entropy_with_logits",
    "smoothed_targets",
    "softmax_cross_entropy_with_logits",
    "unique_layer_name",
    "unit_scaling_convention",
    "us_einsum",
    "variance_scaling",
    "weights_nonzero",
] + list(_convolution_names)

