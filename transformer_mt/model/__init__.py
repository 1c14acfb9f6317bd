"""The Transformer of "Attention Is All You Need", in torch only, and ensembles of it.

What each module owns: docs/architecture.md.
"""

from transformer_mt.model.attention import DecoderCache, MultiHeadAttention
from transformer_mt.model.dropout import Dropout
from transformer_mt.model.ensemble import Ensemble
from transformer_mt.model.transformer import (
    Decoder,
    DecoderLayer,
    Encoder,
    EncoderLayer,
    PositionalEncoding,
    PositionwiseFeedForward,
    Transformer,
)

__all__ = ["Decoder", "DecoderCache", "DecoderLayer", "Dropout", "Encoder", "EncoderLayer", "Ensemble",
           "MultiHeadAttention", "PositionalEncoding", "PositionwiseFeedForward", "Transformer"]
