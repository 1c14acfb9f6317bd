"""Typed configuration: the sections (dataset, tokenizer, model, ...), what every setting is, and its default.

Hydra composes YAML from `configs/` on top of these dataclasses and the commands' configs made of them
(commands.py; registered in the ConfigStore by `config/resolvers.register`), so a misspelt key or a wrong
type fails during composition, and a YAML file states only what differs from them. Which values a setting
allows is in `checks.py`; `validate` applies those rules and reports every problem at once. A section can
also check itself (`ModelConfig(...).check()`), which is how the model, the tokenizer and the search give
Python callers the same messages as the command line.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from transformer_mt.config.checks import section_problems
from transformer_mt.config.problems import raise_if

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"


class Section:
    """A config section that knows its key (`model`, `decoding`, ...) and can check its own values."""

    KEY: ClassVar[str]

    def problems(self) -> list[str]:
        """Every rule of `rules.py` that this section breaks, one message each."""
        return section_problems(self, f"{self.KEY}.")

    def check(self) -> None:
        """Raise ConfigError listing every problem of this section."""
        raise_if(self.problems())


@dataclass
class VariantsConfig:
    """Input as people type it (data/variants.py): the probability that a training pair shows each
    variant in an epoch. caps, title, lower: both sides, at most one of them a pair; no_punct, typos: the
    source alone; substitute: both sides, of the pairs with a name or number on both; join: the pair is
    shown inside a longer example (data/joining.py)."""

    caps: float = 0.0  # ALL CAPS
    title: float = 0.0  # Title Case
    lower: float = 0.0  # all lowercase
    no_punct: float = 0.0  # the final punctuation left out
    typos: float = 0.0  # some longer words misspelt
    substitute: float = 0.0  # the names and numbers it has on both sides replaced by new ones (Faker's)
    join: float = 0.0  # joined with one or two other pairs of the epoch into one longer example


@dataclass
class MixedCorpus:
    """A corpus mixed into the dataset's training pairs (`dataset.mix`): where its pairs come from (as the
    `dataset.*` keys of the same names), how much of an epoch it makes and the tag its sources carry.
    Lengths, split and cache are the dataset's, and its languages unless it names its own. Its held-out
    parts are the dataset's own, unless it brings a target language of its own: then they are drawn
    from its pairs as the dataset's are (a model of several target languages, data/mixture.py)."""

    name: str = "parallel"  # tatoeba | parallel | hf
    path: str | None = None
    src_path: str | None = None
    tgt_path: str | None = None
    hf_path: str | None = None
    hf_name: str | None = None
    hf_data_files: str | None = None
    max_pairs: int | None = None
    src_lang: str | None = None  # null: the dataset's
    tgt_lang: str | None = None  # null: the dataset's; another: one more target language for the model
    weight: float = 1.0  # an epoch holds its pairs this many times (0.3: a new random 30% each epoch)
    tag: str | None = None  # text put before each of its source sentences, e.g. <bt> (back-translation)
    variants: VariantsConfig | None = None  # null: the dataset's

    def dataset(self, base: DatasetConfig) -> DatasetConfig:
        """The dataset section that reads this corpus: base's languages, lengths and cache, this corpus's
        files, all of its pairs for training (no held-out parts of its own)."""
        location = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        location.update(variants=self.variants or base.variants, src_lang=self.src_lang or base.src_lang,
                        tgt_lang=self.tgt_lang or base.tgt_lang)
        held_out = location["tgt_lang"] != base.tgt_lang  # a target language of its own
        return dataclasses.replace(base, **location, url=None, valid_src_path=None, valid_tgt_path=None,
                                   valid_path=None, test_src_path=None, test_tgt_path=None, test_path=None,
                                   valid_size=base.valid_size if held_out else 0,
                                   test_size=base.test_size if held_out else 0, mix=[])


@dataclass
class DatasetConfig(Section):
    """Where the parallel text comes from, how it is filtered and how it is split."""

    KEY: ClassVar[str] = "dataset"
    name: str = "tatoeba"  # tatoeba | parallel | hf | opus_books (hf with its own defaults)
    # tatoeba: a <lang>-eng.zip (or the .txt in it) of manythings.org, any language with English;
    # parallel: a TSV of source<TAB>target lines (or src_path + tgt_path)
    path: str | None = "data/fra-eng.zip"
    url: str | None = "https://www.manythings.org/anki/fra-eng.zip"  # tatoeba: fetched once if path missing
    src_path: str | None = None  # parallel: one source sentence a line (.gz too) ...
    tgt_path: str | None = None  # ... and its translation on the same line here
    # parallel: held-out pairs of their own (then no split is made), as two files or one TSV each
    valid_src_path: str | None = None
    valid_tgt_path: str | None = None
    valid_path: str | None = None
    test_src_path: str | None = None
    test_tgt_path: str | None = None
    test_path: str | None = None
    # hf: load_dataset(hf_path, hf_name) from the hub, or a directory written by save_to_disk; rows
    # {"translation": {src_lang: ..., tgt_lang: ...}}; its validation/test splits are used when it has them
    hf_path: str | None = None
    hf_name: str | None = None
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
    weight: float = 1.0  # with dataset.mix: how many times an epoch holds this corpus's training pairs
    tag: str | None = None  # text put before each source sentence of this corpus (as MixedCorpus.tag)
    mix: list[MixedCorpus] = field(default_factory=list)  # more corpora for training (data/mixture.py)
    variants: VariantsConfig = field(default_factory=VariantsConfig)  # training pairs as people type them

    def target_languages(self) -> list[str]:
        """The languages the model translates into: the dataset's, then those its mix adds."""
        found = [self.tgt_lang]
        for corpus in self.mix:
            if corpus.tgt_lang and corpus.tgt_lang not in found:
                found.append(corpus.tgt_lang)
        return found


@dataclass
class TokenizerConfig(Section):
    """Subword model trained on the training split only; saved as JSON with the run."""

    KEY: ClassVar[str] = "tokenizer"
    kind: str = "bpe"  # bpe (byte-level) | unigram (SentencePiece-style) | wordlevel | char
    vocab_size: int = 8000
    joint: bool = True  # one vocabulary for both languages (required for tied embeddings)
    min_frequency: int = 2
    lowercase: bool = False
    max_sentences: int = 500_000  # training pairs the tokenizer learns from (a random sample of more)
    # Subword regularisation: each epoch's training pairs are segmented anew (data/segmentation.py).
    dropout: float = 0.0  # bpe: BPE-dropout, each merge skipped with this probability (0.1 is usual)
    alpha: float = 0.0  # unigram: sample segmentations with probability ∝ P^alpha (0.1-0.5 is usual)


@dataclass
class ModelConfig(Section):
    """The Transformer's hyper-parameters; its vocabulary sizes and pad id come from the tokenizer.

    The defaults are the `small` model: 7.6M parameters with a joint 8k vocabulary.
    """

    KEY: ClassVar[str] = "model"
    d_model: int = 256
    n_heads: int = 4
    d_ff: int = 1024
    encoder_layers: int = 3
    decoder_layers: int = 3
    dropout: float = 0.1  # sub-layer outputs and the embeddings+positions sum (the paper's P_drop)
    attention_dropout: float = 0.0  # on attention probabilities
    activation_dropout: float = 0.0  # inside the FFN, after the activation
    activation: str = "relu"  # relu | gelu
    norm_first: bool = False  # False: post-norm as in the paper; True: pre-norm + final LayerNorms
    positional: str = "sinusoidal"  # sinusoidal | learned
    max_positions: int = 512
    tie_embeddings: bool = True  # source/target embeddings and output projection share weights
    tie_output: bool = True  # target embedding and output projection (when not fully tied)
    layer_norm_eps: float = 1e-5


@dataclass
class DeviceConfig(Section):
    """Where tensors live and how many CPU threads torch may use."""

    KEY: ClassVar[str] = "device"
    name: str = "auto"  # auto (cuda, then mps, then cpu) | cpu | cuda | mps
    num_threads: int | None = None  # torch.set_num_threads; null = torch default
    num_interop_threads: int | None = None
    # auto: bf16 on a CPU with native bf16 (AVX512_BF16, AMX) and for training on a GPU with bf16 (else
    # fp16); float32 elsewhere (runtime.precision) | off | bf16 | fp16
    amp: str = "auto"
    # torch.compile the training forward pass (dynamic shapes: token batches vary in both
    # dimensions). Off by default: its compile time is paid at every start, and on the CPUs measured
    # it did not pay it back (docs/performance.md).
    compile: bool = False
    # (compile: with training.pad_to_multiple > 1, the default when compiling on CUDA, each of an epoch's
    # few batch shapes is compiled once, as a static graph: runtime.compiled)
    # The attention kernels CUDA may use, best first (torch.nn.attention.sdpa_kernel): efficient | flash |
    # cudnn | math; [] leaves the choice to PyTorch. cuDNN builds a plan for each new batch shape.
    attention_backends: list[str] = field(default_factory=lambda: ["efficient", "flash"])


@dataclass
class TrainingConfig(Section):
    """The optimisation recipe and the training loop's schedule."""

    KEY: ClassVar[str] = "training"
    epochs: int = 10
    batch_tokens: int = 4096  # padded source or target tokens per batch, whichever is larger
    # Round each batch's lengths up to a multiple of this, and its row count down to one, so that an
    # epoch has tens of batch shapes, not hundreds (torch.compile builds a graph per shape); null: 8 when
    # compiling on CUDA, 1 elsewhere (runtime.pad_to_multiple says why).
    pad_to_multiple: int | None = None
    accumulate: int = 1  # gradient accumulation steps per optimizer step
    lr: float = 1e-3  # peak learning rate
    # noam: inverse sqrt after the linear warm-up. linear | cosine: decay to min_lr over the run, which
    # ends at `epochs` or at `max_minutes`, whichever comes first (so a time budget ends at min_lr);
    # decay_by_time=false: at `epochs` alone, so that the learning rates do not depend on the run's speed.
    scheduler: str = "noam"  # noam | linear | cosine | constant
    decay_by_time: bool = True
    warmup_steps: int = 500  # about one Tatoeba epoch at 4k-token batches
    min_lr: float = 0.0  # floor of the linear and cosine decays
    betas: list[float] = field(default_factory=lambda: [0.9, 0.98])
    eps: float = 1e-9
    weight_decay: float = 0.0
    label_smoothing: float = 0.1
    clip_grad_norm: float = 1.0  # 0 disables clipping
    log_every: int = 50  # steps between TensorBoard scalars
    valid_max_sentences: int = 500  # validation's sample: the first N valid pairs (loss and translations)
    valid_every_steps: int = 0  # also validate (and keep a checkpoint) every N steps; 0 = each epoch only
    best_metric: str = "bleu"  # bleu | chrf | loss | cer | wer
    patience: int = 0  # validations without improvement before stopping; 0 = never stop early
    keep_last: int = 3  # epoch/step checkpoints kept besides best
    average_last: int = 0  # at the end, average the last K checkpoints; kept if valid BLEU does not drop
    ema_decay: float = 0.0  # keep an EMA of the weights (e.g. 0.999), validated and saved; 0 = off
    max_minutes: float | None = None  # wall-clock budget for training
    plan: str = "off"  # auto: fill the keys you leave open for max_minutes on this machine (plan/)
    # plan=auto: a decoder whose beam search is this many times as fast as the planned shape's, its layers
    # moved to the encoder so that training costs about the same (docs/planning.md); 1: the balanced shape
    decode_speedup: float = 1.0
    save_every_steps: int = 0  # mid-epoch checkpoint every N steps; 0 = only at epoch end
    max_bad_steps: int = 5  # consecutive non-finite losses (skipped steps) before the run stops
    min_free_mib: int = 200  # refuse to start when the run directory's disk has less free space
    num_samples: int = 5  # sample translations logged every validation
    # At the end, confidence calibrated on the last N valid pairs (decoding/calibration.py); 0 = not
    calibration_sentences: int = 500
    progress: bool = True  # tqdm progress bar


@dataclass
class CheckpointConfig(Section):
    """Where this run's files go: checkpoint.dir when given, else a new directory under root."""

    KEY: ClassVar[str] = "checkpoint"
    root: str = "saved_weights"
    # The run directory. `train` sets it to Hydra's output directory unless given, which is
    # <root>/<run_name>, or <sweep dir>/<job number> in a multirun (resolvers.run_directory).
    dir: str | None = None
    run_name: str | None = None  # null: <dataset>-<src>-<tgt>-<timestamp>
    overwrite: bool = False  # a fresh run may replace the run in `dir` (its checkpoints and records)


@dataclass
class DistillConfig(Section):
    """Sequence-level knowledge distillation (Kim and Rush, 2016): the run trains on a teacher's beam-search
    translations of its training sources, with the teacher's tokenizer (training/distill.py)."""

    KEY: ClassVar[str] = "distill"
    teacher: str | None = None  # a run directory or checkpoint; several, comma-separated: an ensemble
    beam_size: int = 5  # the teacher's search (its length penalty and limits: the run's decoding.*)
    # Each epoch also holds the original targets at this weight, as dataset.mix weighs a corpus: 0 none,
    # 1 every original pair once beside its distilled one, 0.5 half of them drawn anew each epoch
    original_weight: float = 0.0
    chunk_pairs: int = 4096  # sources translated and saved at a time: a killed run redoes one chunk at most
    # The student starts from the teacher's weights (one teacher, pre-norm; its width and everything but the
    # depths are the teacher's): training/student_init.py
    init_from_teacher: bool = False


@dataclass
class SearchConfig(Section):
    """How hypotheses are searched for: what validation during `train` uses (greedy by default)."""

    KEY: ClassVar[str] = "decoding"
    beam_size: int = 5  # 1 = greedy
    length_penalty: float = 0.6  # GNMT alpha
    max_len_a: float = 1.5  # max output length = a * source length + b
    max_len_b: int = 10
    # Source tokens per decoding batch (beam search divides them by beam_size); null: 6000 on a CPU,
    # 32768 on CUDA (`batch_tokens_on`), where one sentence at a time leaves the GPU idle.
    batch_tokens: int | None = None
    use_cache: bool = True

    def batch_tokens_on(self, device: Any) -> int:
        """decoding.batch_tokens, or its default for the device (a torch.device or its type)."""
        if self.batch_tokens is not None:
            return self.batch_tokens
        return 32768 if getattr(device, "type", device) == "cuda" else 6000


@dataclass
class DecodingConfig(SearchConfig):
    """The search plus what only `evaluate` and `translate` offer: n-best lists and sampling."""

    n_best: int = 1
    prefix: str | None = None  # every translation starts with this text (forced decoding)
    sampling: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    alignment: bool = False  # word alignments `0-0 1-2 ...` (source-target) of each translation, from
    alignment_layer: int = -1  # this decoder layer's cross-attention over heads (-1: last, -2: before)
    # Input in ALL CAPS or all lowercase: `fold` translates it in sentence case and writes the translation
    # in the input's case (a corpus shows the model few such sentences); `model` gives it as typed.
    input_case: str = "fold"
    # Each best translation's confidence and its words' (decoding/confidence.py), from one forced pass more
    confidence: bool = True
    min_confidence: float | None = None  # a translation below this confidence is low (null: none is)
    low_confidence: str = "mark"  # mark: flagged (jsonl, serve) and counted | withhold: its text left out
    # A UTF-8 TSV file `source term<TAB>target term` a line: where a source term occurs, its target term is
    # in the translation (hard constraints of beam and greedy search; docs/decoding.md)
    glossary: str | None = None
    # int8: the model's linear layers with int8 weights and inputs quantized as they come, float32 around
    # them, on the CPU (runtime/quantize.py; docs/decoding.md#int8) | none. Chosen when the engine loads
    quantize: str = "none"
    # Greedy and beam search score only the target tokens seen with the sentence's tokens in training, the
    # most frequent ones and its own (the run's shortlist.json: decoding/shortlist.py, docs/decoding.md)
    shortlist: bool = False


@dataclass
class DocumentConfig(Section):
    """Text as people bring it (documents/): a line or a request's text split into sentences, the spans
    that must come through exactly kept from the model, and documents read and written in their format."""

    KEY: ClassVar[str] = "document"
    split: bool = True  # each line (a request's text) split into sentences, translated in batches
    protect: bool = True  # numbers, prices, times, e-mails, URLs, paths, codes and keep_terms copied exactly
    keep_terms: str | None = None  # a UTF-8 file of do-not-translate terms, one a line
    # A capitalised word no training pair held: copy (kept as written, as a name), model (translated), auto
    # (copy, unless the source language capitalises its nouns: German). Needs the checkpoint's word list
    names: str = "auto"
    format: str = "auto"  # input=FILE: auto (by its extension) | text | markdown | html | srt
    # A sentence with more tokens is cut at clause boundaries and translated in parts; null: the length
    # limit the model was trained with (its run's dataset.max_len)
    max_sentence_tokens: int | None = None


def resolve_path(path: str | Path) -> Path:
    """Relative paths in configs are relative to where the command was started."""
    return Path(path).expanduser().resolve()
