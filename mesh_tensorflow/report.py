r"""Layout report of a transformer configured by gin files.

Builds one training step (model, loss, gradients, optimizer updates) of the
transformer that `python -m mesh_tensorflow.transformer.main` would train with
the same gin files, without data or devices, and prints its layout report
(see `mesh_tensorflow.analysis.layout_report`); optionally draws it as a PNG, or first
lets auto_mtf choose the layout:

    python -m mesh_tensorflow.report --gin_file=models/tiny_lm.gin \
        --gin_file=layouts/2x4.gin --png=/tmp/layout.png
    python -m mesh_tensorflow.report --gin_param='run.batch_size = 16' --auto

--mesh_shape and --layout override the config's; --exact takes the
communication from a real lowering (slower, every op type).
"""

from mesh_tensorflow.transformer.report import (  # noqa: F401
    TrainingStep, build_training_step, main, report_for_current_config)

if __name__ == "__main__":
  raise SystemExit(main())
