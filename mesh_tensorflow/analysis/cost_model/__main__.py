"""`python -m mesh_tensorflow.analysis.cost_model --calibrate [--output params.json]`."""

from mesh_tensorflow.analysis.cost_model import main

if __name__ == "__main__":
  raise SystemExit(main())
