"""Core layers over named dimensions: dense, normalization, dropout, embedding,
correlation and activation-gradient clipping.

Part of `mtf.layers` (import them from there). Every layer creates its
variables with `mtf.get_variable` under a scope named after the layer, so the
same code runs under any layout, and layout-invariant initializers make the
variables identical whatever the layout.

    >>> h = mtf.layers.dense(x, d_ff, reduced_dims=[d_model], activation=mtf.relu)
    >>> y = mtf.layers.layer_norm(h, d_ff)
"""

from __future__ import annotations

import contextlib
import functools
import sys
from typing import Callable, List, Optional, Sequence, Tuple, Union

import gin
import tensorflow as tf

from mesh_tensorflow.layers import initializers
from mesh_tensorflow.core.graph import LAYER_SCOPES_KEY, Mesh, Operation, Tensor
from mesh_tensorflow.operations import elementwise as ew
from mesh_tensorflow.operations import random_ops
from mesh_tensorflow.operations import reduction
from mesh_tensorflow.layers.unit_scaling import us_einsum
from mesh_tensorflow.operations.control import custom_gradient
from mesh_tensorflow.operations.einsum_ops import einsum
from mesh_tensorflow.operations.indexing import gather
from mesh_tensorflow.operations.reduction import reduce_mean, reduce_sum
from mesh_tensorflow.operations.shape_ops import rename_dimension
from mesh_tensorflow.operations.variables import VariableDType, assign, get_variable
from mesh_tensorflow.core.shapes import Dimension, Shape, convert_to_dimension, convert_to_shape

DimOrDims = Union[Dimension, Sequence[Dimension], Shape]
Activation = Union[None, str, Callable[[Tensor], Tensor]]


# ---------------------------------------------------------------- scopes
def _scope_prefix(mesh: Mesh) -> str:
  tf_scope = tf.compat.v1.get_variable_scope().name
  stack = mesh.graph._scope_stack  # pylint: disable=protected-access
  return "/".join(p for p in [tf_scope] + stack if p)


def unique_layer_name(mesh: Mesh, name: Optional[str], default_name: str) -> str:
  """The scope name a layer uses: `name` if given, else the first of
  default_name, default_name_1, ... not yet used in the current scope.

  An explicit name is used as is, so layers given the same name share their
  variables (as with tf.compat.v1.AUTO_REUSE).

  Example:
    >>> unique_layer_name(mesh, None, "dense")   # "dense", then "dense_1", ...
    'dense'
  """
  used = mesh.graph.keeps.setdefault(LAYER_SCOPES_KEY, set())
  prefix = _scope_prefix(mesh)

  def full(n):
    return f"{prefix}/{n}" if prefix else n
  if name is None:
    name, i = default_name, 0
    while full(name) in used:
      i += 1
      name = f"{default_name}_{i}"
  used.add(full(name))
  return name


@contextlib.contextmanager
def layer_scope(mesh: Mesh, name: Optional[str], default_name: str):
  """Enters the (unique, see `unique_layer_name`) scope of one layer; mtf op
  and variable names inside are prefixed with it.

  Example:
    >>> with layer_scope(mesh, None, "my_layer"):
    ...   w = mtf.get_variable(mesh, "w", [d_model])   # named "my_layer/w"
  """
  with mesh.graph.name_scope(unique_layer_name(mesh, name, default_name)):
    yield


# ---------------------------------------------------------------- helpers
def check_is_training(is_training, what: str) -> None:
  """Rejects a number given where the `is_training` argument goes.

  The layers take is_training right before dropout; a call written
  for another order (`dense_relu_dense(x, hidden, 0.1)`) would otherwise
  silently train without dropout.
  """
  if isinstance(is_training, (float, int)) and not isinstance(is_training, bool):
    raise TypeError(
        f"{what}: is_training must be a bool (or a boolean tensor), got {is_training!r}. It "
        "comes before dropout; pass the rate as dropout=.")


def _dim_list(dims: Optional[DimOrDims]) -> List[Dimension]:
  if dims is None:
    return []
  if isinstance(dims, Shape):
    return dims.dims
  if isinstance(dims, (Dimension, str)):
    return [convert_to_dimension(dims)]
  return [convert_to_dimension(d) for d in dims]


# Where activation names ("relu", "gelu", "softmax", ...) are looked up.
_ACTIVATION_MODULES = (ew, reduction)


def _resolve_activation(activation: Activation) -> Optional[Callable[[Tensor], Tensor]]:
  if activation is None or activation == "linear":
    return None
  if isinstance(activation, str):
    fn = next((getattr(m, activation) for m in _ACTIVATION_MODULES
               if not activation.startswith("_") and hasattr(m, activation)), None)
    if not callable(fn):
      raise ValueError(f"Unknown activation {activation!r}: give a callable or the "
                       "name of an mtf function such as 'relu' or 'gelu'.")
    return fn
  if not callable(activation):
    raise TypeError(f"activation must be None, a string or a callable, got {activation!r}.")
  return activation


def _variable_dtype(x_dtype, master_dtype, slice_dtype, variable_dtype) -> VariableDType:
  if variable_dtype is not None:
    return variable_dtype
  return VariableDType(master_dtype or tf.float32, slice_dtype or master_dtype or tf.float32,
                       x_dtype)


# ---------------------------------------------------------------- dense
def get_dense_kernel_weights(x: Tensor, new_dims: DimOrDims, reduced_dims: DimOrDims,
                             expert_dims: Optional[DimOrDims] = None,
                             kernel_initializer=None, name: Optional[str] = None,
                             variable_dtype: Optional[VariableDType] = None,
                             master_dtype=tf.float32, slice_dtype=tf.float32) -> Tensor:
  """The kernel of `dense`: a variable over expert_dims + reduced_dims + new_dims.

  The default initializer is `VarianceScalingInitializer()` (normal, variance
  1 / fan_in) with fan_in the product of reduced_dims; a
  `VarianceScalingInitializer` without explicit fans gets reduced_dims and
  new_dims as its fans.

  Example:
    >>> w = get_dense_kernel_weights(x, [d_ff], [d_model], name="wi")
  """
  new_dims, reduced_dims = _dim_list(new_dims), _dim_list(reduced_dims)
  variable_dtype = _variable_dtype(x.dtype, master_dtype, slice_dtype, variable_dtype)
  if kernel_initializer is None:
    kernel_initializer = initializers.VarianceScalingInitializer()
  kernel_initializer = initializers.bind_fans(kernel_initializer, reduced_dims, new_dims)
  with layer_scope(x.mesh, name, "dense"):
    w = get_variable(x.mesh, "kernel", Shape(_dim_list(expert_dims) + reduced_dims + new_dims),
                     initializer=kernel_initializer, dtype=variable_dtype)
  return ew.cast(w, x.dtype)


def dense(x: Tensor, new_dims: Optional[DimOrDims] = None,
          reduced_dims: Optional[DimOrDims] = None,
          expert_dims: Optional[DimOrDims] = None, use_bias: bool = True,
          activation: Activation = None, master_dtype=tf.float32, slice_dtype=tf.float32,
          variable_dtype: Optional[VariableDType] = None, kernel_initializer=None,
          kernel_weights: Optional[Tensor] = None, name: Optional[str] = None,
          output_dim: Optional[Dimension] = None) -> Tensor:
  """Dense layer: activation(einsum(x, kernel) + bias).

  Sums x over `reduced_dims` against a kernel of shape expert_dims +
  reduced_dims + new_dims; the output has x's other dimensions followed by
  new_dims. A reduced dimension that has the name of a new one is renamed
  (to "_" + name) in x first, so `dense(x, d_model, reduced_dims=[d_model])`
  works. Variables: "<name>/kernel" and "<name>/bias" (default name "dense",
  made unique per call; layers given one explicit name share weights).

  Args:
    x: input tensor.
    new_dims: the output dimension(s); `output_dim` (a single one) is
      accepted instead.
    reduced_dims: dimensions of x to sum over; defaults to x's last dimension.
    expert_dims: dimensions of x that index separate weights (experts).
    use_bias: add a bias (initialized to zero) over expert_dims + new_dims.
    activation: None, a function Tensor -> Tensor or the name of an mtf one.
    master_dtype: storage dtype of the variables (if no variable_dtype).
    slice_dtype: slice dtype of the variables (if no variable_dtype).
    variable_dtype: an mtf.VariableDType (overrides the two above).
    name: scope name of the variables.
    kernel_initializer: initializer of the kernel (see
      `get_dense_kernel_weights`).
    kernel_weights: use this tensor as the kernel instead of a new variable.
    output_dim: alias of new_dims for a single dimension.

  Returns:
    a Tensor with x's dimensions minus reduced_dims, plus new_dims.

  Example:
    >>> h = mtf.layers.dense(x, d_ff, reduced_dims=[d_model], activation="relu")
  """
  if new_dims is None and output_dim is None:
    raise ValueError("mtf.layers.dense: give new_dims (or output_dim).")
  if new_dims is not None and output_dim is not None:
    raise ValueError("mtf.layers.dense: give new_dims or output_dim, not both.")
  new_dims = _dim_list(new_dims if new_dims is not None else output_dim)
  reduced_dims = _dim_list(reduced_dims) if reduced_dims is not None else x.shape.dims[-1:]
  expert_dims = _dim_list(expert_dims)
  for d in reduced_dims + expert_dims:
    if d not in x.shape.dims:
      raise ValueError(f"mtf.layers.dense: {x.name} {x.shape} has no dimension {d}.")
  new_names = {d.name for d in new_dims}
  renamed = []
  for d in reduced_dims:
    if d.name in new_names:
      # The kernel needs both; rename the input's copy.
      x = rename_dimension(x, d.name, "_" + d.name)
      d = Dimension("_" + d.name, d.size)
    renamed.append(d)
  reduced_dims = renamed
  kept = [d for d in x.shape.dims if d not in reduced_dims]
  clash = [d.name for d in kept if d.name in new_names]
  if clash:
    raise ValueError(f"mtf.layers.dense: new dimension(s) {clash} are already in "
                     f"{x.name} {x.shape} and are not reduced.")
  variable_dtype = _variable_dtype(x.dtype, master_dtype, slice_dtype, variable_dtype)
  name = unique_layer_name(x.mesh, name, "dense")
  if kernel_weights is None:
    # Looked up on mtf.layers at call time, so that a replaced
    # mtf.layers.get_dense_kernel_weights (ported tests patch it) takes effect.
    kernel_weights_fn = getattr(sys.modules.get(__package__), "get_dense_kernel_weights",
                                get_dense_kernel_weights)
    kernel_weights = kernel_weights_fn(
        x, new_dims, reduced_dims, expert_dims, kernel_initializer, name, variable_dtype)
  with x.mesh.graph.name_scope(name):
    y = us_einsum([x, kernel_weights], output_shape=Shape(kept + new_dims))
    if use_bias:
      b = get_variable(x.mesh, "bias", Shape(expert_dims + new_dims),
                       initializer=initializers.zeros(), dtype=variable_dtype)
      y = y + b
    fn = _resolve_activation(activation)
    return fn(y) if fn is not None else y


def dense_product(x: Tensor, reduced_dims: DimOrDims, new_dims: DimOrDims,
                  activation_functions=None, name: Optional[str] = None,
                  **kwargs) -> Tensor:
  """Elementwise product of dense layers, one per activation function.

  With activation_functions=["linear", "sigmoid"] this is a gated linear
  unit; ["gelu", "linear"] gives GEGLU. Variables, as Mesh TensorFlow 0.1.21
  names them (its checkpoints load): "<name>_<i>/kernel" for factor i, or
  "<name>/kernel" with one activation (default name "dense_product",
  "dense_product_1", ... when none is given).

  Args:
    x: input tensor.
    reduced_dims: dimensions of x to sum over.
    new_dims: output dimension(s).
    activation_functions: a list of (or one) activation: a callable, the name
      of an mtf function, or None / "linear" for none.
    name: scope name.
    **kwargs: passed to `dense` (use_bias, variable_dtype, ...).

  Example:
    >>> h = dense_product(x, [d_model], [d_ff], ["gelu", "linear"])
  """
  if not isinstance(activation_functions, (list, tuple)):
    activation_functions = [activation_functions]
  name = unique_layer_name(x.mesh, name, "dense_product")
  several = len(activation_functions) > 1
  factors = [dense(x, new_dims, reduced_dims=reduced_dims, activation=a,
                   name=f"{name}_{i}" if several else name, **kwargs)
             for i, a in enumerate(activation_functions)]
  return functools.reduce(ew.multiply, factors)


def dense_relu_dense(x: Tensor, hidden_channels: Dimension, is_training: bool = True,
                     dropout: float = 0.0, dropout_broadcast_dims: Optional[DimOrDims] = None,
                     master_dtype=tf.float32, slice_dtype=tf.float32,
                     name: Optional[str] = None) -> Tensor:
  """The transformer feed-forward block: dense (ReLU), dropout, dense.

  The output has x's shape; x's last dimension is the io dimension. No
  biases. Variables "<name>/wi/kernel" [io, hidden] and "<name>/wo/kernel"
  [hidden, io] (default name "dense_relu_dense").

  Args:
    x: input tensor; its last dimension is the io dimension.
    hidden_channels: the hidden dimension.
    is_training: dropout is applied only when true (the third argument).
    dropout: dropout rate on the hidden activations.
    dropout_broadcast_dims: dimensions along which the dropout mask is shared.
    master_dtype: variable storage dtype.
    slice_dtype: variable slice dtype.
    name: scope name.

  Example:
    >>> y = dense_relu_dense(x, mtf.Dimension("d_ff", 2048), dropout=0.1)
  """
  check_is_training(is_training, "mtf.layers.dense_relu_dense")
  io_channels = x.shape.dims[-1]
  with layer_scope(x.mesh, name, "dense_relu_dense"):
    h = dense(x, hidden_channels, reduced_dims=[io_channels], use_bias=False,
              activation=ew.relu, master_dtype=master_dtype, slice_dtype=slice_dtype,
              name="wi")
    if dropout:
      h = random_ops.dropout(h, is_training, rate=dropout,
                             noise_shape=h.shape - _dim_list(dropout_broadcast_dims))
    return dense(h, io_channels, reduced_dims=[hidden_channels], use_bias=False,
                 master_dtype=master_dtype, slice_dtype=slice_dtype, name="wo")


# ---------------------------------------------------------------- normalization
def _norm_variable(x: Tensor, name: str, shape, initializer, trainable: bool = True) -> Tensor:
  return get_variable(x.mesh, name, shape, initializer=initializer, trainable=trainable,
                      dtype=VariableDType(tf.float32, tf.float32, x.dtype))


def scale_normalized(x: Tensor, inverse_norm: Tensor, scale: Tensor) -> Tensor:
  """x * inverse_norm * scale, the last step of a norm, differentiated without
  keeping the full-size product x * inverse_norm for the backward pass.

  Autodiff of `x * inverse_norm * scale` keeps x (the mean square's gradient
  reads it anyway), the output's reader's input, and also x * inverse_norm
  for the scale's gradient: one more activation of x's size per norm. Here
  the gradient makes that product again from x and inverse_norm (one
  elementwise kernel), as fused norm kernels do; the gradients are the
  same operations in the same order, so the same numbers.

  Args:
    x: the (centered) input, e.g. [batch, length, d_model].
    inverse_norm: 1 / its norm, x's shape less the normalized dimensions.
    scale: the learned scale, over the normalized dimensions (or a scalar).

  Example:
    >>> r = mtf.rsqrt(mtf.reduce_mean(mtf.square(x), reduced_dim=d_model) + 1e-6)
    >>> y = mtf.layers.scale_normalized(x, r, scale)
  """
  def forward(x, inverse_norm, scale):
    return x * inverse_norm * scale

  def grad_fn(inputs, captured, outputs, output_grads):
    del captured, outputs
    x, inverse_norm, scale = inputs
    g = output_grads[0]
    if g is None:
      return [None, None, None]
    normalized = x * inverse_norm
    g_normalized = ew.reduce_to_shape(g * scale, normalized.shape)
    return [ew.reduce_to_shape(g_normalized * inverse_norm, x.shape),
            ew.reduce_to_shape(g_normalized * x, inverse_norm.shape),
            ew.reduce_to_shape(g * normalized, scale.shape)]
  return custom_gradient(forward, grad_fn, [x, inverse_norm, scale], name="scale_normalized")


def layer_norm(x: Tensor, dim: DimOrDims, epsilon: float = 1e-6,
               name: Optional[str] = None) -> Tensor:
  """Layer normalization over `dim` (one dimension or several), with a learned
  scale (ones) and bias (zeros) over those dimensions.

  Variables "<name>/layer_norm/layer_norm_scale" and ".../layer_norm_bias"
  (default name "layer_prepostprocess"). A split `dim` costs
  two small allreduces (mean and variance).

  Example:
    >>> y = mtf.layers.layer_norm(x, d_model)
  """
  dims = _dim_list(dim)
  with layer_scope(x.mesh, name, "layer_prepostprocess"), x.mesh.graph.name_scope("layer_norm"):
    scale = _norm_variable(x, "layer_norm_scale", Shape(dims), initializers.ones())
    bias = _norm_variable(x, "layer_norm_bias", Shape(dims), initializers.zeros())
    reduced_shape = x.shape - dims
    mean = reduce_mean(x, output_shape=reduced_shape)
    centered = x - mean
    variance = reduce_mean(ew.square(centered), output_shape=reduced_shape)
    return scale_normalized(centered, ew.rsqrt(variance + epsilon), scale) + bias


def rms_norm(x: Tensor, dim: DimOrDims, epsilon: float = 1e-6,
             name: Optional[str] = None) -> Tensor:
  """Root-mean-square normalization over `dim` with a learned scale (ones):
  x / sqrt(mean(x^2) + epsilon) * scale. Variable "<name>/scale" (default name
  "rms_norm").

  Example:
    >>> y = mtf.layers.rms_norm(x, d_model)
  """
  dims = _dim_list(dim)
  with layer_scope(x.mesh, name, "rms_norm"):
    scale = _norm_variable(x, "scale", Shape(dims), initializers.ones())
    mean_square = reduce_mean(ew.square(x), output_shape=x.shape - dims)
    return scale_normalized(x, ew.rsqrt(mean_square + epsilon), scale)


def batch_norm(x: Tensor, is_training: bool, momentum: float = 0.99, epsilon: float = 1e-9,
               dims_idx_start: int = 0, dims_idx_end: int = -1, init_zero: bool = False,
               name: Optional[str] = None) -> Tuple[Tensor, List[Operation]]:
  """Batch normalization over x.shape.dims[dims_idx_start:dims_idx_end].

  In training, normalizes with the batch statistics and returns ops that
  update the moving averages (run them with the train step:
  `lowering.lowered_operation(op)`); otherwise normalizes with the moving
  averages and returns no ops. Scale (ones, or zeros with init_zero) and bias
  (zeros) have the remaining dimensions, as do the non-trainable
  "bn_moving_mean" (zeros) and "bn_moving_variance" (ones). `epsilon`
  defaults to 1e-9.

  Returns:
    (normalized x, list of update operations).

  Example:
    >>> y, updates = mtf.layers.batch_norm(x, True, dims_idx_start=0,
    ...                                    dims_idx_end=3)   # NHWC: over N, H, W
  """
  norm_dims = x.shape.dims[dims_idx_start:dims_idx_end]
  if not norm_dims:
    raise ValueError(f"mtf.layers.batch_norm: no dimensions of {x.name} {x.shape} in "
                     f"[{dims_idx_start}:{dims_idx_end}] to normalize over.")
  kept = x.shape - norm_dims
  with layer_scope(x.mesh, name, "batch_norm"):
    scale = _norm_variable(x, "batch_norm_scale", kept,
                           initializers.zeros() if init_zero else initializers.ones())
    bias = _norm_variable(x, "batch_norm_bias", kept, initializers.zeros())
    moving_mean = _norm_variable(x, "bn_moving_mean", kept, initializers.zeros(), trainable=False)
    moving_variance = _norm_variable(x, "bn_moving_variance", kept, initializers.ones(),
                                     trainable=False)
    updates = []
    if is_training:
      mean = reduce_mean(x, output_shape=kept)
      centered = x - mean
      variance = reduce_mean(ew.square(centered), output_shape=kept)
      inverse_norm = ew.rsqrt(variance + epsilon)
      updates.append(assign(moving_mean, moving_mean * momentum + mean * (1.0 - momentum),
                            name="moving_mean_update"))
      updates.append(assign(moving_variance,
                            moving_variance * momentum + variance * (1.0 - momentum),
                            name="moving_variance_update"))
    else:
      centered = x - moving_mean
      inverse_norm = ew.rsqrt(moving_variance + epsilon)
    return scale_normalized(centered, inverse_norm, scale) + bias, updates


def dropout(x: Tensor, is_training: bool = True, keep_prob: Optional[float] = None,
            rate: Optional[float] = None, noise_shape=None, name: Optional[str] = None) -> Tensor:
  """Dropout (see `mtf.dropout`): identical under every layout; a no-op when
  not training or when the rate is zero.

  Example:
    >>> h = mtf.layers.dropout(h, is_training, rate=0.1)
  """
  return random_ops.dropout(x, is_training, keep_prob=keep_prob, rate=rate,
                            noise_shape=noise_shape, name=name)


# ---------------------------------------------------------------- embedding
def embedding_weights(mesh: Mesh, vocab_dim: Dimension, output_dim: Dimension,
                      variable_dtype: Optional[VariableDType] = None, name: str = "embedding",
                      ensemble_dim: Optional[DimOrDims] = None, initializer=None) -> Tensor:
  """The embedding table: a variable named `name` over ensemble_dim + [vocab_dim,
  output_dim], by default standard normal (layout-invariant).

  Calls with the same name share the table (default name "embedding").

  Example:
    >>> table = embedding_weights(mesh, vocab, d_model, mtf.VariableDType())
  """
  shape = Shape(_dim_list(ensemble_dim) + [vocab_dim, output_dim])
  return get_variable(mesh, name, shape, dtype=variable_dtype or VariableDType(tf.float32),
                      initializer=initializer or initializers.random_normal_or_replaced(stddev=1.0))


def embedding(indices: Tensor, vocab_dim: Dimension, output_dim: Dimension,
              variable_dtype: Optional[VariableDType] = None, name: str = "embedding") -> Tensor:
  """Looks up `indices` (integers in [0, vocab_dim.size)) in an embedding table.

  Returns a tensor with indices' dimensions plus output_dim. With vocab_dim
  split, each processor looks up the rows it holds and one allreduce combines
  them.

  Example:
    >>> x = mtf.layers.embedding(ids, vocab, d_model, mtf.VariableDType())
  """
  weights = embedding_weights(indices.mesh, vocab_dim, output_dim, variable_dtype, name)
  return gather(weights, indices, vocab_dim)


def multiplicative_jitter(x: Tensor, epsilon: float = 1e-2) -> Tensor:
  """x times noise uniform in [1 - epsilon, 1 + epsilon) (the same under every
  layout); makes a model less sensitive to bfloat16 rounding. epsilon 0: x.

  Example:
    >>> h = mtf.layers.multiplicative_jitter(h, epsilon=1e-2)
  """
  if epsilon == 0:
    return x
  noise = random_ops.random_uniform(x.mesh, x.shape, minval=1.0 - epsilon,
                                    maxval=1.0 + epsilon, dtype=x.dtype)
  return x * noise


def compress_mean(x: Tensor, dim: Dimension, compression_factor: int) -> Tensor:
  """Means of consecutive groups of `compression_factor` entries along `dim`:
  `dim` shrinks to dim.size // compression_factor.

  Example:
    >>> pooled = mtf.layers.compress_mean(x, length_dim, 4)   # length 128 -> 32
  """
  dim = x.shape.get_dim_by_name(dim if isinstance(dim, str) else dim.name)
  if compression_factor <= 0 or dim.size % compression_factor:
    raise ValueError(
        f"compress_mean: compression_factor {compression_factor} must divide dimension "
        f"{dim.name!r} (size {dim.size}) of {x.name}.")
  from mesh_tensorflow.operations.shape_ops import reshape
  compressed = Dimension(dim.name, dim.size // compression_factor)
  group = Dimension("_compression", compression_factor)
  dims = x.shape.dims
  i = x.shape.index_of(dim.name)
  grouped = reshape(x, Shape(dims[:i] + [compressed, group] + dims[i + 1:]))
  return reduce_mean(grouped, reduced_dim=group)


# ---------------------------------------------------------------- statistics, gradients
def corr(x: Tensor, dim: Dimension, epsilon: float = 1e-20,
         name: str = "pearson_correlation") -> Tensor:
  """Pearson correlation matrix between the entries of `dim`, x's other
  dimensions being the samples (tfp.stats.correlation with `dim` as events).

  Entry [i, j] is sum(ci * cj) / ((|ci| + epsilon) * (|cj| + epsilon)), where
  ci is entry i of x minus its mean over the samples.

  Args:
    x: a float Tensor with `dim` and at least one other (sample) dimension.
    dim: the Dimension (or its name) whose entries are correlated.
    epsilon: added to each norm, so constant entries give 0, not NaN.
    name: name scope of the operations.

  Returns:
    a [dim_1, dim_2] Tensor: `dim` renamed "<dim>_1" and "<dim>_2".

  Example:
    >>> c = mtf.layers.corr(x, channels)   # x [batch, channels]: [channels_1, channels_2]
  """
  if not isinstance(x, Tensor):
    raise TypeError(f"corr: expected an mtf.Tensor, got {x!r}.")
  dim_name = dim if isinstance(dim, str) else convert_to_dimension(dim).name
  if dim_name not in x.shape.dimension_names:
    raise ValueError(f"corr: {x.name} {x.shape} has no dimension {dim_name!r}.")
  dim = x.shape.get_dim_by_name(dim_name)
  if not x.dtype.is_floating:
    raise TypeError(f"corr: {x.name} has dtype {x.dtype.name}; cast it to a float first.")
  if x.shape.ndims < 2:
    raise ValueError(f"corr: {x.name} {x.shape} has no sample dimension besides {dim.name!r}.")
  first, second = dim.name + "_1", dim.name + "_2"
  for n in (first, second):
    if n in x.shape.dimension_names:
      raise ValueError(f"corr: {x.name} {x.shape} already has a dimension {n!r}, the "
                       "name of an output dimension.")
  with x.mesh.graph.name_scope(name):
    centered = x - reduce_mean(x, output_shape=[dim])
    norm = ew.sqrt(reduce_sum(ew.square(centered), output_shape=[dim])) + epsilon
    c1 = rename_dimension(centered, dim.name, first)
    c2 = rename_dimension(centered, dim.name, second)
    covariance = einsum([c1, c2], output_shape=[c1.shape.get_dim_by_name(first),
                                                c2.shape.get_dim_by_name(second)])
    return covariance / (rename_dimension(norm, dim.name, first)
                         * rename_dimension(norm, dim.name, second))


@gin.configurable
def clip_activation_gradient(x: Tensor, clip_rms_norm: Optional[float] = None) -> Tensor:
  """x unchanged, whose gradient is clipped by root mean square: the gradient
  g reaching x becomes g / max(1, rms(g) / clip_rms_norm), rms over all of
  g's entries (gin-configurable: `clip_rms_norm`).

  Args:
    x: an mtf Tensor (an activation).
    clip_rms_norm: the largest rms the gradient keeps; None or 0: no clipping.

  Returns:
    x, through an identity whose gradient is clipped.

  Example:
    >>> h = mtf.layers.clip_activation_gradient(h, clip_rms_norm=1.0)
  """
  if not isinstance(x, Tensor):
    raise TypeError(f"clip_activation_gradient: expected an mtf.Tensor, got {x!r}.")
  if not clip_rms_norm:
    return x
  if clip_rms_norm < 0:
    raise ValueError(f"clip_activation_gradient: clip_rms_norm must be positive, got "
                     f"{clip_rms_norm}.")

  def grad_fn(inputs, captured, outputs, output_grads):
    del inputs, captured, outputs
    g = output_grads[0]
    if g is None:
      return [None]
    rms = ew.sqrt(reduce_mean(ew.square(ew.cast(g, tf.float32))))
    denominator = ew.maximum(rms * (1.0 / clip_rms_norm), 1.0)
    return [g / ew.cast(denominator, g.dtype)]
  return custom_gradient(ew.identity, grad_fn, [x], name="clip_activation_gradient")


def annealed_dropout(x: Tensor, is_training: bool, start_step, end_step,
                     init_rate: Optional[float] = None, noise_shape=None, name=None,
                     step: Optional[Tensor] = None) -> Tensor:
  """Dropout whose rate falls linearly from `init_rate` at `start_step` to 0
  at `end_step` (replaces the original's `annealed_dropout`).

  The step is the optimizer's step counter (`mtf.optimize.step_counter`, the
  number of updates applied), or `step` (a scalar mtf Tensor) where given.
  Steps before `start_step` use `init_rate`.

  Args:
    x: an mtf Tensor.
    is_training: dropout only when True.
    start_step: the step annealing starts at.
    end_step: the step from which no dropout is applied.
    init_rate: the dropout rate up to start_step; None or 0: no dropout.
    noise_shape: an optional Shape (a subset of x's) sharing the mask.
    name: an optional name.
    step: an optional scalar mtf Tensor to use instead of the step counter.

  Returns:
    x with dropout applied.

  Example:
    >>> h = mtf.layers.annealed_dropout(h, True, 1000, 5000, init_rate=0.1)
  """
  if not is_training or not init_rate:
    return x
  if not 0.0 < init_rate < 1.0:
    raise ValueError(f"annealed_dropout of {x.name}: init_rate must be in [0, 1), got "
                     f"{init_rate}.")
  if end_step <= start_step:
    raise ValueError(f"annealed_dropout of {x.name}: end_step ({end_step}) must be after "
                     f"start_step ({start_step}).")
  if step is None:
    from mesh_tensorflow.training.optimize import step_counter  # pylint: disable=import-outside-toplevel
    step = step_counter(x.mesh)
  step = ew.cast(step, tf.float32)
  fraction = ew.maximum((step - float(start_step)) * (1.0 / float(end_step - start_step)), 0.0)
  keep_prob = ew.minimum((1.0 - init_rate) + fraction * init_rate, 1.0)
  noise_shape = x.shape if noise_shape is None else convert_to_shape(noise_shape)
  u = random_ops.random_uniform(x.mesh, noise_shape, dtype=tf.float32,
                                name=name or "annealed_dropout")
  keep = ew.cast(ew.less(u, keep_prob), tf.float32) / keep_prob
  return x * ew.cast(keep, x.dtype)


def summary_for_clip_activation_gradient(t: Tensor, name: Optional[str] = None,
                                         batch_dims=None) -> None:
  """Records scalar summaries of an activation (the companion of
  `clip_activation_gradient`): its mean ("mean/") and maximum ("max/"), and,
  with `batch_dims`, the mean, maximum and variance over the batch of the
  per-example root mean square ("rms_mean/<name>", "rms_max/<name>",
  "rms_var/<name>"). The Trainer writes them to TensorBoard.

  Example:
    >>> mtf.layers.summary_for_clip_activation_gradient(h, "block_0", h.shape[:-1])
  """
  from mesh_tensorflow.operations.reduction import reduce_max  # pylint: disable=import-outside-toplevel
  from mesh_tensorflow.training.trainer import scalar_summary  # pylint: disable=import-outside-toplevel
  if not isinstance(t, Tensor):
    raise TypeError(f"summary_for_clip_activation_gradient: expected an mtf.Tensor, got {t!r}.")
  t32 = ew.cast(t, tf.float32)
  scalar_summary("mean/", reduce_mean(t32))
  scalar_summary("max/", reduce_max(t32))
  if batch_dims:
    rms = ew.sqrt(reduce_mean(ew.square(t32), output_shape=convert_to_shape(batch_dims)))
    mean_rms = reduce_mean(rms)
    scalar_summary(f"rms_mean/{name}", mean_rms)
    scalar_summary(f"rms_max/{name}", reduce_max(rms))
    scalar_summary(f"rms_var/{name}", reduce_mean(ew.square(rms - mean_rms)))

from mesh_tensorflow.core import autograph_exempt as _autograph_exempt  # noqa: E402  pylint: disable=g-import-not-at-top
_autograph_exempt.exempt(globals())  # AutoGraph leaves this module's code alone
