"""Tests of transformer_mt.decoding.glossary (the TSV file, source matching) and of the target-term
variants of decoding.constraints (`term_variants`, `fit_terms`)."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest
import torch

from transformer_mt.config import DecodingConfig, ModelConfig, TokenizerConfig
from transformer_mt.data.tokenizer import PAD_ID, UNK_ID, train_tokenizers
from transformer_mt.decoding.constraints import fit_terms, term_variants
from transformer_mt.decoding.decode import decode_ids
from transformer_mt.decoding.glossary import Glossary
from transformer_mt.errors import DataError
from transformer_mt.model import Transformer


def write(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "terms.tsv"
    path.write_bytes(data)
    return path


# -- the file ------------------------------------------------------------------------------------------
def test_reads_pairs_skipping_blank_and_comment_lines(tmp_path: Path) -> None:
    text = ("\ufeff# printers\nprinter\timprimante\n\n   \n  # indented comment\r\n"
            "laser  printer \t imprimante laser\r\n")
    glossary = Glossary.read(write(tmp_path, text.encode("utf-8")))
    got = sorted((e.source, e.target, e.line) for e in glossary.entries)
    assert got == [("laser printer", "imprimante laser", 6), ("printer", "imprimante", 2)]
    assert len(Glossary.read(write(tmp_path, b"a\tb\na\tb\n"))) == 1  # the same pair twice is one entry


@pytest.mark.parametrize("data, line, words", [
    (b"ok\tfine\nno tab here\n", 2, "has no tab"),
    (b"a\tb\tc\n", 1, "3 tab-separated columns"),
    (b"\t\xc3\xa9t\xc3\xa9\n", 1, "empty source term"),
    (b"x\tfine\nsummer\t  \n", 2, "empty target term"),
    (b"ok\tfine\n\ncaf\xe9\tcaf\xc3\xa9\n", 3, "not valid UTF-8"),
    (b"printer\timprimante\n# c\nprinter\tprinteur\n", 3, "line 1 gave it 'imprimante'"),
])
def test_a_bad_file_is_one_line_naming_file_and_line(tmp_path: Path, data: bytes, line: int,
                                                     words: str) -> None:
    path = write(tmp_path, data)
    with pytest.raises(DataError) as info:
        Glossary.read(path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: line {line} ")
    assert words in message


def test_a_missing_file_is_a_data_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="does not exist"):
        Glossary.read(tmp_path / "none.tsv")


# -- matching ------------------------------------------------------------------------------------------
def found(glossary: Glossary, text: str) -> list[str]:
    return [text[m.start:m.end] for m in glossary.find(text)]


def test_case_rules_whole_words_and_spaces() -> None:
    g = Glossary.of([("printer", "imprimante"), ("Wi-Fi", "wifi"), ("iOS", "iOS")])
    text = "Printer, printer; PRINTER? printers imprinter printer_1"
    assert found(g, text) == ["Printer", "printer", "PRINTER"]
    assert found(g, "Wi-Fi wi-Fi WI-FI wi-fi iOS IOS ios IoS") == ["Wi-Fi", "wi-Fi", "iOS", "IOS"]
    two = Glossary.of([("laser printer", "imprimante laser")])
    assert found(two, "a laser \t printer, a laserprinter") == ["laser \t printer"]


def test_longest_first_without_overlap() -> None:
    g = Glossary.of([("printer", "imprimante"), ("laser printer", "imprimante laser"),
                     ("printer cartridge", "cartouche"), ("laser", "laser")])
    assert found(g, "the laser printer") == ["laser printer"]
    assert found(g, "the laser printer cartridge") == ["laser", "printer cartridge"]
    assert [m.entry.target for m in g.find("laser, printer")] == ["laser", "imprimante"]


WORDS = ["printer", "Printer", "PRINTER", "laser", "Laser", "ink", "inks", "Ink", "jet", "Wi-Fi", "wi-fi"]


def reference_find(entries: list[tuple[str, str]], text: str) -> list[tuple[int, int, str]]:
    """Every (start, end, source) the rules allow, by comparing each substring with each entry; then
    longest first, earliest first, no overlap. Texts here have single spaces."""
    cands = []
    for source, _ in entries:
        n = len(source)
        for start in range(len(text) - n + 1):
            piece, end = text[start:start + n], start + n
            before, after = text[start - 1:start], text[end:end + 1]
            if re.fullmatch(r"\w", before) or re.fullmatch(r"\w", after):
                continue
            if source == source.lower():
                ok = piece.lower() == source
            else:
                ok = piece[0].lower() == source[0].lower() and piece[1:] == source[1:]
            if ok:
                cands.append((start, end, source))
    taken: list[tuple[int, int, str]] = []
    for c in sorted(cands, key=lambda c: (c[0] - c[1], c[0])):
        if all(c[1] <= t[0] or t[1] <= c[0] for t in taken):
            taken.append(c)
    return sorted(taken)


def test_find_equals_a_brute_force_reference() -> None:
    rng = random.Random(0)
    sources = ["printer", "laser printer", "Ink", "ink jet", "Wi-Fi", "jet", "inks", "Laser"]
    for _ in range(300):
        entries = [(s, s.upper()) for s in rng.sample(sources, rng.randint(1, len(sources)))]
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 8)))
        text = text.replace(" ", rng.choice([" ", ", ", " (", "-"]), 1)
        got = [(m.start, m.end, m.entry.source) for m in Glossary.of(entries).find(text)]
        want = reference_find(entries, text)
        assert got == want, (entries, text)


def test_an_empty_glossary_finds_nothing() -> None:
    assert Glossary.of([]).find("anything") == []


# -- target-term variants --------------------------------------------------------------------------------
FR = ["l'imprimante laser est en panne", "Imprimante laser neuve", "une imprimante à jet d'encre",
      "cette imprimante est rapide", "le laser et l'encre", "encre noire pour imprimante"] * 5
EN = ["the laser printer is broken", "New laser printer", "an inkjet printer", "this printer is fast",
      "the laser and the ink", "black ink for printer"] * 5


@pytest.mark.parametrize("kind", ["bpe", "unigram", "wordlevel", "char"])
def test_each_variant_is_how_the_term_is_tokenised_in_context(kind: str) -> None:
    cfg = TokenizerConfig(kind=kind, vocab_size=400, min_frequency=1)
    vocab = train_tokenizers(cfg, EN, FR)
    for term in ("imprimante laser", "imprimante", "encre"):
        variants = term_variants(vocab, term)
        assert variants
        for v in variants:
            assert vocab.decode_tgt([v])[0].strip().lower() == term
        capital = term[0].upper() + term[1:]
        contexts = [f"{term} est rapide", f"cette {term} est rapide", f"{capital} est rapide"]
        if kind != "unigram":  # its pieces of a word glued to "l'" depend on the whole word (Viterbi)
            contexts.append(f"l'{term} est en panne")
        for sentence in contexts:
            ids = vocab.encode_tgt([sentence])[0]
            if UNK_ID in ids:  # a word-level vocabulary without "Encre": no variant can write it
                continue
            assert any(ids[i:i + len(v)] == v for v in variants for i in range(len(ids))), sentence


def test_a_word_the_vocabulary_lacks_has_no_variant_and_is_refused() -> None:
    vocab = train_tokenizers(TokenizerConfig(kind="wordlevel", vocab_size=100, min_frequency=1), EN, FR)
    assert term_variants(vocab, "zygomatique") == []
    kept, refused = fit_terms([[[5, 6]], [], [[7]]], room=10)
    assert kept == [0, 2] and [r.index for r in refused] == [1]
    assert "cannot write" in refused[0].reason


def test_terms_beyond_the_room_are_refused_never_dropped_silently() -> None:
    terms = [[[5, 6, 7]], [[8, 9], [10]], [[11, 12, 13, 14]], [[15]]]  # shortest: 3, 1, 4, 1
    kept, refused = fit_terms(terms, room=6)
    assert kept == [0, 1, 3]
    assert [r.index for r in refused] == [2] and "need 8 target tokens" in refused[0].reason
    assert sorted(kept + [r.index for r in refused]) == list(range(len(terms)))


@pytest.mark.parametrize("kind", ["bpe", "wordlevel"])
def test_glossary_targets_come_out_in_the_translation(kind: str) -> None:
    """From the file to the text: source terms found, their targets' variants forced through decode_ids
    (an untrained model), the decoded text holds each target term."""
    vocab = train_tokenizers(TokenizerConfig(kind=kind, vocab_size=400, min_frequency=1), EN, FR)
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=32, n_heads=4, d_ff=64, encoder_layers=1, decoder_layers=1, dropout=0.0,
                      max_positions=64)
    model = Transformer(cfg, vocab.src_vocab_size, vocab.tgt_vocab_size, PAD_ID).eval()
    pairs = [("laser printer", "imprimante laser"), ("ink", "encre"), ("printer", "imprimante")]
    glossary = Glossary.of(pairs)
    texts = ["The laser printer is broken", "Black ink for this printer", "New laser printer and ink"]
    targets = [[m.entry.target for m in glossary.find(t)] for t in texts]
    assert targets == [["imprimante laser"], ["encre", "imprimante"], ["imprimante laser", "encre"]]
    terms = [[term_variants(vocab, target) for target in row] for row in targets]
    for decoding in (DecodingConfig(beam_size=1), DecodingConfig(beam_size=3)):
        found = decode_ids(model, vocab.encode_src(texts), decoding, torch.device("cpu"), terms=terms)
        for hyps, row in zip(found, targets, strict=True):
            text = vocab.decode_tgt([hyps[0].tokens])[0].lower()
            assert all(target in text for target in row), (text, row)
