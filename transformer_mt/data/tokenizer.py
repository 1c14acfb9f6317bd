"""Subword vocabularies: train, encode, decode and serialise the source/target tokenizers.

Four kinds, all built on HF `tokenizers` with fixed special-token ids (<pad>=0, <bos>=1, <eos>=2,
<unk>=3) and an NFC normaliser (optionally followed by lower-casing):

- `bpe`: byte-level BPE. Every string is representable, so decode(encode(x)) == NFC(x) exactly.
- `wordlevel`: words and punctuation. A space is glued to the following token as "▁" (Metaspace,
  never prepended), other whitespace (tab, no-break spaces) is its own token, so the original
  spacing comes back exactly; decode(encode(x)) == NFC(x) when every token is in the vocabulary
  (out-of-vocabulary tokens become <unk> and are dropped on decoding). A literal "▁" in the input
  decodes as a space.
- `char`: one token per code point (spaces included), same guarantee as `wordlevel`.
- `unigram`: SentencePiece's unigram language model over "▁"-prefixed words (trained by `tokenizers`'
  UnigramTrainer); same guarantee as `wordlevel`, with rare words split into pieces of known characters
  (only characters never seen in training become <unk>).

Special-token strings typed by a user (e.g. "<eos>") are encoded as ordinary text, never as the
special ids, so input text cannot end a sequence early. A model of several target languages has one
more special token per language, `<2fr>`, `<2de>`, ... (ids 4, 5, ...): put before a source, it says
which language to translate into (Johnson et al., 2017); typed, it is text too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from transformer_mt.config import TokenizerConfig
from transformer_mt.config import checks as rules
from transformer_mt.config.dataset_checks import LANGUAGE_CODE
from transformer_mt.errors import ConfigError

SPECIAL_TOKENS: list[str] = list(rules.SPECIAL_TOKENS)
_, BOS, EOS, UNK = SPECIAL_TOKENS  # <pad> is only ever used by its id
PAD_ID, BOS_ID, EOS_ID, UNK_ID = range(len(SPECIAL_TOKENS))
SPACE_MARK = "▁"  # U+2581, how word-initial spaces are shown (and stored, for wordlevel)

_LANGUAGE_TOKEN = re.compile(f"<2({LANGUAGE_CODE.pattern})>")

JOINT_FILE = "tokenizer.json"
SRC_FILE = "tokenizer_src.json"
TGT_FILE = "tokenizer_tgt.json"


def _normalizer(lowercase: bool, spaces_marked: bool = False) -> normalizers.Normalizer:
    """NFC first so that composed and decomposed accents share tokens. spaces_marked (unigram): spaces
    become "▁" and one is prepended here, not by the Metaspace pre-tokenizer, which skips it before a
    leading space (losing that space) and adds one before every isolated piece (inventing spaces)."""
    steps = [normalizers.NFC()]
    if lowercase:
        steps.append(normalizers.Lowercase())
    if spaces_marked:
        steps += [normalizers.Replace(" ", SPACE_MARK), normalizers.Prepend(SPACE_MARK)]
    return normalizers.Sequence(steps)


def _new_tokenizer(kind: str, lowercase: bool) -> Tokenizer:
    """An untrained tokenizer of the given kind with its normaliser, splitter and decoder."""
    if kind == "bpe":
        tok = Tokenizer(models.BPE(unk_token=None))
        # add_prefix_space=False keeps the round trip exact (no invented leading space).
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.decoder = decoders.ByteLevel()
    elif kind == "wordlevel":
        tok = Tokenizer(models.WordLevel(unk_token=UNK))
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            # Whitespace other than " " (tabs, the no-break spaces French puts before "!?:;")
            # becomes its own token so "Cours\u202f!" shares the word "Cours".
            pre_tokenizers.Split(Regex(r"[^\S ]"), behavior="isolated"),
            pre_tokenizers.Metaspace(replacement=SPACE_MARK, prepend_scheme="never", split=True),
            pre_tokenizers.Punctuation(behavior="isolated"),
        ])
        tok.decoder = decoders.Metaspace(replacement=SPACE_MARK, prepend_scheme="never", split=True)
    elif kind == "unigram":  # SentencePiece's model: every word starts with "▁", the first one too
        tok = Tokenizer(models.Unigram())
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(SPACE_MARK, behavior="merged_with_next"),  # words: at most one leading ▁
            # As wordlevel, other whitespace is its own piece; "<" and ">" too, so that no piece can
            # spell a special token ("<eos>" typed by a user stays text: Viterbi would pick the piece).
            pre_tokenizers.Split(Regex(r"[^\S ]|[<>]"), behavior="isolated"),
        ])
        # Drops the first piece's "▁" (the prepended one), then each "▁" is a space again.
        tok.decoder = decoders.Metaspace(replacement=SPACE_MARK, prepend_scheme="always", split=True)
    elif kind == "char":
        tok = Tokenizer(models.WordLevel(unk_token=UNK))
        tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
        tok.decoder = decoders.Fuse()  # concatenate; the default decoder would join with spaces
    else:
        raise ValueError(f"unknown tokenizer kind {kind!r}")
    tok.normalizer = _normalizer(lowercase, spaces_marked=kind == "unigram")
    tok.encode_special_tokens = True
    return tok


MODEL_TYPES = {"bpe": "BPE", "unigram": "Unigram", "wordlevel": "WordLevel", "char": "WordLevel"}
PARTS = ("normalizer", "pre_tokenizer", "post_processor", "decoder")  # what surrounds a kind's model


def built_parts(kind: str) -> list[dict[str, Any]]:
    """The normaliser, splitter, post-processor and decoder this module builds for a kind, as the
    tokenizer's JSON writes them: cased, and lowercased."""
    built = [json.loads(_new_tokenizer(kind, lowercase).to_str()) for lowercase in (False, True)]
    return [{part: spec.get(part) for part in PARTS} for spec in built]


def language_token(lang: str) -> str:
    """The token that asks for a translation into `lang`."""
    return f"<2{lang}>"


def _trainer(cfg: TokenizerConfig, special: list[str]) -> trainers.Trainer:
    """The trainer for cfg.kind; special tokens first so they get ids 0, 1, ..."""
    if cfg.kind == "bpe":
        return trainers.BpeTrainer(
            vocab_size=cfg.vocab_size, min_frequency=cfg.min_frequency, show_progress=False,
            special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        )
    if cfg.kind == "unigram":
        return trainers.UnigramTrainer(vocab_size=cfg.vocab_size, special_tokens=special,
                                       unk_token=UNK, show_progress=False)
    return trainers.WordLevelTrainer(
        vocab_size=cfg.vocab_size, min_frequency=cfg.min_frequency, show_progress=False,
        special_tokens=special,
    )


def _train_one(cfg: TokenizerConfig, texts: Iterable[str], languages: Sequence[str] = ()) -> Tokenizer:
    """Train one tokenizer of cfg.kind on texts, with a token for each target language."""
    tok = _new_tokenizer(cfg.kind, cfg.lowercase)
    special = SPECIAL_TOKENS + [language_token(lang) for lang in languages]
    tok.train_from_iterator(texts, trainer=_trainer(cfg, special))
    # Trained unigram scores print with more digits than they read back with: one trip through JSON
    # makes to_json() a fixed point (checkpoints compare vocabularies by it, e.g. in ensembles).
    tok = _load_str(tok.to_str())
    for want, token in enumerate(special):
        if tok.token_to_id(token) != want:  # a tokenizers change would silently shift every id
            raise RuntimeError(f"special token {token} got id {tok.token_to_id(token)}, not {want}")
    return tok


def _kind_of(tok: Tokenizer) -> str:
    """Recover the kind from a tokenizer's own JSON (so saved files need no side-car)."""
    spec = json.loads(tok.to_str())
    if spec["model"]["type"] in ("BPE", "Unigram"):
        return spec["model"]["type"].lower()
    return "char" if spec["pre_tokenizer"]["type"] == "Split" else "wordlevel"


def _load_str(text: str) -> Tokenizer:
    """Tokenizer.from_str plus the settings its JSON does not keep."""
    tok = Tokenizer.from_str(text)
    tok.encode_special_tokens = True  # not serialised by `tokenizers`
    return tok


@dataclass
class Vocabulary:
    """The source and target tokenizers (the same object when the vocabulary is joint)."""

    src: Tokenizer
    tgt: Tokenizer
    kind: str

    @property
    def joint(self) -> bool:
        """True when both sides share one tokenizer."""
        return self.src is self.tgt

    @property
    def target_languages(self) -> tuple[str, ...]:
        """The languages this vocabulary's source tokens can ask for (none: a model of one target)."""
        added = sorted(self.src.get_added_tokens_decoder().items())
        return tuple(m.group(1) for _, token in added if (m := _LANGUAGE_TOKEN.fullmatch(token.content)))

    def language_id(self, lang: str) -> int:
        """The id of `lang`'s token; ConfigError naming the languages there are if it has none."""
        token_id = self.src.token_to_id(language_token(lang)) if lang in self.target_languages else None
        if token_id is None:
            there = ", ".join(self.target_languages) or "none: this model has one target language"
            raise ConfigError(f"tgt_lang={lang!r}: this model has no {language_token(lang)} token "
                              f"(its target languages: {there})")
        return token_id

    @property
    def src_vocab_size(self) -> int:
        """Number of source ids, special tokens included."""
        return self.src.get_vocab_size()

    @property
    def tgt_vocab_size(self) -> int:
        """Number of target ids, special tokens included."""
        return self.tgt.get_vocab_size()

    def encode_src(self, texts: Sequence[str]) -> list[list[int]]:
        """Source ids of each text, without bos/eos."""
        return _encode(self.src, texts)

    def encode_tgt(self, texts: Sequence[str]) -> list[list[int]]:
        """Target ids of each text, without bos/eos."""
        return _encode(self.tgt, texts)

    def decode_src(self, ids: Sequence[Sequence[int]]) -> list[str]:
        """Source text of each id sequence, special tokens dropped."""
        return _decode(self.src, ids)

    def decode_tgt(self, ids: Sequence[Sequence[int]]) -> list[str]:
        """Target text of each id sequence, special tokens dropped."""
        return _decode(self.tgt, ids)

    def src_tokens(self, text: str, add_eos: bool = False) -> list[str]:
        """Readable source pieces of text (attention heatmaps); add_eos as the encoder sees it."""
        ids = _encode(self.src, [text])[0] + ([EOS_ID] if add_eos else [])
        return self._display(self.src, ids)

    def tgt_tokens_from_ids(self, ids: Sequence[int]) -> list[str]:
        """Readable target pieces of ids; special tokens are shown by name."""
        return self._display(self.tgt, ids)

    def _display(self, tok: Tokenizer, ids: Sequence[int]) -> list[str]:
        """One readable string per id; word-initial spaces shown as "▁"."""
        out = []
        for i in ids:
            piece = tok.id_to_token(int(i))
            if piece is None:
                out.append(UNK)
            elif int(i) < len(SPECIAL_TOKENS) or _LANGUAGE_TOKEN.fullmatch(piece):
                out.append(piece)
            elif self.kind == "unigram":  # already text; the decoder would drop a first piece's "▁"
                out.append(piece)
            else:
                # The decoder turns byte-level pieces into text (a piece holding part of a
                # multi-byte character shows as U+FFFD) and "▁" back into a space.
                out.append(tok.decoder.decode([piece]).replace(" ", SPACE_MARK))
        return out

    def to_json(self) -> dict[str, str]:
        """Plain strings for checkpoints: {"kind", "joint", "src", "tgt"}."""
        return {"kind": self.kind, "joint": "true" if self.joint else "false",
                "src": self.src.to_str(), "tgt": self.tgt.to_str()}

    @classmethod
    def from_tokenizer(cls, tok: Tokenizer) -> Vocabulary:
        """One tokenizer on both sides (a joint vocabulary), its kind read from it."""
        tok.encode_special_tokens = True  # typed special-token text stays text (not serialised)
        return cls(src=tok, tgt=tok, kind=_kind_of(tok))

    @classmethod
    def from_json(cls, d: dict[str, str]) -> Vocabulary:
        """Inverse of to_json."""
        src = _load_str(d["src"])
        tgt = src if d["joint"] == "true" else _load_str(d["tgt"])
        return cls(src=src, tgt=tgt, kind=d["kind"])

    def save(self, directory: str | Path) -> list[Path]:
        """Write tokenizer.json (joint) or tokenizer_src.json + tokenizer_tgt.json; return paths."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        if self.joint:
            files = [(self.src, directory / JOINT_FILE)]
        else:
            files = [(self.src, directory / SRC_FILE), (self.tgt, directory / TGT_FILE)]
        for tok, path in files:
            tok.save(str(path))
        return [path for _, path in files]

    @classmethod
    def load(cls, directory: str | Path) -> Vocabulary:
        """Read what save wrote; ConfigError if the directory holds no tokenizer."""
        directory = Path(directory)
        if (directory / JOINT_FILE).is_file():
            src = tgt = _load_str((directory / JOINT_FILE).read_text(encoding="utf-8"))
        elif (directory / SRC_FILE).is_file() and (directory / TGT_FILE).is_file():
            src = _load_str((directory / SRC_FILE).read_text(encoding="utf-8"))
            tgt = _load_str((directory / TGT_FILE).read_text(encoding="utf-8"))
        else:
            raise ConfigError(f"no {JOINT_FILE} (or {SRC_FILE} + {TGT_FILE}) in {directory}; "
                              "point to the run directory the model was trained in")
        return cls(src=src, tgt=tgt, kind=_kind_of(src))


def _encode(tok: Tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """Batch-encode without special tokens (offsets are not needed, so use the fast path)."""
    encodings = tok.encode_batch_fast(list(texts), add_special_tokens=False)
    return [e.ids for e in encodings]


def _decode(tok: Tokenizer, ids: Sequence[Sequence[int]]) -> list[str]:
    """Batch-decode dropping special tokens."""
    return tok.decode_batch([[int(i) for i in seq] for seq in ids], skip_special_tokens=True)


def train_tokenizers(cfg: TokenizerConfig, src_texts: Sequence[str], tgt_texts: Sequence[str],
                     languages: Sequence[str] = ()) -> Vocabulary:
    """Train the vocabulary on the training split (one tokenizer on both sides when joint); with
    several target `languages`, the source side has a token for each."""
    cfg.check()
    if cfg.joint:
        src = tgt = _train_one(cfg, [*src_texts, *tgt_texts], languages)
    else:
        src, tgt = _train_one(cfg, src_texts, languages), _train_one(cfg, tgt_texts)
    return Vocabulary(src=src, tgt=tgt, kind=cfg.kind)
