"""`mesh_tensorflow.ops_with_redefined_builtins`, the original's import path for mtf ops under Python builtin names.

The module is `mesh_tensorflow.compat.ops_with_redefined_builtins`; importing either path gives
the same module object.
"""

import sys

from mesh_tensorflow.compat import ops_with_redefined_builtins as _module

sys.modules[__name__] = _module
