#!/usr/bin/env bash
# Install the project with its test extras, lint it and run the whole test suite (the slow
# tests too: a bare `python -m pytest` deselects them).
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install --quiet -e '.[test]'
python -m ruff check .
python -m pytest -q -m 'slow or not slow'
