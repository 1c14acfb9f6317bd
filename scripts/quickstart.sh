#!/usr/bin/env bash
# Set up, train the small model briefly on real Tatoeba data, then translate a few sentences.
# Override anything: bash scripts/quickstart.sh training.epochs=3 dataset.max_pairs=null
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source .venv/bin/activate
run_dir=saved_weights/quickstart-$(date +%Y%m%d-%H%M%S)
# About 10 minutes on a 2-core laptop CPU: 20k pairs, 3 short epochs with a short warm-up.
transformer-mt train dataset.max_pairs=20000 training.epochs=3 training.warmup_steps=150 checkpoint.dir="$run_dir" "$@"
printf '%s\n' "He is sleeping." "I am cold." "Where is the station?" "I love you." "We're going to the beach tomorrow." \
  | transformer-mt translate checkpoint="$run_dir" decoding.beam_size=5
