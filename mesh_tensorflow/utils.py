"""`mesh_tensorflow.utils`, the original's import path for the original's small TensorFlow-level utilities.

The module is `mesh_tensorflow.compat.utils`; importing either path gives
the same module object.
"""

import sys

from mesh_tensorflow.compat import utils as _module

sys.modules[__name__] = _module
