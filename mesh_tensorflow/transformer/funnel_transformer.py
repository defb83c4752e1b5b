"""Funnel-Transformer encoders (Dai et al. 2020, "Funnel-Transformer:
Filtering out Sequential Redundancy for Efficient Language Processing",
arXiv:2006.03236): a layer stack that shortens the sequence between blocks.

`FunnelTransformerLayerStack` is a `transformer.LayerStack` (same pre-norm
residual layers, final norm, dropout and padding mask) cut into `n_blocks`
blocks. Before block b > 0 finishes its first layer, the "length" dimension
is pooled: every `pooling_size` neighbouring positions become one (their
mean, max or min), so block b runs on sequences pooling_size**b times
shorter, and the stack's output has the pooled length. The context's length
dimension, segment ids and positions are pooled along with the activations,
so the layers after a pooling (and a decoder attending to the output) see a
consistent, shorter sequence. Each block has its own layers, and a block may
run each of its layers several times in a row with the same variables
(`block_repeat_size`).

Pooling mixes neighbouring positions, so the stack belongs in encoders
(`Unitransformer(autoregressive=False)`, a Bitransformer's encoder);
`BitransformerFunnel` is the `Bitransformer` whose decoder attends to the
pooled encoder output with the pooled encoder segment ids.

    >>> stack = FunnelTransformerLayerStack(
    ...     [SelfAttention, DenseReluDense], n_blocks=3,
    ...     block_param_size=[2, 2, 2], block_repeat_size=[1, 1, 1])
    >>> encoder = Unitransformer(stack, d_model=512, input_vocab_size=256,
    ...                          autoregressive=False, name="encoder")
    >>> model = BitransformerFunnel(encoder, decoder)   # encoder 512 -> 128 long
"""

from __future__ import annotations

from typing import Callable, List, Optional, Sequence, Union

import numpy as np
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import sublayers as sublayers_lib
from mesh_tensorflow.transformer import transformer

POOLING_TYPES = ("mean", "max", "min")
# The dimension of the positions pooled into one (a temporary dimension).
WINDOW_DIM_NAME = "funnel_window"

ReduceFn = Union[str, Callable[..., mtf.Tensor]]


def _pooling_kind(reduce_fn: ReduceFn) -> Optional[str]:
  """"mean", "max" or "min" for those names or mtf reductions, else None."""
  if isinstance(reduce_fn, str):
    if reduce_fn not in POOLING_TYPES:
      raise ValueError(f"pooling type must be one of {POOLING_TYPES}, got {reduce_fn!r}.")
    return reduce_fn
  known = {mtf.reduce_mean: "mean", mtf.reduce_max: "max", mtf.reduce_min: "min"}
  return known.get(reduce_fn)


def pooled_size(size: int, pool_size: int) -> int:
  """The length after pooling `size` positions pool_size at a time (the last
  window may be short).

  Example:
    >>> pooled_size(7, 2)
    4
  """
  return -(-size // pool_size)


def _windows(x: mtf.Tensor, pool_dim: mtf.Dimension, pool_size: int) -> mtf.Tensor:
  """x with pool_dim (zero-padded to a multiple of pool_size) cut into
  [pool_dim (pooled size), funnel_window (pool_size)].

  A layout splitting pool_dim keeps it split (the reshape is local) when the
  split count divides the pooled size."""
  n = pooled_size(pool_dim.size, pool_size)
  extra = n * pool_size - pool_dim.size
  if extra:
    x = mtf.pad(x, [0, extra], pool_dim.name)
    pool_dim = mtf.Dimension(pool_dim.name, n * pool_size)
  return mtf.replace_dimensions(
      x, pool_dim, [mtf.Dimension(pool_dim.name, n), mtf.Dimension(WINDOW_DIM_NAME, pool_size)])


def pool_tensor_1d(x: mtf.Tensor, pool_dim: mtf.Dimension, reduce_fn: ReduceFn = "mean",
                   pool_size: int = 2, nonpadding: Optional[mtf.Tensor] = None) -> mtf.Tensor:
  """Pools x along pool_dim: position i of the result reduces positions
  [i * pool_size, (i + 1) * pool_size) of x (non-overlapping windows).

  The result keeps pool_dim's name, with size ceil(size / pool_size); when
  pool_size does not divide the size, the last window is shorter (the
  positions past the end take no part in it). With `nonpadding` (1.0 at real
  tokens, 0.0 at padding, over some of x's dimensions including pool_dim)
  only real tokens take part, and windows without any give 0.

  Args:
    x: a float tensor with pool_dim.
    pool_dim: the dimension to pool (e.g. "length").
    reduce_fn: "mean", "max", "min", one of mtf.reduce_mean / reduce_max /
      reduce_min, or another reduction fn(t, reduced_dim=...) (applied to
      zero-padded windows; `nonpadding` then zeroes padding first).
    pool_size: positions per window.
    nonpadding: optional mask of the positions to pool.

  Returns:
    x pooled: pool_dim of size ceil(pool_dim.size / pool_size).

  Example:
    >>> y = pool_tensor_1d(x, length_dim, "max", pool_size=2)   # length 8 -> 4
  """
  if pool_dim not in x.shape.dims:
    raise ValueError(f"pool_tensor_1d: {x.shape} has no dimension {pool_dim}.")
  transformer.positive_int(pool_size, "pool_tensor_1d: pool_size")
  kind = _pooling_kind(reduce_fn)
  window = mtf.Dimension(WINDOW_DIM_NAME, pool_size)
  if nonpadding is None and pool_dim.size % pool_size:
    # Only the positions past the end (zeros added by _windows) are left out.
    nonpadding = mtf.ones(x.mesh, mtf.Shape([pool_dim]), dtype=x.dtype)
  xw = _windows(x, pool_dim, pool_size)
  if nonpadding is None:
    if kind is None:
      return reduce_fn(xw, reduced_dim=window)
    fn = {"mean": mtf.reduce_mean, "max": mtf.reduce_max, "min": mtf.reduce_min}[kind]
    return fn(xw, reduced_dim=window)
  mw = _windows(mtf.cast(nonpadding, x.dtype), pool_dim, pool_size)
  if kind is None:
    return reduce_fn(xw * mw, reduced_dim=window)
  count = mtf.reduce_sum(mw, reduced_dim=window)
  if kind == "mean":
    return mtf.reduce_sum(xw * mw, reduced_dim=window) / mtf.maximum(count, 1.0)
  fill = x.dtype.min if kind == "max" else x.dtype.max
  picked = mtf.where(mtf.greater(mw, 0.0), xw, fill, output_shape=xw.shape)
  fn = mtf.reduce_max if kind == "max" else mtf.reduce_min
  pooled = fn(picked, reduced_dim=window)
  return mtf.where(mtf.greater(count, 0.0), pooled, 0.0, output_shape=pooled.shape)


def stride_tensor_1d(x: mtf.Tensor, pool_dim: mtf.Dimension, pool_size: int = 2) -> mtf.Tensor:
  """The first position of every window of `pool_tensor_1d`: x at positions
  0, pool_size, 2 * pool_size, ... along pool_dim (any dtype).

  Example:
    >>> ids = stride_tensor_1d(sequence_id, length_dim, 2)   # [1,1,1,0,0] -> [1,1,0]
  """
  if pool_dim not in x.shape.dims:
    raise ValueError(f"stride_tensor_1d: {x.shape} has no dimension {pool_dim}.")
  window = mtf.Dimension(WINDOW_DIM_NAME, pool_size)
  first = mtf.one_hot(mtf.constant(x.mesh, 0, dtype=tf.int32), window, dtype=x.dtype)
  return mtf.reduce_sum(_windows(x, pool_dim, pool_size) * first, reduced_dim=window)


def _sublayer_names(functions):
  """The function names of a sublayer list (gin's configurable versions keep
  them), or None for something that is not a list of functions."""
  try:
    return [getattr(fn, "__name__", None) for fn in functions]
  except TypeError:
    return None


def _instantiate(layer):
  """A layer instance from an instance, a class or a factory."""
  return layer() if isinstance(layer, type) or not hasattr(layer, "call") else layer


class FunnelTransformerLayerStack(transformer.LayerStack):
  """A `LayerStack` whose sequence length is pooled between blocks (see the
  module docstring).

  The stack has n_blocks blocks. Block b has block_param_size[b] layers of
  n_submodules sublayers each (e.g. SelfAttention then DenseReluDense), with
  their own variables; each such layer runs block_repeat_size[b] times in a
  row, the repeats sharing its variables. `layers` lists the sublayers of all
  blocks in order, sum(block_param_size) * n_submodules of them, or just
  n_submodules of them (one layer's worth, repeated for every layer like
  `make_layer_stack`); classes and factories in it are called once per slot.

  Each sublayer is a pre-norm residual step, as in LayerStack: x = x +
  dropout(sublayer(norm(x))). In every block b > 0 the first sublayer of its
  first layer (the attention, which still sees the unpooled sequence) is
  followed by the pooling: "length" shrinks from n to ceil(n / pooling_size),
  each new position pooling a window of pooling_size neighbours ("mean",
  "max" or "min" over the window's non-padding positions). The context is
  pooled along: its length dimension, its segment ids (sequence_id: the
  window's first, so a window that starts with a token is a token) and its
  positions (the window's first, divided by pooling_size: 0, 1, 2, ... for
  unpacked sequences). After `call`, `context` is the stack's context, whose
  sequence_id describes the output's positions.

  Variables of sublayer s of layer p of block b live under
  "funnel_block_%03d/param_idx_%03d/submodule_%03d" (its layer_norm and the
  sublayer's own scope), the final norm under "final_layer_norm".

  A layout may split "length": pooling then stays local as long as the split
  count divides every pooled length; a model that knows its layout (its
  `layout` and `mesh_shape`) checks this when called and raises a
  ValueError naming the dimension otherwise.

  Args:
    layers: the sublayers (TransformerLayer instances, classes or
      factories), see above.
    n_blocks: the number of blocks.
    block_param_size: per block, its number of layers with their own
      variables.
    block_repeat_size: per block, how many times each of its layers runs.
    pooling_size: positions pooled into one between blocks.
    sublayers_initial: accepted for gin files of the original; must be
      None (this stack's structure is LayerStack's; see dropout_rate and
      norm_type).
    sublayers_per_layer: likewise.
    sublayers_final: likewise.
    pooling_type: "mean", "max" or "min".
    n_submodules: sublayers per layer.
    dropout_rate: LayerStack's (embeddings, every residual branch, output).
    norm_epsilon: LayerStack's.
    norm_type: LayerStack's: "rms" or "layer".
    recompute: LayerStack's activation recomputation in training: "none",
      "layer", "selective" or "projections".

  Example:
    >>> stack = FunnelTransformerLayerStack(
    ...     [SelfAttention(num_heads=4), DenseReluDense(hidden_size=256)],
    ...     n_blocks=2, block_param_size=[1, 1], block_repeat_size=[1, 2])
    >>> y = stack.call(context, x)   # [batch, length:8, d_model] -> length:4
  """

  def __init__(self, layers: Sequence, n_blocks: int, block_param_size: Sequence[int],
               block_repeat_size: Sequence[int], pooling_size: int = 2,
               sublayers_initial=None, sublayers_per_layer=None, sublayers_final=None,
               pooling_type: str = "mean", n_submodules: int = 2, dropout_rate: float = 0.0,
               norm_epsilon: float = 1e-6, norm_type: str = "rms", recompute: str = "none"):
    name = type(self).__name__
    ints = (int, np.integer)
    for arg, value in (("n_blocks", n_blocks), ("n_submodules", n_submodules),
                       ("pooling_size", pooling_size)):
      transformer.positive_int(value, f"{name}: {arg}", integer_types=ints)
    for arg, sizes in (("block_param_size", block_param_size),
                       ("block_repeat_size", block_repeat_size)):
      if isinstance(sizes, (str, bytes)) or not isinstance(sizes, Sequence):
        raise ValueError(f"{name}: {arg} must be a list of n_blocks integers, got {sizes!r}.")
      if len(sizes) != n_blocks:
        raise ValueError(f"{name}: {arg} has {len(sizes)} entries for n_blocks={n_blocks}; "
                         "give one per block.")
      for size in sizes:
        transformer.positive_int(size, f"{name}: every entry of {arg}", integer_types=ints)
    if pooling_type not in POOLING_TYPES:
      raise ValueError(f"{name}: pooling_type must be one of {POOLING_TYPES}, got "
                       f"{pooling_type!r}.")
    defaults = sublayers_lib.default_sublayers({})
    for (arg, value), default in zip((("sublayers_initial", sublayers_initial),
                                      ("sublayers_per_layer", sublayers_per_layer),
                                      ("sublayers_final", sublayers_final)), defaults):
      # The default lists are the built-in body (tested in
      # test_transformer_sublayers.py): accepted; any other list is refused.
      if value is not None and _sublayer_names(value) != _sublayer_names(default):
        raise ValueError(
            f"{name}: {arg} is not supported: the stack's sublayers are fixed (pre-norm "
            "residual layers and a final norm: LayerStack's built-in body, which is "
            "also what the original's default lists give); leave it unset and use "
            "dropout_rate, norm_type and norm_epsilon instead.")
    layers = list(layers)
    n_params = sum(block_param_size)
    needed = n_params * n_submodules
    if len(layers) == n_submodules and n_params > 1:
      layers = layers * n_params
    if len(layers) != needed:
      raise ValueError(
          f"{name}: got {len(layers)} layers; sum(block_param_size) * n_submodules = "
          f"{n_params} * {n_submodules} = {needed} are needed (or n_submodules = "
          f"{n_submodules}, repeated for every layer).")
    super().__init__([_instantiate(layer) for layer in layers], dropout_rate=dropout_rate,
                     norm_epsilon=norm_epsilon, norm_type=norm_type, recompute=recompute)
    self.n_blocks = n_blocks
    self.block_param_size = list(block_param_size)
    self.block_repeat_size = list(block_repeat_size)
    self.pooling_size = pooling_size
    self.pooling_type = pooling_type
    self.n_submodules = n_submodules
    self._context: Optional[transformer.Context] = None

  # ---- structure -------------------------------------------------------------
  @property
  def context(self) -> Optional[transformer.Context]:
    """The context of the latest `call` (its pooled length and sequence_id)."""
    return self._context

  def set_context(self, context: transformer.Context) -> None:
    self._context = context

  @property
  def pool_fn(self) -> Callable[..., mtf.Tensor]:
    """The mtf reduction of pooling_type (mtf.reduce_mean, _max or _min)."""
    return {"mean": mtf.reduce_mean, "max": mtf.reduce_max,
            "min": mtf.reduce_min}[self.pooling_type]

  def block_lengths(self, length: int) -> List[int]:
    """The sequence length in each block, for input sequences of `length`.

    Example:
      >>> stack.block_lengths(10)   # n_blocks=3, pooling_size=2
      [10, 5, 3]
    """
    lengths = [length]
    for _ in range(self.n_blocks - 1):
      lengths.append(pooled_size(lengths[-1], self.pooling_size))
    return lengths

  def output_length(self, length: int) -> int:
    """The output's length for input sequences of `length`."""
    return self.block_lengths(length)[-1]

  def schedule(self) -> List[tuple]:
    """(block, param_idx, repeat_idx, submodule_idx, layer) of every sublayer
    call, in order."""
    out, i = [], 0
    for b in range(self.n_blocks):
      for p in range(self.block_param_size[b]):
        layer_slots = self._layers[i:i + self.n_submodules]
        i += self.n_submodules
        for r in range(self.block_repeat_size[b]):
          for s, layer in enumerate(layer_slots):
            out.append((b, p, r, s, layer))
    return out

  # ---- call ------------------------------------------------------------------
  def call(self, context: transformer.Context, x: mtf.Tensor) -> mtf.Tensor:
    """The stack on x [batch..., length, d_model]; returns x's shape with the
    length pooled (output_length), and leaves the context pooled likewise."""
    self._check_context(context, x)
    self.recompute_ops = []
    x = self._dropout(context, x)
    if context.layer_outputs is not None:
      context.layer_outputs.append(x)
    schedule = self.schedule()
    policy = self.recompute if context.train else "none"
    for k, (b, p, r, s, layer) in enumerate(schedule):
      scope = "funnel_block_%03d/param_idx_%03d/submodule_%03d" % (b, p, s)
      x = self._sublayer(context, x, layer, scope, policy, scope)
      if b > 0 and p == 0 and r == 0 and s == 0:
        x = self.pool(context, x)
      if context.layer_outputs is not None and k != len(schedule) - 1:
        context.layer_outputs.append(x)
      context.layer_index += 1
    x = self.finish(context, x)
    self.set_context(context)
    return x

  def _replayable(self, context: transformer.Context, block):
    # recompute="layer" runs block again in the backward pass, when later
    # poolings have shortened the context: give it the context of now.
    pinned = (context.length_dim, context.sequence_id, context.position)

    def replay(x):
      now = (context.length_dim, context.sequence_id, context.position)
      context.length_dim, context.sequence_id, context.position = pinned
      try:
        return block(x)
      finally:
        context.length_dim, context.sequence_id, context.position = now
    return replay

  def pool(self, context: transformer.Context, x: mtf.Tensor) -> mtf.Tensor:
    """Pools x and the context (length_dim, sequence_id, position) along the
    length; returns the pooled x.

    Example:
      >>> x = stack.pool(context, x)   # context.length_dim: 8 -> 4
    """
    length_dim = context.length_dim
    x = pool_tensor_1d(x, length_dim, self.pooling_type, self.pooling_size,
                       nonpadding=context.nonpadding)
    self.update_context(context, x, pool_dim_name=length_dim.name)
    return x

  def update_context(self, context: transformer.Context, x: mtf.Tensor,
                     pool_dim_name: str = "length") -> None:
    """Pools the context's length dimension, sequence_id and position to
    match x, already pooled along pool_dim_name."""
    old = context.length_dim
    new = x.shape.get_dim_by_name(pool_dim_name)

    def stride(t):
      if isinstance(t, mtf.Tensor) and old in t.shape.dims:
        return stride_tensor_1d(t, old, self.pooling_size)
      return t
    context.sequence_id = stride(context.sequence_id)
    if context.position_is_default or not isinstance(context.position, mtf.Tensor):
      context.position = mtf.range(context.mesh, new, tf.int32)
    else:
      context.position = mtf.floordiv(stride(context.position), self.pooling_size)
    context.length_dim = new

  def _check_context(self, context: transformer.Context, x: mtf.Tensor) -> None:
    name = type(self).__name__
    model = context.model
    if (getattr(model, "autoregressive", False) or context.read_priority is not None
        or context.write_priority is not None):
      raise ValueError(
          f"{name} pools neighbouring positions, so a position would see the ones after "
          "it: use it in a non-autoregressive encoder (Unitransformer(autoregressive="
          "False), e.g. the encoder of a BitransformerFunnel), not in a decoder or "
          "language model.")
    if context.mode in (transformer.ModeKeys.FIRST_PART, transformer.ModeKeys.INCREMENTAL):
      raise ValueError(f"{name} runs on whole sequences only, not in {context.mode!r} "
                       "(decoding) mode.")
    if context.length_dim not in x.shape.dims:
      raise ValueError(f"{name}: the input {x.shape} lacks the context's length dimension "
                       f"{context.length_dim}.")
    layout, mesh_shape = getattr(model, "layout", None), getattr(model, "mesh_shape", None)
    if layout is None or mesh_shape is None:
      return
    mesh_shape = mtf.convert_to_shape(mesh_shape)
    rules = mtf.convert_to_layout_rules(layout)
    axis = rules.tensor_dimension_to_mesh_axis(context.length_dim, mesh_shape)
    if axis is None:
      return
    mdim = mesh_shape.dims[axis]
    lengths = self.block_lengths(context.length_dim.size)
    for b, n in enumerate(lengths):
      if n % mdim.size:
        multiple = mdim.size * self.pooling_size ** (self.n_blocks - 1)
        raise ValueError(
            f"{name}: the layout splits {context.length_dim.name!r} over mesh dimension "
            f"{mdim.name!r} (size {mdim.size}), but block {b} pools it to {n} positions "
            f"(lengths per block {lengths}), which {mdim.size} does not divide. Make the "
            f"length a multiple of {multiple} or drop the layout rule "
            f"'{context.length_dim.name}:{mdim.name}'.")


class BitransformerFunnel(transformer.Bitransformer):
  """A `Bitransformer` whose encoder may shorten its sequence (a
  `FunnelTransformerLayerStack`): the decoder attends to the pooled encoder
  output, masked with the encoder's pooled segment ids (its "memory_length"
  is the pooled length). Training (`call_simple`) and decoding (`decode`,
  greedy, sampled or beam search) are Bitransformer's.

  Args:
    encoder: a non-autoregressive Unitransformer (name "encoder"), usually
      with a FunnelTransformerLayerStack.
    decoder: an autoregressive Unitransformer (name "decoder").
    shared_embedding: share the input embeddings.

  Example:
    >>> model = BitransformerFunnel(encoder, decoder)
    >>> logits, loss = model.call_simple(inputs, targets, compute_loss=True)
    >>> outputs = model.decode(inputs, beam_size=1)
  """

  def _encode(self, inputs, mode, variable_dtype, encoder_sequence_id, encoder_position,
              shared_params, compute_loss=False):
    output, sequence_id, layer_outputs, loss = super()._encode(
        inputs, mode, variable_dtype, encoder_sequence_id, encoder_position, shared_params,
        compute_loss)
    stack = self.encoder.layer_stack
    pooled = stack.context.sequence_id if isinstance(
        stack, FunnelTransformerLayerStack) and stack.context is not None else None
    if isinstance(pooled, mtf.Tensor):
      sequence_id = mtf.layers.rename_length_to_memory_length(pooled)
    return output, sequence_id, layer_outputs, loss
