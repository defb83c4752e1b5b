"""Elementwise operations: unary math, binary arithmetic with broadcasting by
dimension name, comparisons, logic and casts.

Broadcasting is by name: `x[batch, hidden] + y[hidden]` adds y to every row;
the output has the dimensions of x followed by those of y that x lacks.

    >>> z = mtf.add(x, y)            # or x + y
    >>> w = mtf.relu(mtf.cast(z, tf.float32))
"""

from __future__ import annotations

import math
from typing import Callable, List, Optional, Sequence

import tensorflow as tf

from mesh_tensorflow.core.graph import TENSOR_OPERATORS, Operation, Tensor
from mesh_tensorflow.lowering import plans
from mesh_tensorflow.lowering.mesh_impl import expand_to_shape, once_per_graph
from mesh_tensorflow.operations.constant_ops import zeros_like
from mesh_tensorflow.operations._common import first_tensor, is_scalar_value, num_elements, to_tensor
from mesh_tensorflow.core.shapes import Shape, convert_to_shape, shape_union


class ElementwiseOperation(Operation):
  """Applies tf_fn to slices broadcast to the output shape.

  Args:
    tf_fn: function of one TensorFlow slice per input.
    inputs: mtf Tensors.
    output_shape: defaults to the union of the input shapes.
    output_dtype: defaults to the first input's dtype.
    grad_fn: function(op, dy) -> list of input gradients, or None if the op is
      not differentiable (its inputs then get no gradient).
    input_grads: instead of grad_fn, one function(op, dy) -> gradient per input
      (None for an input without one); mtf.gradients then builds only the
      gradients it needs (none for a constant operand, say).
  """

  local_kernel = "elementwise"  # the kind of local work the cost model prices

  def __init__(self, tf_fn: Callable, inputs: Sequence[Tensor], output_shape=None,
               output_dtype=None, grad_fn=None, name=None, zero_gradient=False,
               input_grads=None):
    op_name = name or getattr(tf_fn, "__name__", "elementwise")
    shape = shape_union_checked([t.shape for t in inputs], inputs, op_name)
    if output_shape is not None:
      output_shape = convert_to_shape(output_shape)
      missing = [d for d in shape.dims if d not in output_shape.dims]
      if missing:
        raise ValueError(
            f"{op_name}: output_shape {output_shape} lacks {missing} that the "
            "inputs have; reduce them first (mtf.reduce_sum).")
      shape = output_shape
    super().__init__(inputs, name=op_name)
    self._tf_fn = tf_fn
    self._grad_fn = grad_fn
    self._input_grads = input_grads
    self._zero_gradient = zero_gradient
    self.has_gradient = grad_fn is not None or input_grads is not None or zero_gradient
    self._outputs = [Tensor(self, shape, output_dtype or inputs[0].dtype)]

  def gradient(self, grad_ys):
    return self.gradient_for(grad_ys, [True] * len(self._inputs))

  def gradient_for(self, grad_ys, needed):
    if self._zero_gradient or grad_ys[0] is None:
      return [None] * len(self._inputs)
    if self._input_grads is not None:
      return [fn(self, grad_ys[0]) if fn is not None and need else None
              for fn, need in zip(self._input_grads, needed)]
    return self._grad_fn(self, grad_ys[0])

  def lower(self, lowering):
    out = self._outputs[0]
    impl = lowering.mesh_impl(self)
    slice_shape = impl.slice_shape(out.shape)
    in_shapes = [t.shape for t in self._inputs]
    fn = self._tf_fn

    def slice_fn(*slices):
      expanded = [_expanded_slice(s, sh, out.shape) for s, sh in zip(slices, in_shapes)]
      y = fn(*expanded)
      if y.shape.as_list() != slice_shape:
        y = tf.broadcast_to(y, slice_shape)
      return y
    result = impl.slicewise(slice_fn, *[lowering.laid_out(t) for t in self._inputs])
    lowering.add_flops(num_elements(result.tensor_list[0]))
    lowering.set_tensor_lowering(out, result)


def _expanded_slice(t: tf.Tensor, shape: Shape, out_shape: Shape) -> tf.Tensor:
  """expand_to_shape, created once per graph for each slice: a replicated
  input (the same slice on every processor of a mesh row, when replicas are
  shared) is transposed or reshaped once, not once per processor."""
  if shape == out_shape:
    return t
  return once_per_graph(
      ("expand", t, tuple(shape.dimension_names), tuple(out_shape.dimension_names)),
      lambda: expand_to_shape(t, shape, out_shape))


def shape_union_checked(shapes, inputs, op_name) -> Shape:
  try:
    return shape_union(shapes)
  except ValueError as e:
    names = ", ".join(f"{t.name} {t.shape}" for t in inputs)
    raise ValueError(f"{op_name}: incompatible input shapes ({names}): {e}") from None


# The gradient of broadcasting sums over the dimensions an input lacks, with
# mtf.reduce_sum (or reorders them, with mtf.transpose). Those operations sit
# above this module (their own gradients use elementwise operations), so
# mesh_tensorflow.operations.reduction registers the function here, where the
# gradients below use it.
_BROADCAST_GRADIENT: List[Callable[[Tensor, Shape], Tensor]] = []


def register_broadcast_gradient(fn: Callable[[Tensor, Shape], Tensor]) -> None:
  """Sets the function `reduce_to_shape` uses (ops.reduction calls this)."""
  _BROADCAST_GRADIENT[:] = [fn]


def reduce_to_shape(g: Tensor, shape: Shape) -> Tensor:
  """Sums g over the dimensions that `shape` lacks (gradient of broadcasting)."""
  if g.shape == shape:
    return g
  if not _BROADCAST_GRADIENT:
    raise RuntimeError("mtf.reduce_to_shape needs mesh_tensorflow.operations.reduction: "
                       "import mesh_tensorflow first.")
  return _BROADCAST_GRADIENT[0](g, shape)


# ---------------------------------------------------------------- unary ops
def _unary(tf_fn, name, grad=None, zero_gradient=False, output_dtype=None):
  """Makes an mtf unary op; grad(x, y, dy) -> dx expressed with mtf ops."""

  def op(x: Tensor, name: Optional[str] = None) -> Tensor:
    if not isinstance(x, Tensor):
      raise TypeError(f"mtf.{op_name} expects an mtf.Tensor, got {x!r}.")
    grad_fn = None
    if grad is not None:
      grad_fn = lambda o, dy: [grad(o.inputs[0], o.outputs[0], dy)]
    return ElementwiseOperation(
        tf_fn, [x], output_dtype=output_dtype, grad_fn=grad_fn,
        zero_gradient=zero_gradient or (grad is None and not x.dtype.is_floating),
        name=name or op_name).outputs[0]
  op_name = name
  op.__name__ = name
  op.__doc__ = f"Elementwise {name} of an mtf Tensor (`tf.{name}` on every slice)."
  return op


exp = _unary(tf.exp, "exp", lambda x, y, dy: dy * y)
expm1 = _unary(tf.math.expm1, "expm1", lambda x, y, dy: dy * (y + 1.0))
log = _unary(tf.math.log, "log", lambda x, y, dy: dy / x)
log1p = _unary(tf.math.log1p, "log1p", lambda x, y, dy: dy / (x + 1.0))
sqrt = _unary(tf.sqrt, "sqrt", lambda x, y, dy: dy * 0.5 / y)
rsqrt = _unary(tf.math.rsqrt, "rsqrt", lambda x, y, dy: dy * -0.5 * y * y * y)
square = _unary(tf.square, "square", lambda x, y, dy: dy * 2.0 * x)
reciprocal = _unary(tf.math.reciprocal, "reciprocal", lambda x, y, dy: -dy * y * y)
sigmoid = _unary(tf.sigmoid, "sigmoid", lambda x, y, dy: dy * y * (1.0 - y))
tanh = _unary(tf.tanh, "tanh", lambda x, y, dy: dy * (1.0 - y * y))
sin = _unary(tf.sin, "sin", lambda x, y, dy: dy * cos(x))
cos = _unary(tf.cos, "cos", lambda x, y, dy: -dy * sin(x))
softplus = _unary(tf.math.softplus, "softplus", lambda x, y, dy: dy * sigmoid(x))
erf = _unary(tf.math.erf, "erf",
             lambda x, y, dy: dy * (2.0 / math.sqrt(math.pi)) * exp(-square(x)))
def _relu_grad(x, y, dy):
  """dy where x > 0, else 0: TensorFlow's fused ReluGrad kernel; its own
  gradient is the same mask applied to the incoming gradient."""
  return ElementwiseOperation(
      lambda g, f: tf.raw_ops.ReluGrad(gradients=g, features=f), [dy, x],
      output_shape=dy.shape if x.shape == dy.shape else None,
      grad_fn=lambda o, ddy: [_relu_grad(o.inputs[1], None, ddy), None],
      name="relu_grad").outputs[0]


relu = _unary(tf.nn.relu, "relu", _relu_grad)
relu6 = _unary(tf.nn.relu6, "relu6", lambda x, y, dy: dy * cast(
    logical_and(greater(x, 0.0), less(x, 6.0)), dy.dtype))
negative = _unary(tf.negative, "negative", lambda x, y, dy: -dy)
abs = _unary(tf.abs, "abs", lambda x, y, dy: dy * sign(x))  # pylint: disable=redefined-builtin
sign = _unary(tf.sign, "sign", zero_gradient=True)
floor = _unary(tf.floor, "floor", zero_gradient=True)
ceil = _unary(tf.math.ceil, "ceil", zero_gradient=True)
round = _unary(tf.round, "round", zero_gradient=True)  # pylint: disable=redefined-builtin
logical_not = _unary(tf.logical_not, "logical_not", zero_gradient=True)
is_finite = _unary(tf.math.is_finite, "is_finite", zero_gradient=True, output_dtype=tf.bool)
identity = _unary(tf.identity, "identity", lambda x, y, dy: dy)


def gelu(x: Tensor, name=None) -> Tensor:
  """Gaussian error linear unit, tanh approximation."""
  c = math.sqrt(2.0 / math.pi)
  return x * 0.5 * (1.0 + tanh(c * (x + 0.044715 * x * x * x)))


def swish(x: Tensor, name=None) -> Tensor:
  """x * sigmoid(x), also known as SiLU."""
  return x * sigmoid(x)


silu = swish


def elu(x: Tensor, name=None) -> Tensor:
  return where(greater(x, 0.0), x, expm1(minimum(x, 0.0)))


def selu(x: Tensor, name=None) -> Tensor:
  alpha, scale = 1.6732632423543772, 1.0507009873554805
  return scale * where(greater(x, 0.0), x, alpha * expm1(minimum(x, 0.0)))


def leaky_relu(x: Tensor, alpha: float = 0.2, name=None) -> Tensor:
  return where(greater(x, 0.0), x, x * alpha)


_squared_relu = _unary(lambda t: tf.square(tf.nn.relu(t)), "squared_relu",
                       lambda x, y, dy: dy * (2.0 * relu(x)))


def squared_relu(x: Tensor, name: Optional[str] = None) -> Tensor:
  """relu(x) squared, the activation of Primer (arXiv:2109.08668).

  One kernel per slice; the gradient is dy * 2 * relu(x).

  Args:
    x: an mtf Tensor.
    name: optional operation name.

  Returns:
    max(x, 0) ** 2, with x's shape and dtype.

  Example:
    >>> y = mtf.squared_relu(h)   # [-2., 0.5, 3.] -> [0., 0.25, 9.]
  """
  return _squared_relu(x, name=name)


def cast(x: Tensor, dtype, name=None) -> Tensor:
  """Casts x to dtype; the gradient is cast back."""
  dtype = tf.as_dtype(dtype)
  if x.dtype == dtype:
    return x
  differentiable = x.dtype.is_floating and dtype.is_floating
  return ElementwiseOperation(
      lambda t: tf.cast(t, dtype), [x], output_dtype=dtype,
      grad_fn=(lambda o, dy: [cast(dy, o.inputs[0].dtype)]) if differentiable else None,
      zero_gradient=not differentiable, name=name or "cast").outputs[0]


def to_float(x, name=None):
  return cast(x, tf.float32, name=name)


def to_int32(x, name=None):
  return cast(x, tf.int32, name=name)


def to_bfloat16(x, name=None):
  return cast(x, tf.bfloat16, name=name)


# ---------------------------------------------------------------- binary ops
def _binary_inputs(x, y, op_name):
  t = first_tensor(x, y)
  x = to_tensor(t.mesh, x, t.dtype)
  y = to_tensor(t.mesh, y, t.dtype)
  if x.dtype != y.dtype:
    raise TypeError(
        f"mtf.{op_name}: {x.name} is {x.dtype.name} but {y.name} is "
        f"{y.dtype.name}; cast one of them with mtf.cast.")
  return x, y


def _binary(tf_fn, name, grads=None, output_dtype=None, zero_gradient=False):
  """grads: (dx, dy), each a function (x, y, z, dz) -> that input's gradient in
  the broadcast (output) shape; only the gradients needed are built."""

  def op(x, y, output_shape=None, name=None) -> Tensor:
    if is_scalar_value(x) or is_scalar_value(y):
      return _binary_with_scalar(tf_fn, x, y, grads, output_dtype, output_shape,
                                 name or op_name)
    x, y = _binary_inputs(x, y, op_name)
    input_grads = None
    if grads is not None and x.dtype.is_floating:
      input_grads = [_reduced_grad(f, i) for i, f in enumerate(grads)]
    return ElementwiseOperation(
        tf_fn, [x, y], output_shape=output_shape, output_dtype=output_dtype,
        input_grads=input_grads, zero_gradient=input_grads is None,
        name=name or op_name).outputs[0]
  op_name = name
  op.__name__ = name
  op.__doc__ = (f"Elementwise {name} with broadcasting by dimension name; Python "
                "numbers are accepted for either argument.")
  return op


def _reduced_grad(grad, index):
  """The gradient of input `index` of a binary op, summed to its shape."""
  def fn(o, dz):
    return reduce_to_shape(grad(o.inputs[0], o.inputs[1], o.outputs[0], dz),
                           o.inputs[index].shape)
  return fn


class _ScalarOperandOperation(ElementwiseOperation):
  """A binary op with one Python-number operand, folded into the op (one
  constant per op rather than an mtf constant tensor per processor)."""

  def __init__(self, tf_fn, tensor, scalar, scalar_first, **kwargs):
    self._scalar, self._scalar_first = scalar, scalar_first
    self._binary_fn = tf_fn
    super().__init__(tf_fn, [tensor], **kwargs)

  def _scales(self) -> bool:
    """Whether the op multiplies a sum of pending sums (an mtf.add of them,
    such as a ParallelLayer's branches) by a number (x * c, c * x, x / c):
    linear, so the sum can stay pending through it. Only where nothing else
    reads the sum: another reader would complete it, and the scaled one would
    need an allreduce of its own. (A product's own pending sum, a gradient
    say, is often read outside the graph as well, and is completed here.)"""
    x, out = self.inputs[0], self.outputs[0]
    return (x.dtype.is_floating and x.shape == out.shape and out.dtype == x.dtype
            and (self._binary_fn is tf.multiply
                 or (self._binary_fn is tf.truediv and not self._scalar_first))
            and isinstance(x.operation, _LazyAwareAdd)
            and x.graph.num_readers(x) == 1)

  def plan(self, mesh):
    """A pending sum scaled by a number, read by nothing else, stays pending
    (each processor scales its summand); otherwise no plan: a kernel on the
    completed input."""
    pending = mesh.partial_sum_axes_of(self.inputs[0])
    if pending is None or not self._scales():
      return None
    out = self.outputs[0]
    layout = plans.stay(mesh.layout_of(out.shape))
    return plans.LocalPlan((plans.Operand(0, layout, plans.TAKES_PARTIAL),),
                           (plans.Result(out.shape, out.dtype.size, layout,
                                         tuple(sorted(pending))),))

  def lower(self, lowering):
    fn = self._binary_fn
    first = self._scalar_first
    plan = self.plan(lowering.plan_mesh(self))
    if plan is not None:
      def scale(t):
        k = tf.constant(self._scalar, dtype=t.dtype)  # on the processor's device
        return fn(k, t) if first else fn(t, k)
      lowering.lower_with_plan(self, plan, scale)
      return
    impl = lowering.mesh_impl(self)
    x = self.inputs[0]
    out = self.outputs[0]
    c = tf.constant(self._scalar, dtype=x.dtype)
    in_shape = x.shape

    def slice_fn(t, c):
      t = expand_to_shape(t, in_shape, out.shape, impl.slice_shape(out.shape))
      return fn(c, t) if first else fn(t, c)
    result = impl.slicewise(slice_fn, lowering.laid_out(x), c)
    lowering.add_flops(num_elements(result.tensor_list[0]))
    lowering.set_tensor_lowering(out, result)


def _binary_with_scalar(tf_fn, x, y, grads, output_dtype, output_shape, name):
  if is_scalar_value(x) and is_scalar_value(y):
    raise TypeError(f"mtf.{name}: at least one argument must be an mtf.Tensor.")
  scalar_first = is_scalar_value(x)
  tensor, scalar = (y, x) if scalar_first else (x, y)
  if not isinstance(tensor, Tensor):
    raise TypeError(f"mtf.{name}: expected an mtf.Tensor, got {tensor!r}.")
  grad_fn = None
  if grads is not None and tensor.dtype.is_floating:
    def grad_fn(o, dz):
      t = o.inputs[0]
      g = grads[1](scalar, t, o.outputs[0], dz) if scalar_first else grads[0](
          t, scalar, o.outputs[0], dz)
      return [reduce_to_shape(g, t.shape)]
  return _ScalarOperandOperation(
      tf_fn, tensor, scalar, scalar_first, output_shape=output_shape,
      output_dtype=output_dtype, grad_fn=grad_fn, zero_gradient=grad_fn is None,
      name=name).outputs[0]


# One lambda per line: AutoGraph cannot tell apart lambdas sharing a line.
_add_base = _binary(tf.add, "add", (
    lambda x, y, z, dz: dz,
    lambda x, y, z, dz: dz))
_sub_base = _binary(tf.subtract, "sub", (
    lambda x, y, z, dz: dz,
    lambda x, y, z, dz: -dz))
multiply = _binary(tf.multiply, "multiply", (
    lambda x, y, z, dz: dz * y,
    lambda x, y, z, dz: dz * x))
divide = _binary(tf.math.truediv, "divide", (
    lambda x, y, z, dz: dz / y,
    lambda x, y, z, dz: -dz * z / y))
truediv = divide
minimum = _binary(tf.minimum, "minimum", (
    lambda x, y, z, dz: dz * cast(less_equal(x, y), dz.dtype),
    lambda x, y, z, dz: dz * cast(greater(x, y), dz.dtype)))
maximum = _binary(tf.maximum, "maximum", (
    lambda x, y, z, dz: dz * cast(greater_equal(x, y), dz.dtype),
    lambda x, y, z, dz: dz * cast(less(x, y), dz.dtype)))
pow = _binary(tf.pow, "pow", (  # pylint: disable=redefined-builtin
    lambda x, y, z, dz: dz * y * (z / x),
    lambda x, y, z, dz: dz * z * log(x)))
floordiv = _binary(tf.math.floordiv, "floordiv", zero_gradient=True)
mod = _binary(tf.math.floormod, "mod", zero_gradient=True)
squared_difference = _binary(tf.math.squared_difference, "squared_difference", (
    lambda x, y, z, dz: dz * 2.0 * (x - y),
    lambda x, y, z, dz: dz * -2.0 * (x - y)))

equal = _binary(tf.equal, "equal", output_dtype=tf.bool)
not_equal = _binary(tf.not_equal, "not_equal", output_dtype=tf.bool)
less = _binary(tf.less, "less", output_dtype=tf.bool)
less_equal = _binary(tf.less_equal, "less_equal", output_dtype=tf.bool)
greater = _binary(tf.greater, "greater", output_dtype=tf.bool)
greater_equal = _binary(tf.greater_equal, "greater_equal", output_dtype=tf.bool)
logical_and = _binary(tf.logical_and, "logical_and", output_dtype=tf.bool)
logical_or = _binary(tf.logical_or, "logical_or", output_dtype=tf.bool)
logical_xor = _binary(tf.math.logical_xor, "logical_xor", output_dtype=tf.bool)


class _LazyAwareAdd(ElementwiseOperation):
  """add (or subtract: `tf_fn` is linear in each operand) that keeps pending
  allreduces pending: two pending sums over the same mesh axes, or a pending
  sum and a whole tensor."""

  def _pending_operand(self, mesh):
    """(index of the pending operand, its mesh axes) when one pending sum
    meets a whole tensor that can join it (`plans.adds_to_pending_sum`)."""
    (a, b), out = self._inputs, self.outputs[0]
    pa, pb = mesh.partial_sum_axes_of(a), mesh.partial_sum_axes_of(b)
    index = plans.adds_to_pending_sum(pa, pb, a.shape, b.shape, out.shape,
                                      mesh.layout_of(out.shape))
    return None if index is None else (index, tuple(sorted(pa if index == 0 else pb)))

  def plan(self, mesh):
    """Two pending sums over the same mesh axes (no broadcasting): their
    summands are added locally and the result stays pending. A pending sum
    and a whole tensor of its shape: the whole tensor joins the summands of
    the processors at coordinate 0 along the pending axes, and the result
    stays pending. Otherwise no plan: an elementwise kernel on the completed
    inputs."""
    return self._plan_and_joined(mesh)[0]

  def _plan_and_joined(self, mesh):
    """(plan, what `_pending_operand` found: None unless a whole tensor
    joins a pending sum)."""
    (a, b), out = self._inputs, self.outputs[0]
    layout = plans.stay(mesh.layout_of(out.shape))
    pending = mesh.partial_sum_axes_of(a)
    joined = None
    if plans.adds_pending_sums(pending, mesh.partial_sum_axes_of(b), a.shape, b.shape,
                               out.shape):
      partial = (plans.TAKES_PARTIAL, plans.TAKES_PARTIAL)
    else:
      joined = self._pending_operand(mesh)
      if joined is None:
        return None, None
      index, pending = joined
      partial = tuple(plans.TAKES_PARTIAL if i == index else "" for i in range(2))
    return plans.LocalPlan(
        tuple(plans.Operand(i, layout, partial[i]) for i in range(2)),
        (plans.Result(out.shape, out.dtype.size, layout, tuple(sorted(pending))),)), joined

  def lower(self, lowering):
    plan, joined = self._plan_and_joined(lowering.plan_mesh(self))
    if plan is None:
      super().lower(lowering)
      return
    if joined is None:
      lowering.lower_with_plan(self, plan, self._tf_fn)
      return
    index, axes = joined
    impl = lowering.mesh_impl(self)
    # tf.equal, not ==: in graph mode == compares Python objects.
    first = impl.slicewise(
        lambda *coords: tf.reduce_all(tf.stack([tf.equal(c, 0) for c in coords])),
        *[impl.laid_out_pcoord(a) for a in axes])

    def fn(x, y, is_first):
      whole = (y, x)[index]  # the operand that is not pending
      whole = tf.where(is_first, whole, tf.zeros_like(whole))
      return self._tf_fn(x, whole) if index == 0 else self._tf_fn(whole, y)
    lowering.lower_with_plan(self, plan, fn, extra=(first,))


def _linear_binary(tf_fn, base, op_name, x, y, output_shape, name, y_sign):
  """x (tf_fn) y for mtf.add and mtf.sub: `base` (the plain elementwise op)
  for numbers and non-float tensors, else a `_LazyAwareAdd`; y's gradient
  is y_sign * dz."""
  if is_scalar_value(x) or is_scalar_value(y):
    return base(x, y, output_shape=output_shape, name=name)
  x, y = _binary_inputs(x, y, op_name)
  if not x.dtype.is_floating:
    return base(x, y, output_shape=output_shape, name=name)

  def y_grad(o, dz):
    return reduce_to_shape(dz if y_sign > 0 else negative(dz), o.inputs[1].shape)
  return _LazyAwareAdd(
      tf_fn, [x, y], output_shape=output_shape, name=name or op_name,
      input_grads=[lambda o, dz: reduce_to_shape(dz, o.inputs[0].shape), y_grad]).outputs[0]


def add(x, y, output_shape=None, name=None) -> Tensor:
  """x + y with broadcasting by dimension name.

  Example:
    >>> z = mtf.add(x, bias)   # bias's dims must be a subset or disjoint
  """
  return _linear_binary(tf.add, _add_base, "add", x, y, output_shape, name, 1)


def sub(x, y, output_shape=None, name=None) -> Tensor:
  """x - y with broadcasting by dimension name; pending sums stay pending as
  in `mtf.add`.

  Example:
    >>> residual = mtf.sub(targets, predictions)
  """
  return _linear_binary(tf.subtract, _sub_base, "sub", x, y, output_shape, name, -1)


subtract = sub


def add_n(xs: Sequence[Tensor], name=None) -> Tensor:
  """Sum of a list of tensors (broadcasting by name)."""
  xs = list(xs)
  if not xs:
    raise ValueError("mtf.add_n needs at least one tensor.")
  total = xs[0]
  for x in xs[1:]:
    total = add(total, x)
  return total


def where(condition: Tensor, if_true, if_false, output_shape=None, name=None) -> Tensor:
  """Elementwise if_true where condition holds, else if_false (tensors or
  numbers, broadcast by dimension name).

  Example:
    >>> clipped = mtf.where(mtf.greater(x, 0.0), x, 0.0)
  """
  t = first_tensor(if_true, if_false)
  x = to_tensor(t.mesh, if_true, t.dtype)
  y = to_tensor(t.mesh, if_false, t.dtype)
  if condition.dtype != tf.bool:
    condition = cast(condition, tf.bool)

  def grad_x(o, dz):
    return reduce_to_shape(where(o.inputs[0], dz, zeros_like_fn(dz)), o.inputs[1].shape)

  def grad_y(o, dz):
    return reduce_to_shape(where(o.inputs[0], zeros_like_fn(dz), dz), o.inputs[2].shape)
  floating = x.dtype.is_floating
  return ElementwiseOperation(
      tf.where, [condition, x, y], output_shape=output_shape, output_dtype=x.dtype,
      input_grads=[None, grad_x, grad_y] if floating else None,
      zero_gradient=not floating, name=name or "where").outputs[0]


def zeros_like_fn(x):
  return zeros_like(x)


def clip_by_value(x, clip_value_min, clip_value_max, name=None) -> Tensor:
  return minimum(maximum(x, clip_value_min), clip_value_max)


# mtf.Tensor's Python operators (`x + y`, `-x`, `x < y`, ...) are these
# operations, which broadcast by dimension name.
TENSOR_OPERATORS.update(
    add=add, sub=sub, mul=multiply, truediv=divide, floordiv=floordiv, mod=mod, pow=pow,
    lt=less, le=less_equal, gt=greater, ge=greater_equal, neg=negative, abs=abs)

from mesh_tensorflow.core import autograph_exempt as _autograph_exempt  # noqa: E402  pylint: disable=g-import-not-at-top
_autograph_exempt.exempt(globals())  # AutoGraph leaves this module's code alone
