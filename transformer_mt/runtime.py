"""Where and how tensors are computed: device choice, CPU threads, mixed precision, random state."""

from __future__ import annotations

import contextlib
import random
from typing import Any

import numpy as np
import torch

from transformer_mt.config import ConfigError, DeviceConfig


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
    """Apply the thread settings once; inter-op threads can only be set before any parallel work."""
    if cfg.num_threads is not None:
        torch.set_num_threads(cfg.num_threads)
    if cfg.num_interop_threads is not None:
        with contextlib.suppress(RuntimeError):  # already set in this process
            torch.set_num_interop_threads(cfg.num_interop_threads)


def amp_dtype(cfg: DeviceConfig, device: torch.device) -> torch.dtype | None:
    """The autocast dtype: bf16 where the GPU supports it, else fp16 on CUDA; none on CPU by default."""
    if cfg.amp == "off" or (cfg.amp == "auto" and device.type != "cuda"):
        return None
    if cfg.amp == "bf16" or (cfg.amp == "auto" and torch.cuda.is_bf16_supported()):
        return torch.bfloat16
    return torch.float16


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
