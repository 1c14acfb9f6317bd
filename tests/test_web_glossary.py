"""The page's glossary (interop/web_glossary.mjs, web_search.mjs, and the glossary in web_documents.mjs)
against Python's, run by node's V8, the engine of Chromium: source terms found where `Glossary.find` finds
them (every letter in any case as Python's `re` matches it), pasted lines read as `Glossary.read` reads
them, greedy search with terms writing `bank_greedy_search`'s tokens for a model both can run, and the
documents layer leaving a term unmasked and whole. Skipped without node (it comes with npm)."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.nn as nn

from tests.conftest import missing
from tests.test_glossary_use import TermEcho
from tests.test_search import BOS, EOS, PAD
from transformer_mt.config import DocumentConfig
from transformer_mt.decoding.beam import bank_greedy_search
from transformer_mt.decoding.constraints import Constraints, WordEdges, sentence_terms
from transformer_mt.decoding.glossary import Entry, Glossary, holds_term
from transformer_mt.decoding.search import max_output_length
from transformer_mt.decoding.text_translator import Translation
from transformer_mt.documents.pipeline import DocumentTranslator
from transformer_mt.documents.sentences import cut_long
from transformer_mt.errors import DataError
from transformer_mt.interop.web import DOCUMENTS_JS, GLOSSARY_JS, SEARCH_JS, _bits, page_glossary
from transformer_mt.interop.web_rules import glossary_rules, page_rules

DRIVER = Path(__file__).with_name("web_glossary_driver.mjs")
FIRST = 4  # the first ordinary token


def run_node(**parts: Any) -> Any:
    """The driver's answers to a job of `parts` (the others empty)."""
    node = shutil.which("node")
    if node is None:
        missing("no node: these tests run the page's JavaScript with it (apt-get install npm brings it)")
    job = {"glossary": {**glossary_rules(), "ordinary": FIRST}, "rules": page_rules(), "find": [],
           "letters": [], "text": "", "read": [], "holds": [], "search": [],
           "fit": [], "variants": [], "edges": [], "translate": [], "bos": BOS, "eos": EOS,
           "banned": [PAD, BOS], "positions": 64, **parts}
    modules = [m.as_uri() for m in (GLOSSARY_JS, SEARCH_JS, DOCUMENTS_JS)]
    done = subprocess.run([node, str(DRIVER), *modules], input=json.dumps(job), capture_output=True,
                          text=True, check=False, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def entries(glossary: Glossary) -> list[dict[str, Any]]:
    return [{"source": e.source, "target": e.target, "line": e.line} for e in glossary.entries]


# -- source terms ----------------------------------------------------------------------------------------
PAIRS = [("printer", "imprimante"), ("laser printer", "imprimante laser"), ("printer cartridge", "cartouche"),
         ("Wi-Fi", "wifi"), ("iOS", "iOS"), ("straße", "rue"), ("New  York", "New York"), ("C++", "C++"),
         ("état", "state"), ("İstanbul", "Istanbul"), ("a.b", "ab"), ("x", "y"), ("Kelvin", "K"),
         ("σοφία", "sagesse")]
TEXTS = ["My laser printer is broken; the printer cartridge too.", "LASER PRINTER and Printer and pRINTER",
         "wi-Fi, WI-FI, Wi-Fi! wifi", "IOS or iOS or ios", "STRASSE, Straße, STRAẞE, straße",
         "New York and New\u00a0York and New\nYork and NewYork", "C++ c++ C++11", "État, ÉTAT, etat",
         "İstanbul istanbul", "a.b a-b aXb", "x xx x_ x1 x-y", "printers printer's laser  printer cartridge",
         "😀printer😀 printer", "\u212aelvin KELVIN kelvin", "ΣΟΦΊΑ σοφία Σοφία", ""]


def test_the_page_finds_the_source_terms_glossary_find_finds() -> None:
    glossary = Glossary.of(PAIRS)
    answer = run_node(find=[{"entries": entries(glossary), "texts": TEXTS}])["found"][0]
    for text, found in zip(TEXTS, answer, strict=True):
        assert found == [[m.start, m.end, m.entry.source] for m in glossary.find(text)], text
    assert answer[0] == [[3, 16, "laser printer"], [32, 49, "printer cartridge"]]


def test_each_letter_matches_in_any_case_what_pythons_re_matches() -> None:
    """Every character with a case, as a one-letter term, in a text of all of them: found where Python's
    Glossary finds it (its `re` ignoring case by lowercase and a table of its own, not by Unicode's case
    folding as JavaScript's `i` flag)."""
    letters = [chr(c) for c in range(sys.maxunicode + 1)
               if not 0xD800 <= c <= 0xDFFF and (chr(c).lower() != chr(c) or chr(c).upper() != chr(c))]
    text = " ".join(letters)
    answer = run_node(letters=letters, text=text)["letters"]
    for letter, found in zip(letters, answer, strict=True):
        assert found == [m.start for m in Glossary([Entry(letter, "x", 1)]).find(text)], hex(ord(letter))
    assert sum(len(f) > 1 for f in answer) > 1000 and len(answer[letters.index("k")]) == 3  # k K, Kelvin


def test_pasted_lines_are_read_as_a_glossary_file_is(tmp_path: Path) -> None:
    texts = ["printer\timprimante\n\n# a note\n  laser   printer \t imprimante laser\r\nWi-Fi\twifi\r",
             "one\tun\nno tab here", "a\tb\tc", "\tb", "a\t ", "a\tb\na\tc", "it's\tb\nit's\tc\\d",
             "a\tb\na\tb", "\ufeffa\tb"]
    answer = run_node(read=texts)["read"]
    for text, found in zip(texts, answer, strict=True):
        path = tmp_path / "pasted"
        path.write_text(text, encoding="utf-8", newline="")
        try:
            expected: Any = [{"source": e.source, "target": e.target, "line": e.line}
                             for e in Glossary.read(path).entries]
        except DataError as ex:
            expected = str(ex).replace(str(path), "pasted")
        assert found == expected, text


def test_a_term_is_held_by_a_translation_as_holds_term_says() -> None:
    cases = [("Il a une imprimante.", "imprimante"), ("IMPRIMANTE!", "imprimante"),
             ("imprimantes", "imprimante"), ("le Wi-Fi", "Wi-Fi"), ("LE WI-FI", "Wi-Fi"),
             ("de New  York", "New York"), ("STRASSE", "straße"),
             ("\u212aelvin", "kelvin"), ("x_imprimante", "imprimante")]
    answer = run_node(holds=[list(c) for c in cases])["holds"]
    assert answer == [holds_term(text, target) for text, target in cases]
    assert answer.count(True) == 6


def test_a_pasted_target_term_the_model_cannot_write_is_refused_in_one_line() -> None:
    """Variants as term_variants makes them (after a space, glued, capitalised; none holding another),
    with a tokenizer of a token a character: a term longer than the positions, or with a token the
    vocabulary lacks, is refused in the words an engine refuses one with."""
    answer = run_node(variants=[["chat", 10], ["chat", 4], ["chüt", 10], ["Chat", 10]])["variants"]
    ids = {c: ord(c) % 40 + 4 for c in "chatC "}
    assert answer[0] == [[ids[c] for c in "chat"], [ids[c] for c in "Chat"]]
    assert answer[1] == ("pasted: line 2: the target term takes 4 tokens; this model writes at most 3: "
                         "shorten it")
    assert answer[2] == ("pasted: line 2: this model's vocabulary cannot write the target term 'chüt' (a "
                         "word or character it never saw); spell it with words the model knows or drop the "
                         "line")
    assert answer[3] == [[ids[c] for c in "Chat"]]


# -- greedy search with terms ----------------------------------------------------------------------------
class HistoryModel(nn.Module):
    """Stub with Transformer's encode/decode (without a cache): float32 logits of the next token, the sum
    of a table by the last token, one by the token before it and one by the position, so that rows
    reordered wrongly, or scored by another prefix, write other tokens."""

    def __init__(self, seed: int, vocab: int = 11, period: int = 5) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.last, self.before, self.at = (torch.randn(n, vocab, generator=g) * 2.5
                                           for n in (vocab, vocab, period))
        self.config = SimpleNamespace(max_positions=64)
        self.pad_id = PAD

    def encode(self, src: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.zeros(*src.shape, 1), src == PAD

    def decode(self, tgt: torch.Tensor, memory: torch.Tensor, src_pad_mask: torch.Tensor, cache: Any = None,
               need_attention: bool = False) -> torch.Tensor:
        assert cache is None and not need_attention
        before = torch.cat((tgt[:, :1], tgt[:, :-1]), 1)
        return self.last[tgt] + self.before[before] + self.at[torch.arange(tgt.size(1)) % self.at.size(0)]

    def tables(self) -> dict[str, list[list[float]]]:
        return {"last": self.last.tolist(), "before": self.before.tolist(), "at": self.at.tolist()}


def random_case(seed: int) -> dict[str, Any]:
    """A model, a source length, 1-3 terms of 1-2 variants of 1-3 tokens (overlapping ones often), and
    word edges for two cases in three (which tokens glue to a word before them, which end inside one)."""
    rng = random.Random(seed)
    model = HistoryModel(seed)
    vocab = model.last.size(0)
    pool = list(range(FIRST, vocab)) if seed % 2 else [FIRST, FIRST + 1, FIRST + 2]
    terms = [[[rng.choice(pool) for _ in range(rng.randint(1, 3))] for _ in range(rng.randint(1, 2))]
             for _ in range(rng.randint(1, 3))]
    edges = None
    if seed % 3:
        flags = [[v >= FIRST and rng.random() < 0.5 for v in range(vocab)] for _ in range(2)]
        edges = WordEdges(torch.tensor(flags[0]), torch.tensor(flags[1]))
    return {"model": model, "length": rng.randint(2, 7), "terms": terms, "b": rng.choice([1, 2, 5]),
            "edges": edges}


def test_the_pages_search_writes_bank_greedy_searchs_tokens() -> None:
    """90 models and sentences, one to three terms each, with word edges and without: the page's port of
    greedy search with terms and Python's bank_greedy_search write the same tokens, with the same score,
    or both find no output (a sentence whose terms cannot be written as words in its limit)."""
    cases = [random_case(seed) for seed in range(90)]
    expected = []
    for case in cases:
        src = torch.tensor([[FIRST] * (case["length"] - 1) + [EOS]])
        c = Constraints.build([case["terms"]], torch.device("cpu"), case["edges"])
        hyps = bank_greedy_search(case["model"], src, c, bos_id=BOS, eos_id=EOS, max_len_a=1.0,
                                  max_len_b=case["b"], use_cache=False)
        expected.append([hyps[0][0].tokens, hyps[0][0].score] if hyps[0] else None)
    search = [{"tables": c["model"].tables(), "terms": c["terms"],
               "maxLen": max_output_length(c["length"], 1.0, c["b"], 64),
               "edges": c["edges"] and {"glues": _bits(c["edges"].glues.tolist()),
                                        "ends": _bits(c["edges"].ends.tolist())}} for c in cases]
    answer = run_node(search=search)["searched"]
    for case, found, best in zip(cases, answer, expected, strict=True):
        assert (found is None) == (best is None), case["terms"]
        if best is not None:
            assert found[0] == best[0], (case["terms"], case["edges"])
            assert found[1] == pytest.approx(best[1], abs=1e-5)
    assert sum(b is not None for b in expected) > 80
    terms_first = sum(b[0][:len(v)] == v for b, c in zip(expected, cases) if b for v in c["terms"][0])
    assert terms_first < len(cases)  # the terms are not simply written first: the banks decide


def test_the_terms_a_sentence_is_searched_with_are_pythons() -> None:
    """Each target term once, as many as the room holds, the others refused (each entry of theirs)."""
    rng = random.Random(3)
    jobs = []
    for _ in range(40):
        targets = [f"t{rng.randint(0, 3)}" for _ in range(rng.randint(1, 5))]
        ids = {t: [[FIRST] * rng.randint(1, 4) for _ in range(rng.randint(0, 2))] for t in targets}
        entries = [{"source": f"s{k}", "target": t, "variants": ids[t]} for k, t in enumerate(targets)]
        jobs.append([entries, rng.randint(0, 9)])
    answer = run_node(fit=jobs)["fitted"]
    for (entries, room), found in zip(jobs, answer, strict=True):
        ids = {e["target"]: e["variants"] for e in entries}
        sentence = [Entry(e["source"], e["target"]) for e in entries]
        terms, refused = sentence_terms(sentence, ids.__getitem__, room)
        assert found["terms"] == terms
        assert [[e["source"], e["reason"]] for e in found["refused"]] == [[u.source, u.reason]
                                                                           for u in refused]


def test_the_word_edges_the_export_writes_are_read_back_in_the_page() -> None:
    rng = random.Random(5)
    flags = [[rng.random() < 0.4 for _ in range(37)] for _ in range(2)]
    answer = run_node(edges=[{"bits": {"glues": _bits(flags[0]), "ends": _bits(flags[1])}, "n": 37}])["edges"]
    assert answer[0] == [[int(g), int(e)] for g, e in zip(*flags, strict=True)]


# -- the documents layer with a glossary -----------------------------------------------------------------
GLOSSED = Glossary.of([("windows 10", "Windows 10"), ("Mr. Smith", "M. Smith"), ("deadline", "Boston date"),
                       ("long phrase term", "terme")])


class TermDrop(TermEcho):
    """TermEcho (each sentence written back, its terms' targets after it) leaving out the words of `drops`:
    a stand-in dropped once, or always."""

    def __init__(self, drops: list[str], max_tokens: int) -> None:
        super().__init__(max_tokens)
        self.drops = drops

    def search_nbest(self, sentences: list[str], *args: Any, **options: Any) -> list[list[Translation]]:
        kept = [" ".join(w for w in s.split(" ") if w not in self.drops) for s in sentences]
        found = super().search_nbest(kept, *args, **options)
        self.calls[-1] = (list(sentences), self.calls[-1][1])  # what it was given
        return found


def test_texts_with_a_glossary_come_through_as_through_document_translator() -> None:
    """A number inside a term stays for the model to read (the others get stand-ins), no sentence ends
    ("Mr. Smith") and no long sentence is cut inside a term, no stand-in is a word of a target term, a
    second try keeps the terms, and the terms are counted: as DocumentTranslator does it, with an engine
    that writes each sentence back with its terms' targets."""
    long = "one two three four long phrase term five six seven eight nine ten"
    texts = ["I use windows 10 at 10:30 today. Mr. Smith came.", "The deadline is at 9:00.", long,
             "THE DEADLINE FOR WINDOWS 10 IS AT 10:30."]
    cases = [{"texts": texts, "entries": entries(GLOSSED), "drops": drops, "fold": fold, "limit": 7}
             for drops in ([], ["Boston"]) for fold in (True, False)]
    answer = run_node(translate=cases)["translated"]
    for case, found in zip(cases, answer, strict=True):
        engine = TermDrop(case["drops"], 7)
        docs = DocumentTranslator.for_engine(engine, DocumentConfig())
        folded = "fold" if case["fold"] else "model"
        expected = docs.translate_nbest(texts, glossary=GLOSSED, input_case=folded)
        assert found["translations"] == [n[0].text for n in expected], case
        fields = ("sentences", "cut", "spans", "retried", "placed", "terms", "terms_met", "terms_refused")
        assert [found[k] for k in fields] == [getattr(docs.tally, k) for k in fields], case
        first, _ = engine.calls[0]
        assert [text for text, _ in found["given"][0]] == first
    plain, dropped = answer[1], answer[3]  # without folding
    assert plain["given"][0][:3] == [["I use windows 10 at Boston today.", ["windows 10"]],
                                     ["Mr. Smith came.", ["Mr. Smith"]],
                                     ["The deadline is at Tokyo.", ["deadline"]]]  # Boston: in "Boston date"
    pieces = [text for text, _ in plain["given"][0][3:5]]
    unkept = [long[a:b] for a, b in cut_long(long, lambda t: len(t.split()) <= 7)]  # without the glossary
    assert unkept[0].endswith("phrase") and pieces == ["one two three four long phrase term",
                                                       "five six seven eight nine ten"]
    assert [plain["terms"], plain["terms_met"]] == [6, 6] and plain["spans"] == 3
    assert dropped["given"][1][0] == ["I use windows 10 at Tokyo today.", ["windows 10"]]  # the second try
    assert dropped["retried"] >= 1


def test_the_export_writes_the_glossarys_entries_and_refuses_a_term_it_cannot_write(tmp_path: Path) -> None:
    from transformer_mt.config import TokenizerConfig
    from transformer_mt.data.tokenizer import train_tokenizers
    from transformer_mt.decoding.constraints import term_variants

    words = ["the printer is here", "une imprimante laser", "le chat noir"] * 20
    vocab = train_tokenizers(TokenizerConfig(kind="bpe", vocab_size=300, min_frequency=1), words, words)
    path = tmp_path / "terms.tsv"
    path.write_text("printer\tchat noir\nlaser printer\tmachine à laver\n", encoding="utf-8")
    written = page_glossary(path, vocab, 64)
    assert written["entries"] == [{"source": e.source, "target": e.target, "line": e.line,
                                   "variants": term_variants(vocab, e.target)}
                                  for e in Glossary.read(path).entries]
    assert written["entries"][0]["source"] == "laser printer" and written["ordinary"] == FIRST
    edges = WordEdges.of(vocab)
    assert written["edges"] == {"glues": _bits(edges.glues.tolist()), "ends": _bits(edges.ends.tolist())}
    with pytest.raises(DataError, match=r"terms.tsv: line 2: the target term takes \d+ tokens; this model "
                                        r"writes at most 2: shorten it$"):
        page_glossary(path, vocab, 3)
    assert page_glossary(None, vocab, 64)["entries"] == []


def test_a_glossary_for_another_format_than_the_page_is_refused_in_one_line() -> None:
    from transformer_mt.config import ConfigError, ExportConfig, validate

    validate(ExportConfig(checkpoint="run", format="web", glossary="terms.tsv"))
    for fmt in ("ct2", "hf", "onnx"):
        with pytest.raises(ConfigError, match=f"^glossary= goes into the page of format=web; format={fmt} "
                                              "writes a model, which takes a glossary where it translates"):
            validate(ExportConfig(checkpoint="run", format=fmt, glossary="terms.tsv"))
