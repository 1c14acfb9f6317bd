"""Which values each setting allows: the tables of choices and ranges, and the rules between keys.

Keys are full paths (`model.d_model`); a command checks the keys it has. `section_problems` applies the
tables to a config section and lists every problem, one message each, so that `config.validate` (and a
section's own `check()`) can report them all at once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from transformer_mt.config.arguments import not_utf8_text, output_problems
from transformer_mt.config.dataset_checks import MIX_WEIGHT, dataset_relations
from transformer_mt.config.problems import Rule, out_of_range

if TYPE_CHECKING:  # types only: the schemas import this module
    from transformer_mt.config import commands, schema

CHOICES: dict[str, tuple[str, ...]] = {
    "dataset.name": ("tatoeba", "parallel", "hf", "opus_books"),
    "tokenizer.kind": ("bpe", "unigram", "wordlevel", "char"),
    "model.activation": ("relu", "gelu"),
    "model.positional": ("sinusoidal", "learned"),
    "device.name": ("auto", "cpu", "cuda", "mps"),
    "device.amp": ("auto", "off", "bf16", "fp16"),
    "training.scheduler": ("noam", "linear", "cosine", "constant"),
    "training.best_metric": ("bleu", "chrf", "loss", "cer", "wer"),
    "training.plan": ("off", "auto"),
    "split": ("test", "valid"),
    "engine": ("pytorch", "ctranslate2"),
    "decoding.input_case": ("fold", "model"),
    "decoding.low_confidence": ("mark", "withhold"),
    "decoding.quantize": ("none", "int8"),
    "format": ("ct2", "hf", "onnx", "web"),
    "input_format": ("text", "tsv"),
    "document.format": ("auto", "text", "markdown", "html", "srt"),
    "document.names": ("auto", "copy", "model"),
    "quantization": ("int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16",
                     "bfloat16", "float32"),
}

# A command's own key whose values differ from another command's key of the same name.
COMMAND_CHOICES: dict[str, dict[str, tuple[str, ...]]] = {
    "ScoreConfig": {"output_format": ("tsv", "json")},
    "TranslateConfig": {"output_format": ("text", "jsonl")},
}


def at_least(low: float, or_null: bool = False) -> Rule:
    """value >= low (or None, when or_null)."""
    return (lambda v: (or_null and v is None) or (v is not None and v >= low),
            f">= {low}{' or null' if or_null else ''}")


def between(low: int, high: int) -> Rule:
    """low <= value <= high."""
    return (lambda v: low <= v <= high, f"between {low} and {high}")


# Upper bounds on what sizes a model: far above any model this toolkit trains (the paper's big model has
# d_model 1024, FFN 4096, 6+6 layers), so that a checkpoint's config cannot claim more than a machine holds
# before its weights are compared with it (checkpoint_check.py), nor a typo start a run that cannot fit.
MAX_D_MODEL = 16384
MAX_HEADS = 1024
MAX_D_FF = 65536
MAX_LAYERS = 256
MAX_POSITIONS = 16384  # the sinusoid table (max_positions x d_model) is built, not loaded
MAX_VOCAB_SIZE = 1_048_576

PROBABILITY: Rule = (lambda v: 0.0 <= v < 1.0, "in [0, 1)")
POSITIVE: Rule = (lambda v: v > 0, "> 0")
RANGES: dict[str, Rule] = {
    "dataset.max_pairs": at_least(10, or_null=True),
    "dataset.min_len": at_least(0),
    "dataset.valid_size": at_least(1),
    "dataset.test_size": at_least(0),
    "dataset.weight": MIX_WEIGHT,
    "tokenizer.min_frequency": at_least(1),
    "tokenizer.max_sentences": at_least(100),
    "tokenizer.dropout": PROBABILITY,
    "tokenizer.alpha": at_least(0),
    "tokenizer.vocab_size": (lambda v: v <= MAX_VOCAB_SIZE, f"<= {MAX_VOCAB_SIZE}"),  # its low: relations
    "model.d_model": between(1, MAX_D_MODEL),
    "model.n_heads": between(1, MAX_HEADS),
    "model.d_ff": between(1, MAX_D_FF),
    "model.encoder_layers": between(1, MAX_LAYERS),
    "model.decoder_layers": between(1, MAX_LAYERS),
    "model.max_positions": between(1, MAX_POSITIONS),
    **{f"model.{k}": PROBABILITY for k in ("dropout", "attention_dropout", "activation_dropout")},
    "model.layer_norm_eps": (lambda v: 0 < v < 1, "in (0, 1)"),
    "device.num_threads": at_least(1, or_null=True),
    "device.num_interop_threads": at_least(1, or_null=True),
    "training.epochs": at_least(1),
    "training.batch_tokens": at_least(16),
    "training.pad_to_multiple": at_least(1, or_null=True),
    "training.accumulate": at_least(1),
    "training.lr": POSITIVE,
    "training.warmup_steps": at_least(0),
    "training.min_lr": at_least(0),
    "training.label_smoothing": PROBABILITY,
    "training.ema_decay": PROBABILITY,
    "training.clip_grad_norm": at_least(0),
    "training.log_every": at_least(1),
    "training.valid_max_sentences": at_least(1),
    "training.valid_every_steps": at_least(0),
    "training.keep_last": at_least(1),
    "training.patience": at_least(0),
    "training.save_every_steps": at_least(0),
    "training.max_bad_steps": at_least(1),
    "training.max_minutes": (lambda v: v is None or v > 0, "> 0 or null"),
    "training.decode_speedup": at_least(1),
    "training.num_samples": at_least(0),
    "training.calibration_sentences": at_least(0),
    "training.betas": (lambda v: len(v) == 2 and all(0.0 <= b < 1.0 for b in v), "two numbers in [0, 1)"),
    "decoding.beam_size": at_least(1),
    "distill.beam_size": at_least(1),
    "distill.original_weight": at_least(0),
    "distill.chunk_pairs": at_least(1),
    "decoding.max_len_a": at_least(0),
    "decoding.max_len_b": at_least(1),
    "decoding.batch_tokens": at_least(1, or_null=True),
    "document.max_sentence_tokens": at_least(4, or_null=True),
    "decoding.temperature": POSITIVE,
    "decoding.top_k": at_least(0),
    "decoding.top_p": (lambda v: 0 < v <= 1, "in (0, 1]"),
    "decoding.min_confidence": (lambda v: v is None or 0 <= v <= 1, "in [0, 1] or null"),
    "max_sentences": at_least(1, or_null=True),
    "max_input_tokens": at_least(1, or_null=True),
    "port": (lambda v: 0 <= v <= 65535, "a TCP port in [0, 65535] (0: any free port)"),
    "batching.window_ms": at_least(0),
    "batching.max_sentences": at_least(1),
    "batching.max_queue": at_least(1),
    "limits.max_texts": at_least(1),
    "limits.max_chars": at_least(1),
    "limits.max_glossary_terms": at_least(0),
    "limits.max_beam_size": at_least(1),
    "limits.timeout_s": POSITIVE,
    "limits.body_timeout_s": POSITIVE,
    "limits.max_header_bytes": at_least(1024),
    "limits.max_connections": at_least(1),
    "limits.idle_timeout_s": POSITIVE,
    "limits.send_timeout_s": POSITIVE,
    "limits.max_response_bytes": at_least(1024),
    "limits.max_attention_values": at_least(1),
}

# Every vocabulary starts with these, ids 0-3 in this order (transformer_mt.data.tokenizer takes them from
# here, where the smallest vocabulary size counts them).
SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")
BYTE_ALPHABET = 256  # byte-level BPE starts from every byte


def min_vocab_size(kind: str) -> int:
    """The smallest vocabulary a tokenizer kind can be trained with."""
    return len(SPECIAL_TOKENS) + (BYTE_ALPHABET if kind == "bpe" else 1)


def _model_relations(m: schema.ModelConfig) -> list[str]:
    found = []
    if m.n_heads >= 1 and m.d_model % m.n_heads:
        example = m.n_heads * max(1, m.d_model // m.n_heads)
        found.append(f"model.d_model={m.d_model} is not divisible by model.n_heads={m.n_heads}; "
                     f"pick d_model a multiple of n_heads (e.g. {example})")
    if m.positional == "sinusoidal" and m.d_model % 2:
        found.append(f"model.d_model={m.d_model} must be even for sinusoidal positions")
    return found


def _tokenizer_relations(t: schema.TokenizerConfig) -> list[str]:
    minimum = min_vocab_size(t.kind)
    parts = f"{len(SPECIAL_TOKENS)} special tokens + {'256 bytes' if t.kind == 'bpe' else '1 symbol'}"
    found = out_of_range("tokenizer.vocab_size", t.vocab_size, t.vocab_size >= minimum,
                         f">= {minimum} for tokenizer={t.kind} ({parts})")
    # Subword regularisation: BPE-dropout for bpe, sampling for unigram (data/segmentation.py).
    for key, value, kind in (("dropout", t.dropout, "bpe"), ("alpha", t.alpha, "unigram")):
        if value and t.kind != kind:
            found.append(f"tokenizer.{key}={value} applies to tokenizer={kind} only (this run has "
                         f"tokenizer={t.kind}); set tokenizer.{key}=0"
                         + (" or use tokenizer.alpha for unigram" if kind == "bpe" else ""))
    return found


ATTENTION_BACKENDS = ("efficient", "flash", "cudnn", "math")  # model.attention.BACKENDS' names


def _device_relations(d: schema.DeviceConfig) -> list[str]:
    unknown = [name for name in d.attention_backends if name not in ATTENTION_BACKENDS]
    if unknown:
        return [f"device.attention_backends={list(d.attention_backends)} names unknown kernel(s) "
                f"{', '.join(map(str, unknown))}; choose from: {', '.join(ATTENTION_BACKENDS)} "
                "([] leaves the choice to PyTorch)"]
    return []


def _training_relations(t: schema.TrainingConfig) -> list[str]:
    return (out_of_range("training.average_last", t.average_last, 0 <= t.average_last <= t.keep_last,
                         f"between 0 and training.keep_last ({t.keep_last}), since only kept "
                         "checkpoints average")
            + out_of_range("training.max_minutes", t.max_minutes,
                           t.plan != "auto" or t.max_minutes is not None,
                           "a number of minutes with training.plan=auto, which plans that budget")
            + out_of_range("training.decode_speedup", t.decode_speedup,
                           t.plan == "auto" or t.decode_speedup == 1,
                           "1 without training.plan=auto, which plans the decoder it asks for (or choose a "
                           "shape: model=student)"))


def n_best_in_beam(n_best: int, beam_size: int, prefix: str = "decoding.") -> list[str]:
    """An n-best list is taken from the beam: 1 <= n_best <= beam_size (the config, and a request to
    the server, whose keys have no prefix)."""
    return out_of_range(f"{prefix}n_best", n_best, 1 <= n_best <= beam_size,
                        f"between 1 and {prefix}beam_size ({beam_size})")


def _decoding_relations(dc: schema.DecodingConfig) -> list[str]:
    found = n_best_in_beam(dc.n_best, dc.beam_size)
    if dc.min_confidence is not None and not dc.confidence:
        found.append(f"decoding.min_confidence={dc.min_confidence} needs decoding.confidence=true")
    if dc.glossary and dc.sampling:
        found.append("decoding.glossary needs beam or greedy search: its terms are hard constraints; set "
                     "decoding.sampling=false or drop the glossary")
    if dc.shortlist and dc.sampling:
        found.append("decoding.shortlist=true is for beam and greedy search; sampling draws from the whole "
                     "vocabulary: set decoding.sampling=false or decoding.shortlist=false")
    return found


def _train_relations(cfg: commands.TrainConfig) -> list[str]:
    found = []
    if cfg.model.tie_embeddings and not cfg.tokenizer.joint:
        found.append("model.tie_embeddings=true needs tokenizer.joint=true; set one of them to false")
    if cfg.init and cfg.resume:
        found.append(f"init={cfg.init} starts a new run from a trained model, resume={cfg.resume} continues "
                     "a run (a fine-tuning run too, with resume= alone): give one of them")
    if cfg.distill.init_from_teacher and (not cfg.distill.teacher or "," in cfg.distill.teacher or cfg.init):
        found.append("distill.init_from_teacher=true starts the student from one teacher's weights: give "
                     "distill.teacher=<run> (one run, not an ensemble) and no init=")
    if cfg.distill.teacher and len(cfg.dataset.target_languages()) > 1:
        found.append(f"distill.teacher translates into one language; this run's dataset has several "
                     f"({', '.join(cfg.dataset.target_languages())}): distill each direction's run")
    if cfg.dataset.max_len + 2 > cfg.model.max_positions:
        found.append(f"dataset.max_len={cfg.dataset.max_len} needs model.max_positions >= "
                     f"{cfg.dataset.max_len + 2}")
    return found


GLOSSARY_ON_CT2 = ("decoding.glossary runs on engine=pytorch: CTranslate2 has no lexical constraints (it "
                   "forces prefixes only)")
QUANTIZE_ON_CT2 = ("decoding.quantize=int8 runs on engine=pytorch; CTranslate2 computes in the type its "
                   "export chose (`transformer-mt export quantization=int8`, the default): drop "
                   "decoding.quantize")


def int8_problems(quantize: str, amp: str, device: str) -> list[str]:
    """What decoding.quantize=int8 cannot run with: a device other than the CPU (`auto` passes here and is
    checked once it is resolved: runtime/quantize.py), or autocast to bf16/fp16 (the int8 kernels take
    float32 input)."""
    if quantize != "int8":
        return []
    found = []
    if device not in ("auto", "cpu"):
        found.append(f"decoding.quantize=int8 runs on the CPU (PyTorch's int8 kernels are CPU kernels), not "
                     f"on {device}: set device=cpu, or decoding.quantize=none")
    if amp in ("bf16", "fp16"):
        found.append(f"decoding.quantize=int8 runs the layers around its int8 kernels in float32, not "
                     f"device.amp={amp}: drop device.amp (auto), or set decoding.quantize=none")
    return found
_CHECKPOINT = "checkpoint= is required: a .pt file or a run directory under saved_weights/"


def _engine_relations(cfg: commands.EngineConfig) -> list[str]:
    found = []
    if cfg.engine == "ctranslate2" and cfg.device.name == "mps":
        found.append("engine=ctranslate2 runs on cpu or cuda, not mps; set device=cpu")
    if cfg.engine == "ctranslate2" and cfg.decoding.alignment:
        found.append("decoding.alignment=true runs on engine=pytorch (it reads the model's cross-attention)")
    if cfg.engine == "ctranslate2" and cfg.decoding.glossary:
        found.append(GLOSSARY_ON_CT2)
    if cfg.engine == "ctranslate2" and cfg.decoding.quantize != "none":
        found.append(QUANTIZE_ON_CT2)
    elif cfg.engine == "pytorch":
        found += int8_problems(cfg.decoding.quantize, cfg.device.amp, cfg.device.name)
    return found


def _translate_relations(cfg: commands.TranslateConfig) -> list[str]:
    return (_engine_relations(cfg) + not_utf8_text("text=", cfg.text) + output_problems("output", cfg.output)
            + output_problems("attention_png", cfg.attention_png))


def _serve_relations(cfg: commands.ServeConfig) -> list[str]:
    found = _engine_relations(cfg)
    if cfg.decoding.beam_size > cfg.limits.max_beam_size:
        found.append(f"decoding.beam_size={cfg.decoding.beam_size} is above limits.max_beam_size="
                     f"{cfg.limits.max_beam_size}; raise the limit or lower the default")
    if cfg.batching.max_queue < cfg.limits.max_texts:
        found.append(f"batching.max_queue={cfg.batching.max_queue} cannot hold one request of "
                     f"limits.max_texts={cfg.limits.max_texts} texts; raise max_queue")
    if not cfg.allowed_hosts:
        found.append("allowed_hosts is empty; list the host names clients use, or allowed_hosts=[*] for any")
    return found


def _engine_needs(cfg: commands.EngineConfig) -> list[str]:
    if cfg.engine == "ctranslate2":
        return [] if cfg.model_dir else ["engine=ctranslate2 needs model_dir=<directory written by "
                                         "`transformer-mt export checkpoint=...`>"]
    return [] if cfg.checkpoint else [_CHECKPOINT]


def _needs_checkpoint(cfg: commands.EvaluateConfig | commands.ExportConfig | commands.ScoreConfig,
                      ) -> list[str]:
    return [] if cfg.checkpoint else [_CHECKPOINT]


def _evaluate_relations(cfg: commands.EvaluateConfig) -> list[str]:
    found = output_problems("output_dir", cfg.output_dir, directory=True)
    found += int8_problems(cfg.decoding.quantize, cfg.device.amp, cfg.device.name)
    if cfg.decoding.alignment:
        found.append("decoding.alignment=true is for translate and serve; evaluate scores the translations "
                     "alone")
    if cfg.calibrate and "," in (cfg.checkpoint or ""):
        found.append("calibrate=true fits one checkpoint's confidence; give one checkpoint, not an ensemble")
    if cfg.calibrate and not cfg.decoding.confidence:
        found.append("calibrate=true fits confidence: drop decoding.confidence=false")
    if cfg.calibrate and cfg.split == "test" and not (cfg.tsv_file or cfg.src_file):
        found.append("calibrate=true fits on held-out pairs that tests must not see: use split=valid (or "
                     "tsv_file=/src_file= of your own held-out pairs)")
    return found


def _score_relations(cfg: commands.ScoreConfig) -> list[str]:
    found = output_problems("output", cfg.output)
    if cfg.input is not None and (cfg.src is not None or cfg.tgt is not None):
        found.append("give the pairs as input=<TSV> or as src=<file> tgt=<file>, not both")
    elif (cfg.src is None) != (cfg.tgt is None):
        found.append("src= and tgt= come together: one file of sources, one of their targets, aligned")
    return found


def _export_relations(cfg: commands.ExportConfig) -> list[str]:
    found = output_problems("output_dir", cfg.output_dir, directory=True)
    if cfg.glossary and cfg.format != "web":
        found.append(f"glossary= goes into the page of format=web; format={cfg.format} writes a model, which "
                     "takes a glossary where it translates (decoding.glossary=)")
    return found


def _needs_run_dir(cfg: commands.TrainConfig) -> list[str]:
    return [] if cfg.checkpoint.dir else ["checkpoint.dir=null leaves the run without a directory; name "
                                          "one, or leave the key out (the command line and compose() "
                                          "then set it)"]


# Rules between keys, by schema: a section's own, then a command's across its sections.
RELATIONS: dict[str, Callable[[Any], list[str]]] = {
    "ModelConfig": _model_relations, "DatasetConfig": dataset_relations,
    "TokenizerConfig": _tokenizer_relations, "TrainingConfig": _training_relations,
    "DeviceConfig": _device_relations,
    "DecodingConfig": _decoding_relations, "TrainConfig": _train_relations,
    "TranslateConfig": _translate_relations, "ServeConfig": _serve_relations, "ScoreConfig": _score_relations,
    "EvaluateConfig": _evaluate_relations,
    "ExportConfig": _export_relations,
}
# What a command cannot run without (`--cfg job` prints a config without them).
REQUIRED: dict[str, Callable[[Any], list[str]]] = {
    "TranslateConfig": _engine_needs, "ServeConfig": _engine_needs, "EvaluateConfig": _needs_checkpoint,
    "ExportConfig": _needs_checkpoint, "TrainConfig": _needs_run_dir, "ScoreConfig": _needs_checkpoint,
}


def section_problems(obj: Any, prefix: str = "", complete: bool = True) -> list[str]:
    """Choices and ranges of every field of a config (its sections recursively), then its relations;
    with complete, also what it cannot run without."""
    found: list[str] = []
    choices = {**CHOICES, **COMMAND_CHOICES.get(type(obj).__name__, {})}
    for f in dataclasses.fields(obj):
        key, value = f"{prefix}{f.name}", getattr(obj, f.name)
        if dataclasses.is_dataclass(value) and hasattr(type(value), "KEY"):  # a section: its own rules
            found += section_problems(value, f"{type(value).KEY}.")
        elif key in choices and value not in choices[key]:
            found.append(f"{key}={value!r} is not allowed; choose one of: {', '.join(choices[key])}")
        elif key in RANGES and not RANGES[key][0](value):
            found += out_of_range(key, value, False, RANGES[key][1])
    for table in (RELATIONS, REQUIRED) if complete else (RELATIONS,):
        found += table[type(obj).__name__](obj) if type(obj).__name__ in table else []
    return found
