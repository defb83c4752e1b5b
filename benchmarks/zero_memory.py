"""Per-device training-state memory under ZeRO stages 0-3 (mesh_tensorflow.training.zero).

Builds the main job's transformer (2 layers, d_model 128, d_ff 512, 8 heads,
byte vocabulary; gin defaults) with Adam (two full-size slots per variable)
on 8 logical CPU devices, for two layouts: pure data parallelism
(`all:8`, `batch:all`) and the main job's 2x4 data x model layout. For each
ZeRO stage it measures, per processor:

* variables + slots: the bytes of the slice variables each processor holds
  (from the variable store after the first trace);
* gradients: the bytes of the gradient slices the optimizer consumes (from
  the lowering: full allreduced slices for stages 0 and 1, reduce-scattered
  blocks for stages 2 and 3);

* peak: the cost model's peak per processor (`mtf.cost_model.memory_estimate`:
  variables, slots and the tensors alive at once in graph order, gathered
  copies of stage 3 variables included);

and prints the maximum over processors, the ratio to stage 0, the collectives
the step emits, and the first training losses (equal for every stage).

    python benchmarks/zero_memory.py            # about a minute on 2 cores
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from mesh_tensorflow.testing import DEVICES, use_logical_cpus  # noqa: E402

use_logical_cpus(8)  # before TensorFlow initializes its devices

import mesh_tensorflow as mtf  # noqa: E402
from mesh_tensorflow.training import zero  # noqa: E402
from mesh_tensorflow.transformer import gin_config, modeling  # noqa: E402
from mesh_tensorflow.transformer import vocabulary as vocabulary_lib  # noqa: E402

LAYOUTS = {
    "data_parallel_8": ("all:8", "batch:all"),
    "2x4": ("rows:2;cols:4", "batch:rows;d_ff:cols;heads:cols;experts:rows"),
}


def measure(mesh_shape: str, layout: str, stage: int, batch: int, length: int,
            steps: int, tokens: np.ndarray):
  """{'state': bytes, 'grads': bytes, 'total': bytes, 'losses': [...],
  'collectives': {...}} for one layout and stage."""
  impl = mtf.placement_mesh_impl.PlacementMeshImpl(mesh_shape, layout, DEVICES)
  vocab = vocabulary_lib.ByteVocabulary()
  setup = modeling.Setup("lm", vocab, impl, {"targets": length}, batch, vocab.vocab_size, 8,
                         mtf.VariableDType())
  model_fn = modeling.make_model_fn(setup)
  optimizer = mtf.optimize.AdamWeightDecayOptimizer(1e-3)
  record = {}

  @tf.function(autograph=False)
  def train_step(targets):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    shape = mtf.convert_to_shape(f"batch:{batch};length:{length}")
    features = {"targets": mtf.import_tf_tensor(mesh, targets, shape)}
    loss, _ = model_fn(mesh, features, "train")
    zero.shard_training_state(graph, impl, stage)
    variables = graph.trainable_variables
    grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
    grads = zero.shard_gradients(grads, variables)
    updates = optimizer.apply_grads(grads, variables)
    est = mtf.cost_model.memory_estimate(graph, mesh_shape, impl.layout_rules)
    record["peak"] = est.variables + est.slots + est.activations
    lowering = mtf.Lowering(graph, {mesh: impl})
    record["grads"] = max(zero.tensor_bytes_per_processor(lowering, grads))
    record["collectives"] = lowering.collective_counts()
    with tf.control_dependencies([lowering.lowered_operation(u) for u in updates]):
      return tf.identity(lowering.export_to_tf_tensor(loss))

  losses = [float(train_step(tokens[i])) for i in range(steps)]
  state = zero.state_bytes_per_processor(impl)
  return {"state": max(state), "grads": record["grads"],
          "total": max(state) + record["grads"], "peak": record["peak"], "losses": losses,
          "collectives": record["collectives"]}


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--steps", type=int, default=2)
  parser.add_argument("--batch", type=int, default=16)
  parser.add_argument("--length", type=int, default=64)
  args = parser.parse_args(argv)
  gin_config.parse([])
  rng = np.random.default_rng(0)
  tokens = rng.integers(3, 259, size=(args.steps, args.batch, args.length)).astype(np.int32)
  print("ZeRO per-device training state, main-job transformer + Adam, 8 devices, "
        "max over processors (KiB)")
  print(f"{'layout':<16} {'stage':>5} {'vars+slots':>11} {'grads':>9} {'total':>9} "
        f"{'/stage0':>8} {'peak':>9}  {'collectives (count)':<48}losses")
  ok = True
  for name, (mesh_shape, layout) in LAYOUTS.items():
    base = None
    previous = None
    for stage in zero.STAGES:
      r = measure(mesh_shape, layout, stage, args.batch, args.length, args.steps, tokens)
      base = base or r
      comm = ", ".join(f"{k} {n}" for k, (n, _) in sorted(r["collectives"].items()))
      print(f"{name:<16} {stage:>5} {r['state'] / 1024:>11.1f} {r['grads'] / 1024:>9.1f} "
            f"{r['total'] / 1024:>9.1f} {r['total'] / base['total']:>8.3f} "
            f"{r['peak'] / 1024:>9.1f}  {comm:<48}"
            f"{' '.join(f'{x:.6f}' for x in r['losses'])}")
      if previous is not None and not r["total"] < previous["total"]:
        ok = False
      if r["losses"] != base["losses"]:
        ok = False
      previous = r
  print("each stage lower than the one before, losses equal to stage 0:", ok)


if __name__ == "__main__":
  main()
