"""Choices the lowering makes from sizes alone, shared by the operations
that lower themselves (einsum, gather) and by the cost model that predicts
them, so that both always agree.

    >>> from mesh_tensorflow.lowering.policies import gathers_table_first
    >>> gathers_table_first(table_slice_bytes=1024, split=4, out_slice_bytes=8192)
    True
"""


def fuses_allreduce(operand_bytes: int, partial_bytes: int, contiguous: bool) -> bool:
  """Whether, where processors share memory, an einsum summed over a split
  dimension gathers its operands along it and multiplies once per group,
  rather than multiplying per processor and summing the partial results.

  It does when the operands are smaller than the partial results, or up to 3x
  larger when gathering them is a contiguous copy (`contiguous`: see
  split_outermost). The second case is the weight gradient of a
  data-parallel layout: one product on the whole batch instead of a small one
  per processor plus an AddN: on the data-parallel benchmark transformer
  (operands 1.25x to 2x the gradients) it brings the step to the single-device
  time. Gathering an inner dimension (the 2x4 layout's products summed over
  split heads or d_ff, operands 1.25x) is slower, so it is not done.
  """
  return operand_bytes < (3 if contiguous else 1) * partial_bytes


def split_outermost(layout_of, inputs, reduced_axes) -> bool:
  """Whether exactly one summed dimension is split (over `reduced_axes`), and
  it is the outermost dimension of every operand that has it, so that
  gathering it concatenates whole blocks. `layout_of(shape)` gives the mesh
  axis of each dimension."""
  split = {d.name for t in inputs for d, a in zip(t.shape.dims, layout_of(t.shape))
           if a in reduced_axes}
  if len(split) != 1:
    return False
  name = split.pop()
  return all(t.shape.dims[0].name == name for t in inputs if t.shape.has_dim_name(name))


def gathers_table_first(table_slice_bytes: int, split: int, out_slice_bytes: int) -> bool:
  """Whether a lookup in a table split `split` ways along the looked-up
  dimension allgathers that dimension first rather than looking up in each
  block, masking the ids other blocks hold and allreducing the results.

  Gathering wins when the table, whole along that dimension, is no larger than
  a processor's output: it moves fewer bytes than the allreduce (which moves
  about twice the output) and needs no more memory than the output does. A small
  vocabulary embedding takes this path; a large one keeps the masked lookup.
  """
  return split > 1 and table_slice_bytes * split <= out_slice_bytes
