"""Local self-attention over sequences and images cut into spatial blocks.

Part of `mtf.layers` (import them from there). A sequence is laid out as
[batch..., num_w_blocks, w, channels] (position `block * w.size + i`) and an
image as [batch..., num_h_blocks, num_w_blocks, h, w, channels]. Each query
block attends to its own block and its neighbouring blocks, which reach it
through `mtf.halo_exchange`: with a blocks dimension split over the mesh,
only neighbouring processors exchange data, and the result is the same
under every layout.

With `mask_right`, only the blocks before (left, and for images also above)
come in, and a query sees the positions up to itself (raster order for
images). Positions outside the sequence or image (the halo of the first and
last blocks) are masked exactly, not attended as zero keys and values.

    >>> x = mtf.reshape(x, [batch, num_w_blocks, w, d_model])   # length = 4 * 16
    >>> y = mtf.layers.local_self_attention_spatial_blocks(x, d_kv, heads, mask_right=True)
"""

from __future__ import annotations

from typing import Optional, Tuple

import tensorflow as tf

from mesh_tensorflow.core.graph import Mesh, Tensor
from mesh_tensorflow.layers.attention import (
    _bias, attention_bias_local_block, dot_product_attention, memory_name,
    multihead_attention_vars)
from mesh_tensorflow.layers.core import layer_scope
from mesh_tensorflow.operations import elementwise as ew
from mesh_tensorflow.operations.control import stop_gradient
from mesh_tensorflow.operations.conv import halo_exchange
from mesh_tensorflow.operations.einsum_ops import einsum
from mesh_tensorflow.operations.indexing import range as mtf_range
from mesh_tensorflow.operations.reduction import reduce_max, reduce_sum
from mesh_tensorflow.operations.shape_ops import rename_dimension, transpose
from mesh_tensorflow.operations.slicing import pad
from mesh_tensorflow.operations.utilities import left_halo_exchange
from mesh_tensorflow.core.shapes import Dimension, Shape

DimLike = Optional[Dimension]


# ---------------------------------------------------------------- halo exchange
def _dim_in(t: Tensor, dim, what: str) -> Dimension:
  name = dim if isinstance(dim, str) else dim.name
  if name not in t.shape.dimension_names:
    raise ValueError(f"{what}: {t.name} {t.shape} has no dimension {name!r}.")
  return t.shape.get_dim_by_name(name)


def _exchange_one(t: Tensor, blocks_dim: DimLike, block_dim, mask_right: bool,
                  what: str) -> Tensor:
  """t with its block dimension grown by a whole block of neighbours: the
  block before (and, unless mask_right, the block after)."""
  block = _dim_in(t, block_dim, what)
  halo = block.size
  if blocks_dim is None:
    # One block only: its neighbours are outside the data, i.e. zeros.
    return pad(t, [halo, 0 if mask_right else halo], block.name)
  _dim_in(t, blocks_dim, what)
  if mask_right:
    return left_halo_exchange(t, blocks_dim, block, halo)
  return halo_exchange(t, blocks_dim, block, halo)


def local_1d_halo_exchange(k: Tensor, v: Tensor, num_w_blocks: DimLike, w_dim: Dimension,
                           mask_right: bool) -> Tuple[Tensor, Tensor]:
  """Gives each block of keys and values the whole neighbouring blocks.

  Along `w_dim` (the position within a block), every block is preceded by the
  previous block and, unless mask_right, followed by the next one (zeros past
  the ends), so w_dim grows to 2 or 3 times its size. With `num_w_blocks`
  split over the mesh this lowers to permutes between neighbours; without a
  blocks dimension (None) the tensor is one block and is padded with zeros.

  Args:
    k: keys [..., num_w_blocks, ..., w_dim, ...].
    v: values, with the same blocks and w dimensions.
    num_w_blocks: the dimension numbering the blocks, or None.
    w_dim: the dimension within a block (its size is the halo).
    mask_right: take only the block before (causal attention).

  Returns:
    (k, v) with w_dim of size 2 * w (mask_right) or 3 * w.

  Example:
    >>> k, v = local_1d_halo_exchange(k, v, num_w_blocks, memory_w, mask_right=True)
  """
  what = "local_1d_halo_exchange"
  return (_exchange_one(k, num_w_blocks, w_dim, mask_right, what),
          _exchange_one(v, num_w_blocks, w_dim, mask_right, what))


def local_2d_halo_exchange(k: Tensor, v: Tensor, num_h_blocks: DimLike, h_dim: Dimension,
                           num_w_blocks: DimLike, w_dim: Dimension,
                           mask_right: bool) -> Tuple[Tensor, Tensor]:
  """`local_1d_halo_exchange` along h, then along w: each image block gets
  its 8 neighbouring blocks (3h x 3w), or with mask_right the blocks above,
  to the left and above-left (2h x 2w); zeros outside the image.

  Example:
    >>> k, v = local_2d_halo_exchange(k, v, h_blocks, memory_h, w_blocks, memory_w, False)
  """
  what = "local_2d_halo_exchange"
  for blocks_dim, block_dim in ((num_h_blocks, h_dim), (num_w_blocks, w_dim)):
    k = _exchange_one(k, blocks_dim, block_dim, mask_right, what)
    v = _exchange_one(v, blocks_dim, block_dim, mask_right, what)
  return k, v


# ---------------------------------------------------------------- masks
def _outside(mesh: Mesh, blocks_dim: Dimension, memory_dim: Dimension,
             block_size: int) -> Tensor:
  """True where memory position m of block b, global position
  b * block_size + m - block_size (the halo starts one block before), lies
  outside the sequence. Shape [blocks_dim, memory_dim]."""
  pos = (mtf_range(mesh, blocks_dim, tf.int32) * block_size
         + mtf_range(mesh, memory_dim, tf.int32) - block_size)
  return ew.logical_or(ew.less(pos, 0), ew.greater_equal(pos, blocks_dim.size * block_size))


def _after_in_raster_order(mesh: Mesh, h_dim: Dimension, w_dim: Dimension,
                           memory_h: Dimension, memory_w: Dimension) -> Tensor:
  """True where the memory position (row memory_h - h, column memory_w - w,
  relative to the query's block) comes after the query (h, w) in raster
  order. Shape [h_dim, w_dim, memory_h, memory_w]."""
  qh = mtf_range(mesh, h_dim, tf.int32)
  qw = mtf_range(mesh, w_dim, tf.int32)
  mh = mtf_range(mesh, memory_h, tf.int32) - h_dim.size
  mw = mtf_range(mesh, memory_w, tf.int32) - w_dim.size
  later = ew.logical_or(ew.greater(mh, qh),
                        ew.logical_and(ew.equal(mh, qh), ew.greater(mw, qw)))
  return transpose(later, Shape([h_dim, w_dim, memory_h, memory_w]))


def attention_bias_local_2d_block(mesh: Mesh, h_dim: Dimension, w_dim: Dimension,
                                  memory_h_dim: Dimension, memory_w_dim: Dimension,
                                  dtype=tf.int32) -> Tensor:
  """Causal bias of an image block's queries against [blocks above, own
  rows] x [blocks to the left, own columns].

  The memory is what `local_2d_halo_exchange` with mask_right gives: rows
  -h..h-1 and columns -w..w-1 relative to the query block's corner. A memory
  position is hidden (-1e9) when it comes after the query in raster order
  (a later row, or the same row and a later column); the rest is 0.

  Args:
    mesh: the mesh.
    h_dim: the query block's row dimension.
    w_dim: the query block's column dimension.
    memory_h_dim: the memory row dimension (its size becomes 2 * h).
    memory_w_dim: the memory column dimension (its size becomes 2 * w).
    dtype: bias dtype (integer dtypes give float32).

  Returns:
    a bias [h_dim, w_dim, memory_h_dim, memory_w_dim].

  Example:
    >>> bias = attention_bias_local_2d_block(mesh, h, w, mtf.Dimension("memory_h", 8),
    ...                                      mtf.Dimension("memory_w", 8))
  """
  memory_h = Dimension(memory_h_dim.name, 2 * h_dim.size)
  memory_w = Dimension(memory_w_dim.name, 2 * w_dim.size)
  return _bias(_after_in_raster_order(mesh, h_dim, w_dim, memory_h, memory_w), dtype)


# ---------------------------------------------------------------- layers
def _check_rank(x: Tensor, n: int, layout: str, what: str) -> None:
  if x.shape.ndims < n:
    raise ValueError(f"{what}: {x.name} {x.shape} must be [{layout}] "
                     f"(at least {n} dimensions).")


def local_self_attention_spatial_blocks(query_antecedent: Tensor, kv_channels: Dimension,
                                        heads: Dimension, is_training: bool = False,
                                        memory_w_dim=None,
                                        mask_right: bool = False, master_dtype=tf.float32,
                                        slice_dtype=tf.float32,
                                        name: Optional[str] = None) -> Tensor:
  """Multi-head self-attention within neighbouring blocks of a sequence.

  The sequence is [batch..., num_w_blocks, w, io_channels]. Each query sees
  its own block and the block before it and, unless mask_right, the block
  after it; with mask_right, only positions up to itself. Splitting
  num_w_blocks over the mesh splits the sequence: each block gets its
  neighbours with `local_1d_halo_exchange`.

  Args:
    query_antecedent: [batch..., num_w_blocks, w, io_channels].
    kv_channels: per-head key/value dimension.
    heads: heads dimension.
    is_training: accepted for the signature's sake; this layer has no
      dropout, so it changes nothing.
    memory_w_dim: ignored (the memory dimension is always "memory_" + w's
      name).
    mask_right: causal attention (for decoders).
    master_dtype: variable storage dtype.
    slice_dtype: variable slice dtype.
    name: scope name (default "multihead_attention", unique per call);
      variable "<name>/qkvo".

  Returns:
    a tensor with query_antecedent's shape.

  Example:
    >>> x = mtf.reshape(x, [batch, mtf.Dimension("num_w_blocks", 8), w, d_model])
    >>> y = local_self_attention_spatial_blocks(x, d_kv, heads, mask_right=True)
  """
  del is_training, memory_w_dim
  x = query_antecedent
  what = "local_self_attention_spatial_blocks"
  _check_rank(x, 3, "batch..., num_w_blocks, w, io_channels", what)
  *batch_dims, num_w_blocks, w_dim, io_channels = x.shape.dims
  mesh = x.mesh
  with layer_scope(mesh, name, "multihead_attention"):
    wq, wk, wv, wo = multihead_attention_vars(mesh, heads, io_channels, kv_channels,
                                              master_dtype, slice_dtype, x.dtype)
    memory_w = Dimension(memory_name(w_dim.name), w_dim.size)
    memory = rename_dimension(x, w_dim.name, memory_w.name)
    blocks = batch_dims + [heads, num_w_blocks]
    q = einsum([x, wq], output_shape=blocks + [w_dim, kv_channels])
    k = einsum([memory, wk], output_shape=blocks + [memory_w, kv_channels])
    v = einsum([memory, wv], output_shape=blocks + [memory_w, kv_channels])
    k, v = local_1d_halo_exchange(k, v, num_w_blocks, memory_w, mask_right)
    memory_w = k.shape.get_dim_by_name(memory_w.name)
    bias = _bias(_outside(mesh, num_w_blocks, memory_w, w_dim.size), x.dtype)
    if mask_right:
      bias = bias + attention_bias_local_block(mesh, w_dim, memory_w, x.dtype)
    o = dot_product_attention(q, k, v, bias)
    return einsum([o, wo], output_shape=x.shape)


def local_2d_self_attention_spatial_blocks(query_antecedent: Tensor, kv_channels: Dimension,
                                           heads: Dimension, is_training: bool = False,
                                           memory_h_dim=None,
                                           memory_w_dim=None, mask_right: bool = False,
                                           master_dtype=tf.float32, slice_dtype=tf.float32,
                                           name: Optional[str] = None) -> Tensor:
  """Multi-head self-attention within neighbouring blocks of an image.

  The image is [batch..., num_h_blocks, num_w_blocks, h, w, io_channels]:
  pixel (row, column) = (h_block * h + i, w_block * w + j). Each query sees
  the 3 x 3 blocks around its own (2 x 2: above, left, above-left and its
  own with mask_right, where it also sees only the pixels before it in
  raster order, see `attention_bias_local_2d_block`). Splitting num_h_blocks
  and/or num_w_blocks over the mesh splits the image; each block gets its
  neighbours with `local_2d_halo_exchange`.

  Args:
    query_antecedent: [batch..., num_h_blocks, num_w_blocks, h, w, io_channels].
    memory_h_dim: ignored (the memory dimensions are always "memory_" + h's
      and w's names).
    memory_w_dim: ignored, as memory_h_dim.
    mask_right: causal (raster order) attention, for decoders.
    kv_channels, heads, is_training, master_dtype, slice_dtype, name: as in
      `local_self_attention_spatial_blocks`.

  Returns:
    a tensor with query_antecedent's shape.

  Example:
    >>> # x: [batch, h_blocks:4, w_blocks:4, h:8, w:8, d_model], a 32 x 32 image.
    >>> y = local_2d_self_attention_spatial_blocks(x, d_kv, heads)
  """
  del is_training, memory_h_dim, memory_w_dim
  x = query_antecedent
  what = "local_2d_self_attention_spatial_blocks"
  _check_rank(x, 5, "batch..., num_h_blocks, num_w_blocks, h, w, io_channels", what)
  *batch_dims, num_h_blocks, num_w_blocks, h_dim, w_dim, io_channels = x.shape.dims
  mesh = x.mesh
  with layer_scope(mesh, name, "multihead_attention"):
    wq, wk, wv, wo = multihead_attention_vars(mesh, heads, io_channels, kv_channels,
                                              master_dtype, slice_dtype, x.dtype)
    memory_h = Dimension(memory_name(h_dim.name), h_dim.size)
    memory_w = Dimension(memory_name(w_dim.name), w_dim.size)
    memory = rename_dimension(rename_dimension(x, h_dim.name, memory_h.name),
                              w_dim.name, memory_w.name)
    blocks = batch_dims + [heads, num_h_blocks, num_w_blocks]
    q = einsum([x, wq], output_shape=blocks + [h_dim, w_dim, kv_channels])
    k = einsum([memory, wk], output_shape=blocks + [memory_h, memory_w, kv_channels])
    v = einsum([memory, wv], output_shape=blocks + [memory_h, memory_w, kv_channels])
    k, v = local_2d_halo_exchange(k, v, num_h_blocks, memory_h, num_w_blocks, memory_w,
                                  mask_right)
    memory_h = k.shape.get_dim_by_name(memory_h.name)
    memory_w = k.shape.get_dim_by_name(memory_w.name)
    # The biases broadcast into the logits; none is materialized at full size.
    logits = einsum([q, k], output_shape=blocks + [h_dim, w_dim, memory_h, memory_w])
    logits = logits + _bias(_outside(mesh, num_h_blocks, memory_h, h_dim.size), x.dtype)
    logits = logits + _bias(_outside(mesh, num_w_blocks, memory_w, w_dim.size), x.dtype)
    if mask_right:
      logits = logits + attention_bias_local_2d_block(mesh, h_dim, w_dim, memory_h, memory_w,
                                                      x.dtype)
    # One softmax over the memory rows and columns together (composed: the
    # fused kernel takes one dimension).
    others = logits.shape - [memory_h, memory_w]
    top = stop_gradient(reduce_max(logits, output_shape=others))
    e = ew.exp(logits - top)
    weights = e / reduce_sum(e, output_shape=others)
    o = einsum([weights, v], output_shape=q.shape)
    return einsum([o, wo], output_shape=x.shape)

from mesh_tensorflow.core import autograph_exempt as _autograph_exempt  # noqa: E402  pylint: disable=g-import-not-at-top
_autograph_exempt.exempt(globals())  # AutoGraph leaves this module's code alone
