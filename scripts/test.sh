#!/usr/bin/env bash
# Install the project with its test extras, lint it and run the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install --quiet -e '.[test]'
python -m ruff check .
python -m pytest -q
