"""SRT subtitles as a Document. The `srt` library checks the file (its one-line error names the cue and
the line); the cues are then found with the library's own pattern, and only their text is replaced, so
numbers, timings and blank lines come out byte-identical. Each cue's text, its lines joined with a space,
is one run; the tags players understand (<i>, <b>, <u>, <font ...>) are its marks and {\\an8}-style
codes keep ranges. Written back, a translation longer than the cue's first line is wrapped into as many
lines as the cue had, balanced at spaces: subtitles are read in short lines of about equal length."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import srt

from transformer_mt.documents.markup import RunText
from transformer_mt.documents.pieces import Document, Kept, Piece
from transformer_mt.errors import DataError

_CODE = re.compile(r"</?(?:i|b|u|font)(?:\s[^<>]*)?>|\{\\[^{}]*\}", re.IGNORECASE)
_OPENING = re.compile(r"<(i|b|u|font)\b", re.IGNORECASE)
_SPACE = re.compile(r" +")


@dataclass(frozen=True)
class CueLayout:
    """How a cue's text was laid out: its number of lines, its first line's width (visible characters)
    and its line ending."""

    lines: int
    width: int
    newline: str


@dataclass
class Subtitles(Document):
    """A subtitle file: a Document whose runs are written back in their cues' number of lines."""

    layouts: list[CueLayout] = field(default_factory=list)

    def render(self, translated: Sequence[str]) -> str:
        """The file with each cue's text replaced by its translation, wrapped like the cue's own."""
        return super().render([_laid_out(text, layout) for text, layout in zip(translated, self.layouts,
                                                                               strict=True)])


def _width(text: str) -> int:
    return len(_CODE.sub("", text))


def _laid_out(text: str, layout: CueLayout) -> str:
    """The text in up to `layout.lines` lines, the longest as short as it can be, broken only at spaces
    outside tags; as it is when it has lines of its own or fits the cue's first line."""
    if "\n" in text or "\r" in text or layout.lines < 2 or _width(text) <= layout.width:
        return text
    inside = {i for code in _CODE.finditer(text) for i in range(code.start(), code.end())}
    gaps = [gap for gap in _SPACE.finditer(text)
            if gap.start() not in inside and 0 < gap.start() and gap.end() < len(text)]
    starts = [0, *(gap.end() for gap in gaps)]
    ends = [*(gap.start() for gap in gaps), len(text)]
    words, lines = len(starts), min(layout.lines, len(starts))
    # best[k][j]: (the widest line, where the last line starts) laying the first j words out in k lines;
    # among equals the earliest break, so a first line is the shorter one
    best: list[dict[int, tuple[int, int]]] = [{0: (0, 0)}]
    for k in range(1, lines + 1):
        best.append({j: min((max(best[k - 1][i][0], _width(text[starts[i]:ends[j - 1]])), i)
                            for i in range(k - 1, j) if i in best[k - 1])
                     for j in range(k, words + 1)})
    laid, j = [], words
    for k in range(lines, 0, -1):
        i = best[k][j][1]
        laid.append(text[starts[i]:ends[j - 1]])
        j = i
    return layout.newline.join(reversed(laid))


def _where(source: str, offset: int) -> tuple[int, int]:
    line = source.count("\n", 0, offset) + 1
    return line, offset - (source.rfind("\n", 0, offset) + 1) + 1


def _check(source: str, name: str) -> None:
    """The file as the `srt` library reads it, or a DataError naming the cue and line it could not read."""
    try:
        for _ in srt.parse(source):
            pass
    except srt.SRTParseError as error:
        unread = error.unmatched_content
        offset = error.expected_start + len(unread) - len(unread.lstrip())
        line, column = _where(source, offset)
        first = unread.strip().splitlines()[0] if unread.strip() else ""
        cue = f"cue {first}" if first.isdigit() else "the text here"
        raise DataError(f"{name}:{line}:{column}: {cue} is not a subtitle cue: each cue is its number, a "
                        f"timing line such as `00:00:01,000 --> 00:00:04,000` and its text, then a blank "
                        f"line; fix or remove it") from None


def _paired(raw: str) -> set[int]:
    """Where the tags that have a partner start: an opening tag and the closing tag that ends it, nested."""
    open_tags: list[tuple[str, int]] = []
    paired = set()
    for code in _CODE.finditer(raw):
        tag = code.group().lower()
        opening = _OPENING.match(tag)
        if opening:
            open_tags.append((opening.group(1), code.start()))
        elif open_tags and tag == f"</{open_tags[-1][0]}>":
            paired.update((open_tags.pop()[1], code.start()))
    return paired


def _cue_run(raw: str) -> RunText:
    """A cue's lines joined with a space; tags with a partner are marks, other codes keep ranges."""
    run = RunText()
    paired = _paired(raw)
    done = 0
    for code in re.finditer(r"\r?\n|" + _CODE.pattern, raw, re.IGNORECASE):
        run.add_text(raw[done:code.start()])
        done = code.end()
        if code.group() in ("\n", "\r\n"):
            run.add_text(" ")
        elif code.start() not in paired:
            run.add_keep(code.group())
        elif code.group().startswith("</"):
            run.close_mark(code.group())
        else:
            run.open_mark(code.group())
    run.add_text(raw[done:])
    return run


def read_subtitles(source: str, name: str) -> Subtitles:
    """The cues' texts as runs (one a cue), everything else kept byte for byte."""
    _check(source, name)
    pieces: list[Piece] = []
    layouts = []
    done = 0
    for cue in srt.SRT_REGEX.finditer(source):
        start, end = cue.span(5)
        raw = source[start:end]
        run = _cue_run(raw).run(raw)
        if run is None:
            continue
        lines = re.split(r"\r?\n", raw)
        pieces += [Kept(source[done:start]), run]
        layouts.append(CueLayout(len(lines), _width(lines[0]), "\r\n" if "\r\n" in raw else "\n"))
        done = end
    pieces.append(Kept(source[done:]))
    return Subtitles("srt", [p for p in pieces if not isinstance(p, Kept) or p.raw], layouts=layouts)
