"""Rotary position embedding (Su et al. 2021) and its context-extension scalings.

Also here: p-RoPE (``frequency_fraction``) and xPos (``XPos``, RoPE with a distance decay).

Pairing convention: half-split (GPT-NeoX / Hugging Face): channel i is paired with channel i + d/2 of the
rotated block, and pair i turns by angle p * theta_i with theta_i = base^(-2i/d). Used everywhere here.

Scalings (s = factor, L = ``train_length`` = pe.train_length, the training length, d = rotary dims), as
pure functions so the tests can check them against the published formulas:
  none         theta_i
  linear       theta_i / s                                   (position interpolation, Chen et al. 2023)
  ntk          base' = base * s^(d/(d-2))                    (NTK-aware)
  dynamic_ntk  base' = base * (s*l/L - (s-1))^(d/(d-2)) at current length l > L; unchanged for l <= L
  yarn         NTK-by-parts ramp between theta_i and theta_i/s, and cos/sin times 0.1*ln(s) + 1 (Peng et al.)
  rerope, leaky_rerope, self_extend, string: theta_i, with a second position map for the pairs past a window,
               merged per pair through the content-bias hook (pelab.encodings.piecewise)

The inverse frequencies are a non-persistent buffer: they are not in the state_dict, so scaling can be
switched at evaluation time (building the model with another ``pe.scaling``) on a checkpoint trained
without it.
"""

from __future__ import annotations

import logging
import math

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from pelab.encodings.base import PositionEncoding, PositionState, positions_as_float
from pelab.encodings.piecewise import far_correction, far_offsets
from pelab.encodings.settings import PIECEWISE_TYPES, SCALING_TYPES, RoPEConfig, XPosConfig, rotary_dim

log = logging.getLogger(__name__)



# ---- pure functions: frequencies and attention factor --------------------------------------------------
def base_inv_freq(dim: int, base: float) -> Tensor:
    """theta_i = base^(-2i/dim), i = 0..dim/2-1, float64 (dim/2,)."""
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))


def ntk_base(dim: int, base: float, factor: float) -> float:
    """NTK-aware base change: base * s^(d/(d-2))."""
    return base * factor ** (dim / (dim - 2))


def dynamic_ntk_base(dim: int, base: float, factor: float, train_length: int, seq_len):
    """base * (s*l/L - (s-1))^(d/(d-2)) for l > L, else base; L = ``train_length``, l = ``seq_len`` (the
    current length), an int or a 0-d tensor (the tensor form avoids a device->host sync inside forward)."""
    L = train_length
    if isinstance(seq_len, Tensor):
        l = seq_len.to(torch.float32)
        scaled = base * (factor * l / L - (factor - 1.0)) ** (dim / (dim - 2))
        return torch.where(l > L, scaled, torch.full_like(scaled, base))
    if seq_len <= L:
        return base
    return base * (factor * seq_len / L - (factor - 1.0)) ** (dim / (dim - 2))


def yarn_correction_dim(num_rotations: float, dim: int, base: float, train_length: int) -> float:
    """Pair-dimension whose wavelength fits ``num_rotations`` times in L: d*ln(L/(2*pi*r)) / (2*ln(base))."""
    return dim * math.log(train_length / (num_rotations * 2 * math.pi)) / (2 * math.log(base))


def yarn_correction_range(
    dim: int, base: float, train_length: int, beta_fast: float = 32.0, beta_slow: float = 1.0
) -> tuple[int, int]:
    """(low, high) = floor(d(beta_fast)), ceil(d(beta_slow)), clamped to [0, dim-1]."""
    low = math.floor(yarn_correction_dim(beta_fast, dim, base, train_length))
    high = math.ceil(yarn_correction_dim(beta_slow, dim, base, train_length))
    return max(low, 0), min(high, dim - 1)


def yarn_ramp(low: float, high: float, n_pairs: int) -> Tensor:
    """gamma_i = clamp((i - low) / (high - low), 0, 1), float64 (n_pairs,); high nudged if equal to low."""
    if high == low:
        high = high + 0.001
    return ((torch.arange(n_pairs, dtype=torch.float64) - low) / (high - low)).clamp(0.0, 1.0)


def rope_inv_freq(
    dim: int,
    base: float = 10000.0,
    scaling: str = "none",
    factor: float = 1.0,
    train_length: int | None = None,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
    seq_len: int | None = None,
) -> Tensor:
    """Inverse frequencies (dim/2,) float64 for a scaling type; ``seq_len`` is used by dynamic_ntk only.
    The settings are checked once, by ``RoPEConfig.validate``; the piecewise types keep theta_i (their positions
    move instead)."""
    if scaling == "none" or scaling in PIECEWISE_TYPES:
        return base_inv_freq(dim, base)
    if scaling == "linear":
        return base_inv_freq(dim, base) / factor
    if scaling == "ntk":
        return base_inv_freq(dim, ntk_base(dim, base, factor))
    if scaling == "dynamic_ntk":
        if seq_len is None:
            return base_inv_freq(dim, base)
        return base_inv_freq(dim, dynamic_ntk_base(dim, base, factor, train_length, int(seq_len)))
    if scaling != "yarn":
        raise ValueError(f"unknown RoPE scaling {scaling!r}; known: {list(SCALING_TYPES)}")
    # yarn: keep theta_i for fast pairs (gamma=0), interpolate theta_i/s for slow ones (gamma=1)
    theta = base_inv_freq(dim, base)
    low, high = yarn_correction_range(dim, base, train_length, beta_fast, beta_slow)
    gamma = yarn_ramp(low, high, dim // 2)
    return (1.0 - gamma) * theta + gamma * theta / factor


def rope_attention_factor(scaling: str = "none", factor: float = 1.0) -> float:
    """Multiplier on cos/sin (logits scale by its square): YaRN 0.1*ln(s) + 1 for s > 1, else 1."""
    if scaling == "yarn" and factor > 1.0:
        return 0.1 * math.log(factor) + 1.0
    return 1.0


# ---- rotation ---------------------------------------------------------------------------------------
def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Half-split rotation of the first 2h channels of x (..., T, Dh) by cos, sin (..., T, h), in fp32:
    (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin); channels past 2h pass through.

    Why not ``x * cos + rotate_half(x) * sin``: that materialises the negated half, the concatenation and
    two full products (and autograd keeps them); here each half is written once into one output buffer.
    """
    h = cos.shape[-1]
    if torch.compiler.is_compiling():  # dynamo cannot trace out= into a slice (a graph break per call);
        return _rotate_functional(x, cos, sin, h)  # inductor fuses this form into one kernel anyway
    out = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    x1, x2 = x[..., :h], x[..., h : 2 * h]
    o1, o2 = out[..., :h], out[..., h : 2 * h]
    torch.mul(x1, cos, out=o1).addcmul_(x2, sin, value=-1.0)
    torch.mul(x2, cos, out=o2).addcmul_(x1, sin)
    if 2 * h < x.shape[-1]:
        out[..., 2 * h :] = x[..., 2 * h :]
    return out.to(x.dtype)


def _rotate_functional(x: Tensor, cos: Tensor, sin: Tensor, h: int) -> Tensor:
    """_rotate without out= buffers (the same fp32 products), for torch.compile."""
    x1, x2 = x[..., :h].float(), x[..., h : 2 * h].float()
    parts = [x1 * cos - x2 * sin, x2 * cos + x1 * sin]
    if 2 * h < x.shape[-1]:
        parts.append(x[..., 2 * h :].float())
    return torch.cat(parts, dim=-1).to(x.dtype)


class _Rotary(torch.autograd.Function):
    """_rotate with an explicit backward: the gradient of a rotation is the inverse rotation (sin -> -sin),
    so neither pass saves x or any intermediate. Under ``torch.func.vmap`` (models stacked over seeds,
    experiments/gpu/induction_heads.py) the rule below applies it once to the whole batch."""

    @staticmethod
    def forward(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        return _rotate(x, cos, sin)

    @staticmethod
    def setup_context(ctx, inputs: tuple[Tensor, Tensor, Tensor], output: Tensor) -> None:
        _, cos, sin = inputs
        ctx.save_for_backward(cos, sin)

    @staticmethod
    def vmap(info, in_dims: tuple[int | None, ...], x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, int]:
        # vmapped dims first; x (N, ..., T, Dh), cos / sin (T, h) or (N, T, h) viewed as (N, 1, ..., T, h) so
        # that they broadcast over x's dims as they do per model
        x = x.movedim(in_dims[0], 0) if in_dims[0] is not None else x.expand(info.batch_size, *x.shape)

        def batched(t: Tensor, d: int | None) -> Tensor:
            if d is None:
                return t
            t = t.movedim(d, 0)
            return t.reshape(t.shape[0], *([1] * (x.dim() - t.dim())), *t.shape[1:])

        return _Rotary.apply(x, batched(cos, in_dims[1]), batched(sin, in_dims[2])), 0

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None]:
        cos, sin = ctx.saved_tensors
        return _rotate(grad, cos, -sin), None, None


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate the first cos.shape[-1] channels of x (..., T, Dh) in fp32; the rest pass through.

    cos, sin (..., T, d) in the half-split layout cat(f, f): only their first half is read.
    """
    h = cos.shape[-1] // 2
    return _Rotary.apply(x, cos[..., :h], sin[..., :h])


class RoPE(PositionEncoding):
    """Rotary embedding on q and k, optionally on the first ``rotary_fraction`` of each head's channels; under a
    piecewise scaling (``PIECEWISE_TYPES``) also a content bias: the far pairs' second score (``content_bias``)."""

    Config = RoPEConfig
    has_rotate = True

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        base: float,
        rotary_fraction: float,
        frequency_fraction: float,
        scaling: dict,
        **common,
    ):
        super().__init__(d_model, n_heads, **common)
        self.base = float(base)
        self.rotary_dim = rotary_dim(self.head_dim, rotary_fraction)
        # p-RoPE (Barbero et al. 2024): keep the round(p * d/2) highest frequencies, set the rest to 0
        self.n_frequencies = round(float(frequency_fraction) * self.rotary_dim / 2)
        self.scaling = dict(scaling)
        self.attention_factor = rope_attention_factor(self.scaling["type"], self.scaling["factor"])
        self.register_buffer("inv_freq", self._scaled_inv_freq(), persistent=False)
        # ReRoPE, Self-Extend, STRING: the far pairs' scores come through the content-bias path (per instance: the
        # same class serves every scaling type, switchable at evaluation)
        self.has_content_bias = self.scaling["type"] in PIECEWISE_TYPES

    @property
    def rotates_head_subset(self) -> bool:
        return self.has_rotate and not self.has_content_bias  # a piecewise type's far-pair scores reach every head

    def _scaled_inv_freq(self) -> Tensor:
        """(d/2,) fp32 inverse frequencies under the scaling (dynamic_ntk: its l <= L value), p-RoPE applied."""
        s = self.scaling
        inv_freq = rope_inv_freq(
            self.rotary_dim, self.base, s["type"], s["factor"], self.train_length, s["beta_fast"], s["beta_slow"]
        )
        return self._keep_high(inv_freq).float()

    def _apply(self, fn, recurse=True):
        # model.to(bfloat16) would round the frequencies; recompute them in fp32 on the new device instead
        super()._apply(fn, recurse)
        self.inv_freq = self._scaled_inv_freq().to(self.inv_freq.device)
        return self

    def _inv_freq_for(self, pos: Tensor) -> Tensor:
        """(d/2,) fp32; dynamic_ntk derives the base from the current length max(pos)+1 without a sync."""
        if self.scaling["type"] != "dynamic_ntk":
            return self.inv_freq
        d = self.rotary_dim
        new_base = dynamic_ntk_base(d, self.base, self.scaling["factor"], self.train_length, pos.max() + 1)
        exponents = torch.arange(0, d, 2, dtype=torch.float32, device=pos.device) / d
        return self._keep_high(1.0 / new_base**exponents)

    def _keep_high(self, inv_freq: Tensor) -> Tensor:
        """p-RoPE: zero the lowest frequencies (the last pairs); a zero frequency leaves its pair unrotated."""
        if self.n_frequencies == inv_freq.shape[-1]:
            return inv_freq
        keep = torch.arange(inv_freq.shape[-1], device=inv_freq.device) < self.n_frequencies
        return inv_freq * keep

    def cos_sin(self, pos: Tensor) -> tuple[Tensor, Tensor]:
        """(T,) -> cos, sin (T, d); (B, T) -> (B, 1, T, d); fp32, times the attention factor."""
        freqs = positions_as_float(pos)[..., None] * self._inv_freq_for(pos)  # (..., T, d/2)
        emb = torch.cat((freqs, freqs), dim=-1)  # (..., T, d) half-split layout
        cos, sin = emb.cos(), emb.sin()
        if self.attention_factor != 1.0:
            cos, sin = cos * self.attention_factor, sin * self.attention_factor
        if pos.dim() == 2:  # (B, T, d) -> (B, 1, T, d): broadcast over heads
            cos, sin = cos[:, None], sin[:, None]
        return cos, sin

    def rotary_tables(self, pos: Tensor) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
        """(cos, sin) for q and for k: the same tables for RoPE."""
        cos_sin = self.cos_sin(pos)
        return cos_sin, cos_sin

    def rotate(self, q: Tensor, k: Tensor, state: PositionState) -> tuple[Tensor, Tensor]:
        q_tables, k_tables = state.tables
        return apply_rotary(q, *q_tables), apply_rotary(k, *k_tables)

    def content_bias(self, q: Tensor, k: Tensor, q0: int, state: PositionState) -> Tensor:
        """Piecewise scalings: q (B, H, C, Dh) of queries q0..q0+C-1 and k (B, H, K, Dh), already rotated to their
        exact positions -> (B, H, C, K) far score minus RoPE score on the pairs past the window, 0 elsewhere
        (pelab.encodings.piecewise)."""
        s = self.scaling
        q_pos, k_pos = state.pos[..., q0 : q0 + q.shape[-2]], state.pos[..., : k.shape[-2]]
        dq, dk = far_offsets(s["type"], q_pos, k_pos, window=s["window"], factor=s["factor"], group=s["group"],
                             local=s["local"])
        # turning the exact q, k on by the offset is the rotation to the far position (attention factor 1 here)
        q_far, k_far = apply_rotary(q, *self.cos_sin(dq)), apply_rotary(k, *self.cos_sin(dk))
        return far_correction(q, k, q_far, k_far, q_pos, k_pos, s["window"])

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, base={self.base}, rotary_dim={self.rotary_dim}, "
            f"frequencies={self.n_frequencies}/{self.rotary_dim // 2}, scaling={self.scaling}"
        )


# ---- xPos -----------------------------------------------------------------------------------------------
def xpos_zeta(dim: int) -> Tensor:
    """Sun et al. 2022: zeta_i = (2i/d + 0.4) / 1.4 for pair i = 0..d/2-1, float64 (d/2,); all in (0, 1)."""
    return (torch.arange(0, dim, 2, dtype=torch.float64) / dim + 0.4) / 1.4


class XPos(RoPE):
    """RoPE with an exponential decay: q_m times zeta^(m/scale_base), k_n times zeta^(-n/scale_base), so
    q_m . k_n gains zeta^((m-n)/scale_base) -- decaying with distance for causal (m >= n) attention.

    Positions are centred on the middle of the input before the powers are taken (as in torchscale):
    the product depends on m - n only, and centring keeps zeta^(+-p/scale_base) inside fp32 at long inputs.
    """

    Config = XPosConfig

    def __init__(self, d_model: int, n_heads: int, *, scale_base: float, **knobs):
        super().__init__(d_model, n_heads, **knobs)
        self.scale_base = float(scale_base)
        self.register_buffer("log_zeta", xpos_zeta(self.rotary_dim).log().float(), persistent=False)

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        self.log_zeta = xpos_zeta(self.rotary_dim).log().to(device=self.inv_freq.device, dtype=torch.float32)
        return self

    def decay(self, pos: Tensor) -> Tensor:
        """zeta^((p - centre)/scale_base): (T,) -> (T, d); (B, T) -> (B, 1, T, d), half-split layout, fp32."""
        p = positions_as_float(pos)
        centre = (p.amax(-1, keepdim=True) + p.amin(-1, keepdim=True)) / 2  # no host sync
        scale = torch.exp((p - centre)[..., None] / self.scale_base * self.log_zeta)  # (..., T, d/2)
        scale = torch.cat((scale, scale), dim=-1)
        return scale[:, None] if pos.dim() == 2 else scale

    def rotary_tables(self, pos: Tensor) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
        """RoPE's tables times the decay for q, divided by it for k."""
        cos, sin = self.cos_sin(pos)
        scale = self.decay(pos)
        return (cos * scale, sin * scale), (cos / scale, sin / scale)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, scale_base={self.scale_base}"
