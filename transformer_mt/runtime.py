"""The process a job runs in: device, CPU threads, mixed precision, random state, signals, the training
clock, and files; and `HostReads`, which counts how often the host waits for the device.

Atomic files: every file a run keeps (checkpoints, caches, exports, reports) is written to a temporary
name beside it, fsynced and renamed, so a crash or a full disk never leaves half a file behind.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import shutil
import signal
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

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

    def __str__(self) -> str:
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


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (all devices)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    """Every random generator's state, as plain types that `torch.load(weights_only=True)` accepts."""
    np_state = np.random.get_state()
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what `rng_state` captured."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class Interrupt:
    """First SIGINT/SIGTERM: `requested` is set, so the loop finishes its step and saves; a second one
    stops at once."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> Interrupt:
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread (e.g. some launchers): no graceful stop
                pass
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        log.warning("interrupt received: saving a checkpoint after this step (again to quit now)")

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


class TrainingClock:
    """Seconds of training, validation and checkpointing over every session of a run: what
    `training.max_minutes` budgets and the linear/cosine schedules follow. It moves only at `tick`, so
    a decision taken on it and the checkpoint written after that decision see the same time."""

    def __init__(self, max_minutes: float | None, seconds: float = 0.0,
                 now: Callable[[], float] = time.perf_counter) -> None:
        self.max_minutes, self.seconds, self._now = max_minutes, seconds, now
        self._last = now()

    def start(self) -> None:
        """Count from now (a session's setup time is not training)."""
        self._last = self._now()

    def tick(self) -> None:
        """Add the time since the last tick."""
        now = self._now()
        self.seconds += now - self._last
        self._last = now

    def used(self) -> float:
        """The fraction of the budget spent (0 without one)."""
        return 0.0 if self.max_minutes is None else self.seconds / (self.max_minutes * 60)


TEMPORARY = ".tmp"  # the suffix of a file being written (.<name>.<random>.tmp): a kill leaves it behind


def _new_file_mode() -> int:
    """The mode `open()` gives a new file: 0o666 less the umask (read at import, before any thread)."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


NEW_FILE_MODE = _new_file_mode()


def atomic_write(path: Path, write: Callable[[IO[bytes]], Any]) -> None:
    """Call `write(file)` on a temporary file beside `path`, fsync it, then rename it into place. The
    file gets the permissions `open()` would give it (mkstemp's are the owner's alone)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TEMPORARY, dir=path.parent)
    try:
        os.fchmod(fd, NEW_FILE_MODE)
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def check_writable(run_dir: Path, min_free_mib: int) -> None:
    """Fail before hours of training, not at the first checkpoint: the directory must take files."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / ".write_test"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as ex:
        raise ConfigError(f"cannot write to {run_dir} ({ex.strerror}); set checkpoint.dir= or "
                          "checkpoint.root= to a writable place") from ex
    free = free_mib(run_dir)
    if free < min_free_mib:
        raise ConfigError(f"only {free:.0f} MiB free at {run_dir}; free space or lower "
                          f"training.min_free_mib={min_free_mib}")


def free_mib(directory: Path) -> float:
    """The space free for files in `directory`, in MiB."""
    return shutil.disk_usage(directory).free / 2**20


class HostReads(TorchDispatchMode):
    """Counts the host's reads of tensors that live on one device type: `.item()`, `bool()`, `float()`,
    `int()` (aten's `_local_scalar_dense`), `.tolist()`, `.numpy()` and `.cpu()`. On a GPU each read waits
    for every kernel queued before it (a host synchronisation); on the CPU reads are free, yet counted all
    the same, so a run on the CPU shows how often a GPU would wait. `sites` says where each read was.

        with HostReads(device.type) as reads:
            ...
        reads.count
    """

    METHODS = ("tolist", "numpy", "cpu")

    def __init__(self, device_type: str) -> None:
        super().__init__()
        self.device_type, self.count, self.sites = device_type, 0, []
        self._inside = 0  # in a patched method: its own dispatches are not counted again
        self._originals: dict[str, Any] = {}

    def _record(self, tensor: Any) -> None:
        if isinstance(tensor, torch.Tensor) and tensor.device.type == self.device_type:
            self.count += 1
            ours = [f for f in traceback.extract_stack() if "transformer_mt" in f.filename
                    and not f.filename.endswith("runtime.py")]
            self.sites.append(f"{ours[-1].filename}:{ours[-1].lineno}" if ours else "?")

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is torch.ops.aten._local_scalar_dense.default and not self._inside:
            self._record(args[0])
        return func(*args, **(kwargs or {}))

    def _patched(self, name: str) -> Callable[..., Any]:
        original = self._originals[name]

        def read(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if not self._inside:
                self._record(tensor)
            self._inside += 1
            try:
                return original(tensor, *args, **kwargs)
            finally:
                self._inside -= 1

        return read

    def __enter__(self) -> HostReads:
        for name in self.METHODS:
            self._originals[name] = getattr(torch.Tensor, name)
            setattr(torch.Tensor, name, self._patched(name))
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        for name, original in self._originals.items():
            setattr(torch.Tensor, name, original)
