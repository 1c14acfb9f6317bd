"""The robustness report (`transformer-mt evaluate robustness=true`): one set of sentences translated as
written and as people also type them (the variants of data/variants.py: ALL CAPS, all lowercase, no
final punctuation, typos), each scored against the same references with case ignored (BLEU and chrF
of the lowercased text), so that a variant costs what the model loses, not the case it was asked in.
The typos are drawn from the evaluation's seed: two reports of one model are on the same input.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import asdict, dataclass

from transformer_mt.data.text_variants import CASES, TYPO_RATE, add_typos, drop_final_punct
from transformer_mt.decoding.metrics import case_blind
from transformer_mt.tables import markdown_table

AS_WRITTEN = "as written"
LABELS = {AS_WRITTEN: AS_WRITTEN, "caps": "ALL CAPS", "lower": "all lowercase",
          "no_punct": "no final punctuation", "typos": f"typos ({TYPO_RATE:.0%} of longer words)",
          "caps_as_typed": "ALL CAPS, to the model as typed (decoding.input_case=model)",
          "lower_as_typed": "all lowercase, to the model as typed (decoding.input_case=model)"}


def varied_sources(sources: list[str], seed: int) -> dict[str, list[str]]:
    """The sources as written and in each variant the report scores, by the variant's name."""
    rng = random.Random(f"robustness:{seed}")
    return {AS_WRITTEN: sources, "caps": [CASES["caps"](s) for s in sources],
            "lower": [CASES["lower"](s) for s in sources], "no_punct": [drop_final_punct(s) for s in sources],
            "typos": [add_typos(s, rng) for s in sources]}


@dataclass(frozen=True)
class VariantScore:
    """One row of the report."""

    variant: str
    bleu: float  # lowercased
    chrf: float  # lowercased
    share: float  # of the BLEU as written
    changed: int  # sentences the variant changed


def robustness(translate: Callable[..., list[str]], sources: list[str], references: list[str],
               seed: int, folded: bool = False, written: list[str] | None = None
               ) -> tuple[list[VariantScore], tuple[str, str]]:
    """Each variant's scores, and the BLEU and chrF signatures; `translate` maps sources to hypotheses
    (decoding options as keywords), `written` are the hypotheses of the sources as written where the
    caller has them. The variants go to `translate` in one call (an engine that searches a repeated text
    once translates the ALL CAPS and lowercase forms that it folds to one text once). `folded`: the engine
    folds ALL CAPS and lowercase (decoding.input_case=fold), and two last rows show what the model makes
    of them as typed."""
    varied = varied_sources(sources, seed)
    hypotheses = {AS_WRITTEN: written if written is not None else translate(sources)}
    hypotheses |= _in_one_call(translate, {name: varied[name] for name in varied if name != AS_WRITTEN})
    if folded:
        typed = _in_one_call(translate, {c: varied[c] for c in ("caps", "lower")}, input_case="model")
        hypotheses |= {f"{c}_as_typed": h for c, h in typed.items()}
    rows, signatures = [], ("", "")
    for name, hyps in hypotheses.items():
        scores = case_blind(hyps, references)
        bleu, chrf, signatures = scores.bleu, scores.chrf, (scores.bleu_signature, scores.chrf_signature)
        written_bleu = rows[0].bleu if rows else bleu
        changed = sum(v != s for v, s in zip(varied[name.removesuffix("_as_typed")], sources, strict=True))
        rows.append(VariantScore(name, bleu, chrf, bleu / written_bleu if written_bleu else 0.0, changed))
    return rows, signatures


def _in_one_call(translate: Callable[..., list[str]], inputs: dict[str, list[str]], **options: str
                 ) -> dict[str, list[str]]:
    """Each list of `inputs` translated, all in one call of `translate`."""
    flat = translate([s for texts in inputs.values() for s in texts], **options)
    out, at = {}, 0
    for name, texts in inputs.items():
        out[name], at = flat[at:at + len(texts)], at + len(texts)
    return out


def report(rows: list[VariantScore], signatures: tuple[str, str], seed: int) -> dict[str, object]:
    """The rows as the evaluation's JSON keeps them, with what decides the input and the scores."""
    bleu_signature, chrf_signature = signatures
    return {"seed": seed, "typo_rate": TYPO_RATE, "bleu_signature": bleu_signature,
            "chrf_signature": chrf_signature, "variants": [asdict(r) for r in rows]}


def table(rows: list[VariantScore]) -> str:
    """The rows as a Markdown table."""
    header = ["input", "BLEU (lowercased)", "of as written", "chrF (lowercased)", "sentences changed"]
    return markdown_table(header, [[LABELS[r.variant], f"{r.bleu:.2f}", f"{100 * r.share:.0f}%",
                                    f"{r.chrf:.2f}", str(r.changed)] for r in rows])
