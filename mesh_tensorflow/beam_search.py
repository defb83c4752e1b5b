"""`mesh_tensorflow.beam_search`, the original's import path for beam search.

The module is `mesh_tensorflow.layers.beam_search`; importing either path gives
the same module object.
"""

import sys

from mesh_tensorflow.layers import beam_search as _module

sys.modules[__name__] = _module
