"""What Hydra needs before it composes a config: our schemas in its ConfigStore, and the resolvers the
YAML files call, among them `run_directory`, the one place that decides where a run's files go.

`configs/train.yaml` sets Hydra's run directory (and each sweep job's) with `${tmt_run_dir:...}`, and
`checkpoint.dir` to Hydra's output directory unless it is given: a training job reads its directory
from `checkpoint.dir` and decides nothing itself.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from transformer_mt.config import SCHEMAS


def _given_dir(root: DictConfig) -> str | None:
    """checkpoint.dir, resolved, when the user gave one; None when unset or when it is (or lies inside)
    Hydra's output directory, which is being decided right now."""
    raw = OmegaConf.to_container(root.checkpoint, resolve=False)["dir"]
    if not raw or "runtime.output_dir" in str(raw):
        return None
    return str(Path(OmegaConf.select(root, "checkpoint.dir")).expanduser().resolve())


def run_directory(default: str, sweep_job: bool = False, *, _root_: DictConfig) -> str:
    """The run's directory: checkpoint.dir when given; else, for a run of its own, the resumed run's
    directory, or <checkpoint.root>/<checkpoint.run_name> when named; else `default`
    (<root>/<dataset>-<src>-<tgt>-<time> for a run, the job's number inside the sweep's directory for
    a sweep job, so that no two jobs share one). checkpoint.dir is absolute, so that Hydra's join with
    the sweep's directory leaves it as it is."""
    given = _given_dir(_root_)
    if given or sweep_job:
        return given or default
    resume = OmegaConf.select(_root_, "resume")
    if resume:
        return str(Path(resume).parent if Path(resume).suffix == ".pt" else Path(resume))
    run_name = OmegaConf.select(_root_, "checkpoint.run_name")
    if run_name:
        return str(Path(OmegaConf.select(_root_, "checkpoint.root")) / run_name)
    return default


_start: list[datetime] = []  # the run's start time where processes share one (set_start_time)


def set_start_time(start: datetime) -> None:
    """The time `${tmt_now:...}` names, for every process of a run: under torchrun, rank 0's
    (training/distributed.py shares it), so that all ranks name one directory."""
    _start[:] = [start]


def _now(pattern: str) -> str:
    """Hydra's `${now:...}` at the run's start: the shared start time, else the current time."""
    return (_start[0] if _start else datetime.now()).strftime(pattern)


def register() -> None:
    """The schemas (as `<command>_schema` for the YAML defaults lists) and our resolvers."""
    store = ConfigStore.instance()
    for command, schema in SCHEMAS.items():
        if f"{command}_schema.yaml" not in store.repo:  # once a process: making the node is most of the work
            store.store(name=f"{command}_schema", node=schema)
    for name, resolver, cache in (("tmt_run_dir", run_directory, False), ("tmt_now", _now, True)):
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, resolver, use_cache=cache)
