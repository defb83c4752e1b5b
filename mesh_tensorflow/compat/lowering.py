"""The original Mesh TensorFlow's names on the lowering: `Lowering`'s
arguments and a mesh implementation's aliases.

`mtf.Lowering` takes the original's `autostack` and `log_file` (this
library never stacks variables: each is its own slice variables).

Code written for the original calls collectives by its names (`allgather`,
`allsplit`, `permute`), builds laid-out tensors through the implementation
(`mesh_impl.LaidOutTensor([...])`) and passes the mtf Tensor first to
`import_tf_tensor` / `export_to_tf_tensor`. `OriginalMeshImplNames` adds
those to an implementation; the classes at the original's paths
(`mtf.MeshImpl`, `mtf.placement_mesh_impl.PlacementMeshImpl`,
`mtf.simd_mesh_impl.SimdMeshImpl`) carry it, the implementations under
`mesh_tensorflow.lowering` do not.

    >>> impl = mtf.placement_mesh_impl.PlacementMeshImpl("all:2", "", ["cpu:0", "cpu:1"])
    >>> laid = impl.LaidOutTensor([tf.ones([2]), tf.ones([2])])
    >>> whole = impl.allgather(laid, mesh_axis=0, concat_axis=0)
"""

from __future__ import annotations

from mesh_tensorflow.core.graph import Tensor
from mesh_tensorflow.lowering import lowering as _lowering
from mesh_tensorflow.lowering import mesh_impl as _mesh_impl
from mesh_tensorflow.lowering.mesh_impl import LaidOutTensor


def value_and_shape(value, shape):
  """(value, shape) of an import or export call given in this library's
  order (value, shape) or the original's (mtf_tensor, value).

      >>> value_and_shape(tf_x, shape)          # (tf_x, shape)
      >>> value_and_shape(mtf_x, tf_x)          # (tf_x, mtf_x.shape)
  """
  if isinstance(value, Tensor):
    return shape, value.shape  # the original's order: the mtf.Tensor first
  return value, shape


class OriginalMeshImplNames:
  """The original's names, mixed into a MeshImpl subclass (first base)."""

  # The original's nested class name: `mesh_impl.LaidOutTensor([...])`.
  LaidOutTensor = LaidOutTensor

  def allgather(self, x: LaidOutTensor, mesh_axis: int, concat_axis: int) -> LaidOutTensor:
    """The original's name for allconcat."""
    return self.allconcat(x, mesh_axis, concat_axis)

  def allsplit(self, x: LaidOutTensor, mesh_axis: int, split_axis: int) -> LaidOutTensor:
    """The original's name for slice_along: keeps each processor's block of
    `split_axis` by its coordinate along `mesh_axis`, without communication."""
    return self.slice_along(x, mesh_axis, split_axis)

  def permute(self, x: LaidOutTensor, mesh_axis: int, source_pcoord) -> LaidOutTensor:
    """The original's name for receive: a permutation of slices along one
    mesh dimension."""
    return self.receive(x, mesh_axis, source_pcoord)

  def import_tf_tensor(self, x, shape) -> LaidOutTensor:
    """As MeshImpl.import_tf_tensor; the original's order
    `import_tf_tensor(mtf_tensor, tf_x)` works too."""
    return super().import_tf_tensor(*value_and_shape(x, shape))

  def export_to_tf_tensor(self, x, shape):
    """As MeshImpl.export_to_tf_tensor; the original's order
    `export_to_tf_tensor(mtf_tensor, laid_out_x)` works too."""
    return super().export_to_tf_tensor(*value_and_shape(x, shape))


class MeshImpl(OriginalMeshImplNames, _mesh_impl.MeshImpl):
  """`mtf.MeshImpl`: the implementation interface, with the original's names."""


class Lowering(_lowering.Lowering):
  """`mtf.Lowering`, also taking the original's `autostack` (kept as an
  attribute; it changes nothing) and `log_file` (ignored).

  Example:
    >>> lowering = mtf.Lowering(graph, {mesh: impl}, autostack=False)
  """

  def __init__(self, graph, mesh_to_impl, autostack: bool = True, log_file=None, **kwargs):
    del log_file
    super().__init__(graph, mesh_to_impl, **kwargs)
    self.autostack = autostack

from mesh_tensorflow.core import autograph_exempt as _autograph_exempt  # noqa: E402  pylint: disable=g-import-not-at-top
_autograph_exempt.exempt({"MeshImpl": MeshImpl, "Lowering": Lowering})  # its methods; AutoGraph leaves them alone
