#!/usr/bin/env bash
# Set up (if needed) and run the test suite: the command the README and CI use. It installs nothing
# outside .venv: the serving page's browser test runs where Chromium is installed (/usr/bin/chromium, or
# TMT_CHROMIUM=<path>), and is skipped with its reason where it is not.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source .venv/bin/activate
if [ ! -x "${TMT_CHROMIUM:-/usr/bin/chromium}" ]; then
  echo "note: no ${TMT_CHROMIUM:-/usr/bin/chromium}, so the browser test is skipped; to run it: apt-get install chromium (Debian)"
fi
ruff check transformer_mt tests scripts
python -m pytest -q "$@"
