"""Word alignments from cross-attention: subword pieces mapped to whole words, `0-0 1-2 ...`.

A word is a run of non-space characters of the text a person sees: the source as given, the translation
as printed (the words of `text.split()`). Each piece belongs to the word its characters fall in (none for
a piece of spaces); on the source the tokenizer's offsets say where a piece is, on the translation the
decoded text of the pieces before it. Every target piece is linked to the source piece it attends to
most (the source's <eos> and space-only pieces left out), so every target word gets at least one link.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import torch
from tokenizers import Tokenizer

from transformer_mt.data.tokenizer import Vocabulary
from transformer_mt.decoding.scoring import forced_attention
from transformer_mt.decoding.search import StopCheck
from transformer_mt.errors import ConfigError
from transformer_mt.model import Ensemble, Transformer

WORD = re.compile(r"\S+")
REPLACEMENT = "\ufffd"  # what decoding shows for a character whose bytes are not all there yet


def _word_of_spans(text: str, spans: Sequence[tuple[int, int]]) -> list[int | None]:
    """The index in `text.split()` of the word each (start, end) character span falls in, or None when
    it covers only spaces; an empty span (part of one character's bytes) takes the word at its start."""
    owner: list[int | None] = [None] * (len(text) + 1)
    for index, match in enumerate(WORD.finditer(text)):
        owner[match.start():match.end()] = [index] * (match.end() - match.start())
    found = []
    for start, end in spans:
        words = [owner[c] for c in range(start, min(max(end, start + 1), len(text))) if owner[c] is not None]
        found.append(words[0] if words else None)
    return found


def source_words(tok: Tokenizer, text: str, n_pieces: int) -> list[int | None]:
    """The word of each of the first n_pieces pieces of `text` (as the encoder saw it: possibly cut)."""
    offsets = tok.encode(text, add_special_tokens=False).offsets[:n_pieces]
    return _word_of_spans(text, offsets)


def target_words(tok: Tokenizer, ids: Sequence[int]) -> list[int | None]:
    """The word of each piece of an output, in the words of its decoded text."""
    if not ids:
        return []
    prefixes = tok.decode_batch([[int(i) for i in ids[:k]] for k in range(1, len(ids) + 1)],
                                skip_special_tokens=True)
    ends = [len(p.rstrip(REPLACEMENT)) for p in prefixes]
    spans = [(0 if k == 0 else ends[k - 1], end) for k, end in enumerate(ends)]
    return _word_of_spans(prefixes[-1], spans)


def word_alignment(attention: torch.Tensor, src_words: Sequence[int | None],
                   tgt_words: Sequence[int | None]) -> list[tuple[int, int]]:
    """(source word, target word) links, sorted, from attention (target pieces + <eos>, source pieces +
    <eos>): each target piece's most attended source piece that belongs to a word."""
    allowed = torch.zeros(attention.size(1), dtype=torch.bool)  # the source's <eos> never a word
    allowed[: len(src_words)] = torch.tensor([w is not None for w in src_words], dtype=torch.bool)
    if not bool(allowed.any()):
        return []
    masked = attention.float().masked_fill(~allowed, float("-inf"))
    best = masked[: len(tgt_words)].argmax(dim=1).tolist()
    links = {(src_words[s], t) for s, t in zip(best, tgt_words, strict=True) if t is not None}
    return sorted(links)  # type: ignore[arg-type]


def pharaoh(links: Sequence[tuple[int, int]]) -> str:
    """Links in the Pharaoh format of fast_align and Moses: `0-0 1-2 ...` (source-target)."""
    return " ".join(f"{s}-{t}" for s, t in links)


def align_outputs(model: Transformer | Ensemble, vocab: Vocabulary, sentences: Sequence[str],
                  ids: Sequence[Sequence[int]], outputs: dict[int, list[list[int]]], lead: int, layer: int,
                  device: torch.device, batch_tokens: int, amp: torch.dtype | None,
                  should_stop: StopCheck | None) -> dict[tuple[int, int], list[tuple[int, int]]]:
    """The word alignment of each output (outputs[i][k]: the k-th of source i's, whatever search wrote it)
    from one forced-decoding pass over them, by (i, k). `ids`: the sources as the model read them, `lead`
    tokens first that are no word (a language token); `layer`: the decoder layer whose cross-attention,
    averaged over heads, links them (ConfigError for one the model lacks). should_stop is asked before
    each batch of the pass."""
    layers = model.config.decoder_layers
    if not -layers <= layer < layers:
        raise ConfigError(f"decoding.alignment_layer={layer} is out of range; this model has {layers} "
                          f"decoder layers ({-layers} to {layers - 1})")
    pairs = [(i, k) for i, outs in outputs.items() for k in range(len(outs))]
    attention = forced_attention(model, [ids[i] for i, _ in pairs], [outputs[i][k] for i, k in pairs], device,
                                 batch_tokens, layer, amp, should_stop)
    found = {}
    for (i, k), weights in zip(pairs, attention, strict=True):
        src = [None] * lead + source_words(vocab.src, sentences[i].strip(), len(ids[i]) - lead)
        found[i, k] = word_alignment(weights, src, target_words(vocab.tgt, outputs[i][k]))
    return found
