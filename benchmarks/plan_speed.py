r"""How long planning takes: one plan of GPT-3 175B (96 layers) on 1,024
A100s, and `plan --auto` for the same model and device count.

The planner builds and prices the training step of one and of two layers
(no tensor is allocated) and multiplies; --auto prices every
pipeline x data x model split, micro-batch size, pipeline schedule (1F1B,
interleaved with 2 and 4 chunks), recomputation and ZeRO stage. Targets:
under 60 s for the plan, under 10 minutes for --auto.

    python benchmarks/plan_speed.py            # plan and --auto (several minutes)
    python benchmarks/plan_speed.py --no_auto  # the single plan only
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from mesh_tensorflow.analysis.cost_model import hardware  # noqa: E402
from mesh_tensorflow.transformer import plan_search, planner  # noqa: E402
from mesh_tensorflow.transformer import gin_config  # noqa: E402


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--no_auto", action="store_true", help="skip the --auto search")
  args = parser.parse_args(argv)
  cluster = hardware.parse_cluster("a100-80gb:1024")
  gin_config.parse(["models/gpt3_175b.gin"], [
      "transformer.make_layer_stack.num_stages = 8",
      "transformer.make_layer_stack.num_microbatches = 96",
      "transformer.make_layer_stack.pipeline_schedule = '1f1b'"])
  start = time.time()
  plan = planner.plan_current_config(
      cluster, "pipe:8;data:16;model:8", "stages:pipe;batch:data;d_ff:model;heads:model;vocab:model")
  seconds = time.time() - start
  print(f"plan of {plan.parameters / 1e9:.0f}B parameters, {plan.num_layers} layers on "
        f"{cluster}: {seconds:.1f} s (target < 60 s, ratio {seconds / 60:.2f}); "
        f"step {plan.step_time_s:.2f} s, MFU {100 * plan.mfu:.1f}%")
  if not args.no_auto:
    planner._CACHE.clear()  # pylint: disable=protected-access
    start = time.time()
    result = plan_search.search(cluster, top=3)
    seconds = time.time() - start
    best = result.plans[0] if result.plans else None
    print(f"--auto on {cluster}: {result.tried} plans in {seconds:.0f} s (target < 600 s, "
          f"ratio {seconds / 600:.2f}); best {best.mesh_shape if best else 'none'} "
          f"{best.step_time_s if best else float('nan'):.2f} s/step")
  return 0


if __name__ == "__main__":
  sys.exit(main())
