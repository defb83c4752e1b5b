"""local_einsum (the per-slice product of mtf.einsum): equal to tf.einsum for
random two-operand equations and for one or three operands, and a single
matmul op, with no transpose or reshape, for the matrix products."""

import random

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from mesh_tensorflow.operations.local_einsum import local_einsum


def _random_equation(rng: random.Random):
  letters = list("abcdefg")
  rng.shuffle(letters)
  if rng.random() < 0.5:  # the matrix-product shape, in some letter order
    roles = dict(zip(letters, ["summed", "free_a", "free_b"] + ["batch"] * rng.randint(0, 1)))
  else:
    roles = {c: rng.choice(["batch", "summed", "free_a", "free_b", "only_a"])
             for c in letters[:rng.randint(3, 5)]}
  sa = [c for c, r in roles.items() if r in ("batch", "summed", "free_a", "only_a")]
  sb = [c for c, r in roles.items() if r in ("batch", "summed", "free_b")]
  out = [c for c, r in roles.items() if r in ("batch", "free_a", "free_b")]
  block_order = ["batch", "free_a", "summed", "free_b", "only_a"]
  for s in (sa, sb, out):
    if rng.random() < 0.7:  # often whole blocks (the matmul form), in either order
      sign = rng.choice([1, -1])  # -1 puts the blocks after batch in reverse: a transpose
      s.sort(key=lambda c: -99 if roles[c] == "batch" else sign * block_order.index(roles[c]))
    else:
      rng.shuffle(s)
  sizes = {c: rng.randint(1, 4) for c in roles}
  return "".join(sa) + "," + "".join(sb) + "->" + "".join(out), sizes


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(seed=st.integers(0, 2**31 - 1), dtype=st.sampled_from([tf.float32, tf.int32]))
def test_equals_tf_einsum(seed, dtype):
  rng = random.Random(seed)
  eq, sizes = _random_equation(rng)
  sa, sb = eq.split("->")[0].split(",")
  nrng = np.random.RandomState(seed % 2**31)
  a = tf.cast(nrng.randint(-3, 4, [sizes[c] for c in sa]), dtype)
  b = tf.cast(nrng.randint(-3, 4, [sizes[c] for c in sb]), dtype)
  np.testing.assert_array_equal(local_einsum(eq, a, b).numpy(), tf.einsum(eq, a, b).numpy(),
                                err_msg=eq)


def _op_types(eq, shape_a, shape_b):
  fn = tf.function(lambda a, b: local_einsum(eq, a, b)).get_concrete_function(
      tf.TensorSpec(shape_a, tf.float32), tf.TensorSpec(shape_b, tf.float32))
  return {op.type for op in fn.graph.get_operations()}


@pytest.mark.parametrize("eq,shape_a,shape_b", [
    ("bp,ph->bh", [4, 5], [5, 6]),          # x @ w
    ("bp,bh->ph", [4, 5], [4, 6]),          # x^T @ dh (a weight gradient)
    ("bc,hc->bh", [4, 3], [6, 3]),          # dlogits @ w^T
    ("bh,bp->ph", [4, 6], [4, 5]),          # output order swaps the operands
    ("ab,bc->ca", [2, 3], [3, 4]),          # (a b)^T = b^T a^T
    ("hlk,hmk->hlm", [3, 4, 5], [3, 6, 5]),  # a leading batch dimension
])
def test_matrix_products_are_one_matmul(eq, shape_a, shape_b):
  types = _op_types(eq, shape_a, shape_b)
  assert types & {"MatMul", "BatchMatMulV2"}, types
  assert not types & {"Einsum", "Transpose", "Reshape"}, types


@pytest.mark.parametrize("eq,shape_a,shape_b", [
    ("bld,dhk->blhk", [2, 3, 4], [4, 5, 6]),          # would need reshapes
    ("blhk,bmhk->bhlm", [2, 3, 4, 5], [2, 6, 4, 5]),  # batch dims not leading
    ("abc,cb->a", [2, 3, 4], [4, 3]),                 # two summed dimensions
    ("ab,ab->ab", [2, 3], [2, 3]),                    # elementwise
    ("aab,bc->ac", [2, 2, 3], [3, 4]),                # a diagonal
])
def test_other_forms_stay_tf_einsum(eq, shape_a, shape_b):
  assert "Einsum" in _op_types(eq, shape_a, shape_b)


def test_one_and_three_operands_equal_tf_einsum():
  """The Einsum kernel takes at most two operands: three go through tf.einsum."""
  rng = np.random.default_rng(3)
  a, b, c = (tf.constant(rng.normal(size=s).astype(np.float32)) for s in ([2, 3], [3, 4], [4]))
  for eq, ops in [("ab,bc,c->a", (a, b, c)), ("ab,bc,c->", (a, b, c)), ("ab->ba", (a,)),
                  ("ab->", (a,))]:
    np.testing.assert_allclose(local_einsum(eq, *ops).numpy(), tf.einsum(eq, *ops).numpy(),
                               rtol=1e-6, err_msg=eq)


@pytest.mark.parametrize("eq,shape_a,shape_b", [
    ("blhk,bmhk->bhlm", [2, 3, 1, 5], [2, 6, 1, 5]),  # one head per processor
    ("bhlm,bmhk->blhk", [2, 1, 3, 6], [2, 6, 1, 5]),
    ("bld,dk->blk", [1, 3, 4], [4, 5]),                 # a batch of one
])
def test_size_one_axes_dropped_to_reach_a_matmul(eq, shape_a, shape_b):
  types = _op_types(eq, shape_a, shape_b)
  assert types & {"MatMul", "BatchMatMulV2"}, types
  assert not types & {"Einsum", "Transpose"}, types
  rng = np.random.RandomState(0)
  a = tf.constant(rng.randn(*shape_a), tf.float32)
  b = tf.constant(rng.randn(*shape_b), tf.float32)
  np.testing.assert_allclose(local_einsum(eq, a, b).numpy(), tf.einsum(eq, a, b).numpy(),
                             rtol=1e-5, atol=1e-5)


def _op_type_counts(eq, shape_a, shape_b):
  fn = tf.function(lambda a, b: local_einsum(eq, a, b)).get_concrete_function(
      tf.TensorSpec(shape_a, tf.float32), tf.TensorSpec(shape_b, tf.float32))
  counts = {}
  for op in fn.graph.get_operations():
    counts[op.type] = counts.get(op.type, 0) + 1
  return counts, fn.graph


@pytest.mark.parametrize("eq,shape_a,shape_b,reshapes", [
    # Scores come out of the matmul already shaped [b, 1, l, m]: only the two
    # operands, whose last axes are (1, k), are reshaped.
    ("blhk,bmhk->bhlm", [2, 3, 1, 5], [2, 6, 1, 5], 2),
    # The scores [b, 1, l, m] are used as they are; v and the output are reshaped.
    ("bhlm,bmhk->blhk", [2, 1, 3, 6], [2, 6, 1, 5], 2),
    # A batch of one broadcasts against the unbatched weight: no reshape at all.
    ("bld,dk->blk", [1, 3, 4], [4, 5], 0),
    ("hbl,hbm->hlm", [1, 2, 3], [1, 2, 4], 0),
])
def test_size_one_axes_cost_only_the_reshapes_they_must(eq, shape_a, shape_b, reshapes):
  counts, _ = _op_type_counts(eq, shape_a, shape_b)
  assert counts.get("Reshape", 0) == reshapes, counts
  assert counts.get("BatchMatMulV2", 0) + counts.get("MatMul", 0) == 1, counts


def test_attention_chain_shares_operand_reshapes():
  """Forward and backward attention products with one head per slice: each of
  q, k, v and the output gradient is reshaped once, however many products use
  it; the scores and their gradient are never reshaped."""
  b, l, k = 2, 3, 5
  spec = tf.TensorSpec([b, l, 1, k], tf.float32)

  def attention(q, kk, v, do):
    s = local_einsum("blhk,bmhk->bhlm", q, kk)
    o = local_einsum("bhlm,bmhk->blhk", s, v)
    ds = local_einsum("blhk,bmhk->bhlm", do, v)
    dv = local_einsum("bhlm,blhk->bmhk", s, do)
    dq = local_einsum("bhlm,bmhk->blhk", ds, kk)
    dk = local_einsum("bhlm,blhk->bmhk", ds, q)
    return o, dv, dq, dk
  graph = tf.function(attention).get_concrete_function(spec, spec, spec, spec).graph
  reshapes = [op for op in graph.get_operations() if op.type == "Reshape"]
  reshaped = [op.inputs[0].op.type for op in reshapes]
  assert reshaped.count("Placeholder") == 4, reshaped   # q, k, v, do: once each
  assert len(reshapes) == 4 + 4, reshaped                # + the four [b, l, 1, k] outputs
  rng = np.random.RandomState(1)
  args = [tf.constant(rng.randn(b, l, 1, k), tf.float32) for _ in range(4)]
  q, kk, v, do = args
  s = tf.einsum("blhk,bmhk->bhlm", q, kk)
  ds = tf.einsum("blhk,bmhk->bhlm", do, v)
  want = [tf.einsum("bhlm,bmhk->blhk", s, v), tf.einsum("bhlm,blhk->bmhk", s, do),
          tf.einsum("bhlm,bmhk->blhk", ds, kk), tf.einsum("bhlm,blhk->bmhk", ds, q)]
  for got, expected in zip(attention(*args), want):
    np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-5, atol=1e-5)
