"""Fine-tuning (`init=`): the shared tiny run is the parent, and a slice of Multi30k the new domain.

Checked against independent references: the parent's checkpoint tensors, its tokenizer.json file, and
an uninterrupted run (for resume).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

import transformer_mt as tmt
from tests.conftest import DATA_CACHE, multi30k, run_cli
from transformer_mt.checkpoints.store import BEST, TRAINED, load_checkpoint
from transformer_mt.data import prepare_data
from transformer_mt.data.tokenizer import Vocabulary
from transformer_mt.errors import CheckpointError, ConfigError
from transformer_mt.jobs.replayed import with_resumed_overrides
from transformer_mt.jobs.train import build_trainer
from transformer_mt.training import finetune


def finetune_overrides(parent: Path, run_dir: Path, *extra: str) -> list[str]:
    """Two epochs on 300 Multi30k captions (en->fr, as the parent; about ten batches an epoch), from
    `parent`, on one thread (a second one waits for a free core on a busy machine), their data from the
    session's cache."""
    captions = multi30k()
    return [f"init={parent}", "debug=tiny", "dataset=parallel",
            f"dataset.src_path={captions / 'train.en.gz'}",
            f"dataset.tgt_path={captions / 'train.fr.gz'}", "dataset.max_pairs=300",
            f"dataset.cache_dir={os.environ.get(DATA_CACHE, run_dir.parent / 'cache')}",
            "training.epochs=2", f"checkpoint.dir={run_dir}", "device.num_threads=1", *extra]


def _weights(state: dict[str, Any], key: str = "model") -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in state[key].items()}


@pytest.fixture(scope="module")
def finetuned(tiny_run: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A fine-tuning run of the tiny model, what its first training step started from, and a copy of its
    mid-epoch checkpoint of step 5 (`mid.pt`)."""
    run_dir = tmp_path_factory.mktemp("finetune") / "run"
    overrides = with_resumed_overrides(finetune_overrides(tiny_run, run_dir, "training.save_every_steps=5"))
    trainer = build_trainer(tmt.compose("train", overrides), run_dir, overrides)
    first: dict[str, Any] = {}
    step = trainer.train_step

    def spy(*args: Any) -> None:
        if not first:
            first.update(weights=_weights({"model": trainer.model.state_dict()}), step=trainer.step,
                         optimizer=dict(trainer.optimizer.state), lr_steps=trainer.scheduler.last_epoch,
                         best=dict(trainer.best))
        if trainer.step == 5 and not (run_dir.parent / "mid.pt").exists():  # latest.pt was just saved
            shutil.copyfile(run_dir / "latest.pt", run_dir.parent / "mid.pt")
        step(*args)

    trainer.train_step = spy  # type: ignore[method-assign]
    trainer.fit()
    return {"run_dir": run_dir, "first": first, "trainer": trainer}


def test_the_first_step_starts_from_the_parents_weights_with_a_fresh_optimizer(
        finetuned: dict[str, Any], tiny_run: Path) -> None:
    parent = load_checkpoint(tiny_run / BEST)
    first = finetuned["first"]
    assert first["weights"].keys() == parent["model"].keys()
    for name, tensor in parent["model"].items():
        assert torch.equal(first["weights"][name], tensor), name
    assert parent["step"] > 0 and first["step"] == 0 and first["lr_steps"] == 0
    assert first["optimizer"] == {}  # AdamW's moments are created by its first step
    assert first["best"]["value"] is None
    final = load_checkpoint(finetuned["run_dir"] / "latest.pt")
    assert final["step"] > 0 and final["epoch"] == 2
    assert not all(torch.equal(final["model"][name], t) for name, t in parent["model"].items())  # it trained


def test_the_tokenizer_is_the_parents_and_encodes_the_new_data(finetuned: dict[str, Any],
                                                               tiny_run: Path) -> None:
    run_dir = finetuned["run_dir"]
    assert (run_dir / "tokenizer.json").read_bytes() == (tiny_run / "tokenizer.json").read_bytes()
    parent_vocab = Vocabulary.load(tiny_run)
    valid = finetuned["trainer"].data.valid
    assert valid.src_text and "Two" in " ".join(valid.src_text)  # Multi30k's captions, not Tatoeba's
    max_len = finetuned["trainer"].cfg.dataset.max_len  # held-out ids are cut there (encode.py)
    for ragged, text, encode, decode in ((valid.src_ids, valid.src_text, parent_vocab.encode_src,
                                          parent_vocab.decode_src),
                                         (valid.tgt_ids, valid.tgt_text, parent_vocab.encode_tgt,
                                          parent_vocab.decode_tgt)):
        ids = [list(map(int, ragged[i])) for i in range(len(valid))]
        assert ids == [full[:max_len] for full in encode(text)]
        whole = [i for i, row in enumerate(ids) if len(row) < max_len]
        assert len(whole) > len(ids) // 2
        assert decode([ids[i] for i in whole]) == [text[i] for i in whole]
    # The cache is keyed by that tokenizer: the same corpus with a tokenizer of its own lies elsewhere.
    trainer = finetuned["trainer"]
    scratch = prepare_data(trainer.cfg.dataset, trainer.cfg.tokenizer)
    assert scratch.stats["cache_dir"] != trainer.data.stats["cache_dir"]
    assert scratch.vocab.to_json() != parent_vocab.to_json() == trainer.vocab.to_json()


def test_the_run_records_its_parent(finetuned: dict[str, Any], tiny_run: Path) -> None:
    run_dir = finetuned["run_dir"]
    parent = str((tiny_run / BEST).resolve())
    assert json.loads((run_dir / "result.json").read_text())["parent"] == parent
    assert load_checkpoint(run_dir / "latest.pt")["parent"] == parent
    assert f"init={tiny_run}" in load_checkpoint(run_dir / "latest.pt")["overrides"]


def test_resuming_a_finetuning_run_is_bit_exact(finetuned: dict[str, Any], tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch,
                                                caplog: pytest.LogCaptureFixture) -> None:
    """From its checkpoint in the middle of the first epoch to the second's end, as the uninterrupted
    run did; the parent is not read again (its saved overrides put the parent's model in place)."""
    run_dir = tmp_path / "resumed"
    run_dir.mkdir()
    mid = load_checkpoint(finetuned["run_dir"].parent / "mid.pt")
    assert mid["step"] == 5 and mid["epoch"] == 0 and mid["batch_in_epoch"] == 5
    shutil.copyfile(finetuned["run_dir"].parent / "mid.pt", run_dir / "latest.pt")

    def no_parent(*args: object, **kwargs: object) -> None:
        raise AssertionError("a resumed fine-tuning run read its parent")

    monkeypatch.setattr(finetune, "load_parent", no_parent)
    with caplog.at_level("INFO"):
        tmt.train([f"resume={run_dir}"])
    assert "resumed at epoch 1, batch 5, step 5" in caplog.text and "fine-tuning" not in caplog.text
    expected = load_checkpoint(finetuned["run_dir"] / "epoch_002.pt")
    got = load_checkpoint(run_dir / "epoch_002.pt")
    assert got["parent"] == expected["parent"] and got["step"] == expected["step"]
    for name, tensor in expected["model"].items():
        assert torch.equal(got["model"][name], tensor), f"{name} differs after resume"


def test_the_parents_weight_average_is_carried_over(tiny_run: Path, tmp_path: Path) -> None:
    """A parent trained with EMA: training goes on from its trained weights, the average from its
    average (checked here before any step)."""
    from transformer_mt.checkpoints.store import save_checkpoint

    state = load_checkpoint(tiny_run / BEST)
    averaged = {name: t + 0.5 if t.is_floating_point() else t for name, t in state["model"].items()}
    save_checkpoint({**state, TRAINED: state["model"], "model": averaged, "ema_updates": 7},
                    tmp_path / "ema.pt")
    run_dir = tmp_path / "run"
    overrides = with_resumed_overrides(finetune_overrides(tmp_path / "ema.pt", run_dir,
                                                          "training.ema_decay=0.9"))
    trainer = build_trainer(tmt.compose("train", overrides), run_dir, overrides)
    for name, tensor in state["model"].items():
        assert torch.equal(trainer.model.state_dict()[name], tensor), name
        assert torch.equal(trainer.ema.model.state_dict()[name], averaged[name]), name
    assert int(trainer.ema.averaged.n_averaged) == 7


def test_a_parent_of_a_students_shape_comes_with_its_own_depths(tiny_run: Path, tmp_path: Path) -> None:
    """A deep encoder and a one-layer decoder (model=student's kind of shape): the child is built with
    the parent's stacks, not the schema's nor debug=tiny's, and starts from its weights."""
    from transformer_mt.checkpoints.store import build_model, model_spec, save_checkpoint
    from transformer_mt.config import ModelConfig

    state = load_checkpoint(tiny_run / BEST)
    shape = {**finetune.parent_sections(state)["model"], "encoder_layers": 3, "decoder_layers": 1}
    torch.manual_seed(0)
    student = build_model(ModelConfig(**shape), Vocabulary.from_json(state["tokenizer"]))
    (tmp_path / "parent").mkdir()
    save_checkpoint({**state, "model": student.state_dict(), "model_config": model_spec(student)},
                    tmp_path / "parent" / BEST)
    overrides = with_resumed_overrides(finetune_overrides(tmp_path / "parent", tmp_path / "run"))
    trainer = build_trainer(tmt.compose("train", overrides), tmp_path / "run", overrides)
    assert (trainer.model.config.encoder_layers, trainer.model.config.decoder_layers) == (3, 1)
    for key, tensor in student.state_dict().items():
        assert torch.equal(trainer.model.state_dict()[key], tensor), key


def test_a_planned_fine_tuning_run_keeps_the_parents_shape_and_plans_the_rest(tiny_run: Path,
                                                                              tmp_path: Path) -> None:
    from transformer_mt.plan import decide, rules

    run_dir = tmp_path / "run"
    tmt.train(finetune_overrides(tiny_run, run_dir, "training.plan=auto", "training.max_minutes=1"))
    result = json.loads((run_dir / "result.json").read_text(encoding="utf-8"))
    plan = result["plan"]
    parent = load_checkpoint(tiny_run / BEST)["config"]["model"]
    for key in decide.SHAPE:
        assert plan["sources"][key] == "parent" and plan["values"][key] == parent[key.split(".")[1]], key
    assert plan["sources"]["training.lr"] == "plan"  # the peak of training from scratch, at its d_model
    assert plan["values"]["training.lr"] == rules.peak_lr(parent["d_model"])
    assert result["parent"]


@pytest.mark.parametrize(("extra", "named"), [
    (["model.d_model=128"], ["model.d_model=128", "parent's 64"]),
    (["tokenizer.vocab_size=500"], ["tokenizer.vocab_size=500", "parent's 400"]),
    (["model=small"], ["model.d_model=256 (from model=small)", "parent's 64"]),
    (["dataset.tgt_lang=de"], ["en->de", "parent's en->fr"]),
])
def test_a_contradicting_override_is_one_line(tiny_run: Path, tmp_path: Path, extra: list[str],
                                              named: list[str]) -> None:
    run_dir = tmp_path / "run"
    with pytest.raises(ConfigError) as raised:
        tmt.train(finetune_overrides(tiny_run, run_dir, *extra))
    message = str(raised.value)
    assert "\n" not in message and message.startswith(f"init={tiny_run}:")
    assert all(part in message for part in named), message
    assert not run_dir.exists()


def test_a_training_setting_of_the_model_may_change(tiny_run: Path, tmp_path: Path) -> None:
    overrides = with_resumed_overrides(finetune_overrides(tiny_run, tmp_path / "run", "model.dropout=0.3",
                                                          "tokenizer.dropout=0.1"))
    cfg = tmt.compose("train", overrides)
    assert cfg.model.dropout == 0.3 and cfg.tokenizer.dropout == 0.1 and cfg.model.d_model == 64


def test_bad_parents_and_init_with_resume_are_one_line(tiny_run: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    with pytest.raises(CheckpointError, match=r"^init=\S+missing: checkpoint path \S+ does not exist"):
        tmt.train(finetune_overrides(tmp_path / "missing", run_dir))
    (tmp_path / "broken.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match=r"^init=\S+broken.pt: checkpoint \S+broken.pt "):
        tmt.train(finetune_overrides(tmp_path / "broken.pt", run_dir))
    with pytest.raises(ConfigError, match="give one of them"):
        tmt.train([*finetune_overrides(tiny_run, run_dir), f"resume={tiny_run}"])
    assert not run_dir.exists()


def test_the_command_line_says_it_in_one_line(tiny_run: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    result = run_cli("train", *finetune_overrides(tiny_run, run_dir, "model.n_heads=2"))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "model.n_heads=2 contradicts the parent's 4" in result.stderr
    assert not run_dir.exists()
