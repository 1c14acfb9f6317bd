"""Texts as people write them, translated: each text split into sentences, each sentence's spans masked,
a sentence the model cannot take whole cut into parts, every part of every text translated in one call
of the engine (it batches them by length), and each translation put back together around the original
separators, spans restored.

`translate_nbest` takes and returns what an engine's does (one n-best list per text), so the jobs and the
server use it in the engine's place. A text of several sentences gets n-best lists made rank by rank from
its sentences' (the k-th of each), their scores summed, their word alignments joined.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from transformer_mt.config import DecodingConfig, DocumentConfig
from transformer_mt.data.text_variants import CASES, one_case, sentence_case
from transformer_mt.decoding.glossary import Entry, Glossary
from transformer_mt.decoding.text_translator import TextTranslator, Translation
from transformer_mt.documents.assembly import PartTranslation, joined
from transformer_mt.documents.formats import read_document
from transformer_mt.documents.masking import Masked, blanked, mask, missing, unmask
from transformer_mt.documents.rendering import rendered
from transformer_mt.documents.rewrite import Rewrite
from transformer_mt.documents.sentences import SentenceSplitter, cut_long
from transformer_mt.documents.spans import GLOSSARY, Span, copies_names, find_spans, read_terms

log = logging.getLogger(__name__)
Ranges = Sequence[tuple[int, int]]  # (start, end) character ranges of a text
_DECODING = {f.name for f in dataclasses.fields(DecodingConfig)}


@dataclass
class Tally:
    """What the layer did to the texts it translated: the figures a job logs and a response reports."""

    texts: int = 0
    sentences: int = 0  # translated, each sentence once however many parts it was cut into
    cut: int = 0  # sentences longer than the model takes, translated in parts
    spans: int = 0  # protected spans
    retried: int = 0  # spans whose stand-in the model dropped once, restored on a second try
    placed: int = 0  # spans whose stand-in the model dropped twice: placed at the end of the sentence
    terms: int = 0  # glossary source terms found (each searched with its target term)
    terms_met: int = 0  # of them, in the best translation
    terms_refused: int = 0  # the search could not take them (reported with the translation)

    def add(self, other: Tally) -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


@dataclass(frozen=True)
class SentencePart:
    """What the engine translates: a sentence, or a part of a long one, of text `text`, at [start, end)
    of it, masked; `case` the case to write its translation in when it was folded; `terms` its glossary
    entries."""

    text: int
    start: int
    end: int
    masked: Masked
    case: str | None = None
    terms: tuple[Entry, ...] = ()  # the glossary entries whose source term it holds


@dataclass
class Prepared:
    """The parts of a batch of texts, in order, and the tally of what preparing them did."""

    parts: list[SentencePart] = field(default_factory=list)
    tally: Tally = field(default_factory=Tally)


class DocumentTranslator:
    """An engine behind the documents layer: texts in any shape, translated sentence by sentence."""

    def __init__(self, engine: TextTranslator, cfg: DocumentConfig, src_lang: str | None = None,
                 max_sentence_tokens: int | None = None):
        self.engine = engine
        self.cfg = cfg
        self.splitter = SentenceSplitter(src_lang or "en")
        self.terms = read_terms(cfg.keep_terms) if cfg.keep_terms else ()
        self.known = engine.known_words if copies_names(cfg.names, src_lang) else None
        self.max_tokens = min(cfg.max_sentence_tokens or max_sentence_tokens or engine.max_input_tokens,
                              engine.max_input_tokens)
        self.tally = Tally()

    @classmethod
    def for_engine(cls, engine: TextTranslator, cfg: DocumentConfig) -> DocumentTranslator:
        """A translator for `engine` that splits by the rules of its run's source language and cuts what is
        longer than its run trained on (dataset.max_len)."""
        dataset = (engine.info.get("config") or {}).get("dataset") or {}
        return cls(engine, cfg, dataset.get("src_lang"), dataset.get("max_len"))

    @property
    def decoding(self) -> DecodingConfig:
        """The engine's decoding settings (what a request that names none searches with)."""
        return self.engine.decoding

    def summary(self) -> str:
        """What the layer did so far, in one line for a job's log."""
        t = self.tally
        line = (f"{t.sentences} sentences in {t.texts} texts ({t.cut} cut into parts, longer than "
                f"{self.max_tokens} tokens); {t.spans} spans kept as written")
        if t.retried or t.placed:
            line += (f": {t.retried} came through on a second try, {t.placed} the model dropped and were "
                     "placed at the end of their sentence")
        if t.terms:
            line += (f"; {t.terms} glossary terms, {t.terms_met} of them in their translation, "
                     f"{t.terms_refused} refused")
        return line

    # -- texts to parts -------------------------------------------------------------------------------
    def spans(self, text: str, given: Sequence[tuple[int, int]] = (),
              glossary: Sequence[tuple[int, int]] = ()) -> list[Span]:
        """The spans of `text` this translator protects (none with document.protect=false), and the
        glossary ranges they leave (kind GLOSSARY, never masked)."""
        if not self.cfg.protect:
            return [Span(a, b, GLOSSARY) for a, b in glossary]
        return find_spans(text, self.terms, given, self.known, glossary)

    def sentences(self, text: str, unbreakable: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
        """The sentences of `text` (the whole text, stripped, with document.split=false)."""
        if self.cfg.split:
            return self.splitter.split(text, unbreakable)
        stripped = text.strip()
        return [(text.index(stripped), text.index(stripped) + len(stripped))] if stripped else []

    def prepare(self, texts: Sequence[str], given: Sequence[Ranges] | None = None,
                unbreakable: Sequence[Ranges] | None = None, fold: bool = True,
                glossary: Glossary | None = None) -> Prepared:
        """Every text's parts: its sentences, cut where too long, their spans masked (`given`: each text's
        ranges that must pass as they are; `unbreakable`: ranges no sentence boundary may cut, such as
        inline markup's), each with the glossary entries whose source term it holds (no sentence boundary
        or cut inside one)."""
        out = Prepared()
        fits = self._fits()
        for i, text in enumerate(texts):
            matches = {(m.start, m.end): m.entry for m in glossary.find(text)} if glossary else {}
            found = self.spans(text, given[i] if given else (), list(matches))
            terms = {(s.start, s.end): matches[s.start, s.end] for s in found if s.kind == GLOSSARY}
            spans = [s for s in found if s.kind != GLOSSARY]
            out.tally.texts += 1
            out.tally.spans += len(spans)
            out.tally.terms += len(terms)
            whole = [(s.start, s.end) for s in found] + list(unbreakable[i] if unbreakable else ())
            if not text.strip():  # to the engine as it is: it answers an empty text with its prefix, or ""
                out.parts.append(SentencePart(i, 0, len(text), mask(text, [])))
                continue
            for start, end in self.sentences(text, whole):
                out.tally.sentences += 1
                keep = [(a - start, b - start) for a, b in whole if start <= a and b <= end]
                pieces = cut_long(text[start:end], fits, keep)
                out.tally.cut += len(pieces) > 1
                for a, b in pieces:
                    inside = [dataclasses.replace(s, start=s.start - start - a, end=s.end - start - a)
                              for s in spans if start + a <= s.start and s.end <= start + b]
                    held = tuple(e for (s, t), e in terms.items() if start + a <= s and t <= start + b)
                    out.parts.append(self._part(i, text, start + a, start + b, inside, fold, held))
        return out

    def _part(self, index: int, text: str, start: int, end: int, spans: list[Span], fold: bool,
              terms: tuple[Entry, ...] = ()) -> SentencePart:
        """One part, masked (no stand-in a word of its glossary entries' target terms). A part with spans
        in ALL CAPS or lowercase is folded to sentence case here, as the engine would fold it, but with its
        stand-ins in the case the model knows them in (the engine then sees mixed case and leaves it be);
        the engine folds any other part itself."""
        sentence = text[start:end]
        case = one_case(blanked(sentence, spans)) if fold and spans else None
        folded = sentence_case(sentence) if case else sentence
        if len(folded) != len(sentence):  # a character whose case has another length: leave it as is
            case, folded = None, sentence
        masked = mask(folded, spans, typed=sentence, avoid=[e.target for e in terms])
        return SentencePart(index, start, end, masked, case, terms)

    def _fits(self) -> Callable[[str], bool]:
        limit = self.max_tokens

        def fits(text: str) -> bool:
            return len(self.engine.vocab.encode_src([text])[0]) <= limit
        return fits

    # -- parts through the engine ---------------------------------------------------------------------
    def translate_nbest(self, texts: list[str], prefixes: list[str] | None = None,
                        return_attention: bool = False, glossary: Glossary | None = None,
                        **options: Any) -> list[list[Translation]]:
        """Each text's n-best list, as the engine's `translate_nbest` gives one per sentence (with
        `glossary`, else the engine's). Attention maps are of one sentence: asked for, the texts go to the
        engine whole."""
        if return_attention:
            return self.engine.translate_nbest(texts, return_attention=True, prefixes=prefixes,
                                               glossary=glossary, **options)
        return self.translate_runs(texts, prefixes=prefixes, glossary=glossary, **options)

    def translate_runs(self, texts: Sequence[str], given: Sequence[Ranges] | None = None,
                       unbreakable: Sequence[Ranges] | None = None, prefixes: list[str] | None = None,
                       glossary: Glossary | None = None, **options: Any) -> list[list[Translation]]:
        """translate_nbest of texts with ranges of their own to keep (`given`) and not to split
        (`unbreakable`): the runs of a document."""
        settings = {k: v for k, v in options.items() if k in _DECODING}  # not should_stop, tgt_lang
        fold = self.engine.decoding_options(**settings).input_case == "fold"
        glossary = glossary or self.engine.glossary
        prepared = self.prepare(texts, given, unbreakable, fold=fold, glossary=glossary)
        results = self.translate_parts(prepared.parts, prefixes, with_terms=glossary is not None, **options)
        self.tally.add(prepared.tally)
        self.tally.add(results.tally)
        return results.joined(texts)

    def translate_documents(self, sources: Sequence[str], fmt: str, names: Sequence[str],
                            glossary: Glossary | None = None, **options: Any) -> list[str]:
        """Each document (Markdown, HTML, subtitles, plain text) translated, its structure as it was: the
        runs of all of them in one batch, those with inline markup with word alignments (their marks are
        projected through them)."""
        docs = [read_document(source, fmt, name) for source, name in zip(sources, names)]
        runs = [r for d in docs for r in d.runs]
        texts = [_one_line(r.text) for r in runs]
        done: dict[int, Translation] = {}
        for align in (True, False):
            group = [k for k, r in enumerate(runs) if bool(r.marks) == align]
            if group:
                nbest = self.translate_runs([texts[k] for k in group], [runs[k].keep for k in group],
                                            [[(m.start, m.end) for m in runs[k].marks] for k in group],
                                            alignment=align or None, aligned=1, glossary=glossary,
                                            **options)
                done.update({k: n[0] for k, n in zip(group, nbest)})
        out, k = [], 0
        for doc in docs:
            texts = [rendered(run, done[k + j], doc) for j, run in enumerate(doc.runs)]
            k += len(texts)
            out.append(doc.render(texts))
        return out

    def translate_parts(self, parts: list[SentencePart], prefixes: list[str] | None = None,
                        with_terms: bool = False, **options: Any) -> PartResults:
        """Every part's n-best list, spans restored (a part whose stand-in was dropped tried once more with
        other stand-ins). A text's prefix starts its first part's translation. `with_terms`: a glossary is
        on, each part searched with its own entries (and each translation says how they fared)."""
        starts = None
        if prefixes is not None:
            first = {p.text: k for k, p in reversed(list(enumerate(parts)))}
            starts = [prefixes[p.text] if first[p.text] == k else "" for k, p in enumerate(parts)]
        terms = [list(p.terms) for p in parts] if with_terms else None
        found = self.engine.translate_nbest([p.masked.text for p in parts], prefixes=starts, terms=terms,
                                            **options)
        retry = [k for k, p in enumerate(parts) if missing(p.masked, _cased(p, found[k][0].text))]
        tally = Tally()
        if retry:
            again = [dataclasses.replace(parts[k], masked=_remasked(parts[k].masked)) for k in retry]
            second = self.engine.translate_nbest([p.masked.text for p in again],
                                                 prefixes=[starts[k] for k in retry] if starts else None,
                                                 terms=[terms[k] for k in retry] if terms else None,
                                                 **options)
            for k, part, nbest in zip(retry, again, second):
                before = len(missing(parts[k].masked, _cased(parts[k], found[k][0].text)))
                after = len(missing(part.masked, _cased(part, nbest[0].text)))
                if after < before:
                    parts[k], found[k] = part, nbest
                    tally.retried += before - after
        results = PartResults(parts, [], [], tally)
        for part, nbest in zip(parts, found):
            tally.terms_met += sum(u.status == "met" for u in nbest[0].terms or ())
            tally.terms_refused += sum(u.status == "refused" for u in nbest[0].terms or ())
            rewrites = []
            for h in nbest:
                rewrite, placed = unmask(part.masked, _cased(part, h.text))
                rewrites.append(rewrite)
                tally.placed += placed if h is nbest[0] else 0
            results.nbest.append(nbest)
            results.unmasked.append(rewrites)
        return results


@dataclass
class PartResults:
    """Each part (as last translated), its n-best list as the engine gave it, and each hypothesis with
    its spans restored (the rewrite from the model's text to the restored one); what restoring took."""

    parts: list[SentencePart]
    nbest: list[list[Translation]]
    unmasked: list[list[Rewrite]]
    tally: Tally

    def by_text(self, n_texts: int) -> list[list[int]]:
        """The indices of each text's parts, in order."""
        grouped: list[list[int]] = [[] for _ in range(n_texts)]
        for k, part in enumerate(self.parts):
            grouped[part.text].append(k)
        return grouped

    def joined(self, texts: Sequence[str]) -> list[list[Translation]]:
        """Each text's n-best list: its parts' hypotheses put back between its separators, rank by rank."""
        out = []
        for text, ks in zip(texts, self.by_text(len(texts))):
            pieces = [PartTranslation(self.parts[k].start, self.parts[k].end, self.parts[k].masked.rewrite,
                                      self.nbest[k], self.unmasked[k]) for k in ks]
            out.append(joined(text, pieces))
        return out


def _one_line(text: str) -> str:
    """A document run's text with its line breaks as spaces (the same length, so its marks stay where
    they are): inside a paragraph or a cue, a source's line break ends no sentence."""
    return text.translate(_BREAKS)


_BREAKS = str.maketrans({"\n": " ", "\r": " ", "\t": " ", "\f": " ", "\v": " "})


def _cased(part: SentencePart, text: str) -> str:
    """A part's translation in the case its source was typed in."""
    return CASES[part.case](text) if part.case else text


def _remasked(masked: Masked) -> Masked:
    """The same sentence masked with the next stand-ins of each span's pool."""
    again = mask(masked.rewrite.old, masked.spans, attempt=1, avoid=masked.avoid)
    return dataclasses.replace(again, originals=masked.originals)
