r"""Plan a large training run from a laptop: step time, tokens/s, MFU, memory
per device (fits or not) and the most expensive communications of a
transformer configured by gin files, on a cluster of accelerators.

    python -m mesh_tensorflow.plan --gin_file=models/base_lm.gin \
        --gin_param='run.batch_size = 256' --hardware=a100-80gb:64 \
        --mesh_shape='data:16;model:4' --layout='batch:data;d_ff:model;heads:model'
    python -m mesh_tensorflow.plan ... --json      # one JSON object
    python -m mesh_tensorflow.plan ... --auto      # search meshes and options
    python -m mesh_tensorflow.plan ... --measured_step_time=1.7 --save_hardware=mine.json
                                                   # fit the efficiency to your stack

The model flags are `report`'s (--gin_file, --gin_param, --mesh_shape,
--layout). Pipeline stages, micro-batches, recomputation and ZeRO come from
the gin config (docs/planning.md lists the bindings); --hardware is a preset
and a count (v100-16gb, v100-32gb, a100-40gb, a100-80gb, h100-sxm, h200,
tpu-v2, tpu-v3, tpu-v4, tpu-v5e, tpu-v5p, tpu-v6e) or a JSON file.
"""

from __future__ import annotations

import sys
from typing import Optional, Sequence

from mesh_tensorflow import cli


def main(argv: Optional[Sequence[str]] = None) -> int:
  """`python -m mesh_tensorflow.plan ARGS`; returns the exit status."""
  return cli.run_module_command("mesh_tensorflow.plan", _main, argv)


def _main(argv: Sequence[str]) -> int:
  parser = cli.FlagParser(
      prog="python -m mesh_tensorflow.plan",
      description="Step time, throughput, MFU, memory per device and communications of a "
      "transformer (gin config) on a cluster of accelerators, without allocating tensors.")
  parser.add_argument("--gin_file", action="append", default=[],
                      help="gin files read after gin/defaults.gin (paths or names under the "
                      "package's gin/ directory)")
  parser.add_argument("--gin_param", action="append", default=[],
                      help="gin bindings, e.g. 'run.batch_size = 512'")
  parser.add_argument("--gin_location_prefix", action="append", default=[],
                      help=cli.GIN_FLAG_HELP["gin_location_prefix"])
  parser.add_argument("--mesh_shape", default=None, help="override the config's mesh shape")
  parser.add_argument("--layout", default=None, help="override the config's layout rules")
  parser.add_argument("--hardware", default=None,
                      help="NAME:COUNT (v100-16gb, v100-32gb, a100-40gb, a100-80gb, h100-sxm, "
                      "h200, tpu-v2, tpu-v3, tpu-v4, tpu-v5e, tpu-v5p, tpu-v6e) or FILE.json[:COUNT]; "
                      "for TPU slices NAME:SxN (S slices of N devices, e.g. tpu-v5p:2x64)")
  parser.add_argument("--json", action="store_true", help="print one JSON object")
  parser.add_argument("--pipeline_schedule", default=None,
                      help="override the schedule: gpipe, 1f1b or interleaved")
  parser.add_argument("--virtual_stages", type=int, default=None,
                      help="layer chunks per device with --pipeline_schedule=interleaved "
                      "(default: the config's transformer.make_layer_stack.virtual_stages); "
                      "with --auto, also tried beside 1, 2 and 4")
  parser.add_argument("--attention", default="unfused",
                      help="unfused (the library's attention) or fused (estimate only: price "
                      "the attention as one on-chip kernel per pass, as FlashAttention-style "
                      "kernels run it, its products at the hardware's attention_efficiency)")
  parser.add_argument("--fusion", default="xla",
                      help="xla (the step compiled by XLA, run.jit_compile = True: elementwise "
                      "chains fused) or none (TensorFlow running it op by op; GPUs only)")
  parser.add_argument("--no_overlap", action="store_true",
                      help="do not overlap gradient reduction with the backward pass")
  parser.add_argument("--overlap", default="",
                      help="estimate only: what the training stack you plan for overlaps with "
                      "compute beyond this library, comma-separated: model_parallel (each "
                      "layer's tensor-parallel collectives pipelined with its matrix products, "
                      "Megatron-LM's --tp-comm-overlap), param_gather (ZeRO 1/2's gathering of "
                      "updated variables under the next step's first forward pass, "
                      "Megatron-LM's --overlap-param-gather)")
  parser.add_argument("--auto", action="store_true",
                      help="search mesh shapes, layouts and options for the device count and "
                      "print the best plans that fit")
  parser.add_argument("--top", type=int, default=5, help="with --auto: how many plans to print")
  parser.add_argument("--max_seconds", type=float, default=0.0,
                      help="with --auto: stop searching after this many seconds and rank the "
                      "plans priced so far (0: search everything)")
  parser.add_argument("--memory_budget", type=float, default=0.0,
                      help="with --auto: GiB per device a plan may use, to leave headroom "
                      "(allocator fragmentation, compiler scratch space; 0: the whole HBM)")
  parser.add_argument("--matmul_efficiency", type=float, default=0.0,
                      help="the share of peak a large matrix product reaches on your stack, "
                      "instead of the hardware's (fitted on published runs; 0: the hardware's)")
  parser.add_argument("--measured_step_time", type=float, default=0.0,
                      help="seconds per training step you measured for this config on this "
                      "hardware: fit --matmul_efficiency to it and plan with the fitted value "
                      "(docs/planning.md, 'Calibrating to your stack')")
  parser.add_argument("--save_hardware", default="",
                      help="with --measured_step_time: write the hardware with the fitted "
                      "efficiency to this JSON file, for --hardware=FILE:COUNT")
  args = parser.parse_args(argv)
  if not args.hardware:
    parser.error("--hardware is required: e.g. --hardware=a100-80gb:1024 or tpu-v4:512")
  if args.virtual_stages is not None and args.virtual_stages < 1:
    parser.error(f"--virtual_stages={args.virtual_stages}: must be at least 1")
  if args.attention not in ("unfused", "fused"):
    parser.error(f"--attention={args.attention}: use unfused or fused")
  if args.fusion not in ("xla", "none"):
    parser.error(f"--fusion={args.fusion}: use xla or none")
  overlap = tuple(x.strip() for x in args.overlap.split(",") if x.strip())
  unknown = [x for x in overlap if x not in ("model_parallel", "param_gather")]
  if unknown:
    parser.error(f"--overlap={args.overlap}: unknown {', '.join(unknown)}; use model_parallel "
                 "and/or param_gather")
  if args.top < 1:
    parser.error(f"--top={args.top}: must be at least 1")
  if args.max_seconds < 0:
    parser.error(f"--max_seconds={args.max_seconds}: must be 0 (no limit) or more")
  if args.memory_budget < 0:
    parser.error(f"--memory_budget={args.memory_budget}: GiB per device, 0 (the whole HBM) or "
                 "more")
  if args.memory_budget and not args.auto:
    parser.error("--memory_budget limits the plans --auto keeps: give it with --auto (a single "
                 "plan prints its memory against the HBM)")
  if not 0 <= args.matmul_efficiency <= 1:
    parser.error(f"--matmul_efficiency={args.matmul_efficiency}: a share of peak, in (0, 1]")
  if args.measured_step_time < 0:
    parser.error(f"--measured_step_time={args.measured_step_time}: seconds per step, positive")
  if args.measured_step_time and (args.auto or args.matmul_efficiency):
    parser.error("--measured_step_time fits the efficiency of one measured plan: give it "
                 "without --auto and --matmul_efficiency, then plan with --save_hardware's "
                 "file")
  if args.save_hardware and not args.measured_step_time:
    parser.error("--save_hardware writes the efficiency fitted by --measured_step_time: "
                 "give both")
  cli.quiet_tensorflow_startup()
  import json  # pylint: disable=g-import-not-at-top
  from mesh_tensorflow.analysis.cost_model import hardware  # pylint: disable=g-import-not-at-top
  from mesh_tensorflow.transformer import planner  # pylint: disable=g-import-not-at-top
  from mesh_tensorflow.transformer import gin_config  # pylint: disable=g-import-not-at-top
  try:
    cluster = hardware.parse_cluster(args.hardware)
  except ValueError as e:
    raise cli.UserError(str(e), hint="python -m mesh_tensorflow.plan --help lists the presets")
  if args.matmul_efficiency:
    from mesh_tensorflow.transformer import plan_calibration  # pylint: disable=g-import-not-at-top
    cluster = plan_calibration.with_efficiency(cluster, args.matmul_efficiency,
                                               "--matmul_efficiency")
  if args.fusion == "none" and cluster.hardware.kind == "tpu":
    raise cli.UserError(f"--fusion=none with --hardware={args.hardware}: a TPU runs programs "
                        "compiled by XLA only", hint="drop --fusion=none")
  gin_config.add_search_paths(args.gin_location_prefix)
  gin_config.parse(args.gin_file, args.gin_param)
  options = planner.options_from_gin()
  if args.pipeline_schedule:
    options.schedule = args.pipeline_schedule
  if args.virtual_stages is not None:
    options.virtual_stages = args.virtual_stages
  options.overlap_grad_reduce = not args.no_overlap
  options.attention = args.attention
  options.fusion = args.fusion
  options.overlap = overlap
  if args.auto:
    from mesh_tensorflow.transformer import plan_search  # pylint: disable=g-import-not-at-top
    def progress(tried, seconds):
      print(f"searching: {tried} plans priced in {seconds:.0f} s", file=sys.stderr, flush=True)
    chunks = tuple(sorted({*plan_search.VIRTUAL_STAGES, options.virtual_stages}))
    result = plan_search.search(cluster, top=args.top, attention=args.attention, overlap=overlap,
                                virtual_stages=chunks,
                                fusion=args.fusion, max_seconds=args.max_seconds or None,
                                progress=progress,
                                memory_budget_bytes=args.memory_budget * 2**30 or None)
    if args.json:
      print(json.dumps(result.to_dict(), indent=2, sort_keys=True))
    else:
      print(result.summary())
    return 0
  if args.measured_step_time:
    return _calibrate(args, cluster, options)
  plan = planner.plan_current_config(cluster, args.mesh_shape, args.layout, options)
  print(plan.to_json() if args.json else plan.summary())
  return 0


def _calibrate(args, cluster, options) -> int:
  """--measured_step_time: the plan with the fitted efficiency."""
  import json  # pylint: disable=g-import-not-at-top
  from mesh_tensorflow.transformer import plan_calibration  # pylint: disable=g-import-not-at-top
  try:
    fit = plan_calibration.calibrate(cluster, args.measured_step_time, args.mesh_shape,
                                     args.layout, options)
  except ValueError as e:
    if "--measured_step_time" in str(e):
      raise cli.UserError(str(e), hint="measure a step of the run this config describes")
    raise
  if args.save_hardware:
    try:
      with open(args.save_hardware, "w") as f:
        f.write(fit.hardware.to_json() + "\n")
    except OSError as e:
      raise cli.UserError(f"--save_hardware={args.save_hardware}: cannot write it ({e})",
                          hint="give a path in a directory you can write") from None
  line = (f"calibrated: matmul_efficiency {fit.hardware.matmul_efficiency:.3f} "
          f"({cluster.hardware.name}'s was {fit.preset_efficiency:.3f}) reproduces the measured "
          f"{fit.measured_step_s:g} s per step")
  if args.save_hardware:
    line += f"; saved to {args.save_hardware} (--hardware={args.save_hardware}:COUNT)"
  if args.json:
    result = fit.plan.to_dict()
    result["calibration"] = {
        "measured_step_time_s": fit.measured_step_s,
        "matmul_efficiency": fit.hardware.matmul_efficiency,
        "preset_matmul_efficiency": fit.preset_efficiency,
        "saved_to": args.save_hardware or None}
    print(json.dumps(result, indent=2, sort_keys=True))
  else:
    print(line)
    print(fit.plan.summary())
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
