"""What a request that sends documents (`format` markdown, html or srt) must be: each text parses as its
format, and it asks for nothing that belongs to one sentence (n-best lists, scores, attention,
alignments, prefixes); checked before the request joins a batch, so a bad document fails alone."""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.exceptions import HTTPException

from transformer_mt.documents.formats import read_document
from transformer_mt.errors import UserError

if TYPE_CHECKING:  # types only
    from transformer_mt.serve.messages import TranslateRequest


def check_documents(body: TranslateRequest, texts: list[str]) -> None:
    """A 422 naming what a document request cannot ask for, or the first text that does not parse."""
    if body.format == "text":
        return
    asked = [name for name, on in (("n_best", (body.n_best or 1) > 1), ("scores", body.scores),
                                   ("attention", body.attention is not False), ("alignment", body.alignment),
                                   ("prefix", body.prefix is not None)) if on]
    if asked:
        raise HTTPException(422, f"format={body.format} translates each text as a whole document; "
                            f"{', '.join(asked)} are for format=text")
    for i, text in enumerate(texts):
        try:
            read_document(text, body.format, f"text[{i}]")
        except UserError as ex:
            raise HTTPException(422, str(ex)) from None
