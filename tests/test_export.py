"""CTranslate2 export: the exported model translates like the PyTorch one (float32), int8 loads,
and the `export` / `translate engine=ctranslate2` commands work end to end."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import transformer_mt as tmt
from tests.conftest import fitted_checkpoint, require
from transformer_mt.config import (
    ConfigError,
    DecodingConfig,
    TranslateConfig,
)
from transformer_mt.decoding.search import alignment
from transformer_mt.decoding.translator import Translator

require("ctranslate2")

from transformer_mt.decoding.ct2 import CT2Translator  # noqa: E402
from transformer_mt.errors import ExportError  # noqa: E402
from transformer_mt.interop.ct2_export import export_ctranslate2  # noqa: E402

N_PAIRS = 300
GREEDY = DecodingConfig(beam_size=1)


def float32_reference(run: Path, decoding: DecodingConfig) -> Translator:
    """Our PyTorch translator in float32 (not bf16, even where the CPU has it): CTranslate2's parity."""
    return Translator.from_checkpoint(run, device="cpu", decoding=decoding, amp="off")


@pytest.fixture(scope="module")
def pairs(fit_pairs: tuple[list[str], list[str]]) -> tuple[list[str], list[str]]:
    return fit_pairs


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """Tiny tensors: one thread is as fast and fair to other jobs (CTranslate2 uses one too)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def post_norm(fitted_model, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default architecture: post-norm, ReLU, sinusoidal positions, tied embeddings."""
    return fitted_model("marian", tmp_path_factory.mktemp("post"))


def _parity(run: Path, model_dir: Path, sentences: list[str],
            decoding: DecodingConfig) -> tuple[int, float, list[str]]:
    """(identical 1-best outputs, largest score difference among them, the differing sources)."""
    reference = Translator.from_checkpoint(run, device="cpu", decoding=decoding, amp="off")
    engine = CT2Translator.from_dir(model_dir, intra_threads=1, decoding=decoding)
    ours, theirs = reference.translate_nbest(sentences), engine.translate_nbest(sentences)
    same = [a[0].text == b[0].text for a, b in zip(ours, theirs)]
    gap = max((abs(a[0].score - b[0].score) for a, b, s in zip(ours, theirs, same) if s), default=0.0)
    return sum(same), gap, [src for src, s in zip(sentences, same) if not s]


def test_float32_greedy_matches_pytorch(post_norm: Path, pairs: tuple[list[str], list[str]],
                                        tmp_path: Path) -> None:
    model_dir = export_ctranslate2(post_norm, tmp_path / "ct2", quantization="float32")
    assert {"model.bin", "config.json", "tokenizer.json", "transformer_mt.json"} <= {
        p.name for p in model_dir.iterdir()}
    sentences = pairs[0]
    same, gap, differ = _parity(post_norm, model_dir, sentences, GREEDY)
    print(f"post-norm float32 greedy: {same}/{len(sentences)} identical, max score gap {gap:.2e}")
    assert same >= 0.99 * len(sentences), differ[:5]
    assert gap < 1e-3  # same log-probs up to float32 rounding
    outputs = float32_reference(post_norm, GREEDY).translate(sentences)
    assert len(set(outputs)) > len(sentences) // 4  # a model that says something

    # Beam search: CTranslate2's hypotheses re-ranked with our GNMT length penalty.
    same, _, differ = _parity(post_norm, model_dir, sentences[:100], DecodingConfig(beam_size=4))
    print(f"post-norm float32 beam 4: {same}/100 identical")
    assert same >= 97, differ[:5]


def test_pre_norm_gelu_learned_untied_student_matches_pytorch(pairs: tuple[list[str], list[str]],
                                                              tmp_path: Path) -> None:
    """The other branches of the mapping: final LayerNorms, GELU, a learned position table, separate
    source/target embeddings, and a deep encoder with a one-layer decoder (a student's shape)."""
    run, _ = fitted_checkpoint(pairs, tmp_path / "run", steps=40, norm_first=True, activation="gelu",
                    positional="learned", tie_embeddings=False, encoder_layers=3, decoder_layers=1)
    model_dir = export_ctranslate2(run, tmp_path / "ct2", quantization="float32")
    sentences = pairs[0][:150]
    same, gap, differ = _parity(run, model_dir, sentences, GREEDY)
    print(f"pre-norm float32 greedy: {same}/{len(sentences)} identical, max score gap {gap:.2e}")
    assert same >= 0.99 * len(sentences), differ[:5]
    assert gap < 1e-3


def test_int8_loads_and_translates(post_norm: Path, pairs: tuple[list[str], list[str]],
                                   tmp_path: Path) -> None:
    model_dir = export_ctranslate2(post_norm, tmp_path / "ct2-int8")  # int8 is the default
    engine = CT2Translator.from_dir(model_dir, intra_threads=1, decoding=GREEDY)
    assert engine.info["quantization"] == "int8" and engine.info["compute_type"].startswith("int8")
    sentences = pairs[0]
    reference = float32_reference(post_norm, GREEDY).translate(sentences)
    out = engine.translate(sentences)
    same = sum(a == b for a, b in zip(out, reference))
    assert sum(bool(t) for t in out) > 0.9 * len(sentences)
    # The int8 weights themselves, computed in float32: only the weight rounding differs.
    weights_only = CT2Translator.from_dir(model_dir, intra_threads=1, decoding=GREEDY,
                                          compute_type="float32").translate(sentences)
    close = sum(a == b for a, b in zip(weights_only, reference))
    print(f"int8: {same}/{len(sentences)} identical to PyTorch float32 (int8 GEMM), "
          f"{close}/{len(sentences)} with int8 weights computed in float32")
    # This barely trained model has near-ties everywhere, so any rounding flips some tokens; the
    # int8 GEMM (activations quantized too) flips many more, on AVX2 CPUs without VNNI especially: its
    # output is held to the reference's character n-grams rather than to identity.
    assert close >= 0.6 * len(sentences)
    import sacrebleu

    agreement = sacrebleu.corpus_chrf(out, [reference]).score
    print(f"int8 GEMM vs PyTorch float32: chrF {agreement:.1f}")
    assert agreement >= 40, agreement  # a broken quantisation writes other words (chrF near 10)


def test_fast_mode_agrees_with_exact_mode(post_norm: Path, pairs: tuple[list[str], list[str]],
                                          tmp_path: Path) -> None:
    """exact=False (one request, masks up front) changes speed, not the translations, in practice."""
    model_dir = export_ctranslate2(post_norm, tmp_path / "ct2", quantization="float32")
    sentences = pairs[0][:150] + ["", "I am cold."]
    for decoding in (GREEDY, DecodingConfig(beam_size=4)):
        exact = CT2Translator.from_dir(model_dir, intra_threads=1, decoding=decoding).translate(sentences)
        fast = CT2Translator.from_dir(model_dir, intra_threads=1, decoding=decoding,
                                      exact=False).translate(sentences)
        same = sum(a == b for a, b in zip(exact, fast))
        print(f"fast vs exact, beam {decoding.beam_size}: {same}/{len(sentences)} identical")
        assert same >= 0.95 * len(sentences) and fast[-2] == ""


def test_translator_interface(post_norm: Path, tmp_path: Path) -> None:
    model_dir = export_ctranslate2(post_norm, tmp_path / "ct2", quantization="float32")
    engine = CT2Translator.from_dir(model_dir, intra_threads=1)
    reference = Translator.from_checkpoint(post_norm, device="cpu", amp="off")
    lines = ["", "I am cold.", "   ", "He is sleeping.", ""]
    out = engine.translate(lines, beam_size=3)
    assert out == reference.translate(lines, beam_size=3)
    assert out[0] == out[2] == out[4] == "" and out[1] and out[3]
    assert isinstance(engine.translate("I am cold."), str)

    nbest = engine.translate_nbest(["I am cold."], beam_size=4, n_best=3)[0]
    assert len(nbest) == 3 and [h.score for h in nbest] == sorted((h.score for h in nbest), reverse=True)

    # Attention: head average of the last layer over the source with its <eos>, as ours.
    ours = reference.translate_nbest(["Where is the station?"], return_attention=True, beam_size=1)[0][0]
    theirs = engine.translate_nbest(["Where is the station?"], return_attention=True, beam_size=1)[0][0]
    assert theirs.tokens == ours.tokens
    assert theirs.attention is not None and ours.attention is not None
    ours_view = alignment(ours.attention)  # CTranslate2 returns the last layer's head average
    assert theirs.attention.shape == (1, 1, *ours_view.shape)
    assert torch.allclose(alignment(theirs.attention), ours_view, atol=1e-4)

    # Over-long input is cut to the model's positions, as with PyTorch.
    engine.translate(["word " * 300], beam_size=1)
    assert engine.truncated == 1


def test_export_replaces_an_export_only_when_asked(post_norm: Path, tmp_path: Path) -> None:
    target = tmp_path / "ct2"
    export_ctranslate2(post_norm, target, quantization="float32")
    with pytest.raises(ExportError, match="exists; choose another output_dir, or overwrite=true"):
        export_ctranslate2(post_norm, target, quantization="int8")
    assert '"quantization": "float32"' in (target / "transformer_mt.json").read_text()
    export_ctranslate2(post_norm, target, quantization="int8", overwrite=True)  # atomic swap
    assert '"quantization": "int8"' in (target / "transformer_mt.json").read_text()
    assert [p.name for p in tmp_path.iterdir()] == ["ct2"]  # no temporary directories left
    other = tmp_path / "notes"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    with pytest.raises(ExportError, match="is not an export of transformer-mt"):
        export_ctranslate2(post_norm, other, overwrite=True)
    assert (other / "keep.txt").read_text() == "mine"
    with pytest.raises(ConfigError, match="quantization='int4' is not allowed"):
        export_ctranslate2(post_norm, tmp_path / "x", quantization="int4")
    with pytest.raises(ExportError, match="not a CTranslate2 export of transformer-mt"):
        CT2Translator.from_dir(other)


def test_ctranslate2_engine_needs_a_model_dir() -> None:
    with pytest.raises(ConfigError, match="engine=ctranslate2 needs model_dir="):
        tmt.translate(TranslateConfig(engine="ctranslate2", text="Hello"))


def test_cli_export_then_translate(post_norm: Path, tmp_path: Path, run_cli_here) -> None:
    started = time.perf_counter()
    model_dir = tmp_path / "ct2-cli"
    result = run_cli_here("export", f"checkpoint={post_norm}", "quantization=float32",
                          f"output_dir={model_dir}")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(model_dir.resolve()) and (model_dir / "model.bin").is_file()

    text = "Where is the station?"
    result = run_cli_here("translate", "engine=ctranslate2", f"model_dir={model_dir}", "device=cpu",
                          f"text={text}")
    assert result.returncode == 0, result.stderr
    expected = Translator.from_checkpoint(post_norm, device="cpu", amp="off").translate(text)  # beam 5
    assert result.stdout.strip() == expected
    print(f"CLI export + translate: {time.perf_counter() - started:.1f}s")


def test_the_export_carries_the_calibration_and_rates_as_pytorch(
        post_norm: Path, pairs: tuple[list[str], list[str]], tmp_path: Path) -> None:
    """Confidence on CTranslate2 (its score_batch over the best outputs) against PyTorch's forced pass; the
    run's calibration.json travels with the export only where it was fitted for the exported weights."""
    import dataclasses
    import shutil

    from transformer_mt.decoding.calibration import fit_calibration, raw_translations
    from transformer_mt.decoding.confidence import CALIBRATION_FILE, weights_fingerprint, write_calibration

    run = Path(shutil.copytree(post_norm, tmp_path / "run"))
    reference = float32_reference(run, GREEDY)
    sentences, targets = pairs[0][:40], pairs[1][:40]
    calibration = fit_calibration(raw_translations(reference, sentences), targets,
                                  {"fingerprint": weights_fingerprint(reference.model)})
    write_calibration(run, calibration)
    model_dir = export_ctranslate2(run, tmp_path / "ct2", quantization="float32")
    engine = CT2Translator.from_dir(model_dir, intra_threads=1, decoding=GREEDY)
    assert engine.rater.calibration == calibration
    ours = [n[0] for n in float32_reference(run, GREEDY).translate_nbest(sentences)]
    theirs = [n[0] for n in engine.translate_nbest(sentences)]
    same = [(a, b) for a, b in zip(ours, theirs) if a.text == b.text]
    assert len(same) >= 38
    for a, b in same:
        assert b.confidence == pytest.approx(a.confidence, abs=1e-3)
        assert [w for w, _ in b.word_confidences] == [w for w, _ in a.word_confidences]
        expected = [c for _, c in a.word_confidences]
        assert [c for _, c in b.word_confidences] == pytest.approx(expected, abs=1e-3)
    other = dataclasses.replace(calibration, fitted={"fingerprint": "another checkpoint's"})
    write_calibration(run, other)
    again = export_ctranslate2(run, tmp_path / "ct2-other", quantization="float32")
    assert not (again / CALIBRATION_FILE).exists()


def test_the_runs_shortlist_travels_as_ctranslate2s_vocabulary_map(post_norm: Path,
                                                                   pairs: tuple[list[str], list[str]],
                                                                   tmp_path: Path) -> None:
    """The export writes the run's shortlist as vmap.txt; `decoding.shortlist=true` makes CTranslate2 use
    it, one sentence at a time the same lists as ours (CTranslate2 adds <unk> and <s> to every list)."""
    import shutil

    from transformer_mt.data.ragged import Ragged
    from transformer_mt.decoding.shortlist import read_shortlist, write_shortlist

    run = Path(shutil.copytree(post_norm, tmp_path / "run"))
    plain = export_ctranslate2(run, tmp_path / "plain", quantization="float32")
    assert not (plain / "vmap.txt").exists()
    with pytest.raises(ExportError, match="has no vmap.txt; export the run again"):
        CT2Translator.from_dir(plain, decoding=DecodingConfig(shortlist=True))
    reference = Translator.from_checkpoint(run, device="cpu", amp="off")
    vocab = reference.vocab
    en, fr = pairs
    write_shortlist(run, Ragged.from_lists(vocab.encode_src(en)), Ragged.from_lists(vocab.encode_tgt(fr)),
                    vocab)
    shortlist = read_shortlist(run, vocab)
    model_dir = export_ctranslate2(run, tmp_path / "ct2", quantization="float32")
    lines = (model_dir / "vmap.txt").read_text(encoding="utf-8").splitlines()
    assert lines[0] == "\t" + " ".join(vocab.tgt.id_to_token(i) for i in shortlist.frequent.tolist())
    mapped = dict(line.split("\t") for line in lines[1:])
    for s in (5, 50, 200):
        row = [shortlist.identity[s].item(), *(t for t in shortlist.table[s].tolist() if t >= 0)]
        assert mapped[vocab.src.id_to_token(s)].split(" ") == [vocab.tgt.id_to_token(t) for t in row]
    decoding = DecodingConfig(beam_size=1, shortlist=True, confidence=False)
    ours = Translator.from_checkpoint(run, device="cpu", amp="off", decoding=decoding)
    theirs = CT2Translator.from_dir(model_dir, intra_threads=1, decoding=decoding)
    sentences = en[:60]
    same = sum(ours.translate([s]) == theirs.translate([s]) for s in sentences)
    print(f"shortlist, one sentence at a time: {same}/{len(sentences)} identical to ours")
    assert same >= 0.9 * len(sentences)
    few = vocab.encode_tgt(["le chat"])[0]
    (model_dir / "vmap.txt").write_text("\t" + " ".join(map(vocab.tgt.id_to_token, few)) + "\n",
                                        encoding="utf-8")
    narrow = CT2Translator.from_dir(model_dir, intra_threads=1, decoding=decoding)  # the flag obeys the file
    written = {t for out in narrow.translate_nbest(sentences, return_attention=True) for t in out[0].tokens}
    allowed = set(vocab.tgt_tokens_from_ids(few)) | {"<unk>"}
    assert written and written <= allowed, written - allowed
