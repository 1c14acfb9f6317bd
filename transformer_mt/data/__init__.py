"""Parallel text, from files to batches: corpora of any source, the leak-free split, the encoded corpus
cached on disk, and the token batches of training and decoding.

This module holds the names other packages import; what each module owns: docs/architecture.md.
"""

from transformer_mt.data.batching import (
    Batch,
    TokenBatchSampler,
    collate,
    greedy_cut,
    length_sorted_batches,
    pad_sources,
)
from transformer_mt.data.cache import held_out_pairs
from transformer_mt.data.corpora import ensure_tatoeba, load_pairs, locate
from transformer_mt.data.encode import EncodedSplit, PreparedData
from transformer_mt.data.mixture import prepare_data
from transformer_mt.data.ragged import Ragged
from transformer_mt.data.split import assign, load_split_tsv, sentence_key
from transformer_mt.data.text_files import LINE_ENDS, one_line, open_binary, read_lines, read_utf8, utf8_lines
from transformer_mt.errors import DataError

__all__ = ["LINE_ENDS", "Batch", "DataError", "EncodedSplit", "PreparedData", "Ragged", "TokenBatchSampler",
           "assign", "collate", "ensure_tatoeba", "greedy_cut", "held_out_pairs", "length_sorted_batches",
           "load_pairs", "load_split_tsv", "locate", "one_line", "open_binary", "pad_sources",
           "prepare_data", "read_lines", "read_utf8", "sentence_key", "utf8_lines"]
