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
from typing import List, Optional, Sequence, Tuple, Union

import tensorflow as tf

from mesh_tensorflow.graph import Operation, Tensor
from mesh_tensorflow.mesh_impl import LazyAllreduceSum, int_constant
from mesh_tensorflow.shapes import Dimension, Shape, convert_to_dimension, convert_to_shape

IntOrInts = Union[int, Sequence[int]]
DimLike = Union[Dimension, str, None]

_CONV_FNS = {2: tf.nn.conv2d, 3: tf.nn.conv3d}
_CONV_TRANSPOSE_FNS = {2: tf.nn.conv2d_transpose, 3: tf.nn.conv3d_transpose}
_POOL_FNS = {("max", 2): tf.nn.max_pool2d, ("avg", 2): tf.nn.avg_pool2d,
             ("max", 3): tf.nn.max_pool3d, ("avg", 3): tf.nn.avg_pool3d}


# ---- argument helpers --------------------------------------------------------
def _normalize_padding(padding: str, what: str) -> str:
  p = str(padding).upper()
  if p not in ("SAME", "VALID"):
    raise ValueError(f"{what}: padding must be 'SAME' or 'VALID', got {padding!r}.")
  return p


def _normalize_ints(value: IntOrInts, n: int, what: str) -> Tuple[int, ...]:
  """An int, n ints, or n + 2 ints with 1 at both ends (TF's NHWC form)."""
  if isinstance(value, int):
    out = (value,) * n
  else:
    out = tuple(int(v) for v in value)
    if len(out) == n + 2:
      if out[0] != 1 or out[-1] != 1:
        raise ValueError(
            f"{what}: {list(out)} has {n + 2} entries, so the first and last (batch "
            "and channels) must be 1.")
      out = out[1:-1]
  if len(out) != n or any(v < 1 for v in out):
    raise ValueError(f"{what}: expected {n} positive integers, got {value!r}.")
  return out


def conv_output_size(in_size: int, filter_size: int, stride: int, padding: str) -> int:
  """Spatial output size of a convolution or pooling window, as TensorFlow's.

  Example:
    >>> conv_output_size(8, 3, 2, "SAME"), conv_output_size(8, 3, 2, "VALID")
    (4, 3)
  """
  if padding == "SAME":
    return -(-in_size // stride)
  if in_size < filter_size:
    raise ValueError(
        f"A VALID window of size {filter_size} does not fit in a dimension of size "
        f"{in_size}.")
  return (in_size - filter_size) // stride + 1


def conv_transpose_output_size(in_size: int, filter_size: int, stride: int,
                               padding: str) -> int:
  """Spatial output size of a transposed convolution (the largest-free choice:
  SAME gives in_size * stride, VALID (in_size - 1) * stride + filter_size)."""
  if padding == "SAME":
    return in_size * stride
  return (in_size - 1) * stride + filter_size


def _same_padding(in_size: int, filter_size: int, stride: int) -> Tuple[int, int]:
  """(before, after) zero padding that TensorFlow's SAME adds."""
  out = -(-in_size // stride)
  total = max((out - 1) * stride + filter_size - in_size, 0)
  return total // 2, total - total // 2


def _dim_of(shape: Shape, dim: DimLike, what: str) -> Optional[Dimension]:
  if dim is None:
    return None
  name = dim if isinstance(dim, str) else convert_to_dimension(dim).name
  if name not in shape.dimension_names:
    raise ValueError(f"{what}: {shape} has no dimension {name!r}.")
  return shape.get_dim_by_name(name)


def _spatial_dims(shape: Shape, n: int, exclude: Sequence[str], what: str) -> List[Dimension]:
  """The last n dimensions of `shape` whose names are not in `exclude`."""
  candidates = [d for d in shape.dims if d.name not in set(exclude)]
  if len(candidates) < n:
    raise ValueError(
        f"{what}: {shape} needs {n} spatial dimensions besides {list(exclude)}.")
  return candidates[-n:]


# ---- local (per-slice) computation -------------------------------------------
def _to_canonical(t: tf.Tensor, names: Sequence[str], spatial: Sequence[str],
                  channel: Optional[str], others: Optional[Sequence[str]] = None):
  """Transposes a slice to [others..., spatial..., channel] and flattens the
  others into one batch axis. Without a channel name, appends a size-1 one.
  `others` fixes the order of the remaining dims (default: their own order).

  Returns (tensor, other names, their local sizes).
  """
  names = list(names)
  if others is None:
    others = [n for n in names if n not in spatial and n != channel]
  others = list(others)
  order = others + list(spatial) + ([channel] if channel is not None else [])
  perm = [names.index(n) for n in order]
  if perm != list(range(len(perm))):
    t = tf.transpose(t, int_constant(perm))
  sizes = t.shape.as_list()
  other_sizes = sizes[:len(others)]
  new_shape = [math.prod(other_sizes)] + sizes[len(others):]
  if channel is None:
    new_shape.append(1)
  return tf.reshape(t, int_constant(new_shape)), others, other_sizes


def _from_canonical(t: tf.Tensor, others: Sequence[str], other_sizes: Sequence[int],
                    spatial: Sequence[str], channel: Optional[str],
                    out_names: Sequence[str]) -> tf.Tensor:
  """Inverse of `_to_canonical`, ending in the dimension order `out_names`."""
  sizes = t.shape.as_list()
  body = sizes[1:] if channel is not None else sizes[1:-1]
  t = tf.reshape(t, int_constant(list(other_sizes) + body))
  current = list(others) + list(spatial) + ([channel] if channel is not None else [])
  perm = [current.index(n) for n in out_names]
  if perm != list(range(len(perm))):
    t = tf.transpose(t, int_constant(perm))
  return t


def _lower_local(lowering, op: Operation, gather_names, whole_out_names, fn,
                 flops: int = 0) -> None:
  """Lowers `op` (one output) by running fn on every processor's slices.

  Dimensions in `gather_names` are gathered in the inputs first. In fn's
  result, the output dimensions in `whole_out_names` are whole and the others
  are split as the output's layout says. Input dimensions that are split and
  missing from the output are summed by fn locally; their mesh axes are
  allreduced (lazily where possible).
  """
  impl = lowering.mesh_impl(op)
  gather_names = set(gather_names)
  out = op.outputs[0]
  out_names = set(out.shape.dimension_names)
  slices, reduced_axes = [], set()
  for t in op.inputs:
    names = gather_names & set(t.shape.dimension_names)
    slices.append(impl.gather_dims(lowering.laid_out(t), t.shape, names))
    for d, a in zip(t.shape.dims, impl.tensor_layout(t.shape)):
      if a is not None and d.name not in names and d.name not in out_names:
        reduced_axes.add(a)
  result = impl.slicewise(fn, *slices)
  if flops:
    lowering.add_flops(flops)
  target = impl.tensor_layout(out.shape)
  current = [None if d.name in whole_out_names else a
             for d, a in zip(out.shape.dims, target)]
  sliced_axes = {a for a, c in zip(target, current) if a is not None and c is None}
  if reduced_axes & sliced_axes:
    # A summed axis also splits a dimension computed whole: sum, then split.
    result = impl.allreduce(result, sorted(reduced_axes), "SUM")
    reduced_axes = set()
  result = impl.relayout(result, out.shape, current, target)
  if reduced_axes:
    result = LazyAllreduceSum(impl, result, sorted(reduced_axes))
  lowering.set_tensor_lowering(out, result)


def _local_size(impl, shape: Shape, name: str) -> int:
  layout = impl.tensor_layout(shape)
  i = shape.index_of(name)
  a = layout[i]
  size = shape.dims[i].size
  return size if a is None else size // impl.mesh_axis_size(a)


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

  @property
  def splittable_and_unsplittable_dims(self):
    names = set()
    for t in self.inputs + self.outputs:
      names.update(t.shape.dimension_names)
    unsplittable = set(self._spatial) | set(self._k_names)
    return sorted(names - unsplittable), sorted(unsplittable & names)

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

  def _conv_flops(self, impl, small_shape: Shape) -> int:
    """2 * (local elements of the c2-side image) * filter window * local c1."""
    local = impl.laid_out_size(small_shape)
    for name in self._spatial:
      a = impl.tensor_layout(small_shape)[small_shape.index_of(name)]
      if a is not None:
        local *= impl.mesh_axis_size(a)
    filter_local = _local_size(impl, self._filter_shape, self._c1.name)
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
    dims = []
    for d in x.shape.dims:
      if d.name in self._spatial:
        i = self._spatial.index(d.name)
        dims.append(Dimension(d.name, conv_output_size(
            d.size, self._ksize[i], self._strides[i], self._padding)))
      elif d.name == c1.name:
        dims.append(c2)
      else:
        dims.append(d)
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
    impl = lowering.mesh_impl(self)
    x_names, out_names = x.shape.dimension_names, out.shape.dimension_names
    spatial, c1, c2 = self._spatial, self._c1.name, self._c2.name
    conv_fn, tf_strides, padding = _CONV_FNS[self._n], self._tf_strides(), self._padding

    def fn(tx, tf_filter):
      t, others, sizes = _to_canonical(tx, x_names, spatial, c1)
      y = conv_fn(t, tf_filter, strides=tf_strides, padding=padding)
      return _from_canonical(y, others, sizes, spatial, c2, out_names)
    _lower_local(lowering, self, set(spatial) | set(self._k_names), set(spatial), fn,
                 self._conv_flops(impl, out.shape))


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
    impl = lowering.mesh_impl(self)
    dy_names, out_names = dy.shape.dimension_names, out.shape.dimension_names
    spatial, c1, c2 = self._spatial, self._c1.name, self._c2.name
    out_spatial = [out.shape.get_dim_by_name(s).size for s in spatial]
    transpose_fn = _CONV_TRANSPOSE_FNS[self._n]
    tf_strides, padding = self._tf_strides(), self._padding

    def fn(tdy, tf_filter):
      t, others, sizes = _to_canonical(tdy, dy_names, spatial, c2)
      shape = [t.shape[0]] + out_spatial + [tf_filter.shape[-2]]
      x = transpose_fn(t, tf_filter, int_constant(shape), strides=tf_strides,
                       padding=padding)
      return _from_canonical(x, others, sizes, spatial, c1, out_names)
    _lower_local(lowering, self, set(spatial) | set(self._k_names), set(spatial), fn,
                 self._conv_flops(impl, dy.shape))


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
    impl = lowering.mesh_impl(self)
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
      sizes = list(ksize) + [t.shape[-1], d.shape[-1]]
      k = backprop_fn(input=t, filter_sizes=int_constant(sizes), out_backprop=d,
                      strides=tf_strides, padding=padding)
      current = list(k_names) + [c1, c2]
      perm = [current.index(nm) for nm in out_names]
      return k if perm == list(range(len(perm))) else tf.transpose(k, int_constant(perm))
    _lower_local(lowering, self, set(spatial), set(k_names), fn,
                 self._conv_flops(impl, dy.shape))


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
