"""Layout-invariant variable initializers.

Every initializer here has a `slice_value(name, full_shape, begin, slice_shape,
dtype)` method, so `mtf.get_variable` asks each processor for its own slice
only: no processor ever builds the full tensor, and the full tensor is the same
under every layout (each element is a hash of the variable name and its index
in the full tensor, see mesh_tensorflow/core/rng.py).

    >>> init = mtf.initializers.VarianceScalingInitializer(2.0, "fan_in")
    >>> w = mtf.get_variable(mesh, "w", [d_model, d_ff],
    ...                      initializer=init.for_dims([d_model], [d_ff]))
    >>> b = mtf.get_variable(mesh, "b", [d_ff],
    ...                      initializer=mtf.initializers.zeros())

The objects can also be called like Keras initializers,
`init(shape, dtype)`, which returns the full tensor.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence, Union

import tensorflow as tf

from mesh_tensorflow.core import rng
from mesh_tensorflow.core.shapes import Dimension, Shape

# Standard deviation of a standard normal truncated to [-2, 2]: dividing by it
# makes a truncated normal have the requested standard deviation.
_TRUNCATED_STDDEV = 0.87962566103423978

_MODES = ("fan_in", "fan_out", "fan_avg")
_DISTRIBUTIONS = ("normal", "untruncated_normal", "truncated_normal", "uniform")

DimsLike = Union[Shape, Sequence[Union[Dimension, int]], int, None]


def _product(dims: DimsLike) -> Optional[int]:
  """Product of the sizes of Dimensions / ints; None stays None."""
  if dims is None:
    return None
  if isinstance(dims, (int, Dimension)):
    dims = [dims]
  total = 1
  for d in dims:
    total *= d.size if isinstance(d, Dimension) else int(d)
  return total


def default_fans(full_shape: Sequence[int]):
  """(fan_in, fan_out) of a weight of `full_shape` when nothing else is known.

  Follows the Keras convention: the last dimension is the output, the one
  before it the input, and any leading dimensions form a receptive field that
  multiplies both.

  Example:
    >>> default_fans([3, 3, 16, 32])   # a 3x3 convolution kernel
    (144, 288)
  """
  shape = [int(s) for s in full_shape]
  if not shape:
    return 1, 1
  if len(shape) == 1:
    return shape[0], shape[0]
  receptive = math.prod(shape[:-2])
  return shape[-2] * receptive, shape[-1] * receptive


class Initializer:
  """Base class: subclasses implement `slice_value`.

  Example:
    >>> class Halves(Initializer):
    ...   def slice_value(self, name, full_shape, begin, slice_shape, dtype):
    ...     return tf.fill(slice_shape, tf.constant(0.5, dtype))
  """

  def slice_value(self, name: str, full_shape: Sequence[int], begin: Sequence,
                  slice_shape: Sequence[int], dtype) -> tf.Tensor:
    """The values of the slice [begin, begin + slice_shape) of the variable
    `name` of `full_shape`; must not depend on how the variable is split.

    Example:
      >>> zeros().slice_value("w", [8, 4], [4, 0], [4, 4], tf.float32).shape
      TensorShape([4, 4])
    """
    raise NotImplementedError

  def __call__(self, shape, dtype=tf.float32, name: str = "initializer", **kwargs):
    """The full tensor (Keras-style call); meant for small tensors and tests."""
    del kwargs
    shape = [int(s) for s in shape]
    return self.slice_value(name, shape, [0] * len(shape), shape, tf.as_dtype(dtype))


class Constant(Initializer):
  """Every element equals `value`.

  Example:
    >>> b = mtf.get_variable(mesh, "b", "hidden:64", initializer=Constant(0.1))
  """

  def __init__(self, value: float = 0.0):
    self.value = value

  def slice_value(self, name, full_shape, begin, slice_shape, dtype):
    return tf.fill(list(slice_shape), tf.constant(self.value, tf.as_dtype(dtype)))

  def __repr__(self):
    return f"Constant({self.value!r})"


def zeros() -> Constant:
  """An initializer of zeros.

  Example:
    >>> b = mtf.get_variable(mesh, "bias", [d_ff], initializer=zeros())
  """
  return Constant(0.0)


def ones() -> Constant:
  """An initializer of ones.

  Example:
    >>> g = mtf.get_variable(mesh, "scale", [d_model], initializer=ones())
  """
  return Constant(1.0)


def constant(value: float) -> Constant:
  """An initializer filling with `value`.

  Example:
    >>> b = mtf.get_variable(mesh, "b", [d_ff], initializer=constant(0.1))
  """
  return Constant(value)


def _seed(name: str, seed) -> int:
  return rng.name_seed(name, "init" if seed is None else f"init/{seed}")


def _key():
  return tf.constant(0, tf.int64)


class RandomNormal(Initializer):
  """Normal values with `mean` and `stddev`.

  Example:
    >>> table = mtf.get_variable(mesh, "emb", [vocab, d_model],
    ...                          initializer=RandomNormal(stddev=1.0))
  """

  def __init__(self, mean: float = 0.0, stddev: float = 1.0, seed=None):
    self.mean, self.stddev, self.seed = mean, stddev, seed

  def slice_value(self, name, full_shape, begin, slice_shape, dtype):
    z = rng.normal(rng.global_index(full_shape, begin, slice_shape),
                   _seed(name, self.seed), _key(), tf.float32)
    return tf.cast(self.mean + self.stddev * z, dtype)


class TruncatedNormal(Initializer):
  """Normal values with `mean` and `stddev`, re-drawn beyond 2 stddevs (the
  result's standard deviation is about 0.88 * stddev, as tf's).

  Example:
    >>> w = mtf.get_variable(mesh, "w", [d_model, d_ff],
    ...                      initializer=TruncatedNormal(stddev=0.02))
  """

  def __init__(self, mean: float = 0.0, stddev: float = 1.0, seed=None):
    self.mean, self.stddev, self.seed = mean, stddev, seed

  def slice_value(self, name, full_shape, begin, slice_shape, dtype):
    z = rng.truncated_normal(rng.global_index(full_shape, begin, slice_shape),
                             _seed(name, self.seed), _key(), tf.float32)
    return tf.cast(self.mean + self.stddev * z, dtype)


class RandomUniform(Initializer):
  """Uniform values in [minval, maxval).

  Example:
    >>> w = mtf.get_variable(mesh, "w", [d_model, d_ff],
    ...                      initializer=RandomUniform(-0.05, 0.05))
  """

  def __init__(self, minval: float = -0.05, maxval: float = 0.05, seed=None):
    self.minval, self.maxval, self.seed = minval, maxval, seed

  def slice_value(self, name, full_shape, begin, slice_shape, dtype):
    u = rng.uniform(rng.global_index(full_shape, begin, slice_shape),
                    _seed(name, self.seed), _key(), tf.float32)
    return tf.cast(self.minval + (self.maxval - self.minval) * u, dtype)


def random_normal(mean: float = 0.0, stddev: float = 1.0, seed=None) -> RandomNormal:
  """A layout-invariant normal initializer.

  Example:
    >>> init = random_normal(stddev=0.02)
  """
  return RandomNormal(mean, stddev, seed)


_TF_RANDOM_NORMAL = tf.compat.v1.random_normal_initializer


def random_normal_or_replaced(stddev: float = 1.0):
  """`random_normal(stddev=stddev)`, unless a caller has replaced
  tf.compat.v1.random_normal_initializer (tests patch it to pin a table's
  values): then that replacement.

  Example:
    >>> init = random_normal_or_replaced(stddev=0.5)
  """
  if tf.compat.v1.random_normal_initializer is not _TF_RANDOM_NORMAL:
    return tf.compat.v1.random_normal_initializer(stddev=stddev)
  return random_normal(stddev=stddev)


def truncated_normal(mean: float = 0.0, stddev: float = 1.0, seed=None) -> TruncatedNormal:
  """A layout-invariant truncated normal initializer.

  Example:
    >>> init = truncated_normal(stddev=0.02)
  """
  return TruncatedNormal(mean, stddev, seed)


def random_uniform(minval: float = -0.05, maxval: float = 0.05, seed=None) -> RandomUniform:
  """A layout-invariant uniform initializer.

  Example:
    >>> init = random_uniform(-0.1, 0.1)
  """
  return RandomUniform(minval, maxval, seed)


class VarianceScalingInitializer(Initializer):
  """Values with variance scale / n, where n depends on the fans and `mode`.

  n is fan_in ("fan_in"), fan_out ("fan_out") or their mean ("fan_avg").
  The fans are the products of the sizes of `fan_in_dims` and `fan_out_dims`
  when given (layers know them: `dense` passes its reduced and new dimensions);
  otherwise they come from the variable's shape by the Keras convention (see
  `default_fans`).

  Distributions: "normal" and "untruncated_normal" draw from a normal with
  stddev sqrt(scale / n); "truncated_normal" draws from a normal truncated at
  two standard deviations and rescaled so the variance is still scale / n;
  "uniform" draws from [-limit, limit) with limit = sqrt(3 * scale / n).
  ("truncated_normal" is the Keras behaviour.)

  Calling it with
  (reduced_dims, new_dims) returns a copy bound to those fans, so it can be
  given to `mtf.layers.dense(kernel_initializer=...)`.

  Args:
    scale: positive scaling factor.
    mode: "fan_in", "fan_out" or "fan_avg".
    distribution: "normal", "untruncated_normal", "truncated_normal" or
      "uniform".
    fan_in_dims: Dimensions (or sizes) whose product is the fan-in.
    fan_out_dims: Dimensions (or sizes) whose product is the fan-out.
    seed: optional extra seed (values also depend on the variable name).

  Example:
    >>> init = VarianceScalingInitializer(2.0, "fan_in", "truncated_normal",
    ...                                   fan_in_dims=[d_model])
    >>> w = mtf.get_variable(mesh, "w", [d_model, d_ff], initializer=init)
  """

  def __init__(self, scale: float = 1.0, mode: str = "fan_in",
               distribution: str = "normal", fan_in_dims: DimsLike = None,
               fan_out_dims: DimsLike = None, seed=None):
    if scale <= 0.0:
      raise ValueError(f"VarianceScalingInitializer: scale must be positive, got {scale}.")
    mode, distribution = mode.lower(), distribution.lower()
    if mode not in _MODES:
      raise ValueError(f"VarianceScalingInitializer: mode {mode!r} is not one of {_MODES}.")
    if distribution not in _DISTRIBUTIONS:
      raise ValueError(f"VarianceScalingInitializer: distribution {distribution!r} is "
                       f"not one of {_DISTRIBUTIONS}.")
    self.scale, self.mode, self.distribution = scale, mode, distribution
    self.fan_in_dims, self.fan_out_dims, self.seed = fan_in_dims, fan_out_dims, seed

  def for_dims(self, fan_in_dims: DimsLike, fan_out_dims: DimsLike):
    """A copy whose fans are the sizes of the given dimensions.

    Example:
      >>> init = glorot_uniform().for_dims([d_model], [heads, d_kv])
    """
    return VarianceScalingInitializer(self.scale, self.mode, self.distribution,
                                      fan_in_dims, fan_out_dims, self.seed)

  def __call__(self, shape_or_reduced_dims, new_dims_or_dtype=tf.float32, **kwargs):
    """`init(reduced_dims, new_dims)` binds the fans (DenseInitializer
    API); `init(shape, dtype)` returns the full tensor (Keras API)."""
    if _is_dim_list(shape_or_reduced_dims) and _is_dim_list(new_dims_or_dtype):
      return self.for_dims(shape_or_reduced_dims, new_dims_or_dtype)
    return super().__call__(shape_or_reduced_dims, new_dims_or_dtype, **kwargs)

  def fans(self, full_shape: Sequence[int]):
    """(fan_in, fan_out) for a variable of `full_shape`.

    Example:
      >>> VarianceScalingInitializer(fan_in_dims=[d_model]).fans([512, 2048])
      (512, 2048)
    """
    fan_in, fan_out = default_fans(full_shape)
    explicit_in, explicit_out = _product(self.fan_in_dims), _product(self.fan_out_dims)
    return (fan_in if explicit_in is None else explicit_in,
            fan_out if explicit_out is None else explicit_out)

  def stddev(self, full_shape: Sequence[int]) -> float:
    """The standard deviation of the values for a variable of `full_shape`.

    Example:
      >>> he_normal().stddev([512, 2048])   # sqrt(2 / 512)
      0.0625
    """
    # Under the unit-scaling convention the layers scale their contractions
    # instead, so fan_in weights have variance `scale` (see layers.unit_scaling).
    from mesh_tensorflow.layers.unit_scaling import unit_scaling_convention  # pylint: disable=g-import-not-at-top
    if unit_scaling_convention():
      if self.mode != "fan_in":
        raise ValueError(f"VarianceScalingInitializer: mode {self.mode!r} does not work with "
                         "the unit-scaling convention (unit_scaling_convention.value = True); "
                         "use mode 'fan_in'.")
      return math.sqrt(self.scale)
    fan_in, fan_out = self.fans(full_shape)
    n = {"fan_in": fan_in, "fan_out": fan_out, "fan_avg": (fan_in + fan_out) / 2.0}[self.mode]
    return math.sqrt(self.scale / max(1.0, float(n)))

  def slice_value(self, name, full_shape, begin, slice_shape, dtype):
    stddev = self.stddev(full_shape)
    index = rng.global_index(full_shape, begin, slice_shape)
    seed = _seed(name, self.seed)
    if self.distribution == "uniform":
      u = rng.uniform(index, seed, _key(), tf.float32)
      value = (2.0 * u - 1.0) * (stddev * math.sqrt(3.0))
    elif self.distribution == "truncated_normal":
      value = rng.truncated_normal(index, seed, _key(), tf.float32) * (
          stddev / _TRUNCATED_STDDEV)
    else:
      value = rng.normal(index, seed, _key(), tf.float32) * stddev
    return tf.cast(value, dtype)

  def __repr__(self):
    return (f"VarianceScalingInitializer(scale={self.scale}, mode={self.mode!r}, "
            f"distribution={self.distribution!r}, fan_in_dims={self.fan_in_dims}, "
            f"fan_out_dims={self.fan_out_dims})")


def _is_dim_list(x) -> bool:
  if isinstance(x, Shape):
    return True
  return isinstance(x, (list, tuple)) and all(isinstance(d, Dimension) for d in x)


def variance_scaling(scale: float = 1.0, mode: str = "fan_in", distribution: str = "normal",
                     fan_in_dims: DimsLike = None, fan_out_dims: DimsLike = None,
                     seed=None) -> VarianceScalingInitializer:
  """A `VarianceScalingInitializer`.

  Example:
    >>> init = variance_scaling(1.0, "fan_avg", "uniform")
  """
  return VarianceScalingInitializer(scale, mode, distribution, fan_in_dims, fan_out_dims, seed)


def glorot_uniform(fan_in_dims: DimsLike = None, fan_out_dims: DimsLike = None,
                   seed=None) -> VarianceScalingInitializer:
  """Uniform in +-sqrt(6 / (fan_in + fan_out)) (Glorot & Bengio, 2010).

  Example:
    >>> w = mtf.get_variable(mesh, "w", [d_model, d_ff], initializer=glorot_uniform())
  """
  return VarianceScalingInitializer(1.0, "fan_avg", "uniform", fan_in_dims, fan_out_dims, seed)


def glorot_normal(fan_in_dims: DimsLike = None, fan_out_dims: DimsLike = None,
                  seed=None) -> VarianceScalingInitializer:
  """Truncated normal with variance 2 / (fan_in + fan_out).

  Example:
    >>> w = mtf.get_variable(mesh, "w", [d_model, d_ff], initializer=glorot_normal())
  """
  return VarianceScalingInitializer(1.0, "fan_avg", "truncated_normal", fan_in_dims,
                                    fan_out_dims, seed)


def he_normal(fan_in_dims: DimsLike = None, seed=None) -> VarianceScalingInitializer:
  """Truncated normal with variance 2 / fan_in (He et al., 2015), for ReLU layers.

  Example:
    >>> w = mtf.get_variable(mesh, "w", [d_model, d_ff], initializer=he_normal())
  """
  return VarianceScalingInitializer(2.0, "fan_in", "truncated_normal", fan_in_dims, None, seed)


def he_uniform(fan_in_dims: DimsLike = None, seed=None) -> VarianceScalingInitializer:
  """Uniform with variance 2 / fan_in.

  Example:
    >>> w = mtf.get_variable(mesh, "w", [d_model, d_ff], initializer=he_uniform())
  """
  return VarianceScalingInitializer(2.0, "fan_in", "uniform", fan_in_dims, None, seed)


def lecun_normal(fan_in_dims: DimsLike = None, seed=None) -> VarianceScalingInitializer:
  """Truncated normal with variance 1 / fan_in (LeCun et al., 1998), for SELU.

  Example:
    >>> w = mtf.get_variable(mesh, "w", [d_model, d_ff], initializer=lecun_normal())
  """
  return VarianceScalingInitializer(1.0, "fan_in", "truncated_normal", fan_in_dims, None, seed)


def lecun_uniform(fan_in_dims: DimsLike = None, seed=None) -> VarianceScalingInitializer:
  """Uniform with variance 1 / fan_in.

  Example:
    >>> w = mtf.get_variable(mesh, "w", [d_model, d_ff], initializer=lecun_uniform())
  """
  return VarianceScalingInitializer(1.0, "fan_in", "uniform", fan_in_dims, None, seed)


class DenseInitializer:
  """Base class of the dense initializers: `dense` calls
  `init(reduced_dims, new_dims)` and uses the initializer it returns.

  Example:
    >>> class ScaledNormal(DenseInitializer):
    ...   def __call__(self, reduced_dims, new_dims):
    ...     return random_normal(stddev=0.5 * _product(reduced_dims) ** -0.5)
    >>> y = mtf.layers.dense(x, d_ff, [d_model], kernel_initializer=ScaledNormal())
  """

  is_dense_initializer = True

  def __call__(self, reduced_dims, new_dims):
    raise NotImplementedError


def bind_fans(initializer, fan_in_dims: DimsLike, fan_out_dims: DimsLike):
  """`initializer` with its fans set, where it supports that; else unchanged.

  Accepts `VarianceScalingInitializer`s and
  DenseInitializer-style callables `init(reduced_dims, new_dims)`.

  Example:
    >>> init = bind_fans(he_normal(), [d_model], [d_ff])
  """
  if isinstance(initializer, VarianceScalingInitializer):
    if initializer.fan_in_dims is None and initializer.fan_out_dims is None:
      return initializer.for_dims(fan_in_dims, fan_out_dims)
    return initializer
  if getattr(initializer, "is_dense_initializer", False) is True:  # not a mock's attribute
    return initializer(list(fan_in_dims), list(fan_out_dims))
  return initializer

from mesh_tensorflow.core import autograph_exempt as _autograph_exempt  # noqa: E402  pylint: disable=g-import-not-at-top
_autograph_exempt.exempt(globals())  # AutoGraph leaves this module's code alone
