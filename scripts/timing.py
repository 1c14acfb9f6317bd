"""The machine a benchmark runs on, and how to time on it fairly: shared by the benchmark scripts.

Not a script itself: `python scripts/benchmark*.py` finds it beside them (Python puts a script's own
directory first on sys.path).
"""

from __future__ import annotations

import math
import os
import platform
import resource
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from transformer_mt.runtime.device import cpu_flags, cpu_native_bf16
from transformer_mt.training.throughput import synchronize

# The CPU features that decide our speed: vector width, bf16 and int8 arithmetic.
FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_bf16", "amx_int8")


def relevant_flags() -> list[str]:
    """Which of FLAGS this CPU has."""
    have = cpu_flags()
    return [flag for flag in FLAGS if flag in have]


def native_bf16() -> bool:
    """Whether this CPU computes in bf16 natively (device.amp=auto picks bf16 there)."""
    return cpu_native_bf16() is not None


def cpu_name() -> str:
    """The CPU's model name (from /proc/cpuinfo where there is one)."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def device_name(device: torch.device) -> str:
    """What computes: the GPU's name on CUDA, the CPU's model name otherwise."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()


def machine(device: torch.device | None = None) -> str:
    """The device, the CPU's model and flags, threads and the torch version, in one line."""
    cpu = (f"{cpu_name()} ({' '.join(relevant_flags()) or 'flags unknown'}); {os.cpu_count()} cores, "
           f"torch threads {torch.get_num_threads()}; torch {torch.__version__}")
    if device is not None and device.type == "cuda":
        return f"{device_name(device)} (CUDA {torch.version.cuda}); host {cpu}"
    return cpu


def _cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot, from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def load_warning(seconds: float = 2.0) -> str | None:
    """Other work on the CPU distorts every figure: measure how busy it is right now.

    /proc/stat over a short window, not the load average, which still counts work that ended a
    minute ago.
    """
    try:
        busy0, total0 = _cpu_times()
        time.sleep(seconds)
        busy1, total1 = _cpu_times()
    except (OSError, ValueError, IndexError):
        return None
    busy = (busy1 - busy0) / max(1, total1 - total0)
    return f"the CPU is {busy:.0%} busy with other processes" if busy > 0.1 else None


def matmul_peak_gflops(device: torch.device, dtype: torch.dtype, n: int, repeats: int = 5) -> float:
    """Best GEMM rate of an n×n product in dtype: the ceiling for matmul-bound training."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    a @ b
    best = math.inf
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        a @ b
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best / 1e9


def _rounds(runs: dict[str, Callable[[], object]], rounds: int) -> Iterator[tuple[str, float, object]]:
    """Each run's name, wall time and output, in `rounds` interleaved rounds: each round runs every setting
    once, so a slow drift of a shared machine hits all of them alike."""
    for _ in range(rounds):
        for name, run in runs.items():
            start = time.perf_counter()
            out = run()
            yield name, time.perf_counter() - start, out


def timed_rounds(runs: dict[str, Callable[[], object]], rounds: int) -> dict[str, list[float]]:
    """Wall times of each run in each interleaved round: a round's times compare in pairs."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for name, seconds, _ in _rounds(runs, rounds):
        times[name].append(seconds)
    return times


def best_of_rounds(runs: dict[str, Callable[[], object]], rounds: int) -> dict[str, tuple[float, object]]:
    """Fastest wall time (and output) of each run over interleaved rounds; the minimum is the least
    disturbed measurement (the `timeit` convention)."""
    best: dict[str, tuple[float, object]] = {}
    for name, seconds, out in _rounds(runs, rounds):
        if name not in best or seconds < best[name][0]:
            best[name] = (seconds, out)
    return best


def peak_rss_mib() -> float:
    """This process's peak resident memory. VmHWM starts afresh at exec; ru_maxrss does not (on
    Linux it keeps the parent's peak across fork + exec), so prefer it where /proc exists."""
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def peak_memory_gib(device: torch.device) -> float:
    """The peak memory of this process on the device: the tensors allocated on a GPU, the resident
    memory of the process on the CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return peak_rss_mib() / 1024
