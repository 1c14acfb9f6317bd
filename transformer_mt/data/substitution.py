"""Names and numbers a training pair copies (`dataset.variants.substitute`, data/variants.py): the spans
written the same on both sides of a pair, and new ones drawn with Faker to write in their place.

A span is a number (a digit sequence as a whole token: 25, 1990, 3.5, 10:30, 10,000, 223-1374) or a
capitalised name (Tom, Jean-Paul) found verbatim in the source and the target. A name must be
capitalised somewhere other than at a sentence's start, or be a first name Faker knows: a sentence's
first word is capitalised whatever it is. Every whole-word occurrence of a span must be one the
patterns found ("d'Anna" hides an "Anna" they skip), so that all of them change. "0" and "1" are left
alone: a new number there would break the agreement of the words around it (1 year, 2 years).

A new span keeps the shape the pair wrote: a time stays a time, a decimal keeps its separator and
decimals, thousands separators are written only where both sides wrote them; a plain integer becomes an
integer of another length, a year, or a phone-number-like string of 6-12 digits. A name becomes a first
name, a last name or a full name of one of many locales whose names Faker writes in Latin script.
Everything is drawn from the random generator given (Faker's own state is never used), so a pair's new
spans depend on its seed alone, in any process.
"""

from __future__ import annotations

import functools
import importlib
import random
import re

from faker import Faker

# Locales with person names of their own in Latin script (Faker gives many others en_US's names).
NAME_LOCALES = (
    "en_US", "en_GB", "en_IE", "en_IN", "en_NG", "en_KE", "en_PK", "fr_FR", "fr_CA", "fr_DZ", "de_DE",
    "de_CH", "es_ES", "es_MX", "es_CO", "it_IT", "pt_BR", "pt_PT", "nl_NL", "pl_PL", "cs_CZ", "sk_SK",
    "hu_HU", "ro_RO", "hr_HR", "sl_SI", "sv_SE", "da_DK", "no_NO", "fi_FI", "et_EE", "lt_LT", "lv_LV",
    "is_IS", "tr_TR", "az_AZ", "uz_UZ", "id_ID", "vi_VN", "sw", "ha_NG", "ig_NG", "yo_NG", "zu_ZA", "tw_GH",
)
NUMBER_LOCALE = "en_US"  # digits are the same in every locale

_TIME = r"\d{1,2}:\d{2}(?::\d{2})?"
_GROUPED = r"\d{1,3}(?P<sep>[,.\u00a0\u202f ])\d{3}(?:(?P=sep)\d{3})*(?P<decimals>[.,]\d+)?"
_DECIMAL = r"\d+[.,]\d+"
_HYPHENATED = r"\d+(?:-\d+)+"
# Not inside a word, a longer number or a code ("v1.2", "-5", "1990s", "3.5.2" are not taken)
_NUMBER = rf"(?<![\w.,:/'’-])(?:{_TIME}|{_GROUPED}|{_DECIMAL}|{_HYPHENATED}|\d+)(?![\w/]|[.,:-]\d)"
# Upper-case letters of the Latin, Greek and Cyrillic blocks: a name's first letter (one class, so that
# the pattern skips lower-case words at once: a third of the scan's time)
_UPPER = "".join(c for c in map(chr, range(0x41, 0x530)) if c.isupper())
_NAME = rf"(?<![\w'’-])[{_UPPER}][^\W\d_]+(?:-[^\W\d_]+)*(?![\w-])"
_SPAN = re.compile(rf"(?P<number>{_NUMBER})|(?P<name>{_NAME})")
# What may stand between a sentence's end (or the text's start) and its first word: spaces, quotes, dashes
_OPENING = re.compile(r"(?:^|[.!?…])[\s\"'«»“”‘’(\[¿¡–—-]*$")
_SHAPES = {kind: re.compile(pattern) for kind, pattern in
           (("time", _TIME), ("grouped", _GROUPED), ("decimal", _DECIMAL), ("hyphenated", _HYPHENATED))}
# A plain integer's new shape, (weight, smallest, largest): small, hundreds and thousands, a year, large,
# or (None, None) a phone number's digits
_INTEGERS = ((0.25, 2, 99), (0.2, 100, 9_999), (0.2, 1000, 2099), (0.15, 10_000, 9_999_999),
             (0.2, None, None))
REDRAWS = 10  # draws of a new span that equals a span of the pair before the span is left as it is


@functools.cache
def _faker(locale: str) -> Faker:
    """One Faker a locale (made once a process: a few tens of milliseconds each)."""
    return Faker(locale)


@functools.cache
def first_names() -> frozenset[str]:
    """Every first name of the locales' person providers (read from their lists, no Faker made)."""
    names: set[str] = set()
    for locale in NAME_LOCALES:
        provider = importlib.import_module(f"faker.providers.person.{locale}").Provider
        for attribute in ("first_names", "first_names_male", "first_names_female"):
            names.update(getattr(provider, attribute, ()))
    return frozenset(names)


def _occurrences(text: str) -> dict[str, list[bool]]:
    """Each number or capitalised word of `text`, and for each of its occurrences whether it starts a
    sentence."""
    found: dict[str, list[bool]] = {}
    for m in _SPAN.finditer(text):
        span = m.group(0)
        if m.group("number"):
            found.setdefault(span, []).append(False)
        elif not span.isupper():  # a name is not in ALL CAPS (OK, USA, CD)
            found.setdefault(span, []).append(bool(_OPENING.search(text, 0, m.start())))
    return found


def _whole_words(text: str, span: str) -> int:
    return len(re.findall(rf"(?<!\w){re.escape(span)}(?!\w)", text))


def shared_spans(source: str, target: str) -> list[str]:
    """The names and numbers written the same on both sides, in the source's order (module docstring)."""
    src = _occurrences(source)
    tgt = _occurrences(target) if src else {}
    spans = []
    for span, starts in src.items():
        if span not in tgt or (span.isdigit() and int(span) < 2):
            continue
        if span[0].isdigit() or not all(starts + tgt[span]) or span in first_names():
            if _whole_words(source, span) == len(starts) and _whole_words(target, span) == len(tgt[span]):
                spans.append(span)
    return spans


def new_name(rng: random.Random) -> str:
    """A first name (half the draws), a last name or a full name of a locale drawn from NAME_LOCALES."""
    fake = _faker(rng.choice(NAME_LOCALES))
    fake.random = rng
    kind = rng.random()
    if kind < 0.5:
        return fake.first_name().strip()
    if kind < 0.75:
        return fake.last_name().strip()
    return f"{fake.first_name().strip()} {fake.last_name().strip()}"


def new_number(span: str, rng: random.Random) -> str:
    """Another number of the span's shape (module docstring)."""
    fake = _faker(NUMBER_LOCALE)
    fake.random = rng
    kind = next((k for k, pattern in _SHAPES.items() if pattern.fullmatch(span)), "integer")
    if kind == "time":
        hour, *rest = span.split(":")
        new = str(fake.random_int(0, 23)).zfill(len(hour) if hour.startswith("0") else 1)
        return ":".join([new, *(f"{fake.random_int(0, 59):02d}" for _ in rest)])
    if kind == "grouped":
        m = _SHAPES["grouped"].fullmatch(span)
        assert m is not None
        groups = [str(fake.random_int(1, 999)), *(fake.numerify("###") for _ in range(fake.random_int(1, 2)))]
        decimals = m["decimals"] or ""
        return m["sep"].join(groups) + decimals[:1] + fake.numerify("#" * len(decimals[1:]))
    if kind in ("decimal", "hyphenated"):  # the same separators, digits of the same counts (but the first)
        head, *parts = re.split(r"([.,-])", span)
        first = str(fake.random_int(0, 999)) if kind == "decimal" else fake.numerify("#" * len(head))
        return first + "".join(p if p in ".,-" else fake.numerify("#" * len(p)) for p in parts)
    _, smallest, largest = rng.choices(_INTEGERS, weights=[w for w, _, _ in _INTEGERS])[0]
    if smallest is None:  # a phone number's digits: 6 to 12 of them, often a leading 0
        return fake.numerify(rng.choice("0%") + "#" * (fake.random_int(6, 12) - 1))
    return str(fake.random_int(smallest, largest))


def substitute(source: str, target: str, spans: list[str], rng: random.Random) -> tuple[str, str]:
    """The pair with each of `spans` replaced, on both sides, by one new span drawn from `rng` (a span
    whose draws keep meeting the pair's other spans stays as it is)."""
    new: dict[str, str] = {}
    for span in spans:
        for _ in range(REDRAWS):
            drawn = new_number(span, rng) if span[0].isdigit() else new_name(rng)
            if drawn not in spans and drawn not in new.values():
                new[span] = drawn
                break
    def replace(m: re.Match[str]) -> str:
        return new.get(m.group(0), m.group(0))
    return _SPAN.sub(replace, source), _SPAN.sub(replace, target)
