"""What the BERT programs share: their common flags, devices, mesh
implementation, input files, the Trainer and an initial checkpoint."""

from __future__ import annotations

import os
from typing import Callable, Dict, List, Optional

import numpy as np

from absl import logging
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import cli
from mesh_tensorflow.bert import _flags
from mesh_tensorflow.bert import tokenization

# The BERT programs' --layout default.
DEFAULT_LAYOUT = (
    "batch:batch,vocab:model,intermediate:model,num_heads:model,experts:batch")

ESTIMATOR_ONLY = (
    "{what} belongs to TPUEstimator, which TensorFlow 2 does not have; in this library "
    "training runs on mtf.training.Trainer (see docs/bert.md)")


def program_flags(module_name: str, fine_tuning: bool):
  """A BERT program's FLAGS, holding the tokenizer's flags and those of
  `_flags.define_shared` (and `_flags.define_fine_tuning` for a fine-tuning
  program), and its `define(kind, name, default, help_text)` for the
  program's own (see `_flags.program`).

  Example:
    >>> FLAGS, define_flag = program_flags(__name__, fine_tuning=True)
  """
  flag_values, define_flag = _flags.program(module_name, tokenization.FLAGS)
  _flags.define_shared(define_flag, layout_default=DEFAULT_LAYOUT)
  if fine_tuning:
    _flags.define_fine_tuning(define_flag)
  return flag_values, define_flag


def devices_for(mesh_size: int) -> List[str]:
  """Devices for a mesh of `mesh_size` processors: that many GPUs if there
  are enough, else logical CPU devices (the CPU is split into `mesh_size`
  if TensorFlow has not started yet).

  Example:
    >>> devices_for(8)
    ['/device:CPU:0', ..., '/device:CPU:7']
  """
  gpus = tf.config.list_physical_devices("GPU")
  if len(gpus) >= mesh_size:
    return [f"/device:GPU:{i}" for i in range(mesh_size)]
  cpus = tf.config.list_physical_devices("CPU")
  try:
    tf.config.set_logical_device_configuration(
        cpus[0], [tf.config.LogicalDeviceConfiguration() for _ in range(mesh_size)])
  except RuntimeError:
    pass  # already initialized; checked below
  logical = tf.config.list_logical_devices("CPU")
  if len(logical) < mesh_size:
    raise cli.UserError(
        f"the mesh has {mesh_size} processors but there are only {len(logical)} CPU "
        "devices (TensorFlow had started before they could be split)",
        hint="use a smaller --mesh_shape, or set it before TensorFlow runs")
  return [d.name for d in logical[:mesh_size]]


def make_mesh_impl(mesh_shape: str, layout: str):
  """A PlacementMeshImpl for the --mesh_shape and --layout flags.

  Example:
    >>> impl = make_mesh_impl("batch:8", "batch:batch")
  """
  shape = mtf.convert_to_shape(mesh_shape)
  rules = mtf.convert_to_layout_rules(layout)
  # The default layout names a "model" mesh dimension that the
  # default mesh ("batch:8") lacks; for that layout only, such rules split
  # nothing. Any other layout must fit the mesh (the library checks).
  mesh_names = {d.name for d in shape.dims}
  kept = [(t, m) for t, m in rules.pairs if m in mesh_names]
  if layout == DEFAULT_LAYOUT and len(kept) != len(rules.pairs):
    dropped = [f"{t}:{m}" for t, m in rules.pairs if m not in mesh_names]
    logging.info("layout rules %s name mesh dimensions not in %s; ignored", dropped,
                 mesh_shape)
    rules = mtf.LayoutRules(kept)
  return mtf.placement_mesh_impl.PlacementMeshImpl(shape, rules, devices_for(shape.size))


def glob_files(patterns: str, flag: str) -> List[str]:
  """Files matching comma-separated glob patterns; a UserError naming `flag`
  if there are none.

  Example:
    >>> glob_files("/data/train-*.tfrecord", "--input_train_files")
  """
  if not patterns:
    raise cli.UserError(f"{flag} is required", hint=f"pass {flag}=<files or glob>")
  files = []
  for pattern in patterns.split(","):
    if pattern:
      files.extend(sorted(tf.io.gfile.glob(pattern)))
  if not files:
    raise cli.UserError(f"{flag}={patterns} matches no file",
                        hint="check the path (globs and commas are allowed)")
  return files


def require(value, flag: str, hint: str = "") -> None:
  """A UserError if a required flag is unset.

  Example:
    >>> require(FLAGS.output_dir, "--output_dir")
  """
  if value in (None, ""):
    raise cli.UserError(f"{flag} is required", hint=hint or f"pass {flag}=...")


def make_trainer(model_fn: Callable, feature_shapes: Dict[str, str], mesh_impl, optimizer,
                 model_dir: str, init_checkpoint: Optional[str] = None,
                 checkpoint_every: int = 1000, log_every: int = 100,
                 eval_feature_shapes: Optional[Dict[str, str]] = None,
                 log_fn: Optional[Callable[[str], None]] = None) -> mtf.training.Trainer:
  """A Trainer in model_dir; a fresh run (no checkpoint there) starts from
  init_checkpoint's trainable variables (optimizer state and variables the
  checkpoint lacks start from their initializers).

  Example:
    >>> trainer = make_trainer(model_fn, shapes, impl, opt_fn, "/tmp/run", "/tmp/pre")
  """
  trainer = mtf.training.Trainer(
      model_fn, feature_shapes, mesh_impl, optimizer, model_dir=model_dir,
      checkpoint_every=checkpoint_every, log_every=log_every,
      eval_feature_shapes=eval_feature_shapes, log_fn=log_fn)
  if init_checkpoint and trainer.global_step == 0:
    if not (tf.io.gfile.exists(init_checkpoint) or tf.io.gfile.glob(init_checkpoint + "*")):
      raise cli.UserError(f"--init_checkpoint={init_checkpoint} does not exist",
                          hint="give a checkpoint path prefix or a model directory")
    trainer.checkpoint_manager.restore(init_checkpoint, allow_missing=True,
                                       include_optimizer_state=False)
  return trainer


def write_results(output_dir: str, name: str, results: Dict[str, float]) -> str:
  """Writes "key = value" lines to output_dir/name; returns the path."""
  path = os.path.join(output_dir, name)
  with tf.io.gfile.GFile(path, "w") as f:
    for key in sorted(results):
      f.write(f"{key} = {results[key]}\n")
  return path


def predict(mesh_impl, build: Callable, feature_shapes: Dict[str, str],
            dataset: tf.data.Dataset) -> List[Dict[str, np.ndarray]]:
  """Runs `build(mesh, features) -> {name: mtf Tensor}` on every batch of
  `dataset` with the variables of `mesh_impl` (e.g. a Trainer's, restored
  from its checkpoint); returns one {name: numpy array} per batch.

  This replaces TPUEstimator.predict.

  Example:
    >>> outputs = predict(impl, lambda mesh, f: {"logits": ...}, shapes, dataset)
  """
  shapes = {k: mtf.convert_to_shape(v) for k, v in feature_shapes.items()}

  def step(batch):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    features = {name: mtf.import_tf_tensor(mesh, batch[name], shape, name=name)
                for name, shape in shapes.items()}
    outputs = build(mesh, features)
    lowering = mtf.Lowering(graph, {mesh: mesh_impl})
    return {k: lowering.export_to_tf_tensor(v) for k, v in outputs.items()}

  signature = {name: tf.TensorSpec(shape.to_integer_list(), dataset.element_spec[name].dtype)
               for name, shape in shapes.items()}
  fn = tf.function(step, input_signature=[signature], autograph=False)
  results = []
  for batch in dataset:
    out = fn({name: batch[name] for name in shapes})
    results.append({k: v.numpy() for k, v in out.items()})
  return results
