"""Variables: each processor holds only its own slice.

Slice variables are created once (lifted out of any tf.function) and stored in
the mesh implementation, so retracing or re-lowering reuses them.

    >>> w = mtf.get_variable(mesh, "w", [hidden, out_dim],
    ...                      initializer=tf.random_normal_initializer(stddev=0.1))
    >>> update = mtf.assign(w, w - 0.1 * grad)
"""

from __future__ import annotations

import functools
import inspect
import math

import tensorflow as tf

from mesh_tensorflow.lowering import master_variables
from mesh_tensorflow.lowering import plans
from mesh_tensorflow.core import rng
from mesh_tensorflow.lowering import slice_variables
from mesh_tensorflow.lowering.slice_variables import variable_store  # noqa: F401 (public)
from mesh_tensorflow.core.graph import Mesh, Operation, Tensor
from mesh_tensorflow.lowering.mesh_impl import LaidOutTensor
from mesh_tensorflow.core.shapes import convert_to_shape


# mesh_impl.keeps[STORAGE_KEY]: {variable name: the shape its slices are
# stored in}, where that is not its own (training.zero, stage 3), so that
# every graph lowered with the implementation finds them stored that way.
STORAGE_KEY = "variable_storage"
# mesh_impl.keeps[STORAGE_DTYPE_KEY]: {variable name: the dtype its slices
# are stored in, where a training graph chose it (`store_in_activation_dtype`);
# other graphs lowered with the same mesh implementation store it so too.
STORAGE_DTYPE_KEY = "variable_storage_dtype"


class VariableDType:
  """Storage (slice), master and activation dtypes of a variable.

  Example:
    >>> VariableDType(tf.float32, tf.float32, tf.bfloat16)
  """

  def __init__(self, master_dtype=tf.float32, slice_dtype=None, activation_dtype=None):
    self.master_dtype = tf.as_dtype(master_dtype)
    self.slice_dtype = tf.as_dtype(slice_dtype or master_dtype)
    self.activation_dtype = tf.as_dtype(activation_dtype or master_dtype)

  def __repr__(self):
    return (f"VariableDType(master={self.master_dtype.name}, "
            f"slice={self.slice_dtype.name}, activation={self.activation_dtype.name})")


class GlorotUniform:
  """Layout-invariant default initializer: uniform(+-sqrt(6/(fan_in+fan_out)))
  with fan_out the last dimension, keyed by the variable name."""

  def slice_value(self, name, full_shape, begin, slice_shape, dtype):
    fan_out = full_shape[-1] if full_shape else 1
    fan_in = max(1, int(math.prod(full_shape)) // max(fan_out, 1))
    limit = math.sqrt(6.0 / (fan_in + fan_out))
    u = rng.uniform(rng.global_index(full_shape, begin, slice_shape),
                    rng.name_seed(name, "init"), tf.constant(0, tf.int64))
    return tf.cast((2.0 * u - 1.0) * limit, dtype)


class Variable(Operation):
  """An mtf variable; `outputs[0]` (also `.value`) is its current value."""

  is_variable = True

  def __init__(self, mesh: Mesh, name: str, shape, dtype: VariableDType, initializer,
               trainable: bool = True, **kwargs):
    super().__init__([], mesh=mesh, name="Variable")
    self._name = name  # exactly the scoped variable name
    self._shape = convert_to_shape(shape)
    self._dtype = dtype
    self._initializer = initializer
    self._trainable = trainable
    self._outputs = [Tensor(self, self._shape, dtype.activation_dtype, name=name)]
    # The shape the slices are stored in: same sizes, possibly renamed dims so
    # that the layout splits it further (ZeRO stage 3, mesh_tensorflow/training/zero.py).
    self.storage_shape = self._shape
    # Tensors whose computation the read waits for (ZeRO stage 3 gathers
    # only a few variables ahead of their use; see training/zero.py).
    self.read_after: list = []
    # Whether the backward pass gathers a variable stored in blocks again
    # (False: it keeps the forward pass's copy; training/zero.py).
    self.regathers_for_backward = True
    # A full-size master copy, only when the mesh has a variable placer
    # (master_variables.py).
    self.master = None
    placer = getattr(mesh, "variable_placer", None)
    if placer is not None:
      self.master = master_variables.create_master(
          placer, name, self._shape, self.master_dtype, self._full_initial_value, trainable)

  def store_in_activation_dtype(self) -> None:
    """Stores (and checkpoints) the variable in its activation dtype, e.g.
    bfloat16: its float32 master copy then lives in the optimizer's state
    (`mtf.zero.shard_training_state(..., float32_master_in_optimizer=True)`).
    Call it before the graph is lowered."""
    act = self._dtype.activation_dtype
    self._dtype = VariableDType(act, act, act)

  def _full_initial_value(self) -> tf.Tensor:
    full = self._shape.to_integer_list()
    if hasattr(type(self._initializer), "slice_value"):
      return self._initializer.slice_value(self._name, full, [0] * len(full), full,
                                           self.master_dtype)
    return _call_initializer(self._initializer, full, self.master_dtype, self._name)

  shape = property(lambda self: self._shape)
  trainable = property(lambda self: self._trainable)
  value = property(lambda self: self._outputs[0])
  master_dtype = property(lambda self: self._dtype.master_dtype)
  slice_dtype = property(lambda self: self._dtype.slice_dtype)
  activation_dtype = property(lambda self: self._dtype.activation_dtype)
  variable_dtype = property(lambda self: self._dtype)
  dtype = variable_dtype
  size = property(lambda self: self._shape.size)

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    if self.storage_shape == self._shape:  # stored sharded on impl by an earlier graph?
      self.storage_shape = impl.keeps.get(STORAGE_KEY, {}).get(self._name, self._shape)
    stored = impl.keeps.get(STORAGE_DTYPE_KEY, {}).get(self._name)
    if stored is not None and stored != self.slice_dtype:
      self._dtype = VariableDType(stored, stored, self.activation_dtype)
    slices = self._get_or_create_slices(impl)
    lowering.variables[self] = LaidOutVariable(self, impl, slices)
    _lower_read(lowering, self, self, slices, self.read_after)

  @property
  def gathers_on_read(self) -> bool:
    """Whether reading the value gathers slices that are stored split further
    than the value is used (ZeRO stage 3). `mtf.gradients` then reads such a
    variable again for the backward pass instead of keeping the gathered copy
    alive from the forward pass."""
    return self.storage_shape != self._shape

  def read_again(self, after) -> Tensor:
    """The value read anew (gathered again) once the tensors `after` exist.

    Example:
      >>> w_again = var.read_again([dy])      # in the backward pass
    """
    return VariableReread(self, after).outputs[0]

  def plan(self, mesh):
    """The KernelPlan of reading the slice variables (laid out as
    `storage_shape`) and moving them into the value's layout."""
    return plans.plan_variable_read(self.storage_shape, self.outputs[0], mesh.layout_of,
                                    mesh.sizes)

  def _get_or_create_slices(self, impl):
    full = self._shape.to_integer_list()
    full_value = []  # computed at most once, for TF initializers

    def init_fn(begin, slice_shape):
      if self.master is not None:
        return master_variables.initial_slice(self.master, begin, slice_shape)
      if hasattr(type(self._initializer), "slice_value"):  # not a mock's any-attribute
        return self._initializer.slice_value(self._name, full, begin, slice_shape,
                                             self.master_dtype)
      if not full_value:
        with tf.device(impl.variable_device(0)):
          full_value.append(_call_initializer(self._initializer, full, self.master_dtype,
                                              self._name))
      if slice_shape == full:
        return full_value[0]
      return tf.slice(full_value[0], begin, slice_shape)
    sliced = slice_variables.get_or_create(
        impl, self._name, self.storage_shape, self.master_dtype, self.slice_dtype,
        self._trainable, init_fn, graph=self.mesh.graph)
    return impl.program_slices(sliced)


class VariableReread(Operation):
  """A variable's value read again once `after` (mtf tensors) exist: the
  backward pass's copy of a ZeRO stage 3 variable, gathered just before it is
  needed rather than kept from the forward pass (`Variable.read_again`)."""

  has_gradient = False
  stops_gradient = True
  is_variable_reread = True

  def __init__(self, variable: Variable, after):
    super().__init__(list(after), mesh=variable.mesh, name=variable.name + "/read_again")
    self.variable = variable
    self._outputs = [Tensor(self, variable.shape, variable.activation_dtype)]

  def plan(self, mesh):
    return plans.plan_variable_read(self.variable.storage_shape, self.outputs[0],
                                    mesh.layout_of, mesh.sizes)

  def lower(self, lowering):
    laid = lowering.variables[self.variable]
    _lower_read(lowering, self, self.variable, laid.slices, self.inputs)


def _lower_read(lowering, op, variable: Variable, slices, after) -> None:
  """Lowers `op` (a Variable or its VariableReread): each processor reads its
  slice variable, once its slices of the tensors `after` exist, then the plan
  moves the values into the value's layout (ZeRO stage 3: an all-gather)."""
  act = variable.activation_dtype
  waits = {}  # slice variable -> the tensors of its processor to wait for
  for t in after:
    for v, part in zip(slices, lowering.computed_slices(t)):
      waits.setdefault(id(v), []).append(part)

  def read(v):
    with tf.control_dependencies(waits.get(id(v), [])):
      # value(), not read_value(): the latter adds an Identity op per slice.
      if isinstance(v, tf.Variable):
        t = v.value()
      else:
        t = v.read_value() if hasattr(v, "read_value") else tf.identity(v)
      return tf.cast(t, act) if t.dtype != act else t
  plan = op.plan(lowering.plan_mesh(op))
  lowering.lower_kernels(op, plan, [read], extra={0: [LaidOutTensor(slices)]})


def _call_initializer(initializer, shape, dtype, name):
  try:
    value = initializer(shape, dtype=dtype)
  except TypeError:
    value = initializer(shape)
  value = tf.convert_to_tensor(value)
  if value.shape.as_list() != shape:
    raise ValueError(f"Variable {name!r}: initializer returned shape "
                     f"{value.shape.as_list()}, expected {shape}.")
  return tf.cast(value, dtype)


class LaidOutVariable:
  """The slice variables of one mtf Variable under one mesh implementation."""

  def __init__(self, variable: Variable, mesh_impl, slices):
    self.variable = variable
    self.mesh_impl = mesh_impl
    self.slices = slices

  @property
  def laid_out_tensor(self):
    return LaidOutTensor(self.slices)

  def assign_to_slices(self, assign_fn, values, assign_to_tensor_list=None):
    ops = []
    done = set()
    for v, t, device in zip(self.slices, values, _devices(self.mesh_impl)):
      if id(v) in done:  # a variable shared by replicas is assigned once
        continue
      done.add(id(v))
      with tf.device(device):
        ops.append(assign_fn(v, tf.cast(t, v.dtype)))
    return _group(ops)


def _group(ops):
  """One NoOp that runs after `ops`. tf.group makes one NoOp per device as
  well, which on a large mesh is many ops to create for nothing."""
  if tf.executing_eagerly():
    return tf.group(*ops)
  if len(ops) == 1 and isinstance(ops[0], tf.Operation):
    return ops[0]
  with tf.control_dependencies(ops):
    return tf.raw_ops.NoOp()


def _devices(impl):
  return [impl.slice_device(p) for p in range(impl.num_local_slices)]


def get_variable(mesh: Mesh, name: str, shape, dtype=tf.float32, master_dtype=None,
                 slice_dtype=None, activation_dtype=None, initializer=None,
                 trainable=True, **kwargs) -> Tensor:
  """Creates (or returns, by name) a variable and returns its value.

  The name is prefixed with the current `tf.compat.v1.variable_scope`.
  `dtype` may be a tf.DType or a VariableDType.

  Example:
    >>> w = mtf.get_variable(mesh, "w", "hidden:1024;classes:10")
  """
  if isinstance(dtype, VariableDType):
    vdtype = dtype
  else:
    base = tf.as_dtype(dtype or tf.float32)
    vdtype = VariableDType(master_dtype or base, slice_dtype or master_dtype or base,
                           activation_dtype or base)
  scope = tf.compat.v1.get_variable_scope().name
  full_name = "/".join(p for p in [scope] + mesh.graph._scope_stack + [name] if p)
  shape = convert_to_shape(shape)
  existing = mesh.graph.name_to_variable.get(full_name)
  if existing is not None:
    if existing.shape != shape:
      raise ValueError(
          f"Variable {full_name!r} already exists with shape {existing.shape}; "
          f"cannot get it with shape {shape}. Use another name or variable_scope.")
    return existing.outputs[0]
  var = Variable(mesh, full_name, shape, vdtype, initializer or GlorotUniform(),
                 trainable=trainable, **kwargs)
  mesh.graph.name_to_variable[full_name] = var
  return var.outputs[0]


def read_variable(var) -> Tensor:
  """The value of a variable (a Variable op or its output)."""
  return _as_variable(var).outputs[0]


def _as_variable(var) -> Variable:
  if isinstance(var, Variable):
    return var
  if isinstance(var, Tensor) and isinstance(var.operation, Variable):
    return var.operation
  raise TypeError(
      f"Expected an mtf variable (from mtf.get_variable), got {var!r}. Only "
      "variables can be assigned to.")


class Assign(Operation):
  """Assigns (or adds, subtracts) new values to variables; no outputs."""

  def __init__(self, variables, new_values, assign_fn=None, name=None):
    variables = [_as_variable(v) for v in variables]
    new_values = list(new_values)
    for v, t in zip(variables, new_values):
      if not isinstance(t, Tensor):
        raise TypeError(f"assign to {v.name!r}: new value must be an mtf.Tensor.")
      if t.shape != v.shape and t.shape != v.storage_shape:
        raise ValueError(
            f"assign to {v.name!r}: value {t.name} has shape {t.shape}, the "
            f"variable has {v.shape}.")
    super().__init__(new_values, mesh=variables[0].mesh, name=name or "assign")
    self._variables = variables
    self._assign_fn = assign_fn or _set_slice
    # An assign function may also take the mtf Variable first (as
    # mtf.assign_slice does): assign_fn(variable, slice, value).
    self._takes_variable = _positional_arity(self._assign_fn) >= 3

  @property
  def assigned_variables(self):
    return list(self._variables)

  @property
  def assign_fn(self):
    return self._assign_fn

  def plan(self, mesh):
    """The KernelPlan of moving each new value into the layout its
    variable's slices are stored in, then writing them (the writing kernels
    are `LaidOutVariable.assign_to_slices`: one update per distinct slice
    variable, grouped into the one TensorFlow op the Assign lowers to)."""
    return plans.plan_assign([v.storage_shape for v in self._variables], self.inputs,
                             mesh.layout_of, mesh.sizes)

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    plan = self.plan(lowering.plan_mesh(self))
    ops = []
    moves = [operand.move for operand in plan.operands]
    for var, value, move in zip(self._variables, self.inputs, moves):
      laid_var = lowering.variables[var]
      laid = impl.execute(lowering.laid_out(value), move)
      fn = self._assign_fn
      if self._takes_variable:
        fn = functools.partial(self._assign_fn, var)
      ops.append(laid_var.assign_to_slices(fn, laid.tensor_list))
    lowering.operations[self] = _group(ops)


# One function object per kind of update, so that Graph.combine_assignments
# can merge the updates of one kind.
def _set_slice(var, value):
  return var.assign(value)


def _add_to_slice(var, delta):
  return var.assign_add(delta)


def _subtract_from_slice(var, delta):
  return var.assign_sub(delta)


def _positional_arity(fn) -> int:
  try:
    params = inspect.signature(fn).parameters.values()
  except (TypeError, ValueError):
    return 2
  if any(p.kind == p.VAR_POSITIONAL for p in params):
    return 2
  return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
             for p in params)


def assign(var, new_val, assign_fn=None, name=None) -> Operation:
  """Returns an op that sets var to new_val (lowered: lowering.lowered_operation)."""
  return Assign([var], [new_val], assign_fn=assign_fn, name=name)


def assign_add(var, delta, name=None) -> Operation:
  return Assign([var], [delta], assign_fn=_add_to_slice,
                name=name or "assign_add")


def assign_sub(var, delta, name=None) -> Operation:
  return Assign([var], [delta], assign_fn=_subtract_from_slice,
                name=name or "assign_sub")

from mesh_tensorflow.core import autograph_exempt as _autograph_exempt  # noqa: E402  pylint: disable=g-import-not-at-top
_autograph_exempt.exempt(globals())  # AutoGraph leaves this module's code alone
