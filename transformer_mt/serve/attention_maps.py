"""Cross-attention in `/translate` responses: its shape, and the bound checked before decoding.

`attention: true` returns one [target token][source token] matrix per text, averaged over the decoder's
layers and heads; `attention: "heads"` returns [layer][head][target token][source token]. Either way a
response holds at most `limits.max_attention_values` values: the request is refused with 413 before it
is decoded when its texts could exceed that (each text's longest allowed output × its source tokens,
`<eos>` included in both, × layers × heads for "heads").
"""

from __future__ import annotations

from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException

from transformer_mt.config import ServeConfig
from transformer_mt.data.tokenizer import EOS
from transformer_mt.decoding.search import max_output_length
from transformer_mt.decoding.text_translator import TextTranslator, Translation


class AttentionMap(BaseModel):
    source_tokens: list[str]
    target_tokens: list[str]
    weights: list[list[float]] | list[list[list[list[float]]]] = Field(
        description="attention: true: [target token][source token], averaged over layers and heads; "
                    "attention: \"heads\": [layer][head][target token][source token]")


def check_attention_size(engine: TextTranslator, texts: list[str], prefixes: list[str] | None,
                         attention: bool | str, cfg: ServeConfig) -> None:
    """413 before decoding when the attention asked for could exceed limits.max_attention_values: per
    text, the longest output its source allows (<eos> included) × its source tokens (<eos> included),
    × layers × heads for "heads"."""
    if attention is False:
        return
    try:
        sources = engine.vocab.encode_src([t.strip() for t in texts])
        forced = engine.vocab.encode_tgt(prefixes) if prefixes else [[] for _ in texts]
    except Exception:  # noqa: BLE001 - text the tokenizer refuses is the request check's to report
        return
    a, b = engine.decoding.max_len_a, engine.decoding.max_len_b
    values = 0
    for text, ids, start in zip(texts, sources, forced):
        n_src = min(len(ids), engine.max_input_tokens) + 1
        n_tgt = max(max_output_length(n_src, a, b, engine.max_positions), len(start)) + 1
        values += n_src * n_tgt if text.strip() else 0
    values *= _maps(engine) if attention == "heads" else 1
    limit = cfg.limits.max_attention_values
    if values > limit:
        instead = ", or attention: true (averaged)" if attention == "heads" else ""
        raise HTTPException(413, f"the attention asked for could hold {values:,} values; the limit is "
                            f"{limit:,} (limits.max_attention_values): send fewer or shorter texts{instead}")


def _maps(engine: TextTranslator) -> int:
    """How many (layer, head) maps of attention the engine returns per hypothesis."""
    model = getattr(engine, "model", None)  # CTranslate2 returns one map: the last layer's average
    return model.config.decoder_layers * model.config.n_heads if model is not None else 1


def attention_map(engine: TextTranslator, text: str, best: Translation, heads: bool) -> AttentionMap:
    """The best hypothesis's cross-attention, with the tokens labelling its rows and columns: averaged
    over layers and heads, or with heads=True each layer's and head's."""
    if best.attention is None or not text.strip():
        return AttentionMap(source_tokens=[], target_tokens=[], weights=[])
    weights = best.attention.float()  # (layers, heads, target + eos, source + eos)
    n_tgt, n_src = weights.shape[-2:]
    if not heads:
        weights = weights.mean(dim=(0, 1))  # (target + eos, source + eos)
    source = engine.vocab.src_tokens(text.strip())[: n_src - 1] + [EOS]  # cut as the engine cut it
    target = [*(best.tokens or []), EOS][:n_tgt]
    rounded = (weights * 10_000).round() / 10_000
    return AttentionMap(source_tokens=source, target_tokens=target, weights=rounded.tolist())
