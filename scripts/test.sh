#!/usr/bin/env bash
# Set up (if needed) and run the test suite: the command the README and CI use.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source .venv/bin/activate
ruff check transformer_mt tests scripts
python -m pytest -q "$@"
