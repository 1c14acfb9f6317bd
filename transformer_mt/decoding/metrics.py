"""Translation metrics: corpus BLEU and chrF and sentence chrF from sacrebleu, CER and WER from jiwer."""

from __future__ import annotations

import math
from dataclasses import dataclass

import jiwer
import sacrebleu


@dataclass
class Scores:
    """Metrics of one hypothesis set against one reference set; signatures make BLEU reproducible."""

    bleu: float
    chrf: float
    cer: float  # character error rate, in [0, ...), lower is better
    wer: float
    bleu_signature: str
    chrf_signature: str
    n: int

    def as_dict(self) -> dict[str, float | str | int]:
        """Plain dict for JSON reports and logs."""
        return dict(self.__dict__)


def score(hypotheses: list[str], references: list[str]) -> Scores:
    """Score with a single reference per sentence; empty references are skipped by CER/WER only."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    if not hypotheses:
        raise ValueError("no sentences to score")
    bleu = sacrebleu.metrics.BLEU()
    chrf = sacrebleu.metrics.CHRF()
    bleu_score = bleu.corpus_score(hypotheses, [references])
    chrf_score = chrf.corpus_score(hypotheses, [references])
    # jiwer rejects empty references; an empty hypothesis is simply all deletions.
    kept = [(h, r) for h, r in zip(hypotheses, references) if r.strip()]
    hyps = [h if h.strip() else "" for h, _ in kept]
    refs = [r for _, r in kept]
    cer = jiwer.cer(refs, hyps) if kept else 0.0
    wer = jiwer.wer(refs, hyps) if kept else 0.0
    return Scores(
        bleu=float(bleu_score.score),
        chrf=float(chrf_score.score),
        cer=float(cer),
        wer=float(wer),
        bleu_signature=str(bleu.get_signature()),
        chrf_signature=str(chrf.get_signature()),
        n=len(hypotheses),
    )


def sentence_chrfs(hypotheses: list[str], references: list[str]) -> list[float]:
    """Each sentence's own chrF (sacrebleu's sentence_chrf, the corpus chrF's settings), 0-100."""
    chrf = sacrebleu.metrics.CHRF()
    return [float(chrf.sentence_score(h, [r]).score) for h, r in zip(hypotheses, references, strict=True)]


def mean_scores(scores: list[Scores]) -> Scores:
    """The mean of several sets' scores (the directions of a model of several target languages): each
    metric averaged, the sentences summed, the signatures the first's."""
    mean = {name: sum(getattr(s, name) for s in scores) / len(scores)
            for name in ("bleu", "chrf", "cer", "wer")}
    return Scores(**mean, bleu_signature=scores[0].bleu_signature, chrf_signature=scores[0].chrf_signature,
                  n=sum(s.n for s in scores))


def case_blind(hypotheses: list[str], references: list[str]) -> Scores:
    """BLEU and chrF of the lowercased text (sacrebleu's `lowercase`), with their signatures: what the
    robustness report scores (CER and WER are left at 0)."""
    bleu_metric, chrf_metric = sacrebleu.metrics.BLEU(lowercase=True), sacrebleu.metrics.CHRF(lowercase=True)
    bleu = bleu_metric.corpus_score(hypotheses, [references])
    chrf = chrf_metric.corpus_score(hypotheses, [references])
    return Scores(bleu=float(bleu.score), chrf=float(chrf.score), cer=0.0, wer=0.0,
                  bleu_signature=str(bleu_metric.get_signature()),
                  chrf_signature=str(chrf_metric.get_signature()), n=len(hypotheses))


def bleu_and_length(hypotheses: list[str], references: list[str]) -> tuple[float, float, str]:
    """Corpus BLEU, the hypotheses' length over the references' (sacrebleu's sys_len / ref_len, what its
    brevity penalty reads) and BLEU's signature: what the documents report scores a line of several
    sentences with, since a dropped or fused sentence shows in the length first."""
    metric = sacrebleu.metrics.BLEU()
    bleu = metric.corpus_score(hypotheses, [references])
    ratio = bleu.sys_len / bleu.ref_len if bleu.ref_len else 0.0
    return float(bleu.score), ratio, str(metric.get_signature())


HIGHER_IS_BETTER = {"bleu": True, "chrf": True, "loss": False, "cer": False, "wer": False}


def improves(metric: str, value: float, best: float | None, ties: bool = False) -> bool:
    """Whether a metric's value beats the best so far (or equals it, with ties=True); a non-finite
    value never does, so a diverged model is never the best."""
    if not math.isfinite(value):
        return False
    if best is None:
        return True
    if value == best:
        return ties
    return (value > best) == HIGHER_IS_BETTER[metric]
