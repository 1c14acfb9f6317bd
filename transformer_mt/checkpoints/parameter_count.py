"""How many parameters a model_config implies, counted without building the model (no torch).

The command line refuses a checkpoint whose model_config claims more parameters than its weights hold
before it imports torch (checkpoint_header.py), and checkpoint_check.py states the same count when the
weights' shapes do not fit. The count follows model/transformer.py sub-layer by sub-layer;
tests/test_checkpoint_header.py compares it with built models of many configs, so the two cannot drift.
"""

from __future__ import annotations

from transformer_mt.config import ModelConfig


def _linear(n_in: int, n_out: int) -> int:
    """An nn.Linear's weight and bias."""
    return n_in * n_out + n_out


def parameter_count(c: ModelConfig, src_vocab_size: int, tgt_vocab_size: int) -> int:
    """The Transformer's distinct parameters (tied weights once), as its num_parameters() counts them."""
    d = c.d_model
    attention = _linear(d, 3 * d) + _linear(d, d)  # q, k, v fused (cross: q, then k and v), then out
    feed_forward = _linear(d, c.d_ff) + _linear(c.d_ff, d)
    norm = 2 * d  # LayerNorm's scale and shift
    encoder = c.encoder_layers * (attention + feed_forward + 2 * norm)
    decoder = c.decoder_layers * (2 * attention + feed_forward + 3 * norm)
    final_norms = 2 * norm if c.norm_first else 0
    positions = 2 * c.max_positions * d if c.positional == "learned" else 0  # sinusoids are computed
    embeddings = src_vocab_size * d + (0 if c.tie_embeddings else tgt_vocab_size * d)
    output = 0 if c.tie_embeddings or c.tie_output else d * tgt_vocab_size  # no bias
    return encoder + decoder + final_norms + positions + embeddings + output
