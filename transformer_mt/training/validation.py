"""Validation during training: the loss and the BLEU/chrF/CER/WER of decoding one sample, the valid
split's first `training.valid_max_sentences` pairs, and their records (TensorBoard, metrics.jsonl, log
lines). The loss costs about as much per pair as decoding on a CPU: a plan that validates often needs
both to shrink with the sample.

Training validates at each epoch's end and every `training.valid_every_steps`; checkpoint averaging
validates the averaged weights the same way. Decoding goes through `translator.decode_ids`, the one path
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
from transformer_mt.decoding.metrics import Scores, improves, score
from transformer_mt.decoding.search import alignment
from transformer_mt.decoding.translator import decode_ids
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
    """Validates one run's model on its valid split and records the result."""

    def __init__(self, model: Transformer, vocab: Vocabulary, valid: EncodedSplit, cfg: TrainConfig,
                 device: torch.device, amp: torch.dtype | None, records: RunRecords) -> None:
        self.model, self.vocab, self.valid = model, vocab, valid
        self.training, self.records = cfg.training, records
        self.device, self.amp = device, amp
        self.decode_amp = precision(cfg.device, device, training=False).dtype  # as evaluate decodes
        self.decoding = DecodingConfig(**dataclasses.asdict(cfg.decoding))  # n-best 1, no sampling

    def __call__(self, step: int, epoch: int, train_minutes: float, label: str = "") -> Validation:
        """Validate the model as it is now; `label` names a variant (e.g. "averaged"), whose scalars go
        to `valid_<label>/` and which leaves the step's attention image alone."""
        t, valid = self.training, self.valid
        started = time.perf_counter()
        n = min(t.valid_max_sentences, len(valid))
        sample = valid.subset(range(n))  # one sample for the loss and the scores
        loss = validation_loss(self.model, sample, t.batch_tokens, self.device, self.amp)
        hyps = decode_ids(self.model, sample.src_ids, self.decoding, self.device, amp=self.decode_amp)
        texts = self.vocab.decode_tgt([h[0].tokens for h in hyps])
        result = Validation(score(texts, sample.tgt_text), loss)
        tag = f"valid_{label}" if label else "valid"
        if not label:
            self.records.attention(self._attention(), step)
        shown = range(min(t.num_samples, n))
        samples = "\n\n".join(f"    {valid.src_text[i]}\n    → {texts[i]}\n    ({valid.tgt_text[i]})"
                              for i in shown)
        s = result.scores
        record = {"epoch": epoch, "step": step, "valid_loss": loss, "train_minutes": train_minutes,
                  **s.as_dict(), **({"model": label} if label else {})}
        self.records.validation(tag, step, loss, s, samples, record)
        log.info("epoch %d %s: loss %.3f, BLEU %.2f, chrF %.2f, CER %.3f, WER %.3f (%d sentences, %.1fs)",
                 epoch, tag.replace("_", " "), loss, s.bleu, s.chrf, s.cer, s.wer, n,
                 time.perf_counter() - started)
        for i in shown:
            log.info("  %s → %s", valid.src_text[i], texts[i])
        return result

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
        state["best"] = best = {"metric": name, "value": value, "epoch": epoch, "step": step,
                                "averaged": len(paths)}
        ckpt.save_checkpoint(state, run_dir / AVERAGED)
        ckpt.link_checkpoint(run_dir / AVERAGED, run_dir / ckpt.BEST)
        return best

    def _attention(self) -> torch.Tensor:
        """The first validation sentence's greedy cross-attention (output rows × source columns)."""
        greedy = dataclasses.replace(self.decoding, beam_size=1)
        hyp = decode_ids(self.model, [self.valid.src_ids[0]], greedy, self.device, return_attention=True,
                         amp=self.decode_amp)[0][0]
        return alignment(hyp.attention) if hyp.attention is not None else torch.empty(0)
