"""Reading, splitting, encoding (cached), batching and collating parallel text."""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import subprocess
import sys
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from transformer_mt.config import ConfigError, DatasetConfig, TokenizerConfig
from transformer_mt.data import (
    DataError,
    Ragged,
    TokenBatchSampler,
    collate,
    ensure_tatoeba,
    length_sorted_batches,
    load_pairs,
    load_split_tsv,
    pad_sources,
    prepare_data,
)
from transformer_mt.data import cache as cache_mod
from transformer_mt.data.cache import held_out_pairs, sample_indices
from transformer_mt.data.corpora import Skipped, locate
from transformer_mt.data.split import TEST, TRAIN, VALID, assign, sentence_key
from transformer_mt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID

OPUS_FIXTURE = Path(__file__).resolve().parent / "fixtures/opus_books_en_fr.jsonl"

WORDS_EN = ["cat", "dog", "house", "tree", "red", "big", "small", "runs", "sleeps", "eats"]
WORDS_FR = ["chat", "chien", "maison", "arbre", "rouge", "grand", "petit", "court", "dort", "mange"]


def synthetic_pairs(n: int, seed: int = 0) -> tuple[list[str], list[str]]:
    """n pairs sorted by length like Tatoeba, with some repeated sentences on each side."""
    rng = np.random.default_rng(seed)
    en, fr = [], []
    for i in range(n):
        k = 1 + i * 12 // n  # lengths grow through the file
        idx = rng.integers(0, len(WORDS_EN), size=k)
        en.append(" ".join(WORDS_EN[j] for j in idx).capitalize() + ".")
        fr.append(" ".join(WORDS_FR[j] for j in idx).capitalize() + " !")
        if i % 7 == 3:  # the same English sentence again with another translation
            en.append(en[-1])
            fr.append(fr[-1] + " Oui.")
        if i % 11 == 5:  # the same French sentence again for another English one
            en.append("Well, " + en[-1])
            fr.append(fr[-1])
    return en, fr


def write_tatoeba(path: Path, en: list[str], fr: list[str], attribution: bool = False) -> Path:
    """A fra.txt (2 or 3 columns)."""
    cols = "\tCC-BY 2.0 (France) Attribution: tatoeba.org #1 (x)" if attribution else ""
    path.write_text("".join(f"{e}\t{f}{cols}\n" for e, f in zip(en, fr, strict=True)),
                    encoding="utf-8")
    return path


@dataclass
class Part:
    """One part of a split: aligned source and target sentences."""

    src: list[str]
    tgt: list[str]

    def __len__(self) -> int:
        return len(self.src)


def split_pairs(src: list[str], tgt: list[str], valid_size: int, test_size: int,
                seed: int) -> SimpleNamespace:
    """The split of in-memory pairs: `assign` on their keys, each part as (src, tgt) lists."""
    keys = [np.array([sentence_key(s) for s in side], dtype=np.int64) for side in (src, tgt)]
    chosen = assign(keys[0], keys[1], valid_size, test_size, seed)

    def part(p: int) -> Part:
        idx = chosen.orders[p].tolist()
        return Part([src[i] for i in idx], [tgt[i] for i in idx])

    parts = {name: part(p) for name, p in (("train", TRAIN), ("valid", VALID), ("test", TEST))}
    return SimpleNamespace(**parts, valid_size=chosen.valid_size, test_size=chosen.test_size)


def read_tatoeba(path: Path) -> tuple[list[str], list[str], int]:
    """English, French and the count of skipped lines of a Tatoeba file, as the corpus streams them."""
    skipped = Skipped()
    pairs = list(locate(DatasetConfig(path=str(path), url=None)).pairs("train", skipped))
    return [e for e, _ in pairs], [f for _, f in pairs], skipped.count


def tatoeba_cfg(path: Path, tmp_path: Path, **kw) -> DatasetConfig:
    """A config that can never download."""
    return DatasetConfig(path=str(path), url=None, cache_dir=str(tmp_path / "cache"), **kw)


# ---------------------------------------------------------------------------------------------
# read_tatoeba


def test_reads_two_and_three_columns(tmp_path: Path) -> None:
    two = write_tatoeba(tmp_path / "two.txt", ["Hi.", "Run!"], ["Salut.", "Cours !"])
    three = write_tatoeba(tmp_path / "three.txt", ["Hi.", "Run!"], ["Salut.", "Cours !"], True)
    assert read_tatoeba(two) == (["Hi.", "Run!"], ["Salut.", "Cours !"], 0)
    assert read_tatoeba(three) == (["Hi.", "Run!"], ["Salut.", "Cours !"], 0)


def test_bom_crlf_blank_lines_and_malformed_lines(tmp_path: Path) -> None:
    raw = ("\ufeffHi.\tSalut.\r\n"
           "\r\n"
           "just one column\r\n"
           "Empty French.\t  \r\n"
           "\tEmpty English.\r\n"
           "a\tb\tc\td\r\n"
           "   \r\n"
           "Who?\tQui ?\tCC-BY\r\n")
    path = tmp_path / "fra.txt"
    path.write_bytes(raw.encode("utf-8"))
    en, fr, skipped = read_tatoeba(path)
    assert en == ["Hi.", "Who?"]
    assert fr == ["Salut.", "Qui ?"]
    assert skipped == 4


def test_reads_zip_with_about_file(tmp_path: Path) -> None:
    path = tmp_path / "fra-eng.zip"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("_about.txt", "terms")
        zf.writestr("fra.txt", "Hi.\tSalut.\nGo.\tVa !\n")
    assert read_tatoeba(path) == (["Hi.", "Go."], ["Salut.", "Va !"], 0)


def test_reads_zip_with_one_other_txt(tmp_path: Path) -> None:
    path = tmp_path / "pairs.zip"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("_about.txt", "terms")
        zf.writestr("data/pairs.txt", "Hi.\tSalut.\n")
    assert read_tatoeba(path)[0] == ["Hi."]


def test_zip_without_text_is_a_data_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.zip"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("_about.txt", "terms")
        zf.writestr("readme.md", "no")
    with pytest.raises(DataError, match="holds no pairs file"):
        read_tatoeba(path)


def test_non_utf8_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "fra.txt"
    path.write_bytes("Hi.\tSalut.\nGo.\tVa !\nCafé\tCaf".encode() + b"\xe9\n")
    with pytest.raises(DataError, match=r"fra.txt: line 3 is not valid UTF-8 \(byte 0xe9\)") as info:
        read_tatoeba(path)
    assert "\n" not in str(info.value)


def test_missing_empty_and_all_malformed_files(tmp_path: Path) -> None:
    tok = TokenizerConfig(kind="char", vocab_size=60)
    with pytest.raises(DataError, match="does not exist"):
        prepare_data(tatoeba_cfg(tmp_path / "nope.txt", tmp_path), tok)
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(DataError, match="holds no pairs"):
        prepare_data(tatoeba_cfg(tmp_path / "empty.txt", tmp_path), tok)
    (tmp_path / "bad.txt").write_text("one column\nanother\n")
    with pytest.raises(DataError, match=r"holds no pairs.*\(2 skipped\)"):
        prepare_data(tatoeba_cfg(tmp_path / "bad.txt", tmp_path), tok)


def test_non_utf8_after_a_byte_order_mark_names_the_right_byte(tmp_path: Path) -> None:
    path = tmp_path / "fra.txt"
    path.write_bytes(b"\xef\xbb\xbfHi.\tSalut.\nCaf\xe9\tCaf\n")
    with pytest.raises(DataError, match=r"line 2 is not valid UTF-8 \(byte 0xe9\)"):
        read_tatoeba(path)


def test_reading_a_large_file(tmp_path: Path) -> None:
    path = write_tatoeba(tmp_path / "fra.txt", ["I see a small red house."] * 160_000,
                         ["Je vois une petite maison rouge."] * 160_000)
    en, fr, skipped = read_tatoeba(path)
    assert len(en) == len(fr) == 160_000 and skipped == 0


def test_real_corpus(corpus: Path) -> None:
    en, fr, skipped = read_tatoeba(corpus)
    assert (len(en), len(fr), skipped) == (164_211, 164_211, 0)
    assert (en[0], fr[0]) == ("Go.", "Va !")


# ---------------------------------------------------------------------------------------------
# ensure_tatoeba (never downloads for real)


def test_missing_file_without_url_says_what_to_do(tmp_path: Path, monkeypatch) -> None:
    def no_network(*args, **kwargs):
        raise AssertionError("must not download")

    monkeypatch.setattr(urllib.request, "urlopen", no_network)
    cfg = tatoeba_cfg(tmp_path / "data/fra-eng.zip", tmp_path)
    with pytest.raises(DataError, match="manythings.org/anki.*dataset.path=") as info:
        ensure_tatoeba(cfg)
    assert "\n" not in str(info.value)


def test_download_failure_is_a_data_error(tmp_path: Path, monkeypatch) -> None:
    def offline(*args, **kwargs):
        raise urllib.error.URLError("no network")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    cfg = DatasetConfig(path=str(tmp_path / "missing.zip"), url="https://example.invalid/fra-eng.zip",
                        cache_dir=str(tmp_path / "cache"))
    with pytest.raises(DataError, match="downloading .* failed.*dataset.path="):
        ensure_tatoeba(cfg)
    assert not list((tmp_path / "cache").iterdir())  # no partial file left behind


def test_download_once_into_cache(tmp_path: Path, monkeypatch) -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        zf.writestr("fra.txt", "Hi.\tSalut.\n")
    calls = []

    def fake_urlopen(request, timeout=None):
        calls.append(request.full_url)
        return io.BytesIO(buffer.getvalue())

    monkeypatch.setattr(urllib.request, "urlopen", fake_urlopen)
    cfg = DatasetConfig(path=str(tmp_path / "missing.zip"), url="https://example.invalid/fra-eng.zip",
                        cache_dir=str(tmp_path / "cache"))
    first = ensure_tatoeba(cfg)
    second = ensure_tatoeba(cfg)
    assert first == second == (tmp_path / "cache/fra-eng.zip").resolve()
    assert len(calls) == 1
    assert read_tatoeba(first)[0] == ["Hi."]
    assert [p.name for p in (tmp_path / "cache").iterdir()] == ["fra-eng.zip"]


def test_download_of_a_non_zip_is_refused(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(urllib.request, "urlopen",
                        lambda request, timeout=None: io.BytesIO(b"<html>blocked</html>"))
    cfg = DatasetConfig(path=str(tmp_path / "missing.zip"), url="https://example.invalid/fra-eng.zip",
                        cache_dir=str(tmp_path / "cache"))
    with pytest.raises(DataError, match="not send a zip"):
        ensure_tatoeba(cfg)


# ---------------------------------------------------------------------------------------------
# pairs, direction, sampling


def test_load_pairs_and_direction(tmp_path: Path) -> None:
    path = write_tatoeba(tmp_path / "fra.txt", ["Hi.", "Go."], ["Salut.", "Va !"])
    en, fr = load_pairs(tatoeba_cfg(path, tmp_path))
    assert (en, fr) == (["Hi.", "Go."], ["Salut.", "Va !"])
    reverse = tatoeba_cfg(path, tmp_path, src_lang="fr", tgt_lang="en")
    assert load_pairs(reverse) == (fr, en)
    with pytest.raises(ConfigError, match="set dataset.src_lang or dataset.tgt_lang to en"):
        tatoeba_cfg(path, tmp_path, src_lang="de").check()


def test_load_pairs_logs_skipped_lines(tmp_path: Path, caplog) -> None:
    path = tmp_path / "fra.txt"
    path.write_text("Hi.\tSalut.\nbroken\n")
    with caplog.at_level("WARNING"):
        load_pairs(tatoeba_cfg(path, tmp_path))
    assert "skipped 1 malformed" in caplog.text


def sample_pairs(en: list[str], fr: list[str], max_pairs: int | None,
                 seed: int) -> tuple[list[str], list[str]]:
    keep = sample_indices(len(en), max_pairs, seed).tolist()
    return [en[i] for i in keep], [fr[i] for i in keep]


def test_max_pairs_is_deterministic_and_spread_over_lengths() -> None:
    en, fr = synthetic_pairs(3000)
    a = sample_pairs(en, fr, 300, seed=5)
    assert a == sample_pairs(en, fr, 300, seed=5)
    assert a != sample_pairs(en, fr, 300, seed=6)
    assert len(a[0]) == 300
    # Drawn from the whole (length-sorted) file, not its first 300 lines.
    positions = sorted(en.index(s) for s in a[0])
    assert positions[0] < len(en) // 10 and positions[-1] > len(en) * 9 // 10
    assert abs(np.mean([len(s) for s in a[0]]) - np.mean([len(s) for s in en])) < 8
    assert sample_pairs(en, fr, None, seed=5) == (en, fr)
    assert sample_pairs(en, fr, 10**9, seed=5) == (en, fr)


# ---------------------------------------------------------------------------------------------
# split


def _parts(split) -> dict:
    return {"train": split.train, "valid": split.valid, "test": split.test}


def _sides(split) -> dict[str, tuple[set[str], set[str]]]:
    return {name: ({s.strip() for s in part.src}, {t.strip() for t in part.tgt})
            for name, part in _parts(split).items()}


def test_split_is_leak_free_and_sized() -> None:
    en, fr = synthetic_pairs(2000)
    split = split_pairs(en, fr, valid_size=150, test_size=100, seed=3)
    assert len(split.train) + len(split.valid) + len(split.test) == len(en)
    assert 150 <= len(split.valid) < 150 + 10
    assert 100 <= len(split.test) < 100 + 10
    sides = _sides(split)
    for a, b in (("train", "valid"), ("train", "test"), ("valid", "test")):
        assert not sides[a][0] & sides[b][0], f"an English sentence is in {a} and {b}"
        assert not sides[a][1] & sides[b][1], f"a French sentence is in {a} and {b}"
    pairs = set(zip(en, fr, strict=True))
    assert set(zip(split.valid.src, split.valid.tgt, strict=True)) <= pairs


def reference_split(src: list[str], tgt: list[str], valid_size: int, test_size: int,
                    seed: int) -> tuple[list[int], list[int], list[int]]:
    """The split rule written plainly (strings in dicts, a loop over groups): the reference the array
    version must reproduce, order included."""
    parent = list(range(len(src)))

    def find(i: int) -> int:
        while parent[i] != i:
            i = parent[i]
        return i

    for side in (src, tgt):
        first: dict[str, int] = {}
        for i, sentence in enumerate(side):
            j = first.setdefault(sentence.strip(), i)
            a, b = find(i), find(j)
            parent[max(a, b)] = min(a, b)
    groups: dict[int, list[int]] = {}
    for i in range(len(src)):
        groups.setdefault(find(i), []).append(i)
    ordered = list(groups.values())
    parts: dict[str, list[int]] = {"valid": [], "test": [], "train": []}
    for g in np.random.default_rng(seed).permutation(len(ordered)):
        name = ("valid" if len(parts["valid"]) < valid_size
                else "test" if len(parts["test"]) < test_size else "train")
        parts[name].extend(ordered[g])
    return parts["train"], parts["valid"], parts["test"]


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_split_matches_the_plain_reference(seed: int) -> None:
    en, fr = synthetic_pairs(3000, seed=seed)
    train, valid, test = reference_split(en, fr, 120, 90, seed)
    split = split_pairs(en, fr, 120, 90, seed)
    for part, idx in ((split.train, train), (split.valid, valid), (split.test, test)):
        assert (part.src, part.tgt) == ([en[i] for i in idx], [fr[i] for i in idx])


def test_split_of_the_real_corpus_matches_the_reference(corpus: Path) -> None:
    en, fr, _ = read_tatoeba(corpus)
    train, valid, test = reference_split(en, fr, 2000, 2000, 1234)
    split = split_pairs(en, fr, 2000, 2000, 1234)
    assert split.valid.src == [en[i] for i in valid] and split.test.tgt == [fr[i] for i in test]
    assert split.train.src == [en[i] for i in train]


def test_split_groups_chains_of_shared_sentences() -> None:
    # a-x, a-y, b-y, b-z: one group although a and b never share a translation directly.
    en = ["a", "a", "b", "b"] + [f"e{i}" for i in range(20)]
    fr = ["x", "y", "y", "z"] + [f"f{i}" for i in range(20)]
    for seed in range(10):
        split = split_pairs(en, fr, valid_size=2, test_size=2, seed=seed)
        homes = {name for name, part in _parts(split).items()
                 if "a" in part.src or "b" in part.src}
        assert len(homes) == 1


def test_split_is_deterministic_and_direction_independent() -> None:
    en, fr = synthetic_pairs(1000)
    one = split_pairs(en, fr, 80, 80, seed=1)
    assert one == split_pairs(en, fr, 80, 80, seed=1)
    assert one.valid != split_pairs(en, fr, 80, 80, seed=2).valid
    mirrored = split_pairs(fr, en, 80, 80, seed=1)
    assert (mirrored.test.src, mirrored.test.tgt) == (one.test.tgt, one.test.src)


def _split_digest() -> str:
    en, fr = synthetic_pairs(500)
    s = split_pairs(en, fr, 40, 40, seed=7)
    return hashlib.sha256(repr((s.valid, s.test)).encode()).hexdigest()


def test_split_does_not_depend_on_the_hash_seed() -> None:
    code = ("import sys; sys.path.insert(0, 'tests'); from test_data import _split_digest; "
            "print(_split_digest())")
    root = Path(__file__).resolve().parents[1]
    other = subprocess.run([sys.executable, "-c", code], cwd=root, check=True, text=True,
                           capture_output=True, env={**os.environ, "PYTHONHASHSEED": "12345"})
    assert other.stdout.strip() == _split_digest()


def test_split_sizes_shrink_on_small_corpora(caplog) -> None:
    en, fr = [f"e{i}" for i in range(100)], [f"f{i}" for i in range(100)]
    with caplog.at_level("WARNING"):
        split = split_pairs(en, fr, valid_size=2000, test_size=2000, seed=0)
    assert (len(split.valid), len(split.test), len(split.train)) == (10, 10, 80)
    assert "shrunk to 10/10" in caplog.text


def test_split_too_small_is_a_data_error() -> None:
    with pytest.raises(DataError, match="dataset.valid_size"):
        split_pairs(["a", "b"], ["x", "y"], valid_size=1, test_size=1, seed=0)


def test_the_run_keeps_its_split(small_corpus: Path, tmp_path: Path) -> None:
    cfg = tatoeba_cfg(small_corpus, tmp_path, valid_size=20, test_size=10, split_seed=0)
    data = prepare_data(cfg, TokenizerConfig(kind="char", vocab_size=60), tmp_path / "run")
    folder = tmp_path / "run/split"
    assert load_split_tsv(folder / "valid.tsv") == (data.valid.src_text, data.valid.tgt_text)
    assert load_split_tsv(folder / "test.tsv") == (data.test.src_text, data.test.tgt_text)
    summary = json.loads((folder / "train_summary.json").read_text())
    # the split's counts: training pairs before the length filter, which leaves out some of them
    assert summary["counts"] == {"train": data.stats["train_pairs"], "valid": len(data.valid),
                                 "test": len(data.test)}
    assert len(data.train) == data.stats["train_kept"] == summary["counts"]["train"] - \
        data.stats["train_dropped_by_length"]
    assert (summary["seed"], summary["valid_size"], summary["test_size"]) == (0, 20, 10)
    assert (summary["source"], summary["src_lang"], summary["tgt_lang"]) == ("fra.txt", "en", "fr")
    held_out = set(zip(data.valid.src_text + data.test.src_text, data.valid.tgt_text + data.test.tgt_text))
    train = [p for p in zip(*load_pairs(cfg)) if p not in held_out]  # in corpus order
    lines = "".join(f"{s}\t{t}\n" for s, t in train)
    assert summary["train_sha256"] == hashlib.sha256(lines.encode()).hexdigest()


def test_load_split_tsv_errors(tmp_path: Path) -> None:
    (tmp_path / "bad.tsv").write_text("one\ttwo\nthree columns\there\tx\n")
    with pytest.raises(DataError, match="line 2 has 3"):
        load_split_tsv(tmp_path / "bad.tsv")
    with pytest.raises(DataError, match="does not exist"):
        load_split_tsv(tmp_path / "missing.tsv")


# ---------------------------------------------------------------------------------------------
# prepare_data and its cache


@pytest.fixture
def small_corpus(tmp_path: Path) -> Path:
    en, fr = synthetic_pairs(800)
    return write_tatoeba(tmp_path / "fra.txt", en, fr)


def _same(a, b) -> None:
    for part in ("train", "valid", "test"):
        x, y = getattr(a, part), getattr(b, part)
        assert x.src_ids.tolist() == y.src_ids.tolist() and x.tgt_ids.tolist() == y.tgt_ids.tolist()
        assert (x.src_text, x.tgt_text) == (y.src_text, y.tgt_text)
    assert a.vocab.to_json() == b.vocab.to_json()


def test_prepare_data_and_cache_hit(small_corpus: Path, tmp_path: Path) -> None:
    cfg = tatoeba_cfg(small_corpus, tmp_path, valid_size=60, test_size=40)
    tok = TokenizerConfig(kind="bpe", vocab_size=300)
    first = prepare_data(cfg, tok, tmp_path / "run")
    assert not first.stats["cache_hit"]
    assert len([p for p in (tmp_path / "cache/encoded").iterdir() if not p.name.startswith(".")]) == 1
    def no_rebuild(*args, **kwargs):  # noqa: ANN202
        raise AssertionError("a cache hit must not read, split or encode the corpus again")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cache_mod, "build", no_rebuild)
        second = prepare_data(cfg, tok, tmp_path / "run2")
    assert second.stats["cache_hit"]
    _same(first, second)
    assert isinstance(second.train.src_ids.flat, np.memmap)  # the training ids stay on disk

    d = second
    assert d.stats["pairs_read"] == d.stats["pairs_used"] == sum(d.stats[f"{p}_pairs"]
                                                                 for p in ("train", "valid", "test"))
    assert len(d.valid) == d.stats["valid_pairs"] >= 60 and len(d.test) >= 40
    assert d.vocab.decode_tgt(d.valid.tgt_ids.tolist()) == d.valid.tgt_text
    assert (tmp_path / "run2/split/test.tsv").is_file()
    summary = "split/train_summary.json"
    assert (tmp_path / "run" / summary).read_text() == (tmp_path / "run2" / summary).read_text()
    assert (tmp_path / "run2/tokenizer.json").is_file()
    batch = d.train.batch([0, 1, 2])
    assert batch.src.shape[0] == 3 and batch.tgt_out[0, d.train.tgt_lens[0]] == EOS_ID


def test_a_cache_miss_locates_the_corpus_once(small_corpus: Path, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Found (or downloaded) once, then read in its three streaming passes (keys, text, ids)."""
    from transformer_mt.data import corpora

    calls = {"ensure": 0, "read": 0}
    ensure, read = corpora.ensure_tatoeba, corpora.tatoeba_lines

    def counted(name, real):  # noqa: ANN001, ANN202
        def wrapper(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            calls[name] += 1
            return real(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(corpora, "ensure_tatoeba", counted("ensure", ensure))
    monkeypatch.setattr(corpora, "tatoeba_lines", counted("read", read))
    data = prepare_data(tatoeba_cfg(small_corpus, tmp_path, valid_size=60, test_size=40),
                        TokenizerConfig(kind="char", vocab_size=60))
    assert not data.stats["cache_hit"] and calls == {"ensure": 1, "read": 3}


def test_cache_key_follows_the_config(small_corpus: Path, tmp_path: Path) -> None:
    cfg = tatoeba_cfg(small_corpus, tmp_path, valid_size=60, test_size=40)
    tok = TokenizerConfig(kind="wordlevel", vocab_size=100)
    prepare_data(cfg, tok)
    # Length limits are applied after the cache: no rebuild.
    assert prepare_data(tatoeba_cfg(small_corpus, tmp_path, valid_size=60, test_size=40,
                                    max_len=5), tok).stats["cache_hit"]
    other_tok = TokenizerConfig(kind="wordlevel", vocab_size=90)
    assert not prepare_data(cfg, other_tok).stats["cache_hit"]
    assert not prepare_data(tatoeba_cfg(small_corpus, tmp_path, valid_size=60, test_size=40,
                                        split_seed=9), tok).stats["cache_hit"]
    small_corpus.write_text(small_corpus.read_text() + "New.\tNouveau.\n")
    assert not prepare_data(cfg, tok).stats["cache_hit"]


def test_given_vocabulary_is_used_and_cached(small_corpus: Path, tmp_path: Path) -> None:
    cfg = tatoeba_cfg(small_corpus, tmp_path, valid_size=60, test_size=40)
    tok = TokenizerConfig(kind="bpe", vocab_size=300)
    trained = prepare_data(cfg, tok)
    # Resuming with the same tokenizer reuses the regular cache.
    resumed = prepare_data(cfg, tok, vocab=trained.vocab)
    assert resumed.stats["cache_hit"]
    _same(trained, resumed)
    # Another tokenizer is honoured (not silently replaced by the cached one).
    other = prepare_data(cfg, TokenizerConfig(kind="char", vocab_size=100)).vocab
    with_other = prepare_data(cfg, tok, vocab=other)
    assert not with_other.stats["cache_hit"] and with_other.vocab.kind == "char"
    assert prepare_data(cfg, tok, vocab=other).stats["cache_hit"]


def test_fr_to_en(small_corpus: Path, tmp_path: Path) -> None:
    tok = TokenizerConfig(kind="wordlevel", vocab_size=100)
    forward = prepare_data(tatoeba_cfg(small_corpus, tmp_path, valid_size=60, test_size=40), tok)
    backward = prepare_data(tatoeba_cfg(small_corpus, tmp_path, valid_size=60, test_size=40,
                                        src_lang="fr", tgt_lang="en"), tok)
    assert backward.test.src_text == forward.test.tgt_text
    assert backward.test.tgt_text == forward.test.src_text
    _, french = load_pairs(tatoeba_cfg(small_corpus, tmp_path))
    assert set(backward.vocab.decode_src(backward.train.src_ids.tolist())) <= set(french)


def test_split_can_be_rebuilt_from_the_config(small_corpus: Path, tmp_path: Path) -> None:
    # `evaluate` falls back to held_out_pairs when split/*.tsv is missing.
    cfg = tatoeba_cfg(small_corpus, tmp_path, valid_size=30, test_size=30, max_pairs=500,
                      src_lang="fr", tgt_lang="en")
    d = prepare_data(cfg, TokenizerConfig(kind="char", vocab_size=60))
    test, valid = held_out_pairs(cfg, "test"), held_out_pairs(cfg, "valid")
    assert ([s for s, _ in test], [t for _, t in test]) == (d.test.src_text, d.test.tgt_text)
    assert [s for s, _ in valid] == d.valid.src_text



def test_length_filtering(small_corpus: Path, tmp_path: Path, caplog) -> None:
    tok = TokenizerConfig(kind="wordlevel", vocab_size=100)
    full = prepare_data(tatoeba_cfg(small_corpus, tmp_path, valid_size=60, test_size=40,
                                    max_len=1000), tok)
    assert full.stats["train_dropped_by_length"] == 0
    lo, hi = 4, 12
    src, tgt = full.train.src_lens, full.train.tgt_lens
    expected = int(((src < lo) | (src > hi) | (tgt < lo) | (tgt > hi)).sum())
    assert expected > 0
    with caplog.at_level("INFO"):
        cut = prepare_data(tatoeba_cfg(small_corpus, tmp_path, valid_size=60, test_size=40,
                                       min_len=lo, max_len=hi), tok)
    assert f"dropped {expected} of" in caplog.text
    assert cut.stats["train_dropped_by_length"] == expected
    assert len(cut.train) == len(full.train) - expected
    assert cut.train.src_lens.min() >= lo and cut.train.tgt_lens.max() <= hi
    assert cut.train.src_text is None  # the training text may be larger than memory: not kept
    # valid/test keep every pair, ids truncated to max_len, text untouched.
    assert len(cut.valid) == len(full.valid) and cut.valid.src_text == full.valid.src_text
    assert cut.valid.src_lens.max() <= hi and cut.test.tgt_lens.max() <= hi
    assert cut.stats["valid_truncated"] > 0
    with pytest.raises(DataError, match="dataset.min_len=.*dataset.max_len="):
        prepare_data(tatoeba_cfg(small_corpus, tmp_path, valid_size=60, test_size=40,
                                 min_len=500, max_len=600), tok)


def test_max_pairs_through_prepare_data(small_corpus: Path, tmp_path: Path) -> None:
    cfg = tatoeba_cfg(small_corpus, tmp_path, valid_size=20, test_size=20, max_pairs=200)
    d = prepare_data(cfg, TokenizerConfig(kind="char", vocab_size=60))
    assert d.stats["pairs_used"] == 200 and d.stats["pairs_read"] > 200
    assert d.stats["train_pairs"] + d.stats["valid_pairs"] + d.stats["test_pairs"] == 200


# ---------------------------------------------------------------------------------------------
# opus_books through local json (offline)


@pytest.fixture
def offline(monkeypatch) -> None:
    """Offline mode, also when `datasets` was imported before the variables were set."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import datasets.config
    import huggingface_hub.constants

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


def opus_cfg(tmp_path: Path, files: Path | str, **kw) -> DatasetConfig:
    return DatasetConfig(name="opus_books", hf_data_files=str(files),
                         cache_dir=str(tmp_path / "cache"), **kw)


def test_opus_books_from_json(tmp_path: Path, offline) -> None:
    en, fr = load_pairs(opus_cfg(tmp_path, OPUS_FIXTURE))
    assert len(en) == len(fr) == 60
    assert en[0] == "The lighthouse keeper painted the door blue."
    assert fr[0] == "Le gardien du phare a peint la porte en bleu."
    d = prepare_data(opus_cfg(tmp_path, OPUS_FIXTURE, valid_size=5, test_size=5, src_lang="fr",
                              tgt_lang="en"), TokenizerConfig(kind="bpe", vocab_size=300))
    assert len(d.train) + len(d.valid) + len(d.test) == 60
    assert d.stats["source"] == OPUS_FIXTURE.name
    assert set(d.test.tgt_text) <= set(en)


def test_opus_books_flattens_line_breaks_and_skips_empty(tmp_path: Path, offline) -> None:
    rows = [{"id": "0", "translation": {"en": "Two\nlines", "fr": "Deux\tlignes"}},
            {"id": "1", "translation": {"en": "", "fr": "Vide"}}]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert load_pairs(opus_cfg(tmp_path, path)) == (["Two lines"], ["Deux lignes"])


def test_opus_books_missing_language_is_a_data_error(tmp_path: Path, offline) -> None:
    path = tmp_path / "de.jsonl"
    path.write_text(json.dumps({"id": "0", "translation": {"en": "Hi", "de": "Hallo"}}) + "\n")
    with pytest.raises(DataError, match="no fr translation"):
        load_pairs(opus_cfg(tmp_path, path))


def test_opus_books_missing_file_is_a_data_error(tmp_path: Path, offline) -> None:
    with pytest.raises(DataError, match="matches no file"):
        load_pairs(opus_cfg(tmp_path, tmp_path / "nothing.jsonl"))


def test_opus_books_hub_offline_is_one_line(tmp_path: Path, offline) -> None:
    cfg = DatasetConfig(name="opus_books", hf_path="transformer-mt-tests/not-a-dataset",
                        cache_dir=str(tmp_path / "cache"))
    with pytest.raises(DataError, match="hf_data_files") as info:
        load_pairs(cfg)
    assert "\n" not in str(info.value)


# ---------------------------------------------------------------------------------------------
# batching


def _lengths(n: int = 1500, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    tgt = rng.integers(1, 40, size=n)
    src = np.clip(tgt + rng.integers(-3, 4, size=n), 1, None)
    return np.stack([src, tgt], axis=1)


def test_batches_fit_and_cover_every_example_once() -> None:
    lengths = _lengths()
    sampler = TokenBatchSampler(lengths, batch_tokens=400, shuffle=True, seed=1)
    for epoch in range(3):
        batches = sampler.batches(epoch)
        assert len(batches) == len(sampler)
        flat = [i for b in batches for i in b]
        assert sorted(flat) == list(range(len(lengths)))
        for b in batches:
            padded = len(b) * (lengths[b].max() + 1)  # + eos on the source, bos/eos on the target
            assert padded <= 400


def test_batches_are_reproducible_and_change_per_epoch() -> None:
    lengths = _lengths()
    a = TokenBatchSampler(lengths, 400, shuffle=True, seed=1)
    b = TokenBatchSampler(lengths, 400, shuffle=True, seed=1)
    assert a.batches(0) == b.batches(0)
    assert a.batches(5) == a.batches(5)
    assert a.batches(0) != a.batches(1)
    assert a.batches(0) != TokenBatchSampler(lengths, 400, shuffle=True, seed=2).batches(0)


def test_batches_have_little_padding() -> None:
    lengths = _lengths(5000)
    pad = total = 0
    for b in TokenBatchSampler(lengths, 1000, shuffle=True, seed=0).batches(0):
        tgt = lengths[b, 1] + 1
        pad += len(b) * tgt.max() - tgt.sum()
        total += len(b) * tgt.max()
    assert pad / total < 0.05


def test_unshuffled_batches_are_length_sorted() -> None:
    lengths = _lengths()
    batches = TokenBatchSampler(lengths, 400, shuffle=False).batches(0)
    assert batches == TokenBatchSampler(lengths, 400, shuffle=False).batches(3)
    maxima = [lengths[b, 1].max() for b in batches]
    assert maxima == sorted(maxima)


def test_example_longer_than_budget_gets_its_own_batch() -> None:
    sampler = TokenBatchSampler([[3, 3], [50, 2], [3, 4]], batch_tokens=20, shuffle=False)
    assert sorted(map(sorted, sampler.batches(0))) == [[0, 2], [1]]


def test_shards_are_disjoint_and_equal() -> None:
    sampler = TokenBatchSampler(_lengths(), 400, shuffle=True, seed=4)
    shards = [sampler.batches(2, rank=r, world_size=3) for r in range(3)]
    assert len({len(s) for s in shards}) == 1 and len(shards[0]) == sampler.num_batches(3)
    seen = [i for shard in shards for b in shard for i in b]
    assert len(seen) == len(set(seen))
    with pytest.raises(ValueError):
        sampler.batches(0, rank=3, world_size=3)


def test_collate_shapes_and_padding() -> None:
    batch = collate([[5, 6, 7], [8]], [[9], [10, 11]])
    assert batch.src.tolist() == [[5, 6, 7, EOS_ID], [8, EOS_ID, PAD_ID, PAD_ID]]
    assert batch.tgt_in.tolist() == [[BOS_ID, 9, PAD_ID], [BOS_ID, 10, 11]]
    assert batch.tgt_out.tolist() == [[9, EOS_ID, PAD_ID], [10, 11, EOS_ID]]
    assert batch.src.dtype == batch.tgt_in.dtype == torch.long
    assert batch.n_tgt_tokens == 5 and batch.n_src_tokens == 6
    assert len(batch) == 2
    moved = batch.to("cpu")
    assert torch.equal(moved.tgt_out, batch.tgt_out)


def test_collate_accepts_arrays_and_empty_sequences() -> None:
    arrays = [np.array([5, 6], dtype=np.int32), np.array([], dtype=np.int32)]
    batch = collate(arrays, [[7], []])
    assert batch.src.tolist() == [[5, 6, EOS_ID], [EOS_ID, PAD_ID, PAD_ID]]
    assert batch.tgt_in.tolist() == [[BOS_ID, 7], [BOS_ID, PAD_ID]]
    assert batch.tgt_out.tolist() == [[7, EOS_ID], [EOS_ID, PAD_ID]]
    assert torch.equal(pad_sources(arrays), batch.src)
    with pytest.raises(ValueError):
        collate([], [])


def test_decoding_batches_follow_the_training_rule() -> None:
    """Decoding batches sorted by length, each within its token budget: the same cut as training's."""
    lengths = [5, 1, 9, 3, 3, 30, 7, 2]
    batches = length_sorted_batches(lengths, 20)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    flat = [lengths[i] for b in batches for i in b]
    assert flat == sorted(lengths)
    for b in batches:
        assert len(b) * (max(lengths[i] for i in b) + 1) <= 20 or len(b) == 1
    sampler = TokenBatchSampler([[n, 0] for n in lengths], 20, shuffle=False)
    assert [sorted(lengths[i] for i in b) for b in sampler.batches(0)] == [
        sorted(lengths[i] for i in b) for b in batches]


def test_ragged() -> None:
    seqs = [[1, 2, 3], [], [4], [5, 6]]
    offsets = np.cumsum([0, *map(len, seqs)])
    r = Ragged.from_offsets(np.array([i for s in seqs for i in s], dtype=np.int32), offsets)
    assert len(r) == 4 and r.tolist() == seqs and r.lengths.tolist() == [3, 0, 1, 2]
    assert r[0].tolist() == [1, 2, 3] and r[-1].tolist() == [5, 6]
    assert r[1:3].tolist() == [[], [4]]
    assert r.take([3, 0]).tolist() == [[5, 6], [1, 2, 3]]
    assert r.truncate(1).tolist() == [[1], [], [4], [5]]
    assert [a.tolist() for a in r] == seqs
    with pytest.raises(IndexError):
        r[4]


def test_a_memory_mapped_ragged_pickles_as_its_file(tmp_path: Path) -> None:
    """A worker process that gets a memory-mapped split maps the file itself (a copy of a corpus of GBs
    would double the memory it needs): the pickle names the file, and unpickled it reads the same ids.
    A view of a map, or ids in memory, travel as ids."""
    ids = np.arange(10_000, dtype=np.int32)
    ids.tofile(tmp_path / "train.bin")
    offsets = np.array([0, 3, 3, 9_000, 10_000])
    mapped = Ragged.from_offsets(np.memmap(tmp_path / "train.bin", dtype=np.int32, mode="r"), offsets)
    sent = pickle.dumps(mapped.take([3, 0]))
    assert len(sent) < 1_000
    back = pickle.loads(sent)
    assert isinstance(back.flat, np.memmap) and Path(back.flat.filename) == tmp_path / "train.bin"
    assert back.tolist() == mapped.take([3, 0]).tolist()
    view = Ragged(mapped.flat[1:], offsets[:-1], offsets[1:] - 1)
    for in_memory in (Ragged.from_offsets(ids, offsets), view):
        assert len(pickle.dumps(in_memory)) > ids.nbytes
        assert pickle.loads(pickle.dumps(in_memory)).tolist() == in_memory.tolist()
