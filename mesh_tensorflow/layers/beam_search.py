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

Beam search keeps, per batch element, `beam` alive hypotheses and `beam`
finished ones. At each step it extends the alive ones by every token and
ranks the extensions by log probability; those of the best `beam` that end
with `eos_id` are finished (scored log P / ((5 + n) / 6)^alpha with n their
length), and the best `beam` that do not end with `eos_id` stay alive. With
stop_early, decoding stops when every batch element has `beam` finished
hypotheses; at the end, alive hypotheses compete with the finished ones only
where fewer than `beam` finished. So with beam 1 the result is exactly the
greedy decode: the first time the most likely token is `eos_id` that
hypothesis is finished and the search stops.
"""

from __future__ import annotations

from typing import Callable, List, Optional, Sequence, Tuple, Union

import tensorflow as tf

from mesh_tensorflow.core.graph import Tensor
from mesh_tensorflow.ops import constant_ops as const_ops
from mesh_tensorflow.ops import control
from mesh_tensorflow.ops import elementwise as ew
from mesh_tensorflow.ops.einsum_ops import einsum
from mesh_tensorflow.ops.indexing import mtf_range, one_hot, sample_with_temperature, top_k
from mesh_tensorflow.ops.reduction import log_softmax, reduce_all, reduce_min, reduce_sum
from mesh_tensorflow.ops.shape_ops import broadcast, rename_dimension, reshape, transpose
from mesh_tensorflow.ops.slicing import concat
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


def _length_penalty(step_plus_one: Tensor, alpha: float, dtype) -> Tensor:
  n = ew.cast(step_plus_one, dtype)
  return ew.exp(ew.log((n + 5.0) / 6.0) * float(alpha))


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


def beam_search(logits_fn: LogitsFn, initial_ids: Tensor, alpha: float,
                states: Optional[Sequence[Tensor]] = None, eos_id: int = EOS_ID,
                stop_early: bool = True, decode_length: IntLike = None, use_tpu: bool = True,
                dtype=tf.float32, layout=None, mesh_shape=None,
                num_prefilter=None) -> Tuple[Tensor, Tensor]:
  """Beam search with a length penalty (see the module docstring).

  Args:
    logits_fn: logits_fn(step, ids, states) -> (logits, new_states); step is
      an int32 scalar (the position decoded), ids [batch..., beam, length],
      logits [batch..., beam, vocab]; states have the beam dimension and are
      reordered with the hypotheses.
    initial_ids: int32 zeros [batch..., beam, length]; decoding starts at 0.
    alpha: length penalty exponent (0: rank finished hypotheses by log P).
    states: decoding states [batch..., beam, ...].
    eos_id: the end-of-sequence id.
    stop_early: stop once every batch element has `beam` finished hypotheses.
    decode_length: int or int32 mtf scalar: at most this many tokens.
    use_tpu: accepted for compatibility.
    dtype: dtype of the scores.
    layout: accepted for compatibility.
    mesh_shape: accepted for compatibility.
    num_prefilter: accepted for compatibility.

  Returns:
    (ids [batch..., beam, length], scores [batch..., beam]), best first; the
    scores are length-penalized log probabilities.

  Example:
    >>> beams, scores = beam_search(logits_fn, zeros_bbl, alpha=0.6)
    >>> best = best_beam(beams)
  """
  del use_tpu, layout, mesh_shape, num_prefilter
  mesh = initial_ids.mesh
  batch_dims = initial_ids.shape.dims[:-2]
  beam_dim, length_dim = initial_ids.shape.dims[-2:]
  k = beam_dim.size
  batch_beam = Shape(batch_dims + [beam_dim])
  double = Dimension("double_beam", 2 * k)
  old_beam = Dimension("old_beam", k)
  pool_dim = Dimension("triple_beam", 3 * k)
  limit = _as_scalar(mesh, decode_length, length_dim.size)
  neg_inf = const_ops.constant(mesh, -INF, dtype=dtype)

  alive_lp = const_ops.constant(mesh, [0.0] + [-INF] * (k - 1), Shape([beam_dim]), dtype=dtype)
  alive_lp = broadcast(alive_lp, batch_beam)
  finished_scores = const_ops.constant(mesh, -INF, batch_beam, dtype=dtype)
  finished_count = const_ops.zeros(mesh, Shape(batch_dims), dtype=tf.int32)
  step0 = const_ops.constant(mesh, 0, dtype=tf.int32)

  def cond_fn(step, alive_seq, alive_lp, fin_seq, fin_scores, fin_count, *states):
    more = ew.less(step, limit)
    if stop_early:
      more = ew.logical_and(more, ew.logical_not(reduce_all(ew.greater_equal(fin_count, k))))
    return more

  def body_fn(step, alive_seq, alive_lp, fin_seq, fin_scores, fin_count, *states):
    logits, new_states = logits_fn(step, alive_seq, list(states))
    vocab_dim = logits.shape.dims[-1]
    logits = transpose(ew.cast(logits, dtype), Shape(batch_dims + [beam_dim, vocab_dim]))
    log_probs = log_softmax(logits, vocab_dim) + alive_lp
    beam_vocab = Dimension("beam_and_vocab", k * vocab_dim.size)
    flat = reshape(log_probs, Shape(batch_dims + [beam_vocab]))
    cand_lp, cand_index = top_k(flat, beam_vocab, k_dim=double)
    cand_beam = ew.floordiv(cand_index, vocab_dim.size)
    cand_token = ew.mod(cand_index, vocab_dim.size)
    from_beam = one_hot(cand_beam, old_beam, dtype=tf.int32)  # [batch, double, old_beam]
    cand_seq = select(rename_dimension(alive_seq, beam_dim.name, old_beam.name), from_beam,
                      old_beam, double)
    cand_seq = cand_seq + cand_token * one_hot(step, length_dim, dtype=tf.int32)
    is_eos = ew.equal(cand_token, eos_id)
    # Finished: the extensions ending in EOS among the best k.
    newly = ew.logical_and(is_eos, ew.less(mtf_range(mesh, double, tf.int32), k))
    newly = ew.logical_and(newly, ew.greater(cand_lp, -INF / 2))  # not from a dead beam
    penalty = _length_penalty(step + 1, alpha, dtype)
    new_scores = ew.where(newly, cand_lp / penalty, neg_inf)
    pool_scores = concat([rename_dimension(fin_scores, beam_dim.name, pool_dim.name),
                          rename_dimension(new_scores, double.name, pool_dim.name)],
                         pool_dim.name)
    pool_seq = concat([rename_dimension(fin_seq, beam_dim.name, pool_dim.name),
                       rename_dimension(cand_seq, double.name, pool_dim.name)], pool_dim.name)
    fin_scores, fin_index = top_k(pool_scores, pool_dim, k_dim=beam_dim)
    fin_seq = select(pool_seq, one_hot(fin_index, pool_dim, dtype=tf.int32), pool_dim, beam_dim)
    fin_count = ew.minimum(fin_count + reduce_sum(ew.to_int32(newly), reduced_dim=double), k)
    # Alive: the best k extensions that do not end in EOS.
    alive_scores = ew.where(is_eos, neg_inf, cand_lp)
    alive_lp, alive_index = top_k(alive_scores, double, k_dim=beam_dim)
    to_alive = one_hot(alive_index, double, dtype=tf.int32)  # [batch, beam, double]
    alive_seq = select(cand_seq, to_alive, double, beam_dim)
    source = einsum([ew.cast(to_alive, dtype), ew.cast(from_beam, dtype)],
                    output_shape=Shape(batch_dims + [beam_dim, old_beam]))
    reordered = [select(rename_dimension(s, beam_dim.name, old_beam.name), source, old_beam,
                        beam_dim) for s in new_states]
    return [step + 1, alive_seq, alive_lp, fin_seq, fin_scores, fin_count] + reordered

  loop_vars = [step0, initial_ids, alive_lp, initial_ids, finished_scores, finished_count]
  out = control.while_loop(cond_fn, body_fn, loop_vars + list(states or []))
  steps, alive_seq, alive_lp, fin_seq, fin_scores, fin_count = out[:6]
  # Where fewer than k hypotheses finished, alive ones (cut at the limit)
  # compete too.
  alive_scores = ew.where(ew.greater_equal(fin_count, k), neg_inf,
                          alive_lp / _length_penalty(steps, alpha, dtype))
  two = Dimension("final_pool", 2 * k)
  pool_scores = concat([rename_dimension(fin_scores, beam_dim.name, two.name),
                        rename_dimension(alive_scores, beam_dim.name, two.name)], two.name)
  pool_seq = concat([rename_dimension(fin_seq, beam_dim.name, two.name),
                     rename_dimension(alive_seq, beam_dim.name, two.name)], two.name)
  scores, index = top_k(pool_scores, two, k_dim=beam_dim)
  ids = select(pool_seq, one_hot(index, two, dtype=tf.int32), two, beam_dim)
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
