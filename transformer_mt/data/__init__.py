"""Parallel text, from files to batches.

corpora.py   where pairs come from: Tatoeba files of any pair, parallel files or a TSV, Hugging Face
             datasets, and UTF-8 text in general
split.py     the leak-free train/valid/test split, and reading a run's split files
cache.py     the encoded corpus on disk: built in streaming passes, memory-mapped
ragged.py    token ids of many sentences in one flat array
encode.py    `prepare_data`, the data side of a run
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
from transformer_mt.data.cache import held_out_pairs
from transformer_mt.data.corpora import (
    ensure_tatoeba,
    load_pairs,
    locate,
    read_lines,
    read_utf8,
    utf8_lines,
)
from transformer_mt.data.encode import EncodedSplit, PreparedData, prepare_data
from transformer_mt.data.ragged import Ragged
from transformer_mt.data.split import assign, load_split_tsv, sentence_key
from transformer_mt.errors import DataError

__all__ = ["Batch", "DataError", "EncodedSplit", "PreparedData", "Ragged", "TokenBatchSampler", "assign",
           "collate", "ensure_tatoeba", "greedy_cut", "held_out_pairs", "length_sorted_batches",
           "load_pairs", "load_split_tsv", "locate", "pad_sources", "prepare_data", "read_lines",
           "read_utf8", "sentence_key", "utf8_lines"]
