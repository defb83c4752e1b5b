"""The original Mesh TensorFlow's `mesh_tensorflow.ops` namespace.

The original kept its core (shapes, graph, lowering, every operation) in one
module, `ops.py`; code written for it imports names from there:
`from mesh_tensorflow import ops`, `from mesh_tensorflow.ops import *`. Here
those names live in their folders; this module gathers them under the
original's list (`__all__`, in its order of sorting) and serves the path
`mesh_tensorflow.ops` (`original_paths`). As in the original, the
names that would shadow Python builtins are only here under their `mtf_`
names (`mtf_abs`, `mtf_pow`, `mtf_range`, `mtf_slice`);
`ops_with_redefined_builtins` adds the builtin-named ones.

    >>> from mesh_tensorflow import ops
    >>> y = ops.reduce_sum(ops.einsum([a, b], output_shape=[batch]))
"""

# pylint: disable=g-multiple-import,unused-import
from mesh_tensorflow.core.shapes import Dimension, Shape, convert_to_dimension, convert_to_shape
from mesh_tensorflow.core.layout import (
    LayoutRules, TensorLayout, convert_to_layout_rules, pnum_to_processor_coordinates,
    processor_coordinates_to_pnum, processor_groups)
from mesh_tensorflow.core.graph import Graph, Mesh, Operation, Tensor
from mesh_tensorflow.lowering.mesh_impl import (
    LazyAllreduceSum, LazyLaidOutTensor, compatible_lazy_allreduce_sums as
    compatible_lazy_allreduce_sums, convert_args_to_laid_out_tensors as
    convert_args_to_laid_out_tensors)
from mesh_tensorflow.compat.lowering import Lowering, MeshImpl
from mesh_tensorflow.lowering.lowering import pretty_print_counters
from mesh_tensorflow.operations.constant_ops import (
    ConstantOperation as Constant, ImportLaidOutOperation as ImportLaidOutTensorOperation,
    ImportOperation, constant, import_fully_replicated, import_laid_out_tensor,
    import_tf_tensor, ones, ones_like, zeros, zeros_like)
from mesh_tensorflow.operations.elementwise import (
    abs as mtf_abs, add, add_n, cast, cos, divide, elu, equal, exp, floordiv, gelu, greater,
    greater_equal, identity, leaky_relu, less, less_equal, log, logical_and, logical_not,
    logical_or, maximum, minimum, mod, multiply, negative, not_equal, pow as mtf_pow,
    reciprocal, relu, rsqrt, selu, sigmoid, sign, sin, softplus, sqrt, square, sub, swish,
    tanh, to_bfloat16, to_float, to_int32, where)
from mesh_tensorflow.operations.einsum_ops import EinsumOperation, einsum, matmul
from mesh_tensorflow.operations.reduction import (
    ReduceOperation, log_softmax, pool_tensor_1d, reduce_all, reduce_any, reduce_logsumexp,
    reduce_max, reduce_mean, reduce_min, reduce_sum, softmax)
from mesh_tensorflow.operations.shape_ops import (
    BroadcastOperation, ReshapeOperation, broadcast, rename_dimension, replace_dimensions,
    reshape, transpose)
from mesh_tensorflow.operations.slicing import (
    ConcatOperation, PadOperation, ShiftOperation, SliceOperation, StackOperation,
    UnstackOperation, concat, dynamic_shift, mtf_slice, pad, shift, split, stack, unstack)
from mesh_tensorflow.operations.indexing import (
    OneHotOperation, RangeOperation, TopKOperation, argmax, cumsum, gather, mtf_range,
    one_hot, reduce_first, sample_with_temperature, stride_tensor_1d, top_1, top_k)
from mesh_tensorflow.operations.random_ops import RandomOperation, dropout, random_normal, random_uniform
from mesh_tensorflow.operations.variables import (
    Assign, Variable, VariableDType, assign, assign_add, assign_sub, get_variable,
    read_variable)
from mesh_tensorflow.operations.conv import (
    conv2d_backprop_filter, conv2d_backprop_input, conv2d_transpose_backprop_filter,
    conv2d_transpose_backprop_input, conv3d_backprop_filter, conv3d_backprop_input,
    conv3d_transpose_backprop_filter, conv3d_transpose_backprop_input, halo_exchange)
from mesh_tensorflow.operations.control import (
    CustomGradientOperation, Depend, Print, PrintOperation, StopGradient,
    WhileLoopOperation, custom_gradient, depend, recompute_grad, stop_gradient, while_loop)
from mesh_tensorflow.operations.slicewise_ops import (
    GenericGradOperation, SlicewiseOperation, cwise, slicewise)
from mesh_tensorflow.operations.gradients import gradients
from mesh_tensorflow.operations.utilities import (
    anonymize, anonymous_shape, assign_add_slice, assign_slice, assign_sub_slice,
    binary_reduction_fn, combined_dimension, is_subsequence, left_halo_exchange,
    list_product, log_variable_sizes, nth_largest_element, nth_smallest_element, parallel,
    pnum_to_group, pool_fn, reduction_fn, tensor_dim_to_mesh_dim_size,
    tensor_dim_to_size_per_split, transpose_list_of_lists, verify_no_new_dims)
from mesh_tensorflow.training.microbatches import serialize_training_step
from mesh_tensorflow.training.trainer import scalar_summary as scalar_summary
from mesh_tensorflow.compat.legacy_classes import (
    MtfCheckpointSaverListener, MtfRestoreHook,
    AddOperation, BinaryOpWithBroadcasting, Conv2dOperation, Conv2dTransposeOperation,
    Conv2or3dBackpropFilterOperation, Conv2or3dBackpropInputOperation, Conv3dOperation,
    Conv3dTransposeOperation, MinMaxOperation, PoolBackPropOperation, PoolOperation,
    ReadVariable, ScalarAddOperation, ScalarMultiplyOperation, ScalarSummaryOperation,
    SplitOperation, StackedVariable, binary_arguments_to_tensors,
    binary_op_with_broadcasting, pool_backprop)

# The original's public ops names, in its order of sorting.
__all__ = (
    'AddOperation', 'Assign', 'BinaryOpWithBroadcasting', 'BroadcastOperation',
    'ConcatOperation', 'Constant', 'Conv2dOperation', 'Conv2dTransposeOperation',
    'Conv2or3dBackpropFilterOperation', 'Conv2or3dBackpropInputOperation',
    'Conv3dOperation', 'Conv3dTransposeOperation', 'CustomGradientOperation', 'Depend',
    'Dimension', 'EinsumOperation', 'GenericGradOperation', 'Graph',
    'ImportLaidOutTensorOperation', 'ImportOperation', 'LayoutRules', 'LazyAllreduceSum',
    'LazyLaidOutTensor', 'Lowering', 'Mesh', 'MeshImpl', 'MinMaxOperation',
    'MtfCheckpointSaverListener', 'MtfRestoreHook', 'OneHotOperation', 'Operation',
    'PadOperation', 'PoolBackPropOperation', 'PoolOperation', 'Print', 'PrintOperation',
    'RandomOperation', 'RangeOperation', 'ReadVariable', 'ReduceOperation',
    'ReshapeOperation', 'ScalarAddOperation', 'ScalarMultiplyOperation',
    'ScalarSummaryOperation', 'Shape', 'ShiftOperation', 'SliceOperation',
    'SlicewiseOperation', 'SplitOperation', 'StackOperation', 'StackedVariable',
    'StopGradient', 'Tensor', 'TensorLayout', 'TopKOperation', 'UnstackOperation',
    'Variable', 'VariableDType', 'WhileLoopOperation', 'add', 'add_n', 'anonymize',
    'anonymous_shape', 'argmax', 'assign', 'assign_add', 'assign_add_slice', 'assign_slice',
    'assign_sub', 'assign_sub_slice', 'binary_arguments_to_tensors',
    'binary_op_with_broadcasting', 'binary_reduction_fn', 'broadcast', 'cast',
    'combined_dimension', 'compatible_lazy_allreduce_sums', 'concat', 'constant',
    'conv2d_backprop_filter', 'conv2d_backprop_input', 'conv2d_transpose_backprop_filter',
    'conv2d_transpose_backprop_input', 'conv3d_backprop_filter', 'conv3d_backprop_input',
    'conv3d_transpose_backprop_filter', 'conv3d_transpose_backprop_input',
    'convert_args_to_laid_out_tensors', 'convert_to_dimension', 'convert_to_layout_rules',
    'convert_to_shape', 'cos', 'cumsum', 'custom_gradient', 'cwise', 'depend', 'divide',
    'dropout', 'dynamic_shift', 'einsum', 'elu', 'equal', 'exp', 'floordiv', 'gather',
    'gelu', 'get_variable', 'gradients', 'greater', 'greater_equal', 'halo_exchange',
    'identity', 'import_fully_replicated', 'import_laid_out_tensor', 'import_tf_tensor',
    'is_subsequence', 'leaky_relu', 'left_halo_exchange', 'less', 'less_equal',
    'list_product', 'log', 'log_softmax', 'log_variable_sizes', 'logical_and',
    'logical_not', 'logical_or', 'matmul', 'maximum', 'minimum', 'mod', 'mtf_abs',
    'mtf_pow', 'mtf_range', 'mtf_slice', 'multiply', 'negative', 'not_equal',
    'nth_largest_element', 'nth_smallest_element', 'one_hot', 'ones', 'ones_like', 'pad',
    'parallel', 'pnum_to_group', 'pnum_to_processor_coordinates', 'pool_backprop',
    'pool_fn', 'pool_tensor_1d', 'pretty_print_counters', 'processor_coordinates_to_pnum',
    'processor_groups', 'random_normal', 'random_uniform', 'read_variable', 'reciprocal',
    'recompute_grad', 'reduce_all', 'reduce_any', 'reduce_first', 'reduce_logsumexp',
    'reduce_max', 'reduce_mean', 'reduce_min', 'reduce_sum', 'reduction_fn', 'relu',
    'rename_dimension', 'replace_dimensions', 'reshape', 'rsqrt', 'sample_with_temperature',
    'scalar_summary', 'selu', 'serialize_training_step', 'shift', 'sigmoid', 'sign', 'sin',
    'slicewise', 'softmax', 'softplus', 'split', 'sqrt', 'square', 'stack', 'stop_gradient',
    'stride_tensor_1d', 'sub', 'swish', 'tanh', 'tensor_dim_to_mesh_dim_size',
    'tensor_dim_to_size_per_split', 'to_bfloat16', 'to_float', 'to_int32', 'top_1', 'top_k',
    'transpose', 'transpose_list_of_lists', 'unstack', 'verify_no_new_dims', 'where',
    'while_loop', 'zeros', 'zeros_like'
)
