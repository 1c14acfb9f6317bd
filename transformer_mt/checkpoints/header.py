"""What a checkpoint claims, checked without PyTorch: its archive, its pickle read as inert data, its header.

Importing torch alone takes some 280 MiB, so a crafted checkpoint that claims a huge model must be refused
before torch is imported, for the refusal to be cheap; every load reads the file here first (store.py),
the command line before it imports torch (named.py). The zip archive torch.save writes is read from its
first byte, its pickle by an unpickler that builds inert stand-ins for tensors and storages and refuses
every other global, so that nothing in the file runs. The header then must hold the entries the loader
reads, of their types and bounds (fields.py's rules, which check.py applies after torch's own load too),
every storage as many bytes as its tensors claim, and no fewer parameters than model_config implies
(parameter_count.py). This module imports neither torch nor a module that does.
"""
from __future__ import annotations

import dataclasses
import math
import pickle
import zipfile
from collections import OrderedDict
from pathlib import Path
from typing import Any

from transformer_mt.checkpoints.fields import (
    WEIGHTS,
    TensorFacts,
    check_entries,
    check_weight_map,
    corrupt,
    existing,
    model_config,
    refused,
    size_mismatch,
)
from transformer_mt.checkpoints.parameter_count import parameter_count
from transformer_mt.config import ModelConfig
from transformer_mt.errors import CheckpointError

# torch.load reads a file that does not start as a zip archive as a legacy pickle, zipfile finds one by
# its end: a legacy pickle with a zip appended would pass the one and be loaded by the other.
ZIP_SIGNATURE = b"PK\x03\x04"


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


def check_archive(path: Path) -> None:
    """The file is a zip archive from its first byte (what torch.save has written since PyTorch 1.6), so
    that torch.load reads it as the archive checked here; CheckpointError in one line if not."""
    with open(path, "rb") as file:
        head = file.read(len(ZIP_SIGNATURE))
    if head != ZIP_SIGNATURE or not zipfile.is_zipfile(path):
        raise corrupt(path, "not the zip archive torch.save writes")


def _unpickled(path: Path) -> tuple[Any, list[StorageHeader], dict[str, int]]:
    """(data.pkl's object, the storages it refers to, the size in bytes of each storage's entry)."""
    check_archive(path)
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
    """The weights rule (fields.py) on the header's stand-ins for tensors."""
    check_weight_map(path, field, weights, _facts)


def _facts(tensor: Any) -> TensorFacts | None:
    if not isinstance(tensor, TensorHeader):
        return None
    s = tensor.storage
    return TensorFacts(s.dtype, s.dtype in _FLOATING, tensor.shape, tensor.needs() * s.element_size,
                       s.numel * s.element_size)


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


def read_header(path: str | Path, claims: bool = True) -> dict[str, Any]:
    """The checkpoint's contents with stand-ins for tensors (TensorHeader), read without torch and
    checked: the archive, the pickle (no code), the entries, the storages' sizes and, with `claims`, the
    model_config and the parameters it claims (a loader that checks the weights' shapes against the
    model_config after torch's load, check.py, names a mismatch more precisely). CheckpointError in one
    line if any is wrong."""
    path = existing(path)
    state, storages, sizes = _unpickled(path)
    _check_storages(path, storages, sizes)
    check_entries(path, state, check_tensor_headers)
    if claims:
        config, src_size, tgt_size = model_config(path, state)
        check_size(path, state, config, (src_size, tgt_size))
    return state
