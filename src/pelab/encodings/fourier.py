"""Fourier Position Embedding (FoPE; Hua et al. 2024, "Fourier Position Embedding: Enhancing Attention's Periodic
Extension for Length Generalization", arXiv 2412.17739): RoPE whose every channel pair is a Fourier series over the
frequencies, with the frequencies too low to complete a period within the training length clipped to zero.

  omega_m  = base^(-2m/Dh), kept where omega_m >= 2 pi / L (M of them); the lower ones are clipped to 0 and
             dropped (a zero frequency is no position signal)
  c_ho(t)  = sum_m cos(t omega_m) C_hmo,   s_ho(t) = sum_m sin(t omega_m) S_hmo      per head h, output pair o < P
  x'       = x * cat(c, c) + rotate_half(x) * cat(s, s)     (half-split pairs, as RoPE); pairs o >= P get c = s = 1

with P = min(M, Dh / 4) pairs carrying the series, S, C (H, M, P) initialised to a "step eye" (C_h[o * ceil(M / P),
o] = 1: pair o starts at one frequency) plus xavier-normal noise of gain ``pe.init_gain``, and frozen unless
``pe.learnable=true`` -- all as the reference's defaults and its experiment configs (TsinghuaC3I/Fourier-Position-
Embedding, ``olmo/model.py::FourierEmbedding`` with ``fourier_separate_basis``, ``fourier_separate_head``,
``fourier_ignore_zero``, ``fourier_init: eye_xavier_norm``, ``rope_clamp_floor_freq`` + ``rope_clamp_floor_to_zero``).
The padded pairs (c = s = 1: (x1 - x2, x2 + x1)) are the reference's ``F.pad(..., value=1)``.
Checked against that code's formula in tests/test_references.py.

Deviation: the reference gives every layer its own coefficients; here one set serves all layers (the contract gives an
encoding no layer index, as CoPE's table). The series is not a rotation, so the rotation's inverse-rotation backward
(``apply_rotary``) does not apply: it goes through plain autograd.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from pelab.encodings.base import PositionEncoding, PositionState
from pelab.encodings.rotary import _rotate_functional
from pelab.encodings.settings import FoPEConfig


def fope_frequencies(head_dim: int, base: float, train_length: int) -> Tensor:
    """(M,) fp32: RoPE's frequencies base^(-2m/Dh) (computed as the reference, fp32) that complete a period within
    train_length (omega >= 2 pi / L); the clipped ones are dropped."""
    # on the CPU even under a meta-device context (transformers' from_pretrained of an export): how many
    # frequencies survive the clipping is a data-dependent shape
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float, device="cpu") / head_dim))
    return inv_freq[inv_freq >= 2 * math.pi / train_length]


def step_eye(shape: tuple[int, ...]) -> Tensor:
    """(..., M, P) zeros with 1 at [..., o * ceil(M / P), o]: output pair o starts at frequency o * step."""
    eye = torch.zeros(shape)
    M, P = shape[-2:]
    step = math.ceil(M / P)
    for o in range(P):
        if o * step < M:
            eye[..., o * step, o] = 1.0
    return eye


class FoPE(PositionEncoding):
    """Each channel pair a Fourier series of the unclipped RoPE frequencies (see the module docstring)."""

    Config = FoPEConfig
    has_rotate = True

    def __init__(self, d_model: int, n_heads: int, *, base: float, init_gain: float, learnable: bool, **common):
        super().__init__(d_model, n_heads, **common)
        self.base = float(base)
        self.register_buffer("freq", fope_frequencies(self.head_dim, self.base, self.train_length), persistent=False)
        M = self.freq.numel()
        P = min(M, self.head_dim // 4)  # pairs carrying the series (the reference's output_dim)
        self.cos_coef, self.sin_coef = (nn.Parameter(self._init_coef(n_heads, M, P, init_gain), requires_grad=learnable)
                                        for _ in range(2))

    @property
    def rotates_head_subset(self) -> bool:
        return False  # the series' coefficients are per head, (H, M, P)

    @staticmethod
    def _init_coef(H: int, M: int, P: int, gain: float) -> Tensor:
        coef = torch.empty(H, M, P)
        nn.init.xavier_normal_(coef, gain=gain)  # fans of an (H, M, P) tensor, as the reference's
        return coef + step_eye((H, M, P))

    def rotary_tables(self, pos: Tensor) -> tuple[Tensor, Tensor]:
        """(T,) -> c, s (H, T, Dh/2); (B, T) -> (B, H, T, Dh/2); fp32, the pairs past P set to 1."""
        angles = pos.float()[..., None] * self.freq  # (..., T, M)
        c = torch.einsum("...tm,hmo->...hto", angles.cos(), self.cos_coef.float())  # (..., H, T, P)
        s = torch.einsum("...tm,hmo->...hto", angles.sin(), self.sin_coef.float())
        pad = self.head_dim // 2 - c.shape[-1]
        return (torch.nn.functional.pad(c, (0, pad), value=1.0), torch.nn.functional.pad(s, (0, pad), value=1.0))

    def rotate(self, q: Tensor, k: Tensor, state: PositionState) -> tuple[Tensor, Tensor]:
        c, s = state.tables
        h = self.head_dim // 2
        return _rotate_functional(q, c, s, h), _rotate_functional(k, c, s, h)

    def extra_repr(self) -> str:
        return (f"{super().extra_repr()}, base={self.base}, frequencies={self.freq.numel()}/{self.head_dim // 2}, "
                f"series_pairs={self.cos_coef.shape[-1]}, learnable={self.cos_coef.requires_grad}")
