"""Documents end to end through `transformer-mt translate` and `serve`: this project's own Markdown pages,
an HTML page and a subtitle file translated with the tiny run, their structure read back by independent
parsers; and every bad input refused in one line, with nothing written."""

from __future__ import annotations

import html.parser
import re
from pathlib import Path

import pytest
import srt
from markdown_it import MarkdownIt

from tests.conftest import FIXTURES, ROOT

DOCS = sorted((ROOT / "docs").glob("*.md"))


def _markdown_structure(text: str) -> list[tuple[str, str, str, str]]:
    """Every block token of a Markdown page, with code as it is: what translation must not change."""
    return [(t.type, t.tag, t.markup, t.content if t.type in ("fence", "code_block", "html_block") else "")
            for t in MarkdownIt("commonmark").enable("table").parse(text)]


class Tags(html.parser.HTMLParser):
    """The tags of a page with their attributes, and the text of its pre, code and script elements."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, object]] = []
        self.kept: list[str] = []
        self.inside: list[str] = []

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self.tags.append((tag, attrs))
        self.inside.append(tag)

    def handle_endtag(self, tag: str) -> None:
        self.tags.append((f"/{tag}", None))
        if tag in self.inside:
            del self.inside[len(self.inside) - 1 - self.inside[::-1].index(tag):]

    def handle_data(self, data: str) -> None:
        if set(self.inside) & {"pre", "code", "script", "style", "kbd"}:
            self.kept.append(data)


def _tags(text: str) -> Tags:
    parser = Tags()
    parser.feed(text)
    parser.close()
    return parser


def test_markdown_pages_of_this_project_keep_their_structure(tiny_run: Path, tmp_path: Path,
                                                            run_cli_here) -> None:
    for page in DOCS[:3]:
        out = tmp_path / page.name
        done = run_cli_here("translate", f"checkpoint={tiny_run}", f"input={page}", f"output={out}",
                            "device=cpu", "decoding.beam_size=1")
        assert done.returncode == 0, done.stderr
        source, translated = page.read_text(encoding="utf-8"), out.read_text(encoding="utf-8")
        assert _markdown_structure(translated) == _markdown_structure(source), page.name
        assert translated != source


def test_an_html_page_keeps_its_tags_attributes_and_code(tiny_run: Path, tmp_path: Path,
                                                         run_cli_here) -> None:
    out = tmp_path / "page.fr.html"
    done = run_cli_here("translate", f"checkpoint={tiny_run}", f"input={FIXTURES / 'page.html'}",
                        f"output={out}", "device=cpu", "decoding.beam_size=1")
    assert done.returncode == 0, done.stderr
    before, after = _tags((FIXTURES / "page.html").read_text(encoding="utf-8")), _tags(out.read_text("utf-8"))
    assert sorted(map(repr, after.tags)) == sorted(map(repr, before.tags))  # inline tags may move, not change
    assert after.kept == before.kept
    assert [t for t in after.tags if t[0] in ("p", "h1", "h2", "li", "table", "pre")] == \
        [t for t in before.tags if t[0] in ("p", "h1", "h2", "li", "table", "pre")]


def test_subtitles_keep_their_cues_and_timings(tiny_run: Path, tmp_path: Path, run_cli_here) -> None:
    out = tmp_path / "subtitles.fr.srt"
    done = run_cli_here("translate", f"checkpoint={tiny_run}", f"input={FIXTURES / 'subtitles.srt'}",
                        f"output={out}", "device=cpu", "decoding.beam_size=1")
    assert done.returncode == 0, done.stderr
    before = list(srt.parse((FIXTURES / "subtitles.srt").read_text(encoding="utf-8")))
    after = list(srt.parse(out.read_text(encoding="utf-8")))
    assert len(before) >= 50
    assert [(c.index, c.start, c.end) for c in after] == [(c.index, c.start, c.end) for c in before]
    assert all(c.content.strip() for c in after)
    assert all(len(a.content.splitlines()) <= max(1, len(b.content.splitlines()))
               for a, b in zip(after, before))


def test_a_line_of_sentences_and_spans_from_the_command_line(tiny_run: Path, run_cli_here) -> None:
    done = run_cli_here("translate", f"checkpoint={tiny_run}", "device=cpu", "decoding.beam_size=1",
                        "text=I am cold. Call 0585738843 or write to anna7@mail.com.")
    assert done.returncode == 0, done.stderr
    line = done.stdout.strip()
    assert "0585738843" in line and "anna7@mail.com" in line
    assert "sentences in 1 texts" in done.stderr


@pytest.mark.parametrize(("name", "body", "message"), [
    ("bad.html", "<p>An <b>open tag</p>", r"bad\.html:1:\d+: .*<b>"),
    ("bad.srt", "1\n00:00:01,000 --> 00:00:02,000\nHello.\n\n2\n00:00:0x,000 --> 00:00:03,000\nBye.\n",
     r"bad\.srt:5:1: cue 2 is not a subtitle cue"),
])
def test_a_malformed_document_is_refused_in_one_line_and_nothing_written(
        tiny_run: Path, tmp_path: Path, run_cli_here, name: str, body: str, message: str) -> None:
    source, out = tmp_path / name, tmp_path / f"out-{name}"
    source.write_text(body, encoding="utf-8")
    done = run_cli_here("translate", f"checkpoint={tiny_run}", f"input={source}", f"output={out}",
                        "device=cpu")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert re.search(message, done.stderr) and not out.exists()


def test_an_unknown_format_and_an_unreadable_term_list_are_refused_in_one_line(
        tiny_run: Path, tmp_path: Path, run_cli_here) -> None:
    done = run_cli_here("translate", f"checkpoint={tiny_run}", "text=Hi.", "document.format=docx")
    assert done.returncode == 2 and "document.format='docx'" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    done = run_cli_here("translate", f"checkpoint={tiny_run}", "text=Hi.", "device=cpu",
                        f"document.keep_terms={tmp_path / 'none.txt'}")
    assert done.returncode == 2 and "document.keep_terms=" in done.stderr and "cannot read it" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
