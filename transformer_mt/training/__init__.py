"""The training layer: the Trainer and its loop (trainer.py), what it is built from (the step, the
optimizer and schedule, the loss, EMA, validation, records, the clock), fine-tuning, distributed
training, and the run directory."""
