"""Attention arithmetic shared by the transformer layers: projections,
scaled-free dot-product attention over a memory dimension, masks as additive
biases, and T5-style bucketed relative position biases.

Tensors use the dimension names of the transformer: queries
[batch..., heads, length, d_kv], keys and values [batch..., heads,
memory_length, d_kv]; during incremental decoding the query has no length
dimension.

    >>> q = params.compute_q(x)
    >>> o = attend(q, k, v, memory_dim, params.key_dim, bias)

This module is the face of the attention arithmetic: it defines nothing and
imports each name from the module that defines it:

* attention_params.py: `AttentionParams`, `ExpertsAttentionParams`,
  `attention_params_simple`;
* dot_product_attention.py: `attend`, the original's `attention` and
  `hybrid_attention`, the bias helpers and relative position biases;
* local_and_synthetic_attention.py: `synthetic_attention` and
  `local_attention_1d`.
"""

# pylint: disable=unused-import
from mesh_tensorflow.transformer.attention_params import (  # noqa: F401
    AttentionParams, ExpertsAttentionParams, attention_params_simple)
from mesh_tensorflow.transformer.dot_product_attention import (  # noqa: F401
    NEG_INF, add_bias, attend, attention, bias_where, hybrid_attention,
    maybe_reshape_attention_input_for_2d_sharding, relative_position_bias,
    relative_position_bucket, to_memory, visibility_mask_to_attention_bias)
from mesh_tensorflow.transformer.local_and_synthetic_attention import (  # noqa: F401
    SYNTHESIZE_MODES, local_attention_1d, synthetic_attention)
