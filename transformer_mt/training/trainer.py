"""The Trainer: from a typed config to checkpoints, in one readable loop.

`Trainer.__init__` builds the run from its finished (planned) config and what it starts from (start.py):
model, optimizer, schedule, weight average, epochs, records. `fit` trains epoch after epoch
(`train_epoch`, one optimizer step at a time: step.py), validates and keeps a checkpoint at each epoch's
end (and every `valid_every_steps`), until `should_stop` gives a reason. A checkpoint records the
position in the epoch and all random state, so `resume=` continues exactly where the run stopped;
`init=` starts a new run from another's weights (finetune.py). A step never waits for the device: what
it tells the loop stays there until read (tally.py).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf
from tqdm import tqdm

from transformer_mt.checkpoints import store as ckpt
from transformer_mt.checkpoints.fields import WORDS
from transformer_mt.config import TrainConfig
from transformer_mt.data import Batch
from transformer_mt.data.epochs import TrainingEpochs
from transformer_mt.data.joining import build as joined_pairs
from transformer_mt.data.segmentation import build as subword_sampler
from transformer_mt.data.variants import build as input_variants
from transformer_mt.decoding.metrics import improves
from transformer_mt.errors import TrainingError
from transformer_mt.runtime.device import compiled, pad_to_multiple
from transformer_mt.runtime.rng import rng_state, set_rng_state
from transformer_mt.training import distributed, ema, finetune, loss, student_init
from transformer_mt.training.clock import Interrupt, TrainingClock
from transformer_mt.training.optim import build_optimizer, build_scheduler
from transformer_mt.training.records import RunRecords, Window, hparams
from transformer_mt.training.start import RunStart
from transformer_mt.training.step import TrainStep
from transformer_mt.training.validation import Validator

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Stop:
    """Why training stops: what the log says, and whether it was interrupted (Ctrl-C, SIGTERM: the run
    saves where it stands, to resume) rather than done (its budget, epochs or patience spent)."""

    why: str
    interrupted: bool = False


INTERRUPTED = Stop("interrupted", interrupted=True)


class Trainer:
    """Owns the model, optimizer, schedule and data of one run, and the loop that trains them."""

    def __init__(self, cfg: TrainConfig, run_dir: Path, start: RunStart, overrides: Sequence[str] = (),
                 job: int | None = None, plan: Mapping[str, Any] | None = None, spent_s: float = 0.0,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        """`cfg` is the run's whole config, planned already; `start` what the run starts from (start.py);
        `plan` the plan behind cfg as checkpoints and result.json keep it (plan/), made in `spent_s`
        seconds of the budget; `overrides` and `job` (its number in a sweep) go into checkpoints and
        result.json; `clock` reads seconds."""
        t = cfg.training
        self.cfg, self.run_dir = cfg, run_dir
        self.overrides, self.job, self.plan = list(overrides), job, plan  # (what the records keep)
        self.world, self.device = start.world, start.device
        self.precision, self.amp = start.precision, start.precision.dtype
        self.data, self.vocab = start.data, start.data.vocab
        self.parent, self.started = start.parent_path, start.started
        self.word_list = ckpt.word_entry(start.words) if start.words is not None else None
        self.model = ckpt.build_model(cfg.model, self.vocab, resumed=start.state).to(self.device)
        self.optimizer = build_optimizer(self.model, t, self.device)
        self.ema = ema.build(self.model, t.ema_decay)  # then validated, saved and translated with
        subwords = subword_sampler(self.vocab, cfg.tokenizer, cfg.seed, cfg.dataset.max_len)
        pad = pad_to_multiple(t.pad_to_multiple, self.device, cfg.device.compile)
        variants = input_variants(self.vocab, cfg.dataset, self.data.mixture, cfg.seed, len(self.data.train))
        joins = joined_pairs(self.vocab, cfg.dataset, self.data.mixture, cfg.seed, len(self.data.train))
        self.epochs = TrainingEpochs(self.data.train, t.batch_tokens, cfg.seed, subwords, pad,
                                     self.data.mixture, variants, joins, ahead=self.device.type != "cpu")
        self.clock = TrainingClock(t.max_minutes, spent_s, clock)  # before the schedule
        # This rank's batches per epoch: epoch 0's even when resuming (re-drawn epochs differ); the worker
        # starts on the epoch after the one training starts in, known once the run is restored
        self.epoch_batches = self.epochs(0, start_next=False)[1].num_batches(self.world.size)
        steps = math.ceil(self.epoch_batches / t.accumulate) * t.epochs
        self.scheduler = build_scheduler(self.optimizer, t, steps,
                                         self.clock.used if t.decay_by_time else lambda: 0.0)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.amp == torch.float16)

        # The epoch in progress (0-based), its micro-batches already done, and the optimizer steps
        self.epoch = self.batch_in_epoch = self.step = 0
        self.best: dict[str, Any] = {"metric": t.best_metric, "value": None, "epoch": None}
        self.bad_epochs = 0  # validations without improvement (patience)
        self.window = Window()  # the loss and speed since the last progress line
        self.interrupt = Interrupt()
        self.validated_at_step = False  # the last step was validated and saved already
        if start.state:
            self._restore(start.state)
        elif start.parent:
            finetune.start_from(start.parent, self.model, self.ema)
        elif cfg.distill.init_from_teacher:
            student_init.start_from_teacher(cfg, self.model, self.ema)
        # Weights are loaded before DDP wraps the model: it sends rank 0's to every rank.
        forward = compiled(self.model, self.epochs.pad_to_multiple) if cfg.device.compile else self.model
        self.steps = TrainStep(distributed.wrap(forward, self.world, self.device), self.model, self.optimizer,
                               self.scheduler, self.scaler, self.device, self.amp, t.label_smoothing,
                               t.clip_grad_norm, self.world.size, self.ema)
        self.session_tokens, self.session_start_seconds = 0, self.clock.seconds  # for result.json
        # A resumed run redoes the steps after its checkpoint: their old events are purged.
        self.records = RunRecords(run_dir, self.world.is_main, self.step + 1 if self.step else None)
        directions = {lang: valid for lang, (valid, _) in self.data.directions.items()}
        self.validate = Validator(ema.validated(self.ema, self.model), self.vocab,
                                  directions or {cfg.dataset.tgt_lang: self.data.valid}, cfg, self.device,
                                  self.amp, self.records)
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
            stop = self.should_stop()
            if stop and not stop.interrupted and not self.validated_at_step:  # resumed past the budget:
                stop = self._validate_and_save() or stop  # validate where the run would have
            while stop is None:
                stop = self.train_epoch()
                if not (stop and stop.interrupted) and not self.validated_at_step:  # an epoch's end, a stop
                    stop = self._validate_and_save() or stop
        self.epochs.close()
        if stop.interrupted:
            self._save(tag="interrupt")
            log.warning("stopped; continue with: transformer-mt train resume=%s", self.run_dir)
            return self._best_value()
        log.info("stopping: %s", stop.why)
        if t.average_last >= 2 and self.world.is_main:  # kept as best.pt if validation agrees
            epoch = self.epoch + (1 if self.batch_in_epoch else 0)
            self.best = self.validate.keep_average(self.run_dir, t.average_last, self.best, self.step, epoch,
                                                   self.clock.seconds / 60) or self.best
        self._report()
        log.info("best %s %.2f at epoch %s, step %s; checkpoints in %s", t.best_metric, self._best_value(),
                 self.best["epoch"], self.best.get("step"), self.run_dir)
        return self._best_value()

    def should_stop(self) -> Stop | None:
        """Why training must stop now (None to go on): the same answer on every rank, and for a run
        resumed from the checkpoint written at this point (the clock has not moved since)."""
        t = self.cfg.training
        if self.interrupt.requested:
            return INTERRUPTED
        if t.patience and self.bad_epochs >= t.patience:
            return Stop(f"no improvement in {t.patience} validations")
        if self.clock.used() >= 1:
            return Stop(f"time budget of {t.max_minutes} minutes reached")
        if self.epoch >= t.epochs:
            return Stop(f"training.epochs={t.epochs} reached")
        return None

    def train_epoch(self) -> Stop | None:
        """One pass over the epoch's batches (from where a run left off); why to stop, None at its end."""
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
                stop = self._after_step()
                if stop:
                    return stop
        return None

    def train_step(self, batch: Batch, step_tokens: int, ends_step: bool) -> None:
        """Forward and backward of one micro-batch (step.py); out of memory: what to change, in one line."""
        try:
            self.steps.micro_batch(batch, step_tokens, ends_step)
        except torch.OutOfMemoryError as ex:
            self.optimizer.zero_grad(set_to_none=True)
            raise TrainingError(
                f"out of memory on a batch of {batch.src.numel() + batch.tgt_in.numel()} padded tokens "
                f"({tuple(batch.src.shape)} source, {tuple(batch.tgt_in.shape)} target); lower training."
                f"batch_tokens={self.cfg.training.batch_tokens} (training.accumulate keeps the effective "
                "batch) and resume=... from the last checkpoint") from ex

    def optimizer_step(self) -> None:
        """The update (step.py), after the ranks agree on the clock and on an interrupt."""
        self.clock.tick()
        if self.world.distributed:  # the clock sets the learning rate, and all ranks stop together
            flag, self.clock.seconds = distributed.all_max([float(self.interrupt.requested),
                                                           self.clock.seconds], self.world)
            self.interrupt.requested = flag > 0
        self.steps.update()
        self.step += 1

    def _after_step(self) -> Stop | None:
        """Validate or save when the step calls for it; then whether to stop."""
        t = self.cfg.training
        validate_now = t.valid_every_steps and self.step % t.valid_every_steps == 0
        if validate_now and self.batch_in_epoch < self.epoch_batches:  # (else the epoch's own follows)
            stop = self._validate_and_save()
            self.model.train()
            return stop or self.should_stop()
        if not validate_now and t.save_every_steps and self.step % t.save_every_steps == 0:
            self._save(tag="latest")
        return self.should_stop()

    def _read_tally(self) -> float:
        """The device's tally read into the progress window (one host sync): the last gradient norm."""
        values = self.steps.tally.read()
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
    def _validate_and_save(self) -> Stop | None:
        """Validate (rank 0), update the best, keep a checkpoint; why to stop, decided before saving."""
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
        stop = self.should_stop()  # writing the checkpoint counts at the next tick
        self._save(tag="epoch" if end_of_epoch else "step", improved=improved)
        return stop

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
            "parent": self.parent, "plan": self.plan,  # (init=, training.plan=auto; or None)
            WORDS: self.word_list,  # what translation copies as a name the model never met
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
            "tgt_lang": self.cfg.dataset.tgt_lang, "parent": self.parent, "plan": self.plan,
            "wall_seconds": time.perf_counter() - self.started,
            "tgt_tokens_per_s": tokens / seconds if seconds > 0 else math.nan,
        }, hparams(self.cfg, self.overrides, self.world.size), self.step)
