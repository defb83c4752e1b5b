"""`python -m mesh_tensorflow.launch`: start one process per host of a
multi-host mesh. The program is `mesh_tensorflow.distributed.launch`.
"""

import sys

from mesh_tensorflow.distributed.launch import main

if __name__ == "__main__":
  sys.exit(main())
