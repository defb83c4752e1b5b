"""mtf operations, one module per family: constants and imports
(`constant_ops`), elementwise math (`elementwise`), `einsum_ops`, reductions
(`reduction`), reshapes and layout changes (`shape_ops`), slicing, indexing,
random numbers, convolutions and pooling, control (`control`), variables, and
automatic differentiation (`gradients`).

The package root (`import mesh_tensorflow as mtf`) exports their public
names. `mesh_tensorflow.ops` is the original Mesh TensorFlow's one-module
namespace, served by `compat.original_ops`.

    >>> from mesh_tensorflow.operations import einsum_ops
    >>> y = einsum_ops.einsum([a, b], output_shape=[batch])
"""
