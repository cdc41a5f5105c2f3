"""The SDPA path of a score bias: SDPA with an additive float mask (bias + causal -inf), one query chunk at a
time (memory O(H * chunk * T)); on CPU, a mask that needs a gradient goes through ``explicit_attention``
instead. The path taken is recorded (``pelab.model.attention.record``)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from pelab.model.attention.record import note_call
from pelab.model.attention.span import Span, span_mask
from pelab.score_bias import BiasFn, CausalBias, DistanceBias, causal_additive_mask


def bias_chunk(bias_fn: BiasFn, q0: int, q1: int) -> Tensor:
    """Bias of queries q0..q1-1 against keys 0..q1-1: (..., q1-q0, q1)."""
    if isinstance(bias_fn, CausalBias):
        return bias_fn.mask[..., q0:q1, :q1]
    if isinstance(bias_fn, Tensor):
        return bias_fn[..., q0:q1, :q1]
    bias = bias_fn(q0, q1)
    if bias.shape[-2:] != (q1 - q0, q1):
        raise ValueError(
            f"bias_fn({q0}, {q1}) returned shape {tuple(bias.shape)}; expected (..., {q1 - q0}, {q1})"
        )
    return bias


def chunked_biased_attention(
    q: Tensor, k: Tensor, v: Tensor, bias_fn: BiasFn | None, chunk_size: int = 1024, dropout_p: float = 0.0,
    q_start: int = 0, scheme: str | None = None, reason: str | None = None, span: Span | None = None,
) -> Tensor:
    """SDPA with mask = bias + causal, one query chunk at a time (memory O(H * chunk * T)); queries
    q_start..T-1 only -> (B, H, T - q_start, Dh). No bias (None): the mask is the causal -inf alone.
    ``span`` (a local layer, ``pelab.model.attention.span``): each chunk reads only the keys its queries can see, from
    ``span.first_key(q0)`` (memory O(H * chunk * (chunk + span))), with -inf outside the span.
    The path ("sdpa_mask" or "explicit") is recorded under ``scheme`` with ``reason`` (see note_path)."""
    if chunk_size < 1:
        raise ValueError(f"model.attn_chunk_size must be >= 1; got {chunk_size}")
    T = q.shape[-2]
    if not 0 <= q_start < T:
        raise ValueError(f"q_start must be in [0, {T}); got {q_start}")
    outs = []
    for q0 in range(q_start, T, chunk_size):
        q1 = min(q0 + chunk_size, T)
        k0 = 0 if span is None else span.first_key(q0)  # keys before k0 lie outside every query's span
        qc, kc, vc = q[..., q0:q1, :], k[..., k0:q1, :], v[..., k0:q1, :]
        flipped = isinstance(bias_fn, DistanceBias)
        if flipped:
            # the chunk's mask lists queries in reverse order: flip the queries in and the outputs back
            qc, mask = qc.flip(-2), bias_fn.chunk(q0, q1)[..., k0:]
        elif bias_fn is None:
            mask = causal_additive_mask(q.new_zeros(1, q1 - q0, q1 - k0), q0 - k0)  # (1, C, q1 - k0)
        else:
            mask = bias_chunk(bias_fn, q0, q1)[..., k0:]  # (H | B,H, C, q1 - k0)
            if not isinstance(bias_fn, CausalBias):
                mask = causal_additive_mask(mask, q0 - k0)
        if span is not None:
            mask = span_mask(mask, span, q0, k0, flipped)
        if mask.dim() == 3:
            # (1, H, C, K) view: SDPA takes its fused CPU kernel for 4-D masks, the math path for 3-D ones
            mask = mask.unsqueeze(0)
        explicit = _needs_explicit(q, mask)
        if q0 == q_start:
            why = "CPU: the learned bias needs a mask gradient, which SDPA's fused CPU kernel does not give"
            note_call(scheme, "explicit" if explicit else "sdpa_mask",
                  "; ".join(filter(None, (reason, why if explicit else None))), q, bias_fn)
        out = (explicit_attention if explicit else _sdpa_masked)(qc, kc, vc, mask.to(q.dtype), dropout_p)
        outs.append(out.flip(-2) if flipped else out)
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-2)


def _needs_explicit(q: Tensor, mask: Tensor) -> bool:
    """A mask that needs a gradient (a learned bias in training) on CPU: SDPA would take its math path."""
    return mask.requires_grad and not q.is_cuda


def _sdpa_masked(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, dropout_p: float = 0.0) -> Tensor:
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)


def explicit_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, dropout_p: float = 0.0) -> Tensor:
    """softmax(q k^T / sqrt(Dh) + mask) v with plain ops; the mask already holds the causal -inf.

    Why not SDPA's math path: it scales q and k separately, copies them, and uses a "safe" softmax that
    scans every score row for all -inf (never the case under a causal mask); the T5 training step on CPU
    is faster this way (experiments/benchmarks/README.md).
    """
    scores = torch.matmul(q * (1.0 / math.sqrt(q.shape[-1])), k.transpose(-2, -1))  # (B, H, C, K)
    probs = torch.softmax(scores.add_(mask), dim=-1)  # in place: matmul's backward does not need scores
    if dropout_p > 0.0:
        probs = F.dropout(probs, p=dropout_p)
    return probs @ v
