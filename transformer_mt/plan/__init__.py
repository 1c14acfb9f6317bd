"""`training.plan=auto`: a run planned once, before training, from its budget, this machine and its corpus.
A probe times the Trainer's own step and one validation (training/probe.py, validation_cost.py); the rules
(rules.py) turn that and `training.max_minutes` into the settings you left open (decide.py). The plan
(record.py) is logged, applied to the config the Trainer receives, kept in checkpoints and result.json,
and reused by a resumed run. The input variants are chosen first (`inputs`): the data depend on them."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from transformer_mt.config import TrainConfig
from transformer_mt.plan.decide import chosen_by_you, inputs, make
from transformer_mt.plan.record import Plan
from transformer_mt.training import distributed
from transformer_mt.training.start import RunStart

__all__ = ["Plan", "inputs", "settle"]
log = logging.getLogger(__name__)


def settle(cfg: TrainConfig, start: RunStart, overrides: Sequence[str]) -> tuple[TrainConfig, Plan | None]:
    """The run's config with its plan applied, and the plan: the resumed run's own, else a new one (made
    on the first rank, the same on all), None without `training.plan=auto`."""
    saved = (start.state or {}).get("plan")
    if saved:
        plan = Plan.from_record(saved)
        log.info("the run's plan, as it was made:\n%s", plan.table())
    elif cfg.training.plan == "auto":
        plan = make(cfg, start, overrides) if start.world.is_main else None
        plan = distributed.from_main(plan, start.world)
        log.info("plan for %g minutes on this machine (training.plan=auto):\n%s", cfg.training.max_minutes,
                 plan.table())
    else:
        return cfg, None
    return plan.applied_to(cfg, chosen_by_you(cfg, overrides)), plan

