"""The command line's arguments before anything is composed: Hydra's flags told apart from key=value
overrides, a sweep's values listed one by one, old key names, and `checkpoint=a.pt,b.pt` kept as one
value (an ensemble). What a resumed or fine-tuned run reads first is jobs/replayed.py's: this layer reads
no checkpoint.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import IntervalSweep

from transformer_mt.config import ConfigError
from transformer_mt.config.typed import RENAMED, unknown_key_message

log = logging.getLogger(__name__)
# Hydra flags that take a value in the next argument; flags after which nothing runs.
FLAGS_WITH_VALUE = {"--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn",
                    "--config-dir", "-cd", "--experimental-rerun"}
NO_PRECHECK_FLAGS = {"--help", "-h", "--hydra-help", "--shell-completion", "-sc", "--config-dir", "-cd",
                     "--config-path", "-cp", "--config-name", "-cn", "--experimental-rerun", "--version",
                     "--info", "-i"}
MULTIRUN_FLAGS = {"-m", "--multirun"}
# Commands whose `checkpoint=a.pt,b.pt` is an ensemble (decoding) rather than Hydra's sweep over files.
ENSEMBLE_COMMANDS = ("evaluate", "translate", "serve", "score")
# The key of each command that names an ensemble, comma-separated
ENSEMBLE_KEYS = {**dict.fromkeys(ENSEMBLE_COMMANDS, "checkpoint"), "train": "distill.teacher"}


def named_keys(overrides: Sequence[str]) -> set[str]:
    """The config keys that overrides set (`key=value`, `+key=value`, `~key=...`)."""
    return {o.split("=", 1)[0].lstrip("+~") for o in overrides if "=" in o}


def split_flags(args: Sequence[str]) -> tuple[list[str], list[str]]:
    """Separate Hydra's flags (and their values) from key=value overrides."""
    flags: list[str] = []
    overrides: list[str] = []
    rest = list(args)
    while rest:
        arg = rest.pop(0)
        if not arg.startswith("-"):
            overrides.append(arg)
            continue
        flags.append(arg)
        if arg in FLAGS_WITH_VALUE and rest and not rest[0].startswith("-"):
            flags.append(rest.pop(0))
    return flags, overrides


def ensemble_checkpoints(command: str, overrides: Sequence[str]) -> list[str]:
    """`checkpoint=a.pt,b.pt` (train's `distill.teacher=a,b`) quoted into one value, which is read as an
    ensemble: Hydra would take the commas for a sweep (and refuse it without -m). A sweep over them stays
    possible with `checkpoint=choice(a.pt,b.pt)`; values already quoted or holding quotes are left as
    they are."""
    ensemble_key = ENSEMBLE_KEYS.get(command)
    out = []
    for override in overrides:
        key, _, value = override.partition("=")
        if key == ensemble_key and "," in value and not re.search(r"['\"()\[\]]", value):
            override = f"{key}='{value}'"
        out.append(override)
    return out


def renamed_key(override: str) -> str | None:
    """The old key an override uses, if it uses one (`debug=` is also the new group, with a name)."""
    key, _, value = override.lstrip("+~").partition("=")
    return key if key in RENAMED and (key != "debug" or value.lower() in ("true", "false")) else None


def check_renamed(overrides: Sequence[str]) -> None:
    """An old key name fails with one line that names the new one."""
    for override in overrides:
        if renamed_key(override):
            raise ConfigError(unknown_key_message(renamed_key(override)))


def _sweep_values(override: Any) -> list[str]:
    """The values to check of a sweep: each of a list, range or choice, the two ends of an interval."""
    value = override.value()
    if isinstance(value, IntervalSweep):  # Optuna's continuous ranges
        return [str(value.start), str(value.end)]
    return list(override.sweep_string_iterator())


def sweep_variants(overrides: Sequence[str]) -> list[list[str]]:
    """One override list per value of each sweep (a,b,c / range / choice / interval), the other sweeps
    at their first value: every value is checked, and every swept key varies against the first."""
    parsed = OverridesParser.create().parse_overrides(list(overrides))
    firsts: list[str] = []
    options: list[tuple[int, list[str]]] = []
    for i, override in enumerate(parsed):
        if override.is_sweep_override():
            values = [f"{override.get_key_element()}={v}" for v in _sweep_values(override)]
            firsts.append(values[0])
            options.append((i, values))
        else:
            firsts.append(override.input_line)
    variants = [firsts]
    for i, values in options:
        for value in values[1:]:
            variant = list(firsts)
            variant[i] = value
            variants.append(variant)
    return variants
