"""Fine-tuning (`init=<checkpoint or run dir>`): the parent a new run starts from, and what it decides.

A fine-tuning run takes the parent's weights (and weight average, if any), its tokenizer and its model;
its optimizer, schedule, step count and best score start anew. The keys that make the model and the
tokenizer what they are come from the parent as overrides placed before the user's
(`parent_overrides`), so the run composes to the parent's model whatever the defaults pick; a key set
to another value, a `model=`/`tokenizer=` choice that disagrees, or another language pair is refused
in one line (`check_choices` before composing, `check_config` after). Dropout and subword sampling
are training settings: they stay the new run's own.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from transformer_mt.checkpoints import check, fields
from transformer_mt.checkpoints.paths import is_hf_dir
from transformer_mt.checkpoints.store import WEIGHTS, load_checkpoint, resolve_checkpoint, trained_weights
from transformer_mt.config import CONFIG_DIR, ModelConfig, TokenizerConfig, TrainConfig
from transformer_mt.errors import CheckpointError, ConfigError
from transformer_mt.interop import hf_import
from transformer_mt.model import Transformer
from transformer_mt.training.ema import WeightAverage

log = logging.getLogger(__name__)
SCHEMAS = {"model": ModelConfig, "tokenizer": TokenizerConfig}
# Training-time settings: they change how the weights are trained, not what they are.
OWN_KEYS = {"model": ("dropout", "attention_dropout", "activation_dropout"),
            "tokenizer": ("dropout", "alpha")}
_PLAIN = re.compile(r"^[A-Za-z_][\w.-]*$")


def load_parent(init: str, mmap: bool = False) -> tuple[Path, dict[str, Any]]:
    """(checkpoint file, state) of the parent: a file as given, a run directory's best checkpoint, or a
    Hugging Face directory (interop/hf_import.py); its model, tokenizer, weights and the config sections
    a fine-tuning run reads are checked first."""
    hf = is_hf_dir(init)
    if hf:  # a directory from elsewhere may not say its languages (None): the run's dataset does
        path, state = Path(init), hf_import.parent_state(init, {"src_lang": None, "tgt_lang": None})
    try:
        if not hf:
            path = resolve_checkpoint(init)
            state = load_checkpoint(path, mmap=mmap)
            check.check_model(path, state, WEIGHTS)
        fields.counter(path, state, "step")
        config = fields.entry(path, state, "config", dict)
        tokenizer = fields.entry(path, config, "tokenizer", dict, "config.")
        fields.typed_section(path, "config.tokenizer", tokenizer, TokenizerConfig, known_only=False)
        dataset = fields.entry(path, config, "dataset", dict, "config.")
        for key in ("src_lang", "tgt_lang"):
            if not hf or dataset.get(key) is not None:
                fields.entry(path, dataset, key, str, "config.dataset.")
        return path, state
    except CheckpointError as ex:
        raise fields.for_parent(init, ex) from ex


def decided(section: str, saved: dict[str, Any]) -> dict[str, Any]:
    """The values of a saved `model` or `tokenizer` section that make the weights what they are (not
    OWN_KEYS)."""
    return {f.name: saved[f.name] for f in dataclasses.fields(SCHEMAS[section])
            if f.name not in OWN_KEYS[section] and f.name in saved}


def parent_sections(state: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The parent's values of the keys it decides: {"model": {...}, "tokenizer": {...}}."""
    return {"model": decided("model", state["model_config"]),
            "tokenizer": decided("tokenizer", state["config"]["tokenizer"])}


def _override_value(value: Any) -> str:
    """A value as Hydra's override grammar reads it back."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str) and not _PLAIN.match(value):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return str(value)


def parent_overrides(state: dict[str, Any], sections: Sequence[str] = ("model", "tokenizer")) -> list[str]:
    """The parent's model and tokenizer (or those of `sections`) as overrides, e.g. `model.d_model=64`."""
    return [f"{section}.{key}={_override_value(value)}"
            for section, values in parent_sections(state).items() if section in sections
            for key, value in values.items()]


def _contradictions(section: str, values: dict[str, Any], parent: dict[str, Any],
                    origin: str = "") -> list[str]:
    """`section.key=value contradicts the parent's ...` for each value that differs from the parent's."""
    return [f"{section}.{key}={values[key]!r}{origin} contradicts the parent's {want!r}"
            for key, want in parent[section].items() if key in values and values[key] != want]


def _refuse(init: str, problems: list[str]) -> None:
    if problems:
        raise ConfigError(f"init={init}: {'; '.join(problems)}; a fine-tuned model keeps its parent's model, "
                          "tokenizer and language pair: drop those overrides, or train from scratch")


def group_contradictions(state: dict[str, Any], overrides: Sequence[str],
                         sections: Sequence[str] = ("model", "tokenizer")) -> list[str]:
    """How a `model=<name>` or `tokenizer=<name>` choice (of `sections`) contradicts the checkpoint's
    model and tokenizer (whose keys, put first, would silently replace the file's)."""
    parent, problems = parent_sections(state), []
    for override in overrides:
        section, _, name = override.lstrip("+~").partition("=")
        file = CONFIG_DIR / section / f"{name}.yaml"
        if section in sections and file.is_file():
            chosen = OmegaConf.merge(OmegaConf.structured(SCHEMAS[section]), OmegaConf.load(file))
            values = OmegaConf.to_container(chosen)
            problems += _contradictions(section, values, parent, f" (from {override})")
    return problems


def check_choices(init: str, state: dict[str, Any], overrides: Sequence[str]) -> None:
    """A `model=<name>` or `tokenizer=<name>` choice must describe the parent's model and tokenizer."""
    _refuse(init, group_contradictions(state, overrides))


def check_config(cfg: TrainConfig, state: dict[str, Any]) -> None:
    """The composed config keeps the parent's model, tokenizer and language pair (ConfigError if not)."""
    parent = parent_sections(state)
    problems = [p for section in SCHEMAS
                for p in _contradictions(section, dataclasses.asdict(getattr(cfg, section)), parent)]
    saved = state["config"]["dataset"]
    pair, parent_pair = (cfg.dataset.src_lang, cfg.dataset.tgt_lang), (saved["src_lang"], saved["tgt_lang"])
    # a parent of several target languages (data/languages.py) may be fine-tuned into any of them;
    # a Hugging Face directory that does not say its languages (src_lang None) is taken at its word
    targets = [saved["tgt_lang"], *(corpus.get("tgt_lang") for corpus in saved.get("mix") or ())]
    if saved["src_lang"] is not None and (pair[0] != parent_pair[0] or pair[1] not in targets):
        problems.append(f"dataset.src_lang/tgt_lang {'->'.join(pair)} differs from the parent's "
                        f"{'->'.join(parent_pair)}")
    _refuse(str(cfg.init), problems)


def read_parent(cfg: TrainConfig) -> tuple[Path, dict[str, Any]]:
    """The parent of a fine-tuning run, checked against its config."""
    path, state = load_parent(str(cfg.init))
    check_config(cfg, state)
    log.info("fine-tuning %s (step %d of its run): its weights and tokenizer; a new optimizer and schedule",
             path, state["step"])
    return path, state


def start_from(state: dict[str, Any], model: Transformer, average: WeightAverage | None) -> None:
    """Load the parent's trained weights into the model, and its weight average (or, without one, the
    same weights) into the run's average."""
    model.load_state_dict(trained_weights(state))
    if average is not None:
        average.restore(state, model)
