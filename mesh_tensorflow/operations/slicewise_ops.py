"""Any TensorFlow function applied to every processor's slices: `slicewise`
and its elementwise shorthand `cwise`.

`mtf.slicewise(tf_fn, xs, ...)` runs `tf_fn` on each processor's slices of the
inputs. That is right only for the dimensions along which `tf_fn` works slice
by slice (the `splittable_dims`); any other dimension that the layout splits is
gathered first, and the outputs are then cut back to their own layouts, so a
layout never changes the result.

    >>> y = mtf.slicewise(tf.nn.softplus, [x])          # elementwise: any layout
    >>> c = mtf.slicewise(lambda t: tf.cumsum(t, axis=1), [x],
    ...                   splittable_dims=[batch])       # "length" is gathered

Without a `grad_function`, the gradient is TensorFlow's own gradient of
`tf_fn`, recomputed on the slices (`GenericGradOperation`).
"""

from __future__ import annotations

from typing import Callable, List, Optional, Sequence

import tensorflow as tf

from mesh_tensorflow.core.graph import Operation, Tensor
from mesh_tensorflow.lowering import plans
from mesh_tensorflow.core.shapes import Shape, convert_to_dimension, convert_to_shape


def _names(tensors) -> List[str]:
  names = []
  for t in tensors:
    names += [n for n in t.shape.dimension_names if n not in names]
  return names


class SlicewiseOperation(Operation):
  """`tf_fn` applied to each processor's slices of `inputs`.

  Args:
    tf_fn: takes one tf.Tensor per input, returns one (or a list, one per output).
    inputs: mtf Tensors.
    output_shapes: one Shape per output.
    output_dtypes: one dtype per output.
    splittable_dims: the dimensions `tf_fn` may see split (Dimensions or
      names); None: every dimension that each output shares with the inputs,
      which is right for elementwise and broadcasting functions.
    grad_function: optional `grad_function(op, *dys) -> [dx per input]` in mtf
      ops; None differentiates `tf_fn` with TensorFlow.
  """

  has_gradient = True

  def __init__(self, tf_fn: Callable, inputs: Sequence[Tensor], output_shapes, output_dtypes,
               splittable_dims=None, grad_function: Optional[Callable] = None, name=None):
    super().__init__(inputs, name=name or "slicewise")
    self._tf_fn = tf_fn
    self._grad_function = grad_function
    self._outputs = [Tensor(self, convert_to_shape(s), tf.as_dtype(d), index=i)
                     for i, (s, d) in enumerate(zip(output_shapes, output_dtypes))]
    if splittable_dims is None:
      shared = set(_names(inputs))
      for out in self._outputs:
        shared &= set(out.shape.dimension_names)
      splittable = shared
    else:
      splittable = {d if isinstance(d, str) else convert_to_dimension(d).name
                    for d in splittable_dims}
    names = _names(list(inputs) + self._outputs)
    self._splittable_dims = frozenset(n for n in names if n in splittable)
    self._unsplittable_dims = frozenset(n for n in names if n not in splittable)

  tf_fn = property(lambda self: self._tf_fn)

  def gradient(self, grad_ys):
    if self._grad_function is not None:
      return self._grad_function(self, *grad_ys)
    return GenericGradOperation(self, grad_ys).outputs

  def plan(self, mesh):
    return plans.plan_unsplit(self, mesh.layout_of, self._unsplittable_dims)

  def lower(self, lowering):
    tf_fn = self._tf_fn
    lowering.lower_with_plan(
        self, self.plan(lowering.plan_mesh(self)),
        lambda *slices: _as_outputs(tf_fn(*slices), len(self._outputs)))


class GenericGradOperation(Operation):
  """The gradient of a SlicewiseOperation's inputs, by TensorFlow's automatic
  differentiation of its `tf_fn` on each processor's slices.

  Gradients of inputs that lack a split dimension of the outputs are partial
  sums on each processor, summed over that mesh axis.
  """

  def __init__(self, forward_op: SlicewiseOperation, grad_ys: Sequence[Optional[Tensor]],
               name=None):
    self._forward_op = forward_op
    self._has_dy = [g is not None for g in grad_ys]
    super().__init__(list(forward_op.inputs) + [g for g in grad_ys if g is not None],
                     mesh=forward_op.mesh, name=name or f"{forward_op.name}/grad")
    self._outputs = [Tensor(self, x.shape, x.dtype, index=i)
                     for i, x in enumerate(forward_op.inputs)]
    # Reported splittable everywhere: the dimensions the
    # forward op needs whole are gathered here too, whatever is reported.
    self._gathered_dims = forward_op.unsplittable_dims

  def plan(self, mesh):
    # An input without a split dimension of the outputs saw only this
    # processor's part of them: its gradient is a partial sum over that axis.
    fwd = self._forward_op
    unsplit = self._gathered_dims
    out_names = set(_names(fwd.outputs))
    partial = []
    for x in fwd.inputs:
      axes = {mesh.layout_of(Shape([_dim(fwd, name)]))[0]
              for name in out_names - set(x.shape.dimension_names) - unsplit}
      partial.append(axes - {None})
    return plans.plan_unsplit(self, mesh.layout_of, unsplit, partial_sum_axes=partial)

  def lower(self, lowering):
    fwd = self._forward_op
    n_in, n_out = len(fwd.inputs), len(fwd.outputs)
    has_dy = self._has_dy

    def grad_fn(*slices):
      xs, dys = list(slices[:n_in]), iter(slices[n_in:])
      with tf.GradientTape() as tape:
        for x in xs:
          tape.watch(x)
        ys = _as_outputs(fwd.tf_fn(*xs), n_out)
      ys = ys if n_out > 1 else (ys,)
      pairs = [(y, next(dys)) for y, h in zip(ys, has_dy) if h]
      dxs = tape.gradient([y for y, _ in pairs], xs,
                          output_gradients=[dy for _, dy in pairs],
                          unconnected_gradients=tf.UnconnectedGradients.ZERO)
      return tuple(tf.cast(dx, x.dtype) for dx, x in zip(dxs, xs))

    lowering.lower_with_plan(self, self.plan(lowering.plan_mesh(self)), grad_fn)


def _dim(op: Operation, name: str):
  for t in op.outputs:
    if name in t.shape.dimension_names:
      return t.shape.get_dim_by_name(name)
  raise KeyError(name)


def _as_outputs(result, n: int):
  if n == 1 and not isinstance(result, (list, tuple)):
    return result
  result = tuple(result)
  if len(result) != n:
    raise ValueError(f"mtf.slicewise: tf_fn returned {len(result)} tensors for {n} outputs.")
  return result if n > 1 else result[0]


def slicewise(tf_fn: Callable, xs: Sequence[Tensor], output_shape=None, output_dtype=None,
              splittable_dims=None, grad_function: Optional[Callable] = None, name=None):
  """Applies a TensorFlow function to every processor's slices.

  Args:
    tf_fn: a function of one tf.Tensor per element of `xs`.
    xs: the mtf Tensors to pass.
    output_shape: the output's Shape (default: that of xs[0]); a list of
      shapes for a function with several outputs.
    output_dtype: the output's dtype (default: that of xs[0]); a list, one
      per output, for several outputs.
    splittable_dims: the dimensions along which `tf_fn` works slice by slice
      (see SlicewiseOperation); others are gathered when the layout splits them.
    grad_function: optional `grad_function(op, *dys)` returning the inputs'
      gradients; default: TensorFlow's gradient of `tf_fn`.
    name: optional op name.

  Returns:
    an mtf Tensor, or a tuple of them when output_dtype is a list.

  Example:
    >>> y = mtf.slicewise(lambda t: tf.cumsum(t, axis=1), [x], splittable_dims=[batch])
  """
  xs = list(xs)
  if not xs:
    raise ValueError("mtf.slicewise needs at least one input tensor.")
  several = isinstance(output_dtype, (list, tuple)) or (
      isinstance(output_shape, (list, tuple)) and output_shape
      and not _is_one_shape(output_shape))
  shapes = list(output_shape) if several and output_shape is not None else [output_shape]
  dtypes = list(output_dtype) if isinstance(output_dtype, (list, tuple)) else [output_dtype]
  if several and len(dtypes) == 1:
    dtypes = dtypes * len(shapes)
  if several and len(shapes) == 1 and len(dtypes) > 1:
    shapes = shapes * len(dtypes)
  if len(shapes) != len(dtypes):
    raise ValueError(f"mtf.slicewise: {len(shapes)} output shapes but {len(dtypes)} dtypes.")
  op = SlicewiseOperation(
      tf_fn, xs, [convert_to_shape(s) if s is not None else xs[0].shape for s in shapes],
      [d if d is not None else xs[0].dtype for d in dtypes],
      splittable_dims, grad_function, name=name)
  return tuple(op.outputs) if several else op.outputs[0]


def _is_one_shape(x) -> bool:
  """A list that is one shape (Dimensions or (name, size) pairs), not a list
  of shapes."""
  return all(hasattr(d, "size") or (isinstance(d, tuple) and len(d) == 2
                                    and isinstance(d[0], str)) for d in x)


def cwise(tf_fn: Callable, xs: Sequence[Tensor], output_dtype=None,
          grad_function: Optional[Callable] = None, name=None) -> Tensor:
  """An elementwise TensorFlow function of tensors of one shape, slice by
  slice under any layout.

  Example:
    >>> y = mtf.cwise(tf.math.erf, [x])
  """
  xs = list(xs)
  return slicewise(tf_fn, xs, output_dtype=output_dtype, splittable_dims=xs[0].shape.dims,
                   grad_function=grad_function, name=name or "cwise")

from mesh_tensorflow.core import autograph_exempt as _autograph_exempt  # noqa: E402  pylint: disable=g-import-not-at-top
_autograph_exempt.exempt(globals())  # AutoGraph leaves this module's code alone
