"""The Python API: load a checkpoint once, translate many sentences.

    >>> from transformer_mt import Translator
    >>> engine = Translator.from_checkpoint("saved_weights/<run>", device="auto")
    >>> engine.predict("He is sleeping.")
    'Il dort.'
    >>> engine.translate(["I am cold.", "Where is the station?"], beam_size=5)

`evaluate` and `translate` use this same object, so what a notebook gets is what the CLI prints.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from transformer_mt.checkpoint import model_from_checkpoint
from transformer_mt.config import DecodingConfig, DeviceConfig, validate
from transformer_mt.model import Transformer
from transformer_mt.predict import decode_ids
from transformer_mt.runtime import select_device
from transformer_mt.tokenizer import Vocabulary

log = logging.getLogger(__name__)


@dataclass
class Translation:
    """One hypothesis: detokenised text, its model score and (on request) cross-attention."""

    text: str
    score: float
    tokens: list[str] | None = None
    attention: torch.Tensor | None = None  # (output tokens, source tokens)


class TextTranslator:
    """What every engine offers on top of its own `translate_nbest`: strings in, strings out.

    Subclasses set `vocab`, `decoding`, `max_input_tokens` and `truncated`.
    """

    vocab: Vocabulary
    decoding: DecodingConfig
    max_input_tokens: int
    truncated: int

    def translate_nbest(self, sentences: list[str], return_attention: bool = False,
                        **options: Any) -> list[list[Translation]]:
        """n-best translations per sentence (best first)."""
        raise NotImplementedError

    def _options(self, **overrides: Any) -> DecodingConfig:
        """This engine's decoding settings with the given (non-None) options, validated."""
        given = {k: v for k, v in overrides.items() if v is not None}
        decoding = dataclasses.replace(self.decoding, **given)
        if "beam_size" in given and "n_best" not in given:
            decoding.n_best = min(decoding.n_best, decoding.beam_size)
        holder = dataclasses.make_dataclass("Holder", [("decoding", DecodingConfig)])(decoding)
        validate(holder)
        return decoding

    def encode(self, sentences: list[str]) -> list[list[int]]:
        """Token ids of each source, cut to the model's length limit (counted in `truncated`)."""
        ids = self.vocab.encode_src([s.strip() for s in sentences])
        for i, seq in enumerate(ids):
            if len(seq) > self.max_input_tokens:
                ids[i] = seq[: self.max_input_tokens]
                self.truncated += 1
                log.warning("input %d has %d tokens; translating its first %d (the model's limit)",
                            i + 1, len(seq), self.max_input_tokens)
        return ids

    def translate(self, sentences: str | list[str], beam_size: int | None = None,
                  **options: Any) -> str | list[str]:
        """Best translation of one sentence (a string) or of each sentence of a list."""
        single = isinstance(sentences, str)
        batch = [sentences] if single else list(sentences)
        best = [nbest[0].text for nbest in self.translate_nbest(batch, beam_size=beam_size, **options)]
        return best[0] if single else best

    def predict(self, sentence: str) -> str:
        """The classic tutorials' one-sentence call."""
        return self.translate(sentence)  # type: ignore[return-value]


class Translator(TextTranslator):
    """A trained model with its tokenizer, ready to translate plain text."""

    def __init__(self, model: Transformer, vocab: Vocabulary, device: torch.device,
                 decoding: DecodingConfig | None = None, max_input_tokens: int | None = None,
                 info: dict[str, Any] | None = None):
        self.model = model.to(device).eval()
        self.vocab = vocab
        self.device = device
        self.decoding = decoding or DecodingConfig()
        limit = model.config.max_positions - 1  # room for the source's <eos>
        self.max_input_tokens = min(max_input_tokens or limit, limit)
        self.info = info or {}
        self.truncated = 0  # inputs cut to max_input_tokens so far

    @classmethod
    def from_checkpoint(cls, path: str | Path, device: str | torch.device = "auto",
                        decoding: DecodingConfig | None = None,
                        max_input_tokens: int | None = None) -> Translator:
        """Rebuild model and tokenizer from a checkpoint file or run directory (its best checkpoint)."""
        file, state, model, vocab = model_from_checkpoint(path)
        target = device if isinstance(device, torch.device) else select_device(DeviceConfig(device))
        info = {"checkpoint": str(file), "epoch": state.get("epoch"), "step": state.get("step"),
                "config": state.get("config", {})}
        return cls(model, vocab, target, decoding, max_input_tokens, info)

    def translate_nbest(self, sentences: list[str], return_attention: bool = False,
                        **options: Any) -> list[list[Translation]]:
        """n-best translations per sentence (best first); empty input gives one empty translation."""
        decoding = self._options(**options)
        ids = self.encode(sentences)
        real = [i for i, s in enumerate(sentences) if s.strip()]
        results: list[list[Translation]] = [[Translation("", 0.0)] for _ in sentences]
        if not real:
            return results
        hyps = decode_ids(self.model, [ids[i] for i in real], decoding, self.device,
                          return_attention=return_attention)
        for i, nbest in zip(real, hyps):
            texts = self.vocab.decode_tgt([h.tokens for h in nbest])
            results[i] = [
                Translation(text, float(h.score),
                            self.vocab.tgt_tokens_from_ids(h.tokens) if return_attention else None,
                            h.attention)
                for text, h in zip(texts, nbest)
            ]
        return results
