#!/usr/bin/env bash
# Set up, train the small model briefly on real Tatoeba data, then translate a few sentences.
# Override anything: bash scripts/quickstart.sh training.max_minutes=40   (a planned 40-minute run)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source .venv/bin/activate
run_dir=saved_weights/quickstart-$(date +%Y%m%d-%H%M%S)
# An 8-minute run planned for this machine (docs/planning.md): a probe measures its speed, the plan
# chooses batch, schedule, validation and the rest. What it reaches on which machine: docs/results.md.
transformer-mt train training.plan=auto training.max_minutes=8 checkpoint.dir="$run_dir" "$@"
printf '%s\n' "He is sleeping." "I am cold." "Where is the station?" "I love you." "We're going to the beach tomorrow." \
  | transformer-mt translate checkpoint="$run_dir" decoding.beam_size=5
echo "The run is in $run_dir. What it reaches: docs/results.md; the next commands: README.md, \"Using it\"."
