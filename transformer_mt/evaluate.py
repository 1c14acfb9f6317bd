"""The `evaluate` job: decode a held-out set with a checkpoint and report BLEU, chrF, CER, WER, speed.

By default it scores the run's own test split (saved in the run directory as split/test.tsv, or
rebuilt deterministically from the checkpoint's config); parallel text can be given instead as two
files or one TSV. Hypotheses and a JSON report are written next to the checkpoint.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from transformer_mt.checkpoint import atomic_write
from transformer_mt.config import ConfigError, DatasetConfig, EvaluateConfig
from transformer_mt.data import DataError, load_split_tsv
from transformer_mt.metrics import score
from transformer_mt.runtime import configure_threads, select_device
from transformer_mt.translator import Translator

log = logging.getLogger(__name__)


def _read_text(path: Path) -> list[str]:
    if not path.is_file():
        raise DataError(f"{path} does not exist")
    try:
        return path.read_text(encoding="utf-8-sig").splitlines()
    except UnicodeDecodeError as ex:
        raise DataError(f"{path} is not UTF-8 (byte {ex.start}); convert it first") from ex


def load_eval_set(cfg: EvaluateConfig, engine: Translator) -> tuple[list[str], list[str], str]:
    """(sources, references, name) from the options, or the checkpoint run's own split."""
    if cfg.tsv_file:
        src, ref = load_split_tsv(Path(cfg.tsv_file))
        return src, ref, Path(cfg.tsv_file).stem
    if cfg.src_file or cfg.ref_file:
        if not (cfg.src_file and cfg.ref_file):
            raise ConfigError("give both src_file= and ref_file= (or one tsv_file=)")
        src, ref = _read_text(Path(cfg.src_file)), _read_text(Path(cfg.ref_file))
        if len(src) != len(ref):
            raise DataError(f"{cfg.src_file} has {len(src)} lines but {cfg.ref_file} has {len(ref)}")
        return src, ref, Path(cfg.src_file).stem
    saved = Path(engine.info["checkpoint"]).parent / "split" / f"{cfg.split}.tsv"
    if saved.is_file():
        src, ref = load_split_tsv(saved)
        return src, ref, cfg.split
    log.info("%s not found; rebuilding the run's %s split from its config", saved, cfg.split)
    from transformer_mt.data import load_pairs, select_pairs, split_pairs

    dataset = DatasetConfig(**engine.info["config"]["dataset"])
    src, tgt = select_pairs(dataset, *load_pairs(dataset))
    split = split_pairs(src, tgt, dataset.valid_size, dataset.test_size, dataset.split_seed)
    part = getattr(split, cfg.split)
    return list(part.src), list(part.tgt), cfg.split


def evaluate(cfg: EvaluateConfig) -> float:
    """Entry point of `transformer-mt evaluate`: returns BLEU."""
    if not cfg.checkpoint:
        raise ConfigError("checkpoint= is required: a .pt file or a run directory under saved_weights/")
    configure_threads(cfg.device)
    engine = Translator.from_checkpoint(cfg.checkpoint, device=select_device(cfg.device),
                                        decoding=cfg.decoding)
    sources, references, name = load_eval_set(cfg, engine)
    if cfg.max_sentences is not None:
        sources, references = sources[: cfg.max_sentences], references[: cfg.max_sentences]
    if not sources:
        raise DataError(f"the {name} set is empty; nothing to evaluate")

    started = time.perf_counter()
    nbest = engine.translate_nbest(sources)
    seconds = time.perf_counter() - started
    hypotheses = [n[0].text for n in nbest]
    scores = score(hypotheses, references)
    out_tokens = sum(len(t) for t in engine.vocab.encode_tgt(hypotheses))
    d = cfg.decoding
    search = "sampling" if d.sampling else ("greedy" if d.beam_size == 1 else f"beam{d.beam_size}")
    report: dict[str, Any] = {
        "checkpoint": engine.info["checkpoint"],
        "set": name,
        "search": search,
        **scores.as_dict(),
        "sentences_per_s": len(sources) / seconds,
        "tokens_per_s": out_tokens / seconds,
        "seconds": seconds,
        "device": str(engine.device),
        "decoding": d.__dict__,
    }
    out_dir = Path(cfg.output_dir) if cfg.output_dir else Path(engine.info["checkpoint"]).parent / "eval"
    stem = f"{name}.{Path(engine.info['checkpoint']).stem}.{search}"
    text = "\n".join(hypotheses) + "\n"
    atomic_write(out_dir / f"{stem}.hyp.txt", lambda f: f.write(text.encode("utf-8")))
    atomic_write(out_dir / f"{stem}.json",
                 lambda f: f.write(json.dumps(report, indent=2).encode("utf-8")))
    _log_tensorboard(Path(engine.info["checkpoint"]).parent, name, search, scores, engine)
    print(f"{name} ({len(sources)} sentences, {search}): BLEU {scores.bleu:.2f}  chrF {scores.chrf:.2f}"
          f"  CER {scores.cer:.4f}  WER {scores.wer:.4f}")
    print(f"  BLEU signature: {scores.bleu_signature}")
    print(f"  chrF signature: {scores.chrf_signature}")
    print(f"  speed: {report['sentences_per_s']:.1f} sentences/s, {report['tokens_per_s']:.0f} tokens/s"
          f" on {engine.device}")
    print(f"  wrote {out_dir / (stem + '.hyp.txt')} and {stem}.json")
    return scores.bleu


def _log_tensorboard(run_dir: Path, name: str, search: str, scores: Any, engine: Translator) -> None:
    """Add the scores to the run's TensorBoard log at the checkpoint's step."""
    if not (run_dir / "tensorboard").is_dir():
        return
    from torch.utils.tensorboard import SummaryWriter

    step = int(engine.info.get("step") or 0)
    with SummaryWriter(str(run_dir / "tensorboard")) as writer:
        for metric in ("bleu", "chrf", "cer", "wer"):
            writer.add_scalar(f"eval_{name}_{search}/{metric}", getattr(scores, metric), step)
