"""`mesh_tensorflow.test_utils`, the original's import path for the original's test helpers.

The module is `mesh_tensorflow.compat.test_utils`; importing either path gives
the same module object.
"""

import sys

from mesh_tensorflow.compat import test_utils as _module

sys.modules[__name__] = _module
