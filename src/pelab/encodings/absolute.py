"""Absolute schemes: a vector per position added to the token embeddings (or nothing at all)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from pelab.encodings.base import PositionEncoding, PositionState, positions_as_float
from pelab.encodings.settings import LearnedConfig, SinusoidalConfig


class NoPE(PositionEncoding):
    """No positional signal: order comes only from the causal mask (Haviv et al. 2022)."""


def sinusoidal_table(pos: Tensor, d_model: int, base: float = 10000.0) -> Tensor:
    """PE(p, 2i) = sin(p / base^(2i/D)), PE(p, 2i+1) = cos(same); pos (...,) -> (..., D) fp32."""
    inv_freq = base ** (-torch.arange(0, d_model, 2, dtype=torch.float64, device=pos.device) / d_model)
    angle = positions_as_float(pos)[..., None] * inv_freq.to(torch.float32)  # (..., D/2)
    # interleave: even channels sin, odd channels cos, as in Vaswani et al.
    return torch.stack((angle.sin(), angle.cos()), dim=-1).flatten(-2)  # (..., D)


class Sinusoidal(PositionEncoding):
    """Fixed sinusoids (Vaswani et al. 2017), computed for any position (no table, no limit).

    ``scale`` multiplies the added vector. Default 0.02, the token embeddings' init std: the sinusoid's
    per-channel RMS (0.71 * scale) then stands to the token vectors as in fairseq's baseline of the ALiBi
    paper (embeddings N(0, D^-0.5) scaled by sqrt(D): RMS 1 against 0.71). At scale 1.0 the sinusoid
    swamps the 0.02-std token embeddings and training stalls near the unigram perplexity (measured:
    experiments/length_extrapolation/v2/README.md).

    ``learn_scale``: the multiplier is one learned scalar initialised at ``scale`` (x-transformers'
    ``ScaledSinusoidalEmbedding``, init D^-0.5; a ``pe.*`` parameter, so never weight-decayed).
    """

    has_embed = True

    Config = SinusoidalConfig

    def __init__(self, d_model: int, n_heads: int, *, base: float, scale: float, learn_scale: bool = False,
                 **common):
        super().__init__(d_model, n_heads, **common)
        self.base = float(base)
        self.scale = nn.Parameter(torch.tensor(float(scale))) if learn_scale else float(scale)

    def table(self, pos: Tensor) -> Tensor:
        """(T,) or (B, T) positions -> (T, D) or (B, T, D) fp32 vectors of the formula (before ``scale``)."""
        return sinusoidal_table(pos, self.d_model, self.base)

    def embed(self, x: Tensor, state: PositionState) -> Tensor:
        return x + (self.scale * self.table(state.pos)).to(x.dtype)  # sum composition; broadcasts (T, D) over the batch

    def diagnostics(self, n_positions: int) -> dict:
        return {"table": self.table(torch.arange(n_positions))}


class Learned(PositionEncoding):
    """A trained vector per position (GPT-2): ``nn.Embedding(max_position, D)``, init N(0, init_std).

    Positions >= max_position have no row: the model raises PositionOutOfRange (checked once per forward
    by ``GPT.forward`` through ``check_positions``; ``embed`` itself does not re-check, to avoid a sync).
    """

    has_embed = True

    Config = LearnedConfig

    def __init__(self, d_model: int, n_heads: int, *, max_position: int, init_std: float, **common):
        super().__init__(d_model, n_heads, **common)
        self.n_positions = int(max_position)  # bounded: positions past the table raise PositionOutOfRange
        self.weight = nn.Embedding(self.n_positions, d_model)
        nn.init.normal_(self.weight.weight, mean=0.0, std=init_std)

    def embed(self, x: Tensor, state: PositionState) -> Tensor:
        return x + self.weight(state.pos).to(x.dtype)  # (T, D) or (B, T, D)

    def diagnostics(self, n_positions: int) -> dict:
        n = min(n_positions, self.n_positions)
        return {"table": self.weight.weight[:n].detach().float().cpu()}
