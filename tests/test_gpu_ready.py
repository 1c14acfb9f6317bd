"""A GPU's code paths, checked on the CPU: no host synchronisation in the training step or per decoding
step, a bounded set of batch shapes, the chosen attention kernels, compile per shape, GPU-sized decoding.

A read of a GPU tensor (`.item()`, `bool()`, `.tolist()`) waits for the device; on the CPU reads are free,
so the code reads there where it helps. Emptying `attention.FREE_READS` runs a GPU's code paths on the
CPU, and `HostReads` counts what they read.
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path

import pytest
import torch

import transformer_mt as tmt
from tests.conftest import script_module, tiny_overrides
from transformer_mt.config import ConfigError, ModelConfig, SearchConfig
from transformer_mt.data.batching import TokenBatchSampler, greedy_cut
from transformer_mt.data.tokenizer import PAD_ID
from transformer_mt.decoding.beam import beam_search
from transformer_mt.decoding.search import greedy_search, sample
from transformer_mt.model import Transformer, attention
from transformer_mt.runtime import device as runtime
from transformer_mt.training import distributed
from transformer_mt.training.optim import step_unless
from transformer_mt.training.trainer import Trainer

HostReads = script_module("host_reads").HostReads  # scripts/host_reads.py: instrumentation, not the package
BOS, EOS = 1, 2


@pytest.fixture
def gpu_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    """Take the code paths of a device whose reads are host synchronisations."""
    monkeypatch.setattr(attention, "FREE_READS", ())


def test_host_reads_counts_every_kind_of_read_of_its_device() -> None:
    t = torch.arange(4.0)
    with HostReads("cpu") as reads:
        t.sum().item(), bool(t[1]), float(t[2]), int(t[3]), t.tolist(), t.numpy(), t.cpu()
        t * 2  # no read
    assert reads.count == 7
    with HostReads("cuda") as reads:  # tensors of another device are not counted
        t.sum().item(), t.tolist()
    assert reads.count == 0
    assert torch.Tensor.tolist is torch._C.TensorBase.tolist  # the patched methods are restored


def _tiny_trainer(corpus: Path, run_dir: Path, **extra: object) -> Trainer:
    from transformer_mt.jobs.train import build_trainer

    settings = {"dataset.max_pairs": 400, "training.batch_tokens": 256, "training.log_every": 10, **extra}
    return build_trainer(tmt.compose("train", tiny_overrides(corpus, run_dir, **settings)), run_dir)


def test_steady_state_training_reads_the_device_once_per_logging_interval(
        corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trainer = _tiny_trainer(corpus, tmp_path / "run")
    batch = trainer.epochs.batch(*_first_batch(trainer))
    with HostReads("cpu") as reads:  # the CPU's paths: the model checks its masks for padding, for free
        trainer.model(batch.src, batch.tgt_in)
    assert reads.count >= 2  # the counter sees them

    monkeypatch.setattr(attention, "FREE_READS", ())
    with HostReads("cpu") as reads:
        trainer.train_epoch()
    assert trainer.step >= 20
    # One read of the tally every training.log_every steps (and at the epoch's end), nothing else.
    assert reads.count <= math.ceil(trainer.step / 10), reads.sites
    assert all("tally.py" in site for site in reads.sites), reads.sites


def _first_batch(trainer: Trainer) -> tuple:
    split, sampler = trainer.epochs(0)
    return split, sampler.batches(0)[0]


def _model(seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    cfg = ModelConfig(d_model=16, n_heads=2, d_ff=32, encoder_layers=1, decoder_layers=1, dropout=0.0)
    return Transformer(cfg, 20, 20)


def test_a_skipped_step_changes_nothing_and_a_taken_one_is_adamw() -> None:
    model, reference = _model(), _model()
    fused = torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.1, fused=True)
    plain = torch.optim.AdamW(reference.parameters(), lr=0.1, weight_decay=0.1, foreach=False)
    disabled = torch.amp.GradScaler("cpu", enabled=False)
    src, tgt = torch.randint(3, 20, (2, 5)), torch.randint(3, 20, (2, 4))
    for m in (model, reference):
        m(src, tgt).sum().backward()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    step_unless(fused, disabled, torch.tensor(True))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(float(s["step"]) == 0 and not s["exp_avg"].any() for s in fused.state.values())
    step_unless(fused, disabled, torch.tensor(False))
    plain.step()
    for a, b in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(a, b)
    assert not hasattr(fused, "found_inf")


# -- a bounded set of shapes -------------------------------------------------------------------------
def test_greedy_cut_keeps_row_counts_a_multiple() -> None:
    sizes = [8] * 37 + [16] * 21
    bounds = greedy_cut(sizes, 100, rows_multiple=4)
    counts = [b - a for a, b in zip(bounds[:-1], bounds[1:])]
    assert sum(counts) == len(sizes) and all(c % 4 == 0 for c in counts[:-1])
    assert all(max(sizes[a:b]) * (b - a) <= 100 for a, b in zip(bounds[:-1], bounds[1:]))
    assert greedy_cut(sizes, 100) == greedy_cut(sizes, 100, rows_multiple=1)


@pytest.fixture(scope="module")
def real_train_split(tmp_path_factory: pytest.TempPathFactory, corpus: Path):  # noqa: ANN201
    """30,000 pairs of the real corpus with an 8k joint BPE (a few seconds)."""
    run_dir = tmp_path_factory.mktemp("shapes") / "run"
    real = {"dataset.path": corpus, "dataset.max_pairs": 30000, "tokenizer.vocab_size": 8000}
    cfg = tmt.compose("train", tiny_overrides(corpus, run_dir, **real))
    return distributed.prepare_data(cfg.dataset, cfg.tokenizer, run_dir, None, distributed.current()).train


@pytest.mark.slow  # a real corpus and vocabulary to build; the sampler's rules are checked above on sizes
def test_an_epoch_of_the_real_corpus_has_few_shapes_with_the_gpu_setting(real_train_split) -> None:  # noqa: ANN001
    split, batch_tokens = real_train_split, 4096  # about 100 batches an epoch
    found = {}
    for multiple in (1, 8):
        sampler = TokenBatchSampler(split.lengths(), batch_tokens, seed=1, pad_to_multiple=multiple)
        # The reference: the batches as training collates them, their shapes and pad positions counted.
        shapes, pads, total = [], 0, 0
        for indices in sampler.batches(0):
            batch = split.batch(indices).pad_to(multiple)
            assert torch.equal(batch.tgt_in != PAD_ID, batch.tgt_out != PAD_ID)
            shapes.append((len(batch), batch.src.shape[1], batch.tgt_out.shape[1]))
            pads += int((batch.src == PAD_ID).sum() + (batch.tgt_out == PAD_ID).sum())
            total += batch.src.numel() + batch.tgt_out.numel()
            assert len(indices) == 1 or len(batch) * max(shapes[-1][1:]) <= batch_tokens
        assert sampler.shapes(0) == shapes
        assert sampler.padding_fraction(0) == pytest.approx(pads / total)
        found[multiple] = (len(set(shapes)), pads / total)
        if multiple > 1:
            assert all(s % multiple == 0 and t % multiple == 0 for _, s, t in shapes)
            assert all(rows % multiple == 0 for rows, _, _ in shapes[:-1] if rows >= multiple)
    print(f"distinct shapes and padding fraction, pad_to_multiple 1 and 8: {found}")
    assert found[8][0] <= 25 and found[8][0] * 3 < found[1][0]


def test_pad_to_multiple_defaults_to_8_when_compiling_on_cuda_and_1_elsewhere() -> None:
    assert runtime.pad_to_multiple(None, torch.device("cuda"), compiling=True) == 8
    assert runtime.pad_to_multiple(None, torch.device("cuda"), compiling=False) == 1
    assert runtime.pad_to_multiple(None, torch.device("cpu"), compiling=True) == 1
    assert runtime.pad_to_multiple(4, torch.device("cpu"), compiling=False) == 4
    with pytest.raises(ConfigError, match="training.pad_to_multiple=0"):
        tmt.compose("train", ["training.pad_to_multiple=0"])


def test_compile_is_static_per_shape_with_bounded_shapes(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    monkeypatch.setattr(torch, "compile", lambda model, **kwargs: calls.append(kwargs) or model)
    model = _model()
    assert runtime.compiled(model, 8) is model and runtime.compiled(model, 1) is model
    assert calls == [{"dynamic": False}, {"dynamic": True}]


# -- the attention kernel, chosen -----------------------------------------------------------------------
def test_the_configured_attention_kernels_reach_sdpa_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []

    def fake_sdpa_kernel(backends, set_priority=False):  # noqa: ANN001, ANN202
        seen.append((list(backends), set_priority))
        return contextlib.nullcontext()

    monkeypatch.setattr(attention, "sdpa_kernel", fake_sdpa_kernel)
    model, src, tgt = _model(), torch.randint(3, 20, (2, 5)), torch.randint(3, 20, (2, 4))
    expected = model(src, tgt)
    assert seen == []  # the CPU leaves the choice to PyTorch
    monkeypatch.setattr(attention, "KERNEL_CHOICE_DEVICES", ("cpu",))  # as on CUDA
    cfg = tmt.compose("train", ["device.attention_backends=[flash,cudnn]"])
    runtime.configure_threads(cfg.device)
    try:
        torch.testing.assert_close(model(src, tgt), expected)
        assert seen and all(s == ([attention.BACKENDS["flash"], attention.BACKENDS["cudnn"]], True)
                            for s in seen)
        seen.clear()
        runtime.configure_threads(tmt.compose("train", ["device.attention_backends=[]"]).device)
        model(src, tgt)
        assert seen == []  # an empty list leaves it to PyTorch
    finally:
        runtime.configure_threads(tmt.compose("train", []).device)
    assert attention._cuda_backends == [attention.BACKENDS["efficient"], attention.BACKENDS["flash"]]


def test_an_unknown_attention_kernel_is_a_one_line_error() -> None:
    with pytest.raises(ConfigError) as info:
        tmt.compose("train", ["device.attention_backends=[efficient,fast]"])
    assert "device.attention_backends" in str(info.value) and "fast" in str(info.value)
    assert "efficient, flash, cudnn, math" in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(ValueError, match="fast"):
        attention.use_attention_backends(["fast"])


# -- decoding sized for the device, looking at the device every few steps -------------------------------
def test_decoding_batch_tokens_default_by_device() -> None:
    assert SearchConfig().batch_tokens_on(torch.device("cpu")) == 6000
    assert SearchConfig().batch_tokens_on("cuda") >= 30000
    assert SearchConfig(batch_tokens=100).batch_tokens_on("cuda") == 100
    with pytest.raises(ConfigError, match="decoding.batch_tokens=0"):
        tmt.compose("translate", ["decoding.batch_tokens=0", "checkpoint=x.pt"])


def _sources() -> torch.Tensor:
    torch.manual_seed(3)
    lengths = [7, 3, 5, 1, 6, 2]
    src = torch.full((len(lengths), max(lengths) + 1), PAD_ID)
    for i, n in enumerate(lengths):
        src[i, :n] = torch.randint(3, 20, (n,))
        src[i, n] = EOS
    return src


@pytest.mark.parametrize("prefixes", [None, [[5], [], [7, 8], [], [4], []]])
def test_greedy_search_looking_every_few_steps_finds_the_same_translations(
        monkeypatch: pytest.MonkeyPatch, prefixes: list[list[int]] | None) -> None:
    model, src = _model(1).eval(), _sources()
    options = dict(bos_id=BOS, eos_id=EOS, max_len_a=1.5, max_len_b=10, prefixes=prefixes)
    eager = greedy_search(model, src, **options)
    eager_sampled = sample(model, src, top_k=1, **options)
    with HostReads("cpu") as reads:
        greedy_search(model, src, **options)
    monkeypatch.setattr(attention, "FREE_READS", ())
    with HostReads("cpu") as lazy_reads:
        lazy = greedy_search(model, src, **options)
    assert [[h.tokens for h in n] for n in lazy] == [[h.tokens for h in n] for n in eager]
    assert [n[0].score for n in lazy] == pytest.approx([n[0].score for n in eager])
    assert [[h.tokens for h in n] for n in sample(model, src, top_k=1, **options)] == \
        [[h.tokens for h in n] for n in eager_sampled]
    steps = max(len(n[0].tokens) for n in eager) + 1
    assert lazy_reads.count < reads.count and lazy_reads.count <= 4 * math.ceil(steps / 8) + 3


def test_beam_search_on_gpu_paths_finds_the_same_translations(gpu_paths: None) -> None:
    model, src = _model(2).eval(), _sources()
    options = dict(bos_id=BOS, eos_id=EOS, max_len_a=1.5, max_len_b=10)
    lazy = beam_search(model, src, beam_size=3, n_best=2, **options)
    attention.FREE_READS = ("cpu",)  # (restored by the fixture's monkeypatch)
    eager = beam_search(model, src, beam_size=3, n_best=2, **options)
    assert [[h.tokens for h in n] for n in lazy] == [[h.tokens for h in n] for n in eager]


@pytest.mark.gpu
def test_a_training_step_on_cuda_does_not_wait_for_the_gpu(corpus: Path, tmp_path: Path) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    trainer = _tiny_trainer(corpus, tmp_path / "cuda", **{"device.name": "cuda"})
    with HostReads("cuda") as reads:
        trainer.train_epoch()
    assert trainer.step >= 20 and reads.count <= math.ceil(trainer.step / 10), reads.sites
