"""The user-facing text: a README read in minutes, docs that speak about the tool (not its history), a
module map that matches the package, and links and paths that lead somewhere."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").rglob("*.md"))
RESEARCH = sorted((ROOT / "docs" / "research").glob("*.md"))
PAGES = [README, *DOCS]
PACKAGE = ROOT / "transformer_mt"
ARCHITECTURE = ROOT / "docs" / "architecture.md"

FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.MULTILINE | re.DOTALL)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$", re.MULTILINE)
REPO_PATH = re.compile(r"(?<![\w/.-])((?:transformer_mt|scripts|tests|configs|docs)/[\w./-]*[\w/])")
HISTORY = re.compile(r"\bissue\s*#?\d+|\bsessions?\b|\btoday\b|\byesterday\b|\b(?:hours?|days?) later\b"
                     r"|\b(?:earlier|later|another|next|previous|second|third|fourth|fifth) day\b"
                     r"|\b(?:two|three|four|five|six|several) days\b|\btime ran out\b", re.IGNORECASE)
FIGURE = re.compile(r"(?<![\w.,])\d+(?:[.,]\d+)+(?![\w.,]*\d)")


def _prose(text: str) -> str:
    """The text outside fenced code blocks."""
    return FENCE.sub("", text)


def _name(page: Path) -> str:
    return str(page.relative_to(ROOT))


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every anchor of a Markdown page, repeated headings numbered as GitHub numbers them."""
    seen: Counter[str] = Counter()
    found = set()
    for heading in HEADING.findall(_prose(page.read_text(encoding="utf-8"))):
        base = slug(heading)
        found.add(base if seen[base] == 0 else f"{base}-{seen[base]}")
        seen[base] += 1
    return found


def module_map(text: str) -> set[str]:
    """The files the module table of docs/architecture.md names (first column, paths under the package)."""
    return set(re.findall(r"^\| `([^`]+)` \|", text, re.MULTILINE))


def test_slug_matches_github() -> None:
    assert slug("en→fr and fr→en in 40 minutes (Zen 1)") == "enfr-and-fren-in-40-minutes-zen-1"
    assert slug("Prefix (forced) decoding") == "prefix-forced-decoding"
    assert slug("The `serve` extra, v2.0") == "the-serve-extra-v20"


def test_readme_is_short() -> None:
    lines = len(README.read_text(encoding="utf-8").splitlines())
    assert lines <= 200, f"README.md has {lines} lines; move detail into docs/"


@pytest.mark.parametrize("line", ["on today's runs", "a third day", "on an earlier day", "an hour later",
                                  "the next day", "six runs on five days", "the machine's time ran out",
                                  "see issue 42", "in another session"])
def test_history_words_are_caught(line: str) -> None:
    assert HISTORY.search(line)


@pytest.mark.parametrize("line", ["one run each, one after the other", "runs on different days differ",
                                  "the issue of speed", "a day's budget"])
def test_findings_are_not_history(line: str) -> None:
    assert not HISTORY.search(line)


@pytest.mark.parametrize("page", RESEARCH, ids=_name)
def test_research_pages_say_what_they_are(page: Path) -> None:
    """A research page says in its first line that it tells how something was found, not current results."""
    first = page.read_text(encoding="utf-8").splitlines()[0]
    assert "Research page" in first, f"{_name(page)} does not start by saying it is a research page"


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_no_word_about_how_the_project_was_developed(page: Path) -> None:
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        found = HISTORY.search(line)
        assert found is None, f"{_name(page)}:{number} speaks of the project's history: {found.group()!r}"


def test_readme_states_each_figure_once() -> None:
    """A figure is stated in one place; the README links to the page with its command."""
    prose = re.sub(r"`[^`\n]*`", "", _prose(README.read_text(encoding="utf-8")))
    repeated = sorted(f for f, n in Counter(FIGURE.findall(prose)).items() if n > 1)
    assert not repeated, f"README.md repeats figures: {repeated}"


def test_module_map_is_complete() -> None:
    named = module_map(ARCHITECTURE.read_text(encoding="utf-8"))
    package = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")}
    assert package - named == set(), f"docs/architecture.md lacks modules: {sorted(package - named)}"
    missing = sorted(name for name in named if not (PACKAGE / name).is_file())
    assert not missing, f"docs/architecture.md names files the package does not have: {missing}"


def broken_links(page: Path) -> list[str]:
    """The relative links of a page whose file, or heading, does not exist."""
    broken = []
    for target in LINK.findall(_prose(page.read_text(encoding="utf-8"))):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target} (no such heading)")
    return broken


def test_broken_links_are_found(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other page\n\n## Twice\n\n## Twice\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text("# Here\n[a](other.md#other-page) [b](other.md#twice-1) [c](#here) [d](https://x.org/y)\n"
                    "[e](missing.md) [f](other.md#nowhere) ![g](#there)\n```\n# There\n[h](gone.md)\n```\n",
                    encoding="utf-8")
    assert broken_links(page) == ["missing.md", "other.md#nowhere (no such heading)",
                                  "#there (no such heading)"]


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_relative_links_lead_somewhere(page: Path) -> None:
    broken = broken_links(page)
    assert not broken, f"{_name(page)}: broken links {broken}"


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_repository_paths_exist(page: Path) -> None:
    """Paths such as scripts/benchmark.py or transformer_mt/model/dropout.py name files that exist."""
    text = page.read_text(encoding="utf-8")
    missing = sorted({p for p in REPO_PATH.findall(text) if not (ROOT / p).exists()})
    assert not missing, f"{_name(page)} names paths that do not exist: {missing}"
