"""Convolution and pooling layers: each creates its filter variable and calls
the ops of `mesh_tensorflow.operations.conv`.

The filter of a layer is the variable `<name>/kernel`, with dimensions
`fh`, `fw` (and `fd`) for the window, the input's channel dimension (its last
dimension) and `output_dim`. Without a name, a layer takes its default name
("conv2d", "conv2d_1", ...) in order of creation, so building the same model
again (e.g. in another traced function) finds the same variables.

    >>> h = mtf.layers.conv2d(images, mtf.Dimension("filters", 32))
    >>> h = mtf.layers.conv2d_with_blocks(blocked, filters, h_blocks_dim=h_blocks)
    >>> up = mtf.layers.conv2d_transpose_with_blocks(h, filters, h_blocks_dim=h_blocks)
    >>> p = mtf.layers.max_pool2d(h, ksize=(2, 2))
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence, Union

import tensorflow as tf

from mesh_tensorflow.layers import initializers
from mesh_tensorflow.core.graph import Tensor
from mesh_tensorflow.layers.core import layer_scope
from mesh_tensorflow.operations import conv as conv_ops
from mesh_tensorflow.operations.shape_ops import reshape
from mesh_tensorflow.operations.slicing import mtf_slice, pad
from mesh_tensorflow.operations.variables import VariableDType, get_variable
from mesh_tensorflow.core.shapes import Dimension, Shape, convert_to_dimension

IntOrInts = Union[int, Sequence[int]]

__all__ = [
    "avg_pool2d", "avg_pool3d", "conv1d", "conv2d", "conv2d_transpose",
    "conv2d_transpose_with_blocks", "conv2d_with_blocks", "conv3d", "conv3d_transpose",
    "conv3d_transpose_with_blocks", "conv3d_with_blocks",
    "max_pool2d", "max_pool3d", "separable_conv1d",
]


def _layer_scope(x: Tensor, name: Optional[str], default_name: str):
  """The layer's variable scope, named as every mtf.layers layer is."""
  return layer_scope(x.mesh, name, default_name)


def _kernel(x: Tensor, dims, filter_initializer, variable_dtype) -> Tensor:
  if variable_dtype is None:
    variable_dtype = VariableDType(tf.float32, activation_dtype=x.dtype)
  return get_variable(x.mesh, "kernel", dims, initializer=filter_initializer,
                      dtype=variable_dtype)


def _distinct_channels(x: Tensor, output_dim: Dimension) -> Tensor:
  """x, its channel dimension renamed to "_<name>" when the output channels
  have its name (a kernel cannot have two dimensions of one name)."""
  channels = x.shape.dims[-1]
  if channels.name != output_dim.name:
    return x
  from mesh_tensorflow.operations.shape_ops import rename_dimension
  return rename_dimension(x, channels.name, "_" + channels.name)


def _window_dims(sizes: Sequence[int], names: Sequence[str]):
  return [Dimension(n, int(s)) for n, s in zip(names, sizes)]


def _as_tuple(value: IntOrInts, n: int, what: str):
  if isinstance(value, int):
    return (value,) * n
  value = tuple(int(v) for v in value)
  if len(value) != n:
    raise ValueError(f"{what}: expected {n} integers, got {value!r}.")
  return value


def _conv_layer(x: Tensor, output_dim: Dimension, filter_size: IntOrInts,
                window_names: Sequence[str], transposed: bool, filter_initializer,
                variable_dtype: Optional[VariableDType], name: Optional[str],
                default_name: str, what: str,
                apply: Callable[[Tensor, Tensor], Tensor]) -> Tensor:
  """`apply(x, kernel)` in the layer's scope, with its kernel variable.

  Args:
    x, output_dim, filter_initializer, variable_dtype, name: the layer's.
    filter_size: one int, or one per name in `window_names`.
    window_names: the kernel's window dimensions, e.g. ["fh", "fw"].
    transposed: the kernel ends [output_dim, in_channels] (TensorFlow's order
      for transposed filters) instead of [in_channels, output_dim].
    default_name: the layer's scope name when `name` is None.
    what: the layer, as its errors name it.
    apply: the convolution of x (channels renamed if output_dim has their
      name) with the kernel.

  Returns:
    What `apply` returns.
  """
  filter_size = _as_tuple(filter_size, len(window_names), f"{what} filter_size")
  output_dim = convert_to_dimension(output_dim)
  x = _distinct_channels(x, output_dim)
  with _layer_scope(x, name, default_name):
    channels = [output_dim, x.shape[-1]] if transposed else [x.shape[-1], output_dim]
    kernel = _kernel(x, _window_dims(filter_size, window_names) + channels,
                     filter_initializer, variable_dtype)
    return apply(x, kernel)


def conv2d(x: Tensor, output_dim: Dimension, filter_size: IntOrInts = (3, 3),
           strides: IntOrInts = (1, 1), padding: str = "SAME", filter_initializer=None,
           variable_dtype: Optional[VariableDType] = None,
           name: Optional[str] = None) -> Tensor:
  """2D convolution layer over x [..., h, w, in_channels].

  Creates the variable `<name>/kernel` [fh, fw, in_channels, output_dim]
  (in_channels is x's last dimension) and returns `mtf.conv2d(x, kernel)`.

  Args:
    x: the input image; its last dimension is the input channels.
    output_dim: the output channel dimension.
    filter_size: (filter_height, filter_width), or an int for both.
    strides: (stride_height, stride_width), or an int for both.
    padding: "SAME" or "VALID".
    filter_initializer: initializer of the kernel (default: layout-invariant
      Glorot uniform).
    variable_dtype: an mtf.VariableDType (default: float32 master, x's dtype
      for the activations).
    name: the layer's name (default "conv2d", made unique).

  Returns:
    An mtf.Tensor [..., h', w', output_dim].

  Example:
    >>> y = mtf.layers.conv2d(x, mtf.Dimension("filters", 32), filter_size=(3, 3))
  """
  return conv2d_with_blocks(x, output_dim, filter_size, strides, padding, None, None,
                            filter_initializer, variable_dtype, name)


def conv2d_with_blocks(x: Tensor, output_dim: Dimension, filter_size: IntOrInts = (3, 3),
                       strides: IntOrInts = (1, 1), padding: str = "SAME",
                       h_blocks_dim=None, w_blocks_dim=None, filter_initializer=None,
                       variable_dtype: Optional[VariableDType] = None,
                       name: Optional[str] = None) -> Tensor:
  """2D convolution layer over an image cut into blocks (spatial partitioning).

  x is e.g. [batch, h_blocks, h, w_blocks, w, in_channels] (or
  [batch, h_blocks, w_blocks, h, w, in_channels]): image row
  `h_blocks * h.size + h`, column `w_blocks * w.size + w`. Splitting the
  blocks dimensions over the mesh splits the image; each block receives from
  its neighbours the halo its filter window needs (`mtf.halo_exchange`), and
  the result equals a SAME convolution of the whole image. Needs padding
  "SAME" and block sizes divisible by the strides. Without blocks dimensions
  this is `conv2d`; the kernel variable is the same (`conv2d/kernel` by
  default), so a model can switch between the two.

  Args:
    x: the input image; its last dimension is the input channels.
    output_dim: the output channel dimension.
    filter_size: (filter_height, filter_width), or an int for both.
    strides: (stride_height, stride_width), or an int for both.
    padding: "SAME" (required with blocks) or "VALID".
    h_blocks_dim: optional dimension of x numbering blocks along h.
    w_blocks_dim: optional dimension of x numbering blocks along w.
    filter_initializer: initializer of the kernel.
    variable_dtype: an mtf.VariableDType.
    name: the layer's name (default "conv2d", made unique).

  Returns:
    An mtf.Tensor like x with per-block spatial sizes divided by the strides
    and in_channels replaced by output_dim.

  Example:
    >>> h_blocks = mtf.Dimension("h_blocks", 4)
    >>> y = mtf.layers.conv2d_with_blocks(x, filters, (3, 3), (1, 1), "SAME",
    ...                                   h_blocks_dim=h_blocks)
  """
  return _conv_layer(
      x, output_dim, filter_size, ["fh", "fw"], False, filter_initializer, variable_dtype,
      name, "conv2d", "conv2d",
      lambda x, kernel: conv_ops.conv2d(x, kernel, strides, padding, h_blocks_dim,
                                        w_blocks_dim))


_TF_TRUNCATED_NORMAL = tf.compat.v1.truncated_normal_initializer


def _truncated_normal(stddev: float):
  """The layout-invariant truncated normal, unless a caller has replaced
  tf.compat.v1.truncated_normal_initializer (tests patch it to pin the
  filters' values): then the replacement."""
  if tf.compat.v1.truncated_normal_initializer is not _TF_TRUNCATED_NORMAL:
    return tf.compat.v1.truncated_normal_initializer(stddev=stddev)
  return initializers.truncated_normal(stddev=stddev)


def separable_conv1d(x: Tensor, output_dim: Dimension, min_relative_pos: int = -1,
                     max_relative_pos: int = 1, depthwise_filter_initializer_scale: float = 1.0,
                     pointwise_filter_initializer_scale: float = 1.0,
                     name: Optional[str] = None, use_bias: bool = True,
                     kernel_depth_weights: Optional[Sequence[Tensor]] = None) -> Tensor:
  """Depthwise-separable 1D convolution over x [..., length, depth].

  Each output position `l` first sums, over the offsets `r` from
  `min_relative_pos` to `max_relative_pos`, the input at `l + r` (zero past the
  ends) times a per-channel filter (variables `<name>/depthwise_filter_<r>`
  [depth]); a dense layer (`<name>/pointwise`) then maps depth to output_dim.

  Args:
    x: the input; its last dimension is the channels, the one before the length.
    output_dim: the output channel dimension.
    min_relative_pos: the leftmost offset of the window (<= 0 looks back).
    max_relative_pos: the rightmost offset.
    depthwise_filter_initializer_scale: stddev of the depthwise filters'
      truncated-normal initializer.
    pointwise_filter_initializer_scale: stddev of the pointwise kernel's
      initializer, times depth ** -0.5.
    name: the layer's name (default "separable_conv1d", made unique).
    use_bias: whether the pointwise layer adds a bias.
    kernel_depth_weights: optional tensors [depth], one per offset, used as the
      depthwise filters instead of variables.

  Returns:
    An mtf.Tensor [..., length, output_dim].

  Example:
    >>> y = mtf.layers.separable_conv1d(x, mtf.Dimension("d_out", 64), -2, 0)  # causal
  """
  if x.shape.ndims < 2:
    raise ValueError(
        f"separable_conv1d: {x.name} {x.shape} needs a length and a channel dimension.")
  if max_relative_pos < min_relative_pos:
    raise ValueError(
        f"separable_conv1d: max_relative_pos ({max_relative_pos}) is below "
        f"min_relative_pos ({min_relative_pos}).")
  from mesh_tensorflow.layers.core import dense
  from mesh_tensorflow.operations.elementwise import add_n
  from mesh_tensorflow.operations.slicing import shift
  offsets = list(range(min_relative_pos, max_relative_pos + 1))
  if kernel_depth_weights is not None and len(kernel_depth_weights) != len(offsets):
    raise ValueError(
        f"separable_conv1d: {len(kernel_depth_weights)} kernel_depth_weights for "
        f"{len(offsets)} offsets ({min_relative_pos}..{max_relative_pos}); give one each.")
  output_dim = convert_to_dimension(output_dim)
  channels = x.shape.dims[-1]
  x = _distinct_channels(x, output_dim)
  length_dim, depth_dim = x.shape.dims[-2], x.shape.dims[-1]
  if kernel_depth_weights is not None and depth_dim != channels:
    # Given filters over the input's channels follow them to their new name.
    from mesh_tensorflow.operations.shape_ops import rename_dimension
    kernel_depth_weights = [
        rename_dimension(w, channels.name, depth_dim.name) if channels in w.shape.dims else w
        for w in kernel_depth_weights]
  variable_dtype = VariableDType(tf.float32, activation_dtype=x.dtype)
  with _layer_scope(x, name, "separable_conv1d"):
    terms = []
    for i, offset in enumerate(offsets):
      if kernel_depth_weights is not None:
        weights = kernel_depth_weights[i]
      else:
        weights = get_variable(
            x.mesh, f"depthwise_filter_{offset}", [depth_dim], dtype=variable_dtype,
            initializer=_truncated_normal(depthwise_filter_initializer_scale))
      moved = x if offset == 0 else shift(x, -offset, length_dim, wrap=False)
      terms.append(moved * weights)
    depthwise = add_n(terms) if len(terms) > 1 else terms[0]
    return dense(depthwise, output_dim, use_bias=use_bias, variable_dtype=variable_dtype,
                 name="pointwise", kernel_initializer=_truncated_normal(
                     pointwise_filter_initializer_scale * depth_dim.size ** -0.5))


def conv1d(x: Tensor, output_dim: Dimension, filter_size: int = 3, stride: int = 1,
           padding: str = "SAME", filter_initializer=None,
           variable_dtype: Optional[VariableDType] = None,
           name: Optional[str] = None) -> Tensor:
  """1D convolution layer over x [..., length, in_channels].

  A 2D convolution with a window of height 1: the kernel variable is
  `<name>/kernel` [fh:1, fw:filter_size, in_channels, output_dim].

  Args:
    x: the input; its last dimension is the channels, the one before the length.
    output_dim: the output channel dimension.
    filter_size: the window length.
    stride: the stride along the length.
    padding: "SAME" or "VALID".
    filter_initializer: initializer of the kernel.
    variable_dtype: an mtf.VariableDType.
    name: the layer's name (default "conv1d", made unique).

  Returns:
    An mtf.Tensor [..., length', output_dim].

  Example:
    >>> y = mtf.layers.conv1d(tokens, mtf.Dimension("d_out", 64), filter_size=3)
  """
  if x.shape.ndims < 2:
    raise ValueError(f"conv1d: {x.name} {x.shape} needs a length and a channel dimension.")
  output_dim = convert_to_dimension(output_dim)
  x = _distinct_channels(x, output_dim)
  one = Dimension("conv1d_height", 1)
  dims = x.shape.dims
  x2 = reshape(x, Shape(dims[:-2] + [one] + dims[-2:]))
  with _layer_scope(x, name, "conv1d"):
    kernel = _kernel(x2, _window_dims((1, filter_size), ["fh", "fw"])
                     + [dims[-1], output_dim], filter_initializer, variable_dtype)
    y = conv_ops.conv2d(x2, kernel, (1, int(stride)), padding)
  return reshape(y, y.shape - [one])


def conv3d(x: Tensor, output_dim: Dimension, filter_size: IntOrInts = (3, 3, 3),
           strides: IntOrInts = (1, 1, 1), padding: str = "SAME", filter_initializer=None,
           variable_dtype: Optional[VariableDType] = None,
           name: Optional[str] = None) -> Tensor:
  """3D convolution layer over x [..., d, h, w, in_channels].

  Creates `<name>/kernel` [fd, fh, fw, in_channels, output_dim].

  Example:
    >>> y = mtf.layers.conv3d(volume, mtf.Dimension("filters", 16))
  """
  return conv3d_with_blocks(x, output_dim, filter_size, strides, padding, None, None,
                            filter_initializer, variable_dtype, name)


def conv3d_with_blocks(x: Tensor, output_dim: Dimension, filter_size: IntOrInts = (3, 3, 3),
                       strides: IntOrInts = (1, 1, 1), padding: str = "SAME",
                       d_blocks_dim=None, h_blocks_dim=None,
                       filter_initializer=None,
                       variable_dtype: Optional[VariableDType] = None,
                       name: Optional[str] = None, w_blocks_dim=None) -> Tensor:
  """3D convolution layer over a volume cut into blocks along d, h and/or w
  (see `conv2d_with_blocks`); the kernel is `<name>/kernel` (default
  `conv3d/kernel`). `w_blocks_dim` comes last (the
  other arguments keep the original's order).

  Example:
    >>> y = mtf.layers.conv3d_with_blocks(x, filters, d_blocks_dim=d_blocks)
  """
  return _conv_layer(
      x, output_dim, filter_size, ["fd", "fh", "fw"], False, filter_initializer,
      variable_dtype, name, "conv3d", "conv3d",
      lambda x, kernel: conv_ops.conv3d(x, kernel, strides, padding, d_blocks_dim,
                                        h_blocks_dim, w_blocks_dim))


def conv2d_transpose(x: Tensor, output_dim: Dimension, filter_size: IntOrInts = (2, 2),
                     strides: IntOrInts = (2, 2), padding: str = "SAME",
                     filter_initializer=None, variable_dtype: Optional[VariableDType] = None,
                     name: Optional[str] = None) -> Tensor:
  """2D transposed convolution layer (upsampling) over x [..., h, w, in_channels].

  Creates `<name>/kernel` [fh, fw, output_dim, in_channels] (TensorFlow's
  order for transposed filters). With SAME padding, h and w grow by the
  strides.

  Example:
    >>> up = mtf.layers.conv2d_transpose(x, mtf.Dimension("filters", 16))
  """
  return _conv_layer(
      x, output_dim, filter_size, ["fh", "fw"], True, filter_initializer, variable_dtype,
      name, "conv2d_transpose", "conv2d_transpose",
      lambda x, kernel: conv_ops.conv2d_transpose(x, kernel, strides, padding))


def conv3d_transpose(x: Tensor, output_dim: Dimension, filter_size: IntOrInts = (2, 2, 2),
                     strides: IntOrInts = (2, 2, 2), padding: str = "SAME",
                     filter_initializer=None, variable_dtype: Optional[VariableDType] = None,
                     name: Optional[str] = None) -> Tensor:
  """3D transposed convolution layer over x [..., d, h, w, in_channels]; the
  kernel is `<name>/kernel` [fd, fh, fw, output_dim, in_channels].

  Example:
    >>> up = mtf.layers.conv3d_transpose(x, mtf.Dimension("filters", 8))
  """
  return _conv_layer(
      x, output_dim, filter_size, ["fd", "fh", "fw"], True, filter_initializer,
      variable_dtype, name, "conv3d_transpose", "conv3d_transpose",
      lambda x, kernel: conv_ops.conv3d_transpose(x, kernel, strides, padding))


def _conv_transpose_with_blocks(x: Tensor, kernel: Tensor, strides, blocks_dims,
                                what: str) -> Tensor:
  """The SAME transposed convolution of the whole image, computed block by block.

  Output block b along a spatial dimension of block size n is the whole
  image's output rows [b * n * s, (b + 1) * n * s). They need the input rows
  of block b, the `left` rows before it and the `right` rows after it (from
  the neighbouring blocks, by halo exchange; zeros past the image): with
  TensorFlow's SAME padding p_before = max(f - s, 0) // 2, left =
  (f - 1 - p_before) // s and right = ceil(p_before / s). A VALID transposed
  convolution of the extended block followed by a slice from
  p_before + left * s then gives them. Unblocked spatial dimensions are one
  block (zero padded).
  """
  n = len(blocks_dims)
  strides = _as_tuple(strides, n, f"{what} strides")
  c_out, c_in = kernel.shape.dims[n], kernel.shape.dims[n + 1]
  blocks = [None if b is None else x.shape.get_dim_by_name(
      b if isinstance(b, str) else convert_to_dimension(b).name) for b in blocks_dims]
  spatial = conv_ops._spatial_dims(  # pylint: disable=protected-access
      x.shape, n, [c_in.name] + [b.name for b in blocks if b is not None], what)
  windows = []
  for i, (b, d) in enumerate(zip(blocks, spatial)):
    f, s = kernel.shape.dims[i].size, strides[i]
    before = max(f - s, 0) // 2
    left, right = (f - 1 - before) // s, -(-before // s)
    if b is None:
      if left or right:
        x = pad(x, [left, right], d.name)
    else:
      x = conv_ops._halo_exchange(x, b, d, left, right, wrap=False)  # pylint: disable=protected-access
    windows.append((d.name, before + left * s, d.size * s))
  names = [d.name for d in spatial]
  out_dims = []
  for d in x.shape.dims:
    if d.name in names:
      i = names.index(d.name)
      out_dims.append(Dimension(d.name, conv_ops.conv_transpose_output_size(
          d.size, kernel.shape.dims[i].size, strides[i], "VALID")))
    elif d == c_in:
      out_dims.append(c_out)
    else:
      out_dims.append(d)
  y = conv_ops.ConvBackpropInputOperation(x, kernel, Shape(out_dims), strides, "VALID",
                                          names, name=f"{what}_valid").outputs[0]
  for name, begin, size in windows:
    have = y.shape.get_dim_by_name(name).size
    if begin + size > have:
      # A filter smaller than its stride leaves the last rows of each block zero.
      y = pad(y, [0, begin + size - have], name)
    if begin or size != y.shape.get_dim_by_name(name).size:
      y = mtf_slice(y, begin, size, name)
  return y


def _check_transpose_blocks(padding: str, what: str) -> None:
  if str(padding).upper() != "SAME":
    raise ValueError(f"{what}: blocks dimensions need padding='SAME' (each block then "
                     f"gives its own part of the output); got {padding!r}.")


def conv2d_transpose_with_blocks(x: Tensor, output_dim: Dimension,
                                 filter_size: IntOrInts = (2, 2), strides: IntOrInts = (2, 2),
                                 padding: str = "SAME", h_blocks_dim=None, w_blocks_dim=None,
                                 filter_initializer=None,
                                 variable_dtype: Optional[VariableDType] = None,
                                 name: Optional[str] = None) -> Tensor:
  """2D transposed convolution layer over an image cut into blocks.

  x is e.g. [batch, h_blocks, h, w_blocks, w, in_channels] (see
  `conv2d_with_blocks`). Each block receives from its neighbours the rows
  and columns its output needs (`mtf.halo_exchange`), and output block b is
  the whole image's SAME transposed convolution at rows
  [b * h * stride, (b + 1) * h * stride): splitting the blocks dimensions
  over the mesh splits the image, and the result does not depend on the
  layout. Any filter size and stride work. Without blocks dimensions this is
  `conv2d_transpose`; the kernel variable is the same
  (`conv2d_transpose/kernel` [fh, fw, output_dim, in_channels] by default).

  The arguments are those of `conv2d_with_blocks` (the default name is
  "conv2d_transpose").

  Returns:
    An mtf.Tensor like x with per-block spatial sizes times the strides and
    in_channels replaced by output_dim.

  Example:
    >>> up = mtf.layers.conv2d_transpose_with_blocks(x, filters, (2, 2), (2, 2), "SAME",
    ...                                              h_blocks_dim=h_blocks)
  """
  what = "conv2d_transpose_with_blocks"
  if h_blocks_dim is None and w_blocks_dim is None:
    return conv2d_transpose(x, output_dim, filter_size, strides, padding, filter_initializer,
                            variable_dtype, name)
  _check_transpose_blocks(padding, what)
  return _conv_layer(
      x, output_dim, filter_size, ["fh", "fw"], True, filter_initializer, variable_dtype,
      name, "conv2d_transpose", what,
      lambda x, kernel: _conv_transpose_with_blocks(x, kernel, strides,
                                                    [h_blocks_dim, w_blocks_dim], what))


def conv3d_transpose_with_blocks(x: Tensor, output_dim: Dimension,
                                 filter_size: IntOrInts = (2, 2, 2),
                                 strides: IntOrInts = (2, 2, 2), padding: str = "SAME",
                                 d_blocks_dim=None, h_blocks_dim=None, filter_initializer=None,
                                 variable_dtype: Optional[VariableDType] = None,
                                 name: Optional[str] = None, w_blocks_dim=None) -> Tensor:
  """3D transposed convolution layer over a volume cut into blocks along d, h
  (and w): see `conv2d_transpose_with_blocks`. The
  kernel is `<name>/kernel` [fd, fh, fw, output_dim, in_channels] (default
  name "conv3d_transpose", the variable of `conv3d_transpose`).

  Example:
    >>> up = mtf.layers.conv3d_transpose_with_blocks(x, filters, d_blocks_dim=d_blocks)
  """
  what = "conv3d_transpose_with_blocks"
  if d_blocks_dim is None and h_blocks_dim is None and w_blocks_dim is None:
    return conv3d_transpose(x, output_dim, filter_size, strides, padding, filter_initializer,
                            variable_dtype, name)
  _check_transpose_blocks(padding, what)
  return _conv_layer(
      x, output_dim, filter_size, ["fd", "fh", "fw"], True, filter_initializer,
      variable_dtype, name, "conv3d_transpose", what,
      lambda x, kernel: _conv_transpose_with_blocks(
          x, kernel, strides, [d_blocks_dim, h_blocks_dim, w_blocks_dim], what))


def max_pool2d(x: Tensor, ksize: IntOrInts = (2, 2), name: str = "max_pool2d",
               strides: Optional[IntOrInts] = None, padding: str = "VALID",
               h_blocks_dim=None, w_blocks_dim=None) -> Tensor:
  """2D max pooling over x [..., h, w, channels] (strides default to ksize).

  The first three arguments are (x, ksize, name); strides, padding and
  blocks dimensions follow.

  With blocks dimensions, pools each block (windows must not cross blocks).

  Example:
    >>> y = mtf.layers.max_pool2d(x, ksize=(2, 2))
  """
  return conv_ops.max_pool2d(x, ksize, strides, padding, h_blocks_dim, w_blocks_dim,
                             name=name)


def avg_pool2d(x: Tensor, ksize: IntOrInts = (2, 2), name: str = "avg_pool2d",
               strides: Optional[IntOrInts] = None, padding: str = "VALID",
               h_blocks_dim=None, w_blocks_dim=None) -> Tensor:
  """2D average pooling over x [..., h, w, channels] (strides default to ksize;
  arguments as in `max_pool2d`).

  Example:
    >>> y = mtf.layers.avg_pool2d(x, ksize=(2, 2))
  """
  return conv_ops.avg_pool2d(x, ksize, strides, padding, h_blocks_dim, w_blocks_dim,
                             name=name)


def max_pool3d(x: Tensor, ksize: IntOrInts = (2, 2, 2), name: str = "max_pool3d",
               strides: Optional[IntOrInts] = None, padding: str = "VALID") -> Tensor:
  """3D max pooling over x [..., d, h, w, channels] (strides default to ksize).

  Example:
    >>> y = mtf.layers.max_pool3d(x, ksize=(2, 2, 2))
  """
  return conv_ops.max_pool3d(x, ksize, strides, padding, name=name)


def avg_pool3d(x: Tensor, ksize: IntOrInts = (2, 2, 2), name: str = "avg_pool3d",
               strides: Optional[IntOrInts] = None, padding: str = "VALID") -> Tensor:
  """3D average pooling over x [..., d, h, w, channels] (strides default to ksize).

  Example:
    >>> y = mtf.layers.avg_pool3d(x, ksize=(2, 2, 2))
  """
  return conv_ops.avg_pool3d(x, ksize, strides, padding, name=name)

from mesh_tensorflow.core import autograph_exempt as _autograph_exempt  # noqa: E402  pylint: disable=g-import-not-at-top
_autograph_exempt.exempt(globals())  # AutoGraph leaves this module's code alone
