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
"blk,bmk->blm". Reshapes that move size-1 axes copy nothing, and the
`BatchMatMulV2` they enable beat the `Einsum` kernel at every batch size tried
(two attention products on 8 devices: 3.6 vs 4.5 ms at batch 16, 1.3 vs 1.7 ms
at batch 1). On the model-parallel benchmark transformer (heads:all) the step
took 6-8% less time in three interleaved A/B runs. The price is Reshape ops to
create, which on a large mesh is lowering time: `BatchMatMulV2` broadcasts the
axes before the last two, so size-1 axes may stay there, and only tensors
whose last two axes are not their matrix axes are reshaped (operand reshapes
are shared by the products that reuse an operand). Attention then costs 8
reshapes per layer and processor (forward and backward), not 12-24.

    >>> local_einsum("bp,bh->ph", x, dh)   # MatMul(x, dh, transpose_a=True)
"""

from __future__ import annotations

from typing import Optional, Tuple

import tensorflow as tf

from mesh_tensorflow.lowering.mesh_impl import once_per_graph, reshape_slice

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
    product = _unit_axes_matmul(equation, *operands)
    if product is not None:
      return product
  return tf.raw_ops.Einsum(inputs=list(operands), equation=equation)


def _reshaped(x: tf.Tensor, shape) -> tf.Tensor:
  """x reshaped to `shape`, once per graph: attention reuses each operand in
  two or three products (forward and backward)."""
  return once_per_graph(("reshape", x, tuple(shape)), lambda: reshape_slice(x, shape))


def _matmul(plan, a: tf.Tensor, b: tf.Tensor, batched: Optional[bool] = None) -> tf.Tensor:
  swap, transpose_a, transpose_b, plan_batched = plan
  batched = plan_batched if batched is None else batched
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


def _unit_axes_matmul(equation: str, a: tf.Tensor, b: tf.Tensor) -> Optional[tf.Tensor]:
  """The product as one matmul once the letters of size 1 are set aside, or None.

  `BatchMatMulV2` multiplies the last two axes and broadcasts everything before
  them, so size-1 axes may sit anywhere in that prefix. A tensor whose last two
  axes are its two matrix letters is used as it is; the others are reshaped
  (a copy-free op, still an op to create) to a common prefix. Of the prefixes
  the three tensors suggest, the one needing the fewest reshapes wins: the
  attention scores "blhk,bmhk->bhlm" with h of size 1 come out of the matmul
  already shaped [b, 1, l, m], and the next product takes them as they are.
  """
  squeezed = _without_unit_axes(equation, (a, b))
  if squeezed is None:
    return None
  equation_1, unit, sizes = squeezed
  plan = _matmul_plan(equation_1)
  if plan is None:
    return None
  batch = equation_1.split("->")[1][0] if plan[3] else None
  specs = equation.split("->")[0].split(",") + [equation.split("->")[1]]
  natural = [_matmul_prefix(spec, unit, batch, sizes) for spec in specs]
  candidates = [p for p in natural if p is not None] + [[sizes[batch]] if batch else []]
  best = None
  for prefix in candidates:
    operand_prefixes = [q if q is not None and _aligned(q, prefix, batch, sizes) else prefix
                        for q in natural[:2]]
    out_prefix = _broadcast(*operand_prefixes)
    cost = sum(q is not n for q, n in zip(operand_prefixes, natural))
    cost += out_prefix != natural[2]
    if best is None or cost < best[0]:
      best = (cost, operand_prefixes, out_prefix)
  _, operand_prefixes, out_prefix = best
  matrices = [_reshaped(x, prefix + _core_shape(spec, unit, batch, sizes))
              for x, spec, prefix in zip((a, b), specs, operand_prefixes)]
  product = _matmul(plan, *matrices, batched=bool(out_prefix))
  return reshape_slice(product, [sizes[c] for c in specs[2]])


def _without_unit_axes(equation: str, operands):
  """(the equation without its letters of size 1, those letters, every
  letter's size) when some letter has size 1 everywhere and all shapes are
  static and agree; else None."""
  inputs, out = equation.split("->")
  specs = inputs.split(",")
  sizes = {}
  for spec, x in zip(specs, operands):
    shape = x.shape.as_list()
    if len(spec) != len(shape) or None in shape:
      return None
    for letter, n in zip(spec, shape):
      if sizes.setdefault(letter, n) != n:
        return None
  unit = {letter for letter, n in sizes.items() if n == 1}
  if not unit or not set(out) <= set(sizes):
    return None
  keep = lambda spec: "".join(c for c in spec if c not in unit)
  return ",".join(keep(spec) for spec in specs) + "->" + keep(out), unit, sizes


def _matmul_prefix(spec: str, unit, batch, sizes):
  """The shape before the last two axes when those are the tensor's two matrix
  letters (and the rest is size-1 axes and the batch letter), else None."""
  if len(spec) < 2 or spec[-1] in unit or spec[-2] in unit or batch in (spec[-1], spec[-2]):
    return None
  return [sizes[c] for c in spec[:-2]]


def _core_shape(spec: str, unit, batch, sizes):
  return [sizes[c] for c in spec if c not in unit and c != batch]


def _aligned(prefix, target, batch, sizes) -> bool:
  """Whether `prefix` broadcasts like `target`: the batch axis (if any) at the
  same distance from the matrix axes, all else size 1."""
  if not batch:
    return True
  where = lambda p: len(p) - p.index(sizes[batch])
  return where(prefix) == where(target)


def _broadcast(p, q):
  longest = max(len(p), len(q))
  p, q = [1] * (longest - len(p)) + p, [1] * (longest - len(q)) + q
  return [max(x, y) for x, y in zip(p, q)]

from mesh_tensorflow.core import autograph_exempt as _autograph_exempt  # noqa: E402  pylint: disable=g-import-not-at-top
# Public names only: the private helpers stay plain calls (a wrapper costs
# about 3 us per call while lowering).
_autograph_exempt.exempt(globals(), public_only=True)  # AutoGraph leaves this code alone
