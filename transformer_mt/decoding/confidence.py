"""How sure the model is of a translation: the sentence's confidence and each of its words'.

Both come from the model's log-probability of each token it wrote, read by one teacher-forced pass over the
best hypothesis of each sentence once the search is done (`scoring.token_log_probs`; CTranslate2's
`score_batch`), never from state kept in the search: greedy, beam, sampled and prefixed outputs are rated
alike, and the search runs as it does without.
- A word (a run of non-space characters of the printed translation, `alignment.target_words`) scores the
  log-probability of its pieces together: their sum, the log of the probability the model gave to writing
  that word where it did.
- The sentence scores its tokens' mean log-probability, <eos> included: minus the pair's loss.
A calibration, fitted on held-out pairs (calibration.py) and kept beside the checkpoint as calibration.json,
maps each score through an increasing logistic curve: the sentence's to the chrF/100 that translations with
that score reach, a word's to the share of words with that score that the reference holds. Without one, a
confidence is the model's own probability (exp of the score): it ranks one model's translations, but the
same number means different things for different models.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
from tokenizers import Tokenizer

from transformer_mt.decoding.alignment import target_words
from transformer_mt.decoding.scoring import token_log_probs
from transformer_mt.errors import DataError
from transformer_mt.model import Ensemble, Transformer
from transformer_mt.runtime.files import write_output

log = logging.getLogger(__name__)
CALIBRATION_FILE = "calibration.json"
FORMAT_VERSION = 1
WordConfidences = list[tuple[str, float]]  # each word of a translation's text, with its confidence


@dataclass(frozen=True)
class Logistic:
    """confidence = sigmoid(slope * score + bias): a score mapped to a probability, in the same order
    (slope >= 0)."""

    slope: float
    bias: float

    def __call__(self, score: float) -> float:
        z = self.slope * score + self.bias
        return 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))


@dataclass(frozen=True)
class Calibration:
    """The curves that turn a checkpoint's scores into confidences, and what they were fitted for and on:
    the checkpoint (file, step, `fingerprint`), the held-out set, its sentences and words, the search."""

    sentence: Logistic
    word: Logistic
    fitted: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        """The calibration.json object."""
        return {"format_version": FORMAT_VERSION,
                "sentence": {"score": "mean token log-probability", "predicts": "sentence chrF / 100",
                             "slope": self.sentence.slope, "bias": self.sentence.bias},
                "word": {"score": "the word's pieces' summed log-probability",
                         "predicts": "the word is in the reference", "slope": self.word.slope,
                         "bias": self.word.bias},
                **self.fitted}

    @classmethod
    def from_json(cls, data: Any, source: str) -> Calibration:
        """A calibration read back; DataError naming `source` when it is not one this version wrote."""
        try:
            curves = [Logistic(float(data[k]["slope"]), float(data[k]["bias"])) for k in ("sentence", "word")]
            assert data["format_version"] == FORMAT_VERSION
            assert all(math.isfinite(c.slope) and c.slope >= 0 and math.isfinite(c.bias) for c in curves)
        except (AssertionError, KeyError, TypeError, ValueError):
            raise DataError(f"{source} is not a calibration this version of transformer-mt wrote; delete it "
                            "or fit it again (docs/confidence.md)") from None
        fitted = {k: v for k, v in data.items() if k not in ("format_version", "sentence", "word")}
        return cls(curves[0], curves[1], fitted)

    def applied(self, confidence: float, words: WordConfidences) -> tuple[float, WordConfidences]:
        """Uncalibrated confidences (the model's probabilities) through this calibration."""
        return self.sentence(raw_score(confidence)), [(w, self.word(raw_score(c))) for w, c in words]


def weights_fingerprint(model: nn.Module) -> str:
    """What tells one checkpoint's weights from another's, cheaply: a hash of the model's vectors (biases,
    norms), which any update or average changes. An int8 copy's state also holds packed weights and their
    dtypes (runtime/quantize.py), which are not vectors."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        if isinstance(tensor, torch.Tensor) and tensor.dim() == 1 and tensor.is_floating_point():
            digest.update(name.encode("utf-8"))
            digest.update(tensor.detach().float().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:20]


def read_calibration(directory: Path, fingerprint: str | None = None) -> Calibration | None:
    """The calibration kept in `directory`, or None without one, or (logged) when it was fitted for other
    weights than those of `fingerprint` (None: trust it, as an export checked it when it copied it)."""
    path = directory / CALIBRATION_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        data = None
    calibration = Calibration.from_json(data, str(path))
    if fingerprint is not None and calibration.fitted.get("fingerprint") != fingerprint:
        log.warning("%s was fitted for %s (step %s), not for these weights: confidences are uncalibrated "
                    "until it is fitted again", path, calibration.fitted.get("checkpoint"),
                    calibration.fitted.get("step"))
        return None
    return calibration


def write_calibration(directory: Path, calibration: Calibration) -> Path:
    """calibration.json in `directory`, written whole or not at all."""
    path = directory / CALIBRATION_FILE
    text = json.dumps(calibration.to_json(), indent=2) + "\n"
    write_output(path, lambda f: f.write(text.encode("utf-8")))
    return path


def carry_calibration(run_dir: Path, model: nn.Module, directory: Path) -> Calibration | None:
    """An export's copy (in `directory`) of run_dir's calibration, when it was fitted for these weights."""
    calibration = read_calibration(run_dir, weights_fingerprint(model))
    if calibration is not None:
        write_calibration(directory, calibration)
    return calibration


# -- scores and confidences -----------------------------------------------------------------------------
def sentence_score(log_probs: torch.Tensor) -> float:
    """A translation's score: its tokens' mean log-probability (pieces and <eos>)."""
    return float(log_probs.double().mean())


def word_scores(log_probs: torch.Tensor, owners: Sequence[int | None], n_words: int) -> list[float]:
    """Each word's score: the summed log-probability of the pieces `owners` gives it (the word of each
    piece, `alignment.target_words`; <eos> and pieces of spaces belong to none). A word no piece of its own
    starts (a piece that ends one word and starts the next) takes the score of the word before it."""
    sums: list[float | None] = [None] * n_words
    for value, word in zip(log_probs.double().tolist(), owners):
        if word is not None and word < n_words:
            sums[word] = (sums[word] or 0.0) + value
    scores, last = [], 0.0
    for value in sums:
        last = value if value is not None else last
        scores.append(last)
    return scores


class Rater:
    """An engine's scores turned into confidences: through its calibration, or as the model's own
    probabilities when it has none (said once in the log, with `how_to_fit`)."""

    def __init__(self, calibration: Calibration | None, how_to_fit: str | None = None) -> None:
        self.calibration = calibration
        self.how_to_fit = how_to_fit  # None: nothing to say (a calibration being fitted wants raw values)
        self.seconds = 0.0  # spent in the forced passes: what evaluate's speed leaves out

    def rate(self, log_probs: torch.Tensor, ids: Sequence[int], tok: Tokenizer,
             text: str) -> tuple[float, WordConfidences]:
        """A translation's confidence and its words' from its tokens' log-probabilities (pieces, <eos>);
        `ids` its pieces (the target vocabulary `tok`'s), `text` as printed."""
        if self.calibration is None and self.how_to_fit:
            log.info("confidences are uncalibrated (the model's own probabilities: they rank this model's "
                     "translations, but mean different things for different models); %s", self.how_to_fit)
            self.how_to_fit = None
        words = text.split()
        sentence, word = self._curves()
        scored = word_scores(log_probs, target_words(tok, ids), len(words))
        return sentence(sentence_score(log_probs)), [(w, word(s)) for w, s in zip(words, scored)]

    def rate_forced(self, model: Transformer | Ensemble, src: Sequence[Sequence[int]],
                    best: Sequence[Sequence[int]], texts: Sequence[str], tok: Tokenizer, device: torch.device,
                    batch_tokens: int, amp: torch.dtype | None,
                    should_stop: Callable[[], bool] | None = None) -> list[tuple[float, WordConfidences]]:
        """`rate` of each output (ids `best` of sources `src`, printed as `texts`), its tokens'
        log-probabilities read by one teacher-forced pass of `model` over them all, batched by length."""
        started = time.perf_counter()
        gained = token_log_probs(model, src, best, device, batch_tokens, amp, should_stop)
        rated = [self.rate(g, ids, tok, text) for g, ids, text in zip(gained, best, texts, strict=True)]
        self.seconds += time.perf_counter() - started
        return rated

    def _curves(self) -> tuple[Callable[[float], float], Callable[[float], float]]:
        if self.calibration is None:
            return _probability, _probability
        return self.calibration.sentence, self.calibration.word


def _probability(score: float) -> float:
    return math.exp(min(score, 0.0))


def raw_score(confidence: float) -> float:
    """The score an uncalibrated confidence was made from (its log): what a calibration is fitted to."""
    return math.log(max(confidence, 1e-300))


def recased(words: WordConfidences | None, case: Callable[[str], str]) -> WordConfidences | None:
    """Word confidences of a translation written in another case (each word in that case)."""
    return None if words is None else [(case(w), c) for w, c in words]


# -- thresholds ------------------------------------------------------------------------------------------
def verdict(confidence: float | None, threshold: float | None, action: str) -> str | None:
    """What decoding.min_confidence does to a translation: None (at or above it, or no threshold, or no
    confidence), else `action` (decoding.low_confidence: "mark" or "withhold")."""
    if threshold is None or confidence is None or confidence >= threshold:
        return None
    return action


def shown(confidence: float) -> float:
    """A confidence as outputs write it: four decimals, more than a calibration can tell apart."""
    return round(confidence, 4)


def words_json(words: WordConfidences | None) -> WordConfidences | None:
    """Word confidences as JSON writes them ([[word, confidence], ...]), each confidence `shown`."""
    return None if words is None else [(w, shown(c)) for w, c in words]
