"""Paired comparisons between settings, and how a comparison moves along training.

Runs with the same seed see the same batches (the data order is a function of seed, step and rank) and, since
wave 3, are scored on the same evaluation blocks, so two settings run on the same seeds are compared seed by
seed: the difference of log perplexity (or of log ratio) per seed, a Student-t interval of its mean over the
seeds (``scipy.stats.ttest_rel``) and a p-value. Every comparison of one report is one family: the p-values are
Holm-adjusted across it, and a difference is called "resolved" only where the adjusted test rejects at 5%;
otherwise "not resolved at n seeds". With 3 seeds t(2) = 4.30: only differences large against the seed-to-seed
spread resolve, as they should.

Retrieval accuracy (`--compare probe/<kind>/acc`) is compared on the same probe instances instead: per seed, the
per-instance difference of the two rows' outcomes (averaged over the depths at which an instance was asked, so the
instances are the independent unit), a one-sample t test of its mean, and an intersection-union rule across seeds:
p = the largest per-seed p, and 1 when the seeds disagree in sign, so "resolved" means "in every seed". The
interval is a two-level bootstrap of the difference (seeds, then instances): it holds the seed-to-seed spread.
Rows whose runs did not acquire retrieval in-window are not compared (their probes measure nothing learned).

Which rows are compared: pairs that differ in exactly one of the settings that label the rows (e.g. the
encoding at one budget, or the budget for one encoding), on the seeds both have (at least two), with the same
corpus and evaluation text; or every row against a `baseline`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.stats

from pelab.errors import ReportError
from pelab.evaluation.stats import difference_interval
from pelab.metric_keys import MetricKey, metric_key, parse_key
from pelab.report.aggregation import Row, acquired_rows, metric_lengths, outcome_matrix, pairing_key, settings

ALPHA = 0.05
# The metrics compared, by default: on the log scale (perplexities and ratios are positive; a difference of logs
# is the ratio of the two settings' values).
COMPARED = ("extrap/ppl", "extrap/ppl_ratio")


@dataclass
class Comparison:
    a: Row
    b: Row
    metric: str  # e.g. "extrap/ppl_ratio@1024"
    n: int  # seeds
    ratio: float  # exp(mean log difference): a / b
    lo: float
    hi: float
    p: float
    p_adj: float = math.nan
    scale: str = "log"  # log: ratio a / b and its interval; diff: difference a - b (retrieval accuracy)
    note: str = ""  # why a declared pair was not tested (then p is NaN and it is not in the Holm family)

    @property
    def key(self) -> MetricKey:
        return parse_key(self.metric)

    @property
    def resolved(self) -> bool:
        return self.p_adj < ALPHA

    def verdict(self) -> str:
        if self.note:
            return self.note
        return "resolved" if self.resolved else f"not resolved at {self.n} seeds"


def holm(p: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment of a family of p-values (controls the family-wise error rate): the i-th
    smallest times (m - i), made monotone, capped at 1. (scipy.stats has Benjamini-Hochberg, not Holm.)"""
    m = len(p)
    order = sorted(range(m), key=lambda i: p[i])
    out, running = [math.nan] * m, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return out


def paired(a: Row, b: Row, metric: str) -> Comparison | None:
    """`metric` of a vs b on their common seeds (log scale), or None with fewer than two finite pairs."""
    by_seed = lambda row: {j.setting("seed"): j.metrics.get(metric, math.nan) for j in row.jobs}
    va, vb = by_seed(a), by_seed(b)
    seeds = sorted(s for s in set(va) & set(vb) if va[s] > 0 and vb[s] > 0 and math.isfinite(va[s] + vb[s]))
    if len(seeds) < 2:
        return None
    x, y = np.log([va[s] for s in seeds]), np.log([vb[s] for s in seeds])
    d = x - y
    if np.ptp(d) <= 1e-9 * max(1.0, float(np.abs(d).max())):  # identical differences (up to rounding): no spread
        # to test (e.g. a ratio at the training length)
        return None
    res = scipy.stats.ttest_rel(x, y)
    ci = res.confidence_interval(1 - ALPHA)
    return Comparison(a, b, metric, len(seeds), math.exp(d.mean()), math.exp(ci.low), math.exp(ci.high),
                      float(res.pvalue))


def instance_differences(a: Row, b: Row, kind: str, length: int, seed: Any) -> np.ndarray:
    """Per probe instance of one seed: a's outcome minus b's, averaged over the depths (or prefixes) at which the
    instance was asked at `length` (instance i is the same at every depth). Empty when the seed's jobs did not
    probe the same instances."""
    ja = next((j for j in a.jobs if j.setting("seed") == seed), None)
    jb = next((j for j in b.jobs if j.setting("seed") == seed), None)
    if ja is None or jb is None or pairing_key(ja) != pairing_key(jb):
        return np.empty(0)
    (da, xa), (db, xb) = outcome_matrix(ja, kind, length), outcome_matrix(jb, kind, length)
    common = sorted(set(da) & set(db))
    if not common:
        return np.empty(0)
    n = min(xa.shape[1], xb.shape[1])
    pick = lambda depths, x: x[[depths.index(d) for d in common], :n]  # (common depths, n)
    return (pick(da, xa) - pick(db, xb)).mean(axis=0)


def paired_accuracy(a: Row, b: Row, metric: str) -> Comparison | None:
    """Retrieval accuracy of a vs b on the same instances (see the module doc), or None with fewer than two seeds
    that probed the same instances."""
    k = parse_key(metric)
    if k.variant:  # probe outcomes are kept for the main evaluation only
        return None
    groups = [d for s in sorted(set(a.seeds) & set(b.seeds))
              if (d := instance_differences(a, b, k.kind, k.length, s)).size >= 2]
    if len(groups) < 2:
        return None
    means = [float(d.mean()) for d in groups]
    ps = [1.0 if np.all(d == d[0]) else float(scipy.stats.ttest_1samp(d, 0.0).pvalue) for d in groups]
    same_sign = all(m > 0 for m in means) or all(m < 0 for m in means)
    _, lo, hi = difference_interval(groups)  # (no instance differing: a bound, not [0, 0])
    return Comparison(a, b, metric, len(groups), float(np.mean(means)), lo, hi, max(ps) if same_sign else 1.0,
                      scale="diff")


def same_text(a: Row, b: Row) -> bool:
    """Whether two rows' runs saw the same corpus and were scored on the same evaluation text."""
    def text(row: Row) -> set:
        return {(str(((j.summary.get("data") or {}).get("fingerprint") or {}).get("key")),
                 j.extrapolation.get("split"), j.extrapolation.get("seed"), j.extrapolation.get("blocks"))
                for j in row.jobs}
    return len(text(a) | text(b)) == 1


def unpaired_because(a: Row, b: Row) -> str:
    """Why rows a and b admit no paired test ("" when they do): the one reason every option reports."""
    if not same_text(a, b):
        return f"{a.label!r} and {b.label!r} saw other data or evaluation text"
    common = sorted(set(a.seeds) & set(b.seeds))
    if len(common) < 2:
        return f"{a.label!r} (seeds {a.seeds}) and {b.label!r} (seeds {b.seeds}) share {len(common)} seed(s), a paired test needs 2"
    return ""


def differs_in_one(a: Row, b: Row, keys: Sequence[str]) -> bool:
    sa, sb = settings(a.jobs[0]), settings(b.jobs[0])
    return sum(sa.get(k) != sb.get(k) for k in keys if k != "seed") == 1


def named(label: str, name: str) -> bool:
    """Whether a row label is `name` or starts with it as its first words ("rope" names "rope trainer.max_steps=1500")."""
    return label == name or label.startswith(name + " ")


def pairs(rows: Sequence[Row], keys: Sequence[str], baseline: str | None = None,
          chosen: Sequence[str] | None = None, everything: bool = False) -> list[tuple[Row, Row]]:
    """The row pairs to compare (see the module doc); `chosen` ("A/B" each) keeps the pairs of rows named A and
    B (`named`: at every value of the other settings), or, where A and B are two whole row labels, that one pair
    even if it differs in more than one setting (e.g. a fine-tuned child against its control arm): the claims a
    study set out to test, a smaller family, more power. A `baseline` that names
    no row, or whose runs saw other seeds or other text than a row, and a chosen pair that matches none, are
    one-line errors (`unpaired_because` says why). `everything`: the pairs differing in one setting, pairable or
    not."""
    if chosen:
        every = pairs(rows, keys)
        by_label = {r.label: r for r in rows}
        out = []
        for spec in chosen:
            a_name, sep, b_name = spec.partition("/")
            if a_name in by_label and b_name in by_label:  # two whole labels: that pair, whatever else differs
                a, b = by_label[a_name], by_label[b_name]
                if why := unpaired_because(a, b):
                    raise ReportError(f"--pairs {spec!r} cannot be compared: {why}; compare runs made on the same "
                                      "seeds and corpus")
                out.append((a, b))
                continue
            found = [(a, b) for a, b in every if named(a.label, a_name) and named(b.label, b_name)]
            found += [(b, a) for a, b in every if named(b.label, a_name) and named(a.label, b_name)]
            near = [(a, b) if named(a.label, a_name) else (b, a) for a, b in pairs(rows, keys, everything=True)
                    if {named(a.label, a_name), named(b.label, b_name)} == {True}
                    or {named(b.label, a_name), named(a.label, b_name)} == {True}]  # A's row first, as asked
            if sep and not found and near:  # the rows exist and differ in one setting, but cannot be paired
                raise ReportError(f"--pairs {spec!r} cannot be compared: {unpaired_because(*near[0])}; compare "
                                  "runs made on the same seeds and corpus")
            if not sep or not found:
                raise ReportError(f"--pairs {spec!r} matches no pair of rows on the same seeds and text (A/B, "
                                  f"A and B the first words of row labels); rows: {', '.join(r.label for r in rows)}")
            # and where the claim cannot be tested (e.g. a budget with one seed): said in the tables, not dropped
            out += found + [p for p in near if p not in found]
        return out
    if baseline is not None:
        base = [r for r in rows if r.label == baseline]
        if not base:
            raise ReportError(f"--baseline {baseline!r} names no row; rows: {', '.join(r.label for r in rows)}")
        out = []
        for r in rows:
            if r is base[0]:
                continue
            if why := unpaired_because(r, base[0]):
                raise ReportError(f"--baseline {baseline!r} cannot be paired with {r.label!r}: {why}; compare runs "
                                  "made on the same seeds and corpus")
            out.append((r, base[0]))  # each row over the baseline
        return out
    return [(a, b) for i, a in enumerate(rows) for b in rows[i + 1:]
            if a.train_length == b.train_length and differs_in_one(a, b, keys)
            and (everything or not unpaired_because(a, b))]


def compare(rows: Sequence[Row], keys: Sequence[str], metrics: Sequence[str] = COMPARED,
            lengths: Sequence[int] | None = None, baseline: str | None = None,
            chosen: Sequence[str] | None = None) -> list[Comparison]:
    """Every paired comparison of the report (one Holm family): `metrics` (names without @L) at `lengths`
    (default: every length both rows have), of the pairs `pairs` picks. Retrieval metrics (probe/...) compare
    the jobs that acquired retrieval in-window only."""
    out = []
    learned = {id(r): kept for r in rows for kept in acquired_rows([r])[0]}
    for a, b in pairs(rows, keys, baseline, chosen):
        unpaired = unpaired_because(a, b)  # a declared pair at a setting whose rows cannot be paired: said, not tested
        for name in metrics:
            found = metric_lengths([a], name)
            for L in found if lengths is None else [L for L in found if L in set(lengths)]:
                metric = metric_key(name, L)
                if name.startswith("probe/"):
                    unlearned = [r.label for r in (a, b) if id(r) not in learned]
                    c = paired_accuracy(learned[id(a)], learned[id(b)], metric) if not unlearned else None
                    if c is None:  # said, not dropped: a declared claim that could not be tested
                        why = (f"{' and '.join(unlearned)} did not acquire retrieval" if unlearned else
                               "fewer than two seeds acquired retrieval in both rows")
                        c = Comparison(a, b, metric, 0, math.nan, math.nan, math.nan, math.nan, scale="diff",
                                       note=f"not compared: {why}")
                elif unpaired:
                    if len({j.metrics.get(metric) for j in (*a.jobs, *b.jobs)}) == 1:
                        continue  # one value in every run (a ratio at the training length): nothing to compare
                    c = Comparison(a, b, metric, 0, math.nan, math.nan, math.nan, math.nan,
                                   note=f"not compared: {unpaired}")
                else:
                    c = paired(a, b, metric)
                if c is not None:
                    out.append(c)
    tested = [c for c in out if not c.note]
    for c, p in zip(tested, holm([c.p for c in tested])):
        c.p_adj = p
    return out
