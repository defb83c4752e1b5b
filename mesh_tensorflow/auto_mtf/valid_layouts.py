"""Which tensor dimensions may go on which mesh dimensions
(`LayoutValidator`).

A dimension may be split when no operation of the graph needs it whole (an
operation's `unsplittable_dims`, e.g. the concatenated dimension of
`mtf.concat`) and it is not anonymous; it may go on a mesh dimension whose
size divides every size the dimension has in the graph.

    >>> validator = LayoutValidator(mtf_graph, "m1:4;m2:2")
    >>> validator.is_valid_assignment("batch", "m1")
    True
"""

from __future__ import annotations

import math
from typing import Dict, Set

from mesh_tensorflow.core.shapes import convert_to_shape

_ANONYMOUS_PREFIX = "_anonymous_"


class LayoutValidator:
  """Splittability and divisibility of an mtf graph's dimensions on a mesh.

  Args:
    mtf_graph: an mtf.Graph.
    mesh_shape: an mtf.Shape (or its string, e.g. "m1:4;m2:2").

  Attributes:
    splittable_mtf_dimension_names: names of the dimensions a layout may split.
    mesh_dimension_name_to_size: {mesh dimension name: size}.

  Example:
    >>> LayoutValidator(mtf_graph, "m1:4;m2:2").splittable_mtf_dimension_names
    {'a', 'b'}
  """

  def __init__(self, mtf_graph, mesh_shape):
    mesh_shape = convert_to_shape(mesh_shape)
    names: Set[str] = set()
    unsplittable: Set[str] = set()
    gcd: Dict[str, int] = {}
    for op in mtf_graph.operations:
      unsplittable.update(op.unsplittable_dims)
      for t in op.outputs:
        for d in t.shape.dims:
          if not d.name.startswith(_ANONYMOUS_PREFIX):
            names.add(d.name)
          gcd[d.name] = math.gcd(gcd.get(d.name, d.size), d.size)
    self._splittable_mtf_dimension_names = names - unsplittable
    self._mtf_dimension_name_to_size_gcd = gcd
    self._mesh_dimension_name_to_size = {d.name: d.size for d in mesh_shape.dims}

  @property
  def splittable_mtf_dimension_names(self) -> Set[str]:
    return self._splittable_mtf_dimension_names

  @property
  def mesh_dimension_name_to_size(self) -> Dict[str, int]:
    return self._mesh_dimension_name_to_size

  def is_valid_assignment(self, mtf_dimension_name: str, mesh_dimension_name: str) -> bool:
    """Whether the dimension may be split over the mesh dimension: it is
    splittable and the mesh dimension's size divides each of its sizes.

    Example:
      >>> validator.is_valid_assignment("a", "m2")
    """
    if mesh_dimension_name not in self._mesh_dimension_name_to_size:
      raise ValueError(f"LayoutValidator: no mesh dimension named {mesh_dimension_name!r}; "
                       f"the mesh has {sorted(self._mesh_dimension_name_to_size)}.")
    return (mtf_dimension_name in self._splittable_mtf_dimension_names
            and self._mtf_dimension_name_to_size_gcd[mtf_dimension_name]
            % self._mesh_dimension_name_to_size[mesh_dimension_name] == 0)
