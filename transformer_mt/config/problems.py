"""How a broken rule reads: one message per problem, all of a config's problems joined into one line."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from transformer_mt.errors import ConfigError

Rule = tuple[Callable[[Any], bool], str]  # (is the value allowed?, what it must be)


def out_of_range(key: str, value: Any, ok: bool, allowed: str) -> list[str]:
    """[] when ok, else the one message for a value out of its range."""
    return [] if ok else [f"{key}={value!r} is out of range; it must be {allowed}"]


def raise_if(problems: list[str]) -> None:
    """One ConfigError for all problems, joined into one line."""
    if problems:
        raise ConfigError("; ".join(problems))
