"""Copying learned in training: names and numbers substituted on both sides of a pair (data/substitution.py
through data/variants.py), and pairs joined into longer examples (data/joining.py). Checked against
independent references: the original text recovered from the varied one, the joined examples split back
into the pairs they join, draws repeated in another process, an uninterrupted run against a resumed one."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import sys
import unicodedata
from collections import Counter, defaultdict
from pathlib import Path

import pytest
import torch

import transformer_mt as tmt
from tests.conftest import ROOT, encoded_split, smoke_overrides, tatoeba_sample
from transformer_mt.checkpoints.store import load_checkpoint
from transformer_mt.config import ConfigError, DatasetConfig, MixedCorpus, TokenizerConfig, VariantsConfig
from transformer_mt.data import EncodedSplit, prepare_data
from transformer_mt.data.epochs import TrainingEpochs
from transformer_mt.data.joining import PairJoins
from transformer_mt.data.mixture import Mixture, Part
from transformer_mt.data.substitution import new_name, new_number, shared_spans, substitute
from transformer_mt.data.tokenizer import UNK_ID, Vocabulary, train_tokenizers
from transformer_mt.data.variants import CorpusVariants, InputVariants
from transformer_mt.jobs.train import build_trainer


@pytest.fixture(scope="module")
def pairs(corpus: Path) -> list[tuple[str, str]]:
    """2,000 real Tatoeba pairs (every 50th line), about one in ten with a name or number on both sides."""
    return tatoeba_sample(corpus, every=50, n=2000)


@pytest.fixture(scope="module")
def vocab(pairs: list[tuple[str, str]]) -> Vocabulary:
    return train_tokenizers(TokenizerConfig(kind="bpe", vocab_size=1000), [p[0] for p in pairs],
                            [p[1] for p in pairs])


def _text(vocab: Vocabulary, split: EncodedSplit) -> list[tuple[str, str]]:
    return list(zip(vocab.decode_src(split.src_ids.tolist()), vocab.decode_tgt(split.tgt_ids.tolist())))


def _replacements(before: str, after: str, spans: list[str]) -> list[str] | None:
    """What stands in `after` where each occurrence of `spans` stood in `before`, everything else equal;
    None when `after` is not `before` with only those occurrences replaced."""
    words = rf"(?<!\w)({'|'.join(map(re.escape, sorted(spans, key=len, reverse=True)))})(?!\w)"
    pieces = re.split(words, before)  # literal text at even indices, the spans at odd ones
    pattern = "".join(re.escape(p) if i % 2 == 0 else "(.+?)" for i, p in enumerate(pieces))
    found = re.fullmatch(pattern, after)
    return list(found.groups()) if found else None


@pytest.mark.parametrize(("source", "target", "expected"), [
    ("Tom gave Mary 25 apples in 1990.", "Tom a donné 25 pommes à Mary en 1990.",
     ["Tom", "Mary", "25", "1990"]),
    ("It is 10:30 and it costs 3.5 euros.", "Il est 10:30 et ça coûte 3,5 euros.", ["10:30"]),
    ("It costs 10,000 yen, not 10 000.", "Ça coûte 10,000 yens, pas 10 000.", ["10,000", "10 000"]),
    ("Call 223-1374 in the 1990s.", "Appelle le 223-1374 dans les années 1990.", ["223-1374"]),
    ("I like Kyoto.", "J'aime Kyoto.", ["Kyoto"]),  # capitalised within a sentence: a name
    ("Kyoto is old.", "Kyoto est vieille.", []),  # only a sentence's first word, and no first name
    ("Anna is here.", "Anna est là.", ["Anna"]),  # a first name Faker knows, even first
    ("Anna's cat. Anna sleeps.", "Le chat d'Anna. Anna dort.", []),  # "d'Anna" would keep the old name
    ("I have 1 car and NASA has 1.", "J'ai 1 voiture et la NASA en a 1.", []),  # 1: agreement; ALL CAPS
    ("He is 20.", "Il a vingt ans.", []),  # on one side only
])
def test_the_spans_are_the_names_and_numbers_written_alike_on_both_sides(source: str, target: str,
                                                                        expected: list[str]) -> None:
    assert shared_spans(source, target) == expected


def test_substitution_replaces_each_span_by_one_new_span_on_both_sides_and_nothing_else(
        pairs: list[tuple[str, str]]) -> None:
    rng = random.Random(5)
    found = [(s, t, spans) for s, t in pairs if (spans := shared_spans(s, t))]
    assert len(found) > 100
    for source, target, spans in found:
        new_source, new_target = substitute(source, target, spans, rng)
        src_new, tgt_new = _replacements(source, new_source, spans), _replacements(target, new_target, spans)
        assert src_new is not None and tgt_new is not None, (source, new_source, target, new_target)
        src_old = re.findall(rf"(?<!\w)({'|'.join(map(re.escape, spans))})(?!\w)", source)
        tgt_old = re.findall(rf"(?<!\w)({'|'.join(map(re.escape, spans))})(?!\w)", target)
        mapping = dict(zip(src_old, src_new))
        assert len(mapping) == len(spans) and all(new != old for old, new in mapping.items())
        assert [mapping[old] for old in src_old] == src_new  # one new span for every occurrence
        assert [mapping[old] for old in tgt_old] == tgt_new  # the same on the other side
    assert substitute("Tom is here.", "Tom est là.", [], rng) == ("Tom is here.", "Tom est là.")


def test_a_new_span_keeps_its_shape_and_names_are_latin(pairs: list[tuple[str, str]]) -> None:
    rng = random.Random(1)
    shapes = {"10:30": r"(1?\d|2[0-3]):[0-5]\d", "07:05": r"[0-2]\d:[0-5]\d",
              "10,000": r"[1-9]\d{0,2}(,\d{3})+", "1 234,5": r"[1-9]\d{0,2}( \d{3})+,\d",
              "3.25": r"\d+\.\d{2}", "223-1374": r"\d{3}-\d{4}"}
    for span, shape in shapes.items():
        assert all(re.fullmatch(shape, new_number(span, rng)) for _ in range(50)), span
    integers = [new_number("25", rng) for _ in range(2000)]
    assert all(n.isdigit() and int(n) >= 2 for n in integers)
    lengths = Counter(map(len, integers))
    assert set(range(1, 13)) <= set(lengths)  # from 2 to phone numbers of 12 digits
    assert sum(n for length, n in lengths.items() if length >= 6) > 0.2 * len(integers)
    names = [new_name(rng) for _ in range(2000)]
    assert len(set(names)) > 1500
    assert all(unicodedata.name(c).startswith("LATIN") for name in names for c in name if c.isalpha())
    assert sum(" " in name for name in names) > 0.2 * len(names)  # full names too
    assert all(name[0].isupper() or " " in name for name in names)


_IN_ANOTHER_PROCESS = """
import json, random, sys
from transformer_mt.data.substitution import shared_spans, substitute
pairs = json.load(sys.stdin)
drawn = [substitute(s, t, shared_spans(s, t), random.Random(f"pair:{i}")) for i, (s, t) in enumerate(pairs)]
print(json.dumps(drawn))
"""


def test_fakers_draws_are_the_same_in_another_process(pairs: list[tuple[str, str]]) -> None:
    """The epoch worker (data/ahead.py) substitutes in a process of its own, with another hash seed."""
    found = [(s, t) for s, t in pairs if shared_spans(s, t)][:100]
    here = [list(substitute(s, t, shared_spans(s, t), random.Random(f"pair:{i}")))
            for i, (s, t) in enumerate(found)]
    assert sum(a != b for a, b in zip(here, found)) == len(found)
    seed = "1" if os.environ.get("PYTHONHASHSEED") == "0" else "0"  # not this process's
    other = subprocess.run([sys.executable, "-c", _IN_ANOTHER_PROCESS], input=json.dumps(found), cwd=ROOT,
                           capture_output=True, text=True, check=True, env={"PYTHONHASHSEED": seed,
                                                                            "PYTHONPATH": str(ROOT)})
    assert json.loads(other.stdout) == here


def _variants(vocab: Vocabulary, rows: int, **keys: float) -> InputVariants:
    return InputVariants(vocab, [CorpusVariants(0, rows, VariantsConfig(**keys), None)], seed=1, max_len=200)


def test_substitution_is_drawn_per_pair_and_epoch_at_its_probability(vocab: Vocabulary,
                                                                    pairs: list[tuple[str, str]]) -> None:
    split = encoded_split(vocab, pairs)
    original = _text(vocab, split)
    with_spans = {i for i, (s, t) in enumerate(original) if shared_spans(s, t)}
    variants = _variants(vocab, len(split), substitute=0.5)
    varied, shown = variants.apply(split, epoch=0)
    text = _text(vocab, varied)
    changed = {i for i, (a, b) in enumerate(zip(original, text)) if a != b}
    assert changed <= with_spans and len(changed) == shown["substitute"]
    assert abs(len(changed) / len(with_spans) - 0.5) < 0.1
    again, _ = _variants(vocab, len(split), substitute=0.5).apply(split, epoch=0)
    assert again.src_ids.tolist() == varied.src_ids.tolist()
    assert again.tgt_ids.tolist() == varied.tgt_ids.tolist()
    other, _ = variants.apply(split, epoch=1)
    assert other.src_ids.tolist() != varied.src_ids.tolist()
    everything, shown = _variants(vocab, len(split), substitute=1.0, typos=0.3).apply(split, epoch=0)
    assert shown["substitute"] == len(with_spans)  # (byte-level BPE: nothing is <unk>)
    assert 0.25 < shown["typos"] / len(split) < 0.35  # the typos draw as they do alone
    for i in with_spans:  # both together: the target has the new names, the source may misspell them
        (s, t), (_, vt) = original[i], _text(vocab, everything)[i]
        assert t != vt and _replacements(t, vt, shared_spans(s, t)) is not None


def test_a_tagged_corpus_keeps_its_tag_when_its_names_change(vocab: Vocabulary,
                                                             pairs: list[tuple[str, str]]) -> None:
    tagged = [(f"<bt> {s}", t) for s, t in pairs if shared_spans(s, t)][:50]
    split = encoded_split(vocab, tagged)
    variants = InputVariants(vocab, [CorpusVariants(0, 50, VariantsConfig(substitute=1.0), "<bt>")], 1, 200)
    varied, shown = variants.apply(split, epoch=0)
    assert shown["substitute"] == 50
    for (source, target), (new_source, new_target) in zip(tagged, _text(vocab, varied), strict=True):
        spans = shared_spans(source[5:], target)
        assert new_source.startswith("<bt> ") and _replacements(source[5:], new_source[5:], spans) is not None
        assert _replacements(target, new_target, spans) is not None


def test_no_unknown_character_is_brought_in(pairs: list[tuple[str, str]]) -> None:
    """With a vocabulary of the corpus's characters, a name of letters it never saw would be <unk>:
    such a pair stays as it was."""
    chars = train_tokenizers(TokenizerConfig(kind="char", vocab_size=200), [p[0] for p in pairs],
                             [p[1] for p in pairs])
    split = encoded_split(chars, pairs)
    held = {i for i in range(len(split)) if UNK_ID in split.src_ids[i] or UNK_ID in split.tgt_ids[i]}
    varied, shown = _variants(chars, len(split), substitute=1.0).apply(split, epoch=0)
    with_spans = [i for i, (s, t) in enumerate(_text(chars, split)) if shared_spans(s, t) and i not in held]
    assert 0 < shown["substitute"] < len(with_spans)  # some new names had letters the vocabulary lacks
    for i in range(len(split)):
        if varied.src_ids[i].tolist() != split.src_ids[i].tolist():
            assert UNK_ID not in varied.src_ids[i] and UNK_ID not in varied.tgt_ids[i] and i not in held


def _split_back(joined: str, sources: dict[str, list[int]], parts: int = 3) -> list[list[int]]:
    """Every way of reading `joined` as 2-3 of `sources` joined with spaces, as their indices."""
    ways = []
    for end in [m.start() for m in re.finditer(" ", joined)] + [len(joined)]:
        head, tail = joined[:end], joined[end + 1:]
        for i in sources.get(head, []):
            if not tail:
                ways.append([i])
            elif parts > 1:
                ways += [[i, *rest] for rest in _split_back(tail, sources, parts - 1)]
    return ways


def test_joined_examples_are_their_pairs_in_order_within_max_len(vocab: Vocabulary,
                                                                 pairs: list[tuple[str, str]]) -> None:
    split = encoded_split(vocab, pairs)
    max_len = 40
    joins = PairJoins(vocab, [CorpusVariants(0, len(split), VariantsConfig(join=0.3), None)], seed=1,
                      max_len=max_len)
    out, joined, examples = joins.apply(split, None, epoch=0)
    assert len(out) == len(split) - joined + examples and 0.2 < joined / len(split) < 0.32
    assert int(max(out.src_lens.max(), out.tgt_lens.max())) <= max_len
    original, text = _text(vocab, split), _text(vocab, out)
    sources: dict[str, list[int]] = defaultdict(list)
    for i, (s, _) in enumerate(original):
        sources[s].append(i)
    used: list[int] = []
    sizes = Counter()
    for source, target in text[len(split) - joined:]:
        ways = [w for w in _split_back(source, sources) if len(w) > 1
                and target == " ".join(original[i][1] for i in w)]  # the targets in the same order
        assert ways, (source, target)
        used += ways[0]
        sizes[len(ways[0])] += 1
    assert sorted(text[:len(split) - joined] + [original[i] for i in used]) == sorted(original)  # each once
    assert sizes[2] > 0.3 * examples and sizes[3] > 0.3 * examples
    assert joins.apply(split, None, 0)[0].src_ids.tolist() == out.src_ids.tolist()
    assert joins.apply(split, None, 1)[0].src_ids.tolist() != out.src_ids.tolist()
    tight = PairJoins(vocab, joins.corpora, seed=1, max_len=20)
    assert tight.apply(split, None, 0)[1] < 0.8 * joined  # a join past max_len is not made


def test_joins_keep_to_an_epochs_pairs_of_one_corpus_and_its_tag(vocab: Vocabulary,
                                                                 pairs: list[tuple[str, str]]) -> None:
    tagged = [(f"<bt> {s}", t) for s, t in pairs[100:200]]
    split = encoded_split(vocab, pairs[:100] + tagged)
    corpora = [CorpusVariants(0, 100, VariantsConfig(join=0.5), None),
               CorpusVariants(100, 200, VariantsConfig(join=0.5), "<bt>")]
    rows = Mixture((Part("first", 0, 100, 0.5), Part("bt", 100, 200, 2.0)), seed=1).rows(epoch=3)
    out, joined, examples = PairJoins(vocab, corpora, seed=1, max_len=200).apply(split.subset(rows), rows, 3)
    assert len(out) == len(rows) - joined + examples and joined > 0.4 * len(rows)
    drawn = {s for s, _ in _text(vocab, split.subset(rows))}
    for source, _ in _text(vocab, out)[len(rows) - joined:]:
        assert source.count("<bt>") == (1 if source.startswith("<bt> ") else 0)
        pieces = source.removeprefix("<bt> ")
        owners = {s for s in drawn if s.removeprefix("<bt> ") in pieces}  # (pairs drawn for this epoch)
        assert len({s.startswith("<bt>") for s in owners}) == 1  # one corpus's pairs


def test_an_epoch_built_ahead_substitutes_and_joins_as_one_built_in_turn(
        vocab: Vocabulary, pairs: list[tuple[str, str]]) -> None:
    """The epoch worker draws Faker's names in another process: the same pairs and batches."""
    split = encoded_split(vocab, pairs)
    corpora = [CorpusVariants(0, len(split), VariantsConfig(substitute=0.5, join=0.2, typos=0.2), None)]

    def epochs(ahead: bool) -> TrainingEpochs:
        return TrainingEpochs(split, 600, seed=3, variants=InputVariants(vocab, corpora, 3, 200),
                              joins=PairJoins(vocab, corpora, 3, 200), ahead=ahead)

    inline, ahead = epochs(False), epochs(True)
    for epoch in (0, 1, 2):
        (a, a_batches), (b, b_batches) = inline(epoch), ahead(epoch)
        assert a.src_ids.tolist() == b.src_ids.tolist() and a.tgt_ids.tolist() == b.tgt_ids.tolist()
        assert a_batches.batches(epoch) == b_batches.batches(epoch)
    ahead.close()


@pytest.mark.parametrize(("variants", "expected"), [
    ({"substitute": 1.5}, r"dataset.variants.substitute=1.5 is out of range; it must be in \[0, 1\]"),
    ({"join": -0.1}, r"dataset.variants.join=-0.1 is out of range"),
])
def test_bad_probabilities_are_refused_in_one_line(variants: dict[str, float], expected: str) -> None:
    with pytest.raises(ConfigError, match=expected) as info:
        DatasetConfig(variants=VariantsConfig(**variants)).check()
    assert "\n" not in str(info.value)
    mixed = expected.replace("dataset.variants", r"dataset.mix\[0\].variants")
    with pytest.raises(ConfigError, match=mixed):
        DatasetConfig(mix=[MixedCorpus(path="x.tsv", variants=VariantsConfig(**variants))]).check()


def test_validation_and_test_pairs_are_never_varied(corpus: Path, tmp_path: Path) -> None:
    keys = {"dataset.variants.substitute": 1.0, "dataset.variants.join": 0.5}
    overrides = smoke_overrides(corpus, tmp_path / "run", **keys)
    trainer = build_trainer(tmt.compose("train", overrides), tmp_path / "run", overrides)
    cfg = trainer.cfg
    plain = prepare_data(cfg.dataset, cfg.tokenizer)
    for part in ("valid", "test"):
        got, want = getattr(trainer.data, part), getattr(plain, part)
        assert got.src_text == want.src_text and got.src_ids.tolist() == want.src_ids.tolist()
    epoch, _ = trainer.epochs(0)
    assert len(epoch) < len(trainer.data.train)  # the training pairs are joined
    trainer.epochs.close()


def test_a_run_logs_both_and_resumes_in_an_epoch_as_it_ran(corpus: Path, tmp_path: Path,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    keys = {"dataset.variants.substitute": 0.5, "dataset.variants.join": 0.3, "training.epochs": 2,
            "training.valid_every_steps": 5, "training.valid_max_sentences": 2, "training.keep_last": 100}
    straight = tmp_path / "straight"
    with caplog.at_level("INFO"):
        tmt.train(smoke_overrides(corpus, straight, **keys))
    assert re.search(r"epoch 2: input variants: \d+ pairs substitute, \d+ pairs joined into \d+ examples",
                     caplog.text)
    # a checkpoint within the second epoch: a resumed run rebuilds that epoch's draws and goes on at its batch
    mid = next(path for path in sorted(straight.glob("step_*.pt"))
               if (state := load_checkpoint(path))["epoch"] == 1 and state["batch_in_epoch"] > 0)
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    shutil.copyfile(mid, resumed / "latest.pt")
    tmt.train([f"resume={resumed}"])
    want, got = (load_checkpoint(run / "epoch_002.pt") for run in (straight, resumed))
    assert got["step"] == want["step"]
    for name, tensor in want["model"].items():
        assert torch.equal(got["model"][name], tensor), f"{name} differs after resume"
