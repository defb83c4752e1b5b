"""The original's transformer-era entry points, on top of the transformer
library: its `mesh_tensorflow.transformer.utils` (served by `utils` here,
see `mesh_tensorflow.compat.original_paths`) with the Estimator-era
functions (`estimator`, `decoding`, `evaluation`, `helpers`).

    >>> from mesh_tensorflow.transformer import utils   # the original's path
    >>> utils.get_estimator, utils.decode_from_file
"""
