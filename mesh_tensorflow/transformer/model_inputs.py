"""What a Transformer reads besides its weights: argument checks, position
embeddings, and the shifted targets and masks of language-model training.

`Unitransformer` and the layer families use these; `transformer.py`
re-exports the public ones (`transformer.shift_targets`,
`transformer.sinusoid_positional_embedding_weights`, ...), where the
original had them.

    >>> inputs = autoregressive_inputs(targets)          # [0, t0, t1, ...]
    >>> mask = delimited_lm_inputs_mask(ids)             # True on the inputs part
    >>> positive_int(8, "SelfAttention: num_heads")
    8
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer.layer_context import inputs_prefix_mask

_NEG_INF = -1e9


def positive_int(value, what: str, hint: str = "", integer_types=(int,)) -> int:
  """value, if it is a positive integer (of `integer_types`, never a bool);
  else a ValueError "<what> must be a positive integer, got <value><hint>".

  Example:
    >>> positive_int(64, "FactorizedVocabEmbedding: inner_dimension_size")
    64
  """
  if isinstance(value, bool) or not isinstance(value, integer_types) or value < 1:
    raise ValueError(f"{what} must be a positive integer, got {value!r}{hint}.")
  return value


def refuse_unsupported(owner: str, options) -> None:
  """A ValueError for the first of `options` (name -> (value, default)) set
  to something else than its default: options this library
  accepts so that ported code and gin files parse, but does not provide.

  Example:
    >>> refuse_unsupported("MoE1D", {"output_dim": (None, None)})   # fine
  """
  for option, (value, default) in options.items():
    if value != default:
      raise ValueError(f"{owner}: {option}={value!r} is not supported (one of the "
                       f"original's experimental options); leave it at {default!r}.")


def _round_up(n: int, divisor: int) -> int:
  return n if not divisor else -(-n // divisor) * divisor


def _positional_embedding_kind(value) -> Optional[str]:
  if value is True or value == "learned":
    return "learned"
  if value is False or value is None or value == "none":
    return None
  if value == "sinusoidal":
    return "sinusoidal"
  raise ValueError(f"positional_embedding must be 'learned', 'sinusoidal', 'none' or a "
                   f"boolean, got {value!r}.")


def sinusoidal_position_embedding(position: mtf.Tensor, model_dim: mtf.Dimension,
                                  dtype=tf.float32, max_timescale: float = 1.0e4) -> mtf.Tensor:
  """The fixed sine/cosine position signal of "Attention is all you need".

  Channel 2i is sin(p / max_timescale^(2i/d)) and channel 2i+1 the matching
  cosine; computed from the (integer) positions, so it works for any shape
  of `position`, including the single position of a decoding step.

  Example:
    >>> emb = sinusoidal_position_embedding(mtf.range(mesh, length), d_model)
  """
  d = model_dim.size
  channel = np.arange(d)
  inv_freq = np.power(max_timescale, -(2.0 * (channel // 2)) / d).astype(np.float32)
  phase = np.where(channel % 2 == 0, 0.0, math.pi / 2.0).astype(np.float32)
  freq = mtf.constant(position.mesh, inv_freq, mtf.Shape([model_dim]), dtype=tf.float32)
  shift = mtf.constant(position.mesh, phase, mtf.Shape([model_dim]), dtype=tf.float32)
  return mtf.cast(mtf.sin(mtf.cast(position, tf.float32) * freq + shift), dtype)


def sinusoid_positional_embedding_weights(mesh: mtf.Mesh, max_length_dim: mtf.Dimension,
                                          model_dim: mtf.Dimension, dtype,
                                          min_timescale: float = 1.0,
                                          max_timescale: float = 1.0e4) -> mtf.Tensor:
  """A table of sinusoids [max_length_dim, model_dim] (as in
  tensor2tensor's timing signal).

  With n = model_dim.size // 2 and timescale k = min_timescale *
  (max_timescale / min_timescale)^(k / max(n - 1, 1)), channel k < n of row
  p is sin(p / timescale k) and channel n + k is cos(p / timescale k): sines
  in the first half, cosines in the second (unlike
  `sinusoidal_position_embedding`, which interleaves them). Computed in
  float32 from constants over model_dim only, so any layout may split
  either dimension.

  Args:
    mesh: the mtf.Mesh.
    max_length_dim: the position dimension (rows 0 .. size - 1).
    model_dim: the channel dimension; its size must be even.
    dtype: the tf.DType of the result.
    min_timescale: the shortest timescale (channel 0).
    max_timescale: the longest timescale (channel n - 1).

  Returns:
    dtype [max_length_dim, model_dim].

  Example:
    >>> table = sinusoid_positional_embedding_weights(
    ...     mesh, mtf.Dimension("max_length", 512), mtf.Dimension("d_model", 64), tf.float32)
  """
  fn = "sinusoid_positional_embedding_weights"
  if not isinstance(mesh, mtf.Mesh):
    raise TypeError(f"{fn}: mesh must be an mtf.Mesh, got {type(mesh).__name__}.")
  for what, dim in (("max_length_dim", max_length_dim), ("model_dim", model_dim)):
    if not isinstance(dim, mtf.Dimension):
      raise TypeError(f"{fn}: {what} must be an mtf.Dimension, got {type(dim).__name__}.")
  if model_dim.size % 2:
    raise ValueError(f"{fn}: model_dim {model_dim} must have an even size (half sines, half "
                     "cosines).")
  if not 0 < min_timescale <= max_timescale:
    raise ValueError(f"{fn}: need 0 < min_timescale <= max_timescale, got {min_timescale} "
                     f"and {max_timescale}.")
  half = model_dim.size // 2
  step = math.log(float(max_timescale) / float(min_timescale)) / max(half - 1, 1)
  inv_timescale = min_timescale * np.exp(-step * np.arange(half, dtype=np.float32))
  freq = mtf.constant(mesh, np.tile(inv_timescale, 2).astype(np.float32),
                      mtf.Shape([model_dim]), dtype=tf.float32)
  is_sin = mtf.constant(mesh, np.arange(model_dim.size) < half, mtf.Shape([model_dim]),
                        dtype=tf.bool)
  angle = mtf.range(mesh, max_length_dim, tf.float32) * freq
  table = mtf.where(is_sin, mtf.sin(angle), mtf.cos(angle),
                    output_shape=mtf.Shape([max_length_dim, model_dim]))
  return mtf.cast(table, tf.as_dtype(dtype))


text2self_inputs_mask = inputs_prefix_mask


def _check_ids(fn: str, ids, what: str = "targets") -> mtf.Dimension:
  """The length (last) dimension of the integer mtf.Tensor `ids`; else a
  TypeError naming `fn` and `what`."""
  if not isinstance(ids, mtf.Tensor):
    raise TypeError(f"{fn}: {what} must be an mtf.Tensor [..., length], got "
                    f"{type(ids).__name__}.")
  if not ids.dtype.is_integer:
    raise TypeError(f"{fn}: {what} must hold integer token ids, got dtype {ids.dtype.name}; "
                    "cast it with mtf.to_int32.")
  if not ids.shape.dims:
    raise ValueError(f"{fn}: {what} must have a length dimension, got a scalar.")
  return ids.shape.dims[-1]


def shift_targets(targets: mtf.Tensor, bos_id: int = 0, eos_id: int = 1) -> mtf.Tensor:
  """Decoder inputs from decoder targets (kept for ported code; new code
  uses `autoregressive_inputs`).

  The targets move one position to the right along the length (last)
  dimension. A shifted-in eos_id becomes 0, so each packed sequence (which
  follows an EOS) starts afresh; then, if bos_id is nonzero, every 0 of the
  result whose target is not padding becomes bos_id (the first position and
  the position after each EOS).

  Args:
    targets: int [..., length] target ids (0 is padding).
    bos_id: the id the decoder reads first.
    eos_id: the end-of-sequence id.

  Returns:
    int [..., length] decoder inputs, targets' shape and dtype.

  Example:
    >>> # targets [5, 6, 1, 7, 1, 0], bos_id=2 -> [2, 5, 6, 2, 7, 0]
    >>> inputs = shift_targets(targets, bos_id=2)
  """
  length_dim = _check_ids("shift_targets", targets)
  shifted = mtf.shift(targets, offset=1, dim=length_dim, wrap=False)
  shifted = shifted * mtf.cast(mtf.not_equal(shifted, eos_id), targets.dtype)
  if bos_id:
    starts = mtf.logical_and(mtf.equal(shifted, 0), mtf.not_equal(targets, 0))
    shifted = shifted + mtf.cast(starts, targets.dtype) * bos_id
  return shifted


def autoregressive_inputs(targets: mtf.Tensor,
                          sequence_id: Optional[mtf.Tensor] = None) -> mtf.Tensor:
  """The inputs of an autoregressive model: targets shifted right by one
  along the length (last) dimension, 0 first.

  Negative target ids (the original's mark of tokens without loss) are read
  as their absolute values. With `sequence_id` (packed examples: a segment
  id per position), the first position of every segment also reads 0
  instead of the previous segment's last token.

  Args:
    targets: int [..., length] target ids.
    sequence_id: optional int segment ids over targets' dimensions.

  Returns:
    int [..., length] inputs, targets' shape and dtype.

  Example:
    >>> # targets [5, 6, 1, 7, 1], sequence_id [1, 1, 1, 2, 2] -> [0, 5, 6, 0, 7]
    >>> inputs = autoregressive_inputs(targets, sequence_id)
  """
  length_dim = _check_ids("autoregressive_inputs", targets)
  if sequence_id is not None:
    _check_ids("autoregressive_inputs", sequence_id, "sequence_id")
    if length_dim not in sequence_id.shape.dims or not set(sequence_id.shape.dims) <= set(
        targets.shape.dims):
      raise ValueError(f"autoregressive_inputs: sequence_id {sequence_id.shape} must have "
                       f"targets' length dimension and no dimension targets {targets.shape} "
                       "lacks.")
  return shift_right_within_segments(mtf.abs(targets), sequence_id)


def shift_right_within_segments(ids: mtf.Tensor,
                                sequence_id: Optional[mtf.Tensor] = None) -> mtf.Tensor:
  """ids shifted right by one along their last (length) dimension, 0 first
  and 0 at the first position of every segment of `sequence_id` (packed
  examples): a decoder's inputs, unchecked (see autoregressive_inputs).

  Example:
    >>> # ids [5, 6, 1, 7, 1], sequence_id [1, 1, 1, 2, 2] -> [0, 5, 6, 0, 7]
    >>> inputs = shift_right_within_segments(ids, sequence_id)
  """
  length_dim = ids.shape.dims[-1]
  shifted = mtf.shift(ids, offset=1, dim=length_dim, wrap=False)
  if sequence_id is None:
    return shifted
  same = mtf.equal(sequence_id, mtf.shift(sequence_id, offset=1, dim=length_dim, wrap=False))
  return shifted * mtf.cast(same, shifted.dtype)


def delimited_lm_inputs_mask(ids: mtf.Tensor, eos_id: int = 1) -> mtf.Tensor:
  """Which positions of packed "inputs EOS targets EOS inputs EOS ..." language
  model examples belong to an inputs part.

  A position is an input when an even number of eos_id come before it along
  the length (last) dimension, so each example's inputs run up to and
  including their EOS and its targets up to and including theirs; padding
  after a complete example counts as input. (`inputs_prefix_mask` marks the
  first example's inputs only.)

  Args:
    ids: int [..., length] token ids.
    eos_id: the end-of-sequence id.

  Returns:
    bool [..., length], ids' shape.

  Example:
    >>> # ids [3, 1, 4, 1, 5, 1, 6, 1] -> [T, T, F, F, T, T, F, F]
    >>> mask = delimited_lm_inputs_mask(ids)
  """
  length_dim = _check_ids("delimited_lm_inputs_mask", ids, "ids")
  eos_before = mtf.cumsum(mtf.to_int32(mtf.equal(ids, eos_id)), length_dim, exclusive=True)
  return mtf.equal(mtf.mod(eos_before, 2), 0)


def _one_position(ids: mtf.Tensor, position: mtf.Tensor, length_dim: mtf.Dimension) -> mtf.Tensor:
  """ids[..., position] (0 where position is outside [0, length))."""
  pick = mtf.one_hot(position, length_dim, dtype=ids.dtype)
  return mtf.reduce_sum(ids * pick, reduced_dim=length_dim)
