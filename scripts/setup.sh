#!/usr/bin/env bash
# Create .venv, install CPU PyTorch and the package (editable, with dev tools and the Hydra sweeper and
# launcher plugins), and put the corpus in data/.
# Usage: bash scripts/setup.sh            (TORCH_SPEC=torch==2.6.0 or a CUDA index URL to pick another build)
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
[ -d .venv ] || "$PYTHON" -m venv .venv
# shellcheck disable=SC1091
source .venv/bin/activate
# pip runs again only when pyproject.toml or the torch build asked for changed since it last ran here (the
# package is installed editable, so its own modules need no reinstall): the test command calls this script
# before every run.
stamp=.venv/.installed
wanted="$(cksum < pyproject.toml) $TORCH_SPEC"  # cksum: POSIX, on macOS too
if [ "$(cat "$stamp" 2>/dev/null)" != "$wanted" ]; then
  python -m pip install -q --upgrade pip
  # torch first and pinned: otherwise pip resolves `torch>=2.6` to a multi-GB CUDA build.
  python -m pip install -q "$TORCH_SPEC"
  python -m pip install -q -e ".[dev,ct2,hf,onnx,serve,sweep,slurm]"
  echo "$wanted" > "$stamp"
fi

# The Tatoeba corpus: copied from ../shared/data when it is there, otherwise downloaded once.
mkdir -p data
if [ ! -f data/fra-eng.zip ]; then
  if [ -f ../shared/data/fra-eng.zip ]; then
    cp ../shared/data/fra-eng.zip data/fra-eng.zip
  else
    echo "data/fra-eng.zip missing: the first training run downloads it from manythings.org"
  fi
fi
python -c "import torch, transformer_mt; print(f'ready: torch {torch.__version__}, transformer_mt {transformer_mt.__version__}')"
