#!/usr/bin/env bash
# Set up (if needed) and run the test suite: the command the README and CI use. It installs nothing
# outside .venv: the serving page's browser test runs where Chromium is installed (/usr/bin/chromium, or
# TMT_CHROMIUM=<path>), and is skipped with its reason where it is not.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source .venv/bin/activate
if [ ! -x "${TMT_CHROMIUM:-/usr/bin/chromium}" ]; then
  echo "note: no ${TMT_CHROMIUM:-/usr/bin/chromium}, so the browser tests are skipped; to run them: apt-get install chromium (Debian)"
fi
command -v npm >/dev/null || echo "note: no npm, so the format=web tests are skipped; to run them: apt-get install npm (Debian)"
ruff check transformer_mt tests scripts
# pytest caches the test modules it rewrites (and Python the package's modules) as bytecode; an environment
# that turns that off (PYTHONDONTWRITEBYTECODE, set in many container images) has each worker and each
# command a test starts compile them again. The caches go to __pycache__ folders git ignores.
unset PYTHONDONTWRITEBYTECODE
# One pytest-xdist worker per core (TMT_TEST_WORKERS=N to choose, 0 for none); a test file stays on one
# worker, so that its module fixtures (a server, a prepared corpus) are built once. The files go to the
# workers in collection order (the longest first: tests/conftest.py), not in pytest-xdist's own order of
# the most tests first, which would leave the longest files to the end and one worker waiting on them.
# Only the pytest plugins the suite uses (pytest-xdist's, Hypothesis's) are loaded: installed libraries
# bring their own (Faker, Hydra, AnyIO), and pytest rewrites the asserts of every module of a library
# that brings one as each process imports it, seconds in each where bytecode is not cached.
python -m pytest -q --disable-plugin-autoload -p xdist.plugin -p _hypothesis_pytestplugin \
  -n "${TMT_TEST_WORKERS:-auto}" --dist loadfile --no-loadscope-reorder "$@"
