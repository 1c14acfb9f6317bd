"""HTML pages as a Document. The standard library's tokenizer (html.parser) gives every tag, text and comment
with its place, so each piece is cut from the source itself and comes back byte-identical (tags with their
attributes exactly as written); the structure is checked here, with HTML5's optional end tags (</p>, </li>,
</td> ...) and void elements, and a page that cannot be read one way fails in one line that says where.

The text of each block (p, h1-h6, li, td, caption, title, button, a div's own text ...) is a run; inline
elements (a, b, em, span ...) are its marks; code, kbd, images, line breaks and comments inside it are keep
ranges; script, style, pre, template, the tags between blocks and the doctype are kept as they are."""

from __future__ import annotations

import functools
import html
import re
from dataclasses import dataclass
from html.parser import HTMLParser

from transformer_mt.documents.markup import RunText
from transformer_mt.documents.pieces import Document, Kept, Piece
from transformer_mt.errors import DataError

INLINE = frozenset("a abbr acronym b bdi bdo big cite data del dfn em font i ins mark nobr q s small span "
                   "strike strong sub sup time tt u".split())
# elements kept whole, contents and all: inside a run as a keep range, else as a block
KEEP_INLINE = frozenset("code kbd samp var svg math textarea iframe object video audio canvas picture "
                        "ruby".split())
KEEP_BLOCK = frozenset("script style pre template".split())
VOID = frozenset("area base br col embed hr img input link meta param source track wbr".split())
VOID_INLINE = frozenset("br img input wbr embed".split())
# a mark inside a run (so are custom elements, `<x-y>`), a block of its own outside one
PHRASING_BLOCKS = frozenset(("button", "label"))
_P_CLOSERS = frozenset("address article aside blockquote center details dialog dir div dl dd dt fieldset "
                       "figcaption figure footer form h1 h2 h3 h4 h5 h6 header hgroup hr li main menu nav ol "
                       "p pre search section summary table ul".split())
_HEAD_CONTENT = frozenset("title meta link style script base noscript template".split())
_CELL_CLOSERS = frozenset("td th tr tbody thead tfoot".split())
# the elements whose end tag HTML may leave out, and the start tags that end them
_IMPLIED = {"p": _P_CLOSERS, "li": frozenset(("li",)), "dt": frozenset(("dt", "dd")),
            "dd": frozenset(("dt", "dd")), "option": frozenset(("option", "optgroup")),
            "optgroup": frozenset(("optgroup",)), "tr": frozenset("tr tbody thead tfoot".split()),
            "td": _CELL_CLOSERS, "th": _CELL_CLOSERS, "thead": frozenset(("tbody", "tfoot")),
            "tbody": frozenset(("tbody", "tfoot")), "tfoot": frozenset(("tbody",)),
            "colgroup": frozenset("colgroup thead tbody tfoot tr".split()),
            "caption": frozenset("colgroup col thead tbody tfoot tr".split()),
            "head": None, "body": frozenset(), "html": frozenset()}
_UNENDED = re.compile(r"<[A-Za-z!?/]")
_SPACE = " \t\n\r\f"
_NEVER_ENDS = ("a tag or comment starts here and never ends: finish it with `>` (`-->` for a comment), or "
               "write a literal < as &lt;")

escape_html = functools.partial(html.escape, quote=False)


class _Events(HTMLParser):
    """The tokenizer's events, each as (kind, tag, offset of its first character)."""

    def __init__(self, source: str) -> None:
        super().__init__(convert_charrefs=True)
        self.events: list[tuple[str, str, int]] = []
        self._lines = [0] + [m.end() for m in re.finditer("\n", source)]
        self.feed(source)
        self.close()

    def _add(self, kind: str, tag: str = "") -> None:
        line, column = self.getpos()
        self.events.append((kind, tag, self._lines[line - 1] + column))

    def handle_starttag(self, tag: str, attrs: object) -> None:
        self._add("start", tag)

    def handle_startendtag(self, tag: str, attrs: object) -> None:
        # `<x/>`: empty, as XHTML and SVG mean it (HTML5 would leave a non-void element open)
        self._add("void", tag)

    def handle_endtag(self, tag: str) -> None:
        self._add("end", tag)

    def handle_data(self, data: str) -> None:
        self._add("data")

    def handle_comment(self, data: str) -> None:
        self._add("comment")

    def handle_decl(self, decl: str) -> None:
        self._add("decl")

    def handle_pi(self, data: str) -> None:
        self._add("comment")

    def unknown_decl(self, data: str) -> None:
        self._add("comment")


@dataclass
class _Open:
    """An element that is open: its tag, where it starts, and whether it is a mark of the run being read
    (its start tag's place among the run's items) or kept (a block, or an inline element around blocks)."""

    tag: str
    offset: int
    item: int | None


class _Reader:
    """The walk over the events: the open elements, the run being read, the pieces so far."""

    def __init__(self, source: str, name: str) -> None:
        self.source, self.name = source, name
        self.pieces: list[Piece] = []
        self.stack: list[_Open] = []
        self.items: list[tuple[str, str]] = []  # the run being read: (text | keep | open | close, raw)
        self.unit: tuple[str, int, int, bool] | None = None  # a kept element: tag, depth, start, inline

    def place(self, offset: int) -> str:
        """`line:column` of an offset, both from 1."""
        line = self.source.count("\n", 0, offset) + 1
        return f"{line}:{offset - self.source.rfind(chr(10), 0, offset)}"

    def fail(self, offset: int, problem: str) -> DataError:
        return DataError(f"{self.name}:{self.place(offset)}: {problem}")

    def step(self, kind: str, tag: str, start: int, end: int) -> None:
        raw = self.source[start:end]
        if self.unit is not None:
            self.inside_unit(kind, tag, start, end)
        elif kind == "data":
            # a `<` left in text is a tag the tokenizer could not end (or `</>`, which it drops)
            unended = next((start + i for i, ch in enumerate(raw) if ch == "<"
                            and _UNENDED.match(self.source, start + i)), None)
            if unended is not None:
                raise self.fail(unended, _NEVER_ENDS)
            self.text(raw)
        elif not raw.endswith("-->" if raw.startswith("<!--") else ">"):
            raise self.fail(start, _NEVER_ENDS)  # as newer tokenizers may hand over what the end cut short
        elif kind == "comment":
            if self.items:
                self.inline("keep", raw)
            else:
                self.kept(raw)
        elif kind == "decl":
            self.boundary(start, "!DOCTYPE")
            self.kept(raw)
        elif kind == "end":
            self.end_tag(tag, start, raw)
        else:
            self.start_tag(kind, tag, start, end)

    def inside_unit(self, kind: str, tag: str, start: int, end: int) -> None:
        name, depth, first, inline = self.unit
        depth += (kind == "start" and tag == name) - (kind == "end" and tag == name)
        self.unit = (name, depth, first, inline)
        if depth == 0:
            self.unit = None
            self.whole(name, first, end, inline)

    def whole(self, tag: str, start: int, end: int, inline: bool) -> None:
        """A kept element, from its start tag to the end of its end tag."""
        if inline:
            self.inline("keep", self.source[start:end])
        else:
            self.boundary(start, tag)
            self.kept(self.source[start:end])

    def text(self, raw: str) -> None:
        if self.items or raw.strip(_SPACE):
            self.items.append(("text", raw))
        else:
            self.kept(raw)

    def inline(self, kind: str, raw: str) -> None:
        self.items.append((kind, raw))

    def kept(self, raw: str) -> None:
        if not raw:
            return
        if self.pieces and isinstance(self.pieces[-1], Kept):
            self.pieces[-1] = Kept(self.pieces[-1].raw + raw)
        else:
            self.pieces.append(Kept(raw))

    def start_tag(self, kind: str, tag: str, start: int, end: int) -> None:
        raw = self.source[start:end]
        while self.stack and self.closed_by(self.stack[-1].tag, tag):
            self.implied_end(self.stack.pop(), start)
        if kind == "void" or tag in VOID:
            if tag in VOID_INLINE or (self.items and tag != "hr"):
                self.inline("keep", raw)
            else:
                self.boundary(start, tag)
                self.kept(raw)
        elif tag in KEEP_INLINE or tag in KEEP_BLOCK:
            self.unit = (tag, 1, start, tag in KEEP_INLINE)
        elif tag in INLINE or (self.items and not self.blank() and (tag in PHRASING_BLOCKS or "-" in tag)):
            self.stack.append(_Open(tag, start, len(self.items)))
            self.inline("open", raw)
        else:
            self.boundary(start, tag)
            self.kept(raw)
            self.stack.append(_Open(tag, start, None))

    @staticmethod
    def closed_by(open_tag: str, tag: str) -> bool:
        """Whether a start tag `tag` ends the open element `open_tag` whose end tag was left out."""
        if open_tag not in _IMPLIED:
            return False
        closers = _IMPLIED[open_tag]
        return tag not in _HEAD_CONTENT if closers is None else tag in closers

    def end_tag(self, tag: str, start: int, raw: str) -> None:
        found = next((i for i in range(len(self.stack) - 1, -1, -1) if self.stack[i].tag == tag), None)
        if found is None:
            if tag in ("html", "head", "body"):  # their start tags may be left out, their end tags kept
                self.boundary(start, tag)
                self.kept(raw)
                return
            raise self.fail(start, f"</{tag}> closes no open element; remove it or add its <{tag}>")
        for above in reversed(self.stack[found + 1:]):
            if above.tag not in _IMPLIED:
                raise self.fail(above.offset, f"<{above.tag}> is still open where </{tag}> "
                                              f"({self.place(start)}) ends its parent; close it before")
            self.implied_end(self.stack.pop(), start)
        element = self.stack.pop()
        if element.item is not None:
            self.inline("close", raw)
        else:
            self.boundary(start, tag)
            self.kept(raw)

    def implied_end(self, element: _Open, where: int) -> None:
        """An element whose end tag the source left out ends here."""
        if element.item is None:
            self.boundary(where, element.tag)
        else:
            self.inline("close", "")

    def blank(self) -> bool:
        """Whether the run being read has no text yet (only spaces, keep ranges and start tags)."""
        return not any(kind == "text" and raw.strip(_SPACE) for kind, raw in self.items)

    def boundary(self, where: int, tag: str) -> None:
        """A block starts or ends here: the run being read ends. Marks still open become kept tags around
        the blocks when no text came before them (`<a href="/"><div>...</div></a>`), else an error."""
        still_open = [element for element in self.stack if element.item is not None]
        if still_open:
            text_at = next((i for i, (kind, raw) in enumerate(self.items)
                            if kind == "text" and raw.strip(_SPACE)), len(self.items))
            last = still_open[-1]
            if still_open[-1].item > text_at:
                raise self.fail(last.offset, f"<{last.tag}> is still open where <{tag}> ({self.place(where)})"
                                             f" begins or ends a block; close it before")
            self.kept("".join(raw for _, raw in self.items[:last.item + 1]))
            self.items = self.items[last.item + 1:]
            for element in still_open:
                element.item = None
        self.flush()

    def flush(self) -> None:
        """The run read so far as pieces: the spaces around it kept, the rest a Run if it has text."""
        raw = "".join(raw for _, raw in self.items)
        body = raw.strip(_SPACE)
        if not body:
            if raw:
                self.kept(raw)
            self.items = []
            return
        lead = raw[:len(raw) - len(raw.lstrip(_SPACE))]
        low, high = len(lead), len(lead) + len(body)
        run = RunText()
        done = 0
        for kind, part in self.items:
            start, done = done, done + len(part)
            part = part[max(low - start, 0):max(min(high, done) - start, 0)]
            if kind == "text":
                run.add_text(html.unescape(part))
            elif kind == "keep":
                run.add_keep(part)
            elif kind == "open":
                run.open_mark(part)
            else:
                run.close_mark(part)
        self.items = []
        made = run.run(body)
        self.kept(lead)
        if made is None:
            self.kept(body)
        else:
            self.pieces.append(made)
        self.kept(raw[high:])

    def finish(self) -> None:
        """The end of the file: what is still open must be allowed to end here."""
        if self.unit is not None:
            tag, _, start, _ = self.unit
            raise self.fail(start, f"<{tag}> is never closed; add its </{tag}>")
        while self.stack:
            element = self.stack[-1]
            if element.tag not in _IMPLIED:
                raise self.fail(element.offset, f"<{element.tag}> is never closed; add its </{element.tag}>")
            self.implied_end(self.stack.pop(), len(self.source))
        self.flush()


def read_html(source: str, name: str) -> Document:
    """The page's block texts as runs with their inline markup, everything else kept byte for byte."""
    reader = _Reader(source, name)
    events = _Events(source).events
    reader.kept(source[:events[0][2] if events else len(source)])  # what the tokenizer drops (`</>`)
    for (kind, tag, start), (_, _, end) in zip(events, [*events[1:], ("", "", len(source))]):
        reader.step(kind, tag, start, end)
    reader.finish()
    return Document("html", [p for p in reader.pieces if not isinstance(p, Kept) or p.raw], escape_html)
