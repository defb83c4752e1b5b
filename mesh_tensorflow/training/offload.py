"""CPU offload of optimizer state: slots live on each processor's host CPU.

With `offload_slots=True` an optimizer builds its slot variables and its
update arithmetic on a *host mesh*: a second mtf Mesh with the device mesh's
shape and layout whose processor p runs on the host CPU of processor p's
device (`/job:j/task:t/device:GPU:k` -> `/job:j/task:t/device:CPU:0`). The
gradient and the current value are copied to the host (`to_mesh`), the slots
are read and written there, and only the new value is copied back. Because
both meshes use one layout, every copy moves each processor's own slice: no
collective, one device-to-host and one host-to-device transfer per variable.
Slot variables are stored with the device mesh's variables, so checkpoints
hold them as usual.

    >>> opt = mtf.optimize.AdamWeightDecayOptimizer(1e-3, offload_slots=True)
    >>> ops = opt.apply_grads(grads, variables)
    >>> lowering = mtf.Lowering(graph, mtf.offload.lowering_map(graph, {mesh: impl}))

The Trainer does the last step itself.
"""

from __future__ import annotations

from typing import Callable, Dict, Optional

import tensorflow as tf

from mesh_tensorflow.core.graph import Graph, Mesh, Operation, Tensor
from mesh_tensorflow.lowering import slice_variables

# Graph.keeps[HOST_MESHES_KEY]: {host mesh: device mesh} (kept on the graph: a
# module-level map keyed by the graph would keep every graph alive).
HOST_MESHES_KEY = "offload.host_meshes"


def host_device(device: str) -> str:
  """The host CPU of `device`: CPU:0 of its job, replica and task (a CPU
  device is its own host).

  Example:
    >>> mtf.offload.host_device("/job:worker/task:1/device:GPU:3")
    '/job:worker/task:1/device:CPU:0'
  """
  spec = tf.DeviceSpec.from_string(device or "")
  if (spec.device_type or "").upper() == "CPU":
    return spec.to_string()
  return spec.replace(device_type="CPU", device_index=0).to_string()


def host_mesh(mesh: Mesh) -> Mesh:
  """The host mesh of device mesh `mesh` (created on first use).

  Example:
    >>> slots_mesh = mtf.offload.host_mesh(mesh)
  """
  pairs = mesh.graph.keeps.setdefault(HOST_MESHES_KEY, {})
  for host, device in pairs.items():
    if device is mesh:
      return host
  if mesh in pairs:
    return mesh  # already a host mesh
  host = Mesh(mesh.graph, f"{mesh.name}_host")
  pairs[host] = mesh
  return host


def device_mesh_of(mesh: Mesh) -> Optional[Mesh]:
  """The device mesh whose host mesh is `mesh`, or None."""
  return mesh.graph.keeps.get(HOST_MESHES_KEY, {}).get(mesh)


class MoveToMesh(Operation):
  """`x` copied to another mesh of the same shape and layout, slice by slice."""

  has_gradient = True
  allows_other_meshes = True

  def __init__(self, x: Tensor, mesh: Mesh, name: Optional[str] = None):
    if mesh.graph is not x.graph:
      raise ValueError(f"to_mesh: {x.name} and mesh {mesh.name!r} are in different graphs.")
    super().__init__([x], mesh=mesh, name=name or "to_mesh")
    self._outputs = [Tensor(self, x.shape, x.dtype)]

  def gradient(self, grad_ys):
    return [to_mesh(grad_ys[0], self.inputs[0].mesh)]

  def lower(self, lowering):
    x = self.inputs[0]
    src, dst = lowering.mesh_impl(x), lowering.mesh_impl(self)
    if src.shape != dst.shape or src.tensor_layout(x.shape) != dst.tensor_layout(x.shape):
      raise ValueError(
          f"to_mesh: {x.name} {x.shape} is laid out differently on mesh "
          f"{x.mesh.name!r} ({src}) and {self.mesh.name!r} ({dst}); both meshes need "
          "the same shape and layout rules (build the host one with host_mesh_impl).")
    lowering.set_tensor_lowering(self.outputs[0],
                                 dst.slicewise(tf.identity, lowering.laid_out(x)))


def to_mesh(x: Tensor, mesh: Mesh) -> Tensor:
  """`x` on `mesh` (itself if already there).

  Example:
    >>> g_host = mtf.offload.to_mesh(grad, mtf.offload.host_mesh(grad.mesh))
  """
  if x.mesh is mesh:
    return x
  return MoveToMesh(x, mesh).outputs[0]


def host_mesh_impl(mesh_impl, host_device_fn: Optional[Callable[[str], str]] = None):
  """A PlacementMeshImpl with `mesh_impl`'s shape and layout on host CPUs.

  Its variables go into `mesh_impl`'s variable store (so checkpoints of
  `mesh_impl` include the offloaded slots), and a pending checkpoint restore
  of `mesh_impl` applies to them.

  Args:
    mesh_impl: the device mesh implementation (a PlacementMeshImpl).
    host_device_fn: maps a processor's device to the device its slots live
      on (default `host_device`).

  Example:
    >>> host_impl = mtf.offload.host_mesh_impl(impl)
  """
  from mesh_tensorflow.lowering.placement_mesh_impl import PlacementMeshImpl
  if not hasattr(mesh_impl, "devices"):
    raise ValueError(f"offload_slots: {mesh_impl} has no per-processor devices; CPU "
                     "offload needs a PlacementMeshImpl.")
  fn = host_device_fn or host_device
  devices = [fn(d) for d in mesh_impl.devices]
  cache = mesh_impl.keeps.setdefault("offload_host_impls", {})
  key = (mesh_impl.layout_rules.to_string(), tuple(devices))
  if key not in cache:
    # Replicated slots are shared on the host exactly when the device mesh
    # shares replicas; otherwise each processor keeps its own copy.
    cache[key] = PlacementMeshImpl(mesh_impl.shape, mesh_impl.layout_rules, devices,
                                   collectives="direct",
                                   share_replicas=mesh_impl.shares_replicas)
  host = cache[key]
  # The host implementation shares the device one's slice variables and the
  # checkpoint its new variables start from.
  host.keeps[slice_variables.STORES_KEY] = mesh_impl.keeps.setdefault(
      slice_variables.STORES_KEY, {})
  host.keeps[slice_variables.PENDING_KEY] = mesh_impl.keeps.get(slice_variables.PENDING_KEY)
  return host


def lowering_map(graph: Graph, mesh_to_impl: Dict[Mesh, object],
                 host_device_fn: Optional[Callable[[str], str]] = None) -> Dict[Mesh, object]:
  """`mesh_to_impl` plus a host implementation for each host mesh of `graph`.

  Example:
    >>> lowering = mtf.Lowering(graph, mtf.offload.lowering_map(graph, {mesh: impl}))
  """
  out = dict(mesh_to_impl)
  for host, device in graph.keeps.get(HOST_MESHES_KEY, {}).items():
    if device not in out:
      raise ValueError(f"offload: no mesh implementation for mesh {device.name!r}.")
    out.setdefault(host, host_mesh_impl(out[device], host_device_fn))
  return out

from mesh_tensorflow.core import autograph_exempt as _autograph_exempt  # noqa: E402  pylint: disable=g-import-not-at-top
_autograph_exempt.exempt(globals())  # AutoGraph leaves this module's code alone
