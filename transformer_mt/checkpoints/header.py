"""What a checkpoint claims, checked without PyTorch: its archive, its pickle read as inert data, its header.

Importing torch alone takes some 280 MiB, so a crafted checkpoint that claims a huge model must be refused
before torch is imported, for the refusal to be cheap. The command line reads each checkpoint it is
given here first (`composition`, `overrides`; which file a run directory means: checkpoint_paths.py):
the zip archive torch.save writes, its pickle read by an unpickler that builds inert stand-ins for
tensors and storages and refuses every other global, so that nothing in the file runs. The header then
must hold the entries the loader reads, of their types and bounds (the field rules below, which
`checkpoint_check` applies after torch's own load too), every storage as many bytes as its tensors
claim, and no fewer parameters than model_config implies (parameter_count.py). This module imports neither
torch nor a module that does (tests/test_checkpoint_header.py).
"""
from __future__ import annotations

import dataclasses
import math
import pickle
import typing
import zipfile
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from transformer_mt.checkpoints.parameter_count import parameter_count
from transformer_mt.checkpoints.paths import resolve_checkpoint
from transformer_mt.config import ModelConfig
from transformer_mt.config.checks import RANGES, SPECIAL_TOKENS
from transformer_mt.errors import CheckpointError

FORMAT_VERSION = 1
TRAINED = "trained_model"  # with EMA on, `model` is the average and this the trained weights (ema.py)
REQUIRED = ("format_version", "model_config", "model", "tokenizer", "config")
WEIGHTS = ("model", TRAINED)  # the entries that hold a model's weights
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


# -- the header, read without running anything -------------------------------------------------------
class _Name(str):
    """A torch name shown bare in messages (torch.int64), as torch's own object prints."""

    def __repr__(self) -> str:
        return str(self)


# torch's storage classes a checkpoint names: (their element type, bytes per element).
_STORAGES = {"DoubleStorage": ("torch.float64", 8), "FloatStorage": ("torch.float32", 4),
             "HalfStorage": ("torch.float16", 2), "BFloat16Storage": ("torch.bfloat16", 2),
             "LongStorage": ("torch.int64", 8), "IntStorage": ("torch.int32", 4),
             "ShortStorage": ("torch.int16", 2), "CharStorage": ("torch.int8", 1),
             "ByteStorage": ("torch.uint8", 1), "BoolStorage": ("torch.bool", 1),
             "UntypedStorage": ("torch.uint8", 1)}
_FLOATING = ("torch.float64", "torch.float32", "torch.float16", "torch.bfloat16")


class _Inert:
    """A stand-in the pickle cannot change after building it (its BUILD opcode would set attributes)."""

    def __setstate__(self, state: Any) -> None:
        raise pickle.UnpicklingError("state set on a tensor or storage")


@dataclasses.dataclass(frozen=True, eq=False)
class StorageHeader(_Inert):
    """A storage the pickle refers to: its entry in the archive, element type and count."""

    key: str
    dtype: str
    element_size: int
    numel: int


@dataclasses.dataclass(frozen=True, eq=False)
class TensorHeader(_Inert):
    """A tensor as the pickle describes it, never built: its storage, offset, shape and strides."""

    storage: StorageHeader
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]

    def needs(self) -> int:
        """How many elements its storage must hold: all of its own (a view with stride 0 could claim any
        shape over one), and all that its strides reach."""
        if 0 in self.shape:
            return 0
        reach = self.offset + 1 + sum((n - 1) * s for n, s in zip(self.shape, self.stride))
        return max(math.prod(self.shape), reach)


def _ints(value: Any, length: int | None = None) -> tuple[int, ...]:
    """value as a tuple of ints >= 0, else the pickle is damaged."""
    if not (isinstance(value, tuple) and all(type(v) is int and v >= 0 for v in value)) or (
            length is not None and len(value) != length):
        raise pickle.UnpicklingError("a tensor's shape or strides are not counts")
    return value


def _rebuild_tensor(storage: Any, offset: Any, shape: Any, stride: Any, *_: Any) -> TensorHeader:
    """torch._utils._rebuild_tensor_v2's arguments, recorded (requires_grad, hooks and metadata unused)."""
    if not isinstance(storage, StorageHeader) or type(offset) is not int or offset < 0:
        raise pickle.UnpicklingError("a tensor without a storage")
    shape = _ints(shape)
    return TensorHeader(storage, offset, shape, _ints(stride, len(shape)))


def _rebuild_parameter(data: Any, *_: Any) -> Any:
    """torch._utils._rebuild_parameter: a Parameter is its tensor."""
    return data


def _encode(text: Any, encoding: Any = "latin1") -> bytes:
    """_codecs.encode as pickle protocol 2 writes bytes: a string's latin-1 code points."""
    if not isinstance(text, str) or encoding != "latin1":
        raise pickle.UnpicklingError("bytes written another way than pickle's")
    return text.encode("latin1")


# The globals a checkpoint of ours names, each an inert stand-in; torch's weights_only load allows a few
# more (torch.Size, dtypes, sets), which our checkpoints never hold: they are refused here.
_GLOBALS: dict[str, Any] = {"collections.OrderedDict": OrderedDict, "_codecs.encode": _encode,
                            "torch._utils._rebuild_tensor_v2": _rebuild_tensor,
                            "torch._utils._rebuild_parameter": _rebuild_parameter}


class _Refused(Exception):
    """The pickle names a global outside _GLOBALS."""


class _HeaderUnpickler(pickle.Unpickler):
    """Unpickles data.pkl into plain data and stand-ins, recording every storage it refers to."""

    def __init__(self, file: Any) -> None:
        super().__init__(file)
        self.storages: list[StorageHeader] = []

    def find_class(self, module: str, name: str) -> Any:
        """The stand-in of an allowed global; any other is refused, never imported."""
        if f"{module}.{name}" in _GLOBALS:
            return _GLOBALS[f"{module}.{name}"]
        if module == "torch" and name in _STORAGES:
            return _STORAGES[name]
        raise _Refused(f"it names {module}.{name}")

    def persistent_load(self, pid: Any) -> StorageHeader:
        """('storage', storage type, key, location, element count), as torch.save writes a storage."""
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and pid[1] in
                _STORAGES.values() and isinstance(pid[2], str) and type(pid[4]) is int and pid[4] >= 0):
            raise pickle.UnpicklingError("a storage reference that torch.save does not write")
        dtype, size = pid[1]
        self.storages.append(StorageHeader(pid[2], _Name(dtype), size, pid[4]))
        return self.storages[-1]


def _unpickled(path: Path) -> tuple[Any, list[StorageHeader], dict[str, int]]:
    """(data.pkl's object, the storages it refers to, the size in bytes of each storage's entry)."""
    if not zipfile.is_zipfile(path):  # what torch.save has written since PyTorch 1.6
        raise corrupt(path, "not the zip archive torch.save writes")
    try:
        with zipfile.ZipFile(path) as archive:
            pickled = [i for i in archive.infolist() if i.filename.endswith("/data.pkl")]
            if len(pickled) != 1:
                raise pickle.UnpicklingError("no data.pkl in the archive")
            if any(i.compress_type != zipfile.ZIP_STORED for i in archive.infolist()):
                # torch.save stores; a compressed entry could unpack to far more than the file's size
                raise pickle.UnpicklingError("compressed entries, which torch.save never writes")
            folder = pickled[0].filename[:-len("data.pkl")]
            with archive.open(pickled[0]) as file:
                unpickler = _HeaderUnpickler(file)
                state = unpickler.load()
            sizes = {i.filename[len(folder) + len("data/"):]: i.file_size for i in archive.infolist()
                     if i.filename.startswith(f"{folder}data/")}
    except _Refused as ex:
        raise refused(path, str(ex)) from ex
    except Exception as ex:  # damaged bytes surface as any of a dozen exception types
        raise corrupt(path, (str(ex).strip().splitlines() or [type(ex).__name__])[0][:200]) from ex
    return state, unpickler.storages, sizes


def _check_storages(path: Path, storages: list[StorageHeader], sizes: dict[str, int]) -> None:
    """Each storage is an entry of the archive holding as many bytes as it claims."""
    for storage in storages:
        if storage.key not in sizes:
            raise corrupt(path, f"its storage {storage.key!r} is missing")
        if storage.numel * storage.element_size > sizes[storage.key]:
            raise corrupt(path, f"its storage {storage.key!r} claims {storage.numel:,} elements of "
                                f"{storage.dtype} over {sizes[storage.key]:,} bytes")


def check_tensor_headers(path: Path, field: str, weights: Any) -> None:
    """A mapping of names to floating-point tensors, each within its storage (as
    checkpoint_check.check_tensors checks built ones)."""
    if not isinstance(weights, dict) or not weights:
        raise wrong(path, field, weights if not weights else type(weights).__name__,
                    "a mapping of parameter names to tensors")
    for name, tensor in weights.items():
        where = f"{field}[{name!r}]"
        if not isinstance(name, str) or not isinstance(tensor, TensorHeader):
            raise wrong(path, where, _Name(type(tensor).__name__), "a tensor")
        if tensor.storage.dtype not in _FLOATING:
            raise wrong(path, f"{where}.dtype", tensor.storage.dtype, "a floating-point type")
        if tensor.needs() > tensor.storage.numel:
            raise claims_more(path, where, tensor.shape, tensor.storage.numel * tensor.storage.element_size)


def check_size(path: Path, state: dict[str, Any], config: ModelConfig, sizes: tuple[int, int]) -> None:
    """model_config claims no more parameters than each weights entry holds (its storages' elements, each
    checked against the archive): a small file claiming a huge model is refused before torch is imported."""
    claimed = parameter_count(config, *sizes)
    # Sinusoidal positions are computed, not stored: without this bound a file holding a small model
    # could still make the loader build a table of max_positions × d_model values (up to 1 GiB).
    table = config.max_positions * config.d_model if config.positional != "learned" else 0
    for field in WEIGHTS:
        if field in state:
            held = sum({t.storage.key: t.storage.numel for t in state[field].values()}.values())
            if claimed > held:
                raise size_mismatch(path, claimed, held, f"counted in the storages of {field}")
            if table > held:
                raise CheckpointError(
                    f"checkpoint {path}: model_config's max_positions={config.max_positions} × "
                    f"d_model={config.d_model} asks for a table of {table:,} positional values, more than "
                    f"the {held:,} weights the file holds; the file is damaged or crafted")


def read_header(path: str | Path) -> dict[str, Any]:
    """The checkpoint's contents with stand-ins for tensors (TensorHeader), read without torch and
    checked: the archive, the pickle (no code), the entries and model_config, the storages' sizes and
    the parameters model_config claims. CheckpointError in one line if any is wrong."""
    path = existing(path)
    state, storages, sizes = _unpickled(path)
    _check_storages(path, storages, sizes)
    check_entries(path, state, check_tensor_headers)
    config, src_size, tgt_size = model_config(path, state)
    check_size(path, state, config, (src_size, tgt_size))
    return state


def check_checkpoints(value: str, ensemble: bool) -> None:
    """`checkpoint=<file or run directory>` (comma-separated for an ensemble): each one's header."""
    for part in value.split(",") if ensemble else [value]:
        if part.strip():
            read_header(resolve_checkpoint(part))


def check_parent(init: str) -> None:
    """`init=<file or run directory>`: the parent's header, its problems named as init='s."""
    try:
        read_header(resolve_checkpoint(init))
    except CheckpointError as ex:
        raise for_parent(init, ex) from ex
