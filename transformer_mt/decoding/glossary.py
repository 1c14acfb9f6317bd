"""A glossary: source terms and the target terms their translation must hold (issue 62).

The file is UTF-8 text (a byte-order mark is fine), one `source term<TAB>target term` a line; blank lines
and lines starting with `#` are skipped. Anything else that cannot be used is a one-line `DataError`
naming the file and the line.

`Glossary.find` says where a text holds source terms, on the text as typed:
- whole words only (no letter, digit or `_` right before or after the term), a run of whitespace in an
  entry matching any run of whitespace;
- an entry written all lowercase matches in any case (`printer` ~ `Printer`, `PRINTER`); an entry with a
  capital matches as written, its first letter in either case (`Wi-Fi`, `iOS` stay exact otherwise, so
  `Wi-Fi` ~ `wi-Fi`, not `WI-FI`);
- no inflection: each form is its own line (`printers<TAB>imprimantes`);
- matches do not overlap: the longest entry wins (`laser printer` over `printer`), then the earlier
  match; a shorter entry still matches where it overlaps no longer one (`laser` in `laser printer
  cartridge`, when `printer cartridge` is an entry too).
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from transformer_mt.config import resolve_path
from transformer_mt.data.text_files import read_utf8, split_lines
from transformer_mt.errors import ConfigError, DataError

_SPACES = re.compile(r"\s+")


@dataclass(frozen=True)
class Entry:
    """One line of the glossary: a source term, the target term it must be translated by, and where it
    was read (line 0: not from a file)."""

    source: str
    target: str
    line: int = 0


@dataclass(frozen=True)
class Match:
    """Where an entry's source term occurs in a text: text[start:end]."""

    start: int
    end: int
    entry: Entry


@dataclass(frozen=True)
class TermUse:
    """How one glossary term fared in a translation: `met` (its target term is in it), `refused` (the
    search could not take it: `reason`), or `missing` (taken, yet not in the text as it came out, after
    spans were restored or case re-applied: `reason`)."""

    source: str
    target: str
    status: Literal["met", "refused", "missing"]
    reason: str = ""


def sentence_entries(sentences: Sequence[str], terms: Sequence[Sequence[Entry]] | None,
                     glossary: Glossary | None) -> list[list[Entry]] | None:
    """Each sentence's entries: `terms` as given, else those `glossary` finds in it; None without either."""
    if terms is None:
        return None if glossary is None else [[m.entry for m in glossary.find(s)] for s in sentences]
    if len(terms) != len(sentences):
        raise ConfigError(f"{len(terms)} term lists for {len(sentences)} sentences; give one each")
    return [list(t) for t in terms]


def read_glossary(path: str | None) -> Glossary | None:
    """decoding.glossary's file (relative to where the command started), or None when not set."""
    return Glossary.read(resolve_path(path)) if path else None


def count_terms(uses: Iterable[TermUse]) -> dict[str, int]:
    """How these glossary terms fared (of translations): how many, and how many of each status."""
    uses = list(uses)
    return {"terms": len(uses), **{status: sum(u.status == status for u in uses)
                                   for status in ("met", "refused", "missing")}}


def holds_term(text: str, target: str) -> bool:
    """Whether `text` holds the target term as whole words, in any case (an ALL CAPS input's translation
    is written in capitals), any run of whitespace for a space."""
    words = r"\s+".join(map(re.escape, target.split()))
    return re.search(rf"(?<!\w)(?i:{words})(?!\w)", text) is not None


def _pattern(source: str) -> str:
    """The regular expression of one source term, with its case rule (see the module docstring)."""
    words = source.split()
    if source == source.lower():
        return "(?i:" + r"\s+".join(map(re.escape, words)) + ")"
    head = f"(?i:{re.escape(words[0][0])}){re.escape(words[0][1:])}"  # "Printer" at a sentence start
    return r"\s+".join([head, *map(re.escape, words[1:])])


def _entry(line: str, number: int, name: str) -> Entry:
    """One `source<TAB>target` line, or the DataError that says what is wrong with it."""
    columns = line.split("\t")
    if len(columns) != 2:
        found = "no tab" if len(columns) == 1 else f"{len(columns)} tab-separated columns"
        raise DataError(f"{name}: line {number} has {found}; write `source term<TAB>target term`, one pair "
                        "a line")
    source, target = (_SPACES.sub(" ", c).strip() for c in columns)
    if not source or not target:
        side = "source" if not source else "target"
        raise DataError(f"{name}: line {number} has an empty {side} term; write "
                        "`source term<TAB>target term`")
    return Entry(source, target, number)


class Glossary:
    """Source terms → target terms, each source term once; `find` locates source terms in a text."""

    def __init__(self, entries: Sequence[Entry], name: str = "glossary") -> None:
        by_source: dict[str, Entry] = {}
        for e in entries:
            seen = by_source.get(e.source)
            if seen is not None and seen.target != e.target:
                raise DataError(f"{name}: line {e.line} gives {e.source!r} the target {e.target!r}, line "
                                f"{seen.line} gave it {seen.target!r}; keep one")
            by_source.setdefault(e.source, e)
        # Longest first: at one start the regex takes the first alternative that matches.
        self.name = name
        self.entries = sorted(by_source.values(), key=lambda e: -len(e.source))
        self._patterns = [rf"({_pattern(e.source)})(?!\w)" for e in self.entries]
        self._regex = (re.compile(rf"(?<!\w)(?=(?:{'|'.join(self._patterns)}))") if self.entries else None)

    @classmethod
    def read(cls, path: str | Path) -> Glossary:
        """The glossary of a TSV file (DataError naming the file and line of anything unusable)."""
        path = Path(path)
        lines = split_lines(read_utf8(path))
        return cls([_entry(line, n, str(path)) for n, line in enumerate(lines, start=1)
                    if line.strip() and not line.lstrip().startswith("#")], str(path))

    @classmethod
    def of(cls, pairs: Iterable[tuple[str, str]], name: str = "glossary") -> Glossary:
        """The glossary of (source, target) pairs (a request's), numbered from 1 as lines; DataError for
        a pair with an empty side."""
        entries = []
        for n, (s, t) in enumerate(pairs, start=1):
            source, target = _SPACES.sub(" ", s).strip(), _SPACES.sub(" ", t).strip()
            if not source or not target:
                raise DataError(f"{name}: term {n} ({s[:40]!r}: {t[:40]!r}) has an empty "
                                f"{'source' if not source else 'target'} side; give both")
            entries.append(Entry(source, target, n))
        return cls(entries, name)

    def __len__(self) -> int:
        return len(self.entries)

    def merged(self, other: Glossary | None) -> Glossary:
        """This glossary with `other`'s entries added, other's target winning for a source both have (a
        request's glossary over the server's)."""
        if other is None or not len(other):
            return self
        theirs = {e.source for e in other.entries}
        return Glossary([*other.entries, *(e for e in self.entries if e.source not in theirs)], other.name)

    def find(self, text: str) -> list[Match]:
        """The source terms in `text`, in text order: whole words, case rule, longest entry first, no
        overlap (the module docstring)."""
        if self._regex is None:
            return []
        # One candidate per start: the longest entry there (zero-width matches, so starts may overlap).
        heap = []
        for m in self._regex.finditer(text):
            index = (m.lastindex or 1) - 1
            heap.append((-len(self.entries[index].source), m.start(), index, m.end(index + 1)))
        heapq.heapify(heap)
        taken: list[Match] = []
        while heap:
            _, start, index, end = heapq.heappop(heap)
            if all(end <= t.start or t.end <= start for t in taken):
                taken.append(Match(start, end, self.entries[index]))
                continue
            shorter = self._next_at(text, start, index)  # rare: only where matches overlap
            if shorter is not None:
                heapq.heappush(heap, (-len(self.entries[shorter[0]].source), start, *shorter))
        return sorted(taken, key=lambda t: t.start)

    def _next_at(self, text: str, start: int, after: int) -> tuple[int, int] | None:
        """The longest entry after entry `after` (in longest-first order) matching at `start`, and the
        end of its match."""
        for index in range(after + 1, len(self.entries)):
            m = re.compile(self._patterns[index]).match(text, start)  # re caches compiled patterns
            if m is not None:
                return index, m.end()
        return None
