"""Score-bias representations and causal masks: what an encoding builds once per forward and every attention
path reads. Below both the encodings (which build them) and the model (which applies them), so neither imports
the other for them.

A bias (``BiasFn``) is one of
  * a Tensor (H, T, T) or (B, H, T, T): the bias of every (query, key) pair; entries above the diagonal are
    ignored (the attention masks them);
  * a ``CausalBias``: the same with the causal -inf already added -- built once per forward and shared across
    layers, so that each layer only slices it;
  * a ``DistanceBias``: a translation-invariant bias as one value per (head, distance), (H, 2T-1), viewed per
    query chunk -- its learned table gets one gradient sum per distance (``DiagonalView``);
  * a callable ``bias_fn(q0, q1) -> Tensor (H | B,H, q1-q0, q1)``: the bias of queries q0..q1-1 against keys
    0..q1-1, computed on demand per query chunk, for inputs too long to materialise (H, T, T).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor


@dataclass(frozen=True)
class CausalBias:
    """A full (H, T, T) or (B, H, T, T) additive mask: score bias + causal -inf (see causal_bias)."""

    mask: Tensor


def antidiagonal_sums(grad: Tensor) -> Tensor:
    """(..., R, K) -> (..., R+K-1): out[..., m] = sum of grad[..., r, j] over r + j = m.

    Pad-and-reshape: with R zeros appended to each row, entry (r, j) sits at flat index r(K+R) + j
    = r(K+R-1) + (r+j), i.e. in column r+j of the same buffer read as rows of K+R-1 (the last R entries,
    padding of the last row, are dropped). One copy and one row sum: O(R*K), no scatter or atomics."""
    R, K = grad.shape[-2:]
    flat = F.pad(grad, (0, R)).flatten(-2)[..., : R * (K + R - 1)]  # (..., R*(K+R-1))
    return flat.unflatten(-1, (R, K + R - 1)).sum(-2)


class DiagonalView(torch.autograd.Function):
    """table (..., N) -> (..., R, K) with out[..., r, j] = table[..., offset + r + j]: a zero-copy strided view.

    Why a Function: autograd through a strided view (or a gather of T^2 indices) scatter-adds every one of
    the R*K gradient entries into the N table slots (atomics on CUDA: what made T5's training step slow on
    an H200, experiments/benchmarks/README.md); a translation-invariant bias needs one gradient per (head,
    distance), the sums along the view's anti-diagonals (``antidiagonal_sums``)."""

    generate_vmap_rule = True  # both passes work on the last dims only: vmap (models stacked over seeds) batches them

    @staticmethod
    def forward(table: Tensor, R: int, K: int, offset: int) -> Tensor:
        # windows of K consecutive entries, stepping by one: a view (unfold, not as_strided: dynamo traces it)
        return table[..., offset : offset + R + K - 1].unfold(-1, K, 1)  # (..., R, K)

    @staticmethod
    def setup_context(ctx, inputs: tuple[Tensor, int, int, int], output: Tensor) -> None:
        table, _, _, offset = inputs
        ctx.n, ctx.offset = table.shape[-1], offset

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None, None]:
        sums = antidiagonal_sums(grad)  # (..., R+K-1): table entries offset .. offset+R+K-2
        return F.pad(sums, (ctx.offset, ctx.n - ctx.offset - sums.shape[-1])), None, None, None


@dataclass(frozen=True)
class DistanceBias:
    """A translation-invariant bias + causal mask for T consecutive positions, as one value per distance:
    ``table[:, n]`` is the bias at distance (query - key) = T-1-n, n = 0..2T-2, and -inf where that distance
    is negative. The (C, K) mask of a query chunk is then a zero-copy strided view of it (``chunk``): memory
    O(H*T) for any chunk, where materialising the bias costs O(H*chunk*T) per chunk and layer. A learned
    table's gradient is summed per distance (``DiagonalView``).
    """

    table: Tensor  # (H, 2T-1)
    T: int

    def chunk(self, q0: int, q1: int) -> Tensor:
        """(1, H, q1-q0, q1) mask of queries q0..q1-1 against keys 0..q1-1, its rows in REVERSE query order.

        Row r (query i = q1-1-r), key j reads table[T - q1 + r + j], whose distance is i - j: the view
        steps +1 along both rows and keys (strides must be non-negative), hence the reversed rows."""
        return DiagonalView.apply(self.table, q1 - q0, q1, self.T - q1)[None]

    def full(self) -> Tensor:
        """The (H, T, T) mask in query order (bias + causal -inf), materialised: what the CUDA kernels read.
        Its gradient still reaches the table as one sum per distance."""
        return self.chunk(0, self.T)[0].flip(-2)


def distance_bias(pe, T: int, device: torch.device) -> DistanceBias:
    """The encoding's per-distance bias table for positions 0..T-1 (any start, by translation invariance)."""
    keys = torch.arange(2 * T - 1, device=device)
    query = torch.full((1,), T - 1, device=device)
    values = pe.score_bias(query, keys)[:, 0]  # (H, 2T-1): distances T-1 .. -(T-1)
    return DistanceBias(values.masked_fill(keys > T - 1, float("-inf")).contiguous(), T)


BiasFn = Tensor | CausalBias | DistanceBias | Callable[[int, int], Tensor]


def future_mask(q0: int, C: int, K: int, device: torch.device | None = None) -> Tensor:
    """(C, K) True where key j > query i, for queries q0..q0+C-1 and keys 0..K-1."""
    q_idx = torch.arange(q0, q0 + C, device=device)
    return torch.arange(K, device=device)[None, :] > q_idx[:, None]


def causal_additive_mask(bias: Tensor, q0: int) -> Tensor:
    """bias (..., C, K) for queries q0..q0+C-1 -> bias with -inf where key index > query index."""
    return bias.masked_fill(future_mask(q0, *bias.shape[-2:], device=bias.device), float("-inf"))


def causal_bias(bias: Tensor) -> CausalBias:
    """Add the causal mask to a full (..., T, T) bias once, for every layer of a forward to reuse."""
    return CausalBias(causal_additive_mask(bias, 0))
