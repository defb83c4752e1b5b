"""mtf operations, one module per family (constant_ops, einsum_ops, elementwise,
reduction, shape_ops, slicing, indexing, ...).

As a module, `mesh_tensorflow.ops` also answers to the original Mesh
TensorFlow's `ops` names: every public name of the original's ops.py is
resolved (on first use) from the `mesh_tensorflow` package, so code written
as `from mesh_tensorflow import ops` or `from mesh_tensorflow.ops import *`
keeps working. As in the original, the names that would shadow Python builtins
are only here under their `mtf_` names (`mtf_abs`, `mtf_pow`, `mtf_range`,
`mtf_slice`); `mesh_tensorflow.compat.ops_with_redefined_builtins` adds the
builtin-named ones.

    >>> from mesh_tensorflow import ops
    >>> y = ops.reduce_sum(ops.einsum([a, b], output_shape=[batch]))
"""

import importlib as _importlib

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
_NAMES = frozenset(__all__)


def __getattr__(name):
  if name in _NAMES:
    value = getattr(_importlib.import_module("mesh_tensorflow"), name)
    globals()[name] = value  # later lookups skip this function
    return value
  raise AttributeError(f"module 'mesh_tensorflow.ops' has no attribute {name!r}")


def __dir__():
  return sorted(set(globals()) | _NAMES)
