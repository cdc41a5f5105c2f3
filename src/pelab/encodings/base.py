"""The position contract: one base class, optional hooks.

An encoding fills any of
  1. ``embed(x, pos)``            add a vector to the token embeddings   (sinusoidal, learned)
  2. ``rotate(q, k, pos)``        rotate queries and keys                (RoPE, xPos)
  3. ``score_bias(q_pos, k_pos)`` add a per-head bias to attention logits (ALiBi, T5, KERPLE, FIRE, Sandwich)
  4. ``content_bias(q, k, q0)``   add a bias computed from this layer's q and k (CoPE: positions are
                                  counts of gated keys, so they depend on content)
and sets the matching ``has_*`` flag; and may
  5. ``remap_positions(pos)``     replace the positions before the other hooks see them (randomized
                                  positions in training); the default returns ``pos`` itself.
The model calls the hooks whose flag is set and never asks which encoding it holds, so a new scheme is
one module + one YAML file.

Positions are a LongTensor ``pos`` of shape ``(T,)`` (shared by the batch) or ``(B, T)``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class PositionOutOfRange(ValueError):
    """A position the encoding cannot represent (e.g. past the end of a learned table)."""


class PositionEncoding(nn.Module):
    """Base class: every hook is a no-op; subclasses override the ones they need."""

    name: str = "base"
    has_embed: bool = False
    has_rotate: bool = False
    has_bias: bool = False
    has_content_bias: bool = False
    # True: score_bias(q_pos, k_pos) is the same for every layer, so the model computes it once per forward.
    bias_shared_across_layers: bool = True
    # True: score_bias depends on q_pos - k_pos only (ALiBi, T5), so for consecutive positions the model
    # computes one value per distance, (H, 2T-1), instead of one per (query, key) pair, (H, T, T).
    bias_translation_invariant: bool = False

    def __init__(self, d_model: int, n_heads: int, **knobs) -> None:
        super().__init__()
        if knobs:
            raise ValueError(
                f"pe={self.name} got unknown settings {sorted(knobs)}; remove them from conf/pe/{self.name}.yaml"
            )
        if d_model <= 0 or n_heads <= 0 or d_model % n_heads != 0:
            raise ValueError(
                f"model.d_model={d_model} must be a positive multiple of model.n_heads={n_heads}"
            )
        self.d_model = d_model
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.max_positions: int | None = None  # None = unbounded

    # ---- hooks (no-ops by default) -------------------------------------------------------------
    def embed(self, x: Tensor, pos: Tensor) -> Tensor:
        """(B, T, D) token vectors -> (B, T, D)."""
        return x

    def rotate(self, q: Tensor, k: Tensor, pos: Tensor) -> tuple[Tensor, Tensor]:
        """q, k (B, H, T, Dh) -> rotated q, k (same shapes and dtypes)."""
        return q, k

    def score_bias(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """(Tq,), (Tk,) -> (H, Tq, Tk) float bias (or (B, H, Tq, Tk) for (B, T) positions).

        Causal masking is not part of the bias: the attention code adds it.
        """
        raise NotImplementedError(f"pe={self.name} has no score bias (has_bias=False)")

    def content_bias(self, q: Tensor, k: Tensor, q0: int) -> Tensor:
        """q (B, H, C, Dh) of queries q0..q0+C-1, k (B, H, K, Dh) of keys 0..K-1 -> (B, H, C, K) bias.

        Called per layer and per query chunk; entries of future keys are ignored (masked by attention).
        """
        raise NotImplementedError(f"pe={self.name} has no content bias (has_content_bias=False)")

    def remap_positions(self, pos: Tensor) -> Tensor:
        """Positions the other hooks will see; return ``pos`` itself (the same object) to keep them."""
        return pos

    # ---- declarations -------------------------------------------------------------------------
    def num_learnable_params(self) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad)

    def check_positions(self, pos: Tensor | None = None, max_position: int | None = None) -> None:
        """Raise PositionOutOfRange if a position cannot be represented.

        ``max_position`` (the largest position, as a python int) lets callers that know it -- e.g. the
        model with its default ``arange(start, start + T)`` -- skip the device->host sync of ``pos.max()``.
        Unbounded encodings return immediately.
        """
        if self.max_positions is None:
            return
        if max_position is None:
            if pos is None or pos.numel() == 0:
                return
            max_position = int(pos.max().item())  # host sync: only for bounded encodings with explicit pos
        if max_position >= self.max_positions:
            raise PositionOutOfRange(
                f"{self.name} positions end at {self.max_positions - 1} "
                f"(pe.max_positions={self.max_positions}); got position {max_position}. "
                f"Evaluate within the table or train with a larger pe.max_positions"
            )

    def diagnostics(self, n_positions: int) -> dict:
        """Optional extras for logging; absolute schemes return {"table": (P, D) tensor}."""
        return {}

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, n_heads={self.n_heads}, max_positions={self.max_positions}"


def positions_as_float(pos: Tensor) -> Tensor:
    """Positions as fp32 (exact up to 2**24), the dtype all position math is done in."""
    return pos.to(torch.float32)
