"""A Hugging Face Marian or Pegasus directory as the parent of a fine-tuning run (`init=<directory>`).

What `export format=hf` wrote comes back as it left (the same weights and translations as the run it
came from); another Marian or Pegasus directory is taken when it is a model of ours in all but origin:
a `tokenizer.json` of one of our kinds with <pad>, <bos>, <eos>, <unk> at ids 0 to 3, the decoder
started from <bos>, sinusoidal positions, embeddings scaled by sqrt(d_model), no output bias, relu or
gelu. Anything else is refused in one line saying which; an OPUS-MT directory (SentencePiece files
instead of a tokenizer.json, </s> at id 0, <pad> as the decoder's start) among them.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from transformer_mt.config import ModelConfig, TokenizerConfig
from transformer_mt.data.tokenizer import BOS_ID, SPECIAL_TOKENS, Vocabulary
from transformer_mt.errors import CheckpointError
from transformer_mt.interop.hf_weights import from_hf
from transformer_mt.model import Transformer
from transformer_mt.runtime.files import META_FILE

FAMILIES = {"marian": False, "pegasus": True}  # model_type -> norm_first
REQUIRED = ("d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads",
            "encoder_ffn_dim", "max_position_embeddings")


def is_hf_dir(path: str | Path) -> bool:
    """Whether `path` is a directory with a Hugging Face config.json (rather than a run directory)."""
    return (Path(path) / "config.json").is_file() and not (Path(path) / "latest.pt").exists()


def _refuse(directory: Path, why: str) -> CheckpointError:
    return CheckpointError(f"init={directory}: {why}")


def model_config(directory: Path, hf: dict[str, Any]) -> ModelConfig:
    """Our ModelConfig of a Marian/Pegasus config.json; CheckpointError naming what does not fit."""
    family = hf.get("model_type")
    if family not in FAMILIES:
        raise _refuse(directory, f"model_type {family!r} is not one of {', '.join(FAMILIES)}")
    lacking = [key for key in REQUIRED if key not in hf]
    if lacking:
        raise _refuse(directory, f"its config.json lacks {', '.join(lacking)}")
    if (hf.get("encoder_attention_heads"), hf.get("encoder_ffn_dim")) != (hf.get("decoder_attention_heads"),
                                                                        hf.get("decoder_ffn_dim")):
        raise _refuse(directory, "its encoder and decoder differ in heads or FFN size; ours share them")
    problems = [f"{key}={hf.get(key)!r} (ours: {want!r})" for key, want in
                (("scale_embedding", True), ("decoder_start_token_id", BOS_ID), ("pad_token_id", 0),
                 ("eos_token_id", 2)) if hf.get(key) != want]
    if hf.get("activation_function") not in ("relu", "gelu"):
        problems.append(f"activation_function={hf.get('activation_function')!r} (ours: relu or gelu)")
    if problems:
        raise _refuse(directory, f"{family} settings that a model of ours cannot take: {', '.join(problems)}")
    shared = FAMILIES[family] or hf.get("share_encoder_decoder_embeddings", True)
    return ModelConfig(d_model=hf["d_model"], n_heads=hf["encoder_attention_heads"],
                       d_ff=hf["encoder_ffn_dim"], encoder_layers=hf["encoder_layers"],
                       decoder_layers=hf["decoder_layers"], dropout=hf.get("dropout", 0.1),
                       attention_dropout=hf.get("attention_dropout", 0.0),
                       activation_dropout=hf.get("activation_dropout", 0.0),
                       activation=hf["activation_function"], norm_first=FAMILIES[family],
                       max_positions=hf["max_position_embeddings"], tie_embeddings=bool(shared),
                       tie_output=bool(hf.get("tie_word_embeddings", True)))


def vocabulary(directory: Path) -> Vocabulary:
    """The directory's tokenizer.json as our Vocabulary (its post-processor dropped: ours adds <eos>)."""
    path = directory / "tokenizer.json"
    if not path.is_file():
        spm = sorted(p.name for p in directory.glob("*.spm"))
        raise _refuse(directory, "no tokenizer.json" + (f" (it has SentencePiece models {', '.join(spm)}, "
                                                        "as OPUS-MT ships: not supported)" if spm else ""))
    spec = json.loads(path.read_text(encoding="utf-8"))
    spec["post_processor"] = None
    tok = Tokenizer.from_str(json.dumps(spec))
    wrong = [f"{t}={tok.token_to_id(t)}" for i, t in enumerate(SPECIAL_TOKENS) if tok.token_to_id(t) != i]
    if wrong:
        raise _refuse(directory, f"its special tokens are not ours at ids 0-3 ({', '.join(wrong)})")
    return Vocabulary.from_tokenizer(tok)


def parent_state(directory: str | Path, languages: dict[str, str]) -> dict[str, Any]:
    """The directory as the state of a parent checkpoint (finetune.py reads it as it reads ours); its
    language pair as its transformer_mt.json says, else `languages` (a directory from elsewhere)."""
    directory = Path(directory)
    try:
        hf = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as ex:
        raise _refuse(directory, f"its config.json is not valid JSON ({ex})") from None
    if not isinstance(hf, dict):
        raise _refuse(directory, "its config.json is not valid JSON (not an object)")
    config = model_config(directory, hf)
    vocab = vocabulary(directory)
    model = Transformer(config, vocab.src_vocab_size, vocab.tgt_vocab_size)
    weights = _weights(directory)
    bias = weights.get("final_logits_bias")
    if bias is not None and bool(bias.abs().max() > 0):  # OPUS-MT's: Marian's output bias
        raise _refuse(directory, "its output layer has a bias (final_logits_bias); ours has none")
    try:
        from_hf(weights, model)
    except KeyError as ex:
        raise _refuse(directory, f"its weights lack {ex.args[0]}") from None
    ours = directory / META_FILE
    meta = json.loads(ours.read_text(encoding="utf-8")) if ours.is_file() else {}
    tokenizer = dataclasses.asdict(TokenizerConfig(kind=vocab.kind, vocab_size=vocab.src_vocab_size))
    return {"model": model.state_dict(), "model_config": dataclasses.asdict(config),
            "tokenizer": vocab.to_json(), "step": 0,
            "config": {"tokenizer": {**tokenizer, **meta.get("tokenizer", {})},
                       "dataset": meta.get("languages", languages)}}


def _weights(directory: Path) -> dict[str, Any]:
    """model.safetensors (or pytorch_model.bin, read without code) as one state dict."""
    for name in ("model.safetensors", "pytorch_model.bin"):
        path = directory / name
        if not path.is_file():
            continue
        try:
            if name.endswith(".safetensors"):
                from safetensors.torch import load_file

                return load_file(str(path))
            import torch

            return torch.load(path, map_location="cpu", weights_only=True)
        except Exception as ex:  # safetensors and torch raise their own kinds for a damaged file
            first = (str(ex).strip().splitlines() or [type(ex).__name__])[0]
            raise _refuse(directory, f"its {name} cannot be read ({first})") from None
    raise _refuse(directory, "no model.safetensors or pytorch_model.bin")
