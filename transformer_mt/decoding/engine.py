"""Which translator a job serves: the PyTorch `Translator` on a checkpoint, or CTranslate2's engine on an
exported model directory (`engine=ctranslate2`, the `ct2` extra). Both have the `TextTranslator` interface."""

from __future__ import annotations

import logging

from transformer_mt.config import EngineConfig
from transformer_mt.decoding.glossary import read_glossary
from transformer_mt.decoding.text_translator import TextTranslator
from transformer_mt.decoding.translator import Translator
from transformer_mt.runtime.device import configure_threads, select_device

log = logging.getLogger(__name__)


def load_engine(cfg: EngineConfig) -> TextTranslator:
    """The PyTorch Translator on a checkpoint, or with engine=ctranslate2 a CT2Translator (the same
    interface) on a model directory written by `transformer-mt export` (the `ct2` extra); with
    decoding.glossary, its glossary (read before the model: a bad file is one line, and no wait)."""
    glossary = read_glossary(cfg.decoding.glossary)
    engine = _engine(cfg)
    engine.use_glossary(glossary)
    if glossary is not None:
        log.info("glossary %s: %d terms", cfg.decoding.glossary, len(glossary))
    return engine


def _engine(cfg: EngineConfig) -> TextTranslator:
    configure_threads(cfg.device)
    if cfg.engine == "ctranslate2":
        from transformer_mt.decoding.ct2 import (
            CT2Translator,  # ConfigError naming the extra without ctranslate2
        )

        assert cfg.model_dir is not None  # validate() requires it
        exported = CT2Translator.from_dir(cfg.model_dir, device=cfg.device.name,
                                          intra_threads=cfg.device.num_threads or 0, decoding=cfg.decoding,
                                          max_input_tokens=cfg.max_input_tokens, exact=cfg.ct2_exact)
        exported.language_id(cfg.tgt_lang)  # a language the model lacks: one line now
        exported.tgt_lang = cfg.tgt_lang
        return exported
    assert cfg.checkpoint is not None  # validate() requires it
    engine = Translator.from_checkpoint(cfg.checkpoint, device=select_device(cfg.device),
                                        decoding=cfg.decoding, max_input_tokens=cfg.max_input_tokens,
                                        amp=cfg.device.amp, tgt_lang=cfg.tgt_lang)
    log.info("translating on %s (%s)%s", engine.device, engine.precision,
             f" into {engine.tgt_lang}" if engine.vocab.target_languages else "")
    return engine
