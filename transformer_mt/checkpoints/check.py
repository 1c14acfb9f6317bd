"""What a checkpoint must hold before it is trusted: its bytes, its fields and its weights' shapes.

A checkpoint is a file from anywhere, so nothing in it is used before it is checked: the bytes must be
the zip archive torch.save writes (else the file is corrupt), its pickle may hold tensors and plain
data only (else it is refused, never run); each field the loader reads has its type and range (the
rules of `rules.py`, upper bounds included: header.py holds them, torch-free, for the command line's
check before torch is imported); the tokenizer must be one transformer-mt builds (tokenizer_rules.py);
and every weight must have the
shape its model_config implies, compared on a model built on the meta device (no memory), so that a
small file claiming a huge model is refused before a single parameter is allocated. Each problem is one
CheckpointError naming the file and the field.
"""

from __future__ import annotations

import dataclasses
import math
import pickle
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from transformer_mt.checkpoints.fields import (
    REFUSED_PICKLE,
    TensorFacts,
    check_weight_map,
    corrupt,
    counter,
    entry,
    fits,
    model_config,
    reason,
    refused,
    size_mismatch,
    wrong,
)
from transformer_mt.checkpoints.header import check_archive
from transformer_mt.checkpoints.parameter_count import parameter_count
from transformer_mt.checkpoints.tokenizer_rules import vocabulary
from transformer_mt.config import ModelConfig
from transformer_mt.data.tokenizer import PAD_ID, Vocabulary
from transformer_mt.errors import CheckpointError
from transformer_mt.model import Transformer


def read_file(path: Path, map_location: str | torch.device, mmap: bool) -> Any:
    """torch.load with weights_only: corrupt bytes and refused payloads each get their own message."""
    check_archive(path)
    try:
        return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as ex:
        if REFUSED_PICKLE.search(str(ex)):
            raise refused(path, reason(ex)) from ex
        raise corrupt(path, reason(ex)) from ex
    except Exception as ex:  # damaged bytes surface as any of a dozen exception types
        raise corrupt(path, reason(ex)) from ex


def check_tensors(path: Path, field: str, weights: Any) -> None:
    """The weights rule (fields.py) on the tensors torch built: dense floating-point ones whose storage
    holds all their elements."""
    check_weight_map(path, field, weights, _facts)


def _facts(tensor: Any) -> TensorFacts | None:
    if not isinstance(tensor, torch.Tensor):
        return None
    return TensorFacts(tensor.dtype, tensor.is_floating_point(), tuple(tensor.shape),
                       tensor.numel() * tensor.element_size(), tensor.untyped_storage().nbytes())


def check_weights(path: Path, config: ModelConfig, sizes: tuple[int, int], weights: dict[str, Any],
                  field: str = "model") -> None:
    """Every weight has the name and shape the config implies: compared with a model built on the meta
    device, which allocates nothing, so a config that claims far more than the file holds is refused."""
    expected = _meta_weights(path, config, sizes)
    missing = sorted(set(expected) - set(weights))
    unexpected = sorted(set(weights) - set(expected))
    wrong_shape = [name for name, want in expected.items()
                   if name in weights and weights[name].shape != want.shape]
    if not (missing or unexpected or wrong_shape):
        return
    held = sum(t.numel() for t in _distinct(weights))
    if wrong_shape:
        name = wrong_shape[0]
        detail = (f"{field}[{name!r}] is {tuple(weights[name].shape)}, the config needs "
                  f"{tuple(expected[name].shape)}")
    else:
        detail = f"{field} lacks {missing[0]!r}" if missing else f"{field} has an unknown {unexpected[0]!r}"
    raise size_mismatch(path, parameter_count(config, *sizes), held, detail)


class _NoRandomFill(TorchFunctionMode):
    """Skips nn.init.normal_, whose meta kernel would import PyTorch's compiler (sympy and all, some
    75 MB): a meta tensor has no values to fill."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is torch.nn.init.normal_:
            return args[0] if args else kwargs["tensor"]
        return func(*args, **(kwargs or {}))


def _meta_weights(path: Path, config: ModelConfig, sizes: tuple[int, int]) -> dict[str, Any]:
    """The model's state dict on the meta device: names and shapes, no memory. Sinusoidal positions are
    built as learned ones: their table is computed, never loaded, and computing it on the meta device
    (torch.arange) would import the same compiler; the learned table's weights are then left out."""
    built = dataclasses.replace(config, positional="learned")
    try:
        with torch.device("meta"), _NoRandomFill():
            weights = Transformer(built, sizes[0], sizes[1], PAD_ID).state_dict()
    except ValueError as ex:  # the rules that need the vocabulary sizes (tied embeddings, pad id)
        raise CheckpointError(f"checkpoint {path}: its model_config cannot build a model "
                              f"({reason(ex)})") from ex
    if config.positional == "learned":
        return weights
    return {name: t for name, t in weights.items() if not name.endswith("positional.embedding.weight")}


def _distinct(weights: dict[str, Any]) -> list[Any]:
    """Each tensor once: tied weights appear under several names, each a tensor of its own after loading,
    over one storage."""
    seen: dict[tuple[int, int], Any] = {}
    for tensor in weights.values():
        seen.setdefault((tensor.untyped_storage().data_ptr(), tensor.storage_offset()), tensor)
    return list(seen.values())


def check_model(path: Path, state: dict[str, Any],
                weights: tuple[str, ...]) -> tuple[ModelConfig, Vocabulary]:
    """The model's config, the tokenizer whose sizes it states, and the weights' shapes, all checked
    against each other before any model is built; returns (config, vocabulary)."""
    config, src_size, tgt_size = model_config(path, state)
    vocab = vocabulary(path, state)
    if (src_size, tgt_size) != (vocab.src_vocab_size, vocab.tgt_vocab_size):
        raise CheckpointError(f"checkpoint {path}: the tokenizer's vocabulary does not fit the model's "
                              f"embeddings ({vocab.src_vocab_size}/{vocab.tgt_vocab_size} tokens vs "
                              f"model_config's {src_size}/{tgt_size}); it was assembled from different runs")
    for field in weights:
        if field in state:
            check_weights(path, config, (src_size, tgt_size), state[field], field)
    return config, vocab


def check_position(path: Path, state: dict[str, Any]) -> None:
    """A training checkpoint's position, as training reads it back when it resumes."""
    for field in ("epoch", "batch_in_epoch", "step", "bad_epochs"):
        counter(path, state, field)
    counter(path, state, "world_size", low=1)
    entry(path, state, "validated", bool)
    entry(path, state, "rng", dict)
    if not math.isfinite(entry(path, state, "train_seconds", float)) or state["train_seconds"] < 0:
        raise wrong(path, "train_seconds", state["train_seconds"], "a number of seconds >= 0")
    best = entry(path, state, "best", dict)
    value = best.get("value")  # (also its epoch, which only result.json reports)
    if not isinstance(best.get("metric"), str) or not (value is None or fits(value, float)):
        raise wrong(path, "best", best, "{'metric': <name>, 'value': <number or null>, 'epoch': ...}")
