"""Where and how a job computes: its device, CPU threads, mixed precision, compilation and batch padding."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from transformer_mt.config import DeviceConfig
from transformer_mt.errors import ConfigError
from transformer_mt.model.attention import use_attention_backends

log = logging.getLogger(__name__)


def select_device(cfg: DeviceConfig) -> torch.device:
    """`auto` prefers CUDA, then Apple MPS, then the CPU; an explicit choice must exist."""
    if cfg.name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if cfg.name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device=cuda but no CUDA GPU is visible; use device=auto or device=cpu")
    if cfg.name == "mps" and not torch.backends.mps.is_available():
        raise ConfigError("device.name=mps but Apple MPS is not available; use device=auto")
    return torch.device(cfg.name)


def configure_threads(cfg: DeviceConfig) -> None:
    """Apply the process's device settings once: the attention kernels CUDA may use, and the threads
    (inter-op threads can only be set before any parallel work)."""
    use_attention_backends(cfg.attention_backends)
    if cfg.num_threads is not None:
        torch.set_num_threads(cfg.num_threads)
    if cfg.num_interop_threads is not None:
        with contextlib.suppress(RuntimeError):  # already set in this process
            torch.set_num_interop_threads(cfg.num_interop_threads)


BF16_FLAGS = ("amx_bf16", "avx512_bf16")  # CPU flags of native bf16 arithmetic, best first


def cpu_flags() -> set[str]:
    """The CPU's feature flags as Linux reports them (empty elsewhere: then no bf16 is assumed)."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return set()
    line = next((line for line in text.splitlines() if line.startswith("flags")), "")
    return set(line.partition(":")[2].split())


def cpu_bf16(flags: set[str], torch_agrees: bool) -> str | None:
    """The flag that gives this CPU native bf16, when torch's kernels agree they can use it."""
    return next((flag for flag in BF16_FLAGS if flag in flags), None) if torch_agrees else None


def _torch_has_cpu_bf16() -> bool:
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def cpu_native_bf16() -> str | None:
    """This machine's flag of native bf16 arithmetic (amx_bf16, avx512_bf16), or None."""
    return cpu_bf16(cpu_flags(), _torch_has_cpu_bf16())


@dataclass(frozen=True)
class Precision:
    """The autocast dtype a run uses (None: float32 throughout) and why, as the log and result.json say."""

    dtype: torch.dtype | None
    reason: str
    int8: bool = False  # the linear layers in int8, the rest in float32 (runtime/quantize.py)

    def __str__(self) -> str:
        if self.int8:
            return f"int8 linear layers, float32 elsewhere ({self.reason})"
        return f"amp {'off' if self.dtype is None else _NAMES[self.dtype]} ({self.reason})"


_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16"}


def precision(cfg: DeviceConfig, device: torch.device, training: bool = True) -> Precision:
    """device.amp: `auto` is bf16 on a CPU with native bf16 (AVX512_BF16 or AMX: about twice the
    float32 speed there), and for training bf16 on a GPU that has it (else fp16); float32 elsewhere.
    Decoding on a GPU stays float32 under auto (not measured in bf16 yet). off/bf16/fp16 force it."""
    if cfg.amp != "auto":
        dtype = {"off": None, "bf16": torch.bfloat16, "fp16": torch.float16}[cfg.amp]
        return Precision(dtype, f"device.amp={cfg.amp}")
    if device.type == "cuda" and not training:
        return Precision(None, "float32 for decoding on cuda")
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported():
            return Precision(torch.bfloat16, "cuda has bf16")
        return Precision(torch.float16, "cuda without bf16: fp16 with loss scaling")
    if device.type == "cpu":
        flag = cpu_native_bf16()
        if flag:
            return Precision(torch.bfloat16, f"cpu has {flag}")
        return Precision(None, "cpu has no native bf16")
    return Precision(None, f"{device.type}: float32")


def compiled(model: torch.nn.Module, pad_to_multiple: int) -> Callable[..., torch.Tensor]:
    """torch.compile for training. Batches padded to a multiple come in a bounded set of shapes (tens an
    epoch): each is compiled once, as a static graph. Without padding, nearly every batch is a new
    shape, so one graph with dynamic shapes serves them all."""
    return torch.compile(model, dynamic=pad_to_multiple <= 1)


def pad_to_multiple(setting: int | None, device: torch.device, compiling: bool) -> int:
    """training.pad_to_multiple, or its default: 8 when compiling on CUDA, 1 elsewhere.

    Compiled, every new batch shape costs a compilation, so a bounded set of shapes pays for its padding.
    Eager, the attention kernels chosen by `device.attention_backends` need no per-shape plan, and
    rounding short sentences up to a multiple of 8 adds far more padding than it saves
    (docs/performance.md counts both on Tatoeba)."""
    if setting is not None:
        return setting
    return 8 if device.type == "cuda" and compiling else 1


def autocast(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    """Autocast when a dtype is chosen, a no-op context otherwise."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)
