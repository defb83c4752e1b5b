"""Stress test: many random mtf programs under random layouts of three meshes.

Runs the generator of tests/graph_generator.py outside pytest: every case is a
random program of mtf ops whose values and gradients are compared with a
NumPy reference under one random legal layout of each mesh ("all:8",
"rows:2;cols:4", "a:2;b:2;c:2"), optionally plus unconstrained layouts (which
must either work or fail with a clear ValueError).

    python oss_scripts/stress_layouts.py --cases 10000 --seed 0 --jobs 2

Lowering runs eagerly: measured on 2 CPU cores it is about 15x faster per case
than tracing a tf.function per layout, and batching cases into one graph does
not help eager lowering (its cost is per TensorFlow op).

Prints progress, then `cases run: N, mismatches: M`; exits with status 1 if
any case mismatched or raised.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

_GENERATOR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                          "graph_generator.py")


def _setup():
  """Eight logical CPU devices (before TF initializes); the random program
  generator of tests/graph_generator.py, loaded from its file."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  from mesh_tensorflow import testing  # pylint: disable=g-import-not-at-top
  testing.use_logical_cpus(8)
  if "graph_generator" not in sys.modules:
    spec = importlib.util.spec_from_file_location("graph_generator", _GENERATOR)
    module = importlib.util.module_from_spec(spec)
    sys.modules["graph_generator"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
  return sys.modules["graph_generator"]


def case_seed(base_seed: int, index: int) -> int:
  return (base_seed * 1_000_003 + index) % (2**63)


def run_cases(base_seed: int, indices, unconstrained: int, layouts_per_mesh: int,
              num_ops, mode: str):
  """Runs the given cases; returns [(index, [problem, ...])] for failures and
  the number of lowerings and illegal layouts seen."""
  gg = _setup()
  import random  # pylint: disable=g-import-not-at-top
  import traceback  # pylint: disable=g-import-not-at-top
  from mesh_tensorflow.testing import DEVICES  # pylint: disable=g-import-not-at-top
  devices = list(DEVICES)
  failures, lowerings, illegal = [], 0, 0
  for index in indices:
    seed = case_seed(base_seed, index)
    try:
      case = gg.generate_case(seed, num_ops=num_ops)
      result = gg.check_case(case, random.Random(seed ^ 0x5EED), devices,
                             layouts_per_mesh=layouts_per_mesh,
                             unconstrained_layouts=unconstrained, mode=mode)
      lowerings += result.lowerings
      illegal += result.illegal_layouts
      if result.problems:
        failures.append((index, [case.describe()] + result.problems))
    except Exception:  # pylint: disable=broad-except
      failures.append((index, [f"seed {seed}: exception\n{traceback.format_exc()}"]))
  return failures, lowerings, illegal


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--cases", type=int, default=10000, help="number of random cases")
  parser.add_argument("--seed", type=int, default=0, help="base seed")
  parser.add_argument("--jobs", type=int, default=1,
                      help="worker processes (each gets its own 8 logical CPUs)")
  parser.add_argument("--ops", type=int, default=None,
                      help="ops per case (default: random in [3, 10])")
  parser.add_argument("--layouts-per-mesh", type=int, default=1,
                      help="random legal layouts per mesh and case")
  parser.add_argument("--unconstrained", type=int, default=0,
                      help="extra unconstrained (possibly illegal) layouts per mesh")
  parser.add_argument("--mode", choices=["eager", "function", "simd"], default="eager",
                      help="lower eagerly, inside a tf.function, or as a SimdMeshImpl program")
  parser.add_argument("--chunk", type=int, default=100, help="cases per work item")
  parser.add_argument("--max-report", type=int, default=5,
                      help="failures to print in full")
  args = parser.parse_args(argv)

  chunks = [range(i, min(i + args.chunk, args.cases))
            for i in range(0, args.cases, args.chunk)]
  work = dict(base_seed=args.seed, unconstrained=args.unconstrained,
              layouts_per_mesh=args.layouts_per_mesh, num_ops=args.ops, mode=args.mode)
  start = time.time()
  done = lowerings = illegal = 0
  failures = []

  def report(chunk_failures, n, lo, il):
    nonlocal done, lowerings, illegal
    done += n
    lowerings += lo
    illegal += il
    failures.extend(chunk_failures)
    elapsed = time.time() - start
    print(f"[{elapsed:7.1f}s] {done}/{args.cases} cases, {lowerings} lowerings, "
          f"{illegal} illegal layouts rejected, {len(failures)} mismatches "
          f"({1000 * elapsed / max(done, 1):.0f} s per 1000 cases)", flush=True)

  if args.jobs <= 1:
    for chunk in chunks:
      f, lo, il = run_cases(indices=chunk, **work)
      report(f, len(chunk), lo, il)
  else:
    import concurrent.futures  # pylint: disable=g-import-not-at-top
    import multiprocessing  # pylint: disable=g-import-not-at-top
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(args.jobs, mp_context=ctx) as pool:
      futures = {pool.submit(run_cases, indices=list(c), **work): len(c) for c in chunks}
      for fut in concurrent.futures.as_completed(futures):
        f, lo, il = fut.result()
        report(f, futures[fut], lo, il)

  for index, problems in sorted(failures)[:args.max_report]:
    print(f"\n=== case {index} (seed {case_seed(args.seed, index)}) ===")
    print("\n".join(problems))
  print(f"cases run: {done}, mismatches: {len(failures)}")
  return 1 if failures else 0


if __name__ == "__main__":
  sys.exit(main())
