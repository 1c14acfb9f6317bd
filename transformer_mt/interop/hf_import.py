"""A Hugging Face Marian or Pegasus directory as the parent of a fine-tuning run (`init=<directory>`).

What `export format=hf` wrote comes back as it left (the same weights and translations as the run it
came from); another Marian or Pegasus directory is taken when it is a model of ours in all but origin:
a `tokenizer.json` of one of our kinds with <pad>, <bos>, <eos>, <unk> at ids 0 to 3, the decoder
started from <bos>, sinusoidal positions, embeddings scaled by sqrt(d_model), no output bias, relu or
gelu. Anything else is refused in one line saying which (checkpoints/hf_header.py, before anything is
built); an OPUS-MT directory (SentencePiece files instead of a tokenizer.json, </s> at id 0, <pad> as the
decoder's start) among them.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from transformer_mt.checkpoints.fields import reason
from transformer_mt.checkpoints.hf_header import check_directory, refuse
from transformer_mt.config import TokenizerConfig
from transformer_mt.interop.hf_weights import from_hf
from transformer_mt.model import Transformer
from transformer_mt.runtime.files import META_FILE


def parent_state(directory: str | Path, languages: dict[str, str]) -> dict[str, Any]:
    """The directory as the state of a parent checkpoint (finetune.py reads it as it reads ours), checked
    before anything is built (hf_header.py); its language pair as its transformer_mt.json says, else
    `languages` (a directory from elsewhere)."""
    directory = Path(directory)
    config, vocab = check_directory(directory)
    from safetensors.torch import load_file

    try:
        weights = load_file(str(directory / "model.safetensors"))
    except Exception as ex:  # safetensors raises its own kinds for a damaged file
        raise refuse(directory, f"its model.safetensors cannot be read ({reason(ex)})") from None
    bias = weights.get("final_logits_bias")
    if bias is not None and bool(bias.abs().max() > 0):  # OPUS-MT's: Marian's output bias
        raise refuse(directory, "its output layer has a bias (final_logits_bias); ours has none")
    model = Transformer(config, vocab.src_vocab_size, vocab.tgt_vocab_size)
    try:
        from_hf(weights, model)
    except KeyError as ex:
        raise refuse(directory, f"its weights lack {ex.args[0]}") from None
    except RuntimeError as ex:  # a weight of another shape
        raise refuse(directory, f"its weights do not fit its config.json ({reason(ex)})") from None
    meta = _meta(directory)
    tokenizer = dataclasses.asdict(TokenizerConfig(kind=vocab.kind, vocab_size=vocab.src_vocab_size))
    return {"model": model.state_dict(), "model_config": dataclasses.asdict(config),
            "tokenizer": vocab.to_json(), "step": 0,
            "config": {"tokenizer": {**tokenizer, **meta.get("tokenizer", {})},
                       "dataset": meta.get("languages", languages)}}


def _meta(directory: Path) -> dict[str, Any]:
    """What `export format=hf` wrote of the run in transformer_mt.json (nothing for a directory from
    elsewhere): a mapping, whose tokenizer and languages the fine-tuning run checks as a checkpoint's."""
    path = directory / META_FILE
    if not path.is_file():
        return {}
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as ex:
        raise refuse(directory, f"its {META_FILE} is not valid JSON ({ex})") from None
    if not isinstance(meta, dict) or not all(isinstance(meta.get(k, {}), dict)
                                             for k in ("tokenizer", "languages")):
        raise refuse(directory, f"its {META_FILE} is not the mapping `export format=hf` writes")
    return meta
