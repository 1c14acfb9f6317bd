"""`transformer-mt export format=web`: a static folder whose page translates in the browser, with no
server beyond a static file server and no network: the ONNX export (onnx.py), Transformers.js and ONNX
Runtime Web copied from their npm packages, and an `index.html`.

    <output_dir>/index.html
    <output_dir>/lib/transformers.min.js, ort-wasm-simd-threaded.asyncify.{mjs,wasm}
    <output_dir>/lib/documents.mjs  (web_documents.mjs: sentences and spans, as documents/ does them)
    <output_dir>/lib/glossary.mjs, search.mjs  (web_glossary.mjs, web_search.mjs: glossaries)
    <output_dir>/models/model/...   (format=onnx's directory but its PyTorch weights)

    $ python -m http.server -d <output_dir>     # then open http://localhost:8000

The packages are fetched once with `npm pack` (no install scripts run) into the user's cache, at the
version pinned here and the ONNX Runtime Web version that Transformers.js itself pins. Transformers.js
knows Marian but not Pegasus; it never rebuilds the network, it feeds the two graphs, so the page's copy
of a pre-norm model's config names it `marian` (a line at export says so). Its tokenizer splits text as
`tokenizers` does for our `bpe` and `char` vocabularies only: the others are refused.

The page splits what is typed into sentences and keeps its spans as the documents layer does: the rules
come from documents/ through the page's settings (web_rules.py), the code that applies them is
web_documents.mjs. With a glossary (`glossary=terms.tsv`, and the lines pasted into the page), a sentence
holding a source term is decoded by web_search.mjs, a port of our greedy search with target terms
(`bank_greedy_search`) that feeds the model's graphs itself; the others by `generate` as without.
"""

from __future__ import annotations

import base64
import html
import json
import logging
import re
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from transformer_mt.checkpoints.check import check_model
from transformer_mt.checkpoints.paths import resolve_checkpoint
from transformer_mt.checkpoints.store import load_checkpoint, word_list
from transformer_mt.config import ConfigError
from transformer_mt.data.tokenizer import SPECIAL_TOKENS, Vocabulary
from transformer_mt.decoding.confidence import read_calibration
from transformer_mt.decoding.glossary import Glossary
from transformer_mt.decoding.glossary_user import GlossaryUser
from transformer_mt.documents.spans import copies_names
from transformer_mt.errors import ExportError
from transformer_mt.interop.onnx import export_onnx
from transformer_mt.interop.web_rules import glossary_rules, page_rules
from transformer_mt.runtime.files import META_FILE, refuse_existing, written_into

log = logging.getLogger(__name__)
TRANSFORMERS_JS = "4.3.1"  # @huggingface/transformers, the version the page is tested with
ORT_FILES = ("ort-wasm-simd-threaded.asyncify.mjs", "ort-wasm-simd-threaded.asyncify.wasm")
PAGE = Path(__file__).with_name("web_page.html")  # the page, with {title} and {settings} to fill
DOCUMENTS_JS = Path(__file__).with_name("web_documents.mjs")  # the page's sentences and spans
GLOSSARY_JS = Path(__file__).with_name("web_glossary.mjs")  # the page's glossary: lines, matches, variants
SEARCH_JS = Path(__file__).with_name("web_search.mjs")  # the page's greedy search with target terms
WEB_TOKENIZERS = ("bpe", "char")


def npm_package(spec: str, cache: Path) -> Path:
    """The unpacked folder of an npm package (`name@version`), fetched with `npm pack` into `cache` once."""
    folder = cache / spec.replace("/", "+")
    if (folder / "package" / "package.json").is_file():
        return folder / "package"
    npm = shutil.which("npm")
    if npm is None:
        raise ConfigError("format=web needs npm to fetch Transformers.js: apt-get install npm")
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        done = subprocess.run([npm, "pack", spec, "--pack-destination", tmp, "--silent"], capture_output=True,
                              text=True, check=False)
        tarballs = list(Path(tmp).glob("*.tgz"))
        if done.returncode != 0 or not tarballs:
            reason = (done.stderr.strip().splitlines() or ["no tarball"])[-1]
            raise ExportError(f"npm could not fetch {spec}: {reason}")
        with tarfile.open(tarballs[0]) as tar:
            tar.extractall(Path(tmp) / "unpacked", filter="data")
        Path(tmp, "unpacked").rename(folder)
    return folder / "package"


def runtime_files(cache: Path) -> dict[str, Path]:
    """Transformers.js's browser bundle and the ONNX Runtime Web files it loads, by the name the page
    gives them."""
    transformers = npm_package(f"@huggingface/transformers@{TRANSFORMERS_JS}", cache)
    pinned = json.loads((transformers / "package.json").read_text(encoding="utf-8"))["dependencies"]
    ort = npm_package(f"onnxruntime-web@{pinned['onnxruntime-web']}", cache)
    files = {"transformers.min.js": transformers / "dist" / "transformers.min.js",
             **{name: ort / "dist" / name for name in ORT_FILES}}
    missing = [str(p) for p in files.values() if not p.is_file()]
    if missing:
        raise ExportError(f"the npm packages lack {', '.join(missing)}: their files moved in this version")
    return files


def page(title: str, settings: dict[str, object]) -> str:
    """index.html: the page, with the model's length rule, languages and the documents layer's rules."""
    text = PAGE.read_text(encoding="utf-8")
    # The title (the checkpoint's languages) as HTML text; in the settings "<" escaped: they sit inside a
    # <script> element, which "</script" or "<!--" would end. One pass, so neither is read as the other.
    fill = {"{title}": html.escape(title), "{settings}": json.dumps(settings).replace("<", "\\u003c")}
    return re.sub(r"\{title\}|\{settings\}", lambda m: fill[m.group()], text)


def sentence_tokens(state: dict[str, Any], max_positions: int) -> int:
    """The most tokens a sentence the page translates whole may have: what the run trained on
    (dataset.max_len), within the model's positions; a longer one is translated in parts."""
    trained = (state.get("config", {}).get("dataset", {}) or {}).get("max_len") or max_positions
    return max(1, min(int(trained), max_positions - 1))


def page_words(state: dict[str, Any], src_lang: str | None) -> list[str] | None:
    """The training words the page tells names by (case folded, as the checkpoint lists them;
    document.names=auto's rule: none for a source language that capitalises its nouns, nor for a
    checkpoint that lists none)."""
    words = word_list(state)
    if words is None or not copies_names("auto", src_lang):
        return None
    return sorted(words)


class PageTerms(GlossaryUser):
    """An engine's glossary half for the page: the checks an engine makes of a glossary, its target terms'
    token ids and the vocabulary's word edges, with the model's positions."""

    def __init__(self, vocab: Vocabulary, max_positions: int) -> None:
        self.vocab = vocab
        self.max_prefix_tokens = max_positions - 1


def _bits(flags: list[bool]) -> str:
    """A bit a token, little-endian in each byte, in base64: how the page reads `WordEdges`."""
    packed = bytearray((len(flags) + 7) // 8)
    for v, flag in enumerate(flags):
        packed[v >> 3] |= flag << (v & 7)
    return base64.b64encode(bytes(packed)).decode("ascii")


def page_glossary(path: str | Path | None, vocab: Vocabulary, max_positions: int) -> dict[str, object]:
    """The page's glossary: the file's entries with the token ids of their target terms' variants (ours,
    which the page's tokenizer gives too for the kinds it takes), the vocabulary's word edges, and the
    rules to match more in the page. DataError in one line, as an engine's, for an entry the model cannot
    write."""
    terms = PageTerms(vocab, max_positions)
    terms.use_glossary(Glossary.read(path) if path else None)
    glossary = terms.glossary.entries if terms.glossary else []
    entries = [{"source": e.source, "target": e.target, "line": e.line,
                "variants": terms.term_variants(e.target)} for e in glossary]
    edges = terms.edges()
    return {**glossary_rules(), "ordinary": len(SPECIAL_TOKENS), "entries": entries,
            "edges": {"glues": _bits(edges.glues.tolist()), "ends": _bits(edges.ends.tolist())}}


def _calibration(model_dir: Path) -> dict[str, float] | None:
    """The curves the page turns its scores into confidences with (confidence.py): the run's calibration,
    which the export carried where it was fitted for these weights; None: the page shows probabilities."""
    calibration = read_calibration(model_dir)
    if calibration is None:
        return None
    return {"sentence_slope": calibration.sentence.slope, "sentence_bias": calibration.sentence.bias,
            "word_slope": calibration.word.slope, "word_bias": calibration.word.bias}


def export_web(checkpoint: str | Path, output_dir: Path, overwrite: bool = False,
               cache: Path | None = None, glossary: str | Path | None = None) -> Path:
    """Write the static folder of a checkpoint, with a glossary's terms (a TSV file) when given; return its
    path (it appears whole or not at all)."""
    output_dir = Path(output_dir)
    refuse_existing(output_dir, overwrite)
    file = resolve_checkpoint(checkpoint)
    state = load_checkpoint(file)
    kind = state.get("config", {}).get("tokenizer", {}).get("kind")
    if kind is not None and kind not in WEB_TOKENIZERS:
        raise ExportError(f"tokenizer.kind={kind}: Transformers.js's tokenizer splits text otherwise than "
                          f"ours for it, so the page would translate other tokens; train with "
                          f"tokenizer.kind=bpe")
    model_config, vocab = check_model(file, state, ())
    terms = page_glossary(glossary, vocab, model_config.max_positions)  # before the minutes of exporting
    files = runtime_files(cache or Path.home() / ".cache" / "transformer-mt" / "npm")
    parent = output_dir.expanduser().resolve().parent
    parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".web-export.", dir=parent) as work:
        model_dir = export_onnx(checkpoint, Path(work) / "model", overwrite=True)
        meta = json.loads((model_dir / META_FILE).read_text(encoding="utf-8"))
        config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
        if config.get("model_type") == "pegasus":
            log.info("Transformers.js has no 'pegasus' model type; the page runs this pre-norm model's ONNX "
                     "graphs under its 'marian' seq2seq runner, which only feeds the graphs")
            config.update(model_type="marian", architectures=["MarianMTModel"])
            (model_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        with written_into(output_dir, overwrite) as tmp:
            (tmp / "lib").mkdir()
            for name, source in files.items():
                shutil.copy2(source, tmp / "lib" / name)
            for source, name in ((DOCUMENTS_JS, "documents"), (GLOSSARY_JS, "glossary"),
                                 (SEARCH_JS, "search")):
                shutil.copy2(source, tmp / "lib" / f"{name}.mjs")
            (tmp / "models").mkdir()
            shutil.move(model_dir, tmp / "models" / "model")
            (tmp / "models" / "model" / "model.safetensors").unlink()  # the page reads the ONNX graphs only
            languages = meta.get("languages", {})
            settings = {**meta.get("decoding", {}), "max_positions": config["max_position_embeddings"],
                        "languages": languages, "documents": page_rules(),
                        "max_sentence_tokens": sentence_tokens(state, config["max_position_embeddings"]),
                        "words": page_words(state, languages.get("src_lang")), "glossary": terms,
                        "calibration": _calibration(tmp / "models" / "model")}
            title = f"{languages.get('src_lang') or '?'} → {languages.get('tgt_lang') or '?'}"
            (tmp / "index.html").write_text(page(title, settings), encoding="utf-8")
            (tmp / META_FILE).write_text(json.dumps({**meta, "format": "web",
                                                     "transformers_js": TRANSFORMERS_JS}, indent=2) + "\n",
                                         encoding="utf-8")
    log.info("wrote %s: serve it with `python -m http.server -d %s` and open http://localhost:8000",
             output_dir, output_dir)
    return output_dir
