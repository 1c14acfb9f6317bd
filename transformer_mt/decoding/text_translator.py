"""What every translation engine offers on top of its own search (`TextTranslator`): strings in, strings
out, n-best lists of `Translation`s, the input checks, prefixes, languages, ALL CAPS folding and glossaries.
The engines are the PyTorch `Translator` (decoding/translator.py) and CTranslate2's (decoding/ct2.py).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from transformer_mt.config import DecodingConfig
from transformer_mt.data.text_variants import CASES, one_case, sentence_case
from transformer_mt.data.tokenizer import Vocabulary
from transformer_mt.decoding.confidence import Rater, WordConfidences, recased
from transformer_mt.decoding.glossary import Entry, Glossary, TermUse, sentence_entries
from transformer_mt.decoding.glossary_user import GlossaryUser
from transformer_mt.decoding.search import StopCheck
from transformer_mt.errors import ConfigError

log = logging.getLogger(__name__)


@dataclass
class Translation:
    """One hypothesis: detokenised text, its model score and (on request) cross-attention, word alignment
    and, for the best of each list, its confidence and its words' (decoding/confidence.py)."""

    text: str
    score: float
    tokens: list[str] | None = None
    attention: torch.Tensor | None = None  # (layers, heads, output tokens + eos, source tokens + eos)
    alignment: list[tuple[int, int]] | None = None  # (source word, target word) links, decoding.alignment
    terms: list[TermUse] | None = None  # with a glossary: each of the sentence's terms, how it fared
    confidence: float | None = None  # decoding.confidence: its expected chrF/100 once calibrated
    word_confidences: WordConfidences | None = None  # each word of `text`, with its confidence


@dataclass(frozen=True)
class Unfit:
    """One text or prefix an engine cannot take as it is: `side` ("text" or "prefix") and `index` name it;
    `too_long` tells too many tokens from text that cannot be encoded at all."""

    side: str
    index: int
    too_long: bool
    reason: str


class TextTranslator(GlossaryUser):
    """What every engine offers on top of its own `translate_nbest`: strings in, strings out.

    Subclasses set `vocab`, `decoding` and `tgt_lang`, and call `limit_inputs`. A model of several target
    languages translates into `tgt_lang` unless a call names another (data/languages.py); `tgt_lang` is
    its first language by default, and the one language of any other model, when known.
    """

    vocab: Vocabulary
    decoding: DecodingConfig
    info: dict[str, Any]  # what the engine runs: the checkpoint, its step, the run's config ...
    tgt_lang: str | None = None
    known_words: frozenset[str] | None = None  # the training pairs' words (data/words.py), where known
    rater: Rater = Rater(None)  # scores to confidences: each engine sets its own (its calibration)
    max_input_tokens: int
    max_prefix_tokens: int
    max_positions: int
    truncated: int

    def limit_inputs(self, max_positions: int, max_input_tokens: int | None) -> None:
        """Sources are cut to max_input_tokens, and always to the model's positions less one for their
        <eos>; `truncated` counts the sources cut. A forced prefix fits the positions less one for <bos>."""
        self.max_input_tokens = min(max_input_tokens or max_positions - 1, max_positions - 1)
        self.max_prefix_tokens = max_positions - 1
        self.max_positions = max_positions
        self.truncated = 0

    def unfit_inputs(self, texts: Sequence[str], prefixes: Sequence[str] | None = None,
                     tgt_lang: str | None = None) -> list[Unfit]:
        """Every text or prefix this engine cannot translate as it is, encoded as `translate_nbest` encodes
        it: text that is not valid Unicode (a lone UTF-16 surrogate, which the tokenizer rejects), or more
        tokens than the model has positions for (texts: max_input_tokens, which `encode` would cut them to;
        prefixes: max_prefix_tokens)."""
        found: list[Unfit] = []
        text_limit = self.max_input_tokens - (self.language_id(tgt_lang) is not None)  # its language token
        sides = (("text", [t.strip() for t in texts], self.vocab.encode_src, text_limit),
                 ("prefix", list(prefixes or []), self.vocab.encode_tgt, self.max_prefix_tokens))
        for side, items, encode, limit in sides:
            valid = []
            for i, item in enumerate(items):
                try:
                    item.encode("utf-8")
                    valid.append(i)
                except UnicodeEncodeError as ex:
                    reason = (f"is not valid Unicode (character {ex.start + 1} is a lone surrogate: half a "
                              "UTF-16 pair, or a byte that was not UTF-8)")
                    found.append(Unfit(side, i, False, reason))
            for i, ids in zip(valid, encode([items[i] for i in valid]) if valid else []):
                if len(ids) > limit:
                    reason = f"has {len(ids)} tokens; this model takes at most {limit}"
                    found.append(Unfit(side, i, True, reason))
        return sorted(found, key=lambda u: (u.side != "text", u.index))

    def translate_nbest(self, sentences: list[str], return_attention: bool = False,
                        prefixes: list[str] | None = None, should_stop: StopCheck | None = None,
                        tgt_lang: str | None = None, aligned: int | None = None,
                        terms: Sequence[Sequence[Entry]] | None = None, glossary: Glossary | None = None,
                        **options: Any) -> list[list[Translation]]:
        """n-best translations per sentence (best first); with prefixes, each translation starts with
        its sentence's prefix (decoding.prefix gives one to all); into `tgt_lang` (None: the engine's).
        should_stop, asked as decoding goes (once per step where the engine can), ends it early with
        `DecodingStopped` when it says True. With decoding.alignment, the first `aligned` hypotheses of
        each list (None: all) get word alignments, the others none. With decoding.input_case=fold, a
        sentence in ALL CAPS or all lowercase (and no prefix) is translated in sentence case, and its
        translations written in its case.
        With a glossary (`glossary`, else the engine's), each translation holds the target term of each
        source term its sentence holds (`Glossary.find` on the text as typed), and says how each fared
        (`Translation.terms`); `terms` gives each sentence's entries instead (the documents layer does).
        A deterministic search (no sampling, no prefixes) searches each distinct text once: a file's
        repeated lines, or the ALL CAPS and lowercase forms of one sentence, which fold to one text."""
        decoding = self.decoding_options(**options)
        entries = sentence_entries(sentences, terms, glossary or self.glossary)
        if decoding.sampling and entries and any(entries):
            raise ConfigError("a glossary's terms need beam or greedy search; set decoding.sampling=false")
        fold = decoding.input_case == "fold" and not decoding.prefix
        forced = [bool(prefixes and i < len(prefixes) and prefixes[i]) for i in range(len(sentences))]
        cases = [one_case(s) if fold and not f else None for s, f in zip(sentences, forced)]
        texts = [sentence_case(s) if case else s for s, case in zip(sentences, cases)]
        keys = list(zip(texts, map(tuple, entries))) if entries is not None else texts
        distinct = list(dict.fromkeys(keys)) if prefixes is None and not decoding.sampling else keys
        at = {key: i for i, key in enumerate(distinct)}
        unique = [k[0] for k in distinct] if entries is not None else distinct
        searched = [list(k[1]) for k in distinct] if entries is not None else None
        results = self.search_nbest(unique, return_attention, prefixes, should_stop, tgt_lang, aligned,
                                    terms=searched, **options)
        if distinct is not keys:
            results = [list(results[at[key]]) for key in keys]
        return [[dataclasses.replace(t, text=CASES[case](t.text),
                                     word_confidences=recased(t.word_confidences, CASES[case]))
                 for t in nbest] if case else nbest for nbest, case in zip(results, cases)]

    def search_nbest(self, sentences: list[str], return_attention: bool = False,
                     prefixes: list[str] | None = None, should_stop: StopCheck | None = None,
                     tgt_lang: str | None = None, aligned: int | None = None,
                     terms: list[list[Entry]] | None = None, **options: Any) -> list[list[Translation]]:
        """translate_nbest of the sentences as the model gets them (with each one's glossary entries, or
        None): each engine's own search."""
        raise NotImplementedError

    def prefix_ids(self, sentences: list[str], prefixes: list[str] | None,
                   decoding: DecodingConfig) -> list[list[int]] | None:
        """Target token ids each translation must start with: prefixes[i], else decoding.prefix."""
        if prefixes is not None and len(prefixes) != len(sentences):
            raise ConfigError(f"{len(prefixes)} prefixes for {len(sentences)} sentences; give one each")
        texts = prefixes if prefixes is not None else [decoding.prefix or ""] * len(sentences)
        return self.vocab.encode_tgt(texts) if any(texts) else None

    def decoding_options(self, **overrides: Any) -> DecodingConfig:
        """This engine's decoding settings with the given (non-None) options, validated."""
        given = {k: v for k, v in overrides.items() if v is not None}
        if given.get("quantize", self.decoding.quantize) != self.decoding.quantize:
            raise ConfigError(f"decoding.quantize={given['quantize']}: an engine's precision is chosen when "
                              "it loads (decoding.quantize, Translator.from_checkpoint's decoding=), not per "
                              "call")
        decoding = dataclasses.replace(self.decoding, **given)
        if "beam_size" in given and "n_best" not in given:
            decoding.n_best = min(decoding.n_best, decoding.beam_size)
        decoding.check()
        return decoding

    def language_id(self, tgt_lang: str | None = None) -> int | None:
        """The id of the token that asks for `tgt_lang` (None: the engine's), or None for a model of one
        target language; ConfigError naming the languages there are for one the model lacks."""
        lang = tgt_lang or self.tgt_lang
        if self.vocab.target_languages:
            return self.vocab.language_id(lang or self.vocab.target_languages[0])
        if tgt_lang and self.tgt_lang and tgt_lang != self.tgt_lang:
            raise ConfigError(f"tgt_lang={tgt_lang!r}: this model translates into {self.tgt_lang} only")
        return None

    def encode(self, sentences: list[str], tgt_lang: str | None = None) -> list[list[int]]:
        """Token ids of each source, led by its target language's token in a model of several, cut to
        the model's length limit (counted in `truncated`)."""
        token = self.language_id(tgt_lang)
        lead = [] if token is None else [token]
        limit = self.max_input_tokens - len(lead)
        ids = self.vocab.encode_src([s.strip() for s in sentences])
        for i, seq in enumerate(ids):
            if len(seq) > limit:
                ids[i] = seq[:limit]
                self.truncated += 1
                log.warning("input %d has %d tokens; translating its first %d (the model's limit)",
                            i + 1, len(seq), limit)
        return [lead + seq for seq in ids]

    def translate(self, sentences: str | list[str], beam_size: int | None = None,
                  prefixes: str | list[str] | None = None, tgt_lang: str | None = None,
                  **options: Any) -> str | list[str]:
        """Best translation of one sentence (a string) or of each sentence of a list (with a prefix
        each: a string, or a list), into `tgt_lang` (a model of several target languages). Text alone:
        no confidence is computed (translate_nbest's translations carry it)."""
        single = isinstance(sentences, str)
        batch = [sentences] if single else list(sentences)
        starts = [prefixes] if isinstance(prefixes, str) else prefixes
        options = {"confidence": False, **options}
        best = [nbest[0].text for nbest in self.translate_nbest(batch, beam_size=beam_size, prefixes=starts,
                                                                tgt_lang=tgt_lang, **options)]
        return best[0] if single else best

    def predict(self, sentence: str) -> str:
        """The classic tutorials' one-sentence call."""
        return self.translate(sentence)  # type: ignore[return-value]


def check_default_prefix(engine: TextTranslator) -> None:
    """ConfigError when decoding.prefix, which every translation without a prefix of its own starts with,
    does not fit this engine."""
    if engine.decoding.prefix:
        for unfit in engine.unfit_inputs([], [engine.decoding.prefix]):
            raise ConfigError(f"decoding.prefix {unfit.reason}; shorten it")
