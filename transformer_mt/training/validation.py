"""Validation during training: the loss and the BLEU/chrF/CER/WER of decoding one sample, the valid
split's first `training.valid_max_sentences` pairs, and their records (TensorBoard, metrics.jsonl, log
lines). The loss costs about as much per pair as decoding on a CPU: a plan that validates often needs
both to shrink with the sample.

Training validates at each epoch's end and every `training.valid_every_steps`; checkpoint averaging
validates the averaged weights the same way. Decoding goes through `decode.decode_ids`, the one path
`evaluate` and `translate` use too, with the run's `decoding` settings (greedy by default).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from transformer_mt.checkpoints import store as ckpt
from transformer_mt.config import DecodingConfig, TrainConfig
from transformer_mt.data import EncodedSplit, TokenBatchSampler
from transformer_mt.data.tokenizer import Vocabulary
from transformer_mt.decoding.decode import decode_ids
from transformer_mt.decoding.metrics import Scores, improves, mean_scores, score
from transformer_mt.decoding.search import alignment
from transformer_mt.model import Transformer
from transformer_mt.runtime.device import autocast, precision
from transformer_mt.training.loss import summed_nll
from transformer_mt.training.records import RunRecords

log = logging.getLogger(__name__)
AVERAGED = "averaged.pt"


@dataclass
class Validation:
    """The scores of one validation and the loss they were measured with."""

    scores: Scores
    loss: float

    def metric(self, name: str) -> float:
        """The value of `training.best_metric` (bleu, chrf, loss, cer or wer)."""
        return self.loss if name == "loss" else float(getattr(self.scores, name))


@torch.no_grad()
def validation_loss(model: Transformer, split: EncodedSplit, batch_tokens: int, device: torch.device,
                    amp: torch.dtype | None) -> float:
    """Mean per-token negative log-likelihood (no label smoothing) with teacher forcing."""
    was_training = model.training
    model.eval()
    total, tokens = 0.0, 0
    for indices in TokenBatchSampler(split.lengths(), batch_tokens, shuffle=False).batches(0):
        batch = split.batch(indices).to(device)
        with autocast(device, amp):
            logits = model(batch.src, batch.tgt_in)
        total += float(summed_nll(logits, batch.tgt_out))
        tokens += batch.n_tgt_tokens
    model.train(was_training)
    return total / max(tokens, 1)


class Validator:
    """Validates one run's model on its valid split, or on each target language's (data/languages.py),
    and records the result: with several, each direction's scores and their mean, which the best
    checkpoint follows."""

    def __init__(self, model: Transformer, vocab: Vocabulary, valid: dict[str, EncodedSplit],
                 cfg: TrainConfig, device: torch.device, amp: torch.dtype | None,
                 records: RunRecords) -> None:
        self.model, self.vocab, self.valid = model, vocab, valid
        self.training, self.records = cfg.training, records
        self.device, self.amp = device, amp
        self.decode_amp = precision(cfg.device, device, training=False).dtype  # as evaluate decodes
        self.decoding = DecodingConfig(**dataclasses.asdict(cfg.decoding))  # n-best 1, no sampling

    def __call__(self, step: int, epoch: int, train_minutes: float, label: str = "") -> Validation:
        """Validate the model as it is now; `label` names a variant (e.g. "averaged"), whose scalars go
        to `valid_<label>/` and which leaves the step's attention image alone."""
        started = time.perf_counter()
        directions = {lang: self._direction(split) for lang, split in self.valid.items()}
        results = [result for result, _ in directions.values()]
        result = results[0] if len(results) == 1 else Validation(
            mean_scores([r.scores for r in results]), sum(r.loss for r in results) / len(results))
        tag = f"valid_{label}" if label else "valid"
        if not label:
            self.records.attention(self._attention(), step)
        each = {f"{metric}_{lang}": getattr(r.scores, metric) for lang, (r, _) in directions.items()
                for metric in ("bleu", "chrf")} if len(directions) > 1 else {}
        s, samples = result.scores, self._samples({lang: texts for lang, (_, texts) in directions.items()})
        record = {"epoch": epoch, "step": step, "valid_loss": result.loss, "train_minutes": train_minutes,
                  **s.as_dict(), **each, **({"model": label} if label else {})}
        shown = "\n\n".join(f"    {source}\n    → {text}\n    ({ref})" for source, text, ref in samples)
        self.records.validation(tag, step, result.loss, s, shown, record)
        if each:
            self.records.scalars(tag, each, step)
        by_direction = "".join(f"; {lang}: BLEU {r.scores.bleu:.2f}, chrF {r.scores.chrf:.2f}"
                               for lang, (r, _) in directions.items()) if each else ""
        log.info("epoch %d %s: loss %.3f, BLEU %.2f, chrF %.2f, CER %.3f, WER %.3f (%d sentences, %.1fs)%s",
                 epoch, tag.replace("_", " "), result.loss, s.bleu, s.chrf, s.cer, s.wer, s.n,
                 time.perf_counter() - started, by_direction)
        for source, text, _ in samples:
            log.info("  %s → %s", source, text)
        return result

    def _samples(self, translations: dict[str, list[str]]) -> list[tuple[str, str, str]]:
        """(source, translation, reference) of the first `training.num_samples` of each direction."""
        return [(split.src_text[i], texts[i], split.tgt_text[i])
                for split, texts in zip(self.valid.values(), translations.values())
                for i in range(min(self.training.num_samples, len(texts)))]

    def _direction(self, valid: EncodedSplit) -> tuple[Validation, list[str]]:
        """The loss and scores of one direction's sample (its first valid_max_sentences pairs), and the
        sample's translations."""
        sample = valid.subset(range(min(self.training.valid_max_sentences, len(valid))))
        loss = validation_loss(self.model, sample, self.training.batch_tokens, self.device, self.amp)
        hyps = decode_ids(self.model, sample.src_ids, self.decoding, self.device, amp=self.decode_amp)
        texts = self.vocab.decode_tgt([h[0].tokens for h in hyps])
        return Validation(score(texts, sample.tgt_text), loss), texts

    def average(self, paths: list[Path], step: int, epoch: int, train_minutes: float,
                metric: str) -> tuple[dict[str, Any], float]:
        """Validate the average of the checkpoints at paths (as "averaged"); the averaged checkpoint and
        its metric. The model gets its own weights back afterwards."""
        state = ckpt.average_checkpoints(paths)
        own = {name: value.clone() for name, value in self.model.state_dict().items()}
        self.model.load_state_dict(state["model"])
        try:
            return state, self(step, epoch, train_minutes, label="averaged").metric(metric)
        finally:
            self.model.load_state_dict(own)

    def keep_average(self, run_dir: Path, k: int, best: dict[str, Any], step: int, epoch: int,
                     train_minutes: float) -> dict[str, Any] | None:
        """Average the last k checkpoints of run_dir and validate the average: kept as best.pt (the new
        best returned) only where it does not lose to the best single checkpoint, else None."""
        paths = ckpt.numbered_checkpoints(run_dir)[-k:]
        if len(paths) < 2:
            log.info("checkpoint averaging skipped: only %d checkpoint(s) to average", len(paths))
            return None
        name, single = self.training.best_metric, best["value"]
        state, value = self.average(paths, step, epoch, train_minutes, name)
        keep = improves(name, value, single, ties=True)
        log.info("average of %s: valid %s %.2f vs best single checkpoint %.2f: %s",
                 ", ".join(p.name for p in paths), name, value, float("nan") if single is None else single,
                 "kept as best.pt" if keep else "discarded")
        self.records.scalars("valid", {f"averaged_{name}_gain": value - (single or 0.0)}, step)
        if not keep:
            return None
        averaged = {"metric": name, "value": value, "epoch": epoch, "step": step, "averaged": len(paths)}
        state["best"] = averaged
        try:  # the run's epochs are saved: a full disk here costs the average, not the run
            ckpt.save_checkpoint(state, run_dir / AVERAGED)
            ckpt.link_checkpoint(run_dir / AVERAGED, run_dir / ckpt.BEST)
        except OSError as ex:
            log.warning("the average of the last checkpoints was not saved (%s); best.pt stays the best "
                        "single checkpoint", ex.strerror or ex)
            return None
        return averaged

    def _attention(self) -> torch.Tensor:
        """The first validation sentence's greedy cross-attention (output rows × source columns)."""
        greedy = dataclasses.replace(self.decoding, beam_size=1)
        first = next(iter(self.valid.values()))
        hyp = decode_ids(self.model, [first.src_ids[0]], greedy, self.device, return_attention=True,
                         amp=self.decode_amp)[0][0]
        return alignment(hyp.attention) if hyp.attention is not None else torch.empty(0)
