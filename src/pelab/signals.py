"""Preemption, interrupts and clean stops: a signal during training stops at the end of the step with
`checkpoints/last.ckpt` saved.

SIGTERM (and SIGUSR1, unless Lightning's SLURM auto-requeue owns it) or SIGINT (Ctrl-C) during training sets a
flag; at the end of the current step `PreemptionCheckpoint` (pelab.training.callbacks.preemption) writes
`checkpoints/last.ckpt`, lets Lightning log that step's row, and stops the run with `Preempted`. Outside the
training loop the same signals raise `Preempted` at once (`JobSignals`): nothing was trained since the last
checkpoint. `python train.py ... ckpt_path=auto` continues the run. `python train.py` then exits with code 75
(preempted) or 130 (Ctrl-C); a second Ctrl-C quits at once, without saving.

Standard library only: the job's life starts (and a bad setting is refused) before torch is imported. A top-level
module because both the training loop (`PreemptionCheckpoint`) and the job around it (`JobSignals`,
`pelab.tasks.task`) use it.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

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
    sigs = [signal.SIGTERM, signal.SIGINT]
    if hasattr(signal, "SIGUSR1") and not slurm_batch_job():
        sigs.append(signal.SIGUSR1)
    return tuple(sigs)


def slurm_batch_job() -> bool:
    """Lightning's `SLURMEnvironment.detect()` without importing Lightning (torch): launched by SLURM, and
    not in an interactive allocation (job name `bash` or `interactive`). tests/test_signals.py checks both
    agree."""
    return "SLURM_NTASKS" in os.environ and os.environ.get("SLURM_JOB_NAME") not in ("bash", "interactive")


def in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


QuitNow = Callable[[int], None]  # called by a signal that must end the process at once (never returns)


def quit_on(signals: tuple[int, ...], quit_now: QuitNow | None) -> None:
    """From now on, these signals end the process at once (`quit_now`)."""
    if quit_now is not None and in_main_thread():
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
            quit_on((signal.SIGINT,), self.quit_now)
        raise Preempted(signum, hint=self.hint)

    def finishing(self) -> None:
        quit_on(self.signals, self.quit_now)

    def __enter__(self) -> JobSignals:  # noqa: PYI034
        if in_main_thread():  # signal.signal works in the main thread only
            self.previous = {s: signal.signal(s, self._raise) for s in self.signals}
        return self

    def __exit__(self, *exc: object) -> None:
        for s, handler in self.previous.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
