"""Which format a document is in (from its file's extension, or the `document.format` key), and reading it
into a Document with that format's reader."""

from __future__ import annotations

from pathlib import PurePath

from transformer_mt.documents.html_pages import read_html
from transformer_mt.documents.markdown_pages import read_markdown
from transformer_mt.documents.pieces import Document
from transformer_mt.documents.plain_text import read_text
from transformer_mt.documents.subtitles import read_subtitles
from transformer_mt.errors import ConfigError

FORMATS = ("text", "markdown", "html", "srt")
EXTENSIONS = {".md": "markdown", ".markdown": "markdown", ".html": "html", ".htm": "html", ".xhtml": "html",
              ".srt": "srt"}


def _unknown(key: str) -> ConfigError:
    return ConfigError(f"document.format={key!r} is not a format; use auto (from the file's extension) or "
                       f"one of: {', '.join(FORMATS)}")


def format_for(path: str | None, key: str) -> str:
    """The format to read `path` in: `key`, or with key "auto" the one its extension names (else text)."""
    if key == "auto":
        return EXTENSIONS.get(PurePath(path).suffix.lower(), "text") if path else "text"
    if key not in FORMATS:
        raise _unknown(key)
    return key


def read_document(source: str, fmt: str, name: str) -> Document:
    """`source` read as a document of format `fmt`; `name` (a file's name) is where its errors point."""
    if fmt == "text":
        return read_text(source)
    if fmt == "markdown":
        return read_markdown(source)
    if fmt == "html":
        return read_html(source, name)
    if fmt == "srt":
        return read_subtitles(source, name)
    raise _unknown(fmt)
