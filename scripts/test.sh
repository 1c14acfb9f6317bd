#!/usr/bin/env bash
# Set up (if needed) and run the test suite: the command the README and CI use.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The page's browser test drives Debian's headless Chromium: install it where this machine allows.
if [ ! -x /usr/bin/chromium ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  apt-get install -y -q chromium >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; } \
    || echo "warning: could not install chromium; the browser test will be skipped"
fi
source .venv/bin/activate
ruff check transformer_mt tests scripts
python -m pytest -q "$@"
