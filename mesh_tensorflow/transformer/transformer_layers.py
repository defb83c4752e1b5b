"""The layers for `transformer.LayerStack`, under the original's names.

This module is the face of the layer families: it defines nothing and
imports each layer from the module that defines it, so a program or a gin
file says `transformer_layers.SelfAttention` or
`@transformer_layers.TalkingHeadsSelfAttention`.

* base_layers.py: `SelfAttention` (with an optional T5-style relative
  position bias), `EncDecAttention`, `LocalSelfAttention`,
  `DenseReluDense` (with gated variants), `Conv1D`, `Conv1DLayer` and
  `ParallelLayer`;
* talking_heads_attention.py: `TalkingHeadsSelfAttention`,
  `TalkingHeadsEncDecAttention`;
* attention_variants.py: general bilinear, branched, synthesizer,
  transparent encoder-decoder and experts attention;
* convolution_layers.py: `SeparableConv1DLayer` and the local
  convolutional attention layers;
* attention_layer_helpers.py: `enc_dec_attention`,
  `enc_dec_attention_bias`, `relative_position_spans`.

Every layer works in all modes: training and eval (whole sequences),
"first_part" (the prefix pass before decoding, which records caches) and
"incremental" (one position per sequence, reading and updating the caches).

    >>> layers = [SelfAttention(num_heads=8, key_value_size=64,
    ...                         relative_attention_type="bias"),
    ...           EncDecAttention(num_heads=8, key_value_size=64),
    ...           DenseReluDense(hidden_size=2048, activation=["gelu", "linear"])]
"""

# pylint: disable=unused-import
from mesh_tensorflow.transformer.attention_layer_helpers import (  # noqa: F401
    enc_dec_attention, enc_dec_attention_bias, relative_position_spans)
from mesh_tensorflow.transformer.attention_variants import (  # noqa: F401
    BranchedEncDecAttention, BranchedSelfAttention, ExpertsEncDecAttention,
    ExpertsSelfAttention, GeneralBilinearEncDecAttention, GeneralBilinearSelfAttention,
    Synthesizer, TransparentEncDecAttention)
from mesh_tensorflow.transformer.base_layers import (  # noqa: F401
    Activation, Conv1D, Conv1DLayer, DenseReluDense, EncDecAttention, LocalSelfAttention,
    ParallelLayer, SelfAttention, attention_params)
from mesh_tensorflow.transformer.convolution_layers import (  # noqa: F401
    Conv1DLocalAttn, DynamicConv1DLocalAttn, LightweightConv1DLocalAttn, LocalConvAttnBlock,
    SeparableConv1DLayer)
from mesh_tensorflow.transformer.talking_heads_attention import (  # noqa: F401
    TalkingHeadsEncDecAttention, TalkingHeadsSelfAttention)
