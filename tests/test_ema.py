"""The weight average (training.ema_decay): the formula, what is validated and saved, and resuming."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import transformer_mt as tmt
from tests.conftest import smoke_overrides
from transformer_mt.checkpoints.store import TRAINED, UPDATES, average_checkpoints, load_checkpoint
from transformer_mt.config import ModelConfig
from transformer_mt.jobs.replayed import with_resumed_overrides
from transformer_mt.jobs.train import build_trainer
from transformer_mt.model import Transformer
from transformer_mt.training.ema import WeightAverage, warmed_up_decay
from transformer_mt.training.trainer import Trainer
from transformer_mt.training.validation import validation_loss


def _tiny_model(seed: int) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(ModelConfig(d_model=16, n_heads=2, d_ff=32, encoder_layers=1, decoder_layers=1),
                       40, 40, 0)


def test_the_average_follows_the_formula_step_by_step() -> None:
    model, decay = _tiny_model(0), 0.9
    average = WeightAverage(model, decay)
    expected = {k: v.clone() for k, v in model.state_dict().items()}  # the first update copies
    for n in range(6):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
        average.update(model)
        d = 0.0 if n == 0 else min(decay, (1 + n) / (10 + n))  # written out, not through warmed_up_decay
        for name, weight in dict(model.named_parameters()).items():
            expected[name] = d * expected[name] + (1 - d) * weight.detach()
    for name, weight in average.model.named_parameters():
        torch.testing.assert_close(weight, expected[name], rtol=1e-6, atol=1e-6)
    assert warmed_up_decay(0.999, 0) == 0.1 and warmed_up_decay(0.999, 10**6) == 0.999


def test_validation_sees_the_updated_average_not_a_stale_inference_copy() -> None:
    model = _tiny_model(1)
    average = WeightAverage(model, 0.5)
    average.update(model)
    src, tgt = torch.randint(4, 40, (2, 5)), torch.randint(4, 40, (2, 4))
    with torch.no_grad():
        average.model.eval()
        before = average.model(src, tgt)
        for p in model.parameters():
            p.mul_(3.0)
        average.update(model)
        average.model.eval()
        after = average.model(src, tgt)
        fresh = _tiny_model(1)
        fresh.load_state_dict(average.model.state_dict())
        torch.testing.assert_close(after, fresh.eval()(src, tgt))
    assert not torch.allclose(before, after)


@pytest.fixture(scope="module")
def ema_run(tmp_path_factory: pytest.TempPathFactory, corpus: Path) -> Path:
    run_dir = tmp_path_factory.mktemp("ema") / "run"
    tmt.train(smoke_overrides(corpus, run_dir, **{"training.epochs": 2, "training.ema_decay": 0.9,
                                                  "training.average_last": 2}))
    return run_dir


def _resumed_trainer(checkpoint: Path, run_dir: Path, *overrides: str) -> Trainer:
    replayed = with_resumed_overrides([f"resume={checkpoint}", *overrides])
    return build_trainer(tmt.compose("train", replayed), run_dir)


def test_a_run_with_ema_validates_and_saves_the_average(ema_run: Path, tmp_path: Path) -> None:
    state = load_checkpoint(ema_run / "epoch_002.pt")
    assert state[UPDATES] == state["step"] > 0
    assert any(not torch.equal(state["model"][k], state[TRAINED][k]) for k in state["model"])
    # The logged validation loss is the average's, not the trained weights'.
    logged = [json.loads(line) for line in (ema_run / "metrics.jsonl").read_text().splitlines()]
    last = next(r for r in logged if r["step"] == state["step"] and "model" not in r)
    trainer = _resumed_trainer(ema_run / "epoch_002.pt", tmp_path / "again")
    assert trainer.validate.model is trainer.ema.model
    t, valid = trainer.cfg.training, next(iter(trainer.validate.valid.values()))  # its one direction
    sample = valid.subset(range(min(t.valid_max_sentences, len(valid))))
    args = (sample, t.batch_tokens, trainer.device, trainer.amp)
    assert validation_loss(trainer.ema.model, *args) == pytest.approx(last["valid_loss"], rel=1e-6)
    assert validation_loss(trainer.model, *args) != pytest.approx(last["valid_loss"], rel=1e-6)
    averaged = average_checkpoints([ema_run / "epoch_001.pt", ema_run / "epoch_002.pt"])
    assert TRAINED not in averaged and UPDATES not in averaged  # inference only
    # evaluate translates with `model`, the average: the scores validation recorded for it, on the same pairs
    bleu = tmt.evaluate([f"checkpoint={ema_run / 'epoch_002.pt'}", "split=valid", "max_sentences=8",
                         "decoding.beam_size=1", "decoding.max_len_a=0", "decoding.max_len_b=8",
                         f"output_dir={tmp_path / 'eval'}"])
    report = json.loads((tmp_path / "eval" / "valid.epoch_002.greedy.json").read_text())
    assert (bleu, report["chrf"]) == (pytest.approx(last["bleu"]), pytest.approx(last["chrf"]))


def test_validation_measures_its_loss_on_the_pairs_it_translates(ema_run: Path, tmp_path: Path) -> None:
    trainer = _resumed_trainer(ema_run / "epoch_002.pt", tmp_path / "again", "training.valid_max_sentences=5")
    valid = next(iter(trainer.validate.valid.values()))  # the run's one direction
    args = (trainer.cfg.training.batch_tokens, trainer.device, trainer.amp)
    result = trainer.validate(step=trainer.step, epoch=2, train_minutes=0.0)
    sample = validation_loss(trainer.ema.model, valid.subset(range(5)), *args)
    assert len(valid) > 5 and result.loss == pytest.approx(sample, rel=1e-6)
    assert result.loss != pytest.approx(validation_loss(trainer.ema.model, valid, *args), rel=1e-6)


def test_resuming_without_ema_continues_from_the_trained_weights(ema_run: Path, tmp_path: Path) -> None:
    """Switching EMA off on resume: training goes on from `trained_model`, not from the average."""
    state = load_checkpoint(ema_run / "epoch_001.pt")
    trainer = _resumed_trainer(ema_run / "epoch_001.pt", tmp_path / "off", "training.ema_decay=0")
    assert trainer.ema is None
    for name, weight in trainer.model.state_dict().items():
        assert torch.equal(weight, state[TRAINED][name])
