"""The Trainer: from a typed config to checkpoints, in one readable loop.

`Trainer.__init__` sets up the run (device, data and tokenizer, model, optimizer, schedule, records);
`fit` trains epoch after epoch (`train_epoch`, one optimizer step at a time), validates and keeps a
checkpoint at each epoch's end (and every `valid_every_steps`), until `should_stop` gives a reason. A
checkpoint records the position in the epoch and all random state, so `resume=` continues exactly where
the run stopped; `init=` starts a new run from another's weights (finetune.py).
A step never waits for the device: what it tells the loop stays there until read (tally.py).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf
from tqdm import tqdm

from transformer_mt import checkpoint as ckpt
from transformer_mt import distributed, ema, finetune, loss, plan
from transformer_mt.config import TrainConfig
from transformer_mt.data import Batch
from transformer_mt.data.epochs import TrainingEpochs
from transformer_mt.data.segmentation import build as subword_sampler
from transformer_mt.errors import TrainingError
from transformer_mt.metrics import improves
from transformer_mt.optim import build_optimizer, build_scheduler, clip_gradients, step_unless
from transformer_mt.records import RunRecords, Window, hparams
from transformer_mt.runtime import (
    Interrupt,
    TrainingClock,
    autocast,
    check_writable,
    compiled,
    configure_threads,
    pad_to_multiple,
    precision,
    rng_state,
    seed_everything,
    select_device,
    set_rng_state,
)
from transformer_mt.tally import StepTally
from transformer_mt.tokenizer import Vocabulary
from transformer_mt.validation import Validator

log = logging.getLogger(__name__)
INTERRUPTED = "interrupted"
RESIZED = "resized"  # the plan's batch changed: the epoch goes on in batches of the new size


class Trainer:
    """Owns the model, optimizer, schedule and data of one run, and the loop that trains them."""

    def __init__(self, cfg: TrainConfig, run_dir: Path, overrides: Sequence[str] = (), job: int | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        """`overrides` and `job` (its number in a sweep) go into checkpoints and result.json; `resume` goes
        on from the newest good checkpoint, `init` from a parent's weights; `clock` reads seconds."""
        self.cfg, self.run_dir, self.overrides, self.job = cfg, run_dir, list(overrides), job
        t = cfg.training
        self.world, self.started = distributed.current(), time.perf_counter()
        if self.world.is_main:
            check_writable(run_dir, t.min_free_mib)
        configure_threads(cfg.device)
        self.device = distributed.rank_device(select_device(cfg.device), self.world)
        self.precision = precision(cfg.device, self.device)
        self.amp = self.precision.dtype
        seed_everything(cfg.seed)
        state = parent = None
        self.parent: str | None = None  # the checkpoint a fine-tuning run started from (result.json)
        if cfg.resume:
            path, state = ckpt.load_latest_good(cfg.resume)
            log.info("resuming from %s", path)
            self.parent = state.get("parent")  # (None in checkpoints older than fine-tuning)
        elif cfg.init:  # fine-tuning: the parent's tokenizer, model and weights; the rest starts anew
            path, parent = finetune.read_parent(cfg)
            self.parent = str(path.resolve())
        vocab = Vocabulary.from_json((state or parent)["tokenizer"]) if state or parent else None
        self.data = distributed.prepare_data(cfg.dataset, cfg.tokenizer, run_dir, vocab, self.world)
        self.vocab = self.data.vocab
        cfg, self.plan = plan.settle(cfg, state, self.data, self.device, overrides, self.world)  # plan=auto
        self.cfg, t = cfg, cfg.training
        self.model = ckpt.build_model(cfg.model, self.vocab, resumed=state).to(self.device)
        self.optimizer = build_optimizer(self.model, t, self.device)
        self.ema = ema.build(self.model, t.ema_decay)  # then validated, saved and translated with
        subwords = subword_sampler(self.vocab, cfg.tokenizer, cfg.seed, cfg.dataset.max_len)
        pad = pad_to_multiple(t.pad_to_multiple, self.device, cfg.device.compile)
        self.epochs = TrainingEpochs(self.data.train, t.batch_tokens, cfg.seed, subwords, pad,
                                     self.data.mixture)
        self.clock = TrainingClock(t.max_minutes, plan.seconds(self.plan), clock)  # before the schedule
        self.calibration = plan.batch_check(self.plan, cfg, self.data, pad, self.world.size, overrides)
        # This rank's batches per epoch: epoch 0's even when resuming (re-segmented or re-drawn epochs differ)
        self.epoch_batches = self.epochs(0)[1].num_batches(self.world.size)
        self.epochs = plan.epochs_of(self.plan, self.epochs, self.world.size)  # a resized epoch's rest
        steps = math.ceil(self.epoch_batches / t.accumulate) * t.epochs
        self.scheduler = build_scheduler(self.optimizer, t, steps, plan.decay_clock(self.plan, self.clock))
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.amp == torch.float16)

        # The epoch in progress (0-based), its micro-batches already done, and the optimizer steps
        self.epoch = self.batch_in_epoch = self.step = 0
        self.best: dict[str, Any] = {"metric": t.best_metric, "value": None, "epoch": None}
        self.bad_epochs = 0  # validations without improvement (patience)
        self.tally = StepTally(self.device)
        self.window = Window()  # the loss and speed since the last progress line
        self.interrupt = Interrupt()
        self.validated_at_step = False  # the last step was validated and saved already
        if state:
            self._restore(state)
        elif parent:
            finetune.start_from(parent, self.model, self.ema)
        forward = compiled(self.model, self.epochs.pad_to_multiple) if cfg.device.compile else self.model
        self.parallel = distributed.wrap(forward, self.world, self.device)  # what training calls
        self.session_tokens, self.session_start_seconds = 0, self.clock.seconds  # for result.json
        # A resumed run redoes the steps after its checkpoint: their old events are purged.
        self.records = RunRecords(run_dir, self.world.is_main, self.step + 1 if self.step else None)
        self.validate = Validator(ema.validated(self.ema, self.model), self.vocab, self.data.valid, cfg,
                                  self.device, self.amp, self.records)
        log.info("run directory: %s", run_dir)
        log.info("device %s (%s), %d threads%s; model %.2fM parameters; %s", self.device,
                 self.precision, torch.get_num_threads(),
                 f", {self.world.size} processes (DDP)" if self.world.distributed else "",
                 self.model.num_parameters() / 1e6, self.data.summary_line())

    def _restore(self, state: dict[str, Any]) -> None:
        """Continue from a checkpoint: weights, optimizer, schedule, scaler, position, clock and RNG."""
        ckpt.restore_training(state, self.model, self.world.size, self.ema, optimizer=self.optimizer,
                              scheduler=self.scheduler, scaler=self.scaler)
        self.epoch, self.batch_in_epoch, self.step = state["epoch"], state["batch_in_epoch"], state["step"]
        self.best, self.bad_epochs = state["best"], state["bad_epochs"]
        if self.best["metric"] != self.cfg.training.best_metric:  # another metric: its best starts anew
            log.warning("training.best_metric is now %s (was %s): best.pt follows it from here on",
                        self.cfg.training.best_metric, self.best["metric"])
            self.best = {"metric": self.cfg.training.best_metric, "value": None, "epoch": None}
            self.bad_epochs = 0
        self.validated_at_step = state["validated"]
        self.clock.seconds = state["train_seconds"]
        set_rng_state(state["rng"])
        log.info("resumed at epoch %d, batch %d, step %d, lr %.3g", self.epoch + 1,
                 self.batch_in_epoch, self.step, self.scheduler.get_last_lr()[0])

    # -- the loop ---------------------------------------------------------------------------------
    def fit(self) -> float:
        """Train until `should_stop` gives a reason; return the best validation metric."""
        t = self.cfg.training
        if self.step == 0:
            self.records.text("config", f"```\n{OmegaConf.to_yaml(OmegaConf.structured(self.cfg))}\n```", 0)
        self.clock.start()
        with self.interrupt:
            reason = self.should_stop()
            if reason and reason != INTERRUPTED and not self.validated_at_step:  # resumed past the budget:
                reason = self._validate_and_save() or reason  # validate where the run would have
            while not reason:
                reason = self.train_epoch()
                if reason not in (INTERRUPTED, RESIZED) and not self.validated_at_step:  # an end, or a stop
                    reason = self._validate_and_save() or reason
                reason = "" if reason == RESIZED else reason
        if reason == INTERRUPTED:
            self._save(tag="interrupt")
            log.warning("stopped; continue with: transformer-mt train resume=%s", self.run_dir)
            return self._best_value()
        log.info("stopping: %s", reason)
        if t.average_last >= 2 and self.world.is_main:  # kept as best.pt if validation agrees
            epoch = self.epoch + (1 if self.batch_in_epoch else 0)
            self.best = self.validate.keep_average(self.run_dir, t.average_last, self.best, self.step, epoch,
                                                   self.clock.seconds / 60) or self.best
        self._report()
        log.info("best %s %.2f at epoch %s, step %s; checkpoints in %s", t.best_metric, self._best_value(),
                 self.best["epoch"], self.best.get("step"), self.run_dir)
        return self._best_value()

    def should_stop(self) -> str:
        """Why training must stop now ('' to go on): the same answer on every rank, and for a run
        resumed from the checkpoint written at this point (the clock has not moved since)."""
        t = self.cfg.training
        if self.interrupt.requested:
            return INTERRUPTED
        if t.patience and self.bad_epochs >= t.patience:
            return f"no improvement in {t.patience} validations"
        if self.clock.used() >= 1:
            return f"time budget of {t.max_minutes} minutes reached"
        if self.epoch >= t.epochs:
            return f"training.epochs={t.epochs} reached"
        return ""

    def train_epoch(self) -> str:
        """One pass over the epoch's batches (from where a run left off); a reason to stop, '' at its end."""
        t = self.cfg.training
        train, sampler = self.epochs(self.epoch)
        batches = sampler.batches(self.epoch, self.world.rank, self.world.size)
        self.epoch_batches = len(batches)
        # The loss of an optimizer step is normalised by the target tokens of the whole step: all its
        # micro-batches on all ranks (loss.py). Every rank computes the same totals.
        every_rank = sampler.batches(self.epoch)[:len(batches) * self.world.size]
        step_tokens = loss.step_tokens(every_rank, train.tgt_lens, t.accumulate * self.world.size)
        self.model.train()
        self.validated_at_step = False
        self.window = Window()
        bar = tqdm(total=len(batches), initial=self.batch_in_epoch, desc=f"epoch {self.epoch + 1}",
                   disable=not t.progress or not self.world.is_main, dynamic_ncols=True, leave=False)
        with bar:
            for index in range(self.batch_in_epoch, len(batches)):
                batch = self.epochs.batch(train, batches[index]).to(self.device)
                ends_step = (index + 1) % t.accumulate == 0 or index + 1 == len(batches)
                self.train_step(batch, step_tokens[index // t.accumulate], ends_step)
                self.batch_in_epoch = index + 1
                self.validated_at_step = False
                self.window.tokens += batch.n_tgt_tokens
                self.session_tokens += batch.n_tgt_tokens
                if not ends_step:
                    continue
                self.optimizer_step()
                bar.update(self.batch_in_epoch - bar.n)
                if self.step % t.log_every == 0 or self.batch_in_epoch == len(batches):
                    self._log_progress(bar)
                reason = self._after_step()
                if reason:
                    return reason
        return ""

    def train_step(self, batch: Batch, step_tokens: int, ends_step: bool) -> None:
        """Forward and backward of one micro-batch; its loss goes to the tally (a non-finite one: skip)."""
        distributed.set_grad_sync(self.parallel, ends_step)  # DDP: all-reduce once per optimizer step
        try:
            with autocast(self.device, self.amp):
                logits = self.parallel(batch.src, batch.tgt_in)  # (B, T, V)
            summed = loss.summed_nll(logits, batch.tgt_out, self.cfg.training.label_smoothing)
            mean = summed / batch.n_tgt_tokens
            # Under DDP a non-finite loss shows in every rank's all-reduced gradient: all ranks skip.
            self.tally.add_loss(mean, skips_step=not self.world.distributed)
            weight = batch.n_tgt_tokens * self.world.size / step_tokens  # DDP then averages over ranks
            self.scaler.scale(mean * weight).backward()
        except torch.OutOfMemoryError as ex:
            self.optimizer.zero_grad(set_to_none=True)
            raise TrainingError(
                f"out of memory on a batch of {batch.src.numel() + batch.tgt_in.numel()} padded tokens "
                f"({tuple(batch.src.shape)} source, {tuple(batch.tgt_in.shape)} target); lower training."
                f"batch_tokens={self.cfg.training.batch_tokens} (training.accumulate keeps the effective "
                "batch) and resume=... from the last checkpoint") from ex

    def optimizer_step(self) -> None:
        """Clip, step, schedule; ranks first agree on the clock and on an interrupt. A non-finite loss or
        gradient skips the update on the device (fp16's GradScaler does it itself), yet counts as a step."""
        self.clock.tick()
        if self.world.distributed:  # the clock sets the learning rate, and all ranks stop together
            flag, self.clock.seconds = distributed.all_max([float(self.interrupt.requested),
                                                           self.clock.seconds], self.world)
            self.interrupt.requested = flag > 0
        if self.calibration:
            self.calibration.observe(self.clock.seconds, self.session_tokens)
        self.scaler.unscale_(self.optimizer)
        grad_norm = clip_gradients(self.model, self.cfg.training.clip_grad_norm)
        bad = self.tally.end_step(grad_norm, grad_counts=not self.scaler.is_enabled())
        step_unless(self.optimizer, self.scaler, bad)
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        self.step += 1
        if self.ema:
            self.ema.update(self.model)

    def _after_step(self) -> str:
        """Validate or save when the step calls for it; then whether to stop (or to change the batch)."""
        t = self.cfg.training
        validate_now = t.valid_every_steps and self.step % t.valid_every_steps == 0
        if validate_now and self.batch_in_epoch < self.epoch_batches:  # (else the epoch's own follows)
            reason = self._validate_and_save()
            self.model.train()
            return reason or self.should_stop()
        if not validate_now and t.save_every_steps and self.step % t.save_every_steps == 0:
            self._save(tag="latest")
        if self.calibration and self.calibration.ready and self.batch_in_epoch < self.epoch_batches:
            return self.should_stop() or self._check_batch()
        return self.should_stop()

    def _check_batch(self) -> str:
        """The plan's batch checked against the run's speed, once (plan/calibration.py), and what follows
        from the updates expected at it: validation interval, average, dropout and EMA."""
        check, self.calibration = self.calibration, None
        checked = check.decide(self.clock.seconds, self.step) if self.world.is_main else None
        self.plan = distributed.from_main(checked, self.world)
        log.info("the plan's batch, %s", plan.calibrated(self.plan))
        t, v, size = self.cfg.training, self.plan.values, self.plan.values["training.batch_tokens"]
        t.valid_every_steps, t.average_last = v["training.valid_every_steps"], v["training.average_last"]
        self.model.set_dropout(v["model.dropout"])
        if v["training.ema_decay"] != t.ema_decay:  # on from these weights, or off (its average dropped)
            t.ema_decay, self.ema = v["training.ema_decay"], ema.build(self.model, v["training.ema_decay"])
            self.validate.model = ema.validated(self.ema, self.model)
        if size == t.batch_tokens:
            return ""
        t.batch_tokens = size
        self.epochs = plan.resize(self.plan, self.epochs, self.epoch, self.batch_in_epoch, self.world.size)
        self.epoch_batches, self.batch_in_epoch = self.epochs(self.epoch)[1].num_batches(self.world.size), 0
        return RESIZED

    def _read_tally(self) -> float:
        """The device's tally read into the progress window (one host sync): the last gradient norm."""
        values = self.tally.read()
        self.window.loss += values["loss_sum"]
        self.window.batches += int(values["batches"])
        limit = self.cfg.training.max_bad_steps
        if values["skipped"]:
            log.warning("%d optimizer step(s) skipped for a non-finite loss or gradient by step %d of epoch "
                        "%d (%d/%d in a row at most)", values["skipped"], self.step, self.epoch + 1,
                        values["longest"], limit)
        if values["longest"] >= limit:
            raise TrainingError(f"{limit} non-finite values in a row: the run diverged; the last good "
                                f"checkpoint in {self.run_dir} is intact. Lower training.lr="
                                f"{self.cfg.training.lr} or raise training.warmup_steps, then resume")
        return values["grad_norm"]

    # -- validation, checkpoints and records ------------------------------------------------------
    def _validate_and_save(self) -> str:
        """Validate (rank 0), update the best, keep a checkpoint; a reason to stop, decided before saving."""
        self._read_tally()  # a diverged run stops here, before anything is validated or saved
        improved = False
        if self.world.is_main:
            result = self.validate(self.step, self.epoch + 1, self.clock.seconds / 60)
            improved = self._update_best(result.metric(self.cfg.training.best_metric))
        # Every rank learns the best so far (patience), and takes rank 0's clock: the same stop everywhere.
        self.clock.tick()
        improved, self.best, self.bad_epochs, self.clock.seconds = distributed.from_main(
            (improved, self.best, self.bad_epochs, self.clock.seconds), self.world)
        end_of_epoch = self.batch_in_epoch == self.epoch_batches
        if end_of_epoch:
            self.epoch, self.batch_in_epoch = self.epoch + 1, 0
        self.validated_at_step = True
        reason = self.should_stop()  # writing the checkpoint counts at the next tick
        self._save(tag="epoch" if end_of_epoch else "step", improved=improved)
        return reason

    def _update_best(self, value: float) -> bool:
        """Record a validation's metric; True when it is the best so far (a NaN never is)."""
        if not improves(self.cfg.training.best_metric, value, self.best["value"]):
            self.bad_epochs += 1
            return False
        self.best, self.bad_epochs = {"metric": self.best["metric"], "value": value, "epoch": self.epoch + 1,
                                      "step": self.step}, 0
        return True

    def _best_value(self) -> float:
        return float("nan") if self.best["value"] is None else float(self.best["value"])

    def _save(self, tag: str, improved: bool = False) -> None:
        """Write a checkpoint (rank 0): epoch_/step_NNN.pt by tag (keep_last of them kept), or latest.pt."""
        self._read_tally()
        if self.calibration:  # the next step's time is not training's
            self.calibration.pause()
        if not self.world.is_main:
            return
        state = {
            "model_config": ckpt.model_spec(self.model),
            "config": OmegaConf.to_container(OmegaConf.structured(self.cfg), resolve=True),
            "overrides": self.overrides, "tokenizer": self.vocab.to_json(),
            **(self.ema.checkpoint_entries(self.model) if self.ema else {"model": self.model.state_dict()}),
            "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(), "epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch,
            "step": self.step, "best": self.best, "bad_epochs": self.bad_epochs,
            "train_seconds": self.clock.seconds, "world_size": self.world.size, "rng": rng_state(),
            "validated": self.validated_at_step,  # this position's validation is done (or still due)
            "parent": self.parent, "plan": plan.record(self.plan),  # (init=, training.plan=auto; or None)
        }
        name = {"epoch": f"epoch_{self.epoch:03d}.pt", "step": f"step_{self.step:07d}.pt"}.get(tag)
        path = ckpt.keep_checkpoint(state, self.run_dir, name, self.cfg.training.keep_last, improved)
        log.info("saved %s (%s, epoch %d, step %d)%s", path.name, tag, self.epoch, self.step,
                 " — new best" if improved else "")

    def _log_progress(self, bar: tqdm) -> None:
        """The window's mean loss and speed (TensorBoard, the progress bar or a log line); a new window."""
        grad_norm = self._read_tally()
        window, self.window = self.window, Window()
        elapsed = time.perf_counter() - window.start
        total_loss, batches, tokens = distributed.all_sum([window.loss, window.batches, window.tokens],
                                                          self.world)
        mean, lr, tok_s = total_loss / max(batches, 1), self.scheduler.get_last_lr()[0], tokens / elapsed
        self.records.scalars("train", {"loss": mean, "lr": lr, "grad_norm": grad_norm,
                                       "tgt_tokens_per_s": tok_s}, self.step)
        bar.set_postfix(loss=f"{mean:.3f}", lr=f"{lr:.2e}", tok_s=f"{tok_s:.0f}")
        if not self.cfg.training.progress:
            log.info("epoch %d step %d (batch %d/%d): loss %.3f, lr %.2e, %.0f tgt tok/s", self.epoch + 1,
                     self.step, self.batch_in_epoch, self.epoch_batches, mean, lr, tok_s)

    def _report(self) -> None:
        """result.json and the TensorBoard HParams entry: what sweeps compare runs by."""
        self.clock.tick()
        tokens, = distributed.all_sum([self.session_tokens], self.world)
        seconds = self.clock.seconds - self.session_start_seconds
        self.records.finish({
            "job": self.job, "overrides": self.overrides, "best_metric": self.best["metric"],
            "best_value": self._best_value(), "best_epoch": self.best["epoch"], "epochs": self.epoch,
            "steps": self.step, "world_size": self.world.size, "train_seconds": self.clock.seconds,
            "amp": str(self.precision), "src_lang": self.cfg.dataset.src_lang,
            "tgt_lang": self.cfg.dataset.tgt_lang, "parent": self.parent, "plan": plan.record(self.plan),
            "wall_seconds": time.perf_counter() - self.started,
            "tgt_tokens_per_s": tokens / seconds if seconds > 0 else math.nan,
        }, hparams(self.cfg, self.overrides, self.world.size), self.step)
