"""The checkpoints a command names, checked before anything is built: `checkpoint=` (each member of an
ensemble) and `init=` by their headers, before torch is imported (its import alone takes some 280 MiB,
so a crafted file must be refused while refusing is cheap); `init=<a Hugging Face directory>` by the
directory's files (hf_header.py). The loaders check them again, and their weights, when the job runs.
"""

from __future__ import annotations

from transformer_mt.checkpoints.fields import for_parent
from transformer_mt.checkpoints.header import read_header
from transformer_mt.checkpoints.paths import is_hf_dir, resolve_checkpoint
from transformer_mt.errors import CheckpointError


def check_checkpoints(value: str, ensemble: bool) -> None:
    """`checkpoint=<file or run directory>` (comma-separated for an ensemble): each one's header."""
    for part in value.split(",") if ensemble else [value]:
        if part.strip():
            read_header(resolve_checkpoint(part))


def check_parent(init: str) -> None:
    """`init=<file, run directory or Hugging Face directory>`: the parent's header, or the directory's
    config, tokenizer and weights' header; its problems named as init='s."""
    if is_hf_dir(init):  # (its tokenizer's rules come with the data layer, and torch with it)
        from transformer_mt.checkpoints.hf_header import check_directory

        check_directory(init)
        return
    try:
        read_header(resolve_checkpoint(init))
    except CheckpointError as ex:
        raise for_parent(init, ex) from ex
