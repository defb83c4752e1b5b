"""Turning an mtf graph into per-processor TensorFlow ops.

`mesh_impl` defines the interface every mesh implementation follows (laid-out
tensors, slicing, collectives), `placement_mesh_impl` and `simd_mesh_impl` are
the two implementations, `lowering` walks the graph. `plans` says what an
operation communicates under a layout (the implementations execute the plans,
the cost model prices them) with the size-based choices of `policies`, and
`observers` passes every executed collective to whoever counts, and
`sharing` says which processors hold the same tensor where they share
memory. Slice and
master variables, TPU topology and collective keys support them.

The graph walk's names (`Lowering`, `pretty_print_counters`) are also
readable here.
"""

from mesh_tensorflow.lowering.lowering import Lowering, pretty_print_counters  # noqa: F401
