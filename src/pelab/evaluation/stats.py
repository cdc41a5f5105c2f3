"""The statistics of every reported number, from ``scipy.stats``: Wilson intervals of probe accuracies, the
lost-in-the-middle gap with an interval, bootstrap intervals of means, perplexities over evaluation blocks with a
bootstrap over their documents (``clustered_ppl_interval``), McNemar's exact test for paired probe comparisons;
plus effective length and the area under accuracy vs log-length.

Every probe instance is a Bernoulli outcome (retrieved or not). A cell (kind, depth, length) holds n
independent instances, so its accuracy gets a Wilson score interval (Wilson 1927; good coverage at small n
and near 0 or 1, where the normal interval collapses to a point). Across depths the design is *paired*: the
same instances at every depth, only the gold item moves. Summaries over depths (the mean accuracy at a
length, the edges-minus-middle gap) are therefore means of per-instance scores, and their intervals come from
a paired bootstrap over instances (percentile, fixed seed: reproducible). Between two encodings probed with
the same seed the instances are the same too, so they are compared with McNemar's exact test on the
discordant pairs.
"""

from __future__ import annotations

import itertools
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import scipy.stats

LEVEL = 0.95  # every interval reported is a 95% interval
N_RESAMPLES = 2000  # bootstrap resamples: the interval ends move by ~1% of its width between seeds


def wilson(k: int, n: int, level: float = LEVEL) -> tuple[float, float]:
    """Wilson score interval of a proportion k / n (``scipy.stats.binomtest(...).proportion_ci``); (nan, nan)
    when n == 0. At k = 0 (k = n) the lower (upper) end is exactly 0 (1)."""
    if n <= 0:
        return float("nan"), float("nan")
    if not 0 <= k <= n:
        raise ValueError(f"wilson: need 0 <= k <= n, got k={k}, n={n}")
    ci = scipy.stats.binomtest(int(k), int(n)).proportion_ci(confidence_level=level, method="wilson")
    return (0.0 if k == 0 else float(ci.low)), (1.0 if k == n else float(ci.high))


def mean_interval(values: Sequence[float], level: float = LEVEL, seed: int = 0,
                  n_resamples: int = N_RESAMPLES) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of independent ``values`` (``scipy.stats.bootstrap``, a fixed
    seed: reproducible). (nan, nan) with fewer than two values or a non-finite one: no interval can be had."""
    x = np.asarray(values, dtype=float)
    if x.size < 2 or not np.isfinite(x).all():
        return float("nan"), float("nan")
    if np.all(x == x[0]):
        return float(x[0]), float(x[0])  # scipy warns on a degenerate sample; callers bound this case
    res = scipy.stats.bootstrap((x,), np.mean, confidence_level=level, n_resamples=n_resamples,
                                method="percentile", rng=np.random.default_rng(seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


# ---------------------------------------------------------------------------------------------
# Perplexity over evaluation blocks, clustered by document.
#
# The blocks of one document share its style and difficulty (their NLLs are correlated), so blocks are not
# independent: the document is the sampling unit. A perplexity exp(sum NLL / sum tokens) over documents of
# unequal length is a ratio estimator; its interval resamples whole documents (the cluster bootstrap: Davison &
# Hinkley 1997, section 3.8; Field & Welsh 2007) and recomputes the ratio from the drawn documents' totals.

APPROXIMATE_BELOW = 50  # documents: with fewer, a percentile interval of a ratio estimator is only approximate


class ClusteredInterval(NamedTuple):
    """A perplexity (or a ratio of two) with its document-clustered interval: the estimate, [lo, hi], the number
    of documents the blocks come from, the design effect (``clustered_ppl_interval``) and the label the report
    shows."""

    estimate: float
    lo: float
    hi: float
    n_documents: int
    design_effect: float
    label: str


def cluster_label(n_documents: int, level: float = LEVEL) -> str:
    """How a clustered interval was made, e.g. "95% percentile bootstrap over 27 documents (approximate below
    50)"."""
    label = f"{level:.0%} percentile bootstrap over {n_documents} documents"
    return label + (f" (approximate below {APPROXIMATE_BELOW})" if n_documents < APPROXIMATE_BELOW else "")


def ratio_bootstrap(num: np.ndarray, den: np.ndarray, level: float = LEVEL, seed: int = 0,
                    n_resamples: int = N_RESAMPLES) -> tuple[float, float, np.ndarray]:
    """Percentile bootstrap of the ratio sum(num) / sum(den) over n units (blocks or documents): units resampled
    with replacement (``scipy.stats.bootstrap`` over their indices, a fixed seed), the ratio recomputed from the
    drawn units' totals. Returns the interval's ends and the bootstrap distribution (n_resamples,)."""

    def ratio(idx: np.ndarray, axis: int = -1) -> np.ndarray:  # idx (..., n): drawn unit indices
        return num[idx].sum(axis=axis) / den[idx].sum(axis=axis)

    res = scipy.stats.bootstrap((np.arange(num.size),), ratio, vectorized=True, confidence_level=level,
                                n_resamples=n_resamples, method="percentile", rng=np.random.default_rng(seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high), res.bootstrap_distribution


def clustered_ppl_interval(block_nll: Sequence[float], block_tokens: Sequence[float] | float,
                           block_docs: Sequence[int], base_nll: Sequence[float] | None = None,
                           level: float = LEVEL, seed: int = 0,
                           n_resamples: int = N_RESAMPLES) -> ClusteredInterval:
    """exp(sum NLL / sum tokens) over K blocks with a percentile interval from a cluster bootstrap: whole
    documents resampled with replacement and the ratio recomputed from the drawn documents' NLL and token totals
    (documents differ in length: a ratio estimator, not a mean of block means; ``ratio_bootstrap``).

    ``block_nll`` (K,): summed NLL of each block; ``block_tokens``: its scored tokens, (K,) or one count for all;
    ``block_docs`` (K,): the document each block belongs to. With ``base_nll`` (K,), the same blocks' NLL at a
    reference length (same token counts), the statistic is the ratio ppl / ppl_base = exp(sum(NLL - base) /
    sum tokens): paired, both recomputed from the same drawn documents.

    The design effect is the variance of the log perplexity's bootstrap distribution over documents divided by
    that over blocks (as if blocks were independent; same seed and resamples): how much clustering inflates the
    variance, measured as the interval is made (Kish 1965, section 8.2, defines it as this variance ratio; the
    linearised ratio-estimator variance underestimates it when one document holds most of the blocks). NaN
    interval with fewer than two documents or a non-finite NLL."""
    a = np.asarray(block_nll, dtype=float) - (0.0 if base_nll is None else np.asarray(base_nll, dtype=float))
    t = np.broadcast_to(np.asarray(block_tokens, dtype=float), a.shape)  # (K,)
    _, d = np.unique(np.asarray(block_docs), return_inverse=True)
    doc_nll, doc_tokens = np.bincount(d, weights=a), np.bincount(d, weights=t)  # (D,) totals per document
    n_docs, label = doc_nll.size, cluster_label(doc_nll.size, level)
    estimate = math.exp(a.sum() / t.sum()) if np.isfinite(a).all() and t.sum() > 0 else float("nan")
    if n_docs < 2 or not math.isfinite(estimate):
        return ClusteredInterval(estimate, float("nan"), float("nan"), n_docs, float("nan"), label)
    rates = doc_nll / doc_tokens
    if np.all(rates == rates[0]):  # every document at one NLL per token: nothing to resample (scipy warns)
        return ClusteredInterval(estimate, estimate, estimate, n_docs, float("nan"), label)
    lo, hi, by_docs = ratio_bootstrap(doc_nll, doc_tokens, level, seed, n_resamples)
    *_, by_blocks = ratio_bootstrap(a, np.ascontiguousarray(t), level, seed, n_resamples)
    deff = float(np.var(by_docs) / np.var(by_blocks)) if np.var(by_blocks) > 0 else float("nan")
    return ClusteredInterval(estimate, math.exp(lo), math.exp(hi), n_docs, deff, label)


class _Words:
    """The 32-bit words a fresh ``np.random.default_rng`` hands its bounded-integer draws, in order: PCG64's
    ``next_uint32`` is each 64-bit output's low half, then its high half (its own one-word buffer, so the order runs
    across ``integers`` calls), read here in bulk from ``bit_generator.random_raw``."""

    def __init__(self, rng: np.random.Generator):
        self.bits, self.buf = rng.bit_generator, np.empty(0, dtype=np.uint32)

    def peek(self, k: int) -> np.ndarray:
        if self.buf.size < k:
            more = self.bits.random_raw((k - self.buf.size + 1) // 2).view(np.uint32)  # little-endian: low half first
            self.buf = np.concatenate([self.buf, more])
        return self.buf[:k]

    def skip(self, k: int) -> None:
        self.buf = self.buf[k:]


def _integers(words: _Words, bounds: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
    """``[rng.integers(0, b) for b in bounds]`` as numpy's Generator draws them (every bound in 2 .. 2^32 - 1):
    Lemire's multiply-shift of one 32-bit word per draw, a word whose low product falls under the threshold
    (2^32 - b) mod b rejected and the draw retried with the next word (numpy's ``buffered_bounded_lemire_uint32``),
    so the same numbers as the calls, without a Python call per draw. ``bounds``, ``thresholds``: uint64."""
    out = np.empty(bounds.size, dtype=np.int64)
    done = 0
    while done < bounds.size:
        b = bounds[done:]
        m = words.peek(b.size).astype(np.uint64) * b
        rejected = (m & np.uint64(0xFFFFFFFF)) < thresholds[done:]
        k = int(np.argmax(rejected)) if rejected.any() else b.size  # rare: 1 word in 2^32 / (2^32 mod b)
        out[done:done + k] = m[:k] >> np.uint64(32)
        words.skip(k + (k < b.size))  # the rejected word is spent; its draw takes the next one
        done += k
    return out


def _resampled_means_loop(gs: list[np.ndarray], rng: np.random.Generator, n_resamples: int) -> np.ndarray:
    """means[i, j]: the mean of the j-th group drawn in resample i, with its values redrawn (any group sizes)."""
    drawn = np.empty((n_resamples, len(gs)), dtype=np.int64)
    picks: list[list[np.ndarray]] = [[] for _ in gs]  # per group: the index vector of each of its draws
    for i in range(n_resamples):
        drawn[i] = rng.integers(0, len(gs), len(gs))
        for k in drawn[i]:
            picks[k].append(rng.integers(0, gs[k].size, gs[k].size))
    means = np.empty(drawn.shape)
    for k, g in enumerate(gs):
        if picks[k]:  # row sums of the (draws, size) matrix: the pairwise sum a 1-d mean takes, row by row
            means[drawn == k] = g[np.stack(picks[k])].sum(axis=1) / g.size
    return means


def _resampled_means_equal(gs: list[np.ndarray], rng: np.random.Generator, n_resamples: int,
                           chunk: int = 1 << 21) -> np.ndarray:
    """``_resampled_means_loop`` for groups of one size n >= 2, the same numbers: every resample then takes G + G n
    draws (G bounded by G, then G n by n), so the draws are laid out in advance and made in bulk (``_integers``),
    in chunks of about ``chunk`` draws."""
    values = np.stack(gs)  # (G, n)
    G, n = values.shape
    per = G + G * n
    pattern = np.concatenate([np.full(G, G, dtype=np.uint64), np.full(G * n, n, dtype=np.uint64)])
    thresholds = (np.uint64(1 << 32) - pattern) % pattern
    words, out = _Words(rng), []
    step = max(1, min(chunk // per, n_resamples))
    bounds, limits = np.tile(pattern, step), np.tile(thresholds, step)
    flat = values.ravel()
    for start in range(0, n_resamples, step):
        c = min(step, n_resamples - start)
        d = _integers(words, bounds[:c * per], limits[:c * per]).reshape(c, per)
        index = d[:, :G, None] * n + d[:, G:].reshape(c, G, n)  # (c, G, n): group drawn, then its values drawn
        out.append(flat.take(index).sum(axis=2) / n)  # (c, G): each row summed as one 1-d mean
    return np.concatenate(out)


def hierarchical_interval(groups: Sequence[Sequence[float]], level: float = LEVEL, seed: int = 0,
                          n_resamples: int = N_RESAMPLES) -> tuple[float, float]:
    """Percentile interval of the mean of group means by a two-level bootstrap: resample the groups (seeds), then
    the values inside each drawn group (instances). With several seeds the interval holds the seed-to-seed
    spread as well as the instance sampling; (nan, nan) with fewer than two groups."""
    gs = [np.asarray(g, dtype=float) for g in groups if len(g)]
    if len(gs) < 2 or not all(np.isfinite(g).all() for g in gs):
        return float("nan"), float("nan")
    # The draws in the generator's order (resample i: the groups, then each drawn group's values), the means taken
    # afterwards. Groups of one size (seeds probed on the same instances: the usual case) draw in bulk, ~10x faster
    # than a call per draw and the same numbers (tests/test_stats.py); other sizes, a call per draw.
    rng = np.random.default_rng(seed)
    equal = len({g.size for g in gs}) == 1 and gs[0].size >= 2 and sys.byteorder == "little"
    means = (_resampled_means_equal if equal else _resampled_means_loop)(gs, rng, n_resamples)
    stats = means.sum(axis=1) / len(gs)
    a = (1 - level) / 2
    lo, hi = np.quantile(stats, [a, 1 - a])
    return float(lo), float(hi)


def difference_interval(groups: Sequence[Sequence[float]], seed: int = 0) -> tuple[float, float, float]:
    """(mean, lo, hi) of per-instance differences in [-1, 1], one group per seed: the mean of the seeds' means, a
    two-level bootstrap over seeds then instances with several seeds, a bootstrap over the instances with one; when
    every instance of every seed gave the same difference, the bound of ``uniform_gap_interval`` (a bootstrap
    would claim no uncertainty)."""
    gs = [np.asarray(g, dtype=float) for g in groups if len(g)]
    if not gs:
        return float("nan"), float("nan"), float("nan")
    mean = float(np.mean([g.mean() for g in gs]))
    values = np.concatenate(gs)
    if values.min() == values.max():
        return (mean, *uniform_gap_interval(mean, values.size))
    lo, hi = hierarchical_interval(gs, seed=seed) if len(gs) > 1 else mean_interval(gs[0], seed=seed)
    return mean, lo, hi


def seeds_accuracy_interval(outcomes: Sequence[Sequence[Sequence[bool]]], seed: int = 0) -> tuple[float, float, float]:
    """(mean, lo, hi) of an accuracy over several seeds: ``outcomes[s][i][j]`` is seed s, instance j at depth i (one
    depth for mqar_offset). The rules of one seed (``depth_summary``) over the seeds together: a two-level bootstrap of
    the instances' mean outcomes (seeds, then instances), never narrower than Wilson over every outcome, and Wilson
    over the instances when every instance of every seed scored alike."""
    scores = [np.asarray(o, dtype=float).mean(axis=0) for o in outcomes if len(o) and len(o[0])]
    if not scores:
        return float("nan"), float("nan"), float("nan")
    mean = float(np.mean([s.mean() for s in scores]))
    pooled = np.concatenate(scores)
    if pooled.min() == pooled.max() and pooled[0] in (0.0, 1.0):
        return (mean, *wilson(int(pooled[0]) * pooled.size, pooled.size))
    lo, hi = hierarchical_interval(scores, seed=seed) if len(scores) > 1 else mean_interval(scores[0], seed=seed)
    k = sum(int(np.asarray(o, dtype=bool).sum()) for o in outcomes)
    n = sum(np.asarray(o).size for o in outcomes)
    w_lo, w_hi = wilson(k, n)
    return mean, min(lo, w_lo), max(hi, w_hi)


def t_interval(values: Sequence[float], level: float = LEVEL) -> tuple[float, float]:
    """Student-t interval of the mean of a few independent values (e.g. one per seed): mean +- t(n-1) s / sqrt(n)
    (``scipy.stats.t``); with 3 values t = 4.30. (nan, nan) with fewer than two or a non-finite value."""
    x = np.asarray(values, dtype=float)
    if x.size < 2 or not np.isfinite(x).all():
        return float("nan"), float("nan")
    half = scipy.stats.t.ppf((1 + level) / 2, x.size - 1) * x.std(ddof=1) / np.sqrt(x.size)
    return float(x.mean() - half), float(x.mean() + half)


def edge_mask(depths: Sequence[float]) -> np.ndarray | None:
    """True at the edge depths (the smallest and the largest), False at the interior ones; None with fewer
    than 3 distinct depths (no middle to compare with)."""
    d = np.asarray(depths, dtype=float)
    if len(set(d.tolist())) < 3:
        return None
    return (d == d.min()) | (d == d.max())


def depth_summary(depths: Sequence[float], outcomes: Sequence[Sequence[bool]], seed: int = 0) -> dict[str, float]:
    """Mean accuracy over depths and the lost-in-the-middle gap, each with a paired-bootstrap 95% interval.

    ``outcomes[i][j]``: instance j at depth ``depths[i]`` (the same instance j at every depth). The gap is
    the mean accuracy at the two edge depths minus the mean at the interior depths (positive = lost in the
    middle), which is the mean over instances of (mean edge outcome - mean interior outcome): the bootstrap
    resamples those per-instance differences (all equal: ``uniform_gap_interval``). Keys: acc, acc_lo, acc_hi, lim_gap, lim_gap_lo, lim_gap_hi
    (NaN where undefined: fewer than 3 depths for the gap, no instances, or unequal instance counts)."""
    nan = float("nan")
    out = dict.fromkeys(("acc", "acc_lo", "acc_hi", "lim_gap", "lim_gap_lo", "lim_gap_hi"), nan)
    if not outcomes or len({len(o) for o in outcomes}) != 1 or not len(outcomes[0]):
        return out
    x = np.asarray(outcomes, dtype=float)  # (depths, instances)
    mean = x.mean(axis=0)
    out["acc"] = float(mean.mean())
    if mean.min() in (0.0, 1.0) and mean.min() == mean.max():
        # Every instance failed (or passed) at every depth: the bootstrap can only resample that one value and
        # would claim no uncertainty ([0, 0] from 20 instances). The instances are the independent unit, so the
        # Wilson interval of k of n instances bounds it instead.
        out["acc_lo"], out["acc_hi"] = wilson(int(mean[0]) * mean.size, mean.size)
    else:
        # Near 0 or 1 only a few instances differ and the bootstrap has almost nothing to resample (one miss in
        # 200 x 5 outcomes gives [0.997, 1.000]): no interval is narrower than Wilson's over every outcome, as if
        # all were independent.
        lo, hi = mean_interval(mean, seed=seed)
        w_lo, w_hi = wilson(int(x.sum()), x.size)
        out["acc_lo"], out["acc_hi"] = min(lo, w_lo), max(hi, w_hi)
    edges = edge_mask(depths)
    if edges is not None:
        gap = x[edges].mean(axis=0) - x[~edges].mean(axis=0)
        out["lim_gap"] = float(gap.mean())
        if gap.min() == gap.max():
            out["lim_gap_lo"], out["lim_gap_hi"] = uniform_gap_interval(float(gap[0]), gap.size)
        else:
            out["lim_gap_lo"], out["lim_gap_hi"] = mean_interval(gap, seed=seed)
    return out


def uniform_gap_interval(gap: float, n: int) -> tuple[float, float]:
    """The interval of a mean of per-instance gaps in [-1, 1] when all n instances gave the same gap g (e.g.
    0: every instance retrieved, or missed, at every depth). A bootstrap would claim no uncertainty; the
    instances are the independent unit: the fraction w of instances whose gap differs from g is at most
    Wilson's upper end for 0 of n, and each can move the mean towards -1 or 1, so the mean lies in
    [g - w (g + 1), g + w (1 - g)]."""
    w = wilson(0, n)[1]
    return gap - w * (gap + 1.0), gap + w * (1.0 - gap)


def effective_length(lengths: Sequence[int], accs: Sequence[float], threshold: float = 0.9) -> int | None:
    """The longest length whose accuracy is >= ``threshold``; None when no length reaches it (n/a = NaN
    never does)."""
    ok = [int(L) for L, a in zip(lengths, accs) if math.isfinite(float(a)) and float(a) >= threshold]
    return max(ok) if ok else None


def auc_log_length(lengths: Sequence[int], accs: Sequence[float], train_length: int) -> float:
    """Area under accuracy vs x = log2(length / train_length), divided by the x range: in [0, 1], 1 = perfect
    at every length. Trapezoids between the measured lengths. A NaN accuracy (a length the model cannot
    represent, e.g. learned positions past their table) counts as 0: it retrieves nothing there. One
    length: its accuracy. NaN when there are no lengths."""
    pts = sorted((math.log2(int(L) / train_length), float(a) if math.isfinite(float(a)) else 0.0)
                 for L, a in zip(lengths, accs))
    if not pts:
        return float("nan")
    if len(pts) == 1 or pts[-1][0] == pts[0][0]:
        return pts[0][1]
    area = sum((x1 - x0) * (y0 + y1) / 2 for (x0, y0), (x1, y1) in itertools.pairwise(pts))
    return area / (pts[-1][0] - pts[0][0])


def mcnemar(a: Sequence[bool], b: Sequence[bool]) -> dict[str, float]:
    """McNemar's exact test of two paired outcome lists (the same instances scored by two models): a
    two-sided binomial test of the discordant pairs at 1/2 (``scipy.stats.binomtest``).

    Returns n (pairs), b01 (a wrong, b right), b10 (a right, b wrong) and p; p = 1 without discordant pairs.
    """
    if len(a) != len(b):
        raise ValueError(f"mcnemar: paired outcomes need equal lengths, got {len(a)} and {len(b)}")
    b01 = sum(1 for x, y in zip(a, b) if not x and y)
    b10 = sum(1 for x, y in zip(a, b) if x and not y)
    p = scipy.stats.binomtest(b01, b01 + b10, 0.5).pvalue if b01 + b10 else 1.0
    return {"n": len(a), "b01": b01, "b10": b10, "p": float(p)}


def bits(outcomes: Sequence[bool]) -> str:
    """Per-instance outcomes as a compact string, "1" = retrieved ("0110..."), for summary.json."""
    return "".join("1" if o else "0" for o in outcomes)


def unbits(s: str) -> list[bool]:
    return [c == "1" for c in s]


# ---------------------------------------------------------------------------------------------
# Between settings: the seed is the unit.
#
# Two settings run on the same seeds (same initialisation, data order and evaluation text) are compared seed by
# seed: a per-seed contrast d_s (log(a / b) for a perplexity, a - b for an accuracy), then a one-sample t over the
# seeds (df = n - 1). With balanced data this equals the linear mixed model with a random seed intercept. Probe
# instances and evaluation blocks are within-run precision, never the unit of a between-setting test: they share
# one trained model per seed. Sign and Wilcoxon tests cannot reach alpha / 6 below 8 seeds, so they are not used.

MIN_SEEDS = 3  # fewer paired seeds: no between-setting verdict (t(1) is 12.7; one seed-pair decides everything)


@dataclass(frozen=True)
class SeedTest:
    """A one-sample t test of per-seed contrasts: `estimate` their mean, [lo, hi] its t interval at `level`, `p`
    two-sided; `note` says why there is no test (then p is NaN): fewer than MIN_SEEDS seeds, or no spread."""

    n: int
    estimate: float
    lo: float
    hi: float
    p: float
    sd: float
    level: float
    note: str = ""

    @property
    def tested(self) -> bool:
        return not self.note


def seed_test(contrasts: Sequence[float], level: float = LEVEL, min_seeds: int = MIN_SEEDS) -> SeedTest:
    """`scipy.stats.ttest_1samp` of per-seed contrasts against 0, with its interval at `level` (a Bonferroni
    interval when `level` = 1 - alpha / m). Every seed giving the same contrast has no spread to test: 0 everywhere
    reads "no measurable difference" (e.g. every seed at 100 % in both rows), never p = 0 or NaN."""
    d = np.asarray(contrasts, dtype=float)
    d = d[np.isfinite(d)]
    n, nan = int(d.size), float("nan")
    mean = float(d.mean()) if n else nan
    sd = float(d.std(ddof=1)) if n > 1 else nan
    if n < min_seeds:
        return SeedTest(n, mean, nan, nan, nan, sd, level,
                        f"{n} paired seed(s): no between-setting verdict below {min_seeds}")
    if np.ptp(d) <= 1e-12 * max(1.0, float(np.abs(d).max())):
        note = ("no measurable difference (the same value in both rows in every seed)" if np.all(d == 0) else
                "the same difference in every seed: no spread to test")
        return SeedTest(n, mean, mean, mean, nan, 0.0, level, note)
    res = scipy.stats.ttest_1samp(d, 0.0)
    ci = res.confidence_interval(level)
    return SeedTest(n, mean, float(ci.low), float(ci.high), float(res.pvalue), sd, level)


def intersection_union(tests: Sequence[SeedTest]) -> float:
    """p of "the difference has one sign at every budget" (Berger 1982's intersection-union test): the largest of
    the per-budget p-values, and 1 when the estimates disagree in sign or a budget has no test."""
    if not tests or not all(t.tested for t in tests):
        return 1.0
    signs = {np.sign(t.estimate) for t in tests}
    return max(t.p for t in tests) if len(signs) == 1 and 0 not in signs else 1.0


def holm(p: Sequence[float], alpha: float = 0.05) -> list[float]:
    """Holm's step-down adjusted p-values (family-wise error rate), ``statsmodels.stats.multitest.multipletests``."""
    if not len(p):
        return []
    from statsmodels.stats.multitest import multipletests

    return [float(x) for x in multipletests(list(p), alpha=alpha, method="holm")[1]]


def bonferroni_level(m: int, alpha: float = 0.05) -> float:
    """The confidence level of the intervals beside a family of m verdicts: 1 - alpha / m (Holm has no matching
    simultaneous intervals; Bonferroni's hold jointly)."""
    return 1.0 - alpha / max(1, m)


def budget_interaction(contrasts: np.ndarray) -> SeedTest | None:
    """Does the contrast change with the budget? `contrasts` (seeds, budgets), one seed's runs at every budget
    (they share initialisation and data order, so the seed is the unit). Two budgets: a t test of each seed's
    last-minus-first difference; more: the same on each seed's least-squares slope over the budget index. None
    with one budget."""
    d = np.asarray(contrasts, dtype=float)
    if d.ndim != 2 or d.shape[1] < 2:
        return None
    x = np.arange(d.shape[1]) - (d.shape[1] - 1) / 2
    per_seed = d[:, -1] - d[:, 0] if d.shape[1] == 2 else d @ x / (x @ x)
    return seed_test(per_seed)


def pooled_sd(groups: Sequence[Sequence[float]]) -> tuple[float, int]:
    """(sd, df) pooled over groups of per-seed contrasts: sqrt(sum (n_i - 1) s_i^2 / sum (n_i - 1)); groups with
    fewer than two values add nothing. (nan, 0) without any."""
    ss, df = 0.0, 0
    for g in groups:
        x = np.asarray(g, dtype=float)
        x = x[np.isfinite(x)]
        if x.size > 1:
            ss += float(((x - x.mean()) ** 2).sum())
            df += x.size - 1
    return (math.sqrt(ss / df), df) if df else (float("nan"), 0)


def sd_upper(sd: float, df: int, level: float = 0.8) -> float:
    """One-sided `level` upper confidence bound of a standard deviation estimated with df degrees of freedom:
    sd * sqrt(df / chi2_{1-level}(df)) (the planning value that guards against a small pilot's luck)."""
    return sd * math.sqrt(df / scipy.stats.chi2.ppf(1 - level, df)) if df > 0 else float("nan")


def t_power(size: float, n: int, alpha: float) -> float:
    """Power of a two-sided one-sample t test with n values for a true mean of ``size`` sds: both tails of the
    noncentral t (as ``statsmodels.stats.power.TTestPower``). Far from the effect scipy's noncentral t can give NaN
    for the opposite tail (df 2, noncentrality 19.6); that tail is below P(T < 0) = Phi(-nc), taken as 0 when that
    bound is under 1e-12, and any other NaN raises."""
    df, nc = n - 1, abs(size) * math.sqrt(n)
    crit = scipy.stats.t.ppf(1 - alpha / 2, df)
    near, far = scipy.stats.nct.sf(crit, df, nc), scipy.stats.nct.cdf(-crit, df, nc)
    if math.isnan(far) and scipy.stats.norm.cdf(-nc) < 1e-12:
        far = 0.0
    if math.isnan(near + far):
        raise ValueError(f"the noncentral t gave no power for {size:g} sds at n = {n}, alpha = {alpha:g}")
    return float(near + far)


def seeds_for_power(effect: float, sd: float, alpha: float, power: float = 0.8, most: int = 10_000) -> int | None:
    """Seeds needed to detect a true mean contrast `effect` with sd `sd` at two-sided `alpha` with `power`: the fewest
    n >= MIN_SEEDS whose one-sample t has that power (``t_power``; a search over n, where statsmodels' root finder
    returns NaN for effects many sds wide); None when effect or sd is not a positive finite number, or beyond `most`."""
    if not (math.isfinite(effect) and math.isfinite(sd)) or effect == 0 or sd <= 0:
        return None
    size = abs(effect) / sd
    return next((n for n in range(MIN_SEEDS, most + 1) if t_power(size, n, alpha) >= power), None)
