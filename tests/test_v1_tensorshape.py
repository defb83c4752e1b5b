"""Legacy TF1 programs often start with tf.compat.v1.disable_v2_behavior(),
which (among other things) makes `tf_tensor.shape[i]` a `Dimension` object
instead of an int. The lowering must not care: this reruns a cross-section of
the suite (original call forms, shifts across slice boundaries, random
programs inside a tf.function, every collective) in a process with the V1
TensorShape behaviour (see tests/conftest.py)."""

import os
import subprocess
import sys

TESTS = [
    "tests/test_original_signatures.py",
    "tests/test_layout_invariance.py::test_shift_values_and_gradients",
    "tests/test_layout_invariance.py::test_random_graph_in_tf_function",
    "tests/test_communication.py",
]


def test_cross_section_passes_with_v1_tensorshape():
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = dict(os.environ, MTF_TEST_V1_TENSORSHAPE="1", TF_CPP_MIN_LOG_LEVEL="2")
  proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                         "-p", "no:xdist", *TESTS], cwd=root, env=env, capture_output=True,
                        text=True, timeout=1200, check=False)
  assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
  assert " passed" in proc.stdout and " failed" not in proc.stdout
