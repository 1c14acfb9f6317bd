"""A checkpoint's tokenizer checked before it splits a user's text, without torch: our JSON layout (no
padding or truncation, the special tokens at their ids), the model type and the normaliser, splitter,
post-processor and decoder transformer-mt builds for its kind (a crafted regex or normaliser could make
the tokenizer panic or run for ever), and a vocabulary, pieces and merges within bounds. Used for our
checkpoints (check.py) and for a Hugging Face directory's tokenizer.json (hf_header.py) alike.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from transformer_mt.checkpoints.fields import entry, reason, wrong
from transformer_mt.config.checks import CHOICES, MAX_VOCAB_SIZE, SPECIAL_TOKENS
from transformer_mt.data.tokenizer import MODEL_TYPES, PARTS, Vocabulary, built_parts
from transformer_mt.errors import CheckpointError

MAX_PIECE_CHARS = 256  # a vocabulary piece: trained ones are a word at most


def vocabulary(path: Path, state: dict[str, Any]) -> Vocabulary:
    """The checkpoint's tokenizers, checked: our JSON layout, no padding or truncation, the special
    tokens at their ids."""
    saved = entry(path, state, "tokenizer", dict)
    kind = entry(path, saved, "kind", str, "tokenizer.")
    if kind not in CHOICES["tokenizer.kind"]:
        raise wrong(path, "tokenizer.kind", kind, f"one of {', '.join(CHOICES['tokenizer.kind'])}")
    if entry(path, saved, "joint", str, "tokenizer.") not in ("true", "false"):
        raise wrong(path, "tokenizer.joint", saved["joint"], "'true' or 'false'")
    for side in ("src",) if saved["joint"] == "true" else ("src", "tgt"):
        check_tokenizer_json(path, f"tokenizer.{side}", entry(path, saved, side, str, "tokenizer."))
    try:
        vocab = Vocabulary.from_json(saved)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as ex:  # tokenizers panics (pyo3's PanicException, not an Exception) on some input
        raise CheckpointError(f"checkpoint {path}: its tokenizer cannot be read ({reason(ex)})") from ex
    for side, tok in zip(("src",) if vocab.joint else ("src", "tgt"), (vocab.src, vocab.tgt)):
        check_tokenizer_parts(path, f"tokenizer.{side}", kind, json.loads(tok.to_str()))
    return vocab


def check_tokenizer_parts(path: Path, field: str, kind: str, spec: dict[str, Any]) -> None:
    """A tokenizer as transformer-mt trains one of its kind: the model's type, and the normaliser,
    splitter, post-processor and decoder built for the kind (a crafted regex or normaliser there could
    make the tokenizer panic or run for ever on a user's text), read back through this version of
    tokenizers so that only what they do counts; its vocabulary, pieces and merges within bounds."""
    model = spec.get("model") if isinstance(spec.get("model"), dict) else {}
    if model.get("type") != MODEL_TYPES[kind]:
        raise wrong(path, f"{field}.model.type", model.get("type"), f"{MODEL_TYPES[kind]!r} for {kind}")
    built = built_parts(kind)
    for part in PARTS:
        if all(spec.get(part) != b[part] for b in built):
            raise wrong(path, f"{field}.{part}", spec.get(part),
                        f"the {part} transformer-mt builds for tokenizer.kind={kind}")
    vocab = model.get("vocab")  # BPE, WordLevel: {piece: id}; Unigram: [[piece, score], ...]
    vocab = vocab if isinstance(vocab, (list, dict)) else []
    pieces = [p[0] if isinstance(p, list) and p else p for p in vocab]
    if len(pieces) > MAX_VOCAB_SIZE:
        raise wrong(path, f"{field}'s vocabulary", f"{len(pieces):,} pieces", f"at most {MAX_VOCAB_SIZE:,}")
    longest = max((len(str(p)) for p in pieces), default=0)
    if longest > MAX_PIECE_CHARS:
        raise wrong(path, f"{field}'s longest piece", f"{longest:,} characters", f"at most {MAX_PIECE_CHARS}")
    merges = model.get("merges")
    if isinstance(merges, list) and len(merges) > len(pieces):
        raise wrong(path, f"{field}.model.merges", f"{len(merges):,} merges", f"at most one per piece "
                    f"({len(pieces):,})")


def check_tokenizer_json(path: Path, field: str, text: str) -> None:
    try:
        spec = json.loads(text)
    except ValueError as ex:
        raise wrong(path, field, text, f"a tokenizer's JSON ({reason(ex)})") from ex
    if not isinstance(spec, dict):
        raise wrong(path, field, text, "a tokenizer's JSON object")
    for key in ("padding", "truncation"):  # ours never pad or truncate: a padded input can be any length
        if spec.get(key) is not None:
            raise wrong(path, f"{field}.{key}", spec[key], "null (transformer-mt tokenizers never set it)")
    added = spec.get("added_tokens")
    added = added if isinstance(added, list) else []
    ids = {t.get("content"): t.get("id") for t in added if isinstance(t, dict)}
    for want, token in enumerate(SPECIAL_TOKENS):
        if ids.get(token) != want:
            raise wrong(path, f"{field}'s id of {token}", ids.get(token), str(want))
