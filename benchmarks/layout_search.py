"""Does auto_mtf pick fast layouts? Measured step times vs the cost model.

    python benchmarks/layout_search.py [--models mlp,transformer] [--repeats 5]
        [--mlp_repeats N] [--steps 5] [--sample 16] [--params cpu|params.json|calibrate] [--fit]
        [--clock wall|cpu] [--stat median|min] [--save times.json]

For each model (the MLP and the two-layer transformer of bench_models.py) on
8 logical CPUs:

* enumerates every legal layout on every mesh shape of 8 devices (1 and 2
  mesh dimensions) and estimates its step time with the cost model;
* measures the real step time (median over repeats, all layouts interleaved
  so slow phases of the machine hit all alike) of: every legal layout (MLP),
  or the hand-written ones, the search's pick and `--sample` others spread
  over the estimated range (transformer, whose legal layouts number ~450);
* prints the Spearman rank correlation between estimated and measured step
  times, the fraction of layouts estimated within 20% of their measured time,
  the measurement's own reproducibility (the medians of the odd and of the
  even repeats ranked against each other: the ceiling for any estimate), and
  the ratio of the picked layout's measured step time to the best
  hand-written layout in mesh_tensorflow/transformer/gin/layouts/ (those that
  are legal for the model; single.gin runs on one device).

--clock cpu measures this process's CPU time per step instead of wall-clock
time: on a machine that other jobs load, wall-clock medians of one layout vary
between runs far more than the differences between layouts.

Each repeat runs the layouts in a new random order, so that a slow phase of
the machine or the previous layout's memory traffic does not always hit the
same one. The MLP's layouts differ by a few percent of a step on a CPU whose
matrix products dominate it; `--mlp_repeats 80 --steps 4` measures them
reproducibly in about 3 minutes.

--fit also fits the five CPU speed parameters to the measurements (non-negative
least squares), prints them as JSON, and prices each model's layouts with the
parameters fitted on each model alone and on both; the defaults in
mesh_tensorflow/analysis/cost_model came from such a fit.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import re
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from mesh_tensorflow.testing import DEVICES, use_logical_cpus  # noqa: E402

use_logical_cpus(8)  # before TensorFlow initializes its devices

import bench_models as bm  # noqa: E402
import mesh_tensorflow as mtf  # noqa: E402
from mesh_tensorflow import auto_mtf  # noqa: E402
from mesh_tensorflow.analysis import cost_model  # noqa: E402

STAT = "median"  # or "min" (--stat): per layout, over the repeats
SAMPLES = {}  # (mesh_shape, rules) -> seconds per step of each repeat
CLOCK = time.perf_counter  # --clock cpu: time.process_time
GIN_LAYOUTS = os.path.join(os.path.dirname(mtf.__file__), "transformer", "gin", "layouts")


def hand_written_layouts():
  """[(name, mesh_shape, layout)] from transformer/gin/layouts/*.gin."""
  out = []
  for path in sorted(glob.glob(os.path.join(GIN_LAYOUTS, "*.gin"))):
    text = open(path).read()
    shape = re.search(r'^mesh_shape\s*=\s*"([^"]*)"', text, re.M)
    layout = re.search(r'^layout\s*=\s*"([^"]*)"', text, re.M)
    if shape and layout:
      out.append((os.path.basename(path), shape.group(1), layout.group(1)))
  return out


def restrict(layout, graph_dims):
  """The rules of `layout` that name dimensions of the graph."""
  return mtf.LayoutRules([(t, m) for t, m in mtf.convert_to_layout_rules(layout)
                          if t in graph_dims])


def is_legal(graph, mesh_shape, rules):
  try:
    cost_model.estimate(graph, mesh_shape, rules)
    return True
  except ValueError:
    return False


def spearman(a, b):
  def ranks(x):
    x = np.asarray(x, dtype=float)
    order = np.argsort(x, kind="mergesort")
    r = np.empty(len(x))
    r[order] = np.arange(len(x))
    for v in np.unique(x):  # average ties
      idx = np.where(x == v)[0]
      r[idx] = r[idx].mean()
    return r
  ra, rb = ranks(a), ranks(b)
  return float(np.corrcoef(ra, rb)[0, 1])


def measure(entries, builder, data, repeats, steps):
  """{key: median seconds per step} of each (key, mesh_shape, layout)."""
  fns = {}
  for key, shape, rules in entries:
    size = mtf.convert_to_shape(shape).size
    fn = bm.mtf_step_fn(builder, data, shape, rules, DEVICES[:size])
    fn()
    fn()
    fns[key] = fn
  samples = {key: [] for key in fns}
  order = list(fns)
  rng = np.random.default_rng(0)
  for _ in range(repeats):
    # A new order every round: a layout's samples do not always follow the
    # same neighbour (whose memory traffic may slow the next one down).
    rng.shuffle(order)
    for key in order:
      fn = fns[key]
      t0 = CLOCK()
      for _ in range(steps):
        out = fn()
      float(out)
      samples[key].append((CLOCK() - t0) / steps)
  SAMPLES.update(samples)
  return {k: (statistics.median(v) if STAT == "median" else min(v)) for k, v in samples.items()}


def run_model(model, args, params):
  data = bm.mlp_data() if model == "mlp" else bm.transformer_data()
  builder = bm.build_mtf_mlp if model == "mlp" else bm.build_mtf_transformer
  graph, _, _, _ = builder(*[tf.constant(d) for d in data])
  dims = {d.name for op in graph.operations for t in op.outputs for d in t.shape.dims}
  t0 = time.perf_counter()
  result = auto_mtf.search(graph, num_devices=8, params=params, top_k=10)
  search_s = time.perf_counter() - t0
  picked = (result.mesh_shape.to_string(), result.layout)
  everything = []
  for shape in auto_mtf.mesh_shapes(8):
    for rules in auto_mtf.legal_layouts(graph, shape):
      est = cost_model.estimate(graph, shape, rules, params=params, check=False)
      everything.append((shape.to_string(), rules, est))
  hand = []
  for name, shape, layout in hand_written_layouts():
    rules = restrict(layout, dims)
    if mtf.convert_to_shape(shape).size > 8 or not is_legal(graph, shape, rules):
      continue
    hand.append((name, shape, rules))
  if model == "mlp" or args.sample <= 0:
    chosen = [(s, r) for s, r, _ in everything]
  else:
    ranked = sorted(everything, key=lambda e: e[2].step_time_s)
    idx = np.unique(np.linspace(0, len(ranked) - 1, args.sample).round().astype(int))
    chosen = [(ranked[i][0], ranked[i][1]) for i in idx]
  keys = {}
  for s, r in chosen + [picked] + [(s, r) for _, s, r in hand]:
    keys[(s, r)] = None
  entries = [((s, r), s, r) for s, r in keys]
  print(f"[{model}] {len(everything)} legal layouts on 8 devices; search took "
        f"{search_s:.2f}s ({result.method}); measuring {len(entries)} layouts ...", flush=True)
  repeats = args.mlp_repeats if (model == "mlp" and args.mlp_repeats) else args.repeats
  measured = measure(entries, builder, data, repeats, args.steps)
  estimates = {(s, r): cost_model.estimate(graph, s, r, params=params) for s, r in keys}
  eight = [k for k in measured if mtf.convert_to_shape(k[0]).size == 8]
  rho = spearman([estimates[k].step_time_s for k in eight], [measured[k] for k in eight])
  reproducibility = split_half(eight)
  within = within_fraction([estimates[k].step_time_s for k in eight],
                           [measured[k] for k in eight])
  best_hand = min(hand, key=lambda h: measured[(h[1], h[2])])
  ratio = measured[picked] / measured[(best_hand[1], best_hand[2])]
  print(f"{'mesh':<15} {'layout':<48} {'est ms':>8} {'measured ms':>12}")
  for k in sorted(measured, key=lambda k: measured[k]):
    tags = [h[0] for h in hand if (h[1], h[2]) == k] + (["PICKED"] if k == picked else [])
    print(f"{k[0]:<15} {(k[1].to_string() or '(replicated)')[:48]:<48} "
          f"{estimates[k].step_time_s * 1e3:>8.2f} {measured[k] * 1e3:>12.2f}  {' '.join(tags)}")
  print(f"[{model}] Spearman(estimated, measured) over {len(eight)} layouts on 8 devices: "
        f"{rho:.3f}; estimates within 20% of the measured time: {within:.0%}")
  print(f"[{model}] measurement reproducibility (Spearman of the medians of odd and even "
        f"repeats, Spearman-Brown corrected): {reproducibility:.3f}; no estimate can rank "
        "the layouts much better than the measurement ranks itself", flush=True)
  print(f"[{model}] picked {picked[0]} '{picked[1].to_string() or '(replicated)'}': "
        f"{measured[picked] * 1e3:.2f} ms; best hand-written {best_hand[0]} "
        f"'{best_hand[2].to_string() or '(replicated)'}': "
        f"{measured[(best_hand[1], best_hand[2])] * 1e3:.2f} ms; ratio {ratio:.3f}", flush=True)
  rows = [(cost_model.step_components(estimates[k]), measured[k], model) for k in eight]
  saved = [dict(model=model, mesh_shape=k[0], layout=k[1].to_string(), measured_s=measured[k],
                estimated_s=estimates[k].step_time_s, samples=SAMPLES.get(k)) for k in measured]
  return rho, ratio, rows, saved, within, reproducibility


def split_half(keys):
  """Spearman between the medians of the odd and of the even repeats of each
  layout, stepped up to the whole run's length (Spearman-Brown): how well
  this run's measurement ranks the layouts against itself."""
  odd = [statistics.median(SAMPLES[k][0::2]) for k in keys]
  even = [statistics.median(SAMPLES[k][1::2]) for k in keys]
  r = spearman(odd, even)
  return 2 * r / (1 + r) if r > -1 else r


def within_fraction(estimated, measured, tolerance=0.2):
  """Fraction of layouts whose estimate is within `tolerance` of the
  measured step time (|measured / estimated - 1| <= tolerance)."""
  ratios = np.asarray(measured, float) / np.asarray(estimated, float)
  return float(np.mean(np.abs(ratios - 1) <= tolerance))


def priced(rows, coefficients):
  """Estimated step times of `rows` (components, ...) under fitted
  coefficients (seconds per component unit)."""
  return [float(np.dot(r[0], coefficients)) for r in rows]


def fit_coefficients(rows):
  """Non-negative least squares of measured time on the five components:
  the seconds per unit of each (1/flops_per_s, 1/memory_bytes_per_s,
  op_overhead_s, collective_latency_s, 1/collective_bytes_per_s)."""
  a = np.array([r[0] for r in rows], dtype=float)
  b = np.array([r[1] for r in rows], dtype=float)
  scale = a.max(axis=0)
  scale[scale == 0] = 1.0
  try:
    from scipy.optimize import nnls  # pylint: disable=g-import-not-at-top
    coef, _ = nnls(a / scale, b)
  except ImportError:
    coef = np.clip(np.linalg.lstsq(a / scale, b, rcond=None)[0], 0, None)
  return coef / scale


def fit(rows):
  """The fitted coefficients as DeviceParams fields."""
  coef = fit_coefficients(rows)
  inv = lambda c: float(f"{1.0 / c:.3g}") if c > 0 else 1e30
  return dict(flops_per_s=inv(coef[0]), memory_bytes_per_s=inv(coef[1]),
              op_overhead_s=float(f"{coef[2]:.3g}"), collective_latency_s=float(f"{coef[3]:.3g}"),
              collective_bytes_per_s=inv(coef[4]))


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--models", default="mlp,transformer")
  parser.add_argument("--repeats", type=int, default=5,
                      help="rounds over all layouts (each layout's time is the median)")
  parser.add_argument("--mlp_repeats", type=int, default=None,
                      help="rounds for the MLP alone (its steps are ~30x cheaper than the "
                      "transformer's; default --repeats)")
  parser.add_argument("--steps", type=int, default=5)
  parser.add_argument("--sample", type=int, default=16)
  parser.add_argument("--params", default="cpu",
                      help="cpu (the calibrated defaults), a preset, a JSON file, or "
                      "'calibrate': measure this machine's parameters first (as `python -m "
                      "mesh_tensorflow.analysis.cost_model --calibrate` does) and use them")
  parser.add_argument("--fit", action="store_true")
  parser.add_argument("--clock", default="wall", choices=["wall", "cpu"],
                      help="wall-clock step time (default), or this process's CPU time "
                      "(all threads; steadier when other processes load the machine)")
  parser.add_argument("--stat", default="median", choices=["median", "min"],
                      help="per layout, the median (default) or the minimum over repeats "
                      "(steadier when other processes load the machine)")
  parser.add_argument("--save", default=None,
                      help="write the measured step times (JSON) here")
  args = parser.parse_args()
  if args.params == "calibrate":
    params = cost_model.calibrate(num_devices=8)
    print(f"calibrated on this machine: {json.dumps(dataclasses.asdict(params), sort_keys=True)}",
          flush=True)
  else:
    params = cost_model.as_device_params(args.params)
  global STAT, CLOCK
  STAT = args.stat
  CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
  rows = []
  summary = []
  saved = []
  for model in args.models.split(","):
    rho, ratio, r, s, within, reproducibility = run_model(model, args, params)
    rows.extend(r)
    saved.extend(s)
    summary.append((model, rho, ratio, within, reproducibility))
  if args.save:
    with open(args.save, "w") as f:
      json.dump(saved, f, indent=1)
  print("\nmodel        Spearman  within 20%  reproducibility  picked/best-hand-written")
  for model, rho, ratio, within, reproducibility in summary:
    print(f"{model:<12} {rho:>8.3f}  {within:>10.0%}  {reproducibility:>15.3f}  {ratio:>8.3f}")
  if args.fit:
    models = [m for m, *_ in summary]
    print("\nparameters fitted on this run's measurements (non-negative least squares), "
          "priced on each model:")
    print(f"{'fitted on':<16} {'priced':<12} {'Spearman':>8} {'within 20%':>10}")
    for source in models + (["+".join(models)] if len(models) > 1 else []):
      train = [r for r in rows if r[2] in source.split("+")]
      coefficients = fit_coefficients(train)
      for model in models:
        test = [r for r in rows if r[2] == model]
        estimated, measured = priced(test, coefficients), [r[1] for r in test]
        print(f"{source:<16} {model:<12} {spearman(estimated, measured):>8.3f} "
              f"{within_fraction(estimated, measured):>10.0%}")
    fitted = dataclasses.replace(params, name="fitted", **fit(rows))
    print("fitted parameters:\n" + fitted.to_json())


if __name__ == "__main__":
  main()
