"""Preemption, interrupts and clean stops: a signal during training stops at the end of the step with
`checkpoints/last.ckpt` saved.

SIGTERM (and SIGUSR1, unless Lightning's SLURM auto-requeue owns it) or SIGINT (Ctrl-C) during training sets a
flag; at the end of the current step `PreemptionCheckpoint` writes `checkpoints/last.ckpt`, lets Lightning log
that step's row, and stops the run with `Preempted`. Outside the training loop the same signals raise
`Preempted` at once (`JobSignals`): nothing was trained since the last checkpoint. `python train.py ...
ckpt_path=auto` continues the run. `python train.py` then exits with code 75 (preempted) or 130 (Ctrl-C); a
second Ctrl-C quits at once, without saving.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as L
import torch
from lightning.pytorch.callbacks import Callback

log = logging.getLogger(__name__)

RESUME_HINT = "Relaunch the same command with ckpt_path=auto (and the same paths.output_dir) to continue."


class Preempted(BaseException):
    """The job received a preemption signal or Ctrl-C; `ckpt` holds everything trained (None: nothing new to
    save). `status`: "interrupted" for Ctrl-C (SIGINT), else "preempted".

    A BaseException, like KeyboardInterrupt: raised by a signal handler in the middle of any call, it must not
    be swallowed by an `except Exception` there (logging's handlers catch and print those)."""

    def __init__(self, signum: int, step: int | None = None, ckpt: str | None = None, hint: str = RESUME_HINT):
        self.signum, self.step, self.ckpt = signum, step, ckpt
        where = f" at step {step}; saved {ckpt}" if ckpt else ""
        super().__init__(f"received {signal.Signals(signum).name}{where}. {hint}")

    @property
    def status(self) -> str:
        return "interrupted" if self.signum == signal.SIGINT else "preempted"


# -- signals ---------------------------------------------------------------------------------------
def preemption_signals() -> tuple[int, ...]:
    """SIGTERM always; SIGUSR1 too unless this is a SLURM batch job, where Lightning's SLURMEnvironment
    handles it (hpc checkpoint + `scontrol requeue`, auto_requeue=True by default); SIGINT (Ctrl-C), which
    stops like a preemption but with status `interrupted`."""
    from lightning.fabric.plugins.environments import SLURMEnvironment

    sigs = [signal.SIGTERM, signal.SIGINT]
    if hasattr(signal, "SIGUSR1") and not SLURMEnvironment.detect():
        sigs.append(signal.SIGUSR1)
    return tuple(sigs)


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


QuitNow = Callable[[int], None]  # called by a signal that must end the process at once (never returns)


def _quit_on(signals: tuple[int, ...], quit_now: QuitNow | None) -> None:
    """From now on, these signals end the process at once (`quit_now`)."""
    if quit_now is not None and _in_main_thread():
        for s in signals:
            signal.signal(s, lambda signum, frame: quit_now(signum))


class JobSignals:
    """For the whole job: a preemption signal or Ctrl-C raises `Preempted` right away (data building,
    evaluation). During `fit` the callback below replaces this with a flag, so a step is never cut in half.
    After a first Ctrl-C, and while the job is finishing (`finishing()`: summary, W&B), a signal calls
    `quit_now` instead: a second Ctrl-C never waits."""

    def __init__(self, signals: tuple[int, ...], quit_now: QuitNow | None = None, hint: str = RESUME_HINT):
        self.signals = signals
        self.quit_now = quit_now
        self.hint = hint  # what the user should do next, in the Preempted message
        self.previous: dict[int, Any] = {}

    def _raise(self, signum: int, frame: Any) -> None:
        if signum == signal.SIGINT:
            _quit_on((signal.SIGINT,), self.quit_now)
        raise Preempted(signum, hint=self.hint)

    def finishing(self) -> None:
        _quit_on(self.signals, self.quit_now)

    def __enter__(self) -> JobSignals:  # noqa: PYI034
        if _in_main_thread():  # signal.signal works in the main thread only
            self.previous = {s: signal.signal(s, self._raise) for s in self.signals}
        return self

    def __exit__(self, *exc: object) -> None:
        for s, handler in self.previous.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)


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
            _quit_on((signal.SIGINT,), self.quit_now)  # before the message that invites the second Ctrl-C
            os.write(2, b"\nCtrl-C: stopping at the end of this step and saving checkpoints/last.ckpt "
                        b"(Ctrl-C again to quit at once, without saving).\n")

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Lightning installed its own SIGTERM handler (which would raise at a later point of the loop, past
        # where a mid-run checkpoint is consistent); ours replaces it until Lightning's teardown restores the
        # handlers that were there before fit (JobSignals'). SIGINT, which Lightning leaves alone, is given
        # back in `teardown`.
        self.received, self.stop = None, None
        if _in_main_thread():
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
            if _in_main_thread() and signal.getsignal(s) == self._flag:  # not if Lightning restored it already
                signal.signal(s, handler if handler is not None else signal.SIG_DFL)
