"""One decoding step of the attention layers, with key/value caches.

Part of `mtf.layers` (import them from there). Each function takes the new
position's input (no length dimension), the caches of keys and values
[batch..., heads, memory, kv_channels] and the step number (an integer mtf
scalar, or a Python int), and returns the output with the updated caches.
Running the steps 0, 1, 2, ... one after the other gives, at each position,
what the whole-sequence layer gives there (same variables, same names).

    >>> k = v = mtf.zeros(mesh, [batch, heads, memory_length, d_kv])
    >>> for step in range(memory_length.size):
    ...   y, k, v = mtf.layers.multihead_self_attention_incremental(
    ...       x_step[step], k, v, step, tf.float32, tf.float32)
"""

from __future__ import annotations

from typing import Optional, Tuple, Union

import tensorflow as tf

from mesh_tensorflow.core.graph import Mesh, Tensor
from mesh_tensorflow.layers.attention import _bias, dot_product_attention, multihead_attention_vars
from mesh_tensorflow.layers.core import layer_scope
from mesh_tensorflow.operations import elementwise as ew
from mesh_tensorflow.operations.constant_ops import constant
from mesh_tensorflow.operations.einsum_ops import einsum
from mesh_tensorflow.operations.indexing import range as mtf_range
from mesh_tensorflow.core.shapes import Shape

StepNum = Union[int, Tensor]


def _step_tensor(mesh: Mesh, step_num: StepNum, cache: Tensor, what: str) -> Tensor:
  """step_num as an integer mtf tensor whose dimensions the cache has."""
  if not isinstance(step_num, Tensor):
    return constant(mesh, int(step_num), dtype=tf.int32)
  if not step_num.dtype.is_integer:
    raise ValueError(f"{what}: step_num {step_num.name} must have an integer dtype, "
                     f"not {step_num.dtype.name}.")
  extra = [d for d in step_num.shape.dims if d not in cache.shape.dims[:-3]]
  if extra:
    raise ValueError(f"{what}: step_num {step_num.name} {step_num.shape} has dimensions "
                     f"{extra} that the cache's batch dimensions lack.")
  return step_num


def _check_cache(x: Tensor, prev_k: Tensor, prev_v: Tensor, what: str) -> None:
  if prev_k.shape != prev_v.shape:
    raise ValueError(f"{what}: the key cache {prev_k.shape} and the value cache "
                     f"{prev_v.shape} must have one shape.")
  if prev_k.shape.ndims < 3 or prev_k.shape.dims[:-3] != x.shape.dims[:-1]:
    raise ValueError(
        f"{what}: the caches must be [batch..., heads, memory, kv_channels] with the "
        f"input's batch dimensions {x.shape.dims[:-1]}; got {prev_k.shape}.")


def _write(cache: Tensor, value: Tensor, slot: Tensor) -> Tensor:
  """The cache with `value` in the memory position(s) where `slot` holds."""
  return ew.where(slot, value, cache, output_shape=cache.shape)


def multihead_self_attention_incremental(
    query_antecedent: Tensor, prev_k: Tensor, prev_v: Tensor, step_num: StepNum,
    master_dtype=tf.float32, slice_dtype=tf.float32,
    name: Optional[str] = "multihead_attention") -> Tuple[Tensor, Tensor, Tensor]:
  """One step of causal multi-head self-attention (see `multihead_attention`).

  Writes the new position's key and value into the caches at memory
  position `step_num` and attends to positions 0..step_num.

  Args:
    query_antecedent: the new position's input [batch..., io_channels].
    prev_k: key cache [batch..., heads, memory_length, kv_channels].
    prev_v: value cache, the same shape.
    step_num: the position being decoded (an integer mtf scalar, or an
      integer tensor over some batch dimensions, or a Python int).
    master_dtype: variable storage dtype.
    slice_dtype: variable slice dtype.
    name: scope name; the default, "multihead_attention", is the first
      default-named `multihead_attention` layer's, so the step uses its
      variable "<name>/qkvo".

  Returns:
    (y [batch..., io_channels], new key cache, new value cache).

  Example:
    >>> y, k, v = multihead_self_attention_incremental(x, k, v, step, tf.float32,
    ...                                                tf.float32, name="self_attention")
  """
  what = "multihead_self_attention_incremental"
  x = query_antecedent
  _check_cache(x, prev_k, prev_v, what)
  batch_dims, io_channels = x.shape.dims[:-1], x.shape.dims[-1]
  heads, memory_length, kv_channels = prev_k.shape.dims[-3:]
  mesh = x.mesh
  with layer_scope(mesh, name, "multihead_attention"):
    wq, wk, wv, wo = multihead_attention_vars(mesh, heads, io_channels, kv_channels,
                                              master_dtype, slice_dtype, x.dtype)
    step = _step_tensor(mesh, step_num, prev_k, what)
    shape = Shape(batch_dims + [heads, kv_channels])
    q = einsum([x, wq], output_shape=shape)
    position = mtf_range(mesh, memory_length, tf.int32)
    slot = ew.equal(position, step)
    k = _write(prev_k, einsum([x, wk], output_shape=shape), slot)
    v = _write(prev_v, einsum([x, wv], output_shape=shape), slot)
    o = dot_product_attention(q, k, v, _bias(ew.greater(position, step), q.dtype))
    return einsum([o, wo], output_shape=x.shape), k, v


def multihead_encdec_attention_incremental(
    query_antecedent: Tensor, wq: Tensor, wo: Tensor, k: Tensor, v: Tensor,
    mask: Optional[Tensor], name: Optional[str] = "multihead_attention") -> Tensor:
  """Attention of new decoder position(s) to precomputed encoder keys and values.

  Args:
    query_antecedent: query_dims + [io_channels] (e.g. [batch, d_model] for
      one step, or [batch, length, d_model]).
    wq: query weights [heads, io_channels, kv_channels].
    wo: output weights [heads, io_channels, kv_channels].
    k: memory_dims + [heads, memory_length, kv_channels], memory_dims a
      subset of query_dims.
    v: values, like k.
    mask: an additive bias broadcastable to the logits (e.g. from
      `attention_mask_ignore_padding`), or None.
    name: scope name of the operations (no variables are created).

  Returns:
    a tensor with query_antecedent's shape.

  Example:
    >>> y = multihead_encdec_attention_incremental(x, wq, wo, k, v, mask)
  """
  what = "multihead_encdec_attention_incremental"
  x = query_antecedent
  if k.shape.ndims < 3:
    raise ValueError(f"{what}: k {k.shape} must be [..., heads, memory_length, kv_channels].")
  heads, _, kv_channels = k.shape.dims[-3:]
  io_channels = x.shape.dims[-1]
  for w, w_name in ((wq, "wq"), (wo, "wo")):
    if set(w.shape.dims) != {heads, io_channels, kv_channels}:
      raise ValueError(f"{what}: {w_name} {w.shape} must be [{heads}, {io_channels}, "
                       f"{kv_channels}] (the heads and kv_channels of k {k.shape}).")
  with layer_scope(x.mesh, name, "multihead_attention"):
    q = einsum([x, wq], output_shape=Shape(x.shape.dims[:-1] + [heads, kv_channels]))
    o = dot_product_attention(q, k, v, mask)
    return einsum([o, wo], output_shape=x.shape)


def masked_local_attention_1d_incremental(
    x: Tensor, prev_k: Tensor, prev_v: Tensor, step_num: StepNum, master_dtype=None,
    slice_dtype=None, params=None, name: Optional[str] = None) -> Tuple[Tensor, Tensor, Tensor]:
  """One step of `masked_local_attention_1d` with window_size = the cache size.

  The caches are ring buffers over the last window_length positions: the new
  key and value go to slot step_num % window_length, and the query attends
  to the filled slots (all of them once step_num >= window_length - 1), i.e.
  to positions (step_num - window_length, step_num]. Slots not written yet
  are masked, not attended as zeros.

  Args:
    x: the new position's input [batch..., io_channels].
    prev_k: key cache [batch..., heads, window_length, kv_channels].
    prev_v: value cache, the same shape.
    step_num: the position being decoded (integer mtf scalar or Python int).
    master_dtype: variable storage dtype (default float32).
    slice_dtype: variable slice dtype (default master_dtype).
    params: (wq, wk, wv, wo) to use instead of the layer's variables.
    name: scope name (default "masked_local_attention_1d", unique per call);
      give the whole-sequence layer's name to use its variables.

  Returns:
    (y [batch..., io_channels], new key cache, new value cache).

  Example:
    >>> y, k, v = masked_local_attention_1d_incremental(x, k, v, step, name="local")
  """
  what = "masked_local_attention_1d_incremental"
  _check_cache(x, prev_k, prev_v, what)
  batch_dims, io_channels = x.shape.dims[:-1], x.shape.dims[-1]
  heads, window_length, kv_channels = prev_k.shape.dims[-3:]
  mesh = x.mesh
  with layer_scope(mesh, name, "masked_local_attention_1d"):
    wq, wk, wv, wo = params or multihead_attention_vars(
        mesh, heads, io_channels, kv_channels, master_dtype, slice_dtype, x.dtype)
    step = _step_tensor(mesh, step_num, prev_k, what)
    shape = Shape(batch_dims + [heads, kv_channels])
    q = einsum([x, wq], output_shape=shape)
    slot_index = mtf_range(mesh, window_length, tf.int32)
    slot = ew.equal(slot_index, step % window_length.size)
    k = _write(prev_k, einsum([x, wk], output_shape=shape), slot)
    v = _write(prev_v, einsum([x, wv], output_shape=shape), slot)
    # Slot j holds a position once step_num >= j.
    o = dot_product_attention(q, k, v, _bias(ew.greater(slot_index, step), q.dtype))
    return einsum([o, wo], output_shape=x.shape), k, v

from mesh_tensorflow.core import autograph_exempt as _autograph_exempt  # noqa: E402  pylint: disable=g-import-not-at-top
_autograph_exempt.exempt(globals())  # AutoGraph leaves this module's code alone
