"""Checkpoints are checked before they are trusted: damaged bytes, malformed fields, weights that do not fit
their config and configs that claim more than the file holds each fail alone, in one line, before a model
is built. Checkpoints here are written in this process from a model of a few hundred parameters."""

from __future__ import annotations

import dataclasses
import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import ROOT
from transformer_mt.checkpoints.store import (
    average_checkpoints,
    build_model,
    load_checkpoint,
    load_latest_good,
    model_from_checkpoint,
    model_spec,
    save_checkpoint,
    saved_overrides,
)
from transformer_mt.config import ModelConfig, TokenizerConfig
from transformer_mt.data.tokenizer import Vocabulary, train_tokenizers
from transformer_mt.errors import CheckpointError
from transformer_mt.training import finetune

SOURCES = ["the cat sat", "a dog ran", "the dog sat down", "a cat ran away"]
TARGETS = ["le chat", "un chien", "le chien", "un chat"]
TINY = ModelConfig(d_model=8, n_heads=2, d_ff=16, encoder_layers=1, decoder_layers=1, max_positions=32)
# A config about 700 MB of float32 would take to build (176M parameters), for a vocabulary of a few words.
LARGE = {"d_model": 1024, "n_heads": 8, "d_ff": 4096, "encoder_layers": 6, "decoder_layers": 6,
         "max_positions": 256}
# Within every bound and with the weights' own d_model: layers and a feed-forward of 570M parameters.
DEEP = {"d_ff": 65536, "encoder_layers": 256, "decoder_layers": 256}
# The claim: far past every bound.
HUGE = {"d_model": 65536, "n_heads": 8, "d_ff": 65536, "encoder_layers": 100, "decoder_layers": 100,
        "src_vocab_size": 10_000_000, "tgt_vocab_size": 10_000_000}


@pytest.fixture(scope="module")
def state() -> dict[str, Any]:
    """What training writes, for a model of a few hundred parameters (no optimizer: inference only)."""
    torch.manual_seed(0)
    tokenizer = TokenizerConfig(kind="wordlevel", vocab_size=40, min_frequency=1)
    vocab = train_tokenizers(tokenizer, SOURCES, TARGETS)
    model = build_model(TINY, vocab)
    return {"model_config": model_spec(model), "model": model.state_dict(), "tokenizer": vocab.to_json(),
            "config": {"tokenizer": dataclasses.asdict(tokenizer),
                       "dataset": {"src_lang": "en", "tgt_lang": "fr"}},
            "overrides": ["debug=tiny"], "epoch": 1, "step": 3}


def _write(tmp_path: Path, state: dict[str, Any], name: str = "ckpt.pt", **changes: Any) -> Path:
    path = tmp_path / name
    save_checkpoint({**state, **changes}, path)
    return path


def _with_config(state: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {**state, "model_config": {**state["model_config"], **fields}}


def test_a_checked_checkpoint_loads_its_weights_exactly(tmp_path: Path, state: dict[str, Any]) -> None:
    _, _, model, vocab = model_from_checkpoint(_write(tmp_path, state))
    loaded = model.state_dict()
    assert all(torch.equal(loaded[name], tensor) for name, tensor in state["model"].items())
    assert vocab.src_vocab_size == state["model_config"]["src_vocab_size"]


@pytest.mark.parametrize(("fields", "message"), [
    ({"d_model": "abc"}, "model_config.d_model is 'abc', expected an integer"),
    ({"n_heads": True}, "model_config.n_heads is True, expected an integer"),
    ({"dropout": "x"}, "model_config.dropout is 'x', expected a number"),
    ({"layer_norm_eps": float("nan")}, "model_config.layer_norm_eps is nan, expected a finite number"),
    ({"activation": 3}, "model_config.activation is 3, expected a string"),
    ({"norm_first": "no"}, "model_config.norm_first is 'no', expected true or false"),
    ({"src_vocab_size": "40"}, "model_config.src_vocab_size is '40', expected an integer"),
    ({"pad_id": 2}, "model_config.pad_id is 2, expected 0"),
    ({"n_layers": 6}, "model_config.n_layers is not a setting of this version's ModelConfig"),
])
def test_a_malformed_model_config_field_is_one_line_naming_it(tmp_path: Path, state: dict[str, Any],
                                                             fields: dict[str, Any], message: str) -> None:
    path = _write(tmp_path, _with_config(state, **fields))
    with pytest.raises(CheckpointError, match="^checkpoint .*: " + message.replace("(", r"\(")) as info:
        model_from_checkpoint(path)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(("changes", "message"), [
    ({"format_version": "1"}, "format_version is '1', expected an integer"),
    ({"model_config": "oops"}, "model_config is 'oops', expected a mapping"),
    ({"tokenizer": {"kind": "bpe"}}, "has no tokenizer.joint"),
    ({"step": -1}, "step is -1, expected an integer >= 0"),
    ({"model": {"w": [1, 2]}}, "model\\['w'\\] is 'list', expected a tensor"),
])
def test_a_malformed_entry_is_one_line_naming_it(tmp_path: Path, state: dict[str, Any],
                                                 changes: dict[str, Any], message: str) -> None:
    path = tmp_path / "ckpt.pt"
    torch.save({"format_version": 1, **state, **changes}, path)
    with pytest.raises(CheckpointError, match=message) as info:
        model_from_checkpoint(path)
    assert "\n" not in str(info.value)


def test_model_sizes_have_upper_bounds() -> None:
    problems = ModelConfig(d_model=20480, n_heads=4, d_ff=100_000, encoder_layers=1000,
                           max_positions=100_000).problems()
    assert "model.d_model=20480 is out of range; it must be between 1 and 16384" in problems
    assert any(p.startswith("model.d_ff=100000") for p in problems)
    assert any(p.startswith("model.encoder_layers=1000") for p in problems)
    assert any(p.startswith("model.max_positions=100000") for p in problems)
    assert TokenizerConfig(vocab_size=10_000_000).problems()


def test_a_config_claiming_a_huge_model_is_refused_by_its_bounds(tmp_path: Path,
                                                                 state: dict[str, Any]) -> None:
    path = _write(tmp_path, _with_config(state, **HUGE))
    with pytest.raises(CheckpointError, match="model_config.src_vocab_size is 10000000, expected"):
        model_from_checkpoint(path)
    path = _write(tmp_path, _with_config(state, **{k: v for k, v in HUGE.items() if "vocab" not in k}))
    with pytest.raises(CheckpointError, match="model.d_model=65536 is out of range"):
        model_from_checkpoint(path)


def test_weights_that_do_not_fit_the_config_are_named(tmp_path: Path, state: dict[str, Any]) -> None:
    weights = dict(state["model"])
    weights["encoder.layers.0.feed_forward.linear1.weight"] = torch.zeros(12, 8)
    with pytest.raises(CheckpointError, match=r"'encoder.layers.0.feed_forward.linear1.weight'\] is "
                                              r"\(12, 8\), the config needs \(16, 8\)"):
        model_from_checkpoint(_write(tmp_path, state, model=weights))
    del weights["encoder.layers.0.feed_forward.linear1.weight"]
    with pytest.raises(CheckpointError, match="model lacks 'encoder.layers.0.feed_forward.linear1.weight'"):
        model_from_checkpoint(_write(tmp_path, state, model=weights))


def test_a_vocabulary_that_does_not_fit_the_embeddings_is_refused(tmp_path: Path,
                                                                  state: dict[str, Any]) -> None:
    """The tokenizer and model_config agree, the embedding tensors hold another vocabulary."""
    vocab = state["model_config"]["src_vocab_size"]
    weights = {name: (torch.zeros(vocab + 5, 8) if tensor.shape == (vocab, 8) else tensor)
               for name, tensor in state["model"].items()}
    with pytest.raises(CheckpointError, match=rf"is \({vocab + 5}, 8\), the config needs \({vocab}, 8\)"):
        model_from_checkpoint(_write(tmp_path, state, model=weights))


def test_a_tensor_claiming_more_than_its_storage_is_refused(tmp_path: Path, state: dict[str, Any]) -> None:
    """A view with stride 0 gives any shape to a few bytes: with a config to match, a model that size
    would be built."""
    claim = _with_config(state, d_model=256, d_ff=1024, n_heads=4)
    with torch.device("meta"):
        shapes = {name: t.shape for name, t in build_model(
            ModelConfig(**{**dataclasses.asdict(TINY), "d_model": 256, "d_ff": 1024, "n_heads": 4}),
            Vocabulary.from_json(state["tokenizer"])).state_dict().items()}
    weights = {name: torch.zeros(1).expand(shape) for name, shape in shapes.items()}
    with pytest.raises(CheckpointError, match="claims shape .* over 4 bytes; the file is damaged"):
        model_from_checkpoint(_write(tmp_path, claim, model=weights))


def _tokenizer_json(state: dict[str, Any], **changes: Any) -> dict[str, str]:
    spec = json.loads(state["tokenizer"]["src"])
    spec.update(changes)
    return {**state["tokenizer"], "src": json.dumps(spec)}


def test_a_tokenizer_that_pads_or_is_not_json_is_refused(tmp_path: Path, state: dict[str, Any]) -> None:
    padded = _tokenizer_json(state, padding={"strategy": {"Fixed": 10**9}, "direction": "Right",
                                             "pad_to_multiple_of": None, "pad_id": 0, "pad_type_id": 0,
                                             "pad_token": "<pad>"})
    with pytest.raises(CheckpointError, match="tokenizer.src.padding is .*, expected null"):
        model_from_checkpoint(_write(tmp_path, state, tokenizer=padded))
    garbled = {**state["tokenizer"], "src": "{not json"}
    with pytest.raises(CheckpointError, match="tokenizer.src is '{not json', expected a tokenizer's JSON"):
        model_from_checkpoint(_write(tmp_path, state, tokenizer=garbled))
    unreadable = _tokenizer_json(state, model={"type": "Nonsense"})
    with pytest.raises(CheckpointError, match="its tokenizer cannot be read"):
        model_from_checkpoint(_write(tmp_path, state, tokenizer=unreadable))


def test_a_tokenizer_other_than_ours_is_refused_before_it_splits_a_text(tmp_path: Path,
                                                                       state: dict[str, Any]) -> None:
    """A crafted splitter regex or normaliser could make tokenizers panic or run for ever on a user's text:
    only the parts transformer-mt builds for the kind are read; a vocabulary of absurd pieces neither."""
    from transformer_mt.checkpoints.tokenizer_rules import check_tokenizer_parts as _check_tokenizer_parts

    split = {"type": "Split", "pattern": {"Regex": "(a+)+$"}, "behavior": "Isolated", "invert": False}
    for part, value in (("pre_tokenizer", split), ("normalizer", {"type": "Lowercase"}),
                        ("decoder", {"type": "Fuse"})):
        crafted = _tokenizer_json(state, **{part: value})
        with pytest.raises(CheckpointError, match=rf"tokenizer.src.{part} is .*, expected the {part} "
                                                  r"transformer-mt builds for tokenizer.kind=wordlevel"):
            model_from_checkpoint(_write(tmp_path, state, tokenizer=crafted))
    spec = json.loads(state["tokenizer"]["src"])
    _check_tokenizer_parts(tmp_path, "tokenizer.src", "wordlevel", spec)  # as trained: accepted
    with pytest.raises(CheckpointError, match="model.type is 'WordLevel', expected 'BPE' for bpe"):
        _check_tokenizer_parts(tmp_path, "tokenizer.src", "bpe", spec)
    spec["model"]["vocab"]["x" * 300] = len(spec["model"]["vocab"])
    with pytest.raises(CheckpointError, match="longest piece is '300 characters', expected at most 256"):
        _check_tokenizer_parts(tmp_path, "tokenizer.src", "wordlevel", spec)


def test_random_bytes_are_corrupt_not_refused(tmp_path: Path, state: dict[str, Any]) -> None:
    """Damaged bytes are reported as corrupt (use an earlier checkpoint), whatever the unpickler makes of
    them; only a pickle naming code is refused (test_faults.py)."""
    generator = random.Random(0)
    for n, size in enumerate([1, 100, 20_000] * 20):
        path = tmp_path / f"random{n}.pt"
        path.write_bytes(generator.randbytes(size))
        with pytest.raises(CheckpointError, match="is corrupt or truncated"):
            load_checkpoint(path)
    good = _write(tmp_path, state).read_bytes()
    at = good.index(b"\x80\x02}")  # the pickle inside the zip: one damaged byte
    (tmp_path / "flipped.pt").write_bytes(good[:at + 3] + bytes([good[at + 3] ^ 0xFF]) + good[at + 4:])
    with pytest.raises(CheckpointError, match="is corrupt or truncated"):
        load_checkpoint(tmp_path / "flipped.pt")


def test_resume_from_a_checkpoint_without_its_overrides_is_one_line(tmp_path: Path,
                                                                    state: dict[str, Any]) -> None:
    assert saved_overrides(_write(tmp_path, state)) == ["debug=tiny"]
    bare = {k: v for k, v in state.items() if k != "overrides"}
    with pytest.raises(CheckpointError, match="does not record the overrides its run was started with"):
        saved_overrides(_write(tmp_path, bare))
    with pytest.raises(CheckpointError, match="overrides is 'debug=tiny', expected a list of strings"):
        saved_overrides(_write(tmp_path, state, overrides="debug=tiny"))


def test_a_resumed_position_of_the_wrong_type_is_one_line(tmp_path: Path, state: dict[str, Any]) -> None:
    training = {**state, "optimizer": {}, "scheduler": {}, "batch_in_epoch": 0, "bad_epochs": 0,
                "validated": False, "best": {"metric": "bleu", "value": None, "epoch": None}, "world_size": 1,
                "train_seconds": 1.5, "rng": {}}
    assert load_latest_good(_write(tmp_path, training))[1]["step"] == 3
    with pytest.raises(CheckpointError, match="world_size is '2', expected an integer"):
        load_latest_good(_write(tmp_path, training, world_size="2"))
    with pytest.raises(CheckpointError, match="has no batch_in_epoch"):
        load_latest_good(_write(tmp_path, {k: v for k, v in training.items() if k != "batch_in_epoch"}))
    with pytest.raises(CheckpointError, match="train_seconds is inf, expected a number of seconds >= 0"):
        load_latest_good(_write(tmp_path, training, train_seconds=float("inf")))


def test_a_parent_without_its_tokenizer_config_is_one_line(tmp_path: Path, state: dict[str, Any]) -> None:
    init = str(_write(tmp_path, state))
    assert "model.d_model=8" in finetune.parent_overrides(finetune.load_parent(init)[1])
    for changes, message in [({"config": {"dataset": state["config"]["dataset"]}}, "has no config.tokenizer"),
                             ({"config": {**state["config"], "tokenizer": {"vocab_size": "8k"}}},
                              "config.tokenizer.vocab_size is '8k', expected an integer"),
                             ({"step": "3"}, "step is '3', expected an integer")]:
        init = str(_write(tmp_path, state, **changes))
        with pytest.raises(CheckpointError, match=f"init={init}: .*{message}"):
            finetune.parent_overrides(finetune.load_parent(init)[1])


def test_averaging_checkpoints_of_other_shapes_is_one_line(tmp_path: Path, state: dict[str, Any]) -> None:
    other = {name: torch.zeros(3, *tensor.shape[1:]) if name.endswith("linear1.bias") else tensor
             for name, tensor in state["model"].items()}
    paths = [_write(tmp_path, state, "a.pt"), _write(tmp_path, state, "b.pt", model=other)]
    with pytest.raises(CheckpointError, match="different models"):
        average_checkpoints(paths)


# The child's peak memory, measured by a parent that starts only it (RUSAGE_CHILDREN: its children).
_PEAK = ("import resource, subprocess, sys; done = subprocess.run(sys.argv[1:], capture_output=True, "
         "text=True); sys.stderr.write(done.stderr); "
         "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(done.returncode)")
# The bar, 300 MB, in its stricter reading: 286.1 MiB (300 MB is 292,969 KiB).
LIMIT_KIB = 286_102


def _peak_kib(*args: str, returncode: int = 2) -> tuple[int, str]:
    """(peak RSS in KiB, stderr) of `python args` run as a user would."""
    done = subprocess.run([sys.executable, "-c", _PEAK, sys.executable, *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == returncode, done.stderr[-2000:]
    return int(done.stdout.split()[-1]), done.stderr.strip()


@pytest.fixture(scope="module")
def torch_kib() -> int:
    """The peak of a process that imports torch and does nothing else."""
    return _peak_kib("-c", "import torch", returncode=0)[0]


@pytest.mark.parametrize(("claim", "command"), [
    (LARGE, "translate"), (HUGE, "translate"), (DEEP, "translate"), (LARGE, "evaluate"), (LARGE, "init"),
    (LARGE, "resume"),
])
def test_a_crafted_checkpoint_claiming_a_huge_model_is_refused_in_little_memory(
        tmp_path: Path, state: dict[str, Any], torch_kib: int, claim: dict[str, int], command: str,
        corpus: Path) -> None:
    """A few kB whose model_config claims hundreds of millions of parameters: refused in one line from its
    header, before torch is imported, so in under 300 MB and in less than half what importing torch alone
    takes. (Fine-tuning is given a corpus, so that nothing else could stop it before it reads the file.)"""
    crafted = _write(tmp_path, _with_config(state, **claim))
    assert crafted.stat().st_size < 64_000
    args = {"translate": ["translate", f"checkpoint={crafted}", "text=hi"],
            "evaluate": ["evaluate", f"checkpoint={crafted}"],
            "init": ["train", f"init={crafted}", f"checkpoint.dir={tmp_path / 'run'}",
                     f"dataset.path={corpus}", "dataset.url=null", "dataset.max_pairs=300",
                     f"dataset.cache_dir={tmp_path / 'cache'}", "device.num_threads=1"],
            "resume": ["train", f"resume={crafted}"]}[command]
    peak, stderr = _peak_kib("-m", "transformer_mt", *args)
    print(f"{command} with {claim}: peak {peak} KiB; importing torch: {torch_kib} KiB")
    assert len(stderr.splitlines()) == 1 and stderr.startswith("error: ") and str(crafted) in stderr
    assert peak < LIMIT_KIB and peak < torch_kib / 2, (peak, torch_kib)


def test_a_resume_into_another_model_is_refused_before_that_model_is_built(
        tiny_run_copy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A resume whose composed config asks for another model (a user's override, or overrides saved in a
    crafted checkpoint) is refused before the model is allocated, not after."""
    import transformer_mt as tmt
    from transformer_mt.model import transformer

    built: list[int] = []
    real_init = transformer.Transformer.__init__

    def spy(self: Any, config: Any, *args: Any, **kwargs: Any) -> None:
        built.append(config.d_model)
        real_init(self, config, *args, **kwargs)

    monkeypatch.setattr(transformer.Transformer, "__init__", spy)
    with pytest.raises(CheckpointError, match=r"cannot resume.*model\.d_model"):
        tmt.train([f"resume={tiny_run_copy}", "model.d_model=1024", "model.d_ff=4096"])
    assert 1024 not in built
