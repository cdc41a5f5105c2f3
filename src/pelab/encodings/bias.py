"""Score-bias schemes: a per-head function of (query position, key position) added to attention logits.

All are identical for every layer (one module per model, as T5 does), so the bias is computed once per
forward (``PositionEncoding.prepare``). ALiBi, T5, KERPLE and Sandwich depend on the distance
i - j only (``bias_translation_invariant``); FIRE also on the query position i. Causal masking is added
by the attention code, not here.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pelab.encodings.base import PositionEncoding
from pelab.encodings.settings import (
    KERPLE_VARIANTS,
    T5_BIAS_SCALES,
    FIREConfig,
    KERPLEConfig,
    SandwichConfig,
    T5BiasConfig,
    t5_bias_scale,
)


def _distance(q_pos: Tensor, k_pos: Tensor) -> Tensor:
    """query - key position: (Tq,), (Tk,) -> (Tq, Tk); (B, Tq), (B, Tk) -> (B, Tq, Tk)."""
    return q_pos[..., :, None] - k_pos[..., None, :]


def _with_heads(per_head: Tensor, pairs: Tensor) -> tuple[Tensor, Tensor]:
    """per_head (H,) and pairs (Tq, Tk) | (B, Tq, Tk) as broadcastable views in the heads-first layout:
    (H, 1, 1) and (1, Tq, Tk), or (1, H, 1, 1) and (B, 1, Tq, Tk)."""
    if pairs.dim() == 2:
        return per_head[:, None, None], pairs[None]
    return per_head[None, :, None, None], pairs[:, None]


def _heads_first(per_head: Tensor, index: Tensor) -> Tensor:
    """per_head (H, N) gathered at index (Tq, Tk) -> (H, Tq, Tk); index (B, Tq, Tk) -> (B, H, Tq, Tk)."""
    out = per_head[:, index]
    return out if index.dim() == 2 else out.transpose(0, 1)


# ---- ALiBi -----------------------------------------------------------------------------------------
def alibi_slopes(n_heads: int) -> list[float]:
    """Press et al. 2022: 2^(-8h/n) for n a power of two; otherwise the power-of-two slopes for
    k = 2^floor(log2 n) followed by every other slope of 2k, up to n in total."""

    def power_of_two(n: int) -> list[float]:
        return [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]

    if n_heads <= 0:
        raise ValueError(f"model.n_heads must be positive; got {n_heads}")
    k = 2 ** math.floor(math.log2(n_heads))
    if k == n_heads:
        return power_of_two(n_heads)
    return power_of_two(k) + power_of_two(2 * k)[0::2][: n_heads - k]


class ALiBi(PositionEncoding):
    """Linear biases: bias[h, i, j] = -m_h * (i - j) for key j <= query i; slopes fixed, not learned."""

    has_bias = True
    bias_translation_invariant = True

    def __init__(self, d_model: int, n_heads: int, **common):
        super().__init__(d_model, n_heads, **common)
        self.register_buffer(
            "slopes", torch.tensor(alibi_slopes(n_heads), dtype=torch.float32), persistent=False
        )

    def _apply(self, fn, recurse=True):
        # keep the slopes exact fp32 even if the model is cast to bf16/fp16
        super()._apply(fn, recurse)
        self.slopes = torch.tensor(alibi_slopes(self.n_heads), dtype=torch.float32, device=self.slopes.device)
        return self

    def score_bias(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        slopes, dist = _with_heads(self.slopes, _distance(q_pos, k_pos).to(torch.float32))
        return -slopes * dist  # (H, Tq, Tk) or (B, H, Tq, Tk)

    def diagnostics(self, n_positions: int) -> dict:
        return {"slopes": self.slopes.detach().cpu()}


# ---- T5 relative bias --------------------------------------------------------------------------------
def t5_causal_bucket(distance: int, num_buckets: int = 32, max_distance: int = 128) -> int:
    """Causal T5 bucket of n = query - key >= 0: exact below B/2, then log-spaced up to max_distance."""
    exact = num_buckets // 2
    n = max(distance, 0)
    if n < exact:
        return n
    log_bucket = exact + math.floor(
        math.log(n / exact) / math.log(max_distance / exact) * (num_buckets - exact)
    )
    return min(num_buckets - 1, log_bucket)


class T5Bias(PositionEncoding):
    """T5's bucketed relative bias (Raffel et al. 2020), causal buckets.

    One learned table [num_buckets, heads] per model, shared by all layers (as in T5). Initialised
    N(0, init_std) with init_std = d_model^-0.5 by default, like Hugging Face's T5.

    ``bias_scale`` multiplies the table before it is added to the scaled logits q.k / sqrt(d_head).
    1 adds the table as it is, as Hugging Face's T5 does: its ``position_bias`` is the table, unmultiplied, added
    to q.k, which T5 does not divide by sqrt(d_kv) (``scaling = 1.0``; that factor is in the query's init
    instead) -- one table unit is one logit in both. ``sqrt_head_dim`` (= sqrt(d_head), the default) is
    x-transformers': ``RelativePositionBias(scale=dim_head ** 0.5)`` multiplies its table, N(0, 1)
    (``init_std=1.0`` for that init too), by sqrt(d_head) and adds it to q.k * dim_head ** -0.5. Under Adam the
    table moves ~lr per step whatever its scale, so the scale is also the bias's learning-rate multiplier
    in logit units (why sqrt_head_dim is the default: experiments/peer/README.md).
    """

    has_bias = True
    bias_translation_invariant = True

    Config = T5BiasConfig

    def __init__(self, d_model: int, n_heads: int, *, num_buckets: int, max_distance: int,
                 init_std: float | None, bias_scale: Any = "sqrt_head_dim", **common):
        super().__init__(d_model, n_heads, **common)
        self.bias_scale = t5_bias_scale(bias_scale, d_model // n_heads)
        if self.bias_scale is None:
            raise ValueError(f"pe.bias_scale={bias_scale!r} must be a number > 0 or one of {list(T5_BIAS_SCALES)}")
        self.num_buckets = int(num_buckets)
        self.max_distance = int(max_distance)
        self.table = nn.Embedding(self.num_buckets, n_heads)
        nn.init.normal_(self.table.weight, std=init_std if init_std is not None else d_model**-0.5)
        # all distances >= max_distance share the last bucket, so a lookup over 0..max_distance suffices
        lut = [t5_causal_bucket(n, self.num_buckets, self.max_distance) for n in range(self.max_distance + 1)]
        self.register_buffer("bucket_of_distance", torch.tensor(lut, dtype=torch.long), persistent=False)

    def buckets(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """Bucket ids (Tq, Tk) or (B, Tq, Tk)."""
        dist = _distance(q_pos, k_pos).clamp(0, self.max_distance)
        return self.bucket_of_distance[dist]

    def score_bias(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        # (H, max_distance+1): the bias of every distance, then one gather over the (Tq, Tk) distances
        per_distance = self.table.weight[self.bucket_of_distance].t()
        if self.bias_scale != 1.0:
            per_distance = per_distance * self.bias_scale
        dist = _distance(q_pos, k_pos).clamp(0, self.max_distance)
        return _heads_first(per_distance, dist).to(torch.float32)


# ---- KERPLE ------------------------------------------------------------------------------------------
def _inverse_softplus(y: Tensor) -> Tensor:
    """x with softplus(x) = y (y > 0)."""
    return y + torch.log(-torch.expm1(-y))


class KERPLE(PositionEncoding):
    """Kernelized relative positions (Chi et al. 2022), per head h and distance n = i - j >= 0:

      log:   bias = -r1_h * log(1 + r2_h * n)
      power: bias = -r1_h * n ** r2_h,  r2_h in (0, 2]

    r1, r2 > 0 are learned. The paper clamps them after each step; here they are a softplus of free
    parameters (power r2: 2 * sigmoid), which keeps them positive without a projection step. Init as the
    paper's code: log r1 ~ U(0, 2), r2 ~ U(0, 1); power r1 ~ U(0, 1), r2 ~ U(0, 2).
    """

    has_bias = True
    bias_translation_invariant = True
    VARIANTS = KERPLE_VARIANTS

    Config = KERPLEConfig

    def __init__(self, d_model: int, n_heads: int, *, variant: str, eps: float, **common):
        super().__init__(d_model, n_heads, **common)
        self.variant = variant
        self.eps = float(eps)  # lower bound of the initial values, away from softplus' flat end
        scale_r1, scale_r2 = (2.0, 1.0) if variant == "log" else (1.0, 2.0)
        r1 = (torch.rand(n_heads) * scale_r1).clamp(min=self.eps)
        r2 = (torch.rand(n_heads) * scale_r2).clamp(min=self.eps, max=2.0 - self.eps)
        self.r1_raw = nn.Parameter(_inverse_softplus(r1))
        if variant == "log":
            self.r2_raw = nn.Parameter(_inverse_softplus(r2))
        else:
            self.r2_raw = nn.Parameter(torch.logit(r2 / 2.0))

    def r1(self) -> Tensor:
        return F.softplus(self.r1_raw.float())

    def r2(self) -> Tensor:
        if self.variant == "log":
            return F.softplus(self.r2_raw.float())
        return 2.0 * torch.sigmoid(self.r2_raw.float())

    def score_bias(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        n = _distance(q_pos, k_pos).clamp(min=0).to(torch.float32)  # (Tq, Tk) or (B, Tq, Tk)
        r1, _ = _with_heads(self.r1(), n)
        r2, n = _with_heads(self.r2(), n)
        if self.variant == "log":
            return -r1 * torch.log1p(r2 * n)
        # n**r2 at n = 0 is 0, but its r2-gradient 0 * log(0) is NaN: take the power of n >= 1 only
        return -r1 * torch.where(n > 0, n.clamp(min=1.0).pow(r2), 0.0)


# ---- Sandwich ----------------------------------------------------------------------------------------
def sandwich_slopes(n_heads: int) -> list[float]:
    """Head h = 1..H divides the bias by its compression ratio 8h/H (Chi et al. 2023, as ALiBi's slopes)."""
    return [n_heads / (8.0 * h) for h in range(1, n_heads + 1)]


class Sandwich(PositionEncoding):
    """Sandwich (Chi et al. 2023): the inner product of two sinusoidal embeddings of dimension d' as bias,

      bias_h(n) = (sum_{i=1}^{d'/2} cos(n * w_i) - d'/2) * H / (8h),   w_i = base^(-2i/d'),  n = i - j,

    i.e. p_m . p_n shifted so that distance 0 has bias 0 (and every other distance a negative one), and
    scaled per head like ALiBi. No parameters.
    """

    has_bias = True
    bias_translation_invariant = True

    Config = SandwichConfig

    def __init__(self, d_model: int, n_heads: int, *, dim: int | None, base: float, **common):
        super().__init__(d_model, n_heads, **common)
        self.dim = int(dim) if dim is not None else d_model
        self.base = float(base)
        self.register_buffer("omega", self._omega(), persistent=False)
        self.register_buffer("head_scale", torch.tensor(sandwich_slopes(n_heads)), persistent=False)

    def _omega(self) -> Tensor:
        i = torch.arange(1, self.dim // 2 + 1, dtype=torch.float64)
        return (self.base ** (-2.0 * i / self.dim)).float()

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)  # keep the frequencies and scales fp32 under model.to(bf16)
        self.omega = self._omega().to(self.omega.device)
        self.head_scale = torch.tensor(sandwich_slopes(self.n_heads), device=self.omega.device)
        return self

    # above this many (pair, frequency) products, score_bias computes each distance once instead
    MAX_DIRECT_ELEMENTS = 2**22

    def score_bias(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        n = _distance(q_pos, k_pos).to(torch.float32)  # (Tq, Tk) or (B, Tq, Tk)
        if n.numel() * self.omega.numel() <= self.MAX_DIRECT_ELEMENTS:
            # e.g. the model's per-distance table, (1, 2T-1): no host sync, nothing dynamo cannot trace
            scale, bias = _with_heads(self.head_scale, torch.cos(n[..., None] * self.omega).sum(-1) - self.dim / 2)
            return bias * scale
        # sum_i cos(n w_i) over d'/2 frequencies, a Tq*Tk*d'/2 temporary: computed per distance instead
        # (the same products: identical numbers; min/max are a host sync, and a graph break under compile)
        lo, hi = int(n.min()), int(n.max())
        d = torch.arange(lo, hi + 1, device=n.device, dtype=torch.float32)
        per_distance = torch.cos(d[:, None] * self.omega).sum(-1) - self.dim / 2  # (hi-lo+1,)
        index = (n - lo).long()
        scale, bias = _with_heads(self.head_scale, per_distance[index])
        return bias * scale  # (H, Tq, Tk) or (B, H, Tq, Tk)


# ---- FIRE --------------------------------------------------------------------------------------------
class FIRE(PositionEncoding):
    """Functional Interpolation for Relative Positions (Li et al. 2023):

      bias(i, j) = MLP( psi(i - j) / psi(max(i, L)) ),   psi(x) = log(|c x| + 1),

    MLP 1 -> hidden (ReLU) -> H. c (init 0.1) and the threshold L = |L_mult * init_L| (init_L: the training
    length unless set, L_mult init 1) are learned. Dividing by psi(max(i, L)) maps every distance of any
    query into [0, 1]: long inputs are interpolated into the trained range instead of extrapolated. One
    module for all layers.
    """

    has_bias = True

    # rows of the (rows, Tk, hidden) MLP temporary per block: bounds memory at long evaluation lengths
    MAX_HIDDEN_ELEMENTS = 16 * 2**20

    Config = FIREConfig

    def __init__(self, d_model: int, n_heads: int, *, mlp_width: int, init_c: float, init_L: float, eps: float,
                 **common):
        super().__init__(d_model, n_heads, **common)
        self.mlp = nn.Sequential(nn.Linear(1, mlp_width), nn.ReLU(), nn.Linear(mlp_width, n_heads))
        self.c = nn.Parameter(torch.tensor(float(init_c)))
        self.register_buffer("init_L", torch.tensor(float(init_L)))
        self.L_multiplier = nn.Parameter(torch.tensor(1.0))
        self.eps = float(eps)

    def normalized_distance(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """psi(i - j) / psi(max(i, L)): (Tq, Tk) or (B, Tq, Tk), fp32, in [0, 1] for j <= i."""
        qf, kf = q_pos.to(torch.float32), k_pos.to(torch.float32)
        c = self.c.float()
        dist = (qf[..., :, None] - kf[..., None, :]).clamp(min=0)  # future keys are masked anyway
        threshold = (self.L_multiplier.float() * self.init_L.float()).abs()
        normalizer = torch.log(torch.abs(c * torch.maximum(qf, threshold)) + 1) + self.eps  # (Tq,)
        return torch.log(torch.abs(c * dist) + 1) / normalizer[..., :, None]

    def score_bias(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        x = self.normalized_distance(q_pos, k_pos)  # (..., Tq, Tk)
        Tq, Tk = x.shape[-2:]
        rows = max(1, self.MAX_HIDDEN_ELEMENTS // max(1, Tk * self.mlp[0].out_features))
        blocks = [self.mlp(x[..., r : r + rows, :, None]) for r in range(0, Tq, rows)]  # (..., rows, Tk, H)
        bias = blocks[0] if len(blocks) == 1 else torch.cat(blocks, dim=-3)
        return bias.movedim(-1, -3).float()  # (..., H, Tq, Tk)
