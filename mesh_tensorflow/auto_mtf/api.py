"""The automatic layout entry points as a module:
`from mesh_tensorflow.auto_mtf import api; api.layout(...)`.

`layout` and `layout_and_mesh_shape` minimize memory per processor; `search`
(in search.py) minimizes estimated step time under a memory budget.
"""

from typing import Iterator, List, Optional

from mesh_tensorflow.auto_mtf.search import factorizations, layout, layout_and_mesh_shape  # noqa: F401


def _mesh_shape_iterator(num_cores: int, max_mesh_dimensions: Optional[int] = None
                         ) -> Iterator[List[int]]:
  """`factorizations` under its private name."""
  return factorizations(num_cores, max_mesh_dimensions)
