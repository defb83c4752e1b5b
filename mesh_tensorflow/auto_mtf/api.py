"""The original Mesh TensorFlow's module path for the automatic layout entry
points: `from mesh_tensorflow.auto_mtf import api; api.layout(...)`.

The search here minimizes the cost model's estimated step time among layouts
that fit the memory budget (the original minimized memory), so on tiny graphs
it may keep tensors unsplit where the original split them; pass
`memory_budget_bytes` to force splitting (see search.py).
"""

from mesh_tensorflow.auto_mtf.search import layout, layout_and_mesh_shape  # noqa: F401
