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


# A forward over a window this long may stay minutes in one call into torch (one attention kernel over the whole
# window: 1 M tokens of the micro model on a CPU), and Python runs a signal handler only between calls: SIGTERM or
# Ctrl-C waited for the whole call. Such a forward runs in a worker thread while this (the main) thread waits in
# short sleeps, so the handler runs within a fraction of a second and the job stops as preempted / interrupted. The
# worker is left to the process's end (`abandoned_forwards`: the job then exits at once, pelab.tasks.task).
LONG_WINDOW_TOKENS = 16384
WAIT_SECONDS = 0.2
_abandoned: list[threading.Event] = []  # the end of each forward a stop left running


def stoppable_forward(model: Callable[..., Any], idx: torch.Tensor) -> Any:
    """`model(idx)`; for a window of LONG_WINDOW_TOKENS or more, in a worker thread (see above)."""
    if idx.shape[-1] < LONG_WINDOW_TOKENS:
        return model(idx)
    return in_worker(model, idx)


def in_worker(fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)` in a daemon thread under this thread's grad mode, the result or its exception returned here;
    a signal handler that raises while it runs (Preempted) leaves the worker behind, recorded. The wait is on an
    Event, not `Thread.join`: a join interrupted by a signal marks a running thread as ended (CPython 3.11)."""
    out: dict[str, Any] = {}
    done = threading.Event()
    grad = torch.is_grad_enabled()  # thread-local: the evaluation's no_grad must hold in the worker too

    def work() -> None:
        try:
            with torch.set_grad_enabled(grad):
                out["value"] = fn(*args)
        except BaseException as err:  # noqa: BLE001 - handed to the waiting thread, raised there
            out["error"] = err
        finally:
            done.set()

    threading.Thread(target=work, name="pelab-long-forward", daemon=True).start()
    try:
        while not done.wait(WAIT_SECONDS):
            pass
    except BaseException:
        _abandoned.append(done)
        raise
    if "error" in out:
        raise out["error"]
    return out["value"]


def abandoned_forwards() -> bool:
    """A forward left running by a stop: libtorch aborts ("terminate called without an active exception") when
    the interpreter ends under it, so the process must end with os._exit."""
    return any(not done.is_set() for done in _abandoned)
