"""Automatic layouts: search the legal layouts (and mesh shapes) of an mtf
graph with the cost model and pick the fastest that fits in memory (`search`)
or, as the original did, the one needing the least memory (`layout`,
`layout_and_mesh_shape`).

    >>> rules = mtf.auto_mtf.layout(graph, "rows:2;cols:4", [loss])
    >>> rules, mesh_shape = mtf.auto_mtf.layout_and_mesh_shape(graph, 8, [loss])
    >>> result = mtf.auto_mtf.search(graph, "rows:2;cols:4", memory_budget_bytes=2**30)
    >>> print(result.explain())
"""

from mesh_tensorflow.auto_mtf.search import (
    Candidate, LayoutSearchError, LayoutSearchResult, NoLayoutFitsError, explain,
    factorizations, layout, layout_and_mesh_shape, legal_layouts, mesh_shapes,
    original_mesh_shapes, search)

__all__ = [
    "Candidate", "LayoutSearchError", "LayoutSearchResult", "NoLayoutFitsError", "explain",
    "factorizations", "layout", "layout_and_mesh_shape", "legal_layouts", "mesh_shapes",
    "original_mesh_shapes", "search",
]
