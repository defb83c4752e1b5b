r"""`python -m mesh_tensorflow.report`: the layout report of a transformer
configured by gin files. The program is `mesh_tensorflow.transformer.report`.

    python -m mesh_tensorflow.report --gin_file=models/tiny_lm.gin \
        --gin_file=layouts/2x4.gin --png=/tmp/layout.png
"""

from mesh_tensorflow.transformer.report import (  # noqa: F401
    TrainingStep, build_training_step, main, report_for_current_config)

if __name__ == "__main__":
  raise SystemExit(main())
