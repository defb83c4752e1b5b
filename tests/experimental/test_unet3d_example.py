"""examples/unet3d.py, run as a user would (a subprocess with tiny settings):
the 3-D U-Net, its volume split over a 2x4 mesh, trains on synthetic
spheres through the original's reader and executor, and its loss falls;
bad settings are one `error:` line with exit status 2."""

import os
import re
import subprocess
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO_ROOT, "examples", "unet3d.py")

_FINAL = re.compile(r"^final: steps=(\d+) first_loss=(\S+) last_loss=(\S+) dice_global=(\S+) "
                    r"losses=\[(\S+)\]$")


def _run(*args, timeout=300):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=REPO_ROOT)
  return subprocess.run([sys.executable, SCRIPT, *args], cwd=REPO_ROOT, env=env,
                        capture_output=True, text=True, timeout=timeout, check=False)


def test_training_on_a_spatially_split_volume_lowers_the_loss(tmp_path):
  proc = _run("--train_steps=8", "--ct_resolution=8", "--n_conv_per_block=1",
              "--num_volumes=4", "--batch_size_train=2", "--batch_size_eval=2",
              "--log_every=4", f"--data_dir={tmp_path}")
  assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-4000:]}"
  lines = proc.stdout.strip().splitlines()
  assert "layout 'image_nx_block:rows;image_ny_block:cols' on mesh 'rows:2;cols:4'" in lines[0]
  match = _FINAL.match(lines[-1])
  assert match, f"last line is not the final summary: {lines[-1]!r}"
  losses = [float(v) for v in match.group(5).split(",")]
  assert int(match.group(1)) == len(losses) == 8
  assert all(v == v and v > 0 for v in losses)
  assert losses[-1] < 0.8 * losses[0], losses
  assert sum(losses[-3:]) < sum(losses[:3])
  assert any(line.startswith("train step 4: loss") for line in lines)
  assert sorted(p.name for p in tmp_path.iterdir())[:2] == ["eval-0-0.tfrecords",
                                                             "eval-0-1.tfrecords"]


def test_bad_settings_are_one_error_line():
  proc = _run("--image_ny_block=3", "--train_steps=1")
  assert proc.returncode == 2
  errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
  assert len(errors) == 1, proc.stderr
  assert errors[0].startswith("error: unet: --image_ny_block=3 must divide --ct_resolution=16")
  assert "Traceback" not in proc.stderr
