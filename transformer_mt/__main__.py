"""`python -m transformer_mt ...` is the same as the `transformer-mt` command."""

import sys

from transformer_mt.cli import main

if __name__ == "__main__":  # (not in a worker process spawned from it: data/ahead.py)
    sys.exit(main())
