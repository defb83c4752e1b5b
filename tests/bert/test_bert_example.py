"""examples/bert_pretrain_and_classify.py as a user runs it: a tiny BERT
pre-trains and fine-tunes, and both losses fall."""

import os
import re
import subprocess
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_FINAL = re.compile(r"^final: (.*)$", re.M)


def _run(args, timeout=300):
  env = dict(os.environ, PYTHONPATH=REPO_ROOT, TF_CPP_MIN_LOG_LEVEL="2")
  return subprocess.run([sys.executable, *args], cwd=REPO_ROOT, env=env, capture_output=True,
                        text=True, timeout=timeout, check=False)


def test_example_pretrains_and_fine_tunes_with_falling_losses():
  proc = _run(["examples/bert_pretrain_and_classify.py", "--mesh_shape=rows:2;cols:2",
               "--layout=batch:rows;num_heads:cols", "--num_layers=1", "--pretrain_steps=20",
               "--classify_steps=60", "--batch_size=16", "--learning_rate=1e-3",
               "--log_every=100"])
  assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
  match = _FINAL.search(proc.stdout)
  assert match, proc.stdout
  final = {k: float(v) for k, v in (item.split("=") for item in match.group(1).split())}
  # Masked LM starts near log(128) (the padded vocabulary) and falls.
  assert final["pretrain_loss_first"] > 5.0
  assert final["pretrain_loss_last"] < final["pretrain_loss_first"] - 0.8
  assert final["classify_loss_last"] < 0.5 * final["classify_loss_first"]
  assert final["classify_accuracy"] > 0.8
