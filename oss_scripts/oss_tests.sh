#!/usr/bin/env bash
# Installs mesh_tensorflow with its test dependencies and runs the test suite
# on 8 logical CPU devices (tests/conftest.py sets them up).
#   bash oss_scripts/oss_tests.sh [extra pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install --quiet --disable-pip-version-check -e ".[test,examples]"
python -m pytest tests -q "$@"
