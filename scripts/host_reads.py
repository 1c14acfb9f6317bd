"""`HostReads`: counts how often the host waits for the device, for the tests and benchmarks that check
that a training step on a GPU never synchronises (scripts/training_speed.py, tests/test_gpu_ready.py)."""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode


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
                    and not f.filename.endswith("host_reads.py")]
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
