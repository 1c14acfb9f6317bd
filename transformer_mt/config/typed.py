"""From Hydra's composed DictConfig to the typed dataclass tree of a command (config.py): a key the
schema lacks is named in one line, with its new name when it was renamed."""

from __future__ import annotations

import copy
import dataclasses
import typing
from typing import Any, ClassVar

from omegaconf import DictConfig, OmegaConf, open_dict, read_write

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
    """Turn a composed config into the typed dataclass tree; unknown keys raise ConfigError. A command's
    composition is typed by its schema already (configs/<command>.yaml starts from it), so its values were
    checked then and it converts as it is; other configs (a preset's file, a run's saved section) are
    merged into the schema first."""
    if OmegaConf.get_type(cfg) is schema:
        cfg = copy.copy(cfg)  # its `hydra` node left out of this copy alone; the nodes are shared, not copied
        with read_write(cfg), open_dict(cfg):
            cfg.pop("hydra", None)
        raise_if([unknown_key_message(k) for k in _unknown_keys(cfg, schema)])
        return OmegaConf.to_object(cfg)
    cfg = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]) if "hydra" in cfg else cfg
    raise_if([unknown_key_message(k) for k in _unknown_keys(cfg, schema)])
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), cfg))


def preset(group: str, name: str, schema: type) -> Any:
    """configs/<group>/<name>.yaml as its typed section (the plan's model shapes)."""
    return to_dataclass(OmegaConf.load(CONFIG_DIR / group / f"{name}.yaml"), schema)
