"""Per-replica gradient statistics from a pending data-parallel allreduce.

Under data parallelism a weight's gradient is lowered as a
`LazyAllreduceSum`: each processor holds the partial sum of its own local
batch, and the allreduce over the data-parallel mesh dimension is deferred.
Those partial sums are the per-replica gradients, for free.
`replica_squared_norm` reads them (before or after another consumer has
completed the allreduce) and returns the mean over the R replicas of
|g_r|^2, where g_r = R * partial_r, so that the mean of the g_r is the full
gradient when the loss is a mean over the global batch.

Cost: one local square-sum per gradient slice and one scalar allreduce per
distinct set of mesh axes to sum over (the data-parallel one plus those that
split a gradient: usually one or two for a whole model), plus, for a
gradient whose sum is also pending over other mesh dimensions, an allreduce
of its partial gradient over those.

    >>> sq = mtf.replica_stats.replica_squared_norm(mtf.gradients([loss], ws), "rows")
"""

from __future__ import annotations

from typing import Optional, Sequence, Union

import tensorflow as tf

from mesh_tensorflow.core.graph import Operation, Tensor
from mesh_tensorflow.lowering import plans
from mesh_tensorflow.core.shapes import Shape


class ReplicaSquaredNorm(Operation):
  """Mean over the replicas of `mesh_dim` of |g_r|^2 (a float32 scalar), g_r
  being the concatenation of replica r's parts of all the input gradients."""

  def __init__(self, grads: Sequence[Tensor], mesh_dim: str, name: Optional[str] = None):
    if not isinstance(mesh_dim, str) or not mesh_dim:
      raise ValueError(f"replica_squared_norm: mesh_dim must be a mesh dimension name, "
                       f"got {mesh_dim!r}.")
    super().__init__(grads, name=name or "replica_squared_norm")
    self.mesh_dim = mesh_dim
    self._outputs = [Tensor(self, Shape([]), tf.float32)]

  def plan(self, mesh):
    """Per gradient, replica `mesh_dim`'s part (the summands of its pending
    sum, allreduced over the sum's other mesh axes); one kernel makes the
    local square-sums, added per set of mesh axes to sum them over (the
    replica axis and the axes splitting the gradient), and each set's
    scalar is allreduced: usually one or two for a whole model."""
    axis = self._mesh_axis(mesh)
    operands = []
    for i, grad in enumerate(self.inputs):
      layout = tuple(mesh.layout_of(grad.shape))
      if mesh.sizes[axis] == 1:
        operands.append(plans.Operand(i, plans.stay(layout)))
      else:
        pending = mesh.summands_axes_of(grad)
        if pending is None or axis not in pending:
          raise ValueError(
              f"replica_squared_norm: {grad.name} {grad.shape} is not a pending sum over "
              f"mesh dimension {self.mesh_dim!r} (the data-parallel allreduce of a "
              "gradient), so its per-replica parts are unknown. Pass a gradient "
              "straight from mtf.gradients on a layout that splits the batch over "
              f"{self.mesh_dim!r}, or (AdaScale) use samples='microbatches'.")
        others = tuple(a for a in pending if a != axis)
        move = plans.stay(layout)
        if others:  # e.g. a batch split over two mesh dimensions
          move = move.then(plans.AllReduce(others))
        operands.append(plans.Operand(i, move, partial=plans.READS_PARTIAL))
    results = tuple(plans.Result(Shape([]), 4, plans.stay(()).then(plans.AllReduce(axes)))
                    for axes in self._groups(mesh))
    return plans.LocalPlan(tuple(operands), results, combined=True)

  def _mesh_axis(self, mesh) -> int:
    names = list(mesh.names)
    if self.mesh_dim not in names:
      mesh_string = ";".join(f"{n}:{s}" for n, s in zip(names, mesh.sizes))
      raise ValueError(
          f"replica_squared_norm: mesh dimension {self.mesh_dim!r} is not in the mesh "
          f"'{mesh_string}'; pass one of {names}.")
    return names.index(self.mesh_dim)

  def _groups(self, mesh):
    """Input numbers per set of mesh axes their square-sums are summed over."""
    axis = self._mesh_axis(mesh)
    groups = {}
    for i, grad in enumerate(self.inputs):
      axes = tuple(sorted({a for a in mesh.layout_of(grad.shape) if a is not None} | {axis}))
      groups.setdefault(axes, []).append(i)
    return groups

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    mesh = lowering.plan_mesh(self)
    plan = self.plan(mesh)
    members = list(self._groups(mesh).values())

    def square_sums(*parts):
      sq = [tf.reduce_sum(tf.square(tf.cast(t, tf.float32))) for t in parts]
      return tuple(tf.add_n([sq[i] for i in m]) for m in members)
    totals = lowering.lower_with_plan(self, plan, square_sums)
    replicas = mesh.sizes[self._mesh_axis(mesh)]
    # mean_r |R p_r|^2 = R * sum_r |p_r|^2
    result = impl.slicewise(lambda *ts: tf.add_n(list(ts)) * float(replicas), *totals)
    lowering.set_tensor_lowering(self.outputs[0], result)


def replica_squared_norm(grads: Union[Tensor, Sequence[Optional[Tensor]]], mesh_dim: str,
                         name: Optional[str] = None) -> Tensor:
  """mean_r |g_r|^2 over the replicas r of `mesh_dim`, g_r = R * partial_r.

  Each gradient must be lowered as a sum still pending over `mesh_dim` (a
  gradient from `mtf.gradients` with the batch split over `mesh_dim`);
  otherwise lowering raises a ValueError naming the tensor and mesh
  dimension. With `mesh_dim` of size 1 the result is |grad|^2. For a list,
  g_r concatenates replica r's parts of all gradients (None entries are
  skipped), at one scalar allreduce per distinct set of mesh axes.

  Args:
    grads: a gradient or a list of them (any shapes, float dtypes).
    mesh_dim: the data-parallel mesh dimension name, e.g. "rows".
    name: optional op name.

  Returns:
    A float32 mtf scalar.

  Example:
    >>> grads = mtf.gradients([loss], [w1, w2])
    >>> sq = mtf.replica_stats.replica_squared_norm(grads, "all")
  """
  grads = [grads] if isinstance(grads, Tensor) else [g for g in grads if g is not None]
  if not grads or not all(isinstance(g, Tensor) for g in grads):
    raise TypeError(f"replica_squared_norm: grads must be mtf Tensors (at least one), "
                    f"got {grads!r}.")
  return ReplicaSquaredNorm(grads, mesh_dim, name=name).outputs[0]

from mesh_tensorflow.core import autograph_exempt as _autograph_exempt  # noqa: E402  pylint: disable=g-import-not-at-top
_autograph_exempt.exempt(globals())  # AutoGraph leaves this module's code alone
