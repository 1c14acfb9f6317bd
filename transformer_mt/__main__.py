"""`python -m transformer_mt ...` is the same as the `transformer-mt` command."""

import sys

from transformer_mt.cli import main

sys.exit(main())
