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

from transformer_mt.checkpoint import CheckpointError, load_checkpoint, resolve_checkpoint
from transformer_mt.config import DecodingConfig, DeviceConfig, validate
from transformer_mt.model import Transformer, TransformerConfig
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


def decoding_with(decoding: DecodingConfig, **overrides: Any) -> DecodingConfig:
    """A copy of `decoding` with the given (non-None) options, validated like the config."""
    given = {k: v for k, v in overrides.items() if v is not None}
    decoding = dataclasses.replace(decoding, **given)
    if "beam_size" in given and "n_best" not in given:
        decoding.n_best = min(decoding.n_best, decoding.beam_size)
    holder = dataclasses.make_dataclass("Holder", [("decoding", DecodingConfig)])(decoding)
    validate(holder)
    return decoding


def encode_sources(vocab: Vocabulary, sentences: list[str], max_tokens: int) -> tuple[list[list[int]], int]:
    """Source token ids cut to `max_tokens`, and how many were cut (each one logged)."""
    ids = vocab.encode_src([s.strip() for s in sentences])
    cut = 0
    for i, seq in enumerate(ids):
        if len(seq) > max_tokens:
            ids[i] = seq[:max_tokens]
            cut += 1
            log.warning("input %d has %d tokens; translating its first %d (the model's limit)",
                        i + 1, len(seq), max_tokens)
    return ids, cut


class Translator:
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
        file = resolve_checkpoint(path)
        state = load_checkpoint(file)
        target = device if isinstance(device, torch.device) else select_device(DeviceConfig(device))
        try:
            model = Transformer(TransformerConfig(**state["model_config"]))
            model.load_state_dict(state["model"])
            vocab = Vocabulary.from_json(state["tokenizer"])
        except (TypeError, RuntimeError, ValueError, KeyError) as ex:
            first = str(ex).strip().splitlines()[0][:200]
            raise CheckpointError(f"checkpoint {file} does not match this version's model or "
                                  f"tokenizer ({first})") from ex
        if (vocab.src_vocab_size, vocab.tgt_vocab_size) != (model.config.src_vocab_size,
                                                            model.config.tgt_vocab_size):
            raise CheckpointError(f"checkpoint {file}: the tokenizer's vocabulary does not fit the "
                                  "model's embeddings; it was assembled from different runs")
        info = {"checkpoint": str(file), "epoch": state.get("epoch"), "step": state.get("step"),
                "config": state.get("config", {})}
        return cls(model, vocab, target, decoding, max_input_tokens, info)

    def _options(self, **overrides: Any) -> DecodingConfig:
        return decoding_with(self.decoding, **overrides)

    def encode(self, sentences: list[str]) -> list[list[int]]:
        """Token ids of each source, cut to the model's length limit (counted in `truncated`)."""
        ids, cut = encode_sources(self.vocab, sentences, self.max_input_tokens)
        self.truncated += cut
        return ids

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
