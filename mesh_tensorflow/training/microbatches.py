"""Training on a batch one micro-batch at a time (the original's
`mtf.serialize_training_step`).

A batch too large for memory is cut into `num_splits` micro-batches along its
batch dimension. The model runs on each in turn, with the same variables; the
gradients are summed, and each micro-batch starts only once the previous
one's gradients exist, so only one micro-batch's activations are alive at a
time. Outputs with the batch dimension are put back together in the batch's
order; the others (the loss) are summed, so a model_fn that divides its loss
by `num_splits` gives the loss of the whole batch.

    >>> def model_fn(features):
    ...   return {"loss": loss_of(features) * (1.0 / 4)}
    >>> grads, outputs = mtf.serialize_training_step(features, model_fn, batch_dim, 4)
    >>> updates = optimizer.apply_grads(grads, graph.trainable_variables)
"""

from __future__ import annotations

from typing import Callable, Dict, List, Mapping, Optional, Tuple

from mesh_tensorflow.operations.gradients import gradients
from mesh_tensorflow.core.graph import LAYER_SCOPES_KEY, Tensor
from mesh_tensorflow.operations.control import depend
from mesh_tensorflow.operations.indexing import gather
from mesh_tensorflow.operations.shape_ops import reshape
from mesh_tensorflow.operations.slicing import stack
from mesh_tensorflow.core.shapes import Dimension, Shape, convert_to_dimension

_SPLITS = "_microbatch"


def _cut(x: Tensor, batch_dim: Dimension, micro: Dimension, splits: Dimension) -> Tensor:
  """x [..., batch, ...] as [..., batch/n, _microbatch:n, ...]. Example b of the
  batch is (b // n, b % n), so a processor holding a block of the batch holds
  its share of every micro-batch: cutting moves no data."""
  dims = []
  for d in x.shape.dims:
    dims.extend([micro, splits] if d == batch_dim else [d])
  return reshape(x, Shape(dims))


def _join(parts: List[Tensor], batch_dim: Dimension, micro: Dimension,
          splits: Dimension) -> Tensor:
  """The inverse of `_cut` for per-micro-batch outputs."""
  stacked = stack(parts, splits.name, axis=parts[0].shape.index_of(micro.name) + 1)
  dims = [batch_dim if d == micro else d for d in stacked.shape.dims if d != splits]
  return reshape(stacked, Shape(dims))


def serialize_training_step(features: Mapping[str, Tensor],
                            model_fn: Callable[[Dict[str, Tensor]], Mapping[str, Tensor]],
                            batch_dim, num_splits: int
                            ) -> Tuple[List[Optional[Tensor]], Dict[str, Tensor]]:
  """Runs model_fn on `num_splits` micro-batches in turn and sums the gradients.

  Args:
    features: {name: Tensor}; those with `batch_dim` are cut into
      micro-batches (whose batch dimension keeps its name, with size
      batch_dim.size / num_splits); the others are given whole to every call.
    model_fn: features -> {name: Tensor}, with a scalar "loss". It is called
      once per micro-batch and must make the same variables every time
      (`mtf.get_variable` names, `mtf.layers` layers with default or explicit
      names: the calls find the first call's variables).
    batch_dim: the batch Dimension (or its name) to cut.
    num_splits: how many micro-batches; must divide the batch size.

  Returns:
    (grads, outputs): the gradients of the summed losses for
    `graph.trainable_variables` (in that order; None where a variable does not
    affect the loss), and model_fn's outputs: those with the batch dimension
    joined back into the whole batch, the others summed over the micro-batches.

  Raises:
    ValueError: num_splits does not divide the batch, no feature has the batch
      dimension, model_fn returns no "loss" or makes new variables after its
      first call.

  Example:
    >>> grads, out = mtf.serialize_training_step({"x": x, "y": y}, model_fn, "batch", 4)
  """
  if not features:
    raise ValueError("serialize_training_step: features is empty.")
  graph = next(iter(features.values())).graph
  name = batch_dim if isinstance(batch_dim, str) else convert_to_dimension(batch_dim).name
  batched = {k: v for k, v in features.items() if name in v.shape.dimension_names}
  if not batched:
    raise ValueError(f"serialize_training_step: no feature has the batch dimension {name!r} "
                     f"(features: {', '.join(f'{k} {v.shape}' for k, v in features.items())}).")
  batch_dim = next(iter(batched.values())).shape.get_dim_by_name(name)
  if not isinstance(num_splits, int) or num_splits < 1 or batch_dim.size % num_splits:
    raise ValueError(f"serialize_training_step: num_splits={num_splits!r} must be a positive "
                     f"int dividing the batch dimension {batch_dim}.")
  micro = Dimension(name, batch_dim.size // num_splits)
  splits = Dimension(_SPLITS, num_splits)
  cut = ({k: _cut(v, batch_dim, micro, splits) for k, v in batched.items()}
         if num_splits > 1 else dict(batched))
  layer_names = set(graph.keeps.get(LAYER_SCOPES_KEY, ()))
  variables = None
  grad_sum: List[Optional[Tensor]] = []
  per_split: List[Mapping[str, Tensor]] = []
  waits: List[Tensor] = []
  for k in range(num_splits):
    # Each call names its layers as the first did, so it finds their variables.
    graph.keeps[LAYER_SCOPES_KEY] = set(layer_names)
    micro_features = dict(features)
    for key, v in cut.items():
      part = gather(v, k, splits) if num_splits > 1 else v
      micro_features[key] = depend(part, waits) if waits else part
    outputs = model_fn(micro_features)
    if "loss" not in outputs:
      raise ValueError(f"serialize_training_step: model_fn must return a dict with a scalar "
                       f"'loss'; got keys {sorted(outputs)}.")
    if variables is None:
      variables = list(graph.trainable_variables)
      grad_sum = [None] * len(variables)
    elif len(graph.trainable_variables) != len(variables):
      new = [v.name for v in graph.trainable_variables if v not in variables]
      raise ValueError(
          f"serialize_training_step: model_fn made new variables {new} on micro-batch {k}; "
          "every call must use the first call's variables (same names).")
    grads = gradients([outputs["loss"]], [v.outputs[0] for v in variables])
    grad_sum = [g if s is None else (s if g is None else s + g)
                for s, g in zip(grad_sum, grads)]
    per_split.append(outputs)
    waits = [g for g in grads if g is not None] or [outputs["loss"]]
  joined = {}
  for key in per_split[0]:
    values = [o[key] for o in per_split]
    if num_splits > 1 and name in values[0].shape.dimension_names:
      joined[key] = _join(values, batch_dim, micro, splits)
    else:
      total = values[0]
      for v in values[1:]:
        total = total + v
      joined[key] = total
  return grad_sum, joined

from mesh_tensorflow.core import autograph_exempt as _autograph_exempt  # noqa: E402  pylint: disable=g-import-not-at-top
_autograph_exempt.exempt(globals())  # AutoGraph leaves this module's code alone
