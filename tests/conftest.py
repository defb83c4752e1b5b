"""Shared pytest setup: eight logical CPU devices, before TF initializes.

The logical device split must happen before anything makes TensorFlow
initialize its devices, so it is the first thing this file does.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # pylint: disable=g-import-not-at-top

# Legacy TF1 programs often call tf.compat.v1.disable_v2_behavior(), which
# among other things makes TensorShape[i] a Dimension object instead of an
# int; tests/compat/test_v1_tensorshape.py reruns tests under that setting.
if os.environ.get("MTF_TEST_V1_TENSORSHAPE") == "1":
  tf.compat.v1.disable_v2_tensorshape()

from mesh_tensorflow import testing  # pylint: disable=g-import-not-at-top

testing.use_logical_cpus(8)
# Grappler, TensorFlow's graph optimizer, is off in the test processes: it
# rewrites every function graph before its first run, which makes up about a
# third of a test that traces a step and runs it a few times, and its
# rewrites change results by float rounding at most. The commands the tests
# start in subprocesses (the main job, the command lines, the examples, the
# multi-host workers) run with TensorFlow's defaults, and tests that take the
# `grappler_on` fixture run the lowering with it. MTF_TEST_GRAPPLER=1 keeps it
# on for the whole suite.
if os.environ.get("MTF_TEST_GRAPPLER") != "1":
  tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})

import logging  # pylint: disable=g-import-not-at-top
import re  # pylint: disable=g-import-not-at-top
import sys  # pylint: disable=g-import-not-at-top
import warnings  # pylint: disable=g-import-not-at-top

import pytest  # pylint: disable=g-import-not-at-top

import mtf_test_utils  # pylint: disable=g-import-not-at-top

# Modules whose frames stand between a deprecated TensorFlow function and
# its caller (TensorFlow's dispatch and decorators, logging itself).
_PASS_THROUGH = re.compile(r"(tensorflow|keras|tf_keras|absl|logging|contextlib|functools|"
                           r"conftest)(\.|$)")
_LIBRARY = re.compile(r"mesh_tensorflow(\.|$)")


class _TensorFlowDeprecationsAsWarnings(logging.Handler):
  """TensorFlow announces a call of a deprecated function with a log line
  ("X is deprecated and will be removed ..."), not a warning, logged during
  the call. If the innermost frame outside TensorFlow (the caller) is in
  mesh_tensorflow, it becomes a DeprecationWarning of that module there,
  which the warnings filter in setup.cfg turns into a test failure."""

  def emit(self, record: logging.LogRecord) -> None:
    message = record.getMessage()
    if "is deprecated" not in message:
      return
    frame = sys._getframe(1)  # pylint: disable=protected-access
    while frame is not None and _PASS_THROUGH.match(frame.f_globals.get("__name__", "")):
      frame = frame.f_back
    module = frame.f_globals.get("__name__", "") if frame is not None else ""
    if _LIBRARY.match(module):
      warnings.warn_explicit(message, DeprecationWarning, frame.f_code.co_filename,
                             frame.f_lineno, module=module)


logging.getLogger("tensorflow").addHandler(_TensorFlowDeprecationsAsWarnings())


@pytest.fixture
def devices():
  """The eight logical CPU devices, in pnum order."""
  return list(mtf_test_utils.DEVICES)


@pytest.fixture
def grappler_on():
  """TensorFlow's graph optimizer on for the test (it is off in the test
  processes, see above), as it is in a user's program."""
  before = tf.config.optimizer.get_experimental_options()
  tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": False})
  try:
    yield
  finally:
    tf.config.optimizer.set_experimental_options(
        {"disable_meta_optimizer": before.get("disable_meta_optimizer", False)})


@pytest.fixture
def graph_and_mesh():
  """A fresh mtf graph and a mesh named "mesh" on it."""
  import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top
  graph = mtf.Graph()
  return graph, mtf.Mesh(graph, "mesh")


# The files whose tests run longest (minutes: the main job, every layout gin
# file, the command line). Collected first, they start first: with the suite
# spread over worker processes (pytest-xdist), one left for the end would run
# alone while the other workers idle.
_LONGEST_FIRST = ("test_transformer_main_job.py", "test_transformer_layouts.py",
                  "test_transformer_cli.py")


def pytest_collection_modifyitems(config, items):
  del config
  rank = {name: i for i, name in enumerate(_LONGEST_FIRST)}
  items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable
