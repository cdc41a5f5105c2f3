"""Which attention path each scheme actually took, recorded per process, so that no fallback is silent:
logged once per (scheme, path) at INFO and written to summary.json (``pelab.model.attention.attention_paths``
adds FlexAttention's failure, if any). Every attention module records through ``note_call``.
"""

from __future__ import annotations

import logging

import torch
from torch import Tensor

from pelab.score_bias import BiasFn

log = logging.getLogger("pelab.model.attention")  # the package's name: one logger for every path

_paths: dict[str, dict[str, dict]] = {}  # scheme -> path -> {"reason", "first_call", "compiled"}


def note_path(scheme: str, path: str, reason: str | None, signature: str, compiled: bool) -> None:
    """Record that ``scheme``'s attention ran on ``path`` (and why not a faster one); logged once per
    (scheme, path). Under torch.compile it is called after each compiled graph runs, never traced
    (registered with dynamo below), so recording adds no graph break and no recompile."""
    entry = _paths.setdefault(scheme, {})
    if path in entry:
        return
    entry[path] = {"reason": reason, "first_call": signature, "compiled": compiled}
    log.info("attention: pe=%s takes the %s path (%s)%s%s", scheme, path, signature,
             f"; {reason}" if reason else "", " under torch.compile" if compiled else "")


if hasattr(torch._dynamo.config, "reorderable_logging_functions"):
    torch._dynamo.config.reorderable_logging_functions.add(note_path)


def recorded_paths() -> dict:
    """{scheme: {path: {reason, first_call, compiled}}} so far (a copy)."""
    return {s: {p: dict(v) for p, v in paths.items()} for s, paths in _paths.items()}


def reset_attention_paths() -> None:
    _paths.clear()


def note_call(scheme: str | None, path: str, reason: str | None, q: Tensor, bias_fn: BiasFn | None) -> None:
    if scheme is None:  # internal calls (e.g. the flex self-check) are not the model's attention
        return
    kind = "none" if bias_fn is None else type(bias_fn).__name__
    B, H, T, Dh = q.shape
    signature = f"{q.device.type} {str(q.dtype).removeprefix('torch.')} B={B} H={H} T={T} Dh={Dh} bias={kind}"
    note_path(scheme, path, reason, signature, torch.compiler.is_compiling())
