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

Dimensions of size 1 are the exception. A layout that splits a dimension as
many ways as it is long (8 heads over 8 processors) leaves each slice a size-1
axis that hides a batched matrix product: "blhk,bmhk->bhlm" with h of size 1 is
"blk,bmk->blm". Reshapes that drop or restore size-1 axes copy nothing, and the
`BatchMatMulV2` they enable beat the `Einsum` kernel at every batch size tried
(two attention products on 8 devices: 3.6 vs 4.5 ms at batch 16, 1.3 vs 1.7 ms
at batch 1). On the model-parallel benchmark transformer (heads:all) the step
took 6-8% less time in three interleaved A/B runs; the price is up to three
Reshape ops per product to create (operand reshapes are shared between the
products that reuse an operand), 12% more ops to lower on the 64-device mesh
of benchmarks/lowering_time.py.

    >>> local_einsum("bp,bh->ph", x, dh)   # MatMul(x, dh, transpose_a=True)
"""

from __future__ import annotations

from typing import Optional, Tuple

import tensorflow as tf

from mesh_tensorflow.mesh_impl import once_per_graph, reshape_slice

_MATMUL_DTYPES = (tf.float16, tf.bfloat16, tf.float32, tf.float64)


def local_einsum(equation: str, *operands: tf.Tensor) -> tf.Tensor:
  """tf.einsum(equation, *operands) as one op: a matmul when it is a matrix
  product of the two float operands as they are (or once their size-1 axes are
  dropped), else an `Einsum`."""
  # Raw ops: creating ops dominates lowering time on large meshes, and the
  # Python wrappers (tf.einsum parses the equation again) cost up to as much as
  # the op itself.
  if len(operands) > 2:  # the Einsum kernel takes one or two operands
    return tf.einsum(equation, *operands)
  if len(operands) == 2 and operands[0].dtype in _MATMUL_DTYPES and (
      operands[0].dtype == operands[1].dtype):
    plan = _matmul_plan(equation)
    if plan is not None:
      return _matmul(plan, *operands)
    squeezed = _without_unit_axes(equation, operands)
    if squeezed is not None:
      equation_1, kept_shapes, out_shape = squeezed
      plan = _matmul_plan(equation_1)
      if plan is not None:
        a, b = (_reshaped(x, s) for x, s in zip(operands, kept_shapes))
        return reshape_slice(_matmul(plan, a, b), out_shape)
  return tf.raw_ops.Einsum(inputs=list(operands), equation=equation)


def _reshaped(x: tf.Tensor, shape) -> tf.Tensor:
  """x reshaped to `shape`, once per graph: attention reuses each operand in
  two or three products (forward and backward)."""
  return once_per_graph(("reshape", x, tuple(shape)), lambda: reshape_slice(x, shape))


def _matmul(plan, a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
  swap, transpose_a, transpose_b, batched = plan
  if swap:
    a, b = b, a
  if batched:
    return tf.raw_ops.BatchMatMulV2(x=a, y=b, adj_x=transpose_a, adj_y=transpose_b)
  return tf.raw_ops.MatMul(a=a, b=b, transpose_a=transpose_a, transpose_b=transpose_b)


def _matmul_plan(equation: str) -> Optional[Tuple[bool, bool, bool, bool]]:
  """(swap, transpose_a, transpose_b, batched): the two-operand `equation` is
  matmul(a, b) (a batched one over a shared leading dimension), with a and b
  the operands, swapped when `swap`; or None."""
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
  swap = out == free_b + free_a  # (a b)^T = b^T a^T: swap the operands
  if swap:
    sa, sb, free_a, free_b = sb, sa, free_b, free_a
  if out != free_a + free_b:
    return None
  return swap, sa == k + free_a, sb == free_b + k, batched


def _without_unit_axes(equation: str, operands):
  """(equation without the letters of size 1, the operands' shapes without
  those axes, the output's shape) when some letter has size 1 everywhere and
  all shapes are static; else None."""
  inputs, out = equation.split("->")
  specs = inputs.split(",")
  shapes = [x.shape.as_list() for x in operands]
  sizes = {}
  for spec, shape in zip(specs, shapes):
    if len(spec) != len(shape) or None in shape:
      return None
    for letter, n in zip(spec, shape):
      sizes.setdefault(letter, set()).add(n)
  unit = {letter for letter, ns in sizes.items() if ns == {1}}
  if not unit or any(len(ns) != 1 for ns in sizes.values()) or not set(out) <= set(sizes):
    return None
  keep = lambda spec: "".join(c for c in spec if c not in unit)
  kept_shapes = [[n for c, n in zip(spec, shape) if c not in unit]
                 for spec, shape in zip(specs, shapes)]
  out_shape = [next(iter(sizes[c])) for c in out]
  return ",".join(keep(spec) for spec in specs) + "->" + keep(out), kept_shapes, out_shape
