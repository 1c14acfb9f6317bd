"""The `train` job: from a typed config to checkpoints, in one readable loop.

setup (data, tokenizer, model, optimiser, schedule, logging) → for each epoch: train on shuffled token
batches, validate (loss, BLEU, chrF, CER, WER), checkpoint. Every checkpoint records the position
inside the epoch and all random state, so `resume=` continues exactly where the run stopped.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from tqdm import tqdm

from transformer_mt import checkpoint as ckpt
from transformer_mt import distributed, sweep
from transformer_mt.config import ConfigError, TrainConfig, TrainingConfig
from transformer_mt.data import EncodedSplit, PreparedData, TokenBatchSampler, collate, prepare_data
from transformer_mt.metrics import HIGHER_IS_BETTER, Scores, score
from transformer_mt.model import Transformer, TransformerConfig
from transformer_mt.predict import decode_ids
from transformer_mt.runtime import (
    amp_dtype,
    autocast,
    configure_threads,
    rng_state,
    seed_everything,
    select_device,
    set_rng_state,
)
from transformer_mt.tokenizer import PAD_ID, Vocabulary

log = logging.getLogger(__name__)
AVERAGED = "averaged.pt"


def lr_lambda(training: TrainingConfig, total_steps: int,
              time_used: Callable[[], float] = lambda: 0.0) -> Callable[[int], float]:
    """Learning-rate multiplier per optimizer step: linear warm-up, then the chosen decay.

    The linear and cosine decays reach `min_lr` when the run ends: after `total_steps`, or when
    `time_used()` (the fraction of `max_minutes` spent) reaches 1, whichever comes first. A run on a
    time budget thus cools down properly instead of being cut off at a high learning rate.
    """
    warmup = training.warmup_steps

    def factor(step: int) -> float:
        step += 1
        if warmup and step < warmup:
            return step / warmup
        if training.scheduler == "noam":  # inverse square root, equal to 1 at the end of warm-up
            return math.sqrt(max(warmup, 1) / step)
        if training.scheduler in ("linear", "cosine"):
            by_steps = (step - warmup) / max(1, total_steps - warmup)
            progress = min(1.0, max(by_steps, time_used()))
            cosine = 0.5 * (1 + math.cos(math.pi * progress))
            shape = 1 - progress if training.scheduler == "linear" else cosine
            floor = training.min_lr / training.lr
            return floor + (1 - floor) * shape
        return 1.0

    return factor


def build_model(cfg: TrainConfig, vocab: Vocabulary) -> Transformer:
    """The model's dimensions come from the config; vocabulary sizes and pad id from the tokenizer."""
    model_cfg = TransformerConfig(src_vocab_size=vocab.src_vocab_size,
                                  tgt_vocab_size=vocab.tgt_vocab_size, pad_id=PAD_ID,
                                  **dataclasses.asdict(cfg.model))
    return Transformer(model_cfg)


class TrainingError(RuntimeError):
    """Training cannot go on (diverged, out of memory); the message says what to change."""


def check_writable(run_dir: Path, min_free_mib: int) -> None:
    """Fail before hours of training, not at the first checkpoint: the directory must take files."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / ".write_test"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as ex:
        raise ConfigError(f"cannot write to {run_dir} ({ex.strerror}); set checkpoint.dir= or "
                          "checkpoint.root= to a writable place") from ex
    free_mib = shutil.disk_usage(run_dir).free / 2**20
    if free_mib < min_free_mib:
        raise ConfigError(f"only {free_mib:.0f} MiB free at {run_dir}; free space or lower "
                          f"training.min_free_mib={min_free_mib}")


class _Interrupt:
    """First SIGINT/SIGTERM: finish the step and save; a second one stops at once."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _Interrupt:
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread (e.g. some launchers): no graceful stop
                pass
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        log.warning("interrupt received: saving a checkpoint after this step (again to quit now)")

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


class Trainer:
    """Owns the model, optimiser, schedule and data of one run, and the loop that trains them."""

    def __init__(self, cfg: TrainConfig, run_dir: Path, overrides: list[str] | None = None):
        self.cfg = cfg
        self.run_dir = run_dir
        self.overrides = overrides or []
        self.world = distributed.current()
        self.started = time.perf_counter()
        if self.world.is_main:
            check_writable(run_dir, cfg.training.min_free_mib)
        configure_threads(cfg.device)
        self.device = distributed.rank_device(select_device(cfg.device), self.world)
        self.amp = amp_dtype(cfg.device, self.device)
        seed_everything(cfg.seed)

        resume_state = self._load_resume_state()
        vocab = Vocabulary.from_json(resume_state["tokenizer"]) if resume_state else None
        self.data: PreparedData = self._prepare_data(vocab)
        self.vocab = self.data.vocab
        self.model = build_model(cfg, self.vocab).to(self.device)
        t = cfg.training
        fused = self.device.type == "cuda"
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=t.lr, betas=tuple(t.betas),
                                           eps=t.eps, weight_decay=t.weight_decay, fused=fused or None)
        self.sampler = TokenBatchSampler(self.data.train.lengths(), t.batch_tokens, shuffle=True,
                                         seed=cfg.seed)
        steps_per_epoch = math.ceil(self.sampler.num_batches(self.world.size) / t.accumulate)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_lambda(t, steps_per_epoch * t.epochs, self._budget_used))
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.amp == torch.float16)

        self.epoch = 0  # the epoch in progress (0-based)
        self.batch_in_epoch = 0  # micro-batches of it already done
        self.step = 0  # optimizer steps
        self.best: dict[str, Any] = {"metric": t.best_metric, "value": None, "epoch": None}
        self.bad_epochs = 0
        self.bad_steps = 0  # consecutive non-finite losses
        self.interrupted = False  # stopped by SIGINT/SIGTERM (after saving)
        self.train_seconds = 0.0  # training, validation and checkpointing, over all sessions of the run
        self._last_tick = time.perf_counter()
        if resume_state:
            self._restore(resume_state)
        forward = self.model
        if cfg.device.compile:  # one graph with dynamic shapes serves every token batch
            forward = torch.compile(self.model, dynamic=True)
        self.parallel = distributed.wrap(forward, self.world, self.device)  # what training calls
        self.session_tokens, self.session_start_seconds = 0, self.train_seconds  # for result.json

        from torch.utils.tensorboard import SummaryWriter  # slow import, only for training

        purge = self.step + 1 if self.step else None  # a resumed run redoes the steps after its checkpoint
        self.writer = (SummaryWriter(str(run_dir / "tensorboard"), purge_step=purge)
                       if self.world.is_main else None)
        log.info("run directory: %s", run_dir)
        log.info("device %s%s, %d threads%s; model %.2fM parameters; %s", self.device,
                 f" (amp {self.amp})" if self.amp else "", torch.get_num_threads(),
                 f", {self.world.size} processes (DDP)" if self.world.distributed else "",
                 self.model.num_parameters() / 1e6, self.data.summary())

    def _prepare_data(self, vocab: Vocabulary | None) -> PreparedData:
        """Rank 0 trains the tokenizer and writes the split; the other ranks then encode with its tokenizer.

        Sharing the tokenizer's JSON rather than a file keeps ranks on other machines in step without
        a shared disk, and only rank 0 writes into the run directory.
        """
        cfg = self.cfg
        if self.world.is_main:
            data = prepare_data(cfg.dataset, cfg.tokenizer, self.run_dir, vocab=vocab)
            distributed.from_main(data.vocab.to_json(), self.world)
            return data
        tokenizer = distributed.from_main("", self.world)
        return prepare_data(cfg.dataset, cfg.tokenizer, None, vocab=Vocabulary.from_json(tokenizer))

    # -- resume ---------------------------------------------------------------------------------
    def _load_resume_state(self) -> dict[str, Any] | None:
        if not self.cfg.resume:
            return None
        path, state = ckpt.load_latest_good(self.cfg.resume)
        log.info("resuming from %s", path)
        return state

    def _restore(self, state: dict[str, Any]) -> None:
        expected = dataclasses.asdict(self.model.config)
        if state["model_config"] != expected:
            diff = [f"model.{k}: checkpoint {state['model_config'].get(k)!r} vs config {v!r}"
                    for k, v in expected.items() if state["model_config"].get(k) != v]
            raise ckpt.CheckpointError("cannot resume: the checkpoint's model differs from the config "
                                       f"({'; '.join(diff)}); drop those overrides")
        if "optimizer" not in state:
            raise ckpt.CheckpointError("cannot resume from an averaged (inference-only) checkpoint; "
                                       "resume from the run directory or its latest.pt")
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        saved_world = state.get("world_size", 1)  # checkpoints from before DDP: one process
        if state["batch_in_epoch"] and saved_world != self.world.size:
            raise ckpt.CheckpointError(
                f"cannot resume mid-epoch with {self.world.size} processes: the checkpoint was written by "
                f"{saved_world}, which dealt the epoch's batches differently; resume with {saved_world} "
                "processes, or from an epoch checkpoint (epoch_NNN.pt)")
        self.epoch, self.batch_in_epoch, self.step = state["epoch"], state["batch_in_epoch"], state["step"]
        self.best, self.bad_epochs = state["best"], state["bad_epochs"]
        self.train_seconds = state["train_seconds"]
        set_rng_state(state["rng"])
        log.info("resumed at epoch %d, batch %d, step %d, lr %.3g", self.epoch + 1,
                 self.batch_in_epoch, self.step, self.scheduler.get_last_lr()[0])

    # -- the loop -------------------------------------------------------------------------------
    def fit(self) -> float:
        """Train until the epochs, the time budget or the patience run out; return the best metric."""
        t = self.cfg.training
        self._log_config_once()
        self._last_tick = time.perf_counter()
        stop_reason = ""
        with _Interrupt() as interrupt:
            while self.epoch < t.epochs and not stop_reason:
                stop_reason = self._train_epoch(interrupt)
                if interrupt.requested:
                    self.interrupted = True
                    self._save(tag="interrupt")
                    log.warning("stopped; continue with: transformer-mt train resume=%s", self.run_dir)
                    return self._best_value()
                if not self._validated_at_step:
                    stop_reason = self._validate_and_save() or stop_reason
        if stop_reason:
            log.info("stopping: %s", stop_reason)
        if t.average_last >= 2 and self.world.is_main:
            self._average_last(t.average_last)
        self._report()
        log.info("best %s %.2f at epoch %s, step %s; checkpoints in %s", t.best_metric,
                 self._best_value(), self.best["epoch"], self.best.get("step"), self.run_dir)
        return self._best_value()

    def _tick(self) -> None:
        """Add the time since the last tick to the run's clock (the budget counts all of it)."""
        now = time.perf_counter()
        self.train_seconds += now - self._last_tick
        self._last_tick = now

    def _validate_on_main(self) -> bool:
        """Rank 0 validates as the others wait; then every rank knows the best so far (for patience)."""
        improved = False
        if self.world.is_main:
            improved = self._update_best(*self.validate())
        improved, self.best, self.bad_epochs = distributed.from_main(
            (improved, self.best, self.bad_epochs), self.world)
        return improved

    def _report(self) -> None:
        """result.json and the TensorBoard HParams entry: what sweeps compare runs by."""
        tokens, = distributed.all_sum([self.session_tokens], self.world)
        if not self.world.is_main:
            return
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hydra_cfg = HydraConfig.get() if HydraConfig.initialized() else None
        job = hydra_cfg.job.num if hydra_cfg is not None and hydra_cfg.mode == RunMode.MULTIRUN else None
        seconds = self.train_seconds - self.session_start_seconds
        scores = sweep.best_scores(self.run_dir)
        best = self.run_dir / ckpt.BEST
        sweep.write_result(self.run_dir, {
            "job": job, "overrides": self.overrides, "best_metric": self.best["metric"],
            "best_value": self._best_value(), "best_epoch": self.best["epoch"],
            "higher_is_better": HIGHER_IS_BETTER[self.best["metric"]],
            "best_bleu": scores["bleu"], "best_chrf": scores["chrf"], "best_valid_loss": scores["valid_loss"],
            "epochs": self.epoch, "steps": self.step, "world_size": self.world.size,
            "wall_seconds": time.perf_counter() - self.started, "train_seconds": self.train_seconds,
            "tgt_tokens_per_s": tokens / seconds if seconds > 0 else math.nan,
            "checkpoint": str((best if best.exists() else self.run_dir / ckpt.LATEST).resolve())})
        sweep.log_hparams(self.writer, sweep.hparams(self.cfg, self.overrides, self.world.size), scores,
                          self.step)
        self.writer.close()

    def _budget_used(self) -> float:
        """The fraction of `max_minutes` spent (0 without a budget): drives budget-aware decays."""
        budget = self.cfg.training.max_minutes
        return 0.0 if budget is None else self.train_seconds / (budget * 60)

    def _validate_and_save(self) -> str:
        """Validate, update best, keep a checkpoint (epoch_NNN.pt at the end of an epoch, else
        step_NNNNNNN.pt); a reason to stop, or '' to go on."""
        t = self.cfg.training
        improved = self._validate_on_main()
        end_of_epoch = self.batch_in_epoch == self._epoch_batches
        if end_of_epoch:
            self.epoch += 1
            self.batch_in_epoch = 0
        self._tick()
        self.train_seconds = distributed.from_main(self.train_seconds, self.world)  # same stop everywhere
        # Decide before saving, on the clock the checkpoint records: a run resumed from it then
        # makes the same decision (writing the checkpoint still counts towards the budget).
        stop = ""
        if t.patience and self.bad_epochs >= t.patience:
            stop = f"no improvement in {t.patience} validations"
        elif self._budget_used() >= 1:
            stop = f"time budget of {t.max_minutes} minutes reached"
        self._save(tag="epoch" if end_of_epoch else "step", improved=improved)
        self._tick()
        return stop

    def _train_epoch(self, interrupt: _Interrupt) -> str:
        """One pass over the shuffled batches (from where a resumed run left off).

        Returns a reason to stop early ('' if none). `_validated_at_step` tells whether the last
        step was already validated and saved (by `valid_every_steps`), so the caller need not repeat it.
        """
        t = self.cfg.training
        batches = self.sampler.batches(self.epoch, self.world.rank, self.world.size)
        self._epoch_batches = len(batches)
        train = self.data.train
        # Each optimizer step's loss is normalised by the target tokens of its whole batch: all its
        # micro-batches on all ranks. Accumulating or adding processes then changes no gradient.
        every_rank = self.sampler.batches(self.epoch)[:len(batches) * self.world.size]
        step_tokens = distributed.step_tokens(every_rank, train.tgt_lens, t.accumulate * self.world.size)
        self.model.train()
        self._validated_at_step = False
        window_tokens, window_start, window_loss, window_batches = 0, time.perf_counter(), 0.0, 0
        bar = tqdm(total=len(batches), initial=self.batch_in_epoch, desc=f"epoch {self.epoch + 1}",
                   disable=not t.progress or not self.world.is_main, dynamic_ncols=True, leave=False)
        for index in range(self.batch_in_epoch, len(batches)):
            batch = collate(*train.select(batches[index]), PAD_ID).to(self.device)
            ends_step = (index + 1) % t.accumulate == 0 or index + 1 == len(batches)
            distributed.set_grad_sync(self.parallel, ends_step)  # DDP: all-reduce once per step
            try:
                loss = self._loss(batch)
                # Under DDP every rank must run backward; a non-finite loss then shows in the gradient.
                if not torch.isfinite(loss) and not self.world.distributed:
                    self._skip_bad_step(loss, index)
                    self.batch_in_epoch = index + 1
                    continue
                weight = batch.n_tgt_tokens * self.world.size / step_tokens[index // t.accumulate]
                self.scaler.scale(loss * weight).backward()  # DDP then averages over the ranks
            except torch.OutOfMemoryError as ex:
                self.optimizer.zero_grad(set_to_none=True)
                raise TrainingError(
                    f"out of memory on a batch of {batch.src.numel() + batch.tgt_in.numel()} padded "
                    f"tokens ({tuple(batch.src.shape)} source, {tuple(batch.tgt_in.shape)} target); "
                    f"lower training.batch_tokens={t.batch_tokens} (use training.accumulate to keep "
                    f"the effective batch) and resume=... from the last checkpoint") from ex
            self.bad_steps = 0
            self.batch_in_epoch = index + 1
            self._validated_at_step = False
            window_tokens += batch.n_tgt_tokens
            self.session_tokens += batch.n_tgt_tokens
            window_loss += loss.item()
            window_batches += 1
            if self.batch_in_epoch % t.accumulate and self.batch_in_epoch < len(batches):
                continue
            self._tick()
            if self.world.distributed:  # ranks agree on the clock (it sets the lr) and on stopping
                flag, self.train_seconds = distributed.all_max(
                    [float(interrupt.requested), self.train_seconds], self.world)
                interrupt.requested = flag > 0
            grad_norm = self._optimizer_step()
            bar.update(self.batch_in_epoch - bar.n)
            if self.step % t.log_every == 0 or self.batch_in_epoch == len(batches):
                elapsed = time.perf_counter() - window_start
                window_loss, window_batches, window_tokens = distributed.all_sum(
                    [window_loss, window_batches, window_tokens], self.world)
                self._log_train(window_loss / window_batches, grad_norm, window_tokens / elapsed)
                bar.set_postfix(loss=f"{window_loss / window_batches:.3f}",
                                lr=f"{self.scheduler.get_last_lr()[0]:.2e}",
                                tok_s=f"{window_tokens / elapsed:.0f}")
                if not t.progress:
                    log.info("epoch %d step %d (batch %d/%d): loss %.3f, lr %.2e, %.0f tgt tok/s",
                             self.epoch + 1, self.step, self.batch_in_epoch, len(batches),
                             window_loss / window_batches, self.scheduler.get_last_lr()[0],
                             window_tokens / elapsed)
                window_tokens, window_start, window_loss, window_batches = 0, time.perf_counter(), 0.0, 0
            elif window_batches >= t.accumulate:
                bar.set_postfix(loss=f"{loss.item():.3f}", refresh=False)
            stop_reason = ""
            if t.valid_every_steps and self.step % t.valid_every_steps == 0:
                if self.batch_in_epoch == len(batches):  # the epoch's own validation follows
                    break
                stop_reason = self._validate_and_save()
                self._validated_at_step = True
                self.model.train()
            elif t.save_every_steps and self.step % t.save_every_steps == 0:
                self._save(tag="latest")
            if interrupt.requested:
                break
            # (a validation just now has already decided on the budget, on its checkpoint's clock)
            if stop_reason or (not self._validated_at_step and self._budget_used() >= 1):
                bar.close()
                return stop_reason or f"time budget of {t.max_minutes} minutes reached"
        bar.close()
        return ""

    def _skip_bad_step(self, value: torch.Tensor, index: int, what: str = "loss") -> None:
        """A non-finite loss or gradient changes nothing; too many in a row means divergence."""
        self.optimizer.zero_grad(set_to_none=True)
        self.bad_steps += 1
        limit = self.cfg.training.max_bad_steps
        log.warning("non-finite %s (%s) at batch %d of epoch %d: step skipped (%d/%d in a row)",
                    what, value.item(), index + 1, self.epoch + 1, self.bad_steps, limit)
        if self.bad_steps >= limit:
            raise TrainingError(f"{limit} non-finite values in a row: the run diverged; the last good "
                                f"checkpoint in {self.run_dir} is intact. Lower training.lr="
                                f"{self.cfg.training.lr} or raise training.warmup_steps, then resume")

    def _loss(self, batch: Any) -> torch.Tensor:
        """Label-smoothed cross-entropy per target token, padding ignored."""
        with autocast(self.device, self.amp):
            logits = self.parallel(batch.src, batch.tgt_in)  # (B, T, V)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), batch.tgt_out.flatten(),
                               ignore_index=PAD_ID, label_smoothing=self.cfg.training.label_smoothing,
                               reduction="sum")
        return loss / batch.n_tgt_tokens

    def _optimizer_step(self) -> float:
        clip = self.cfg.training.clip_grad_norm
        self.scaler.unscale_(self.optimizer)
        params = [p for p in self.model.parameters() if p.grad is not None]
        if clip > 0:
            grad_norm = float(torch.nn.utils.clip_grad_norm_(params, clip))
        else:
            grad_norm = float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params])))
        if not math.isfinite(grad_norm) and not self.scaler.is_enabled():
            # fp16's GradScaler skips such steps itself; elsewhere one would poison every weight.
            self._skip_bad_step(torch.tensor(grad_norm), self.batch_in_epoch - 1, what="gradient")
            return grad_norm
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        self.step += 1
        return grad_norm

    # -- validation -----------------------------------------------------------------------------
    @torch.no_grad()
    def validation_loss(self, split: EncodedSplit) -> float:
        """Mean per-token negative log-likelihood (no label smoothing) with teacher forcing."""
        self.model.eval()
        total, tokens = 0.0, 0
        sampler = TokenBatchSampler(split.lengths(), self.cfg.training.batch_tokens, shuffle=False,
                                    seed=0)
        for indices in sampler.batches(0):
            batch = collate(*split.select(indices), PAD_ID).to(self.device)
            with autocast(self.device, self.amp):
                logits = self.model(batch.src, batch.tgt_in)
            total += float(F.cross_entropy(logits.flatten(0, 1).float(), batch.tgt_out.flatten(),
                                           ignore_index=PAD_ID, reduction="sum"))
            tokens += batch.n_tgt_tokens
        self.model.train()
        return total / max(tokens, 1)

    def validate(self, label: str = "") -> tuple[Scores, float]:
        """Loss on the whole valid split; BLEU/chrF/CER/WER on its first `valid_max_sentences`.

        `label` names a variant of the model (e.g. "averaged"); its scalars go to `valid_<label>/`.
        """
        t = self.cfg.training
        started = time.perf_counter()
        valid = self.data.valid
        valid_loss = self.validation_loss(valid)
        n = min(t.valid_max_sentences, len(valid))
        decoding = dataclasses.replace(self.cfg.decoding, beam_size=t.valid_beam_size, n_best=1,
                                       sampling=False)
        hyps = decode_ids(self.model, valid.src_ids[:n], decoding, self.device)
        texts = self.vocab.decode_tgt([h[0].tokens for h in hyps])
        scores = score(texts, valid.tgt_text[:n])
        step = self.step
        w = self.writer
        tag = f"valid_{label}" if label else "valid"
        w.add_scalar(f"{tag}/loss", valid_loss, step)
        w.add_scalar(f"{tag}/ppl", math.exp(min(valid_loss, 50)), step)
        for name in ("bleu", "chrf", "cer", "wer"):
            w.add_scalar(f"{tag}/{name}", getattr(scores, name), step)
        samples = "\n\n".join(f"    {valid.src_text[i]}\n    → {texts[i]}\n    ({valid.tgt_text[i]})"
                              for i in range(min(t.num_samples, n)))
        w.add_text(f"{tag}/samples", samples, step)
        if not label:  # a variant's attention image would overwrite the checkpoint's own at this step
            self._log_attention(valid.src_ids[0], step)
        w.flush()
        log.info("epoch %d %s: loss %.3f, BLEU %.2f, chrF %.2f, CER %.3f, WER %.3f (%d sentences, "
                 "%.1fs)", self.epoch + 1, tag.replace("_", " "), valid_loss, scores.bleu, scores.chrf,
                 scores.cer, scores.wer, n, time.perf_counter() - started)
        for i in range(min(t.num_samples, n)):
            log.info("  %s → %s", valid.src_text[i], texts[i])
        record = {"epoch": self.epoch + 1, "step": self.step, "valid_loss": valid_loss,
                  "train_minutes": self.train_seconds / 60, **scores.as_dict(),
                  **({"model": label} if label else {})}
        with (self.run_dir / "metrics.jsonl").open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        return scores, valid_loss

    def _log_attention(self, src_ids: Any, step: int) -> None:
        """The first validation sentence's cross-attention (output rows × source columns) as an image."""
        decoding = dataclasses.replace(self.cfg.decoding, beam_size=1, n_best=1, sampling=False)
        hyp = decode_ids(self.model, [src_ids], decoding, self.device, return_attention=True)[0][0]
        if hyp.attention is None or hyp.attention.numel() == 0:
            return
        image = hyp.attention.float().cpu()
        image = image / image.amax(dim=1, keepdim=True).clamp_min(1e-9)  # each row to [0, 1]
        scale = max(1, 256 // max(image.shape))
        image = image.repeat_interleave(scale, 0).repeat_interleave(scale, 1)
        self.writer.add_image("valid/cross_attention", image, step, dataformats="HW")

    def _update_best(self, scores: Scores, valid_loss: float) -> bool:
        name = self.cfg.training.best_metric
        value = valid_loss if name == "loss" else getattr(scores, name)
        if not math.isfinite(value):  # a diverged model is never the best
            self.bad_epochs += 1
            return False
        best = self.best["value"]
        better = best is None or (value > best if HIGHER_IS_BETTER[name] else value < best)
        if better:
            self.best = {"metric": name, "value": value, "epoch": self.epoch + 1, "step": self.step}
            self.bad_epochs = 0
        else:
            self.bad_epochs += 1
        return better

    def _average_last(self, k: int) -> None:
        """Average the last k checkpoints; keep the result as best.pt only if validation agrees."""
        paths = ckpt.numbered_checkpoints(self.run_dir)[-k:]
        if len(paths) < 2:
            log.info("checkpoint averaging skipped: only %d checkpoint(s) to average", len(paths))
            return
        state = ckpt.average_checkpoints(paths)
        last_weights = {k: v.clone() for k, v in self.model.state_dict().items()}
        self.model.load_state_dict(state["model"])
        scores, valid_loss = self.validate(label="averaged")
        name = self.cfg.training.best_metric
        value = valid_loss if name == "loss" else getattr(scores, name)
        best = self.best["value"]
        better = best is None or (value >= best if HIGHER_IS_BETTER[name] else value <= best)
        log.info("average of %s: valid %s %.2f vs best single checkpoint %.2f: %s",
                 ", ".join(p.name for p in paths), name, value, self._best_value(),
                 "kept as best.pt" if better else "discarded")
        self.writer.add_scalar(f"valid/averaged_{name}_gain", value - (best or 0.0), self.step)
        if better:
            state["best"] = self.best = {"metric": name, "value": value, "epoch": self.epoch,
                                         "step": self.step, "averaged": len(paths)}
            ckpt.save_checkpoint(state, self.run_dir / AVERAGED)
            ckpt.link_checkpoint(self.run_dir / AVERAGED, self.run_dir / ckpt.BEST)
        self.model.load_state_dict(last_weights)

    def _best_value(self) -> float:
        return float("nan") if self.best["value"] is None else float(self.best["value"])

    # -- checkpoints and logs -------------------------------------------------------------------
    def _save(self, tag: str, improved: bool = False) -> None:
        if not self.world.is_main:
            return
        state = {
            "model_config": dataclasses.asdict(self.model.config),
            "config": OmegaConf.to_container(OmegaConf.structured(self.cfg), resolve=True),
            "overrides": self.overrides,
            "tokenizer": self.vocab.to_json(),
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "epoch": self.epoch,
            "batch_in_epoch": self.batch_in_epoch,
            "step": self.step,
            "best": self.best,
            "bad_epochs": self.bad_epochs,
            "train_seconds": self.train_seconds,
            "world_size": self.world.size,
            "rng": rng_state(),
        }
        if tag in ("epoch", "step"):  # numbered: kept (keep_last of them) and averaged at the end
            name = f"epoch_{self.epoch:03d}.pt" if tag == "epoch" else f"step_{self.step:07d}.pt"
            path = self.run_dir / name
            ckpt.save_checkpoint(state, path)
            ckpt.link_checkpoint(path, self.run_dir / ckpt.LATEST)
            ckpt.prune_checkpoints(self.run_dir, self.cfg.training.keep_last)
        else:
            path = self.run_dir / ckpt.LATEST
            ckpt.save_checkpoint(state, path)
        if improved:
            ckpt.link_checkpoint(path, self.run_dir / ckpt.BEST)
        log.info("saved %s (%s, epoch %d, step %d)%s", path.name, tag, self.epoch, self.step,
                 " — new best" if improved else "")

    def _log_train(self, loss: float, grad_norm: float, tokens_per_s: float) -> None:
        w = self.writer
        if w is None:  # not rank 0
            return
        w.add_scalar("train/loss", loss, self.step)
        w.add_scalar("train/lr", self.scheduler.get_last_lr()[0], self.step)
        w.add_scalar("train/grad_norm", grad_norm, self.step)
        w.add_scalar("train/tgt_tokens_per_s", tokens_per_s, self.step)

    def _log_config_once(self) -> None:
        if self.step == 0 and self.writer is not None:
            text = OmegaConf.to_yaml(OmegaConf.structured(self.cfg))
            self.writer.add_text("config", f"```\n{text}\n```", 0)


def run_directory(cfg: TrainConfig) -> Path:
    """Hydra's output directory for this run (it already follows checkpoint.dir and resume)."""
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        return Path(HydraConfig.get().runtime.output_dir)
    if cfg.checkpoint.dir is None:
        raise ConfigError("checkpoint.dir must be set when training outside the CLI")
    return Path(cfg.checkpoint.dir)


def train(cfg: TrainConfig) -> float:
    """Entry point of `transformer-mt train`: the best validation metric, for sweepers."""
    from hydra.core.hydra_config import HydraConfig

    overrides = list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []
    trainer = Trainer(cfg, run_directory(cfg), overrides)
    best = trainer.fit()
    if trainer.interrupted and HydraConfig.initialized():
        from hydra.types import RunMode

        if HydraConfig.get().mode == RunMode.MULTIRUN:  # Ctrl-C stops the sweep, not just this job
            log.warning("sweep interrupted: the remaining jobs were not started")
            raise SystemExit(130)
    return best
