"""The Transformer of "Attention Is All You Need", in torch only.

attention.py   multi-head attention, its masks and the decoder's key/value cache
dropout.py     dropout with a cheap CPU mask
transformer.py the embeddings, positions, layers, encoder, decoder and the whole model
ensemble.py    several models decoding as one (their averaged probabilities)
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
