"""Mesh TensorFlow for TensorFlow 2: models over named dimensions, laid out on
device meshes.

    >>> import mesh_tensorflow as mtf
    >>> graph = mtf.Graph()
    >>> mesh = mtf.Mesh(graph, "mesh")
"""

from mesh_tensorflow import cli as _cli
from mesh_tensorflow import _environment
_environment.check_tensorflow()  # one line if TensorFlow is missing or untested (quiet for commands)

from mesh_tensorflow.compat import original_paths as _original_paths
_original_paths.install()  # the original's module paths (mesh_tensorflow.optimize, ...)
del _original_paths

from mesh_tensorflow.core.shapes import Dimension, Shape, convert_to_dimension, convert_to_shape
from mesh_tensorflow.core.layout import (
    LayoutRules, TensorLayout, convert_to_layout_rules, pnum_to_processor_coordinates,
    processor_coordinates_to_pnum, processor_groups)
from mesh_tensorflow.core.graph import Graph, Mesh, Operation, Tensor, name_scope
from mesh_tensorflow.lowering.mesh_impl import (
    LaidOutTensor, LazyAllreduceSum, LazyLaidOutTensor, compatible_lazy_allreduce_sums,
    convert_args_to_laid_out_tensors)
from mesh_tensorflow.lowering.lowering import pretty_print_counters
from mesh_tensorflow.operations.gradients import gradients
# The mesh implementations as the original named them (compat.lowering):
# `mtf.placement_mesh_impl.PlacementMeshImpl`, ..., with the original's aliases.
from mesh_tensorflow.compat.lowering import Lowering, MeshImpl
from mesh_tensorflow.compat import placement_mesh_impl
from mesh_tensorflow.compat import simd_mesh_impl
from mesh_tensorflow.training import learning_rate_schedules
from mesh_tensorflow.compat import utils
from mesh_tensorflow.training import optimize
from mesh_tensorflow.layers import initializers
from mesh_tensorflow import layers
from mesh_tensorflow.compat.placement_mesh_impl import PlacementMeshImpl
from mesh_tensorflow.compat.simd_mesh_impl import SimdMeshImpl
from mesh_tensorflow.training import checkpoint
from mesh_tensorflow.compat import original_checkpoint as _original_checkpoint
del _original_checkpoint  # imported to register the TF1 name-based format with checkpoint
from mesh_tensorflow import training
from mesh_tensorflow.distributed import cluster  # meshes over several processes/hosts
from mesh_tensorflow.training import zero
from mesh_tensorflow.training import offload
from mesh_tensorflow.training import mixed_precision
from mesh_tensorflow.training import adascale
from mesh_tensorflow.operations import replica_stats
from mesh_tensorflow.operations.replica_stats import replica_squared_norm
from mesh_tensorflow.training.trainer import scalar_summary

from mesh_tensorflow.operations.constant_ops import (
    constant, fill, import_fully_replicated, import_laid_out_tensor, import_tf_tensor,
    ones, ones_like, zeros, zeros_like)
from mesh_tensorflow.operations.elementwise import (
    ElementwiseOperation, abs, add, add_n, cast, ceil, clip_by_value, cos, divide, elu,
    equal, erf, exp, expm1, floor, floordiv, gelu, greater, greater_equal, identity,
    is_finite, leaky_relu, less, less_equal, log, log1p, logical_and, logical_not,
    logical_or, logical_xor, maximum, minimum, mod, multiply, negative, not_equal, pow,
    reciprocal, relu, relu6, round, rsqrt, selu, sigmoid, sign, silu, sin, softplus, sqrt,
    square, squared_difference, squared_relu, sub, subtract, swish, tanh, to_bfloat16,
    to_float, to_int32, truediv, where)
from mesh_tensorflow.operations.einsum_ops import EinsumOperation, einsum, matmul
from mesh_tensorflow.operations.reduction import (
    ReduceOperation, SoftmaxOperation, log_softmax, pool_tensor_1d, reduce_all, reduce_any,
    reduce_logsumexp, reduce_max, reduce_mean, reduce_min, reduce_sum, softmax)
from mesh_tensorflow.operations.shape_ops import (
    broadcast, rename_dimension, replace_dimensions, reshape, transpose)
from mesh_tensorflow.operations.slicing import (
    concat, dynamic_shift, mtf_slice, pad, shift, slice, split, stack, unstack)
from mesh_tensorflow.operations.indexing import (
    argmax, cumsum, gather, mtf_range, one_hot, range, reduce_first, sample_with_temperature,
    stride_tensor_1d, top_1, top_k)
from mesh_tensorflow.operations.random_ops import dropout, random_normal, random_uniform
from mesh_tensorflow.operations.variables import (
    Assign, Variable, VariableDType, assign, assign_add, assign_sub, get_variable,
    read_variable)
from mesh_tensorflow.operations.conv import (avg_pool2d, avg_pool3d, conv2d, conv2d_backprop_filter, conv2d_backprop_input, conv2d_transpose, conv2d_transpose_backprop_filter, conv2d_transpose_backprop_input, conv2d_with_blocks, conv3d, conv3d_backprop_filter, conv3d_backprop_input, conv3d_transpose, conv3d_transpose_backprop_filter, conv3d_transpose_backprop_input, conv3d_with_blocks, halo_exchange, max_pool2d, max_pool3d)  # pylint: disable=line-too-long
from mesh_tensorflow.operations.control import (
    CustomGradientOperation, Print, SavedOutput, custom_gradient, depend, kept_by_recompute,
    product_without_batch_dims, recompute_grad, stop_gradient, while_loop)
from mesh_tensorflow.operations.slicewise_ops import (
    GenericGradOperation, SlicewiseOperation, cwise, slicewise)
from mesh_tensorflow.compat.legacy_classes import (  # raise: Estimator is gone
    MtfCheckpointSaverListener, MtfRestoreHook)
from mesh_tensorflow.compat.legacy_classes import (
    AddOperation, MinMaxOperation, PoolBackPropOperation, ScalarSummaryOperation,
    StackedVariable, pool_backprop)
from mesh_tensorflow.compat.legacy_classes import (
    BinaryOpWithBroadcasting, Conv2dOperation, Conv2dTransposeOperation,
    Conv2or3dBackpropFilterOperation, Conv2or3dBackpropInputOperation, Conv3dOperation,
    Conv3dTransposeOperation, PoolOperation, ReadVariable, ScalarAddOperation,
    ScalarMultiplyOperation, SplitOperation, binary_arguments_to_tensors,
    binary_op_with_broadcasting)
from mesh_tensorflow.operations.random_ops import RandomOperation
from mesh_tensorflow.training.microbatches import serialize_training_step
from mesh_tensorflow.operations import signal_ops  # noqa: F401  (mtf.signal_ops.fft3d, ifft3d)
from mesh_tensorflow.operations.utilities import (
    anonymize, anonymous_shape, assign_add_slice, assign_slice, assign_sub_slice,
    binary_reduction_fn, combined_dimension, is_subsequence, left_halo_exchange, list_product,
    log_variable_sizes, nth_largest_element, nth_smallest_element, parallel, pnum_to_group,
    pool_fn, reduction_fn, tensor_dim_to_mesh_dim_size, tensor_dim_to_size_per_split,
    transpose_list_of_lists, verify_no_new_dims)
# The original's class names for this library's own operation classes.
from mesh_tensorflow.operations.constant_ops import (  # noqa: E402
    ConstantOperation, ImportLaidOutOperation, ImportOperation)
from mesh_tensorflow.operations.shape_ops import (  # noqa: E402
    BroadcastOperation, ReshapeOperation, TransposeOperation)
from mesh_tensorflow.operations.slicing import (  # noqa: E402
    ConcatOperation, PadOperation, ShiftOperation, SliceOperation, StackOperation,
    UnstackOperation)
from mesh_tensorflow.operations.indexing import (  # noqa: E402
    CumsumOperation, GatherOperation, OneHotOperation, RangeOperation, TopKOperation)
from mesh_tensorflow.operations.control import (  # noqa: E402
    Depend, PrintOperation, StopGradient, WhileLoopOperation)
Constant = ConstantOperation
ImportLaidOutTensorOperation = ImportLaidOutOperation
mtf_pow = pow
mtf_abs = abs

from mesh_tensorflow.layers import beam_search
from mesh_tensorflow.training import pipeline  # pipeline parallelism over a "stages" dimension
from mesh_tensorflow.lowering import tpu_variables
from mesh_tensorflow.lowering import slice_variables  # mtf.slice_variables.scalar_state, ...
from mesh_tensorflow.training import checkpoint_verify  # mtf.checkpoint_verify.verify
from mesh_tensorflow.compat import ops_with_redefined_builtins  # the original's mtf.ops_with_redefined_builtins
from mesh_tensorflow.compat import original_ops as ops  # the original's one-module namespace, mtf.ops


__version__ = "0.2.0"

# The layers above the core library load on first use (PEP 562), so that
# `import mesh_tensorflow` brings in neither the transformer library nor the
# cost model and layout search: `mtf.transformer`, `mtf.cost_model`,
# `mtf.auto_mtf` and `mtf.layout_report` resolve when first read.
# Name -> (module, attribute or None for the module).
_LAZY = {
    "auto_mtf": ("mesh_tensorflow.auto_mtf", None),
    "cost_model": ("mesh_tensorflow.analysis.cost_model", None),
    "layout_report": ("mesh_tensorflow.analysis.layout_report", "layout_report"),
    "transformer": ("mesh_tensorflow.transformer", None),
}


def __getattr__(name: str):
  if name not in _LAZY:
    raise AttributeError(f"module 'mesh_tensorflow' has no attribute {name!r}")
  import importlib  # pylint: disable=g-import-not-at-top
  module_name, attribute = _LAZY[name]
  value = importlib.import_module(module_name)
  if attribute is not None:
    namespace = {attribute: getattr(value, attribute)}
    from mesh_tensorflow.core.autograph_exempt import exempt  # pylint: disable=g-import-not-at-top
    exempt(namespace)
    value = namespace[attribute]
  globals()[name] = value
  return value


def __dir__():
  hidden = {"_LAZY", "__getattr__", "__dir__"}
  return sorted((set(globals()) | set(_LAZY)) - hidden)

