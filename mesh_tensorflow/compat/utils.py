"""Small TensorFlow-level utilities under the original `mtf.utils` names.

    >>> placer = mtf.utils.BalancedVariablePlacer(["cpu:0", "cpu:1"])
    >>> with tf.Graph().as_default(), tf.compat.v1.device(placer.device_function):
    ...   a = tf.compat.v1.get_variable("a", [1000])   # on cpu:0
    ...   b = tf.compat.v1.get_variable("b", [10])     # on cpu:1, the emptier one

mtf variables live as per-processor slices on the mesh's own devices. Given
to a mesh, `mtf.Mesh(graph, name, placer)`, a placer asks for a full-size
master copy of each variable as well, placed by it (see
mesh_tensorflow/lowering/master_variables.py).
"""

from __future__ import annotations

import contextlib
import heapq
from typing import Optional, Sequence

import tensorflow as tf
from absl import logging

from mesh_tensorflow import _environment

SCALAR_SUMMARIES_COLLECTION_KEY = "mtf_scalar_summaries"
_VARIABLE_OP_TYPES = ("Variable", "VariableV2", "VarHandleOp")


@contextlib.contextmanager
def outside_all_rewrites():
  """Ops created inside do not inherit the enclosing control dependencies."""
  with tf.control_dependencies(None):
    yield


class BalancedVariablePlacer:
  """A TensorFlow device function that puts each new variable on the device
  holding the fewest bytes of variables so far; other ops follow the last
  variable placed.

  Args:
    devices: device names.
    init_usage: bytes already used on each device (default: zeros).
  """

  def __init__(self, devices: Sequence[str], init_usage: Optional[Sequence[int]] = None):
    devices = list(devices)
    if not devices:
      raise ValueError("BalancedVariablePlacer needs at least one device.")
    usage = list(init_usage) if init_usage else [0] * len(devices)
    if len(usage) != len(devices):
      raise ValueError(
          f"BalancedVariablePlacer: {len(usage)} init_usage values for {len(devices)} "
          "devices; give one per device.")
    # (bytes, position, device): the position keeps ties in device order.
    self._heap = [(u, i, d) for i, (u, d) in enumerate(zip(usage, devices))]
    heapq.heapify(self._heap)
    self._last_device = devices[0]

  def device_function(self, op) -> str:
    """The device for `op` (a tf.Operation, or a NodeDef in TF1 graphs)."""
    if op.type not in _VARIABLE_OP_TYPES:
      return self._last_device
    shape = tf.TensorShape(op.get_attr("shape"))
    if shape.num_elements() is None:
      raise ValueError(
          f"BalancedVariablePlacer: variable {op.name!r} has shape {shape}, which is "
          "not fully defined; give it a static shape.")
    nbytes = shape.num_elements() * tf.as_dtype(op.get_attr("dtype")).size
    used, position, device = heapq.heappop(self._heap)
    heapq.heappush(self._heap, (used + nbytes, position, device))
    logging.debug("Placing variable %s (%d bytes) on %s.", op.name, nbytes, device)
    self._last_device = device
    return device

  __call__ = device_function


def remove_summaries() -> None:
  """Clears the mtf scalar summaries recorded in the default TF1 graph."""
  graph = tf.compat.v1.get_default_graph()
  del graph.get_collection_ref(SCALAR_SUMMARIES_COLLECTION_KEY)[:]


def create_host_call(model_dir: str):
  """The original's TPUEstimator host call writing the scalar summaries of the
  default TF1 graph (collection `SCALAR_SUMMARIES_COLLECTION_KEY`, pairs of
  (name, scalar tensor)) to `model_dir` at the global step.

  For code that still builds TF1 graphs; mtf models trained with
  `mtf.training.Trainer` need none: `mtf.scalar_summary` values are written to
  TensorBoard by the Trainer.

  Returns:
    (host_call_fn, args) for `host_call_fn(*args)`, or None when there is no
    summary.

  Raises:
    ValueError: there are summaries but the graph has no global step.

  Example:
    >>> with tf.Graph().as_default():
    ...   tf.compat.v1.train.get_or_create_global_step()
    ...   tf.compat.v1.add_to_collection(SCALAR_SUMMARIES_COLLECTION_KEY,
    ...                                  ("loss", tf.constant(1.5)))
    ...   fn, args = create_host_call("/tmp/model")
  """
  graph = tf.compat.v1.get_default_graph()
  summaries = list(graph.get_collection(SCALAR_SUMMARIES_COLLECTION_KEY))
  if not summaries:
    return None

  def as_scalar(name, t):
    if not t.shape.is_compatible_with([]):
      raise ValueError(f"create_host_call: summary {name!r} has shape {t.shape}; "
                       "summaries must be scalars.")
    if t.dtype == tf.int64:
      t = tf.cast(t, tf.int32)
    elif t.dtype == tf.bfloat16:
      t = tf.cast(t, tf.float32)
    return tf.reshape(t, [1])
  names = [name for name, _ in summaries]
  tensors = [as_scalar(name, t) for name, t in summaries]
  global_step = tf.compat.v1.train.get_global_step(graph)
  if global_step is None:
    raise ValueError("create_host_call: the default graph has no global step; create it "
                     "with tf.compat.v1.train.get_or_create_global_step() (or train with "
                     "mtf.training.Trainer, which writes mtf.scalar_summary values itself).")

  def host_call_fn(global_step, *args):
    """Writes one scalar summary per argument (averaged over replicas)."""
    if len(args) != len(names):
      raise ValueError(f"host_call_fn: {len(args)} values for {len(names)} summaries.")
    step = tf.cast(tf.reshape(global_step, [-1])[0], tf.int64)
    if not _environment.tensorboard_available(model_dir):
      return []
    with tf.summary.create_file_writer(model_dir).as_default():
      written = [tf.summary.scalar(name, tf.reduce_mean(t), step=step)
                 for name, t in zip(names, args)]
    return written

  step = tf.reshape(tf.cast(global_step, tf.int32), [1])
  return host_call_fn, [step] + tensors


from mesh_tensorflow.lowering.tpu_topology import topology_rank  # noqa: E402,F401  pylint: disable=g-import-not-at-top

from mesh_tensorflow.core import autograph_exempt as _autograph_exempt  # noqa: E402  pylint: disable=g-import-not-at-top
_autograph_exempt.exempt(globals())  # AutoGraph leaves this module's code alone
