"""Calibrating a plan to a step time measured on your own software stack.

The presets' `matmul_efficiency` (the share of peak a large matrix product
reaches) is fitted on published Megatron-LM runs. Other stacks run the same
plan faster or slower: published runs of one model on one layout differ by
a third between software stacks. Measure a few steps of a small run (one
host, say) and fit the efficiency to it; the plan of the large run then
starts from your stack's speed:

    python -m mesh_tensorflow.plan ... --hardware=a100-80gb:8 \
        --measured_step_time=1.42 --save_hardware=my_a100.json
    python -m mesh_tensorflow.plan ... --hardware=my_a100.json:512

The fit moves one number, so everything the plan does not price (an input
pipeline, a slow kernel, a host) lands in it: calibrate on a run whose
per-device shapes are those of the large run (the same layers, micro-batch
and model-parallel split), where the difference between the two runs is
what the plan does price (more devices, data parallelism, pipelines).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from mesh_tensorflow.analysis.cost_model import hardware as hardware_lib
from mesh_tensorflow.transformer import planner
from mesh_tensorflow.transformer.plan_types import Plan, PlanOptions

# The fitted efficiency is searched in [LOWEST, 1]: below a few percent of
# peak the run is bound by something the plan does not price.
LOWEST = 0.05


@dataclasses.dataclass
class Calibration:
  """The hardware with the fitted efficiency, and the plan it gives.

  Attributes:
    hardware: the cluster's hardware with `matmul_efficiency` fitted, its
      `sources` entry saying to what, and "-calibrated" after its name.
    plan: the measured configuration's plan with that hardware.
    measured_step_s: the step time it was fitted to.
    preset_efficiency: the efficiency the hardware had before.
  """
  hardware: hardware_lib.Hardware
  plan: Plan
  measured_step_s: float
  preset_efficiency: float


def with_efficiency(cluster: hardware_lib.Cluster, efficiency: float,
                    source: Optional[str] = None,
                    name: Optional[str] = None) -> hardware_lib.Cluster:
  """`cluster` with its hardware's matmul efficiency replaced (and its
  name, if `name` is given).

  Example:
    >>> with_efficiency(hardware_lib.parse_cluster("a100-80gb:8"), 0.8).hardware.matmul_efficiency
    0.8
  """
  h = cluster.hardware
  sources = dict(h.sources)
  if source:
    sources["matmul_efficiency"] = source
  fitted = dataclasses.replace(h, matmul_efficiency=efficiency, sources=sources,
                               name=name or h.name).validate()
  return dataclasses.replace(cluster, hardware=fitted)


def calibrate(cluster: hardware_lib.Cluster, measured_step_s: float,
              mesh_shape: Optional[str] = None, layout: Optional[str] = None,
              options: Optional[PlanOptions] = None) -> Calibration:
  """Fits `matmul_efficiency` so that the parsed gin config's plan on
  `cluster` takes `measured_step_s` per step.

  Args:
    cluster: the hardware and device count the step was measured on.
    measured_step_s: the measured seconds per training step (a median over
      steps after the first few).
    mesh_shape, layout, options: as `planner.plan_current_config`.

  Raises:
    ValueError: the measured time is shorter than the plan at full
      efficiency (the plan prices more communication or memory traffic than
      the run did: check the config matches it), or longer than the plan at
      LOWEST (the run is bound by something the plan does not price).

  Example:
    >>> gin_config.parse(["models/gpt_13b.gin"], [])
    >>> fit = calibrate(hardware_lib.parse_cluster("a100-80gb:64"), 20.0, "data:8;model:8",
    ...                 "batch:data;d_ff:model;heads:model;vocab:model")
    >>> round(fit.hardware.matmul_efficiency, 3), round(fit.plan.step_time_s, 3)
    (0.693, 20.0)
  """
  if not measured_step_s > 0:
    raise ValueError(f"--measured_step_time={measured_step_s}: a step time must be positive "
                     "(seconds per training step).")
  options = options or planner.options_from_gin()

  def step(efficiency: float) -> Plan:
    return planner.plan_current_config(with_efficiency(cluster, efficiency), mesh_shape,
                                       layout, dataclasses.replace(options))

  fastest, slowest = step(1.0), step(LOWEST)
  what = f"{cluster} {fastest.mesh_shape}"
  if measured_step_s < fastest.step_time_s * (1 - 1e-9):
    raise ValueError(
        f"--measured_step_time={measured_step_s:g} s is shorter than the plan of {what} at "
        f"matmul_efficiency 1.0 ({fastest.step_time_s:.4g} s): the plan prices more than that "
        "run did; check that the gin config, mesh and layout are the measured run's.")
  if measured_step_s > slowest.step_time_s:
    raise ValueError(
        f"--measured_step_time={measured_step_s:g} s is longer than the plan of {what} at "
        f"matmul_efficiency {LOWEST} ({slowest.step_time_s:.4g} s): the run is bound by "
        "something the plan does not price (input pipeline, host, first steps); measure "
        "later steps or check the config.")
  # The step time falls as the efficiency rises: bisect on it.
  low, high = LOWEST, 1.0
  for _ in range(40):
    middle = (low + high) / 2
    if step(middle).step_time_s > measured_step_s:
      low = middle
    else:
      high = middle
  efficiency = (low + high) / 2
  source = (f"fitted to a measured step of {measured_step_s:g} s: {fastest.mesh_shape} on "
            f"{cluster} (python -m mesh_tensorflow.plan --measured_step_time)")
  name = cluster.hardware.name
  fitted = with_efficiency(cluster, efficiency, source,
                           name if name.endswith("-calibrated") else name + "-calibrated")
  plan = planner.plan_current_config(fitted, mesh_shape, layout, dataclasses.replace(options))
  return Calibration(fitted.hardware, plan, measured_step_s, cluster.hardware.matmul_efficiency)
