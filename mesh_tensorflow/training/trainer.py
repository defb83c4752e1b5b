"""A TF2 training loop for mtf models: compiled train and eval steps, inputs
from tf.data split by the layout, gradient accumulation, checkpoints that
resume (on any mesh), TensorBoard summaries and progress on the terminal.

    >>> def model_fn(mesh, features, mode):
    ...   logits = ...                    # build the model from mtf features
    ...   loss = ...
    ...   return loss, {"accuracy": accuracy}
    >>> trainer = mtf.training.Trainer(
    ...     model_fn, {"image": "batch:128;pixels:64", "label": "batch:128"},
    ...     mesh_impl, mtf.optimize.SgdOptimizer(0.1), model_dir="/tmp/run")
    >>> trainer.train(dataset, steps=1000)
    >>> trainer.evaluate(eval_dataset)
"""

from __future__ import annotations

import math
import time
from typing import Callable, Dict, Optional, Sequence

import tensorflow as tf
from absl import logging

from mesh_tensorflow import _environment
from mesh_tensorflow.training import checkpoint as checkpoint_lib
from mesh_tensorflow.training import offload
from mesh_tensorflow.lowering import slice_variables
from mesh_tensorflow.training import zero
from mesh_tensorflow.operations.gradients import gradients
from mesh_tensorflow.core.graph import Graph, Mesh, Tensor
from mesh_tensorflow.lowering.lowering import Lowering
from mesh_tensorflow.operations import constant_ops as const_ops
from mesh_tensorflow.operations import elementwise as ew
from mesh_tensorflow.operations import variables as var_ops
from mesh_tensorflow.core.shapes import Shape, convert_to_shape

TRAIN, EVAL = "train", "eval"


def scalar_summary(name: str, value: Tensor) -> None:
  """Records an mtf scalar to be written to TensorBoard by the Trainer.

  Example:
    >>> mtf.scalar_summary("z_loss", z_loss)
  """
  if not isinstance(value, Tensor) or value.shape.ndims != 0:
    raise ValueError(f"scalar_summary {name!r}: expected a scalar mtf.Tensor, got {value!r}.")
  value.graph.summaries.append((name, value))


def _as_loss_and_metrics(result, mode):
  if isinstance(result, Tensor):
    return result, {}
  if isinstance(result, (tuple, list)) and len(result) == 2:
    loss, metrics = result
    return loss, dict(metrics or {})
  raise TypeError(f"model_fn({mode!r}) must return a loss tensor or (loss, metrics dict); "
                  f"got {result!r}.")


class Trainer:
  """Turns an mtf model function into compiled TF2 train and eval steps.

  Args:
    model_fn: model_fn(mesh, features, mode) -> loss or (loss, {name: scalar}),
      where features maps names to mtf Tensors and mode is "train" or "eval".
      The loss must be a scalar mtf Tensor.
    feature_shapes: {name: mtf shape} of one batch (e.g. "batch:128;pixels:64").
      Each batch from tf.data is imported with these shapes, so every processor
      receives only its slice.
    mesh_impl: the mesh implementation (mesh shape, layout and devices).
    optimizer: an mtf.optimize.Optimizer, or a function of the global step (a
      float mtf scalar) returning one (for learning-rate schedules).
    model_dir: where checkpoints and TensorBoard events go (None: neither). If
      it holds a checkpoint, the Trainer resumes from it (on any mesh/layout).
    grad_accum_steps: micro-batches whose gradients are averaged per update;
      each dataset element is one micro-batch, so an update sees
      grad_accum_steps * batch examples and equals one step on the
      concatenated batch (up to float rounding).
    checkpoint_every: save every this many steps (and at the end of train).
    keep_checkpoints: how many checkpoints to keep.
    log_every: print progress every this many steps (0: never).
    log_fn: where progress lines go (default: print to stdout).
    eval_feature_shapes: feature shapes of evaluation batches, if they differ
      from feature_shapes (e.g. a larger batch, or an extra "weight" feature).
    checkpoint_options: tf.train.CheckpointOptions for every save.
    zero_stage: ZeRO stage 0 to 3 (see `mesh_tensorflow.training.zero`): shard
      optimizer slots (1), then gradients (2), then the variables (3) over
      the data-parallel mesh dimension. Checkpoints do not depend on it.
    zero_mesh_dim: the mesh dimension to shard over (default: the one
      splitting "batch").
    zero_reshard_after_forward: stage 3: False keeps each gathered variable
      from the forward pass to the backward pass (one gather per step).
    float32_master_in_optimizer: store the variables in their 16-bit
      activation dtype and keep their float32 masters in the optimizer's
      state, sharded with the slots from stage 1 (DeepSpeed's and
      Megatron-LM's distributed optimizer's layout; `mtf.zero`).
    loss_scale: a `mtf.mixed_precision.DynamicLossScale` for float16
      training: steps with non-finite gradients are skipped (variables and
      slots unchanged; the global step still advances) and logged.
    checkpoint_path: restore this checkpoint of model_dir's run instead of
      the newest intact one (a damaged one is an error naming the intact ones).
    jit_compile: compile the train and eval steps with XLA. With a
      `SimdMeshImpl` this sets its `jit_compile` (each processor's program
      is compiled; True or "auto", see there). With a `PlacementMeshImpl` the
      mesh must have one processor (XLA compiles one device's program);
      "auto" compiles exactly then.

  An `mtf.adascale.AdaScale` optimizer takes its gradient samples from the
  data-parallel replicas (grad_accum_steps=1) or from the micro-batches
  (grad_accum_steps equal to its scale); the Trainer calls its `configure`.

  Example:
    >>> trainer = Trainer(model_fn, shapes, impl, mtf.optimize.SgdOptimizer(0.1))
    >>> history = trainer.train(dataset, steps=500)
  """

  def __init__(self, model_fn: Callable, feature_shapes: Dict[str, object], mesh_impl,
               optimizer, model_dir: Optional[str] = None, grad_accum_steps: int = 1,
               checkpoint_every: Optional[int] = 1000, keep_checkpoints: int = 3,
               log_every: int = 100, log_fn: Optional[Callable[[str], None]] = None,
               eval_feature_shapes: Optional[Dict[str, object]] = None,
               checkpoint_options: Optional[tf.train.CheckpointOptions] = None,
               zero_stage: int = 0, zero_mesh_dim: Optional[str] = None,
               zero_reshard_after_forward: bool = True, loss_scale=None,
               checkpoint_path: Optional[str] = None,
               jit_compile=False, float32_master_in_optimizer: bool = False):
    if jit_compile not in (True, False, "auto"):
      raise ValueError(f"Trainer: jit_compile={jit_compile!r}; choose True, False or 'auto'.")
    if hasattr(mesh_impl, "run_all"):
      if jit_compile:
        mesh_impl.jit_compile = jit_compile
      self._jit = False  # the SIMD program compiles itself
    elif jit_compile is True and mesh_impl.size > 1:
      raise ValueError(
          f"Trainer: jit_compile=True needs a one-processor mesh with "
          f"{type(mesh_impl).__name__} (its mesh has {mesh_impl.size} processors, one "
          "program per device in one graph, which XLA does not compile); use "
          "SimdMeshImpl, whose per-processor program XLA compiles, or jit_compile='auto'.")
    else:
      self._jit = bool(jit_compile) and mesh_impl.size == 1
    if grad_accum_steps < 1:
      raise ValueError(f"Trainer: grad_accum_steps must be >= 1, got {grad_accum_steps}.")
    if zero_stage not in zero.STAGES:
      raise ValueError(f"Trainer: zero_stage must be one of {zero.STAGES}, got {zero_stage!r}.")
    if hasattr(optimizer, "sample_ops"):  # AdaScale: settle its gradient samples
      optimizer.configure(mesh_impl, grad_accum_steps)
    self._zero_stage = zero_stage
    self._zero_mesh_dim = zero_mesh_dim
    zero.check_reshard(zero_stage, zero_reshard_after_forward)
    self._zero_reshard = zero_reshard_after_forward
    self._float32_master = float32_master_in_optimizer
    self._loss_scale = loss_scale
    self._model_fn = model_fn
    self._shapes = {k: convert_to_shape(v) for k, v in feature_shapes.items()}
    self._eval_shapes = ({k: convert_to_shape(v) for k, v in eval_feature_shapes.items()}
                         if eval_feature_shapes is not None else self._shapes)
    self._impl = mesh_impl
    self._optimizer = optimizer
    self._model_dir = model_dir
    self._accum = grad_accum_steps
    self._checkpoint_every = checkpoint_every
    self._log_every = log_every
    self._log = log_fn or (lambda line: print(line, flush=True))
    self._functions = {}
    self._manager = None
    self._writer = None
    if model_dir:
      self._manager = checkpoint_lib.CheckpointManager(
          mesh_impl, model_dir, max_to_keep=keep_checkpoints, options=checkpoint_options)
      restored = self._manager.restore_or_initialize(checkpoint_path)
      if restored:
        self._log(f"restored checkpoint {restored} (step {self.global_step})")

  def _summary_writer(self) -> Optional[tf.summary.SummaryWriter]:
    """model_dir's TensorBoard writer, made at the first summary (so a run
    that fails before its first step writes nothing into model_dir); None
    without model_dir, or without TensorBoard (which says so in one line)."""
    if (self._writer is None and self._model_dir
        and _environment.tensorboard_available(self._model_dir)):
      self._writer = tf.summary.create_file_writer(self._model_dir)
    return self._writer

  # ---- state ---------------------------------------------------------------
  def _step_variable(self) -> tf.Variable:
    return slice_variables.scalar_state(self._impl, "global_step", tf.int64)

  @property
  def global_step(self) -> int:
    """Number of optimizer updates applied so far (restored from checkpoints)."""
    return int(self._step_variable().numpy())

  @property
  def checkpoint_manager(self) -> Optional[checkpoint_lib.CheckpointManager]:
    return self._manager

  def save(self) -> Optional[str]:
    """Writes a checkpoint now (if there is a model_dir); returns its path."""
    if self._manager is None:
      return None
    path = self._manager.save(self.global_step)
    self._log(f"saved checkpoint {path}")
    return path

  # ---- graph building ------------------------------------------------------
  def _build(self, batch: Dict[str, tf.Tensor], mode: str, apply_update: bool):
    graph = Graph()
    mesh = Mesh(graph, "mesh")
    step_var = self._step_variable()
    features = {name: const_ops.import_tf_tensor(mesh, batch[name], shape, name=name)
                for name, shape in self._shapes_for(mode).items()}
    loss, metrics = _as_loss_and_metrics(self._model_fn(mesh, features, mode), mode)
    if not isinstance(loss, Tensor) or loss.shape.ndims != 0:
      raise ValueError(f"model_fn must return a scalar mtf loss, got {loss!r}.")
    plan = zero.shard_training_state(graph, self._impl, self._zero_stage,
                                     self._zero_mesh_dim, self._zero_reshard,
                                     self._float32_master)
    updates = []
    if mode == TRAIN:
      updates = self._train_updates(graph, mesh, loss, plan, step_var, apply_update)
    lowering = Lowering(graph, offload.lowering_map(graph, {mesh: self._impl}))
    outputs = {"loss": lowering.export_to_tf_tensor(loss)}
    for name, value in metrics.items():
      outputs[name] = lowering.export_to_tf_tensor(value)
    for name, value in graph.summaries:
      outputs[f"summary/{name}"] = lowering.export_to_tf_tensor(value)
    update_ops = [lowering.lowered_operation(u) for u in updates]
    with tf.control_dependencies(update_ops + list(outputs.values())):
      if mode == TRAIN and apply_update:
        update_ops.append(step_var.assign_add(1))
      done = tf.group(*update_ops)
    with tf.control_dependencies([done]):
      return {k: tf.identity(v) for k, v in outputs.items()}

  def _train_updates(self, graph, mesh, loss, plan, step_var, apply_update):
    """The update (or, for a micro-batch, accumulation) ops of one step."""
    variables = graph.trainable_variables
    scaler = self._loss_scale
    if scaler is not None:
      loss = scaler.scale_loss(loss)
    grads = gradients([loss], [v.outputs[0] for v in variables])
    raw_grads = grads  # AdaScale samples="replicas" reads their pending allreduce
    finite = None
    if scaler is not None:  # with micro-batches, their sum is checked below
      grads, finite = scaler.unscale(grads, check=self._accum == 1)
    grads = zero.shard_gradients(grads, variables)  # stages 2, 3: reduce-scattered
    optimizer, step = self._optimizer_for(mesh, step_var)
    sampled = hasattr(optimizer, "sample_ops")  # AdaScale
    if self._accum == 1:
      extra = ({"replica_sample": optimizer.replica_sample(raw_grads, scaler)}
               if sampled and optimizer.samples == "replicas" else {})
      updates = optimizer.apply_grads(grads, variables, step=step, apply_if=finite, **extra)
    else:
      accums = [var_ops.get_variable(
          mesh, f"grad_accumulator/{v.name}", plan.shapes[v] if plan.shards_gradient(v)
          else v.shape, dtype=tf.float32 if plan.keeps_master(v) else v.master_dtype,
          initializer=tf.zeros_initializer(),
          trainable=False) for v in variables]
      if not apply_update:
        updates = [var_ops.assign_add(a, ew.cast(g, a.dtype))
                   for a, g in zip(accums, grads) if g is not None]
        return updates + (optimizer.sample_ops(grads) if sampled else [])
      totals = [None if g is None else (a + ew.cast(g, a.dtype)) * (1.0 / self._accum)
                for a, g in zip(accums, grads)]
      if scaler is not None:
        finite = scaler.check(totals)
      extra = {"last_sample": grads} if sampled else {}
      updates = optimizer.apply_grads(totals, variables, step=step, apply_if=finite, **extra)
      updates += [var_ops.assign(a, const_ops.zeros_like(a)) for a in accums]
    if scaler is not None:
      updates += scaler.update(finite)
    return updates

  def _optimizer_for(self, mesh, step_var):
    """(optimizer, global step as a float mtf scalar): the optimizer and any
    schedule count updates with the Trainer's checkpointed global step."""
    step = const_ops.import_fully_replicated(
        mesh, tf.cast(step_var.read_value(), tf.float32), Shape([]), name="global_step")
    if callable(self._optimizer) and not hasattr(self._optimizer, "apply_grads"):
      return self._optimizer(step), step
    return self._optimizer, step

  def _shapes_for(self, mode: str) -> Dict[str, Shape]:
    return self._eval_shapes if mode == EVAL else self._shapes

  def _signature(self, mode: str, element_spec) -> Dict[str, tf.TensorSpec]:
    """The step function's input signature: the feature shapes, checked
    against the dataset's element_spec."""
    what = "eval_feature_shapes" if mode == EVAL and self._eval_shapes is not self._shapes \
        else "feature_shapes"
    if not isinstance(element_spec, dict):
      raise ValueError(
          f"Trainer: dataset elements must be dicts of features {sorted(self._shapes_for(mode))}"
          f", got {element_spec}. Map tuples to dicts, e.g. "
          "dataset.map(lambda x, y: {'image': x, 'label': y}).")
    signature = {}
    for name, shape in self._shapes_for(mode).items():
      if name not in element_spec:
        raise ValueError(
            f"Trainer: the dataset has no feature {name!r} (it has {sorted(element_spec)}); "
            f"check {what}.")
      spec = element_spec[name]
      dims = shape.to_integer_list()
      if not spec.shape.is_compatible_with(dims):
        raise ValueError(
            f"Trainer: feature {name!r} has shape {spec.shape} in the dataset but {what} "
            f"gives {shape} ({dims}). Batch with drop_remainder=True so every batch has "
            "the same size.")
      signature[name] = tf.TensorSpec(dims, spec.dtype, name=name)
    return signature

  def _features(self, batch, mode: str, where: str) -> Dict[str, tf.Tensor]:
    """The batch's features for `mode`, checked against the feature shapes
    (datasets whose element_spec leaves the batch size open may still yield a
    short last batch)."""
    out = {}
    for name, shape in self._shapes_for(mode).items():
      value = batch[name]
      if value.shape.as_list() != shape.to_integer_list():
        raise ValueError(
            f"{where}: feature {name!r} of a batch has shape {value.shape}, but the "
            f"feature shapes give {shape} ({shape.to_integer_list()}). Batch with "
            "drop_remainder=True so every batch has the same size.")
      out[name] = value
    return out

  def _function(self, mode: str, apply_update: bool, element_spec):
    key = (mode, apply_update)
    signature = self._signature(mode, element_spec)
    if key not in self._functions:
      def step_fn(batch):
        return self._build(batch, mode, apply_update)
      if hasattr(self._impl, "run_all"):
        # A SIMD mesh implementation runs the step as its own program on every
        # processor (it traces step_fn once, and eagerly calls it per device).
        impl = self._impl
        self._functions[key] = lambda batch: impl.run(step_fn, batch)
      else:
        self._functions[key] = tf.function(step_fn, input_signature=[signature],
                                           autograph=False,
                                           jit_compile=True if self._jit else None)
    return self._functions[key]

  # ---- loops ---------------------------------------------------------------
  def train(self, dataset: tf.data.Dataset, steps: int,
            hooks: Sequence[Callable[[int, Dict[str, float]], None]] = ()) -> Dict[str, list]:
    """Trains until the global step reaches `steps`.

    Resuming where a previous run stopped, the batches it consumed are skipped,
    so a deterministic dataset gives the same sequence as an uninterrupted run.

    Args:
      dataset: a tf.data.Dataset of feature dicts, one (micro-)batch per
        element; repeat() it so it does not run out.
      steps: the global step to train to (not a number of steps to add).
      hooks: functions hook(step, outputs) called after every update, with the
        step's loss, metrics and summaries as floats (e.g. to evaluate every N
        steps).

    Returns:
      {"step": [...], "loss": [...], metric: [...]} for the steps run now.

    Raises:
      ValueError: if the dataset lacks a feature, has other shapes, or runs out.

    Example:
      >>> history = trainer.train(dataset.repeat(), steps=1000)
      >>> history["loss"][-1]
    """
    start = self.global_step
    if start >= steps:
      self._log(f"already at step {start} >= {steps}; nothing to train")
      return {"step": [], "loss": []}
    spec = dataset.element_spec
    accumulate = self._function(TRAIN, False, spec) if self._accum > 1 else None
    apply = self._function(TRAIN, True, spec)
    batches = iter(dataset.skip(start * self._accum))
    history = {"step": [], "loss": []}
    t0, last_t, last_step = time.perf_counter(), time.perf_counter(), start
    for step in range(start + 1, steps + 1):
      losses = []
      for micro in range(self._accum):
        try:
          batch = next(batches)
        except StopIteration:
          raise ValueError(
              f"Trainer.train: the dataset ran out at step {step} (it must provide "
              f"{steps * self._accum} batches, counting the {start * self._accum} skipped "
              "when resuming); repeat() it.") from None
        out = (apply if micro == self._accum - 1 else accumulate)(
            self._features(batch, TRAIN, f"Trainer.train (step {step})"))
        losses.append(float(out["loss"]))
      out = {k: float(v) for k, v in out.items()}
      out["loss"] = sum(losses) / len(losses)
      if out.get("summary/loss_scale/finite", 1.0) == 0.0:
        message = (f"step {step}: non-finite gradients, update skipped; loss scale "
                   f"{out['summary/loss_scale/scale']:g} -> "
                   f"{self._loss_scale.scale_after_overflow(out['summary/loss_scale/scale']):g}")
        logging.warning(message)
        self._log(message)
      history["step"].append(step)
      for k, v in out.items():
        history.setdefault(k, []).append(v)
      if self._summary_writer() is not None:
        with self._writer.as_default(step=step):
          for k, v in out.items():
            tf.summary.scalar(k.replace("summary/", ""), v)
      if self._log_every and (step % self._log_every == 0 or step == steps):
        now = time.perf_counter()
        rate = (step - last_step) / max(now - last_t, 1e-9)
        eta = (steps - step) / rate if rate > 0 else float("inf")
        extra = "".join(f" {k}={v:.4f}" for k, v in out.items() if k != "loss")
        self._log(f"step {step}/{steps} loss={out['loss']:.4f}{extra} "
                  f"{rate:.1f} steps/s eta {_format_seconds(eta)}")
        last_t, last_step = now, step
      for hook in hooks:
        hook(step, out)
      if self._manager and self._checkpoint_every and step % self._checkpoint_every == 0:
        self.save()
    if self._manager and (not self._checkpoint_every or steps % self._checkpoint_every):
      self.save()
    if self._writer is not None:
      self._writer.flush()
    self._log(f"trained steps {start + 1}..{steps} in {time.perf_counter() - t0:.1f} s")
    return history

  def evaluate(self, dataset: tf.data.Dataset,
               steps: Optional[int] = None) -> Dict[str, float]:
    """Mean loss and metrics over the dataset (or its first `steps` batches).

    Each batch counts equally; for exact metrics over a set that the batch
    size does not divide, pad it and weight the padding out in model_fn (see
    eval_feature_shapes). Written to TensorBoard as "eval/<name>".

    Example:
      >>> trainer.evaluate(test_dataset)["accuracy"]
    """
    fn = self._function(EVAL, False, dataset.element_spec)
    totals, n = {}, 0
    for batch in dataset:
      out = fn(self._features(batch, EVAL, "Trainer.evaluate"))
      for k, v in out.items():
        totals[k] = totals.get(k, 0.0) + float(v)
      n += 1
      if steps is not None and n >= steps:
        break
    if n == 0:
      raise ValueError("Trainer.evaluate: the dataset is empty.")
    result = {k: v / n for k, v in totals.items()}
    if self._summary_writer() is not None:
      with self._writer.as_default(step=self.global_step):
        for k, v in result.items():
          tf.summary.scalar(f"eval/{k}", v)
      self._writer.flush()
    return result


def _format_seconds(s: float) -> str:
  if not math.isfinite(s):
    return "?"
  s = int(s)
  return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"

from mesh_tensorflow.core import autograph_exempt as _autograph_exempt  # noqa: E402  pylint: disable=g-import-not-at-top
_autograph_exempt.exempt(globals())  # AutoGraph leaves this module's code alone
