"""Score-bias schemes: a per-head function of (query position, key position) added to attention logits.

Both are translation invariant and identical for every layer (``bias_shared_across_layers``), so the model
computes the bias once per forward. Causal masking is added by the attention code, not here.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from pelab.encodings.base import PositionEncoding


def _distance(q_pos: Tensor, k_pos: Tensor) -> Tensor:
    """query - key position: (Tq,), (Tk,) -> (Tq, Tk); (B, Tq), (B, Tk) -> (B, Tq, Tk)."""
    return q_pos[..., :, None] - k_pos[..., None, :]


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

    name = "alibi"
    has_bias = True
    bias_translation_invariant = True

    def __init__(self, d_model: int, n_heads: int, **knobs):
        super().__init__(d_model, n_heads, **knobs)
        self.register_buffer(
            "slopes", torch.tensor(alibi_slopes(n_heads), dtype=torch.float32), persistent=False
        )

    def _apply(self, fn, recurse=True):
        # keep the slopes exact fp32 even if the model is cast to bf16/fp16
        super()._apply(fn, recurse)
        self.slopes = torch.tensor(alibi_slopes(self.n_heads), dtype=torch.float32, device=self.slopes.device)
        return self

    def score_bias(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        dist = _distance(q_pos, k_pos).to(torch.float32)  # (Tq, Tk) or (B, Tq, Tk)
        if dist.dim() == 2:
            return -self.slopes[:, None, None] * dist  # (H, Tq, Tk)
        return -self.slopes[None, :, None, None] * dist[:, None]  # (B, H, Tq, Tk)

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
    """

    name = "t5_bias"
    has_bias = True
    bias_translation_invariant = True

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        num_buckets: int = 32,
        max_distance: int = 128,
        init_std: float | None = None,
        **knobs,
    ):
        super().__init__(d_model, n_heads, **knobs)
        if num_buckets < 2 or max_distance <= num_buckets // 2:
            raise ValueError(
                f"pe.num_buckets={num_buckets} must be >= 2 and pe.max_distance={max_distance} must exceed "
                f"num_buckets // 2"
            )
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
        dist = _distance(q_pos, k_pos).clamp(0, self.max_distance)
        return _heads_first(per_distance, dist).to(torch.float32)

    def diagnostics(self, n_positions: int) -> dict:
        n = torch.arange(min(n_positions, self.max_distance + 1))
        return {"bias_by_distance": self.score_bias(n[-1:], n)[:, 0].detach().flip(-1).cpu()}  # (H, n)
