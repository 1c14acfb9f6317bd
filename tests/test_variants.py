"""Input variants (data/variants.py): what each variant writes, how often each is drawn, that only the
training pairs change and only in their text (decoded ids are the variant of the decoded original), that
an epoch is drawn the same way every time, that a tag and a mixed corpus's own settings are respected,
and that bad settings are one line."""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import transformer_mt as tmt
from tests.conftest import encoded_split, smoke_overrides, tatoeba_sample
from transformer_mt.config import ConfigError, DatasetConfig, MixedCorpus, TokenizerConfig, VariantsConfig
from transformer_mt.data import EncodedSplit
from transformer_mt.data.ahead import EpochsAhead
from transformer_mt.data.epochs import TrainingEpochs
from transformer_mt.data.languages import prefixed
from transformer_mt.data.mixture import Mixture, Part
from transformer_mt.data.text_variants import NAMES, add_typos, drop_final_punct, title_case, tokenizer_pairs
from transformer_mt.data.tokenizer import Vocabulary, train_tokenizers
from transformer_mt.data.variants import CorpusVariants, InputVariants, build, draw, shows


@pytest.fixture(scope="module")
def pairs(corpus: Path) -> list[tuple[str, str]]:
    """2,000 real Tatoeba pairs (every 50th line)."""
    return tatoeba_sample(corpus, every=50, n=2000)


@pytest.fixture(scope="module")
def vocab(pairs: list[tuple[str, str]]) -> Vocabulary:
    return train_tokenizers(TokenizerConfig(kind="bpe", vocab_size=1000), [p[0] for p in pairs],
                            [p[1] for p in pairs])


def _text(vocab: Vocabulary, split: EncodedSplit) -> list[tuple[str, str]]:
    return list(zip(vocab.decode_src(split.src_ids.tolist()), vocab.decode_tgt(split.tgt_ids.tolist())))


def _one_edit(a: str, b: str) -> bool:
    """b is a with two neighbouring letters swapped, one left out, or one doubled."""
    if len(b) == len(a):
        diff = [i for i in range(len(a)) if a[i] != b[i]]
        swapped = len(diff) == 2 and diff[1] == diff[0] + 1
        return swapped and (a[diff[0]], a[diff[1]]) == (b[diff[1]], b[diff[0]])
    short, long_ = (b, a) if len(b) < len(a) else (a, b)
    return len(long_) == len(short) + 1 and any(long_[:i] + long_[i + 1:] == short for i in range(len(long_)))


def test_each_variant_writes_what_its_name_says() -> None:
    assert title_case("don't leave l'homme au BORD-de-mer, 2 fois") == ("Don't Leave L'homme Au Bord-de-mer, "
                                                                         "2 Fois")
    assert drop_final_punct("Où est la gare ?") == "Où est la gare"
    assert drop_final_punct("Wait... what?!") == "Wait... what"
    assert drop_final_punct("Il dort.\u202f") == "Il dort"
    assert drop_final_punct("?") == "?"  # punctuation alone is kept
    assert drop_final_punct("He said \"Go!\"") == "He said \"Go!\""  # ends with a quote: nothing to drop
    text = "The meeting has been postponed until tomorrow because of the weather."
    assert add_typos(text, random.Random(1), rate=0.0) == text
    every = add_typos(text, random.Random(1), rate=1.0)
    for before, after in zip(text.split(), every.split(), strict=True):
        if len(re.sub(r"\W", "", before)) >= 4:
            assert before[0] == after[0] and _one_edit(before, after), (before, after)
        else:
            assert before == after
    assert add_typos(text, random.Random(7), rate=0.5) == add_typos(text, random.Random(7), rate=0.5)


def test_draws_follow_their_probabilities_and_a_pair_shows_one_case_at_most() -> None:
    cfg = VariantsConfig(caps=0.2, title=0.1, lower=0.3, no_punct=0.5, typos=0.05)
    rng, n = random.Random(0), 20_000
    draws = [draw(cfg, rng) for _ in range(n)]
    shown = {name: sum(1 for d in draws if d is not None and shows(d, name)) / n for name in NAMES}
    for name in NAMES:
        assert abs(shown[name] - getattr(cfg, name)) < 0.015, (name, shown[name])
    assert all(draw(VariantsConfig(), rng) is None for _ in range(100))


def test_only_the_drawn_pairs_change_and_only_as_their_variant(vocab: Vocabulary,
                                                               pairs: list[tuple[str, str]]) -> None:
    split = encoded_split(vocab, pairs)
    original = _text(vocab, split)
    wanted = VariantsConfig(caps=0.5, no_punct=0.3)
    caps = InputVariants(vocab, [CorpusVariants(0, len(split), wanted, None)], seed=1, max_len=200)
    varied, shown = caps.apply(split, epoch=0)
    assert 0.45 < shown["caps"] / len(split) < 0.55 and 0.25 < shown["no_punct"] / len(split) < 0.35
    changed = 0
    for (src, tgt), (vsrc, vtgt) in zip(original, _text(vocab, varied), strict=True):
        assert vtgt in (tgt, tgt.upper())
        assert vsrc in (src, src.upper(), drop_final_punct(src), drop_final_punct(src.upper()))
        if src != src.upper() and tgt != tgt.upper():  # ALL CAPS on both sides together, or neither
            assert (vtgt != tgt) == (vsrc not in (src, drop_final_punct(src)))
        changed += (vsrc, vtgt) != (src, tgt)
    assert changed >= shown["caps"] * 0.9
    again, _ = caps.apply(split, epoch=0)
    assert again.src_ids.tolist() == varied.src_ids.tolist()  # one epoch, one draw (resume replays it)
    other, _ = caps.apply(split, epoch=1)
    assert other.src_ids.tolist() != varied.src_ids.tolist()


def test_a_pair_too_long_once_varied_stays_as_it_was(vocab: Vocabulary, pairs: list[tuple[str, str]]) -> None:
    split = encoded_split(vocab, pairs[:200])
    longest = int(max(split.src_lens.max(), split.tgt_lens.max()))
    caps = InputVariants(vocab, [CorpusVariants(0, 200, VariantsConfig(caps=1.0), None)], 1, longest)
    varied, _ = caps.apply(split, 0)
    assert int(max(varied.src_lens.max(), varied.tgt_lens.max())) <= longest
    kept = [i for i in range(200) if varied.src_ids[i].tolist() == split.src_ids[i].tolist()]
    assert kept  # capitals cost byte-level BPE more tokens: some pairs no longer fit and are kept


def test_a_mixed_corpus_takes_its_own_variants_and_keeps_its_tag(vocab: Vocabulary,
                                                                 pairs: list[tuple[str, str]]) -> None:
    tagged = [(f"<bt> {s}", t) for s, t in pairs[100:200]]
    split = encoded_split(vocab, pairs[:100] + tagged)
    cfg = DatasetConfig(variants=VariantsConfig(), mix=[MixedCorpus(path="bt.tsv", tag="<bt>",
                                                                   variants=VariantsConfig(caps=1.0))])
    mixture = Mixture((Part("first", 0, 100, 1.0), Part("bt", 100, 200, 1.0)), seed=1)
    variants = build(vocab, cfg, mixture, seed=1, rows=200)
    assert variants is not None
    varied, shown = variants.apply(split, 0)
    text = _text(vocab, varied)
    assert text[:100] == _text(vocab, split)[:100]  # the first corpus: the dataset's variants, none
    assert shown["caps"] > 90
    assert all(s.startswith("<bt> ") and s[5:] == s[5:].upper() for s, _ in text[100:] if s != s.lower())
    assert build(vocab, DatasetConfig(), None, seed=1, rows=200) is None  # nothing asked: nothing built


@pytest.mark.parametrize(("variants", "expected"), [
    ({"caps": 1.5}, r"dataset.variants.caps=1.5 is out of range; it must be in \[0, 1\]"),
    ({"typos": -0.1}, r"dataset.variants.typos=-0.1 is out of range"),
    ({"caps": 0.6, "lower": 0.6}, r"caps \+ dataset.variants.title \+ dataset.variants.lower = 1.2"),
])
def test_bad_probabilities_are_refused_in_one_line(variants: dict[str, float], expected: str) -> None:
    with pytest.raises(ConfigError, match=expected) as info:
        DatasetConfig(variants=VariantsConfig(**variants)).check()
    assert "\n" not in str(info.value)
    with pytest.raises(ConfigError, match=r"dataset.mix\[0\].variants.caps=1.5"):
        DatasetConfig(mix=[MixedCorpus(path="x.tsv", variants=VariantsConfig(caps=1.5))]).check()


def test_the_command_line_refuses_an_unknown_variant_in_one_line(run_cli_here: Callable[..., Any]) -> None:
    result = run_cli_here("train", "debug=tiny", "dataset.variants.shout=0.1")
    assert result.returncode != 0 and "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert "dataset.variants.shout" in last


def test_a_run_with_variants_logs_what_each_epoch_showed(corpus: Path, tmp_path: Path,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("INFO"):
        tmt.train(smoke_overrides(corpus, tmp_path / "run", **{"dataset.variants.caps": 0.2,
                                                             "dataset.variants.typos": 0.2}))
    assert re.search(r"epoch 1: input variants: \d+ pairs caps, \d+ pairs typos", caplog.text)


def test_a_source_keeps_its_language_token(pairs: list[tuple[str, str]]) -> None:
    """In a model of several target languages (data/languages.py) a varied source still asks for its
    language."""
    vocab = train_tokenizers(TokenizerConfig(kind="bpe", vocab_size=600), [p[0] for p in pairs],
                             [p[1] for p in pairs], ["fr", "de"])
    plain = encoded_split(vocab, pairs[:100])
    de = vocab.language_id("de")
    split = EncodedSplit(prefixed(plain.src_ids, de), plain.tgt_ids)
    caps = InputVariants(vocab, [CorpusVariants(0, 100, VariantsConfig(caps=1.0), None)], seed=1, max_len=200)
    varied, shown = caps.apply(split, 0)
    assert shown["caps"] > 90
    assert all(ids[0] == de for ids in varied.src_ids.tolist())
    sources = vocab.decode_src([ids[1:] for ids in varied.src_ids.tolist()])
    assert sum(s == s.upper() for s in sources) >= shown["caps"]


def test_the_tokenizer_sample_shows_the_case_variants_so_capitals_keep_whole_pieces(
        pairs: list[tuple[str, str]]) -> None:
    """A vocabulary learnt from text as written splits ALL CAPS words into letters; one learnt from the
    sample with its cased copies (text_variants.tokenizer_pairs) keeps them in pieces like the words'."""
    assert tokenizer_pairs(pairs, VariantsConfig(typos=0.5, no_punct=0.5), seed=1) == pairs
    sample = tokenizer_pairs(pairs, VariantsConfig(caps=0.3, title=0.1), seed=1)
    copies = sample[len(pairs):]
    assert sample[:len(pairs)] == pairs and 0.33 * len(pairs) < len(copies) < 0.47 * len(pairs)
    assert sample == tokenizer_pairs(pairs, VariantsConfig(caps=0.3, title=0.1), seed=1)  # seeded
    forms = {(s.upper(), t.upper()) for s, t in pairs} | {(title_case(s), title_case(t)) for s, t in pairs}
    assert all(copy in forms for copy in copies)
    tok = TokenizerConfig(kind="bpe", vocab_size=1000)
    written = train_tokenizers(tok, [p[0] for p in pairs], [p[1] for p in pairs])
    cased = train_tokenizers(tok, [p[0] for p in sample], [p[1] for p in sample])
    shouted = [p[0].upper() for p in pairs[:500]]
    as_written = sum(map(len, written.encode_src(shouted)))
    assert sum(map(len, cased.encode_src(shouted))) < 0.75 * as_written


def test_the_data_cache_is_keyed_by_the_case_variants_alone() -> None:
    """The tokenizer's sample shows the case variants, so they decide the cached vocabulary; the
    source-only variants (typos, no final punctuation) are drawn each epoch and do not."""
    from transformer_mt.data.cache import cache_key
    tok, files = TokenizerConfig(), {"size": 1}
    plain = cache_key(DatasetConfig(), tok, files)
    assert cache_key(DatasetConfig(variants=VariantsConfig(typos=0.1, no_punct=0.1)), tok, files) == plain
    assert cache_key(DatasetConfig(variants=VariantsConfig(caps=0.1)), tok, files) != plain


def test_epochs_built_ahead_are_the_epochs_built_in_turn(vocab: Vocabulary, pairs: list[tuple[str, str]],
                                                         caplog: pytest.LogCaptureFixture) -> None:
    """On a GPU the next epoch's variants are drawn in a worker process while one trains: the same
    pairs, batches and log lines as drawn in turn, also for an epoch asked out of turn (a resume)."""
    split = encoded_split(vocab, pairs)
    wanted = VariantsConfig(caps=0.1, lower=0.1, no_punct=0.2, typos=0.5)
    asked = (0, 1, 2, 5, 6)

    def epochs(ahead: bool) -> TrainingEpochs:
        variants = InputVariants(vocab, [CorpusVariants(0, len(split), wanted, None)], seed=3, max_len=200)
        return TrainingEpochs(split, 600, seed=3, variants=variants, ahead=ahead)

    def run(made: TrainingEpochs) -> tuple[list[tuple[EncodedSplit, Any]], list[str]]:
        caplog.clear()
        with caplog.at_level("INFO", logger="transformer_mt.data.epochs"):
            got = [made(e) for e in asked]
        made.close()
        return got, [r.getMessage() for r in caplog.records]

    (expected, expected_log), (got, got_log) = run(epochs(False)), run(epochs(True))
    for (a, a_batches), (b, b_batches), e in zip(expected, got, asked, strict=True):
        assert a.src_ids.tolist() == b.src_ids.tolist() and a.tgt_ids.tolist() == b.tgt_ids.tolist()
        assert a_batches.batches(e) == b_batches.batches(e)
    built_ahead = [m for m in got_log if "built while the one before trained" in m]
    assert [m for m in got_log if m not in built_ahead] == expected_log
    assert len(expected_log) == 2 * len(asked)
    # epoch 6 (index 5) was asked out of turn: built there, as a resumed run's first epoch is
    assert [m.split(":")[0] for m in built_ahead] == ["epoch 2", "epoch 3", "epoch 7"]


def test_a_resumed_run_has_the_worker_start_after_the_epoch_it_resumes(
        vocab: Vocabulary, pairs: list[tuple[str, str]], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """The trainer looks at epoch 0 before it knows where a resumed run starts: the worker does not
    start on epoch 1 then (it would build an epoch no one asks for, and the next one would wait on it)."""
    split = encoded_split(vocab, pairs)
    variants = InputVariants(vocab, [CorpusVariants(0, len(split), VariantsConfig(typos=0.5), None)], seed=3,
                             max_len=200)
    started: list[int] = []  # the epochs given to the worker
    submit = ProcessPoolExecutor.submit
    monkeypatch.setattr(ProcessPoolExecutor, "submit",
                        lambda self, fn, epoch: (started.append(epoch), submit(self, fn, epoch))[1])
    made = TrainingEpochs(split, 600, seed=3, variants=variants, ahead=True)
    with caplog.at_level("INFO", logger="transformer_mt.data.epochs"):
        made(0, start_next=False)
        made(3)
        made(3)  # asked again (a validation in the epoch): the worker is on epoch 4 already
        made(4)
    made.close()
    assert started == [4, 5]
    built_ahead = [r.getMessage().split(":")[0] for r in caplog.records if "built while" in r.getMessage()]
    assert built_ahead == ["epoch 5"]


def _fails(epoch: int, say: Callable[..., None]) -> None:
    raise OSError(f"epoch {epoch + 1}: the disk went away")


def test_an_epoch_the_worker_cannot_build_is_built_in_turn(caplog: pytest.LogCaptureFixture) -> None:
    """A failure in the worker is a warning, and the trainer builds that epoch itself (where a fault of
    the building raises as it would without a worker)."""
    ahead = EpochsAhead(_fails)
    ahead.start(4)
    assert ahead.take(3) is None  # not the epoch started: built in turn
    ahead.start(4)
    with caplog.at_level("WARNING", logger="transformer_mt.data.ahead"):
        assert ahead.take(4) is None
    assert "epoch 5 could not be built ahead (OSError: epoch 5: the disk went away)" in caplog.text
    ahead.close()
    ahead.start(5)
    assert ahead.take(5) is None
