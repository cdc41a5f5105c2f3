"""Explicit logits: evaluation-time attention that computes the pre-softmax scores itself, to scale them past
the training length (``log_length_scale``) or to show them to the attention statistics (an observer).
Training never takes this path."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from pelab.model.attention.record import note_call
from pelab.model.attention.sdpa import bias_chunk
from pelab.model.attention.span import Span, span_mask, visible_keys
from pelab.score_bias import BiasFn, CausalBias, DistanceBias, causal_additive_mask, future_mask


def causal_scores(q: Tensor, k: Tensor, bias_fn: BiasFn | None, q0: int, q1: int, span: Span | None = None
                  ) -> Tensor:
    """The pre-softmax logits of queries q0..q1-1 against keys 0..q1-1, fp32 (B, H, q1-q0, q1):
    q k^T / sqrt(Dh) + bias, -inf on future keys -- what every path above softmaxes. For evaluation-time
    paths only (attention statistics, per-query logit scaling); training never calls it. ``span``: -inf on the
    keys outside a local layer's span too (every key column kept, for the observers)."""
    qc, kc = q[..., q0:q1, :].float(), k[..., :q1, :].float()
    scores = qc @ kc.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, C, q1)
    if bias_fn is None:
        scores = scores.masked_fill(future_mask(q0, q1 - q0, q1, device=q.device), float("-inf"))
        return scores if span is None else span_mask(scores, span, q0, 0)
    if isinstance(bias_fn, DistanceBias):
        mask = bias_fn.chunk(q0, q1).flip(-2)  # rows back in query order
    else:
        mask = bias_chunk(bias_fn, q0, q1)
        if not isinstance(bias_fn, CausalBias):
            mask = causal_additive_mask(mask, q0)
    scores = scores + mask.float()
    return scores if span is None else span_mask(scores, span, q0, 0)


def log_length_scale(q0: int, q1: int, train_length: int, device: torch.device | None = None,
                     span: Span | None = None) -> Tensor:
    """(q1-q0, 1) logit multipliers log(n)/log(L) for the query at index i, n = i + 1 keys (fewer under a local
    ``span``: the keys it sees), where n > L, and 1 within the training window (Chiang & Cholak 2022): attention
    stays as peaked as at L instead of diluting over more keys. L >= 2."""
    n = visible_keys(span, q0, q1, device).float()
    return (n.log() / math.log(train_length)).clamp_min(1.0).where(n > train_length, torch.ones_like(n))[:, None]


def observed_attention(q: Tensor, k: Tensor, v: Tensor, bias_fn: BiasFn | None, chunk_size: int = 1024,
                       scale_from: int | None = None, observer: Callable | None = None, q_start: int = 0,
                       scheme: str | None = None, span: Span | None = None) -> Tensor:
    """Causal attention through explicit logits, one query chunk at a time: optionally scaled by
    ``log_length_scale`` (``scale_from`` = L) and shown to ``observer(scores (B, H, C, K), q0)`` before the
    softmax. (B, H, T, Dh) -> (B, H, T - q_start, Dh): queries q_start..T-1. The model takes this path only
    when one of the two is asked for at evaluation; otherwise ``causal_attention`` runs unchanged."""
    why = [w for w, on in (("logits scaled past the training length", scale_from is not None),
                           ("attention statistics observed", observer is not None)) if on]
    note_call(scheme, "explicit_logits", "evaluation: " + ", ".join(why), q, bias_fn)
    T = q.shape[-2]
    outs = []
    for q0 in range(q_start, T, chunk_size):
        q1 = min(q0 + chunk_size, T)
        scores = causal_scores(q, k, bias_fn, q0, q1, span)  # (B, H, C, q1)
        if scale_from is not None and q1 > scale_from:
            scores = scores * log_length_scale(q0, q1, scale_from, scores.device, span)
        if observer is not None:
            observer(scores, q0)
        outs.append((torch.softmax(scores, dim=-1) @ v[..., :q1, :].float()).to(v.dtype))
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-2)
