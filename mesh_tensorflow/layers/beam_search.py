"""Autoregressive decoding over mtf tensors: beam search and greedy decoding
(or sampling), each one `mtf.while_loop` over positions.

Both take a `logits_fn(step, ids, states) -> (logits, new_states)` that
computes the logits for position `step` given the ids decoded so far (ids at
positions >= step are 0) and the decoding states (e.g. caches of keys and
values); logits have ids' dimensions without the length, plus a vocabulary
dimension last.

    >>> ids = mtf.beam_search.greedy_decode(logits_fn, mtf.zeros(mesh, "batch:8;length:32",
    ...                                                          dtype=tf.int32))
    >>> beams, scores = mtf.beam_search.beam_search(
    ...     logits_fn, mtf.zeros(mesh, "batch:8;beam:4;length:32", dtype=tf.int32), alpha=0.6)

Beam search is the one of Mesh TensorFlow 0.1.x and T5 (after Wu et al.
2016, https://arxiv.org/abs/1609.08144), with the same results. Per batch
element it keeps `beam` alive hypotheses (none ends with `eos_id`) and
`beam` finished ones. Step i extends every alive hypothesis by every token,
scores each extension log P / ((5 + i + 1) / 6)^alpha and takes the best
2 * beam (ties: the lower beam, then the lower id). Of those, the best
`beam` that do not end with `eos_id` are the new alive ones; the ones that
do compete with the finished ones for the `beam` finished places. Decoding
stops after `decode_length` steps or, with stop_early, once in every batch
element the lowest finished score beats the best alive hypothesis's log P
divided by the largest length penalty, ((5 + decode_length) / 6)^alpha.
The result is the finished hypotheses with their scores, or, for a batch
element where none finished, the alive ones with their log probabilities.

Given `layout` and `mesh_shape` (and use_tpu), the candidates are
prefiltered: the vocabulary is cut into as many parts as
the layout splits it on the mesh, each beam keeps its `num_prefilter` best
tokens per part, and the best 2 * beam come from those. A model's
`beam_search` passes its layout and mesh shape.
"""

from __future__ import annotations

from typing import Callable, List, Optional, Sequence, Tuple, Union

import tensorflow as tf

from mesh_tensorflow.core.graph import Tensor
from mesh_tensorflow.operations import constant_ops as const_ops
from mesh_tensorflow.operations import control
from mesh_tensorflow.operations import elementwise as ew
from mesh_tensorflow.operations.einsum_ops import einsum
from mesh_tensorflow.operations.indexing import one_hot, sample_with_temperature, top_k
from mesh_tensorflow.operations.reduction import (reduce_all, reduce_any, reduce_logsumexp, reduce_min,
                                           reduce_sum)
from mesh_tensorflow.operations.utilities import tensor_dim_to_mesh_dim_size
from mesh_tensorflow.operations.shape_ops import broadcast, rename_dimension, reshape, transpose
from mesh_tensorflow.operations.slicing import concat
from mesh_tensorflow.core.shapes import Dimension, Shape

EOS_ID = 1
INF = 1e7

LogitsFn = Callable[[Tensor, Tensor, List[Tensor]], Tuple[Tensor, List[Tensor]]]
IntLike = Union[int, Tensor, None]


def select(x: Tensor, selector: Tensor, old_dim: Dimension, new_dim: Dimension) -> Tensor:
  """Rows of x along old_dim chosen by a one-hot selector [..., new_dim, old_dim].

  Written as an einsum, so it is exact (one term per output) and works with
  any layout; dimensions that selector has and x lacks (batch) are kept.

  Example:
    >>> picked = select(seqs, mtf.one_hot(idx, beam, dtype=tf.int32), beam, new_beam)
  """
  sel = ew.cast(selector, x.dtype) if selector.dtype != x.dtype else selector
  dims = [new_dim if d == old_dim else d for d in x.shape.dims]
  dims += [d for d in sel.shape.dims if d not in dims and d != old_dim]
  return einsum([x, sel], output_shape=Shape(dims))


def compute_topk_scores_and_seq(sequences: Tensor, scores: Tensor, scores_to_gather: Tensor,
                                flags: Tensor, beam_dim: Dimension, prefix: str = "default"
                                ) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
  """The `beam_dim.size` best entries of the old beam dimension (the second
  of `sequences` [batch, old_beam, length]) by `scores` [batch, old_beam]: the
  chosen sequences, their `scores_to_gather` and `flags`, each with beam_dim
  in place of the old beam dimension, and the one-hot float32 selector
  [batch, beam_dim, old_beam]. Ties go to the lower index.

  Example:
    >>> seq, picked_scores, done, selector = compute_topk_scores_and_seq(
    ...     seqs, scores, log_probs, finished, mtf.Dimension("beam", 4))
  """
  if sequences.shape.ndims != 3:
    raise ValueError(f"compute_topk_scores_and_seq: sequences {sequences.name} must be "
                     f"[batch, beam, length], got {sequences.shape}.")
  old_beam_dim = sequences.shape.dims[1]
  for t in (scores, scores_to_gather, flags):
    if old_beam_dim not in t.shape.dims:
      raise ValueError(f"compute_topk_scores_and_seq: {t.name} {t.shape} lacks the beam "
                       f"dimension {old_beam_dim} of sequences.")
  if beam_dim.size > old_beam_dim.size:
    raise ValueError(f"compute_topk_scores_and_seq: beam_dim {beam_dim} is larger than "
                     f"the {old_beam_dim} to choose from.")
  with tf.name_scope(prefix):
    _, topk_indices = top_k(scores, old_beam_dim, k_dim=beam_dim)
    selector = one_hot(topk_indices, old_beam_dim, dtype=tf.float32)
    topk_seq = select(sequences, selector, old_beam_dim, beam_dim)
    topk_scores = select(scores_to_gather, selector, old_beam_dim, beam_dim)
    if flags.dtype == tf.bool:
      topk_flags = ew.cast(select(ew.cast(flags, tf.int32), selector, old_beam_dim,
                                  beam_dim), tf.bool)
    else:
      topk_flags = select(flags, selector, old_beam_dim, beam_dim)
  return topk_seq, topk_scores, topk_flags, selector


def _as_scalar(mesh, value: IntLike, default: int) -> Tensor:
  if value is None:
    return const_ops.constant(mesh, default, dtype=tf.int32)
  if isinstance(value, Tensor):
    return ew.minimum(ew.cast(value, tf.int32), default)
  return const_ops.constant(mesh, min(int(value), default), dtype=tf.int32)


def keep_top_k(logits: Tensor, vocab_dim: Dimension, k: int) -> Tensor:
  """logits with all but the k largest (along vocab_dim) set to -INF.

  Example:
    >>> logits = keep_top_k(logits, vocab, 40)
  """
  values, _ = top_k(logits, vocab_dim, k=k)
  kth = reduce_min(values, reduced_dim=values.shape.dims[logits.shape.index_of(vocab_dim.name)])
  return ew.where(ew.less(logits, kth), -INF, logits)


def greedy_decode(logits_fn: LogitsFn, initial_ids: Tensor, temperature: float = 0.0,
                  initial_states: Optional[Sequence[Tensor]] = None, eos_id: Optional[int] = EOS_ID,
                  forced_ids: Optional[Tensor] = None, use_tpu: bool = True,
                  max_steps: IntLike = None, top_k: Optional[int] = None,
                  initial_position: Optional[Tensor] = None) -> Tensor:
  """Decodes one token per step: argmax (temperature 0) or samples.

  Each sequence continues after its leading nonzero ids (or from
  initial_position) until it produces eos_id, has max_steps new tokens, or
  reaches the end of the length dimension; positions after its end stay 0.
  logits_fn receives the positions being decoded ([batch...] int32).

  Args:
    logits_fn: logits_fn(step, ids, states) -> (logits [batch..., vocab],
      new_states).
    initial_ids: int32 [batch..., length]: prefixes followed by zeros.
    temperature: 0.0 for argmax, else softmax(logits / temperature) samples.
    initial_states: decoding states (loop variables of fixed shapes).
    eos_id: the end-of-sequence id, or None.
    forced_ids: optional int32 [batch..., length]; nonzero entries are
      emitted instead of the decoded token at their position.
    use_tpu: accepted for compatibility.
    max_steps: int or int32 mtf scalar: at most this many new tokens.
    top_k: sample among the k most likely tokens only.
    initial_position: int32 [batch...] start positions (default: the number
      of nonzero ids).

  Returns:
    int32 [batch..., length].

  Example:
    >>> ids = greedy_decode(logits_fn, mtf.zeros(mesh, "batch:2;length:8", dtype=tf.int32))
  """
  del use_tpu
  mesh = initial_ids.mesh
  length_dim = initial_ids.shape.dims[-1]
  if initial_position is None:
    initial_position = reduce_sum(ew.to_int32(ew.not_equal(initial_ids, 0)),
                                  reduced_dim=length_dim)
  end = _as_scalar(mesh, None, length_dim.size)
  if max_steps is not None:
    end = ew.minimum(initial_position + _as_scalar(mesh, max_steps, length_dim.size),
                     length_dim.size)
  eos_before = None
  if eos_id is not None:
    eos_before = reduce_sum(ew.to_int32(ew.equal(initial_ids, eos_id)), reduced_dim=length_dim)

  def finished(position, ids):
    done = ew.greater_equal(position, end)
    if eos_id is not None:
      eos_now = reduce_sum(ew.to_int32(ew.equal(ids, eos_id)), reduced_dim=length_dim)
      done = ew.logical_or(done, ew.greater(eos_now, eos_before))
    return done

  def cond_fn(position, ids, *states):
    return ew.logical_not(reduce_all(finished(position, ids)))

  def body_fn(position, ids, *states):
    done = finished(position, ids)
    logits, new_states = logits_fn(position, ids, list(states))
    vocab_dim = logits.shape.dims[-1]
    if top_k:
      logits = keep_top_k(logits, vocab_dim, top_k)
    token = sample_with_temperature(logits, vocab_dim, temperature)
    if forced_ids is not None:
      forced = reduce_sum(forced_ids * one_hot(position, length_dim, dtype=tf.int32),
                          reduced_dim=length_dim)
      token = ew.where(ew.not_equal(forced, 0), forced, token)
    token = ew.where(done, 0, token)
    ids = ids + token * one_hot(position, length_dim, dtype=tf.int32)
    return [position + 1, ids] + list(new_states)

  states = list(initial_states or [])
  outputs = control.while_loop(cond_fn, body_fn, [initial_position, initial_ids] + states)
  return outputs[1]


def _beam_dim_entry(x: Tensor, beam_dim: Dimension, index: int) -> Tensor:
  """x's entries at position `index` of beam_dim (exactly: one-hot einsum)."""
  pick = one_hot(const_ops.constant(x.mesh, index, dtype=tf.int32), beam_dim, dtype=x.dtype)
  return einsum([x, pick], output_shape=x.shape - [beam_dim])


def _top_candidates(scores: Tensor, batch_dims, beam_dim: Dimension, vocab_dim: Dimension,
                    double: Dimension, split: int, num_prefilter: Optional[int]):
  """The best double.size (beam, token) pairs of scores [batch..., beam,
  vocab]: (their scores, beam index, token id), each [batch..., double].

  split > 1: the prefilter: the vocabulary cut into `split`
  parts, num_prefilter (or double.size) best tokens per beam and part first.
  """
  k = beam_dim.size
  vocab = vocab_dim.size
  if split <= 1 or vocab % split:
    flat_dim = Dimension("beam_and_vocab", k * vocab)
    flat = reshape(scores, Shape(batch_dims + [flat_dim]))
    top_scores, top_index = top_k(flat, flat_dim, k_dim=double)
    return top_scores, ew.floordiv(top_index, vocab), ew.mod(top_index, vocab)
  part_dim = Dimension(vocab_dim.name, split)
  within_dim = Dimension("minor_vocab", vocab // split)
  keep_dim = Dimension("prefilter", num_prefilter or double.size)
  parts = reshape(scores, Shape(batch_dims + [beam_dim, part_dim, within_dim]))
  part_scores, part_tokens = top_k(parts, within_dim, k_dim=keep_dim)
  pooled_dim = Dimension("combined", k * split * keep_dim.size)
  pooled_scores = reshape(part_scores, Shape(batch_dims + [pooled_dim]))
  pooled_tokens = reshape(part_tokens, Shape(batch_dims + [pooled_dim]))
  top_scores, top_index = top_k(pooled_scores, pooled_dim, k_dim=double)
  within = reduce_sum(pooled_tokens * one_hot(top_index, pooled_dim, dtype=tf.int32),
                      reduced_dim=pooled_dim)
  per_beam = split * keep_dim.size
  beam_index = ew.floordiv(top_index, per_beam)
  part = ew.floordiv(ew.mod(top_index, per_beam), keep_dim.size)
  return top_scores, beam_index, part * within_dim.size + within


def beam_search(logits_fn: LogitsFn, initial_ids: Tensor, alpha: float,
                states: Optional[Sequence[Tensor]] = None, eos_id: int = EOS_ID,
                stop_early: bool = True, decode_length: IntLike = None, use_tpu: bool = True,
                dtype=tf.float32, layout=None, mesh_shape=None,
                num_prefilter: Optional[int] = 2) -> Tuple[Tensor, Tensor]:
  """Beam search with a length penalty, as Mesh TensorFlow 0.1.x and T5
  decode (see the module docstring).

  Args:
    logits_fn: logits_fn(step, ids, states) -> (logits, new_states); step is
      an int32 scalar (the position decoded), ids [batch..., beam, length],
      logits [batch..., beam, vocab]; states have the beam dimension and are
      reordered with the hypotheses.
    initial_ids: int32 zeros [batch..., beam, length]; decoding starts at 0.
    alpha: length penalty exponent (0: no length penalty).
    states: decoding states [batch..., beam, ...].
    eos_id: the end-of-sequence id.
    stop_early: stop once no alive hypothesis can beat the finished ones
      (else run decode_length steps).
    decode_length: int or int32 mtf scalar: at most this many tokens (capped
      by the length dimension).
    use_tpu: with layout and mesh_shape: prefilter the candidates.
    dtype: dtype of the scores.
    layout: the layout rules, for the prefilter (None: no prefilter).
    mesh_shape: the mesh shape, for the prefilter.
    num_prefilter: tokens kept per beam and vocabulary part by the prefilter
      (None or 0: 2 * beam).

  Returns:
    (ids [batch..., beam, length], scores [batch..., beam]), best first: the
    finished hypotheses and their length-penalized log probabilities, or
    where none finished, the alive ones and their log probabilities.

  Example:
    >>> beams, scores = beam_search(logits_fn, zeros_bbl, alpha=0.6)
    >>> best = best_beam(beams)
  """
  mesh = initial_ids.mesh
  if initial_ids.shape.ndims < 3:
    raise ValueError(f"beam_search: initial_ids {initial_ids.name} must be [batch..., beam, "
                     f"length], got {initial_ids.shape}.")
  batch_dims = initial_ids.shape.dims[:-2]
  beam_dim, length_dim = initial_ids.shape.dims[-2:]
  k = beam_dim.size
  batch_beam = Shape(batch_dims + [beam_dim])
  double = Dimension("double_beam", 2 * k)
  old_beam = Dimension("old_beam", k)
  triple = Dimension("triple_beam", 3 * k)
  limit = _as_scalar(mesh, decode_length, length_dim.size)
  prefilter = use_tpu and layout is not None and mesh_shape is not None

  alive_lp = const_ops.constant(mesh, [0.0] + [-INF] * (k - 1), Shape([beam_dim]), dtype=dtype)
  alive_lp = broadcast(alive_lp, batch_beam)
  finished_scores = const_ops.constant(mesh, -INF, batch_beam, dtype=dtype)
  finished_flags = const_ops.constant(mesh, False, batch_beam, dtype=tf.bool)
  step0 = const_ops.constant(mesh, 0, dtype=tf.int32)

  def penalty(length: Tensor) -> Tensor:
    return ew.pow((ew.cast(length, dtype) + 5.0) / 6.0, float(alpha))

  def cond_fn(step, alive_seq, alive_lp, fin_seq, fin_scores, fin_flags, *states):
    more = ew.less(step, limit)
    if not stop_early:
      return more
    best_alive = _beam_dim_entry(alive_lp, beam_dim, 0) / penalty(limit)
    lowest_finished = reduce_min(fin_scores * ew.cast(fin_flags, dtype), reduced_dim=beam_dim)
    none_finished = 1.0 - ew.cast(reduce_any(fin_flags, reduced_dim=beam_dim), dtype)
    lowest_finished = lowest_finished + none_finished * -INF
    settled = reduce_all(ew.greater(lowest_finished, best_alive))
    return ew.logical_and(more, ew.logical_not(settled))

  def body_fn(step, alive_seq, alive_lp, fin_seq, fin_scores, fin_flags, *states):
    logits, new_states = logits_fn(step, alive_seq, list(states))
    vocab_dim = logits.shape.dims[-1]
    logits = transpose(ew.cast(logits, dtype), Shape(batch_dims + [beam_dim, vocab_dim]))
    # The two per-hypothesis terms are summed first, so that the beams match
    # the original's (whose optimized graph sums them in this order). The order
    # matters for the empty beams (log P -1e7), where float32 steps are 1.0 and it
    # decides which of them fill alive places at the first step.
    log_probs = logits + (alive_lp - reduce_logsumexp(logits, vocab_dim))
    step_penalty = penalty(step + 1)
    split = (tensor_dim_to_mesh_dim_size(layout, mesh_shape, vocab_dim) if prefilter else 1)
    top_scores, top_beam, top_token = _top_candidates(
        log_probs / step_penalty, batch_dims, beam_dim, vocab_dim, double, split,
        num_prefilter)
    top_lp = top_scores * step_penalty
    from_beam = one_hot(top_beam, old_beam, dtype=tf.int32)  # [batch, double, old_beam]
    top_seq = select(rename_dimension(alive_seq, beam_dim.name, old_beam.name), from_beam,
                     old_beam, double)
    top_seq = top_seq + top_token * one_hot(step, length_dim, dtype=tf.int32)
    top_ended = ew.equal(top_token, eos_id)
    ended = ew.cast(top_ended, dtype)
    # Alive: the best k extensions that do not end with eos_id.
    _, alive_index = top_k(top_scores + ended * -INF, double, k_dim=beam_dim)
    to_alive = one_hot(alive_index, double, dtype=tf.int32)  # [batch, beam, double]
    alive_seq = select(top_seq, to_alive, double, beam_dim)
    alive_lp = select(top_lp, to_alive, double, beam_dim)
    # Finished: the best k of the finished ones and the extensions that end
    # with eos_id (the others pushed below every real score).
    def pool(finished: Tensor, candidates: Tensor) -> Tensor:
      return concat([rename_dimension(finished, beam_dim.name, triple.name),
                     rename_dimension(candidates, double.name, triple.name)], triple.name)
    fin_scores, fin_index = top_k(pool(fin_scores, top_scores + (1.0 - ended) * -INF),
                                  triple, k_dim=beam_dim)
    to_finished = one_hot(fin_index, triple, dtype=tf.int32)
    fin_seq = select(pool(fin_seq, top_seq), to_finished, triple, beam_dim)
    fin_flags = ew.cast(select(pool(ew.cast(fin_flags, tf.int32), ew.cast(top_ended, tf.int32)),
                               to_finished, triple, beam_dim), tf.bool)
    source = einsum([ew.cast(to_alive, dtype), ew.cast(from_beam, dtype)],
                    output_shape=Shape(batch_dims + [beam_dim, old_beam]))
    reordered = [select(rename_dimension(s, beam_dim.name, old_beam.name), source, old_beam,
                        beam_dim) for s in new_states]
    return [step + 1, alive_seq, alive_lp, fin_seq, fin_scores, fin_flags] + reordered

  loop_vars = [step0, initial_ids, alive_lp, initial_ids, finished_scores, finished_flags]
  out = control.while_loop(cond_fn, body_fn, loop_vars + list(states or []))
  _, alive_seq, alive_lp, fin_seq, fin_scores, fin_flags = out[:6]
  any_finished = reduce_any(fin_flags, reduced_dim=beam_dim)
  ids = ew.where(any_finished, fin_seq, alive_seq)
  scores = ew.where(any_finished, fin_scores, alive_lp)
  return ids, scores


def best_beam(beams: Tensor, beam_dim_name: str = "beam") -> Tensor:
  """The first (best) hypothesis: [batch..., beam, length] -> [batch..., length].

  Example:
    >>> best = best_beam(beams)
  """
  beam_dim = beams.shape.get_dim_by_name(beam_dim_name)
  first = one_hot(const_ops.constant(beams.mesh, 0, dtype=tf.int32), beam_dim, dtype=beams.dtype)
  return einsum([beams, first], output_shape=beams.shape - [beam_dim])

from mesh_tensorflow.core import autograph_exempt as _autograph_exempt  # noqa: E402  pylint: disable=g-import-not-at-top
_autograph_exempt.exempt(globals())  # AutoGraph leaves this module's code alone
