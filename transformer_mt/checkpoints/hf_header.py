"""A Hugging Face Marian or Pegasus directory named as a parent (`init=<directory>`), checked without torch
and before anything is built, as a checkpoint's header is (header.py): its config.json read into our
ModelConfig within the same bounds, its tokenizer.json held to the same rules as a checkpoint's
(tokenizer_rules.py), and its model.safetensors header (a JSON table at the file's start) read for the
tensors it claims, which must lie within the file and hold no fewer parameters than the config implies.
pytorch_model.bin is refused: a pickle from elsewhere is not loaded (convert it to safetensors).
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from transformer_mt.checkpoints.fields import model_config, reason
from transformer_mt.checkpoints.parameter_count import parameter_count
from transformer_mt.checkpoints.tokenizer_rules import check_tokenizer_json, check_tokenizer_parts
from transformer_mt.config import ModelConfig
from transformer_mt.data.tokenizer import BOS_ID, MODEL_TYPES, PAD_ID, SPECIAL_TOKENS, Vocabulary
from transformer_mt.errors import CheckpointError

FAMILIES = {"marian": False, "pegasus": True}  # model_type -> norm_first
REQUIRED = ("d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads",
            "encoder_ffn_dim", "max_position_embeddings")
MAX_JSON_BYTES = 16 * 2**20  # config.json, tokenizer.json, a safetensors header: far above any real one
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
               "BOOL": 1}


def refuse(directory: Path, why: str) -> CheckpointError:
    return CheckpointError(f"init={directory}: {why}")


def _json_file(directory: Path, name: str) -> Any:
    """A JSON file of the directory, of bounded size."""
    path = directory / name
    try:
        if path.stat().st_size > MAX_JSON_BYTES:
            raise refuse(directory, f"its {name} has over {MAX_JSON_BYTES:,} bytes")
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as ex:
        raise refuse(directory, f"its {name} is not valid JSON ({ex})") from None


def config_of(directory: Path, hf: Any) -> ModelConfig:
    """Our ModelConfig of a Marian/Pegasus config.json, within a checkpoint's bounds; CheckpointError
    naming what does not fit."""
    if not isinstance(hf, dict):
        raise refuse(directory, "its config.json is not valid JSON (not an object)")
    family = hf.get("model_type")
    if family not in FAMILIES:
        raise refuse(directory, f"model_type {family!r} is not one of {', '.join(FAMILIES)}")
    lacking = [key for key in REQUIRED if key not in hf]
    if lacking:
        raise refuse(directory, f"its config.json lacks {', '.join(lacking)}")
    if (hf.get("encoder_attention_heads"), hf.get("encoder_ffn_dim")) != (hf.get("decoder_attention_heads"),
                                                                        hf.get("decoder_ffn_dim")):
        raise refuse(directory, "its encoder and decoder differ in heads or FFN size; ours share them")
    problems = [f"{key}={hf.get(key)!r} (ours: {want!r})" for key, want in
                (("scale_embedding", True), ("decoder_start_token_id", BOS_ID), ("pad_token_id", PAD_ID),
                 ("eos_token_id", 2)) if hf.get(key) != want]
    if hf.get("activation_function") not in ("relu", "gelu"):
        problems.append(f"activation_function={hf.get('activation_function')!r} (ours: relu or gelu)")
    if problems:
        raise refuse(directory, f"{family} settings that a model of ours cannot take: {', '.join(problems)}")
    shared = FAMILIES[family] or hf.get("share_encoder_decoder_embeddings", True)
    spec = {"d_model": hf["d_model"], "n_heads": hf["encoder_attention_heads"], "d_ff": hf["encoder_ffn_dim"],
            "encoder_layers": hf["encoder_layers"], "decoder_layers": hf["decoder_layers"],
            "dropout": hf.get("dropout", 0.1), "attention_dropout": hf.get("attention_dropout", 0.0),
            "activation_dropout": hf.get("activation_dropout", 0.0), "activation": hf["activation_function"],
            "norm_first": FAMILIES[family], "max_positions": hf["max_position_embeddings"],
            "tie_embeddings": bool(shared), "tie_output": bool(hf.get("tie_word_embeddings", True))}
    vocab_size = hf.get("vocab_size", len(SPECIAL_TOKENS) + 1)
    sizes = {"src_vocab_size": vocab_size, "tgt_vocab_size": hf.get("decoder_vocab_size") or vocab_size}
    # The bounds and rules of a checkpoint's model_config (its sizes are the tokenizer's, checked later)
    return model_config(directory / "config.json", {"model_config": {**spec, **sizes, "pad_id": PAD_ID}})[0]


def tokenizer_of(directory: Path) -> Vocabulary:
    """The directory's tokenizer.json, held to a checkpoint's rules, as our Vocabulary (its post-processor
    dropped: ours adds <eos>)."""
    path = directory / "tokenizer.json"
    if not path.is_file():
        spm = sorted(p.name for p in directory.glob("*.spm"))
        raise refuse(directory, "no tokenizer.json" + (f" (it has SentencePiece models {', '.join(spm)}, "
                                                       "as OPUS-MT ships: not supported)" if spm else ""))
    spec = _json_file(directory, "tokenizer.json")
    if not isinstance(spec, dict):
        raise refuse(directory, "its tokenizer.json is not a tokenizer's JSON object")
    text = json.dumps({**spec, "post_processor": None})
    try:
        tok = Tokenizer.from_str(text)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as ex:  # tokenizers panics (pyo3's PanicException) on some input
        raise refuse(directory, f"its tokenizer.json cannot be read ({reason(ex)})") from None
    wrong = [f"{t}={tok.token_to_id(t)}" for i, t in enumerate(SPECIAL_TOKENS) if tok.token_to_id(t) != i]
    if wrong:
        raise refuse(directory, f"its special tokens are not ours at ids 0-3 ({', '.join(wrong)})")
    check_tokenizer_json(path, "tokenizer.json", text)
    read_back = json.loads(tok.to_str())
    kinds = [k for k, t in MODEL_TYPES.items() if t == (read_back.get("model") or {}).get("type")] or ["bpe"]
    for kind in kinds:  # wordlevel and char share a model type: the one whose parts these are
        try:
            check_tokenizer_parts(path, "tokenizer.json", kind, read_back)
            break
        except CheckpointError:
            if kind == kinds[-1]:
                raise
    return Vocabulary.from_tokenizer(tok)


def weights_claimed(directory: Path) -> dict[str, tuple[int, ...]]:
    """The shape of each tensor model.safetensors holds, from its header, each checked to lie within the
    file with as many bytes as its shape and type take."""
    path = directory / "model.safetensors"
    if not path.is_file():
        bin_file = " (pytorch_model.bin is not loaded: convert it to model.safetensors)" \
            if (directory / "pytorch_model.bin").is_file() else ""
        raise refuse(directory, f"no model.safetensors{bin_file}")
    size = path.stat().st_size
    with open(path, "rb") as file:
        head = file.read(8)
        length = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
        if not 0 < length <= min(MAX_JSON_BYTES, size - 8):
            raise refuse(directory, "its model.safetensors is damaged (no header)")
        try:
            table = json.loads(file.read(length))
        except (UnicodeDecodeError, json.JSONDecodeError) as ex:
            raise refuse(directory, f"its model.safetensors header is not JSON ({ex})") from None
    data = size - 8 - length
    shapes = {}
    for name, spec in (table.items() if isinstance(table, dict) else ()):
        if name == "__metadata__":
            continue
        try:
            shape, (start, end) = tuple(int(n) for n in spec["shape"]), spec["data_offsets"]
            fits = 0 <= start <= end <= data and end - start == math.prod(shape) * DTYPE_BYTES[spec["dtype"]]
        except (KeyError, TypeError, ValueError):
            fits = False
        if not fits:
            raise refuse(directory, f"its model.safetensors is damaged ({name[:80]!r} lies outside it)")
        shapes[name] = shape
    return shapes


def check_directory(directory: str | Path) -> tuple[ModelConfig, Vocabulary]:
    """The directory's config and tokenizer, checked, and its weights' header: no fewer parameters than
    the config implies, nor fewer than a sinusoid table of max_positions × d_model (what a small file
    could otherwise make the loader build)."""
    directory = Path(directory)
    try:
        config = config_of(directory, _json_file(directory, "config.json"))
        vocab = tokenizer_of(directory)
    except CheckpointError as ex:  # a checkpoint's rule broken: named as init='s, as the rest are
        if str(ex).startswith("init="):
            raise
        raise refuse(directory, str(ex).removeprefix("checkpoint ")) from None
    held = sum(math.prod(shape) for shape in weights_claimed(directory).values())
    claimed = parameter_count(config, vocab.src_vocab_size, vocab.tgt_vocab_size)
    table = config.max_positions * config.d_model
    if max(claimed, table) > held:
        raise refuse(directory, f"its config.json and tokenizer.json describe a model of {claimed:,} "
                                f"parameters (positions: {table:,} values), its model.safetensors holds "
                                f"{held:,}; the directory is damaged or assembled from different models")
    return config, vocab
