"""Inputs shared by the attention tests (tests/test_attention*.py)."""

from __future__ import annotations

import torch

B, H, DH = 2, 3, 8


def qkv(T: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, T, DH, generator=g) for _ in range(3))


def random_bias(T: int, batched: bool = False, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*((B,) if batched else ()), H, T, T, generator=g) * 2
