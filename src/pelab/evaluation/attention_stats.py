"""Attention diagnostics by evaluation length: why an encoding extrapolates or not.

At each evaluation length n, on the first `windows` windows of the evaluation span, per layer and head,
averaged over the queries of position buckets [0, L), [L, 2L), [2L, 4L), ... (L = the training length):

* ``entropy``      -- of the attention distribution, in nats; log(i+1) for uniform attention over the i+1 keys.
                      It grows with length when attention dilutes (LM-Infinite, Han et al. 2023; the reason for
                      log-length logit scaling, Chiang & Cholak 2022);
* ``distance``     -- mean attention distance sum_j p_ij (i - j), in tokens;
* ``mass_past_L``  -- attention mass on keys at distances never seen in training, i - j >= L (the receptive-field
                      argument of ALiBi, Press et al. 2022, and Sandwich, Chi et al. 2023);
* ``max_logit``    -- the largest pre-softmax logit of each query, averaged (``max_logit_peak``: the largest in the
                      bucket); RoPE's out-of-distribution rotations show here first.

The statistics are read through ``CausalSelfAttention.observer`` (explicit logits, evaluation only): with no
observer set the model runs its normal kernels, bit for bit.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from pelab.errors import PositionOutOfRange
from pelab.evaluation import progress
from pelab.evaluation.common import evaluating, model_device, stoppable_forward
from pelab.metric_keys import metric_key

STATS = ("entropy", "distance", "mass_past_L", "max_logit")


def query_stats(scores: Tensor, q0: int, train_length: int) -> dict[str, Tensor]:
    """Per-query statistics of pre-softmax logits ``scores`` (..., C, K) of queries q0..q0+C-1 against keys
    0..K-1, -inf on masked keys: each (..., C) fp32 (see the module doc)."""
    scores = scores.float()
    logp = torch.log_softmax(scores, dim=-1)
    p = logp.exp()
    C, K = scores.shape[-2:]
    dist = (torch.arange(q0, q0 + C, device=scores.device)[:, None]
            - torch.arange(K, device=scores.device)[None, :]).float()  # (C, K), i - j
    return {
        "entropy": -torch.where(p > 0, p * logp, torch.zeros_like(p)).sum(-1),
        "distance": (p * dist.clamp_min(0)).sum(-1),
        "mass_past_L": (p * (dist >= train_length)).sum(-1),
        "max_logit": scores.amax(-1),
    }


def buckets(length: int, train_length: int) -> list[tuple[int, int]]:
    """Query-position buckets [0, L), [L, 2L), [2L, 4L), ... cut at ``length``."""
    edges, hi = [0], train_length
    while hi < length:
        edges.append(hi)
        hi *= 2
    edges.append(length)
    return [(a, b) for a, b in itertools.pairwise(edges) if b > a]


class Recorder:
    """Sums the per-query statistics of one layer into (head, bucket) cells; an ``observer`` of the model."""

    def __init__(self, n_heads: int, bounds: list[tuple[int, int]], train_length: int):
        self.bounds, self.train_length = bounds, train_length
        self.sums = torch.zeros(len(STATS), n_heads, len(bounds), dtype=torch.float64)
        self.peak = torch.full((n_heads, len(bounds)), -math.inf, dtype=torch.float64)
        self.count = torch.zeros(len(bounds), dtype=torch.float64)  # queries per bucket (times windows)

    def __call__(self, scores: Tensor, q0: int) -> None:  # scores (B, H, C, K)
        st = query_stats(scores, q0, self.train_length)
        C = scores.shape[-2]
        for b, (lo, hi) in enumerate(self.bounds):
            a, z = max(lo, q0) - q0, min(hi, q0 + C) - q0
            if z <= a:
                continue
            for s, name in enumerate(STATS):
                self.sums[s, :, b] += st[name][..., a:z].double().sum(dim=(0, -1)).cpu()  # over windows, queries
            self.peak[:, b] = torch.maximum(self.peak[:, b], st["max_logit"][..., a:z].double().amax(dim=(0, -1)).cpu())
            self.count[b] += scores.shape[0] * (z - a)


@contextmanager
def observing(model: nn.Module, recorders: Sequence[Recorder]) -> Iterator[None]:
    """Set one recorder per attention layer of ``model`` (a pelab GPT) for the block; always removed after."""
    attns = [block.attn for block in model.blocks]
    try:
        for attn, rec in zip(attns, recorders, strict=True):
            attn.observer = rec
        yield
    finally:
        for attn in attns:
            attn.observer = None


def attention_diagnostics(model: nn.Module, tokens: Tensor, lengths: Sequence[int], train_length: int,
                          windows: int = 2) -> dict[str, Any]:
    """The statistics at each length on the first ``windows`` windows of ``tokens`` (each at positions
    0..n-1, like the extrapolation windows). Returns {"rows": [...], "seconds": wall time}; one row per
    (length, layer, head, bucket). A length the encoding cannot represent is skipped (no rows)."""
    t0 = time.perf_counter()
    device = model_device(model)
    n_heads = model.config.n_heads
    rows: list[dict[str, Any]] = []
    plan = {n: max(1, min(int(windows), (tokens.numel() - 1) // n)) for n in sorted({int(x) for x in lengths})
            if tokens.numel() >= n}  # windows of each length
    with evaluating(model), progress.opened("attention diagnostics", "windows", [(w, n) for n, w in plan.items()],
                                            model):
        for n, w in plan.items():
            idx = tokens[: w * n].view(w, n).to(device)  # (W, n)
            bounds = buckets(n, train_length)
            recs = [Recorder(n_heads, bounds, train_length) for _ in model.blocks]
            try:
                with observing(model, recs):
                    for i in range(w):  # one window per forward: (1, H, C, n) logits at a time
                        stoppable_forward(model, idx[i : i + 1])
            except PositionOutOfRange:
                progress.advance(w, n)  # skipped
                continue
            rows += _rows(n, recs, bounds)
    return {"rows": rows, "seconds": time.perf_counter() - t0, "windows": int(windows), "train_length": train_length}


def _rows(n: int, recs: list[Recorder], bounds: list[tuple[int, int]]) -> list[dict[str, Any]]:
    out = []
    for layer, rec in enumerate(recs):
        means = rec.sums / rec.count.clamp_min(1)  # (S, H, nb)
        for h in range(means.shape[1]):
            for b, (lo, hi) in enumerate(bounds):
                out.append({"length": n, "layer": layer, "head": h, "q_lo": lo, "q_hi": hi,
                            **{name: float(means[s, h, b]) for s, name in enumerate(STATS)},
                            "max_logit_peak": float(rec.peak[h, b])})
    return out


def layer_curves(rows: list[dict[str, Any]], stat: str) -> dict[int, dict[int, float]]:
    """{layer: {length: value}}: ``stat`` at the queries of each length's last bucket (the positions first
    reached at that length), averaged over heads -- the value-vs-length lines, one per layer."""
    last: dict[int, int] = {}
    for r in rows:
        last[r["length"]] = max(last.get(r["length"], 0), r["q_lo"])
    acc: dict[tuple[int, int], list[float]] = {}
    for r in rows:
        if r["q_lo"] == last[r["length"]]:
            acc.setdefault((r["layer"], r["length"]), []).append(r[stat])
    out: dict[int, dict[int, float]] = {}
    for (layer, n), vals in sorted(acc.items()):
        out.setdefault(layer, {})[n] = sum(vals) / len(vals)
    return out


def metrics(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Scalars ``attn/<stat>@<length>/layer<l>`` (the ``layer_curves`` values) and ``attn/<stat>@<length>``
    (their mean over layers: what pelab.report tabulates across a sweep)."""
    out: dict[str, float] = {}
    for stat in STATS:
        series = layer_curves(rows, stat)
        for layer, curve in series.items():
            out.update({metric_key(f"attn/{stat}", n, layer=layer): v for n, v in curve.items()})
        for n in sorted({n for curve in series.values() for n in curve}):
            vals = [curve[n] for curve in series.values() if n in curve]
            out[metric_key(f"attn/{stat}", n)] = sum(vals) / len(vals)
    return out
