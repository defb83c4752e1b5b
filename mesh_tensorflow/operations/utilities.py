"""Small helpers that Mesh TensorFlow code calls as `mtf.*`: shape and layout
arithmetic, list utilities, reduction-function lookup, anonymous (never split)
dimensions, n-th largest elements, and the slice-level assign functions.

    >>> flat = mtf.combined_dimension([heads, d_kv])        # heads*d_kv
    >>> replicated = mtf.anonymize(x)                        # no rule splits it
    >>> mtf.pnum_to_group("rows:2;cols:4", [1], 5)           # 1: row 1's group
"""

from __future__ import annotations

import math
from typing import Callable, List, Optional, Sequence

import tensorflow as tf
from absl import logging

from mesh_tensorflow.core.graph import Tensor
from mesh_tensorflow.core.layout import (
    convert_to_layout_rules, pnum_to_processor_coordinates, processor_coordinates_to_pnum)
from mesh_tensorflow.core.shapes import Dimension, Shape, convert_to_dimension, convert_to_shape
from mesh_tensorflow.operations import conv
from mesh_tensorflow.operations.indexing import gather, top_k
from mesh_tensorflow.operations.shape_ops import reshape

_ANONYMOUS_PREFIX = "_anonymous_"


def list_product(values) -> int:
  """The product of a list of numbers (1 for an empty list)."""
  return math.prod(values)


def transpose_list_of_lists(lol: Sequence[Sequence]) -> List[list]:
  """[[a, b], [c, d]] -> [[a, c], [b, d]]."""
  if not lol:
    raise ValueError("transpose_list_of_lists: cannot transpose an empty list.")
  return [list(column) for column in zip(*lol)]


def is_subsequence(short_seq: Sequence, long_seq: Sequence) -> bool:
  """Whether short_seq's elements appear in long_seq in the same order."""
  remaining = iter(long_seq)
  return all(any(x == y for y in remaining) for x in short_seq)


def verify_no_new_dims(input_shapes, output_shape) -> None:
  """Raises ValueError if output_shape has a dimension no input shape has."""
  known = {d.name for s in input_shapes for d in convert_to_shape(s).dims}
  new = [d.name for d in convert_to_shape(output_shape).dims if d.name not in known]
  if new:
    raise ValueError(
        f"Output shape {output_shape} has dimensions {new} that no input has "
        f"(inputs: {[str(s) for s in input_shapes]}).")


def combined_dimension(dims: Sequence[Dimension], name: Optional[str] = None) -> Dimension:
  """One Dimension as large as `dims` together, named `name` or like dims[0]."""
  dims = [convert_to_dimension(d) for d in dims]
  if not dims:
    raise ValueError("combined_dimension needs at least one dimension.")
  return Dimension(name or dims[0].name, list_product(d.size for d in dims))


def anonymous_shape(shape) -> Shape:
  """`shape` with every dimension renamed to a name no layout rule matches, so
  a tensor of this shape is never split."""
  shape = convert_to_shape(shape)
  return Shape([d if d.name.startswith(_ANONYMOUS_PREFIX)
                else Dimension(_ANONYMOUS_PREFIX + d.name, d.size) for d in shape.dims])


def anonymize(x: Tensor) -> Tensor:
  """x, replicated on every processor (its dimensions renamed to anonymous
  ones); `mtf.reshape(y, x.shape)` names them again."""
  return reshape(x, anonymous_shape(x.shape))


def pnum_to_group(mesh_shape, group_dims: Sequence[int], pnum: int) -> int:
  """The index of processor `pnum`'s group, where a group is the processors
  that differ only along the mesh axes `group_dims`."""
  mesh_shape = convert_to_shape(mesh_shape)
  coords = pnum_to_processor_coordinates(mesh_shape, pnum)
  others = [i for i in range(mesh_shape.ndims) if i not in group_dims]
  return processor_coordinates_to_pnum(
      Shape([mesh_shape.dims[i] for i in others]), [coords[i] for i in others])


def tensor_dim_to_mesh_dim_size(layout, mesh_shape, tensor_dim) -> int:
  """How many ways the layout splits `tensor_dim` on `mesh_shape` (1: not split)."""
  mesh_shape = convert_to_shape(mesh_shape)
  axis = convert_to_layout_rules(layout).tensor_dimension_to_mesh_axis(
      convert_to_dimension(tensor_dim), mesh_shape)
  return 1 if axis is None else mesh_shape.dims[axis].size


def tensor_dim_to_size_per_split(layout, mesh_shape, tensor_dim) -> int:
  """The size of one processor's slice of `tensor_dim` under the layout."""
  tensor_dim = convert_to_dimension(tensor_dim)
  ways = tensor_dim_to_mesh_dim_size(layout, mesh_shape, tensor_dim)
  if tensor_dim.size % ways:
    raise ValueError(
        f"Dimension {tensor_dim.name!r} (size {tensor_dim.size}) is split {ways} ways, "
        "which does not divide it; change the layout or the size.")
  return tensor_dim.size // ways


_BINARY = {"SUM": tf.add, "MAX": tf.maximum, "MIN": tf.minimum,
           "ANY": tf.logical_or, "ALL": tf.logical_and}
_REDUCE = {"SUM": tf.reduce_sum, "MAX": tf.reduce_max, "MIN": tf.reduce_min,
           "ANY": tf.reduce_any, "ALL": tf.reduce_all, "LOGSUMEXP": tf.reduce_logsumexp}
_POOL = {"MAX_2D": tf.nn.max_pool2d, "AVG_2D": tf.nn.avg_pool2d,
         "MAX_3D": tf.nn.max_pool3d, "AVG_3D": tf.nn.avg_pool3d}


def _lookup(table, key: str, what: str):
  try:
    return table[key]
  except KeyError:
    raise ValueError(f"Unknown {what} {key!r}; use one of {sorted(table)}.") from None


def binary_reduction_fn(reduction_fn_string: str) -> Callable:
  """The TensorFlow function combining two values: "SUM" -> tf.add, ..."""
  return _lookup(_BINARY, reduction_fn_string, "reduction")


def reduction_fn(reduction_fn_string: str) -> Callable:
  """The TensorFlow reduction: "SUM" -> tf.reduce_sum, "MAX", "MIN", "ANY",
  "ALL", "LOGSUMEXP"."""
  return _lookup(_REDUCE, reduction_fn_string, "reduction")


def pool_fn(pool_fn_string: str) -> Callable:
  """The TensorFlow pooling function: "MAX_2D", "AVG_2D", "MAX_3D", "AVG_3D"."""
  return _lookup(_POOL, pool_fn_string, "pooling")


def nth_largest_element(x: Tensor, n: int, reduced_dim, name=None) -> Tensor:
  """The (n+1)-th largest value along reduced_dim (n=0: the maximum)."""
  k_dim = Dimension("_top_k_", n + 1)
  values, _ = top_k(x, reduced_dim=reduced_dim, k_dim=k_dim, name=name)
  return gather(values, n, k_dim)


def nth_smallest_element(x: Tensor, n: int, reduced_dim, name=None) -> Tensor:
  """The (n+1)-th smallest value along reduced_dim (n=0: the minimum)."""
  return -nth_largest_element(-x, n, reduced_dim, name=name)


def left_halo_exchange(x: Tensor, blocks_dim, block_size_dim, halo_size: int,
                       wrap: bool = False) -> Tensor:
  """Like mtf.halo_exchange, but each block gets only the `halo_size`
  elements before it (block_size_dim grows by halo_size)."""
  if halo_size < 0:
    raise ValueError(f"mtf.left_halo_exchange: halo_size must be >= 0, got {halo_size}.")
  blocks = conv._dim_of(x.shape, blocks_dim, "mtf.left_halo_exchange")  # pylint: disable=protected-access
  block = conv._dim_of(x.shape, block_size_dim, "mtf.left_halo_exchange")  # pylint: disable=protected-access
  return conv._halo_exchange(x, blocks, block, int(halo_size), 0, bool(wrap))  # pylint: disable=protected-access


def parallel(devices: Sequence[str], fn: Callable, *args, **kwargs):
  """fn(args[0][i], ..., **{k: kwargs[k][i]}) on each devices[i]; every
  argument is a list with one entry per device. Returns the list of results
  (a tuple of lists when fn returns tuples)."""
  devices = list(devices)
  for value in list(args) + list(kwargs.values()):
    if not isinstance(value, (list, tuple)) or len(value) != len(devices):
      raise ValueError(
          f"mtf.parallel: every argument must be a list of {len(devices)} values "
          f"(one per device), got {value!r}.")
  results = []
  for i, device in enumerate(devices):
    with tf.device(device):
      results.append(fn(*[a[i] for a in args], **{k: v[i] for k, v in kwargs.items()}))
  if results and isinstance(results[0], tuple):
    return tuple(transpose_list_of_lists(results))
  return results


def assign_slice(variable: tf.Variable, slice_var: tf.Variable, val):
  """Assigns `val` to one processor's slice variable (the `assign_fn` of
  mtf.assign; `variable` is the mtf Variable, unused here)."""
  del variable
  return slice_var.assign(val)


def assign_add_slice(variable: tf.Variable, slice_var: tf.Variable, val):
  del variable
  return slice_var.assign_add(val)


def assign_sub_slice(variable: tf.Variable, slice_var: tf.Variable, val):
  del variable
  return slice_var.assign_sub(val)


def log_variable_sizes(var_list, tag: str, verbose: bool = True, mesh_to_impl=None,
                       log_file=None) -> int:
  """Logs each mtf variable's shape and size and the total; returns the total.

  With `mesh_to_impl` ({mesh: mesh_impl}) it also logs the size of one
  processor's slice.
  """
  lines = []
  total = 0
  for var in sorted(var_list, key=lambda v: v.name):
    size = var.shape.size
    total += size
    extra = ""
    if mesh_to_impl is not None and var.mesh in mesh_to_impl:
      extra = f"  slice {mesh_to_impl[var.mesh].slice_size(var.shape)}"
    if verbose:
      lines.append(f"  {var.name:<60} {var.shape}  {size}{extra}")
  lines.append(f"{tag}: {len(var_list)} variables, total size {total}")
  for line in lines:
    logging.info(line)
    if log_file is not None:
      log_file.write(line + "\n")
  return total

from mesh_tensorflow.core import autograph_exempt as _autograph_exempt  # noqa: E402  pylint: disable=g-import-not-at-top
_autograph_exempt.exempt(globals())  # AutoGraph leaves this module's code alone
