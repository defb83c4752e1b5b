"""Max and average pooling over 2 or 3 spatial dimensions, and their
gradient. Split spatial dimensions are gathered first (the window needs its
neighbours); every other dimension may be split.

    >>> z = mtf.max_pool2d(y, ksize=(2, 2))
"""

from __future__ import annotations

from typing import Optional, Sequence

import tensorflow as tf

from mesh_tensorflow.core.graph import Operation, Tensor
from mesh_tensorflow.lowering import plans
from mesh_tensorflow.lowering.mesh_impl import int_constant
from mesh_tensorflow.core.shapes import Shape, convert_to_shape
from mesh_tensorflow.operations.spatial import (
    _POOL_FNS, DimLike, IntOrInts, _dim_of, _from_canonical, _lower_local, _normalize_ints,
    _normalize_padding, _spatial_dims, _to_canonical, windowed_dims)


# ---- pooling ----------------------------------------------------------------------
class _PoolBase(Operation):
  """Window, strides, padding and spatial dimensions of a pooling op."""

  def _setup(self, n, ksize, strides, padding, spatial, x_shape: Shape):
    self._n = n
    self._ksize = tuple(ksize)
    self._strides = tuple(strides)
    self._padding = padding
    self._spatial = list(spatial)
    last = x_shape.dims[-1].name
    self._channel = None if last in self._spatial else last
    self._others = [d.name for d in x_shape.dims
                    if d.name not in self._spatial and d.name != self._channel]

  def _unsplittable_dim_names(self):
    return set(self._spatial)

  def plan(self, mesh):
    return plans.plan_local(self, mesh.layout_of, set(self._spatial), set(self._spatial))

  def _window(self):
    return [1] + list(self._ksize) + [1], [1] + list(self._strides) + [1]

  def _args(self):
    return (self._ksize, self._strides, self._padding, self._spatial)

  def _canon(self, t, shape: Shape):
    return _to_canonical(t, shape.dimension_names, self._spatial, self._channel,
                         others=self._others)

  def _restore(self, t, sizes, shape: Shape):
    return _from_canonical(t, self._others, sizes, self._spatial, self._channel,
                           shape.dimension_names)


class PoolOperation(_PoolBase):
  """Max or average pooling over N spatial dimensions (N = 2 or 3)."""

  def __init__(self, x: Tensor, kind: str, ksize, strides, padding,
               spatial_dim_names: Sequence[str], name=None):
    n = len(spatial_dim_names)
    if kind not in ("max", "avg"):
      raise ValueError(f"PoolOperation: kind must be 'max' or 'avg', got {kind!r}.")
    super().__init__([x], name=name or f"{kind}_pool{n}d")
    self._kind = kind
    self._setup(n, ksize, strides, padding, spatial_dim_names, x.shape)
    dims = windowed_dims(x.shape, self._spatial, self._ksize, self._strides, self._padding)
    self.has_gradient = x.dtype.is_floating
    self._outputs = [Tensor(self, Shape(dims), x.dtype)]

  def gradient(self, grad_ys):
    x, y, dy = self.inputs[0], self.outputs[0], grad_ys[0]
    if self._kind == "max":
      return [PoolBackpropOperation("max", [x, y, dy], x.shape, *self._args()).outputs[0]]
    return [PoolBackpropOperation("avg", [dy], x.shape, *self._args()).outputs[0]]

  def lower(self, lowering):
    x, out = self.inputs[0], self.outputs[0]
    pool_fn = _POOL_FNS[(self._kind, self._n)]
    ksize, strides = self._window()
    padding = self._padding

    def fn(t):
      c, _, sizes = self._canon(t, x.shape)
      return self._restore(pool_fn(c, ksize, strides, padding), sizes, out.shape)
    _lower_local(lowering, self, fn)


class PoolBackpropOperation(_PoolBase):
  """Gradients of pooling, each linear in its last input.

  kind "max": (x, y, dy) -> dx, of x's shape; "max_gradgrad": (x, y, g) -> the
  adjoint of "max" in dy, of y's shape; "avg": (dy,) -> dx of `input_shape`.
  """

  def __init__(self, kind: str, inputs: Sequence[Tensor], input_shape, ksize, strides,
               padding, spatial_dim_names: Sequence[str], name=None):
    n = len(spatial_dim_names)
    if kind not in ("max", "max_gradgrad", "avg"):
      raise ValueError(f"PoolBackpropOperation: unknown kind {kind!r}.")
    super().__init__(list(inputs), name=name or f"{kind}_pool{n}d_backprop")
    self._kind = kind
    input_shape = convert_to_shape(input_shape)
    self._setup(n, ksize, strides, padding, spatial_dim_names, input_shape)
    self._input_shape = input_shape
    out_shape = inputs[1].shape if kind == "max_gradgrad" else input_shape
    self.has_gradient = inputs[-1].dtype.is_floating
    self._outputs = [Tensor(self, out_shape, inputs[-1].dtype)]

  def gradient(self, grad_ys):
    g = grad_ys[0]
    if self._kind == "avg":
      return [PoolOperation(g, "avg", *self._args()).outputs[0]]
    x, y, _ = self.inputs
    other = "max_gradgrad" if self._kind == "max" else "max"
    return [None, None, PoolBackpropOperation(other, [x, y, g], x.shape,
                                              *self._args()).outputs[0]]

  def lower(self, lowering):
    ksize, strides = self._window()
    padding, n, kind = self._padding, self._n, self._kind
    shapes = [t.shape for t in self.inputs]
    out_shape = self.outputs[0].shape
    in_spatial = [self._input_shape.get_dim_by_name(s).size for s in self._spatial]

    def fn(*ts):
      canon = [self._canon(t, s) for t, s in zip(ts, shapes)]
      sizes = canon[-1][2]
      c = [ct[0] for ct in canon]
      if kind == "avg":
        orig = [c[0].shape.as_list()[0]] + in_spatial + [c[0].shape.as_list()[-1]]
        grad_fn = tf.raw_ops.AvgPoolGrad if n == 2 else tf.raw_ops.AvgPool3DGrad
        r = grad_fn(orig_input_shape=int_constant(orig), grad=c[0], ksize=ksize,
                    strides=strides, padding=padding)
      else:
        if kind == "max":
          grad_fn = tf.raw_ops.MaxPoolGrad if n == 2 else tf.raw_ops.MaxPool3DGrad
        else:
          grad_fn = tf.raw_ops.MaxPoolGradGrad if n == 2 else tf.raw_ops.MaxPool3DGradGrad
        r = grad_fn(orig_input=c[0], orig_output=c[1], grad=c[2], ksize=ksize,
                    strides=strides, padding=padding)
      return self._restore(r, sizes, out_shape)
    _lower_local(lowering, self, fn)


def _pool(kind: str, n: int, x: Tensor, ksize, strides, padding,
          blocks_dims: Sequence[DimLike], name) -> Tensor:
  what = f"mtf.{kind}_pool{n}d"
  if not isinstance(x, Tensor):
    raise TypeError(f"{what}: x must be an mtf.Tensor, got {x!r}.")
  ksize = _normalize_ints(ksize, n, f"{what} ksize")
  strides = ksize if strides is None else _normalize_ints(strides, n, f"{what} strides")
  padding = _normalize_padding(padding, what)
  blocks = [_dim_of(x.shape, b, what) for b in blocks_dims]
  exclude = [x.shape.dims[-1].name] + [b.name for b in blocks if b is not None]
  spatial = _spatial_dims(x.shape, n, exclude, what)
  for b, d, k, s in zip(blocks, spatial, ksize, strides):
    if b is not None and (k > s or d.size % s):
      raise ValueError(
          f"{what}: pooling over blocks of {d.name!r} (size {d.size}) needs windows "
          f"that stay inside a block: ksize <= stride and a block size divisible by "
          f"the stride; got ksize {k}, stride {s}.")
  return PoolOperation(x, kind, ksize, strides, padding, [d.name for d in spatial],
                       name=name).outputs[0]


def max_pool2d(x: Tensor, ksize: IntOrInts = (2, 2), strides: Optional[IntOrInts] = None,
               padding: str = "VALID", h_blocks_dim: DimLike = None,
               w_blocks_dim: DimLike = None, name: Optional[str] = None) -> Tensor:
  """2D max pooling of x [..., h, w, channels], like tf.nn.max_pool2d.

  The spatial dimensions are the two before the last (channels) dimension,
  skipping blocks dimensions. Strides default to ksize. With blocks
  dimensions, each block is pooled on its own, which equals pooling the whole
  image when windows never cross blocks (ksize <= stride, block size divisible
  by the stride); other cases raise.

  Args:
    x: the input image.
    ksize: an int or (window_h, window_w).
    strides: an int, (stride_h, stride_w), or None for ksize.
    padding: "SAME" or "VALID".
    h_blocks_dim: optional blocks dimension (or name) along h.
    w_blocks_dim: optional blocks dimension (or name) along w.
    name: optional op name.

  Returns:
    The pooled mtf.Tensor (h and w resized, names kept).

  Example:
    >>> y = mtf.max_pool2d(x, ksize=(2, 2))
  """
  return _pool("max", 2, x, ksize, strides, padding, [h_blocks_dim, w_blocks_dim], name)


def avg_pool2d(x: Tensor, ksize: IntOrInts = (2, 2), strides: Optional[IntOrInts] = None,
               padding: str = "VALID", h_blocks_dim: DimLike = None,
               w_blocks_dim: DimLike = None, name: Optional[str] = None) -> Tensor:
  """2D average pooling of x [..., h, w, channels], like tf.nn.avg_pool2d
  (see `max_pool2d` for the arguments).

  Example:
    >>> y = mtf.avg_pool2d(x, ksize=(2, 2))
  """
  return _pool("avg", 2, x, ksize, strides, padding, [h_blocks_dim, w_blocks_dim], name)


def max_pool3d(x: Tensor, ksize: IntOrInts = (2, 2, 2), strides: Optional[IntOrInts] = None,
               padding: str = "VALID", d_blocks_dim: DimLike = None,
               h_blocks_dim: DimLike = None, w_blocks_dim: DimLike = None,
               name: Optional[str] = None) -> Tensor:
  """3D max pooling of x [..., d, h, w, channels], like tf.nn.max_pool3d
  (see `max_pool2d`).

  Example:
    >>> y = mtf.max_pool3d(x, ksize=(2, 2, 2))
  """
  return _pool("max", 3, x, ksize, strides, padding,
               [d_blocks_dim, h_blocks_dim, w_blocks_dim], name)


def avg_pool3d(x: Tensor, ksize: IntOrInts = (2, 2, 2), strides: Optional[IntOrInts] = None,
               padding: str = "VALID", d_blocks_dim: DimLike = None,
               h_blocks_dim: DimLike = None, w_blocks_dim: DimLike = None,
               name: Optional[str] = None) -> Tensor:
  """3D average pooling of x [..., d, h, w, channels], like tf.nn.avg_pool3d
  (see `max_pool2d`).

  Example:
    >>> y = mtf.avg_pool3d(x, ksize=(2, 2, 2))
  """
  return _pool("avg", 3, x, ksize, strides, padding,
               [d_blocks_dim, h_blocks_dim, w_blocks_dim], name)

from mesh_tensorflow.core import autograph_exempt as _autograph_exempt  # noqa: E402  pylint: disable=g-import-not-at-top
_autograph_exempt.exempt(globals())  # AutoGraph leaves this module's code alone
