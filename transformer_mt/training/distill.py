"""Sequence-level knowledge distillation (`distill.teacher=<run>[,<run>...]`; Kim and Rush, 2016): a teacher
(one model or an ensemble) translates the run's training sources with beam search, and the run trains on
its translations, with the teacher's tokenizer.

The translations are kept in `<dataset.cache_dir>/distilled/<key>/`, one file per chunk of
`distill.chunk_pairs` sources, each written whole (atomic rename) and keyed by what decides it: the
teacher's weights and vocabulary, its search, the sources. A run killed while the teacher translates starts
again at its first missing chunk; a later run of the same teacher and corpus (another seed or student
shape, a resumed run) reads them without translating. The teacher trained on every pair but its valid and
test ones, so the student's held-out pairs must be the teacher's own (`check_held_out`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from transformer_mt.checkpoints.store import resolve_checkpoint
from transformer_mt.config import DecodingConfig, TrainConfig, resolve_path
from transformer_mt.data import PreparedData, Ragged
from transformer_mt.data.encode import EncodedSplit, write_summary
from transformer_mt.data.mixture import Mixture, Part
from transformer_mt.data.split import SPLIT_DIR
from transformer_mt.data.tokenizer import Vocabulary
from transformer_mt.decoding.confidence import weights_fingerprint
from transformer_mt.decoding.decode import decode_ids
from transformer_mt.decoding.translator import Translator
from transformer_mt.errors import ConfigError, DataError
from transformer_mt.runtime.device import Precision
from transformer_mt.runtime.files import atomic_write
from transformer_mt.training import finetune
from transformer_mt.training.distributed import World, from_main

log = logging.getLogger(__name__)
FORMAT = 1  # bump when what a chunk holds changes
HELD_OUT = ("valid.tsv", "test.tsv")


@dataclass
class Teacher:
    """The teacher's checkpoints and its engine (model or ensemble, tokenizer, device, precision)."""

    paths: list[Path]
    engine: Translator

    @property
    def vocab(self) -> Vocabulary:
        return self.engine.vocab


def load_teacher(cfg: TrainConfig, device: torch.device) -> Teacher:
    """distill.teacher's models on the run's device, decoding as `translate` would; its tokenizer
    settings must be the run's (`train` puts them first: jobs/replayed.py)."""
    teacher = str(cfg.distill.teacher)
    engine = Translator.from_checkpoint(teacher, device=device, amp=cfg.device.amp)
    paths = [resolve_checkpoint(p.strip()) for p in teacher.split(",") if p.strip()]
    theirs = finetune.decided("tokenizer", engine.info["config"].get("tokenizer", {}))
    ours = dataclasses.asdict(cfg.tokenizer)
    differ = [f"tokenizer.{k}={ours[k]!r} contradicts the teacher's {v!r}" for k, v in theirs.items()
              if k in ours and ours[k] != v]
    if differ:
        raise ConfigError(f"distill.teacher={teacher}: {'; '.join(differ)}; a student keeps its teacher's "
                          "tokenizer: drop those settings")
    saved_data = engine.info["config"].get("dataset", {})
    pair = (cfg.dataset.src_lang, cfg.dataset.tgt_lang)
    if (saved_data.get("src_lang"), saved_data.get("tgt_lang")) != pair:
        raise ConfigError(f"distill.teacher={teacher} translates {saved_data.get('src_lang')}->"
                          f"{saved_data.get('tgt_lang')}, this run is {'->'.join(pair)}; distill a teacher "
                          "of the run's language pair")
    log.info("distillation: teacher %s (%s on %s)", ", ".join(map(str, paths)), engine.precision, device)
    return Teacher(paths, engine)


def check_held_out(teacher: Teacher, run_dir: Path) -> None:
    """The run's valid and test pairs must be the teacher's (its run directory's split files): any other
    held-out pair may be one the teacher trained on, and the student's scores would count it."""
    for path in teacher.paths:
        theirs = path.parent / SPLIT_DIR
        if not all((theirs / name).is_file() for name in HELD_OUT):
            log.warning("distillation: %s keeps no split files beside it; the student's valid and test pairs "
                        "cannot be checked against the pairs it trained on", path)
            continue
        for name in HELD_OUT:
            if (theirs / name).read_bytes() != (run_dir / SPLIT_DIR / name).read_bytes():
                raise DataError(f"this run's {SPLIT_DIR}/{name} differs from the teacher's "
                                f"({theirs / name}): the teacher may have trained on the student's held-out "
                                "pairs; distill with the teacher's dataset settings (dataset, its "
                                "split_seed, valid_size, test_size, max_pairs)")


def teacher_search(cfg: TrainConfig) -> DecodingConfig:
    """The teacher's search: beam distill.beam_size, the run's length penalty, limits and batch size."""
    search = {f.name: getattr(cfg.decoding, f.name) for f in dataclasses.fields(cfg.decoding)}
    return dataclasses.replace(DecodingConfig(**search), beam_size=cfg.distill.beam_size, confidence=False)


# The search's fields when the cache key was defined. A field added since enters the key only where it is
# not at its default, so that a new setting's neutral default keeps every cache made before it found.
KEYED_SEARCH = ("beam_size", "length_penalty", "max_len_a", "max_len_b", "batch_tokens", "use_cache",
                "n_best", "prefix", "sampling", "temperature", "top_k", "top_p", "alignment",
                "alignment_layer", "input_case", "confidence", "min_confidence", "low_confidence", "glossary")


def search_key(search: DecodingConfig) -> dict[str, object]:
    """The search's fields for the cache key (KEYED_SEARCH, and later ones set otherwise than by default);
    `quantize` is the engine's precision (precision_key)."""
    values, default = dataclasses.asdict(search), dataclasses.asdict(DecodingConfig())
    return {k: v for k, v in values.items()
            if k in KEYED_SEARCH or (k != "quantize" and v != default[k])}


def precision_key(precision: Precision) -> str:
    """What the teacher computes in: its float type, and int8 where its linear layers are quantized."""
    return str(precision.dtype) + (" int8" if precision.int8 else "")


def chunk_directory(cfg: TrainConfig, teacher: Teacher, sources: Ragged, search: DecodingConfig) -> Path:
    """`<cache_dir>/distilled/<key>`: the key hashes the teacher's weights and vocabulary, the search and
    the sources (ids and offsets), so another teacher or corpus never reads these translations."""
    digest = hashlib.sha256(sources.lengths.astype(np.int64).tobytes())
    digest.update(Ragged.concat([sources]).flat.astype(np.int32).tobytes())
    key = {"format": FORMAT, "teacher": weights_fingerprint(teacher.engine.model),
           "vocab": hashlib.sha256(json.dumps(teacher.vocab.to_json(), sort_keys=True).encode()).hexdigest(),
           "search": search_key(search), "amp": precision_key(teacher.engine.precision),
           "chunk_pairs": cfg.distill.chunk_pairs, "sources": digest.hexdigest()}
    name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
    directory = resolve_path(cfg.dataset.cache_dir) / "distilled" / name
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "key.json").write_text(json.dumps({**key, "paths": list(map(str, teacher.paths))}, indent=2))
    return directory


def _save_chunk(path: Path, outputs: list[list[int]]) -> None:
    lengths = np.array([len(o) for o in outputs], dtype=np.int64)
    flat = np.fromiter((t for o in outputs for t in o), dtype=np.int32, count=int(lengths.sum()))
    buffer = io.BytesIO()
    np.savez(buffer, flat=flat, offsets=np.concatenate([[0], np.cumsum(lengths)]))
    atomic_write(path, lambda f: f.write(buffer.getvalue()))


def _load_chunk(path: Path) -> Ragged:
    with np.load(path) as chunk:
        return Ragged.from_offsets(chunk["flat"], chunk["offsets"])


def translate_sources(teacher: Teacher, sources: Ragged, search: DecodingConfig, directory: Path,
                      chunk_pairs: int, progress: bool = True) -> tuple[Ragged, dict[str, Any]]:
    """The teacher's best translation (token ids) of every source, chunk by chunk: chunks already in
    `directory` are read, the others translated and saved. A source the teacher cannot take (longer than
    its positions) gets an empty translation. Returns them and what was done (chunks, seconds)."""
    n = len(sources)
    chunks = math.ceil(n / chunk_pairs)
    path = [directory / f"chunk_{k:06d}.npz" for k in range(chunks)]
    done = sum(p.is_file() for p in path)
    started, translated = time.perf_counter(), 0
    bar = tqdm(total=n, initial=min(n, done * chunk_pairs), unit="sentence", desc="teacher",
               disable=not progress, dynamic_ncols=True)
    if done:
        log.info("distillation: %d of %d chunks already translated in %s", done, chunks, directory)
    outputs = []
    for k in range(chunks):
        if not path[k].is_file():  # (also one removed since the run started)
            rows = sources[k * chunk_pairs:(k + 1) * chunk_pairs]
            _save_chunk(path[k], _translate(teacher, rows.tolist(), search))
            translated += len(rows)
            bar.update(len(rows))
            rate = translated / (time.perf_counter() - started)
            left = sum(not p.is_file() for p in path[k:]) * chunk_pairs / rate
            log.info("distillation: chunk %d of %d translated (%.1f sentences/s; %.0f s to go)", k + 1,
                     chunks, rate, left)
        outputs.append(_load_chunk(path[k]))
    bar.close()
    seconds = time.perf_counter() - started
    if translated:
        log.info("distillation: the teacher translated %d sources in %.0fs (%.1f sentences/s)", translated,
                 seconds, translated / seconds)
    return Ragged.concat(outputs), {"chunks": chunks, "chunks_cached": done, "translated": translated,
                                    "seconds": round(seconds, 1)}


def _translate(teacher: Teacher, rows: list[list[int]], search: DecodingConfig) -> list[list[int]]:
    """The teacher's best translation of each source; an empty one where the source is longer than its
    positions (its eos takes one)."""
    engine = teacher.engine
    fits = [i for i, ids in enumerate(rows) if len(ids) < engine.model.config.max_positions]
    outputs: list[list[int]] = [[] for _ in rows]
    found = decode_ids(engine.model, [rows[i] for i in fits], search, engine.device,
                       amp=engine.precision.dtype)
    for i, hyps in zip(fits, found):
        outputs[i] = hyps[0].tokens
    return outputs


def _with_targets(data: PreparedData, outputs: Ragged, min_len: int, max_len: int,
                  original_weight: float, seed: int) -> tuple[PreparedData, int]:
    """The training split with the teacher's targets: a pair keeps its original target where the teacher
    gave none within min_len..max_len tokens (so every corpus keeps its rows); with original_weight, the
    original pairs follow, each corpus's as one more part of that corpus (its variants, tag, language)
    weighing original_weight times its own weight. Also how many kept their original."""
    train, lengths = data.train, outputs.lengths
    own = (lengths >= min_len) & (lengths <= max_len)
    either = Ragged.concat([outputs, train.tgt_ids])  # row i: the teacher's; row n + i: the original
    rows = np.where(own, np.arange(len(train)), len(train) + np.arange(len(train)))
    distilled = EncodedSplit(train.src_ids, either.take(rows))
    parts = data.mixture.parts if data.mixture else (Part("distilled", 0, len(train), 1.0),)
    if original_weight:
        n, corpora = len(train), Mixture(parts, seed).corpora()
        parts = (*parts, *(Part(f"{p.name}, original targets" if data.mixture else "original targets",
                                p.start + n, p.stop + n, p.weight * original_weight, corpus=k)
                           for p, k in zip(parts, corpora)))
        distilled = EncodedSplit(Ragged.concat([distilled.src_ids, train.src_ids]),
                                 Ragged.concat([distilled.tgt_ids, train.tgt_ids]))
    mixture = Mixture(parts, seed) if original_weight or data.mixture else None
    return dataclasses.replace(data, train=distilled, mixture=mixture), int((~own).sum())


def distilled_data(cfg: TrainConfig, data: PreparedData, teacher: Teacher | None, run_dir: Path,
                   world: World) -> PreparedData:
    """The run's data with the teacher's translations as training targets (`teacher` is loaded on the
    main process only; the others receive its translations)."""
    d = cfg.distill
    report: dict[str, Any] = {}
    outputs = None
    if world.is_main:
        assert teacher is not None
        check_held_out(teacher, run_dir)
        search = teacher_search(cfg)
        directory = chunk_directory(cfg, teacher, data.train.src_ids, search)
        outputs, report = translate_sources(teacher, data.train.src_ids, search, directory, d.chunk_pairs,
                                            cfg.training.progress)
        report = {"teacher": [str(p) for p in teacher.paths], "beam_size": d.beam_size,
                  "cache": str(directory), **report}
    outputs, report = from_main((outputs, report), world)
    distilled, kept = _with_targets(data, outputs, cfg.dataset.min_len, cfg.dataset.max_len,
                                    d.original_weight, cfg.dataset.split_seed)
    report = {**report, "kept_original": kept, "original_weight": d.original_weight}
    log.info("distillation: %d training pairs with the teacher's targets (%d kept their own: none from the "
             "teacher within the length limits)%s", len(data.train) - kept, kept,
             f"; the original targets at weight {d.original_weight:g}" if d.original_weight else "")
    summary = {**distilled.summary, "distillation": report}
    if world.is_main:
        write_summary(run_dir, summary)
    return dataclasses.replace(distilled, summary=summary,
                               stats={**distilled.stats, "train_kept": len(distilled.train)})
