"""`mesh_tensorflow.optimize`, the original's import path for optimizers.

The module is `mesh_tensorflow.training.optimize`; importing either path gives
the same module object.
"""

import sys

from mesh_tensorflow.training import optimize as _module

sys.modules[__name__] = _module
