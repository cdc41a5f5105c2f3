"""Contextual Position Encoding (CoPE, Golovneva et al. 2024): positions are counts of gated keys.

For query i and key j <= i (per head, from this layer's q and k):

  g_ij = sigmoid(q_i . k_j / sqrt(Dh))          does key j count as a step?
  p_ij = sum_{t=j}^{i} g_it                     contextual position of j seen from i (fractional)
  bias_ij = (1 - w) * (q_i . e[floor p_ij]) + w * (q_i . e[ceil p_ij]),   w = p_ij - floor p_ij

with p clamped to npos_max - 1 and e a learned (npos_max, Dh) table, initialised to zero as in the
paper's code. The bias depends on content, so it is the ``content_bias`` hook: the attention computes
it per layer and per query chunk. Used on its own (no other position signal), as in the paper.

Deviation: the paper gives each layer its own table e; here one table serves all layers (the contract
gives an encoding no layer index), so parameters are npos_max * Dh per model, not per layer.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from pelab.encodings.base import PositionEncoding


def cope_positions(gates: Tensor, q0: int) -> Tensor:
    """gates (..., C, K) of queries q0..q0+C-1 -> p_ij = sum_{t=j}^{i} g_it (0 for future keys j > i)."""
    C, K = gates.shape[-2:]
    q_idx = torch.arange(q0, q0 + C, device=gates.device)
    future = torch.arange(K, device=gates.device)[None, :] > q_idx[:, None]  # (C, K)
    gates = gates.masked_fill(future, 0.0)
    return gates.flip(-1).cumsum(-1).flip(-1)  # suffix sums over keys


def interpolate_logits(logits_int: Tensor, pos: Tensor) -> Tensor:
    """logits_int (..., C, P) = q . e[p] at integer p; pos (..., C, K) fractional -> (..., C, K)."""
    floor = pos.floor()
    w = pos - floor
    lo = logits_int.gather(-1, floor.long())
    hi = logits_int.gather(-1, pos.ceil().long())
    return lo * (1.0 - w) + hi * w


class CoPE(PositionEncoding):
    name = "cope"
    has_content_bias = True

    def __init__(self, d_model: int, n_heads: int, npos_max: int = 128, **knobs):
        super().__init__(d_model, n_heads, **knobs)
        if npos_max is None or int(npos_max) < 2:
            raise ValueError(f"pe.npos_max must be an integer >= 2; got {npos_max}")
        self.npos_max = int(npos_max)
        self.pos_emb = nn.Parameter(torch.zeros(self.head_dim, self.npos_max))  # e^T: (Dh, P)

    def content_bias(self, q: Tensor, k: Tensor, q0: int) -> Tensor:
        # q (B, H, C, Dh), k (B, H, K, Dh)
        logits = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))  # (B, H, C, K)
        pos = cope_positions(torch.sigmoid(logits.float()), q0).clamp(max=self.npos_max - 1)
        logits_int = torch.matmul(q.float(), self.pos_emb.float())  # (B, H, C, P)
        return interpolate_logits(logits_int, pos)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, npos_max={self.npos_max}"
