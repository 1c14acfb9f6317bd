"""The process a job runs in: its device and precision (device.py), random state (rng.py) and files
(files.py)."""
