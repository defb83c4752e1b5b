"""The README's commands and example work as a user would run them."""

import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def _python_blocks():
  return re.findall(r"```python\n(.*?)```", README, flags=re.S)


def test_readme_starts_with_the_two_commands():
  first_block = re.search(r"```bash\n(.*?)```", README, flags=re.S).group(1)
  lines = [l.split("#")[0].strip() for l in first_block.strip().splitlines()]
  assert "python -m mesh_tensorflow.transformer.main" in lines[0]
  assert lines[1] == "bash oss_scripts/oss_tests.sh"
  assert "oss_tests.sh" in (ROOT / ".ci" / "run").read_text()
  assert (ROOT / "mesh_tensorflow" / "transformer" / "main.py").exists()


def test_readme_tf2_example_is_quickstart_and_trains(tmp_path):
  block = _python_blocks()[0]
  quickstart = (ROOT / "examples" / "quickstart.py").read_text()
  # The README shows examples/quickstart.py without its docstring.
  assert block.strip() in quickstart.replace("  # noqa: E402", "")
  script = tmp_path / "readme_example.py"
  script.write_text(block)
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
  out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                       env=env, timeout=1800, cwd=tmp_path)
  assert out.returncode == 0, out.stderr[-3000:]
  first, last = map(float, re.search(
      r"first step ([\d.]+), after 100 steps ([\d.]+)", out.stdout).groups())
  assert last < first / 10
  # The counters printed while tracing: the 2x4 layout needs allreduces.
  assert "allreduce" in out.stdout
