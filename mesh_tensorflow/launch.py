"""`python -m mesh_tensorflow.launch`: start one process per host of a
multi-host mesh. The program is `mesh_tensorflow.distributed.launch`;
importing either path gives the same module object.
"""

import sys

from mesh_tensorflow.distributed import launch as _module

if __name__ == "__main__":
  sys.exit(_module.main())
else:
  sys.modules[__name__] = _module
