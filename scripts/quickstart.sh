#!/usr/bin/env bash
# Set up, train the small model briefly on real Tatoeba data, then translate a few sentences.
# Override anything: bash scripts/quickstart.sh training.epochs=3 dataset.max_pairs=null
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source .venv/bin/activate
run_dir=saved_weights/quickstart-$(date +%Y%m%d-%H%M%S)
transformer-mt train dataset.max_pairs=40000 training.epochs=2 checkpoint.dir="$run_dir" "$@"
printf '%s\n' "He is sleeping." "I am cold." "Where is the station?" "I love you." "We're going to the beach tomorrow." \
  | transformer-mt translate checkpoint="$run_dir" decoding.beam_size=5
