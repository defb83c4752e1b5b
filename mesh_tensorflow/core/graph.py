"""The mtf graph: meshes, tensors and operations over named dimensions.

An mtf `Graph` is built in Python before any TensorFlow op exists; a
`Lowering` later turns it into per-device TensorFlow ops.

    >>> graph = Graph()
    >>> mesh = Mesh(graph, "my_mesh")
    >>> x = mtf.zeros(mesh, "batch:8;hidden:4")   # an mtf.Tensor
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Callable, Dict, FrozenSet, Iterable, List, Optional, Sequence, Tuple

import tensorflow as tf

from mesh_tensorflow.core.shapes import CallableString, convert_to_shape


# Graph.keeps[LAYER_SCOPES_KEY]: the layer names already used in the graph
# (layers.core.unique_layer_name), which recomputation and micro-batching
# restore so that a replayed layer finds its variables under the same name.
LAYER_SCOPES_KEY = "layer_scopes"


class Graph:
  """Holds the operations and variables of an mtf computation.

  Example:
    >>> graph = mtf.Graph()
    >>> mesh = mtf.Mesh(graph, "mesh")
  """

  def __init__(self):
    self.operations: List["Operation"] = []
    self.name_to_variable = {}
    self._names_in_use = {}
    self._scope_stack: List[str] = []
    self._lowered_into = weakref.WeakSet()  # TF graphs: must not keep them alive
    self.rng_seed = 0
    # (name, scalar Tensor) pairs recorded by mtf.scalar_summary; the Trainer
    # writes them to TensorBoard.
    self.summaries: List[Tuple[str, "Tensor"]] = []

  @property
  def keeps(self) -> dict:
    """What other modules keep with this graph, under keys they name (the
    layer scopes already used, so that layers get unique names).

    Example:
      >>> graph.keeps.setdefault("my_module", set()).add("dense")
    """
    return self.__dict__.setdefault("_keeps", {})

  @contextlib.contextmanager
  def keeping(self, key: str, value):
    """`keeps[key] = value` inside the `with` block; afterwards the entry is
    what it was before (or absent again).

    Example:
      >>> with graph.keeping("my_module.scope", ["dense"]):
      ...   build_layers()
    """
    keeps = self.keeps
    had, previous = key in keeps, keeps.get(key)
    keeps[key] = value
    try:
      yield value
    finally:
      if had:
        keeps[key] = previous
      else:
        keeps.pop(key, None)

  def num_readers(self, tensor: "Tensor") -> int:
    """How many operations of the graph read `tensor` (counted once per
    reading operation; recounted when the operations change).

    Example:
      >>> graph.num_readers(y)
      2
    """
    ops = self.operations
    key = (len(ops), id(ops[-1]) if ops else None)
    cached = self.__dict__.get("_readers")
    if cached is None or cached[0] != key:
      counts: Dict[int, int] = {}
      for op in ops:
        for t in set(op.inputs):
          counts[id(t)] = counts.get(id(t), 0) + 1
      cached = self.__dict__["_readers"] = (key, counts)
    return cached[1].get(id(tensor), 0)

  @property
  def all_variables(self):
    return [op for op in self.operations if getattr(op, "is_variable", False)]

  @property
  def trainable_variables(self):
    return [v for v in self.all_variables if v.trainable]

  def make_variables_untrainable(self) -> None:
    """Marks every variable of the graph not trainable (e.g. to freeze a
    pretrained model built so far)."""
    for v in self.all_variables:
      v._trainable = False  # pylint: disable=protected-access

  def combine_assignments(self, assignments):
    """The same updates as fewer operations: the Assign operations in
    `assignments` that use one assign function become one Assign, which
    replaces them in the graph (a traced tf.function runs every stateful op it
    builds, so they must not stay).

    Example:
      >>> updates = graph.combine_assignments(optimizer.apply_grads(grads, variables))
    """
    groups = {}
    for op in assignments:
      if getattr(op, "assign_fn", None) is None or not hasattr(op, "assigned_variables"):
        raise ValueError(
            f"combine_assignments: {op!r} is not an mtf.Assign; pass only the "
            "operations of mtf.assign / assign_add / assign_sub.")
      groups.setdefault(op.assign_fn, []).append(op)
    combined = []
    for fn, ops in groups.items():
      if len(ops) == 1:
        combined.append(ops[0])
        continue
      replaced = set(ops)
      self.operations = [op for op in self.operations if op not in replaced]
      variables = [v for op in ops for v in op.assigned_variables]
      values = [t for op in ops for t in op.inputs]
      combined.append(type(ops[0])(variables, values, assign_fn=fn))
    return combined

  def _current_scope(self) -> str:
    parts = [tf.get_current_name_scope()] + self._scope_stack
    return "/".join(p.strip("/") for p in parts if p and p.strip("/"))

  @property
  def to_string(self) -> CallableString:
    """Every operation, one per line (also callable)."""
    return CallableString("\n".join(op.to_string for op in self.operations))

  def unique_name(self, name: str, mark_as_used: bool = True) -> str:
    scope = self._current_scope()
    full = f"{scope}/{name}" if scope else name
    # Case-insensitive, as TensorFlow's own op names: "A" after "a" is "A_1".
    base = full.lower()
    i = self._names_in_use.get(base, 0)
    if i:
      while f"{base}_{i}" in self._names_in_use:
        i += 1
      full = f"{full}_{i}"
    if mark_as_used:
      self._names_in_use[base] = i + 1
      self._names_in_use.setdefault(full.lower(), 1)
    return full

  @contextlib.contextmanager
  def name_scope(self, name: str):
    """Prefixes the names of the mtf ops created inside with `name`."""
    self._scope_stack.append(name)
    try:
      yield
    finally:
      self._scope_stack.pop()

  def mark_lowered_into(self, tf_graph_key) -> None:
    if tf_graph_key in self._lowered_into:
      raise ValueError(
          "This mtf.Graph was already lowered into the current TensorFlow "
          "function/graph. Lower it once per function and reuse that Lowering "
          "(lowering.export_to_tf_tensor / lowered_operation), or build a new "
          "tf.function.")
    self._lowered_into.add(tf_graph_key)


@contextlib.contextmanager
def name_scope(graph_or_mesh, name: str):
  """mtf name scope: `with mtf.name_scope(mesh, "block"): ...`."""
  graph = graph_or_mesh.graph if isinstance(graph_or_mesh, Mesh) else graph_or_mesh
  with graph.name_scope(name):
    yield


class Mesh:
  """A named, logical device mesh in an mtf graph.

  Its shape and devices are given only at lowering time, by a `MeshImpl`.
  With a `variable_placer` (e.g. `mtf.utils.BalancedVariablePlacer`, or any
  object with a TF device function `device_function(op)`), every variable
  also gets a full-size master copy on the device the placer picks (see
  mesh_tensorflow/lowering/master_variables.py); without one, variables
  exist only as slices on the mesh's own devices.

  Example:
    >>> mesh = mtf.Mesh(graph, "my_mesh")
  """

  def __init__(self, graph: Graph, name: str, variable_placer=None):
    if not isinstance(graph, Graph):
      raise TypeError(f"Mesh {name!r}: graph must be an mtf.Graph, got {graph!r}.")
    self._graph = graph
    self._name = name
    self._variable_placer = variable_placer

  @property
  def graph(self) -> Graph:
    return self._graph

  @property
  def variable_placer(self):
    """The placer of master variables, or None (no master copies)."""
    return self._variable_placer

  @property
  def name(self) -> str:
    return self._name

  def __repr__(self):
    return f"Mesh({self._name!r})"


# The functions behind Tensor's Python operators (`x + y`, `-x`, `x < y`), by
# operator name ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow",
# "lt", "le", "gt", "ge", "neg", "abs"). Declared here, where the operators
# use them; mesh_tensorflow.operations.elementwise, which defines those operations,
# fills it when it is imported.
TENSOR_OPERATORS: Dict[str, Callable] = {}


def _operator_function(name: str) -> Callable:
  try:
    return TENSOR_OPERATORS[name]
  except KeyError:
    raise TypeError(f"mtf.Tensor operator {name!r} needs mesh_tensorflow.operations.elementwise: "
                    "import mesh_tensorflow first.") from None


def _binary_operator(name: str, reflected: bool = False):
  if reflected:
    return lambda self, other: _operator_function(name)(other, self)
  return lambda self, other: _operator_function(name)(self, other)


def _unary_operator(name: str):
  return lambda self: _operator_function(name)(self)


class Tensor:
  """A tensor over named dimensions, the output of an mtf `Operation`."""

  def __init__(self, operation: "Operation", shape, dtype, name=None, index=0):
    if not isinstance(dtype, tf.DType):
      dtype = tf.as_dtype(dtype)
    self._operation = operation
    self._shape = convert_to_shape(shape)
    self._dtype = dtype
    self._name = name or f"{operation.name}:{index}"
    self._index = index

  operation = property(lambda self: self._operation)
  shape = property(lambda self: self._shape)
  dtype = property(lambda self: self._dtype)
  name = property(lambda self: self._name)
  mesh = property(lambda self: self._operation.mesh)
  graph = property(lambda self: self._operation.mesh.graph)
  size = property(lambda self: self._shape.size)

  def __repr__(self):
    return f"Tensor[{self._name}, {self._shape}, {self._dtype.name}]"

  @property
  def to_string(self) -> CallableString:
    """A one-line description (also callable: `op.to_string()`)."""
    return CallableString(repr(self))

  # The arithmetic and comparison operators broadcast by dimension name; the
  # functions behind them are in TENSOR_OPERATORS (see there).
  __add__, __radd__ = _binary_operator("add"), _binary_operator("add", reflected=True)
  __sub__, __rsub__ = _binary_operator("sub"), _binary_operator("sub", reflected=True)
  __mul__, __rmul__ = _binary_operator("mul"), _binary_operator("mul", reflected=True)
  __truediv__ = _binary_operator("truediv")
  __rtruediv__ = _binary_operator("truediv", reflected=True)
  __floordiv__ = _binary_operator("floordiv")
  __rfloordiv__ = _binary_operator("floordiv", reflected=True)
  __mod__, __rmod__ = _binary_operator("mod"), _binary_operator("mod", reflected=True)
  __pow__ = _binary_operator("pow")
  __lt__, __le__ = _binary_operator("lt"), _binary_operator("le")
  __gt__, __ge__ = _binary_operator("gt"), _binary_operator("ge")
  __neg__, __abs__ = _unary_operator("neg"), _unary_operator("abs")

  __hash__ = object.__hash__

  def __bool__(self):
    raise TypeError(
        f"{self!r} has no Python truth value: mtf tensors are symbolic. Use "
        "mtf.where / mtf.logical_* for conditions.")


class Operation:
  """Base class of mtf operations.

  Subclasses set `self._outputs` and implement `lower(lowering)`; those that are
  differentiable implement `gradient(grad_ys)` returning one gradient (or None)
  per input.
  """

  has_gradient = False

  def __init__(self, inputs: Sequence[Tensor], mesh: Optional[Mesh] = None,
               name: Optional[str] = None):
    inputs = list(inputs)
    if mesh is None:
      if not inputs:
        raise ValueError(f"Operation {name!r} needs a mesh or at least one input.")
      mesh = inputs[0].mesh
    for t in inputs:
      if not isinstance(t, Tensor):
        raise TypeError(
            f"Operation {name or type(self).__name__!r}: input {t!r} is not an "
            "mtf.Tensor; import TensorFlow values with mtf.import_tf_tensor or "
            "mtf.constant.")
      if t.mesh.graph is not mesh.graph:
        raise ValueError(
            f"Operation {name or type(self).__name__!r}: input {t.name!r} belongs "
            "to a different mtf.Graph. Build all tensors of a computation in one "
            "graph.")
      if t.mesh is not mesh and not getattr(self, "allows_other_meshes", False):
        raise ValueError(
            f"Operation {name or type(self).__name__!r}: input {t.name!r} lives on "
            f"mesh {t.mesh.name!r} but the operation runs on mesh {mesh.name!r}. "
            "Build both on one mesh, or move the value between meshes by "
            "exporting it to TensorFlow and importing it again.")
    self._inputs = inputs
    self._mesh = mesh
    self._outputs: List[Tensor] = []
    self._name = mesh.graph.unique_name(name or type(self).__name__)
    mesh.graph.operations.append(self)

  name = property(lambda self: self._name)
  mesh = property(lambda self: self._mesh)
  graph = property(lambda self: self._mesh.graph)
  inputs = property(lambda self: list(self._inputs))
  outputs = property(lambda self: list(self._outputs))

  # Splittability: the dimensions the
  # op's per-slice computation accepts split as they are, and those it needs
  # whole (which the lowering gathers first when a layout splits them). Ops
  # that need some dimension whole override _unsplittable_dim_names, or set
  # both attributes in their constructor.
  _splittable_dims: Optional[FrozenSet[str]] = None
  _unsplittable_dims: Optional[FrozenSet[str]] = None

  @property
  def splittable_dims(self) -> FrozenSet[str]:
    """Names of the dimensions this op computes on split, slice by slice."""
    return self._splittability()[0]

  @property
  def unsplittable_dims(self) -> FrozenSet[str]:
    """Names of the dimensions this op needs whole on every processor."""
    return self._splittability()[1]

  def _splittability(self):
    if self._splittable_dims is None or self._unsplittable_dims is None:
      present = {n for t in self._inputs + self._outputs for n in t.shape.dimension_names}
      self._splittable_dims, self._unsplittable_dims = (
          self._initialize_splittable_and_unsplittable_dims(
              "splittable", present & set(self._unsplittable_dim_names())))
    return self._splittable_dims, self._unsplittable_dims

  def _unsplittable_dim_names(self) -> Iterable[str]:
    return ()

  def _initialize_all_dimensions_as_splittable(self):
    """(all dimension names of inputs and outputs, no names)."""
    return self._initialize_splittable_and_unsplittable_dims("splittable")

  def _initialize_splittable_and_unsplittable_dims(self, default_splittability: str,
                                                   exception_dims_iterable=None):
    """(splittable, unsplittable) frozensets of dimension names: every dimension
    of the inputs and outputs is `default_splittability` ("splittable" or
    "unsplittable") except the names in `exception_dims_iterable`."""
    exceptions = set(exception_dims_iterable or ())
    others = set()
    for t in self._inputs + self._outputs:
      others.update(n for n in t.shape.dimension_names if n not in exceptions)
    if default_splittability == "splittable":
      return frozenset(others), frozenset(exceptions)
    if default_splittability == "unsplittable":
      return frozenset(exceptions), frozenset(others)
    raise ValueError(
        f"Operation {self._name!r}: default_splittability must be 'splittable' or "
        f"'unsplittable', got {default_splittability!r}.")

  def __repr__(self):
    ins = ", ".join(t.name for t in self._inputs)
    return f"{type(self).__name__}[{self._name}]({ins})"

  @property
  def to_string(self) -> CallableString:
    """'name (Type): inputs -> outputs', with shapes (also callable)."""
    ins = ", ".join(f"{t.name}[{t.shape.to_string}]" for t in self._inputs)
    outs = ", ".join(f"{t.name}[{t.shape.to_string}]" for t in self._outputs)
    return CallableString(f"{self._name} ({type(self).__name__}): {ins} -> {outs}")

  def replace_inputs(self, replacements: Dict["Tensor", "Tensor"]) -> List["Tensor"]:
    """Rewires this operation to read other tensors of the same shape and
    dtype (a graph rewrite, e.g. ZeRO stage 3's backward pass reading a
    variable again); returns the previous inputs.

    Example:
      >>> previous = op.replace_inputs({w: w_read_again})
    """
    previous = list(self._inputs)
    for old, new in replacements.items():
      if old.shape != new.shape or old.dtype != new.dtype:
        raise ValueError(f"Operation {self._name!r}: cannot replace input {old.name} "
                         f"[{old.shape}, {old.dtype.name}] by {new.name} "
                         f"[{new.shape}, {new.dtype.name}].")
    self._inputs = [replacements.get(t, t) for t in self._inputs]
    return previous

  def lower(self, lowering) -> None:
    raise NotImplementedError(f"{type(self).__name__} cannot be lowered.")

  # For an operation without a plan (no communication), the kind of local
  # work it does, which the cost model prices: "elementwise" (one FLOP per
  # output element), "copy" (broadcast, transpose), "identity", "import",
  # "constant"; None for any other (one kernel on the inputs' slices).
  local_kernel: Optional[str] = None

  def plan(self, mesh):
    """What this operation communicates under a layout, as a plan of
    mesh_tensorflow.lowering.plans (e.g. a LocalPlan: the operands' moves, a
    local kernel, the results' moves), given a `plans.PlanMesh`. Its
    lowering executes this plan and the cost model prices it. None (the
    default): no communication, one local kernel on the inputs' slices.

    Example:
      >>> op.plan(lowering.plan_mesh(op))
    """
    del mesh
    return None

  def gradient(self, grad_ys):
    raise ValueError(
        f"Operation {self._name!r} ({type(self).__name__}) has no gradient; "
        "wrap it in mtf.stop_gradient or use mtf.custom_gradient.")

  def gradient_for(self, grad_ys, needed: Sequence[bool]):
    """Like gradient(), but ops may skip building gradients of inputs whose
    `needed` entry is False (mtf.gradients calls this)."""
    del needed
    return self.gradient(grad_ys)

from mesh_tensorflow.core import autograph_exempt as _autograph_exempt  # noqa: E402  pylint: disable=g-import-not-at-top
_autograph_exempt.exempt(globals())  # AutoGraph leaves this module's code alone
