"""Model directories written by the original Mesh TensorFlow 0.1.21 itself
(tests/data/original_0.1.21, see its README.md) score here as they scored
there: the command line reads the original's checkpoint and gin 0.5
operative config unchanged, on split meshes, and the log-likelihoods equal
the original's to 1e-3.
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "original_0.1.21"

# (model directory, mesh, layout): each on another mesh than the original's
# single device, splitting heads, d_ff and vocab where the model allows.
CASES = [
    ("t5_v1_0_bi", "batch:2;model:4", "batch:batch;d_ff:model;vocab:model"),
    ("t5_1_1_bi", "batch:4;model:2", "batch:batch;d_ff:model;heads:model;vocab:model"),
    ("lm", "all:8", "d_ff:all;vocab:all"),
]


def _run(args, cwd):
  env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="3")
  return subprocess.run([sys.executable, "-m", "mesh_tensorflow.transformer.main", *args],
                        capture_output=True, text=True, env=env, cwd=cwd, timeout=900)


@pytest.mark.parametrize("name,mesh,layout", CASES, ids=[c[0] for c in CASES])
def test_scores_equal_the_originals(tmp_path, name, mesh, layout):
  model_dir = tmp_path / name
  shutil.copytree(DATA / name, model_dir)
  expected = json.loads((model_dir / "expected.json").read_text())
  before = sorted(p.name for p in model_dir.iterdir())
  if expected["inputs"]:
    lines = [f"{i}\t{t}" for i, t in zip(expected["inputs"], expected["targets"])]
  else:
    lines = expected["targets"]
  pairs = tmp_path / "pairs.txt"
  pairs.write_text("\n".join(lines) + "\n")
  out = _run([f"--model_dir={model_dir}", f"--gin_file={model_dir / 'operative_config.gin'}",
              "--mode=score", f"--input_file={pairs}", f"--output_file={tmp_path / 'scores'}",
              f"--gin_param=utils.run.mesh_shape = '{mesh}'",
              f"--gin_param=utils.run.layout_rules = '{layout}'",
              "--gin_param=utils.run.batch_size = 8"], cwd=tmp_path)
  assert out.returncode == 0, out.stderr[-4000:]
  scores = [float(s) for s in (tmp_path / "scores").read_text().split()]
  assert len(scores) == len(expected["scores"])
  for got, want in zip(scores, expected["scores"]):
    assert abs(got - want) <= 1e-3, (name, scores, expected["scores"])
  # Scoring leaves the original's directory as it was.
  assert sorted(p.name for p in model_dir.iterdir()) == before
