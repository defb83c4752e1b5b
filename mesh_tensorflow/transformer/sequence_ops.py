"""Operations on token-id sequences: end decodes at EOS, and turn
input/target pairs into language-model sequences.

    >>> clean_decodes([[5, 1, 7, 7]]).numpy().tolist()
    [[5, 1, 0, 0]]
"""

from __future__ import annotations

from typing import Dict, Mapping

import tensorflow as tf

import mesh_tensorflow as mtf


def clean_decodes(ids, eos_id: int = 1, pad_id: int = 0, length_axis: int = -1) -> tf.Tensor:
  """Replaces every id after the first `eos_id` (kept) with `pad_id`.

  Example:
    >>> clean_decodes([[5, 1, 7, 7]]).numpy().tolist()
    [[5, 1, 0, 0]]
  """
  ids = tf.convert_to_tensor(ids)
  is_eos = tf.cast(tf.equal(ids, tf.cast(eos_id, ids.dtype)), tf.int32)
  after_eos = tf.cumsum(is_eos, axis=length_axis, exclusive=True) > 0
  return tf.where(after_eos, tf.cast(pad_id, ids.dtype), ids)




def concat_inputs_and_targets(mtf_features: Mapping[str, "mtf.Tensor"]) -> Dict[str, "mtf.Tensor"]:
  """Turns (packed) input/target pairs into language-model sequences.

  Each example's inputs are followed by its targets in one sequence twice as
  long, for training a decoder-only model on sequence-to-sequence data (the
  original's "delimited_lm"). Packed features ("inputs_segmentation",
  "inputs_position" and the same for "targets") keep their packing: example s
  becomes inputs_s then targets_s, examples in segment order, positions
  counting on from the inputs into the targets, padding (segment 0) at the
  end. Without segmentation, the nonzero ids are one example.

  Args:
    mtf_features: "inputs" and "targets", int tensors [..., length] (the same
      shape), with or without their "_segmentation" and "_position" features.

  Returns:
    {"targets", "targets_segmentation", "targets_position"} over the
    batch dimensions and a "length" dimension of twice the size (only
    "targets" when the input had no segmentation).

  Example:
    >>> out = concat_inputs_and_targets({"inputs": x, "targets": y})
    >>> out["targets"].shape   # [batch, length * 2]
  """
  inputs, targets = mtf_features["inputs"], mtf_features["targets"]
  if inputs.shape != targets.shape:
    raise ValueError(
        f"concat_inputs_and_targets: 'inputs' has shape {inputs.shape} and 'targets' "
        f"{targets.shape}; they need the same shape (pad to one length).")
  mesh, length = inputs.mesh, inputs.shape.dims[-1]
  packed = "inputs_segmentation" in mtf_features
  if packed:
    seg_in, seg_tg = mtf_features["inputs_segmentation"], mtf_features["targets_segmentation"]
    pos_in, pos_tg = mtf_features["inputs_position"], mtf_features["targets_position"]
  else:
    seg_in = mtf.cast(mtf.not_equal(inputs, 0), tf.int32)
    seg_tg = mtf.cast(mtf.not_equal(targets, 0), tf.int32)
    pos_in = pos_tg = mtf.broadcast(mtf.range(mesh, length, tf.int32), inputs.shape)
  # At most `length` examples per row; segment 0 is padding.
  segment = mtf.Dimension("segment", length.size + 1)
  real = mtf.cast(mtf.not_equal(mtf.range(mesh, segment, tf.int32), 0), tf.int32)

  def tokens_per_segment(seg):
    return real * mtf.reduce_sum(mtf.one_hot(seg, segment, dtype=tf.int32), reduced_dim=length)
  n_in, n_tg = tokens_per_segment(seg_in), tokens_per_segment(seg_tg)
  new_length = mtf.Dimension("new_length", 2 * length.size)
  # Where each segment starts in the new row; padding goes past its end.
  start = (mtf.cumsum(n_in + n_tg, segment, exclusive=True)
           + (1 - real) * new_length.size)

  def at_segment(values, seg):
    return mtf.gather(values, seg, segment)
  dest_in = at_segment(start, seg_in) + pos_in
  pos_tg_new = at_segment(n_in, seg_tg) + pos_tg
  dest_tg = at_segment(start, seg_tg) + pos_tg_new
  slots = mtf.range(mesh, new_length, tf.int32)
  to_in = mtf.cast(mtf.equal(dest_in, slots), tf.int32)
  to_tg = mtf.cast(mtf.equal(dest_tg, slots), tf.int32)
  out_shape = inputs.shape.dims[:-1] + [new_length]

  def scatter(from_inputs, from_targets):
    merged = (mtf.einsum([from_inputs, to_in], output_shape=out_shape)
              + mtf.einsum([from_targets, to_tg], output_shape=out_shape))
    return mtf.rename_dimension(merged, "new_length", length.name)
  out = {"targets": scatter(mtf.cast(inputs, tf.int32), mtf.cast(targets, tf.int32))}
  if packed:
    out["targets_segmentation"] = scatter(seg_in, seg_tg)
    out["targets_position"] = scatter(pos_in, pos_tg_new)
  return out
