"""Gradient and control-flow operations: stop_gradient, depend, while_loop,
custom_gradient, recompute_grad, Print.

    >>> y = mtf.stop_gradient(x)
    >>> outs = mtf.while_loop(cond_fn, body_fn, [i, total])
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Callable, Dict, List, Sequence

import tensorflow as tf

from mesh_tensorflow.core.graph import LAYER_SCOPES_KEY, Operation, Tensor
from mesh_tensorflow.lowering.mesh_impl import LaidOutTensor
from mesh_tensorflow.operations.constant_ops import zeros
from mesh_tensorflow.operations.gradients import gradients
from mesh_tensorflow.operations.random_ops import RandomOperation


class _IdentityLike(Operation):
  local_kernel = "identity"  # the kind of local work the cost model prices

  def __init__(self, inputs, num_outputs, name, grad=None, control_inputs=()):
    super().__init__(inputs, name=name)
    self._control = list(control_inputs)
    self._grad = grad
    self.has_gradient = True
    # Without a gradient function (stop_gradient) no gradient flows through.
    self.stops_gradient = grad is None
    self._outputs = [Tensor(self, t.shape, t.dtype, index=i)
                     for i, t in enumerate(inputs[:num_outputs])]

  def gradient(self, grad_ys):
    if self._grad is None:
      return [None] * len(self.inputs)
    return self._grad(self, grad_ys)

  def lower(self, lowering):
    deps = [lowering.laid_out(t) for t in self.inputs[len(self.outputs):]]
    deps_ops = [lowering.operations[o] for o in self._control if o in lowering.operations]
    for i, out in enumerate(self.outputs):
      laid = lowering.laid_out(self.inputs[i])
      if not deps and not deps_ops:
        lowering.set_tensor_lowering(out, laid)
        continue
      results = []
      for pnum, t in enumerate(laid.tensor_list):
        ctrl = [d.tensor_list[pnum] for d in deps] + deps_ops
        with tf.control_dependencies(ctrl):
          results.append(tf.identity(t))
      lowering.set_tensor_lowering(out, LaidOutTensor(results))


class StopGradient(_IdentityLike):
  """The identity, without a gradient (mtf.stop_gradient)."""

  def __init__(self, x: Tensor, name=None):
    super().__init__([x], 1, name or "stop_gradient")


class Depend(_IdentityLike):
  """x, once `dependencies` (mtf Operations or Tensors) have run (mtf.depend)."""

  def __init__(self, x: Tensor, dependencies, name=None):
    deps = list(dependencies) if isinstance(dependencies, (list, tuple)) else [dependencies]
    tensors = [d for d in deps if isinstance(d, Tensor)]
    super().__init__([x] + tensors, 1, name or "depend",
                     grad=lambda op, g: [g[0]] + [None] * len(tensors),
                     control_inputs=[d for d in deps if isinstance(d, Operation)])


class PrintOperation(_IdentityLike):
  """x, printing `message` and the full values of `data` when it runs (mtf.Print)."""

  def __init__(self, x: Tensor, data, message: str, name=None, **kwargs):
    del kwargs  # summarize: the values are printed whole
    self._data = list(data)
    self._message = message
    super().__init__([x] + self._data, 1, name or "Print",
                     grad=lambda op, g: [g[0]] + [None] * len(self._data))

  def lower(self, lowering):
    values = [lowering.export_to_tf_tensor(t) for t in self._data]
    with tf.control_dependencies([tf.print(self._message, *values)]):
      laid = lowering.laid_out(self.inputs[0])
      lowering.set_tensor_lowering(
          self.outputs[0], LaidOutTensor([tf.identity(t) for t in laid.tensor_list]))


def stop_gradient(x: Tensor, name=None) -> Tensor:
  """Identity whose gradient is zero."""
  return StopGradient(x, name=name).outputs[0]


def depend(x: Tensor, dependencies, name=None) -> Tensor:
  """x, computed only after `dependencies` (Tensors or ops such as assign).

  Example:
    >>> y = mtf.depend(x, [update_op])
  """
  return Depend(x, dependencies, name=name).outputs[0]


def Print(x: Tensor, data, message: str, summarize: int = 3, name=None) -> Tensor:  # pylint: disable=invalid-name
  """Identity that prints `message` and the full values of `data` when run."""
  return PrintOperation(x, data, message, name=name, summarize=summarize).outputs[0]


class _Placeholder(Operation):
  """Stands for a loop variable inside a while_loop body."""

  def __init__(self, mesh, shape, dtype, name):
    super().__init__([], mesh=mesh, name=name)
    self._outputs = [Tensor(self, shape, dtype)]

  def lower(self, lowering):
    if self.outputs[0] not in lowering.tensors:
      raise ValueError(f"{self.name} is only defined inside its while_loop.")


class WhileLoopOperation(Operation):
  """Runs body_fn while cond_fn holds, as one tf.while_loop over the slices."""

  def __init__(self, cond_fn, body_fn, inputs, num_loop_vars=None, name=None,
               has_accumulators: bool = False, tf_kwargs=None):
    if isinstance(num_loop_vars, dict) or isinstance(name, bool):
      # The positional order (cond_fn, body_fn, inputs, tf_kwargs,
      # has_accumulators, name).
      tf_kwargs, has_accumulators, name = (
          num_loop_vars, bool(name), has_accumulators if isinstance(has_accumulators, str)
          else None)
      num_loop_vars = None
    self._tf_kwargs = _while_loop_kwargs(tf_kwargs)
    inputs = list(inputs)
    if not inputs:
      raise ValueError("mtf.while_loop needs at least one loop variable.")
    n = len(inputs) if num_loop_vars is None else num_loop_vars
    mesh = inputs[0].mesh
    graph = mesh.graph
    start = len(graph.operations)
    try:
      self._placeholders = [_Placeholder(mesh, t.shape, t.dtype, "while_loop/var").outputs[0]
                            for t in inputs[:n]]
      cond = cond_fn(*self._placeholders)
      body = body_fn(*self._placeholders)
      body = list(body) if isinstance(body, (list, tuple)) else [body]
      if has_accumulators and len(body) > n:
        # Each extra output is summed over the iterations: a loop variable
        # that starts at zero and adds the output (made among the body's ops).
        extra = body[n:]
        sums = [_Placeholder(mesh, t.shape, t.dtype, "while_loop/accumulator").outputs[0]
                for t in extra]
        body = body[:n] + [s + t for s, t in zip(sums, extra)]
        self._placeholders += sums
    finally:
      # The body's ops run only inside the loop (and a failed call leaves none).
      self._body_ops = graph.operations[start:]
      del graph.operations[start:]
    if len(body) != len(self._placeholders):
      raise ValueError(f"mtf.while_loop: body_fn returned {len(body)} tensors for "
                       f"{n} loop variables (extra outputs are allowed only with "
                       "has_accumulators=True).")
    for t, b in zip(inputs[:n], body):
      if t.shape != b.shape or t.dtype != b.dtype:
        raise ValueError(
            f"mtf.while_loop: body_fn changes loop variable {t.name} from {t.shape} "
            f"{t.dtype.name} to {b.shape} {b.dtype.name}; shapes and dtypes must stay.")
    if cond.shape.ndims != 0 or cond.dtype != tf.bool:
      raise ValueError("mtf.while_loop: cond_fn must return a scalar boolean mtf.Tensor.")
    for op in self._body_ops:
      if getattr(op, "is_variable", False):
        raise ValueError("mtf.while_loop: create variables outside the loop body.")
    self._cond, self._body = cond, body
    initial = inputs[:n] + [zeros(mesh, t.shape, t.dtype) for t in self._placeholders[n:]]
    super().__init__(initial, mesh=mesh, name=name or "while_loop")
    self._outputs = [Tensor(self, t.shape, t.dtype, index=i) for i, t in enumerate(initial)]

  def gradient(self, grad_ys):
    raise ValueError(
        f"{self.name}: mtf.while_loop has no gradient (its trip count is data "
        "dependent). Unroll the loop in Python, or stop_gradient its outputs.")

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    n = len(self.inputs)
    body_ops = set(self._body_ops)
    # Complete pending allreduces of the outer tensors the body reads here,
    # outside the loop: completed inside, they would belong to the loop's graph.
    for op in self._body_ops:
      for t in op.inputs:
        if t.operation not in body_ops and t not in self._placeholders:
          lowering.laid_out(t)
    cond_ops = _ancestors_within([self._cond], self._body_ops)
    # Random ops in the loop get a key per iteration (made outside the loop).
    has_random = any(isinstance(op, RandomOperation) for op in self._body_ops)
    base_key = lowering.random_key(impl) if has_random else None
    init = [lowering.laid_out(t).tensor_list for t in self.inputs]
    flat = [s for slices in init for s in slices]

    def unflatten(values):
      k = impl.num_local_slices
      return [LaidOutTensor(list(values[i * k:(i + 1) * k])) for i in range(n)]

    def run_ops(values, iteration, ops, targets):
      for ph, laid in zip(self._placeholders, unflatten(values)):
        lowering.set_tensor_lowering(ph, laid)
      if base_key is not None:
        lowering.set_random_key(impl, base_key + (iteration + 1) * _ITERATION_KEY_STRIDE)
      try:
        lowering.lower_operations(ops)
      finally:
        if base_key is not None:
          lowering.set_random_key(impl, base_key)
      return [lowering.laid_out(t) for t in targets]

    def cond(iteration, *values):
      return run_ops(values, iteration, cond_ops, [self._cond])[0].tensor_list[0]

    def body(iteration, *values):
      outs = run_ops(values, iteration, self._body_ops, self._body)
      return [iteration + 1] + [s for laid in outs for s in laid.tensor_list]
    # Built as a V2 While op even where TF1 control flow is the default
    # (tf.compat.v1.disable_v2_behavior): a TF1 while frame whose ops span
    # several devices never finished in a Session here (tests/legacy_v1_program.py).
    v1_flow = (not tf.executing_eagerly() and not tf.compat.v1.control_flow_v2_enabled()
               and not tf.compat.v1.get_default_graph().building_function)
    if v1_flow:
      tf.compat.v1.enable_control_flow_v2()
    try:
      results = tf.while_loop(cond, body, [tf.constant(0, tf.int64)] + flat,
                              **self._tf_kwargs)[1:]
    finally:
      if v1_flow:
        tf.compat.v1.disable_control_flow_v2()
    for out, laid in zip(self.outputs, unflatten(results)):
      lowering.set_tensor_lowering(out, laid)


_TF_WHILE_LOOP_KWARGS = ("maximum_iterations", "parallel_iterations", "swap_memory")


def _while_loop_kwargs(tf_kwargs) -> dict:
  """The tf.while_loop arguments of an mtf while_loop (`back_prop`, which
  TensorFlow 2 ignores, is dropped)."""
  tf_kwargs = dict(tf_kwargs or {})
  tf_kwargs.pop("back_prop", None)
  unknown = sorted(set(tf_kwargs) - set(_TF_WHILE_LOOP_KWARGS))
  if unknown:
    raise TypeError(f"mtf.while_loop: unexpected arguments {unknown}; the tf.while_loop "
                    f"arguments it passes on are {list(_TF_WHILE_LOOP_KWARGS)}.")
  return tf_kwargs


# Odd multiplier that spreads iteration numbers over the random key's 32 bits.
_ITERATION_KEY_STRIDE = 0x9E3779B1


def _ancestors_within(targets, ops):
  """The operations of `ops` (in order) that `targets` depend on."""
  members = set(ops)
  needed = set()
  stack = [t.operation for t in targets]
  while stack:
    op = stack.pop()
    if op in needed or op not in members:
      continue
    needed.add(op)
    stack.extend(t.operation for t in op.inputs)
  return [op for op in ops if op in needed]


def while_loop(cond_fn: Callable, body_fn: Callable, inputs: Sequence[Tensor],
               num_loop_vars=None, has_accumulators: bool = False, name=None,
               **kwargs) -> List[Tensor]:
  """Repeats body_fn(*vars) while cond_fn(*vars) is true; returns the vars.

  With `has_accumulators`, body_fn may return more tensors than there are
  loop variables: each extra one is summed over the iterations and returned
  after the loop variables (zero when the loop runs no iteration), e.g. the
  gradients of several micro-batches. Other keyword arguments
  (`maximum_iterations`, `parallel_iterations`, `swap_memory`) go to
  tf.while_loop.

  Example:
    >>> i, total = mtf.while_loop(lambda i, t: mtf.less(i, 10),
    ...                           lambda i, t: [i + 1, t + x], [i0, t0])
    >>> i, grad_sum = mtf.while_loop(lambda i: mtf.less(i, 4),
    ...                              lambda i: [i + 1, grad_of(i)], [i0],
    ...                              has_accumulators=True)
  """
  return WhileLoopOperation(cond_fn, body_fn, inputs, num_loop_vars, name=name,
                            has_accumulators=has_accumulators, tf_kwargs=kwargs).outputs


class CustomGradientOperation(Operation):
  """Identity on fn's outputs whose gradient is given by grad_fn (see
  `custom_gradient`).

  Args:
    explicit_inputs: the tensors fn was called with.
    all_inputs: explicit_inputs followed by the tensors fn used without
      receiving them (variables, closures).
    fn_outputs: fn's outputs.
    grad_fn: see `custom_gradient`.
    forward_operations: the operations fn created.
    name: optional name.
  """

  def __init__(self, explicit_inputs, all_inputs, fn_outputs, grad_fn,
               forward_operations=(), name=None):
    explicit_inputs, all_inputs = list(explicit_inputs), list(all_inputs)
    if all_inputs[:len(explicit_inputs)] != explicit_inputs:
      raise ValueError("CustomGradientOperation: all_inputs must begin with explicit_inputs.")
    super().__init__(all_inputs + list(fn_outputs), name=name or "custom_gradient")
    self._n_explicit = len(explicit_inputs)
    self._n_all = len(all_inputs)
    self._grad_fn = grad_fn
    self._forward_operations = list(forward_operations)
    self.has_gradient = True
    self._outputs = [Tensor(self, t.shape, t.dtype, index=i) for i, t in enumerate(fn_outputs)]

  @property
  def forward_operations(self):
    return list(self._forward_operations)

  def gradient(self, grad_ys):
    k = self._n_all
    explicit = self.inputs[:self._n_explicit]
    fn_outputs = self.inputs[k:]
    if _takes_keyword_form(self._grad_fn):
      grads = list(self._grad_fn(
          explicit_inputs=explicit, all_inputs=self.inputs[:k],
          forward_operations=self.forward_operations, outputs=fn_outputs,
          output_grads=list(grad_ys)))
    else:
      grads = list(self._grad_fn(explicit, self.inputs[self._n_explicit:k], self.outputs,
                                 grad_ys))
    if len(grads) == self._n_explicit:
      grads += [None] * (k - self._n_explicit)
    if len(grads) != k:
      raise ValueError(f"{self.name}: grad_fn returned {len(grads)} gradients for "
                       f"{k} inputs.")
    return grads + [None] * len(self.outputs)

  def lower(self, lowering):
    k = self._n_all
    for out, t in zip(self.outputs, self.inputs[k:]):
      lowering.set_tensor_lowering(out, lowering.laid_out(t))


_KEYWORD_FORM_PARAMETERS = ("all_inputs", "forward_operations")


def _takes_keyword_form(grad_fn) -> bool:
  """Whether grad_fn is written for the keyword call
  (explicit_inputs=, all_inputs=, forward_operations=, outputs=,
  output_grads=) rather than this library's positional one."""
  try:
    params = inspect.signature(grad_fn).parameters
  except (TypeError, ValueError):
    return False
  return any(k in params for k in _KEYWORD_FORM_PARAMETERS)


def _run_and_capture(fn, explicit_inputs):
  graph = explicit_inputs[0].graph
  start = len(graph.operations)
  outputs = fn(*explicit_inputs)
  single = isinstance(outputs, Tensor)
  outputs = [outputs] if single else list(outputs)
  forward_operations = list(graph.operations[start:])
  # Variables fn creates on its first call are inputs like any other: they
  # outlive fn and need gradients.
  created = [op for op in forward_operations if not getattr(op, "is_variable", False)]
  created_tensors = {t for op in created for t in op.outputs}
  explicit = set(explicit_inputs)
  captured = []
  for op in created:
    for t in op.inputs:
      if t not in created_tensors and t not in explicit and t not in captured:
        captured.append(t)
  return outputs, single, captured, forward_operations


def custom_gradient(fn: Callable, grad_fn: Callable, explicit_inputs: Sequence[Tensor],
                    name=None):
  """Computes fn(*inputs) but differentiates it with grad_fn.

  grad_fn is called in one of two forms:
  - grad_fn(inputs, captured, outputs, output_grads), returning one gradient
    per input (optionally followed by one per captured tensor, i.e. each
    tensor such as a variable that fn used without it being in `inputs`);
  - a grad_fn with an `all_inputs` or `forward_operations` parameter:
    called with the keywords `explicit_inputs`, `all_inputs` (inputs, then
    captured), `forward_operations`, `outputs` (fn's outputs)
    and `output_grads`, it returns one gradient per tensor of all_inputs (or
    per explicit input).

  Example:
    >>> y = mtf.custom_gradient(lambda x: x * 2.0,
    ...                         lambda xs, cap, ys, gs: [gs[0] * 2.0], [x])
  """
  inputs = list(explicit_inputs)
  outputs, single, captured, forward_operations = _run_and_capture(fn, inputs)
  op = CustomGradientOperation(inputs, inputs + captured, outputs, grad_fn,
                               forward_operations, name=name)
  return op.outputs[0] if single else op.outputs


class _ForwardScope:
  """The naming state of the graph when recompute_grad's forward call ran.

  `replay()` restores it while fn runs again in the backward pass, so that
  `mtf.get_variable` finds the forward call's variables (same scopes, same
  variable map, which a pipeline stage may have replaced; default-named
  `mtf.layers` layers get the same unique names) and the recomputed
  operations get the forward ones' names, so random operations (dropout),
  whose seeds derive from their names, draw the same numbers.
  """


  def __init__(self, graph):
    self._graph = graph
    self._scope_stack = list(graph._scope_stack)  # pylint: disable=protected-access
    self._names_in_use = dict(graph._names_in_use)  # pylint: disable=protected-access
    self._name_to_variable = graph.name_to_variable
    self._layer_scopes = set(graph.keeps.get(LAYER_SCOPES_KEY, ()))
    self._variable_scope = tf.compat.v1.get_variable_scope()

  @contextlib.contextmanager
  def replay(self):
    graph = self._graph
    saved = (graph._scope_stack, graph._names_in_use, graph.name_to_variable)  # pylint: disable=protected-access
    graph._scope_stack = list(self._scope_stack)  # pylint: disable=protected-access
    graph._names_in_use = dict(self._names_in_use)  # pylint: disable=protected-access
    graph.name_to_variable = self._name_to_variable
    try:
      with graph.keeping(LAYER_SCOPES_KEY, set(self._layer_scopes)):
        if self._variable_scope.name != tf.compat.v1.get_variable_scope().name:
          with tf.compat.v1.variable_scope(self._variable_scope, auxiliary_name_scope=False):
            yield
        else:
          yield
    finally:
      graph._scope_stack, graph._names_in_use, graph.name_to_variable = saved  # pylint: disable=protected-access


class SavedOutput(Operation):
  """The forward pass's output of an operation that a recomputation keeps
  instead of running it again (`recompute_grad`'s `saveable`).

  Its value is `saved` (inputs[0]); it is differentiated as `template`, the
  recomputed operation it stands in for, whose inputs follow `saved`: the
  gradients reach the recomputed inputs, not the forward ones, so those need
  not stay alive for the backward pass.
  """

  local_kernel = "saved"  # no kernel: the value of inputs[0] (the cost model's kind)

  def __init__(self, saved: Tensor, template: Operation, name=None):
    super().__init__([saved] + list(template.inputs), name=name or template.name + "_saved")
    self._template = template
    self.has_gradient = True
    self._outputs = [Tensor(self, saved.shape, saved.dtype)]

  def gradient(self, grad_ys):
    return [None] + list(self._template.gradient(grad_ys))

  def lower(self, lowering):
    saved = self.inputs[0]
    if saved not in lowering.tensors:
      lowering.laid_out(saved)  # its error names the tensor
    # The forward value as it is: a pending sum stays pending.
    lowering.set_tensor_lowering(self.outputs[0], lowering.tensors[saved])
    if saved in lowering.completed_sums:
      lowering.completed_sums[self.outputs[0]] = lowering.completed_sums[saved]


def product_without_batch_dims(op: Operation) -> bool:
  """Whether `op` is a matrix product with no dimension that both operands
  and the output share: a projection by a weight (x . W), not a batched
  product such as attention's q . k. The operations that
  `recompute_grad(saveable=...)` keeps under JAX's
  `dots_with_no_batch_dims_saveable` policy (MaxText's "minimal").

  Example:
    >>> mtf.recompute_grad(block, [x], saveable=product_without_batch_dims)
  """
  if type(op).__name__ != "EinsumOperation" or len(op.inputs) != 2:
    return False
  a, b = (set(t.shape.dimension_names) for t in op.inputs)
  return not (a & b & set(op.outputs[0].shape.dimension_names))


def kept_by_recompute(forward_ops: Sequence[Operation],
                      saveable: Callable[[Operation], bool]) -> List[Operation]:
  """The forward operations whose outputs `recompute_grad(saveable=...)`
  keeps for the backward pass: each single-output operation `saveable`
  accepts, or, where its only reader just lays it out anew (a `moves_only`
  operation: a sum reduce-scattered over a sequence-parallel stream), that
  reader, whose output is smaller. The planner prices kept memory by the
  same rule.

  Example:
    >>> kept = mtf.kept_by_recompute(ops, mtf.product_without_batch_dims)
    >>> kept_elements = sum(op.outputs[0].shape.size for op in kept)
  """
  readers: Dict[int, List[Operation]] = {}
  for op in forward_ops:
    for t in op.inputs:
      readers.setdefault(id(t), []).append(op)
  kept = []
  for op in forward_ops:
    if len(op.outputs) == 1 and saveable(op):
      only = readers.get(id(op.outputs[0]), [])
      kept.append(only[0] if len(only) == 1 and getattr(only[0], "moves_only", False) else op)
  return kept


def _keep_saved(forward_ops, recomputed_ops, saveable, graph) -> dict:
  """Replaces each recomputed operation whose forward twin (the forward
  operation of the same name: the recomputation replays the forward call's
  names) is kept (`kept_by_recompute`) by a SavedOutput of the twin's
  output, in place in `graph.operations`, its readers rewired; returns
  {recomputed output: its SavedOutput's}."""
  twins = {f.name: f for f in kept_by_recompute(forward_ops, saveable)}
  position = {id(op): i for i, op in enumerate(graph.operations)}
  replacements = {}
  for r in recomputed_ops:
    if replacements:
      r.replace_inputs(replacements)
    f = twins.get(r.name)
    if f is None:
      continue
    if type(f) is not type(r) or f.outputs[0].shape != r.outputs[0].shape:
      raise ValueError(
          f"mtf.recompute_grad: the recomputation's {r.name!r} is not the forward call's "
          "operation of that name; with `saveable`, fn must build the same operations each "
          "time it is called.")
    saved = SavedOutput(f.outputs[0], r)
    graph.operations.pop()  # made last; it takes r's place
    graph.operations[position[id(r)]] = saved
    replacements[r.outputs[0]] = saved.outputs[0]
  return replacements


def recompute_grad(fn: Callable, explicit_inputs: Sequence[Tensor],
                   control_dependencies: bool = True, name=None,
                   saveable: Callable[[Operation], bool] = None):
  """Calls fn(*explicit_inputs) and recomputes it during backprop instead of
  keeping its activations (variables fn uses get their gradients too).

  The recomputation runs in the forward call's name scopes, so fn may
  create its variables with `mtf.get_variable` (it finds them again), and
  its random operations (dropout) repeat the forward pass's numbers.

  With `control_dependencies` (the default), the recomputation waits for the
  output gradients, so its activations are not alive before they are needed;
  without, TensorFlow may schedule it earlier.

  `saveable(op)`, given, names the forward operations whose outputs are kept
  for the backward pass rather than computed again (e.g.
  `product_without_batch_dims`: the projections by weights); the
  recomputation reads their kept outputs and runs only the rest.

  Example:
    >>> y = mtf.recompute_grad(lambda x: block(x), [x])
    >>> y = mtf.recompute_grad(block, [x], saveable=mtf.product_without_batch_dims)
  """
  explicit_inputs = list(explicit_inputs)
  if not explicit_inputs:
    raise ValueError("mtf.recompute_grad needs at least one explicit input tensor.")
  forward = _ForwardScope(explicit_inputs[0].graph)

  def grad_fn(explicit_inputs, all_inputs, forward_operations, outputs, output_grads):
    del outputs  # the keyword form's, unused
    xs, captured, dys = explicit_inputs, all_inputs[len(explicit_inputs):], output_grads
    dys_real = [d for d in dys if d is not None]
    graph = xs[0].graph
    start = len(graph.operations)
    # Recompute only once the output gradients exist (to free the memory).
    xs2 = [depend(x, dys_real) for x in xs] if control_dependencies else list(xs)
    replay_start = len(graph.operations)
    with forward.replay():
      outs = fn(*xs2)
    # mtf.gradients passes a variable that gathers on read (ZeRO stage 3) as
    # its copy read again for the backward pass: the recomputation uses it.
    again = {c.operation.variable.outputs[0]: c for c in captured
             if getattr(c.operation, "is_variable_reread", False)}
    if again:
      for op in graph.operations[start:]:
        op.replace_inputs(again)
    outs = [outs] if isinstance(outs, Tensor) else list(outs)
    if saveable is not None:
      saved = _keep_saved(forward_operations, graph.operations[replay_start:], saveable, graph)
      outs = [saved.get(o, o) for o in outs]
    pairs = [(o, d) for o, d in zip(outs, dys) if d is not None]
    # Differentiate the recomputation only: a captured tensor may also be
    # upstream of xs, and that path is the outer gradient pass's business.
    # Differentiating with respect to xs (not xs2) also counts the uses of xs
    # that fn makes through its closure rather than through its arguments.
    grads = gradients([o for o, _ in pairs], list(xs) + list(captured),
                      grad_ys=[d for _, d in pairs],
                      operations=graph.operations[start:])
    return grads
  return custom_gradient(fn, grad_fn, explicit_inputs, name=name or "recompute_grad")


from mesh_tensorflow.core import autograph_exempt as _autograph_exempt  # noqa: E402  pylint: disable=g-import-not-at-top
_autograph_exempt.exempt(globals())  # AutoGraph leaves this module's code alone
