"""From Hydra's composed DictConfig to the typed dataclass tree of a command (config.py): a key the
schema lacks is named in one line, with its new name when it was renamed."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, ClassVar

from omegaconf import DictConfig, OmegaConf

from transformer_mt.config.problems import raise_if
from transformer_mt.config.schema import CONFIG_DIR

# Renamed keys (old: new, why): the old name fails in one line naming the new; a resumed run's are moved.
RENAMED = {
    "training.valid_beam_size": ("decoding.beam_size", "validation's search during train"),
    "debug": ("traceback", "debug=<name> picks a debug config: configs/debug/"),
}


def _unknown_keys(node: Any, schema: type, prefix: str = "") -> list[str]:
    """Keys present in a composed config that the schema does not define (e.g. from `+key=`)."""
    types = typing.get_type_hints(schema)
    found = []
    for key in node:
        if key not in types or typing.get_origin(types[key]) is ClassVar:
            found.append(f"{prefix}{key}")
        elif dataclasses.is_dataclass(types[key]) and isinstance(node[key], DictConfig):
            found += _unknown_keys(node[key], types[key], f"{prefix}{key}.")
    return found


def unknown_key_message(key: str) -> str:
    """What to say about a key the schema lacks: its new name if it was renamed, else a spelling hint."""
    if key in RENAMED:
        return f"'{key}' was renamed: use {RENAMED[key][0]} ({RENAMED[key][1]})"
    return f"'{key}' is not a known key; check the spelling (`--cfg job` lists every key)"


def to_dataclass(cfg: DictConfig, schema: type) -> Any:
    """Turn a composed config into the typed dataclass tree; unknown keys raise ConfigError."""
    cfg = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]) if "hydra" in cfg else cfg
    raise_if([unknown_key_message(k) for k in _unknown_keys(cfg, schema)])
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), cfg))


def preset(group: str, name: str, schema: type) -> Any:
    """configs/<group>/<name>.yaml as its typed section (the plan's model shapes)."""
    return to_dataclass(OmegaConf.load(CONFIG_DIR / group / f"{name}.yaml"), schema)
