"""CTranslate2: a checkpoint exported to a CTranslate2 model directory (`export format=ct2`; the `ct2`
extra), which decoding/ct2.py translates with.

    $ transformer-mt export checkpoint=saved_weights/<run> quantization=int8

    >>> from transformer_mt.interop.ct2_export import export_ctranslate2
    >>> model_dir = export_ctranslate2("saved_weights/<run>", Path("ct2-int8"), quantization="int8")

The model directory holds CTranslate2's own files, our tokenizer JSON and `transformer_mt.json` (model
config, source checkpoint, quantization), and where the run has a shortlist, it as CTranslate2's
vocabulary map (`vmap.txt`: `decoding.shortlist=true` on engine=ctranslate2). docs/ctranslate2.md explains
how each weight is mapped.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

import torch

from transformer_mt.checkpoints.store import model_from_checkpoint
from transformer_mt.config import ExportConfig, validate
from transformer_mt.data.tokenizer import BOS, BOS_ID, EOS, EOS_ID, UNK, UNK_ID, Vocabulary
from transformer_mt.decoding.confidence import carry_calibration
from transformer_mt.decoding.ct2 import VMAP_FILE, ctranslate2_module
from transformer_mt.decoding.shortlist import SHORTLIST_FILE, read_shortlist, vmap_lines
from transformer_mt.errors import ExportError
from transformer_mt.model import Transformer
from transformer_mt.runtime.files import META_FILE, refuse_existing, written_into

log = logging.getLogger(__name__)
META_VERSION = 1


def _array(t: torch.Tensor) -> Any:
    return t.detach().cpu().float().contiguous().numpy()


def _linear(spec: Any, layer: torch.nn.Linear) -> None:
    spec.weight = _array(layer.weight)
    if layer.bias is not None:
        spec.bias = _array(layer.bias)


def _norm(spec: Any, norm: torch.nn.LayerNorm) -> None:
    spec.gamma = _array(norm.weight)
    spec.beta = _array(norm.bias)


def _tokens(tok: Any, side: str) -> list[str]:
    """The vocabulary in id order; CTranslate2 looks tokens up by string, so they must be unique."""
    size = tok.get_vocab_size()
    tokens = [tok.id_to_token(i) for i in range(size)]
    if any(t is None for t in tokens):
        raise ExportError(f"the {side} vocabulary has gaps in its ids; CTranslate2 needs ids 0..{size - 1}")
    if len(set(tokens)) != size:
        raise ExportError(f"the {side} vocabulary has duplicate token strings; CTranslate2 cannot map them")
    return tokens




def _copy_stack(spec: Any, embedding_spec: Any, stack: torch.nn.Module, embed: torch.nn.Embedding,
                norm_first: bool) -> None:
    """An encoder or decoder's embeddings (scaled by sqrt(d_model)), our position table, and its final
    LayerNorm (pre-norm only)."""
    embedding_spec.weight = _array(embed.weight)
    spec.scale_embeddings = True
    positional = stack.positional
    spec.position_encodings.encodings = _array(positional.embedding.weight if positional.learned
                                               else positional.pe)
    if norm_first:
        _norm(spec.layer_norm, stack.final_norm)


def _copy_sublayers(layer_spec: Any, layer: torch.nn.Module) -> None:
    """Self-attention and feed-forward with their LayerNorms: the sub-layers both stacks' layers have."""
    _linear(layer_spec.self_attention.linear[0], layer.self_attn.qkv_proj)
    _linear(layer_spec.self_attention.linear[1], layer.self_attn.out_proj)
    _norm(layer_spec.self_attention.layer_norm, layer.self_attn_norm)
    _linear(layer_spec.ffn.linear_0, layer.feed_forward.linear1)
    _linear(layer_spec.ffn.linear_1, layer.feed_forward.linear2)
    _norm(layer_spec.ffn.layer_norm, layer.ff_norm)


def build_spec(model: Transformer, vocab: Vocabulary) -> Any:
    """A validated `ctranslate2.specs.TransformerSpec` holding the model's weights (not yet quantized)."""
    ct2 = ctranslate2_module()
    from ctranslate2.specs import common_spec, transformer_spec

    c = model.config
    activations = {"relu": common_spec.Activation.RELU, "gelu": common_spec.Activation.GELU}
    if c.activation not in activations:
        raise ExportError(f"activation {c.activation!r} has no CTranslate2 equivalent; "
                          f"supported: {', '.join(activations)}")
    if c.positional not in ("sinusoidal", "learned"):
        raise ExportError(f"positional {c.positional!r} cannot be exported")
    spec = transformer_spec.TransformerSpec.from_config(
        (c.encoder_layers, c.decoder_layers), c.n_heads, pre_norm=c.norm_first,
        activation=activations[c.activation],
        alignment_layer=-1, alignment_heads=c.n_heads,  # head average of the last layer, as ours
    )
    _copy_stack(spec.encoder, spec.encoder.embeddings[0], model.encoder, model.src_embed, c.norm_first)
    for layer_spec, layer in zip(spec.encoder.layer, model.encoder.layers):
        _copy_sublayers(layer_spec, layer)
    _copy_stack(spec.decoder, spec.decoder.embeddings, model.decoder, model.tgt_embed, c.norm_first)
    for layer_spec, layer in zip(spec.decoder.layer, model.decoder.layers):
        _copy_sublayers(layer_spec, layer)
        _linear(layer_spec.attention.linear[0], layer.cross_attn.q_proj)
        _linear(layer_spec.attention.linear[1], layer.cross_attn.kv_proj)
        _linear(layer_spec.attention.linear[2], layer.cross_attn.out_proj)
        _norm(layer_spec.attention.layer_norm, layer.cross_attn_norm)
    _linear(spec.decoder.projection, model.output_projection)

    src_tokens, tgt_tokens = _tokens(vocab.src, "source"), _tokens(vocab.tgt, "target")
    for tokens in (src_tokens, tgt_tokens):
        if tokens[BOS_ID] != BOS or tokens[EOS_ID] != EOS or tokens[UNK_ID] != UNK:
            raise ExportError(f"special tokens are not at their fixed ids ({BOS}={BOS_ID}, "
                              f"{EOS}={EOS_ID}, {UNK}={UNK_ID})")
    spec.register_source_vocabulary(src_tokens)
    spec.register_target_vocabulary(tgt_tokens)
    cfg = spec.config
    cfg.unk_token, cfg.bos_token, cfg.eos_token = UNK, BOS, EOS
    cfg.decoder_start_token = BOS  # targets start with <bos>
    cfg.add_source_bos = False  # sources are tokens + <eos>, no <bos>
    cfg.add_source_eos = True
    cfg.layer_norm_epsilon = c.layer_norm_eps
    try:
        spec.validate()
    except (ValueError, TypeError) as ex:
        raise ExportError(f"CTranslate2 {ct2.__version__} rejects the model: "
                          f"{str(ex).strip().splitlines()[0]}") from ex
    return spec


def export_ctranslate2(checkpoint: str | Path, output_dir: Path, quantization: str = "int8",
                       overwrite: bool = False) -> Path:
    """Write a CTranslate2 model directory for a checkpoint (file or run directory); return its path. An
    existing output_dir is refused unless `overwrite` (and then only an earlier export is replaced)."""
    ct2 = ctranslate2_module()
    validate(ExportConfig(checkpoint=str(checkpoint), quantization=quantization))
    output_dir = Path(output_dir).expanduser().resolve()
    refuse_existing(output_dir, overwrite)
    file, state, model, vocab = model_from_checkpoint(checkpoint)
    with torch.no_grad():
        spec = build_spec(model, vocab)
    spec.optimize(quantization=quantization)
    with written_into(output_dir, overwrite) as tmp:
        spec.save(str(tmp))
        vocab.save(tmp)
        carry_calibration(Path(file).parent, model, tmp)  # confidence.py: where fitted for these weights
        if (Path(file).parent / SHORTLIST_FILE).is_file():  # its shortlist, as CTranslate2 reads one
            lines = vmap_lines(read_shortlist(Path(file).parent, vocab), vocab)
            (tmp / VMAP_FILE).write_text("\n".join(lines) + "\n", encoding="utf-8")
        meta = {
            "format": "ct2", "format_version": META_VERSION,
            "model_config": dataclasses.asdict(model.config),
            "checkpoint": str(file),
            "epoch": state.get("epoch"),
            "step": state.get("step"),
            "quantization": quantization, "ctranslate2_version": ct2.__version__,
            "tgt_lang": state.get("config", {}).get("dataset", {}).get("tgt_lang"),  # the default target
        }
        (tmp / META_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    log.info("exported %s to %s (CTranslate2 %s, %s)", file, output_dir, ct2.__version__, quantization)
    return output_dir
