"""A run of a document written back from its translation: its inline markup projected onto the words
that translate the words it marked, its kept ranges (inline code, images) found again and left as they
are, the rest escaped as the format writes text."""

from __future__ import annotations

from transformer_mt.decoding.text_translator import Translation
from transformer_mt.documents.markup import render_run
from transformer_mt.documents.pieces import Document, Run
from transformer_mt.documents.projection import project


def rendered(run: Run, translation: Translation, doc: Document) -> str:
    """One run written back: the translation, its marks projected, its kept ranges found again; a run the
    model translated into nothing stays as it was, rather than leave its element (a table cell, a list
    item) empty or gone."""
    text = translation.text.strip()
    if not text:
        return run.raw
    marks = project(run.marks, run.text, text, translation.alignment or []) if run.marks else []
    return render_run(text, marks, _kept(run, text), doc.escape)


def _kept(run: Run, text: str) -> list[tuple[int, int]]:
    """Where each of the run's kept ranges is in its translation (restored verbatim, in order)."""
    found, at = [], 0
    for start, end in run.keep:
        piece = run.text[start:end]
        where = text.find(piece, at)
        where = where if where >= 0 else text.find(piece)
        if where >= 0 and all(where >= b or where + len(piece) <= a for a, b in found):
            found.append((where, where + len(piece)))
            at = where + len(piece)
    return sorted(found)
