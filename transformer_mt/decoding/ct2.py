"""CTranslate2: translate with a model directory `export format=ct2` wrote (interop/ct2_export.py; the
`ct2` extra).

    $ transformer-mt translate engine=ctranslate2 model_dir=saved_weights/<run>/ct2-int8 text="I am cold."

    >>> from transformer_mt.decoding.ct2 import CT2Translator
    >>> CT2Translator.from_dir("saved_weights/<run>/ct2-int8").translate(["I am cold."], beam_size=5)

`CT2Translator` has the `Translator` interface, and with
exact=True (the default) the same 1-best as our PyTorch search in float32: it reuses our length limit
and length penalty (`search.py`). docs/ctranslate2.md explains how each weight is mapped and how the
search is reproduced.
"""

from __future__ import annotations

import json
import logging
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from transformer_mt.config import DecodingConfig
from transformer_mt.config.checks import GLOSSARY_ON_CT2, QUANTIZE_ON_CT2
from transformer_mt.data.tokenizer import BOS_ID, EOS, EOS_ID, PAD_ID, UNK_ID, Vocabulary
from transformer_mt.decoding.confidence import Rater, read_calibration
from transformer_mt.decoding.glossary import Entry, Glossary
from transformer_mt.decoding.search import (
    DecodingStopped,
    StopCheck,
    gnmt_penalty,
    gnmt_slope,
    max_output_length,
)
from transformer_mt.decoding.text_translator import TextTranslator, Translation
from transformer_mt.errors import ConfigError, ExportError
from transformer_mt.runtime.files import META_FILE

log = logging.getLogger(__name__)
_INSTALL = "pip install 'transformer-mt[ct2]'"
VMAP_FILE = "vmap.txt"  # the export's shortlist as CTranslate2 reads it (decoding/shortlist.py::vmap_lines)


def ctranslate2_module() -> Any:
    """The ctranslate2 package, or a ConfigError naming the extra that installs it."""
    try:
        import ctranslate2
    except ImportError as ex:
        raise ConfigError(f"CTranslate2 support needs the ctranslate2 package: {_INSTALL}") from ex
    return ctranslate2


class CT2Translator(TextTranslator):
    """A CTranslate2 model directory with our tokenizer: the `Translator` API on CTranslate2."""

    def __init__(self, translator: Any, vocab: Vocabulary, meta: dict[str, Any],
                 decoding: DecodingConfig | None = None, max_input_tokens: int | None = None,
                 info: dict[str, Any] | None = None, exact: bool = True):
        self.translator = translator
        self.exact = exact
        self.vocab = vocab
        self.meta, self.tgt_lang = meta, meta.get("tgt_lang")
        self.max_positions = int(meta["model_config"]["max_positions"])
        self.decoding = decoding or DecodingConfig()
        self.limit_inputs(self.max_positions, max_input_tokens)
        self.info = info or {}
        self.rater = Rater(None)
        self._src_itos = [vocab.src.id_to_token(i) for i in range(vocab.src_vocab_size)]
        self._tgt_stoi = vocab.tgt.get_vocab(with_added_tokens=True)
        self._banned = [[vocab.tgt.id_to_token(i)] for i in sorted({PAD_ID, BOS_ID} - {EOS_ID})]

    @classmethod
    def from_dir(cls, model_dir: str | Path, device: str = "cpu", compute_type: str = "default",
                 inter_threads: int = 1, intra_threads: int = 0,
                 decoding: DecodingConfig | None = None,
                 max_input_tokens: int | None = None, exact: bool = True) -> CT2Translator:
        """Load an `export_ctranslate2` directory (device: cpu | cuda | auto).

        exact=True reproduces PyTorch search (module notes); exact=False trades that for speed: one
        request for all sentences (larger batches), <pad>/<bos> masked up front, the longest
        sentence's length limit for all, and no re-scoring of hypotheses cut at the limit.
        """
        if decoding is not None and decoding.quantize != "none":
            raise ConfigError(QUANTIZE_ON_CT2)
        ct2 = ctranslate2_module()
        path = Path(model_dir).expanduser()
        if not (path / META_FILE).is_file() or not ct2.contains_model(str(path)):
            raise ExportError(f"{path} is not a CTranslate2 export of transformer-mt (no {META_FILE} or "
                              "model.bin); create one with: transformer-mt export checkpoint=<run>")
        if decoding is not None and decoding.shortlist and not (path / VMAP_FILE).is_file():
            raise ExportError(f"decoding.shortlist=true: {path} has no {VMAP_FILE}; export the run again "
                              "once it has a shortlist.json (scripts/build_shortlist.py), or set "
                              "decoding.shortlist=false")
        meta = json.loads((path / META_FILE).read_text(encoding="utf-8"))
        vocab = Vocabulary.load(path)
        try:
            translator = ct2.Translator(str(path), device=device, compute_type=compute_type,
                                        inter_threads=inter_threads, intra_threads=intra_threads)
        except (RuntimeError, ValueError) as ex:
            raise ExportError(f"CTranslate2 cannot load {path}: {str(ex).strip().splitlines()[0]}") from ex
        info = {"model_dir": str(path), "checkpoint": meta.get("checkpoint"), "epoch": meta.get("epoch"),
                "step": meta.get("step"), "quantization": meta.get("quantization"),
                "compute_type": translator.compute_type, "device": translator.device}
        engine = cls(translator, vocab, meta, decoding, max_input_tokens, info, exact)
        # The export copied the run's calibration only where it was fitted for the exported weights.
        engine.rater = Rater(read_calibration(path), "fit one for the run (transformer-mt evaluate "
                             "checkpoint=<run> split=valid calibrate=true), then export it again")
        return engine

    def max_length(self, n_src: int, decoding: DecodingConfig) -> int:
        """Output tokens allowed (without <eos>) for n_src source tokens, as in PyTorch search."""
        return max(1, max_output_length(n_src + 1, decoding.max_len_a, decoding.max_len_b,
                                        self.max_positions))  # + 1: the source's <eos>

    @staticmethod
    def ct2_length_penalty(alpha: float, n_src: int) -> float:
        """CTranslate2's exponent p (score / L ** p) closest to GNMT ((5 + L) / 6) ** alpha near L.

        Only used to pick which beam_size hypotheses CTranslate2 keeps when more finish in the same
        step (we re-rank them with the exact GNMT penalty): d ln lp / d ln L = alpha * L / (5 + L),
        taken at L = n_src + 1, the usual output length.
        """
        return gnmt_slope(n_src + 1, alpha)

    def _request(self, decoding: DecodingConfig, n_src: int, return_attention: bool,
                 suppress: bool) -> dict[str, Any]:
        """translate_batch options for sources of n_src tokens."""
        beam = 1 if decoding.sampling else decoding.beam_size
        options: dict[str, Any] = dict(
            max_batch_size=max(1, decoding.batch_tokens_on(self.info.get("device", "cpu")) // beam),
            batch_type="tokens",
            beam_size=beam, max_decoding_length=self.max_length(n_src, decoding), min_decoding_length=0,
            max_input_length=0,  # inputs are already cut to the positions the model has
            return_scores=True, return_end_token=True, return_attention=return_attention,
            suppress_sequences=self._banned if suppress else None,
            use_vmap=decoding.shortlist,  # CTranslate2's own: one list for a batch (docs/decoding.md)
        )
        if decoding.sampling:
            options.update(sampling_topk=decoding.top_k, sampling_topp=decoding.top_p,
                           sampling_temperature=decoding.temperature, length_penalty=0.0)
        elif beam == 1:
            options.update(length_penalty=0.0)  # score = sum of log-probs, <eos> included
        else:
            # Stop at beam_size finished hypotheses like ours (length_penalty != 0: no early exit)
            # and return them all; their raw sums are recovered and re-ranked with GNMT below.
            options.update(num_hypotheses=beam, patience=1.0,
                           length_penalty=self.ct2_length_penalty(decoding.length_penalty, n_src))
        return options

    def _search(self, sources: dict[int, list[str]], decoding: DecodingConfig, return_attention: bool,
                suppress: bool) -> dict[int, tuple[Any, float]]:
        """CTranslate2 results by sentence index, with the length-penalty exponent they were scored with.

        One request per source length, so each sentence gets exactly its own max length (and
        exponent); requests run asynchronously on the translator's inter_threads workers.
        """
        groups: dict[int, list[int]] = defaultdict(list)
        for i, src in sources.items():
            groups[len(src) - 1].append(i)  # without the <eos> CTranslate2 appends
        pending = []
        for n_src, members in sorted(groups.items()):
            request = self._request(decoding, n_src, return_attention, suppress)
            found = self.translator.translate_batch([sources[i][:-1] for i in members],
                                                    asynchronous=True, **request)
            pending.append((members, found, request["length_penalty"]))
        return {i: (res.result(), exponent)
                for members, found, exponent in pending for i, res in zip(members, found)}

    def _search_fast(self, sources: dict[int, list[str]], decoding: DecodingConfig,
                     return_attention: bool) -> dict[int, tuple[Any, float]]:
        """exact=False: one request, so CTranslate2 forms the largest batches it can."""
        order = list(sources)
        lengths = sorted(len(sources[i]) - 1 for i in order)
        request = self._request(decoding, lengths[-1], return_attention, suppress=True)
        if not decoding.sampling and decoding.beam_size > 1:  # the exponent at the typical length
            request["length_penalty"] = self.ct2_length_penalty(decoding.length_penalty,
                                                                lengths[len(lengths) // 2])
        found = self.translator.translate_batch([sources[i][:-1] for i in order], **request)
        return {i: (res, request["length_penalty"]) for i, res in zip(order, found)}

    def _hypotheses(self, found: dict[int, Any], sources: dict[int, list[str]],
                    return_attention: bool) -> dict[int, list[list[Any]]]:
        """Each sentence's hypotheses as [tokens, log-prob sum, attention], scored as our search scores
        them: CTranslate2's length penalty undone, and <eos> counted where the length limit ended one."""
        capped: list[tuple[list[str], list[str], list[Any]]] = []  # (source, tokens, hypothesis)
        collected: dict[int, list[list[Any]]] = {}
        for i, (res, exponent) in found.items():
            hyps = []
            for k, tokens in enumerate(res.hypotheses):
                ended = bool(tokens) and tokens[-1] == EOS
                out = tokens[:-1] if ended else list(tokens)
                raw = res.scores[k] * len(tokens) ** exponent  # undo CTranslate2's length penalty
                attn = None
                if return_attention and res.attention:
                    # CTranslate2 leaves out the column of the <eos> it appended itself; each row
                    # is a distribution over the source, so that column is what the others leave.
                    attn = torch.tensor(res.attention[k], dtype=torch.float32)[:, : len(sources[i]) - 1]
                    attn = torch.cat((attn, (1 - attn.sum(1, keepdim=True)).clamp(min=0)), dim=1)
                    attn = attn[None, None]  # CTranslate2 gives one (layer, head) view, see build_spec
                hyp = [out, raw, attn]
                if not ended and self.exact:
                    capped.append((sources[i][:-1], out, hyp))
                hyps.append(hyp)
            collected[i] = hyps
        if capped:
            # At the length limit we force <eos> and count its log-prob; CTranslate2 just stops.
            scored = self.translator.score_batch([c[0] for c in capped], [c[1] for c in capped],
                                                 max_input_length=0)
            for (_, _, hyp), s in zip(capped, scored):
                hyp[1] = float(sum(s.log_probs))
        return collected

    def use_glossary(self, glossary: Glossary | None) -> None:
        if glossary is not None:
            raise ConfigError(GLOSSARY_ON_CT2)

    def search_nbest(self, sentences: list[str], return_attention: bool = False,
                     prefixes: list[str] | None = None, should_stop: StopCheck | None = None,
                     tgt_lang: str | None = None, aligned: int | None = None,
                     terms: list[list[Entry]] | None = None, **options: Any) -> list[list[Translation]]:
        """n-best translations per sentence (best first); empty input gives one empty translation.
        CTranslate2 decodes a batch in one call: should_stop is asked once, before it."""
        decoding = self.decoding_options(**options)
        if terms and any(terms):
            raise ConfigError(GLOSSARY_ON_CT2)
        if self.prefix_ids(sentences, prefixes, decoding):
            raise ConfigError("prefix decoding runs on engine=pytorch; drop decoding.prefix or the prefixes")
        if decoding.alignment:
            raise ConfigError("word alignments run on engine=pytorch; drop decoding.alignment")
        ids = self.encode(sentences, tgt_lang)
        results: list[list[Translation]] = [[Translation("", 0.0)] for _ in sentences]
        # Source tokens as the encoder sees them (for attention widths and re-scoring).
        sources = {i: [self._src_itos[t] for t in ids[i]] + [EOS]
                   for i, s in enumerate(sentences) if s.strip()}
        if not sources:
            return results
        if should_stop is not None and should_stop():
            raise DecodingStopped("decoding stopped before it began: its requester is gone")
        # <pad>/<bos> are impossible in our search. Masking them in CTranslate2 (suppress_sequences)
        # renormalises its log-softmax over the other tokens, which shifts scores and can re-rank
        # beams; so search unmasked first (exactly our scores) and only redo, masked, the sentences
        # where one of them came out.
        if self.exact:
            found = self._search(sources, decoding, return_attention, suppress=False)
            banned = {t[0] for t in self._banned}
            redo = {i: sources[i] for i, (res, _) in found.items()
                    if any(banned.intersection(h) for h in res.hypotheses)}
            if redo:
                found.update(self._search(redo, decoding, return_attention, suppress=True))
        else:
            found = self._search_fast(sources, decoding, return_attention)

        beam = not decoding.sampling and decoding.beam_size > 1
        collected = self._hypotheses(found, sources, return_attention)
        for i, hyps in collected.items():
            if beam:
                for hyp in hyps:  # GNMT penalty, L = tokens + 1 (<eos>), as PyTorch beam search
                    hyp[1] = hyp[1] / gnmt_penalty(len(hyp[0]) + 1, decoding.length_penalty)
                hyps.sort(key=lambda h: h[1], reverse=True)
            best = hyps[: decoding.n_best]
            token_ids = [[self._tgt_stoi.get(t, UNK_ID) for t in h[0]] for h in best]
            texts = self.vocab.decode_tgt(token_ids)
            results[i] = [
                Translation(text, float(h[1]),
                            self.vocab.tgt_tokens_from_ids(tid) if return_attention else None, h[2])
                for text, tid, h in zip(texts, token_ids, best)
            ]
        if decoding.confidence:
            self._rate(results, {i: (sources[i][:-1], hyps[0][0]) for i, hyps in collected.items()})
        return results

    def _rate(self, results: list[list[Translation]], best: dict[int, tuple[list[str], list[str]]]) -> None:
        """Set the confidence of each best translation (results[i][0]) from CTranslate2's scores of its
        tokens (`score_batch`: one teacher-forced pass over (source tokens, best output tokens) by i)."""
        started = time.perf_counter()
        order = list(best)
        scored = self.translator.score_batch([best[i][0] for i in order], [best[i][1] for i in order],
                                             max_input_length=0)
        for i, found in zip(order, scored, strict=True):
            ids = [self._tgt_stoi.get(t, UNK_ID) for t in best[i][1]]
            top = results[i][0]
            log_probs = torch.tensor(found.log_probs, dtype=torch.float32)  # the output's tokens and </s>
            top.confidence, top.word_confidences = self.rater.rate(log_probs, ids, self.vocab.tgt, top.text)
        self.rater.seconds += time.perf_counter() - started
