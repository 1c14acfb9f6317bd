"""Tokenizer kinds: special ids, exact round trips, serialisation and robustness on any text."""

from __future__ import annotations

import unicodedata

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from transformer_mt.config import ConfigError, TokenizerConfig
from transformer_mt.config.checks import min_vocab_size
from transformer_mt.data.tokenizer import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    SPECIAL_TOKENS,
    UNK_ID,
    Vocabulary,
    train_tokenizers,
)

TRICKY = [
    "J'ai faim.",
    "l’été dernier, c’était l’œuvre d’un garçon.",
    "Où est la gare ?",
    "«  Bonjour  »",
    "Attention : œ é ç ß Æ ñ",
    "Cours\u202f! Vite\u00a0!",
    "Le chat 🐈 dort 😴.",
    "",
    "a   b  c",
    "  leading and trailing  ",
    "tab\there",
    "<eos> and <pad> are just text",
]

KINDS = ["bpe", "unigram", "wordlevel", "char"]
ENGLISH = [
    "I have a cat.", "Where is the station?", "It's summer again!", "We're going home.",
    "She reads a book in the garden.", "The weather is nice today.", "Do you speak French?",
] * 3
FRENCH = [
    "J'ai un chat.", "Où est la gare ?", "C’est encore l’été !", "Nous rentrons à la maison.",
    "Elle lit un livre dans le jardin.", "Il fait beau aujourd'hui.", "Parlez-vous français ?",
] * 3


@pytest.fixture(scope="module")
def vocabs() -> dict[str, Vocabulary]:
    """One joint vocabulary per kind, trained on a corpus that holds every tricky string."""
    out = {}
    for kind in KINDS:
        cfg = TokenizerConfig(kind=kind, vocab_size=400, min_frequency=1)
        out[kind] = train_tokenizers(cfg, ENGLISH + TRICKY, FRENCH + TRICKY)
    return out


def test_special_ids_are_fixed(vocabs: dict[str, Vocabulary]) -> None:
    assert (PAD_ID, BOS_ID, EOS_ID, UNK_ID) == (0, 1, 2, 3)
    for vocab in vocabs.values():
        for tok in (vocab.src, vocab.tgt):
            assert [tok.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3]


@pytest.mark.parametrize("kind", KINDS)
def test_round_trip_is_exact(vocabs: dict[str, Vocabulary], kind: str) -> None:
    vocab = vocabs[kind]
    ids = vocab.encode_src(TRICKY)
    assert all(UNK_ID not in seq for seq in ids)
    assert vocab.decode_src(ids) == TRICKY
    assert vocab.decode_tgt(vocab.encode_tgt(TRICKY)) == TRICKY


@pytest.mark.parametrize("kind", KINDS)
def test_no_bos_eos_added_and_specials_are_plain_text(vocabs: dict[str, Vocabulary],
                                                      kind: str) -> None:
    vocab = vocabs[kind]
    assert vocab.encode_src([""]) == [[]]
    ids = vocab.encode_src(["<eos> and <pad> are just text"])[0]
    assert EOS_ID not in ids and PAD_ID not in ids and BOS_ID not in ids


def test_decode_skips_special_tokens(vocabs: dict[str, Vocabulary]) -> None:
    vocab = vocabs["bpe"]
    ids = vocab.encode_tgt(["Où est la gare ?"])[0]
    assert vocab.decode_tgt([[BOS_ID, *ids, EOS_ID, PAD_ID, PAD_ID]]) == ["Où est la gare ?"]


def test_wordlevel_splits_words_and_punctuation(vocabs: dict[str, Vocabulary]) -> None:
    vocab = vocabs["wordlevel"]
    assert vocab.src_tokens("J'ai un chat.") == ["J", "'", "ai", "▁un", "▁chat", "."]
    # The no-break space before "!" is its own token, so "Cours" is the same word as elsewhere.
    assert vocab.src_tokens("Cours\u202f!") == ["Cours", "\u202f", "!"]


def test_wordlevel_unknown_word_becomes_unk(vocabs: dict[str, Vocabulary]) -> None:
    ids = vocabs["wordlevel"].encode_src(["I have a zebra."])[0]
    assert UNK_ID in ids


def test_display_tokens(vocabs: dict[str, Vocabulary]) -> None:
    bpe = vocabs["bpe"]
    pieces = bpe.src_tokens("Où est l’été ?", add_eos=True)
    assert pieces[-1] == "<eos>"
    assert "".join(pieces[:-1]).replace("▁", " ") == "Où est l’été ?"
    ids = bpe.encode_tgt(["C’est encore l’été !"])[0]
    shown = bpe.tgt_tokens_from_ids([BOS_ID, *ids, EOS_ID])
    assert shown[0] == "<bos>" and shown[-1] == "<eos>" and len(shown) == len(ids) + 2
    assert vocabs["char"].src_tokens("a b") == ["a", "▁", "b"]


def test_vocab_size_respected() -> None:
    for kind, size in (("bpe", 300), ("wordlevel", 20), ("char", 12)):
        vocab = train_tokenizers(TokenizerConfig(kind=kind, vocab_size=size, min_frequency=1),
                                 ENGLISH, FRENCH)
        assert vocab.src_vocab_size <= size
    bpe = train_tokenizers(TokenizerConfig(kind="bpe", vocab_size=300, min_frequency=1),
                           ENGLISH, FRENCH)
    assert bpe.src_vocab_size == 300


def test_min_frequency_prunes_rare_words() -> None:
    rare = train_tokenizers(TokenizerConfig(kind="wordlevel", vocab_size=1000, min_frequency=4),
                            ENGLISH, FRENCH)
    assert rare.src.token_to_id("▁cat") is None  # seen 3 times
    assert rare.src.token_to_id("▁chat") is None
    common = train_tokenizers(TokenizerConfig(kind="wordlevel", vocab_size=1000, min_frequency=3),
                              ENGLISH, FRENCH)
    assert common.src.token_to_id("▁cat") is not None


@pytest.mark.parametrize("kind", KINDS)
def test_vocab_too_small_is_a_config_error(kind: str) -> None:
    minimum = min_vocab_size(kind)
    expected = f"tokenizer.vocab_size={minimum - 1} is out of range; it must be >= {minimum}"
    with pytest.raises(ConfigError, match=expected):
        train_tokenizers(TokenizerConfig(kind=kind, vocab_size=minimum - 1), ENGLISH, FRENCH)
    assert min_vocab_size("bpe") == 260


def test_unknown_kind_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="tokenizer.kind"):
        train_tokenizers(TokenizerConfig(kind="sentencepiece"), ENGLISH, FRENCH)


def test_lowercase() -> None:
    vocab = train_tokenizers(TokenizerConfig(kind="bpe", vocab_size=300, lowercase=True),
                             ENGLISH, FRENCH)
    assert vocab.decode_src(vocab.encode_src(["Où Est LA Gare ?"])) == ["où est la gare ?"]


def test_nfc_normalisation() -> None:
    vocab = train_tokenizers(TokenizerConfig(kind="char", vocab_size=200, min_frequency=1),
                             ENGLISH, FRENCH)
    decomposed = unicodedata.normalize("NFD", "été")
    assert vocab.encode_src([decomposed]) == vocab.encode_src(["été"])


@pytest.mark.parametrize("kind", KINDS)
def test_joint_serialisation_round_trip(vocabs: dict[str, Vocabulary], kind: str, tmp_path) -> None:
    vocab = vocabs[kind]
    expected = vocab.encode_src(TRICKY)
    from_json = Vocabulary.from_json(vocab.to_json())
    assert from_json.joint and from_json.kind == kind
    assert from_json.encode_src(TRICKY) == expected
    assert from_json.to_json() == vocab.to_json()
    written = vocab.save(tmp_path)
    assert [p.name for p in written] == ["tokenizer.json"]
    loaded = Vocabulary.load(tmp_path)
    assert loaded.joint and loaded.kind == kind
    assert loaded.encode_tgt(TRICKY) == expected
    assert loaded.decode_tgt(expected) == vocab.decode_tgt(expected)
    # Special strings stay plain text after loading too (the flag is not in the JSON).
    assert EOS_ID not in loaded.encode_src(["<eos>"])[0]


def test_separate_vocabularies(tmp_path) -> None:
    cfg = TokenizerConfig(kind="wordlevel", vocab_size=100, joint=False, min_frequency=1)
    vocab = train_tokenizers(cfg, ENGLISH, FRENCH)
    assert not vocab.joint
    assert vocab.src.token_to_id("▁cat") is not None and vocab.tgt.token_to_id("▁cat") is None
    assert vocab.tgt.token_to_id("▁chat") is not None and vocab.src.token_to_id("▁chat") is None
    written = vocab.save(tmp_path)
    assert sorted(p.name for p in written) == ["tokenizer_src.json", "tokenizer_tgt.json"]
    for restored in (Vocabulary.load(tmp_path), Vocabulary.from_json(vocab.to_json())):
        assert not restored.joint
        assert restored.encode_src(ENGLISH) == vocab.encode_src(ENGLISH)
        assert restored.encode_tgt(FRENCH) == vocab.encode_tgt(FRENCH)
        assert (restored.src_vocab_size, restored.tgt_vocab_size) == (
            vocab.src_vocab_size, vocab.tgt_vocab_size)


def test_load_from_empty_directory_is_a_config_error(tmp_path) -> None:
    with pytest.raises(ConfigError, match="tokenizer.json"):
        Vocabulary.load(tmp_path)


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text())
def test_any_text_encodes_and_decodes(vocabs: dict[str, Vocabulary], text: str) -> None:
    for kind, vocab in vocabs.items():
        ids = vocab.encode_src([text])[0]
        assert all(0 <= i < vocab.src_vocab_size for i in ids)
        decoded = vocab.decode_src([ids])[0]
        vocab.src_tokens(text, add_eos=True)
        if kind == "bpe":  # byte-level BPE is lossless up to NFC
            assert decoded == unicodedata.normalize("NFC", text)


def test_unigram_splits_unseen_words_into_pieces(vocabs: dict[str, Vocabulary]) -> None:
    vocab = vocabs["unigram"]
    text = "readings gardened"  # neither word was seen whole, every letter was ("R" never was)
    ids = vocab.encode_src([text])[0]
    assert UNK_ID not in ids and len(ids) > 2
    assert vocab.decode_src([ids]) == [text]
