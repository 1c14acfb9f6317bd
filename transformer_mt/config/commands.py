"""The commands' configs: what `transformer-mt <command>` takes (the sections of schema.py and the keys of
its own), `SCHEMAS` (a command's name to its config) and `validate`, which applies the rules of checks.py
to a whole command's config."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from transformer_mt.config.checks import section_problems
from transformer_mt.config.problems import raise_if
from transformer_mt.config.schema import (
    CheckpointConfig,
    DatasetConfig,
    DecodingConfig,
    DeviceConfig,
    DistillConfig,
    DocumentConfig,
    ModelConfig,
    SearchConfig,
    Section,
    TokenizerConfig,
    TrainingConfig,
)


@dataclass
class TrainConfig:
    """The `train` command."""

    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    device: DeviceConfig = field(default_factory=DeviceConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    decoding: SearchConfig = field(default_factory=lambda: SearchConfig(beam_size=1))  # validation's
    distill: DistillConfig = field(default_factory=DistillConfig)
    seed: int = 1
    resume: str | None = None  # checkpoint file or directory to continue from
    # fine-tune: a trained checkpoint or run directory whose weights, tokenizer and model a new run starts
    # from (its optimizer, schedule and step count start anew; finetune.py)
    init: str | None = None
    traceback: bool = False  # full tracebacks instead of one-line errors


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
    output_dir: str | None = None  # null: <run dir>/eval
    tgt_lang: str | None = None  # a model of several target languages: which (null: its first)
    robustness: bool = False  # also score the set as people type it: ALL CAPS, lowercase, typos, ...
    documents: bool = False  # also score text as people have it: several sentences a line, spans, names
    document: DocumentConfig = field(default_factory=DocumentConfig)  # how the documents report's texts go
    seed: int = 1  # the robustness and documents reports draw their typos and cases, confidence its bootstrap
    # also fit the checkpoint's confidence on this set (split=valid), written as calibration.json beside it
    calibrate: bool = False
    traceback: bool = False


@dataclass
class EngineConfig:
    """What `translate` and `serve` share: a model to load and how it decodes."""

    checkpoint: str | None = None
    device: DeviceConfig = field(default_factory=DeviceConfig)
    decoding: DecodingConfig = field(default_factory=DecodingConfig)
    document: DocumentConfig = field(default_factory=DocumentConfig)
    max_input_tokens: int | None = None  # null: the model's positional limit
    tgt_lang: str | None = None  # a model of several target languages: which (null: its first)
    seed: int = 1
    traceback: bool = False
    engine: str = "pytorch"  # pytorch | ctranslate2 (an `export`ed model_dir; the ct2 extra)
    model_dir: str | None = None  # engine=ctranslate2: the exported model directory
    ct2_exact: bool = True  # engine=ctranslate2: reproduce PyTorch search exactly; false = faster


@dataclass
class TranslateConfig(EngineConfig):
    """The `translate` command: text from the command line, stdin or a file."""

    text: str | None = None  # one sentence given on the command line
    input: str | None = None  # a file with one sentence a line; null = stdin
    output: str | None = None  # null = stdout
    scores: bool = False  # print the score before each translation
    attention_png: str | None = None  # write a cross-attention heatmap of the first sentence
    input_format: str = "text"  # text: one sentence a line | tsv: source<TAB>prefix (forced start)
    # text: translations a line (`scores` adds their column) | jsonl: one JSON object a line, with the
    # translation's confidence and its words' (decoding.confidence)
    output_format: str = "text"


@dataclass
class ScoreConfig:
    """The `score` command: the model's log-probability of given pairs (each target given its source)."""

    checkpoint: str | None = None  # file, or a run directory (its best checkpoint); a,b: an ensemble
    device: DeviceConfig = field(default_factory=DeviceConfig)
    input: str | None = None  # a TSV of source<TAB>target lines; null (and no src/tgt) = stdin ...
    src: str | None = None  # ... or two files, one sentence a line, aligned
    tgt: str | None = None
    output: str | None = None  # null = stdout
    output_format: str = "tsv"  # tsv: sum<TAB>mean per pair | json: one object a line
    tgt_lang: str | None = None  # a model of several target languages: the targets' (null: its first)
    traceback: bool = False


@dataclass
class BatchingConfig(Section):
    """Cross-request batching of `serve`: one worker decodes the sentences of concurrent requests together."""

    KEY = "batching"
    enabled: bool = True  # false: each request is decoded on its own (for comparison)
    window_ms: float = 5.0  # after the first waiting request, how long the worker gathers more
    max_sentences: int = 64  # sentences per decoding batch
    max_queue: int = 1024  # sentences waiting at most, by cost (serve/batcher.py); beyond, 503 + Retry-After


@dataclass
class LimitsConfig(Section):
    """What one `serve` request and connection may take; beyond it, a 4xx or 503 with a one-line error."""

    KEY = "limits"
    max_texts: int = 64  # texts per request
    max_chars: int = 1000  # characters per text (and per glossary term)
    max_glossary_terms: int = 100  # entries of a request's own glossary
    max_beam_size: int = 16
    timeout_s: float = 60.0  # a request still waiting after this gets 503
    body_timeout_s: float = 10.0  # a body still arriving after this gets 408
    max_header_bytes: int = 16_384  # request line and headers; beyond it, 431
    max_connections: int = 512  # open connections and requests at once; beyond it, 503
    idle_timeout_s: float = 5.0  # a connection without a whole request head for this long is closed
    send_timeout_s: float = 30.0  # a client that takes none of its answer for this long is disconnected
    max_attention_values: int = 1_000_000  # attention values per response, bounded before decoding (413)
    max_response_bytes: int = 16 * 2**20  # an answer's JSON; a larger one is not sent (413)


@dataclass
class ServeConfig(EngineConfig):
    """The `serve` command: an HTTP API and a page in front of one model."""

    host: str = "127.0.0.1"  # 0.0.0.0 opens the server to other machines
    port: int = 8000
    # Host headers answered (DNS rebinding guard): loopback names, plus host= itself; ["*"]: any
    allowed_hosts: list[str] = field(default_factory=lambda: ["127.0.0.1", "localhost", "[::1]"])
    # The key every request but the page and /health must carry (`Authorization: Bearer <key>` or
    # `X-API-Key: <key>`): api_key_file holds it (off the command line, out of `ps`), or api_key itself
    api_key: str | None = None
    api_key_file: str | None = None
    open_without_key: bool = False  # host= beyond loopback without an API key: refused unless true
    batching: BatchingConfig = field(default_factory=BatchingConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)


@dataclass
class ExportConfig:
    """The `export` command: a checkpoint as a model directory of another toolkit."""

    checkpoint: str | None = None  # file, or a run directory (its best checkpoint)
    format: str = "ct2"  # ct2 (CTranslate2) | hf (Hugging Face) | onnx (hf + ONNX) | web (a page; npm)
    quantization: str = "int8"  # format=ct2: int8 | int8_float32 | float32 | float16 ...
    output_dir: str | None = None  # null: <run dir>/ct2-<quantization>, or <run dir>/<format>
    overwrite: bool = False  # replace an existing output_dir (an earlier export only)
    glossary: str | None = None  # format=web: a `source<TAB>target` TSV the page's translations follow
    traceback: bool = False


SCHEMAS: dict[str, type] = {"train": TrainConfig, "evaluate": EvaluateConfig, "translate": TranslateConfig,
                            "export": ExportConfig, "serve": ServeConfig, "score": ScoreConfig}


def validate(cfg: Any, complete: bool = True) -> None:
    """Raise ConfigError listing every impossible value of a command's typed config (and, when complete,
    every missing one: a checkpoint= to evaluate, say)."""
    raise_if(section_problems(cfg, complete=complete))
