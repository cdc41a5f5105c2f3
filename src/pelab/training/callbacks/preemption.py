"""A signal during fit stops at the end of the step with `checkpoints/last.ckpt` saved (the whole story:
`pelab.signals`); `pelab.runs.build` always adds it (not a conf/callbacks entry)."""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path
from typing import Any

import lightning.pytorch as L
import torch
from lightning.pytorch.callbacks import Callback

from pelab.signals import Preempted, QuitNow, in_main_thread, quit_on

log = logging.getLogger(__name__)


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
