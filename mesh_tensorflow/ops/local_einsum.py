"""The per-slice product of an einsum, as a TensorFlow matmul where it can be.

`tf.einsum` first transposes its operands into a canonical order, and on CPU
that copy measured 20% of a model-parallel MLP step (benchmarks/step_time.py).
Most einsums of a model need no copy at all: after their shared leading
(batch) dimensions, each operand is a block of free dimensions and a block of
summed ones, in either order. Those become a reshape (free) and one
`tf.linalg.matmul` with its transpose flags; the rest stay `tf.einsum`.

    >>> local_einsum("bp,bh->ph", x, dh)   # matmul(x, dh, transpose_a=True)
"""

from __future__ import annotations

from typing import List, Optional

import tensorflow as tf

_MATMUL_DTYPES = (tf.float16, tf.bfloat16, tf.float32, tf.float64)


def local_einsum(equation: str, *operands: tf.Tensor) -> tf.Tensor:
  """tf.einsum(equation, *operands), computed by one matmul when that needs
  no transpose copy (two float operands of static shape)."""
  plan = _matmul_plan(equation, operands)
  if plan is None:
    return tf.einsum(equation, *operands)
  return plan()


def _matmul_plan(equation: str, operands):
  if len(operands) != 2:
    return None
  a, b = operands
  if a.dtype not in _MATMUL_DTYPES or a.dtype != b.dtype:
    return None
  if not (a.shape.is_fully_defined() and b.shape.is_fully_defined()):
    return None
  inputs, out = equation.split("->")
  sa, sb = inputs.split(",")
  if any(len(set(s)) != len(s) for s in (sa, sb, out)):
    return None  # a repeated letter is a diagonal
  if set(out) - set(sa) - set(sb) or (set(sa) ^ set(sb)) - set(out):
    return None  # a letter summed within one operand
  sizes = dict(zip(sa, a.shape.as_list()))
  sizes.update(zip(sb, b.shape.as_list()))
  n_batch = 0
  while (n_batch < min(len(sa), len(sb), len(out)) and sa[n_batch] == sb[n_batch] == out[n_batch]):
    n_batch += 1
  batch = out[:n_batch]
  if set(batch) != set(sa) & set(sb) & set(out):
    return None  # a batch letter that is not leading everywhere
  ra, rb, ro = sa[n_batch:], sb[n_batch:], out[n_batch:]
  summed = "".join(c for c in ra if c not in ro)
  free_a = "".join(c for c in ra if c in ro)
  free_b = "".join(c for c in rb if c in ro)
  if ro == free_b + free_a and ro != free_a + free_b:
    a, b, ra, rb, free_a, free_b = b, a, rb, ra, free_b, free_a
  if ro != free_a + free_b or not summed or not (free_a or free_b):
    return None  # not a product of matrices (elementwise or outer products)
  transpose_a = _block_order(ra, free_a, summed)
  transpose_b = _block_order(rb, summed, free_b)
  if transpose_a is None or transpose_b is None:
    return None
  if "".join(c for c in rb if c in summed) != summed:
    return None  # the summed letters come in another order in b

  def size(letters: str) -> int:
    n = 1
    for c in letters:
      n *= sizes[c]
    return n
  lead = [size(batch)] if batch else []
  m, k, n = size(free_a), size(summed), size(free_b)
  out_shape: List[int] = [sizes[c] for c in out]

  def run() -> tf.Tensor:
    a2 = tf.reshape(a, lead + ([k, m] if transpose_a else [m, k]))
    b2 = tf.reshape(b, lead + ([n, k] if transpose_b else [k, n]))
    product = tf.linalg.matmul(a2, b2, transpose_a=transpose_a, transpose_b=transpose_b)
    return tf.reshape(product, out_shape)
  return run


def _block_order(letters: str, first: str, second: str) -> Optional[bool]:
  """False when letters == first + second, True when second + first (a
  transposed matmul operand), None otherwise."""
  if letters == first + second:
    return False
  if letters == second + first:
    return True
  return None
