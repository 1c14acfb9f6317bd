"""`transformer-mt export format=hf`: a run as a Hugging Face Transformers model directory (the `hf` extra).

    $ transformer-mt export format=hf checkpoint=saved_weights/<run> output_dir=hf-model
    >>> from transformers import AutoModelForSeq2SeqLM, AutoTokenizer
    >>> model = AutoModelForSeq2SeqLM.from_pretrained("hf-model")
    >>> tok = AutoTokenizer.from_pretrained("hf-model")

A post-norm model becomes a MarianMTModel, a pre-norm one a PegasusForConditionalGeneration: the same
function, its weights reordered (hf_weights.py). The directory holds `config.json`, `model.safetensors`
(written by the model's own `save_pretrained`), `generation_config.json` (greedy token for token as
ours: <bos> starts, <pad> and <bos> are never generated), our `tokenizer.json` with a post-processor that
ends each source with <eos> and a `tokenizer_config.json` for `AutoTokenizer`, `transformer_mt.json`
(our length rule and the run it came from) and a model card (`README.md`, card.py). What the formats
cannot hold exactly is refused in one line naming the setting (`refusals`).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from tokenizers import processors

from transformer_mt.checkpoints.store import model_from_checkpoint
from transformer_mt.config import ConfigError, DecodingConfig, ModelConfig
from transformer_mt.data.tokenizer import BOS, BOS_ID, EOS, EOS_ID, PAD_ID, SPECIAL_TOKENS, UNK, Vocabulary
from transformer_mt.decoding.confidence import carry_calibration
from transformer_mt.errors import ExportError
from transformer_mt.interop.card import write_card
from transformer_mt.interop.hf_weights import SIDES, to_hf
from transformer_mt.model import Transformer
from transformer_mt.runtime.files import META_FILE, written_into

log = logging.getLogger(__name__)
INSTALL = "pip install 'transformer-mt[hf]'"
HF_LAYER_NORM_EPS = 1e-5  # Marian's and Pegasus's LayerNorms take torch's default; no config key sets it


def transformers_module() -> Any:
    """The transformers package, or a ConfigError naming the extra that installs it."""
    try:
        import transformers
    except ImportError as ex:
        raise ConfigError(f"format=hf needs the transformers package: {INSTALL}") from ex
    return transformers


def refusals(c: ModelConfig, vocab: Vocabulary) -> list[str]:
    """Every setting of the model that the Hugging Face classes cannot express exactly, one line each."""
    found = []
    if c.positional != "sinusoidal":
        found.append(f"model.positional={c.positional}: Marian and Pegasus rebuild sinusoidal positions and "
                     "store none")
    if c.layer_norm_eps != HF_LAYER_NORM_EPS:
        found.append(f"model.layer_norm_eps={c.layer_norm_eps:g}: Marian's and Pegasus's LayerNorms use "
                     f"{HF_LAYER_NORM_EPS:g}")
    if not vocab.joint:
        found.append("separate source and target tokenizers (tokenizer.joint=false): a Hugging Face "
                     "directory holds one tokenizer.json")
    if vocab.target_languages:
        found.append(f"several target languages ({', '.join(vocab.target_languages)}): a Hugging Face "
                     "tokenizer cannot put the language's token before each source")
    if c.norm_first and not c.tie_embeddings:
        found.append("model.tie_embeddings=false with pre-norm: Pegasus shares one embedding between its "
                     "encoder and decoder")
    return found


def architecture(c: ModelConfig) -> str:
    """The Hugging Face class a model becomes: Pegasus (pre-norm, final LayerNorms) or Marian (post-norm)."""
    return "PegasusForConditionalGeneration" if c.norm_first else "MarianMTModel"


def config_kwargs(c: ModelConfig, vocab: Vocabulary) -> dict[str, Any]:
    """The arguments of MarianConfig / PegasusConfig that describe `c`."""
    kwargs = dict(vocab_size=vocab.src_vocab_size, d_model=c.d_model, encoder_layers=c.encoder_layers,
                  decoder_layers=c.decoder_layers, encoder_attention_heads=c.n_heads,
                  decoder_attention_heads=c.n_heads, encoder_ffn_dim=c.d_ff, decoder_ffn_dim=c.d_ff,
                  activation_function=c.activation, dropout=c.dropout, attention_dropout=c.attention_dropout,
                  activation_dropout=c.activation_dropout, max_position_embeddings=c.max_positions,
                  scale_embedding=True, pad_token_id=PAD_ID, bos_token_id=BOS_ID, eos_token_id=EOS_ID,
                  decoder_start_token_id=BOS_ID, forced_eos_token_id=EOS_ID,
                  tie_word_embeddings=c.tie_embeddings or c.tie_output, is_encoder_decoder=True)
    if not c.norm_first:
        kwargs.update(decoder_vocab_size=vocab.tgt_vocab_size,
                      share_encoder_decoder_embeddings=c.tie_embeddings)
    return kwargs


def hf_model(model: Transformer, vocab: Vocabulary) -> Any:
    """The Hugging Face model that computes what `model` does."""
    transformers = transformers_module()
    c = model.config
    kwargs = config_kwargs(c, vocab)
    if c.norm_first:
        hf = transformers.PegasusForConditionalGeneration(transformers.PegasusConfig(**kwargs))
    else:
        hf = transformers.MarianMTModel(transformers.MarianConfig(**kwargs))
    missing, unexpected = hf.load_state_dict(to_hf(model), strict=False)
    built = {"final_logits_bias", *(f"model.{side}.embed_positions.weight" for side in SIDES)}
    tied = {k for k in missing if k.endswith("embed_tokens.weight") or k == "lm_head.weight"}
    lacking = sorted(set(missing) - built - tied)
    if unexpected or lacking:
        raise ExportError(f"transformers {transformers.__version__} names {architecture(c)}'s weights "
                          f"otherwise: unexpected {sorted(unexpected)[:3]}, missing {lacking[:3]}")
    hf.tie_weights()
    return hf.eval()


def generation_kwargs(decoding: DecodingConfig, max_positions: int) -> dict[str, Any]:
    """generation_config.json: ours as far as `generate` has it. <bos> starts; <pad> and <bos> never
    come out; <eos> is forced at the length limit. `generate` has no length rule of ours (a * source
    + b): each call passes max_new_tokens (transformer_mt.json says how); beam search divides by
    length^length_penalty, not GNMT's ((5 + length) / 6)^alpha, so beams may rank otherwise
    (interop.generate passes the nearest exponent for each sentence)."""
    return dict(decoder_start_token_id=BOS_ID, bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID,
                forced_eos_token_id=EOS_ID, suppress_tokens=[PAD_ID, BOS_ID], num_beams=decoding.beam_size,
                max_length=max_positions + 1,
                **({"length_penalty": decoding.length_penalty, "early_stopping": False}
                   if decoding.beam_size > 1 else {}))  # transformers refuses beam settings for greedy


def tokenizer_files(vocab: Vocabulary, max_positions: int, directory: Path) -> None:
    """tokenizer.json (ours, each source ended by <eos> as our encoder reads it) and tokenizer_config.json
    (AutoTokenizer's class and special tokens; typed special-token text stays text, as in ours)."""
    tok = vocab.src.__class__.from_str(vocab.src.to_str())
    tok.post_processor = processors.TemplateProcessing(
        single=f"$A:0 {EOS}:0", pair=f"$A:0 {EOS}:0 $B:1 {EOS}:1", special_tokens=[(EOS, EOS_ID)])
    tok.save(str(directory / "tokenizer.json"))
    pad, _, _, _ = SPECIAL_TOKENS
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS, "eos_token": EOS,
              "pad_token": pad, "unk_token": UNK, "model_max_length": max_positions, "padding_side": "right",
              "clean_up_tokenization_spaces": False, "split_special_tokens": True,
              "model_input_names": ["input_ids", "attention_mask"]}
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def export_hf(checkpoint: str | Path, output_dir: Path, overwrite: bool = False) -> Path:
    """Write a Hugging Face model directory for a checkpoint (file or run directory), with its model card
    (card.py); return its path. An existing output_dir is replaced only with `overwrite`."""
    file, state, model, vocab = model_from_checkpoint(checkpoint)
    problems = refusals(model.config, vocab)
    if problems:
        raise ExportError(f"{file} cannot be exported as {architecture(model.config)} exactly: "
                          + "; ".join(problems))
    transformers = transformers_module()
    hf = hf_model(model, vocab)
    decoding = DecodingConfig(**{k: v for k, v in state.get("config", {}).get("decoding", {}).items()
                                 if k in DecodingConfig.__dataclass_fields__})
    with written_into(Path(output_dir), overwrite) as tmp:
        hf.save_pretrained(str(tmp), safe_serialization=True)
        generation = generation_kwargs(decoding, model.config.max_positions)
        transformers.GenerationConfig(**generation).save_pretrained(str(tmp))
        tokenizer_files(vocab, model.config.max_positions, tmp)
        carry_calibration(Path(file).parent, model, tmp)  # confidence.py: where fitted for these weights
        run = state.get("config", {})
        meta = {"format": "hf", "architecture": architecture(model.config), "checkpoint": str(file),
                "step": state.get("step"), "transformers_version": transformers.__version__,
                "languages": {k: run.get("dataset", {}).get(k) for k in ("src_lang", "tgt_lang")},
                "tokenizer": run.get("tokenizer", {}),
                "decoding": {"max_len_a": decoding.max_len_a, "max_len_b": decoding.max_len_b,
                             "length_penalty": decoding.length_penalty},
                "max_new_tokens": "min(floor(max_len_a * len(input_ids) + max_len_b), max_positions - 1) + 1"}
        (tmp / META_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        write_card(state, Path(file).parent, tmp, architecture(model.config), model.num_parameters())
    log.info("exported %s to %s (%s, transformers %s)", file, output_dir, architecture(model.config),
             transformers.__version__)
    return Path(output_dir)
