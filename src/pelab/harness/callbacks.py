"""Callbacks instantiated from `conf/callbacks/` (`_target_` entries): checkpoints, progress bar, throughput;
and `SummaryUpdates`, which the harness always adds.

Checkpoints: `best.ckpt` (by the optimized metric) and `last.ckpt` at every validation, and, with
`callbacks.checkpoint.every_n_steps=k`, `last.ckpt` every k training steps too (what a preempted or killed
run resumes from with `ckpt_path=auto`).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as L
import torch
from lightning.pytorch.callbacks import (
    Callback,
    ModelCheckpoint,
    RichProgressBar,
    ThroughputMonitor,
    TQDMProgressBar,
)
from lightning.pytorch.callbacks.progress import ProgressBar
from lightning.pytorch.trainer.states import RunningStage, TrainerFn
from lightning.pytorch.utilities import rank_zero_only

from pelab.harness.job import JobRecord
from pelab.harness.signals import Preempted, QuitNow, in_main_thread, quit_on


class RunCheckpoint(ModelCheckpoint):
    """`best.ckpt` by `monitor` (the best validation so far) and `last.ckpt` at every validation and the end of
    training, whatever the metric did (the final weights: what eval.py and extend.from read); with
    `every_n_steps=k`, `last.ckpt` every k training steps too (written at the end of the step: a consistent
    mid-run resume point).

    Only validation metrics exist when checkpoints are taken, so a `monitor` outside `val/` (e.g. a metric
    of the end-of-training evaluation) keeps no best.ckpt instead of failing at the first validation."""

    def __init__(self, dirpath: str, monitor: str | None = None, mode: str = "min",
                 every_n_steps: int | None = None):
        monitor = monitor if monitor and monitor.startswith("val/") else None
        super().__init__(dirpath=dirpath, filename="best", monitor=monitor, mode=mode,
                         save_top_k=1 if monitor else 0, save_last=True, auto_insert_metric_name=False,
                         enable_version_counter=False)
        self.every_n_steps = every_n_steps

    @property
    def last_path(self) -> Path:
        return Path(self.dirpath) / f"{self.CHECKPOINT_NAME_LAST}{self.FILE_EXTENSION}"

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        if self.every_n_steps and trainer.global_step % int(self.every_n_steps) == 0:
            trainer.save_checkpoint(self.last_path, weights_only=False)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """last.ckpt after every validation, whatever the monitored metric did: Lightning writes "last" only on a
        step where it also wrote a top-k checkpoint (lightning 2.6 `ModelCheckpoint.on_validation_end`), so a
        validation worse than the best left last.ckpt behind (a resume lost those steps; eval.py read old
        weights)."""
        super().on_validation_end(trainer, pl_module)
        if trainer.sanity_checking or trainer.state.fn != TrainerFn.FITTING:
            return
        if self._last_global_step_saved != trainer.global_step:  # Lightning saved nothing at this step
            self.last_model_path = str(self.last_path)
            trainer.save_checkpoint(self.last_path, weights_only=False)
            self._last_global_step_saved = trainer.global_step


class SummaryUpdates(L.Callback):
    """summary.json kept current during fit: the step and the val/*, train/* metrics after each validation
    (`job`: the job's record; only its own process of rank 0 writes)."""

    def __init__(self, job: JobRecord):
        self.job = job

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != TrainerFn.FITTING:
            return
        self.job.summary.update(global_step=int(trainer.global_step), metrics=pl_module.run_metrics(trainer))
        self.job.save()


class SparseRichProgressBar(RichProgressBar):
    """Lightning's RichProgressBar, reading its metrics (train/loss, ...: `.item()`, a host sync on CUDA) only
    every `refresh_rate` training steps: the stock bar reads them after every step whatever its refresh rate
    (lightning 2.6 `RichProgressBar.on_train_batch_end`). TQDMProgressBar already reads them only when it
    refreshes."""

    def _update_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.training and trainer.global_step % max(self.refresh_rate, 1):
            return
        super()._update_metrics(trainer, pl_module)


def progress_bar(refresh_rate: int = 10, log_refresh_rate: int = 50) -> ProgressBar:
    """Rich on a terminal, its metrics read every `refresh_rate` steps; plain tqdm every `log_refresh_rate`
    steps in logs and CI."""
    if sys.stdout.isatty():
        return SparseRichProgressBar(refresh_rate=refresh_rate)
    return TQDMProgressBar(refresh_rate=log_refresh_rate)


def _rows(batch: torch.Tensor) -> int:  # (B, T+1) windows
    return batch.size(0)


def _tokens(batch: torch.Tensor) -> int:  # the inputs of a (B, T+1) batch: B*T tokens
    return batch.size(0) * (batch.size(1) - 1)


class TokenThroughput(ThroughputMonitor):
    """Lightning's ThroughputMonitor, logged as `train/tokens_per_sec` (all devices),
    `train/tokens_per_sec_per_device` and `train/mfu` (model FLOPs utilisation: `pl_module.flops_per_token`
    x tokens/s per device / the device's peak, from Lightning's `get_available_flops(device, dtype)`, known
    GPUs only: no MFU on CPU; `available_flops` overrides the peak). Rates are over the last
    `trainer.log_every_n_steps` steps, validation time excluded.

    Two changes to the stock callback: it reads the clock (a CUDA synchronize) only on the steps that log, not
    after every step, and it does not measure validation batches (it would log them under validation batch
    indices as steps, which W&B rejects as going backwards)."""

    def __init__(self, available_flops: float | None = None):
        super().__init__(batch_size_fn=_rows, length_fn=_tokens, window_size=2)  # 2 readings: one interval
        self.configured_flops = available_flops
        self._flops_since = 0.0  # per device, since the last reading
        self._val_t0 = 0.0

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        if self.configured_flops:
            self.available_flops = float(self.configured_flops)
            for throughput in self._throughputs.values():
                throughput.available_flops = self.available_flops

    @staticmethod
    def _clock(trainer: L.Trainer) -> float:
        if trainer.strategy.root_device.type == "cuda":
            torch.cuda.synchronize()  # the work queued so far belongs to the time read here
        return time.perf_counter()

    def _update(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, iter_num: int) -> None:
        stage = RunningStage.TRAINING
        self._batches[stage] += 1
        self._samples[stage] += _rows(batch)
        self._lengths[stage] += _tokens(batch)
        self._flops_since += pl_module.flops_per_token * _tokens(batch)
        if not trainer._logger_connector.should_update_logs:
            return
        self._throughputs[stage].update(time=self._clock(trainer) - self._t0s[stage],
                                        batches=self._batches[stage], samples=self._samples[stage],
                                        lengths=self._lengths[stage], flops=self._flops_since)
        self._flops_since = 0.0

    @rank_zero_only
    def on_train_start(self, trainer: L.Trainer, *_: Any) -> None:
        super().on_train_start(trainer)
        self._flops_since = 0.0

    @rank_zero_only
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           *_: Any) -> None:
        self._update(trainer, pl_module, batch, trainer.fit_loop.total_batch_idx + 1)
        if not trainer._logger_connector.should_update_logs:
            return
        m = self._throughputs[RunningStage.TRAINING].compute()
        if "device/items_per_sec" not in m:  # the first reading: no interval yet
            return
        per_device = m["device/items_per_sec"]
        pl_module.log("train/tokens_per_sec", per_device * trainer.world_size, prog_bar=True, rank_zero_only=True)
        pl_module.log("train/tokens_per_sec_per_device", per_device, rank_zero_only=True)
        if "device/mfu" in m:
            pl_module.log("train/mfu", m["device/mfu"], rank_zero_only=True)

    @rank_zero_only
    def on_validation_start(self, trainer: L.Trainer, *_: Any) -> None:
        if not trainer.sanity_checking:
            self._val_t0 = self._clock(trainer)

    def on_validation_batch_end(self, *_: Any, **__: Any) -> None:
        pass

    @rank_zero_only
    def on_validation_end(self, trainer: L.Trainer, *_: Any) -> None:
        if trainer.sanity_checking or trainer.state.fn != TrainerFn.FITTING:
            return
        self._t0s[RunningStage.TRAINING] += self._clock(trainer) - self._val_t0  # not training time


# Its log lines keep the logger name they had when it lived in pelab.harness.signals.
log = logging.getLogger("pelab.harness.signals")


class PreemptionCheckpoint(Callback):
    """Signal -> flag; at the end of the step: save `ckpt_path` (all ranks agree on the step); at the start
    of the next step (or the end of training) stop with `Preempted`. Stopping there rather than at once lets
    Lightning log the saved step's row first and run a validation due at that step (which then saves
    last.ckpt again, validated: a resume does not repeat a validation), so a resumed run's logs have no
    hole; the cost is one validation when the signal lands on a validation step."""

    def __init__(self, ckpt_path: str | Path, signals: tuple[int, ...], quit_now: QuitNow | None = None):
        self.ckpt_path = str(ckpt_path)
        self.signals = signals
        self.quit_now = quit_now
        self.received: int | None = None
        self.stop: Preempted | None = None  # set once last.ckpt is saved
        self.previous: dict[int, Any] = {}  # the handlers fit found

    def _flag(self, signum: int, frame: Any) -> None:
        # No logging here (a handler may run inside a logging call); a raw write is safe.
        self.received = signum
        if signum == signal.SIGINT:
            quit_on((signal.SIGINT,), self.quit_now)  # before the message that invites the second Ctrl-C
            os.write(2, b"\nCtrl-C: stopping at the end of this step and saving checkpoints/last.ckpt "
                        b"(Ctrl-C again to quit at once, without saving).\n")

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Lightning installed its own SIGTERM handler (which would raise at a later point of the loop, past
        # where a mid-run checkpoint is consistent); ours replaces it until Lightning's teardown restores the
        # handlers that were there before fit (JobSignals'). SIGINT, which Lightning leaves alone, is given
        # back in `teardown`.
        self.received, self.stop = None, None
        if in_main_thread():
            self.previous = {s: signal.signal(s, self._flag) for s in self.signals}

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        flag = self.received is not None
        if trainer.world_size > 1 and torch.distributed.is_initialized():
            # Every rank must stop at the same step (SLURM signals all tasks, but not at the same instant).
            t = torch.tensor([float(flag)], device=pl_module.device)
            torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
            flag = bool(t.item())
        if not flag or self.stop is not None:
            return
        signum = self.received or signal.SIGTERM
        log.warning("%s received: saving %s at step %d and stopping.", signal.Signals(signum).name,
                    self.ckpt_path, trainer.global_step)
        trainer.save_checkpoint(self.ckpt_path, weights_only=False)
        self.stop = Preempted(signum, step=trainer.global_step, ckpt=self.ckpt_path)

    def _stop_if_saved(self, *_: Any) -> None:
        if self.stop is not None:
            raise self.stop

    on_train_batch_start = on_train_end = _stop_if_saved

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        for s, handler in self.previous.items():
            if in_main_thread() and signal.getsignal(s) == self._flag:  # not if Lightning restored it already
                signal.signal(s, handler if handler is not None else signal.SIG_DFL)
