"""Our weights under Hugging Face's names (MarianMTModel, PegasusForConditionalGeneration), and back: an
exact change of coordinates, no retraining.

Both families compute what our model computes (the same attention, FFN, LayerNorms, sqrt(d_model)
embedding scale before the positions are added, and sinusoids of the same frequencies), with two
differences of layout:
- our fused projections (self-attention's q, k, v in one matrix; cross-attention's k, v) are separate
  matrices there;
- our positional table interleaves sines and cosines (dimension 2i the sine, 2i+1 the cosine of one
  frequency), theirs puts the sines in the first half. Reordering the residual stream's dimensions
  (2i -> i, 2i+1 -> D/2 + i) in every weight that reads or writes it (the embeddings, the q/k/v and
  FFN inputs, the attention and FFN outputs, every LayerNorm, the output projection) is an exact
  symmetry of the network: nothing inside attention heads or the FFN is reordered.
No transformers import here: the mapping is plain tensors, tested against the transformers models
where they are installed (tests/test_hf_export.py).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from transformer_mt.model import Transformer

SIDES = ("encoder", "decoder")


def residual_order(d_model: int) -> Tensor:
    """HF's dimension j of the residual stream is our dimension order[j]: the sines, then the cosines."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


class _Mapper:
    """Writes HF-named tensors from our modules (to_hf) in the new coordinates."""

    def __init__(self, d_model: int) -> None:
        self.order = residual_order(d_model)
        self.out: dict[str, Tensor] = {}

    def reads(self, name: str, linear: nn.Linear | Tensor, rows: slice = slice(None)) -> None:
        """A map that reads the residual stream: its input columns reordered (its bias, if any, kept)."""
        weight = linear if isinstance(linear, Tensor) else linear.weight
        self.out[f"{name}.weight"] = weight[rows][:, self.order].clone()
        if isinstance(linear, nn.Linear) and linear.bias is not None:
            self.out[f"{name}.bias"] = linear.bias[rows].clone()

    def writes(self, name: str, linear: nn.Linear) -> None:
        """A map that writes the residual stream: its output rows and bias reordered."""
        self.out[f"{name}.weight"] = linear.weight[self.order].clone()
        self.out[f"{name}.bias"] = linear.bias[self.order].clone()

    def norm(self, name: str, norm: nn.LayerNorm) -> None:
        self.out[f"{name}.weight"] = norm.weight[self.order].clone()
        self.out[f"{name}.bias"] = norm.bias[self.order].clone()


@torch.no_grad()
def to_hf(model: Transformer) -> dict[str, Tensor]:
    """The HF state dict of `model` (keys of MarianMTModel / PegasusForConditionalGeneration): shared
    embeddings as `model.shared`, untied ones as each stack's `embed_tokens`; no positions (both
    families build their sinusoids), a zero `final_logits_bias` left to the model."""
    c, d = model.config, model.config.d_model
    m = _Mapper(d)
    if c.tie_embeddings:
        m.reads("model.shared", model.src_embed.weight)
    else:
        m.reads("model.encoder.embed_tokens", model.src_embed.weight)
        m.reads("model.decoder.embed_tokens", model.tgt_embed.weight)
    m.reads("lm_head", model.output_projection.weight)
    for side in SIDES:
        stack = getattr(model, side)
        for i, layer in enumerate(stack.layers):
            at = f"model.{side}.layers.{i}"
            for k, name in enumerate(("q_proj", "k_proj", "v_proj")):
                m.reads(f"{at}.self_attn.{name}", layer.self_attn.qkv_proj, slice(k * d, (k + 1) * d))
            m.writes(f"{at}.self_attn.out_proj", layer.self_attn.out_proj)
            m.norm(f"{at}.self_attn_layer_norm", layer.self_attn_norm)
            if side == "decoder":
                m.reads(f"{at}.encoder_attn.q_proj", layer.cross_attn.q_proj)
                m.reads(f"{at}.encoder_attn.k_proj", layer.cross_attn.kv_proj, slice(0, d))
                m.reads(f"{at}.encoder_attn.v_proj", layer.cross_attn.kv_proj, slice(d, 2 * d))
                m.writes(f"{at}.encoder_attn.out_proj", layer.cross_attn.out_proj)
                m.norm(f"{at}.encoder_attn_layer_norm", layer.cross_attn_norm)
            m.reads(f"{at}.fc1", layer.feed_forward.linear1)
            m.writes(f"{at}.fc2", layer.feed_forward.linear2)
            m.norm(f"{at}.final_layer_norm", layer.ff_norm)
        if stack.final_norm is not None:
            m.norm(f"model.{side}.layer_norm", stack.final_norm)
    return m.out


@torch.no_grad()
def from_hf(state: dict[str, Tensor], model: Transformer) -> None:
    """Load an HF state dict (as to_hf writes it, or a Marian/Pegasus model's own) into `model`, a
    Transformer of the matching config: every weight in our coordinates. KeyError names a missing one."""
    c, d = model.config, model.config.d_model
    back = torch.argsort(residual_order(d))  # our dimension i is HF's back[i]

    def get(name: str) -> Tensor:
        return state[name].float()

    def reading(name: str) -> Tensor:
        return get(name)[:, back]

    def load(linear: nn.Linear, name: str, writes: bool = False) -> None:
        weight = get(f"{name}.weight")
        linear.weight.copy_(weight[back] if writes else weight[:, back])
        bias = get(f"{name}.bias")
        linear.bias.copy_(bias[back] if writes else bias)

    def load_norm(norm: nn.LayerNorm, name: str) -> None:
        norm.weight.copy_(get(f"{name}.weight")[back])
        norm.bias.copy_(get(f"{name}.bias")[back])

    shared = "model.shared.weight" if "model.shared.weight" in state else "model.encoder.embed_tokens.weight"
    model.src_embed.weight.copy_(reading(shared))
    if not c.tie_embeddings:
        model.tgt_embed.weight.copy_(reading("model.decoder.embed_tokens.weight"))
    if not (c.tie_embeddings or c.tie_output):
        model.output_projection.weight.copy_(reading("lm_head.weight"))
    for side in SIDES:
        stack = getattr(model, side)
        for i, layer in enumerate(stack.layers):
            at = f"model.{side}.layers.{i}"
            fused = [(get(f"{at}.self_attn.{n}.weight")[:, back], get(f"{at}.self_attn.{n}.bias"))
                     for n in ("q_proj", "k_proj", "v_proj")]
            layer.self_attn.qkv_proj.weight.copy_(torch.cat([w for w, _ in fused]))
            layer.self_attn.qkv_proj.bias.copy_(torch.cat([b for _, b in fused]))
            load(layer.self_attn.out_proj, f"{at}.self_attn.out_proj", writes=True)
            load_norm(layer.self_attn_norm, f"{at}.self_attn_layer_norm")
            if side == "decoder":
                load(layer.cross_attn.q_proj, f"{at}.encoder_attn.q_proj")
                kv = [(get(f"{at}.encoder_attn.{n}.weight")[:, back], get(f"{at}.encoder_attn.{n}.bias"))
                      for n in ("k_proj", "v_proj")]
                layer.cross_attn.kv_proj.weight.copy_(torch.cat([w for w, _ in kv]))
                layer.cross_attn.kv_proj.bias.copy_(torch.cat([b for _, b in kv]))
                load(layer.cross_attn.out_proj, f"{at}.encoder_attn.out_proj", writes=True)
                load_norm(layer.cross_attn_norm, f"{at}.encoder_attn_layer_norm")
            load(layer.feed_forward.linear1, f"{at}.fc1")
            load(layer.feed_forward.linear2, f"{at}.fc2", writes=True)
            load_norm(layer.ff_norm, f"{at}.final_layer_norm")
        if stack.final_norm is not None:
            load_norm(stack.final_norm, f"model.{side}.layer_norm")
