"""Train and evaluate the U-Net of `unet` on the devices at hand (TF2).

`train_and_eval()` alternates training phases (`num_train_iterations_per_loop`
steps of Adafactor with a step-wise decaying learning rate, batch-norm moving
averages updated with every step) and evaluation phases
(`num_eval_iterations_per_loop` batches, predictions saved and the lesion
dice logged by `unet.PostProcessor`), `num_training_loops` times, configured by
absl flags. The mesh is a `PlacementMeshImpl` over the GPUs, or the
logical CPUs when there is no GPU; checkpoints (any mesh can resume them) go
to `checkpoint_dir` and summaries to `summary_dir`:

    python -m mesh_tensorflow.experimental.model_executor --use_tpu=false \\
        --mesh_shape="rows:2;columns:4" \\
        --layout="image_nx_block:rows;image_ny_block:columns" \\
        --train_file_pattern='/data/train/*' --eval_file_pattern='/data/eval/*' \\
        --ct_resolution=64 --image_nx_block=2 --image_ny_block=4 --mtf_dtype=float32

`--use_tpu=true` (a TPU infeed driver) raises an error naming
the TensorFlow 2 replacement, `mtf.training.Trainer` with a `SimdMeshImpl`.
"""

from __future__ import annotations

import sys
from typing import Callable, Dict, List, Optional

import tensorflow as tf
from absl import logging

import mesh_tensorflow as mtf
from mesh_tensorflow import _environment
from mesh_tensorflow.training import checkpoint as checkpoint_lib
from mesh_tensorflow.lowering import slice_variables
from mesh_tensorflow.experimental import _flag_specs
from mesh_tensorflow.experimental import unet
from mesh_tensorflow.experimental._flag_specs import FlagSpec

FLAGS = _flag_specs.FLAGS

FLAG_SPECS: Dict[str, FlagSpec] = {
    "use_tpu": FlagSpec("boolean", True, "Use TPU infeed (not available in TF2) or not."),
    "lr": FlagSpec("float", 0.003, "Learning rate."),
    "lr_drop_steps": FlagSpec("float", 20000, "The learning rate drops every this many steps."),
    "lr_drop_rate": FlagSpec("float", 0.3, "... by this factor."),
    "num_train_iterations_per_loop": FlagSpec("integer", 500, "Training steps per loop."),
    "num_eval_iterations_per_loop": FlagSpec("integer", 2, "Evaluation batches per loop."),
    "num_training_loops": FlagSpec("integer", 1000, "Train/eval loops."),
    "mesh_shape": FlagSpec("string", "rows:4, columns:4, cores:2", "Mesh shape."),
    "master": FlagSpec("string", "", "TPU master (unused)."),
    "checkpoint_dir": FlagSpec("string", "", "Checkpoint directory (empty: none)."),
    "save_checkpoints_steps": FlagSpec("integer", 500, "Save every this many steps."),
    "on_gcp": FlagSpec("boolean", False, "TPU worker setting (unused)."),
    "write_summary": FlagSpec("boolean", True, "Write TensorBoard summaries."),
    "summary_dir": FlagSpec("string", "", "Summary directory (empty: none)."),
    "pred_output_dir": FlagSpec("string", "", "Where predictions go (empty: not saved)."),
}

_NO_TPU = ("model_executor: --use_tpu drove TPU infeed queues from a TensorFlow 1 session, "
           "which TensorFlow 2 does not have; pass --use_tpu=false to run on the local GPUs "
           "or CPUs, or train with mtf.training.Trainer and a mtf.simd_mesh_impl.SimdMeshImpl "
           "on TPU (see docs/unet3d.md).")


def define_flags(flag_values=FLAGS) -> List[str]:
  """Defines this module's and `unet`'s absl flags (those not defined
  elsewhere yet); returns the names it defined.

  Example:
    >>> model_executor.define_flags()
  """
  return _flag_specs.define(FLAG_SPECS, flag_values) + unet.define_flags(flag_values)


def _flag(name: str):
  return _flag_specs.value(FLAG_SPECS, name)


def _local_devices() -> List[str]:
  gpus = [d.name for d in tf.config.list_logical_devices("GPU")]
  return gpus or [d.name for d in tf.config.list_logical_devices("CPU")]


class MeshContext:
  """The mesh shape, layout and mesh implementation of a run.

  Args:
    sess: a tf.Session; accepted and ignored (TF2 has none).
    use_tpu: must be False (TPU infeed is TensorFlow 1 only).
    mesh_shape: e.g. "rows:2;columns:4"; one device per processor is
      needed (GPUs, else logical CPUs).
    layout_rules: layout rules (e.g. `unet.get_layout()`).

  Example:
    >>> ctx = MeshContext(None, False, "rows:2;cols:4", unet.get_layout())
    >>> graph, mesh, mesh_impl = ctx.create_graph_mesh_and_mesh_impl()
  """

  def __init__(self, sess, use_tpu: bool, mesh_shape, layout_rules):
    del sess
    if use_tpu:
      raise NotImplementedError(_NO_TPU)
    self._mesh_shape = mtf.convert_to_shape(mesh_shape)
    self._layout_rules = mtf.convert_to_layout_rules(layout_rules)
    devices = _local_devices()
    if len(devices) < self._mesh_shape.size:
      raise ValueError(
          f"MeshContext: mesh shape {self._mesh_shape} needs {self._mesh_shape.size} devices, "
          f"this machine has {len(devices)} ({', '.join(devices)}); use a smaller mesh or "
          "split the CPU into logical devices (tf.config.set_logical_device_configuration).")
    self._devices = devices[:self._mesh_shape.size]
    self._mesh_impl = mtf.placement_mesh_impl.PlacementMeshImpl(
        self._mesh_shape, self._layout_rules, self._devices)

  def create_graph_mesh_and_mesh_impl(self):
    """A fresh (mtf.Graph, mtf.Mesh, mesh implementation).

    Example:
      >>> graph, mesh, mesh_impl = ctx.create_graph_mesh_and_mesh_impl()
    """
    graph = mtf.Graph()
    return graph, mtf.Mesh(graph, "my_mesh"), self._mesh_impl

  @property
  def device_assignment(self):
    return None

  @property
  def num_hosts(self) -> int:
    return 1

  @property
  def num_cores(self) -> int:
    return self._mesh_shape.size

  @property
  def num_cores_per_host(self) -> int:
    return self._mesh_shape.size

  @property
  def mesh_impl(self):
    return self._mesh_impl


class _Runner:
  """Compiled train and eval steps of the U-Net on one MeshContext."""

  def __init__(self, mesh_context: MeshContext, checkpoint_dir: str = "",
               log: Callable[[str], None] = logging.info):
    self._ctx = mesh_context
    self._impl = mesh_context.mesh_impl
    self._log = log
    self._step = slice_variables.scalar_state(self._impl, "global_step", tf.int64)
    self._manager = None
    if checkpoint_dir:
      self._manager = checkpoint_lib.CheckpointManager(self._impl, checkpoint_dir)
    self._restored = False
    self._summary_writer = None
    self._train_fn = None
    self._eval_fn = None

  @property
  def global_step(self) -> int:
    return int(self._step.numpy())

  def _writer(self) -> Optional[tf.summary.SummaryWriter]:
    """The summary writer of --summary_dir (None without --write_summary)."""
    if not (_flag("write_summary") and _flag("summary_dir")):
      return None
    if not _environment.tensorboard_available(_flag("summary_dir")):
      return None
    if self._summary_writer is None:
      self._summary_writer = tf.summary.create_file_writer(_flag("summary_dir"))
    return self._summary_writer

  def _maybe_restore(self) -> None:
    if self._manager is not None and not self._restored:
      path = self._manager.restore_or_initialize()
      if path:
        self._log(f"restored {path} (step {self.global_step})")
    self._restored = True

  def save(self) -> Optional[str]:
    return None if self._manager is None else self._manager.save(self.global_step)

  def _build_train(self, images, labels):
    graph, mesh, impl = self._ctx.create_graph_mesh_and_mesh_impl()
    _, loss, scalars, bn_updates = unet.unet_with_spatial_partition(
        mesh, impl, "train", images, labels)
    variables = graph.trainable_variables
    grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
    step = tf.cast(self._step.read_value(), tf.float32)
    lr = _flag("lr") * tf.pow(_flag("lr_drop_rate"), tf.floor(step / _flag("lr_drop_steps")))
    mtf_lr = mtf.import_fully_replicated(mesh, lr, mtf.Shape([]), name="learning_rate")
    updates = mtf.optimize.AdafactorOptimizer(learning_rate=mtf_lr).apply_grads(
        grads, variables)
    lowering = mtf.Lowering(graph, {mesh: impl})
    outputs = {"loss": lowering.export_to_tf_tensor(loss), "learning_rate": lr}
    outputs.update({k: lowering.export_to_tf_tensor(v) for k, v in scalars.items()})
    ops = [lowering.lowered_operation(u) for u in updates + bn_updates]
    with tf.control_dependencies(ops + list(outputs.values())):
      ops.append(self._step.assign_add(1))
    with tf.control_dependencies(ops):
      return {k: tf.cast(tf.identity(v), tf.float32) for k, v in outputs.items()}

  def _build_eval(self, images, labels):
    graph, mesh, impl = self._ctx.create_graph_mesh_and_mesh_impl()
    preds, loss, scalars, _ = unet.unet_with_spatial_partition(
        mesh, impl, "eval", images, labels)
    lowering = mtf.Lowering(graph, {mesh: impl})
    preds = [tf.cast(lowering.export_to_tf_tensor(p), tf.float32) for p in preds]
    outputs = {k: tf.cast(lowering.export_to_tf_tensor(v), tf.float32)
               for k, v in scalars.items()}
    outputs["loss"] = tf.cast(lowering.export_to_tf_tensor(loss), tf.float32)
    return preds, outputs

  def train(self, batches, steps: int) -> List[float]:
    """Runs `steps` training steps on the (image, label) batches; returns the losses."""
    self._maybe_restore()
    if self._train_fn is None:
      self._train_fn = tf.function(self._build_train, autograph=False)
    losses = []
    for _ in range(steps):
      images, labels = next(batches)
      out = self._train_fn(images, labels)
      losses.append(float(out["loss"]))
      step = self.global_step
      writer = self._writer()
      if writer is not None:
        with writer.as_default(step=step):
          for k, v in out.items():
            tf.summary.scalar(f"train_{k}", v)
      if self._manager is not None and step % _flag("save_checkpoints_steps") == 0:
        self.save()
      self._log(f"train step {step}: loss {losses[-1]:.5f}")
    return losses

  def evaluate(self, batches, steps: int, post_processor: unet.PostProcessor):
    """Evaluates `steps` batches, recording them in post_processor; returns
    the mean loss and metrics."""
    self._maybe_restore()
    if self._eval_fn is None:
      self._eval_fn = tf.function(self._build_eval, autograph=False)
    totals: Dict[str, float] = {}
    for _ in range(steps):
      images, labels = next(batches)
      preds, out = self._eval_fn(images, labels)
      results = [p.numpy() for p in preds] + [float(out["loss"]), self.global_step]
      post_processor.record(results, _flag("pred_output_dir"))
      for k, v in out.items():
        totals[k] = totals.get(k, 0.0) + float(v) / steps
    writer = self._writer()
    if writer is not None:
      with writer.as_default(step=self.global_step):
        for k, v in totals.items():
          tf.summary.scalar(f"eval_{k}", v)
      writer.flush()
    return totals


def _batches(dataset_str: str):
  shapes = unet.get_input_mtf_shapes(dataset_str)
  batch = shapes[0].dims[0].size
  ds = unet.get_dataset_creator(dataset_str)().batch(batch, drop_remainder=True)
  return iter(ds.prefetch(2))


def train_and_eval(mesh_context: Optional[MeshContext] = None,
                   log: Callable[[str], None] = logging.info) -> Dict[str, object]:
  """Alternates training and evaluation phases as the flags say.

  Args:
    mesh_context: where to run (default: a MeshContext of the flags
      `use_tpu`, `mesh_shape` and `layout`).
    log: where the per-step progress lines go.

  Returns:
    The last evaluation's mean loss and metrics, with "dice_per_case" and
    "dice_global" from `unet.PostProcessor` (absent if nothing was
    evaluated), and "train_losses", the loss of every training step.

  Example:
    >>> model_executor.train_and_eval()
  """
  if _flag("use_tpu"):
    raise NotImplementedError(_NO_TPU)
  if mesh_context is None:
    mesh_context = MeshContext(None, False, _flag("mesh_shape"), unet.get_layout())
  runner = _Runner(mesh_context, _flag("checkpoint_dir"), log)
  train_batches = _batches("train") if _flag("num_train_iterations_per_loop") > 0 else None
  result: Dict[str, object] = {}
  losses: List[float] = []
  for _ in range(_flag("num_training_loops")):
    if train_batches is not None:
      losses += runner.train(train_batches, _flag("num_train_iterations_per_loop"))
      runner.save()
    if _flag("num_eval_iterations_per_loop") > 0:
      post = unet.PostProcessor()
      result = dict(runner.evaluate(_batches("eval"), _flag("num_eval_iterations_per_loop"),
                                    post))
      result["dice_per_case"], result["dice_global"] = post.finish()
  result["train_losses"] = losses
  log("finished.")
  return result


def main(argv) -> None:
  """The program's main (after absl parsed the flags).

  Example:
    >>> main(["model_executor"])
  """
  del argv
  train_and_eval()


def _run(argv: Optional[list] = None) -> int:
  from mesh_tensorflow import cli  # pylint: disable=import-outside-toplevel
  define_flags()

  def guarded(args):
    try:
      return main(args)
    except (ValueError, NotImplementedError) as e:
      raise cli.UserError(str(e)) from None
  return cli.run_absl_main(guarded, argv)


if __name__ == "__main__":
  sys.exit(_run())
