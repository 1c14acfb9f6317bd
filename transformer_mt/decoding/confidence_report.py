"""How well confidence sorts translations, for `evaluate`: Spearman's correlation between each sentence's
confidence and its own chrF (sacrebleu's sentence chrF), with a bootstrap interval over the sentences, and
the BLEU of the most confident 50, 80 and 90% of the sentences beside the whole set's; and whether the
values mean what they say: the mean sentence confidence beside the mean chrF/100, the mean word confidence
beside the share of words the references hold (what a calibration fits them to, calibration.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from transformer_mt.decoding.calibration import words_in_reference
from transformer_mt.decoding.metrics import bleu_and_length, sentence_chrfs
from transformer_mt.decoding.text_translator import Translation

FRACTIONS = (0.5, 0.8, 0.9)  # the most confident shares of the sentences whose BLEU is reported
RESAMPLES = 1000  # bootstrap resamples of the sentences
LEVEL = 0.95  # the bootstrap interval's coverage


def average_ranks(values: torch.Tensor) -> torch.Tensor:
    """The 1-based rank of each value along the last dimension, tied values sharing their mean rank."""
    ordered = values.sort(dim=-1).values
    below = torch.searchsorted(ordered, values.contiguous(), right=False)  # values smaller
    up_to = torch.searchsorted(ordered, values.contiguous(), right=True)  # values smaller or equal
    return (below + up_to + 1).double() / 2


def spearman(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Spearman's rank correlation of x and y along the last dimension (Pearson's of their average
    ranks); NaN where either is constant."""
    rx, ry = average_ranks(x), average_ranks(y)
    rx, ry = rx - rx.mean(-1, keepdim=True), ry - ry.mean(-1, keepdim=True)
    return (rx * ry).sum(-1) / ((rx * rx).sum(-1) * (ry * ry).sum(-1)).sqrt()


def bootstrap_interval(x: torch.Tensor, y: torch.Tensor, resamples: int, seed: int,
                       level: float = LEVEL) -> tuple[float, float]:
    """The percentile bootstrap interval of Spearman's correlation: the sentences drawn again with
    replacement `resamples` times (seeded), the correlation of each draw, its (1 - level) / 2 quantiles."""
    generator = torch.Generator().manual_seed(seed)
    drawn = torch.randint(0, len(x), (resamples, len(x)), generator=generator)
    values = spearman(x[drawn], y[drawn])
    values = values[~values.isnan()]
    if not len(values):
        return math.nan, math.nan
    low, high = torch.quantile(values, torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=values.dtype))
    return float(low), float(high)


def most_confident(confidences: Sequence[float], fraction: float) -> list[int]:
    """The indices of the ceil(fraction * n) most confident sentences (ties: the earlier first), in order."""
    ranked = sorted(range(len(confidences)), key=lambda i: (-confidences[i], i))
    return sorted(ranked[: math.ceil(fraction * len(confidences))])


def report(translations: Sequence[Translation], references: Sequence[str], seed: int,
           calibrated: bool) -> dict[str, Any]:
    """The confidence section of evaluate's report, for translations that carry confidences."""
    confidences = [t.confidence if t.confidence is not None else 0.0 for t in translations]
    hypotheses = [t.text for t in translations]
    chrfs = sentence_chrfs(hypotheses, list(references))
    x, y = torch.tensor(confidences, dtype=torch.float64), torch.tensor(chrfs, dtype=torch.float64)
    low, high = bootstrap_interval(x, y, RESAMPLES, seed)
    shares = {}
    for fraction in FRACTIONS:
        kept = most_confident(confidences, fraction)
        shares[f"{round(100 * fraction)}%"] = bleu_and_length([hypotheses[i] for i in kept],
                                                              [references[i] for i in kept])[0]
    words = [(c, right) for t, r in zip(translations, references, strict=True)
             for (_, c), right in zip(t.word_confidences or [],
                                      words_in_reference([w for w, _ in t.word_confidences or []], r))]
    return {"calibrated": calibrated, "sentences": len(translations),
            "spearman_chrf": float(spearman(x, y)), "spearman_interval": [low, high],
            "bootstrap": {"resamples": RESAMPLES, "level": LEVEL, "seed": seed},
            "bleu": bleu_and_length(hypotheses, list(references))[0], "bleu_most_confident": shares,
            "mean_confidence": sum(confidences) / len(confidences),
            "mean_chrf": sum(chrfs) / len(chrfs) / 100,
            "words": len(words), "mean_word_confidence": sum(c for c, _ in words) / max(1, len(words)),
            "words_in_reference": sum(r for _, r in words) / max(1, len(words))}


def lines(section: dict[str, Any]) -> list[str]:
    """The confidence section as evaluate prints it."""
    low, high = section["spearman_interval"]
    kind = "calibrated" if section["calibrated"] else "uncalibrated"
    best = ", ".join(f"{share} {bleu:.2f}" for share, bleu in section["bleu_most_confident"].items())
    return [f"  confidence ({kind}): Spearman with sentence chrF {section['spearman_chrf']:.3f} "
            f"({100 * section['bootstrap']['level']:.0f}% bootstrap interval {low:.3f} to {high:.3f}, "
            f"{section['bootstrap']['resamples']} resamples)",
            f"  BLEU of the most confident {best}; of all {section['bleu']:.2f}",
            f"  mean confidence {section['mean_confidence']:.3f} (mean chrF/100 {section['mean_chrf']:.3f}); "
            f"words: mean confidence {section['mean_word_confidence']:.3f} "
            f"({section['words_in_reference']:.3f} in the reference)"]
