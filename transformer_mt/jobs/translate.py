"""The `translate` job: sentences from the command line, a file, a pipe or an interactive prompt.

Output keeps line alignment: one line out per line in (n lines with n-best), an empty line for an
empty line (or its prefix, with one); with output_format=jsonl each line is a JSON object (text, score,
confidence, words). A translation below decoding.min_confidence is marked (jsonl) or withheld (its text
left empty), and counted in the log. Lines are translated in chunks so a large file streams instead
of filling memory; with `output=`, each chunk goes to a temporary file beside it, renamed into place
once every line is written.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import logging
import math
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TextIO, TypeVar

from transformer_mt.config import TranslateConfig
from transformer_mt.config.arguments import not_utf8_text
from transformer_mt.config.problems import raise_if
from transformer_mt.data import one_line, open_binary, read_utf8, utf8_lines
from transformer_mt.decoding.alignment import pharaoh
from transformer_mt.decoding.confidence import shown, verdict, words_json
from transformer_mt.decoding.engine import load_engine
from transformer_mt.decoding.search import alignment
from transformer_mt.decoding.text_translator import TextTranslator, Translation, check_default_prefix
from transformer_mt.documents.formats import format_for, read_document
from transformer_mt.documents.pipeline import DocumentTranslator
from transformer_mt.documents.spans import read_terms
from transformer_mt.errors import ConfigError, DataError
from transformer_mt.runtime.files import write_output

log = logging.getLogger(__name__)
T = TypeVar("T")
CHUNK_LINES = 2000  # lines translated together: big enough to batch well, small enough to stream


def chunks(lines: Iterable[str], size: int) -> Iterator[list[str]]:
    """Group lines into lists of at most `size`."""
    chunk: list[str] = []
    for line in lines:
        chunk.append(line)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def format_nbest(nbest: list[Translation], n_best: int, with_scores: bool) -> list[str]:
    """Output lines for one input: the best, or n lines `rank<TAB>score<TAB>text` with n-best; with
    decoding.alignment, each line ends in `<TAB>0-0 1-2 ...`. A line break in a translation (a byte-level
    model can write one) becomes a space, and so does a tab where the line has columns: one input, one
    output line (or n)."""
    columns = with_scores or n_best > 1 or nbest[0].alignment is not None

    def text(h: Translation) -> str:
        flat = one_line(h.text)
        flat = flat.replace("\t", " ") if columns else flat
        return flat if h.alignment is None else f"{flat}\t{pharaoh(h.alignment)}"

    if n_best == 1:
        best = nbest[0]
        return [f"{best.score:.4f}\t{text(best)}" if with_scores else text(best)]
    empty = Translation("", float("-inf"), alignment=[] if nbest[0].alignment is not None else None)
    padded = nbest + [empty] * (n_best - len(nbest))
    return [f"{rank}\t{h.score:.4f}\t{text(h)}" if with_scores else text(h)
            for rank, h in enumerate(padded[:n_best], start=1)]


def jsonl_lines(nbest: list[Translation], n_best: int, screened: bool, action: str | None) -> list[str]:
    """output_format=jsonl: one object per output line of format_nbest (n with n-best, `rank` then given):
    text, score, confidence and words of the best ([[word, confidence], ...]; null for the others), the
    alignment where asked; `screened` (decoding.min_confidence set) adds `low_confidence`, and `action`
    withhold leaves the text and words out, with `withheld: true`."""
    empty = Translation("", float("-inf"), alignment=[] if nbest[0].alignment is not None else None)
    out = []
    for rank, h in enumerate((nbest + [empty] * (n_best - len(nbest)))[:n_best], start=1):
        line: dict[str, object] = {"text": h.text, "score": h.score if math.isfinite(h.score) else None,
                                   "confidence": None if h.confidence is None else shown(h.confidence),
                                   "words": words_json(h.word_confidences)}
        if n_best > 1:
            line["rank"] = rank
        if h.alignment is not None:
            line["alignment"] = pharaoh(h.alignment)
        if screened:
            line["low_confidence"] = action is not None
        if action == "withhold":  # nothing of the translation: its text, words, alignment
            line.update(text="", words=[], withheld=True)
            line.update({"alignment": ""} if "alignment" in line else {})
        out.append(json.dumps(line, ensure_ascii=False))
    return out


def output_lines(nbest: list[Translation], cfg: TranslateConfig) -> tuple[list[str], bool]:
    """One input's output lines (output_format), and whether its best translation is below
    decoding.min_confidence (marked, or withheld: its lines' texts left empty)."""
    d = cfg.decoding
    action = verdict(nbest[0].confidence, d.min_confidence, d.low_confidence)
    if cfg.output_format == "jsonl":
        return jsonl_lines(nbest, d.n_best, d.min_confidence is not None, action), action is not None
    if action == "withhold":
        nbest = [dataclasses.replace(h, text="", alignment=None if h.alignment is None else [])
                 for h in nbest]
    return format_nbest(nbest, d.n_best, cfg.scores), action is not None


def warn_terms(number: int, best: Translation | None) -> None:
    """One warning per glossary term of input line `number` that its translation does not hold."""
    for use in best.terms or () if best is not None else ():
        if use.status != "met":
            log.warning("line %d: glossary term %r -> %r %s: %s", number, use.source, use.target, use.status,
                        use.reason)


def interactive(docs: DocumentTranslator, cfg: TranslateConfig) -> None:
    """A prompt for a person at a terminal: one sentence at a time until EOF or Ctrl-C."""
    print("Type a sentence and press Enter (Ctrl-D to quit).", file=sys.stderr)
    while True:
        try:
            line = input("> ")
            raise_if(not_utf8_text("the line", line))  # a terminal that is not UTF-8 (surrogate escapes)
        except (EOFError, KeyboardInterrupt):
            print(file=sys.stderr)
            return
        except (UnicodeDecodeError, ConfigError) as ex:  # a strict stdin raises, another escapes the bytes
            print(f"error: {ex if isinstance(ex, ConfigError) else 'the line is not valid UTF-8'}; try again",
                  file=sys.stderr)
            continue
        for out in output_lines(docs.translate_nbest([line])[0], cfg)[0]:
            print(out, flush=True)


def write_attention_png(engine: TextTranslator, sentence: str, path: Path) -> None:
    """Cross-attention of the best hypothesis as a heatmap (needs matplotlib: the `plot` extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as ex:
        raise ConfigError("attention_png needs matplotlib: pip install 'transformer-mt[plot]'") from ex
    best = engine.translate_nbest([sentence], return_attention=True)[0][0]
    if best.attention is None:
        raise ConfigError("this decoding mode returns no attention; use decoding.sampling=false")
    src_tokens = engine.vocab.src_tokens(sentence, add_eos=True)
    out_tokens = [*(best.tokens or []), "</s>"]
    weights = alignment(best.attention)[: len(out_tokens), : len(src_tokens)].float().cpu().numpy()
    fig, ax = plt.subplots(figsize=(1 + 0.45 * len(src_tokens), 1 + 0.4 * len(out_tokens)))
    ax.imshow(weights, cmap="viridis", aspect="auto")
    ax.set_xticks(range(len(src_tokens)), src_tokens, rotation=60, ha="right")
    ax.set_yticks(range(len(out_tokens)), out_tokens)
    ax.set_xlabel("source")
    ax.set_ylabel("translation")
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120)
    plt.close(fig)
    write_output(path, lambda f: f.write(buffer.getvalue()))
    log.info("attention heatmap written to %s", path)


@dataclass
class Written:
    """What write_lines did: the lines, what was wrong with each line that could not be translated (its
    output is empty, as for an empty line), and how many translations were below decoding.min_confidence."""

    count: int = 0
    failed: list[str] = dataclasses.field(default_factory=list)
    low: int = 0


def write_lines(docs: DocumentTranslator, lines: Iterable[str], out: TextIO, cfg: TranslateConfig) -> Written:
    """Translate lines chunk by chunk, writing each chunk's output as soon as it is done."""
    done = Written()
    empty = [Translation("", float("-inf"), alignment=[] if cfg.decoding.alignment else None)]
    for chunk in chunks(lines, CHUNK_LINES):
        prefixes = None
        if cfg.input_format == "tsv":  # source<TAB>prefix: each translation starts with its prefix
            rows = [line.split("\t", 1) for line in chunk]
            chunk, prefixes = [r[0] for r in rows], [r[1] if len(r) > 1 else "" for r in rows]
        results, problems = translate_fitting(docs, chunk, prefixes, first_line=done.count + 1)
        done.failed += problems
        for number, nbest in enumerate(results, start=done.count + 1):
            warn_terms(number, nbest[0] if nbest else None)
            written, low = output_lines(nbest or empty, cfg)
            done.low += low
            for line in written:
                out.write(line + "\n")
        out.flush()
        done.count += len(chunk)
    return done


def translate_fitting(docs: DocumentTranslator, sources: list[str], prefixes: list[str] | None,
                      first_line: int) -> tuple[list[list[Translation] | None], list[str]]:
    """Each line's n-best list, or None for a line the engine cannot take (a prefix too long for the model,
    text that is not valid Unicode), with one error naming each such line: it fails alone, not its chunk.
    A source too long is not refused: its sentences are cut into parts the model takes (documents/)."""
    engine = docs.engine
    refused = [u for u in engine.unfit_inputs(sources, prefixes) if u.side == "prefix" or not u.too_long]
    unfit = {u.index: u for u in refused}
    failed = [f"line {first_line + i}: its {u.side} {u.reason}" for i, u in sorted(unfit.items())]
    for message in failed:
        log.error("%s; its output is empty", message)
    results: list[list[Translation] | None] = [None] * len(sources)
    fit = [i for i in range(len(sources)) if i not in unfit]
    if fit:
        starts = [prefixes[i] for i in fit] if prefixes else None
        for i, nbest in zip(fit, docs.translate_nbest([sources[i] for i in fit], prefixes=starts)):
            results[i] = nbest
    return results, failed


def read_first(cfg: TranslateConfig, fmt: str) -> str | None:
    """What can be wrong with the input, found before the model loads: the list of terms, and a document
    (Markdown, HTML, subtitles) read and parsed whole; its text, or None for text a line."""
    if cfg.document.keep_terms:
        read_terms(cfg.document.keep_terms)
    if not cfg.input or fmt == "text":
        return None
    if (cfg.decoding.n_best > 1 or cfg.scores or cfg.decoding.alignment or cfg.input_format != "text"
            or cfg.output_format != "text"):
        raise ConfigError(f"document.format={fmt} writes the document translated; n-best lists, scores, "
                          "alignments, input_format=tsv and output_format=jsonl are for text a line "
                          "(document.format=text)")
    source = read_utf8(Path(cfg.input))
    read_document(source, fmt, cfg.input)
    return source


def write_document(docs: DocumentTranslator, source: str, fmt: str, cfg: TranslateConfig) -> None:
    """A Markdown, HTML or subtitle file translated whole, its structure as it was, to output= (written
    only once complete) or stdout."""
    translated = docs.translate_documents([source], fmt, [str(cfg.input)])[0]
    log.info("%s", docs.summary())
    if cfg.output:
        write_output(Path(cfg.output), lambda f: f.write(translated.encode("utf-8")))
        log.info("%s translated into %s", cfg.input, cfg.output)
    else:
        sys.stdout.write(translated)
        sys.stdout.flush()


def write_file(path: Path, write: Callable[[TextIO], T]) -> T:
    """Run `write` on a UTF-8 text file that becomes `path` only once it is complete: the lines go to a
    temporary file beside it as they are written (memory holds one chunk, not the output), renamed into
    place at the end, so `path` never holds a partial output (an error leaves no file at all)."""
    result: list[T] = []

    def text(raw: IO[bytes]) -> None:
        out = io.TextIOWrapper(raw, encoding="utf-8", newline="\n")  # type: ignore[arg-type]
        try:
            result.append(write(out))
        finally:
            out.detach()  # flushes; write_output closes, fsyncs and renames the file itself

    write_output(path, text)
    return result[0]


def translate(cfg: TranslateConfig) -> None:
    """Entry point of `transformer-mt translate`."""
    fmt = format_for(cfg.input, cfg.document.format)
    document = read_first(cfg, fmt)
    # Confidence costs a forced pass more: only where the output shows it (jsonl) or a threshold reads it.
    shown = cfg.output_format == "jsonl" or cfg.decoding.min_confidence is not None
    cfg = dataclasses.replace(cfg, decoding=dataclasses.replace(cfg.decoding,
                                                                confidence=cfg.decoding.confidence and shown))
    engine = load_engine(cfg)
    check_default_prefix(engine)
    docs = DocumentTranslator.for_engine(engine, cfg.document)
    if cfg.attention_png:
        if cfg.text is None:
            raise ConfigError("attention_png needs a sentence given as text=...")
        write_attention_png(engine, cfg.text, Path(cfg.attention_png))
    with contextlib.ExitStack() as stack:
        if cfg.text is not None:
            lines: Iterable[str] = cfg.text.split("\n")
        elif document is not None:
            write_document(docs, document, fmt, cfg)
            return
        elif cfg.input:
            path = Path(cfg.input)
            lines = utf8_lines(stack.enter_context(open_binary(path)), str(path))  # .gz too
        elif sys.stdin.isatty() and cfg.output is None:
            interactive(docs, cfg)
            return
        else:
            lines = utf8_lines(sys.stdin.buffer, "stdin")
        if cfg.output:
            done = write_file(Path(cfg.output), lambda out: write_lines(docs, lines, out, cfg))
            log.info("%d lines translated into %s", done.count, cfg.output)
        else:
            done = write_lines(docs, lines, sys.stdout, cfg)
    log.info("%s", docs.summary())
    if cfg.decoding.min_confidence is not None:
        log.info("%d of %d translations below decoding.min_confidence=%g: %s", done.low, done.count,
                 cfg.decoding.min_confidence,
                 "marked" if cfg.decoding.low_confidence == "mark" else "withheld (empty output)")
    if engine.truncated:
        log.warning("%d inputs were longer than %d tokens and were cut", engine.truncated,
                    engine.max_input_tokens)
    if done.failed:
        raise DataError(f"{len(done.failed)} of {done.count} lines could not be translated and have empty "
                        f"output (first: {done.failed[0]}); shorten or fix them")
