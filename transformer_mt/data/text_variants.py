"""The text of each input variant (data/variants.py applies them to training pairs, decoding/robustness.py
to a test set): how a sentence reads in ALL CAPS, Title Case or lowercase, without its final
punctuation, or misspelt, and the tokenizer's sample with the cased forms an epoch will show.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence

from transformer_mt.config import VariantsConfig

TYPO_RATE = 0.15  # the share of a sentence's words of four letters or more that `add_typos` misspells
_WORD = re.compile(r"[^\W\d_][\w'’-]*")  # a word: a letter, then letters, digits, apostrophes, hyphens
_LONG_WORD = re.compile(r"[^\W\d_]{4,}")
# Final punctuation, with the (no-break) spaces French puts before it: "Où est la gare ?" -> "Où est la gare"
_FINAL_PUNCT = re.compile(r"[\s\u00a0\u202f]*[.!?…。！？]+[\s\u00a0\u202f]*$")


def title_case(text: str) -> str:
    """Each word's first letter upper-case, its others lower-case ("don't" stays one word)."""
    return _WORD.sub(lambda m: m.group(0)[0].upper() + m.group(0)[1:].lower(), text)


def drop_final_punct(text: str) -> str:
    """The text without its final . ! ? … (a text of punctuation alone is kept)."""
    return _FINAL_PUNCT.sub("", text) or text


def add_typos(text: str, rng: random.Random, rate: float = TYPO_RATE) -> str:
    """Each word of four letters or more misspelt with probability `rate` by one of a typist's three
    commonest slips, never on its first letter: two neighbouring letters swapped, one left out, one
    typed twice."""
    def slip(match: re.Match[str]) -> str:
        word = match.group(0)
        if rng.random() >= rate:
            return word
        i, kind = rng.randrange(1, len(word) - 1), rng.randrange(3)
        if kind == 0:
            return word[:i] + word[i + 1] + word[i] + word[i + 2:]
        return word[:i] + word[i + 1:] if kind == 1 else word[:i] + word[i] + word[i:]
    return _LONG_WORD.sub(slip, text)


# How each case variant writes a text: applied to both sides of a pair.
CASES: dict[str, Callable[[str], str]] = {"caps": str.upper, "title": title_case, "lower": str.lower}
NAMES = (*CASES, "no_punct", "typos")


def one_case(text: str) -> str | None:
    """"caps" for a text in ALL CAPS, "lower" for one in lowercase (two letters or more, every cased one
    in that case: "HE IS SLEEPING.", not "I." nor "NASA is"), else None: the input cases that carry no
    sentence case for a model to read."""
    if sum(c.isalpha() for c in text) < 2:
        return None
    return "caps" if text.isupper() else "lower" if text.islower() else None


def sentence_case(text: str) -> str:
    """The text lower-cased but for its first letter: how a corpus writes what ALL CAPS shouts."""
    lower = text.lower()
    first = next((i for i, c in enumerate(lower) if c.isalpha()), None)
    return lower if first is None else lower[:first] + lower[first].upper() + lower[first + 1:]


def pick_case(cfg: VariantsConfig, u: float) -> str | None:
    """The case variant a uniform draw `u` picks: caps, title, lower in turn, each over its probability."""
    edge = 0.0
    for name in CASES:
        edge += getattr(cfg, name)
        if u < edge:
            return name
    return None


def tokenizer_cases(cfg: VariantsConfig) -> dict[str, float]:
    """The case variants' probabilities the tokenizer's sample shows (none: the sample as written)."""
    return {name: getattr(cfg, name) for name in CASES if getattr(cfg, name)}


def tokenizer_pairs(pairs: Sequence[tuple[str, str]], cfg: VariantsConfig,
                    seed: int) -> list[tuple[str, str]]:
    """The tokenizer's training pairs followed by copies in the case variants at their probabilities:
    the vocabulary then holds the pieces of the upper-case words training shows (a vocabulary learnt on
    text as written splits an ALL CAPS word into single letters, too many for the model to learn)."""
    if not tokenizer_cases(cfg):
        return list(pairs)
    rng = random.Random(f"tokenizer-variants:{seed}")
    cased = []
    for source, target in pairs:
        case = pick_case(cfg, rng.random())
        if case:
            cased.append((CASES[case](source), CASES[case](target)))
    return [*pairs, *cased]
