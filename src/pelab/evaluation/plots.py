"""Figures for extrapolation and probes.

Built with the object-oriented API (``matplotlib.figure.Figure`` + the Agg canvas), never pyplot:
no global figure registry to leak, no GUI backend, safe in worker processes and under Lightning.
``wandb.Image(fig)`` and ``save_figure(fig, path)`` both accept the returned figures.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullFormatter


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


def _finite(x: float | None) -> bool:
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x)


def plot_ppl_vs_length(
    results: Mapping[str, Mapping[int, float]],
    train_len: int,
    title: str = "Perplexity vs evaluation length",
    ylabel: str = "perplexity (log scale)",
) -> Figure:
    """One line per label (e.g. encoding) of ppl by length; log y, log2 x, the training length marked.
    NaN / inf points (not applicable, diverged) are skipped."""
    fig = _figure(8.5 if len(results) > 6 else 6.0, 4.0)
    ax = fig.add_subplot()
    all_x: set[int] = set()
    for (label, curve), style in zip(results.items(), _styles(len(results))):
        pts = sorted((int(L), float(p)) for L, p in curve.items() if _finite(p) and p > 0)
        if not pts:
            continue
        xs, ys = zip(*pts)
        all_x.update(xs)
        ax.plot(xs, ys, label=str(label), **style)
    ax.axvline(train_len, color="grey", linestyle="--", linewidth=1, label=f"train length {train_len}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ticks = sorted(all_x | {int(train_len)})
    ax.set_xticks(ticks)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{round(v)}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("evaluation length (tokens)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    _legend(ax, len(results) + 1)
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
    train_len: int,
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
    ax.axvline(train_len, color="grey", linestyle="--", linewidth=1, label=f"train length {train_len}")
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


def _draw_heatmap(ax, data, depths: Sequence[float], lengths: Sequence[int], train_len: int | None,
                  annotate: bool, fontsize: float = 8):
    """Draw one depth x length accuracy heatmap into ``ax``; returns the image (for a colorbar)."""
    import numpy as np

    cmap = colormaps["RdYlGn"].with_extremes(bad="lightgrey")  # NaN cells grey
    im = ax.imshow(np.ma.masked_invalid(data), cmap=cmap, vmin=0.0, vmax=1.0, aspect="auto")
    ax.set_xticks(range(len(lengths)))
    ax.set_xticklabels([f"{L}" + ("*" if train_len is not None and L == train_len else "") for L in lengths])
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
    train_len: int | None = None,
    annotate: bool = True,
) -> Figure:
    """Needle-in-a-haystack heatmap: rows = depths (0 at the top), columns = lengths, 'RdYlGn' colours
    from 0 (red) to 1 (green), each cell annotated; NaN cells grey with "n/a"."""
    data = _heatmap_array(grid, depths, lengths)
    fig = _figure(1.2 + 0.9 * len(lengths), 1.0 + 0.55 * len(depths))
    ax = fig.add_subplot()
    im = _draw_heatmap(ax, data, depths, lengths, train_len, annotate)
    ax.set_xlabel("context length (tokens)" + (" — * = train length" if train_len in lengths else ""))
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
    ``lengths`` and optionally ``train_len`` (marked with *). A missing (label, kind) cell stays blank.
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
            im = _draw_heatmap(ax, data, p["depths"], p["lengths"], p.get("train_len"), annotate, fontsize=7)
            if i == 0:
                ax.set_title(kind)
            if i == len(labels) - 1:
                ax.set_xlabel("context length (* = train length)", fontsize=8)
            if j == 0:
                ax.set_ylabel(f"{label}\nanswer depth", fontsize=8)
    fig.colorbar(im, ax=axes, label="accuracy", shrink=0.8)
    fig.suptitle(title)
    return fig


def plot_depth_curve(
    curves: Mapping[str, Sequence[float]] | Sequence[float],
    depths: Sequence[float],
    length: int | None = None,
    chance: float | None = None,
    title: str | None = None,
    ylabel: str = "accuracy",
) -> Figure:
    """Accuracy by depth (the lost-in-the-middle U-curve) at one length; one line per label.
    A bare list is one unlabeled curve. ``chance`` draws a dotted floor."""
    if not isinstance(curves, Mapping):
        curves = {"": curves}
    fig = _figure(5.5, 3.8)
    ax = fig.add_subplot()
    xs = [100 * float(d) for d in depths]
    for label, ys in curves.items():
        ys = [float(y) if _finite(y) else float("nan") for y in ys]
        ax.plot(xs, ys, marker="o", label=str(label) or None)
    if chance is not None and _finite(chance):
        ax.axhline(chance, color="grey", linestyle=":", linewidth=1, label=f"chance {chance:.2g}")
    if ylabel == "accuracy":
        ax.set_ylim(-0.02, 1.02)
    ax.set_xticks(xs)
    ax.set_xlabel("depth of the answer (%)")
    ax.set_ylabel(ylabel)
    ax.set_title(title or (f"Accuracy by depth at {length} tokens" if length else "Accuracy by depth"))
    ax.grid(True, alpha=0.3)
    if any(str(k) for k in curves) or chance is not None:
        ax.legend(fontsize=8)
    return fig


def save_figure(fig: Figure, path: str | Path, dpi: int = 120) -> Path:
    """Write ``fig`` as an image (format from the suffix, e.g. .png), creating parent folders."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    return path
