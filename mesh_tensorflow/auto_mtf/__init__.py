"""Automatic layouts: search the legal layouts (and mesh shapes) of an mtf
graph with the cost model and pick the fastest that fits in memory (`search`)
or the one needing the least memory (`layout`,
`layout_and_mesh_shape`).

    >>> rules = mtf.auto_mtf.layout(graph, "rows:2;cols:4", [loss])
    >>> rules, mesh_shape = mtf.auto_mtf.layout_and_mesh_shape(graph, 8, [loss])
    >>> result = mtf.auto_mtf.search(graph, "rows:2;cols:4", memory_budget_bytes=2**30)
    >>> print(result.explain())

The layout tools are modules here too: `graph_interface.GraphInterface`,
`valid_layouts.LayoutValidator`, `memory_estimator.MemoryEstimator`,
`scheduler.minimize_peak_memory`, `layout_optimizer.LayoutOptimizer` (least
memory per processor, without an integer-programming solver) and
`print_cp_model_solution.print_solution`.
"""

from mesh_tensorflow.auto_mtf.search import (
    Candidate, LayoutSearchError, LayoutSearchResult, NoLayoutFitsError, explain,
    factorizations, layout, layout_and_mesh_shape, legal_layouts, mesh_shapes,
    original_mesh_shapes, search)
from mesh_tensorflow.auto_mtf import api  # noqa: E402
from mesh_tensorflow.auto_mtf import graph_interface  # noqa: E402
from mesh_tensorflow.auto_mtf import layout_optimizer  # noqa: E402
from mesh_tensorflow.auto_mtf import memory_estimator  # noqa: E402
from mesh_tensorflow.auto_mtf import print_cp_model_solution  # noqa: E402
from mesh_tensorflow.auto_mtf import scheduler  # noqa: E402
from mesh_tensorflow.auto_mtf import valid_layouts  # noqa: E402

__all__ = [
    "Candidate", "LayoutSearchError", "LayoutSearchResult", "NoLayoutFitsError", "explain",
    "factorizations", "layout", "layout_and_mesh_shape", "legal_layouts", "mesh_shapes",
    "original_mesh_shapes", "search", "api", "graph_interface", "layout_optimizer",
    "memory_estimator", "print_cp_model_solution", "scheduler", "valid_layouts",
]
