"""The `evaluate` job: decode a held-out set with a checkpoint and report BLEU, chrF, CER, WER, speed and
how well confidence sorts the translations (decoding/confidence_report.py); with calibrate=true, fit the
checkpoint's calibration of confidence on the set first (decoding/calibration.py).

By default it scores the run's own test split (saved in the run directory as split/test.tsv, or
rebuilt deterministically from the checkpoint's config); parallel text can be given instead as two
files or one TSV. Hypotheses and a JSON report are written to <run dir>/eval/ (or output_dir), and the
scores to the run's TensorBoard log at the checkpoint's step.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from transformer_mt.config import DatasetConfig, EvaluateConfig
from transformer_mt.config.typed import to_dataclass
from transformer_mt.data import LINE_ENDS, held_out_pairs, load_split_tsv, one_line, read_lines
from transformer_mt.data.languages import split_file
from transformer_mt.data.words import seen_words, training_words
from transformer_mt.decoding import confidence_report, robustness
from transformer_mt.decoding.calibration import fit_calibration, fitted_for, search_name
from transformer_mt.decoding.confidence import Calibration, Rater, write_calibration
from transformer_mt.decoding.glossary import count_terms, read_glossary
from transformer_mt.decoding.metrics import Scores, bleu_and_length, score
from transformer_mt.decoding.text_translator import Translation
from transformer_mt.decoding.translator import Translator
from transformer_mt.documents import report as documents_report
from transformer_mt.documents.pipeline import DocumentTranslator
from transformer_mt.errors import ConfigError, DataError
from transformer_mt.runtime.device import configure_threads, select_device
from transformer_mt.runtime.files import write_output

log = logging.getLogger(__name__)


def load_eval_set(cfg: EvaluateConfig, run_dir: Path, run_config: dict[str, Any],
                  lang: str | None = None) -> tuple[list[str], list[str], str]:
    """(sources, references, name) from the options, or the checkpoint run's own split (with several
    target languages, `lang`'s: split/test.<lang>.tsv)."""
    if cfg.tsv_file:
        src, ref = load_split_tsv(Path(cfg.tsv_file))
        return src, ref, Path(cfg.tsv_file).stem
    if cfg.src_file or cfg.ref_file:
        if not (cfg.src_file and cfg.ref_file):
            raise ConfigError("give both src_file= and ref_file= (or one tsv_file=)")
        src, ref = read_lines(Path(cfg.src_file)), read_lines(Path(cfg.ref_file))
        if len(src) != len(ref):
            raise DataError(f"{cfg.src_file} has {len(src)} lines but {cfg.ref_file} has {len(ref)} "
                            f"({LINE_ENDS})")
        return src, ref, Path(cfg.src_file).stem
    own = run_config.get("dataset", {}).get("tgt_lang")
    files = ([split_file(run_dir, cfg.split, lang)] if lang else []) + \
        ([split_file(run_dir, cfg.split)] if lang in (None, own) else [])  # the first language's
    for saved in files:
        if saved.is_file():
            src, ref = load_split_tsv(saved)
            return src, ref, f"{cfg.split}.{lang}" if lang else cfg.split
    if lang not in (None, own):
        raise DataError(f"{files[0]} is missing: the run's {cfg.split} pairs into {lang} are kept only there")
    log.info("%s not found; rebuilding the run's %s split from its config", saved, cfg.split)
    pairs = held_out_pairs(DatasetConfig(**run_config["dataset"]), cfg.split)
    return [s for s, _ in pairs], [t for _, t in pairs], cfg.split


def evaluate(cfg: EvaluateConfig) -> float:
    """Entry point of `transformer-mt evaluate`: returns BLEU."""
    assert cfg.checkpoint is not None  # validate() requires it
    configure_threads(cfg.device)
    glossary = read_glossary(cfg.decoding.glossary)  # before the model: a bad file is one line, and no wait
    engine = Translator.from_checkpoint(cfg.checkpoint, device=select_device(cfg.device),
                                        decoding=cfg.decoding, amp=cfg.device.amp, tgt_lang=cfg.tgt_lang)
    engine.use_glossary(glossary)
    checkpoint = Path(engine.info["checkpoint"])
    lang = engine.tgt_lang if engine.vocab.target_languages else None
    sources, references, name = load_eval_set(cfg, checkpoint.parent, engine.info["config"], lang)
    if cfg.max_sentences is not None:
        sources, references = sources[: cfg.max_sentences], references[: cfg.max_sentences]
    if not sources:
        raise DataError(f"the {name} set is empty; nothing to evaluate")
    if cfg.calibrate:
        engine.rater = Rater(None)  # the model's own probabilities: what a calibration is fitted to

    best, seconds, rating = _translated(engine, sources)
    hypotheses = [t.text for t in best]
    scores = score(hypotheses, references)
    d = cfg.decoding
    search = search_name(d)
    out_tokens = sum(len(t) for t in engine.vocab.encode_tgt(hypotheses))
    report: dict[str, Any] = {
        "checkpoint": engine.info.get("ensemble", str(checkpoint)), "set": name, "search": search,
        **scores.as_dict(),
        "sentences_per_s": len(sources) / seconds, "tokens_per_s": out_tokens / seconds, "seconds": seconds,
        "device": str(engine.device), "amp": str(engine.precision), "decoding": d.__dict__,
        "confidence_seconds": rating,
    }
    confidence = _confidence(cfg, engine, best, references, checkpoint.parent, name)
    if confidence is not None:
        report["confidence"] = confidence
    if glossary is not None:
        report["glossary"] = count_terms(u for t in best for u in t.terms or ())
    out_dir = Path(cfg.output_dir) if cfg.output_dir else checkpoint.parent / "eval"
    members = len(engine.info.get("ensemble", ()))
    stem = f"{name}.{f'ensemble{members}' if members else checkpoint.stem}.{search}"
    text = "".join(f"{one_line(h)}\n" for h in hypotheses)  # a line break in one would shift the rest
    if cfg.robustness:  # the same sentences as people also type them (decoding/robustness.py)
        rows, signatures = robustness.robustness(
            lambda s, **o: _best(engine, s, **o), sources, references, cfg.seed,
            folded=cfg.decoding.input_case == "fold", written=hypotheses)
        report["robustness"] = robustness.report(rows, signatures, cfg.seed)
    if cfg.documents:  # several sentences a line, spans, unseen names (documents/report.py)
        if engine.known_words is None:  # a checkpoint older than its word list: the words of its data
            engine.known_words = training_words(_dataset(engine))
        docs = DocumentTranslator.for_engine(engine, cfg.document)
        documents = _documents_report(cfg, docs, sources, references, hypotheses)
        report["documents"] = documents_report.report_json(documents)
        report["documents"]["typos_names"] = typos = _names_on_typos(cfg, docs, sources, references)
    write_output(out_dir / f"{stem}.hyp.txt", lambda f: f.write(text.encode("utf-8")))
    write_output(out_dir / f"{stem}.json", lambda f: f.write(json.dumps(report, indent=2).encode("utf-8")))
    if not members:  # an ensemble is no one checkpoint's step
        step = int(engine.info.get("step") or 0)
        _log_tensorboard(checkpoint.parent, f"eval_{name}_{search}", scores, step)
    _print_scores(f"{name} ({len(sources)} sentences, {search})", scores, report, engine)
    if cfg.robustness:
        print(f"input as people type it (seed {cfg.seed}):")
        print(robustness.table(rows))
    if cfg.documents:
        print(f"text as people have it (seed {cfg.seed}):")
        print(documents_report.table(documents))
        print(f"  typos ({typos['sentences_changed']} sentences): BLEU {typos['bleu_names_copied']:.2f} with "
              f"names the model never met copied, {typos['bleu_names_model']:.2f} with document.names=model")
        print(f"  {docs.summary()}")
    print(f"  wrote {out_dir / (stem + '.hyp.txt')} and {stem}.json")
    return scores.bleu


def _print_scores(title: str, scores: Scores, report: dict[str, Any], engine: Translator) -> None:
    """The report's scores, speed, confidence and glossary lines."""
    print(f"{title}: BLEU {scores.bleu:.2f}  chrF {scores.chrf:.2f}  CER {scores.cer:.4f}"
          f"  WER {scores.wer:.4f}")
    print(f"  BLEU signature: {scores.bleu_signature}")
    print(f"  chrF signature: {scores.chrf_signature}")
    print(f"  speed: {report['sentences_per_s']:.1f} sentences/s, {report['tokens_per_s']:.0f} tokens/s"
          f" on {engine.device} ({engine.precision})")
    if "confidence" in report:
        print("\n".join(confidence_report.lines(report["confidence"])))
    if "glossary" in report:
        terms = report["glossary"]
        print(f"  glossary: {terms['terms']} terms in the sources, {terms['met']} in their translation, "
              f"{terms['refused']} refused, {terms['missing']} missing")


def _translated(engine: Translator, sources: list[str]) -> tuple[list[Translation], float, float]:
    """The best translation of each source, as validation decodes (sentence by sentence, as written); the
    seconds of the search, and apart those of confidence's forced pass, which its speed leaves out."""
    started, rating = time.perf_counter(), engine.rater.seconds
    best = [nbest[0] for nbest in engine.translate_nbest(sources)]
    rating = engine.rater.seconds - rating
    return best, time.perf_counter() - started - rating, rating


def _confidence(cfg: EvaluateConfig, engine: Translator, best: list[Translation], references: list[str],
                run_dir: Path, name: str) -> dict[str, Any] | None:
    """The report's confidence section (None with decoding.confidence=false). With calibrate=true, the
    checkpoint's calibration is fitted on these translations first, written beside it, and applied to them."""
    if not cfg.decoding.confidence or all(t.confidence is None for t in best):  # off, or all empty
        return None
    written = None
    if cfg.calibrate:
        calibration = fit_calibration(best, references, fitted_for(engine, name, cfg.decoding))
        written = str(write_calibration(run_dir, calibration))
        best = [_calibrated(t, calibration) for t in best]
        engine.rater = Rater(calibration)
    section = confidence_report.report(best, references, cfg.seed, engine.rater.calibration is not None)
    return section if written is None else {**section, "calibration_written": written}


def _calibrated(t: Translation, calibration: Calibration) -> Translation:
    """A translation rated without a calibration, rated with it: a new one (the translations of a repeated
    source are one object, which must not go through the curves twice)."""
    if t.confidence is None:
        return t
    confidence, words = calibration.applied(t.confidence, t.word_confidences or [])
    return dataclasses.replace(t, confidence=confidence, word_confidences=words)


def _best(engine: Translator | DocumentTranslator, sources: list[str], **options: Any) -> list[str]:
    """The best translation of each source (with these decoding options): by the engine, or through the
    documents layer. No confidence unless asked: the reports that call it read none."""
    return [n[0].text for n in engine.translate_nbest(sources, **{"confidence": False, **options})]


def _documents_report(cfg: EvaluateConfig, docs: DocumentTranslator, sources: list[str],
                      references: list[str], written: list[str]) -> documents_report.DocumentsReport:
    """The documents report: the pipeline as configured, then with splitting off and with protection
    off; names are unseen when the run's training pairs lack them."""
    engine = docs.engine
    unsplit = DocumentTranslator.for_engine(engine, dataclasses.replace(cfg.document, split=False))
    unprotected = DocumentTranslator.for_engine(engine, dataclasses.replace(cfg.document, protect=False))
    return documents_report.documents_report(
        lambda t: _best(docs, t), lambda t: _best(unsplit, t), lambda t: _best(unprotected, t),
        sources, references, written, cfg.seed, seen_words(engine.known_words or frozenset()))


def _names_on_typos(cfg: EvaluateConfig, docs: DocumentTranslator, sources: list[str],
                    references: list[str]) -> dict[str, float | int]:
    """What copying capitalised words no training pair held costs text with typos (a misspelt first word
    is one): the test sentences with the robustness report's typos, through the layer with names copied
    and with document.names=model."""
    typed = robustness.varied_sources(sources, cfg.seed)["typos"]
    model = DocumentTranslator.for_engine(docs.engine, dataclasses.replace(cfg.document, names="model"))
    copied = DocumentTranslator.for_engine(docs.engine, dataclasses.replace(cfg.document, names="copy"))
    return {"sentences_changed": sum(t != s for t, s in zip(typed, sources, strict=True)),
            "bleu_names_copied": bleu_and_length(_best(copied, typed), references)[0],
            "bleu_names_model": bleu_and_length(_best(model, typed), references)[0]}


def _dataset(engine: Translator) -> DatasetConfig:
    """The dataset section of the engine's run."""
    return to_dataclass(OmegaConf.create(engine.info["config"]["dataset"]), DatasetConfig)


def _log_tensorboard(run_dir: Path, tag: str, scores: Scores, step: int) -> None:
    """Add the scores to the run's TensorBoard log at the checkpoint's step."""
    if not (run_dir / "tensorboard").is_dir():
        return
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(str(run_dir / "tensorboard")) as writer:
        for metric in ("bleu", "chrf", "cer", "wer"):
            writer.add_scalar(f"{tag}/{metric}", getattr(scores, metric), step)
