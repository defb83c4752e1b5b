"""The original Mesh TensorFlow's module path for the automatic layout entry
points: `from mesh_tensorflow.auto_mtf import api; api.layout(...)`.

`layout` and `layout_and_mesh_shape` minimize memory per processor, as the
original did; `search` (in search.py) minimizes estimated step time under a
memory budget.
"""

from typing import Iterator, List, Optional

from mesh_tensorflow.auto_mtf.search import factorizations, layout, layout_and_mesh_shape  # noqa: F401


def _mesh_shape_iterator(num_cores: int, max_mesh_dimensions: Optional[int] = None
                         ) -> Iterator[List[int]]:
  """The original's private name for `factorizations` (kept for its tests)."""
  return factorizations(num_cores, max_mesh_dimensions)
