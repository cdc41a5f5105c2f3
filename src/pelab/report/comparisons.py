"""Paired comparisons between settings: the seed is the unit.

Runs with the same seed see the same batches (the data order is a function of seed, step and rank) and are scored on
the same evaluation blocks and probe instances, so two settings run on the same seeds are compared seed by seed: one
contrast per seed (log(a / b) for a perplexity or any positive metric, a - b for a retrieval accuracy), then a
one-sample t over the seeds (``pelab.evaluation.stats.seed_test``). Retrieval is compared like perplexity: per-seed
accuracies, never the probe instances of 2-3 trained models (they share their model and their filler text; their
intervals stay in the probe tables as within-run precision). Fewer than 3 paired seeds: no verdict, said in the
table; the same value in both rows in every seed: "no measurable difference".

Every comparison of one report is one family: p Holm-adjusted across it, "resolved" where the adjusted p < 5 %; the
interval beside a verdict is the Bonferroni interval at 1 - 0.05 / m (it holds jointly; Holm has no matching
interval), the unadjusted 95 % one is kept as `lo95`/`hi95`. These are exploratory families (every pair the options
pick); a study's declared questions (`pelab.report.questions`) are the confirmatory ones. The seed-level tests hold
for the evaluated text: every run is scored on the same blocks.

Which rows are compared: pairs that differ in exactly one of the settings that label the rows (e.g. the
encoding at one budget, or the budget for one encoding), on the seeds both have, with the same corpus and evaluation
text; or every row against a `baseline`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pelab.errors import ReportError
from pelab.evaluation.stats import LEVEL, SeedTest, bonferroni_level, holm, seed_test
from pelab.metric_keys import MetricKey, metric_key, parse_key
from pelab.report.aggregation import Row, acquired_rows, metric_lengths, settings

ALPHA = 0.05
# The metrics compared, by default: on the log scale (perplexities and ratios are positive; a difference of logs
# is the ratio of the two settings' values).
COMPARED = ("extrap/ppl", "extrap/ppl_ratio")


def log_scale(metric: str) -> bool:
    """Whether `metric` is compared as a ratio (log scale: perplexities, ratios, any positive quantity) or as a
    difference (retrieval accuracies, which can be 0)."""
    return not metric.startswith("probe/")


def seed_values(row: Row, metric: str) -> dict[Any, float]:
    """{seed: the metric of that seed's run} (NaN where the run lacks it)."""
    return {j.setting("seed"): float(j.metrics.get(metric, math.nan)) for j in row.jobs}


def contrast(x: float, y: float, log: bool) -> float:
    """One seed's contrast of a value x with y: log(x / y) on the log scale (both positive), x - y otherwise; NaN
    where it is not defined."""
    if not math.isfinite(x + y) or (log and (x <= 0 or y <= 0)):
        return math.nan
    return math.log(x / y) if log else x - y


def contrasts(a: Row, b: Row, metric: str) -> dict[Any, float]:
    """{seed: a's value contrasted with b's} on the seeds both have where it is defined (`contrast`)."""
    va, vb = seed_values(a, metric), seed_values(b, metric)
    log = log_scale(metric)
    both = {s: contrast(va[s], vb[s], log) for s in sorted(set(va) & set(vb), key=str)}
    return {s: c for s, c in both.items() if math.isfinite(c)}


@dataclass
class Comparison:
    a: Row
    b: Row
    metric: str  # e.g. "extrap/ppl_ratio@1024"
    n: int  # paired seeds
    ratio: float  # log scale: exp(mean contrast) = a / b; diff scale: the mean difference a - b
    lo: float  # the interval beside the verdict: Bonferroni at 1 - alpha / m once the family is known
    hi: float
    p: float
    p_adj: float = math.nan
    scale: str = "log"  # log: ratio a / b and its interval; diff: difference a - b (retrieval accuracy)
    note: str = ""  # why there is no verdict (then p is NaN and it is not in the Holm family)
    per_seed: dict = field(default_factory=dict)  # {seed: contrast}
    lo95: float = math.nan  # the unadjusted 95 % interval
    hi95: float = math.nan
    level: float = LEVEL  # of [lo, hi]

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

    def natural(self, x: float) -> float:
        """A contrast on the metric's own scale (a ratio on the log scale)."""
        return math.exp(x) if self.scale == "log" else x

    def set_level(self, level: float) -> None:
        """Recompute [lo, hi] at `level` (the family's Bonferroni level) from the per-seed contrasts."""
        t = seed_test(list(self.per_seed.values()), level)
        if t.tested:
            self.lo, self.hi, self.level = self.natural(t.lo), self.natural(t.hi), level


def from_test(a: Row, b: Row, metric: str, d: dict[Any, float], t: SeedTest) -> Comparison:
    scale = "log" if log_scale(metric) else "diff"
    nat = (lambda x: math.exp(x) if math.isfinite(x) else x) if scale == "log" else (lambda x: x)
    return Comparison(a, b, metric, t.n, nat(t.estimate), nat(t.lo), nat(t.hi), t.p, scale=scale, note=t.note,
                      per_seed=d, lo95=nat(t.lo), hi95=nat(t.hi))


def paired(a: Row, b: Row, metric: str) -> Comparison | None:
    """`metric` of a vs b on their common seeds (see the module doc); None where no seed has both values."""
    d = contrasts(a, b, metric)
    if not d:
        return None
    return from_test(a, b, metric, d, seed_test(list(d.values())))


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
    common = sorted(set(a.seeds) & set(b.seeds), key=str)
    if not common:
        return f"{a.label!r} (seeds {a.seeds}) and {b.label!r} (seeds {b.seeds}) share no seed"
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
                    c = paired(learned[id(a)], learned[id(b)], metric) if not unlearned else None
                    if c is None:  # said, not dropped: a declared claim that could not be tested
                        why = (f"{' and '.join(unlearned)} did not acquire retrieval" if unlearned else
                               "no seed acquired retrieval in both rows")
                        c = Comparison(a, b, metric, 0, math.nan, math.nan, math.nan, math.nan, scale="diff",
                                       note=f"not compared: {why}")
                elif len({j.metrics.get(metric) for j in (*a.jobs, *b.jobs)}) == 1:
                    continue  # one value in every run by definition (a ratio at the training length)
                elif unpaired:
                    c = Comparison(a, b, metric, 0, math.nan, math.nan, math.nan, math.nan,
                                   note=f"not compared: {unpaired}")
                else:
                    c = paired(a, b, metric)
                if c is not None:
                    out.append(c)
    finish_family(out)
    return out


def finish_family(comparisons: Sequence[Comparison], alpha: float = ALPHA) -> None:
    """Holm-adjust the tested comparisons as one family and put their Bonferroni intervals beside them."""
    tested = [c for c in comparisons if not c.note]
    level = bonferroni_level(len(tested), alpha)
    for c, p in zip(tested, holm([c.p for c in tested])):
        c.p_adj = p
        c.set_level(level)
