"""Causal attention: the single dispatch point for every encoding (the paths live in their own modules).

  no score bias     -> "sdpa_causal": F.scaled_dot_product_attention(is_causal=True) (flash / fused kernels)
  score bias        -> "sdpa_mask" (``sdpa``): SDPA with an additive float mask (bias + causal
                       -inf), in query chunks of ``chunk_size`` (keys only up to each chunk's last query): memory O(H*chunk*T); the
                       mask is passed 4-D, which SDPA's fused CPU kernel accepts (3-D -> math path). The
                       default on every device, CUDA too: it ran faster than FlexAttention on an H200
                       (experiments/benchmarks/README.md).
  local span        -> "sdpa_mask" with the span's keys only (``span``: sliding window, chunk);
                       with backend="flex", FlexAttention under the span's block mask (blocks outside skipped)
                    -> "explicit": on CPU, a mask that needs a gradient (a learned bias in training) goes
                       through ``explicit_attention`` (SDPA's fused CPU kernel gives no mask gradient)
  backend="flex"    -> "flex" (``flex``): FlexAttention with a score_mod adding the bias
                       (compiled; causal block mask; runs on CPU too under torch.compile); if it fails or is
                       refused, a warning and the SDPA path, with the reason recorded
Which path each scheme actually took is recorded per process (``record``; ``attention_paths``:
logged once per (scheme, path) at INFO and written to summary.json), so that no fallback is silent.
Evaluation-time explicit logits (log-length scaling, attention statistics) are ``logits``.

The bias (``bias_fn``) is one of the forms of ``pelab.score_bias`` (a tensor, ``CausalBias``, ``DistanceBias`` or a
per-chunk callable). All paths return the same numbers as ``reference_attention`` (explicit softmax); see
tests/test_attention*.py.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from pelab.model.attention.flex import flex_biased_attention, flex_state
from pelab.model.attention.record import note_call, recorded_paths
from pelab.model.attention.sdpa import chunked_biased_attention
from pelab.model.attention.span import Span
from pelab.model.config import ATTN_BACKENDS
from pelab.score_bias import BiasFn


def attention_paths() -> dict:
    """What this process's attention did so far, for summary.json: {"paths": {scheme: {path: {reason,
    first_call, compiled}}}, "flex_error": the FlexAttention failure that disabled it, or None}."""
    return {"paths": recorded_paths(), "flex_error": flex_state["error"]}


def reference_attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None = None) -> Tensor:
    """Plain causal softmax attention: softmax(q k^T / sqrt(Dh) + bias + causal) v. (B, H, T, Dh)."""
    T = q.shape[-2]
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, T, T)
    if bias is not None:
        scores = scores + bias
    future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    scores = scores.masked_fill(future, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def causal_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias_fn: BiasFn | None = None,
    chunk_size: int = 1024,
    dropout_p: float = 0.0,
    backend: str = "auto",
    q_start: int = 0,
    scheme: str | None = None,
    span: Span | None = None,
) -> Tensor:
    """q, k, v (B, H, T, Dh) -> (B, H, T, Dh), causal, with an optional score bias (see module doc).

    ``backend`` (model.attn_backend): "auto" and "sdpa": the SDPA paths; "flex": FlexAttention for a score
    bias (any device; on CPU under torch.compile), falling back to SDPA with a warning if it fails.
    ``q_start`` > 0: only the queries q_start..T-1 (against keys 0..T-1), (B, H, T - q_start, Dh) --
    evaluation of the last rows (``GPT.hidden(from_index=...)``); they take the chunked SDPA path whatever
    the bias (is_causal aligns a shorter query block top-left). ``scheme``: the label the path taken is
    recorded under (``attention_paths``); None records nothing. ``span`` (a local layer of ``model.layout``:
    sliding window or chunk, ``pelab.model.attention.span``): the chunked SDPA path with the span's keys only, or with
    backend="flex" FlexAttention under the span's block mask, whatever the bias.
    """
    if backend not in ATTN_BACKENDS:
        raise ValueError(f"model.attn_backend={backend} is unknown; choose one of {list(ATTN_BACKENDS)}")
    if q_start:
        return chunked_biased_attention(q, k, v, bias_fn, chunk_size, dropout_p, q_start, scheme=scheme,
                                        reason="the last rows only (q_start > 0)", span=span)
    if bias_fn is None and span is None:
        note_call(scheme, "sdpa_causal", None, q, None)
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
    reason = _sdpa_reason(q, backend, dropout_p)
    if reason is None:  # FlexAttention asked for and possible
        out, reason = flex_biased_attention(q, k, v, bias_fn, strict=False, span=span)
        if out is not None:
            note_call(scheme, "flex", "model.attn_backend=flex", q, bias_fn)
            return out
    if span is not None:
        reason = f"a local span ({span.kind} {span.size}); {reason}"
    return chunked_biased_attention(q, k, v, bias_fn, chunk_size, dropout_p, scheme=scheme, reason=reason,
                                    span=span)


def _sdpa_reason(q: Tensor, backend: str, dropout_p: float) -> str | None:
    """Why a score bias takes the SDPA path rather than FlexAttention; None: try FlexAttention."""
    if backend == "sdpa":
        return (
            "SDPA asked for: model.attn_backend=sdpa, or a bias computed per layer and chunk (CoPE's content bias, "
            "FoX's forget gate)"
        )
    if backend == "auto":
        if q.is_cuda:
            return ("model.attn_backend=auto: additive-mask SDPA, faster than FlexAttention on an H200 "
                    "(experiments/benchmarks/README.md)")
        return "model.attn_backend=auto"
    if dropout_p > 0.0:
        return "model.attn_backend=flex refused: FlexAttention has no attention dropout (model.dropout > 0)"
    if flex_state["error"] is not None:
        return f"model.attn_backend=flex refused: FlexAttention failed earlier in this process ({flex_state['error']})"
    return None

