"""Contextual Position Encoding (CoPE, Golovneva et al. 2024): positions are counts of gated keys.

For query i and key j <= i (per head, from this layer's q and k):

  g_ij = sigmoid(q_i . k_j / sqrt(Dh))          does key j count as a step?
  p_ij = sum_{t=j}^{i} g_it                     contextual position of j seen from i (fractional)
  bias_ij = (1 - w) * (q_i . e[floor p_ij]) + w * (q_i . e[ceil p_ij]),   w = p_ij - floor p_ij

with p clamped to max_position - 1 and e a learned (max_position, Dh) table, initialised to zero as in the
paper's code. The bias depends on content, so it is the ``content_bias`` hook: the attention computes
it per layer and per query chunk. Used on its own (no other position signal), as in the paper.

Deviation: the paper gives each layer its own table e; here one table serves all layers (the contract
gives an encoding no layer index), so parameters are max_position * Dh per model, not per layer.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from pelab.encodings.base import PositionEncoding, PositionState
from pelab.encodings.settings import CoPEConfig
from pelab.score_bias import future_mask


def cope_positions(logits: Tensor, q0: int) -> Tensor:
    """logits q_i.k_j/sqrt(Dh) (..., C, K) of queries q0..q0+C-1 -> p_ij = sum_{t=j}^{i} sigmoid(logit_it),
    0 for future keys j > i. Overwrites ``logits`` (its future entries become -inf, sigmoid(-inf) = 0):
    one (B, H, C, K) copy fewer; matmul's backward does not need its output."""
    logits.masked_fill_(future_mask(q0, *logits.shape[-2:], device=logits.device), float("-inf"))
    return suffix_sum(torch.sigmoid(logits))


def suffix_sum(gates: Tensor) -> Tensor:
    """sum_{t >= j} g_t along the last dim, as total - prefix + g: one cumsum pass instead of
    flip-cumsum-flip (two extra copies of a (B, H, C, K) tensor); the rounding error, ~K * 1e-7 of the
    row sum, is far below the spacing of the integer positions it is interpolated between."""
    prefix = gates.cumsum(-1)
    return (prefix[..., -1:] - prefix).add_(gates)


def interpolate_logits(logits_int: Tensor, pos: Tensor) -> Tensor:
    """logits_int (..., C, P) = q . e[p] at integer p; pos (..., C, K) fractional in [0, P-1] -> (..., C, K).

    (1 - w) * z[floor p] + w * z[floor p + 1] with w = p - floor p; at an integer p, w = 0 and the
    upper index (clamped to P-1) does not matter."""
    lo = pos.floor()
    w = pos - lo
    lo = lo.long()
    hi = (lo + 1).clamp_(max=logits_int.shape[-1] - 1)
    z_lo, z_hi = logits_int.gather(-1, lo), logits_int.gather(-1, hi)
    return torch.lerp(z_lo, z_hi, w)


class CoPE(PositionEncoding):
    has_content_bias = True

    Config = CoPEConfig

    def __init__(self, d_model: int, n_heads: int, *, max_position: int, **common):
        super().__init__(d_model, n_heads, **common)
        # The largest contextual position (inclusive): larger counts clamp to it, so CoPE is never out of
        # range (n_positions stays None: unbounded).
        self.position_clamp = int(max_position) - 1
        self.pos_emb = nn.Parameter(torch.zeros(self.head_dim, self.position_clamp + 1))  # e^T: (Dh, P)

    def content_bias(self, q: Tensor, k: Tensor, q0: int, state: PositionState) -> Tensor:
        # q (B, H, C, Dh), k (B, H, K, Dh)
        logits = torch.matmul(q, k.transpose(-2, -1)).float().mul_(1.0 / math.sqrt(q.shape[-1]))  # (B, H, C, K)
        pos = cope_positions(logits, q0).clamp_(max=self.position_clamp)
        logits_int = torch.matmul(q.float(), self.pos_emb.float())  # (B, H, C, P)
        return interpolate_logits(logits_int, pos)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, position_clamp={self.position_clamp}"
