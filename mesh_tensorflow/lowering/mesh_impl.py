"""The interface between mtf graphs and a concrete set of devices.

A `MeshImpl` knows the mesh shape and the layout rules, and how to compute on
slices and communicate between processors. `PlacementMeshImpl` (one op per
device) implements it; other implementations (SIMD, one program per processor)
share everything in this file.

Slices of one mtf tensor on a mesh form a `LaidOutTensor`. Results of sums over
split dimensions may stay pending as a `LazyAllreduceSum`, so that further local
sums happen before the (single) allreduce.
"""

from __future__ import annotations

import contextlib
import math
from typing import Callable, List, Optional, Sequence, Tuple

import tensorflow as tf

from mesh_tensorflow.core import layout as layout_lib
from mesh_tensorflow.core.shapes import Shape, convert_to_shape
from mesh_tensorflow.lowering import observers
from mesh_tensorflow.lowering import plans



class LaidOutTensor:
  """The slices of one tensor, one per processor (in pnum order), placed as
  the layout says: each processor holds its block of the tensor."""

  def __init__(self, tensor_list: Sequence[tf.Tensor]):
    self.tensor_list = list(tensor_list)

  @property
  def all_slices(self):
    return self.tensor_list

  @property
  def partial_sum_axes(self) -> Tuple[int, ...]:
    """Mesh axes over which the slices are partial sums still to be added
    (DTensor's `Partial` placement): none for a laid-out tensor."""
    return ()

  def to_laid_out_tensor(self):
    return self

  def __repr__(self):
    return f"LaidOutTensor({self.tensor_list})"


class LazyAllreduceSum:
  """A tensor placed as partial sums over `mesh_axes` (DTensor's `Partial`):
  each processor holds a summand of its block, and the allreduce that
  completes it waits until something needs the whole value, so that later
  local sums fold in first.

  The mesh implementation decides how a pending sum completes
  (`MeshImpl.complete_pending_sum`; a SIMD program reduces several together).
  Operations make one with `MeshImpl.partial_sum` and read the placement of
  any lowered value with `partial_sum_axes(value)`. `add_counter_fn`
  (the original's argument; the library's own counting is by observers) is
  called once, when the allreduce is made.
  """

  def __init__(self, mesh_impl, laid_out_input: LaidOutTensor, mesh_axes,
               add_counter_fn: Optional[Callable[[], None]] = None):
    self.mesh_impl = mesh_impl
    self.laid_out_input = laid_out_input
    self.mesh_axes = tuple(sorted(mesh_axes))
    self._reduced = None
    self._add_counter_fn = add_counter_fn
    mesh_impl.pending_sum_made(self)

  @property
  def partial_sum_axes(self) -> Tuple[int, ...]:
    """The mesh axes the pending allreduce runs over."""
    return self.mesh_axes

  def to_laid_out_tensor(self) -> LaidOutTensor:
    if self._reduced is None:
      if self._add_counter_fn is not None:
        self._add_counter_fn()
      self._reduced = self.mesh_impl.complete_pending_sum(self)
    return self._reduced

  def set_reduced(self, value: "LaidOutTensor") -> None:
    """Completes the sum with `value` (its allreduce, done by the caller)."""
    if self._reduced is None and self._add_counter_fn is not None:
      self._add_counter_fn()
    self._reduced = value

  def derived(self) -> None:
    """Tells the implementation that a new pending sum was made from this
    one's partial sums: this one is then reduced only if something needs it
    (not along with others)."""
    self.mesh_impl.pending_sum_folded(self)

  @property
  def is_pending(self) -> bool:
    return self._reduced is None

  def combine(self, other, tf_fn) -> "LazyAllreduceSum | LaidOutTensor":
    """tf_fn (add or subtract) of self and other: two pending sums over the
    same mesh axes combine their partial sums and stay pending (one allreduce
    later instead of two); otherwise both are reduced first.

    Example:
      >>> total = lazy_a.combine(lazy_b, tf.add)   # still one pending allreduce
    """
    if isinstance(other, LazyAllreduceSum) and other.mesh_axes == self.mesh_axes:
      self.derived()
      other.derived()
      return LazyAllreduceSum(self.mesh_impl, self.mesh_impl.slicewise(
          tf_fn, self.laid_out_input, other.laid_out_input), self.mesh_axes)
    return self.mesh_impl.slicewise(tf_fn, self.to_laid_out_tensor(), as_laid_out(other))

  def __add__(self, other):
    return self.combine(other, tf.add)


def partial_sum_axes(value) -> Optional[Tuple[int, ...]]:
  """The mesh axes over which a lowered value (what `lowering.tensors`
  holds) is a pending sum, or None when it is laid out whole.

  Example:
    >>> partial_sum_axes(lowering.tensors[grad])   # a data-parallel gradient
    (0,)
  """
  axes = getattr(value, "partial_sum_axes", ())
  return tuple(axes) if axes else None


def compatible_lazy_allreduce_sums(xs) -> bool:
  """Whether `xs` is a non-empty list of pending sums (`LazyAllreduceSum`) on
  one mesh implementation over the same mesh axes, so that they can be
  combined before a single allreduce.

  Example:
    >>> if mtf.compatible_lazy_allreduce_sums([a, b]):
    ...   total = a.combine(b, tf.add)
  """
  xs = list(xs)
  if not xs or not all(isinstance(x, LazyAllreduceSum) for x in xs):
    return False
  return all(x.mesh_impl is xs[0].mesh_impl and x.mesh_axes == xs[0].mesh_axes
             for x in xs[1:])


class LazyLaidOutTensor:
  """A laid-out tensor computed on demand: `to_laid_out_tensor()` calls
  `to_laid_out_tensor_fn()` each time (a lowering may store one of these in
  `lowering.tensors` to recompute a cheap value where it is used).

  Example:
    >>> lazy = mtf.LazyLaidOutTensor(lambda: impl.slicewise(tf.zeros_like, x),
    ...                              impl.slice_shape(shape))
  """

  def __init__(self, to_laid_out_tensor_fn: Callable[[], LaidOutTensor], slice_shape):
    self._to_laid_out_tensor_fn = to_laid_out_tensor_fn
    self._slice_shape = slice_shape

  def to_laid_out_tensor(self) -> LaidOutTensor:
    return self._to_laid_out_tensor_fn()

  @property
  def slice_shape(self):
    return self._slice_shape


def as_laid_out(x):
  return x.to_laid_out_tensor() if hasattr(x, "to_laid_out_tensor") else x


def convert_args_to_laid_out_tensors(xs) -> list:
  """`xs` with pending sums completed (`LazyAllreduceSum` -> `LaidOutTensor`);
  other values (laid-out tensors, numbers, TF tensors) pass through. For
  custom lowerings that hand lowered inputs to `mesh_impl.slicewise`.

  Example:
    >>> x, y = mtf.convert_args_to_laid_out_tensors([lowering.tensors[a], 2.0])
  """
  return [as_laid_out(x) for x in xs]


class MeshImpl:
  """Shape, layout rules and the operations every mesh implementation provides.

  Args:
    shape: the mesh shape, e.g. "rows:2;cols:4".
    layout_rules: e.g. "batch:rows;hidden:cols".
  """

  def __init__(self, shape, layout_rules):
    self._shape = convert_to_shape(shape)
    if self._shape is None:
      raise ValueError(f"Invalid mesh shape {shape!r}; write e.g. 'rows:2;cols:4'.")
    empty = [d for d in self._shape.dims if d.size < 1]
    if empty:
      raise ValueError(
          f"Mesh shape {shape if isinstance(shape, str) else self._shape.to_string!r}: mesh "
          f"dimension {empty[0].name!r} has size {empty[0].size}; every mesh dimension "
          "needs at least 1 processor (e.g. 'rows:2;cols:4').")
    self._layout_rules = layout_lib.convert_to_layout_rules(layout_rules)
    self._layout_rules.check_mesh_shape(self._shape)
    self._layout_cache = {}

  shape = property(lambda self: self._shape)
  ndims = property(lambda self: self._shape.ndims)
  size = property(lambda self: self._shape.size)
  layout_rules = property(lambda self: self._layout_rules)

  @property
  def keeps(self) -> dict:
    """What other modules keep with this implementation, under keys they
    name: the slice variables of each TensorFlow program
    (`slice_variables`), a checkpoint that new variables start from, the
    shapes ZeRO stores variables in, host-offload implementations.

    Example:
      >>> impl.keeps.setdefault("my_module", {})["note"] = 1
    """
    return self.__dict__.setdefault("_keeps", {})

  # ---- capabilities the lowering asks about ----------------------------------
  @property
  def shares_replicas(self) -> bool:
    """Whether processors holding the same slice share one TensorFlow tensor
    (one memory): then a LocalPlan's moves may realize a collective
    (`counted_as`: an einsum's allreduce made by gathering its operands) and
    its kernel may run once on joined blocks (`batch_axes`)."""
    return False

  def gathers_without_copy(self, x, mesh_axis: int, concat_axis: int) -> bool:
    """Whether allconcat(x, mesh_axis, concat_axis) would return tensors
    that already exist (x's slices are blocks of one tensor), so joining
    them costs nothing."""
    del x, mesh_axis, concat_axis
    return False

  # ---- pending sums (partial placement) -------------------------------------
  def partial_sum(self, x: LaidOutTensor, mesh_axes) -> "LazyAllreduceSum | LaidOutTensor":
    """x's slices as partial sums over `mesh_axes`, their allreduce pending
    (x itself when there are none).

    Example:
      >>> y = impl.partial_sum(local_products, [1])   # Partial over mesh axis 1
    """
    mesh_axes = tuple(mesh_axes)
    return LazyAllreduceSum(self, x, mesh_axes) if mesh_axes else x

  def pending_sum_made(self, lazy: LazyAllreduceSum) -> None:
    """Called for every new pending sum on this mesh (an implementation that
    completes several together keeps track of them)."""

  def pending_sum_folded(self, lazy: LazyAllreduceSum) -> None:
    """`lazy`'s partial sums went into another pending sum: it completes
    only if something still needs it."""

  def complete_pending_sum(self, lazy: LazyAllreduceSum) -> LaidOutTensor:
    """The allreduce that completes `lazy` (its plan: one AllReduce step)."""
    return self.execute(lazy.laid_out_input, plans.AllReduce(lazy.mesh_axes, "SUM"))

  @property
  def supports_control_dependencies(self) -> bool:
    """Whether ops on this mesh may take TensorFlow control dependencies."""
    return True

  def Print(self, x, data, message: str, **kwargs) -> "LaidOutTensor":  # pylint: disable=invalid-name
    """x (a LaidOutTensor), after printing `message` and each processor's
    slices of `data` (LaidOutTensors) with tf.print when it runs.

    Example:
      >>> y = impl.Print(laid_x, [laid_x], "x is")
    """
    data = [as_laid_out(d) for d in data]

    def fn(t, *slices):
      with tf.control_dependencies([tf.print(message, *slices, **kwargs)]):
        return tf.identity(t)
    return self.slicewise(fn, x, *data)

  def __repr__(self):
    return (f"{type(self).__name__}(shape='{self._shape.to_string()}', "
            f"layout='{self._layout_rules.to_string()}')")

  # ---- layouts -------------------------------------------------------------
  def tensor_dimension_to_mesh_axis(self, tensor_dimension) -> Optional[int]:
    return self._layout_rules.tensor_dimension_to_mesh_axis(tensor_dimension, self._shape)

  def tensor_layout(self, arg, tensor_name: str = "") -> layout_lib.TensorLayout:
    shape = arg.shape if hasattr(arg, "operation") else convert_to_shape(arg)
    if not tensor_name and hasattr(arg, "operation"):
      tensor_name = arg.name
    try:
      return self._layout_cache[shape]
    except KeyError:
      pass
    result = self._layout_rules.tensor_layout(shape, self._shape, tensor_name)
    self._layout_cache[shape] = result
    return result

  def mesh_axis_size(self, mesh_axis: int) -> int:
    return self._shape.dims[mesh_axis].size

  def slice_shape(self, tensor_shape) -> List[int]:
    tensor_shape = convert_to_shape(tensor_shape)
    layout = self.tensor_layout(tensor_shape)
    return [d.size if a is None else d.size // self._shape.dims[a].size
            for d, a in zip(tensor_shape.dims, layout)]

  def slice_size(self, tensor_shape) -> int:
    """Number of elements of one processor's slice."""
    return math.prod(self.slice_shape(tensor_shape))

  def slice_begin(self, tensor_shape, pnum: int) -> List[int]:
    tensor_shape = convert_to_shape(tensor_shape)
    layout = self.tensor_layout(tensor_shape)
    coords = self.pnum_to_processor_coordinates(pnum)
    sizes = self.slice_shape(tensor_shape)
    return [0 if a is None else coords[a] * s for a, s in zip(layout, sizes)]

  def laid_out_size(self, tensor_shape) -> int:
    """Number of elements of all processors' slices together (replicas
    counted): `slice_size(tensor_shape) * size`. For the
    elements one processor holds, use `slice_size`.

    Example:
      >>> impl = PlacementMeshImpl("rows:2;cols:4", "batch:rows", devices)
      >>> impl.slice_size("batch:8;d:4"), impl.laid_out_size("batch:8;d:4")
      (16, 128)
    """
    return self.slice_size(tensor_shape) * self.size

  def pnum_to_processor_coordinates(self, pnum: int) -> List[int]:
    return layout_lib.pnum_to_processor_coordinates(self._shape, pnum)

  def processor_coordinates_to_pnum(self, coords) -> int:
    return layout_lib.processor_coordinates_to_pnum(self._shape, coords)

  def processor_groups(self, mesh_axes) -> List[List[int]]:
    return layout_lib.processor_groups(self._shape, mesh_axes)

  # ---- counters ------------------------------------------------------------
  def begin_collective(self, kind: str, x, mesh_axis: int):
    """(x as a LaidOutTensor, the number of processors along `mesh_axis`) for
    an implementation's collective `kind` ("allgather", "alltoall") over that
    axis, announced (record_collective) when more than one processor takes
    part; with one, nothing moves and the caller returns x as it is.

    Example:
      >>> x, n = self.begin_collective("alltoall", x, mesh_axis)
      >>> if n == 1:
      ...   return x
    """
    x = as_laid_out(x)
    n = self.mesh_axis_size(mesh_axis)
    if n > 1:
      self.record_collective(kind, x, [mesh_axis])
    return x, n

  def record_collective(self, kind: str, x, mesh_axes) -> None:
    """Announces a collective this implementation runs to whoever observes
    (see observers.py); x is the LaidOutTensor sent (or its per-processor
    size in bytes)."""
    if not observers.observing():
      return
    if isinstance(x, int):
      nbytes = x
    else:
      t = x.tensor_list[0]
      nbytes = t.shape.num_elements() * t.dtype.size if t.shape.is_fully_defined() else 0
    observers.announce(self, observers.collective(kind, mesh_axes, nbytes,
                                                  self._shape.to_integer_list()))

  def unrecorded(self):
    """A context in which this implementation's collectives reach no observer
    (used where it realizes one announced collective with other data
    movement)."""
    return observers.silenced(self)

  # ---- what every implementation provides ---------------------------------
  def slicewise(self, fn: Callable, *inputs):
    raise NotImplementedError

  def allreduce(self, x: LaidOutTensor, mesh_axes, reduction_fn_string: str) -> LaidOutTensor:
    raise NotImplementedError

  def allconcat(self, x: LaidOutTensor, mesh_axis: int, concat_axis: int) -> LaidOutTensor:
    raise NotImplementedError

  def alltoall(self, x: LaidOutTensor, mesh_axis: int, split_axis: int,
               concat_axis: int) -> LaidOutTensor:
    raise NotImplementedError

  def receive(self, x: LaidOutTensor, mesh_axis: int, source_pcoord) -> LaidOutTensor:
    """Each processor receives the slice of the processor at coordinate
    `source_pcoord[c]` along `mesh_axis` (its own coordinate being `c`), or
    zeros where that is None."""
    raise NotImplementedError

  def shift_by_n_processors(self, x: LaidOutTensor, mesh_axis: int, offset: int,
                            wrap: bool) -> LaidOutTensor:
    """Each processor receives the slice of the processor `offset` before it
    along `mesh_axis` (zeros past the end unless `wrap`)."""
    n = self.mesh_axis_size(mesh_axis)
    sources = [(c - offset) % n if wrap or 0 <= c - offset < n else None for c in range(n)]
    return self.receive(x, mesh_axis, sources)

  def einsum(self, equation: str, *slices) -> LaidOutTensor:
    """tf.einsum(equation, ...) of every processor's slices."""
    return self.slicewise(lambda *xs: tf.einsum(equation, *xs), *slices)

  def combine_slices(self, slices, tensor_shape, device=None) -> tf.Tensor:
    """The whole tensor from a list of per-processor slices."""
    del device
    return self.export_to_tf_tensor(LaidOutTensor(list(slices)), tensor_shape)

  def random(self, shape, distribution: str, seed: int, key, dtype, row_keys=None,
             **params) -> LaidOutTensor:
    """Layout-invariant random slices (see rng.py): 'uniform' with minval and
    maxval, or 'normal' with mean and stddev. `row_keys` (axis, keys): row i
    along that axis draws from key keys[i] (`mtf.random_ops.keyed_rows`)."""
    from mesh_tensorflow.core import rng
    shape = convert_to_shape(shape)
    full = shape.to_integer_list()
    slice_shape = self.slice_shape(shape)

    def fn(pnum, begin):
      if row_keys is None:
        index = rng.global_index(full, begin, slice_shape)
      else:
        index = rng.keyed_index(full, begin, slice_shape, *row_keys)
      if distribution == "uniform":
        u = rng.uniform(index, seed, key, tf.float32)
        return tf.cast(params["minval"] + (params["maxval"] - params["minval"]) * u, dtype)
      if distribution == "normal":
        z = rng.normal(index, seed, key, tf.float32)
        return tf.cast(params["mean"] + params["stddev"] * z, dtype)
      raise ValueError(f"Unknown distribution {distribution!r}; use 'uniform' or 'normal'.")
    return self.make_slices(fn, shape)

  def slice_along(self, x: LaidOutTensor, mesh_axis: int, tensor_axis: int) -> LaidOutTensor:
    """Splits (locally, no communication) an unsplit tensor axis over mesh_axis."""
    raise NotImplementedError

  def import_tf_tensor(self, x: tf.Tensor, shape) -> LaidOutTensor:
    """x (a tf.Tensor of `shape`'s full size) cut into this mesh's slices."""
    raise NotImplementedError

  def export_to_tf_tensor(self, x: LaidOutTensor, shape) -> tf.Tensor:
    """The full tf.Tensor of the laid-out `x` of `shape`."""
    raise NotImplementedError

  def make_slices(self, fn: Callable[[int, List[int]], tf.Tensor], shape) -> LaidOutTensor:
    """Builds a laid-out tensor from fn(pnum, slice_begin) on each processor."""
    raise NotImplementedError

  def laid_out_pnum(self) -> LaidOutTensor:
    """Each processor's number, an int32 scalar slice (for custom operations)."""
    raise NotImplementedError

  def laid_out_pcoord(self, mesh_axis: int) -> LaidOutTensor:
    """Each processor's coordinate along `mesh_axis`, an int32 scalar slice."""
    sizes = self._shape.to_integer_list()
    stride = math.prod(sizes[mesh_axis + 1:])
    return self.slicewise(lambda p: (p // stride) % sizes[mesh_axis], self.laid_out_pnum())

  def laid_out_slice_num(self, tensor_shape) -> LaidOutTensor:
    """Each processor's slice number of a tensor of `tensor_shape`, an int32
    scalar slice: the row-major index of its slice among the tensor's slices
    (tensor axes in order), so processors holding the same slice (replicas)
    get the same number. Custom operations use it to seed per-slice work.

    Example:
      >>> impl = PlacementMeshImpl("rows:2;cols:4", "batch:rows", devices)
      >>> impl.laid_out_slice_num("batch:8;d:4")   # 0,0,0,0,1,1,1,1
    """
    tensor_shape = convert_to_shape(tensor_shape)
    number = self.slicewise(lambda p: tf.zeros([], tf.int32), self.laid_out_pnum())
    for mesh_axis in self.tensor_layout(tensor_shape):
      if mesh_axis is not None:
        size = self.mesh_axis_size(mesh_axis)
        number = self.slicewise(lambda n, c, size=size: n * size + c, number,
                                self.laid_out_pcoord(mesh_axis))
    return number

  def mesh_axis_to_cumprod(self, tensor_shape) -> List[Optional[int]]:
    """For each mesh axis, the product of the sizes of the tensor dimensions
    before the one it splits (None where it splits none).

    Example:
      >>> impl.mesh_axis_to_cumprod("batch:8;d:4")   # batch:rows -> [1, None]
    """
    tensor_shape = convert_to_shape(tensor_shape)
    sizes = tensor_shape.to_integer_list()
    layout = self.tensor_layout(tensor_shape)
    return [None if axis is None else math.prod(sizes[:axis])
            for axis in layout.mesh_axis_to_tensor_axis(self.ndims)]

  def variable_device(self, pnum: int):
    raise NotImplementedError

  def check_can_lower(self) -> None:
    """Raises a clear error if a Lowering cannot use this implementation now."""

  @property
  def num_local_slices(self) -> int:
    """How many slices a LaidOutTensor holds here: one per processor for
    the placement lowering, one (the processor's own) for the SIMD one."""
    return self.size

  def program_slices(self, sliced) -> list:
    """The slice variables of SlicedVariable `sliced` that the lowered
    program reads and assigns, one per local slice."""
    return sliced.slices

  def slice_device(self, pnum: int):
    """The device scope for ops on local slice `pnum` of a variable."""
    return self.variable_device(pnum)

  # ---- derived operations --------------------------------------------------
  def broadcast_impl(self, old_slices, old_shape, new_shape):
    """Broadcasts slices of old_shape to slices of new_shape (local)."""
    old_shape = convert_to_shape(old_shape)
    new_shape = convert_to_shape(new_shape)
    new_slice_shape = self.slice_shape(new_shape)

    def fn(x):
      return expand_to_shape(x, old_shape, new_shape, new_slice_shape)
    return self.slicewise(fn, old_slices)

  def execute(self, x: LaidOutTensor, plan) -> LaidOutTensor:
    """Runs a plan (see plans.py) on `x`: the steps of a Redistribution (x
    in `plan.source`, returned in `plan.target`), or one step such as an
    AllReduce. The one place where plan steps become this implementation's
    collectives.

    Example:
      >>> plan = plans.plan_relayout((0, None), (None, 0))
      >>> y = impl.execute(laid_out_x, plan)   # one alltoall over mesh axis 0
      >>> total = impl.execute(partial_sums, plans.AllReduce((0,), "SUM"))
    """
    steps = plan.steps if isinstance(plan, plans.Redistribution) else (plan,)
    for step in steps:
      if isinstance(step, plans.AllGather):
        x = self.allconcat(x, step.mesh_axis, step.tensor_axis)
      elif isinstance(step, plans.AllToAll):
        x = self.alltoall(x, step.mesh_axis, split_axis=step.split_axis,
                          concat_axis=step.concat_axis)
      elif isinstance(step, plans.SliceAlong):
        x = self.slice_along(x, step.mesh_axis, step.tensor_axis)
      elif isinstance(step, plans.AllReduce):
        x = self.allreduce(x, list(step.mesh_axes), step.reduction)
      elif isinstance(step, plans.Permute):
        x = self.receive(x, step.mesh_axis, list(step.sources))
      elif isinstance(step, plans.ReduceScatter):
        x = self.reduce_scatter(x, step.mesh_axis, step.tensor_axis)
      elif isinstance(step, plans.JoinBlocks):
        with self.unrecorded():  # the blocks' tensor itself: nothing moves
          x = self.allconcat(x, step.mesh_axis, step.tensor_axis)
      else:
        raise TypeError(f"execute: unknown plan step {step!r}.")
    return x

  def execute_local(self, operands: Sequence[LaidOutTensor], plan: "plans.LocalPlan",
                    fn: Optional[Callable] = None, extra: Sequence = ()) -> list:
    """Runs a LocalPlan: moves each operand, runs fn on every processor's
    slices (unless the plan has no kernel), moves each result and leaves it
    a pending sum where the plan says. Returns the results in order.
    `extra`: more per-processor arguments of fn after the operands (the slice
    offsets of a plan's `coordinates`).

    Example:
      >>> [y] = impl.execute_local([laid_x], plans.plan_unsplit(op, layout_of, {"d"}), fn)
    """
    counted = plan.counted_as
    if counted is not None:  # the moves realize this collective
      self.record_collective(counted.kind, counted.nbytes, counted.mesh_axes)
    with self.unrecorded() if counted is not None else contextlib.nullcontext():
      args = [self.execute(x, o.move) for x, o in zip(operands, plan.operands)]
    if plan.kernel:
      batched = None
      if plan.batch_axes is not None and self.shares_replicas:
        batched = plans.batched_operand(
            plan.batch_axes, lambda i: len({id(t) for t in args[i].tensor_list}) == 1,
            lambda i, axis: self.gathers_without_copy(args[i], axis, 0))
      if batched is not None:  # one kernel on the joined blocks
        args[batched[0]] = self.execute(args[batched[0]], plans.JoinBlocks(batched[1], 0))
      out = self.slicewise(fn, *args, *extra)
      args = list(out) if isinstance(out, tuple) else [out]
      if batched is not None:  # each processor's rows
        args = [self.execute(x, plans.SliceAlong(batched[1], 0)) for x in args]
    return [self._moved_result(x, r) for x, r in zip(args, plan.results)]

  def execute_kernels(self, operands: Sequence[LaidOutTensor], plan: "plans.KernelPlan",
                      fns: Sequence[Callable], extra: Optional[dict] = None) -> list:
    """Runs a KernelPlan: moves each operand, then runs each kernel
    (`fns[i]` for `plan.kernels[i]`, on its `args` values and then the
    per-processor arguments `extra[i]`, if any) and moves its results.
    Returns the values `plan.outputs`.

    Example:
      >>> [y] = impl.execute_kernels([laid_x], softmax_op.plan(mesh), fns)
    """
    values = [self.execute(x, o.move) for x, o in zip(operands, plan.operands)]
    extra = extra or {}
    for i, (kernel, fn) in enumerate(zip(plan.kernels, fns)):
      out = self.slicewise(fn, *[values[a] for a in kernel.args], *extra.get(i, ()))
      out = list(out) if isinstance(out, tuple) else [out]
      values.extend(self._moved_result(x, r) for x, r in zip(out, kernel.results))
    return [values[i] for i in plan.outputs]

  def _moved_result(self, x: LaidOutTensor, result: "plans.Result"):
    """A kernel's result moved as the plan says, left a pending sum there."""
    return self.partial_sum(self.execute(x, result.move), result.pending_sum_axes)

  def plan_mesh(self, partial_sum_axes_of: Optional[Callable] = None,
                summands_axes_of: Optional[Callable] = None) -> "plans.PlanMesh":
    """The PlanMesh of this implementation (layouts, sizes, shared memory);
    partial_sum_axes_of and summands_axes_of tell the placement of lowered
    tensors (see plans.PlanMesh)."""
    return plans.PlanMesh(self.tensor_layout, tuple(self._shape.to_integer_list()),
                          self.shares_replicas, partial_sum_axes_of or (lambda t: None),
                          tuple(self._shape.dimension_names),
                          summands_axes_of or (lambda t: None))

  def relayout(self, x: LaidOutTensor, shape, old_layout, new_layout) -> LaidOutTensor:
    """Moves a tensor from one layout to another with the fewest collectives
    (plans.plan_relayout)."""
    del shape  # the plan needs only the layouts
    return self.execute(x, plans.plan_relayout(old_layout, new_layout))

  def gather_dims(self, x, shape, dim_names) -> LaidOutTensor:
    """Un-splits the named dimensions of a laid-out tensor (allconcat)."""
    shape = convert_to_shape(shape)
    return self.execute(as_laid_out(x),
                        plans.plan_gather_dims(shape, self.tensor_layout(shape), dim_names))

  def reduce_scatter(self, x: LaidOutTensor, mesh_axis: int, split_axis: int) -> LaidOutTensor:
    """Sums partial slices over `mesh_axis` and leaves each processor the
    block of tensor axis `split_axis` at its coordinate: one collective,
    counted as kind "reduce_scatter" (bytes: the partial slice sent).
    Implementations may override; this one sums, then slices locally."""
    x = as_laid_out(x)
    if self.mesh_axis_size(mesh_axis) == 1:
      return x
    self.record_collective("reduce_scatter", x, [mesh_axis])
    with self.unrecorded():
      return self.slice_along(self.allreduce(x, [mesh_axis], "SUM"), mesh_axis, split_axis)



_CACHE_ATTRIBUTE = "_mesh_tensorflow_lowering_cache"


def graph_cache(graph: tf.Graph) -> dict:
  """A dict for tensors that lowering creates once per TensorFlow graph and
  shares (constants, reshapes).

  It lives on the graph object itself, so it goes away with the graph: a
  module-level cache would keep old traced graphs alive, and every garbage
  collection walks all their objects.
  """
  cache = getattr(graph, _CACHE_ATTRIBUTE, None)
  if cache is None:
    cache = {}
    setattr(graph, _CACHE_ATTRIBUTE, cache)
  return cache


def once_per_graph(key: tuple, make):
  """make(), created once per TensorFlow graph for `key` (tensors in it are
  compared by identity) and shared afterwards; eagerly, always make()."""
  if tf.executing_eagerly():
    return make()
  key = tuple(k.ref() if isinstance(k, tf.Tensor) else k for k in key)
  cache = graph_cache(tf.compat.v1.get_default_graph())
  if key not in cache:
    cache[key] = make()
  return cache[key]


def reshape_slice(t: tf.Tensor, shape) -> tf.Tensor:
  """t reshaped to the static `shape` (a list of ints), or t itself when it
  has that shape already: no op to create or run."""
  if t.shape.rank is not None and t.shape.as_list() == list(shape):
    return t
  return tf.reshape(t, int_constant(list(shape)))


def int_constant(values) -> tf.Tensor:
  """An int32 constant (a shape, axis list or slice bound), created once per
  TensorFlow graph and shared by every device's ops: lowering a large mesh
  would otherwise spend much of its time creating identical constants."""
  return shared_constant(values, tf.int32)


def shared_constant(values, dtype: tf.DType) -> tf.Tensor:
  """A constant of `dtype` created once per TensorFlow graph (see int_constant).

  Example:
    >>> zero = shared_constant(0.0, tf.float32)
  """
  def make():
    if tf.executing_eagerly():
      return tf.constant(values, dtype)
    with tf.device(None), tf.name_scope("mtf_constants/"):
      return tf.constant(values, dtype)
  return once_per_graph(
      ("constant", dtype.name, tuple(values) if isinstance(values, (list, tuple)) else values),
      make)


def expand_to_shape(x: tf.Tensor, old_shape: Shape, new_shape: Shape,
                    new_slice_shape=None) -> tf.Tensor:
  """Transposes and broadcasts a slice of old_shape to a slice of new_shape.

  Every dimension of old_shape must be in new_shape. With new_slice_shape
  given, the result is broadcast to it; otherwise missing dims have size 1.
  """
  old_names = old_shape.dimension_names
  new_names = new_shape.dimension_names
  for n in old_names:
    if n not in new_names:
      raise ValueError(f"Cannot broadcast {old_shape} to {new_shape}: {n!r} missing.")
  order = sorted(range(len(old_names)), key=lambda i: new_names.index(old_names[i]))
  if order != list(range(len(order))):
    x = tf.transpose(x, int_constant(order))
  if len(old_names) != len(new_names):
    present = set(old_names)
    # Insert size-1 axes where new_shape has dims that old_shape lacks.
    target = []
    src_dims = tf.shape(x) if not x.shape.is_fully_defined() else x.shape.as_list()
    j = 0
    for n in new_names:
      if n in present:
        target.append(src_dims[j])
        j += 1
      else:
        target.append(1)
    x = tf.reshape(x, int_constant(target) if all(
        isinstance(v, int) for v in target) else target)
  if new_slice_shape is not None and x.shape.as_list() != list(new_slice_shape):
    x = tf.broadcast_to(x, int_constant(list(new_slice_shape)))
  return x

from mesh_tensorflow.core import autograph_exempt as _autograph_exempt  # noqa: E402  pylint: disable=g-import-not-at-top
# Public names only: the private helpers stay plain calls (a wrapper costs
# about 3 us per call while lowering).
_autograph_exempt.exempt(globals(), public_only=True)  # AutoGraph leaves this code alone
