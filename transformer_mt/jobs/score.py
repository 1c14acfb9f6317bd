"""The `score` job: the model's log-probability of given pairs, to filter a noisy corpus or rerank.

Pairs come as a TSV (`input=`, or stdin) or as two aligned files (`src=`, `tgt=`). Every line is read
and checked before anything is scored, so a malformed line ends the command with one line naming it and
nothing written. The output has one line per pair, in input order: `sum<TAB>mean` (the summed
log-probability of the target's pieces and its <eos>, and its mean per token), or with
`output_format=json` one JSON object a line.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterable
from pathlib import Path

from transformer_mt.config import ScoreConfig
from transformer_mt.data import LINE_ENDS, read_lines, utf8_lines
from transformer_mt.decoding.scoring import PairScore
from transformer_mt.decoding.translator import Translator
from transformer_mt.errors import DataError
from transformer_mt.runtime.device import configure_threads, select_device
from transformer_mt.runtime.files import write_output

log = logging.getLogger(__name__)


def tsv_pairs(lines: Iterable[str], name: str) -> tuple[list[str], list[str]]:
    """Sources and targets of source<TAB>target lines; DataError naming the first line without them."""
    sources, targets = [], []
    for number, line in enumerate(lines, start=1):
        columns = line.split("\t")
        if len(columns) != 2:
            raise DataError(f"{name}: line {number} has {len(columns)} tab-separated column"
                            f"{'s' if len(columns) > 1 else ''}, expected 2 (source<TAB>target)")
        sources.append(columns[0])
        targets.append(columns[1])
    return sources, targets


def read_pairs(cfg: ScoreConfig) -> tuple[list[str], list[str], str]:
    """The pairs to score and where they came from (for messages)."""
    if cfg.src is not None and cfg.tgt is not None:
        sources, targets = read_lines(Path(cfg.src)), read_lines(Path(cfg.tgt))
        if len(sources) != len(targets):
            raise DataError(f"{cfg.src} has {len(sources)} lines but {cfg.tgt} has {len(targets)}; the two "
                            f"files must hold one sentence per line each, aligned ({LINE_ENDS})")
        name = f"{cfg.src} + {cfg.tgt}"
    elif cfg.input is not None:
        sources, targets = tsv_pairs(read_lines(Path(cfg.input)), cfg.input)
        name = cfg.input
    else:
        if sys.stdin.isatty():
            raise DataError("no pairs: give input=<pairs.tsv>, src=<file> tgt=<file>, or pipe a TSV in")
        sources, targets = tsv_pairs(utf8_lines(sys.stdin.buffer, "stdin"), "stdin")
        name = "stdin"
    if not sources:
        raise DataError(f"{name} holds no pairs to score")
    return sources, targets, name


def format_score(score: PairScore, output_format: str) -> str:
    """One output line (without its newline)."""
    if output_format == "json":
        return json.dumps({"log_prob": round(score.log_prob, 6), "mean": round(score.mean, 6),
                           "tokens": score.tokens})
    return f"{score.log_prob:.6f}\t{score.mean:.6f}"


def score(cfg: ScoreConfig) -> list[PairScore]:
    """Entry point of `transformer-mt score`: the scores, also written to `output` or stdout."""
    sources, targets, name = read_pairs(cfg)
    configure_threads(cfg.device)
    assert cfg.checkpoint is not None  # validate() requires it
    engine = Translator.from_checkpoint(cfg.checkpoint, device=select_device(cfg.device), amp=cfg.device.amp,
                                        tgt_lang=cfg.tgt_lang)
    log.info("scoring %d pairs of %s on %s (%s)", len(sources), name, engine.device, engine.precision)
    try:
        scores = engine.score(sources, targets)
    except DataError as ex:  # name the line rather than the pair: they are the same number
        raise DataError(f"{name}: {str(ex).replace('pair ', 'line ', 1)}") from None
    text = "".join(format_score(s, cfg.output_format) + "\n" for s in scores)
    if cfg.output:
        write_output(Path(cfg.output), lambda f: f.write(text.encode("utf-8")))
        log.info("%d scores written to %s", len(scores), cfg.output)
    else:
        sys.stdout.write(text)
        sys.stdout.flush()
    return scores
