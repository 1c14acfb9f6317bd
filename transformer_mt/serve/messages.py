"""What a request and an answer of POST /translate hold (the API's schema, which the OpenAPI page shows),
and a request body read into a TranslateRequest within the server's limits: every way a body can be
wrong answered with a 4xx and one line that says what to change, bodies of thousands of errors included.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.exceptions import HTTPException

from transformer_mt.config import ServeConfig
from transformer_mt.config.checks import n_best_in_beam
from transformer_mt.decoding.glossary import Glossary
from transformer_mt.errors import DataError
from transformer_mt.serve.attention_maps import AttentionMap
from transformer_mt.serve.batcher import Search

SHOWN_ERRORS = 3  # of a request's validation errors: what to fix first, not a catalogue


# -- the API's schema ---------------------------------------------------------------------------------
class TranslateRequest(BaseModel):
    """POST /translate: texts and, optionally, how to search and what to return."""

    model_config = ConfigDict(extra="forbid", strict=True)
    text: list[str] | str = Field(description="the sentences to translate (or one sentence)")
    beam_size: int | None = Field(None, ge=1, description="1 = greedy; default: the server's")
    n_best: int | None = Field(None, ge=1, description="hypotheses per text, at most beam_size")
    scores: bool = Field(False, description="also return each hypothesis with its model score")
    attention: bool | Literal["heads"] = Field(False, description="also return cross-attention: true = "
                                                "averaged over layers and heads, \"heads\" = per layer and "
                                                "head")
    alignment: bool | None = Field(None, description="also return word alignments (`0-0 1-2 ...`, source-"
                                   "target word indices) of each best translation; default: the server's")
    prefix: list[str] | str | None = Field(None, description="forced start of each translation (prefix "
                                           "decoding): one per text, \"\" for none; default: the server's")
    tgt_lang: str | None = Field(None, description="the language to translate into, for a model of several "
                                 "(GET /health lists them); default: the server's")
    format: Literal["text", "markdown", "html", "srt"] = Field(
        "text", description="text: each text split into sentences; markdown, html, srt: each text a "
        "document, translated with its structure (markup, code, cue numbers and timings) as it was")
    glossary: dict[str, str] | None = Field(None, description="{source term: target term}: where a source "
                                            "term occurs, its translation holds the target term (added to "
                                            "the server's decoding.glossary, over its entry for the term)")

    def search(self) -> Search:
        """What the request asks of the search (requests that ask the same decode together)."""
        glossary = tuple(sorted(self.glossary.items())) if self.glossary else None
        return Search(self.beam_size, self.n_best, self.attention is not False, self.alignment, self.tgt_lang,
                      self.format, glossary)


class ScoredText(BaseModel):
    """One of a text's n best translations and its score."""

    text: str
    score: float


class TermReport(BaseModel):
    """How one glossary term of a text fared in its best translation."""

    source: str
    target: str
    status: Literal["met", "refused", "missing"] = Field(description="met: the translation holds the target "
                                                         "term; refused: the search could not take it; "
                                                         "missing: it did not come out (see reason)")
    reason: str | None = None


class TranslateResponse(BaseModel):
    translations: list[str] = Field(description="the best translation of each text, in request order")
    terms: list[list[TermReport]] | None = Field(None, description="with a glossary: each text's terms and "
                                                 "how each fared")
    nbest: list[list[ScoredText]] | None = None
    attention: list[AttentionMap] | None = None
    alignments: list[str] | None = Field(None, description="the best translation's word alignment of each "
                                         "text (`0-0 1-2 ...`), when asked")
    confidence: list[float | None] | None = Field(
        None, description="each best translation's confidence: its expected chrF/100 where the model is "
        "calibrated (docs/confidence.md); null for an empty text or a document")
    words: list[list[tuple[str, float]] | None] | None = Field(
        None, description="each best translation's words with their confidence: [[word, confidence], ...]")
    low_confidence: list[bool] | None = Field(None, description="with the server's decoding.min_confidence: "
                                              "whether each best translation is below it")
    withheld: list[bool] | None = Field(None, description="with decoding.low_confidence=withhold: whether "
                                        "each translation was left out (its text empty) for being below it")


class ErrorResponse(BaseModel):
    error: str


ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse, "description": why} for code, why in (
        (400, "the body is not UTF-8 JSON, or the Host is not in allowed_hosts"),
        (408, "the body did not arrive within limits.body_timeout_s"),
        (413, "too many texts, a text or prefix too long, the body too large, or more attention than "
              "limits.max_attention_values"),
        (415, "a browser sent a body that is not application/json"),
        (422, "a field is missing, of the wrong type or out of range, or a text cannot be encoded"),
        (431, "the request line and headers are over limits.max_header_bytes"),
        (503, "the queue is full (see Retry-After) or the request waited too long"))}


def parse_request(raw: bytes, cfg: ServeConfig) -> TranslateRequest:
    """The request body as a TranslateRequest within the server's limits, or the HTTPException saying
    what is wrong with it."""
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as ex:
        raise HTTPException(400, f"the body is not UTF-8 (byte {ex.start}); send UTF-8 JSON") from None
    except json.JSONDecodeError as ex:
        raise HTTPException(400, f"the body is not JSON ({ex.msg} at line {ex.lineno} column {ex.colno}); "
                            'send {"text": ["..."]}') from None
    except RecursionError:
        raise HTTPException(400, "the body's JSON nests too deeply; send a flat object such as "
                            '{"text": ["..."]}') from None
    except ValueError:  # an integer past Python's limit on digits: reading it would take quadratic time
        raise HTTPException(400, f"the body holds a number of more than {sys.get_int_max_str_digits()} "
                            "digits; send a smaller one") from None
    if not isinstance(data, dict):
        raise HTTPException(422, 'the body must be a JSON object such as {"text": ["..."]}')
    _check_shape(data, cfg.limits.max_texts, cfg.limits.max_glossary_terms)
    try:
        body = TranslateRequest.model_validate(data)
    except ValidationError as ex:
        raise HTTPException(422, one_line(ex.errors())) from None
    texts = [body.text] if isinstance(body.text, str) else body.text
    limits = cfg.limits
    if not texts:
        raise HTTPException(422, "text is an empty list; send at least one text")
    if len(texts) > limits.max_texts:
        raise HTTPException(413, f"{len(texts)} texts in one request; the limit is {limits.max_texts} "
                            "(limits.max_texts): split the request")
    for i, text in enumerate(texts):
        if len(text) > limits.max_chars:
            raise HTTPException(413, f"text[{i}] has {len(text)} characters; the limit is {limits.max_chars} "
                                "(limits.max_chars): split it into sentences")
    _check_prefixes(body, len(texts), limits.max_chars)
    _check_glossary(body, limits.max_chars)
    beam = body.beam_size or cfg.decoding.beam_size
    if beam > limits.max_beam_size:
        raise HTTPException(422, f"beam_size={beam} is above this server's limit of {limits.max_beam_size}")
    too_many = n_best_in_beam(body.n_best or 1, beam, prefix="")
    if too_many:
        raise HTTPException(422, too_many[0])
    return body


def _check_shape(data: dict[str, Any], max_texts: int, max_terms: int) -> None:
    """What validation would take long to find, refused before it: a key that is not a field, more texts
    or prefixes than limits.max_texts, more glossary terms than limits.max_glossary_terms (each item past
    the limit would be an error of its own)."""
    unknown = [str(key) for key in data if key not in TranslateRequest.model_fields]
    if unknown:
        more = f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""
        raise HTTPException(422, f"{unknown[0][:40]}{more}: not a field of /translate; the fields are "
                            f"{', '.join(TranslateRequest.model_fields)}")
    for field in ("text", "prefix"):
        if isinstance(data.get(field), list) and len(data[field]) > max_texts:
            what = "texts" if field == "text" else "prefixes"
            raise HTTPException(413, f"{len(data[field])} {what} in one request; the limit is {max_texts} "
                                "(limits.max_texts): split the request")
    terms = data.get("glossary")
    if isinstance(terms, dict) and len(terms) > max_terms:
        raise HTTPException(413, f"a glossary of {len(terms)} terms in one request; the limit is {max_terms} "
                            "(limits.max_glossary_terms): put the rest in the server's decoding.glossary")


def _check_prefixes(body: TranslateRequest, n_texts: int, max_chars: int) -> None:
    """One prefix per text (a string for one text), each within limits.max_chars."""
    if body.prefix is None:
        return
    prefixes = [body.prefix] if isinstance(body.prefix, str) else body.prefix
    if len(prefixes) != n_texts:
        raise HTTPException(422, f"prefix has {len(prefixes)} items for {n_texts} texts; give one per text "
                            '("" for none)')
    for i, prefix in enumerate(prefixes):
        if len(prefix) > max_chars:
            raise HTTPException(413, f"prefix[{i}] has {len(prefix)} characters; the limit is {max_chars} "
                                "(limits.max_chars)")


def _check_glossary(body: TranslateRequest, max_chars: int) -> None:
    """Each glossary term within limits.max_chars, and usable (`Glossary.of`: no empty term, no tab)."""
    for source, target in (body.glossary or {}).items():
        if max(len(source), len(target)) > max_chars:
            raise HTTPException(413, f"glossary term {source[:40]!r} is over {max_chars} characters "
                                "(limits.max_chars); shorten it")
    try:
        Glossary.of((body.glossary or {}).items(), "glossary")
    except DataError as ex:
        raise HTTPException(422, str(ex)) from None


def one_line(errors: Any) -> str:
    """Pydantic's error list as one line: `field: message` of the first few, and how many more."""
    parts = []
    for e in errors[:SHOWN_ERRORS]:
        where = ".".join(str(p) for p in e.get("loc", ()) if p != "body")[:80] or "body"
        parts.append(f"{where}: {e.get('msg', 'invalid')[:200]}")
    if len(errors) > SHOWN_ERRORS:
        parts.append(f"and {len(errors) - SHOWN_ERRORS} more")
    return "; ".join(parts)
