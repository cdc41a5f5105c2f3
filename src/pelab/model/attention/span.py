"""Local attention spans: which keys a query may see besides the causal mask, per query chunk of the SDPA path.

  window W  sliding window: query i sees keys i-W+1 .. i (W keys, itself included; Mistral / Gemma local layers,
            Cohere's RNoPE-SWA, SWAN-GPT). HF: `sliding_window_overlay`, kv_idx > q_idx - W.
  chunk C   chunked attention: query i sees keys of its own C-token chunk, floor(j / C) == floor(i / C) (Llama 4's
            `attention_chunk_size`; HF: `chunked_overlay`).
Chunks and windows count rows of the input (row 0 = its first token), as HF counts cached tokens.

A query chunk q0..q1-1 needs keys from `first_key(q0)` only, so a span bounds the attention memory by
O(H * chunk * (chunk + span)) at any evaluation length, instead of O(H * chunk * T).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Span:
    kind: str  # "window" | "chunk"
    size: int  # tokens

    def first_key(self, q0: int) -> int:
        """The first key any query q0.. can see."""
        if self.kind == "window":
            return max(0, q0 - self.size + 1)
        return q0 // self.size * self.size

    def outside(self, q0: int, q1: int, k0: int, device: torch.device | None = None) -> Tensor:
        """(q1-q0, q1-k0) True where key k0.. lies outside query q0..'s span (the future is the causal mask's)."""
        q = torch.arange(q0, q1, device=device)[:, None]
        k = torch.arange(k0, q1, device=device)[None, :]
        if self.kind == "window":
            return k <= q - self.size
        return k // self.size != q // self.size

    def visible(self, q0: int, q1: int, device: torch.device | None = None) -> Tensor:
        """(q1-q0,) how many keys queries q0..q1-1 see (causal and span): Scalable-Softmax's n."""
        q = torch.arange(q0, q1, device=device)
        if self.kind == "window":
            return (q + 1).clamp_max(self.size)
        return q % self.size + 1

    def keys(self, chunk: int, length: int) -> int:
        """The most key columns one query chunk of `chunk` rows reads at `length` tokens (memory estimate)."""
        return min(length, chunk + self.size - 1)  # first_key lies at most size - 1 before q0 (both kinds)


def visible_keys(span: Span | None, q0: int, q1: int, device: torch.device | None = None) -> Tensor:
    """(q1-q0,) keys seen by queries q0..q1-1: i + 1 under the causal mask alone, fewer with a span."""
    if span is None:
        return torch.arange(q0 + 1, q1 + 1, device=device)
    return span.visible(q0, q1, device)


def span_mask(mask: Tensor, span: Span, q0: int, k0: int, flipped: bool = False) -> Tensor:
    """An additive mask (..., C, K) of queries q0.. and keys k0.. with -inf added outside the span (`flipped`:
    its rows list the queries in reverse order, as a ``DistanceBias`` chunk does)."""
    outside = span.outside(q0, q0 + mask.shape[-2], k0, mask.device)
    return mask.masked_fill(outside.flip(0) if flipped else outside, float("-inf"))
