"""Pipeline bubble and activation-recomputation memory, measured in one run.

    python benchmarks/pipeline_bubble.py            # bubble table + memory table
    python benchmarks/pipeline_bubble.py --no-rss   # skip the peak-RSS runs (fast)

1. Bubble fraction of the GPipe and 1F1B schedules for S = 4 stages and
   M = 1..16 micro-batches: the theoretical (S - 1) / (M + S - 1), the idle
   stage-slots counted in the schedule table the graph is built from, and,
   the value measured in the executed graph (a flag that moves through the
   pipeline with the data, and for 1F1B with the cotangents too, counts the
   stage-ticks or stage-slots that did useful work; 1 - useful / all), and a time-based value: step times of a
   forward pipeline for M = 1..16 at a fixed micro-batch size, fitted as
   T(M) = c (M + S - 1) + d, give the time per tick c; the bubble's share of
   the step is c (S - 1) / T(M). (On a CPU whose logical devices share two
   cores the stages do not run concurrently; the fit still measures what
   the bubble ticks cost in this SPMD formulation, where idle stages compute
   on zeros.)
2. Memory of the backward pass of a small transformer (one device) under
   LayerStack(recompute="none" | "selective" | "layer"): the bytes of forward
   activations the backward pass reads (counted on the mtf graph), the
   cost model's peak of live activation slices (mesh_tensorflow.analysis.cost_model,
   if present), and the peak resident memory of a process that runs one training step (each
   policy in a fresh subprocess; ru_maxrss), with the loss of each (equal).
   Also GPipe vs 1F1B for the pipelined model on pp:4;dp:2.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from mesh_tensorflow.testing import DEVICES, use_logical_cpus  # noqa: E402

use_logical_cpus(8)  # before TensorFlow initializes its devices

import mesh_tensorflow as mtf  # noqa: E402
from mesh_tensorflow.training import pipeline as pl  # noqa: E402
from mesh_tensorflow.transformer import layer_stack as layer_stack_lib  # noqa: E402
from mesh_tensorflow.transformer import transformer  # noqa: E402
from mesh_tensorflow.transformer import transformer_layers as tl  # noqa: E402



def measured_gpipe_bubble(stages: int, micro: int) -> float:
  """1 - useful / all stage-ticks, counted by the executed graph."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  batch = mtf.Dimension("batch", 2 * micro)
  w = mtf.Dimension("w", 4)
  x = mtf.zeros(mesh, mtf.Shape([batch, w]))

  def stage_fn(h):
    k = mtf.get_variable(h.mesh, "k", [w])
    return mtf.tanh(h * k)
  _, stats = pl.pipeline(stage_fn, x, mtf.Dimension("stages", stages), micro,
                         return_stats=True)
  impl = mtf.placement_mesh_impl.PlacementMeshImpl(f"pp:{stages}", "stages:pp",
                                                   DEVICES[:stages])
  lowering = mtf.Lowering(graph, {mesh: impl})
  useful = float(lowering.export_to_tf_tensor(stats["useful_stage_ticks"]).numpy())
  return 1.0 - useful / stats["stage_ticks"]


def measured_1f1b_bubble(stages: int, micro: int) -> float:
  """1 - useful / all stage-slots of the explicit 1F1B schedule, counted by
  flags that travel with the activations and the cotangents in the
  executed graph."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  batch = mtf.Dimension("batch", 2 * micro)
  w = mtf.Dimension("w", 4)
  x = mtf.ones(mesh, mtf.Shape([batch, w]))

  def stage_fn(h):
    k = mtf.get_variable(h.mesh, "k", [w])
    return mtf.tanh(h * k)
  loss, stats = pl.pipeline_loss(stage_fn, lambda y: mtf.reduce_sum(y), x,
                                 mtf.Dimension("stages", stages), micro, schedule="1f1b",
                                 return_stats=True)
  mtf.gradients([loss], [v.outputs[0] for v in graph.trainable_variables])
  impl = mtf.placement_mesh_impl.PlacementMeshImpl(f"pp:{stages}", "stages:pp",
                                                   DEVICES[:stages])
  lowering = mtf.Lowering(graph, {mesh: impl})
  useful = float(lowering.export_to_tf_tensor(stats["useful_stage_slots"]).numpy())
  return 1.0 - useful / (stages * stats["slots"])


def tick_timings(stages: int = 4, micro_batch: int = 128, width: int = 512, repeats: int = 9):
  """Step time of a forward GPipe pipeline for several M at a fixed
  micro-batch size: T(M) ~ c (M + S - 1) + d. The least-squares fit gives
  the time per tick c, and the time spent in bubble ticks is c (S - 1)."""
  impl = mtf.placement_mesh_impl.PlacementMeshImpl(f"pp:{stages}", "stages:pp",
                                                   DEVICES[:stages])
  hidden = mtf.Dimension("hidden", width)
  results = []
  for micro in (1, 2, 4, 8, 16):
    batch = mtf.Dimension("batch", micro_batch * micro)
    xv = np.random.RandomState(0).normal(size=(batch.size, width)).astype(np.float32)

    def stage_fn(h):
      k = mtf.get_variable(h.mesh, "k", [hidden, mtf.Dimension("h2", width)])
      y = mtf.einsum([h, k], output_shape=h.shape - [hidden] + [mtf.Dimension("h2", width)])
      return mtf.tanh(mtf.rename_dimension(y, "h2", "hidden"))

    @tf.function(autograph=False)
    def step(x_tf):
      graph = mtf.Graph()
      mesh = mtf.Mesh(graph, "mesh")
      x = mtf.import_tf_tensor(mesh, x_tf, [batch, hidden])
      y = pl.pipeline(stage_fn, x, mtf.Dimension("stages", stages), micro)
      lowering = mtf.Lowering(graph, {mesh: impl})
      return tf.reduce_sum(lowering.export_to_tf_tensor(y))
    step(xv)
    times = []
    for _ in range(repeats):
      t0 = time.perf_counter()
      step(xv).numpy()
      times.append(time.perf_counter() - t0)
    results.append((micro, float(np.median(times))))
  ticks = np.array([m + stages - 1 for m, _ in results], np.float64)
  secs = np.array([t for _, t in results])
  c, d = np.polyfit(ticks, secs, 1)
  print(f"## Per-tick timing (forward GPipe, S = {stages}, micro-batch {micro_batch} x "
        f"{width}, one {width}x{width} matmul per stage; median of {repeats})\n")
  print(f"Fit T(M) = c (M + S - 1) + d: c = {c * 1e3:.2f} ms per tick, d = {d * 1e3:.2f} ms.\n")
  print("| M | step time (ms) | bubble time c (S-1) / T(M) | theory (S-1)/(M+S-1) |")
  print("|---|---|---|---|")
  for (micro, t) in results:
    print(f"| {micro} | {t * 1e3:.2f} | {c * (stages - 1) / t:.3f} "
          f"| {(stages - 1) / (micro + stages - 1):.3f} |")
  print()


def bubble_table(stages: int = 4):
  print(f"## Bubble fraction, S = {stages} stages\n")
  print("| M | theory (S-1)/(M+S-1) | GPipe: counted in table | GPipe: measured in graph "
        "| 1F1B: counted in table | 1F1B: measured in graph "
        "| max micro-batches in flight GPipe / 1F1B |")
  print("|---|---|---|---|---|---|---|")
  for micro in (1, 2, 4, 8, 16):
    g = pl.PipelineSchedule("gpipe", stages, micro)
    f = pl.PipelineSchedule("1f1b", stages, micro)
    measured = measured_gpipe_bubble(stages, micro)
    measured_f = measured_1f1b_bubble(stages, micro)
    print(f"| {micro} | {g.bubble_fraction:.3f} | {g.idle_fraction:.3f} | {measured:.3f} "
          f"| {f.idle_fraction:.3f} | {measured_f:.3f} "
          f"| {g.max_in_flight()} / {f.max_in_flight()} |")
  print()


# ------------------------------------------------------------------ memory
B, L, V, D, HEADS, KV, FF, BLOCKS = 16, 256, 64, 128, 8, 16, 512, 4


def _model(recompute="none", num_stages=1, schedule="gpipe", micro=1):
  stack = transformer.make_layer_stack(
      [tl.SelfAttention(num_heads=HEADS, key_value_size=KV), tl.DenseReluDense(hidden_size=FF)],
      num_layers=BLOCKS, recompute=recompute, num_stages=num_stages, num_microbatches=micro,
      pipeline_schedule=schedule)
  return transformer.Unitransformer(stack, d_model=D, input_vocab_size=V, output_vocab_size=V,
                                    autoregressive=True, max_length=L, vocab_divisor=8)


def _targets():
  return np.random.RandomState(0).randint(2, V, size=(B, L)).astype(np.int32)


def _build(mesh, recompute, num_stages=1, schedule="gpipe", micro=1):
  batch, length = mtf.Dimension("batch", B), mtf.Dimension("length", L)
  targets = mtf.import_tf_tensor(mesh, tf.constant(_targets()), [batch, length])
  model = _model(recompute, num_stages, schedule, micro)
  _, loss = model.call_simple(mtf.shift(targets, 1, length, wrap=False), targets, True)
  n_forward = len(mesh.graph.operations)
  variables = mesh.graph.trainable_variables
  grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
  return loss, grads, n_forward


def kept_bytes(recompute: str):
  """(bytes kept for the backward pass, the cost model's peak activation
  bytes or None if mesh_tensorflow.analysis.cost_model is absent)."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  _, _, n_forward = _build(mesh, recompute)
  impl = mtf.placement_mesh_impl.PlacementMeshImpl("all:1", "", DEVICES[:1])
  kept = layer_stack_lib.kept_activation_bytes(graph, n_forward, impl)
  cost_model = getattr(mtf, "cost_model", None)
  peak = cost_model.estimate(graph, "all:1", "").memory.activations if cost_model else None
  return kept, peak


def pipelined_peak(schedule: str, recompute: str) -> str:
  """The cost model's peak of live activation slices per device (graph
  order) of the pipelined training step, in MiB, or "n/a"."""
  cost_model = getattr(mtf, "cost_model", None)
  if cost_model is None:
    return "n/a"
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  _build(mesh, recompute, num_stages=4, schedule=schedule, micro=8)
  est = cost_model.estimate(graph, "pp:4;dp:2", "stages:pp;batch:dp")
  return f"{est.memory.activations / 2**20:.1f}"


def child(config: str) -> None:
  """Runs one training step (loss + gradients) and prints peak RSS."""
  recompute, schedule = config.split(",")
  if schedule == "none":
    impl = mtf.placement_mesh_impl.PlacementMeshImpl("all:1", "", DEVICES[:1])
    kwargs = {}
  else:
    impl = mtf.placement_mesh_impl.PlacementMeshImpl("pp:4;dp:2", "stages:pp;batch:dp",
                                                     DEVICES)
    kwargs = {"num_stages": 4, "schedule": schedule, "micro": 8}
  before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

  @tf.function(autograph=False)
  def step():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    loss, grads, _ = _build(mesh, recompute, **kwargs)
    lowering = mtf.Lowering(graph, {mesh: impl})
    total = tf.add_n([tf.reduce_sum(tf.abs(lowering.export_to_tf_tensor(g))) for g in grads])
    return lowering.export_to_tf_tensor(loss), total
  step.get_concrete_function()
  traced = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  t0 = time.time()
  loss, total = step()
  seconds = time.time() - t0
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  print(json.dumps({"loss": float(loss), "grad_l1": float(total), "before_kb": before,
                    "traced_kb": traced, "peak_kb": peak, "seconds": seconds}))


def run_child(config: str):
  out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", config],
                       capture_output=True, text=True, check=True,
                       env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
  return json.loads(out.stdout.strip().splitlines()[-1])


def memory_table(rss: bool):
  print(f"## Backward-pass memory, transformer batch {B} x length {L}, d_model {D}, "
        f"{HEADS} heads, d_ff {FF}, {2 * BLOCKS} layers, one device\n")
  print("| recompute | activation bytes kept for backward (MiB) | ratio to none "
        "| cost model: peak activations (MiB) |"
        + (" peak RSS of a training step (MiB) | RSS growth during the step (MiB) | loss |"
           if rss else ""))
  print("|---|---|---|---|" + ("---|---|---|" if rss else ""))
  base = None
  for policy in ("none", "selective", "layer"):
    kept, peak = kept_bytes(policy)
    base = base or kept
    peak_text = "n/a" if peak is None else f"{peak / 2**20:.1f}"
    row = f"| {policy} | {kept / 2**20:.1f} | {kept / base:.2f} | {peak_text} |"
    if rss:
      r = run_child(f"{policy},none")
      row += (f" {r['peak_kb'] / 1024:.0f} | {(r['peak_kb'] - r['traced_kb']) / 1024:.0f} "
              f"| {r['loss']:.6f} |")
    print(row)
  print()
  if rss:
    print("## Pipelined (pp:4;dp:2, 8 micro-batches): GPipe vs 1F1B, one training step\n")
    print("| schedule | recompute | cost model: peak activations per device (MiB) "
          "| peak RSS (MiB) | RSS growth during the step (MiB) | loss | sum of abs(gradients) |")
    print("|---|---|---|---|---|---|---|")
    for schedule, policy in (("gpipe", "none"), ("gpipe", "layer"), ("1f1b", "none")):
      r = run_child(f"{policy},{schedule}")
      print(f"| {schedule} | {policy} | {pipelined_peak(schedule, policy)} "
            f"| {r['peak_kb'] / 1024:.0f} "
            f"| {(r['peak_kb'] - r['traced_kb']) / 1024:.0f} | {r['loss']:.6f} "
            f"| {r['grad_l1']:.4f} |")
    print()


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
  parser.add_argument("--no-rss", action="store_true", help="skip the peak-RSS subprocesses")
  args = parser.parse_args()
  if args.child:
    child(args.child)
    return
  bubble_table()
  tick_timings()
  memory_table(not args.no_rss)


if __name__ == "__main__":
  main()
