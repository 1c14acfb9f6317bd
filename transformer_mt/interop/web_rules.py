"""The documents layer's rules for the page of `export format=web`: the span patterns, stand-ins and
restoring patterns of documents/spans.py and documents/masking.py, written into the page's settings as
JavaScript regular expressions, so the page and Python hold one set of rules.

Python's `re` and JavaScript's RegExp read most of these patterns alike (look-behind and look-ahead
included), but not the character classes: in JavaScript `\\w`, `\\d` and `\\b` are ASCII whatever the
flags, `\\s` holds U+FEFF and lacks U+001C-U+001F and U+0085, `.` stops at U+2028 as well, and `$`
does not match before a final line break. Each is written out here as what Python's means, with Unicode
properties (`\\p{L}`, `\\p{N}`, `\\p{Nd}`) under the `u` flag; under that flag a needless escape
(`\\"`) is an error, so it loses its backslash. A construct with no JavaScript equivalent written here
is refused, so a new pattern fails the export rather than finding other spans in the page.

The glossary's source terms are matched in the page (web_glossary.mjs) with Python's rules too: its \\w
and \\s, and, for the letters a term matches in any case, the characters Python's `re` takes for each
when case is ignored (`case_classes`): JavaScript's `i` flag folds by Unicode's case folding, `re` by
lowercase and a table of its own, so the page writes each such letter as the class of those.
"""

from __future__ import annotations

import functools
import re
import sys

from transformer_mt.documents.masking import AROUND_STAND_IN, FINAL, STAND_INS, WORDS
from transformer_mt.documents.sentences import ATTACHED, CLAUSE, JOINERS, SPACES
from transformer_mt.documents.spans import NAME_WORD, ORDINAL, PATTERNS, TRAILING, TRIMMED

WORD_CLASS = r"\p{L}\p{N}_"  # Python's \w: str.isalnum() (letters and numbers) or "_"
# Python's [^\W\d_], a word's characters but digits and "_": letters and the numbers that are not digits
LETTER_CLASS = ("[^\\W\\d_]", r"[\p{L}\p{Nl}\p{No}]")
_SYNTAX = set("^$\\.*+?()[]{}|/")  # what JavaScript lets a backslash escape under the u flag
_REFUSED = ("(?P", "(?#", "(?>", "(?(")
_FLAGS = {re.IGNORECASE: "i"}


@functools.cache
def _spaces() -> str:
    """Python's \\s (str.isspace()) as the inside of a JavaScript character class."""
    spaces = [c for c in range(sys.maxunicode + 1) if chr(c).isspace()]
    runs: list[list[int]] = []
    for c in spaces:
        if runs and runs[-1][1] == c - 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return "".join(f"\\u{{{a:x}}}" + (f"-\\u{{{b:x}}}" if b > a else "") for a, b in runs)


def _escape(letter: str, in_class: bool) -> str:
    """A backslash escape of one letter, as JavaScript writes what Python means by it."""
    inside = {"w": WORD_CLASS, "d": r"\p{Nd}", "s": _spaces()}
    if letter in inside:
        return inside[letter] if in_class else f"[{inside[letter]}]"
    if letter in "WDS" and not in_class:
        return f"[^{inside[letter.lower()]}]"
    if letter == "b" and not in_class:
        word = f"[{WORD_CLASS}]"
        return f"(?:(?<={word})(?!{word})|(?<!{word})(?={word}))"
    if letter in "ntrfv":
        return "\\" + letter
    raise ValueError(f"\\{letter} has no JavaScript equivalent written here")


def _quantifier(source: str, i: int) -> int:
    """The end of a {m}, {m,} or {m,n} quantifier starting at source[i], or i when it is none."""
    match = re.compile(r"\{\d+(?:,\d*)?\}").match(source, i)
    return match.end() if match else i


def js_source(source: str) -> str:
    """A Python regular expression's source as the source of a JavaScript one (u flag) that matches the
    same; ValueError for a construct that cannot be written so."""
    out, i, in_class = [], 0, False
    while i < len(source):
        c = source[i]
        if not in_class and source.startswith(LETTER_CLASS[0], i):
            out.append(LETTER_CLASS[1])
            i += len(LETTER_CLASS[0])
            continue
        if c == "\\":
            nxt = source[i + 1]
            if nxt.isalpha() and nxt not in "ux":
                out.append(_escape(nxt, in_class))
            elif nxt in "ux":  # \xhh, \uhhhh: the same in both
                width = 2 if nxt == "x" else 4
                out.append(source[i:i + 2 + width])
                i += width
            elif nxt.isdigit():
                raise ValueError(f"\\{nxt}: back-references are not written here")
            else:
                out.append("\\" + nxt if nxt in _SYNTAX or (in_class and nxt == "-") else nxt)
            i += 2
            continue
        if in_class:
            in_class = c != "]"
            out.append(c)
        elif c == "[":
            in_class = True
            start = i + 2 if source.startswith("[^", i) else i + 1
            out.append(source[i:start])
            if source.startswith("]", start):  # a ] first in a class is one in Python, none in JS
                out.append("\\]")
                start += 1
            i = start
            continue
        elif source.startswith(_REFUSED, i) or re.match(r"\(\?-?[aiLmsux]", source[i:]):
            raise ValueError(f"{source[i:i + 4]}: no JavaScript equivalent written here")
        elif c in "*+?" and source.startswith("+", i + 1):
            raise ValueError("possessive quantifiers have no JavaScript equivalent")
        elif c == "{":
            end = _quantifier(source, i)
            if end > i and source.startswith("+", end):
                raise ValueError("possessive quantifiers have no JavaScript equivalent")
            out.append(source[i:end] if end > i else "\\{")
            i = max(end, i + 1)
            continue
        else:
            out.append({".": "[^\\n]", "$": "(?=\\n?$)", "}": "\\}"}.get(c, c))
        i += 1
    return "".join(out)


def js_regex(pattern: re.Pattern[str]) -> dict[str, str]:
    """A compiled Python pattern as the page builds it: `new RegExp(source, flags)`."""
    flags = "u" + "".join(letter for flag, letter in _FLAGS.items() if pattern.flags & flag)
    unknown = pattern.flags & ~(re.UNICODE | re.IGNORECASE)
    if unknown:
        raise ValueError(f"{re.RegexFlag(unknown)!r} has no JavaScript equivalent written here")
    return {"source": js_source(pattern.pattern), "flags": flags}


@functools.cache
def case_folds() -> dict[str, str]:
    """The characters whose case folding (str.casefold, how training words are compared) is not their
    lowercase, with their folding: JavaScript has no casefold, and lowercases the others alike."""
    chars = (chr(c) for c in range(sys.maxunicode + 1) if not 0xD800 <= c <= 0xDFFF)
    return {c: c.casefold() for c in chars if c.casefold() != c.lower()}


def page_rules() -> dict[str, object]:
    """What the page needs to split, mask and restore as the documents layer does."""
    before, after = AROUND_STAND_IN
    return {
        "spans": [{"kind": kind, **js_regex(pattern)} for kind, pattern in PATTERNS],
        "trimmed": list(TRIMMED),
        "trailing": TRAILING,
        "ordinal": js_regex(ORDINAL),
        "stand_ins": list(STAND_INS),
        "words": js_regex(WORDS),
        "around_stand_in": [js_source(before), js_source(after)],
        "final": js_regex(FINAL),
        "space": js_regex(re.compile(r"\s")),
        "name": js_regex(NAME_WORD),
        "clause": js_regex(CLAUSE),
        "spaces": js_regex(SPACES),
        "attached": {"source": "[" + "".join(f"\\p{{{c}}}" for c in sorted(ATTACHED)) + "]", "flags": "u"},
        "joiners": sorted(JOINERS),
        "folds": case_folds(),
    }


@functools.cache
def case_classes() -> list[str]:
    """The characters Python's `re` matches alike when case is ignored, a class a string (characters
    that match only themselves left out); ValueError should `re` ever match them otherwise than as
    classes (one character matching another that does not match it back)."""
    cased = "".join(c for c in map(chr, range(sys.maxunicode + 1))
                    if not 0xD800 <= ord(c) <= 0xDFFF and (c.lower() != c or c.upper() != c))
    alike = {c: "".join(re.findall(f"(?i:{re.escape(c)})", cased)) for c in cased}
    classes = sorted({group for group in alike.values() if len(group) > 1})
    for group in classes:
        if any(alike[c] != group for c in group):
            raise ValueError(f"re matches {group!r} alike ignoring case, but not each one with every other")
    return classes


def glossary_rules() -> dict[str, object]:
    """What the page needs to find the glossary's source terms as `Glossary.find` does."""
    return {"word": js_source(r"\w"), "space": js_source(r"\s"), "cases": case_classes()}
