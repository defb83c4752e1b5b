"""`plan --measured_step_time`: the matmul efficiency fitted to a measured step."""

import json
import os
import subprocess
import sys

import pytest

from mesh_tensorflow.analysis.cost_model import hardware
from mesh_tensorflow.transformer import gin_config
from mesh_tensorflow.transformer import plan_calibration
from mesh_tensorflow.transformer import planner

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = ["num_layers = 4", "d_model = 1024", "d_ff = 4096", "num_heads = 16", "d_kv = 64",
         "run.sequence_length = {'inputs': 512, 'targets': 512}", "run.batch_size = 32",
         "run.activation_dtype = 'bfloat16'", "run.vocabulary = @vocabulary.SizedVocabulary()",
         "vocabulary.SizedVocabulary.size = 32000"]
MESH, LAYOUT = "data:2;model:4", "batch:data;d_ff:model;heads:model;vocab:model"


def _plan(cluster):
  return planner.plan_current_config(cluster, MESH, LAYOUT, planner.options_from_gin())


def test_fitted_efficiency_reproduces_the_measured_step():
  gin_config.parse([], MODEL)
  cluster = hardware.parse_cluster("a100-80gb:8")
  preset = _plan(cluster)
  # A step measured at the preset's own prediction gives back its efficiency.
  same = plan_calibration.calibrate(cluster, preset.step_time_s, MESH, LAYOUT)
  assert same.hardware.matmul_efficiency == pytest.approx(
      cluster.hardware.matmul_efficiency, rel=1e-4)
  assert same.preset_efficiency == cluster.hardware.matmul_efficiency
  # A faster measured step: a higher efficiency, whose plan takes that long
  # and moves only the compute (communication is priced as before).
  faster = plan_calibration.calibrate(cluster, 0.97 * preset.step_time_s, MESH, LAYOUT)
  assert faster.hardware.matmul_efficiency > cluster.hardware.matmul_efficiency
  assert faster.plan.step_time_s == pytest.approx(0.97 * preset.step_time_s, rel=1e-4)
  assert faster.plan.time_breakdown["compute"] < preset.time_breakdown["compute"]
  assert faster.plan.time_breakdown["model_parallel_comm"] == pytest.approx(
      preset.time_breakdown["model_parallel_comm"])
  assert "fitted to a measured step" in faster.hardware.sources["matmul_efficiency"]
  assert faster.hardware.name == "a100-80gb-calibrated"
  assert faster.plan.cluster == "a100-80gb-calibrated:8"
  # The fitted hardware plans any other count the same way as the fit.
  saved, _ = hardware.hardware_from_json(faster.hardware.to_json())
  again = _plan(hardware.Cluster(saved, 8))
  assert again.step_time_s == pytest.approx(faster.plan.step_time_s, rel=1e-9)


def test_a_measured_step_the_plan_cannot_reach_is_refused():
  gin_config.parse([], MODEL)
  cluster = hardware.parse_cluster("a100-80gb:8")
  at_peak = _plan(plan_calibration.with_efficiency(cluster, 1.0)).step_time_s
  with pytest.raises(ValueError, match=r"--measured_step_time=.* is shorter than the plan"):
    plan_calibration.calibrate(cluster, 0.5 * at_peak, MESH, LAYOUT)
  with pytest.raises(ValueError, match=r"--measured_step_time=.* is longer than the plan"):
    plan_calibration.calibrate(cluster, 1000.0, MESH, LAYOUT)
  with pytest.raises(ValueError, match="must be positive"):
    plan_calibration.calibrate(cluster, 0.0, MESH, LAYOUT)


def _flags(*flags):
  """The plan command's flags for the test's model, mesh and layout."""
  return [f"--mesh_shape={MESH}", f"--layout={LAYOUT}", *flags] + [
      f"--gin_param={b}" for b in MODEL]


def _command(*flags):
  env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3")
  args = [sys.executable, "-m", "mesh_tensorflow.plan", *_flags(*flags)]
  return subprocess.run(args, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)


def test_plan_command_calibrates_saves_and_plans_with_the_saved_hardware(tmp_path, capsys):
  saved = tmp_path / "mine.json"
  fit = _command("--hardware=a100-80gb:8", "--measured_step_time=0.05",
                 f"--save_hardware={saved}", "--json")
  assert fit.returncode == 0, fit.stderr
  result = json.loads(fit.stdout)
  assert result["step_time_s"] == pytest.approx(0.05, rel=1e-4)
  calibration = result["calibration"]
  assert calibration["saved_to"] == str(saved)
  assert calibration["preset_matmul_efficiency"] == pytest.approx(
      hardware.preset("a100-80gb").matmul_efficiency)
  assert json.loads(saved.read_text())["matmul_efficiency"] == pytest.approx(
      calibration["matmul_efficiency"])
  # Planned with the saved file, or with the efficiency given as a flag (in
  # this process: the command's main, as the subprocesses above run it).
  from mesh_tensorflow import plan as plan_command  # pylint: disable=g-import-not-at-top
  for flags in ([f"--hardware={saved}:8"],
                ["--hardware=a100-80gb:8",
                 f"--matmul_efficiency={calibration['matmul_efficiency']!r}"]):
    assert plan_command.main(_flags(*flags, "--json")) == 0
    planned = json.loads(capsys.readouterr().out)
    assert planned["step_time_s"] == pytest.approx(0.05, rel=1e-4)
  # A user's mistake: one line and exit status 2.
  too_fast = _command("--hardware=a100-80gb:8", "--measured_step_time=0.0001")
  assert too_fast.returncode == 2
  assert too_fast.stderr.startswith("error: --measured_step_time=0.0001 s is shorter")
  assert "Traceback" not in too_fast.stderr


def test_plan_command_rejects_calibration_flags_that_do_not_go_together(capsys):
  from mesh_tensorflow import plan as plan_command  # pylint: disable=g-import-not-at-top
  assert plan_command.main(["--hardware=a100-80gb:8", "--measured_step_time=1",
                            "--auto"]) == 2
  assert "--measured_step_time fits the efficiency of one measured plan" in \
      capsys.readouterr().err
  assert plan_command.main(["--hardware=a100-80gb:8", "--save_hardware=x.json"]) == 2
  assert "give both" in capsys.readouterr().err
  assert plan_command.main(["--hardware=a100-80gb:8", "--matmul_efficiency=1.5"]) == 2
  assert "--matmul_efficiency=1.5" in capsys.readouterr().err


def test_calibration_on_a_smaller_run_of_the_same_stack_carries_to_its_larger_runs():
  sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
  try:
    import scale_validation  # pylint: disable=g-import-not-at-top
  finally:
    sys.path.pop(0)
  # MT-NLG 530B on 2,240 GPUs as the measured run; its 2,800- and 3,360-GPU
  # runs (the same stack and layers, more data parallelism) from it. The
  # preset over-predicts them by 12% and 15%.
  smallest, *larger = scale_validation.mt_nlg_rows()
  _, plan = scale_validation.predict(smallest)
  fit = plan_calibration.calibrate(
      hardware.parse_cluster(f"{smallest.hardware}:{smallest.count}"),
      scale_validation.published_step_s(smallest, plan),
      smallest.mesh_shape, smallest.layout, plan.options)
  assert fit.hardware.matmul_efficiency < fit.preset_efficiency
  for row in larger:
    preset, _ = scale_validation.predict(row)
    calibrated, _ = scale_validation.predict(row, fit.hardware.matmul_efficiency)
    assert abs(calibrated / row.published - 1) < 0.06 < abs(preset / row.published - 1), (
        row.name, calibrated, preset, row.published)
