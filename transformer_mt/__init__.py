"""transformer-mt: a from-scratch Transformer for machine translation, driven by Hydra configs."""

__version__ = "0.1.0"
