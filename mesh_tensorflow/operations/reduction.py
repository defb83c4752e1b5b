"""Reductions over named dimensions, softmax and log_softmax, and 1-D pooling.

Reducing a split dimension sums locally, then allreduces over the mesh
dimensions that split it. Sums stay pending (lazy) so that chains of sums cost
one allreduce of the smallest tensor.

    >>> total = mtf.reduce_sum(x, reduced_dim=hidden)
    >>> probs = mtf.softmax(logits, vocab_dim)
    >>> halves = mtf.pool_tensor_1d(x, length, pool_size=2)
"""

from __future__ import annotations

import math
from typing import Callable

import tensorflow as tf

from mesh_tensorflow.core.graph import Operation, Tensor
from mesh_tensorflow.lowering import plans, statistics_plans
from mesh_tensorflow.lowering.mesh_impl import expand_to_shape, int_constant
from mesh_tensorflow.operations import elementwise as ew
from mesh_tensorflow.operations.control import stop_gradient
from mesh_tensorflow.operations.shape_ops import broadcast, replace_dimensions, transpose
from mesh_tensorflow.core.shapes import Dimension, Shape, convert_to_dimension, convert_to_shape

_TF_REDUCE = {"SUM": tf.reduce_sum, "MAX": tf.reduce_max, "MIN": tf.reduce_min}


class ReduceOperation(Operation):
  """Reduces x to output_shape (a subset of its dimensions)."""

  def __init__(self, x: Tensor, output_shape, reduction_fn_string: str, name=None):
    output_shape = convert_to_shape(output_shape)
    extra = [d for d in output_shape.dims if d not in x.shape.dims]
    if extra:
      raise ValueError(
          f"mtf.reduce_{reduction_fn_string.lower()}: output_shape {output_shape} "
          f"has {extra}, which {x.name} {x.shape} does not have.")
    super().__init__([x], name=name or f"reduce_{reduction_fn_string.lower()}")
    self._reduction = reduction_fn_string
    self.has_gradient = x.dtype.is_floating
    self._outputs = [Tensor(self, output_shape, x.dtype)]

  @property
  def reduction_fn_string(self):
    return self._reduction

  def gradient(self, grad_ys):
    x, y = self.inputs[0], self.outputs[0]
    g = broadcast(grad_ys[0], x.shape)
    if self._reduction == "SUM":
      return [g]
    # MAX/MIN: the gradient goes to the elements equal to the result.
    mask = ew.cast(ew.equal(x, broadcast(y, x.shape)), g.dtype)
    return [g * mask]

  def plan(self, mesh):
    x, out = self.inputs[0], self.outputs[0]
    return plans.plan_reduce(x, out, self._reduction, mesh.partial_sum_axes_of(x),
                             mesh.layout_of, mesh.sizes)

  def lower(self, lowering):
    x, out = self.inputs[0], self.outputs[0]
    reduced = [d for d in x.shape.dims if d not in out.shape.dims]
    axes = [x.shape.dims.index(d) for d in reduced]
    kept_shape = Shape([d for d in x.shape.dims if d in out.shape.dims])
    fn = _TF_REDUCE[self._reduction]

    def local(t):
      if x.dtype == tf.bool:
        t2 = tf.reduce_any(t, axis=int_constant(axes)) if self._reduction in (
            "SUM", "MAX") else tf.reduce_all(t, axis=int_constant(axes))
      else:
        t2 = fn(t, axis=int_constant(axes)) if axes else t
      return expand_to_shape(t2, kept_shape, out.shape)
    lowering.lower_with_plan(self, self.plan(lowering.plan_mesh(self)), local)


def _output_shape(x: Tensor, output_shape, reduced_dim, reduced_dims=None):
  if output_shape is not None:
    if reduced_dim is not None or reduced_dims:
      raise ValueError("Give either output_shape or reduced_dim(s), not both.")
    return convert_to_shape(output_shape)
  dims = []
  if reduced_dim is not None:
    dims = reduced_dim if isinstance(reduced_dim, (list, Shape)) else [reduced_dim]
  if reduced_dims is not None:
    dims = list(dims) + list(reduced_dims)
  if not dims:
    return Shape([])
  dims = [convert_to_dimension(d) if not isinstance(d, str) else x.shape.get_dim_by_name(d)
          for d in dims]
  for d in dims:
    if d not in x.shape.dims:
      raise ValueError(f"Cannot reduce {x.name} {x.shape} over {d}: no such dimension.")
  return x.shape - dims


def _check_keyword_only(disable_positional_args, fn_name):
  if disable_positional_args is not None:
    raise ValueError(
        f"mtf.{fn_name}: pass output_shape/reduced_dim as keyword arguments.")


def _reduce(kind):
  def op(x: Tensor, disable_positional_args=None, output_shape=None,
         reduced_dim=None, name=None, reduced_dims=None) -> Tensor:
    _check_keyword_only(disable_positional_args, f"reduce_{kind.lower()}")
    shape = _output_shape(x, output_shape, reduced_dim, reduced_dims)
    if shape == x.shape:
      return x
    return ReduceOperation(x, shape, kind, name=name).outputs[0]
  op.__name__ = f"reduce_{kind.lower()}"
  op.__doc__ = (f"Reduces x by {kind.lower()} to output_shape, or over reduced_dim; "
                "with neither, over all dimensions.\n\n  Example:\n    >>> "
                f"mtf.reduce_{kind.lower()}(x, reduced_dim=hidden)")
  return op


reduce_sum = _reduce("SUM")
reduce_max = _reduce("MAX")
reduce_min = _reduce("MIN")


def _sum_to_shape(g: Tensor, shape: Shape) -> Tensor:
  """g summed over the dimensions `shape` lacks, in `shape`'s order: the
  gradient of broadcasting (`ops.elementwise.reduce_to_shape` calls it)."""
  if all(d in shape.dims for d in g.shape.dims):
    return transpose(g, shape)
  return reduce_sum(g, output_shape=shape)


ew.register_broadcast_gradient(_sum_to_shape)


def reduce_mean(x, disable_positional_args=None, output_shape=None, reduced_dim=None,
                name=None, reduced_dims=None) -> Tensor:
  """Mean over the reduced dimensions."""
  _check_keyword_only(disable_positional_args, "reduce_mean")
  shape = _output_shape(x, output_shape, reduced_dim, reduced_dims)
  s = reduce_sum(x, output_shape=shape, name=name)
  return s * (float(shape.size) / float(x.shape.size)) if x.shape.size else s


def reduce_any(x, disable_positional_args=None, output_shape=None, reduced_dim=None,
               name=None) -> Tensor:
  _check_keyword_only(disable_positional_args, "reduce_any")
  shape = _output_shape(x, output_shape, reduced_dim)
  return ReduceOperation(ew.cast(x, tf.bool), shape, "MAX", name=name).outputs[0]


def reduce_all(x, disable_positional_args=None, output_shape=None, reduced_dim=None,
               name=None) -> Tensor:
  _check_keyword_only(disable_positional_args, "reduce_all")
  shape = _output_shape(x, output_shape, reduced_dim)
  return ReduceOperation(ew.cast(x, tf.bool), shape, "MIN", name=name).outputs[0]


def reduce_logsumexp(x, reduced_dim, extra_logit=None, name=None) -> Tensor:
  """log(sum(exp(x))) over reduced_dim, computed stably."""
  reduced_dim = _dim_of(x, reduced_dim)
  max_x = stop_gradient(reduce_max(x, reduced_dim=reduced_dim))
  exp_x = ew.exp(x - max_x)
  sum_exp = reduce_sum(exp_x, reduced_dim=reduced_dim)
  if extra_logit is not None:
    sum_exp = sum_exp + ew.exp(extra_logit - max_x)
  return ew.log(sum_exp) + max_x


def _dim_of(x, d):
  if not isinstance(x, Tensor):
    raise TypeError(f"Expected an mtf.Tensor, got {x!r}.")
  if isinstance(d, str):
    if d not in x.shape.dimension_names:
      raise ValueError(f"{x.name} {x.shape} has no dimension {d!r}.")
    return x.shape.get_dim_by_name(d)
  d = convert_to_dimension(d)
  if d not in x.shape.dims:
    raise ValueError(f"{x.name} {x.shape} has no dimension {d}.")
  return d


class SoftmaxOperation(Operation):
  """softmax or log_softmax of x over one dimension.

  Each processor runs one fused kernel (tf.nn.softmax / tf.nn.log_softmax)
  when the dimension is whole on it; when the layout splits the dimension, the
  maximum and the sum of exponentials are allreduced over the mesh dimension
  that splits it (one MAX and one SUM allreduce). The gradient is one
  `SoftmaxGradOperation` (one SUM allreduce when the dimension is split).
  """

  def __init__(self, x: Tensor, dim, log: bool, name=None):
    if not x.dtype.is_floating:
      raise TypeError(f"mtf.{'log_' if log else ''}softmax: {x.name} has dtype "
                      f"{x.dtype.name}; cast it to a floating type first.")
    super().__init__([x], name=name or ("log_softmax" if log else "softmax"))
    self._dim = dim
    self._log = log
    self.has_gradient = True
    self._outputs = [Tensor(self, x.shape, x.dtype)]

  @property
  def reduced_dim(self):
    return self._dim

  @property
  def log(self) -> bool:
    return self._log

  def gradient(self, grad_ys):
    dy, y = grad_ys[0], self.outputs[0]
    if dy.shape != y.shape or dy.dtype != y.dtype:  # only from unusual grad_ys
      if self._log:
        return [dy - ew.exp(y) * reduce_sum(dy, reduced_dim=self._dim)]
      return [y * (dy - reduce_sum(dy * y, reduced_dim=self._dim))]
    return [SoftmaxGradOperation(y, dy, self._dim, self._log).outputs[0]]

  def plan(self, mesh):
    return statistics_plans.plan_softmax(self.inputs[0], self._dim, self._log, mesh.layout_of,
                                         mesh.sizes)

  def lower(self, lowering):
    x = self.inputs[0]
    axis = x.shape.index_of(self._dim)
    plan = self.plan(lowering.plan_mesh(self))
    if len(plan.kernels) == 1:
      fn = tf.nn.log_softmax if self._log else _softmax_any_rank
      fns = [lambda t: fn(t, axis=axis)]
    else:  # the dimension is split: statistics allreduced between the kernels
      axis = int_constant(axis)  # one shared constant, not one per processor
      fns = [lambda t: tf.reduce_max(t, axis=axis, keepdims=True), tf.subtract, tf.exp,
             lambda e: tf.reduce_sum(e, axis=axis, keepdims=True),
             (lambda s, z: s - tf.math.log(z)) if self._log else tf.math.divide]
    lowering.lower_kernels(self, plan, fns)


class SoftmaxGradOperation(Operation):
  """The gradient of softmax (log=False) or log_softmax (log=True) over `dim`,
  given the output y and its gradient dy:

      softmax:      y * (dy - sum(y * dy))
      log_softmax:  dy - exp(y) * sum(dy)

  One operation rather than five mtf ones, because the sum keeps `dim` (size 1)
  to broadcast back: no reshape per processor, which is lowering time on large
  meshes. With `dim` split, the sum is allreduced over its mesh axis. Its own
  gradient (second order) is written in mtf ops.
  """

  def __init__(self, y: Tensor, dy: Tensor, dim, log: bool, name=None):
    super().__init__([y, dy], name=name or ("log_softmax_grad" if log else "softmax_grad"))
    self._dim, self._log = dim, log
    self.has_gradient = True
    self._outputs = [Tensor(self, y.shape, y.dtype)]

  reduced_dim = property(lambda self: self._dim)
  log = property(lambda self: self._log)

  def gradient(self, grad_ys):
    g = grad_ys[0]
    y, dy = self.inputs
    if self._log:
      probs = ew.exp(y)
      return [-g * probs * reduce_sum(dy, reduced_dim=self._dim),
              g - reduce_sum(g * probs, reduced_dim=self._dim)]
    g_dot_y = reduce_sum(g * y, reduced_dim=self._dim)
    return [g * (dy - reduce_sum(y * dy, reduced_dim=self._dim)) - dy * g_dot_y,
            SoftmaxGradOperation(y, g, self._dim, False).outputs[0]]

  def plan(self, mesh):
    return statistics_plans.plan_softmax_grad(self.inputs[0], self._dim, self._log,
                                              mesh.layout_of, mesh.sizes)

  def lower(self, lowering):
    y = self.inputs[0]
    axis = int_constant(y.shape.index_of(self._dim))  # one shared constant
    if self._log:
      fns = [lambda d: tf.reduce_sum(d, axis=axis, keepdims=True),
             lambda a, d, s: d - tf.exp(a) * s]
    else:
      fns = [lambda a, d: tf.reduce_sum(a * d, axis=axis, keepdims=True),
             lambda a, d, s: a * (d - s)]
    lowering.lower_kernels(self, self.plan(lowering.plan_mesh(self)), fns)


def _softmax_any_rank(t: tf.Tensor, axis: int) -> tf.Tensor:
  """tf.nn.softmax, also for more than 5 dimensions, which TensorFlow's oneDNN
  CPU kernel rejects ("Input dims must be <= 5"): the dimensions before and
  after `axis` are folded into one each (reshapes, no copies)."""
  shape = t.shape.as_list()
  if len(shape) <= 5:
    return tf.nn.softmax(t, axis=axis)
  folded = [math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])]
  return tf.reshape(tf.nn.softmax(tf.reshape(t, folded), axis=1), shape)


def log_softmax(x: Tensor, reduced_dim, extra_logit=None, name=None) -> Tensor:
  """x - logsumexp(x) over reduced_dim.

  Example:
    >>> log_probs = mtf.log_softmax(logits, vocab_dim)
  """
  if extra_logit is not None:
    return x - reduce_logsumexp(x, reduced_dim, extra_logit=extra_logit)
  return SoftmaxOperation(x, _dim_of(x, reduced_dim), log=True, name=name).outputs[0]


def softmax(x: Tensor, reduced_dim, extra_logit=None, name=None) -> Tensor:
  """exp(x) / sum(exp(x)) over reduced_dim; extra_logit, if given, adds
  exp(extra_logit) to the denominator (as if one more, constant logit).

  Example:
    >>> probs = mtf.softmax(logits, vocab_dim)
  """
  if extra_logit is not None:
    return ew.exp(log_softmax(x, reduced_dim, extra_logit=extra_logit))
  return SoftmaxOperation(x, _dim_of(x, reduced_dim), log=False, name=name).outputs[0]


# ---------------------------------------------------------------- pooling

_POOL_WINDOW = "_pool_window"


def pool_tensor_1d(tensor: Tensor, pool_dim, reduce_fn: Callable = reduce_mean,
                   pool_size: int = 2) -> Tensor:
  """Pools non-overlapping windows of `pool_size` entries along `pool_dim`.

  `pool_dim` is cut (a reshape) into [pool_dim, window] of sizes
  [size // pool_size, pool_size], the outer part keeping the name, and
  `reduce_fn(t, reduced_dim=window)` reduces each window. A layout splitting
  `pool_dim` keeps the pooled dimension split with no communication when the
  split count divides the pooled size.

  Args:
    tensor: an mtf Tensor with `pool_dim`.
    pool_dim: the Dimension (or its name) to pool.
    reduce_fn: a reduction called as reduce_fn(t, reduced_dim=window), e.g.
      mtf.reduce_mean, mtf.reduce_max or mtf.reduce_first.
    pool_size: entries per window; must divide pool_dim's size.

  Returns:
    tensor with pool_dim of size pool_dim.size // pool_size.

  Example:
    >>> y = mtf.pool_tensor_1d(x, length, pool_size=2)   # [2, 5, 9, 15] -> [3.5, 12]
  """
  dim = _dim_of(tensor, pool_dim)
  if isinstance(pool_size, bool) or not isinstance(pool_size, int) or pool_size < 1:
    raise ValueError(f"mtf.pool_tensor_1d: pool_size must be a positive int, got "
                     f"{pool_size!r}.")
  if dim.size % pool_size:
    raise ValueError(
        f"mtf.pool_tensor_1d: pool_size {pool_size} does not divide dimension "
        f"{dim.name!r} (size {dim.size}) of {tensor.name} {tensor.shape}.")
  if _POOL_WINDOW in tensor.shape.dimension_names:
    raise ValueError(f"mtf.pool_tensor_1d: {tensor.name} {tensor.shape} already has a "
                     f"dimension named {_POOL_WINDOW!r}, which pooling uses.")
  window = Dimension(_POOL_WINDOW, pool_size)
  windows = replace_dimensions(
      tensor, dim, [Dimension(dim.name, dim.size // pool_size), window])
  return reduce_fn(windows, reduced_dim=window)

from mesh_tensorflow.core import autograph_exempt as _autograph_exempt  # noqa: E402  pylint: disable=g-import-not-at-top
_autograph_exempt.exempt(globals())  # AutoGraph leaves this module's code alone
