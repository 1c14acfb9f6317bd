"""Any parallel corpus, any language pair: Tatoeba files of other languages, plain parallel files, a TSV,
a Hugging Face dataset on disk; each trains end to end, bad files fail in one line, the split stays
leak-free, and the memory-mapped cache gives the batches an in-memory one would."""

from __future__ import annotations

import gzip
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

import transformer_mt as tmt
from transformer_mt.checkpoints.store import load_checkpoint
from transformer_mt.config import DatasetConfig, TokenizerConfig
from transformer_mt.data import TokenBatchSampler, prepare_data
from transformer_mt.errors import ConfigError, DataError

EN = ["the cat", "a dog", "my house", "the tree", "a red car", "the big city", "small birds", "it runs",
      "she sleeps", "we eat"]
DE = ["die Katze", "ein Hund", "mein Haus", "der Baum", "ein rotes Auto", "die grosse Stadt",
      "kleine Vögel", "es rennt", "sie schläft", "wir essen"]


def pairs(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """n English-German pairs of a few words, some sentences repeated as real corpora repeat them."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        k = rng.integers(0, len(EN), size=1 + i % 3)
        en, de = (" ".join(words[j] for j in k).capitalize() + "." for words in (EN, DE))
        out.append((en, de))
    return out


def tatoeba_zip(path: Path, rows: list[tuple[str, str]]) -> Path:
    """A deu-eng.zip as manythings.org ships it: English, German, attribution; and _about.txt."""
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("_about.txt", "terms")
        lines = (f"{e}\t{d}\tCC-BY 2.0 (France) #{i}\n" for i, (e, d) in enumerate(rows))
        zf.writestr("deu.txt", "".join(lines))
    return path


def write_lines(path: Path, lines: list[str]) -> Path:
    data = "".join(f"{line}\n" for line in lines).encode("utf-8")
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return path


def hf_dataset(path: Path, rows: list[tuple[str, str]]) -> Path:
    """A DatasetDict in the translation schema with its own validation and test splits, saved to disk."""
    import datasets

    def part(chunk: list[tuple[str, str]]) -> datasets.Dataset:
        return datasets.Dataset.from_dict({"translation": [{"en": e, "de": d} for e, d in chunk]})

    datasets.DatasetDict({"train": part(rows[:240]), "validation": part(rows[240:270]),
                          "test": part(rows[270:])}).save_to_disk(str(path))
    return path


def _train(tmp_path: Path, *dataset: str) -> Path:
    run_dir = tmp_path / "run"
    tmt.train(["debug=tiny", "tokenizer=char", f"dataset.cache_dir={tmp_path / 'cache'}",
               "dataset.valid_size=20", "dataset.test_size=20", "training.valid_max_sentences=8",
               "device.num_threads=1", f"checkpoint.dir={run_dir}", *dataset])
    return run_dir


def _held_out_and_train(data) -> tuple[set[str], set[str]]:  # noqa: ANN001
    train = set(data.vocab.decode_src(data.train.src_ids.tolist()))
    return train, set(data.valid.src_text) | set(data.test.src_text)


def test_tatoeba_of_another_language(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    zipped = tatoeba_zip(tmp_path / "deu-eng.zip", pairs(300))
    with caplog.at_level("INFO"):
        run = _train(tmp_path, f"dataset.path={zipped}", "dataset.url=null", "dataset.src_lang=en",
                     "dataset.tgt_lang=de")
    assert "deu-eng.zip en->de" in caplog.text
    state = load_checkpoint(run / "latest.pt")
    assert (state["config"]["dataset"]["src_lang"], state["config"]["dataset"]["tgt_lang"]) == ("en", "de")
    assert any(word in (run / "split" / "test.tsv").read_text() for word in ("katze", "hund", "haus"))
    assert json.loads((run / "split" / "train_summary.json").read_text())["tgt_lang"] == "de"
    reverse = prepare_data(DatasetConfig(path=str(zipped), url=None, src_lang="de", tgt_lang="en",
                                         cache_dir=str(tmp_path / "cache"), valid_size=20, test_size=20),
                           TokenizerConfig(kind="char", vocab_size=100))
    assert reverse.test.tgt_text[0].isascii()  # German to English: English on the target side


def test_parallel_files_and_a_tsv(tmp_path: Path) -> None:
    rows = pairs(300, seed=1)
    src = write_lines(tmp_path / "train.en.gz", [e for e, _ in rows])  # gzip is read as such
    tgt = write_lines(tmp_path / "train.de", [d for _, d in rows])
    run = _train(tmp_path, "dataset=parallel", f"dataset.src_path={src}", f"dataset.tgt_path={tgt}",
                 "dataset.src_lang=en", "dataset.tgt_lang=de")
    assert (run / "best.pt").exists()
    tsv = write_lines(tmp_path / "train.tsv", [f"{e}\t{d}" for e, d in rows])
    cfg = DatasetConfig(name="parallel", path=str(tsv), url=None, src_lang="en", tgt_lang="de",
                        cache_dir=str(tmp_path / "cache"), valid_size=20, test_size=20)
    from_tsv = prepare_data(cfg, TokenizerConfig(kind="char", vocab_size=100))
    files = DatasetConfig(**{**cfg.__dict__, "path": None, "src_path": str(src), "tgt_path": str(tgt)})
    from_files = prepare_data(files, TokenizerConfig(kind="char", vocab_size=100))
    assert from_tsv.test.src_text == from_files.test.src_text  # the same pairs, the same split
    assert from_tsv.train.src_ids.tolist() == from_files.train.src_ids.tolist()


def test_parallel_files_with_their_own_held_out_pairs(tmp_path: Path) -> None:
    rows = pairs(300, seed=2)
    files = {}
    for name, chunk in (("train", rows[:240]), ("valid", rows[240:270]), ("test", rows[270:])):
        files[name] = (write_lines(tmp_path / f"{name}.en", [e for e, _ in chunk]),
                       write_lines(tmp_path / f"{name}.de", [d for _, d in chunk]))
    cfg = DatasetConfig(name="parallel", path=None, url=None, src_path=str(files["train"][0]),
                        tgt_path=str(files["train"][1]), valid_src_path=str(files["valid"][0]),
                        valid_tgt_path=str(files["valid"][1]), test_src_path=str(files["test"][0]),
                        test_tgt_path=str(files["test"][1]), src_lang="en", tgt_lang="de",
                        cache_dir=str(tmp_path / "cache"))
    data = prepare_data(cfg, TokenizerConfig(kind="char", vocab_size=100))
    assert (len(data.valid), len(data.test)) == (30, 30) and data.stats["held_out_given"]
    assert data.valid.src_text == [e for e, _ in rows[240:270]]
    train, held_out = _held_out_and_train(data)
    assert not train & held_out  # training pairs that share a sentence with them were left out
    assert len(data.train) < 240


def test_a_valid_part_without_a_test_part(tmp_path: Path) -> None:
    """The test split is then drawn from the training pairs, leak-free, or left out with test_size=0."""
    rows = [(f"The cat {i}.", f"Die Katze {i}.") for i in range(300)]
    train = write_lines(tmp_path / "train.tsv", [f"{e}\t{d}" for e, d in rows[:260] + rows[270:275]])
    valid = write_lines(tmp_path / "valid.tsv", [f"{e}\t{d}" for e, d in rows[260:]])
    cfg = DatasetConfig(name="parallel", path=str(train), valid_path=str(valid), url=None, src_lang="en",
                        tgt_lang="de", test_size=25, cache_dir=str(tmp_path / "cache"))
    data = prepare_data(cfg, TokenizerConfig(kind="char", vocab_size=100), tmp_path / "run")
    assert data.valid.src_text == [e for e, _ in rows[260:]]
    assert (len(data.test), len(data.train)) == (25, 235)  # 5 training pairs were valid pairs
    train_text, held_out = _held_out_and_train(data)
    assert not train_text & held_out and not set(data.test.src_text) & set(data.valid.src_text)
    assert (tmp_path / "run" / "split" / "test.tsv").read_text().count("\n") == len(data.test)
    assert tmt.data.held_out_pairs(cfg, "test") == list(zip(data.test.src_text, data.test.tgt_text))
    none = prepare_data(DatasetConfig(**{**cfg.__dict__, "test_size": 0}), TokenizerConfig(kind="char",
                                                                                        vocab_size=100))
    assert len(none.test) == 0 and len(none.train) == 260


def test_a_hugging_face_dataset_on_disk(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    saved = hf_dataset(tmp_path / "hf", pairs(300, seed=3))
    with caplog.at_level("INFO"):
        run = _train(tmp_path, "dataset=hf", f"dataset.hf_path={saved}", "dataset.src_lang=de",
                     "dataset.tgt_lang=en")
    assert "de->en" in caplog.text and (run / "best.pt").exists()
    assert len((run / "split" / "valid.tsv").read_text().splitlines()) == 30  # its own validation split
    with pytest.raises(DataError, match="has no fr translation"):
        prepare_data(DatasetConfig(name="hf", hf_path=str(saved), path=None, url=None, src_lang="en",
                                   tgt_lang="fr", cache_dir=str(tmp_path / "cache2")),
                     TokenizerConfig(kind="char", vocab_size=100))


def test_a_repeated_source_sentence_stays_in_one_split(tmp_path: Path) -> None:
    rows = pairs(400, seed=4) + [("The cat.", f"Variante {i}.") for i in range(12)]  # one source, 13 targets
    tsv = write_lines(tmp_path / "dup.tsv", [f"{e}\t{d}" for e, d in rows])
    data = prepare_data(DatasetConfig(name="parallel", path=str(tsv), url=None, src_lang="en", tgt_lang="de",
                                      cache_dir=str(tmp_path / "cache"), valid_size=40, test_size=40),
                        TokenizerConfig(kind="char", vocab_size=100))
    train, held_out = _held_out_and_train(data)
    assert not train & held_out


def test_the_memory_mapped_cache_holds_the_training_pairs_in_split_order(tmp_path: Path) -> None:
    """The cached, memory-mapped training ids are the reference split's training pairs, encoded one by
    one in its order; token batches taken from them equal batches collated from those lists."""
    from tests.test_data import reference_split
    from transformer_mt.data import collate, load_pairs

    rows = pairs(500, seed=5)
    tsv = write_lines(tmp_path / "c.tsv", [f"{e}\t{d}" for e, d in rows])
    cfg = DatasetConfig(name="parallel", path=str(tsv), url=None, src_lang="en", tgt_lang="de",
                        cache_dir=str(tmp_path / "cache"), valid_size=20, test_size=20, max_len=1000)
    data = prepare_data(cfg, TokenizerConfig(kind="char", vocab_size=100))
    assert isinstance(data.train.src_ids.flat, np.memmap)
    src, tgt = load_pairs(cfg)
    train, _, _ = reference_split(src, tgt, 20, 20, cfg.split_seed)
    expected_src = data.vocab.encode_src([src[i] for i in train])
    expected_tgt = data.vocab.encode_tgt([tgt[i] for i in train])
    assert data.train.src_ids.tolist() == expected_src and data.train.tgt_ids.tolist() == expected_tgt
    for indices in TokenBatchSampler(data.train.lengths(), 200, seed=3).batches(0):
        mapped = data.train.batch(indices)
        plain = collate([expected_src[i] for i in indices], [expected_tgt[i] for i in indices])
        assert torch.equal(mapped.src, plain.src) and torch.equal(mapped.tgt_out, plain.tgt_out)


@pytest.mark.parametrize(("files", "expected"), [
    ({"a.en": "one\ntwo\nthree\n", "a.de": "eins\nzwei\n"}, "a.de has 2 lines but .*a.en has more"),
    ({"a.en": "", "a.de": ""}, "holds no pairs"),
    ({"a.en": b"caf\xe9\n", "a.de": "Kaffee\n"}, r"a.en: line 1 is not valid UTF-8 \(byte 0xe9\)"),
    ({"p.tsv": "one\teins\ntwo zwei\n"}, r"p.tsv: line 2 has 1 tab-separated columns, expected 2"),
])
def test_bad_files_fail_in_one_line(tmp_path: Path, files: dict[str, str | bytes], expected: str) -> None:
    for name, content in files.items():
        (tmp_path / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    paths = ({"path": str(tmp_path / "p.tsv")} if "p.tsv" in files else
             {"path": None, "src_path": str(tmp_path / "a.en"), "tgt_path": str(tmp_path / "a.de")})
    cfg = DatasetConfig(name="parallel", url=None, src_lang="en", tgt_lang="de",
                        cache_dir=str(tmp_path / "c"), **paths)
    with pytest.raises(DataError, match=expected) as info:
        prepare_data(cfg, TokenizerConfig(kind="char", vocab_size=100))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(("overrides", "expected"), [
    ({"name": "parallel", "path": None}, "dataset=parallel needs its training pairs"),
    ({"name": "parallel", "path": None, "src_path": "a"},
     "dataset.src_path and dataset.tgt_path go together"),
    ({"name": "parallel", "test_path": "t.tsv"}, "takes test pairs with valid pairs of their own"),
    ({"name": "hf", "path": None}, "dataset=hf needs dataset.hf_path="),
    ({"src_lang": "de", "tgt_lang": "fr"}, "dataset=tatoeba pairs English with another language"),
    ({"src_lang": "de", "tgt_lang": "de"}, "are both 'de'"),
])
def test_source_settings_are_checked(overrides: dict[str, object], expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        DatasetConfig(**overrides).check()


def test_another_tatoeba_file_is_not_fetched_from_the_french_address(tmp_path: Path) -> None:
    cfg = DatasetConfig(path=str(tmp_path / "deu-eng.zip"), src_lang="en", tgt_lang="de",
                        cache_dir=str(tmp_path / "cache"))
    with pytest.raises(DataError, match="set dataset.url=https://www.manythings.org/anki/deu-eng.zip"):
        prepare_data(cfg, TokenizerConfig(kind="char", vocab_size=100))


def test_damaged_gzip_and_another_language_fail_in_one_line(tmp_path: Path) -> None:
    write_lines(tmp_path / "a.de", ["eins", "zwei"])
    whole = gzip.compress(b"one\ntwo\n" * 2000)
    for name, content in (("plain.en.gz", b"one\ntwo\n"), ("cut.en.gz", whole[: len(whole) // 2])):
        (tmp_path / name).write_bytes(content)
        cfg = DatasetConfig(name="parallel", path=None, url=None, src_path=str(tmp_path / name),
                            tgt_path=str(tmp_path / "a.de"), src_lang="en", tgt_lang="de",
                            cache_dir=str(tmp_path / "c"))
        with pytest.raises(DataError, match=f"{name}: unreadable after line") as info:
            prepare_data(cfg, TokenizerConfig(kind="char", vocab_size=100))
        assert "\n" not in str(info.value)
    german = tatoeba_zip(tmp_path / "deu-eng.zip", pairs(50))
    cfg = DatasetConfig(path=str(german), url=None, cache_dir=str(tmp_path / "c"))  # en->fr by default
    with pytest.raises(DataError, match="deu-eng.zip holds English-deu pairs, but the config asks for en->"):
        prepare_data(cfg, TokenizerConfig(kind="char", vocab_size=100))
