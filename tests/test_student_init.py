"""A student started from its teacher's weights (distill.init_from_teacher): which teacher layer each
student layer takes, a deeper pre-norm student computing exactly what its teacher does, and the settings
it cannot take refused in one line."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

import transformer_mt as tmt
from tests.conftest import as_teacher, tiny_overrides
from transformer_mt.checkpoints.store import model_from_checkpoint
from transformer_mt.config import ModelConfig, TrainConfig
from transformer_mt.errors import ConfigError
from transformer_mt.model import Transformer
from transformer_mt.training import finetune, student_init
from transformer_mt.training.student_init import layer_map, student_weights

VOCAB = 50


@pytest.mark.parametrize(("student", "teacher", "expected"), [
    (3, 3, [(0, False), (1, False), (2, False)]),
    (1, 3, [(0, False)]),  # one layer of several: the first (Shleifer and Rush)
    (2, 3, [(0, False), (2, False)]),  # the first and the last
    (4, 6, [(0, False), (2, False), (3, False), (5, False)]),
    (6, 3, [(0, False), (0, True), (1, False), (1, True), (2, False), (2, True)]),
    (4, 3, [(0, False), (0, True), (1, False), (2, False)]),
    (2, 1, [(0, False), (0, True)]),
])
def test_each_student_layer_takes_a_teacher_layer_spread_evenly(student: int, teacher: int,
                                                                 expected: list[tuple[int, bool]]) -> None:
    assert layer_map(student, teacher) == expected


def _model(seed: int, **shape: object) -> Transformer:
    torch.manual_seed(seed)
    config = ModelConfig(**{"d_model": 32, "n_heads": 4, "d_ff": 64, "encoder_layers": 2, "decoder_layers": 2,
                            "dropout": 0.0, "norm_first": True, "activation": "gelu", "max_positions": 64,
                            **shape})
    model = Transformer(config, VOCAB, VOCAB).eval()
    with torch.no_grad():  # biases and norms away from their initial 0 and 1, as a trained model's are
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    return model


def _started(teacher: Transformer, **depths: int) -> Transformer:
    student = _model(1, **{**dataclasses.asdict(teacher.config), **depths})
    theirs = {k: getattr(teacher.config, k) for k in student_init.DEPTHS}
    ours = {k: getattr(student.config, k) for k in student_init.DEPTHS}
    student.load_state_dict(student_weights(teacher.state_dict(), ours, theirs))
    return student


@pytest.mark.parametrize("depths", [{"encoder_layers": 4}, {"encoder_layers": 6, "decoder_layers": 3},
                                    {"decoder_layers": 4}, {}])
def test_a_deeper_pre_norm_student_computes_what_its_teacher_does(depths: dict[str, int]) -> None:
    """The teacher is the reference: a student as deep or deeper starts with its logits, padding and all."""
    teacher = _model(0)
    student = _started(teacher, **depths)
    src = torch.randint(3, VOCAB, (5, 9))
    src[1, 6:] = 0  # padding
    tgt = torch.randint(3, VOCAB, (5, 7))
    with torch.no_grad():
        torch.testing.assert_close(student(src, tgt), teacher(src, tgt), rtol=1e-5, atol=1e-5)


def test_a_shallower_student_takes_the_spread_layers_and_everything_else() -> None:
    teacher = _model(0, encoder_layers=3, decoder_layers=3)
    student = _started(teacher, encoder_layers=2, decoder_layers=1)
    theirs, ours = teacher.state_dict(), student.state_dict()
    for key, value in ours.items():
        parts = key.split(".")
        if parts[1:2] == ["layers"]:
            picked = {"encoder": [0, 2], "decoder": [0]}[parts[0]][int(parts[2])]
            value_from = theirs[".".join([parts[0], "layers", str(picked), *parts[3:]])]
        else:
            value_from = theirs[key]
        assert torch.equal(value, value_from), key


def _state(model: Transformer) -> dict:
    return {"model": model.state_dict(), "model_config": dataclasses.asdict(model.config)}


def test_what_a_student_cannot_take_from_its_teacher() -> None:
    cfg = TrainConfig()
    pre_norm = _model(0)
    cfg.model = dataclasses.replace(pre_norm.config, encoder_layers=6, decoder_layers=1, dropout=0.3)
    assert student_init.problems(cfg, _state(pre_norm)) == []  # depths and dropout are the student's own
    cfg.model = dataclasses.replace(cfg.model, d_model=64, d_ff=128)
    assert student_init.problems(cfg, _state(pre_norm)) == [
        "model.d_model=64 contradicts the teacher's 32", "model.d_ff=128 contradicts the teacher's 64"]
    post_norm = _model(0, norm_first=False)
    cfg.model = dataclasses.replace(post_norm.config, encoder_layers=1, decoder_layers=3)
    assert student_init.problems(cfg, _state(post_norm)) == [
        "model.decoder_layers=3 is deeper than the teacher's 2, which a post-norm model cannot start from "
        "(its layers have no identity)"]


@pytest.fixture(scope="module")
def pre_norm_teacher(fitted_model, tiny_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A pre-norm 3+1 model that writes real words, as a run with tiny_run's split."""
    return as_teacher(fitted_model("pegasus", tmp_path_factory.mktemp("student-init") / "teacher"), tiny_run)


def test_a_run_starts_from_its_teachers_weights_and_keeps_its_shape(
        pre_norm_teacher: Path, corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`train distill.teacher=<run> distill.init_from_teacher=true model.encoder_layers=4 ...`: it takes the
    teacher's width, norms and activation (the tiny model's are not), and its first weights compute the
    teacher's logits; then it trains."""
    started = {}
    real = student_init.start_from_teacher

    def spy(cfg, model, average) -> None:
        real(cfg, model, average)
        started["model"] = {k: v.clone() for k, v in model.state_dict().items()}

    monkeypatch.setattr(student_init, "start_from_teacher", spy)
    run_dir = tmp_path / "student"
    tmt.train(tiny_overrides(corpus, run_dir, **{
        "dataset.path": corpus, "training.epochs": 1, "distill.teacher": pre_norm_teacher,
        "distill.init_from_teacher": "true", "distill.beam_size": 1, "model.encoder_layers": 4,
        "model.decoder_layers": 1, "training.calibration_sentences": 0, "device.amp": "off"}))
    _, teacher_state, teacher, _ = model_from_checkpoint(pre_norm_teacher / "best.pt")
    _, saved, student, _ = model_from_checkpoint(run_dir / "epoch_001.pt")
    spec, theirs = saved["model_config"], teacher_state["model_config"]
    assert (spec["encoder_layers"], spec["decoder_layers"]) == (4, 1)
    own = (*student_init.DEPTHS, *finetune.OWN_KEYS["model"])
    assert {k: v for k, v in spec.items() if k not in own} == {k: theirs[k] for k in theirs if k not in own}
    student.load_state_dict(started["model"])
    src, tgt = torch.randint(4, 300, (3, 8)), torch.randint(4, 300, (3, 6))
    with torch.no_grad():
        torch.testing.assert_close(student(src, tgt), teacher(src, tgt), rtol=1e-5, atol=1e-5)
    assert not torch.equal(saved["model"]["src_embed.weight"], started["model"]["src_embed.weight"])  # trains


@pytest.mark.parametrize(("extra", "message"), [
    ({"model.d_model": 32}, "distill.init_from_teacher=true: model.d_model=32 contradicts the teacher's 64"),
    ({"distill.teacher": "null"}, "distill.init_from_teacher=true starts the student from one teacher's"),
    ({"init": "TEACHER"}, "distill.init_from_teacher=true starts the student from one teacher's"),
    ({"distill.teacher": "TEACHER,TEACHER"}, "distill.init_from_teacher=true starts the student from one"),
])
def test_a_student_that_cannot_start_from_its_teacher_is_refused_in_one_line(
        pre_norm_teacher: Path, corpus: Path, tmp_path: Path, extra: dict, message: str) -> None:
    extra = {key: str(value).replace("TEACHER", str(pre_norm_teacher)) for key, value in extra.items()}
    overrides = tiny_overrides(corpus, tmp_path / "run", **{
        "distill.teacher": pre_norm_teacher, "distill.init_from_teacher": "true", **extra})
    with pytest.raises(ConfigError, match="^" + message.replace("(", r"\(")) as error:
        tmt.train(overrides)
    assert "\n" not in str(error.value)
