"""Markdown pages as a Document, read with markdown-it-py (CommonMark, tables and strikethrough).

Paragraphs, headings, list items, block quotes and table cells are runs; everything between them (code
blocks, HTML blocks, front matter, link reference definitions, thematic breaks, list and heading markers,
table pipes, indentation) is kept byte for byte. markdown-it gives each block its lines but no inline
offsets, so each inline token's content is aligned back onto its source lines, and each inline token is
found in it by running markdown-it's own rule (link, image, code span, autolink) at its place.

A paragraph's soft line breaks become spaces in its run's text, and its translation is written on one line:
Markdown renders a soft break as a space, so the page reads the same, and a line never starts where the
translation happened to put a `-`, `1.` or `#` that would begin a list or a heading, as rewrapping could."""

from __future__ import annotations

import re
from collections.abc import Callable

from markdown_it import MarkdownIt
from markdown_it.rules_inline import StateInline, autolink, backtick, image, link
from markdown_it.token import Token

from transformer_mt.documents.markup import RunText
from transformer_mt.documents.pieces import Document, Kept, Piece, Run

# YAML (---) or TOML (+++) front matter, which markdown-it would read as a rule and a heading
_FRONT_MATTER = re.compile(r"\A(---|\+\+\+)[ \t]*\r?\n(?:.*?\r?\n)?(?:\1|\.\.\.)[ \t]*(?:\r?\n|\Z)",
                           re.DOTALL)
_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n|\Z)")
# what may stand before a table row's leading pipe: spaces, quote markers, a list item's marker
_PREFIX = re.compile(r"(?:\s|>|[-+*](?=\s)|\d{1,9}[.)](?=\s))*")
_BREAK = re.compile(r"(?:\\| *)\n[ \t]*")
_MARKS = {"em_open", "strong_open", "s_open"}
_CLOSES = {"em_close", "strong_close", "s_close"}
_KEEP_RULES: dict[str, Callable[[StateInline, bool], bool]] = {"code_inline": backtick, "image": image}
# characters that would start markup anywhere, and what would start a block at the beginning of a line
_INLINE_SPECIAL = re.compile(r"[\\`*\[\]|]|_(?!(?<=\w_)\w)|<(?=[A-Za-z/!?])|&(?=#?\w+;)|~(?=~)|(?<=~)~")
_LINE_START = re.compile(r"\A(?:[#>+-]|\d{1,9}(?=[.)]))")


def escape_markdown(text: str) -> str:
    """Plain text as Markdown that reads back as the same text: markup characters escaped."""
    text = _INLINE_SPECIAL.sub(lambda m: "\\" + m.group(), text)
    start = _LINE_START.match(text)
    if start and start.group().isdigit():
        return text[:start.end()] + "\\" + text[start.end():]
    return "\\" + text if start else text


def parser() -> MarkdownIt:
    """CommonMark with tables and strikethrough; escapes and entities left as tokens of their own."""
    return MarkdownIt("commonmark").enable(["table", "strikethrough"]).disable("text_join")


class _Lines:
    """The source's lines as markdown-it counts them (\\r\\n, \\r and \\n end a line), with their offsets."""

    def __init__(self, source: str, base: int) -> None:
        self.text = source.replace("\0", "\ufffd")  # as markdown-it reads it; same length
        self.starts = [m.start() + base for m in _LINE.finditer(source)]
        self.lines = [m.group().rstrip("\r\n") for m in _LINE.finditer(self.text)]


def _aligned(content: str, lines: _Lines, first: int, count: int) -> list[int]:
    """Where each character of a paragraph's or setext heading's content (from `count` lines from `first`)
    is in the source, one offset more for its end. Each content line ends its source line (it lost a
    container's prefix and indentation), except the last, which lost its trailing spaces too; lines of
    nothing but spaces (U+00A0 too) at either end were trimmed away."""
    parts = content.split("\n")
    for lead in range(first, first + count - len(parts) + 1):
        offsets = _lines_at(parts, lines, lead)
        if offsets is not None:
            return offsets
    raise ValueError(f"lines {first + 1}-{first + count} do not hold {content!r}")


def _lines_at(parts: list[str], lines: _Lines, first: int) -> list[int] | None:
    offsets: list[int] = []
    for k, part in enumerate(parts):
        line = lines.lines[first + k]
        body = part.lstrip(" \t") if k else part
        at = line.rfind(body) if k == len(parts) - 1 else len(line) - len(body)
        if at < 0 or line[at:at + len(body)] != body:
            return None
        at += lines.starts[first + k]
        offsets += [at] * (len(part) - len(body)) + list(range(at, at + len(body)))
        if k < len(parts) - 1:
            offsets.append(at + len(body))  # the line's end stands for its "\n"
    return [*offsets, offsets[-1] + 1]


def _heading(content: str, lines: _Lines, first: int) -> list[int]:
    """Where an ATX heading's content is: after its first run of `#` and the spaces that follow."""
    line = lines.lines[first]
    at = line.index("#")
    at += len(line[at:]) - len(line[at:].lstrip("#"))
    at += len(line[at:]) - len(line[at:].lstrip(" \t"))
    if line[at:at + len(content)] != content:
        raise ValueError(f"line {first + 1} does not hold the heading {content!r}")
    return list(range(lines.starts[first] + at, lines.starts[first] + at + len(content) + 1))


def _cells(line: str) -> list[tuple[str, list[int]]]:
    """A table row split at its unescaped pipes as markdown-it splits it (`\\|` is a pipe in a cell), each
    cell with the column of each of its characters."""
    cells: list[tuple[str, list[int]]] = [("", [])]
    escaped = False
    for column, ch in enumerate(line):
        text, where = cells[-1]
        if ch == "|" and not escaped:
            cells.append(("", []))
        elif ch == "|":
            cells[-1] = (text[:-1] + ch, [*where[:-1], column])
        else:
            cells[-1] = (text + ch, [*where, column])
        escaped = ch == "\\"
    return cells


def _cell(content: str, lines: _Lines, row: int, index: int) -> list[int]:
    """Where the content of a table row's cell `index` is."""
    cells = _cells(lines.lines[row])
    shift = 1 if _PREFIX.fullmatch(cells[0][0]) else 0  # a leading pipe: markdown-it drops the empty cell
    text, where = cells[index + shift]
    at = text.rfind(content)
    if at < 0:
        raise ValueError(f"line {row + 1} does not hold the cell {content!r}")
    start = lines.starts[row]
    columns = where[at:at + len(content)]
    return [start + column for column in columns] + [start + columns[-1] + 1]


def _extent(rule: Callable[[StateInline, bool], bool], state: StateInline, at: int) -> int:
    """Where the construct that markdown-it's `rule` reads at `at` ends."""
    state.pos = at
    if not rule(state, True):
        raise ValueError(f"no {rule.__name__} at {at} of {state.src!r}")
    return state.pos


def _link_close(close: str, label: str) -> str:
    """A link's closing markup: as written, except that a reference link named by its own text (`[text]`,
    `[text][]`) gets its label written out, so that its translated text still finds its target."""
    if close in ("]", "][]"):
        return "][" + " ".join(label.split()) + "]"
    return close


def _run(children: list[Token], state: StateInline, offsets: list[int], source: str) -> Run | None:
    """The run of one inline token: its children walked in order over the content they came from."""
    content = state.src

    def raw(start: int, end: int) -> str:  # the source of content[start:end]
        return source[offsets[start]:offsets[end]]

    run, at, links = RunText(), 0, []
    autolinked = False
    for token in children:
        if autolinked:
            autolinked = token.type != "link_close"
        elif token.type == "text":
            if not content.startswith(token.content, at):
                raise ValueError(f"{token.content!r} is not at {at} of {content!r}")
            run.add_text(token.content)
            at += len(token.content)
        elif token.type == "text_special":
            run.add_text(token.content)
            at += len(token.markup)
        elif token.type in ("softbreak", "hardbreak"):
            end = _BREAK.match(content, at).end()
            run.add_text(" ") if token.type == "softbreak" else run.add_keep(raw(at, end))
            at = end
        elif token.type in _MARKS or token.type in _CLOSES:
            if not content.startswith(token.markup, at):
                raise ValueError(f"{token.markup!r} is not at {at} of {content!r}")
            (run.open_mark if token.type in _MARKS else run.close_mark)(raw(at, at + len(token.markup)))
            at += len(token.markup)
        elif token.type == "link_open" and token.markup == "autolink":
            end = _extent(autolink, state, at)
            run.add_keep(raw(at, end))
            at, autolinked = end, True
        elif token.type == "link_open":
            links.append((at, _extent(link, state, at)))
            run.open_mark(raw(at, at + 1))
            at += 1
        elif token.type == "link_close":
            start, end = links.pop()
            run.close_mark(_link_close(raw(at, end), content[start + 1:at]))
            at = end
        else:  # code_inline, image, html_inline: verbatim
            end = at + len(token.content) if token.type == "html_inline" else _extent(
                _KEEP_RULES[token.type], state, at)
            run.add_keep(raw(at, end))
            at = end
    if at != len(content):
        raise ValueError(f"{content[at:]!r} of {content!r} was not read")
    return run.run(raw(0, len(content)))


def _offsets(tokens: list[Token], i: int, lines: _Lines, cell: int) -> list[int]:
    """Where the content of the inline token `tokens[i]` is in the source, by the block it belongs to."""
    block, content, (first, end) = tokens[i - 1], tokens[i].content, tokens[i].map
    if block.type in ("th_open", "td_open"):
        return _cell(content, lines, first, cell)
    if block.type == "heading_open" and block.markup.startswith("#"):
        return _heading(content, lines, first)
    return _aligned(content, lines, first, end - first)  # a setext heading's map leaves out its underline


def read_markdown(source: str) -> Document:
    """The page's paragraphs, headings, list items, quotes and table cells as runs, the rest kept (every
    text is valid Markdown: nothing is refused)."""
    front = _FRONT_MATTER.match(source)
    base = front.end() if front else 0
    md, env = parser(), {}
    tokens = md.parse(source[base:], env)
    lines = _Lines(source[base:], base)
    runs: list[tuple[int, int, Run]] = []
    cell = 0
    for i, token in enumerate(tokens):
        cell = 0 if token.type == "tr_open" else cell + (token.type in ("th_open", "td_open"))
        if token.type != "inline" or not token.content:
            continue
        offsets = _offsets(tokens, i, lines, cell - 1)
        run = _run(token.children or [], StateInline(token.content, md, env, []), offsets, source)
        if run is not None:
            runs.append((offsets[0], offsets[-1], run))
    pieces: list[Piece] = []
    done = 0
    for start, end, run in runs:
        pieces += [Kept(source[done:start]), run]
        done = end
    pieces.append(Kept(source[done:]))
    return Document("markdown", [p for p in pieces if not isinstance(p, Kept) or p.raw], escape_markdown)
