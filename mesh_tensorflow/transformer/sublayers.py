"""Sublayer functions: the steps a `LayerStack` runs around its layers when
it is given `sublayers_initial`, `sublayers_per_layer` or `sublayers_final`.

A sublayer is called as `s(x, layer_stack, context)` and returns a tensor of
x's shape. Its other arguments are keywords with defaults, bound in gin
(`transformer.sublayer_dropout.dropout_rate = 0.1`) or with
`functools.partial`. While a layer's sublayers run, `context.current_layer`
is that layer and `context.current_layer_input` its input (what
`sublayer_residual` adds back), and variables go under the layer's slot
scope ("block_%03d/layer_%03d", see `LayerStack.layer_scope`); the initial
and final sublayers create theirs at the stack's own scope.

The default lists, which `LayerStack` uses for any list it is not given:

    >>> stack = LayerStack(
    ...     [SelfAttention(), DenseReluDense()],
    ...     sublayers_initial=[sublayer_dropout],
    ...     sublayers_per_layer=[sublayer_rms_norm, sublayer_call_layer,
    ...                          sublayer_dropout, sublayer_residual],
    ...     sublayers_final=[sublayer_rms_norm, sublayer_dropout])

Import them from `transformer` (which re-exports them) or from here.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Tuple

import tensorflow as tf

import mesh_tensorflow as mtf

# s(x, layer_stack, context) -> a tensor of x's shape.
Sublayer = Callable[[mtf.Tensor, Any, Any], mtf.Tensor]


def _current(context, attribute: str, sublayer: str):
  value = getattr(context, attribute, None)
  if value is None:
    raise ValueError(f"{sublayer}: context.{attribute} is not set; this sublayer runs only "
                     "inside a layer, so put it in LayerStack's sublayers_per_layer (not "
                     "sublayers_initial or sublayers_final).")
  return value


def _scale(context, name: str, shape) -> mtf.Tensor:
  return mtf.get_variable(context.mesh, name, mtf.Shape(shape),
                          initializer=mtf.initializers.ones(), dtype=context.variable_dtype)


def sublayer_call_layer(x: mtf.Tensor, layer_stack, context) -> mtf.Tensor:
  """Calls the current layer on x (padding zeroed first), in the layer's
  scope (its `scope_name`, by default its class name).

  Example:
    >>> y = sublayer_call_layer(x, stack, context)   # inside sublayers_per_layer
  """
  x = sublayer_mask_padding(x, layer_stack, context)
  layer = _current(context, "current_layer", "sublayer_call_layer")
  with mtf.name_scope(context.mesh, getattr(layer, "scope_name", type(layer).__name__)):
    return layer.call(context, x)


def sublayer_mask_padding(x: mtf.Tensor, layer_stack, context) -> mtf.Tensor:
  """x with padding positions (sequence_id 0) zeroed; x itself when the
  context has no segment ids.

  Example:
    >>> y = sublayer_mask_padding(x, stack, context)
  """
  del layer_stack
  mask = context.nonpadding
  return x if mask is None else x * mask


def sublayer_rms_norm(x: mtf.Tensor, layer_stack, context, epsilon: float = 1e-6,
                      name: str = "rms_norm") -> mtf.Tensor:
  """RMS normalization over d_model with a learned scale (variable
  "<name>/scale", ones): x / sqrt(mean(x^2) + epsilon) * scale.

  Example:
    >>> y = sublayer_rms_norm(x, stack, context, name="pre_norm")
  """
  del layer_stack
  return _rms_normalized(x, context, epsilon, name, scale_over_d_model=True)


def _rms_normalized(x: mtf.Tensor, context, epsilon: float, name: str,
                    scale_over_d_model: bool) -> mtf.Tensor:
  """x / sqrt(mean over d_model of x^2 + epsilon) times the learned
  "<name>/scale": one per d_model channel, or one scalar."""
  d_model = context.model.model_dim
  with mtf.name_scope(context.mesh, name):
    scale = _scale(context, "scale", [d_model] if scale_over_d_model else [])
    variance = mtf.reduce_mean(mtf.square(x), reduced_dim=d_model)
    return mtf.layers.scale_normalized(x, mtf.rsqrt(variance + epsilon), scale)


def sublayer_legacy_rms_norm(x: mtf.Tensor, layer_stack, context) -> mtf.Tensor:
  """`sublayer_rms_norm` named "layer_norm", with the stack's norm_epsilon:
  the variables of the stack's built-in body (and of old checkpoints).

  Example:
    >>> y = sublayer_legacy_rms_norm(x, stack, context)
  """
  return sublayer_rms_norm(x, layer_stack, context, epsilon=layer_stack.norm_epsilon,
                           name="layer_norm")


def sublayer_legacy_final_rms_norm(x: mtf.Tensor, layer_stack, context) -> mtf.Tensor:
  """`sublayer_legacy_rms_norm` for the end of the stack ("final_layer_norm").

  Example:
    >>> y = sublayer_legacy_final_rms_norm(x, stack, context)
  """
  return sublayer_rms_norm(x, layer_stack, context, epsilon=layer_stack.norm_epsilon,
                           name="final_layer_norm")


def sublayer_rms_norm_subsampled(x: mtf.Tensor, layer_stack, context,
                                 percentage: float = 100.0,
                                 epsilon: float = 1e-6) -> mtf.Tensor:
  """RMS normalization whose mean square is taken over the first
  ceil(d_model * percentage / 100) channels only (variable
  "layer_norm_subsampled/scale"). The channels are picked by a mask, not a
  slice, so any layout may split d_model.

  Example:
    >>> y = sublayer_rms_norm_subsampled(x, stack, context, percentage=25.0)
  """
  del layer_stack
  if not 0.0 < percentage <= 100.0:
    raise ValueError(f"sublayer_rms_norm_subsampled: percentage must be in (0, 100], got "
                     f"{percentage!r}.")
  d_model = context.model.model_dim
  size = int(math.ceil(d_model.size * percentage / 100.0))
  with mtf.name_scope(context.mesh, "layer_norm_subsampled"):
    scale = _scale(context, "scale", [d_model])
    first = mtf.cast(mtf.less(mtf.range(context.mesh, d_model, tf.int32), size), x.dtype)
    variance = mtf.reduce_sum(mtf.square(x) * first, reduced_dim=d_model) * (1.0 / size)
    return mtf.layers.scale_normalized(x, mtf.rsqrt(variance + epsilon), scale)


def sublayer_true_layer_norm(x: mtf.Tensor, layer_stack, context,
                             epsilon: float = 1e-6) -> mtf.Tensor:
  """Layer normalization over d_model (mean and variance, learned scale and
  bias: `mtf.layers.layer_norm`), under the scope "true_layer_norm".

  Example:
    >>> y = sublayer_true_layer_norm(x, stack, context)
  """
  del layer_stack
  with mtf.name_scope(context.mesh, "true_layer_norm"):
    # An explicit name: a second call (a decoding step) finds the same variables.
    return mtf.layers.layer_norm(x, context.model.model_dim, epsilon,
                                 name="layer_prepostprocess")


def sublayer_scale_norm(x: mtf.Tensor, layer_stack, context, epsilon: float = 1e-6,
                        name: str = "scale_norm") -> mtf.Tensor:
  """Scale normalization: RMS normalization over d_model with one learned
  scalar scale (variable "<name>/scale", 1.0).

  Example:
    >>> y = sublayer_scale_norm(x, stack, context)
  """
  del layer_stack
  return _rms_normalized(x, context, epsilon, name, scale_over_d_model=False)


def sublayer_residual(x: mtf.Tensor, layer_stack, context) -> mtf.Tensor:
  """x plus the current layer's input (the residual connection).

  Example:
    >>> y = sublayer_residual(x, stack, context)   # inside sublayers_per_layer
  """
  del layer_stack
  return x + _current(context, "current_layer_input", "sublayer_residual")


def sublayer_dropout(x: mtf.Tensor, layer_stack, context,
                     dropout_rate: float = 0.0) -> mtf.Tensor:
  """Dropout in training (x unchanged otherwise): one mask per example and
  d_model channel, shared by all positions.

  Example:
    >>> y = sublayer_dropout(x, stack, context, dropout_rate=0.1)
  """
  del layer_stack
  if not context.train or not dropout_rate:
    return x
  noise_shape = mtf.Shape(list(context.batch_dims) + [context.model.model_dim])
  return mtf.dropout(x, True, rate=dropout_rate, noise_shape=noise_shape)


def sublayer_legacy_dropout(x: mtf.Tensor, layer_stack, context) -> mtf.Tensor:
  """`sublayer_dropout` at the stack's own dropout_rate.

  Example:
    >>> y = sublayer_legacy_dropout(x, stack, context)
  """
  return sublayer_dropout(x, layer_stack, context, dropout_rate=layer_stack.dropout_rate)


def sublayer_rezero(x: mtf.Tensor, layer_stack, context,
                    initial_value: float = 0.0) -> mtf.Tensor:
  """x times a learned scalar "rezero_weight" (initially `initial_value`);
  ReZero puts it before `sublayer_residual`, without norms.

  Example:
    >>> y = sublayer_rezero(x, stack, context, initial_value=0.1)
  """
  del layer_stack
  weight = mtf.get_variable(context.mesh, "rezero_weight", mtf.Shape([]),
                            initializer=mtf.initializers.constant(initial_value),
                            dtype=context.variable_dtype)
  return x * weight


def sublayer_clip_activation_gradient(x: mtf.Tensor, layer_stack, context,
                                      rms_norm: float = 1.0) -> mtf.Tensor:
  """x unchanged; the gradient reaching it is clipped to root mean square
  `rms_norm` (`mtf.layers.clip_activation_gradient`).

  Example:
    >>> y = sublayer_clip_activation_gradient(x, stack, context, rms_norm=0.5)
  """
  del layer_stack, context
  return mtf.layers.clip_activation_gradient(x, rms_norm)


def default_sublayers(configurables: Dict[str, Callable]
                      ) -> Tuple[List[Sublayer], List[Sublayer], List[Sublayer]]:
  """The default (initial, per-layer, final) sublayer lists,
  each function taken from `configurables` (gin's versions by name, from
  layer_stack.gin_configurables()) where it is there, so bindings such as
  `transformer.sublayer_dropout.dropout_rate` apply.

  Example:
    >>> initial, per_layer, final = default_sublayers({})
    >>> [f.__name__ for f in per_layer]
    ['sublayer_rms_norm', 'sublayer_call_layer', 'sublayer_dropout', 'sublayer_residual']
  """
  def pick(fn):
    return configurables.get(fn.__name__, fn)
  return ([pick(sublayer_dropout)],
          [pick(sublayer_rms_norm), pick(sublayer_call_layer), pick(sublayer_dropout),
           pick(sublayer_residual)],
          [pick(sublayer_rms_norm), pick(sublayer_dropout)])
