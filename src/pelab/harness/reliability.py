"""What keeps a long run trustworthy: preemption, interrupts, atomic checkpoints, resume checks, clean user errors.

- **Preemption and Ctrl-C.** SIGTERM (and SIGUSR1, unless Lightning's SLURM auto-requeue owns it) or SIGINT
  (Ctrl-C) during training sets a flag; at the end of the current step `PreemptionCheckpoint` writes
  `checkpoints/last.ckpt`, lets Lightning log that step's row, and stops the run with `Preempted`. Outside
  the training loop the same signals raise `Preempted` at once (`JobSignals`): nothing was trained since the
  last checkpoint. `python train.py ... ckpt_path=auto` continues the run. `python train.py` then exits with
  code 75 (preempted) or 130 (Ctrl-C); a second Ctrl-C quits at once, without saving.
- **Atomic checkpoints.** `AtomicCheckpointIO` writes `<name>.tmp-<pid>` and renames it, so a checkpoint file
  is complete or absent even when the process is SIGKILLed mid-write (Lightning writes in place).
- **Resume checks.** `check_resume_checkpoint` reads the checkpoint's own training config and refuses one
  from another model / encoding / tokenizer before any data is built; a truncated file is a one-line error.
- **Same data as DDP on one device.** `EmulatedWorldDataModule` draws, per step, the rows ranks 0..W-1 of a
  W-device run draw (`debug.emulate_world_size=W`), so a 1-process run is comparable to a DDP run.
- **User errors.** `is_user_error` tells deliberate, message-bearing errors (one line, no traceback) from bugs.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import lightning.pytorch as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.plugins.io import TorchCheckpointIO
from torch.utils.data import IterableDataset

from pelab.data.datamodule import LMDataModule

log = logging.getLogger(__name__)

# model.* keys that do not change the checkpoint's tensors or their meaning; anything else in model.*, pe.*
# (except the encoding's own `runtime_keys`) and tokenizer.* must match to resume.
MODEL_RUNTIME_KEYS = ("name", "dropout", "attn_chunk_size", "attn_backend")


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


class NonFiniteError(RuntimeError):
    """A non-finite loss or gradient under optim.nonfinite=stop (or more than optim.max_skips skipped)."""


class CheckpointError(ValueError):
    """A checkpoint that cannot be read or does not belong to this run's model/tokenizer."""


def is_user_error(err: BaseException) -> bool:
    """Errors pelab raises on purpose with a message naming the setting to change: print them as one line.
    Anything else (a bug, a library failure) keeps its full traceback."""
    if isinstance(err, NonFiniteError):
        return True
    return isinstance(err, ValueError) and type(err).__module__.startswith("pelab.")


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


# -- checkpoints -----------------------------------------------------------------------------------
class AtomicCheckpointIO(TorchCheckpointIO):
    """torch.save to a temporary file in the same folder, fsync, rename over the target."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any = None) -> None:
        if "://" in str(path):  # remote storage: Lightning's fsspec writer
            return super().save_checkpoint(checkpoint, path, storage_options)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        try:
            with open(tmp, "wb") as f:
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """The checkpoint dict (tensors memory-mapped, so a large file costs little), or a one-line error."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"ckpt_path={path} does not exist; pass a .ckpt file, 'auto' or null.")
    try:
        try:
            return torch.load(path, map_location="cpu", weights_only=False, mmap=True)
        except RuntimeError as err:
            if "mmap" not in str(err):
                raise
            return torch.load(path, map_location="cpu", weights_only=False)  # legacy (non-zip) format
    except Exception as err:  # any unpickling failure means the same to the user
        first = (str(err).splitlines() or [""])[0][:200]
        raise CheckpointError(
            f"ckpt_path={path} is not a readable checkpoint (truncated or corrupted: {type(err).__name__}: "
            f"{first}); delete it or set ckpt_path= to another checkpoint (e.g. checkpoints/best.ckpt)."
        ) from err


def checkpoint_mismatches(ckpt_cfg: dict, cfg: dict) -> list[str]:
    """Settings that must match to continue training these weights, as readable differences. Keys that only
    one side has are skipped (a key added to the configs since the checkpoint was written)."""
    from pelab.encodings import pe_schema

    runtime_keys = {"model": set(MODEL_RUNTIME_KEYS), "pe": set(pe_schema(cfg["pe"]).runtime_keys), "tokenizer": set()}
    out = []
    for group, runtime in runtime_keys.items():
        old, new = ckpt_cfg.get(group) or {}, cfg.get(group) or {}
        keys = sorted(set(old) & set(new), key=lambda k: (k != "name" and k != "kind", k))
        for key in keys:
            if key not in runtime and old.get(key) != new.get(key):
                out.append(f"{group}.{key}={old.get(key)!r} in the checkpoint but {new.get(key)!r} now")
    return out


def check_resume_checkpoint(path: str, cfg: dict) -> tuple[int, int | None]:
    """Refuse a checkpoint of another model, encoding or tokenizer before any work starts.
    Returns its step and vocabulary size (checked against the data once the tokenizer is loaded)."""
    ckpt = read_checkpoint(path)
    hp = ckpt.get("hyper_parameters") or {}
    if "cfg" not in hp or "state_dict" not in ckpt:
        raise CheckpointError(f"ckpt_path={path} was not written by pelab's train.py (no training config inside).")
    diffs = checkpoint_mismatches(hp["cfg"], cfg)
    if diffs:
        more = f" (+{len(diffs) - 4} more)" if len(diffs) > 4 else ""
        raise CheckpointError(
            f"ckpt_path={path} belongs to another run: {'; '.join(diffs[:4])}{more}. Use the checkpoint's "
            "settings or start a fresh run (ckpt_path=null, another paths.output_dir)."
        )
    return int(ckpt.get("global_step", 0)), hp.get("vocab_size")


def newest_checkpoint(output_dir: Path) -> Path | None:
    """`ckpt_path=auto`: the newest of checkpoints/last.ckpt and Lightning's SLURM requeue checkpoints
    (hpc_ckpt_*.ckpt in the run folder)."""
    candidates = [output_dir / "checkpoints" / "last.ckpt", *output_dir.glob("hpc_ckpt_*.ckpt")]
    existing = [p for p in candidates if p.is_file()]
    return max(existing, key=lambda p: p.stat().st_mtime) if existing else None


# -- one process drawing a DDP run's data -----------------------------------------------------------
class RankUnion(IterableDataset):
    """Batch `step` = rows of rank 0, then rank 1, ...: what a W-rank run trains on at that step."""

    def __init__(self, parts: list[IterableDataset]):
        self.parts = parts

    def __iter__(self) -> Iterator[torch.Tensor]:
        for rows in zip(*self.parts):  # each (B/W, T+1)
            yield torch.cat(rows)  # (B, T+1)


class EmulatedWorldDataModule(LMDataModule):
    """`LMDataModule` whose training stream is the union of `world` ranks' streams; `batch_size` is per rank.
    DDP averages the ranks' gradients, i.e. the gradient of the mean loss over these same B rows."""

    def __init__(self, *args: Any, world: int = 1, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.world = int(world)

    def train_dataset(self, start_step: int | None = None, rank: int | None = None) -> IterableDataset:
        return RankUnion([super(EmulatedWorldDataModule, self).train_dataset(start_step, rank=r)
                          for r in range(self.world)])
