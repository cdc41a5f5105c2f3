"""Figures for extrapolation and probes.

Built with the object-oriented API (``matplotlib.figure.Figure`` + the Agg canvas), never pyplot:
no global figure registry to leak, no GUI backend, safe in worker processes and under Lightning.
``wandb.Image(fig)`` and ``save_figure(fig, path)`` both accept the returned figures.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path

from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter


def _figure(w: float = 6.0, h: float = 4.0) -> Figure:
    fig = Figure(figsize=(w, h), layout="constrained")
    FigureCanvasAgg(fig)  # attaches the Agg canvas (savefig / wandb.Image work without pyplot)
    return fig


def _styles(n: int) -> list[dict]:
    """n distinguishable line styles: tab10's colours, then the same colours dashed with other markers
    (14 encodings in one plot otherwise share colours)."""
    colors = colormaps["tab10"].colors
    variants = [("-", "o"), ("--", "s"), (":", "^")]
    return [
        {"color": colors[i % 10], "linestyle": variants[i // 10 % 3][0], "marker": variants[i // 10 % 3][1]}
        for i in range(n)
    ]


def _legend(ax, n_series: int) -> None:
    """Inside the axes for a few lines; outside on the right when many would cover the data."""
    if n_series <= 6:
        ax.legend(fontsize=8)
    else:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)


def plain_log_ticks(axis) -> None:
    """Ticks of a log axis at 1, 1.5, 2, 3, 4, 5, 6, 8 per decade, written as plain numbers (4, 6, 10, not
    6x10^0): perplexities between 4 and 15 otherwise get one labelled tick."""
    axis.set_major_locator(LogLocator(subs=(1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def _finish(ax, xlabel: str, ylabel: str, title: str, n_series: int) -> None:
    """Labels, title, grid and legend of a line plot."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title("\n".join(textwrap.wrap(title, 70)), fontsize=10)  # a long title wider than its axes is cut off
    ax.grid(True, which="both", alpha=0.3)
    _legend(ax, n_series)


def _finite(x: float | None) -> bool:
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x)


def plot_ppl_vs_length(
    results: Mapping[str, Mapping[int, float]],
    train_length: int,
    title: str = "Perplexity vs evaluation length",
    ylabel: str = "perplexity (log scale)",
    yscale: str = "log",
) -> Figure:
    """One line per label (e.g. encoding) of ppl by length; log y (or ``yscale``), log2 x, the training
    length marked. NaN / inf points (not applicable, diverged) are skipped. Also draws any other value by
    length (attention statistics: ``yscale="linear"``)."""
    fig = _figure(8.5 if len(results) > 6 else 6.0, 4.0)
    ax = fig.add_subplot()
    all_x: set[int] = set()
    for (label, curve), style in zip(results.items(), _styles(len(results))):
        pts = sorted((int(L), float(p)) for L, p in curve.items() if _finite(p) and (p > 0 or yscale != "log"))
        if not pts:
            continue
        xs, ys = zip(*pts)
        all_x.update(xs)
        ax.plot(xs, ys, label=str(label), **style)
    ax.axvline(train_length, color="grey", linestyle="--", linewidth=1, label=f"train length {train_length}")
    ax.set_xscale("log", base=2)
    ax.set_yscale(yscale)
    if yscale == "log":
        plain_log_ticks(ax.yaxis)  # 3, 4, 6, 10 rather than 3x10^0
    ticks = sorted(all_x | {int(train_length)})
    ax.set_xticks(ticks)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{round(v)}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    _finish(ax, "evaluation length (tokens)", ylabel, title, len(results) + 1)
    return fig


def plot_metric_vs_step(
    curves: Mapping[str, Mapping[int, float]],
    title: str = "Validation perplexity during training",
    ylabel: str = "validation perplexity (log scale)",
    shade_from: float | None = 0.8,
    xlabel: str = "training step",
    markers: Mapping[str, Mapping[int, float]] | None = None,
    log: bool = True,
) -> Figure:
    """One line per label of a metric by training step (log y with plain-number ticks; `log=False`: a linear y from 0
    to 1, for an accuracy); the last (1 - shade_from) of the steps shaded: the part of training where a flat curve
    says it has converged."""
    fig = _figure(8.5 if len(curves) > 6 else 6.0, 4.0)
    ax = fig.add_subplot()
    last = 0
    for (label, curve), style in zip(curves.items(), _styles(len(curves))):
        pts = sorted((int(s), float(v)) for s, v in curve.items() if _finite(v) and (v > 0 or not log))
        if not pts:
            continue
        xs, ys = zip(*pts)
        last = max(last, xs[-1])
        ax.plot(xs, ys, label=str(label), markersize=3, **style)
        if markers and (dots := sorted((x, y) for x, y in markers.get(label, {}).items() if _finite(y))):
            ax.plot(*zip(*dots), linestyle="none", marker="o", markersize=7, color=style.get("color"))
    if shade_from is not None and last:
        ax.axvspan(shade_from * last, last, color="grey", alpha=0.12, label=f"last {100 - round(100 * shade_from)}%")
    if log:
        ax.set_yscale("log")
        plain_log_ticks(ax.yaxis)
    else:
        ax.set_ylim(-0.02, 1.02)
    _finish(ax, xlabel, ylabel, title, len(curves) + 1)
    return fig


def plot_intervals(
    rows: Sequence[tuple[str, tuple[float, float], Mapping[str, tuple[float, float, float, bool]]]],
    title: str,
    xlabel: str,
    log: bool,
) -> Figure:
    """A forest plot of contrasts: one line per row, (label, the band of no interest (lo, hi), {group: (estimate,
    lo, hi, resolved)}), each group's estimate with its interval (filled: resolved; hollow: not), the band shaded
    and no difference (1 on a log axis, else 0) drawn. NaN estimates are skipped; a NaN bound draws no bar."""
    groups = list(dict.fromkeys(g for _, _, by in rows for g in by))
    longest = max((len(label) for label, _, _ in rows), default=0)  # the labels sit left of the axes: widen for them
    fig = _figure(5.0 + 0.06 * longest, 1.2 + 0.45 * len(rows) * max(1, len(groups)))
    ax = fig.add_subplot()
    step = 0.6 / max(1, len(groups))  # the groups of a row side by side around its line
    for i, (_, (band_lo, band_hi), _) in enumerate(rows):
        y = len(rows) - 1 - i  # the first row on top, as in the tables
        ax.fill_betweenx([y - 0.4, y + 0.4], band_lo, band_hi, color="grey", alpha=0.15, linewidth=0,
                         label="smallest effect of interest" if i == 0 else None)
    for g, (group, style) in enumerate(zip(groups, _styles(len(groups)))):
        # the legend's marker, filled whatever the first question's verdict (an empty line: nothing drawn)
        ax.plot([], [], linestyle="none", marker=style["marker"], markersize=7, color=style["color"],
                label=group or "estimate")
        for i, (_, _, by) in enumerate(rows):
            if group not in by or not _finite(by[group][0]):
                continue
            est, lo, hi, resolved = by[group]
            y = len(rows) - 1 - i + (len(groups) - 1) / 2 * step - g * step
            if _finite(lo) and _finite(hi):
                ax.plot([lo, hi], [y, y], color=style["color"], linewidth=1.5)
            ax.plot([est], [y], linestyle="none", marker=style["marker"], markersize=7, color=style["color"],
                    markerfacecolor=style["color"] if resolved else "white")
    ax.axvline(1.0 if log else 0.0, color="black", linewidth=1, label="no difference")
    if log:
        ax.set_xscale("log")
        plain_log_ticks(ax.xaxis)
    ax.set_yticks(range(len(rows)), [label for label, _, _ in reversed(rows)], fontsize=8)
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.set_xlabel(xlabel)
    fig.suptitle(title)  # over the figure: long labels leave the axes too narrow to hold it
    ax.grid(True, axis="x", which="both", alpha=0.3)
    _legend(ax, len(groups) + 2)
    return fig


def _moving_average(ys: Sequence[float], k: int) -> list[float]:
    """Centered moving average of width k, ignoring NaN."""
    if k <= 1:
        return list(ys)
    out, h = [], k // 2
    for i in range(len(ys)):
        win = [y for y in ys[max(0, i - h) : i + h + 1] if _finite(y)]
        out.append(sum(win) / len(win) if win else float("nan"))
    return out


def plot_loss_by_position(
    curves: Mapping[str, Sequence[float]],
    train_length: int,
    smooth: int | None = None,
    title: str = "Loss by token position",
) -> Figure:
    """Mean NLL by position in the window, one line per label; the training length marked.
    ``smooth``: moving-average width (None = about 1/64 of the longest curve); the raw curve is drawn faint
    (up to 6 lines)."""
    fig = _figure(9.0 if len(curves) > 6 else 7.0, 4.0)
    ax = fig.add_subplot()
    longest = max((len(c) for c in curves.values()), default=0)
    k = smooth if smooth is not None else max(1, longest // 64)
    for (label, ys), style in zip(curves.items(), _styles(len(curves))):
        ys = [float(y) for y in ys]
        if not any(_finite(y) for y in ys):
            continue
        xs = list(range(len(ys)))
        style = {k_: v for k_, v in style.items() if k_ != "marker"}  # thousands of points: no markers
        (line,) = ax.plot(xs, _moving_average(ys, k), label=str(label), linewidth=1.5, **style)
        if k > 1 and len(curves) <= 6:  # the raw curves of many lines would hide the smoothed ones
            ax.plot(xs, ys, color=line.get_color(), alpha=0.2, linewidth=0.7)
    ax.axvline(train_length, color="grey", linestyle="--", linewidth=1, label=f"train length {train_length}")
    ax.set_xlabel("token position in window")
    ax.set_ylabel("mean NLL (nats)" + (f", smoothed over {k}" if k > 1 else ""))
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    _legend(ax, len(curves) + 1)
    return fig


def _heatmap_array(grid: Sequence[Sequence[float]], depths: Sequence[float], lengths: Sequence[int]):
    """(len(depths), len(lengths)) float array; None -> NaN; a shape mismatch is a clear error."""
    import numpy as np

    data = np.array([[float(v) if v is not None else float("nan") for v in row] for row in grid], dtype=float)
    if data.shape != (len(depths), len(lengths)):
        raise ValueError(
            f"grid shape {data.shape} != (len(depths), len(lengths)) = ({len(depths)}, {len(lengths)})"
        )
    return data


def _draw_heatmap(ax, data, depths: Sequence[float], lengths: Sequence[int], train_length: int | None,
                  annotate: bool, fontsize: float = 8):
    """Draw one depth x length accuracy heatmap into ``ax``; returns the image (for a colorbar)."""
    import numpy as np

    cmap = colormaps["RdYlGn"].with_extremes(bad="lightgrey")  # NaN cells grey
    im = ax.imshow(np.ma.masked_invalid(data), cmap=cmap, vmin=0.0, vmax=1.0, aspect="auto")
    ax.set_xticks(range(len(lengths)))
    ax.set_xticklabels([f"{L}" + ("*" if train_length is not None and L == train_length else "") for L in lengths])
    ax.set_yticks(range(len(depths)))
    ax.set_yticklabels([f"{100 * d:.0f}%" for d in depths])
    if annotate:
        for i in range(data.shape[0]):
            for j in range(data.shape[1]):
                v = data[i, j]
                ax.text(
                    j, i, "n/a" if not math.isfinite(v) else f"{v:.2f}", ha="center", va="center",
                    fontsize=fontsize,
                )
    return im


def plot_probe_heatmap(
    grid: Sequence[Sequence[float]],
    depths: Sequence[float],
    lengths: Sequence[int],
    title: str = "",
    train_length: int | None = None,
    annotate: bool = True,
) -> Figure:
    """Needle-in-a-haystack heatmap: rows = depths (0 at the top), columns = lengths, 'RdYlGn' colours
    from 0 (red) to 1 (green), each cell annotated; NaN cells grey with "n/a"."""
    data = _heatmap_array(grid, depths, lengths)
    fig = _figure(1.2 + 0.9 * len(lengths), 1.0 + 0.55 * len(depths))
    ax = fig.add_subplot()
    im = _draw_heatmap(ax, data, depths, lengths, train_length, annotate)
    ax.set_xlabel("context length (tokens)" + (" — * = train length" if train_length in lengths else ""))
    ax.set_ylabel("depth of the answer")
    fig.colorbar(im, ax=ax, label="accuracy")
    ax.set_title(title)
    return fig


def plot_probe_heatmap_grid(
    panels: Mapping[str, Mapping[str, Mapping]],
    title: str = "Retrieval accuracy by depth and context length",
    annotate: bool = True,
) -> Figure:
    """A grid of probe heatmaps: one row per label (e.g. encoding, named on the left), one column per
    probe kind (named on top).

    ``panels[label][kind]`` is a mapping with ``grid`` (rows = depths, columns = lengths), ``depths``,
    ``lengths`` and optionally ``train_length`` (marked with *). A missing (label, kind) cell stays blank.
    One shared 0..1 colour bar."""
    labels = list(panels)
    kinds = list(dict.fromkeys(k for row in panels.values() for k in row))
    if not labels or not kinds:
        raise ValueError("plot_probe_heatmap_grid needs at least one label with one probe kind")
    n_len = max(len(p["lengths"]) for row in panels.values() for p in row.values())
    n_dep = max(len(p["depths"]) for row in panels.values() for p in row.values())
    fig = _figure(1.0 + (0.8 * n_len + 0.6) * len(kinds), 0.6 + (0.42 * n_dep + 0.7) * len(labels))
    axes = fig.subplots(len(labels), len(kinds), squeeze=False)
    im = None
    for i, label in enumerate(labels):
        for j, kind in enumerate(kinds):
            ax = axes[i][j]
            p = panels[label].get(kind)
            if p is None:
                ax.set_axis_off()
                continue
            data = _heatmap_array(p["grid"], p["depths"], p["lengths"])
            im = _draw_heatmap(ax, data, p["depths"], p["lengths"], p.get("train_length"), annotate, fontsize=7)
            if i == 0:
                ax.set_title(kind)
            if i == len(labels) - 1:
                ax.set_xlabel("context length (* = train length)", fontsize=8)
            if j == 0:
                ax.set_ylabel(f"{label}\nanswer depth", fontsize=8)
    fig.colorbar(im, ax=axes, label="accuracy", shrink=0.8)
    fig.suptitle(title)
    return fig


Band = tuple[Sequence[float], Sequence[float]]  # (lower, upper) per point: an interval drawn as a band


def _baselines(ax, chance: float | None, copy: float | None) -> None:
    """Dotted floors: chance (a uniform guess over the answer space) and copy (a random value of the
    context)."""
    if chance is not None and _finite(chance):
        ax.axhline(chance, color="grey", linestyle=":", linewidth=1, label=f"chance {chance:.2g}")
    if copy is not None and _finite(copy):
        ax.axhline(copy, color="black", linestyle="-.", linewidth=1, label=f"copy a random value {copy:.2g}")


def _curve(ax, xs: Sequence[float], ys: Sequence[float], label: str, band: Band | None, **style) -> None:
    ys = [float(y) if _finite(y) else float("nan") for y in ys]
    (line,) = ax.plot(xs, ys, label=label or None, **style)
    if band is not None:
        lo = [float(v) if _finite(v) else float("nan") for v in band[0]]
        hi = [float(v) if _finite(v) else float("nan") for v in band[1]]
        ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.15, linewidth=0)


def plot_depth_curve(
    curves: Mapping[str, Sequence[float]] | Sequence[float],
    depths: Sequence[float],
    length: int | None = None,
    chance: float | None = None,
    title: str | None = None,
    ylabel: str = "accuracy",
    bands: Mapping[str, Band] | None = None,
    copy: float | None = None,
) -> Figure:
    """Accuracy by depth (the lost-in-the-middle U-curve); one line per label (e.g. encoding, or length).
    A bare list is one unlabeled curve. ``bands[label]`` = (lower, upper) per depth, drawn as a shaded
    interval; ``chance`` and ``copy`` draw dotted floors."""
    if not isinstance(curves, Mapping):
        curves = {"": curves}
    bands = bands or {}
    fig = _figure(5.5 if len(curves) <= 6 else 7.5, 3.8)
    ax = fig.add_subplot()
    xs = [100 * float(d) for d in depths]
    for (label, ys), style in zip(curves.items(), _styles(len(curves))):
        _curve(ax, xs, ys, str(label), bands.get(label), **style)
    _baselines(ax, chance, copy)
    if ylabel == "accuracy":
        ax.set_ylim(-0.02, 1.02)
    ax.set_xticks(xs)
    ax.set_xlabel("depth of the answer (%)")
    ax.set_ylabel(ylabel)
    ax.set_title(title or (f"Accuracy by depth at {length} tokens" if length else "Accuracy by depth"))
    ax.grid(True, alpha=0.3)
    if any(str(k) for k in curves) or _finite(chance) or _finite(copy):
        _legend(ax, len(curves) + 2)
    return fig


def plot_accuracy_vs_length(
    curves: Mapping[str, Mapping[int, float]],
    train_length: int | None = None,
    bands: Mapping[str, Mapping[int, tuple[float, float]]] | None = None,
    chance: float | None = None,
    copy: float | None = None,
    title: str = "Retrieval accuracy vs context length",
    xlabel: str = "context length (tokens)",
) -> Figure:
    """Accuracy by length (log2 x), one line per label, ``bands[label][L]`` = (lower, upper) shaded; the
    training length, chance and copy baselines marked. NaN points (n/a) are gaps."""
    bands = bands or {}
    fig = _figure(8.5 if len(curves) > 6 else 6.0, 4.0)
    ax = fig.add_subplot()
    all_x: set[int] = set()
    for (label, curve), style in zip(curves.items(), _styles(len(curves))):
        xs = sorted(int(L) for L in curve)
        all_x.update(xs)
        b = bands.get(label)
        band = ([b[L][0] for L in xs], [b[L][1] for L in xs]) if b and all(L in b for L in xs) else None
        _curve(ax, xs, [curve[L] for L in xs], str(label), band, **style)
    if train_length:
        ax.axvline(train_length, color="grey", linestyle="--", linewidth=1, label=f"train length {train_length}")
        all_x.add(int(train_length))
    _baselines(ax, chance, copy)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(all_x))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{round(v)}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("accuracy")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    _legend(ax, len(curves) + 3)
    return fig


def probe_figures(probes, label: str) -> dict[str, Figure]:
    """The figures of one run's ``ProbeResult``, per kind: the depth x length heatmap, accuracy by depth at
    every length (one line per length, Wilson bands), accuracy vs length (mean over depths, paired-bootstrap
    band); and mqar_offset's accuracy vs total length at a fixed distance. Chance and copy marked."""
    figs: dict[str, Figure] = {}
    train_length = probes.train_length
    for kind in probes.kinds:
        figs[f"probe_{kind}_heatmap"] = plot_probe_heatmap(
            probes.grid(kind, "acc"), probes.depths, probes.lengths,
            title=f"{kind} retrieval accuracy — {label}", train_length=train_length,
        )
        names = {L: f"{L} tokens" + (" (train)" if L == train_length else "") for L in probes.lengths}
        figs[f"probe_{kind}_depth"] = plot_depth_curve(
            {names[L]: probes.depth_curve(kind, L) for L in probes.lengths}, probes.depths,
            bands={names[L]: (probes.depth_curve(kind, L, "lo"), probes.depth_curve(kind, L, "hi"))
                   for L in probes.lengths},
            chance=probes.chance(kind), copy=probes.copy(kind),
            title=f"{kind}: accuracy by depth (95% Wilson bands) — {label}",
        )
        summaries = {L: probes.summary(kind, L) for L in probes.lengths}
        figs[f"probe_{kind}_length"] = plot_accuracy_vs_length(
            {label: {L: s["acc"] for L, s in summaries.items()}}, train_length,
            bands={label: {L: (s["acc_lo"], s["acc_hi"]) for L, s in summaries.items()}},
            chance=probes.chance(kind), copy=probes.copy(kind),
            title=f"{kind}: accuracy (mean over depths) vs length",
        )
    if probes.offset:
        cells = sorted(probes.offset.values(), key=lambda c: c.length)
        figs["probe_mqar_offset"] = plot_accuracy_vs_length(
            {label: {c.length: c.acc for c in cells}}, train_length,
            bands={label: {c.length: (c.lo, c.hi) for c in cells}},
            chance=_mean_finite([c.chance for c in cells]), copy=_mean_finite([c.chance_copy for c in cells]),
            title="mqar_offset: gold pair at a fixed distance after a prefix of m × train length",
            xlabel="context length (tokens) = (m + 1) × train length",
        )
    return figs


def _mean_finite(xs: Sequence[float]) -> float | None:
    xs = [x for x in xs if _finite(x)]
    return sum(xs) / len(xs) if xs else None


def save_figure(fig: Figure, path: str | Path, dpi: int = 120) -> Path:
    """Write ``fig`` as an image (format from the suffix, e.g. .png), creating parent folders."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    return path
