"""Pipeline parallelism as a layout: layer stages stacked along a `stages`
dimension, micro-batches moved between stages with `mtf.shift`.

A stage function (some layers) is applied to all stages at once: its variables
get a leading `stages` dimension (stage s's weights are row s), and the
pipeline state is a tensor [stages, batch, ...] whose row s is the
micro-batch that stage s works on. Each clock tick every stage applies its
layers to its row (one einsum vectorized over `stages`), then the state moves
one stage on with `mtf.shift(state, 1, stages)`. With the layout rule
`stages:pp` each processor along mesh dimension `pp` holds one stage's
weights and activations, and the shift lowers to a permute between
neighbouring processors: the pipeline's send/receive (where other mesh
dimensions replicate the activations, each replica sends one block and the
receiving stage all-gathers them; see `_send`). Other rules (e.g.
`batch:dp`, `heads:mp`) split the rest of each stage as usual, so pipelining
composes with data and model parallelism.

Schedules (`PipelineSchedule`):

* "gpipe": M micro-batches through S stages take M + S - 1 forward ticks;
  stage s works on micro-batch t - s at tick t. The backward pass is the
  gradient of that graph: the same ticks in reverse, shifts reversed. Idle
  stage-ticks (the bubble): S (S - 1) of S (M + S - 1), fraction
  (S - 1) / (M + S - 1).
* "1f1b" (`pipeline_loss` only, it needs the loss per micro-batch): an
  explicit schedule of forward and backward slots. At slot u stage s runs
  the forward of one micro-batch or the backward of another (recomputing
  its forward from the stashed stage input), following the non-interleaved
  one-forward-one-backward order; gradients are accumulated as the schedule
  runs and handed to `mtf.gradients` through `mtf.custom_gradient`. In the
  schedule a stage has at most S micro-batches between forward and backward
  (GPipe keeps all M micro-batches' activations of every layer); since a
  slot's stage inputs form one [stages, ...] tensor, a processor keeps its
  slice until every stage reading that slot has run its backward: at most
  2 S - 1 stashed inputs, for any M. Slots: 2 (M + S - 1); bubble fraction
  (S - 1) / (M + S - 1), as GPipe's.
* "interleaved" (`pipeline_loss` with `virtual_stages` V > 1): 1F1B over
  S x V layer chunks, stage s holding chunks s, s + S, ...: its variables
  get leading [virtual_stages, stages] dimensions (`StageVariables`), each
  slot gives every stage the chunk the schedule names (a one-hot product
  over the unsplit virtual_stages dimension, local to each processor), and
  the sends wrap round from the last stage to the first. A slot is one
  chunk, so the bubble fraction is (S - 1) / (V M + S - 1); M must be a
  multiple of S. More micro-batch chunks are in flight than in 1F1B
  (`PipelineSchedule.max_in_flight`).

In this single-program (SPMD) formulation an idle stage still executes the
tick's operations on zeros (its results are never used): the bubble costs
time, not correctness; in a 1F1B slot every stage runs both the forward and
the backward computation, masked to the work the table gives it (the order
and the memory bound are real, the skipping of masked work per device is
not). `PipelineSchedule.bubble_fraction` is the theoretical value;
`pipeline(..., return_stats=True)` and `pipeline_loss(..., return_stats=True)`
also return the useful stage-ticks (stage-slots) counted in the executed
graph by flags that travel with the activations (and, in 1F1B, with the
cotangents).

    >>> y = mtf.pipeline.pipeline(lambda h: my_layers(h), x, stages, 8)
    >>> # layout "stages:pp;batch:dp" on mesh "pp:4;dp:2"
"""

from __future__ import annotations

import contextlib
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
import tensorflow as tf

from mesh_tensorflow.core.graph import Mesh, Tensor
from mesh_tensorflow.operations import constant_ops as const_ops
from mesh_tensorflow.operations import control
from mesh_tensorflow.operations import einsum_ops as einsum_ops
from mesh_tensorflow.operations import random_ops
from mesh_tensorflow.operations import elementwise as ew
from mesh_tensorflow.operations import reduction
from mesh_tensorflow.operations import shape_ops
from mesh_tensorflow.operations import slicing
from mesh_tensorflow.core.shapes import Dimension, Shape
from mesh_tensorflow.training.pipeline_schedule import SCHEDULES, PipelineSchedule, chunk_of
from mesh_tensorflow.training.stage_variables import StageVariables


# ---------------------------------------------------------------- helpers
def _send(t: Tensor, offset: int, stages_dim: Dimension, wrap: bool = False) -> Tensor:
  """Moves `t` one stage on (offset 1) or back (-1): a permute between
  neighbouring stages (with `wrap`, also from the last stage to the first
  or back: the interleaved schedule's ring). Where the layout replicates `t`
  over other mesh dimensions (the model-parallel ones, typically), each
  replica sends one block and the next stage all-gathers them
  (`mtf.shift(..., split_replicas=True)`), so the link between stages,
  often the network between hosts, carries 1/r of the activations."""
  return slicing.shift(t, offset, stages_dim, wrap=wrap, split_replicas=True)


def _stage_mask(mesh: Mesh, stages_dim: Dimension, stage: int, dtype) -> Tensor:
  """1 at `stage` along stages_dim, else 0 (a constant, split like stages)."""
  value = np.zeros([stages_dim.size], dtype=dtype.as_numpy_dtype)
  value[stage] = 1
  return const_ops.constant(mesh, value, Shape([stages_dim]), dtype=dtype)


_STAGE_CHUNKS = "pipeline.stage_chunks"  # Graph.keeps: the chunks a stage_fn call runs


def stage_chunks(graph) -> Optional[List[int]]:
  """Inside a stage function that the interleaved schedule calls: the layer
  chunk (c = v S + s) each stage runs in this call (an idle stage: its
  first, s); None elsewhere, where stage s runs chunk s.

  Example:
    >>> chunks = mtf.pipeline.stage_chunks(mesh.graph) or range(num_stages)
  """
  return graph.keeps.get(_STAGE_CHUNKS)


def _row_keys(cells: Dict[int, tuple], s_count: int, v_count: int, m_count: int) -> List[int]:
  """Per stage, the key its rows of random numbers are drawn from
  (`random_ops.keyed_rows`): micro-batch m's layer chunk c = v S + s draws
  from key m S V + c in every schedule (so its dropout masks are the same
  when the stage runs it forward and when it recomputes it); idle stages
  from keys past all of those. cells: {stage: (m, v)}."""
  chunks = s_count * v_count
  return [cells[s][0] * chunks + cells[s][1] * s_count + s if s in cells
          else m_count * chunks + s for s in range(s_count)]


def _inject(shifted: Optional[Tensor], value: Tensor, first: Tensor,
            stages_dim: Dimension) -> Tensor:
  """[stages] + value.shape: value in stage 0's row, `shifted` elsewhere
  (zeros if None)."""
  shape = Shape([stages_dim] + value.shape.dims)
  if shifted is None:
    shifted = const_ops.zeros(value.mesh, shape, dtype=value.dtype)
  return ew.where(first, value, shifted, output_shape=shape)


def _split_microbatches(x: Tensor, batch_dim: Dimension, num_microbatches: int,
                        what: str) -> List[Tensor]:
  """x [..., batch, ...] -> M tensors [..., batch/M, ...]; micro-batch m
  holds rows b * M + m (so a split of batch stays local)."""
  if batch_dim not in x.shape.dims:
    raise ValueError(f"pipeline: {what} {x.name} {x.shape} lacks the micro-batched "
                     f"dimension {batch_dim}.")
  mb_dim = Dimension(batch_dim.name, batch_dim.size // num_microbatches)
  m_dim = Dimension("microbatches", num_microbatches)
  dims = []
  for d in x.shape.dims:
    dims += [mb_dim, m_dim] if d == batch_dim else [d]
  return slicing.unstack(shape_ops.reshape(x, Shape(dims)), m_dim)


def _join_microbatches(parts: Sequence[Tensor], batch_dim: Dimension,
                       mb_dim: Dimension) -> Tensor:
  axis = parts[0].shape.index_of(mb_dim.name) + 1
  stacked = slicing.stack(list(parts), "microbatches", axis)
  dims = [d for d in stacked.shape.dims if d.name != "microbatches"]
  dims = [batch_dim if d == mb_dim else d for d in dims]
  return shape_ops.reshape(stacked, Shape(dims))


def _check_args(x, stages_dim, num_microbatches, batch_dim):
  if not isinstance(x, Tensor):
    raise TypeError(f"pipeline: x must be an mtf.Tensor, got {x!r}.")
  if not isinstance(stages_dim, Dimension) or stages_dim.size < 1:
    raise TypeError(f"pipeline: stages_dim must be an mtf.Dimension, got {stages_dim!r}.")
  if stages_dim.name in x.shape.dimension_names:
    raise ValueError(f"pipeline: x {x.shape} already has the stages dimension "
                     f"{stages_dim.name!r}.")
  batch_dim = batch_dim or x.shape.dims[0]
  if isinstance(batch_dim, str):
    batch_dim = x.shape.get_dim_by_name(batch_dim)
  if num_microbatches < 1 or batch_dim.size % num_microbatches:
    raise ValueError(
        f"pipeline: num_microbatches={num_microbatches} must divide the size of "
        f"{batch_dim} of x {x.shape}. Change the batch size or the number of "
        "micro-batches.")
  return batch_dim


# ---------------------------------------------------------------- GPipe
def pipeline(stage_fn: Callable[..., Tensor], x: Tensor, stages_dim: Dimension,
             num_microbatches: int, schedule: str = "gpipe",
             carried: Sequence[Tensor] = (), batch_dim=None,
             init_name_fn: Optional[Callable[[str, int], str]] = None,
             return_stats: bool = False):
  """Runs `stage_fn` as S = stages_dim.size pipeline stages over M
  micro-batches of x (GPipe schedule) and returns the result, x's shape.

  `stage_fn(h, *carried_h)` gets the pipeline state h = [stages] + x's shape
  with the batch dimension cut to batch / M (row s: the micro-batch stage s
  works on), and each carried tensor likewise (per-example side inputs such
  as segment ids, moved along with h); it returns the new h (same shape).
  Variables it creates with `mtf.get_variable` get a leading `stages`
  dimension (see `StageVariables`): stage s's weights are row s. The model
  is then: y = stage_{S-1}(... stage_0(x)) applied to each micro-batch.

  Args:
    stage_fn: the layers of one stage, vectorized over `stages`.
    x: the input activations, e.g. [batch, length, d_model].
    stages_dim: e.g. mtf.Dimension("stages", 4); lay it out with a rule
      such as "stages:pp" so each processor along pp holds one stage.
    num_microbatches: M; must divide the batch dimension.
    schedule: "gpipe" (forward ticks here; backward by mtf.gradients). For
      "1f1b" use `pipeline_loss`, which schedules the backward itself.
    carried: per-example tensors sharing x's batch dimension, passed to
      stage_fn along with h.
    batch_dim: the dimension to cut into micro-batches (default: x's first).
    init_name_fn: see `StageVariables`.
    return_stats: also return {"useful_stage_ticks": int32 mtf scalar
      (counted from a flag carried through the executed schedule),
      "stage_ticks": S (M + S - 1), "schedule": PipelineSchedule}.

  Returns:
    y with x's shape (and the stats dict if return_stats).

  Example:
    >>> stages = mtf.Dimension("stages", 4)
    >>> def stage_fn(h):
    ...   w = mtf.get_variable(h.mesh, "w", [d_model, d_model])   # [stages, d, d]
    ...   return h + mtf.relu(mtf.einsum([h, w], output_shape=h.shape))
    >>> y = mtf.pipeline.pipeline(stage_fn, x, stages, num_microbatches=8)
  """
  if schedule != "gpipe":
    if schedule in SCHEDULES:
      raise ValueError(
          f"pipeline: schedule={schedule!r} needs the loss of each micro-batch inside "
          "the schedule; use mtf.pipeline.pipeline_loss(stage_fn, loss_fn, ...) "
          f"(LayerStack(..., pipeline_schedule={schedule!r}) does so).")
    raise ValueError(f"pipeline: schedule must be one of {SCHEDULES}, got {schedule!r}.")
  batch_dim = _check_args(x, stages_dim, num_microbatches, batch_dim)
  mesh = x.mesh
  s_count, m_count = stages_dim.size, num_microbatches
  xs = _split_microbatches(x, batch_dim, m_count, "x")
  cs = [_split_microbatches(c, batch_dim, m_count, "carried tensor") for c in carried]
  mb_dim = Dimension(batch_dim.name, batch_dim.size // m_count)
  first = ew.cast(_stage_mask(mesh, stages_dim, 0, tf.int32), tf.bool)
  last = _stage_mask(mesh, stages_dim, s_count - 1, x.dtype)
  sv = StageVariables(mesh, stages_dim, init_name_fn)
  one = _ones_scalar(mesh)
  zero = one * 0.0

  h = None
  c_state = [None] * len(cs)
  flag = None
  outputs = []
  useful = []
  for t in range(m_count + s_count - 1):
    src = min(t, m_count - 1)
    h_in = _inject(None if h is None else _send(h, 1, stages_dim),
                   xs[src] if t < m_count else const_ops.zeros_like(xs[0]), first, stages_dim)
    c_in = [_inject(None if c_state[i] is None else _send(c_state[i], 1, stages_dim),
                    cs[i][src], first, stages_dim) for i in range(len(cs))]
    f_in = _inject(None if flag is None else slicing.shift(flag, 1, stages_dim, wrap=False),
                   one if t < m_count else zero, first, stages_dim)
    if t == 0:
      sv.discover(stage_fn, h_in, *c_in)
    cells = {st: (t - st, 0) for st in range(s_count) if 0 <= t - st < m_count}
    with sv.stacked(), random_ops.keyed_rows(mesh.graph, stages_dim,
                                             _row_keys(cells, s_count, 1, m_count)):
      h = stage_fn(h_in, *c_in)
    if not isinstance(h, Tensor) or h.shape != h_in.shape:
      raise ValueError(f"pipeline: stage_fn must return one tensor of its input's shape "
                       f"{h_in.shape}, got {h!r}.")
    c_state, flag = c_in, f_in
    useful.append(flag)
    if t >= s_count - 1:
      outputs.append(einsum_ops.einsum([h, last], output_shape=Shape(h.shape.dims[1:])))
  y = _join_microbatches(outputs, batch_dim, mb_dim)
  y = _transpose_like(y, x.shape)
  if not return_stats:
    return y
  stats = {"useful_stage_ticks": control.stop_gradient(reduction.reduce_sum(ew.add_n(useful))),
           "stage_ticks": s_count * (m_count + s_count - 1),
           "schedule": PipelineSchedule("gpipe", s_count, m_count)}
  return y, stats


def _ones_scalar(mesh: Mesh) -> Tensor:
  return const_ops.constant(mesh, 1.0, Shape([]), dtype=tf.float32)


def _transpose_like(y: Tensor, shape: Shape) -> Tensor:
  if y.shape == shape:
    return y
  return shape_ops.transpose(y, shape)




# ---------------------------------------------------------------- with the loss
def pipeline_loss(stage_fn: Callable[..., Tensor], loss_fn: Callable[..., Tensor], x: Tensor,
                  stages_dim: Dimension, num_microbatches: int, schedule: str = "1f1b",
                  carried: Sequence[Tensor] = (), loss_inputs: Sequence[Tensor] = (),
                  batch_dim=None, init_name_fn: Optional[Callable[[str, int], str]] = None,
                  return_stats: bool = False, virtual_stages: int = 1):
  """The summed loss of a pipelined stack followed by a per-micro-batch loss.

  loss = sum over micro-batches m of loss_fn(y_m, *loss_inputs_m), where
  y_m is stage_{S-1}(... stage_0(x_m)) (see `pipeline` for stage_fn and
  carried). loss_fn must return a scalar; a mean over the whole batch must
  divide by the whole batch's count (computed outside, e.g. from targets).

  With schedule="gpipe" this is `pipeline` followed by loss_fn. With
  "1f1b" the backward pass is scheduled explicitly (see the module doc and
  `PipelineSchedule`): slot by slot, each stage runs the forward of one
  micro-batch or the backward of another; the backward of micro-batch m at
  stage s recomputes the stage's forward from its stashed input and applies
  `mtf.gradients` to it with the cotangent received from stage s + 1 (or from
  loss_fn at the last stage). Each slot's inputs depend on the previous
  slot's results, so TensorFlow runs the slots in order. The gradients,
  accumulated over the slots, are returned to `mtf.gradients` by
  `mtf.custom_gradient`; the result is the same loss and the same
  gradients as GPipe, up to float rounding. "interleaved" is the same with
  `virtual_stages` layer chunks per stage (the model is then the S x V
  chunks in order: stage_fn applied with chunk 0's weights, then chunk 1's,
  ...; see the module doc).

  Args:
    stage_fn: as in `pipeline`.
    loss_fn: loss_fn(y_m, *loss_inputs_m) -> scalar, or (scalar, aux_m)
      where aux_m is a per-example tensor with y_m's batch dimension (e.g.
      the logits, for metrics); may create variables (e.g. a softmax
      layer), which get gradients too.
    x: input activations with a batch dimension.
    stages_dim: the stages dimension (its size is S).
    num_microbatches: M.
    schedule: "1f1b", "interleaved" or "gpipe".
    carried: per-example tensors passed to stage_fn (see `pipeline`).
    loss_inputs: per-example tensors passed to loss_fn (e.g. targets).
    batch_dim: the dimension cut into micro-batches (default: x's first).
    init_name_fn: see `StageVariables`.
    return_stats: also return {"schedule": PipelineSchedule, "slots": its
      number of slots, "idle_fraction": the idle stage-slots counted in the
      schedule table, "useful_stage_slots": an mtf scalar measured in the
      executed graph (flags that travel with the activations and, for
      1F1B, with the cotangents; for GPipe twice the forward count, the
      backward mirroring it), out of S * slots}.
    virtual_stages: V, layer chunks per stage ("interleaved" only).

  Returns:
    the scalar loss, or (loss, aux) with the aux tensors of all
    micro-batches joined in batch order; followed by the stats dict if
    return_stats.

  Example:
    >>> loss = mtf.pipeline.pipeline_loss(
    ...     stage_fn, lambda y, t: mtf.reduce_sum(mtf.square(y - t)) / n, x,
    ...     stages, 8, schedule="1f1b", loss_inputs=[t])
  """
  if schedule not in SCHEDULES:
    raise ValueError(f"pipeline_loss: schedule must be one of {SCHEDULES}, got {schedule!r}.")
  batch_dim = _check_args(x, stages_dim, num_microbatches, batch_dim)
  s_count, m_count = stages_dim.size, num_microbatches
  table = PipelineSchedule(schedule, s_count, m_count, virtual_stages)
  stats = {"schedule": table, "slots": table.num_slots, "idle_fraction": table.idle_fraction}
  if schedule == "gpipe":
    y, gpipe_stats = pipeline(stage_fn, x, stages_dim, m_count, carried=carried,
                              batch_dim=batch_dim, init_name_fn=init_name_fn, return_stats=True)
    ys = _split_microbatches(y, batch_dim, m_count, "y")
    ins = [_split_microbatches(t, batch_dim, m_count, "loss input") for t in loss_inputs]
    heads = [_loss_and_aux(loss_fn(ys[m], *[i[m] for i in ins])) for m in range(m_count)]
    # The backward pass mirrors the forward ticks counted by the flag.
    stats["useful_stage_slots"] = gpipe_stats["useful_stage_ticks"] * 2.0
    loss = ew.add_n([h[0] for h in heads])
    aux = [h[1] for h in heads]
  else:
    run = _OneFOneB(stage_fn, loss_fn, x, stages_dim, table, list(carried), list(loss_inputs),
                    batch_dim, init_name_fn)
    loss = run.build()
    aux = run.aux
    stats["useful_stage_slots"] = run.useful_stage_slots
  result = loss
  if aux[0] is not None:
    mb_dim = Dimension(batch_dim.name, batch_dim.size // m_count)
    result = (loss, _join_microbatches(aux, batch_dim, mb_dim))
  if return_stats:
    return (result + (stats,)) if isinstance(result, tuple) else (result, stats)
  return result


def _loss_and_aux(result):
  """loss_fn's result as (scalar loss, per-example tensor or None)."""
  if isinstance(result, (tuple, list)):
    if len(result) != 2:
      raise ValueError("pipeline_loss: loss_fn must return a scalar or (scalar, tensor).")
    loss, aux = result
  else:
    loss, aux = result, None
  if not isinstance(loss, Tensor) or loss.shape.ndims != 0:
    raise ValueError(f"pipeline_loss: loss_fn must return a scalar mtf.Tensor, got {loss!r}.")
  return loss, aux


def _first_row(h: Tensor) -> Tensor:
  """h [stages, ...] -> [...] (a placeholder value of one stage's output)."""
  return reduction.reduce_sum(h, reduced_dim=h.shape.dims[0])


def _create_variables_only(graph, fn, *args):
  """Calls fn and keeps only the variables it created (drops its other ops)."""
  start = len(graph.operations)
  fn(*args)
  graph.operations[start:] = [op for op in graph.operations[start:]
                              if getattr(op, "is_variable", False)]


def _captured_inputs(graph, start: int, exclude) -> List[Tensor]:
  """Floating tensors that the ops from `start` on read but did not make."""
  ops = graph.operations[start:]
  made = {t for op in ops for t in op.outputs}
  exclude = set(exclude)
  seen, result = set(), []
  for op in ops:
    for t in op.inputs:
      if t in made or t in exclude or t in seen or not t.dtype.is_floating:
        continue
      seen.add(t)
      result.append(t)
  return result


class _OneFOneB:
  """Builds the explicit 1F1B schedule of `pipeline_loss`."""

  def __init__(self, stage_fn, loss_fn, x, stages_dim, table, carried, loss_inputs,
               batch_dim, init_name_fn):
    self.stage_fn, self.loss_fn = stage_fn, loss_fn
    self.x, self.stages_dim, self.table = x, stages_dim, table
    self.carried, self.loss_inputs = carried, loss_inputs
    self.batch_dim = batch_dim
    self.mesh = x.mesh
    self.sv = StageVariables(self.mesh, stages_dim, init_name_fn, table.virtual_stages)
    self.v_count = table.virtual_stages
    self.aux: List[Optional[Tensor]] = [None]
    self.useful_stage_slots: Optional[Tensor] = None

  def _prepare(self):
    """Creates the stage's stacked variables and the loss's variables
    before the custom-gradient region, so that they are its inputs."""
    graph = self.mesh.graph
    m_count = self.table.num_microbatches
    start = len(graph.operations)
    xs = _split_microbatches(self.x, self.batch_dim, m_count, "x")
    cs = [_split_microbatches(c, self.batch_dim, m_count, "carried tensor")
          for c in self.carried]
    h = _inject(None, xs[0], self._mask(0, tf.bool), self.stages_dim)
    c = [_inject(None, ci[0], self._mask(0, tf.bool), self.stages_dim) for ci in cs]
    self.sv.discover(self.stage_fn, h, *c)
    ins = [_split_microbatches(t, self.batch_dim, m_count, "loss input")[0]
           for t in self.loss_inputs]
    _create_variables_only(graph, self.loss_fn, _first_row(h), *ins)
    graph.operations[start:] = [op for op in graph.operations[start:]
                                if getattr(op, "is_variable", False)]

  def _mask(self, stage_rows, dtype):
    """[stages] constant: 1 on the given stage (or list of stages)."""
    rows = [stage_rows] if isinstance(stage_rows, int) else list(stage_rows)
    value = np.zeros([self.stages_dim.size], dtype=np.int32)
    value[rows] = 1
    t = const_ops.constant(self.mesh, value, Shape([self.stages_dim]), dtype=tf.int32)
    return ew.cast(t, dtype) if dtype != tf.int32 else t

  def build(self) -> Tensor:
    self._prepare()
    explicit = [self.x] + self.carried + self.loss_inputs
    holder = {}

    def fn(*inputs):
      loss, grads = self._schedule(inputs)
      holder["grads"] = grads
      return loss

    def grad_fn(xs, captured, ys, dys):
      grads = holder["grads"]
      scale = dys[0]

      def scaled(t):
        g = grads.get(t)
        return None if g is None else g * scale
      return [scaled(t) for t in xs] + [scaled(t) for t in captured]
    return control.custom_gradient(fn, grad_fn, explicit, name="pipeline_1f1b")

  def _schedule(self, inputs):
    graph = self.mesh.graph
    outside = set(graph.operations)  # gradients are wanted for these ops' outputs only

    def captured(start, exclude):
      return [t for t in _captured_inputs(graph, start, exclude) if t.operation in outside]
    s_count, m_count = self.stages_dim.size, self.table.num_microbatches
    n_c = len(self.carried)
    x, carried, loss_inputs = inputs[0], list(inputs[1:1 + n_c]), list(inputs[1 + n_c:])
    xs = _split_microbatches(x, self.batch_dim, m_count, "x")
    cs = [_split_microbatches(c, self.batch_dim, m_count, "carried tensor") for c in carried]
    ls = [_split_microbatches(t, self.batch_dim, m_count, "loss input") for t in loss_inputs]
    first_b = self._mask(0, tf.bool)
    last_f = self._mask(s_count - 1, x.dtype)
    first_f = self._mask(0, x.dtype)
    acc: Dict[Tensor, Tensor] = {}
    dx = [None] * m_count

    def accumulate(t, g):
      if g is not None:
        acc[t] = g if t not in acc else acc[t] + g

    f_done = {}     # (stage, m, v) -> slot of that forward
    b_done = {}     # (stage, m, v) -> slot of that backward
    f_in, recv_f = {}, {}   # per slot: stage inputs / outputs shifted to stage + 1
    recv_b = {}             # per slot: input gradients shifted to stage - 1
    head_dy = {}                       # m -> dloss_m / dy_m
    aux = [None] * m_count
    one = _ones_scalar(self.mesh)
    flags = []                         # per phase: 1 where a stage got real work
    recv_b_flag = {}
    losses = []
    prev = []                          # the previous slot's results (ordering)
    v_count = self.v_count
    wrap = v_count > 1  # chunk v S - 1 (last stage) feeds chunk v S (first stage)
    last_chunk = s_count * v_count - 1

    def cells(row, kind):
      """{stage: (micro-batch, chunk v)} of the row's cells of `kind`."""
      return {s: (c[1], chunk_of(c)) for s, c in enumerate(row)
              if c is not None and c[0] == kind}
    for u, row in enumerate(self.table.table):
      fwd, bwd = cells(row, "F"), cells(row, "B")
      results = []
      if fwd:
        parts = []
        for s, (m, v) in fwd.items():
          if v * s_count + s == 0:
            src = [xs[m]] + [ci[m] for ci in cs] + [one]
            parts.append((s, None, src))
          else:  # from the chunk before: the stage before, or the last one round
            parts.append((s, f_done[((s - 1) % s_count, m, v if s else v - 1)], None))
        # The last entry is a flag that travels with the data (it counts the
        # stage-slots that received a real micro-batch).
        state = self._route(parts, recv_f, prev, first_b)
        flags.append(state[-1])
        state = state[:-1]
        with self._weights(fwd), self._keyed(fwd):
          h = self.stage_fn(*state)
        f_in[u] = state
        recv_f[u] = [_send(t, 1, self.stages_dim, wrap)
                     for t in [h] + state[1:] + [flags[-1]]]
        results.append(h)
        for s, (m, v) in fwd.items():
          f_done[(s, m, v)] = u
        if fwd.get(s_count - 1, (0, -1))[1] == v_count - 1:
          m = fwd[s_count - 1][0]
          y = einsum_ops.einsum([h, last_f], output_shape=Shape(h.shape.dims[1:]))
          start = len(graph.operations)
          loss_m, aux_m = _loss_and_aux(self.loss_fn(y, *[li[m] for li in ls]))
          aux[m] = aux_m
          cap = captured(start, [y])
          grads = mtf_gradients([loss_m], [y] + cap, operations=graph.operations[start:])
          head_dy[m] = grads[0]
          for t, g in zip(cap, grads[1:]):
            accumulate(t, g)
          losses.append(loss_m)
      if bwd:
        # Stashed stage inputs of the micro-batches being differentiated.
        stash = self._select([(s, f_in[f_done[(s, m, v)]]) for s, (m, v) in bwd.items()], prev)
        cot_parts, flag_parts = [], []
        for s, (m, v) in bwd.items():
          if v * s_count + s == last_chunk:
            cot_parts.append((s, head_dy[m]))
            flag_parts.append((s, one))
          else:  # from the chunk after: the next stage, or the first one round
            slot = b_done[((s + 1) % s_count, m, v if s < s_count - 1 else v + 1)]
            cot_parts.append((s, recv_b[slot]))
            flag_parts.append((s, recv_b_flag[slot]))
        cot = self._select_cotangent(cot_parts, stash[0].shape)
        b_flag = self._select_cotangent(flag_parts, Shape([self.stages_dim]))
        flags.append(b_flag)
        recv_b_flag[u] = slicing.shift(b_flag, -1, self.stages_dim, wrap=wrap)
        h_in = control.stop_gradient(stash[0])
        start = len(graph.operations)
        with self._weights(bwd), self._keyed(bwd):
          h_out = self.stage_fn(h_in, *stash[1:])
        cap = captured(start, [h_in])
        grads = mtf_gradients([h_out], [h_in] + cap, grad_ys=[cot],
                              operations=graph.operations[start:])
        gx = grads[0]
        for t, g in zip(cap, grads[1:]):
          accumulate(t, g)
        recv_b[u] = _send(gx, -1, self.stages_dim, wrap)
        results.append(gx)
        for s, (m, v) in bwd.items():
          b_done[(s, m, v)] = u
          if s == 0 and v == 0:
            dx[m] = einsum_ops.einsum([gx, first_f], output_shape=Shape(gx.shape.dims[1:]))
      prev = results
    dx_full = _transpose_like(
        _join_microbatches(dx, self.batch_dim,
                           Dimension(self.batch_dim.name, self.batch_dim.size // m_count)),
        x.shape)
    grads = dict(acc)
    grads[x] = dx_full
    self.aux = aux
    self.useful_stage_slots = control.stop_gradient(reduction.reduce_sum(ew.add_n(flags)))
    return ew.add_n(losses), grads

  @contextlib.contextmanager
  def _keyed(self, work):
    """A slot's stage_fn call: its random numbers (dropout) keyed by each
    stage's micro-batch and chunk (a backward slot's recomputation draws the
    forward slot's masks), and with virtual stages `stage_chunks` naming
    each stage's chunk."""
    graph, s_count = self.mesh.graph, self.stages_dim.size
    named_chunks = (graph.keeping(_STAGE_CHUNKS, [work[s][1] * s_count + s if s in work else s
                                                  for s in range(s_count)])
                    if self.v_count > 1 else contextlib.nullcontext())
    row_keys = _row_keys(work, s_count, self.v_count, self.table.num_microbatches)
    with named_chunks, random_ops.keyed_rows(graph, self.stages_dim, row_keys):
      yield

  def _weights(self, work):
    """Context for a slot's stage_fn call: each stage's weights (with
    virtual stages, of the chunk `work` gives it: {stage: (m, v)})."""
    if self.v_count == 1:
      return self.sv.stacked()
    return self.sv.stacked(self.sv.pick_chunks({s: v for s, (_, v) in work.items()}))

  def _route(self, parts, recv_f, prev, first_b):
    """The forward inputs of a slot: per stage, a new micro-batch (stage 0)
    or what stage s - 1 sent at an earlier slot; zeros for idle stages."""
    state = None
    for s, slot, src in parts:
      if src is not None:
        vals = [_inject(None, v, first_b, self.stages_dim) for v in src]
        mask = first_b
      else:
        vals = recv_f[slot]
        mask = self._mask(s, tf.bool)
      if state is None:
        zeros = [const_ops.zeros_like(v) for v in vals]
        state = zeros
      state = [ew.where(mask, v, acc, output_shape=acc.shape) for v, acc in zip(vals, state)]
    if prev:
      state = [control.depend(state[0], prev)] + state[1:]
    return state

  def _select(self, parts, prev):
    """Per stage s, row s of the given tensors (stashed inputs); zeros
    elsewhere."""
    state = None
    for s, vals in parts:
      mask = self._mask(s, tf.bool)
      if state is None:
        state = [const_ops.zeros_like(v) for v in vals]
      state = [ew.where(mask, v, acc, output_shape=acc.shape) for v, acc in zip(vals, state)]
    if prev:
      state = [control.depend(state[0], prev)] + state[1:]
    return state

  def _select_cotangent(self, parts, shape):
    out = None
    for s, g in parts:
      mask = self._mask(s, tf.bool)
      if out is None:
        out = const_ops.zeros(self.mesh, shape, dtype=g.dtype)
      out = ew.where(mask, g, out, output_shape=shape)
    return out


def mtf_gradients(ys, xs, grad_ys=None, operations=None):
  """mtf.gradients (imported late: gradients imports the op modules)."""
  from mesh_tensorflow.operations.gradients import gradients  # pylint: disable=import-outside-toplevel
  return gradients(ys, xs, grad_ys=grad_ys, operations=operations)


__all__ = ["PipelineSchedule", "StageVariables", "pipeline", "pipeline_loss", "SCHEDULES"]

from mesh_tensorflow.core import autograph_exempt as _autograph_exempt  # noqa: E402  pylint: disable=g-import-not-at-top
_autograph_exempt.exempt(globals())  # AutoGraph leaves this module's code alone
