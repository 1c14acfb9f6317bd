"""Parallel text, from files to batches.

corpora.py   reading Tatoeba (downloaded once), Opus Books and UTF-8 text; the configured corpus
split.py     the leak-free train/valid/test split and the split files of a run
encode.py    token ids, their cache, and `prepare_data`: the data side of a run
batching.py  token batches for training and decoding, padding, the tensors of a step
"""

from transformer_mt.data.batching import (
    Batch,
    TokenBatchSampler,
    collate,
    greedy_cut,
    length_sorted_batches,
    pad_sources,
)
from transformer_mt.data.corpora import (
    ensure_tatoeba,
    load_pairs,
    read_lines,
    read_tatoeba,
    read_utf8,
    select_pairs,
    utf8_lines,
)
from transformer_mt.data.encode import EncodedSplit, PreparedData, Ragged, prepare_data
from transformer_mt.data.split import Parallel, Split, load_split_tsv, save_split, split_pairs
from transformer_mt.errors import DataError

__all__ = ["Batch", "DataError", "EncodedSplit", "Parallel", "PreparedData", "Ragged", "Split",
           "TokenBatchSampler", "collate", "ensure_tatoeba", "greedy_cut", "length_sorted_batches",
           "load_pairs", "load_split_tsv", "pad_sources", "prepare_data", "read_lines",
           "read_tatoeba", "read_utf8",
           "save_split", "select_pairs", "split_pairs", "utf8_lines"]
