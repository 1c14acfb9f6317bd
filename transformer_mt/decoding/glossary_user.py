"""What an engine does with a glossary: takes one (checked against its vocabulary and positions), and turns
each sentence's entries into the token ids the search writes (`decoding/constraints.py`)."""

from __future__ import annotations

import functools

from transformer_mt.data.tokenizer import Vocabulary
from transformer_mt.decoding.constraints import TermIds, WordEdges, sentence_terms, term_variants
from transformer_mt.decoding.glossary import Entry, Glossary, TermUse
from transformer_mt.errors import DataError


class GlossaryUser:
    """The glossary half of `TextTranslator`: `vocab` and `max_prefix_tokens` are the engine's."""

    vocab: Vocabulary
    max_prefix_tokens: int
    glossary: Glossary | None = None  # decoding.glossary: the terms every translation must hold

    def use_glossary(self, glossary: Glossary | None) -> None:
        """Translate with `glossary` from now on (None: without); a DataError naming the first entry whose
        target term this model cannot write, or not within its positions."""
        for e in glossary.entries if glossary is not None else ():
            ids = self.term_variants(e.target)
            where = f"{glossary.name}: line {e.line}" if e.line else f"{glossary.name}: {e.source!r}"
            if not ids:
                raise DataError(f"{where}: this model's vocabulary cannot write the target term {e.target!r} "
                                "(a word or character it never saw); spell it with words the model knows "
                                "or drop the line")
            if min(map(len, ids)) > self.max_prefix_tokens:
                raise DataError(f"{where}: the target term takes {min(map(len, ids))} tokens; this model "
                                f"writes at most {self.max_prefix_tokens}: shorten it")
        self.glossary = glossary

    def term_variants(self, target: str) -> list[list[int]]:
        """The token ids a target term can take in an output (`constraints.term_variants`), cached."""
        if target not in self._variants:
            self._variants[target] = term_variants(self.vocab, target)
        return self._variants[target]

    @functools.cached_property
    def _variants(self) -> dict[str, list[list[int]]]:
        return {}

    def term_ids(self, terms: list[list[Entry]],
                 forced: list[list[int]] | None) -> tuple[list[list[TermIds]], list[list[TermUse]]]:
        """Each sentence's target terms as the search takes them (`constraints.sentence_terms`: as many as
        the model's positions hold after its prefix), and the entries refused."""
        found = [sentence_terms(entries, self.term_variants,
                                self.max_prefix_tokens - len(forced[i] if forced else []))
                 for i, entries in enumerate(terms)]
        return [ids for ids, _ in found], [uses for _, uses in found]

    @functools.cache  # noqa: B019 - one per engine, which lives as long as its model
    def edges(self) -> WordEdges:
        """Where the vocabulary's tokens stand against words (`WordEdges`), read once."""
        return WordEdges.of(self.vocab)
