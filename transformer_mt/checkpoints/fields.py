"""The rules for a checkpoint's fields, without torch: the entries its loaders read, each of its type and
within its bounds, the model_config they build, the weights as names of floating-point tensors within
their storages, and the one-line message of each way a field can be wrong. header.py applies them to a
checkpoint read without torch (before every load, and before the command line imports torch), check.py
to the objects torch's own load built: one rule each, for both.
"""
from __future__ import annotations

import dataclasses
import math
import re
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformer_mt.config import ModelConfig
from transformer_mt.config.checks import RANGES, SPECIAL_TOKENS
from transformer_mt.errors import CheckpointError

FORMAT_VERSION = 1
# What weights_only's refusal of a pickle naming code says; any other unpickling failure is damage.
REFUSED_PICKLE = re.compile(r"GLOBAL|unrecognized function|new object|Can only build")
TRAINED = "trained_model"  # with EMA on, `model` is the average and this the trained weights (ema.py)
REQUIRED = ("format_version", "model_config", "model", "tokenizer", "config")
WEIGHTS = ("model", TRAINED)  # the entries that hold a model's weights
WORDS = "words"  # the training pairs' words, case folded, one a line (data/words.py); older ones lack it
PAD_ID = SPECIAL_TOKENS.index("<pad>")
_TYPES = {int: "an integer", float: "a number", str: "a string", bool: "true or false", dict: "a mapping",
          list: "a list"}
_SIZES = ("src_vocab_size", "tgt_vocab_size")


# -- the messages ---------------------------------------------------------------------------------
def for_parent(init: str, ex: CheckpointError) -> CheckpointError:
    """A problem of the checkpoint `init=` names, as the fine-tuning run reports it."""
    return CheckpointError(f"init={init}: {ex}")


def existing(path: str | Path) -> Path:
    """The path of a checkpoint file, which must exist."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    return path


def corrupt(path: Path, why: str) -> CheckpointError:
    """The one-line error for damaged bytes."""
    return CheckpointError(f"checkpoint {path} is corrupt or truncated ({why}); "
                           "use an earlier checkpoint of the run")


def refused(path: Path, why: str) -> CheckpointError:
    """The one-line error for a pickle that names code."""
    return CheckpointError(f"checkpoint {path} was refused: it holds objects other than tensors and plain "
                           f"data, which could run code when loaded ({why})")


def claims_more(path: Path, where: str, shape: tuple[int, ...], nbytes: int) -> CheckpointError:
    """The one-line error for a tensor claiming more elements than its storage holds."""
    return CheckpointError(f"checkpoint {path}: {where} claims shape {shape} over {nbytes} bytes; "
                           "the file is damaged")


def size_mismatch(path: Path, claimed: int, held: int, detail: str) -> CheckpointError:
    """The one-line error for weights that do not make the model model_config describes."""
    return CheckpointError(f"checkpoint {path}: model_config describes a model of {claimed:,} parameters, "
                           f"its weights hold {held:,} ({detail}); the file is damaged or assembled from "
                           "different runs")


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def reason(ex: BaseException) -> str:
    """The line of an exception's message that says what went wrong (torch wraps it in advice)."""
    lines = [line.strip() for line in str(ex).splitlines() if line.strip()]
    named = [line for line in lines if REFUSED_PICKLE.search(line) or line.startswith("Unsupported")]
    return (named or lines or [type(ex).__name__])[0][:200]


def wrong(path: Path, field: str, value: Any, expected: str) -> CheckpointError:
    """The one-line error for a field of the wrong type or value."""
    return CheckpointError(f"checkpoint {path}: {field} is {_shown(value)}, expected {expected}")


# -- the field rules (also applied by checkpoint_check after torch's load) ---------------------------
def fits(value: Any, kind: Any) -> bool:
    """value is of kind; an int counts as a float, a bool as nothing but a bool."""
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, kind) and (kind is bool or not isinstance(value, bool))


def entry(path: Path, state: dict[str, Any], field: str, kind: Any, within: str = "") -> Any:
    """state[field], which must exist and be of `kind` (int, float, str, bool, dict or list); `within`
    names the mapping in messages (`config.dataset.`)."""
    if field not in state:
        raise CheckpointError(f"checkpoint {path} has no {within}{field}; it was not written by this "
                              "version of transformer-mt's training")
    value = state[field]
    if not fits(value, kind):
        raise wrong(path, within + field, value, _TYPES[kind])
    return value


def counter(path: Path, state: dict[str, Any], field: str, low: int = 0, within: str = "") -> int:
    """A count such as step or epoch: an integer >= low."""
    value = entry(path, state, field, int, within)
    if value < low:
        raise wrong(path, within + field, value, f"an integer >= {low}")
    return value


def check_entries(path: Path, state: Any, check_weights: Callable[[Path, str, Any], None]) -> None:
    """A mapping with the required entries, a format this version reads, step and epoch counts, a run
    config, and each weights entry passed to `check_weights` (path, field, weights)."""
    if not isinstance(state, dict) or any(key not in state for key in REQUIRED):
        raise CheckpointError(f"{path} is not a transformer-mt checkpoint "
                              "(missing model, config or tokenizer)")
    version = entry(path, state, "format_version", int)
    if version > FORMAT_VERSION:
        raise CheckpointError(f"{path} was written by a newer transformer-mt; upgrade to load it")
    if version < 1:
        raise wrong(path, "format_version", version, f"an integer from 1 to {FORMAT_VERSION}")
    for field in WEIGHTS:
        if field in state:
            check_weights(path, field, state[field])
    for field in ("step", "epoch"):
        if field in state and state[field] is not None:
            counter(path, state, field)
    entry(path, state, "config", dict)  # the run's config: shown by translate and serve as it is
    if state.get(WORDS) is not None:
        entry(path, state, WORDS, str)


def typed_section(path: Path, field: str, values: Any, schema: type, known_only: bool) -> dict[str, Any]:
    """A saved config section whose values have the schema's types (unknown keys: an error when
    known_only, else left alone); returns the section's values of the schema's keys."""
    if not isinstance(values, dict):
        raise wrong(path, field, values, "a mapping of settings")
    hints = typing.get_type_hints(schema)
    fields = {f.name for f in dataclasses.fields(schema)}
    unknown = sorted(str(k) for k in values if k not in fields)
    if known_only and unknown:
        raise CheckpointError(f"checkpoint {path}: {field}.{unknown[0]} is not a setting of this version's "
                              f"{schema.__name__}; the checkpoint is from another version or damaged")
    for key in sorted(fields & set(values)):
        kind = hints[key]
        if not fits(values[key], kind):
            raise wrong(path, f"{field}.{key}", values[key], _TYPES[kind])
        if kind is float and not math.isfinite(values[key]):
            raise wrong(path, f"{field}.{key}", values[key], "a finite number")
    return {key: values[key] for key in fields & set(values)}


def model_config(path: Path, state: dict[str, Any]) -> tuple[ModelConfig, int, int]:
    """The checkpoint's model_config checked: (the config, source and target vocabulary sizes)."""
    spec = dict(entry(path, state, "model_config", dict))
    sizes = []
    for key in _SIZES:
        size = counter(path, spec, key, within="model_config.")
        allowed, bound = RANGES["tokenizer.vocab_size"]
        if not (allowed(size) and size > len(SPECIAL_TOKENS)):
            raise wrong(path, f"model_config.{key}", size,
                        f"a vocabulary size > {len(SPECIAL_TOKENS)} and {bound}")
        sizes.append(spec.pop(key))
    if entry(path, spec, "pad_id", int, "model_config.") != PAD_ID:
        raise wrong(path, "model_config.pad_id", spec["pad_id"], f"{PAD_ID} (the id of <pad>)")
    del spec["pad_id"]
    config = ModelConfig(**typed_section(path, "model_config", spec, ModelConfig, known_only=True))
    problems = config.problems()
    if problems:
        raise CheckpointError(f"checkpoint {path}: its model_config breaks the model's rules: "
                              f"{'; '.join(problems)}")
    return config, sizes[0], sizes[1]


# -- the weights --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TensorFacts:
    """What the weights rule reads of a tensor, built by torch or a header's stand-in."""

    dtype: Any
    floating: bool
    shape: tuple[int, ...]
    needed: int  # bytes its elements take
    held: int  # bytes its storage holds


def check_weight_map(path: Path, field: str, weights: Any,
                     facts: Callable[[Any], TensorFacts | None]) -> None:
    """A mapping of parameter names to floating-point tensors, each within its storage; `facts` reads a
    tensor (None: not a tensor)."""
    if not isinstance(weights, dict) or not weights:
        raise wrong(path, field, weights if not weights else type(weights).__name__,
                    "a mapping of parameter names to tensors")
    for name, tensor in weights.items():
        where = f"{field}[{name!r}]"
        known = facts(tensor) if isinstance(name, str) else None
        if known is None:
            raise wrong(path, where, type(tensor).__name__, "a tensor")
        if not known.floating:
            raise wrong(path, f"{where}.dtype", known.dtype, "a floating-point type")
        if known.needed > known.held:
            raise claims_more(path, where, known.shape, known.held)
