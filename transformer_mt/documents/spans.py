"""Spans that must come through a translation exactly: numbers, prices, times, years, e-mail addresses,
URLs, file paths, codes that mix letters and digits, a user's do-not-translate terms, the inline pieces a
format keeps (inline code, an image), and names the model never met: a capitalised word that no training
pair holds (data/words.py), which the model could only garble, and a name is what such a word most often
is. Each is found here, replaced before the model by a stand-in the model copies, and put back after it
in place of that stand-in.

A small model garbles what it rarely saw ("0585738843" comes out as "5583", an address as words), but it
copies the few names and numbers its corpus is full of; a stand-in is one of those. Which stand-ins, and
how well each is copied, is measured in docs/documents.md.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from transformer_mt.errors import DataError

_TLDS = "com|org|net|edu|gov|io|fr|de|uk|es|it|nl|eu|info|ch|be|ca|jp|ru|br|au|co|us|app|dev"
GLOSSARY = "glossary"  # the kind of a glossary term's range: claimed, never masked
TRAILING = ".,;:!?)]}»\"'’”"  # what ends a sentence rather than an address
_URL = (rf"(?:https?://|ftp://|www\.)[^\s<>\"]+|\b[a-z0-9][a-z0-9-]*(?:\.[a-z0-9-]+)*\.(?:{_TLDS})"
        r"(?:/[^\s<>\"]*)?(?![\w@])")
_EMAIL = r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+"
_PATH = (r"(?<![\w/])(?:~|\.{1,2})?/(?:[\w.@-]+/)*[\w.@-]+|\b[A-Za-z]:\\(?:[^\\\s]+\\)*[^\\\s]*"
         r"|\b[\w-]+\.(?:pdf|docx?|xlsx?|pptx?|txt|csv|json|zip|png|jpe?g|gif|py|md|html?|mp[34]|exe)\b")
_TIME = r"\b\d{1,2}:\d{2}(?::\d{2})?(?:\s?(?:[ap]m\b|[ap]\.m\.))?"
_AMOUNT = r"\d{1,3}(?:[,.\u00a0\u202f ]\d{3})+(?:[.,]\d+)?|\d+(?:[.,]\d+)?"
_PRICE = rf"[$€£¥]\s?(?:{_AMOUNT})|(?:{_AMOUNT})\s?(?:€|\$|£|EUR|USD|GBP|CHF)(?!\w)"
_PHONE = r"\+\d{1,3}(?:[ .-]?\(?\d+\)?)+|\(?\b\d{2,5}\)?(?:[ .-]\d{2,}){1,4}\b"
# a code: hyphenated pieces with a letter and a digit (AB-1234), or capitals and digits (X7K9P2)
_CODE = (r"\b(?=[A-Za-z0-9-]*\d)(?=[A-Za-z0-9-]*[A-Za-z])[A-Za-z0-9]+(?:-[A-Za-z0-9]+)+\b"
         r"|\b(?=[A-Z]*\d)(?=\d*[A-Z])[A-Z0-9]{3,}\b")
_YEAR = r"\b(?:1[5-9]\d\d|20\d\d)\b(?![.,]\d)"
_NUMBER = rf"\b(?:{_AMOUNT})\b"

# The kinds, in the order they claim text: an address before the numbers inside it, a price before its
# amount. "term" (the user's list) and "markup" (a format's inline pieces) are given, not found.
PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (kind, re.compile(pattern, re.IGNORECASE if kind in ("url", "email") else 0))
    for kind, pattern in (("email", _EMAIL), ("url", _URL), ("path", _PATH), ("time", _TIME),
                          ("price", _PRICE), ("code", _CODE), ("number", _PHONE), ("year", _YEAR),
                          ("number", _NUMBER)))
TRIMMED = ("url", "email", "path")  # kinds whose match may run into the sentence's punctuation
KINDS = ("number", "price", "time", "year", "email", "url", "code", "path", "name", "term", "markup")
# A word, hyphenated parts and all ("Jean-Luc"); an apostrophe ends it ("Yusuf's": the name is "Yusuf")
NAME_WORD = re.compile(r"(?<![\w@/\\.-])[^\W\d_]+(?:-[^\W\d_]+)*(?![\w@/\\-])")
# Source languages that capitalise every noun: a capitalised word of theirs that training never held is
# as likely a compound noun to translate as a name (document.names=auto leaves them be)
CAPITALISED_NOUNS = ("de", "lb")


def copies_names(names: str, src_lang: str | None) -> bool:
    """Whether `document.names` keeps a capitalised word no training pair held as a name: `copy`, or
    `auto` for a source language that does not capitalise its nouns (English when unknown)."""
    return names == "copy" or (names == "auto" and (src_lang or "en") not in CAPITALISED_NOUNS)
ORDINAL = re.compile(r"\d+(?:st|nd|rd|th|e|er|re|ème|ème|te|ten)\b", re.IGNORECASE)


@dataclass(frozen=True)
class Span:
    """A stretch of a text that must come through as it is: [start, end) of the text, and its kind."""

    start: int
    end: int
    kind: str

    def of(self, text: str) -> str:
        return text[self.start:self.end]


def _trim(text: str, start: int, end: int) -> int:
    """The end of an address without the sentence's punctuation after it (a closing bracket stays when
    the address opened one)."""
    while end > start and text[end - 1] in TRAILING:
        if text[end - 1] == ")" and text.count("(", start, end) >= text.count(")", start, end):
            break
        end -= 1
    return end


def find_spans(text: str, terms: Sequence[str] = (), given: Iterable[tuple[int, int]] = (),
               known: frozenset[str] | None = None, glossary: Iterable[tuple[int, int]] = ()) -> list[Span]:
    """The protected spans of `text`, in order and never overlapping: the `given` ranges (a format's
    inline pieces) first, then the glossary's source terms (kind GLOSSARY: the model translates them, so
    nothing inside one is masked), then the user's terms (whole words, longest first), then each kind's
    pattern, then, with `known` (the training pairs' words, case folded), the capitalised words not among
    them."""
    taken = [False] * len(text)
    found: list[Span] = []

    def claim(start: int, end: int, kind: str) -> None:
        if end > start and not any(taken[start:end]):
            taken[start:end] = [True] * (end - start)
            found.append(Span(start, end, kind))

    for start, end in given:
        claim(start, end, "markup")
    for start, end in glossary:
        claim(start, end, GLOSSARY)
    for term in sorted({t for t in terms if t.strip()}, key=len, reverse=True):
        for m in re.finditer(rf"(?<!\w){re.escape(term)}(?!\w)", text):
            claim(m.start(), m.end(), "term")
    for kind, pattern in PATTERNS:
        for m in pattern.finditer(text):
            end = _trim(text, m.start(), m.end()) if kind in TRIMMED else m.end()
            if kind == "number" and ORDINAL.match(text, m.start()):
                continue  # "2nd" is a word to translate ("2e"), not a number to copy
            claim(m.start(), end, kind)
    names: list[list[int]] = []  # names one space apart are one ("José María"): the model keeps their order
    for m in NAME_WORD.finditer(text) if known is not None else ():
        if m.group()[0].isupper() and any(part.casefold() not in known for part in m.group().split("-")):
            if names and text[names[-1][1]:m.start()] == " ":
                names[-1][1] = m.end()
            else:
                names.append([m.start(), m.end()])
    for start, end in names:
        claim(start, end, "name")
    return sorted(found, key=lambda s: s.start)


def read_terms(path: str) -> tuple[str, ...]:
    """A do-not-translate list: one term a line (UTF-8; blank lines and lines starting with # skipped);
    DataError in one line when the file cannot be read."""
    try:
        raw = Path(path).read_bytes()
    except OSError as ex:
        raise DataError(f"document.keep_terms={path}: cannot read it ({ex.strerror or ex}); give a UTF-8 "
                        "text file with one term a line") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as ex:
        line = raw[:ex.start].count(b"\n") + 1
        raise DataError(f"document.keep_terms={path}: line {line} is not UTF-8; save it as UTF-8") \
            from None
    return tuple(line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#"))
