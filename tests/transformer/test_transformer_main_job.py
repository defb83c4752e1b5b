"""README.md's first command, the main job, exactly as a user runs it (default
flags except --model_dir): its held-out loss ends well below the corpus's
unigram entropy, it writes checkpoints and TensorBoard events and prints
samples, and a second run resumes instead of training again."""

import glob
import os
import re
import subprocess
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _main(model_dir):
  proc = subprocess.run(
      [sys.executable, "-m", "mesh_tensorflow.transformer.main", f"--model_dir={model_dir}"],
      cwd=REPO_ROOT, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"), capture_output=True,
      text=True, timeout=2400, check=False)
  assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-4000:]}"
  final = re.search(r"^final: (.*)$", proc.stdout, re.M)
  assert final, proc.stdout
  values = dict(item.split("=") for item in final.group(1).split())
  return {k: float(v) for k, v in values.items()}, proc.stdout


def test_main_job_learns_well_below_unigram_entropy_and_resumes(tmp_path):
  final, out = _main(tmp_path)
  assert final["step"] == 400
  assert "mesh 'rows:2;cols:4'" in out and "layout 'batch:rows;" in out
  assert "unigram entropy of the training tokens" in out
  assert re.search(r"^step 400/400 loss=\S+ .*steps/s", out, re.M)
  assert 2.5 < final["unigram_entropy"] < 4.0
  # "Well below": at most two thirds of the unigram entropy (0.61 of it in
  # practice: 1.91 against 3.14 nats), on held-out files the model never saw.
  assert final["eval_cross_entropy"] < final["unigram_entropy"] * 2 / 3, final
  assert final["perplexity"] < 8.0
  assert out.count("--- sample (prompt") == 4
  assert glob.glob(str(tmp_path / "ckpt-400*")) and glob.glob(str(tmp_path / "events.*"))

  again, out = _main(tmp_path)
  assert "(step 400)" in out and "nothing to train" in out
  assert again["step"] == 400
  assert abs(again["eval_loss"] - final["eval_loss"]) < 1e-4
