"""Lowering: turns an mtf graph into TensorFlow ops, one mesh implementation
per mesh, and counts what it emits.

    >>> lowering = mtf.Lowering(graph, {mesh: mesh_impl})
    >>> tf_loss = lowering.export_to_tf_tensor(loss)
    >>> print(lowering.report())
"""

from __future__ import annotations

import collections
import contextlib
import gc
from typing import Dict, List

import tensorflow as tf

from mesh_tensorflow.core.graph import Graph, Mesh, Operation, Tensor
from mesh_tensorflow.lowering import observers, plans, slice_variables
from mesh_tensorflow.lowering.mesh_impl import LaidOutTensor, MeshImpl, as_laid_out, partial_sum_axes


@contextlib.contextmanager
def _cyclic_gc_paused():
  """Pauses Python's cyclic garbage collector while lowering.

  Lowering a large mesh creates tens of thousands of TensorFlow ops, and with
  them enough Python objects to start many collections, each of which walks
  every live object (the traced graph included). Paused, the lowering of the
  64-device benchmark transformer takes about 5% less time.
  Reference counting still frees everything that is not in a cycle, and the
  collector resumes (if it was on) as soon as lowering ends or fails.
  """
  was_enabled = gc.isenabled()
  gc.disable()
  try:
    yield
  finally:
    if was_enabled:
      gc.enable()


class Lowering:
  """Lowers every operation of `graph` with the given mesh implementations.

  Works eagerly, inside a `tf.function` (slice variables are created once, on
  the first trace, and reused afterwards) and in a `tf.compat.v1` graph.

  Args:
    graph: the mtf.Graph.
    mesh_to_impl: {mtf.Mesh: MeshImpl}.

  Example:
    >>> @tf.function
    ... def step():
    ...   lowering = mtf.Lowering(graph, {mesh: impl})
    ...   return lowering.export_to_tf_tensor(loss)
  """

  def __init__(self, graph: Graph, mesh_to_impl: Dict[Mesh, MeshImpl], *,
               counting_only: bool = False):
    # counting_only: lowered to read the counters only (the cost model's exact
    # mode): imported TensorFlow tensors are stood in for by zeros of their
    # shape (they may belong to another graph), and the mtf graph is not
    # marked as lowered into the current TensorFlow graph.
    self.counting_only = counting_only
    if not isinstance(graph, Graph):
      raise TypeError(f"Lowering: graph must be an mtf.Graph, got {graph!r}.")
    self.graph = graph
    self.mesh_to_impl = dict(mesh_to_impl)
    for mesh, impl in self.mesh_to_impl.items():
      if not isinstance(mesh, Mesh) or not isinstance(impl, MeshImpl):
        raise TypeError(
            "Lowering: mesh_to_impl must map mtf.Mesh to a MeshImpl, got "
            f"{mesh!r}: {impl!r}.")
    for impl in self.mesh_to_impl.values():
      impl.check_can_lower()
    for op in graph.operations:
      if op.mesh not in self.mesh_to_impl:
        raise ValueError(
            f"Lowering: operation {op.name!r} runs on mesh {op.mesh.name!r}, which "
            "has no mesh implementation. Pass {mesh: mesh_impl} for every mesh.")
    # Lowering a graph twice into one tf.function, or a graph with variables
    # twice into one TF1 graph, would make its variables twice: refused. A
    # graph without variables may be lowered again into a TF1 graph (each
    # lowering makes its own ops).
    if not tf.executing_eagerly() and not counting_only and (tf.inside_function() or graph.all_variables):
      graph.mark_lowered_into(tf.compat.v1.get_default_graph())
    self.tensors: Dict[Tensor, object] = {}
    self.completed_sums: Dict[Tensor, object] = {}  # pending sums laid_out completed
    self.operations: Dict[Operation, object] = {}
    self.variables = {}
    self.collective_records: List[observers.Collective] = []
    self.flops: Dict[str, int] = collections.defaultdict(int)
    self._random_keys = {}
    self._current_op_name = None
    self._extra_counters: List[tuple] = []
    self._impls = list(self.mesh_to_impl.values())
    with observers.observe(self._count_collective, self._impls), _cyclic_gc_paused():
      self.lower_operations(graph.operations)

  def lower_operations(self, operations) -> None:
    outer = self._current_op_name
    for op in operations:
      self._current_op_name = op.name
      with tf.name_scope(_tf_scope_name(op.name)):
        op.lower(self)
    self._current_op_name = outer

  # ---- accessors -----------------------------------------------------------
  def mesh_impl(self, x) -> MeshImpl:
    mesh = x if isinstance(x, Mesh) else x.mesh
    try:
      return self.mesh_to_impl[mesh]
    except KeyError:
      raise ValueError(f"No mesh implementation for mesh {mesh.name!r}.") from None

  def set_tensor_lowering(self, mtf_tensor: Tensor, lowered) -> None:
    self.tensors[mtf_tensor] = lowered

  def laid_out(self, mtf_tensor: Tensor) -> LaidOutTensor:
    """The slices of `mtf_tensor`, completing any pending allreduce."""
    try:
      value = self.tensors[mtf_tensor]
    except KeyError:
      raise ValueError(
          f"Tensor {mtf_tensor.name!r} was not lowered; it may come from another "
          "mtf.Graph or from inside a while_loop body.") from None
    laid_out = as_laid_out(value)
    if laid_out is not value:  # replica_stats reads the partial sums later
      self.completed_sums[mtf_tensor] = value
    self.tensors[mtf_tensor] = laid_out
    return laid_out

  def computed_slices(self, mtf_tensor: Tensor) -> list:
    """The per-processor TensorFlow tensors `mtf_tensor` was computed as,
    without completing a pending sum (its partial slices): something that
    waits on them waits for the computation, not for an allreduce that the
    tensor's readers may not need.

    Example:
      >>> with tf.control_dependencies(lowering.computed_slices(dy)): ...
    """
    if mtf_tensor not in self.tensors:
      self.laid_out(mtf_tensor)  # its error names the tensor
    value = self.tensors[mtf_tensor]
    if partial_sum_axes(value):
      value = value.laid_out_input
    return value.tensor_list

  def plan_mesh(self, op: Operation):
    """The PlanMesh that `op.plan` takes when `op` is lowered: its mesh
    implementation's layouts and the placement of the tensors lowered so far."""
    return self.mesh_impl(op).plan_mesh(
        lambda t: partial_sum_axes(self.tensors.get(t)),
        lambda t: (partial_sum_axes(self.tensors.get(t))
                   or partial_sum_axes(self.completed_sums.get(t))))

  def imported_value(self, source, shape) -> tf.Tensor:
    """The TensorFlow value an import of `source` (a tensor or tf.Variable)
    lowers: the source itself, or zeros of `shape` when counting only."""
    if self.counting_only:
      return tf.zeros(shape.to_integer_list(), source.dtype)
    value = tf.convert_to_tensor(source)
    if not value.shape.is_fully_defined():
      value = tf.ensure_shape(value, shape.to_integer_list())
    return value

  def lower_with_plan(self, op: Operation, plan, fn=None, extra=()) -> list:
    """Runs LocalPlan `plan` of `op` (see plans.py) with kernel `fn` on the
    lowered inputs (then `extra` per-processor arguments, such as slice
    offsets). Returns the results; unless the plan combines them, they also
    become `op`'s outputs.

    Example:
      >>> lowering.lower_with_plan(op, op.plan(lowering.plan_mesh(op)), fn)
    """
    impl = self.mesh_impl(op)
    operands = []
    for o in plan.operands:
      t = op.inputs[o.input]
      if not o.partial:
        operands.append(self.laid_out(t))
        continue
      value = self.tensors.get(t)
      if partial_sum_axes(value) is None:  # completed by a consumer before
        value = self.completed_sums.get(t, value)
      if o.partial == plans.TAKES_PARTIAL and value.is_pending:
        value.derived()
      operands.append(value.laid_out_input)
    results = impl.execute_local(operands, plan, fn, extra)
    if plan.flops:
      self.add_flops(plan.flops)
    if not plan.combined:
      for out, value in zip(op.outputs, results):
        self.set_tensor_lowering(out, value)
    return results

  def lower_kernels(self, op: Operation, plan, fns, extra=None) -> None:
    """Runs KernelPlan `plan` of `op` (see plans.py) with one function per
    kernel on the lowered inputs; its outputs become `op`'s.

    Example:
      >>> lowering.lower_kernels(op, op.plan(lowering.plan_mesh(op)), [max_fn, ...])
    """
    operands = [self.laid_out(op.inputs[o.input]) for o in plan.operands]
    outputs = self.mesh_impl(op).execute_kernels(operands, plan, fns, extra)
    if plan.flops:
      self.add_flops(plan.flops)
    for out, value in zip(op.outputs, outputs):
      self.set_tensor_lowering(out, value)

  def export_to_tf_tensor(self, x: Tensor) -> tf.Tensor:
    """The full value of mtf tensor `x` as one TensorFlow tensor."""
    if not isinstance(x, Tensor):
      raise TypeError(f"export_to_tf_tensor expects an mtf.Tensor, got {x!r}.")
    impl = self.mesh_impl(x)
    self._current_op_name = "export/" + x.name
    with observers.observe(self._count_collective, self._impls):
      return impl.export_to_tf_tensor(self.laid_out(x), x.shape)

  def lowered_operation(self, op: Operation):
    """The TensorFlow op that a stateful mtf op (e.g. assign) became."""
    if op in self.operations:
      return self.operations[op]
    if isinstance(op, Tensor):
      return self.export_to_tf_tensor(op)
    raise ValueError(f"Operation {op.name!r} has no lowered TensorFlow operation.")

  def copy_masters_to_slices(self):
    """Assigns the slices of every variable from its master copy (kept only
    when the mesh has a variable placer, see master_variables.py; otherwise a
    no-op)."""
    from mesh_tensorflow.lowering import master_variables  # pylint: disable=g-import-not-at-top
    return master_variables.copy_masters_to_slices(self)

  def copy_slices_to_masters(self):
    """Assigns every master copy the full value of its slices (a no-op
    without master copies)."""
    from mesh_tensorflow.lowering import master_variables  # pylint: disable=g-import-not-at-top
    return master_variables.copy_slices_to_masters(self)

  def random_key(self, mesh_impl) -> tf.Tensor:
    """A per-execution int64 key for layout-invariant random ops."""
    if mesh_impl not in self._random_keys:
      self._random_keys[mesh_impl] = slice_variables.next_step_key(mesh_impl)
    return self._random_keys[mesh_impl]

  def set_random_key(self, mesh_impl, key: tf.Tensor) -> None:
    """Makes random ops lowered from now on use `key` (a while_loop gives
    each iteration its own)."""
    self._random_keys[mesh_impl] = key

  # ---- counters ------------------------------------------------------------
  def _count_collective(self, record: observers.Collective) -> None:
    """The observer subscribed (for this lowering's mesh implementations)
    while lowering: files each collective under the current operation."""
    self.collective_records.append(record._replace(op_name=self._current_op_name))

  def record_collective(self, kind, mesh_axes, nbytes, group_size, num_groups):
    """Records one collective under the operation being lowered (custom
    operations that communicate by other means may call it)."""
    self.collective_records.append(observers.Collective(
        self._current_op_name, kind, tuple(mesh_axes), nbytes, group_size, num_groups))

  def laid_out_size(self, tensor: Tensor) -> int:
    """Elements of `tensor` held on all processors together (replicas
    counted)."""
    impl = self.mesh_impl(tensor)
    return impl.slice_size(tensor.shape) * impl.size

  def verify_slice_shapes(self, tensor: Tensor, laid_out_tensor) -> None:
    """Raises ValueError if a slice's static shape is not the one the layout
    gives `tensor`."""
    expected = self.mesh_impl(tensor).slice_shape(tensor.shape)
    for pnum, t in enumerate(as_laid_out(laid_out_tensor).tensor_list):
      if t.shape.is_fully_defined() and t.shape.as_list() != expected:
        raise ValueError(
            f"Slice {pnum} of {tensor.name} has shape {t.shape.as_list()}; the layout "
            f"gives {expected} for {tensor.shape}.")

  def add_counter(self, key: str, value) -> None:
    """Adds a (key, value) pair to `counters` (for custom operations)."""
    self._extra_counters.append((key, value))

  def add_flops(self, n: int) -> None:
    self.flops[self._current_op_name] += int(n)

  @property
  def counters(self):
    """(key, value) pairs: 'collectives/<kind>', 'collective_bytes/<kind>'
    (bytes per processor) and 'flops' (per processor)."""
    out = []
    for r in self.collective_records:
      out.append((f"collectives/{r.kind}", 1))
      out.append((f"collective_bytes/{r.kind}", r.bytes_per_processor))
    out.append(("flops", sum(self.flops.values())))
    return out + list(self._extra_counters)

  def collective_counts(self, op_name_prefix: str = ""):
    """{kind: (number of collectives, bytes per processor)}."""
    out = {}
    for r in self.collective_records:
      if r.op_name and r.op_name.startswith(op_name_prefix):
        n, b = out.get(r.kind, (0, 0))
        out[r.kind] = (n + 1, b + r.bytes_per_processor)
    return out

  def report(self) -> str:
    """A table of per-op FLOPs and collectives, then totals."""
    per_op = collections.OrderedDict()
    for name, fl in self.flops.items():
      per_op.setdefault(name, {"flops": 0, "comm": []})["flops"] += fl
    for r in self.collective_records:
      per_op.setdefault(r.op_name, {"flops": 0, "comm": []})["comm"].append(r)
    lines = [f"{'operation':<48} {'flops/proc':>12}  collectives (bytes per processor)"]
    for name, info in per_op.items():
      comm = ", ".join(f"{r.kind}{list(r.mesh_axes)}:{r.bytes_per_processor}"
                       for r in info["comm"])
      lines.append(f"{name[:48]:<48} {info['flops']:>12}  {comm}")
    lines.append(pretty_print_counters(self.counters))
    return "\n".join(lines)


def _tf_scope_name(name: str) -> str:
  return "".join(c if c.isalnum() or c in "_-./" else "_" for c in name).strip("/") or "op"


def pretty_print_counters(counters) -> str:
  """Sums (key, value) counters over every '/'-prefix of their keys.

  Example:
    >>> print(mtf.pretty_print_counters(lowering.counters))
  """
  totals = collections.OrderedDict()
  for key, value in counters:
    parts = key.split("/")
    for i in range(1, len(parts) + 1):
      prefix = "/".join(parts[:i])
      totals[prefix] = totals.get(prefix, 0) + value
  lines = []
  for key in sorted(totals):
    depth = key.count("/")
    lines.append(f"{'  ' * depth}{key.split('/')[-1]}: {totals[key]:,}")
  return "\n".join(lines)

from mesh_tensorflow.core import autograph_exempt as _autograph_exempt  # noqa: E402  pylint: disable=g-import-not-at-top
_autograph_exempt.exempt(globals())  # AutoGraph leaves this module's code alone
