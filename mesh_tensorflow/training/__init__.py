"""Training: the trainer, optimizers, learning-rate schedules, checkpoints
(and a registry of checkpoint formats), micro-batches, ZeRO, host offload, mixed
precision, AdaScale and pipeline parallelism.

`mtf.training` is this package; the trainer's names (`Trainer`,
`scalar_summary`, `TRAIN`, `EVAL`) are readable from it.

    >>> import mesh_tensorflow as mtf
    >>> mtf.training.Trainer is mtf.training.trainer.Trainer
    True
"""

from mesh_tensorflow.training.trainer import EVAL, TRAIN, Trainer, scalar_summary  # noqa: F401
