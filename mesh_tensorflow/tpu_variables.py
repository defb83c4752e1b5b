"""`mesh_tensorflow.tpu_variables`, the original's import path for TPU replicated variables.

The module is `mesh_tensorflow.lowering.tpu_variables`; importing either path gives
the same module object.
"""

import sys

from mesh_tensorflow.lowering import tpu_variables as _module

sys.modules[__name__] = _module
