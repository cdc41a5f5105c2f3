"""What every evaluation shares: running a model in evaluation mode, its device, batch sizing by length, and
how a length an encoding cannot represent is reported."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

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
