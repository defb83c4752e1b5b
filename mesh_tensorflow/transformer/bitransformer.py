"""The encoder-decoder Transformer, `Bitransformer` (two Unitransformers), and
the builders of encoder-decoders from gin scopes:
`make_bitransformer` and `make_bi_student_teacher`.

    >>> model = Bitransformer(encoder, decoder)
    >>> logits, loss = model.call_simple(inputs, targets, compute_loss=True)
    >>> outputs = model.decode(inputs, beam_size=4, alpha=0.6)
"""

from __future__ import annotations

import contextlib
from typing import Optional

import numpy as np
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer.layer_context import ModeKeys, gin_configurables
from mesh_tensorflow.transformer.layer_stack import LayerStack, make_layer_stack
from mesh_tensorflow.transformer.model_inputs import positive_int, shift_right_within_segments
from mesh_tensorflow.transformer.transformer_extras import StudentTeacher
from mesh_tensorflow.transformer.unitransformer import Unitransformer


class Bitransformer:
  """An encoder-decoder Transformer: two Unitransformers.

  The decoder's self-attention is causal and each decoder layer may attend
  to the encoder output (EncDecAttention layers). With shared_embedding the
  two share one vocabulary embedding (an instance of their
  vocab_embedding_cls, by default one table) and learned position table,
  created under "shared/".

  Args:
    encoder: a Unitransformer with output_vocab_size None (name "encoder").
    decoder: an autoregressive Unitransformer (name "decoder").
    shared_embedding: share the input embeddings.

  Example:
    >>> model = Bitransformer(encoder, decoder)
    >>> logits, loss = model.call_simple(inputs, targets, compute_loss=True)
    >>> outputs = model.decode(inputs, beam_size=4, alpha=0.6)
  """

  def __init__(self, encoder: Unitransformer, decoder: Unitransformer,
               shared_embedding: bool = True):
    if not decoder.autoregressive:
      raise ValueError("Bitransformer: the decoder must be autoregressive.")
    if encoder.name == decoder.name:
      raise ValueError(f"Bitransformer: encoder and decoder need different names "
                       f"(both are {encoder.name!r}).")
    self.encoder = encoder
    self.decoder = decoder
    self.shared_embedding = shared_embedding

  @property
  def output_vocab_dim(self) -> mtf.Dimension:
    return self.decoder.output_vocab_dim

  @property
  def z_loss(self) -> float:
    return self.decoder.z_loss

  def _shared_params(self, mesh: mtf.Mesh, variable_dtype: mtf.VariableDType):
    params = {}
    if not self.shared_embedding:
      return params
    enc, dec = self.encoder, self.decoder
    if (enc.model_dim != dec.model_dim or enc.input_vocab_dim != dec.input_vocab_dim):
      raise ValueError("Bitransformer: shared_embedding needs the same d_model and input "
                       f"vocabulary in encoder ({enc.model_dim}, {enc.input_vocab_dim}) and "
                       f"decoder ({dec.model_dim}, {dec.input_vocab_dim}).")
    if enc.vocab_embedding_cls is not dec.vocab_embedding_cls:
      raise ValueError(
          "Bitransformer: shared_embedding needs one vocab_embedding_cls for encoder and "
          f"decoder, got {enc.vocab_embedding_cls!r} and {dec.vocab_embedding_cls!r}.")
    with mtf.name_scope(mesh, "shared"):
      params["embedding"] = enc.vocab_embedding_cls(
          mesh, enc.input_vocab_dim, enc.model_dim, variable_dtype, name="embedding",
          ensemble_dim=None)
      if (enc.positional_embedding == dec.positional_embedding == "learned"
          and enc.max_length_dim == dec.max_length_dim):
        params["positional_embedding"] = mtf.layers.embedding_weights(
            mesh, enc.max_length_dim, enc.model_dim, variable_dtype,
            name="positional_embedding")
    return params

  def _encode(self, inputs, mode, variable_dtype, encoder_sequence_id, encoder_position,
              shared_params, compute_loss=False):
    if encoder_sequence_id is None:
      encoder_sequence_id = mtf.minimum(inputs, 1)
    layer_outputs = []
    output, loss = self.encoder.call_simple(
        inputs, None, compute_loss, mode=mode, variable_dtype=variable_dtype,
        sequence_id=encoder_sequence_id, position=encoder_position,
        shared_params=shared_params, layer_outputs=layer_outputs)
    output = mtf.layers.rename_length_to_memory_length(output)
    encoder_sequence_id = mtf.layers.rename_length_to_memory_length(encoder_sequence_id)
    return output, encoder_sequence_id, layer_outputs, loss

  def call_simple(self, inputs: mtf.Tensor, targets: mtf.Tensor, compute_loss: bool,
                  mode: str = ModeKeys.TRAIN,
                  variable_dtype: Optional[mtf.VariableDType] = None,
                  encoder_sequence_id=None, decoder_sequence_id=None,
                  decoder_subsequence_id=None, encoder_position=None, decoder_position=None,
                  num_microbatches: int = 1):
    """Logits and loss with teacher forcing (training and eval).

    Args:
      inputs: int32 [batch..., length] encoder tokens (0 is padding).
      targets: int32 [batch..., length] decoder targets; the decoder reads
        them shifted right by one (within each packed segment).
      compute_loss: whether to return the loss.
      mode: ModeKeys.TRAIN, EVAL or PREDICT.
      variable_dtype: an mtf.VariableDType.
      encoder_sequence_id: segment ids of packed inputs (default: 1 at
        tokens, 0 at padding).
      decoder_sequence_id: segment ids of packed targets.
      decoder_subsequence_id: accepted for compatibility.
      encoder_position: positions of packed inputs.
      decoder_position: positions of packed targets.
      num_microbatches: see Unitransformer.call_simple.

    Returns:
      (logits [batch..., length, vocab], loss or None).

    Example:
      >>> logits, loss = model.call_simple(inputs, targets, compute_loss=True)
    """
    variable_dtype = variable_dtype or mtf.VariableDType(tf.float32)
    shared_params = self._shared_params(inputs.mesh, variable_dtype)
    encoder_output, encoder_sequence_id, encoder_layer_outputs, encoder_loss = self._encode(
        inputs, mode, variable_dtype, encoder_sequence_id, encoder_position, shared_params,
        compute_loss)
    shifted = shift_right_within_segments(targets, decoder_sequence_id)
    logits, loss = self.decoder.call_simple(
        shifted, targets, compute_loss, mode=mode, variable_dtype=variable_dtype,
        sequence_id=decoder_sequence_id, subsequence_id=decoder_subsequence_id,
        encoder_output=encoder_output, encoder_sequence_id=encoder_sequence_id,
        position=decoder_position, shared_params=shared_params,
        encoder_layer_outputs=encoder_layer_outputs, encoder_inputs=inputs,
        num_microbatches=num_microbatches)
    if loss is not None and encoder_loss is not None:
      loss = loss + encoder_loss
    return logits, loss

  def decode(self, inputs: mtf.Tensor, variable_dtype: Optional[mtf.VariableDType] = None,
             beam_size: int = 1, alpha: float = 0.6, temperature: float = 0.0,
             sampling_keep_top_k: Optional[int] = None,
             decode_length_multiplier: float = 1.5, decode_length_constant: float = 10,
             max_decode_length: Optional[int] = None, top_k: Optional[int] = None,
             stop_at_token: int = 1) -> mtf.Tensor:
    """Decodes targets for `inputs`: greedy/sampling (beam_size 1) or beam
    search.

    At most max_input_length * decode_length_multiplier +
    decode_length_constant tokens are produced (capped by the length
    dimension), where max_input_length is the longest non-padding input of
    the batch.

    Args:
      inputs: int32 [batch..., length] encoder tokens.
      variable_dtype: an mtf.VariableDType.
      beam_size: 1 for greedy decoding or sampling, more for beam search.
      alpha: beam search length penalty exponent.
      temperature: sampling temperature (0.0: greedy; must be 0 with beams).
      sampling_keep_top_k: the original's name for top_k (-1: no limit).
      decode_length_multiplier: see above.
      decode_length_constant: see above.
      max_decode_length: the output length (default: the input length).
      top_k: sample among the k most likely tokens only.
      stop_at_token: end-of-sequence id.

    Returns:
      int32 [batch..., length] decoded targets (the best beam).

    Example:
      >>> outputs = model.decode(inputs, beam_size=4, alpha=0.6)
    """
    variable_dtype = variable_dtype or mtf.VariableDType(tf.float32)
    if top_k is None and sampling_keep_top_k is not None and sampling_keep_top_k > 0:
      top_k = sampling_keep_top_k
    mesh = inputs.mesh
    shared_params = self._shared_params(mesh, variable_dtype)
    encoder_output, encoder_sequence_id, encoder_layer_outputs, _ = self._encode(
        inputs, ModeKeys.PREDICT, variable_dtype, None, None, shared_params)
    batch_dims = inputs.shape.dims[:-1]
    length_dim = inputs.shape.dims[-1]
    out_length = (length_dim if max_decode_length is None
                  else mtf.Dimension(length_dim.name, max_decode_length))
    input_length = mtf.reduce_sum(mtf.to_float(mtf.not_equal(inputs, 0)), reduced_dim=length_dim)
    decode_length = mtf.to_int32(mtf.reduce_max(input_length) * decode_length_multiplier
                                 + float(decode_length_constant))
    if beam_size == 1:
      partial = mtf.zeros(mesh, mtf.Shape(batch_dims + [out_length]), dtype=tf.int32)
      return self.decoder.sample_autoregressive(
          partial, stop_at_token=stop_at_token, max_steps=decode_length,
          temperature=temperature, variable_dtype=variable_dtype,
          encoder_output=encoder_output, encoder_sequence_id=encoder_sequence_id,
          shared_params=shared_params, has_partial_sequences=False,
          encoder_layer_outputs=encoder_layer_outputs, top_k=top_k)
    if temperature != 0.0:
      raise ValueError("Bitransformer.decode: beam search needs temperature 0.0.")
    beam_dim = mtf.Dimension("beam", beam_size)
    partial = mtf.zeros(mesh, mtf.Shape(batch_dims + [beam_dim, out_length]), dtype=tf.int32)
    return self.decoder.beam_search(
        partial, decode_length, variable_dtype=variable_dtype, encoder_output=encoder_output,
        encoder_sequence_id=encoder_sequence_id, alpha=alpha, shared_params=shared_params,
        encoder_layer_outputs=encoder_layer_outputs, stop_at_token=stop_at_token)


def _gin_scope(scope: str, configurables: dict):
  """gin.config_scope(scope) when gin is in use, else a no-op context."""
  if not configurables:
    return contextlib.nullcontext()
  import gin  # pylint: disable=g-import-not-at-top  (gin_config imported it already)
  return gin.config_scope(scope)


def _default_layer_stack(side: str, configurables: dict) -> LayerStack:
  """make_layer_stack() without arguments (gin's when registered), or a
  ValueError saying which binding is missing."""
  build = configurables.get("make_layer_stack", make_layer_stack)
  try:
    return build()
  except TypeError as e:
    if "make_layer_stack() missing" not in str(e) or "'layers'" not in str(e):
      raise
    how = ("" if configurables else
           " (first call mesh_tensorflow.transformer.gin_config.register_configurables() "
           "or gin_config.parse, which registers the names)")
    raise ValueError(
        f"make_bitransformer: make_layer_stack has no default layers, so the {side} needs "
        f"a gin binding{how}, e.g. `{side}/make_layer_stack.layers = "
        "[@transformer_layers.SelfAttention, @transformer_layers.DenseReluDense]`; or build "
        "the two Unitransformers yourself and pass them to Bitransformer(encoder, decoder)."
    ) from e


def make_bitransformer(input_vocab_size: Optional[int] = None,
                       output_vocab_size: Optional[int] = None, layout=None, mesh_shape=None,
                       encoder_name: str = "encoder", decoder_name: str = "decoder",
                       bitransformer_cls=Bitransformer):
  """An encoder-decoder built from gin bindings (gin:
  `transformer.make_bitransformer`).

  The encoder is a non-autoregressive Unitransformer without output
  vocabulary and the decoder an autoregressive one whose input and output
  vocabularies are output_vocab_size. Each gets the layer stack of
  `make_layer_stack()` called in the gin scope "encoder" or "decoder", and
  is itself built in that scope, so a config binds, e.g.

      encoder/make_layer_stack.layers = [@transformer_layers.SelfAttention,
                                         @transformer_layers.DenseReluDense]
      decoder/make_layer_stack.layers = [@transformer_layers.SelfAttention,
                                         @transformer_layers.EncDecAttention,
                                         @transformer_layers.DenseReluDense]
      decoder/Unitransformer.d_model = 512

  Unscoped bindings (`Unitransformer.d_model`) apply to both. Before
  gin_config.register_configurables() the plain classes are used, and since
  make_layer_stack has no default layers that raises a ValueError saying
  what to bind.

  Args:
    input_vocab_size: the encoder's vocabulary size (required).
    output_vocab_size: the decoder's vocabulary size (required).
    layout: layout rules, passed to both Unitransformers (layers such as
      MoE1D read them).
    mesh_shape: the mesh shape, likewise.
    encoder_name: the encoder's name (its variable scope).
    decoder_name: the decoder's name.
    bitransformer_cls: called as bitransformer_cls(encoder, decoder), e.g.
      funnel_transformer.BitransformerFunnel. The default is Bitransformer,
      gin's version of it once registered (so `Bitransformer.*` bindings
      apply).

  Returns:
    bitransformer_cls(encoder, decoder).

  Example:
    >>> gin_config.parse([], ["encoder/make_layer_stack.layers = [...]", ...])
    >>> model = make_bitransformer(input_vocab_size=32128, output_vocab_size=32128)
    >>> model.encoder.name, model.decoder.autoregressive
    ('encoder', True)
  """
  for what, size in (("input_vocab_size", input_vocab_size),
                     ("output_vocab_size", output_vocab_size)):
    positive_int(size, f"make_bitransformer: {what}",
                 f" (gin: `make_bitransformer.{what} = 32128`)", (int, np.integer))
  configurables = gin_configurables()
  unitransformer = configurables.get("Unitransformer", Unitransformer)
  if bitransformer_cls is Bitransformer:
    bitransformer_cls = configurables.get("Bitransformer", Bitransformer)
  sides = {}
  for scope, name, input_size, output_size in (
      ("encoder", encoder_name, input_vocab_size, None),
      ("decoder", decoder_name, output_vocab_size, output_vocab_size)):
    with _gin_scope(scope, configurables):
      sides[scope] = unitransformer(
          layer_stack=_default_layer_stack(scope, configurables),
          input_vocab_size=input_size, output_vocab_size=output_size,
          autoregressive=output_size is not None, name=name, layout=layout,
          mesh_shape=mesh_shape)
  return bitransformer_cls(sides["encoder"], sides["decoder"])

# Distillation: a student and a teacher (StudentTeacher, transformer_extras.py).


def make_bi_student_teacher(input_vocab_size: Optional[int] = None,
                            output_vocab_size: Optional[int] = None, layout=None,
                            mesh_shape=None) -> StudentTeacher:
  """A StudentTeacher of two Bitransformers built by `make_bitransformer` in
  the gin scopes "student" and "teacher", so a config binds e.g.

      student/encoder/transformer.make_layer_stack.layers = [...]
      teacher/decoder/transformer.make_layer_stack.layers = [...]

  Args:
    input_vocab_size: the encoders' vocabulary size.
    output_vocab_size: the decoders' vocabulary size.
    layout: layout rules, passed to the models.
    mesh_shape: the mesh shape, passed to the models.

  Example:
    >>> model = make_bi_student_teacher(input_vocab_size=512, output_vocab_size=512)
  """
  import gin  # pylint: disable=g-import-not-at-top
  configurables = gin_configurables()
  make = configurables.get("make_bitransformer", make_bitransformer)
  models = {}
  for scope in ("student", "teacher"):
    with gin.config_scope(scope):
      models[scope] = make(input_vocab_size=input_vocab_size,
                           output_vocab_size=output_vocab_size, layout=layout,
                           mesh_shape=mesh_shape)
  cls = configurables.get("StudentTeacher", StudentTeacher)
  return cls(student=models["student"], teacher=models["teacher"])
