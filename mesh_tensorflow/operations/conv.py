"""Convolutions, transposed convolutions, pooling and halo exchange.

Images are tensors over named dimensions. A 2D image has two spatial
dimensions and one channel dimension; every other dimension (batch, and the
"blocks" dimensions of a spatially partitioned image) is a batch-like
dimension. A 2D filter is `[fh, fw, in_channels, out_channels]`; a 3D one is
`[fd, fh, fw, in_channels, out_channels]`.

How each op is laid out:

* batch-like dimensions and out_channels may be split freely;
* a split in_channels dimension is summed locally and then allreduced (lazily,
  as einsum does);
* split spatial (or filter-spatial) dimensions are gathered first, so the
  result is right under any layout, at the price of an allgather;
* to compute on a spatially split image without gathering it, cut each
  spatial dimension into blocks (e.g. `[batch, h_blocks, h, w, channels]`),
  split the blocks dimension, and pass it as `h_blocks_dim`: every block then
  receives the rows its filter window needs from its neighbours
  (`halo_exchange`, which lowers to permutes between neighbouring
  processors), and the convolution itself is local.

    >>> y = mtf.conv2d(x, kernel, strides=(1, 1), padding="SAME")
    >>> y = mtf.conv2d(blocked_x, kernel, (1, 1), "SAME", h_blocks_dim=h_blocks)
    >>> z = mtf.max_pool2d(y, ksize=(2, 2))
"""
from __future__ import annotations

import math
from typing import List, Optional, Sequence, Tuple

import tensorflow as tf

from mesh_tensorflow.core.graph import Operation, Tensor
from mesh_tensorflow.lowering import plans
from mesh_tensorflow.lowering.mesh_impl import int_constant
from mesh_tensorflow.core.shapes import Dimension, Shape, convert_to_shape
from mesh_tensorflow.operations.pooling import (  # noqa: F401  (served here)
    PoolBackpropOperation, PoolOperation, avg_pool2d, avg_pool3d, max_pool2d, max_pool3d)
from mesh_tensorflow.operations.slicing import concat, pad, shift
from mesh_tensorflow.operations.slicing import slice as mtf_slice
from mesh_tensorflow.operations.spatial import (  # noqa: F401  (conv_*_output_size served here)
    _CONV_FNS, _CONV_TRANSPOSE_FNS, DimLike, IntOrInts, _dim_of, _from_canonical, _lower_local,
    _normalize_ints, _normalize_padding, _same_padding, _spatial_dims, _to_canonical,
    conv_output_size, conv_transpose_output_size, windowed_dims)


# ---- convolution operations ---------------------------------------------------
class _ConvBase(Operation):
  """State shared by the three convolution primitives.

  With a filter [k_1..k_n, c1, c2] and an image x over c1, the convolution
  maps x to an image over c2 (`ConvOperation`). Its adjoints map an image over
  c2 back to one over c1 (`ConvBackpropInputOperation`, also the transposed
  convolution) and a pair of images to a filter (`ConvBackpropFilterOperation`).
  Each primitive's gradient is built from the other two.
  """

  has_gradient = True

  def _setup(self, n: int, strides, padding, spatial: Sequence[str], filter_shape: Shape):
    self._n = n
    self._strides = _normalize_ints(strides, n, f"{type(self).__name__} strides")
    self._padding = _normalize_padding(padding, type(self).__name__)
    self._spatial = list(spatial)
    self._filter_shape = filter_shape
    self._k_names = [d.name for d in filter_shape.dims[:n]]
    self._c1 = filter_shape.dims[n]
    self._c2 = filter_shape.dims[n + 1]
    self._ksize = [d.size for d in filter_shape.dims[:n]]

  @property
  def strides(self) -> Tuple[int, ...]:
    return self._strides

  @property
  def padding(self) -> str:
    return self._padding

  @property
  def spatial_dim_names(self) -> List[str]:
    return list(self._spatial)

  def _unsplittable_dim_names(self):
    return set(self._spatial) | set(self._k_names)

  def _tf_strides(self) -> List[int]:
    return [1] + list(self._strides) + [1]

  def _check_spatial(self, big: Shape, small: Shape, what: str) -> None:
    """Checks conv(big spatial sizes) == small spatial sizes."""
    for name, k, s in zip(self._spatial, self._ksize, self._strides):
      n_big = big.get_dim_by_name(name).size
      n_small = small.get_dim_by_name(name).size
      if conv_output_size(n_big, k, s, self._padding) != n_small:
        raise ValueError(
            f"{what}: spatial dimension {name!r} has size {n_big} on the input side "
            f"and {n_small} on the output side, which a {self._padding} window of "
            f"{k} with stride {s} does not give.")

  def _conv_flops(self, mesh, small_shape: Shape) -> int:
    """2 * (local elements of the c2-side image) * filter window * local c1."""
    layout = mesh.layout_of(small_shape)
    local = plans.slice_elements(small_shape, layout, mesh.sizes)
    for name in self._spatial:
      a = layout[small_shape.index_of(name)]
      if a is not None:
        local *= mesh.sizes[a]
    c1 = self._filter_shape.index_of(self._c1.name)
    a = mesh.layout_of(self._filter_shape)[c1]
    filter_local = self._c1.size // (1 if a is None else mesh.sizes[a])
    return 2 * local * math.prod(self._ksize) * filter_local

  def _args(self):
    return (self._strides, self._padding, self._spatial)


class ConvOperation(_ConvBase):
  """N-d convolution (N = 2 or 3) of an image with a filter [k..., c1, c2].

  The output is x with its spatial dimensions resized (same names) and c1
  replaced by c2 (in place). Build with `conv2d` / `conv3d`.
  """

  def __init__(self, x: Tensor, conv_filter: Tensor, strides, padding,
               spatial_dim_names: Sequence[str], name=None):
    n = len(spatial_dim_names)
    what = f"mtf.conv{n}d"
    _check_filter(conv_filter, n, what)
    c1, c2 = conv_filter.shape.dims[n], conv_filter.shape.dims[n + 1]
    _check_channel(x, c1, what, conv_filter)
    if c2.name in x.shape.dimension_names:
      raise ValueError(
          f"{what}: the filter's output channel dimension {c2.name!r} is already a "
          f"dimension of the input {x.shape}; give it another name.")
    super().__init__([x, conv_filter], name=name or f"conv{n}d")
    self._setup(n, strides, padding, spatial_dim_names, conv_filter.shape)
    dims = [c2 if d.name == c1.name else d for d in
            windowed_dims(x.shape, self._spatial, self._ksize, self._strides, self._padding)]
    self.has_gradient = x.dtype.is_floating
    self._outputs = [Tensor(self, Shape(dims), x.dtype)]

  def gradient(self, grad_ys):
    x, f = self.inputs
    dy = grad_ys[0]
    return [ConvBackpropInputOperation(dy, f, x.shape, *self._args()).outputs[0],
            ConvBackpropFilterOperation(x, dy, f.shape, *self._args()).outputs[0]]

  def lower(self, lowering):
    x, f = self.inputs
    out = self.outputs[0]
    x_names, out_names = x.shape.dimension_names, out.shape.dimension_names
    spatial, c1, c2 = self._spatial, self._c1.name, self._c2.name
    conv_fn, tf_strides, padding = _CONV_FNS[self._n], self._tf_strides(), self._padding

    def fn(tx, tf_filter):
      t, others, sizes = _to_canonical(tx, x_names, spatial, c1)
      y = conv_fn(t, tf_filter, strides=tf_strides, padding=padding)
      return _from_canonical(y, others, sizes, spatial, c2, out_names)
    _lower_local(lowering, self, fn)

  def plan(self, mesh):
    return plans.plan_local(self, mesh.layout_of, set(self._spatial) | set(self._k_names),
                            set(self._spatial), self._conv_flops(mesh, self.outputs[0].shape))


class ConvBackpropInputOperation(_ConvBase):
  """Adjoint of `ConvOperation` in its image: maps dy (over c2) and a filter
  [k..., c1, c2] to an image of `input_shape` (over c1).

  This is also the transposed convolution (`conv2d_transpose`).
  """

  def __init__(self, dy: Tensor, conv_filter: Tensor, input_shape, strides, padding,
               spatial_dim_names: Sequence[str], name=None):
    n = len(spatial_dim_names)
    input_shape = convert_to_shape(input_shape)
    what = f"conv{n}d_backprop_input"
    _check_filter(conv_filter, n, what)
    c1, c2 = conv_filter.shape.dims[n], conv_filter.shape.dims[n + 1]
    _check_channel(dy, c2, what, conv_filter)
    if c1 not in input_shape.dims:
      raise ValueError(
          f"{what}: the result shape {input_shape} lacks the filter's channel "
          f"dimension {c1}.")
    dy_others = {d for d in dy.shape.dims if d.name not in spatial_dim_names and d != c2}
    in_others = {d for d in input_shape.dims
                 if d.name not in spatial_dim_names and d != c1}
    if dy_others != in_others:
      raise ValueError(
          f"{what}: the batch-like dimensions of {dy.name} {dy.shape} and of the "
          f"result {input_shape} differ.")
    super().__init__([dy, conv_filter], name=name or what)
    self._setup(n, strides, padding, spatial_dim_names, conv_filter.shape)
    self._check_spatial(input_shape, dy.shape, what)
    self.has_gradient = dy.dtype.is_floating
    self._outputs = [Tensor(self, input_shape, dy.dtype)]

  def gradient(self, grad_ys):
    dy, f = self.inputs
    g = grad_ys[0]
    return [ConvOperation(g, f, *self._args()).outputs[0],
            ConvBackpropFilterOperation(g, dy, f.shape, *self._args()).outputs[0]]

  def lower(self, lowering):
    dy, f = self.inputs
    out = self.outputs[0]
    dy_names, out_names = dy.shape.dimension_names, out.shape.dimension_names
    spatial, c1, c2 = self._spatial, self._c1.name, self._c2.name
    out_spatial = [out.shape.get_dim_by_name(s).size for s in spatial]
    transpose_fn = _CONV_TRANSPOSE_FNS[self._n]
    tf_strides, padding = self._tf_strides(), self._padding

    def fn(tdy, tf_filter):
      t, others, sizes = _to_canonical(tdy, dy_names, spatial, c2)
      shape = [t.shape.as_list()[0]] + out_spatial + [tf_filter.shape.as_list()[-2]]
      x = transpose_fn(t, tf_filter, int_constant(shape), strides=tf_strides,
                       padding=padding)
      return _from_canonical(x, others, sizes, spatial, c1, out_names)
    _lower_local(lowering, self, fn)

  def plan(self, mesh):
    return plans.plan_local(self, mesh.layout_of, set(self._spatial) | set(self._k_names),
                            set(self._spatial), self._conv_flops(mesh, self.inputs[0].shape))


class ConvBackpropFilterOperation(_ConvBase):
  """Adjoint of `ConvOperation` in its filter: maps an image x (over c1) and
  dy (over c2) to a filter of `filter_shape` [k..., c1, c2], summing over the
  batch-like and spatial dimensions."""

  def __init__(self, x: Tensor, dy: Tensor, filter_shape, strides, padding,
               spatial_dim_names: Sequence[str], name=None):
    n = len(spatial_dim_names)
    filter_shape = convert_to_shape(filter_shape)
    what = f"conv{n}d_backprop_filter"
    if filter_shape.ndims != n + 2:
      raise ValueError(f"{what}: filter shape {filter_shape} must have {n + 2} dimensions.")
    c1, c2 = filter_shape.dims[n], filter_shape.dims[n + 1]
    if c1 not in x.shape.dims or c2 not in dy.shape.dims:
      raise ValueError(
          f"{what}: {x.name} {x.shape} must have {c1} and {dy.name} {dy.shape} must "
          f"have {c2}.")
    x_others = {d for d in x.shape.dims if d.name not in spatial_dim_names and d != c1}
    dy_others = {d for d in dy.shape.dims if d.name not in spatial_dim_names and d != c2}
    if x_others != dy_others:
      raise ValueError(
          f"{what}: the batch-like dimensions of {x.name} {x.shape} and {dy.name} "
          f"{dy.shape} differ.")
    super().__init__([x, dy], name=name or what)
    self._setup(n, strides, padding, spatial_dim_names, filter_shape)
    self._check_spatial(x.shape, dy.shape, what)
    self.has_gradient = x.dtype.is_floating
    self._outputs = [Tensor(self, filter_shape, x.dtype)]

  def gradient(self, grad_ys):
    x, dy = self.inputs
    g = grad_ys[0]
    return [ConvBackpropInputOperation(dy, g, x.shape, *self._args()).outputs[0],
            ConvOperation(x, g, *self._args()).outputs[0]]

  def lower(self, lowering):
    x, dy = self.inputs
    out = self.outputs[0]
    x_names, dy_names = x.shape.dimension_names, dy.shape.dimension_names
    spatial, c1, c2 = self._spatial, self._c1.name, self._c2.name
    k_names, ksize = self._k_names, self._ksize
    out_names = out.shape.dimension_names
    tf_strides, padding = self._tf_strides(), self._padding
    backprop_fn = (tf.raw_ops.Conv2DBackpropFilter if self._n == 2
                   else tf.raw_ops.Conv3DBackpropFilterV2)

    def fn(tx, tdy):
      t, x_others, _ = _to_canonical(tx, x_names, spatial, c1)
      d, _, _ = _to_canonical(tdy, dy_names, spatial, c2, others=x_others)
      sizes = list(ksize) + [t.shape.as_list()[-1], d.shape.as_list()[-1]]
      k = backprop_fn(input=t, filter_sizes=int_constant(sizes), out_backprop=d,
                      strides=tf_strides, padding=padding)
      current = list(k_names) + [c1, c2]
      perm = [current.index(nm) for nm in out_names]
      return k if perm == list(range(len(perm))) else tf.transpose(k, int_constant(perm))
    _lower_local(lowering, self, fn)

  def plan(self, mesh):
    return plans.plan_local(self, mesh.layout_of, set(self._spatial), set(self._k_names),
                            self._conv_flops(mesh, self.inputs[1].shape))


def _check_filter(conv_filter: Tensor, n: int, what: str) -> None:
  if not isinstance(conv_filter, Tensor) or conv_filter.shape.ndims != n + 2:
    raise ValueError(
        f"{what}: the filter must be an mtf.Tensor with {n + 2} dimensions "
        f"[{'fd, ' if n == 3 else ''}fh, fw, in_channels, out_channels], got "
        f"{getattr(conv_filter, 'shape', conv_filter)}.")


def _check_channel(x: Tensor, channel: Dimension, what: str, conv_filter: Tensor) -> None:
  if channel not in x.shape.dims:
    raise ValueError(
        f"{what}: the filter {conv_filter.name} {conv_filter.shape} convolves channel "
        f"dimension {channel}, which {x.name} {x.shape} does not have.")


# ---- halo exchange --------------------------------------------------------------
def _halo_exchange(x: Tensor, blocks_dim: Dimension, block_size_dim: Dimension,
                   before: int, after: int, wrap: bool) -> Tensor:
  """Prepends the last `before` rows of the preceding blocks and appends the
  first `after` rows of the following ones, along block_size_dim."""
  size = block_size_dim.size
  # Halos longer than a block come from blocks further away: shift by one
  # block at a time (each a permute between neighbours), slicing only the
  # partial block at the end so that no more than the halo travels there.
  left, right = [], []
  for sign, amount, out in ((1, before, left), (-1, after, right)):
    current, remaining = x, amount
    while remaining > 0:
      take = min(size, remaining)
      if take < size:
        begin = size - take if sign > 0 else 0
        current = mtf_slice(current, begin, take, block_size_dim.name)
      current = shift(current, sign, blocks_dim.name, wrap)
      out.append(current)
      remaining -= take
  left.reverse()
  if not left and not right:
    return x
  return concat(left + [x] + right, block_size_dim.name)


def halo_exchange(x: Tensor, blocks_dim: DimLike, block_size_dim: DimLike, halo_size: int,
                  wrap: bool = False) -> Tensor:
  """Pads every block with `halo_size` elements of its neighbouring blocks.

  `x` holds a long dimension cut into blocks: global position
  `b * block_size + i` is at `[blocks_dim=b, block_size_dim=i]`. The result
  has block_size_dim grown by `2 * halo_size`: each block is preceded by the
  last `halo_size` elements before it and followed by the first `halo_size`
  elements after it (zeros past the ends, or the other end's with `wrap`).
  With blocks_dim split over a mesh dimension, this lowers to permutes between
  neighbouring processors; halos longer than a block reach further blocks.

  Args:
    x: an mtf.Tensor with both dimensions.
    blocks_dim: the dimension (or its name) numbering the blocks.
    block_size_dim: the dimension (or its name) within a block.
    halo_size: number of elements taken from each side (>= 0).
    wrap: whether the first and last blocks are neighbours.

  Returns:
    An mtf.Tensor like x with block_size_dim of size block_size + 2 * halo_size.

  Example:
    >>> # x: [batch, h_blocks:4, h:8, w, channels], h_blocks split over a mesh.
    >>> padded = mtf.halo_exchange(x, "h_blocks", "h", 1)   # h is now 10
  """
  if halo_size < 0:
    raise ValueError(f"mtf.halo_exchange: halo_size must be >= 0, got {halo_size}.")
  blocks = _dim_of(x.shape, blocks_dim, "mtf.halo_exchange")
  block = _dim_of(x.shape, block_size_dim, "mtf.halo_exchange")
  return _halo_exchange(x, blocks, block, int(halo_size), int(halo_size), bool(wrap))


# ---- convolution functions -------------------------------------------------------
def _conv(n: int, x: Tensor, conv_filter: Tensor, strides, padding,
          blocks_dims: Sequence[DimLike], name) -> Tensor:
  what = f"mtf.conv{n}d"
  _check_filter(conv_filter, n, what)
  strides = _normalize_ints(strides, n, f"{what} strides")
  padding = _normalize_padding(padding, what)
  c1 = conv_filter.shape.dims[n]
  _check_channel(x, c1, what, conv_filter)
  blocks = [_dim_of(x.shape, b, what) for b in blocks_dims]
  spatial = _spatial_dims(x.shape, n, [c1.name] + [b.name for b in blocks if b is not None],
                          what)
  if any(b is not None for b in blocks):
    if padding != "SAME":
      raise ValueError(
          f"{what}: convolution over blocks needs padding='SAME' (each block then "
          "gives its own part of the output); got 'VALID'.")
    for i, (b, sd) in enumerate(zip(blocks, spatial)):
      k, s = conv_filter.shape.dims[i].size, strides[i]
      before, after = _same_padding(sd.size, k, s)
      if b is None:
        if before or after:
          x = pad(x, [before, after], sd.name)
        continue
      if sd.size % s:
        raise ValueError(
            f"{what}: the block size {sd.size} of {sd.name!r} must be a multiple of "
            f"its stride {s}.")
      x = _halo_exchange(x, b, sd, before, after, wrap=False)
    padding = "VALID"
  return ConvOperation(x, conv_filter, strides, padding, [d.name for d in spatial],
                       name=name).outputs[0]


def conv2d(x: Tensor, conv_filter: Tensor, strides: IntOrInts = (1, 1),
           padding: str = "SAME", h_blocks_dim: DimLike = None,
           w_blocks_dim: DimLike = None, name: Optional[str] = None) -> Tensor:
  """2D convolution, like tf.nn.conv2d, over named dimensions.

  The filter is `[fh, fw, in_channels, out_channels]`; `x` must have the
  filter's in_channels dimension. The spatial dimensions are the last two
  other dimensions of x (blocks dimensions excluded), so both
  `[batch, h, w, channels]` and `[batch, channels, h, w]` work. The output is
  x with h and w resized (names kept) and in_channels replaced by
  out_channels.

  Spatial partitioning: give `h_blocks_dim` (and/or `w_blocks_dim`), a
  dimension of x that numbers blocks of the image along h (w); the image row
  is then `h_blocks * h.size + h`. Each block gets the rows its filter window
  needs from its neighbours (`halo_exchange`) and is convolved locally, so
  the result equals the SAME convolution of the whole image, block by block.
  Needs padding "SAME" and block sizes divisible by the strides.

  Args:
    x: the input image.
    conv_filter: the filter [fh, fw, in_channels, out_channels].
    strides: an int, (stride_h, stride_w), or [1, stride_h, stride_w, 1].
    padding: "SAME" or "VALID".
    h_blocks_dim: optional blocks dimension (or name) of x along h.
    w_blocks_dim: optional blocks dimension (or name) of x along w.
    name: optional op name.

  Returns:
    The output image, an mtf.Tensor.

  Example:
    >>> kernel = mtf.get_variable(mesh, "k", [fh, fw, channels, filters])
    >>> y = mtf.conv2d(x, kernel, strides=(1, 1), padding="SAME")
  """
  return _conv(2, x, conv_filter, strides, padding, [h_blocks_dim, w_blocks_dim], name)


def conv3d(x: Tensor, conv_filter: Tensor, strides: IntOrInts = (1, 1, 1),
           padding: str = "SAME", d_blocks_dim: DimLike = None,
           h_blocks_dim: DimLike = None, w_blocks_dim: DimLike = None,
           name: Optional[str] = None) -> Tensor:
  """3D convolution, like tf.nn.conv3d, over named dimensions.

  As `conv2d`, with a filter `[fd, fh, fw, in_channels, out_channels]`, three
  spatial dimensions (the last three of x other than in_channels and blocks
  dimensions) and optional blocks dimensions for each of them.

  Example:
    >>> kernel = mtf.get_variable(mesh, "k", [fd, fh, fw, channels, filters])
    >>> y = mtf.conv3d(x, kernel, strides=(1, 1, 1), padding="SAME")
  """
  return _conv(3, x, conv_filter, strides, padding,
               [d_blocks_dim, h_blocks_dim, w_blocks_dim], name)


def conv2d_with_blocks(conv_input: Tensor, conv_filter: Tensor, strides: IntOrInts,
                       padding: str, h_blocks_dim: DimLike = None,
                       w_blocks_dim: DimLike = None, name: Optional[str] = None) -> Tensor:
  """`conv2d` over blocks (the original op's name and argument order).

  Example:
    >>> y = mtf.conv2d_with_blocks(x, kernel, (1, 1), "SAME", h_blocks_dim=hb)
  """
  return conv2d(conv_input, conv_filter, strides, padding, h_blocks_dim, w_blocks_dim,
                name)


def conv3d_with_blocks(conv_input: Tensor, conv_filter: Tensor, strides: IntOrInts,
                       padding: str, d_blocks_dim: DimLike = None,
                       h_blocks_dim: DimLike = None, name: Optional[str] = None,
                       w_blocks_dim: DimLike = None) -> Tensor:
  """`conv3d` over blocks (the original op's name and argument order;
  `w_blocks_dim` comes last).

  Example:
    >>> y = mtf.conv3d_with_blocks(x, kernel, (1, 1, 1), "SAME", d_blocks_dim=db)
  """
  return conv3d(conv_input, conv_filter, strides, padding, d_blocks_dim, h_blocks_dim,
                w_blocks_dim, name)


def _backprop_input(n, input_shape, conv_filter, dy, strides, padding, name):
  what = f"mtf.conv{n}d_backprop_input"
  _check_filter(conv_filter, n, what)
  input_shape = convert_to_shape(input_shape)
  spatial = _spatial_dims(input_shape, n, [conv_filter.shape.dims[n].name], what)
  return ConvBackpropInputOperation(dy, conv_filter, input_shape, strides, padding,
                                    [d.name for d in spatial], name=name).outputs[0]


def _backprop_filter(n, conv_input, filter_shape, dy, strides, padding, name):
  what = f"mtf.conv{n}d_backprop_filter"
  filter_shape = convert_to_shape(filter_shape)
  if filter_shape.ndims != n + 2:
    raise ValueError(f"{what}: filter shape {filter_shape} must have {n + 2} dimensions.")
  spatial = _spatial_dims(conv_input.shape, n, [filter_shape.dims[n].name], what)
  return ConvBackpropFilterOperation(conv_input, dy, filter_shape, strides, padding,
                                     [d.name for d in spatial], name=name).outputs[0]


def conv2d_backprop_input(input_shape, conv_filter: Tensor, dy: Tensor, strides: IntOrInts,
                          padding: str, name: Optional[str] = None) -> Tensor:
  """Gradient of `conv2d` with respect to its input, given the output's `dy`.

  Example:
    >>> dx = mtf.conv2d_backprop_input(x.shape, kernel, dy, (1, 1), "SAME")
  """
  return _backprop_input(2, input_shape, conv_filter, dy, strides, padding, name)


def conv2d_backprop_filter(conv_input: Tensor, filter_shape, dy: Tensor, strides: IntOrInts,
                           padding: str, name: Optional[str] = None) -> Tensor:
  """Gradient of `conv2d` with respect to its filter, given the output's `dy`.

  Example:
    >>> dk = mtf.conv2d_backprop_filter(x, kernel.shape, dy, (1, 1), "SAME")
  """
  return _backprop_filter(2, conv_input, filter_shape, dy, strides, padding, name)


def conv3d_backprop_input(input_shape, conv_filter: Tensor, dy: Tensor, strides: IntOrInts,
                          padding: str, name: Optional[str] = None) -> Tensor:
  """Gradient of `conv3d` with respect to its input, given the output's `dy`.

  Example:
    >>> dx = mtf.conv3d_backprop_input(x.shape, kernel, dy, (1, 1, 1), "SAME")
  """
  return _backprop_input(3, input_shape, conv_filter, dy, strides, padding, name)


def conv3d_backprop_filter(conv_input: Tensor, filter_shape, dy: Tensor, strides: IntOrInts,
                           padding: str, name: Optional[str] = None) -> Tensor:
  """Gradient of `conv3d` with respect to its filter, given the output's `dy`.

  Example:
    >>> dk = mtf.conv3d_backprop_filter(x, kernel.shape, dy, (1, 1, 1), "SAME")
  """
  return _backprop_filter(3, conv_input, filter_shape, dy, strides, padding, name)


def _conv_transpose(n, x, conv_filter, strides, padding, name):
  out_shape, strides, padding, names = conv_transpose_setup(n, x, conv_filter, strides, padding)
  return ConvBackpropInputOperation(x, conv_filter, out_shape, strides, padding, names,
                                    name=name or f"conv{n}d_transpose").outputs[0]


def conv_transpose_setup(n, x, conv_filter, strides, padding):
  """(output shape, strides, padding, spatial names) of an n-D transposed
  convolution of x by conv_filter [f..., out_channels, in_channels], checked."""
  what = f"mtf.conv{n}d_transpose"
  _check_filter(conv_filter, n, what)
  strides = _normalize_ints(strides, n, f"{what} strides")
  padding = _normalize_padding(padding, what)
  c_out, c_in = conv_filter.shape.dims[n], conv_filter.shape.dims[n + 1]
  _check_channel(x, c_in, what, conv_filter)
  spatial = _spatial_dims(x.shape, n, [c_in.name], what)
  names = [d.name for d in spatial]
  dims = []
  for d in x.shape.dims:
    if d.name in names:
      i = names.index(d.name)
      dims.append(Dimension(d.name, conv_transpose_output_size(
          d.size, conv_filter.shape.dims[i].size, strides[i], padding)))
    elif d == c_in:
      dims.append(c_out)
    else:
      dims.append(d)
  return Shape(dims), strides, padding, names


def conv2d_transpose(x: Tensor, conv_filter: Tensor, strides: IntOrInts = (2, 2),
                     padding: str = "SAME", name: Optional[str] = None) -> Tensor:
  """2D transposed convolution, like tf.nn.conv2d_transpose.

  The filter is `[fh, fw, out_channels, in_channels]` (TensorFlow's order for
  transposed convolutions); x must have its in_channels dimension. Spatial
  sizes grow to `size * stride` (SAME) or `(size - 1) * stride + f` (VALID).
  Split in_channels is summed and allreduced; spatial splits are gathered.

  Args:
    x: the input image.
    conv_filter: the filter [fh, fw, out_channels, in_channels].
    strides: an int, (stride_h, stride_w), or [1, stride_h, stride_w, 1].
    padding: "SAME" or "VALID".
    name: optional op name.

  Returns:
    The output image, an mtf.Tensor.

  Example:
    >>> kernel = mtf.get_variable(mesh, "k", [fh, fw, filters, channels])
    >>> up = mtf.conv2d_transpose(x, kernel, strides=(2, 2), padding="SAME")
  """
  return _conv_transpose(2, x, conv_filter, strides, padding, name)


def conv3d_transpose(x: Tensor, conv_filter: Tensor, strides: IntOrInts = (2, 2, 2),
                     padding: str = "SAME", name: Optional[str] = None) -> Tensor:
  """3D transposed convolution, like tf.nn.conv3d_transpose (see
  `conv2d_transpose`); the filter is [fd, fh, fw, out_channels, in_channels].

  Example:
    >>> up = mtf.conv3d_transpose(x, kernel, strides=(2, 2, 2), padding="SAME")
  """
  return _conv_transpose(3, x, conv_filter, strides, padding, name)


def _transpose_backprop_input(n, input_shape, conv_filter, dy, strides, padding, name):
  what = f"mtf.conv{n}d_transpose_backprop_input"
  _check_filter(conv_filter, n, what)
  spatial = _spatial_dims(dy.shape, n, [conv_filter.shape.dims[n].name], what)
  out = ConvOperation(dy, conv_filter, strides, padding, [d.name for d in spatial],
                      name=name or f"conv{n}d_transpose_backprop_input").outputs[0]
  if out.shape != convert_to_shape(input_shape):
    raise ValueError(f"{what}: the gradient has shape {out.shape}, not {input_shape}.")
  return out


def _transpose_backprop_filter(n, conv_input, filter_shape, dy, strides, padding, name):
  what = f"mtf.conv{n}d_transpose_backprop_filter"
  filter_shape = convert_to_shape(filter_shape)
  if filter_shape.ndims != n + 2:
    raise ValueError(f"{what}: filter shape {filter_shape} must have {n + 2} dimensions.")
  spatial = _spatial_dims(dy.shape, n, [filter_shape.dims[n].name], what)
  return ConvBackpropFilterOperation(
      dy, conv_input, filter_shape, strides, padding, [d.name for d in spatial],
      name=name or f"conv{n}d_transpose_backprop_filter").outputs[0]


def conv2d_transpose_backprop_input(input_shape, conv_filter: Tensor, dy: Tensor,
                                    strides: IntOrInts, padding: str,
                                    name: Optional[str] = None) -> Tensor:
  """Gradient of `conv2d_transpose` with respect to its input (a conv2d).

  Example:
    >>> dx = mtf.conv2d_transpose_backprop_input(x.shape, kernel, dy, (2, 2), "SAME")
  """
  return _transpose_backprop_input(2, input_shape, conv_filter, dy, strides, padding, name)


def conv2d_transpose_backprop_filter(conv_input: Tensor, filter_shape, dy: Tensor,
                                     strides: IntOrInts, padding: str,
                                     name: Optional[str] = None) -> Tensor:
  """Gradient of `conv2d_transpose` with respect to its filter.

  Example:
    >>> dk = mtf.conv2d_transpose_backprop_filter(x, kernel.shape, dy, (2, 2), "SAME")
  """
  return _transpose_backprop_filter(2, conv_input, filter_shape, dy, strides, padding, name)


def conv3d_transpose_backprop_input(input_shape, conv_filter: Tensor, dy: Tensor,
                                    strides: IntOrInts, padding: str,
                                    name: Optional[str] = None) -> Tensor:
  """Gradient of `conv3d_transpose` with respect to its input (a conv3d).

  Example:
    >>> dx = mtf.conv3d_transpose_backprop_input(x.shape, k, dy, (2, 2, 2), "SAME")
  """
  return _transpose_backprop_input(3, input_shape, conv_filter, dy, strides, padding, name)


def conv3d_transpose_backprop_filter(conv_input: Tensor, filter_shape, dy: Tensor,
                                     strides: IntOrInts, padding: str,
                                     name: Optional[str] = None) -> Tensor:
  """Gradient of `conv3d_transpose` with respect to its filter.

  Example:
    >>> dk = mtf.conv3d_transpose_backprop_filter(x, k.shape, dy, (2, 2, 2), "SAME")
  """
  return _transpose_backprop_filter(3, conv_input, filter_shape, dy, strides, padding, name)

from mesh_tensorflow.core import autograph_exempt as _autograph_exempt  # noqa: E402  pylint: disable=g-import-not-at-top
_autograph_exempt.exempt(globals())  # AutoGraph leaves this module's code alone
