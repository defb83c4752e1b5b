"""Transformer models over named dimensions: the layer stack, the decoder-only
`Unitransformer` and the encoder-decoder `Bitransformer`.

A model is a `LayerStack` of `TransformerLayer` instances (attention,
feed-forward, mixture of experts; see transformer_layers.py and moe.py)
wrapped by a `Unitransformer`, which adds the vocabulary embedding, positions
and the output softmax (the embedding and, with shared weights, the softmax
come from a `VocabEmbedding` or another `vocab_embedding_cls`, see
vocab_embeddings.py). Layers get a `Context` with everything else they need
(mode, positions, packing ids, decoding caches, the list of auxiliary losses).

Dimension names are fixed so that layout rules can refer to them: "batch",
"length", "memory_length", "d_model", "heads", "d_kv", "d_ff", "vocab",
"experts" (e.g. "batch:rows;heads:cols;d_ff:cols;vocab:cols").

    >>> stack = make_layer_stack(
    ...     [transformer_layers.SelfAttention(num_heads=8, key_value_size=64),
    ...      transformer_layers.DenseReluDense(hidden_size=2048)], num_layers=6)
    >>> model = Unitransformer(stack, d_model=512, input_vocab_size=256,
    ...                        output_vocab_size=256, autoregressive=True,
    ...                        max_length=512)
    >>> logits, loss = model.call_simple(inputs, targets, compute_loss=True)
    >>> samples = model.sample_autoregressive(prompts, temperature=0.0)

This module is the face of the model library: it defines nothing and
imports the names the original's `transformer` module had from the modules
that define them, so `transformer.Unitransformer` and
`transformer.sublayer_dropout` work in programs and gin files:

* unitransformer.py: `Unitransformer` and `VocabEmbedding`;
* bitransformer.py: `Bitransformer`, `make_bitransformer` (an
  encoder-decoder from the gin scopes "encoder" and "decoder") and
  `make_bi_student_teacher`;
* layer_stack.py: `LayerStack` and `make_layer_stack`;
* layer_context.py: `TransformerLayer`, `Context` and `ModeKeys`;
* sublayers.py: the sublayer functions (`sublayer_rms_norm`,
  `sublayer_residual`, ...);
* model_inputs.py: `shift_targets`, `autoregressive_inputs`,
  `delimited_lm_inputs_mask`, `sinusoid_positional_embedding_weights` and
  the argument checks the layers share (`positive_int`);
* transformer_extras.py: `ReversibleLayerStack`, `StudentTeacher` and the
  ensemble reductions.

Decoding is incremental: a "first_part" pass over the known prefix fills
per-layer caches of keys and values, then an `mtf.while_loop` runs one
position at a time ("incremental" mode), each step reading and updating the
caches, so a step costs O(length) rather than a full recomputation.
"""

# pylint: disable=unused-import
from mesh_tensorflow.transformer.bitransformer import (  # noqa: F401
    Bitransformer, make_bi_student_teacher, make_bitransformer)
from mesh_tensorflow.transformer.layer_context import (  # noqa: F401
    EOS_ID, Context, ModeKeys, TransformerLayer, gin_configurables, inputs_prefix_mask)
from mesh_tensorflow.transformer.layer_stack import LayerStack, make_layer_stack  # noqa: F401
from mesh_tensorflow.transformer.model_inputs import (  # noqa: F401
    autoregressive_inputs, delimited_lm_inputs_mask, positive_int, refuse_unsupported,
    shift_right_within_segments, shift_targets, sinusoid_positional_embedding_weights,
    sinusoidal_position_embedding, text2self_inputs_mask)
from mesh_tensorflow.transformer.sublayers import (  # noqa: F401
    sublayer_call_layer, sublayer_clip_activation_gradient, sublayer_dropout,
    sublayer_legacy_dropout, sublayer_legacy_final_rms_norm, sublayer_legacy_rms_norm,
    sublayer_mask_padding, sublayer_residual, sublayer_rezero, sublayer_rms_norm,
    sublayer_rms_norm_subsampled, sublayer_scale_norm, sublayer_true_layer_norm)
from mesh_tensorflow.transformer.transformer_extras import (  # noqa: F401
    ReversibleLayerStack, StudentTeacher, reduce_ensemble_logits,
    reduce_ensemble_logits_mean_logit, reduce_ensemble_logits_mean_prob,
    reduce_ensemble_logits_select, sublayer_annealed_dropout)
from mesh_tensorflow.transformer.unitransformer import (  # noqa: F401
    Unitransformer, VocabEmbedding, _call_loss_fn, get_vocab_embedding_cls)
