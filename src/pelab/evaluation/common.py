"""What every evaluation shares: running a model in evaluation mode, its device, batch sizing by length, how a
length an encoding cannot represent is reported, and a long forward that still lets a signal through."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from pelab.evaluation import progress


@contextmanager
def evaluating(model: nn.Module) -> Iterator[nn.Module]:
    """``model.eval()`` under ``torch.no_grad()``, its train / eval mode restored afterwards. Encodings keep
    nothing between forwards (``pelab.encodings.base``), so ``inference_mode`` would do as well."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield model
    finally:
        model.train(was_training)


def safe_exp(x: float) -> float:
    """exp(x) that returns inf on overflow (a broken model must not crash the evaluation)."""
    if math.isnan(x):
        return float("nan")
    try:
        return math.exp(x)
    except OverflowError:
        return float("inf")


def not_applicable_note(exc: BaseException) -> str:
    """Short table note for a length the encoding cannot represent, from the exception message:
    "n/a — learned positions end at 255 (pe.max_position=256)"."""
    msg = str(exc).strip().split(";")[0].strip() or type(exc).__name__
    return f"n/a — {msg}"


def model_device(model: nn.Module) -> torch.device:
    p = next(model.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


def windows_per_batch(length: int, batch_size: int, batch_tokens: int | None) -> int:
    """Windows per forward batch: shrinks with the length so that 16x lengths fit in memory."""
    if batch_tokens is None:
        return max(1, batch_size)
    return max(1, min(batch_size, batch_tokens // max(1, length)))


# One forward may stay minutes in one call into torch: a 1 M-token window of the micro model, or 16384 tokens of
# model=base, on a CPU core. Python runs a signal handler only between calls, so SIGTERM or Ctrl-C waited for the
# whole call. Every evaluation forward started from the main thread (where handlers run) therefore runs in a
# worker thread while the main thread waits in short sleeps: the handler runs within a fraction of a second and
# the job stops as preempted / interrupted. Starting the thread costs about 0.5 ms a forward (measured on the
# loaded 2-core CPU): about 0.13 s for the ~260 forwards of the default evaluation. A worker a stop left running
# is left to the process's end (`abandoned_forwards`: the job then exits at once, pelab.tasks.task).
WAIT_SECONDS = 0.2
_workers: list[threading.Thread] = []  # the workers started and not yet seen ended (a stop may leave one running)


def stoppable_forward(fn: Callable[[torch.Tensor], Any], idx: torch.Tensor) -> Any:
    """`fn(idx)` for a batch `idx` (B, T): from the main thread in a worker thread (see above); then the open
    progress bar (pelab.evaluation.progress) advances by its B rows of T tokens."""
    out = in_worker(fn, idx) if threading.current_thread() is threading.main_thread() else fn(idx)
    progress.advance(int(idx.shape[0]), int(idx.shape[-1]))
    return out


def in_worker(fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)` in a daemon thread under this thread's grad mode and CUDA device (both thread-local), the result
    or its exception returned here; a signal handler that raises while it runs (Preempted) leaves the worker
    behind (`_workers`). The wait is on an Event, not `Thread.join`: a join interrupted by a signal marks a
    running thread as ended (CPython 3.11)."""
    out: dict[str, Any] = {}
    done = threading.Event()
    grad = torch.is_grad_enabled()  # thread-local: the evaluation's no_grad must hold in the worker too
    cuda = torch.cuda.current_device() if torch.cuda.is_initialized() else None  # a rank's device (DDP)

    def work() -> None:
        try:
            if cuda is not None:
                torch.cuda.set_device(cuda)
            with torch.set_grad_enabled(grad):
                out["value"] = fn(*args)
        except BaseException as err:  # noqa: BLE001 - handed to the waiting thread, raised there
            out["error"] = err
        finally:
            done.set()

    _workers[:] = [t for t in _workers if t.is_alive()]
    worker = threading.Thread(target=work, name="pelab-forward", daemon=True)
    _workers.append(worker)  # recorded before it starts: a signal may land inside start() itself
    worker.start()
    while not done.wait(WAIT_SECONDS):
        pass
    if "error" in out:
        raise out["error"]
    return out["value"]


def abandoned_forwards() -> bool:
    """A worker still alive (a forward a stop left running, or one ending): libtorch aborts ("terminate called
    without an active exception") when the interpreter ends under it, so the process must end with os._exit."""
    return any(t.is_alive() for t in _workers)
