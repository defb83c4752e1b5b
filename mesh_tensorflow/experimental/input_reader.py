"""Input readers that hand each processor its slice of every batch.

`PlacementMeshImplInputReader` works with `mtf.placement_mesh_impl.
PlacementMeshImpl`: it batches a dataset of single examples and cuts every
batch into the slices the layout gives each device:

    >>> reader = input_reader.PlacementMeshImplInputReader(
    ...     mesh_impl, ds_creator, [image_shape, label_shape])
    >>> reader.initialize()
    >>> @tf.function
    ... def step():
    ...   return reader.gpu_placement(model_fn)   # model_fn(image_slices, label_slices)

`SimdMeshImplInputReader`, `SubBatchSlicer` and `ProcessDevices` would feed
TPU infeed queues from TensorFlow 1 sessions, which
TensorFlow 2 does not have: they raise an error naming the replacement,
`mtf.training.Trainer` (it imports each tf.data batch with the feature
shapes, so every processor of any mesh implementation receives only its
slice; see docs/unet3d.md).
"""

from __future__ import annotations

from typing import Callable, Sequence

import tensorflow as tf

import mesh_tensorflow as mtf

_TPU_INFEED = (
    "{name} fed TPU infeed queues from a TensorFlow 1 session, which TensorFlow 2 does not "
    "have. Use mtf.training.Trainer(model_fn, feature_shapes, mesh_impl, optimizer): it "
    "imports each batch of a tf.data.Dataset with the feature shapes, so every processor "
    "(SimdMeshImpl or PlacementMeshImpl) receives only its slice; or "
    "PlacementMeshImplInputReader with a PlacementMeshImpl.")


class SubBatchSlicer:
  """The per-host reader of TPU infeed sub-batches; not available
  in TensorFlow 2 (raises, naming `mtf.training.Trainer`).

  Example:
    >>> trainer = mtf.training.Trainer(model_fn, shapes, mesh_impl, optimizer)  # instead
  """

  def __init__(self, *args, **kwargs):
    del args, kwargs
    raise NotImplementedError(_TPU_INFEED.format(name="SubBatchSlicer"))


class ProcessDevices:
  """The map from processor numbers to TPU cores and hosts; not
  available in TensorFlow 2 (raises, naming `mtf.training.Trainer`).

  Example:
    >>> mesh_impl.devices   # the devices of a mesh implementation, instead
  """

  def __init__(self, *args, **kwargs):
    del args, kwargs
    raise NotImplementedError(_TPU_INFEED.format(name="ProcessDevices"))


class SimdMeshImplInputReader:
  """The TPU infeed reader for SimdMeshImpl; not available in
  TensorFlow 2 (raises, naming `mtf.training.Trainer`).

  Example:
    >>> trainer = mtf.training.Trainer(model_fn, shapes, simd_mesh_impl, optimizer)
  """

  def __init__(self, *args, **kwargs):
    del args, kwargs
    raise NotImplementedError(_TPU_INFEED.format(name="SimdMeshImplInputReader"))


class PlacementMeshImplInputReader:
  """Batches a dataset and cuts each batch into a PlacementMeshImpl's slices.

  Args:
    placement_mesh_impl: the mesh implementation whose layout cuts the batches.
    ds_creator: a function returning a tf.data.Dataset of single examples,
      each a tuple of tensors (no batch dimension).
    mtf_input_shapes: one mtf.Shape per tensor of an example, each starting
      with the batch dimension.
    ds_prefetch_size: batches to prefetch.
    is_eval_mode: keep a short last batch (padded with zeros to the batch
      size) instead of dropping it.

  Example:
    >>> reader = PlacementMeshImplInputReader(mesh_impl, ds_creator, shapes)
    >>> reader.initialize()
    >>> laid_out = reader.next_laid_out()   # inside a tf.function
  """

  def __init__(self, placement_mesh_impl, ds_creator: Callable[[], tf.data.Dataset],
               mtf_input_shapes: Sequence[mtf.Shape],
               ds_prefetch_size: int = tf.data.AUTOTUNE, is_eval_mode: bool = False):
    if not isinstance(placement_mesh_impl, mtf.lowering.placement_mesh_impl.PlacementMeshImpl):
      raise TypeError(
          f"PlacementMeshImplInputReader needs a PlacementMeshImpl, got "
          f"{type(placement_mesh_impl).__name__}; for other mesh implementations use "
          "mtf.training.Trainer, which slices tf.data batches by the layout.")
    shapes = [mtf.convert_to_shape(s) for s in mtf_input_shapes]
    if not shapes:
      raise ValueError("PlacementMeshImplInputReader: mtf_input_shapes is empty.")
    batch = shapes[0].dims[0]
    for s in shapes:
      if s.dims[0] != batch:
        raise ValueError(f"PlacementMeshImplInputReader: every input shape must start with "
                         f"the batch dimension {batch}; got {s}.")
    self._impl = placement_mesh_impl
    self._shapes = shapes
    self._batch = batch.size
    ds = ds_creator()
    if is_eval_mode:
      ds = ds.batch(self._batch, drop_remainder=False).map(self._pad)
    else:
      ds = ds.batch(self._batch, drop_remainder=True)
    self._dataset = ds.prefetch(ds_prefetch_size)
    self._iterator = None

  def _pad(self, *tensors):
    short = self._batch - tf.shape(tensors[0])[0]
    return tuple(tf.pad(t, [[0, short]] + [[0, 0]] * (len(t.shape) - 1)) for t in tensors)

  @property
  def dataset(self) -> tf.data.Dataset:
    """The batched dataset (whole batches; e.g. for mtf.training.Trainer)."""
    return self._dataset

  def initialize(self, sess=None) -> None:
    """(Re)starts reading from the first batch. `sess` is accepted and
    ignored (TensorFlow 2 has no sessions)."""
    del sess
    self._iterator = iter(self._dataset)

  def _next_batch(self):
    if self._iterator is None:
      self.initialize()
    batch = next(self._iterator)
    batch = batch if isinstance(batch, (tuple, list)) else (batch,)
    if len(batch) != len(self._shapes):
      raise ValueError(f"PlacementMeshImplInputReader: the dataset gives {len(batch)} tensors "
                       f"per example but mtf_input_shapes has {len(self._shapes)}.")
    return batch

  def next_laid_out(self) -> list:
    """The next batch, each tensor cut into one slice per processor
    (LaidOutTensors, for `mtf.import_laid_out_tensor`)."""
    return [self._impl.import_tf_tensor(t, s) for t, s in zip(self._next_batch(), self._shapes)]

  def gpu_placement(self, model_fn: Callable):
    """model_fn(*laid_out_inputs) on the next batch; returns its result.

    Call it inside a tf.function when the mesh has several devices (the
    lowered collectives run in graphs only).
    """
    return model_fn(*self.next_laid_out())
