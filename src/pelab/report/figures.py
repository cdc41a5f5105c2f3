"""Rendering, figures (drawn by pelab.evaluation.plots): ppl vs evaluation length, validation perplexity vs step
and loss by position, one of each per training length, probe accuracy vs length per kind (bands: the seeds' mean 95% interval;
chance and copy baselines), and a grid of probe heatmaps (probes: only runs that acquired retrieval in-window,
when they trained to a criterion)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pelab.metric_keys import metric_key
from pelab.report.aggregation import (
    Row,
    acquired_rows,
    along_training_points,
    budget_key,
    by_length,
    geometric_seed_mean,
    mean_curve,
    metric_lengths,
    probe_kinds,
    probe_panel,
    seed_mean,
    trained_on_text,
    val_curves,
)


def make_figures(rows: Sequence[Row], out: Path) -> dict[str, Path]:
    """{name: PNG path} of the figures written to `out` (names get `_L<train length>` when the rows
    have several training lengths)."""
    from pelab.evaluation.plots import (
        plot_accuracy_vs_length,
        plot_loss_by_position,
        plot_metric_vs_step,
        plot_ppl_vs_length,
        plot_probe_heatmap_grid,
        save_figure,
    )

    paths: dict[str, Path] = {}
    train_lengths = sorted({r.train_length for r in rows if r.train_length})
    for train_length in train_lengths:
        sub = [r for r in rows if r.train_length == train_length]
        suffix = f"_L{train_length}" if len(train_lengths) > 1 else ""
        text = [r for r in sub if trained_on_text(r)]  # perplexity figures: the runs that saw text
        ppl = by_length(text, "extrap/ppl", geometric_seed_mean)  # the tables' mean: exp of the mean log
        if np.isfinite(ppl.to_numpy(dtype=float)).any():
            curves = {
                r.label: {int(L): float(p) for L, p in line.items()}
                for r, (_, line) in zip(text, ppl.iterrows())
            }
            fig = plot_ppl_vs_length(
                curves, train_length, title=f"Perplexity vs evaluation length (train {train_length})"
            )
            paths[f"ppl_vs_length{suffix}"] = save_figure(fig, out / f"ppl_vs_length{suffix}.png")
        losses = {
            r.label: mean_curve([j.extrapolation.get("loss_by_position") or [] for j in r.jobs]) for r in text
        }
        losses = {k: v for k, v in losses.items() if v}
        if losses:
            fig = plot_loss_by_position(
                losses, train_length, title=f"Loss by token position (train {train_length})"
            )
            paths[f"loss_by_position{suffix}"] = save_figure(fig, out / f"loss_by_position{suffix}.png")
        val = {r.label: c.mean(axis=1).dropna().to_dict() for r in text if not (c := val_curves(r)).empty}
        if val:
            fig = plot_metric_vs_step(val, title=f"Validation perplexity during training (train {train_length}; "
                                                 "mean over seeds)")
            paths[f"val_curve{suffix}"] = save_figure(fig, out / f"val_curve{suffix}.png")
        for stat in ("entropy", "distance", "mass_past_L", "max_logit"):  # eval.diagnostics runs only
            values = by_length(sub, f"attn/{stat}", seed_mean)
            if values.columns.empty or not np.isfinite(values.to_numpy(dtype=float)).any():
                continue
            curves = {r.label: {int(L): float(v) for L, v in line.items()} for r, (_, line) in zip(sub, values.iterrows())}
            fig = plot_ppl_vs_length(curves, train_length, title=f"Attention {stat} vs length (train {train_length})",
                                     ylabel=stat, yscale="linear")
            paths[f"attn_{stat}_vs_length{suffix}"] = save_figure(fig, out / f"attn_{stat}_vs_length{suffix}.png")
        sub = acquired_rows(sub)[0]  # runs that did not acquire retrieval in-window: no probe curves
        for kind in probe_kinds(sub):
            acc = by_length(sub, f"probe/{kind}/acc", seed_mean)
            if not np.isfinite(acc.to_numpy(dtype=float)).any():
                continue
            lo = by_length(sub, f"probe/{kind}/acc_lo", seed_mean).reindex(columns=acc.columns)
            hi = by_length(sub, f"probe/{kind}/acc_hi", seed_mean).reindex(columns=acc.columns)
            curves, bands = {}, {}
            for i, r in enumerate(sub):
                curves[r.label] = {int(L): float(v) for L, v in acc.iloc[i].items()}
                bands[r.label] = {int(L): (float(lo.iloc[i][L]), float(hi.iloc[i][L])) for L in acc.columns}
            panels = [p for r in sub if (p := probe_panel(r, kind))]
            fig = plot_accuracy_vs_length(
                curves, train_length, bands=bands,
                chance=_nanmean([p["chance"] for p in panels]),
                copy=_nanmean([p["copy"] for p in panels]),
                title=f"{kind}: accuracy (mean over depths) vs length (train {train_length})",
            )
            name = f"probe_{kind}_vs_length{suffix}"
            paths[name] = save_figure(fig, out / f"{name}.png")
    longest = max(metric_lengths(rows, "extrap/ppl_ratio"), default=None)
    if longest and (fig := along_figure([r for r in rows if trained_on_text(r)], metric_key("extrap/ppl_ratio", longest),
                                        f"ppl@{longest} / ppl@L", f"ppl ratio at {longest} (log scale)")):
        paths["along_training"] = save_figure(fig, out / "along_training.png")
    for kind in probe_kinds(rows):  # retrieval along training (eval.at_probes, or runs of several budgets)
        n = max(metric_lengths(rows, f"probe/{kind}/acc"), default=None)
        if n and (fig := along_figure(rows, metric_key(f"probe/{kind}/acc", n), f"{kind} accuracy at {n}",
                                      f"{kind} accuracy at {n}", log=False)):
            paths[f"along_training_{kind}"] = save_figure(fig, out / f"along_training_{kind}.png")
    rows = acquired_rows(rows)[0]
    panels = {r.label: {k: p for k in probe_kinds(rows) if (p := probe_panel(r, k))} for r in rows}
    panels = {k: v for k, v in panels.items() if v}
    if panels:
        fig = plot_probe_heatmap_grid(panels)
        paths["probe_heatmaps"] = save_figure(fig, out / "probe_heatmaps.png")
    return paths


def along_figure(rows: Sequence[Row], metric: str, what: str, ylabel: str, log: bool = True) -> Any:
    """`metric` by training tokens per setting: a line through the points of its longest runs (eval.at's, mid-schedule)
    and a dot at the end of each budget's runs (a matplotlib figure); None unless some setting has two points or
    more."""
    from pelab.evaluation.plots import plot_metric_vs_step

    along: dict[str, dict[int, float]] = {}  # per setting: the points of its longest run
    ends: dict[str, dict[int, float]] = {}  # per setting: the end of each budget's runs
    for r in sorted(rows, key=lambda r: max((j.setting("trainer.max_steps") or 0 for j in r.jobs), default=0)):
        if points := along_training_points(r, metric):
            along[budget_key(r)] = {t: v for t, v, _ in points}
            ends.setdefault(budget_key(r), {}).update({t: v for t, v, s in points if s == "end"})
    if not any(len(c) > 1 for c in along.values()):
        return None
    return plot_metric_vs_step(along, title=f"{what} along training (mean over seeds; line: the longest runs, "
                                            "mid-schedule; dots: the ends of runs of each budget)",
                               ylabel=ylabel, shade_from=None, xlabel="training tokens", markers=ends, log=log)


def question_rows(families: Mapping[str, Sequence]) -> dict[bool, list[tuple]]:
    """The declared questions as forest-plot rows, per contrast scale ({log scale: [(label, the smallest effect's
    band (lo, hi), {group: (estimate, lo, hi, resolved)})]}), on the natural scale (a ratio, or a difference) and
    with the Bonferroni interval the verdict tables give (a difference of accuracies clipped to [-1, 1], as there);
    `families`: {group label (e.g. "data.source=stdlib", or ""): its Answers}. `every` gives a row per budget; an
    untested question none."""
    scales: dict[bool, dict[str, tuple]] = {}
    for group, answers in families.items():
        for a in answers:
            for budget, t in a.intervals():
                if not (a.tested and t.tested):
                    continue
                d = a.q.effect()
                label = a.q.title + (f" ({budget.rstrip(': ')})" if budget else "")
                _, by = scales.setdefault(a.q.log, {}).setdefault(label, ((a.natural(-d), a.natural(d)), {}))
                lo, hi = (a.natural(t.lo), a.natural(t.hi)) if a.q.log else (max(-1.0, t.lo), min(1.0, t.hi))
                by[group] = (a.natural(t.estimate), lo, hi, a.resolved)  # accuracies differ by at most 1
    return {log: [(label, band, by) for label, (band, by) in rows.items()] for log, rows in scales.items()}


def question_figures(families: Mapping[str, Sequence], out: Path) -> dict[str, Path]:
    """{name: PNG path} of the declared questions' forest plots (`question_rows`), one per contrast scale:
    questions_ratio (log-scale metrics) and questions_difference (accuracies)."""
    from pelab.evaluation.plots import plot_intervals, save_figure

    paths: dict[str, Path] = {}
    for log, rows in question_rows(families).items():
        name = "questions_ratio" if log else "questions_difference"
        fig = plot_intervals(rows, title="Declared questions (filled: resolved)",
                             xlabel="A / B (log scale)" if log else "A − B", log=log)
        paths[name] = save_figure(fig, out / f"{name}.png")
    return paths


def _nanmean(xs: Sequence[float]) -> float | None:
    xs = [x for x in xs if np.isfinite(x)]
    return float(np.mean(xs)) if xs else None
