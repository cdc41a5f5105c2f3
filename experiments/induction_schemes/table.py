"""The induction-heads table for every scheme (issue 52): answer accuracy at 2^6 ... 2^14 per row, over every finished
run of the row (acquired in-window or not: the criterion of 1.000 is missed by runs that learned the task, README),
as the mean over seeds with its 95 % t interval over seeds and n; and the figure, accuracy against length, one line per
row with its interval as a band. Rows: pe.name, with the RoPE scaling of an evaluation run (eval.py's scaling sweep:
rope+linear, rope+ntk, rope+yarn). Reads summary.json of the run folders under each folder (numpy, scipy, matplotlib).

    python experiments/induction_schemes/table.py <folders>... [--out table.md] [--figure accuracy.png]
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from pathlib import Path

import numpy as np
from scipy import stats

LENGTHS = [1 << k for k in range(6, 15)]
CHANCE = 1 / 14  # 14 ordinary symbols


def row_values(folders: list[Path]) -> dict[str, dict[int, list[float]]]:
    """{row: {length: [accuracy of each seed]}} from the finished runs (training runs and eval.py's scaling sweeps)."""
    out: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for path in sorted(p for f in folders for p in f.glob("**/summary.json")):
        s = json.loads(path.read_text())
        if s.get("status") != "ok":
            continue
        name = s["config"]["pe"]["name"]
        for variant, metrics in variants(s):
            for L in LENGTHS:
                v = metrics.get(f"probe/induction_heads/acc@{L}")
                if v is not None and math.isfinite(float(v)):
                    out[name + (f"+{variant}" if variant else "")][L].append(float(v))
    return out


def variants(summary: dict) -> list[tuple[str | None, dict]]:
    """[(scaling or None, metrics)]: a training run's metrics, or each scaling of an eval.py sweep (whose metrics are
    probe/<scaling>/induction_heads/acc@L: the scaling's name after probe/)."""
    m = summary.get("metrics") or {}
    swept: dict[str, dict] = defaultdict(dict)
    for k, v in m.items():
        parts = k.split("/")
        if len(parts) == 4 and parts[0] == "probe" and parts[2] == "induction_heads":
            swept[parts[1]][f"probe/induction_heads/{parts[3]}"] = v
    return sorted(swept.items()) if swept else [(None, m)]


def cell(values: list[float]) -> tuple[float, float, float, int]:
    """(mean, lo, hi, n): the t interval over seeds (a single seed: no interval)."""
    x = np.asarray(values, dtype=float)
    n, mean = len(x), float(x.mean())
    if n < 2:
        return mean, math.nan, math.nan, n
    half = stats.t.ppf(0.975, n - 1) * float(x.std(ddof=1)) / math.sqrt(n)
    return mean, max(0.0, mean - half), min(1.0, mean + half), n


def table(rows: dict[str, dict[int, list[float]]]) -> str:
    head = " | ".join(f"2^{int(math.log2(L))}" for L in LENGTHS)
    lines = [f"| row | {head} |", "|---|" + "---|" * len(LENGTHS)]
    for name in sorted(rows):
        cells = []
        for L in LENGTHS:
            if not rows[name].get(L):
                cells.append("n/a")
                continue
            mean, lo, hi, n = cell(rows[name][L])
            cells.append(f"{100 * mean:.1f}" + (f" [{100 * lo:.1f}, {100 * hi:.1f}]" if n > 1 else "") + f" ({n})")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def figure(rows: dict[str, dict[int, list[float]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name in sorted(rows):
        Ls = [L for L in LENGTHS if rows[name].get(L)]
        cells = [cell(rows[name][L]) for L in Ls]
        line, = ax.plot(Ls, [100 * c[0] for c in cells], marker="o", ms=3, label=f"{name} (n={max(c[3] for c in cells)})")
        if any(c[3] > 1 for c in cells):
            ax.fill_between(Ls, [100 * c[1] for c in cells], [100 * c[2] for c in cells], alpha=0.15,
                            color=line.get_color(), lw=0)
    ax.axhline(100 * CHANCE, color="grey", ls=":", lw=1, label="chance (1/14)")
    ax.axvline(256, color="grey", ls="--", lw=1)
    ax.set_xscale("log", base=2)
    ax.set(xlabel="task length (trained at 2^8)", ylabel="answer accuracy (%)", ylim=(0, 102),
           title="Induction heads: accuracy by length (mean over seeds, 95% t band)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folders", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--figure", type=Path, default=None)
    a = ap.parse_args()
    rows = row_values(a.folders)
    text = table(rows)
    if a.out:
        a.out.write_text(text)
    if a.figure:
        figure(rows, a.figure)
    print(text, end="")


if __name__ == "__main__":
    main()
