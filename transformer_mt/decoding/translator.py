"""The PyTorch engine, and the Python API on top of it: load a checkpoint once, translate many sentences
(what every engine offers on top of its search, this one included: decoding/text_translator.py).

    >>> from transformer_mt import Translator
    >>> engine = Translator.from_checkpoint("saved_weights/<run>", device="auto")
    >>> engine.predict("He is sleeping.")
    'Il dort.'
    >>> engine.translate(["I am cold.", "Where is the station?"], beam_size=5)
    >>> engine.translate("I am cold.", tgt_lang="de")  # a model of several target languages


Every engine here decodes through `decoding/decode.py::decode_ids`, as validation during training does, so
what a notebook gets is what the CLI prints.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from transformer_mt.checkpoints.store import model_from_checkpoint, word_list
from transformer_mt.config import DecodingConfig, DeviceConfig
from transformer_mt.data.tokenizer import Vocabulary
from transformer_mt.decoding.alignment import align_outputs
from transformer_mt.decoding.confidence import Rater, read_calibration, weights_fingerprint
from transformer_mt.decoding.constraints import terms_used
from transformer_mt.decoding.decode import decode_ids
from transformer_mt.decoding.glossary import Entry
from transformer_mt.decoding.scoring import PairScore, forced_attention, score_pairs
from transformer_mt.decoding.search import StopCheck
from transformer_mt.decoding.shortlist import Shortlist, read_shortlist
from transformer_mt.decoding.text_translator import TextTranslator, Translation
from transformer_mt.errors import ConfigError, DataError
from transformer_mt.model import Ensemble, Transformer
from transformer_mt.runtime.device import Precision, select_device
from transformer_mt.runtime.quantize import decoding_precision, quantized


class Translator(TextTranslator):
    """A trained model with its tokenizer, ready to translate plain text."""

    def __init__(self, model: Transformer, vocab: Vocabulary, device: torch.device,
                 decoding: DecodingConfig | None = None, max_input_tokens: int | None = None,
                 info: dict[str, Any] | None = None, precision: Precision | None = None,
                 tgt_lang: str | None = None):
        self.model = model.to(device).eval()
        self.vocab = vocab
        self.tgt_lang = tgt_lang
        self.device = device
        self.precision = precision or Precision(None, "float32")
        self.decoding = decoding or DecodingConfig()
        self.limit_inputs(model.config.max_positions, max_input_tokens)
        self.info = info or {}
        self.rater = Rater(None)
        self.shortlist: Shortlist | None = None  # the run's, read when decoding.shortlist asks for it

    @classmethod
    def from_checkpoint(cls, path: str | Path, device: str | torch.device = "auto",
                        decoding: DecodingConfig | None = None, max_input_tokens: int | None = None,
                        amp: str = "auto", tgt_lang: str | None = None) -> Translator:
        """Rebuild model and tokenizer from a checkpoint file or run directory (its best checkpoint);
        several, comma-separated, decode as an ensemble. `amp` as device.amp (auto: bf16 on a CPU with
        native bf16); decoding.quantize=int8 decodes with an int8 copy of the model (runtime/quantize.py);
        `tgt_lang` the language to translate into (None: the run's dataset.tgt_lang)."""
        loaded = [model_from_checkpoint(p) for p in str(path).split(",") if p.strip()]
        if not loaded:
            raise ConfigError(f"checkpoint={path} names no checkpoint")
        file, state, model, vocab = loaded[0]
        for other, _, _, other_vocab in loaded[1:]:
            if other_vocab.to_json() != vocab.to_json():
                raise ConfigError(f"{other} and {file} have different vocabularies; an ensemble needs "
                                  "models trained with the same tokenizer")
        target = device if isinstance(device, torch.device) else select_device(DeviceConfig(device))
        info = {"checkpoint": str(file), "epoch": state.get("epoch"), "step": state.get("step"),
                "config": state.get("config", {})}
        if len(loaded) > 1:
            model = Ensemble([m for _, _, m, _ in loaded])
            info["ensemble"] = [str(f) for f, _, _, _ in loaded]
        chosen = decoding_precision(decoding.quantize if decoding else "none", amp, target)
        runs = quantized(model) if chosen.int8 else model  # `model` stays float: its fingerprint below
        engine = cls(runs, vocab, target, decoding, max_input_tokens, info, chosen,
                     info["config"].get("dataset", {}).get("tgt_lang"))
        engine.language_id(tgt_lang)  # a language the model lacks: one line now, not at the first sentence
        engine.tgt_lang = tgt_lang or engine.tgt_lang
        engine.known_words = word_list(state)
        engine.shortlist_for(engine.decoding)  # decoding.shortlist=true without one: one line now
        calibration = None if len(loaded) > 1 else read_calibration(file.parent, weights_fingerprint(model))
        how = f"fit one with: transformer-mt evaluate checkpoint={file} split=valid calibrate=true"
        engine.rater = Rater(calibration, f"{how} (docs/confidence.md)")
        return engine

    def search_nbest(self, sentences: list[str], return_attention: bool = False,
                     prefixes: list[str] | None = None, should_stop: StopCheck | None = None,
                     tgt_lang: str | None = None, aligned: int | None = None,
                     terms: list[list[Entry]] | None = None, **options: Any) -> list[list[Translation]]:
        """n-best translations per sentence (best first); empty input gives one translation: its prefix
        (so every output starts with its prefix), else the empty string."""
        decoding = self.decoding_options(**options)
        ids = self.encode(sentences, tgt_lang)
        forced = self.prefix_ids(sentences, prefixes, decoding)
        hard, refused = self.term_ids(terms, forced) if terms is not None else (None, None)
        real = [i for i, s in enumerate(sentences) if s.strip()]
        results: list[list[Translation]] = [[Translation("", 0.0)] for _ in sentences]
        empty = [i for i, s in enumerate(sentences) if not s.strip() and forced and forced[i]]
        for i, text in zip(empty, self.vocab.decode_tgt([forced[i] for i in empty]) if empty else []):
            results[i] = [Translation(text, 0.0)]
        if not real:
            return results
        hyps = decode_ids(self.model, [ids[i] for i in real], decoding, self.device, amp=self.precision.dtype,
                          prefixes=[forced[i] for i in real] if forced else None, should_stop=should_stop,
                          terms=[hard[i] for i in real] if hard else None,
                          edges=self.edges() if hard else None, shortlist=self.shortlist_for(decoding))
        lost = [k for k, h in enumerate(hyps) if not h]  # no way to write its terms as words in its limit
        if lost:
            again = decode_ids(self.model, [ids[real[k]] for k in lost], decoding, self.device,
                               amp=self.precision.dtype, should_stop=should_stop,
                               shortlist=self.shortlist_for(decoding),
                               prefixes=[forced[real[k]] for k in lost] if forced else None)
            for k, h in zip(lost, again):
                hyps[k] = h
        # Attention of the best hypotheses alone, from a forced pass over them: the search would keep
        # every layer and head for every hypothesis it holds, beams and n-best lists over.
        best = [nbest[0].tokens for nbest in hyps]
        maps = forced_attention(self.model, [ids[i] for i in real], best, self.device,
                                decoding.batch_tokens_on(self.device), None, self.precision.dtype,
                                should_stop) if return_attention else [None] * len(real)
        for i, nbest, best_map in zip(real, hyps, maps):
            texts = self.vocab.decode_tgt([h.tokens for h in nbest])
            results[i] = [
                Translation(text, float(h.score),
                            self.vocab.tgt_tokens_from_ids(h.tokens) if return_attention else None,
                            best_map if k == 0 else None)
                for k, (text, h) in enumerate(zip(texts, nbest))
            ]
        if decoding.confidence:  # the best of each list, from one forced pass over them
            rated = self.rater.rate_forced(self.model, [ids[i] for i in real], best,
                                           [results[i][0].text for i in real], self.vocab.tgt, self.device,
                                           decoding.batch_tokens_on(self.device), self.precision.dtype,
                                           should_stop)
            for i, (confidence, words) in zip(real, rated, strict=True):
                results[i][0].confidence, results[i][0].word_confidences = confidence, words
        if decoding.alignment:
            outputs = {i: [h.tokens for h in nbest][:aligned] for i, nbest in zip(real, hyps)}
            lead = int(self.language_id(tgt_lang) is not None)
            for i, nbest in enumerate(results):  # an empty source's translation (its prefix): no links
                for t in nbest[:len(outputs.get(i, nbest))]:
                    t.alignment = []
            layer, budget = decoding.alignment_layer, decoding.batch_tokens_on(self.device)
            found = align_outputs(self.model, self.vocab, sentences, ids, outputs, lead, layer, self.device,
                                  budget, self.precision.dtype, should_stop)
            for (i, k), links in found.items():
                results[i][k].alignment = links
        for i, nbest in enumerate(results if terms is not None else []):
            for t in nbest:
                t.terms = terms_used(terms[i], refused[i], t.text)  # type: ignore[index]
        return results

    def shortlist_for(self, decoding: DecodingConfig) -> Shortlist | None:
        """The shortlist the search uses: the run's (its first model's, in an ensemble) where
        decoding.shortlist asks for one, read once; None where it does not."""
        if not decoding.shortlist:
            return None
        if self.shortlist is None:
            if "checkpoint" not in self.info:
                raise ConfigError("decoding.shortlist=true needs the engine loaded from a run "
                                  "(Translator.from_checkpoint), whose shortlist.json it reads")
            self.shortlist = read_shortlist(Path(self.info["checkpoint"]).parent, self.vocab)
        return self.shortlist

    def score(self, sources: list[str], targets: list[str], batch_tokens: int | None = None,
              tgt_lang: str | None = None) -> list[PairScore]:
        """The model's log-probability of each target given its source (teacher forcing, as in training;
        tokens: the target's pieces and its <eos>), the targets in `tgt_lang` (a model of several);
        DataError naming the first pair too long for the model (1-based)."""
        if len(sources) != len(targets):
            raise ConfigError(f"{len(sources)} sources but {len(targets)} targets; give one target each")
        token = self.language_id(tgt_lang)
        src_ids = [([] if token is None else [token]) + ids
                   for ids in self.vocab.encode_src([s.strip() for s in sources])]
        tgt_ids = self.vocab.encode_tgt([t.strip() for t in targets])
        limit = self.model.config.max_positions - 1  # the encoder's <eos>, the decoder's <bos>
        for number, (s, t) in enumerate(zip(src_ids, tgt_ids), start=1):
            if max(len(s), len(t)) > limit:
                side, n = ("source", len(s)) if len(s) > limit else ("target", len(t))
                raise DataError(f"pair {number}: the {side} has {n} tokens; this model scores at most "
                                f"{limit}")
        budget = batch_tokens or self.decoding.batch_tokens_on(self.device)
        return score_pairs(self.model, src_ids, tgt_ids, self.device, budget, self.precision.dtype)
