#!/usr/bin/env bash
# Installs mesh_tensorflow (with TensorFlow, through the `tensorflow` extra)
# and its test dependencies, and runs the test suite on 8 logical CPU devices
# (tests/conftest.py sets them up), in parallel worker processes
# (pytest-xdist). Other TensorFlow and Python versions: oss_scripts/version_matrix.py.
#   bash oss_scripts/oss_tests.sh [extra pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install --quiet --disable-pip-version-check \
    -e ".[tensorflow,test,examples,sentencepiece,tfds,seqio,docs]"
# tensorflow-text (the SentencePiece op, for string signatures in exported
# SavedModels) of the installed TensorFlow's release, without its dependencies
# so that it cannot add or replace a TensorFlow distribution.
TF_RELEASE="$(python -c 'import tensorflow as tf; print(".".join(tf.__version__.split(".")[:2]))' 2>/dev/null)"
python -m pip install --quiet --disable-pip-version-check --no-deps "tensorflow-text==${TF_RELEASE}.*" ||
  echo "tensorflow-text ${TF_RELEASE} is not available: exports are tested with id signatures only"
# One worker process per core, at most 4 (each holds TensorFlow and 8 devices);
# tests marked with one xdist_group run in one worker, so that a module
# fixture they share (a run over every layout) is computed once; the 15
# slowest tests are listed at the end, to keep an eye on suite time.
python -m pytest tests -q -n auto --maxprocesses 4 --dist loadgroup --durations=15 "$@"
