#!/usr/bin/env bash
# Set up, train the small model briefly on real Tatoeba data, then translate a few sentences.
# Override anything: bash scripts/quickstart.sh training.max_minutes=40   (the full CPU recipe)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source .venv/bin/activate
run_dir=saved_weights/quickstart-$(date +%Y%m%d-%H%M%S)
# The 2-core CPU recipe (configs/experiment/tatoeba_cpu.yaml) on an 8-minute budget, its warm-up scaled
# down to match. What it reaches on which machine: docs/results.md.
transformer-mt train experiment=tatoeba_cpu training.max_minutes=8 training.warmup_steps=400 \
  training.valid_every_steps=400 checkpoint.dir="$run_dir" "$@"
printf '%s\n' "He is sleeping." "I am cold." "Where is the station?" "I love you." "We're going to the beach tomorrow." \
  | transformer-mt translate checkpoint="$run_dir" decoding.beam_size=5
echo "The run is in $run_dir. What the recipe reaches: docs/results.md; the next commands: README.md, \"Using it\"."
