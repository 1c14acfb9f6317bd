"""A calibration fitted (confidence.py): held-out pairs translated, each score's curve fitted to what its
confidence should predict.

- The sentence's curve is fitted to each translation's own chrF/100 (sacrebleu's sentence chrF), by
  cross-entropy with those values as soft targets: the fit of a mean, as least squares is, kept within
  [0, 1], so a confidence of 0.6 is the chrF/100 that translations scored so reach on average.
- A word's curve is fitted to whether the reference holds the word (case and the punctuation around
  words ignored, each word of the reference matched once), by cross-entropy: a confidence of 0.6 means
  6 of 10 such words are in the reference.
Each curve is sigmoid(slope * score + bias) with slope >= 0 (a softplus), fitted by L-BFGS on the
standardised scores: two numbers each, which a few hundred sentences pin down.

The pairs are held out from training, never the test split: the end of `train` fits on the last
`training.calibration_sentences` pairs of the run's validation split (past validation's own sample when the
split is large enough), `evaluate calibrate=true` on the set it evaluates (split=valid, or files of one's
own). Each translates with the search it is given (train: its validation search) and records it.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from transformer_mt.config import DecodingConfig, DeviceConfig, SearchConfig
from transformer_mt.data import load_split_tsv
from transformer_mt.data.languages import split_file
from transformer_mt.decoding.confidence import (
    Calibration,
    Logistic,
    Rater,
    raw_score,
    weights_fingerprint,
    write_calibration,
)
from transformer_mt.decoding.metrics import sentence_chrfs
from transformer_mt.decoding.text_translator import Translation
from transformer_mt.decoding.translator import Translator
from transformer_mt.errors import DataError, UserError
from transformer_mt.runtime.device import select_device

log = logging.getLogger(__name__)
MIN_SENTENCES = 10  # fewer held-out translations fit two numbers to noise
_EDGES = re.compile(r"^[\W_]+|[\W_]+$")  # the punctuation (and symbols) around a word


def fit_logistic(scores: Sequence[float], targets: Sequence[float]) -> Logistic:
    """The increasing curve sigmoid(slope * score + bias) closest, by cross-entropy, to targets in [0, 1]."""
    x = torch.tensor(list(scores), dtype=torch.float64)
    y = torch.tensor(list(targets), dtype=torch.float64)
    mean, spread = x.mean(), x.std().clamp_min(1e-9) if len(x) > 1 else torch.tensor(1.0, dtype=x.dtype)
    z = (x - mean) / spread  # standardised: one step size suits every model's scores
    raw_slope = torch.tensor(0.5413, dtype=torch.float64, requires_grad=True)  # softplus: a slope of 1
    bias = torch.tensor(0.0, dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS([raw_slope, bias], lr=1.0, max_iter=500, tolerance_grad=1e-12,
                                  tolerance_change=1e-14, line_search_fn="strong_wolfe")

    def loss() -> torch.Tensor:
        optimizer.zero_grad()
        value = F.binary_cross_entropy_with_logits(F.softplus(raw_slope) * z + bias, y)
        value.backward()
        return value

    optimizer.step(loss)
    slope = float(F.softplus(raw_slope.detach())) / float(spread)
    return Logistic(slope, float(bias.detach()) - slope * float(mean))


def words_in_reference(words: Sequence[str], reference: str) -> list[bool]:
    """For each word, whether the reference holds it: case and the punctuation around it ignored (a word
    of punctuation alone compared as it is), each word of the reference matched once, in order."""
    left = collections.Counter(_bare(w) for w in reference.split())
    found = []
    for word in words:
        key = _bare(word)
        found.append(left[key] > 0)
        if left[key]:
            left[key] -= 1
    return found


def _bare(word: str) -> str:
    return (_EDGES.sub("", word) or word).casefold()


def fit_calibration(translations: Sequence[Translation], references: Sequence[str],
                    fitted: dict[str, Any]) -> Calibration:
    """A calibration from translations rated without one (their confidences the model's probabilities)
    and their references; `fitted` says for which checkpoint and on what (counts are added)."""
    rated = [(t, r) for t, r in zip(translations, references, strict=True)
             if t.confidence is not None and t.word_confidences is not None]
    if len(rated) < MIN_SENTENCES:
        raise DataError(f"{len(rated)} held-out translations to calibrate on; give at least {MIN_SENTENCES}")
    chrfs = sentence_chrfs([t.text for t, _ in rated], [r for _, r in rated])
    sentence = fit_logistic([raw_score(t.confidence) for t, _ in rated],  # type: ignore[arg-type]
                            [c / 100 for c in chrfs])
    scores: list[float] = []
    right: list[float] = []
    for t, reference in rated:
        words = t.word_confidences or []
        scores += [raw_score(c) for _, c in words]
        right += [float(f) for f in words_in_reference([w for w, _ in words], reference)]
    if not scores:
        raise DataError("the held-out translations have no words to calibrate word confidences on")
    word = fit_logistic(scores, right)
    return Calibration(sentence, word, {**fitted, "sentences": len(rated), "words": len(scores)})


def search_name(decoding: SearchConfig) -> str:
    """The search a config asks for, as reports name it: greedy, beam<k> or sampling."""
    if getattr(decoding, "sampling", False):
        return "sampling"
    return "greedy" if decoding.beam_size == 1 else f"beam{decoding.beam_size}"


def raw_translations(engine: Translator, sources: list[str], **options: Any) -> list[Translation]:
    """The best translation of each source, rated without the engine's calibration: what one is fitted to."""
    kept, engine.rater = engine.rater, Rater(None)
    try:
        return [nbest[0] for nbest in engine.translate_nbest(sources, confidence=True, **options)]
    finally:
        engine.rater = kept


def fitted_for(engine: Translator, held_out: str, decoding: SearchConfig) -> dict[str, Any]:
    """What a calibration records of where it comes from: the checkpoint, its weights' fingerprint, the
    held-out set and the search."""
    return {"checkpoint": Path(engine.info["checkpoint"]).name, "step": engine.info.get("step"),
            "fingerprint": weights_fingerprint(engine.model), "held_out": held_out,
            "search": search_name(decoding)}


def calibrate_run(run_dir: Path, sentences: int, search: SearchConfig, device: DeviceConfig) -> Path | None:
    """The end of `train`: the run's checkpoint (its best) calibrated on the last `sentences` pairs of its
    validation split, with its validation search; calibration.json written into the run directory. A run
    that cannot be (no validation split, a model that writes nothing yet) is done all the same: the log
    says why, and how to calibrate it later."""
    try:
        path = _calibrated_run(run_dir, sentences, search, device)
    except UserError as ex:
        log.warning("confidence not calibrated: %s; later: transformer-mt evaluate checkpoint=%s split=valid "
                    "calibrate=true", ex, run_dir)
        return None
    log.info("confidence calibrated on held-out pairs (the last of the validation split): %s", path)
    return path


def _calibrated_run(run_dir: Path, sentences: int, search: SearchConfig, device: DeviceConfig) -> Path:
    valid = split_file(run_dir, "valid")
    if not valid.is_file():
        raise DataError(f"{valid} is missing")
    sources, references = load_split_tsv(valid)
    first = max(0, len(sources) - sentences)
    decoding = DecodingConfig(**dataclasses.asdict(search))
    engine = Translator.from_checkpoint(run_dir, device=select_device(device), decoding=decoding,
                                        amp=device.amp)
    translations = raw_translations(engine, sources[first:])
    held_out = f"split/valid.tsv, pairs {first + 1}-{len(sources)}"
    calibration = fit_calibration(translations, references[first:], fitted_for(engine, held_out, decoding))
    return write_calibration(run_dir, calibration)
