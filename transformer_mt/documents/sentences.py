"""Sentences: where a text's sentences are, as character ranges, and where a sentence too long for the
model is cut into parts that it can take.

The segmenter is Wikimedia's sentencex (rules and abbreviation lists for ~30 languages, fallback chains
for the others; chosen by measuring against pysbd, Koehn and Schroeder's splitter and others: see
docs/documents.md). Its output is never trusted as offsets: each sentence it returns is located again in
the text (`locate`), so that whatever it strips or changes, the ranges cover every character that is not
whitespace, and what lies between them is whitespace only, which the caller joins translations with.
"""

from __future__ import annotations

import difflib
import itertools
import re
import unicodedata
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterator, Sequence

import sentencex

Range = tuple[int, int]

# A line break always ends a sentence: the translated text keeps the lines of the source.
LINE_BREAK = re.compile(r"\r\n|\r|\n")
# Where a clause ends: a comma, semicolon, colon, dash or ellipsis before a space (not the comma of 3,5
# or the colon of 10:30), a dash between words, and the full-width marks of Chinese and Japanese.
CLAUSE = re.compile(r"[,;:\u2013\u2014\u2026]\s+|\u2014(?=\S)|[\u3001\uff0c\uff1a\uff1b]")
SPACES = re.compile(r"\s+")
WHITESPACE = re.compile(r"[^\S ]")  # whitespace other than the plain space
# What a cut between characters never separates from the character before it: combining marks and
# modifiers (categories), and the characters on both sides of a joiner.
ATTACHED = {"Mn", "Mc", "Me", "Sk"}
JOINERS = {"\u200c", "\u200d", "\u034f"}


def _stripped(text: str, start: int, end: int) -> Range | None:
    """[start, end) without the whitespace around it; None when it is all whitespace."""
    part = text[start:end]
    left = len(part) - len(part.lstrip())
    if left == len(part):
        return None
    return start + left, start + len(part.rstrip())


def _mapped(source: str, target: str, cuts: list[int]) -> list[int]:
    """Positions in `source` carried over to `target`, two versions of one string: each to its matched
    character in target, or, where it was changed or dropped, to the next character that matched."""
    blocks = difflib.SequenceMatcher(None, source, target, autojunk=False).get_matching_blocks()
    found = []
    for cut in cuts:
        for a, b, size in blocks:
            if cut < a + size:
                found.append(b + max(0, cut - a))
                break
    return found


def locate(text: str, sentences: Sequence[str]) -> list[int]:
    """Where sentences 2, 3, ... of a segmenter's output for `text` begin in `text`: the position of each
    one's first character that is not whitespace (ascending, inside the text). Exact when the sentences
    spell the text; else found through the characters other than whitespace, and through a character
    alignment where the segmenter changed or dropped some."""
    if "".join(sentences) == text:  # each cut moved past the whitespace that a sentence starts with
        starts = itertools.accumulate((len(s) for s in sentences[:-1]), initial=0)
        cuts = (start + len(s) - len(s.lstrip()) for start, s in zip(starts, sentences))
        return sorted({c for c in cuts if 0 < c < len(text)})
    solid = [i for i, c in enumerate(text) if not c.isspace()]
    pieces = ["".join(s.split()) for s in sentences]
    ends = list(itertools.accumulate(len(p) for p in pieces[:-1]))
    source, target = "".join(pieces), "".join(text[i] for i in solid)
    if source != target:
        ends = _mapped(source, target, ends)
    return sorted({solid[e] for e in ends if 0 < e < len(solid)})


def _lines(text: str) -> Iterator[Range]:
    """The (start, end) of each line of `text`, its line break left out."""
    start = 0
    for match in LINE_BREAK.finditer(text):
        yield start, match.start()
        start = match.end()
    yield start, len(text)


def _merged(ranges: list[Range], unbreakable: Sequence[Range]) -> list[Range]:
    """`ranges` with every two neighbours that an unbreakable range reaches into both of made one."""
    if len(ranges) < 2 or not unbreakable:
        return ranges
    ends = [end for _, end in ranges[:-1]]
    starts = [start for start, _ in ranges[1:]]
    depth = [0] * (len(ranges) + 1)  # +1 where a run of joined gaps starts, -1 after it
    for start, end in unbreakable:
        first, last = bisect_right(ends, start), bisect_left(starts, end)
        if first < last:
            depth[first] += 1
            depth[last] -= 1
    merged = [ranges[0]]
    for joined, (start, end) in zip(itertools.accumulate(depth), ranges[1:]):
        merged[-1:] = [(merged[-1][0], end)] if joined else [merged[-1], (start, end)]
    return merged


class SentenceSplitter:
    """The sentences of texts in one language. sentencex has rules for about 30 languages and falls back
    along its chains for others (Occitan to French, Luxembourgish to German); a language it knows nothing
    of is split by its English rules."""

    def __init__(self, lang: str) -> None:
        # sentencex builds its language's rules from the code on each call (they are static tables),
        # so there is no object to keep: the code is all this splitter holds.
        self.lang = lang

    def _cuts(self, line: str) -> list[int]:
        """Where sentences 2, 3, ... of one line begin. sentencex sees every kind of whitespace as a plain
        space (one character for one, so positions hold): it panics on whitespace of more than one
        UTF-8 byte after a capital letter before a full stop ("A", a no-break space, "."). A panic it
        still raises leaves the line one sentence rather than escaping as a BaseException, which would
        end a server's worker thread."""
        plain = WHITESPACE.sub(" ", line)
        try:
            return locate(plain, sentencex.segment(self.lang, plain))
        except BaseException as error:  # pyo3's PanicException derives from BaseException only
            if type(error).__name__ != "PanicException":
                raise
            return []

    def split(self, text: str, unbreakable: Sequence[Range] = ()) -> list[Range]:
        """The (start, end) character ranges of the sentences of `text`, in order, each without the
        whitespace around it; between and around them only whitespace. A line break ends a sentence;
        no sentence ends inside one of the `unbreakable` ranges (protected spans, inline markup): the
        sentences on both sides are one, even across a line break."""
        ranges = []
        for start, end in _lines(text):
            line = text[start:end]
            if not line.strip():
                continue
            bounds = [start, *(start + c for c in self._cuts(line)), end]
            ranges += [r for a, b in itertools.pairwise(bounds) if (r := _stripped(text, a, b))]
        return _merged(ranges, unbreakable)


def _attached(text: str, at: int) -> bool:
    """Whether the character at `at` belongs with the one before it: a combining mark, a modifier (an
    emoji's skin tone), or either side of a joiner."""
    return unicodedata.category(text[at]) in ATTACHED or text[at] in JOINERS or text[at - 1] in JOINERS


def _character_cut(text: str, start: int, end: int, keep: Sequence[Range] = ()) -> int | None:
    """The cut between characters nearest the middle of [start, end) that leaves what belongs together
    together (and no `keep` range cut); None for one character and what belongs to it."""
    middle = (start + end) // 2
    nearest = sorted(range(start + 1, end), key=lambda c: abs(c - middle))
    return next((cut for cut in nearest if not _attached(text, cut) and not _inside(cut, keep)), None)


def _inside(cut: int, keep: Sequence[Range]) -> bool:
    return any(a < cut < b for a, b in keep)


def _middle_cut(text: str, start: int, end: int, keep: Sequence[Range] = ()) -> int | None:
    """Where to cut [start, end) in two: the clause boundary nearest the middle, else the space between
    words nearest it, else the cut between characters nearest it; never inside a `keep` range."""
    middle = (start + end) / 2
    for pattern in (CLAUSE, SPACES):
        cuts = [c for m in pattern.finditer(text, start, end) if start < (c := m.end()) < end
                and not _inside(c, keep)]
        if cuts:
            return min(cuts, key=lambda c: abs(c - middle))
    return _character_cut(text, start, end, keep)


def cut_long(sentence: str, fits: Callable[[str], bool], keep: Sequence[Range] = ()) -> list[Range]:
    """Ranges of `sentence`, in order, each without the whitespace around it and each accepted by `fits`
    (the whole stripped sentence when it is): a part that does not fit is halved at the clause boundary
    nearest its middle, else between words, else between characters, so `fits` sees each part and its
    halvings only (under twice as many calls as parts). A character that does not fit alone is a part.
    No cut falls inside a `keep` range (a span, a glossary term): a part that could only be cut there
    stays whole."""
    whole = _stripped(sentence, 0, len(sentence))
    parts: list[Range] = []
    todo = [whole] if whole else []
    while todo:  # a stack of ranges still to check, the leftmost on top
        start, end = todo.pop()
        cut = None if fits(sentence[start:end]) else _middle_cut(sentence, start, end, keep)
        if cut is None:
            parts.append((start, end))
            continue
        halves = [_stripped(sentence, start, cut), _stripped(sentence, cut, end)]
        todo += [half for half in reversed(halves) if half]
    return parts
