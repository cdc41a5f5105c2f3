"""Rendering, the probes' tables: retrieval at the training length, paired McNemar comparisons on the same
instances, the offset-layout kinds (mqar_offset: position vs distance), and each kind's tables by length."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from pelab.evaluation.effective_length import describe
from pelab.evaluation.stats import difference_interval, mcnemar, seeds_accuracy_interval
from pelab.metric_keys import metric_key
from pelab.report.aggregation import (
    Row,
    aggregate,
    kind_title,
    metric_lengths,
    offset_cells,
    offset_kinds,
    outcome_matrix,
    paired_outcomes,
    probe_outcomes,
    probe_panel,
)
from pelab.report.tables import (
    Table,
    _in_window,
    _seed_values,
    interval_cell,
    interval_table,
    metric_table,
    probe_notes,
)


def baselines_text(rows: Sequence[Row], kind: str) -> str:
    """What a probe's accuracy is read against, over the rows that probed `kind`: chance (a random answer) and, where
    the kind has one, copying a random value of the context (1/N for mqar: what a run that learned to copy but not to
    look up scores). "" when no row probed the kind."""
    panels = [p for r in rows if (p := probe_panel(r, kind))]
    chance = [p["chance"] for p in panels if np.isfinite(p["chance"])]
    copy = [p["copy"] for p in panels if np.isfinite(p.get("copy", np.nan))]
    if not chance:
        return ""
    return f"chance ≈ {np.mean(chance):.3g}" + (
        f", copying a random value of the context ≈ {np.mean(copy):.3g}" if copy else "")


def not_acquired_tables(rows: Sequence[Row], kind: str) -> list[Table | None]:
    """The runs that never met the in-window criterion: their accuracy by length, read against the baselines (a run
    that learned to copy but not to look up sits at the copy baseline), and the shape of their depth curves."""
    b = baselines_text(rows, kind)
    return [interval_table(rows, f"probe/{kind}/acc", f"{kind}, not acquired: accuracy (mean over depths)",
                           caption=f"Read against {b}." if b else ""),
            shape_table(rows, kind, f"{kind}, not acquired: shape of the depth curve")]


def falls_to_copy(row: Row, kind: str) -> str:
    """The shortest probed length whose mean accuracy's 95% interval reaches down to copying a random value
    of the context (1/N for mqar): where retrieval is no better than that baseline. "—": never within the
    probed lengths."""
    panel = probe_panel(row, kind)
    if panel is None or not np.isfinite(panel["copy"]):
        return "—"
    for L in metric_lengths([row], f"probe/{kind}/acc_lo"):
        key = metric_key(f"probe/{kind}/acc_lo", L)
        lo = [j.metrics[key] for j in row.jobs if key in j.metrics]
        if lo and float(np.mean(lo)) <= panel["copy"]:
            return str(L)
    return "—"


def probe_summary_table(rows: Sequence[Row], kind: str) -> Table:
    """Per row at the training length: accuracy and lim_gap with intervals, the error split and the gold's
    rank; over lengths: the effective length (longest with accuracy >= 0.9) and the AUC."""
    cols = ["encoding", "L", "accuracy", "lim_gap", "effective length", "AUC", "at copy baseline from",
            "other value", "not in context", "gold rank"]
    t = Table(f"{kind}: summary at the training length", cols, [], caption=(
        "accuracy and lim_gap (edges − middle) at the training length with 95% intervals (one seed; paired "
        "bootstrap over instances) or mean ± std (several seeds); effective length = the longest length with "
        "accuracy ≥ 0.9; AUC = area under accuracy vs log2(length / training length), in [0, 1]; at copy "
        "baseline from = the shortest length whose 95% interval reaches the copy baseline; errors: the "
        "fraction of instances answered with another value of the context / with something not in it; gold "
        "rank = mean rank of the gold among the context's values (1 = best)."))
    for r in rows:
        L = _in_window(r, kind)
        if L is None:
            continue
        key = {s: metric_key(f"probe/{kind}/{s}", L)
               for s in ("acc", "lim_gap", "other_in_context", "not_in_context", "rank")}
        t.rows.append([
            r.label, str(L), interval_cell(r, key["acc"]), interval_cell(r, key["lim_gap"]),
            _seed_values(r, f"probe/{kind}/effective_length", lambda v: str(int(v)) if v > 0 else "none"),
            aggregate([j.metrics[f"probe/{kind}/auc"] for j in r.jobs if f"probe/{kind}/auc" in j.metrics]),
            falls_to_copy(r, kind),
            *(aggregate([j.metrics[key[x]] for j in r.jobs if key[x] in j.metrics])
              for x in ("other_in_context", "not_in_context", "rank")),
        ])
    return t


def effective_length_table(rows: Sequence[Row], kind: str) -> Table | None:
    """Per row the kind's effective length (pelab.evaluation.effective_length): one seed's, or the median and range
    over seeds (a statistic on the grid of probed lengths: no t interval), beside the in-window accuracy with its
    interval and each seed's threshold. None when no run recorded one (runs made before the rule existed)."""
    metric = f"probe/{kind}/eff_length"
    rows = [r for r in rows if any(metric in j.metrics for j in r.jobs)]
    if not rows:
        return None
    rule = {(x.get("floor"), x.get("fraction")) for r in rows for j in r.jobs
            if isinstance(x := j.setting("probes.effective_length"), dict)}
    how = ", ".join(f"max({a}, {b} × in-window accuracy)" for a, b in sorted(rule, key=str)) or "the threshold"
    t = Table(f"{kind}: effective length", ["encoding", "seeds", "L", "in-window accuracy", "effective length",
                                            "threshold"], [], caption=(
        f"effective length = the longest probed length up to which, at every probed length, the 95% Wilson lower "
        f"bound of the accuracy (mean over depths; n = the instances, which the depths share) is ≥ {how} "
        "(probes.effective_length); n/a = not acquired in-window (even the shortest "
        "probed length fails). Several seeds: the median (the lower one with an even count, n/a counted below every "
        "length) and [smallest, largest]; the lengths form a grid, so no t interval."))
    for r in rows:
        L = _in_window(r, kind)
        acc = interval_cell(r, metric_key(f"probe/{kind}/acc", L)) if L is not None else "—"
        t.rows.append([r.label, ",".join(map(str, r.seeds)), str(L or "—"), acc,
                       describe([j.metrics[metric] for j in r.jobs if metric in j.metrics]),
                       _seed_values(r, f"probe/{kind}/eff_threshold",
                                    lambda v: f"{v:.2f}" if math.isfinite(v) else "n/a")])
    return t


def paired_table(rows: Sequence[Row], kind: str) -> Table | None:
    """Every pair of rows with the same training length, compared on the same instances: per length the
    accuracy difference (first − second) and McNemar's exact p over the paired (seed, depth, instance)
    outcomes. None when no pair shares instances."""
    lengths: set[int] = set()
    results = []
    for i, a in enumerate(rows):
        for b in rows[i + 1 :]:
            if a.train_length != b.train_length:
                continue
            by_len = {L: mcnemar(xa, xb) for L, (xa, xb) in paired_outcomes(a, b, kind).items() if xa}
            if by_len:
                lengths |= set(by_len)
                results.append((a, b, by_len))
    if not results:
        return None
    cols = sorted(lengths)
    train_length = results[0][0].train_length
    if kind in offset_kinds(rows) and train_length:  # its lengths are (m + 1) x the training length
        names = [f"prefix {L // train_length - 1}×L" for L in cols]
    else:
        names = [str(L) for L in cols]
    t = Table(f"{kind}: paired comparisons on the same instances", ["pair"] + names, [],
              caption=(
                  "Accuracy of the first minus the second over the paired outcomes (seed, depth, instance), n, and "
                  "McNemar's exact two-sided p of each seed on its own (the instances of a seed are shared by both "
                  "rows; seeds are separate experiments). The same instance appears at every depth, so pairs are "
                  "not fully independent: read p as approximate, small p as a real difference only with a clear Δ "
                  "and the same direction in every seed."),
              collapsed=len(results) > 6)
    for a, b, by_len in results:
        seeds = sorted(set(a.seeds) & set(b.seeds))
        per_seed = {s: {L: mcnemar(xa, xb) for L, (xa, xb) in paired_outcomes(a, b, kind, seed=s).items() if xa}
                    for s in seeds}
        cells = []
        for L in cols:
            r = by_len.get(L)
            if r is None:
                cells.append("—")
                continue
            ps = [f"{per_seed[s][L]['p']:.2g}" for s in seeds if L in per_seed[s]]
            cells.append(f"{(r['b10'] - r['b01']) / r['n']:+.2f} (p={', '.join(ps)}, n={r['n']})")
        t.rows.append([f"{a.label} vs {b.label}"] + cells)
    return t


def offset_table(rows: Sequence[Row], kind: str) -> Table | None:
    """An offset-layout kind (mqar_offset): accuracy with the gold pair at a fixed distance from the query after
    a filler prefix of m × the training length, one column per m (absolute position grows, distance does not)."""
    cells = {r.label: offset_cells(r, kind) for r in rows}
    prefixes = sorted({m for c in cells.values() for m in c})
    if not prefixes:
        return None
    seeds = "seeds" if any(len(r.jobs) > 1 for r in rows) else "seed"
    cols = ["encoding", seeds] + [f"prefix {m}×L" for m in prefixes]
    t = Table(f"{kind}: {kind_title(kind) or 'accuracy by filler prefix'}", cols,
              [], caption=(
                  "Accuracy (95% interval: Wilson with one seed; with several, seeds then instances) with the gold pair at "
                  "the same distance from its query as in training and m × L filler tokens before the "
                  "haystack: a drop here is absolute position, not distance."))
    for r in rows:
        line = []
        for m in prefixes:
            recs = cells[r.label].get(m, [])
            accs = [float(x["acc"]) for x in recs]
            outcomes = [[[c == "1" for c in x["outcomes"]]] for x in recs if x.get("outcomes")]
            if len(recs) == 1 and math.isfinite(accs[0]):
                line.append(f"{accs[0]:.2f} [{float(recs[0]['lo']):.2f}, {float(recs[0]['hi']):.2f}]")
            elif len(outcomes) == len(recs) > 1:  # several seeds: seeds, then instances
                mean, lo, hi = seeds_accuracy_interval(outcomes)
                line.append(f"{mean:.2f} [{lo:.2f}, {hi:.2f}] ({len(recs)} seeds)")
            else:
                line.append(aggregate(accs))
        t.rows.append([r.label, ",".join(map(str, r.seeds))] + line)
    return t


def edge_differences(row: Row, kind: str, length: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per seed, per instance: the outcome at the first depth (the start of the context, farthest from the query)
    minus the mean over the interior depths, and the same for the last depth (nearest the query). Empty where a
    seed probed fewer than three depths at `length`."""
    first, last = [], []
    for j in row.jobs:
        depths, x = outcome_matrix(j, kind, length)  # (depths, instances)
        if len(depths) < 3:
            continue
        middle = x[1:-1].mean(axis=0)
        first.append(x[0] - middle)
        last.append(x[-1] - middle)
    return first, last


def curve_shape(first: tuple[float, float, float], last: tuple[float, float, float]) -> str:
    """The depth curve from its two edge-minus-middle differences (mean, lo, hi): U where both edges are above the
    middle (both intervals above 0), primacy / recency where only the first / last is, a dip the other way (∩)
    where both are below, flat where neither interval excludes 0."""
    up = (first[1] > 0, last[1] > 0)
    down = (first[2] < 0, last[2] < 0)
    if all(up):
        return "U"
    if all(down):
        return "∩"
    if up[0] and not up[1]:
        return "primacy"
    if up[1] and not up[0]:
        return "recency"
    return "flat" if not any(down) else ("falls at the start" if down[0] else "falls at the end")


def shape_table(rows: Sequence[Row], kind: str, title: str = "") -> Table | None:
    """Per row and length: the shape of the accuracy-by-depth curve (curve_shape) and the two edge-minus-middle
    differences with their 95% intervals (per instance, the same instances at every depth; seeds, then instances,
    with several seeds)."""
    cells: dict[str, dict[int, str]] = {}
    lengths: set[int] = set()
    for r in rows:
        for L in sorted({L for j in r.jobs for _, L in probe_outcomes(j, kind)}):
            first, last = edge_differences(r, kind, L)
            if not first:
                continue
            f, la = difference_interval(first), difference_interval(last)
            cells.setdefault(r.label, {})[L] = (f"{curve_shape(f, la)}: {f[0]:+.2f} [{f[1]:+.2f}, {f[2]:+.2f}] / "
                                                f"{la[0]:+.2f} [{la[1]:+.2f}, {la[2]:+.2f}]")
            lengths.add(L)
    if not cells:
        return None
    cols = sorted(lengths)
    t = Table(title or f"{kind}: shape of the depth curve", ["encoding", "seeds"] + [str(L) for L in cols], [], caption=(
        "Accuracy at the first depth (start of the context, farthest from the query) minus the interior depths' "
        "mean / at the last depth (nearest the query) minus the interior mean, per instance, with 95% intervals "
        "(several seeds: seeds, then instances). U = both edges above the middle; primacy / recency = only the "
        "first / last above it (the other level or below); ∩ = both below; falls at the start / end = one edge below, "
        "the other level; flat = neither interval excludes 0."))
    for r in rows:
        if r.label in cells:
            t.rows.append([r.label, ",".join(map(str, r.seeds))] + [cells[r.label].get(L, "—") for L in cols])
    return t


def probe_tables(rows: Sequence[Row], kind: str) -> list[Table]:
    """Per kind: a summary at the training length, the effective length, accuracy (mean over depths) by length, the
    lost-in-the-middle gap by length, the gold's log-probability, paired comparisons between rows, and
    one depth x length table per row."""
    out: list[Table | None] = [probe_summary_table(rows, kind), effective_length_table(rows, kind)]
    acc = interval_table(rows, f"probe/{kind}/acc", f"{kind}: accuracy (mean over depths)")
    if acc is not None:
        acc.notes += probe_notes(rows, kind)
    gap = interval_table(rows, f"probe/{kind}/lim_gap", f"{kind}: lost-in-the-middle gap (edges − middle)")
    # informative where accuracy sits at chance: how much probability the gold answer gets
    logprob = metric_table(
        rows,
        f"probe/{kind}/logprob",
        f"{kind}: mean log-probability of the gold answer tokens (mean over depths)",
    )
    out += [acc, gap, shape_table(rows, kind) if kind not in offset_kinds(rows) else None, logprob, paired_table(rows, kind)]
    for r in rows:
        p = probe_panel(r, kind)
        if p is None:
            continue
        t = Table(
            f"{kind} — {r.label}: accuracy by depth × length (mean over {p['n']} seed(s))",
            ["depth"] + [f"{L}" + ("*" if L == r.train_length else "") for L in p["lengths"]],
            [],
            collapsed=True,
        )
        for d, line in zip(p["depths"], p["grid"]):
            t.rows.append(
                [f"{100 * d:.0f}%"] + [("n/a" if not math.isfinite(v) else f"{v:.2f}") for v in line]
            )
        out.append(t)
    return [t for t in out if t is not None and t.rows]


# ---------------------------------------------------------------------------------------------
# metadata and failures
