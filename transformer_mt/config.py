"""Typed configuration schemas: what every setting is, who owns it, and which values are allowed.

Hydra composes YAML from `configs/` on top of these dataclasses (registered in the ConfigStore), so a
misspelt key or a wrong type fails during composition. `validate` adds the checks a type cannot
express (ranges, choices, cross-field rules) and reports every problem at once, one line each.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"


class ConfigError(ValueError):
    """A configuration problem a user can fix; its message is one line per problem."""


@dataclass
class DatasetConfig:
    """Where the parallel text comes from, how it is filtered and how it is split."""

    name: str = "tatoeba"  # tatoeba | opus_books
    path: str = "data/fra-eng.zip"  # tatoeba: fra.txt or the zip holding it
    url: str | None = "https://www.manythings.org/anki/fra-eng.zip"  # fetched once if path missing
    hf_path: str = "Helsinki-NLP/opus_books"  # opus_books: load_dataset(hf_path, hf_name)
    hf_name: str | None = "en-fr"
    hf_data_files: str | None = None  # local json/jsonl in the same schema (offline use, tests)
    cache_dir: str = "data/cache"  # downloads and encoded-corpus cache
    src_lang: str = "en"
    tgt_lang: str = "fr"
    max_pairs: int | None = None  # keep N pairs sampled deterministically; null = all
    min_len: int = 1  # tokens per side (without bos/eos), training split only
    max_len: int = 64
    valid_size: int = 2000  # pairs (whole source-sentence groups, so approximately)
    test_size: int = 2000
    split_seed: int = 1234


@dataclass
class TokenizerConfig:
    """Subword model trained on the training split only; saved as JSON with the run."""

    kind: str = "bpe"  # bpe (byte-level) | wordlevel | char
    vocab_size: int = 8000
    joint: bool = True  # one vocabulary for both languages (required for tied embeddings)
    min_frequency: int = 2
    lowercase: bool = False


@dataclass
class ModelConfig:
    """Transformer dimensions; vocabulary sizes and pad id come from the tokenizer."""

    d_model: int = 256
    n_heads: int = 4
    d_ff: int = 1024
    encoder_layers: int = 3
    decoder_layers: int = 3
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    activation: str = "relu"  # relu | gelu
    norm_first: bool = False  # False: post-norm as in the paper; True: pre-norm
    positional: str = "sinusoidal"  # sinusoidal | learned
    max_positions: int = 512
    tie_embeddings: bool = True  # source/target embeddings and output projection share weights
    tie_output: bool = True  # target embedding and output projection (when not fully tied)


@dataclass
class DeviceConfig:
    """Where tensors live and how many CPU threads torch may use."""

    name: str = "auto"  # auto (cuda, then mps, then cpu) | cpu | cuda | mps
    num_threads: int | None = None  # torch.set_num_threads; null = torch default
    num_interop_threads: int | None = None
    amp: str = "auto"  # auto (bf16 if supported on cuda, else fp16 on cuda, off on cpu) | off | bf16 | fp16
    # torch.compile the training forward pass (dynamic shapes: token batches vary in both
    # dimensions). Off by default: measured slower on a 2-core CPU (README, Performance).
    compile: bool = False


@dataclass
class TrainingConfig:
    """The optimisation recipe and the training loop's schedule."""

    epochs: int = 10
    batch_tokens: int = 4096  # padded source or target tokens per batch, whichever is larger
    accumulate: int = 1  # gradient accumulation steps per optimizer step
    lr: float = 1e-3  # peak learning rate
    # noam: inverse sqrt after the linear warm-up. linear | cosine: decay to min_lr over the run, which
    # ends at `epochs` or at `max_minutes`, whichever comes first (so a time budget ends at min_lr).
    scheduler: str = "noam"  # noam | linear | cosine | constant
    warmup_steps: int = 500  # about one Tatoeba epoch at 4k-token batches
    min_lr: float = 0.0  # floor of the linear and cosine decays
    betas: list[float] = field(default_factory=lambda: [0.9, 0.98])
    eps: float = 1e-9
    weight_decay: float = 0.0
    label_smoothing: float = 0.1
    clip_grad_norm: float = 1.0  # 0 disables clipping
    log_every: int = 50  # steps between TensorBoard scalars
    valid_max_sentences: int = 500  # validation decoding cap (loss uses the whole valid split)
    valid_beam_size: int = 1
    valid_every_steps: int = 0  # also validate (and keep a checkpoint) every N steps; 0 = each epoch only
    best_metric: str = "bleu"  # bleu | chrf | loss | cer | wer
    patience: int = 0  # epochs without improvement before stopping; 0 = never stop early
    keep_last: int = 3  # epoch/step checkpoints kept besides best
    average_last: int = 0  # at the end, average the last K checkpoints; kept if valid BLEU does not drop
    max_minutes: float | None = None  # wall-clock budget for training
    save_every_steps: int = 0  # mid-epoch checkpoint every N steps; 0 = only at epoch end
    max_bad_steps: int = 5  # consecutive non-finite losses (skipped steps) before the run stops
    min_free_mib: int = 200  # refuse to start when the run directory's disk has less free space
    num_samples: int = 5  # sample translations logged every epoch
    progress: bool = True  # tqdm progress bar


@dataclass
class CheckpointConfig:
    """Where this run's checkpoints go."""

    root: str = "saved_weights"
    dir: str | None = None  # null: <root>/<run_name>
    run_name: str | None = None  # null: <dataset>-<src>-<tgt>-<timestamp>


@dataclass
class DecodingConfig:
    """How hypotheses are searched for; shared by validation, evaluate and translate."""

    beam_size: int = 5  # 1 = greedy
    length_penalty: float = 0.6  # GNMT alpha
    max_len_a: float = 1.5  # max output length = a * source length + b
    max_len_b: int = 10
    n_best: int = 1
    sampling: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    batch_tokens: int = 6000  # source tokens per decoding batch
    use_cache: bool = True


@dataclass
class TrainConfig:
    """The `train` command."""

    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    device: DeviceConfig = field(default_factory=DeviceConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    decoding: DecodingConfig = field(default_factory=lambda: DecodingConfig(beam_size=1))
    seed: int = 1
    resume: str | None = None  # checkpoint file or directory to continue from
    debug: bool = False  # full tracebacks instead of one-line errors


@dataclass
class EvaluateConfig:
    """The `evaluate` command: score a checkpoint on its test split or on given parallel text."""

    checkpoint: str | None = None  # file, or a run directory (its best checkpoint)
    device: DeviceConfig = field(default_factory=DeviceConfig)
    decoding: DecodingConfig = field(default_factory=DecodingConfig)
    split: str = "test"  # test | valid: the run's own held-out split
    src_file: str | None = None  # or parallel text: two files ...
    ref_file: str | None = None
    tsv_file: str | None = None  # ... or one TSV (source<TAB>reference)
    max_sentences: int | None = None
    output_dir: str | None = None  # null: next to the checkpoint
    seed: int = 1
    debug: bool = False


@dataclass
class TranslateConfig:
    """The `translate` command: text from the command line, stdin or a file."""

    checkpoint: str | None = None
    device: DeviceConfig = field(default_factory=DeviceConfig)
    decoding: DecodingConfig = field(default_factory=DecodingConfig)
    text: str | None = None  # one sentence given on the command line
    input: str | None = None  # a file with one sentence a line; null = stdin
    output: str | None = None  # null = stdout
    scores: bool = False  # print the score before each translation
    attention_png: str | None = None  # write a cross-attention heatmap of the first sentence
    max_input_tokens: int | None = None  # null: the model's positional limit
    seed: int = 1
    debug: bool = False
    engine: str = "pytorch"  # pytorch | ctranslate2 (an `export`ed model_dir; the ct2 extra)
    model_dir: str | None = None  # engine=ctranslate2: the exported model directory
    ct2_exact: bool = True  # engine=ctranslate2: reproduce PyTorch search exactly; false = faster


@dataclass
class ExportConfig:
    """The `export` command: a checkpoint as a CTranslate2 model directory."""

    checkpoint: str | None = None  # file, or a run directory (its best checkpoint)
    format: str = "ctranslate2"
    quantization: str = "int8"  # int8 | int8_float32 | float32 | float16 ...
    output_dir: str | None = None  # null: <run dir>/ct2-<quantization>
    debug: bool = False


SCHEMAS: dict[str, type] = {"train": TrainConfig, "evaluate": EvaluateConfig, "translate": TranslateConfig,
                            "export": ExportConfig}

CHOICES: dict[str, tuple[str, ...]] = {
    "dataset.name": ("tatoeba", "opus_books"),
    "tokenizer.kind": ("bpe", "wordlevel", "char"),
    "model.activation": ("relu", "gelu"),
    "model.positional": ("sinusoidal", "learned"),
    "device.name": ("auto", "cpu", "cuda", "mps"),
    "device.amp": ("auto", "off", "bf16", "fp16"),
    "training.scheduler": ("noam", "linear", "cosine", "constant"),
    "training.best_metric": ("bleu", "chrf", "loss", "cer", "wer"),
    "split": ("test", "valid"),
    "engine": ("pytorch", "ctranslate2"),
    "format": ("ctranslate2",),
    "quantization": ("int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16",
                     "bfloat16", "float32"),
}


def register_schemas() -> None:
    """Make the schemas available to YAML defaults lists as `<command>_schema`."""
    store = ConfigStore.instance()
    for command, schema in SCHEMAS.items():
        store.store(name=f"{command}_schema", node=schema)


def _unknown_keys(node: Any, schema: type, prefix: str = "") -> list[str]:
    """Keys present in a composed config that the schema does not define (e.g. from `+key=`)."""
    types = typing.get_type_hints(schema)
    found = []
    for key in node:
        if key not in types:
            found.append(f"{prefix}{key}")
        elif dataclasses.is_dataclass(types[key]) and isinstance(node[key], DictConfig):
            found += _unknown_keys(node[key], types[key], f"{prefix}{key}.")
    return found


def to_dataclass(cfg: DictConfig, schema: type) -> Any:
    """Turn a composed config into the typed dataclass tree; unknown keys raise ConfigError."""
    cfg = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]) if "hydra" in cfg else cfg
    unknown = _unknown_keys(cfg, schema)
    if unknown:
        raise ConfigError("; ".join(f"'{k}' is not a known key; check the spelling "
                                    "(`--cfg job` lists every key)" for k in unknown))
    structured = OmegaConf.merge(OmegaConf.structured(schema), cfg)
    return OmegaConf.to_object(structured)


def _problems(obj: Any, prefix: str = "") -> list[str]:
    """Range and choice checks that types cannot express, one message per problem."""
    found: list[str] = []
    for f in dataclasses.fields(obj):
        key = f"{prefix}{f.name}"
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            found += _problems(value, f"{key}.")
        elif key in CHOICES and value not in CHOICES[key]:
            found.append(f"{key}={value!r} is not allowed; choose one of: {', '.join(CHOICES[key])}")
    return found


def _range(found: list[str], key: str, value: Any, ok: bool, allowed: str) -> None:
    if not ok:
        found.append(f"{key}={value!r} is out of range; it must be {allowed}")


def validate(cfg: Any) -> None:
    """Raise ConfigError listing every impossible value in a typed config."""
    found = _problems(cfg)
    if isinstance(cfg, TrainConfig):
        m, t, d, tok = cfg.model, cfg.training, cfg.dataset, cfg.tokenizer
        for name in ("d_model", "n_heads", "d_ff", "encoder_layers", "decoder_layers", "max_positions"):
            _range(found, f"model.{name}", getattr(m, name), getattr(m, name) >= 1, ">= 1")
        if m.n_heads >= 1 and m.d_model % m.n_heads:
            found.append(
                f"model.d_model={m.d_model} is not divisible by model.n_heads={m.n_heads}; "
                f"pick d_model a multiple of n_heads (e.g. {m.n_heads * max(1, m.d_model // m.n_heads)})"
            )
        if m.positional == "sinusoidal" and m.d_model % 2:
            found.append(f"model.d_model={m.d_model} must be even for sinusoidal positions")
        for name in ("dropout", "attention_dropout", "activation_dropout"):
            value = getattr(m, name)
            _range(found, f"model.{name}", value, 0.0 <= value < 1.0, "in [0, 1)")
        if m.tie_embeddings and not tok.joint:
            found.append("model.tie_embeddings=true needs tokenizer.joint=true; set one of them to false")
        _range(found, "training.epochs", t.epochs, t.epochs >= 1, ">= 1")
        _range(found, "training.batch_tokens", t.batch_tokens, t.batch_tokens >= 16, ">= 16")
        _range(found, "training.accumulate", t.accumulate, t.accumulate >= 1, ">= 1")
        _range(found, "training.lr", t.lr, t.lr > 0, "> 0")
        _range(found, "training.warmup_steps", t.warmup_steps, t.warmup_steps >= 0, ">= 0")
        _range(found, "training.label_smoothing", t.label_smoothing,
               0.0 <= t.label_smoothing < 1.0, "in [0, 1)")
        _range(found, "training.clip_grad_norm", t.clip_grad_norm, t.clip_grad_norm >= 0, ">= 0")
        _range(found, "training.log_every", t.log_every, t.log_every >= 1, ">= 1")
        _range(found, "training.valid_max_sentences", t.valid_max_sentences,
               t.valid_max_sentences >= 1, ">= 1")
        _range(found, "training.keep_last", t.keep_last, t.keep_last >= 1, ">= 1")
        _range(found, "training.patience", t.patience, t.patience >= 0, ">= 0")
        _range(found, "training.save_every_steps", t.save_every_steps, t.save_every_steps >= 0, ">= 0")
        _range(found, "training.valid_every_steps", t.valid_every_steps, t.valid_every_steps >= 0, ">= 0")
        _range(found, "training.average_last", t.average_last, 0 <= t.average_last <= t.keep_last,
               f"between 0 and training.keep_last ({t.keep_last}), since only kept checkpoints average")
        _range(found, "training.max_bad_steps", t.max_bad_steps, t.max_bad_steps >= 1, ">= 1")
        if t.max_minutes is not None:
            _range(found, "training.max_minutes", t.max_minutes, t.max_minutes > 0, "> 0 or null")
        if len(t.betas) != 2 or not all(0.0 <= b < 1.0 for b in t.betas):
            found.append(f"training.betas={t.betas} must be two numbers in [0, 1)")
        if d.max_pairs is not None:
            _range(found, "dataset.max_pairs", d.max_pairs, d.max_pairs >= 10, ">= 10 or null")
        _range(found, "dataset.min_len", d.min_len, d.min_len >= 0, ">= 0")
        _range(found, "dataset.max_len", d.max_len, d.max_len >= max(1, d.min_len),
               f">= dataset.min_len ({d.min_len}) and >= 1")
        if d.max_len + 2 > m.max_positions:
            found.append(f"dataset.max_len={d.max_len} needs model.max_positions >= {d.max_len + 2}")
        _range(found, "dataset.valid_size", d.valid_size, d.valid_size >= 1, ">= 1")
        _range(found, "dataset.test_size", d.test_size, d.test_size >= 0, ">= 0")
        if d.src_lang == d.tgt_lang:
            found.append(f"dataset.src_lang and dataset.tgt_lang are both {d.src_lang!r}; pick en/fr")
        minimum = 260 if tok.kind == "bpe" else 5  # 4 specials, plus the 256 bytes for byte-level BPE
        _range(found, "tokenizer.vocab_size", tok.vocab_size, tok.vocab_size >= minimum,
               f">= {minimum} for tokenizer={tok.kind} (4 special tokens"
               f"{' + 256 bytes' if tok.kind == 'bpe' else ' + 1 symbol'})")
        _range(found, "tokenizer.min_frequency", tok.min_frequency, tok.min_frequency >= 1, ">= 1")
    decoding = getattr(cfg, "decoding", None)
    if decoding is not None:
        dc = decoding
        _range(found, "decoding.beam_size", dc.beam_size, dc.beam_size >= 1, ">= 1")
        _range(found, "decoding.n_best", dc.n_best, 1 <= dc.n_best <= dc.beam_size,
               f"between 1 and decoding.beam_size ({dc.beam_size})")
        _range(found, "decoding.max_len_a", dc.max_len_a, dc.max_len_a >= 0, ">= 0")
        _range(found, "decoding.max_len_b", dc.max_len_b, dc.max_len_b >= 1, ">= 1")
        _range(found, "decoding.temperature", dc.temperature, dc.temperature > 0, "> 0")
        _range(found, "decoding.top_k", dc.top_k, dc.top_k >= 0, ">= 0")
        _range(found, "decoding.top_p", dc.top_p, 0 < dc.top_p <= 1, "in (0, 1]")
        _range(found, "decoding.batch_tokens", dc.batch_tokens, dc.batch_tokens >= 1, ">= 1")
    device = getattr(cfg, "device", None)
    if device is not None and device.num_threads is not None:
        _range(found, "device.num_threads", device.num_threads, device.num_threads >= 1, ">= 1 or null")
    if found:
        raise ConfigError("; ".join(found))


def resolve_path(path: str | Path) -> Path:
    """Relative paths in configs are relative to where the command was started."""
    return Path(path).expanduser().resolve()
