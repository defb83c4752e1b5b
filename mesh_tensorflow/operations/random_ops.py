"""Layout-invariant random ops: random_uniform, random_normal, dropout.

The full random tensor is the same under every layout and mesh (see
mesh_tensorflow/core/rng.py); a new sample is drawn each time the lowered program
runs.

    >>> h = mtf.dropout(h, is_training=True, rate=0.1)
"""

from __future__ import annotations

import contextlib
from typing import Sequence

import tensorflow as tf

from mesh_tensorflow.core import rng
from mesh_tensorflow.core.graph import Operation, Tensor
from mesh_tensorflow.operations import elementwise as ew
from mesh_tensorflow.core.shapes import convert_to_shape


_DEFAULT_PARAMS = {"uniform": {"minval": 0.0, "maxval": 1.0},
                   "normal": {"mean": 0.0, "stddev": 1.0}}
_KEYED_ROWS = "random_ops.keyed_rows"  # Graph.keeps: the active keyed_rows scope
_KEYED_OPS = "random_ops.keyed_ops"    # Graph.keeps: op name -> (seed, (axis, keys) or None)


@contextlib.contextmanager
def keyed_rows(graph, dim, keys: Sequence[int]):
  """Random operations made inside draw row i along `dim` from key
  `keys[i]`, not from i, and take their seeds from their order in the scope
  (the first made gets seed 0, the next 1, ...), not from their names.

  A pipeline calls a stage function once per slot for several micro-batches
  (row s of [stages, ...] tensors is stage s's), and calls it again to
  recompute a micro-batch's forward pass for its backward pass: with the
  micro-batch and layer chunk as each row's key, both calls draw the same
  dropout masks, under every schedule. Operations that `mtf.recompute_grad`
  makes again for the backward pass carry their forward names and get the
  same numbers as well.

  Example:
    >>> with keyed_rows(mesh.graph, stages_dim, [m * num_stages + s for s in ...]):
    ...   h = stage_fn(h)
  """
  with graph.keeping(_KEYED_ROWS, [dim, tuple(int(k) for k in keys), 0]):
    yield


def _keyed_seed(graph, name: str, shape):
  """(seed, row keys) for a random operation named `name`: from the active
  keyed_rows scope, or as registered under the same name (a recomputation);
  None outside both."""
  registered = graph.keeps.setdefault(_KEYED_OPS, {})
  if name in registered:
    return registered[name]
  scope = graph.keeps.get(_KEYED_ROWS)
  if scope is None:
    return None
  dim, keys, count = scope
  scope[2] += 1
  axis = shape.dims.index(dim) if dim in shape.dims else None
  registered[name] = (rng.name_seed(f"keyed_rows/{count}"),
                      None if axis is None else (axis, keys))
  return registered[name]


class RandomOperation(Operation):
  """Samples a tensor of `shape` from `distribution` ('uniform' or 'normal').

  `distribution` may also be a TensorFlow function with its keywords
  (`RandomOperation(mesh, shape, tf.random.uniform, minval=..., maxval=...,
  dtype=...)`): it names the distribution, and the samples are this
  library's layout-invariant ones.
  """

  def __init__(self, mesh, shape, distribution, params=None, dtype=tf.float32, seed=None,
               name=None, **kwargs):
    if callable(distribution):
      fn_name = getattr(distribution, "__name__", "")
      distribution = {"random_uniform": "uniform", "uniform": "uniform",
                      "random_normal": "normal", "normal": "normal"}.get(fn_name)
      if distribution is None:
        raise ValueError(
            f"RandomOperation: cannot sample from {fn_name or 'this function'} under a "
            "layout; use tf.random.uniform or tf.random.normal (or mtf.random_uniform "
            "/ mtf.random_normal).")
    if distribution not in _DEFAULT_PARAMS:
      raise ValueError(f"Unknown distribution {distribution!r}; use 'uniform' or 'normal'.")
    if params is None:
      params = {k: kwargs.pop(k, v) for k, v in _DEFAULT_PARAMS[distribution].items()}
    dtype = kwargs.pop("dtype", dtype)
    seed = kwargs.pop("seed", seed)
    if kwargs:
      raise TypeError(f"RandomOperation: unexpected arguments {sorted(kwargs)}.")
    super().__init__([], mesh=mesh, name=name or f"random_{distribution}")
    self._distribution, self._params = distribution, params
    shape = convert_to_shape(shape)
    self._seed, self._row_keys = rng.name_seed(self.name, seed), None
    keyed = _keyed_seed(mesh.graph, self.name, shape) if seed is None else None
    if keyed is not None:
      self._seed, self._row_keys = keyed
    self._outputs = [Tensor(self, shape, dtype)]

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    out = self.outputs[0]
    lowering.set_tensor_lowering(out, impl.random(
        out.shape, self._distribution, self._seed, lowering.random_key(impl), out.dtype,
        row_keys=self._row_keys, **self._params))


def random_uniform(mesh, shape, minval=0.0, maxval=1.0, dtype=tf.float32, seed=None,
                   name=None, **kwargs) -> Tensor:
  """Uniform samples in [minval, maxval); identical under every layout."""
  return RandomOperation(mesh, shape, "uniform", {"minval": minval, "maxval": maxval},
                         dtype, seed=seed, name=name).outputs[0]


def random_normal(mesh, shape, mean=0.0, stddev=1.0, dtype=tf.float32, seed=None,
                  name=None, **kwargs) -> Tensor:
  """Normal samples; identical under every layout."""
  return RandomOperation(mesh, shape, "normal", {"mean": mean, "stddev": stddev},
                         dtype, seed=seed, name=name).outputs[0]


def dropout(x: Tensor, is_training: bool = True, keep_prob=None, rate=None,
            noise_shape=None, name=None) -> Tensor:
  """Zeros elements with probability `rate` (= 1 - keep_prob), scales the rest.

  `dropout(x, keep_prob, noise_shape=None)` works too: a second argument that
  is not a bool is keep_prob.

  Example:
    >>> h = mtf.dropout(h, is_training, rate=0.1)
  """
  if not isinstance(is_training, bool):
    # dropout(x, keep_prob, ...).
    if keep_prob is None and rate is None:
      keep_prob, is_training = is_training, True
    else:
      is_training = bool(is_training)
  if rate is None:
    rate = 0.0 if keep_prob is None else 1.0 - keep_prob
  if not 0.0 <= rate < 1.0:
    raise ValueError(f"mtf.dropout of {x.name}: rate must be in [0, 1), got {rate}.")
  if not is_training or rate == 0.0:
    return x
  noise_shape = x.shape if noise_shape is None else convert_to_shape(noise_shape)
  u = random_uniform(x.mesh, noise_shape, dtype=tf.float32, name=name or "dropout")
  return _masked(x, ew.greater_equal(u, rate), 1.0 / (1.0 - rate))


def _masked(x: Tensor, mask: Tensor, scale: float) -> Tensor:
  """x * scale where the boolean `mask` holds, else 0. Its gradient is the
  same operation on the incoming gradient, so the backward pass keeps the
  one-byte mask rather than a mask in x's dtype (or x)."""
  def apply(x_slice, mask_slice):
    return x_slice * tf.cast(mask_slice, x_slice.dtype) * tf.constant(scale, x_slice.dtype)

  def grad_x(op, dy):
    return ew.reduce_to_shape(_masked(dy, op.inputs[1], scale), op.inputs[0].shape)
  return ew.ElementwiseOperation(apply, [x, mask], output_dtype=x.dtype,
                                 input_grads=[grad_x, None], name="dropout_mask").outputs[0]

from mesh_tensorflow.core import autograph_exempt as _autograph_exempt  # noqa: E402  pylint: disable=g-import-not-at-top
_autograph_exempt.exempt(globals())  # AutoGraph leaves this module's code alone
