"""Several processes, one model: the process group `torchrun` asks for, and what the ranks agree on.

`torchrun --nproc_per_node=N -m transformer_mt train ...` starts N copies of the command with RANK,
LOCAL_RANK and WORLD_SIZE set. Each copy trains on its own share of every optimizer step's batches,
DistributedDataParallel sums their gradients, and rank 0 alone validates, logs and writes files. The
decisions that end a loop (interrupt, time budget, patience) are shared, because a rank that stops
while the others wait in a collective would hang the job. Without WORLD_SIZE > 1 every helper here is a
no-op, so the single-process path is unchanged.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch
import torch.distributed as dist

from transformer_mt.config.resolvers import set_start_time
from transformer_mt.errors import ConfigError

if TYPE_CHECKING:
    from transformer_mt.config import DatasetConfig, TokenizerConfig
    from transformer_mt.data import PreparedData
    from transformer_mt.data.tokenizer import Vocabulary

T = TypeVar("T")
# Rank 0 may validate for a while as the others wait in a collective: don't time them out too soon.
TIMEOUT = timedelta(minutes=60)


@dataclass(frozen=True)
class World:
    """This process's place among the training processes."""

    rank: int = 0
    local_rank: int = 0  # the rank on this machine: which GPU to use
    size: int = 1

    @property
    def distributed(self) -> bool:
        return self.size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that validates, logs and writes checkpoints."""
        return self.rank == 0


def env_world() -> World:
    """The world torchrun (or a launcher setting the same variables) describes in the environment."""
    try:
        size = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
        local_rank = int(os.environ.get("LOCAL_RANK", str(rank)))
    except ValueError as ex:
        raise ConfigError(f"WORLD_SIZE, RANK and LOCAL_RANK must be integers ({ex})") from ex
    return World(rank=rank, local_rank=local_rank, size=size)


def current() -> World:
    """The world of the initialised process group, or a single process."""
    if not (dist.is_available() and dist.is_initialized()):
        return World()
    rank = dist.get_rank()
    return World(rank=rank, local_rank=int(os.environ.get("LOCAL_RANK", str(rank))),
                 size=dist.get_world_size())


def init(world: World) -> None:
    """Join the process group: gloo for CPU tensors, NCCL for CUDA ones (one backend per device type)."""
    if not world.distributed or dist.is_initialized():
        return
    backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend=backend, rank=world.rank, world_size=world.size, timeout=TIMEOUT)


def barrier() -> None:
    """Wait until every rank of the process group (if any) is here."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def shutdown() -> None:
    """Leave the process group (if any), so the process exits without warnings."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def share_start_time(world: World) -> None:
    """Every rank takes rank 0's start time, so `${tmt_now:...}` names the same run directory.

    Each process reading its own clock could straddle a second and give each rank a directory of its
    own. The time travels as rank 0's local wall-clock text, so nodes in other time zones agree too.
    """
    now = [datetime.now().isoformat()]
    if world.distributed:
        dist.broadcast_object_list(now, src=0, device=torch.device("cpu"))
    set_start_time(datetime.fromisoformat(now[0]))


def prepare_data(dataset: DatasetConfig, tokenizer: TokenizerConfig, run_dir: Path,
                 vocab: Vocabulary | None, world: World) -> PreparedData:
    """`data.prepare_data` on every rank: rank 0 trains the tokenizer (unless vocab is given) and writes
    the split into run_dir; the others then encode with its tokenizer. Sharing the tokenizer's JSON
    rather than a file keeps ranks on other machines in step without a shared disk."""
    from transformer_mt.data import prepare_data as prepare
    from transformer_mt.data.tokenizer import Vocabulary

    if world.is_main:
        data = prepare(dataset, tokenizer, run_dir, vocab=vocab)
        from_main(data.vocab.to_json(), world)
        return data
    return prepare(dataset, tokenizer, None, vocab=Vocabulary.from_json(from_main("", world)))


def rank_device(device: torch.device, world: World) -> torch.device:
    """Each rank on its own GPU (cuda:LOCAL_RANK); CPU ranks share the CPU."""
    if not world.distributed or device.type == "cpu":
        return device
    if device.type != "cuda":
        raise ConfigError(f"distributed training runs on CUDA or the CPU, not {device.type}; use device=cpu")
    if world.local_rank >= torch.cuda.device_count():
        raise ConfigError(f"LOCAL_RANK {world.local_rank} but only {torch.cuda.device_count()} GPUs are "
                          "visible; start at most that many processes per machine (--nproc_per_node)")
    torch.cuda.set_device(world.local_rank)
    return torch.device("cuda", world.local_rank)


def wrap(model: torch.nn.Module, world: World, device: torch.device) -> torch.nn.Module:
    """The module to call in training: DDP around the model when there are several ranks."""
    if not world.distributed:
        return model
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


def set_grad_sync(model: torch.nn.Module, enabled: bool) -> None:
    """Skip the gradient all-reduce on micro-batches that are not the last of an optimizer step.

    The same switch as DDP's `no_sync()` context, set before the forward pass instead of wrapping it.
    """
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        model.require_backward_grad_sync = enabled


def _all_reduce(values: Sequence[float], op: dist.ReduceOp.RedOpType) -> list[float]:
    tensor = torch.tensor(list(values), dtype=torch.float64)  # CPU: gloo, whatever the model's device
    dist.all_reduce(tensor, op=op)
    return tensor.tolist()


def all_sum(values: Sequence[float], world: World) -> list[float]:
    """Element-wise sums over the ranks."""
    return _all_reduce(values, dist.ReduceOp.SUM) if world.distributed else list(values)


def all_max(values: Sequence[float], world: World) -> list[float]:
    """Element-wise maximum over ranks (e.g. the run's clock, which drives budget-aware schedules)."""
    if not world.distributed:
        return list(values)
    return _all_reduce(values, dist.ReduceOp.MAX)


def from_main(value: T, world: World) -> T:
    """Rank 0's value on every rank (picklable values: scores, best-so-far, a tokenizer's JSON)."""
    if not world.distributed:
        return value
    box: list[Any] = [value]
    dist.broadcast_object_list(box, src=0, device=torch.device("cpu"))
    return box[0]


