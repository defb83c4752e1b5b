"""The per-slice product of an einsum, as a TensorFlow matmul where it is one.

Measured on the model-parallel MLP of benchmarks/step_time.py (8 logical
CPUs), `tf.einsum` slices cost 20% more step time than the same products as
`MatMul` with transpose flags. So an einsum that is exactly a matrix product
of its operands as they are (one free dimension per operand, one summed, at
most one leading batch dimension, any operand order) becomes one
`MatMul`/`BatchMatMulV2`; everything else stays one `Einsum` op. Products that
would first need dimensions merged by reshapes stay einsums too: on the
transformer, the extra reshape ops cost more step and lowering time than they
saved.

    >>> local_einsum("bp,bh->ph", x, dh)   # MatMul(x, dh, transpose_a=True)
"""

from __future__ import annotations

import tensorflow as tf

_MATMUL_DTYPES = (tf.float16, tf.bfloat16, tf.float32, tf.float64)


def local_einsum(equation: str, *operands: tf.Tensor) -> tf.Tensor:
  """tf.einsum(equation, *operands) as one op: a matmul when it is a matrix
  product of the two float operands as they are, else an `Einsum`."""
  # Raw ops: creating ops dominates lowering time on large meshes, and the
  # Python wrappers (tf.einsum parses the equation again) cost up to as much as
  # the op itself.
  if len(operands) > 2:  # the Einsum kernel takes one or two operands
    return tf.einsum(equation, *operands)
  plan = _matmul_plan(equation, operands)
  if plan is None:
    return tf.raw_ops.Einsum(inputs=list(operands), equation=equation)
  a, b, transpose_a, transpose_b, batched = plan
  if batched:
    return tf.raw_ops.BatchMatMulV2(x=a, y=b, adj_x=transpose_a, adj_y=transpose_b)
  return tf.raw_ops.MatMul(a=a, b=b, transpose_a=transpose_a, transpose_b=transpose_b)


def _matmul_plan(equation: str, operands):
  """(a, b, transpose_a, transpose_b, batched) computing `equation` as
  matmul(a, b) (a batched one over a shared leading dimension), or None."""
  if len(operands) != 2:
    return None
  a, b = operands
  if a.dtype not in _MATMUL_DTYPES or a.dtype != b.dtype:
    return None
  inputs, out = equation.split("->")
  sa, sb = inputs.split(",")
  if len(out) not in (2, 3) or not len(sa) == len(sb) == len(out):
    return None
  if len(set(sa + sb)) != len(out) + 1 or len(set(out)) != len(out):
    return None  # a repeated letter (a diagonal) or not one summed letter
  batched = len(out) == 3
  if batched:
    if not sa[0] == sb[0] == out[0]:
      return None
    sa, sb, out = sa[1:], sb[1:], out[1:]
  summed = set(sa) & set(sb)
  if len(summed) != 1 or set(out) != set(sa + sb) - summed:
    return None  # not one free dimension per operand and one summed
  k = summed.pop()
  free_a, free_b = sa.replace(k, ""), sb.replace(k, "")
  if out == free_b + free_a:  # (a b)^T = b^T a^T: swap the operands
    a, b, sa, sb, free_a, free_b = b, a, sb, sa, free_b, free_a
  if out != free_a + free_b:
    return None
  return a, b, sa == k + free_a, sb == free_b + k, batched
