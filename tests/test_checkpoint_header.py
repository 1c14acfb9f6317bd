"""A checkpoint's header is read without torch, and nothing in it runs: a real checkpoint reads as
torch.load reads it, damaged bytes are corrupt, a pickle naming code is refused, and storages or tensors
claiming more than the archive holds are refused (checkpoint_header.py). The files are the tiny trained
run's, or torch.save's of it changed."""

from __future__ import annotations

import itertools
import os
import random
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import ROOT
from transformer_mt.checkpoints.header import TensorHeader, read_header
from transformer_mt.checkpoints.parameter_count import parameter_count
from transformer_mt.checkpoints.paths import first_loadable
from transformer_mt.checkpoints.store import BEST, LATEST, load_checkpoint, save_checkpoint
from transformer_mt.config import ModelConfig
from transformer_mt.errors import CheckpointError
from transformer_mt.model import Transformer


@pytest.fixture(scope="module")
def trained(tiny_run: Path) -> dict[str, Any]:
    """The tiny run's best checkpoint, as torch loads it."""
    return load_checkpoint(tiny_run / BEST)


def test_a_real_checkpoint_reads_as_torch_loads_it(tiny_run: Path, trained: dict[str, Any]) -> None:
    """Every checkpoint the run wrote (with optimizer and RNG state) passes; the header holds the same
    model_config and each weight's shape."""
    for path in sorted(tiny_run.glob("*.pt")):
        header = read_header(path)
        assert header["model_config"] == load_checkpoint(path)["model_config"]
    header = read_header(tiny_run / BEST)
    assert {name: t.shape for name, t in header["model"].items()} == {
        name: tuple(t.shape) for name, t in trained["model"].items()}
    assert all(isinstance(t, TensorHeader) for t in header["model"].values())


def test_the_header_is_read_without_importing_torch(tiny_run: Path) -> None:
    code = ("import sys; from transformer_mt.checkpoints.header import read_header; "
            f"read_header({str(tiny_run / BEST)!r}); print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert done.stdout.strip() == "False"


def test_random_bytes_are_corrupt(tmp_path: Path, tiny_run: Path) -> None:
    generator = random.Random(0)
    for n, size in enumerate([1, 100, 20_000] * 10):
        path = tmp_path / f"random{n}.pt"
        path.write_bytes(generator.randbytes(size))
        with pytest.raises(CheckpointError, match="is corrupt or truncated"):
            read_header(path)
    good = (tiny_run / BEST).read_bytes()
    at = good.index(b"\x80\x02}")  # the pickle inside the zip: one damaged byte
    (tmp_path / "flipped.pt").write_bytes(good[:at + 3] + bytes([good[at + 3] ^ 0xFF]) + good[at + 4:])
    with pytest.raises(CheckpointError, match="is corrupt or truncated"):
        read_header(tmp_path / "flipped.pt")


class _Payload:
    """Would create a file when unpickled, if reading ran code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # noqa: ANN204
        return (os.system, (f"touch {self.marker}",))


def test_a_pickle_naming_code_is_refused_without_running_it(tmp_path: Path,
                                                             trained: dict[str, Any]) -> None:
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.pt"
    torch.save({**trained, "config": _Payload(marker)}, evil)
    with pytest.raises(CheckpointError, match=r"was refused: .*\(it names posix.system\)"):
        read_header(evil)
    assert not marker.exists()


def _rewritten(source: Path, target: Path, change: dict[str, bytes]) -> Path:
    """A copy of a checkpoint's archive with the entries named in `change` (by their name's end)
    holding other bytes."""
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(target, "w") as new:
        for info in old.infolist():
            ending = next((end for end in change if info.filename.endswith(end)), None)
            new.writestr(info, change[ending] if ending else old.read(info))
    return target


def test_a_compressed_archive_is_corrupt(tmp_path: Path, tiny_run: Path) -> None:
    """torch.save never compresses; a compressed entry could unpack to far more than the file holds."""
    path = tmp_path / "deflated.pt"
    with zipfile.ZipFile(tiny_run / BEST) as old, zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as new:
        for info in old.infolist():
            new.writestr(info.filename, old.read(info))
    with pytest.raises(CheckpointError, match=r"corrupt or truncated \(compressed entries"):
        read_header(path)


def test_a_legacy_pickle_before_a_valid_archive_is_refused_by_every_loader(tmp_path: Path,
                                                                          tiny_run: Path) -> None:
    """zipfile finds an archive by its end, torch.load a legacy pickle by the file's start: a file that is
    both must not pass the one check and be read by the other (on torch below 2.6 the legacy reader can
    run code under weights_only)."""
    from transformer_mt.decoding.translator import Translator

    path = tmp_path / "both.pt"
    with open(path, "wb") as file:
        torch.save({"anything": 1}, file, _use_new_zipfile_serialization=False)
        file.write((tiny_run / BEST).read_bytes())
    assert zipfile.is_zipfile(path)
    for load in (read_header, load_checkpoint, Translator.from_checkpoint):
        with pytest.raises(CheckpointError, match="not the zip archive torch.save writes"):
            load(path)


def test_the_python_api_checks_the_header_before_torch_builds_anything(tmp_path: Path,
                                                                     trained: dict[str, Any]) -> None:
    from transformer_mt.decoding.translator import Translator

    path = tmp_path / "claims.pt"
    claimed = {**trained["model_config"], "encoder_layers": 256}
    save_checkpoint({**trained, "model_config": claimed}, path)
    lacking = r"claims.pt: model_config describes a model of [\d,]+ parameters, its weights hold [\d,]+"
    with pytest.raises(CheckpointError, match=lacking) as refused:
        Translator.from_checkpoint(path, device="cpu")  # the weights against the config, on the meta device
    assert "\n" not in str(refused.value)


def test_a_storage_smaller_than_its_tensors_claim_is_refused(tmp_path: Path, tiny_run: Path) -> None:
    source = tiny_run / BEST
    with zipfile.ZipFile(source) as archive:
        largest = max((i for i in archive.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
        key = largest.filename.rsplit("/", 1)[1]
        short = archive.read(largest)[:largest.file_size // 2]
    path = _rewritten(source, tmp_path / "short.pt", {f"/data/{key}": short})
    with pytest.raises(CheckpointError, match=rf"corrupt or truncated \(its storage '{key}' claims "
                                              rf"[\d,]+ elements of torch.float32 over {len(short):,} bytes"):
        read_header(path)


def test_a_view_claiming_more_than_its_storage_is_refused(tmp_path: Path, trained: dict[str, Any]) -> None:
    """A view with stride 0 gives any shape to a few bytes."""
    weights = {name: torch.zeros(1).expand(t.shape) for name, t in trained["model"].items()}
    path = tmp_path / "views.pt"
    save_checkpoint({**trained, "model": weights}, path)
    with pytest.raises(CheckpointError, match=r"model\['.*'\] claims shape .* over 4 bytes; the file is"):
        read_header(path)


@pytest.mark.parametrize(("field", "value", "message"), [
    ("d_model", "big", "model_config.d_model is 'big', expected an integer"),
    ("d_model", 20480, "model.d_model=20480 is out of range"),
    ("d_model", 512, r"model_config describes a model of [\d,]+ parameters, its weights hold [\d,]+ \("),
    ("encoder_layers", 256, r"model_config describes a model of [\d,]+ parameters, its weights hold"),
    ("tgt_vocab_size", 10**7, "model_config.tgt_vocab_size is 10000000, expected"),
    ("max_positions", 16384, r"max_positions=16384 × d_model=\d+ asks for a table of [\d,]+ positional"),
])
def test_a_model_config_that_does_not_fit_is_one_line(tmp_path: Path, trained: dict[str, Any], field: str,
                                                      value: Any, message: str) -> None:
    path = tmp_path / "claims.pt"
    save_checkpoint({**trained, "model_config": {**trained["model_config"], field: value}}, path)
    with pytest.raises(CheckpointError, match=message):
        read_header(path)


def test_a_word_list_that_is_not_text_is_one_line(tmp_path: Path, trained: dict[str, Any]) -> None:
    path = tmp_path / "words.pt"
    save_checkpoint({**trained, "words": 7}, path)
    with pytest.raises(CheckpointError, match="words is 7, expected a string"):
        read_header(path)


def test_the_parameter_count_of_a_config_is_the_built_models() -> None:
    """parameter_count's count, which refuses a checkpoint before torch is imported, is the model's own, for
    every choice that changes it."""
    choices = itertools.product([True, False], [True, False], [True, False], ["learned", "sinusoidal"],
                                [(1, 2), (3, 1)])
    for tie, tie_output, norm_first, positional, (encoder, decoder) in choices:
        config = ModelConfig(d_model=8, n_heads=2, d_ff=12, encoder_layers=encoder, decoder_layers=decoder,
                             max_positions=20, tie_embeddings=tie, tie_output=tie_output,
                             norm_first=norm_first, positional=positional)
        sizes = (30, 30) if tie else (30, 25)
        assert parameter_count(config, *sizes) == Transformer(config, *sizes).num_parameters(), config


def test_a_run_whose_latest_checkpoint_is_damaged_resumes_from_the_previous(tiny_run_copy: Path) -> None:
    """The header check of resume= tries the run's files as the loader does (checkpoint_paths)."""
    latest = tiny_run_copy / LATEST
    latest.unlink()  # a link to the newest numbered file: damage a copy of its own
    latest.write_bytes(b"not a zip")
    path, header = first_loadable(tiny_run_copy, read_header, warn=False)
    assert path.name != LATEST and header["step"] > 0
