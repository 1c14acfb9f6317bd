"""The process a job runs in: its device and precision (device.py; int8 decoding, quantize.py), random
state (rng.py) and files (files.py)."""
