"""A plan as it is made, logged and kept: each planned key's value, who chose it and why, and what was
measured. Frozen: a plan is decided once, before training, and a resumed run reuses it as it was."""

from __future__ import annotations

import copy
import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, NamedTuple

from transformer_mt.config import TrainConfig
from transformer_mt.tables import markdown_table


class Choice(NamedTuple):
    """A planned key's value, who chose it ("you", "plan", or a fine-tuning run's "parent") and why."""

    key: str
    value: Any
    source: str
    why: str = ""


@dataclass(frozen=True)
class Measured:
    """What the plan measured on this machine and expects of the run."""

    probe_seconds: float  # what planning took: the budget counts it
    tokens_per_s: float  # training target tokens/s of one process at the planned batch
    batch_speeds: dict[int, float]  # the probe's tokens/s at each batch size it measured
    shape_speeds: dict[str, float] | None  # each model shape's at the small one's batch (None: you chose it)
    updates: float
    epochs: float
    steps_per_epoch: int
    ends_by: str  # what ends the run: "budget", or "epochs" (your training.epochs, before the budget)
    validation_seconds: float  # one validation of the planned sample


@dataclass(frozen=True)
class Plan:
    """Every planned key's choice, and the measurements behind them."""

    choices: tuple[Choice, ...]
    measured: Measured

    @property
    def values(self) -> dict[str, Any]:
        return {c.key: c.value for c in self.choices}

    @property
    def sources(self) -> dict[str, str]:
        return {c.key: c.source for c in self.choices}

    def applied_to(self, cfg: TrainConfig, yours: set[str]) -> TrainConfig:
        """A copy of cfg with the plan's values, except for `yours` (also a resumed run's command line's)."""
        cfg = copy.deepcopy(cfg)
        for key, value, source, _ in self.choices:
            if source == "plan" and key not in yours:  # section.name, or section.group.name
                *path, name = key.split(".")
                setattr(functools.reduce(getattr, path, cfg), name, value)
        return cfg

    def table(self) -> str:
        """The log's table: each key, its value, from whom and why; then the measurements."""
        rows = [[c.key, f"{c.value:g}" if isinstance(c.value, float) else str(c.value), c.source, c.why]
                for c in self.choices]
        m = self.measured
        shapes = f", {m.shape_speeds} at the small shape's batch (shape: tokens/s)" if m.shape_speeds else ""
        speeds = {b: round(v) for b, v in m.batch_speeds.items()}
        return (markdown_table(["key", "value", "from", "why"], rows, align="llll") +
                f"\nmeasured in {m.probe_seconds:.1f}s: {m.tokens_per_s:.0f} target tokens/s at {speeds} "
                f"(batch: tokens/s){shapes}; expected {m.updates:.0f} updates, {m.epochs:.2f} epochs of "
                f"{m.steps_per_epoch} updates; one validation {m.validation_seconds:.1f}s")

    def record(self) -> dict[str, Any]:
        """Plain types, as checkpoints and result.json keep the plan."""
        m = dataclasses.asdict(self.measured)
        m["batch_speeds"] = {str(b): v for b, v in self.measured.batch_speeds.items()}  # as JSON has them
        reasons = {c.key: c.why for c in self.choices}
        return {"values": self.values, "sources": self.sources, "reasons": reasons, "measured": m}

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Plan:
        """The plan a checkpoint or result.json keeps (what older versions measured besides is left out)."""
        m = {**record["measured"], "shape_speeds": record["measured"].get("shape_speeds")}
        m["batch_speeds"] = {int(b): float(v) for b, v in m["batch_speeds"].items()}
        measured = Measured(**{f.name: m[f.name] for f in dataclasses.fields(Measured)})
        return cls(tuple(Choice(key, value, record["sources"][key], record["reasons"].get(key, ""))
                         for key, value in record["values"].items()), measured)
