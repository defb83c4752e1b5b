"""mtf operations, one module per family (constant_ops, einsum_ops, elementwise,
reduction, shape_ops, slicing, indexing, ...).

As a module, `mesh_tensorflow.ops` is also the original Mesh TensorFlow's
`ops` namespace (its core names and every operation), gathered in
`mesh_tensorflow.compat.original_ops` and re-exported here, so code written as
`from mesh_tensorflow import ops` or `from mesh_tensorflow.ops import *` keeps
working.

    >>> from mesh_tensorflow import ops
    >>> y = ops.reduce_sum(ops.einsum([a, b], output_shape=[batch]))
"""

from mesh_tensorflow.compat.original_ops import *  # noqa: F401,F403  pylint: disable=wildcard-import
from mesh_tensorflow.compat.original_ops import __all__  # noqa: F401
