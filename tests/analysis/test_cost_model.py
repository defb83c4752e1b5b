"""The cost model agrees with the lowering's counters and the slice variables."""

import json

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mesh_tensorflow as mtf
from mesh_tensorflow.analysis import cost_model
from mesh_tensorflow.lowering import slice_variables
import mtf_test_utils as tu

RNG = np.random.default_rng(0)


def mlp_step(mesh, optimizer=None, batch=16, features=8, hidden=32, classes=4):
  """A tiny MLP training step: returns (loss, updates)."""
  b = mtf.Dimension("batch", batch)
  f = mtf.Dimension("features", features)
  h = mtf.Dimension("hidden", hidden)
  c = mtf.Dimension("classes", classes)
  x = mtf.import_tf_tensor(mesh, RNG.normal(size=(batch, features)).astype(np.float32), [b, f])
  y = mtf.import_tf_tensor(mesh, RNG.integers(0, classes, batch).astype(np.int32), [b])
  w1 = mtf.get_variable(mesh, "w1", [f, h])
  w2 = mtf.get_variable(mesh, "w2", [h, c])
  logits = mtf.einsum([mtf.relu(mtf.einsum([x, w1], output_shape=[b, h])), w2],
                      output_shape=[b, c])
  loss = mtf.reduce_mean(mtf.layers.softmax_cross_entropy_with_logits(logits, y, c))
  variables = mesh.graph.trainable_variables
  grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
  optimizer = optimizer or mtf.optimize.SgdOptimizer(0.1)
  return loss, optimizer.apply_grads(grads, variables)


def transformer_step(mesh, batch=4, length=8, d_model=16, heads=4, d_ff=32, vocab=16):
  """One attention + feed-forward block with embedding and softmax, SGD."""
  dims = {n: mtf.Dimension(n, s) for n, s in dict(
      batch=batch, length=length, memory=length, d_model=d_model, heads=heads,
      d_kv=d_model // heads, d_ff=d_ff, vocab=vocab).items()}
  B, L, M, D, H, K, F, V = (dims[n] for n in (
      "batch", "length", "memory", "d_model", "heads", "d_kv", "d_ff", "vocab"))
  ids = mtf.import_tf_tensor(mesh, RNG.integers(0, vocab, (batch, length)).astype(np.int32), [B, L])
  x = mtf.gather(mtf.get_variable(mesh, "emb", [V, D]), ids, V)
  q = mtf.einsum([x, mtf.get_variable(mesh, "q", [D, H, K])], output_shape=[B, L, H, K])
  mem = mtf.rename_dimension(x, "length", "memory")
  k = mtf.einsum([mem, mtf.get_variable(mesh, "k", [D, H, K])], output_shape=[B, M, H, K])
  v = mtf.einsum([mem, mtf.get_variable(mesh, "v", [D, H, K])], output_shape=[B, M, H, K])
  w = mtf.softmax(mtf.einsum([q, k], output_shape=[B, H, L, M]), M)
  att = mtf.einsum([w, v], output_shape=[B, L, H, K])
  x = x + mtf.einsum([att, mtf.get_variable(mesh, "o", [H, K, D])], output_shape=[B, L, D])
  hid = mtf.relu(mtf.einsum([x, mtf.get_variable(mesh, "wi", [D, F])], output_shape=[B, L, F]))
  x = x + mtf.einsum([hid, mtf.get_variable(mesh, "wo", [F, D])], output_shape=[B, L, D])
  logits = mtf.einsum([x, mtf.get_variable(mesh, "logits", [D, V])], output_shape=[B, L, V])
  loss = mtf.reduce_mean(mtf.layers.softmax_cross_entropy_with_logits(logits, ids, V))
  variables = mesh.graph.trainable_variables
  grads = mtf.gradients([loss], [t.outputs[0] for t in variables])
  return loss, mtf.optimize.SgdOptimizer(0.1).apply_grads(grads, variables)


def lower(step_fn, mesh_shape, layout, impl=None, **impl_kwargs):
  """Builds and lowers a step in a tf.function (on `impl`, or a new mesh
  implementation) and runs it once; returns (graph, lowering, mesh_impl)."""
  impl = impl or tu.make_impl(mesh_shape, layout, **impl_kwargs)
  holder = {}

  @tf.function(autograph=False)
  def run():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    loss, updates = step_fn(mesh)
    lowering = mtf.Lowering(graph, {mesh: impl})
    holder.update(graph=graph, lowering=lowering)
    with tf.control_dependencies([lowering.lowered_operation(u) for u in updates]):
      return tf.identity(lowering.export_to_tf_tensor(loss))
  assert np.isfinite(run().numpy())
  return holder["graph"], holder["lowering"], impl


def lowered_per_op(lowering):
  """{op name: sorted (kind, mesh axes, bytes) of its collectives} that the
  lowering recorded (exports left out)."""
  by_op = {}
  for r in lowering.collective_records:
    if not r.op_name.startswith("export/"):
      by_op.setdefault(r.op_name, []).append((r.kind, r.mesh_axes, r.bytes_per_processor))
  return {k: sorted(v) for k, v in by_op.items()}


def estimated_per_op(est):
  """The same for a cost estimate."""
  return {op.name: sorted((c.kind, c.mesh_axes, c.bytes_per_processor) for c in op.collectives)
          for op in est.ops if op.collectives}


def lowering_counts(lowering):
  counts = {}
  for r in lowering.collective_records:
    if not r.op_name.startswith("export/"):
      n, b = counts.get(r.kind, (0, 0))
      counts[r.kind] = (n + 1, b + r.bytes_per_processor)
  return counts


@pytest.mark.parametrize("mesh_shape,layout,expected_kinds", [
    ("all:8", "batch:all", {"allreduce"}),                         # data-parallel MLP
    ("all:8", "hidden:all", {"allreduce"}),                        # model-parallel einsums
    ("rows:2;cols:4", "batch:rows;hidden:cols", {"allreduce"}),
    ("rows:2;cols:4", "features:rows;hidden:cols", {"allreduce"}),
])
def test_mlp_matches_lowering_counters(mesh_shape, layout, expected_kinds):
  graph, lowering, _ = lower(mlp_step, mesh_shape, layout)
  est = cost_model.estimate(graph, mesh_shape, layout)
  assert est.collective_counts() == lowering_counts(lowering)
  assert set(est.collective_counts()) == expected_kinds
  assert est.flops == sum(lowering.flops.values())
  assert not any(op.approximate for op in est.ops)
  # Per operation too.
  by_op = {}
  for r in lowering.collective_records:
    by_op.setdefault(r.op_name, []).append((r.kind, r.mesh_axes, r.bytes_per_processor))
  for op in est.ops:
    got = sorted((c.kind, c.mesh_axes, c.bytes_per_processor) for c in op.collectives)
    assert got == sorted(by_op.get(op.name, [])), op.name


def _live_einsum_flops(concrete):
  """FLOPs of the matrix-product kernels (Einsum, MatMul) a traced step
  really runs: those that a variable update or an output needs (TensorFlow
  prunes the others)."""
  graph = concrete.graph
  stack = [op for op in graph.get_operations() if op.type.startswith("Assign")]
  stack += [t.op for t in concrete.outputs]
  live = set()
  while stack:
    op = stack.pop()
    if op not in live:
      live.add(op)
      stack.extend([t.op for t in op.inputs] + list(op.control_inputs))
  total = 0
  for op in live:
    if op.type == "Einsum":
      sizes = {}
      terms = op.get_attr("equation").decode().split("->")[0].split(",")
      for term, t in zip(terms, op.inputs):
        sizes.update(zip(term, t.shape.as_list()))
      total += 2 * int(np.prod(list(sizes.values())))
    elif op.type in ("MatMul", "BatchMatMulV2"):  # mtf.einsum's matrix products
      out = op.outputs[0].shape.as_list()
      a = op.inputs[0].shape.as_list()
      transposed = op.get_attr("transpose_a" if op.type == "MatMul" else "adj_x")
      total += 2 * int(np.prod(out)) * (a[-2] if transposed else a[-1])
  return total


@pytest.mark.parametrize("layout", ["hidden:cols", "features:rows;classes:cols",
                                    "batch:rows;hidden:cols", "batch:rows",
                                    "batch:rows;classes:cols"])
def test_shared_replicas_count_only_the_kernels_tensorflow_runs(layout):
  """On rows:4;cols:2, an allreduce over cols makes one result per row, and
  the lowering emits the kernels that use each; TensorFlow runs only those
  the variable updates and the loss need. The model counts the same
  matrix-product work as the live Einsum kernels of the traced step (before
  this was fixed, hidden:cols counted 4x the replicated layout's dW1). With
  the batch split alone over rows, the imported batch's blocks join back
  into the imported tensor itself, one for every column: the forward
  product runs once, not once per column."""
  impl = tu.make_impl("rows:4;cols:2", layout)
  holder = {}

  @tf.function(autograph=False)
  def step():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    loss, updates = mlp_step(mesh)
    lowering = mtf.Lowering(graph, {mesh: impl})
    holder["graph"] = graph
    with tf.control_dependencies([lowering.lowered_operation(u) for u in updates]):
      return tf.identity(lowering.export_to_tf_tensor(loss))
  live = _live_einsum_flops(step.get_concrete_function())
  est = cost_model.estimate(holder["graph"], "rows:4;cols:2", layout)
  assert sum(op.work_flops for op in est.ops) == live
  if layout == "hidden:cols":  # a 2-way split of hidden: the replicated work
    replicated = cost_model.estimate(holder["graph"], "rows:4;cols:2", "")
    assert sum(op.work_flops for op in replicated.ops) == live

def test_outputs_keep_their_kernels_and_foreign_outputs_are_rejected():
  """Costing the forward pass with only the hidden activations exported:
  the first einsum and the relu run, the logits' einsum is pruned. A tensor
  of another graph is a clear error."""
  graph = mtf.Graph()
  mlp_step(mtf.Mesh(graph, "mesh"))
  ops = graph.operations
  einsums = [op for op in ops if type(op).__name__ == "EinsumOperation"]
  forward = ops[:ops.index(einsums[1]) + 1]
  relu = next(op for op in forward if op.name.startswith("relu"))
  est = cost_model.estimate(graph, "all:8", "batch:all", operations=forward,
                            outputs=[relu.outputs[0]])
  kernels = {op.name: op.kernels for op in est.ops}
  assert kernels[einsums[0].name] > 0 and kernels[relu.name] > 0
  assert kernels[einsums[1].name] == 0
  everything = cost_model.estimate(graph, "all:8", "batch:all", operations=forward)
  assert {op.name: op.kernels for op in everything.ops}[einsums[1].name] > 0
  other = mtf.Graph()
  foreign, _ = mlp_step(mtf.Mesh(other, "mesh"))
  with pytest.raises(ValueError, match="not an mtf tensor that the costed operations produce"):
    cost_model.estimate(graph, "all:8", "", outputs=[foreign])

def test_model_parallel_einsum_allreduce_bytes():
  """x[batch, hidden] @ w[hidden, out] with hidden split 8 ways: one
  allreduce of the [batch, out] result, 16 * 4 * 4 bytes per processor."""
  b, h, o = mtf.Dimension("batch", 16), mtf.Dimension("hidden", 64), mtf.Dimension("out", 4)

  def step(mesh):
    x = mtf.import_tf_tensor(mesh, np.ones((16, 64), np.float32), [b, h])
    w = mtf.get_variable(mesh, "w", [h, o])
    return mtf.reduce_sum(mtf.square(mtf.einsum([x, w], output_shape=[b, o]))), []
  graph, lowering, _ = lower(step, "all:8", "hidden:all")
  est = cost_model.estimate(graph, "all:8", "hidden:all")
  assert est.collective_counts() == {"allreduce": (1, 16 * 4 * 4)} == lowering_counts(lowering)
  (c,) = est.collectives
  assert c.mesh_axes == (0,) and c.group_size == 8 and c.num_groups == 1


@pytest.mark.parametrize("layout,kinds", [
    ("batch:rows;heads:cols;d_ff:cols;vocab:cols", {"allreduce", "allgather"}),
    ("batch:cols;d_model:rows", {"allreduce"}),
    ("length:rows;memory:cols;d_ff:cols", {"allreduce", "allgather"}),
    ("memory:rows;d_kv:cols;vocab:rows", {"allreduce", "allgather"}),
])
def test_transformer_2x4_matches_real_lowering(layout, kinds):
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  transformer_step(mesh)
  est = cost_model.estimate(graph, "rows:2;cols:4", layout)
  exact = cost_model.estimate(graph, "rows:2;cols:4", layout, exact=True)
  assert exact.exact and not est.exact
  assert est.collective_counts() == exact.collective_counts()
  assert est.flops == exact.flops
  assert set(est.collective_counts()) == kinds


def _transformer_graph():
  graph = mtf.Graph()
  transformer_step(mtf.Mesh(graph, "mesh"))
  return graph


def _legal_transformer_layouts():
  """Every legal layout of transformer_step on 2x4 and on 8 devices."""
  from mesh_tensorflow import auto_mtf  # pylint: disable=g-import-not-at-top
  graph = _transformer_graph()
  return [(shape.to_string(), rules.to_string()) for shape in auto_mtf.mesh_shapes(8)
          for rules in auto_mtf.legal_layouts(graph, shape)]


@settings(max_examples=6, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(case=st.sampled_from(_legal_transformer_layouts()), params=st.sampled_from(["cpu", "gpu"]))
def test_estimate_prices_what_the_lowering_executes_for_any_layout(case, params):
  """The estimate prices the same plans the lowering executes, so for any
  legal layout each operation's collectives (kind, mesh axes, bytes) and the
  FLOPs equal those that a real lowering records, with shared-memory
  replicas (cpu) and without (gpu)."""
  mesh_shape, layout = case
  graph = _transformer_graph()
  est = cost_model.estimate(graph, mesh_shape, layout, params=params)
  exact = cost_model.estimate(graph, mesh_shape, layout, params=params, exact=True)

  def per_op(estimate):
    return {op.name: sorted((c.kind, c.mesh_axes, c.bytes_per_processor) for c in op.collectives)
            for op in estimate.ops if op.collectives and not op.name.startswith("export/")}
  assert per_op(est) == per_op(exact)
  assert est.flops == exact.flops


@pytest.mark.parametrize("share", [False, True])
def test_memory_matches_slice_variables_and_slots(share):
  """Variables + Adam slots per processor, against the tf.Variables that
  processor 0 holds (one per processor without shared replicas)."""
  layout = "batch:rows;hidden:cols"
  graph, _, impl = lower(lambda m: mlp_step(m, mtf.optimize.AdamWeightDecayOptimizer(0.01)),
                         "rows:2;cols:4", layout, share_replicas=share)
  est = cost_model.estimate(graph, "rows:2;cols:4", layout)
  store = slice_variables.variable_store(impl)
  held = {name: sv.slices[0].shape.num_elements() * sv.slices[0].dtype.size
          for name, sv in store.items()}
  trainable = sum(b for n, b in held.items() if store[n].trainable)
  state = sum(b for n, b in held.items() if not store[n].trainable)
  assert state > trainable > 0  # Adam: two slots per variable, plus step counters
  assert abs(est.memory.variables - trainable) <= 0.1 * trainable
  assert abs(est.memory.slots - state) <= 0.1 * state
  assert est.memory.per_variable.keys() == held.keys()
  assert est.memory.activations > 0
  assert est.memory.peak_bytes == est.memory.variables + est.memory.slots + est.memory.activations


def test_splitting_reduces_memory_and_data_parallel_sends_gradients():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  mlp_step(mesh)
  replicated = cost_model.estimate(graph, "all:8", "")
  split = cost_model.estimate(graph, "all:8", "hidden:all")
  data = cost_model.estimate(graph, "all:8", "batch:all")
  assert replicated.collectives == []
  assert split.memory.variables * 8 == replicated.memory.variables
  # Data parallel: one allreduce per weight gradient, of the weight's size.
  assert data.collective_counts()["allreduce"][1] >= (8 * 32 + 32 * 4) * 4


def test_illegal_layout_error_names_tensor_and_dimension():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  mlp_step(mesh, batch=12)
  with pytest.raises(ValueError, match=r"does not divide dimension 'batch'"):
    cost_model.estimate(graph, "all:8", "batch:all")
  with pytest.raises(ValueError, match=r"mesh dimension 'nope'"):
    cost_model.estimate(graph, "all:8", "batch:nope")


def test_device_params_defaults_json_and_errors(tmp_path):
  for kind in ("cpu", "gpu", "tpu"):
    p = cost_model.DeviceParams.default(kind)
    assert p.flops_per_s > 0 and p.op_overhead_s > 0
    assert cost_model.DeviceParams.from_json(p.to_json()) == p
  path = tmp_path / "p.json"
  path.write_text(cost_model.DeviceParams.default("gpu").to_json())
  assert cost_model.as_device_params(str(path)).name == "gpu"
  with pytest.raises(ValueError, match="unknown device kind 'fpga'"):
    cost_model.DeviceParams.default("fpga")
  with pytest.raises(ValueError, match=r"unknown fields \['speed'\]"):
    cost_model.DeviceParams.from_json(json.dumps({"speed": 1}))
  graph = mtf.Graph()
  mlp_step(mtf.Mesh(graph, "mesh"))
  gpu = cost_model.estimate(graph, "all:8", "batch:all", params="gpu")
  cpu = cost_model.estimate(graph, "all:8", "batch:all")
  assert gpu.step_time_s < cpu.step_time_s
  assert "estimated step" in cpu.summary()


def test_calibrate_measures_positive_parameters(capsys, tmp_path):
  params = cost_model.calibrate(num_devices=8, repeats=2)
  assert params.shares_memory and 1 <= params.parallel_processors <= 8
  for field in ("flops_per_s", "memory_bytes_per_s", "collective_bytes_per_s",
                "collective_latency_s", "op_overhead_s"):
    assert getattr(params, field) > 0, field
  # Combining slices is memory-bound work: an allreduce measurement whose
  # repetitions TensorFlow merged into one (common subexpressions) would
  # report several times the elementwise bandwidth.
  assert params.collective_bytes_per_s < 3 * params.memory_bytes_per_s, params
  # The command line without --calibrate prints the defaults as JSON.
  assert cost_model.main([]) == 0
  assert json.loads(capsys.readouterr().out)["cpu"]["parallel_processors"] >= 1
  # --calibrate --output writes what DeviceParams.from_json reads.
  out = tmp_path / "params.json"
  assert cost_model.main(["--calibrate", f"--output={out}"]) == 0
  assert cost_model.DeviceParams.from_json(str(out)).name == "calibrated"


def test_calibrate_prices_a_transfer_without_the_call_and_the_kernels(monkeypatch):
  """The per-transfer latency is the small allreduce less the function call
  (the empty function) and its two kernels, measured beside the two it is
  compared with."""
  from mesh_tensorflow.analysis.cost_model import calibration
  overhead, latency, call = 3e-6, 2e-6, 150e-6
  order = []

  def fake_least_medians(functions, repeats, passes):
    order.extend(functions)
    per_allreduce = 2 * overhead + 8 * latency  # 7 transfers and a combine
    return dict(chain=call + (calibration._CHAIN - 1) * overhead, empty=call,
                allreduce_small=call + calibration._ALLREDUCES * per_allreduce,
                allreduce_large=call + calibration._ALLREDUCES * (per_allreduce + 1e-3),
                products_one_device=1e-2, products_all_devices=8e-2, elementwise=1e-2)
  monkeypatch.setattr(calibration, "_least_medians", fake_least_medians)
  params = calibration.calibrate(num_devices=8)
  assert params.op_overhead_s == pytest.approx(overhead, rel=1e-2)
  assert params.collective_latency_s == pytest.approx(latency, rel=1e-2)
  assert order[:3] == ["chain", "empty", "allreduce_small"]


def _conv_step(mesh):
  """conv2d on [batch, h, w, c] with the filter's c split or not, a
  max-pool, and a halo-exchanged conv over blocks of h."""
  b, h, w, c, d = (mtf.Dimension(n, s) for n, s in
                   (("batch", 8), ("h", 8), ("w", 4), ("c", 4), ("d", 4)))
  x = mtf.import_tf_tensor(mesh, RNG.normal(size=(8, 8, 4, 4)).astype(np.float32), [b, h, w, c])
  f = mtf.get_variable(mesh, "f", [mtf.Dimension("kh", 3), mtf.Dimension("kw", 3), c, d])
  y = mtf.max_pool2d(mtf.conv2d(x, f), (2, 2))
  blocks, block = mtf.Dimension("hb", 4), mtf.Dimension("hh", 2)
  xb = mtf.reshape(x, [b, blocks, block, w, c])
  yb = mtf.conv2d_with_blocks(xb, f, (1, 1), "SAME", blocks, None)
  loss = mtf.reduce_sum(mtf.square(y)) + mtf.reduce_sum(mtf.square(yb))
  grads = mtf.gradients([loss], [f.outputs[0] if hasattr(f, "outputs") else f])
  return loss, mtf.optimize.SgdOptimizer(0.1).apply_grads(
      grads, mesh.graph.trainable_variables)


def _slicing_step(mesh):
  """shift (boundary permute and gathered), slice, pad, concat, cumsum and
  top_k along a split dimension."""
  b, n = mtf.Dimension("batch", 4), mtf.Dimension("length", 16)
  x = mtf.import_tf_tensor(mesh, RNG.normal(size=(4, 16)).astype(np.float32), [b, n])
  w = mtf.get_variable(mesh, "w", [n])
  x = x * w
  parts = [mtf.shift(x, 1, n, wrap=False), mtf.shift(x, -1, n, wrap=True),
           mtf.shift(x, 5, n, wrap=False), mtf.shift(x, 0, n, wrap=False),
           mtf.pad(mtf.slice(x, 4, 8, "length"), [4, 4], "length"),
           mtf.cumsum(x, n)]
  y = parts[0]
  for p in parts[1:]:
    y = y + p
  both = mtf.concat([y, x], "length")
  values, _ = mtf.top_k(x, n, k=2)
  loss = mtf.reduce_sum(mtf.square(both)) + mtf.reduce_sum(values)
  grads = mtf.gradients([loss], [v.outputs[0] for v in mesh.graph.trainable_variables])
  return loss, mtf.optimize.SgdOptimizer(0.1).apply_grads(
      grads, mesh.graph.trainable_variables)


def _replica_stats_step(mesh):
  """The per-replica squared norm of an MLP's pending gradients."""
  loss, _ = mlp_step(mesh)
  variables = mesh.graph.trainable_variables
  grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
  sq = mtf.replica_stats.replica_squared_norm(grads, "rows")
  return loss + sq, mtf.optimize.SgdOptimizer(0.1).apply_grads(grads, variables)


def _zero_step(mesh):
  """Gradients reduce-scattered into a layout split over rows (ZeRO stage
  2), and all-gathered back."""
  loss, _ = mlp_step(mesh)
  variables = mesh.graph.trainable_variables
  grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
  updates = []
  for v, g in zip(variables, grads):
    first = v.outputs[0].shape.dims[0]
    sharded = mtf.Shape([mtf.Dimension("zero_rows", first.size)] + v.outputs[0].shape.dims[1:])
    back = mtf.zero.relayout(mtf.zero.relayout(g, sharded) * 0.1, v.outputs[0].shape)
    updates.append(mtf.assign_sub(v, back))
  return loss, updates


@pytest.mark.parametrize("step_fn,mesh_shape,layout", [
    (_conv_step, "rows:2;cols:4", "batch:rows;d:cols"),
    (_conv_step, "rows:2;cols:4", "c:cols;hb:rows"),
    (_slicing_step, "rows:2;cols:4", "length:cols;batch:rows"),
    (_slicing_step, "all:8", "length:all"),
    (_replica_stats_step, "rows:2;cols:4", "batch:rows;hidden:cols"),
    (_replica_stats_step, "rows:4;cols:2", "batch:rows;features:cols"),
    (_zero_step, "rows:2;cols:4", "batch:rows;zero_rows:rows;hidden:cols"),
])
def test_plans_of_conv_slicing_replica_stats_and_zero_match_the_lowering(step_fn, mesh_shape,
                                                                         layout):
  """Convolutions and halo exchange, shifts and slicing, replica statistics
  and ZeRO's reduce-scatters state their plans: the estimate's collectives
  per operation (kind, mesh axes, bytes) and FLOPs equal the lowering's,
  and no operation is priced approximately. (Replica statistics and ZeRO
  read the gradients' pending sums, which shared memory would fuse away: one
  copy per device there.)"""
  shared = step_fn not in (_replica_stats_step, _zero_step)
  graph, lowering, _ = lower(step_fn, mesh_shape, layout, share_replicas=shared)
  est = cost_model.estimate(graph, mesh_shape, layout, params="cpu" if shared else "gpu")
  assert not [op.name for op in est.ops if op.approximate]
  assert estimated_per_op(est) == lowered_per_op(lowering)
  assert est.flops == sum(lowering.flops.values())
  kinds = {r.kind for r in lowering.collective_records}
  expected = {_conv_step: "allreduce", _slicing_step: "permute",
              _replica_stats_step: "allreduce", _zero_step: "reduce_scatter"}[step_fn]
  assert expected in kinds


@pytest.mark.parametrize("share", [False, True])
def test_zero_stage_3_storage_relayout_is_priced_as_lowered(share):
  """ZeRO stage 3 stores each variable split over the data-parallel axis:
  reading it all-gathers the slices (the Variable's KernelPlan) and the
  updates write the shards. The estimate's collectives per operation and
  FLOPs equal the lowering's, and its variable memory is the stored
  shards (what processor 0 holds)."""
  mesh_shape, layout = "rows:2;cols:4", "batch:rows;hidden:cols"
  impl = tu.make_impl(mesh_shape, layout, share_replicas=share)

  def step(mesh):
    loss, _ = mlp_step(mesh, optimizer=_NoUpdates())
    mtf.zero.shard_training_state(mesh.graph, impl, stage=3)
    variables = mesh.graph.trainable_variables
    grads = mtf.zero.shard_gradients(
        mtf.gradients([loss], [v.outputs[0] for v in variables]), variables)
    return loss, mtf.optimize.AdamWeightDecayOptimizer(0.01).apply_grads(grads, variables)
  graph, lowering, _ = lower(step, mesh_shape, layout, impl=impl)
  est = cost_model.estimate(graph, mesh_shape, impl.layout_rules,
                            params="cpu" if share else "gpu")
  got = estimated_per_op(est)
  assert got == lowered_per_op(lowering)
  assert est.flops == sum(lowering.flops.values())
  # The variables' reads gather their shards over rows.
  assert got["w1"] == [("allgather", (0,), 8 * 32 // 4 // 2 * 4)]
  store = slice_variables.variable_store(impl)
  held = sum(sv.slices[0].shape.num_elements() * sv.slices[0].dtype.size
             for sv in store.values() if sv.trainable)
  assert est.memory.variables == held


class _NoUpdates:
  """An optimizer stand-in: mlp_step's own updates are not made."""

  def apply_grads(self, grads, variables):
    del grads, variables
    return []
