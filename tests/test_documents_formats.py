"""Reading documents into runs and writing them back (transformer_mt/documents: markup, formats and each
format's reader). Each format's source comes back byte-identical from its runs' raw text, and from their
text where the source spells it the canonical way; with every run's text changed, an independent parser
(markdown-it's tokens, html5lib's tree, the srt library's cues) finds the same structure in the output."""

from __future__ import annotations

import html
import itertools
import re

import html5lib
import pytest
import srt
from hypothesis import given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt

from tests.conftest import ROOT
from transformer_mt.documents.formats import FORMATS, format_for, read_document
from transformer_mt.documents.markdown_pages import escape_markdown
from transformer_mt.documents.markup import render_run
from transformer_mt.documents.pieces import Document, Mark, Run
from transformer_mt.documents.subtitles import CueLayout, Subtitles
from transformer_mt.errors import ConfigError, DataError

FIXTURES = ROOT / "tests" / "fixtures"
DOCS = sorted((ROOT / "docs").glob("*.md"))


def _upper(run: Run) -> str:
    """The run's text upper-cased outside its keep ranges, one character for one (marks stay in place)."""
    kept = {i for start, end in run.keep for i in range(start, end)}
    return "".join(ch if i in kept or len(ch.upper()) != 1 else ch.upper() for i, ch in enumerate(run.text))


def _rendered(doc: Document, text=lambda run: run.text) -> str:
    return doc.render([render_run(text(run), run.marks, run.keep, doc.escape) for run in doc.runs])


def _raw(doc: Document) -> str:
    return doc.render([run.raw for run in doc.runs])


# --- render_run, against a recursive writer of the same tree -------------------------------------------

_leaf = st.one_of(st.tuples(st.just("text"), st.text("abc <&", min_size=1, max_size=4)),
                  st.tuples(st.just("keep"), st.text("xyz<&", min_size=1, max_size=3)))
_tree = st.lists(st.recursive(_leaf, lambda inner: st.tuples(st.just("mark"), st.lists(inner, min_size=1,
                                                                                        max_size=3)),
                              max_leaves=8), max_size=5)


_IDS = itertools.count()


def _flatten(nodes, text: list[str], marks: list[Mark], keep: list) -> str:
    """The tree written by recursion (the reference), its text, marks and keep ranges collected."""
    out = []
    for kind, value in nodes:
        start = sum(map(len, text))
        if kind == "mark":
            n = next(_IDS)
            index = len(marks)
            marks.append(None)
            inner = _flatten(value, text, marks, keep)
            marks[index] = Mark(start, sum(map(len, text)), f"<{n}>", f"</{n}>")
            out.append(f"<{n}>{inner}</{n}>")
        else:
            text.append(value)
            if kind == "keep":
                keep.append((start, start + len(value)))
            out.append(value if kind == "keep" else value.upper())
    return "".join(out)


@settings(max_examples=200, deadline=None)
@given(_tree, st.randoms(use_true_random=False))
def test_render_run_nests_marks_given_in_any_order(tree, random) -> None:
    text, marks, keep = [], [], []
    expected = _flatten(tree, text, marks, keep)
    # shuffled, except that marks with the same range keep their order (the first given is outermost)
    keys: dict[tuple[int, int], float] = {}
    shuffled = sorted(marks, key=lambda m: keys.setdefault((m.start, m.end), random.random()))
    assert render_run("".join(text), shuffled, keep, str.upper) == expected


def _nested(out: str) -> bool:
    stack = []
    for closing, name in re.findall(r"<(/?)(\w+)>", out):
        if closing and (not stack or stack.pop() != name):
            return False
        if not closing:
            stack.append(name)
    return not stack


def test_render_run_splits_crossing_marks_and_places_zero_width_ones() -> None:
    crossing = render_run("abcdefgh", [Mark(3, 8, "<b>", "</b>"), Mark(0, 5, "<a>", "</a>")], [], str)
    assert crossing == "<a>abc<b>de</b></a><b>fgh</b>" and _nested(crossing)
    shared_end = render_run("abcd", [Mark(2, 4, "<i>", "</i>"), Mark(0, 4, "<b>", "</b>")], [], str)
    assert shared_end == "<b>ab<i>cd</i></b>"
    zero = render_run("abcd", [Mark(0, 2, "<b>", "</b>"), Mark(2, 2, "<a>", "</a>")], [], str)
    assert zero == "<b>ab</b><a></a>cd"
    inside_keep = render_run("ab `c d` e", [Mark(0, 5, "*", "*")], [(3, 8)], escape_markdown)
    assert inside_keep == "*ab `c d`* e"  # the mark's end moved out of the keep range, which stays whole
    with pytest.raises(ValueError):
        render_run("abc", [Mark(2, 5, "<b>", "</b>")], [], str)


# --- plain text ---------------------------------------------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["a", "b", " ", "\t", "\n", "\r\n", "\r", "é"]), max_size=30).map("".join))
def test_text_keeps_every_line_ending_and_blank_line(source: str) -> None:
    doc = read_document(source, "text", "notes.txt")
    assert _raw(doc) == source and _rendered(doc) == source
    translated = _rendered(doc, _upper)
    assert translated == source.upper()
    assert all("\n" not in run.text and "\r" not in run.text and run.text == run.text.strip()
               for run in doc.runs)


# --- Markdown -----------------------------------------------------------------------------------------

_VERBATIM = {"fence", "code_block", "html_block", "code_inline", "html_inline", "image"}


def _md_shape(page: str) -> list[tuple]:
    """markdown-it's view of a page without its words: every token's type, tag, markup, info and
    attributes, and the contents of code, HTML and images."""
    shape = []
    for token in MarkdownIt("commonmark").enable(["table", "strikethrough"]).parse(page):
        for t in [token, *(token.children or [])]:
            if t.type not in ("inline", "text", "softbreak"):
                shape.append((t.type, t.tag, t.markup, t.info, sorted((t.attrs or {}).items()),
                              t.content if t.type in _VERBATIM else ""))
    return shape


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_markdown_docs_read_and_keep_their_structure(page) -> None:
    source = page.read_text(encoding="utf-8")
    doc = read_document(source, "markdown", page.name)
    assert _raw(doc) == source and doc.runs
    assert _md_shape(_rendered(doc, _upper)) == _md_shape(source)


def test_a_reference_link_named_by_its_text_still_links_when_its_text_changes() -> None:
    source = "See [the docs] or [*Guide*][].\n\n[the docs]: /docs\n[*guide*]: /g\n"
    doc = read_document(source, "markdown", "a.md")
    (run,) = doc.runs
    text = "Voir la documentation ou le guide."
    spans = [(text.index(w), text.index(w) + len(w)) for w in ("la documentation", "le guide")]
    # the first link around "la documentation", the second link and its emphasis around "le guide"
    marks = [Mark(*span, m.open, m.close) for span, m in zip([*spans, spans[1]], run.marks)]
    out = doc.render([render_run(text, marks, run.keep, doc.escape)])
    links = [t.attrs for token in MarkdownIt().parse(out) for t in token.children or []
             if t.type == "link_open"]
    assert links == [{"href": "/docs"}, {"href": "/g"}]


_MD_JUNK = st.lists(st.sampled_from(list("ab *_`[]()<>#-!|~\\&;:/\n\t") + [
    "\n\n", "> ", "- ", "1. ", "    ", "&amp;", "| a |\n|---|\n", "```\n", "\r\n", "  \n", "===\n"]),
    max_size=40).map("".join)


@settings(max_examples=300, deadline=None)
@given(_MD_JUNK)
def test_any_markdown_reads_back_and_keeps_its_structure(source: str) -> None:
    doc = read_document(source, "markdown", "page.md")
    assert _raw(doc) == source
    assert _md_shape(_rendered(doc, _upper)) == _md_shape(_rendered(doc))


_word = st.text("ab*_[]`<&#|~\\!;", min_size=1, max_size=5)
_inline = st.one_of(st.tuples(st.just("word"), _word),
                    st.tuples(st.sampled_from(["*", "**", "_", "~~", "link"]),
                              st.lists(st.text("abc", min_size=1, max_size=4), min_size=1,
                                       max_size=2).map(" ".join)))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["", "# ", "- ", "> ", "1. "]),
                          st.lists(_inline, min_size=1, max_size=4)), min_size=1, max_size=4))
def test_markdown_spelled_canonically_renders_back_from_its_text(blocks) -> None:
    lines = []
    for prefix, nodes in blocks:
        parts: list[tuple[str, str]] = []  # ("text", plain text) or ("mark", its markup), words spaced
        for kind, value in nodes:
            if parts:
                parts.append(("text", " "))
            if kind == "word":
                parts.append(("text", value))
            else:
                parts.append(("mark", f'[{value}](/x "t")' if kind == "link" else f"{kind}{value}{kind}"))
        # the text between two marks is escaped as one piece, as render_run escapes it
        groups = [(kind, "".join(v for _, v in group))
                  for kind, group in itertools.groupby(parts, lambda p: p[0])]
        line = "".join(escape_markdown(value) if kind == "text" else value for kind, value in groups)
        lines.append(prefix + line)
    source = "\n\n".join(lines) + "\n"
    doc = read_document(source, "markdown", "page.md")
    assert _rendered(doc) == source


# --- HTML ---------------------------------------------------------------------------------------------

def _html_shape(page: str) -> list[tuple]:
    """html5lib's tree without its words: every element's tag and attributes, comments, and the text of
    what is kept whole (script, style, pre, code, kbd)."""
    shape = []
    for element in html5lib.parse(page, namespaceHTMLElements=False).iter():
        if callable(element.tag):
            shape.append(("comment", element.text))
        else:
            kept = element.tag in ("script", "style", "pre", "code", "kbd")
            shape.append((element.tag, sorted(element.attrib.items()), element.text if kept else None))
    return shape


def test_html_page_reads_back_and_keeps_its_tags() -> None:
    source = (FIXTURES / "page.html").read_text(encoding="utf-8")
    doc = read_document(source, "html", "page.html")
    assert _raw(doc) == source
    assert _html_shape(_rendered(doc, _upper)) == _html_shape(source)
    texts = [run.text for run in doc.runs]
    assert "Getting started — transformer-mt" in texts and "Scores on the test split" in texts
    code = ("querySelectorAll", "font-family", "max_minutes")
    assert not any(kept in text for kept in code for text in texts)


_html_text = st.text("ab &<>'\"é", min_size=1, max_size=5).map(lambda t: html.escape(t, quote=False))
_html_inline = st.recursive(
    st.one_of(_html_text, st.sampled_from(["<code>x &lt; y</code>", "<br>", '<img src="a.png" alt="A b">'])),
    lambda inner: st.tuples(st.sampled_from(["b", "em", "span"]), st.lists(inner, min_size=1, max_size=3))
    .map(lambda t: f'<{t[0]} class="k">' + "".join(t[1]) + f"</{t[0]}>"),
    max_leaves=6)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["p", "h2", "li", "td"]), st.lists(_html_inline, min_size=1,
                                                                             max_size=4)), max_size=4))
def test_html_spelled_canonically_renders_back_from_its_text(blocks) -> None:
    source = "<body>\n" + "".join(f"<{tag}>{''.join(parts)}</{tag}>\n" for tag, parts in blocks) + "</body>\n"
    doc = read_document(source, "html", "page.html")
    assert _raw(doc) == source and _rendered(doc) == source


@pytest.mark.parametrize("page", [
    "<p>One<p>Two", "<ul><li>a<li>b</ul>", "<table><tr><td>a<td>b<tr><td>c</table>", "<dl><dt>a<dd>b</dl>",
    "<select><option>a<option>b</select>", '<a href="/"><div>Block link</div></a>', "<P>Upper</P>",
    "<p>a<br/>b<img src=x></p>", '<svg viewBox="0 0 1 1"><path d="M0"/></svg>', "<p>x</p></body></html>",
    "<!-- only a comment -->", "<p>Press <button>OK <i>now</i></button></p>"])
def test_html_that_leaves_out_end_tags_is_read(page: str) -> None:
    doc = read_document(page, "html", "page.html")
    assert _raw(doc) == page
    assert _html_shape(_rendered(doc, _upper)) == _html_shape(page)


@pytest.mark.parametrize(("page", "where"), [
    ("<div>\n  <p>Text</span>\n</div>", "page.html:2:10:"),  # an end tag that closes nothing
    ("<p>Some <b>bold\n</p>", "page.html:1:9:"),  # an inline element left open when its block ends
    ("<p>Fine</p>\n<p>Cut <a href='x'", "page.html:2:8:"),  # a tag never ended
    ("<p>Fine</p>\n<!-- never closed", "page.html:2:1:"),
    ("<div><p>Text</p>", "page.html:1:1:"),  # a block never closed
    ("<pre>code", "page.html:1:1:"),
    ("<p>Some <em>text <div>block</div></em></p>", "page.html:1:9:"),
])
def test_malformed_html_is_refused_in_one_line(page: str, where: str) -> None:
    with pytest.raises(DataError) as error:
        read_document(page, "html", "page.html")
    assert str(error.value).startswith(where) and "\n" not in str(error.value)


# --- subtitles ----------------------------------------------------------------------------------------

def test_subtitles_keep_numbers_and_timings() -> None:
    source = (FIXTURES / "subtitles.srt").read_text(encoding="utf-8")
    doc = read_document(source, "srt", "subtitles.srt")
    cues = list(srt.parse(source))
    assert _raw(doc) == source and len(doc.runs) == len(cues) >= 50
    # a cue's text written back is the cue as it was where it was on one line (canonical), or balanced
    single = [run for run in doc.runs if "\n" not in run.raw]
    assert single and all(render_run(r.text, r.marks, r.keep, doc.escape) == r.raw for r in single)
    two = read_document("1\n00:00:01,000 --> 00:00:02,000\n<i>Hello,</i>\n<i>you.</i>\n", "srt", "a.srt")
    assert _rendered(two) == two.source()
    longer = _rendered(doc, lambda run: _upper(run) + " and a few more words")
    out = list(srt.parse(longer))
    assert [(c.index, c.start, c.end) for c in out] == [(c.index, c.start, c.end) for c in cues]
    for before, after in zip(cues, out):
        assert len(after.content.splitlines()) == len(before.content.splitlines())
        if "<" not in before.content and "{" not in before.content:
            joined = " ".join(before.content.splitlines()).upper() + " and a few more words"
            assert " ".join(after.content.splitlines()) == joined
    italic = next(run for run in doc.runs if run.raw.startswith("<i>"))
    assert italic.marks == (Mark(0, len(italic.text), "<i>", "</i>"),) and "<" not in italic.text


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text("ab", min_size=1, max_size=6), min_size=1, max_size=8), st.integers(1, 3),
       st.integers(0, 12))
def test_a_long_cue_is_wrapped_into_balanced_lines(words, lines, width) -> None:
    text = " ".join(words)
    doc = Subtitles("srt", [Run(text, text)], layouts=[CueLayout(lines, width, "\n")])
    laid = doc.render([text]).split("\n")
    assert " ".join(laid) == text
    if len(text) <= width or lines == 1:
        assert laid == [text]
        return
    assert len(laid) == min(lines, len(words))
    # no other way of breaking the words into as many lines has a shorter longest line
    cuts = itertools.combinations(range(1, len(words)), len(laid) - 1)
    best = min(max(len(" ".join(words[a:b])) for a, b in zip((0, *c), (*c, len(words)))) for c in cuts)
    assert max(map(len, laid)) == best


def test_malformed_subtitles_are_refused_in_one_line() -> None:
    source = "1\n00:00:01,000 --> 00:00:02,000\nHello.\n\n2\n00:00:03,000 -> 00:00:04,000\nBye.\n"
    with pytest.raises(DataError) as error:
        read_document(source, "srt", "film.srt")
    assert str(error.value).startswith("film.srt:5:1: cue 2 ") and "\n" not in str(error.value)


# --- formats ------------------------------------------------------------------------------------------

def test_format_from_the_extension_or_the_key() -> None:
    paths = ("a.md", "b.MARKDOWN", "c.htm", "d.xhtml", "e.srt", "f.txt", None)
    expected = ["markdown", "markdown", "html", "html", "srt", "text", "text"]
    assert [format_for(p, "auto") for p in paths] == expected
    assert format_for("a.md", "text") == "text"
    for bad in (lambda: format_for("a.md", "docx"), lambda: read_document("x", "docx", "a.docx")):
        with pytest.raises(ConfigError, match="document.format='docx'.*" + ", ".join(FORMATS)):
            bad()
