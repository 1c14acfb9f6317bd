"""Glossaries where users meet them (issue 62): `Translator` with a glossary or per-sentence terms against
the same translator without, the documents layer (terms never masked, never cut, stand-ins clear of target
words), `decoding.glossary` in `translate` and `evaluate`, and a request's own glossary in `serve`.

The tiny model would glue a forced term to a word of its own (`sssschevaux`, `serpentie`) but for the word
edges the search keeps (`constraints.WordEdges`): these tests hold it to whole words on that model."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import held_out_pairs
from transformer_mt.config import DecodingConfig, DocumentConfig, ModelConfig, TokenizerConfig
from transformer_mt.data.tokenizer import PAD_ID, SPECIAL_TOKENS, train_tokenizers
from transformer_mt.decoding.constraints import WordEdges, terms_used
from transformer_mt.decoding.decode import decode_ids
from transformer_mt.decoding.glossary import Entry, Glossary, holds_term
from transformer_mt.decoding.text_translator import TextTranslator, Translation
from transformer_mt.decoding.translator import Translator
from transformer_mt.documents.masking import STAND_INS
from transformer_mt.documents.pipeline import DocumentTranslator
from transformer_mt.errors import ConfigError, DataError
from transformer_mt.model import Transformer

WORD_CHARS = 5  # a source word this long or longer is a term; its pair's longest reference word its target


def sentence_terms(sources: list[str], references: list[str]) -> list[list[Entry]]:
    """One term a sentence: a long word of its source, and the longest word of its reference (which the
    tiny model rarely writes by itself, so the search has work to do)."""
    out = []
    for source, reference in zip(sources, references, strict=True):
        words = [w.strip(".,!?;:\"'") for w in source.split()]
        long = [w for w in words if len(w) >= WORD_CHARS and w.isalpha()]
        target = max((w.strip(".,!?;:\"'") for w in reference.split()), key=len)
        out.append([Entry(long[0], target)] if long and target.isalpha() else [])
    return out


@pytest.fixture(scope="module")
def pairs(tiny_run: Path) -> tuple[list[str], list[str], list[list[Entry]]]:
    sources, references = held_out_pairs(tiny_run, 16)
    terms = sentence_terms(sources, references)
    assert sum(map(bool, terms)) >= 10  # the fixture tests something
    return sources, references, terms


# -- the translator -------------------------------------------------------------------------------------
@pytest.mark.parametrize("beam", [1, 4])
def test_every_translation_holds_its_terms_and_says_so(tiny_engine: Translator, pairs, beam: int) -> None:
    sources, _, terms = pairs
    n_best = min(beam, 3)
    found = tiny_engine.translate_nbest(sources, terms=terms, beam_size=beam, n_best=n_best)
    plain = tiny_engine.translate_nbest(sources, beam_size=beam, n_best=n_best)
    changed = 0
    for nbest, without, entries in zip(found, plain, terms, strict=True):
        for hyp in nbest:  # the whole n-best list, not only the best
            assert all(holds_term(hyp.text, e.target) for e in entries), (hyp.text, entries)
            assert hyp.terms == [terms_used([e], [], hyp.text)[0] for e in entries]
            assert all(u.status == "met" for u in hyp.terms)
        changed += nbest[0].text != without[0].text
        if not entries:  # a sentence without a term is decoded as without a glossary (its batch's padding
            # differs, so its scores may differ in the last float bits)
            assert [h.text for h in nbest] == [h.text for h in without]
            assert [h.score for h in nbest] == pytest.approx([h.score for h in without], abs=1e-5)
    assert changed >= 5  # the terms were not already in the model's own translations
    assert all(h.terms is None for nbest in plain for h in nbest)


@pytest.mark.parametrize("beam", [1, 4])
def test_terms_decode_the_same_in_a_batch_as_one_by_one(tiny_engine: Translator, pairs, beam: int) -> None:
    sources, _, terms = pairs
    batch = tiny_engine.translate_nbest(sources, terms=terms, beam_size=beam)
    for source, entries, nbest in zip(sources, terms, batch, strict=True):
        alone = tiny_engine.translate_nbest([source], terms=[entries], beam_size=beam)[0]
        assert alone[0].text == nbest[0].text
        assert alone[0].score == pytest.approx(nbest[0].score, abs=1e-5)


def test_a_glossary_finds_terms_itself_and_leaves_other_sentences_as_they_were(tiny_engine: Translator,
                                                                               pairs) -> None:
    sources, _, terms = pairs
    k = next(i for i, t in enumerate(terms) if t)
    glossary = Glossary.of([(terms[k][0].source, terms[k][0].target)])
    holding = [i for i, s in enumerate(sources) if glossary.find(s)]
    with_glossary = tiny_engine.translate_nbest(sources, glossary=glossary)
    plain = tiny_engine.translate_nbest(sources)
    for i, (nbest, without) in enumerate(zip(with_glossary, plain, strict=True)):
        if i in holding:
            assert holds_term(nbest[0].text, terms[k][0].target)
            assert nbest[0].terms == terms_used([glossary.entries[0]], [], nbest[0].text)
        else:
            assert (nbest[0].text, nbest[0].terms) == (without[0].text, [])
            assert nbest[0].score == pytest.approx(without[0].score, abs=1e-5)
    tiny_engine.use_glossary(glossary)  # the engine's own: the same as per call
    try:
        assert [n[0].text for n in tiny_engine.translate_nbest(sources)] == [n[0].text for n in with_glossary]
    finally:
        tiny_engine.use_glossary(None)


def test_one_text_with_different_terms_is_searched_once_for_each(tiny_engine: Translator, pairs) -> None:
    sources, _, terms = pairs
    k = next(i for i, t in enumerate(terms) if t)
    twice = tiny_engine.translate_nbest([sources[k], sources[k]], terms=[terms[k], []])
    assert holds_term(twice[0][0].text, terms[k][0].target)
    assert twice[1][0].text == tiny_engine.translate_nbest([sources[k]])[0][0].text


def test_an_all_caps_sentence_keeps_its_term_in_capitals(tiny_engine: Translator, pairs) -> None:
    sources, _, terms = pairs
    k = next(i for i, t in enumerate(terms) if t)
    entry = terms[k][0]
    shouted = tiny_engine.translate_nbest([sources[k].upper()], glossary=Glossary.of([(entry.source,
                                                                                        entry.target)]))
    best = shouted[0][0]
    assert best.text == best.text.upper() and entry.target.upper() in best.text
    assert best.terms[0].status == "met" and holds_term(best.text, entry.target)


def test_a_term_too_long_for_the_model_is_refused_and_reported(tiny_engine: Translator, pairs) -> None:
    sources, _, terms = pairs
    k = next(i for i, t in enumerate(terms) if t)
    huge = Entry("endless", " ".join(["chat"] * 400))
    found = tiny_engine.translate_nbest([sources[k]], terms=[[huge, *terms[k]]])[0][0]
    refused, met = found.terms
    assert refused.status == "refused" and "tokens" in refused.reason and refused.source == "endless"
    assert met.status == "met" and holds_term(found.text, terms[k][0].target)
    with pytest.raises(DataError, match=r"terms\.tsv: line 2: the target term takes \d+ tokens"):
        tiny_engine.use_glossary(Glossary([Entry("ok", "chat", 1), Entry("endless", huge.target, 2)],
                                          "terms.tsv"))
    assert tiny_engine.glossary is None


def test_a_sentence_left_without_a_hypothesis_is_translated_without_its_terms(
        tiny_engine: Translator, pairs, monkeypatch: pytest.MonkeyPatch) -> None:
    """The search's last resort (no way to write its terms as words within its limit): the sentence is
    translated as without them, and its terms reported missing, never an empty answer."""
    import transformer_mt.decoding.translator as translator

    sources, _, terms = pairs
    k = next(i for i, t in enumerate(terms) if t)
    search = translator.decode_ids

    def lose_the_first(*args: Any, **kwargs: Any) -> list:
        found = search(*args, **kwargs)
        return [[], *found[1:]] if kwargs.get("terms") else found
    monkeypatch.setattr(translator, "decode_ids", lose_the_first)
    best = tiny_engine.translate_nbest([sources[k]], terms=[terms[k]])[0][0]
    plain = tiny_engine.translate_nbest([sources[k]])[0][0]
    assert (best.text, best.score) == (plain.text, plain.score)
    held = holds_term(plain.text, terms[k][0].target)
    assert [u.status for u in best.terms] == ["met" if held else "missing"]


def test_sampling_and_a_mismatched_list_of_terms_are_one_line_errors(tiny_engine: Translator, pairs) -> None:
    sources, _, terms = pairs
    with pytest.raises(ConfigError, match="decoding.sampling=false"):
        tiny_engine.translate_nbest(sources, terms=terms, sampling=True)
    with pytest.raises(ConfigError, match="term lists for"):
        tiny_engine.translate_nbest(sources, terms=terms[:2])


def test_a_target_term_the_vocabulary_cannot_write_is_refused_at_load() -> None:
    vocab = train_tokenizers(TokenizerConfig(kind="wordlevel", vocab_size=100, min_frequency=1),
                             ["the printer is here"] * 3, ["l' imprimante est ici"] * 3)
    cfg = ModelConfig(d_model=16, n_heads=2, d_ff=32, encoder_layers=1, decoder_layers=1, max_positions=32)
    engine = Translator(Transformer(cfg, vocab.src_vocab_size, vocab.tgt_vocab_size, PAD_ID), vocab,
                        torch.device("cpu"))
    engine.use_glossary(Glossary.of([("printer", "imprimante")]))
    with pytest.raises(DataError, match=r"g\.tsv: line 3: this model's vocabulary cannot write the target "
                                        r"term 'zygomatique'"):
        engine.use_glossary(Glossary([Entry("printer", "imprimante", 2), Entry("bone", "zygomatique", 3)],
                                     "g.tsv"))


def test_word_edges_read_from_the_vocabulary(tiny_engine: Translator) -> None:
    """Against the byte-level pieces themselves: `Ġ` marks a space before a piece, so a piece without it
    that starts with a letter glues to what precedes; a piece ends a word when its last letter is one."""
    edges = WordEdges.of(tiny_engine.vocab)
    pieces = tiny_engine.vocab.tgt_tokens_from_ids(list(range(tiny_engine.vocab.tgt_vocab_size)))
    checked = 0
    for v, piece in enumerate(pieces):
        if v < len(SPECIAL_TOKENS) or not piece.isascii() or not piece.lstrip("Ġ"):
            continue
        bare = piece.removeprefix("Ġ")
        assert bool(edges.glues[v]) == (not piece.startswith("Ġ") and (bare[0].isalnum() or bare[0] == "_"))
        assert bool(edges.ends[v]) == (bare[-1].isalnum() or bare[-1] == "_"), piece
        checked += 1
    assert checked > 200 and edges.glues.any() and (~edges.glues).any()


def test_without_word_edges_the_tiny_model_glues_terms(tiny_engine: Translator, pairs) -> None:
    """What the edges prevent: the same search without them writes terms inside longer words."""
    sources, _, terms = pairs
    ids = [tiny_engine.vocab.encode_src([s])[0] for s in sources]
    hard, _ = tiny_engine.term_ids(terms, None)
    for edges, glued in ((None, True), (tiny_engine.edges(), False)):
        found = decode_ids(tiny_engine.model, ids, DecodingConfig(beam_size=4), tiny_engine.device,
                           terms=hard, edges=edges)
        texts = tiny_engine.vocab.decode_tgt([h[0].tokens for h in found])
        inside = sum(not holds_term(t, e.target) for t, es in zip(texts, terms) for e in es)
        assert (inside > 0) == glued, texts


# -- the documents layer --------------------------------------------------------------------------------
class Words:
    def encode_src(self, texts: list[str]) -> list[list[int]]:
        return [[0] * len(t.split()) for t in texts]


class TermEcho(TextTranslator):
    """Writes each sentence back with its terms' targets after it, and records what it was given."""

    def __init__(self, max_tokens: int = 50) -> None:
        self.decoding = DecodingConfig(beam_size=2)
        self.vocab = Words()  # type: ignore[assignment]
        self.info: dict[str, Any] = {"config": {"dataset": {"src_lang": "en", "max_len": max_tokens}}}
        self.limit_inputs(512, None)
        self.calls: list[tuple[list[str], list[list[Entry]] | None]] = []

    def search_nbest(self, sentences: list[str], return_attention: bool = False, prefixes=None,
                     should_stop=None, tgt_lang=None, aligned=None, terms=None,
                     **options: Any) -> list[list[Translation]]:
        self.calls.append((list(sentences), terms))
        out = []
        for i, s in enumerate(sentences):
            text = " ".join([s, *(e.target for e in (terms[i] if terms else []))])
            out.append([Translation(text, -1.0, terms=terms_used(terms[i], [], text) if terms else None)])
        return out


def test_a_term_is_never_masked_and_its_target_never_a_stand_in() -> None:
    engine = TermEcho()
    docs = DocumentTranslator.for_engine(engine, DocumentConfig())
    glossary = Glossary.of([("model 3000", "modèle 3000"), ("the city", STAND_INS[0])])
    text = "Send the model 3000 to the city for 250 euros. Thanks."
    out = docs.translate_nbest([text], glossary=glossary)[0][0]
    (sent, terms), = engine.calls
    assert sent[0].startswith("Send the model 3000 to the city for ")  # the number in the term is not masked
    assert [[e.source for e in t] for t in terms] == [["model 3000", "the city"], []]
    assert "250" not in sent[0] and STAND_INS[0] not in sent[0]  # masked, by a stand-in not the target
    assert "250 euros" in out.text and "modèle 3000" in out.text
    assert [u.status for u in out.terms] == ["met", "met"]
    assert docs.tally.terms == 2 and docs.tally.terms_met == 2 and "2 glossary terms" in docs.summary()


def test_a_long_sentence_is_never_cut_inside_a_term() -> None:
    engine = TermEcho(max_tokens=4)
    docs = DocumentTranslator.for_engine(engine, DocumentConfig())
    text = "one two three four five six seven eight nine ten"
    for source in ("four five six", "five six seven", "six seven"):
        engine.calls.clear()
        docs.translate_nbest([text], glossary=Glossary.of([(source, "X")]))
        (parts, terms), = engine.calls
        assert sum(source in p.lower() for p in parts) == 1 and len(parts) > 2, parts
        assert [p for p, t in zip(parts, terms) if t] == [p for p in parts if source in p.lower()]


def test_terms_without_protection_and_no_terms_without_a_glossary() -> None:
    engine = TermEcho()
    DocumentTranslator.for_engine(engine, DocumentConfig(protect=False)).translate_nbest(
        ["Call 555 1234 for the model 3000."], glossary=Glossary.of([("model 3000", "modèle 3000")]))
    DocumentTranslator.for_engine(engine, DocumentConfig()).translate_nbest(["The model 3000."])
    (first, terms), (_, none) = engine.calls
    assert first == ["Call 555 1234 for the model 3000."] and terms[0][0].target == "modèle 3000"
    assert none is None


# -- the jobs -------------------------------------------------------------------------------------------
def test_translate_with_a_glossary_file(tiny_run: Path, pairs, tmp_path: Path, run_cli_here,
                                        caplog: pytest.LogCaptureFixture) -> None:
    sources, _, terms = pairs
    k = next(i for i, t in enumerate(terms) if t)
    tsv = tmp_path / "terms.tsv"
    tsv.write_text(f"# mine\n{terms[k][0].source}\t{terms[k][0].target}\n", encoding="utf-8")
    out = tmp_path / "out.txt"
    (tmp_path / "in.txt").write_text(f"{sources[k]}\n\n{sources[k].upper()}\n", encoding="utf-8")
    done = run_cli_here("translate", f"checkpoint={tiny_run}", f"input={tmp_path / 'in.txt'}",
                        f"output={out}", f"decoding.glossary={tsv}", "device=cpu")
    assert done.returncode == 0, done.stderr
    lines = out.read_text(encoding="utf-8").split("\n")
    target = terms[k][0].target
    assert holds_term(lines[0], target) and lines[1] == "" and holds_term(lines[2], target)


@pytest.mark.parametrize("data, says", [
    (b"printer imprimante\n", "line 1 has no tab"),
    (b"printer\t\n", "line 1 has an empty target term"),
    (b"printer\timprimante\n\xff\xfe\n", "UTF-8"),
])
def test_a_bad_glossary_file_is_one_line(tiny_run: Path, tmp_path: Path, run_cli_here,
                                                                data: bytes, says: str) -> None:
    tsv = tmp_path / "terms.tsv"
    tsv.write_bytes(data)
    done = run_cli_here("translate", f"checkpoint={tiny_run}", "text=Hello.", f"decoding.glossary={tsv}")
    assert done.returncode != 0 and says in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and str(tsv) in done.stderr


def test_settings_a_glossary_cannot_run_with_are_config_errors(tiny_run: Path, tmp_path: Path,
                                                               run_cli_here) -> None:
    tsv = tmp_path / "terms.tsv"
    tsv.write_text("a\tb\n", encoding="utf-8")
    done = run_cli_here("translate", f"checkpoint={tiny_run}", "text=Hello.", f"decoding.glossary={tsv}",
                        "decoding.sampling=true")
    assert done.returncode != 0 and "decoding.glossary needs beam or greedy search" in done.stderr
    done = run_cli_here("translate", f"model_dir={tmp_path}", "engine=ctranslate2", "text=Hello.",
                        f"decoding.glossary={tsv}")
    assert done.returncode != 0 and "CTranslate2 has no lexical constraints" in done.stderr


def test_evaluate_reports_how_the_terms_fared(tiny_run_copy: Path, pairs, tmp_path: Path,
                                              run_cli_here) -> None:
    sources, _, terms = pairs
    entries = {e.source: e.target for t in terms for e in t}
    tsv = tmp_path / "terms.tsv"
    tsv.write_text("".join(f"{s}\t{t}\n" for s, t in entries.items()), encoding="utf-8")
    done = run_cli_here("evaluate", f"checkpoint={tiny_run_copy}", "split=valid", "max_sentences=16",
                        f"decoding.glossary={tsv}", "decoding.beam_size=2", "device=cpu")
    assert done.returncode == 0, done.stderr
    report = json.loads(next((tiny_run_copy / "eval").glob("valid.*.json")).read_text())
    counts = report["glossary"]
    assert counts["terms"] >= 10 and counts["met"] == counts["terms"] and "glossary:" in done.stdout


def test_warnings_name_the_line_of_a_term_left_out(caplog: pytest.LogCaptureFixture) -> None:
    from transformer_mt.decoding.glossary import TermUse
    from transformer_mt.jobs.translate import warn_terms

    with caplog.at_level(logging.WARNING):
        warn_terms(7, Translation("x", 0.0, terms=[TermUse("a", "b", "met"),
                                                  TermUse("c", "d", "refused", "too long")]))
    assert [r.getMessage() for r in caplog.records] == ["line 7: glossary term 'c' -> 'd' refused: too long"]
