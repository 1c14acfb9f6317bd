"""The page's documents layer (interop/web_documents.mjs, with the rules web_rules.py writes into the page)
against Python's (documents/): run by node's V8, the engine of Chromium, the exported patterns find the
spans Python finds, each converted character class matches what Python's does on every code point, and
masking, restoring and whole texts through an engine come out as DocumentTranslator's. Skipped without
node (it comes with npm, which format=web needs)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import unicodedata
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import missing
from tests.test_documents_pipeline import EchoEngine
from transformer_mt.config import DocumentConfig
from transformer_mt.decoding.text_translator import Translation
from transformer_mt.documents.masking import STAND_INS, mask, unmask
from transformer_mt.documents.pipeline import DocumentTranslator
from transformer_mt.documents.sentences import cut_long
from transformer_mt.documents.spans import PATTERNS, Span, find_spans
from transformer_mt.interop.web import DOCUMENTS_JS
from transformer_mt.interop.web_rules import js_regex, js_source, page_rules

# Each kind, and what JavaScript reads otherwise unless converted: letters and digits beyond ASCII,
# no-break spaces inside numbers, astral characters (two UTF-16 units), brackets after a URL.
TEXTS = [
    "My phone number is 0585738843.", "Send the report to anna7@mail.com tomorrow.",
    "See https://example.com/a_b?x=1. Then go.", "Visit example.org today.",
    "It costs $12.99, or 45 € in Paris.", "The train leaves at 10:30 pm.", "I was born in 1990.",
    "Your order code is AB-1234 and X7K9P2.", "Open /home/anna/report.pdf or C:\\Users\\anna\\a.txt now.",
    "Call +33 6 12 34 56 78 or 058-573-8843.", "He came 2nd of 1,250 runners, e.g. 3.5 km.",
    "Écris à ünïcödé@exämple.de, s'il te plaît.", "Café2024 ouvre en 2024, à 9:05.",
    "Il coûte 1\u202f234,50 € ou 1\u00a0234 CHF.", "٣٤٥ ٦٧٨ ٩٠١ et ２０２４年 et ৭৮৯০.",
    "İstanbul 34 ve Straße 12, ǅemal 1999.", "😀 42 😀 anna@😀.com 7😀8",
    "(see http://a.com/b_(c)) and www.Ex-ample.COM/path).", "Fichier rapport_été.pdf, code ÉT-42, naïve-7.",
    "Le 3e, le 21st et 5ème; à 10:30\npm puis $\n30.", "x_1990_y 1990_ _2000 ABC123 abc123 A1",
]


DRIVER = Path(__file__).with_name("web_documents_driver.mjs")


def run_node(job: dict[str, Any]) -> Any:
    """The answers of node, running the page's documents module on `job` (stdin and stdout in JSON)."""
    node = shutil.which("node")
    if node is None:
        missing("no node: these tests run the page's JavaScript with it (apt-get install npm brings it)")
    done = subprocess.run([node, str(DRIVER), DOCUMENTS_JS.as_uri()],
                          input=json.dumps(job), capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def everything() -> str:
    """Every code point Python's Unicode database assigns (not a surrogate): what the classes are read on."""
    return "".join(chr(c) for c in range(sys.maxunicode + 1)
                   if not 0xD800 <= c < 0xE000 and unicodedata.category(chr(c)) != "Cn")


def test_the_exported_patterns_find_in_javascript_what_they_find_in_python() -> None:
    answer = run_node({**_empty(), "texts": TEXTS})
    for text, matches, spans in zip(TEXTS, answer["matches"], answer["spans"]):
        for (kind, pattern), found in zip(PATTERNS, matches):
            assert found == [list(m.span()) for m in pattern.finditer(text)], (kind, text)
        assert spans == [[s.kind, s.start, s.end] for s in find_spans(text)], text
    assert {s[0] for spans in answer["spans"] for s in spans} == {kind for kind, _ in PATTERNS}


def test_each_converted_class_matches_on_every_code_point_what_pythons_does() -> None:
    """\\w, \\d, \\s and \\b as Python reads them (str.isalnum() and "_", Nd, str.isspace()), on every code
    point both Unicode databases assign. Under the i flag JavaScript matches a character whose case
    folding is a letter too: only combining marks are such, and no pattern puts one next to a word."""
    chars = everything()
    names = {"w": r"\w", "d": r"\d", "s": r"\s", "b": r"\b.", "W": r"\W"}
    classes = {f"{name}{flag}": js_regex(re.compile(source, re.IGNORECASE if flag else 0))
               for name, source in names.items() for flag in ("", "i")}
    answer = run_node({**_empty(), "classes": classes, "everything": chars})["classes"]
    for name, source in names.items():
        python = {ord(m) for m in re.findall(source, chars)}
        assert set(answer[name]) == python, name
        extra = set(answer[name + "i"]) ^ python
        assert all(unicodedata.category(chr(c)) == "Mn" for c in extra), (name, sorted(extra))
    assert len(answer["w"]) > 100_000 and 0x3000 in answer["s"] and 0x0663 in answer["d"]


def test_a_pattern_javascript_cannot_read_as_python_does_is_refused() -> None:
    for source in (r"(?P<x>a)", r"(?i)a", r"(?-i:a)", r"a\Z", r"(a)\1", r"[\W]", r"a++", r"a{2}+", r"(?>a)"):
        with pytest.raises(ValueError):
            js_source(source)
    assert js_source(r"a{2}{x}[]a]\.\"") == r'a{2}\{x\}[\]a]\."'  # what only Python reads as literal


def test_masking_and_restoring_are_pythons() -> None:
    sentences = [t for t in TEXTS if find_spans(t)]
    jobs = [(t, [[s.kind, s.start, s.end] for s in find_spans(t)], attempt)
            for t in sentences for attempt in (0, 1)]
    jobs.append(("Tom and Boston and Paris at 10:30.", [["time", 28, 33]], 0))  # stand-ins the sentence holds
    translations = ["{0} est là {1}.", "Rien ici .", "Rien ici !", "Rien …", "{1} et {1}, puis {0}?", "",
                    "x{0} {0}y {0}"]
    unjobs = [(t, spans, tr) for t, spans, _ in jobs[::2] for tr in translations]
    answer = run_node({**_empty(), "mask": jobs, "unmask": unjobs})
    for (sentence, spans, attempt), found in zip(jobs, answer["masked"]):
        m = mask(sentence, [Span(a, b, kind) for kind, a, b in spans], attempt)
        assert found == [m.text, list(m.stand_ins), list(m.originals)], sentence
    for (sentence, spans, translation), found in zip(unjobs, answer["unmasked"]):
        m = mask(sentence, [Span(a, b, kind) for kind, a, b in spans])
        stand_ins = [m.stand_ins[int(k)] if int(k) < len(m.stand_ins) else "" for k in "01"]
        restored, placed = unmask(m, translation.format(*stand_ins))
        assert found == [restored.new, placed], (sentence, translation)


class Dropping(EchoEngine):
    """EchoEngine that leaves out every word of `drops`: a stand-in dropped once (tried again with the next
    of its pool) or always (placed before the final punctuation)."""

    def __init__(self, drops: list[str]) -> None:
        super().__init__()
        self.drops = drops

    def translate_nbest(self, sentences: list[str], return_attention: bool = False,
                        prefixes: list[str] | None = None, **options: Any) -> list[list[Translation]]:
        kept = [" ".join(w for w in s.split(" ") if w not in self.drops) for s in sentences]
        return super().translate_nbest(kept, return_attention, prefixes, **options)


LINES = ["I paid 30 dollars. Write to anna7@mail.com now! See you at 10:30.",
         "  Two spaces before.  Call 0585738843 or +33 6 12 34 56 78, please.\n\nA blank line above.  ",
         "HE LIVES AT 42 MAIN STREET. HIS CODE IS AB-1234.", "tom is 30 and lives at 10:30 in paris.",
         "", "   ", "One."]


def test_texts_come_through_an_engine_as_through_document_translator() -> None:
    """Split, masked, folded, retried, restored and joined alike: an echoing engine, one that drops a
    stand-in's first choice, and one that drops every choice of it."""
    cases = [{"texts": LINES, "drops": drops, "fold": fold}
             for drops in ([], [STAND_INS[0]], list(STAND_INS)) for fold in (True, False)]
    answer = run_node({**_empty(), "translate": cases, "split": LINES})
    splitter = DocumentTranslator.for_engine(EchoEngine(), DocumentConfig())
    for line, sentences in zip(LINES, answer["sentences"]):  # the browser's segmenter, here as sentencex
        assert sentences == [line[a:b] for a, b in splitter.sentences(line, [])], line
    for case, found in zip(cases, answer["translated"]):
        docs = DocumentTranslator.for_engine(Dropping(case["drops"]), DocumentConfig())
        expected = docs.translate_nbest(LINES, input_case="fold" if case["fold"] else "model")
        assert found["translations"] == [n[0].text for n in expected], case
        tally = docs.tally
        assert [found[k] for k in ("sentences", "spans", "retried", "placed")] == \
               [tally.sentences, tally.spans, tally.retried, tally.placed], case
    assert answer["translated"][0]["translations"][:4] == [line for line in LINES[:4]]
    assert answer["translated"][2]["retried"] > 0 and answer["translated"][4]["placed"] > 0


def _empty() -> dict[str, Any]:
    """A job with nothing to do but the rules."""
    return {"rules": page_rules(), "texts": [], "classes": {}, "everything": "", "mask": [], "unmask": [],
            "split": [], "translate": []}


def test_the_pages_title_is_text_whatever_the_checkpoint_calls_its_languages() -> None:
    """The title comes from the checkpoint's src_lang and tgt_lang: markup there is shown, not run, and a
    title naming the settings' placeholder does not receive them."""
    from transformer_mt.interop.web import page

    hostile = '<script>alert(1)</script> {settings} "'
    text = page(hostile, {"languages": {"src_lang": "en"}})
    assert "<script>alert(1)" not in text and "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert text.count('"src_lang": "en"') == 1 and "{settings}" in text  # the title's, shown as typed


LONG = ["When the rain stopped, we walked to the station; the train was late again, and nobody knew why.",
        "Tom said — and he meant it — that the meeting would take place at the old house near the river.",
        "Onewordthatgoesonandonwithoutanyspaceatallforaverylongtime and then two.",
        "Short one."]


def test_a_long_sentence_is_cut_in_the_page_where_python_cuts_it() -> None:
    """cut_long's halving at the clause boundary nearest the middle, else between words, else between
    characters, with a length rule of a few words (the page's counts tokens)."""
    cases = [[sentence, limit] for sentence in LONG for limit in (3, 6, 12)]
    answer = run_node({**_empty(), "cut": cases})
    for (sentence, limit), parts in zip(cases, answer["cut"]):
        expected = [sentence[a:b] for a, b in cut_long(sentence, lambda t, n=limit: len(t.split()) <= n)]
        assert parts == expected, (sentence, limit)


def test_the_page_copies_the_names_the_model_never_met_as_python_does() -> None:
    seen = {w.casefold() for text in TEXTS for w in re.findall(r"\w+", text)}  # as a checkpoint lists them
    words = sorted(seen - {"paris", "tom", "anna"}
                   | {"i", "is", "waiting", "for", "you", "at", "the", "station", "met"})
    texts = [*TEXTS, "Yusuf is waiting for you at the station.", "I met Jean-Luc and Tom in Paris.",
             "ZOË AND Ǆemal ARE HERE.", "Write to Yusuf@mail.com at /home/Yusuf.",
             "I met José María and Yusuf  Ali, Straße Jean-Luc."]
    answer = run_node({**_empty(), "words": words, "names": texts})
    for text, found in zip(texts, answer["names"]):
        expected = [[s.kind, s.start, s.end] for s in find_spans(text, known=frozenset(words))]
        assert found == expected, text
    assert ["name", 0, 5] in answer["names"][len(TEXTS)]  # Yusuf


def test_texts_with_long_sentences_and_names_come_through_as_through_document_translator() -> None:
    words = ["i", "is", "waiting", "for", "you", "at", "the", "station", "when", "rain", "stopped", "we"]
    texts = [*LONG, "Yusuf is waiting for you at the station. When the rain stopped, we walked."]
    cases = [{"texts": texts, "drops": [], "fold": True, "limit": 6}]
    answer = run_node({**_empty(), "words": words, "translate": cases})
    engine = EchoEngine(max_tokens=6)
    engine.known_words = frozenset(words)
    docs = DocumentTranslator.for_engine(engine, DocumentConfig())
    expected = docs.translate_nbest(texts)
    found = answer["translated"][0]
    assert found["translations"] == [n[0].text for n in expected]
    assert [found[k] for k in ("sentences", "cut", "spans")] == [docs.tally.sentences, docs.tally.cut,
                                                                  docs.tally.spans]
    assert found["cut"] >= 2 and found["spans"] >= 1

