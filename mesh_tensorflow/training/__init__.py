"""Training: the trainer, optimizers, learning-rate schedules, checkpoints
(this library's and the original's), micro-batches, ZeRO, host offload, mixed
precision, AdaScale and pipeline parallelism.

`mtf.training` is this package; the names of `mesh_tensorflow.training.trainer`
(`Trainer`, `scalar_summary`, ...) are readable from it.

    >>> import mesh_tensorflow as mtf
    >>> mtf.training.Trainer is mtf.training.trainer.Trainer
    True
"""

import importlib as _importlib


def __getattr__(name):
  if name.startswith("__"):
    raise AttributeError(name)
  module = _importlib.import_module("mesh_tensorflow.training.trainer")
  try:
    return getattr(module, name)
  except AttributeError:
    raise AttributeError(
        f"module 'mesh_tensorflow.training' has no attribute {name!r}") from None
