"""Checkpoints: writing and loading them (store.py), checking one before it is trusted (header.py reads it
without torch; check.py against the model it builds), finding them in a run directory (paths.py)."""
