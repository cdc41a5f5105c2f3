"""Diagnostics logged at the start of a run (the classic "what does a position embedding look like" lesson).

- learnable parameters the encoding adds (learned: max_position x D, t5_bias: num_buckets x heads, else 0)
- cosine similarity between neighbouring positions of an absolute table (sinusoidal: high and constant,
  since PE(p+1) is a fixed rotation of PE(p); learned at init: near zero)
- a heatmap of the table (position x dimension), as a matplotlib Figure
- for score-bias schemes: the bias each head adds at distance 0..n-1 (as seen by the last query), plotted
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping

import torch
import torch.nn.functional as F
from matplotlib.figure import Figure  # object API, no pyplot: no global state, renders with Agg on savefig
from torch import Tensor

from pelab.encodings.base import PositionEncoding


def neighbour_cosine(table: Tensor) -> Tensor:
    """Cosine similarity of rows p and p+1: (P, D) -> (P-1,)."""
    table = table.detach().float()
    return F.cosine_similarity(table[:-1], table[1:], dim=-1)


def plot_table_heatmap(table: Tensor, title: str = "position table") -> Figure:
    """Heatmap of a (P, D) position table: positions down, dimensions across."""
    data = table.detach().float().cpu().numpy()
    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    im = ax.imshow(data, aspect="auto", cmap="RdBu_r", interpolation="nearest")
    ax.set_xlabel("dimension")
    ax.set_ylabel("position")
    ax.set_title(title)
    fig.colorbar(im, ax=ax)
    fig.tight_layout()
    return fig


def plot_neighbour_cosine(curves: Tensor | Mapping[str, Tensor], title: str = "neighbour cosine") -> Figure:
    """Line plot of cos(PE(p), PE(p+1)) against p; ``curves`` is one (P-1,) tensor or {label: tensor}."""
    if isinstance(curves, Tensor):
        curves = {"": curves}
    fig = Figure(figsize=(6, 3.5))
    ax = fig.subplots()
    for label, values in curves.items():
        ax.plot(values.detach().float().cpu().numpy(), label=label or None)
    ax.set_xlabel("position p")
    ax.set_ylabel("cos(PE(p), PE(p+1))")
    ax.set_ylim(-1.05, 1.05)
    ax.set_title(title)
    if any(curves):
        ax.legend()
    fig.tight_layout()
    return fig


def plot_bias_by_distance(bias: Tensor, title: str = "score bias by distance") -> Figure:
    """One line per head: the bias (H, n) added to the logit of a key at distance 0..n-1."""
    data = bias.detach().float().cpu().numpy()
    fig = Figure(figsize=(6, 3.5))
    ax = fig.subplots()
    for h, values in enumerate(data):
        ax.plot(values, label=f"head {h}")
    ax.set_xlabel("distance i - j")
    ax.set_ylabel("bias")
    ax.set_title(title)
    if len(data) <= 16:
        ax.legend(fontsize="small", ncol=2)
    fig.tight_layout()
    return fig


def encoding_report(pe: PositionEncoding, n_positions: int, figures: bool = False) -> dict:
    """Scalars (and optionally figures) describing an encoding; tables only exist for absolute schemes.

    Keys: name, num_learnable_params, max_position (the encoding's ``n_positions``: logged as pe/max_position,
    the user key's name; None = unbounded), hooks, and when a table exists neighbour_cosine_{mean,
    min,max}; with ``figures``: figures {"table_heatmap", "neighbour_cosine"} for a table,
    {"bias_by_distance"} for a score bias.
    """
    report: dict = {
        "name": pe.name,
        "num_learnable_params": pe.num_learnable_params(),
        "max_position": pe.n_positions,
        "hooks": [
            h
            for h, used in (
                ("embed", pe.has_embed),
                ("rotate", pe.has_rotate),
                ("score_bias", pe.has_bias),
                ("content_bias", pe.has_content_bias),
            )
            if used
        ],
    }
    if figures:
        report["figures"] = {}
    with torch.no_grad():
        extras = pe.diagnostics(n_positions)
    table = extras.get("table")
    if table is not None and table.shape[0] >= 2:
        cos = neighbour_cosine(table)
        report.update(
            neighbour_cosine_mean=float(cos.mean()),
            neighbour_cosine_min=float(cos.min()),
            neighbour_cosine_max=float(cos.max()),
        )
        if figures:
            report["figures"] = {
                "table_heatmap": plot_table_heatmap(table, title=f"{pe.name} position table"),
                "neighbour_cosine": plot_neighbour_cosine(
                    {pe.name: cos}, title=f"{pe.name} neighbour cosine"
                ),
            }
    if figures and pe.has_bias:
        bias = bias_by_distance(pe, n_positions)
        report["figures"]["bias_by_distance"] = plot_bias_by_distance(bias, title=f"{pe.name} bias by distance")
    return report


def bias_by_distance(pe: PositionEncoding, n_positions: int) -> Tensor:
    """(H, n): the score bias of keys at distance 0..n-1 from the last query of positions 0..n-1."""
    tensor = next(itertools.chain(pe.parameters(), pe.buffers()), None)
    n = torch.arange(n_positions, device=tensor.device if tensor is not None else None)
    with torch.no_grad():
        return pe.score_bias(n[-1:], n)[:, 0].flip(-1).float().cpu()
