"""The documents layer's core: protected spans found, masked and restored; sentences translated in one
batch and joined back around their separators; alignments carried through; checked against an echoing
engine (whose exact output is known) and against the real engine translating each sentence alone."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from transformer_mt.config import DecodingConfig, DocumentConfig
from transformer_mt.decoding.text_translator import TextTranslator, Translation
from transformer_mt.documents.masking import STAND_INS, mask, unmask
from transformer_mt.documents.pipeline import DocumentTranslator
from transformer_mt.documents.rewrite import Edit, Rewrite
from transformer_mt.documents.spans import find_spans, read_terms
from transformer_mt.errors import DataError

SPANS = [  # (text, the spans it holds, by kind)
    ("My phone number is 0585738843.", [("number", "0585738843")]),
    ("Send the report to anna7@mail.com tomorrow.", [("email", "anna7@mail.com")]),
    ("See https://example.com/a_b?x=1. Then go.", [("url", "https://example.com/a_b?x=1")]),
    ("Visit example.org today.", [("url", "example.org")]),
    ("It costs $12.99, or 45 € in Paris.", [("price", "$12.99"), ("price", "45 €")]),
    ("The train leaves at 10:30 pm.", [("time", "10:30 pm")]),
    ("I was born in 1990.", [("year", "1990")]),
    ("Your order code is AB-1234 and X7K9P2.", [("code", "AB-1234"), ("code", "X7K9P2")]),
    ("Open /home/anna/report.pdf or C:\\Users\\anna\\a.txt now.",
     [("path", "/home/anna/report.pdf"), ("path", "C:\\Users\\anna\\a.txt")]),
    ("Call +33 6 12 34 56 78 or 058-573-8843.",
     [("number", "+33 6 12 34 56 78"), ("number", "058-573-8843")]),
    ("He came 2nd of 1,250 runners, e.g. 3.5 km.", [("number", "1,250"), ("number", "3.5")]),
    ("Tom is here.", []),
]


@pytest.mark.parametrize(("text", "expected"), SPANS, ids=[t for t, _ in SPANS])
def test_each_kind_of_span_is_found_whole(text: str, expected: list[tuple[str, str]]) -> None:
    assert [(s.kind, s.of(text)) for s in find_spans(text)] == expected


def test_terms_and_given_ranges_come_first_and_spans_never_overlap() -> None:
    text = "Ask Acme Corp 2000 about `x = 1` at acme.com."
    given_range = (text.index("`"), text.index("`", text.index("`") + 1) + 1)
    found = [(s.kind, s.of(text)) for s in find_spans(text, ("Acme Corp 2000", "Acme"), [given_range])]
    assert found == [("term", "Acme Corp 2000"), ("markup", "`x = 1`"), ("url", "acme.com")]


KNOWN = frozenset("i met tom and at the is waiting for you station car in o jean paris write".split())


@pytest.mark.parametrize(("text", "names"), [
    ("Yusuf is waiting for you at the station.", ["Yusuf"]),
    ("I met Tom and Jean-Luc in Paris.", ["Jean-Luc"]),  # one unknown part makes a hyphenated name
    ("Yusuf's car is in O'Brien.", ["Yusuf", "Brien"]),  # an apostrophe ends a name
    ("YUSUF IS WAITING.", ["YUSUF"]),
    ("yusuf is waiting.", []),  # not capitalised: a word to translate, misspelt perhaps
    ("Write to Yusuf@mail.com at /home/Yusuf.", []),  # inside an address or a path: theirs
    ("I met José María and Yusuf  Ali in Paris.", ["José María", "Yusuf", "Ali"]),  # one space: one name
    ("I met Tom Yusuf Ali.", ["Yusuf Ali"]),
])
def test_a_capitalised_word_no_training_pair_held_is_a_name(text: str, names: list[str]) -> None:
    assert [s.of(text) for s in find_spans(text, known=KNOWN) if s.kind == "name"] == names
    assert not any(s.kind == "name" for s in find_spans(text))  # no word list: no names


@given(st.text(alphabet=st.sampled_from("ab1 .:/@-$€,X\n"), max_size=60))
@settings(max_examples=200, deadline=None)
def test_spans_are_ordered_and_disjoint(text: str) -> None:
    spans = find_spans(text, ("ab",))
    assert all(a.end <= b.start for a, b in zip(spans, spans[1:]))
    assert all(0 <= s.start < s.end <= len(text) for s in spans)


def _brute(old: str, edits: list[Edit]) -> list[tuple[int, int]]:
    """Where each character of `old` goes, by walking the edits one character at a time."""
    out, at = [], 0
    for i in range(len(old)):
        inside = [e for e in edits if e.start <= i < e.end]
        before = sum(len(e.new) - (e.end - e.start) for e in edits if e.end <= i)
        if inside:
            e = inside[0]
            start = e.start + sum(len(f.new) - (f.end - f.start) for f in edits if f.end <= e.start)
            out.append((start, start + len(e.new)))
        else:
            out.append((i + before, i + before + 1))
        at += 1
    return out


@given(st.data())
@settings(max_examples=200, deadline=None)
def test_a_rewrite_maps_every_character_where_it_went(data: st.DataObject) -> None:
    old = data.draw(st.text(alphabet="abc ", min_size=1, max_size=30))
    cuts = sorted(data.draw(st.sets(st.integers(0, len(old)), max_size=6)))
    edits = [Edit(a, b, data.draw(st.text(alphabet="XY", max_size=4)))
             for a, b in zip(cuts[::2], cuts[1::2]) if b > a]
    rewrite = Rewrite.of(old, edits)
    for i, where in enumerate(_brute(old, edits)):
        assert rewrite.forward(i, i + 1) == where
    for e in edits:
        a, b = rewrite.forward(e.start, e.end)
        assert rewrite.new[a:b] == e.new and rewrite.backward(a, b) == (e.start, e.end) or a == b


@pytest.mark.parametrize(("text", "_"), SPANS, ids=[t for t, _ in SPANS])
def test_masking_then_unmasking_the_masked_text_gives_the_sentence_back(text: str, _: object) -> None:
    spans = find_spans(text)
    masked = mask(text, spans)
    assert not any(s.of(text) in masked.text for s in spans)  # the model sees none of them
    assert len(set(masked.stand_ins)) == len(spans)
    for stand_in in masked.stand_ins:  # each stand-in once, and no word the sentence already had
        assert len(re.findall(rf"(?<![\w.:]){stand_in}(?![\w]|[.:]\w)", masked.text)) == 1
    restored, placed = unmask(masked, masked.text)
    assert restored.new == text and placed == 0


def test_a_dropped_stand_in_is_placed_before_the_final_punctuation_and_counted() -> None:
    text = "My phone number is 0585738843."
    masked = mask(text, find_spans(text))
    restored, placed = unmask(masked, "Mon numéro de téléphone est .")
    assert (restored.new, placed) == ("Mon numéro de téléphone est 0585738843.", 1)
    assert STAND_INS[0] in masked.text


def test_a_list_of_terms_is_read_and_a_bad_one_refused_in_one_line(tmp_path: Path) -> None:
    terms = tmp_path / "terms.txt"
    terms.write_text("# products\nAcme Corp\n\n  transformer-mt  \n", encoding="utf-8")
    assert read_terms(str(terms)) == ("Acme Corp", "transformer-mt")
    terms.write_bytes(b"ok\n\xff\xfe\n")
    with pytest.raises(DataError, match=r"^document.keep_terms=.*line 2 is not UTF-8; save it as UTF-8$"):
        read_terms(str(terms))
    with pytest.raises(DataError, match=r"cannot read it .*; give a UTF-8 text file"):
        read_terms(str(tmp_path / "missing.txt"))


class Words:
    """A vocabulary whose tokens are words: enough for the length rule."""

    def encode_src(self, texts: list[str]) -> list[list[int]]:
        return [[0] * len(t.split()) for t in texts]


class EchoEngine(TextTranslator):
    """Translates a sentence into itself (its prefix first; a blank one into its prefix alone), one hypothesis
    per beam position up to n_best, with the identity alignment; records every call; `drop` is a word it
    leaves out every time."""

    def __init__(self, drop: str | None = None, max_tokens: int = 50) -> None:
        self.decoding = DecodingConfig(beam_size=2)
        self.vocab = Words()  # type: ignore[assignment]
        self.info: dict[str, Any] = {"config": {"dataset": {"src_lang": "en", "max_len": max_tokens}}}
        self.limit_inputs(512, None)
        self.calls: list[list[str]] = []
        self.drop = drop

    def translate_nbest(self, sentences: list[str], return_attention: bool = False,
                        prefixes: list[str] | None = None, aligned: int | None = None,
                        **options: Any) -> list[list[Translation]]:
        decoding = self.decoding_options(**options)
        self.calls.append(list(sentences))
        out = []
        for i, s in enumerate(sentences):
            text = " ".join(w for w in s.split(" ") if w != self.drop) if self.drop else s
            text = (prefixes[i] + " " if prefixes and prefixes[i] else "") + text
            text = text if s.strip() else (prefixes[i] if prefixes else "")  # as Translator answers a blank
            links = [(w, w) for w in range(len(text.split()))] if decoding.alignment else None
            out.append([Translation(text, -1.0 - k, alignment=links) for k in range(decoding.n_best)])
        return out


def test_sentences_of_every_text_go_to_the_engine_in_one_call_and_come_back_around_their_separators() -> None:
    engine = EchoEngine()
    docs = DocumentTranslator.for_engine(engine, DocumentConfig())
    texts = ["I'm proud of my family.  One of the bulls pushed the fence down. He's not home.",
             "  Call 0585738843 or write to anna7@mail.com!\n\nSee you at 10:30.  ", "", "One."]
    out = docs.translate_nbest(texts)
    assert [n[0].text for n in out] == [texts[0], texts[1], "", "One."]
    assert len(engine.calls) == 1 and len(engine.calls[0]) == 3 + 2 + 1 + 1  # the empty text as it is
    assert "0585738843" not in " ".join(engine.calls[0])
    assert [n[0].score for n in out[:1]] == [-3.0]  # three sentences' scores added up
    assert docs.tally.sentences == 6 and docs.tally.spans == 3 and docs.tally.placed == 0


def test_splitting_and_protection_turn_off() -> None:
    engine = EchoEngine()
    docs = DocumentTranslator.for_engine(engine, DocumentConfig(split=False, protect=False))
    text = "Call 0585738843. Now."
    assert docs.translate_nbest([text])[0][0].text == text and engine.calls == [[text]]


def test_a_sentence_too_long_for_the_model_is_translated_in_parts() -> None:
    engine = EchoEngine(max_tokens=6)
    docs = DocumentTranslator.for_engine(engine, DocumentConfig())
    text = "When the rain stopped, we walked to the station, and the train was late again."
    assert docs.translate_nbest([text])[0][0].text == text
    assert len(engine.calls[0]) > 1 and all(len(p.split()) <= 6 for p in engine.calls[0])
    assert docs.tally.cut == 1


def test_n_best_lists_join_rank_by_rank_and_alignments_follow_the_words() -> None:
    engine = EchoEngine()
    docs = DocumentTranslator.for_engine(engine, DocumentConfig())
    text = "Send it to anna7@mail.com now. Then call +33 6 12 34 56 78, please."
    nbest = docs.translate_nbest([text], n_best=2, alignment=True)[0]
    assert [h.text for h in nbest] == [text, text] and [h.score for h in nbest] == [-2.0, -4.0]
    words = text.split()
    phone = range(words.index("+33"), words.index("78,") + 1)  # six words the model saw as one stand-in
    expected = {(w, w) for w in range(len(words))} | {(a, b) for a in phone for b in phone}
    assert nbest[0].alignment == sorted(expected)


def test_a_prefix_starts_the_first_sentence_only() -> None:
    engine = EchoEngine()
    docs = DocumentTranslator.for_engine(engine, DocumentConfig())
    assert docs.translate_nbest(["A b. C d."], prefixes=["Z"])[0][0].text == "Z A b. C d."


def test_a_dropped_stand_in_is_retried_with_another_then_placed() -> None:
    first = STAND_INS[0]
    engine = EchoEngine(drop=first)
    docs = DocumentTranslator.for_engine(engine, DocumentConfig())
    assert docs.translate_nbest(["I have 7 cats."])[0][0].text == "I have 7 cats."
    assert len(engine.calls) == 2 and docs.tally.retried == 1 and docs.tally.placed == 0
    stubborn = EchoEngine(drop="cats.")  # drops the word after the stand-in as well: nothing to retry
    docs = DocumentTranslator.for_engine(stubborn, DocumentConfig())
    assert docs.translate_nbest(["I have 7 cats."])[0][0].text == "I have 7"


def test_text_in_all_caps_is_folded_around_its_spans_and_they_come_back_as_typed() -> None:
    engine = EchoEngine()
    docs = DocumentTranslator.for_engine(engine, DocumentConfig())
    text = "SEND THE REPORT TO ANNA7@MAIL.COM TOMORROW."
    assert docs.translate_nbest([text])[0][0].text == text
    assert engine.calls[0][0] == f"Send the report to {STAND_INS[0]} tomorrow."


@pytest.mark.parametrize(("names", "src_lang", "copied"), [
    ("auto", "en", True), ("model", "en", False), ("auto", "de", False), ("copy", "de", True)])
def test_a_name_the_model_never_met_reaches_it_as_a_stand_in_unless_the_source_capitalises_nouns(
        names: str, src_lang: str, copied: bool) -> None:
    engine = EchoEngine()
    engine.known_words = KNOWN
    engine.info["config"]["dataset"]["src_lang"] = src_lang
    docs = DocumentTranslator.for_engine(engine, DocumentConfig(names=names))
    text = "Yusuf is waiting for you at the station."
    assert docs.translate_nbest([text])[0][0].text == text
    assert engine.calls[0][0] == (text.replace("Yusuf", STAND_INS[0]) if copied else text)


@pytest.mark.parametrize("split", [True, False])
def test_the_real_engine_translates_a_line_as_it_does_its_sentences_one_by_one(tiny_engine: Any,
                                                                              split: bool) -> None:
    sentences = ["I am cold.", "Where is the station?", "Tom is sleeping."]
    docs = DocumentTranslator.for_engine(tiny_engine, DocumentConfig(split=split, protect=False))
    line = "  ".join(sentences)
    alone = [tiny_engine.translate(s) for s in sentences]
    together = docs.translate_nbest([line, sentences[1]])
    if split:
        assert together[0][0].text == "  ".join(alone)
    else:
        assert together[0][0].text == tiny_engine.translate(line)
    assert together[1][0].text == alone[1]
    batch = docs.translate_nbest(sentences)
    assert [n[0].text for n in batch] == [docs.translate_nbest([s])[0][0].text for s in sentences]


def test_options_reach_the_engine(tiny_engine: Any) -> None:
    docs = DocumentTranslator.for_engine(tiny_engine, DocumentConfig())
    beam = docs.translate_nbest(["I am cold. He is here."], beam_size=3, n_best=3)[0]
    assert len(beam) == 3
    assert beam[0].text == " ".join(tiny_engine.translate(["I am cold.", "He is here."], beam_size=3))
